"""Elastic resume: a run checkpointed on one number of devices or processes goes on on another with the same
global batch, the same examples in the same order and the same step, and ends where the uninterrupted run ends
(within the reordering of reductions). A global batch the new devices cannot divide is refused in one line."""
import os
import shutil
import subprocess
import sys

import helpers as tt
import jax
import numpy as np
import pytest
from helpers import ROOT

from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import writers as metrics

# A batch ramp from 8 to 16 rows: its sizes are the config's, so 8 and 4 devices run the same plan (sizes rounded
# to the device count gave 8 devices [8, 16] and 4 devices [8, 12, 16], and the resume read other rows).
RAMP = ("--config.train.batch_warmup_tokens=1024", "--config.train.batch_warmup_from=8")
# Parameters and losses agree to the reordering of sums over another number of devices. An entry below ATOL is
# rounding noise: the attention's key bias has a zero gradient in exact arithmetic (softmax ignores a shift
# shared by every key), so it holds only ~1e-8 of noise, which is all a relative measure of it would compare.
RTOL, ATOL = 1e-5, 1e-6


def args(workdir, data_dir, *extra):
  return tt.main_cmd("variant=tiny,seq=32,preds=5,batch=16,steps=6,shard=fsdp", workdir, data_dir,
                     "--config.log_every=1", "--config.eval_every=0", "--config.checkpoint_every=3",
                     "--config.data.prefetch=0", *extra)[3:]


def train(workdir, data_dir, devices, *extra, check=True):
  env = dict(tt.env(), XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "bertjax", "train", *args(workdir, data_dir, *extra)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  if check:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  return out


def cluster(workdir, data_dir, *extra):
  out = subprocess.run([sys.executable, "launch/local_cluster.py", "--processes", "2", "--devices_per_process", "4",
                        "--", *args(workdir, data_dir, *extra)],
                       capture_output=True, text=True, env=tt.env(), cwd=ROOT, timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  return out


def resumed_from(src, dst, step=3):
  """A fresh workdir holding only `src`'s checkpoint at `step` (model, optimizer and data position)."""
  shutil.copytree(src / "checkpoints" / str(step), dst / "checkpoints" / str(step))
  return dst


def losses(workdir):
  return {r["step"]: r["loss"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if r["split"] == "train"}


def differences(a, b, step=6) -> dict:
  """{parameter: max |a - b| over (RTOL · max |a| + ATOL)} at `step`: above 1 is a mismatch."""
  pa = checkpoint_lib.Checkpointer(str(a), read_only=True).restore_params(step=step)
  pb = checkpoint_lib.Checkpointer(str(b), read_only=True).restore_params(step=step)
  flat_b = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(pb)}
  return {jax.tree_util.keystr(k): float(np.max(np.abs(v - flat_b[jax.tree_util.keystr(k)]))
                                         / (RTOL * np.max(np.abs(v)) + ATOL))
          for k, v in jax.tree_util.tree_leaves_with_path(pa)}


def assert_same_run(reference, resumed):
  """The resumed run logged steps 4..6 with the reference's losses and ends with its parameters."""
  a, b = losses(reference), losses(resumed)
  assert sorted(b) == [4, 5, 6]
  np.testing.assert_allclose([b[s] for s in b], [a[s] for s in b], rtol=RTOL, atol=ATOL)
  worst = max(differences(reference, resumed).items(), key=lambda kv: kv[1])
  assert worst[1] <= 1, worst


@pytest.fixture(scope="module")
def on_eight(tmp_path_factory, data_dir):
  """The uninterrupted run on 8 devices (steps 0..6, a checkpoint at 3 and 6), the batch ramping 8 -> 16."""
  w = tmp_path_factory.mktemp("elastic") / "eight"
  train(w, data_dir, 8, *RAMP)
  return w


@pytest.mark.slow
def test_eight_devices_resume_on_four(on_eight, data_dir, tmp_path):
  out = train(resumed_from(on_eight, tmp_path / "four"), data_dir, 4, *RAMP)
  assert "mesh {'data': 1, 'fsdp': 4, 'tensor': 1}" in out.stdout and "steps 3->6" in out.stdout
  assert_same_run(on_eight, tmp_path / "four")


@pytest.mark.slow
def test_a_batch_the_new_devices_cannot_divide_is_one_line(on_eight, data_dir, tmp_path):
  w = resumed_from(on_eight, tmp_path / "three")
  out = train(w, data_dir, 3, *RAMP, check=False)
  tt.assert_one_line_error(out, r"global_batch_size 16 .*not divisible by the data-parallel size 3")
  assert not (w / "metrics.jsonl").exists() and sorted(os.listdir(w / "checkpoints")) == ["3"]


@pytest.mark.slow
def test_one_process_resumes_in_two_and_the_reverse(on_eight, data_dir, tmp_path):
  """2 processes x 4 devices continue the 1-process checkpoint; 1 process x 8 continues a 2-process one."""
  two = tmp_path / "two"
  cluster(resumed_from(on_eight, two), data_dir, *RAMP)
  assert_same_run(on_eight, two)
  back = tmp_path / "back"
  cluster(back, data_dir, *RAMP, "--config.train.stop_after_steps=3")
  (back / "metrics.jsonl").unlink()  # what the resumed leg logs alone
  train(back, data_dir, 8, *RAMP)
  assert_same_run(on_eight, back)
