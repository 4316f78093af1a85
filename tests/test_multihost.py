"""The multi-host path with real processes: 2 processes x 4 fake CPU devices == 1 process x 8 devices."""
import json
import os
import shutil
import subprocess
import sys

import helpers as tt
import numpy as np
import pytest
from helpers import ROOT

from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import writers as metrics


def main_args(workdir, data_dir, steps, *extra):
  return tt.main_cmd("variant=tiny,seq=32,preds=5,batch=16,steps=6,shard=fsdp", workdir, data_dir,
                     "--config.log_every=1", "--config.eval_every=3", "--config.eval_batches=2",
                     "--config.checkpoint_every=3", f"--config.train.stop_after_steps={steps}", *extra)[3:]


def single(workdir, data_dir, steps):
  env = dict(tt.env(), XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "bertjax", "train", *main_args(workdir, data_dir, steps)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def cluster(workdir, data_dir, steps):
  out = subprocess.run([sys.executable, "launch/local_cluster.py", "--processes", "2", "--devices_per_process", "4",
                        "--", *main_args(workdir, data_dir, steps)],
                       capture_output=True, text=True, env=tt.env(), cwd=ROOT, timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  return out.stdout


def losses(workdir, split="train"):
  rows = {}
  for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if r["split"] == split:
      rows[r["step"]] = r
  return rows


@pytest.mark.slow
def test_two_processes_equal_one_and_checkpoints_cross_over(tmp_path, data_dir):
  one, two = tmp_path / "one", tmp_path / "two"
  single(one, data_dir, 0)
  out = cluster(two, data_dir, 0)
  assert "mesh {'data': 1, 'fsdp': 8, 'tensor': 1}" in out and "8 cpu device(s)" in out
  a, b = losses(one), losses(two)
  assert sorted(a) == sorted(b) == list(range(1, 7))
  np.testing.assert_allclose([b[s]["loss"] for s in range(1, 7)], [a[s]["loss"] for s in range(1, 7)], atol=1e-5)
  ea, eb = losses(one, "eval"), losses(two, "eval")
  assert sorted(ea) == sorted(eb) and abs(ea[6]["mlm_loss"] - eb[6]["mlm_loss"]) < 1e-5
  # Only process 0 wrote the shared files; every process took part in the checkpoint.
  assert checkpoint_lib.Checkpointer(str(two)).steps() == [3, 6]
  # A 2-process checkpoint continues in 1 process, and the reverse, with the same batch sequence: each run's
  # step-3 checkpoint (model, optimizer and input-pipeline state) alone seeds a fresh workdir.
  cross1, cross2 = tmp_path / "c1", tmp_path / "c2"
  for src, dst in ((two, cross1), (one, cross2)):
    shutil.copytree(src / "checkpoints" / "3", dst / "checkpoints" / "3")
  assert "steps 3->6" in single(cross1, data_dir, 0) and "steps 3->6" in cluster(cross2, data_dir, 0)
  for w in (cross1, cross2):
    c = losses(w)
    assert sorted(c) == [4, 5, 6]
    np.testing.assert_allclose([c[s]["loss"] for s in c], [a[s]["loss"] for s in c], atol=1e-5)


def finetune_args(tmp_path, workdir):
  """A tiny sentence-classification fine-tuning run (local CSV) through python -m bertjax train, fsdp over 8 devices."""
  import random

  from bertjax.data import tokenizer
  if not (tmp_path / "train.csv").exists():
    rng = random.Random(0)
    words = "alpha beta gamma delta river mountain city island good bad fine poor nice awful".split()
    (tmp_path / "t.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)))
    tokenizer.train([tmp_path / "t.txt"], tmp_path / "tok", vocab_size=120)
    tt.write_sentiment(tmp_path / "train.csv", 64, 0)
    tt.write_sentiment(tmp_path / "dev.csv", 40, 1)
  vocab = next((tmp_path / "tok").glob("vocab.txt"))
  return [f"--config={ROOT}/configs/finetune.py:task=local,variant=tiny,lr=1e-3,batch=16,epochs=2,seq=32,shard=fsdp",
          f"--workdir={workdir}", f"--config.data.tokenizer={vocab}",
          f"--config.model.vocab_size={tokenizer.load(str(vocab)).vocab_size}",
          f"--config.data.train_file={tmp_path / 'train.csv'}", f"--config.data.eval_file={tmp_path / 'dev.csv'}",
          "--config.data.text_a_column=sentence", "--config.data.label_column=sentiment",
          "--config.data.labels=('neg', 'pos')", "--config.log_every=1"]


@pytest.mark.slow
def test_two_process_finetuning_equals_one(tmp_path):
  """Fine-tuning on 2 processes x 4 devices: the same per-step losses and eval predictions as 1 x 8 (every
  process takes part in the prediction gather and the best-params save; process 0 writes the report)."""
  one, two = tmp_path / "one", tmp_path / "two"
  env = dict(tt.env(), XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "bertjax", "train", *finetune_args(tmp_path, one)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  out = subprocess.run([sys.executable, "launch/local_cluster.py", "--processes", "2", "--devices_per_process", "4",
                        "--", *finetune_args(tmp_path, two)], capture_output=True, text=True, env=tt.env(), cwd=ROOT,
                       timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  a, b = losses(one), losses(two)
  assert sorted(a) == sorted(b) == list(range(1, 9))
  np.testing.assert_allclose([b[s]["loss"] for s in a], [a[s]["loss"] for s in a], atol=1e-5)
  ra = json.loads((one / "report.json").read_text())
  rb = json.loads((two / "report.json").read_text())
  for ea, eb in zip(ra["epochs"], rb["epochs"]):
    assert abs(ea["validation"]["accuracy"] - eb["validation"]["accuracy"]) < 1e-9
  assert (two / "best").is_dir()
