"""launch/sweep.py and launch/suite.py with their --root in a bucket, against a real GCS emulator (fake-gcs-server,
the `gcs_server` and `bucket` fixtures): the runs' workdirs, the plans and the tables go to the bucket, a rerun
keeps the runs whose report.json it finds there, and nothing is written in the folder the command runs in."""
import json
import os
import subprocess
import sys

import helpers as tt
import pytest
from helpers import ROOT

from bertjax.core import files

WORDS = "good fine nice bad poor awful alpha beta gamma delta river mountain city island".split()
# The smallest fine-tuning run: a tiny model from scratch, one epoch of 64 examples (4 steps) at seq 32.
CONFIG = f"configs/finetune.py:task=local,batch=16,epochs=1,seq=32,variant=tiny,vocab={5 + len(WORDS)}"


def _inputs(tmp_path) -> list[str]:
  """A learnable local sentiment task and its WordPiece vocabulary in tmp_path/in; the runs' overrides."""
  d = tmp_path / "in"
  d.mkdir()
  tt.write_sentiment(d / "train.csv", 64, 0)
  tt.write_sentiment(d / "dev.csv", 32, 1)
  (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
  return [f"--config.data.train_file={d / 'train.csv'}", f"--config.data.eval_file={d / 'dev.csv'}",
          f"--config.data.tokenizer={d / 'vocab.txt'}", "--config.data.text_a_column=sentence",
          "--config.data.label_column=sentiment", "--config.data.labels=('neg','pos')"]


def _launch(tool, args, cwd, timeout=600):
  """launch/TOOL.py ARGS run in `cwd`, as a user runs it (the emulator's variables in os.environ, set by the
  fixture)."""
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch", f"{tool}.py"), *args], capture_output=True,
                        text=True, cwd=cwd, env=tt.env(), timeout=timeout)


def _report(value: float) -> str:
  best = {"epoch": 1, "value": value, "metrics": {"validation": {"accuracy": value, "f1": value - 0.1}}}
  return json.dumps({"task": "local", "main_metric": "accuracy", "epochs": [], "best": best})


@pytest.mark.slow
def test_a_sweep_in_a_bucket_runs_tabulates_and_resumes_there(bucket, tmp_path):
  overrides = _inputs(tmp_path)
  root = files.join(bucket, "sweep")
  cmd = ["run", "--config", f"{CONFIG},lr=1e-3", "--grid", "seed=0,1", "--root", root, "--", *overrides]
  out = _launch("sweep", cmd, tmp_path)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  names = files.listdir(root)
  assert names == ["seed-0", "seed-1", "sweep.json", "sweep.png", "sweep_runs.json"], names
  for run in ("seed-0", "seed-1"):
    report = files.read_json(files.join(root, run, "report.json"))
    assert report["main_metric"] == "accuracy" and report["best"], report
    assert "checkpoints" in files.listdir(files.join(root, run))
  (row,) = files.read_json(files.join(root, "sweep.json"))
  assert row["setting"] == {} and row["runs"] == 2 and sorted(row["per_seed"]) == ["0", "1"], row
  assert files.read_bytes(files.join(root, "sweep.png"))[:4] == b"\x89PNG"
  table = files.read_bytes(files.join(root, "sweep.json"))

  again = _launch("sweep", cmd, tmp_path)  # the same command: both runs finished, read back from the bucket
  assert again.returncode == 0, again.stderr[-3000:]
  assert "== seed-0: finished before, kept" in again.stdout and "== seed-1: finished before, kept" in again.stdout
  assert "fine-tuning local" not in again.stdout + again.stderr  # no run started
  assert files.read_bytes(files.join(root, "sweep.json")) == table
  shown = _launch("sweep", ["table", "--root", root], tmp_path)
  assert shown.returncode == 0 and "accuracy" in shown.stdout, shown.stderr[-2000:]
  assert os.listdir(tmp_path) == ["in"]  # nothing local: no folder named 'gs:'


def test_a_suite_in_a_bucket_keeps_the_runs_finished_there(bucket, tmp_path):
  """Every run's report.json already in the bucket (as a preempted suite left them): the rerun starts none of them
  and writes its tables beside them."""
  overrides = _inputs(tmp_path)
  (tmp_path / "in" / "suite.json").write_text(json.dumps([{"name": "sentiment", "config": CONFIG,
                                                           "overrides": overrides}]))
  root = files.join(bucket, "suite")
  scores = {("1e-3", "0"): 0.9, ("1e-3", "1"): 0.8, ("3e-4", "0"): 0.7, ("3e-4", "1"): 0.75}
  for (lr, seed), v in scores.items():
    files.write_whole(files.join(root, "sentiment", f"lr-{lr}_seed-{seed}", "report.json"), _report(v))
  out = _launch("suite", ["run", "--suite", "in/suite.json", "--lrs", "1e-3,3e-4", "--seeds", "0,1", "--root", root],
                tmp_path)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert out.stdout.count("finished before, kept") == 4, out.stdout
  assert {"suite.json", "suite.json.runs", "suite.md", "suite.png", "sentiment"} == set(files.listdir(root))
  summary = files.read_json(files.join(root, "suite.json"))
  (row,) = summary["tasks"]
  assert row["lr"] == "1e-3" and row["runs"] == 4 and row["median"] == pytest.approx(0.85), row
  assert summary["average"] == pytest.approx(0.85)
  assert "| sentiment | accuracy | 1e-3 | 2 | 0.8500 |" in files.read_text(files.join(root, "suite.md"))
  assert files.read_bytes(files.join(root, "suite.png"))[:4] == b"\x89PNG"
  plan = files.read_json(files.join(root, "suite.json.runs"))
  assert plan["errors"] == {} and sorted(plan["tasks"]["sentiment"]) == [f"lr-{lr}_seed-{s}" for lr, s in scores]
  shown = _launch("suite", ["table", "--root", root], tmp_path)
  assert shown.returncode == 0 and "| **average** | | | | 0.8500 | |" in shown.stdout, shown.stderr[-2000:]
  assert os.listdir(tmp_path) == ["in"]  # nothing local: no folder named 'gs:'


@pytest.mark.parametrize("tool", ["sweep", "suite"])
def test_a_missing_bucket_is_one_line(gcs_server, tmp_path, tool):
  out = _launch(tool, ["table", "--root", "gs://no-such-bucket-here/r"], tmp_path, timeout=120)
  assert out.returncode == 2
  tt.assert_one_line_error(out, r"gs://no-such-bucket-here: the bucket does not exist")
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_suite_runs_in_a_bucket(bucket, tmp_path):
  """A real suite (one task, two rates, one seed) into the bucket, then its rerun keeping both runs."""
  overrides = _inputs(tmp_path)
  (tmp_path / "in" / "suite.json").write_text(json.dumps([{"name": "sentiment", "config": CONFIG,
                                                           "overrides": overrides}]))
  root = files.join(bucket, "suite")
  cmd = ["run", "--suite", "in/suite.json", "--lrs", "1e-3,3e-4", "--seeds", "0", "--root", root]
  out = _launch("suite", cmd, tmp_path)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert files.listdir(files.join(root, "sentiment")) == ["lr-1e-3_seed-0", "lr-3e-4_seed-0"]
  (row,) = files.read_json(files.join(root, "suite.json"))["tasks"]
  assert row["runs"] == 2 and row["metric"] == "accuracy", row
  again = _launch("suite", cmd, tmp_path)
  assert again.returncode == 0 and again.stdout.count("finished before, kept") == 2, again.stderr[-3000:]
  assert os.listdir(tmp_path) == ["in"]
