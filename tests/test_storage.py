"""The file layer and runs whose workdir lives in a bucket, against a real GCS emulator (fake-gcs-server, the
`gcs_server` and `bucket` fixtures): what a TPU VM's run does with gs:// paths."""
import json
import os
import socket
import subprocess
import sys
import time

import helpers as tt
import jax
import numpy as np
import pytest
from helpers import ROOT

from bertjax import errors
from bertjax import pretrain as train
from bertjax import run as run_lib
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files
from bertjax.core import writers as metrics


def test_objects_read_and_write_as_files(bucket, tmp_path):
  w = files.join(bucket, "w")
  files.write_whole(files.join(w, "config.json"), '{"a": 1}')
  files.write_whole(files.join(w, "sub", "x.bin"), b"\x00\x01")
  assert files.isdir(w) and files.isfile(files.join(w, "config.json")) and not files.exists(files.join(w, "none"))
  assert files.listdir(w) == ["config.json", "sub"] and files.listdir(files.join(bucket, "empty")) == []
  assert files.walk_files(w) == ["config.json", "sub/x.bin"]
  assert files.glob(files.join(w, "*.json")) == [files.join(w, "config.json")]
  assert files.read_json(files.join(w, "config.json")) == {"a": 1}
  local = files.local_copy(w)
  assert open(os.path.join(local, "sub", "x.bin"), "rb").read() == b"\x00\x01"
  with files.local_target(files.join(bucket, "out")) as d:
    os.makedirs(d)
    with open(os.path.join(d, "f.txt"), "w") as f:
      f.write("made locally")
  assert files.read_text(files.join(bucket, "out", "f.txt")) == "made locally"
  files.rename(files.join(bucket, "out"), files.join(bucket, "moved"))
  assert not files.exists(files.join(bucket, "out", "f.txt"))
  assert files.listdir(files.join(bucket, "moved")) == ["f.txt"]
  with pytest.raises(ValueError, match="appended"):
    files.open(files.join(w, "config.json"), "a")
  # Local paths keep the operating system's behaviour: a write is whole and leaves no temporary file.
  files.write_whole(tmp_path / "a.txt", "x")
  assert os.listdir(tmp_path) == ["a.txt"]


def test_a_missing_bucket_is_one_line(gcs_server):
  with pytest.raises(errors.DataPathError, match="gs://no-such-bucket-here: the bucket does not exist"):
    files.reach("gs://no-such-bucket-here/w")


def test_an_unreachable_store_is_one_line_within_the_bound(tmp_path):
  env = dict(tt.env(), STORAGE_EMULATOR_HOST="http://127.0.0.1:9", BERTJAX_REMOTE_TIMEOUT_S="3")
  t0 = time.time()
  out = subprocess.run([sys.executable, "-m", "bertjax", "plot", "gs://bkt/w"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
  tt.assert_one_line_error(out, r"gs://bkt: (no answer within 3s|cannot reach the store)")
  assert time.time() - t0 < 60 and os.listdir(tmp_path) == []  # no local folder named after the scheme


def test_a_claim_refuses_a_live_run_and_takes_over_a_stale_one(bucket, monkeypatch, capsys):
  monkeypatch.setenv("BERTJAX_CLAIM_SETTLE_S", "0")
  w = files.join(bucket, "w")
  with checkpoint_lib.WorkdirLock(w):
    held = json.loads(files.read_bytes(files.join(w, ".claim.json")))
    assert held["pid"] == os.getpid() and held["heartbeat"] >= held["started"]
    with pytest.raises(errors.WorkdirLockedError, match=r"is claimed by another run .*pid \d+"):
      checkpoint_lib.Claim(w).take()
  assert not files.exists(files.join(w, ".claim.json"))  # released on exit
  # Another host's claim: refused while its heartbeat is fresh, taken over once stale.
  other = {"host": "tpu-vm-7", "pid": 4242, "token": "t", "started": time.time(), "heartbeat": time.time()}
  files.write_whole(files.join(w, ".claim.json"), json.dumps(other))
  with pytest.raises(errors.WorkdirLockedError, match="host tpu-vm-7, pid 4242"):
    checkpoint_lib.Claim(w).take()
  files.write_whole(files.join(w, ".claim.json"), json.dumps({**other, "heartbeat": time.time() - 3600}))
  claim = checkpoint_lib.Claim(w).take()
  assert "taking over the stale claim of host tpu-vm-7" in capsys.readouterr().out
  claim.release()
  # A dead process of this host (kill -9 here) is not waited for.
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  files.write_whole(files.join(w, ".claim.json"), json.dumps({**other, "host": socket.gethostname(),
                                                              "pid": dead.pid}))
  checkpoint_lib.Claim(w).take().release()


def test_the_resume_checks_read_the_buckets_config(bucket, data_dir):
  w = files.join(bucket, "w")
  c = tt.small_config(data_dir)
  run_lib.write_config(w, c)
  other = tt.small_config(data_dir)
  other.seed = c.seed + 1
  with pytest.raises(errors.ConfigError, match="holds a pre-training run of other settings .*seed"):
    run_lib.check_same_settings(w, other, ("seed",), "pre-training")
  with pytest.raises(errors.ConfigError, match="holds a pre-training run, not a fine-tuning one"):
    run_lib.check_workdir_mode(w, "finetune")


def test_metrics_reach_the_bucket_once_per_flush(bucket, monkeypatch):
  w = files.join(bucket, "w")
  uploads = []
  real = files.write_whole
  monkeypatch.setattr(files, "write_whole", lambda path, data: (uploads.append(str(path)), real(path, data))[1])
  writer = metrics.Writer(w)
  for step in range(1, 51):
    writer.write(step, {"loss": 1.0 / step})
  assert uploads == []  # buffered: no request per line
  writer.flush()
  assert uploads == [files.join(w, "metrics.jsonl")]
  writer.write(51, {"loss": 0.1})
  writer.close()
  assert [r["step"] for r in metrics.read_jsonl(files.join(w, "metrics.jsonl"))] == list(range(1, 52))
  assert any(n.startswith("events.out.tfevents") for n in files.listdir(files.join(w, "tensorboard")))
  # A resume from step 20 drops the rows the stopped run logged past its checkpoint, as it does locally.
  cut = files.read_text(files.join(w, "metrics.jsonl")) + '{"step": 52, "spl'  # a line cut by a kill
  files.write_whole(files.join(w, "metrics.jsonl"), cut)
  metrics.Writer(w, start_step=20).close()
  assert [r["step"] for r in metrics.read_jsonl(files.join(w, "metrics.jsonl"))] == list(range(1, 21))


@pytest.mark.slow
@pytest.mark.ci
def test_pretraining_in_a_bucket_resumes_bitwise_from_another_directory(bucket, data_dir, tmp_path, monkeypatch):
  full = train.train_and_evaluate(tt.small_config(data_dir), str(tmp_path / "local"))
  w, remote_data = files.join(bucket, "pre"), files.join(bucket, "data")
  files.copy(data_dir, remote_data)  # the data in the bucket too, as on a TPU VM
  (tmp_path / "a").mkdir()
  monkeypatch.chdir(tmp_path / "a")
  monkeypatch.setenv("BERTJAX_CACHE", str(tmp_path / "cache-a"))
  part = train.train_and_evaluate(tt.small_config(remote_data, stop_after_steps=3), w)
  assert part["preempted"] and part["final_step"] == 3
  (tmp_path / "b").mkdir()
  monkeypatch.chdir(tmp_path / "b")  # another working directory and an empty local cache: a fresh host
  monkeypatch.setenv("BERTJAX_CACHE", str(tmp_path / "cache-b"))
  resumed = train.train_and_evaluate(tt.small_config(remote_data), w)
  assert resumed["start_step"] == 3 and resumed["final_step"] == 6
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         full["state"].params, resumed["state"].params)
  a, b = ({r["step"]: r["loss"] for r in metrics.read_jsonl(files.join(d, "metrics.jsonl")) if r["split"] == "train"}
          for d in (str(tmp_path / "local"), w))
  assert a == b and sorted(b) == list(range(1, 7))
  names = files.listdir(w)
  for name in ("config.json", "metrics.jsonl", "loss.png", "mlm_accuracy.png", "nsp_accuracy.png", "tensorboard",
               "checkpoints"):
    assert name in names, names
  assert ".claim.json" not in names  # released at the end
  assert files.read_bytes(files.join(w, "loss.png"))[:4] == b"\x89PNG"
  assert checkpoint_lib.Checkpointer(w, read_only=True).steps() == [3, 6]
  for d in (tmp_path / "a", tmp_path / "b"):
    assert os.listdir(d) == []  # nothing local, no folder named after the scheme


@pytest.mark.slow
def test_kill9_in_a_bucket_resumes_bitwise_on_fresh_hosts(bucket, data_dir, tmp_path):
  out = subprocess.run([sys.executable, "tests/chaos.py", "--kills", "2", "--steps", "12", "--seed", "3",
                        "--workdir", str(tmp_path), "--data_dir", data_dir, "--victim", files.join(bucket, "chaos"),
                        "--fresh_hosts"], capture_output=True, text=True, cwd=ROOT, env=tt.env(), timeout=1200)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert "kills 2" in out.stdout and "max |param diff| 0" in out.stdout and "-> OK" in out.stdout


@pytest.mark.slow
def test_two_processes_share_a_bucket_workdir(bucket, data_dir, tmp_path):
  import test_multihost as mh
  one, two = tmp_path / "one", files.join(bucket, "two")
  mh.single(one, data_dir, 0)
  out = mh.cluster(two, data_dir, 0)
  assert "8 cpu device(s)" in out
  a = {r["step"]: r["loss"] for r in metrics.read_jsonl(str(one / "metrics.jsonl")) if r["split"] == "train"}
  b = {r["step"]: r["loss"] for r in metrics.read_jsonl(files.join(two, "metrics.jsonl")) if r["split"] == "train"}
  assert sorted(a) == sorted(b) == list(range(1, 7))
  np.testing.assert_allclose([b[s] for s in range(1, 7)], [a[s] for s in range(1, 7)], atol=1e-5)
  assert checkpoint_lib.Checkpointer(two, read_only=True).steps() == [3, 6]


def _pretrained_workdir(w) -> str:
  """A tiny pre-training workdir (tests/data/checkpoints_v0's run, hidden 16) with its tokenizer copy, at `w`."""
  import shutil
  data = os.path.join(ROOT, "tests", "data", "checkpoints_v0")
  shutil.copytree(os.path.join(data, "pretrain"), w)
  os.makedirs(os.path.join(w, "tokenizer"))
  shutil.copyfile(os.path.join(data, "vocab.txt"), os.path.join(w, "tokenizer", "vocab.txt"))
  record = json.load(open(os.path.join(w, "config.json"), encoding="utf-8"))
  record["data"]["data_dir"] = ""
  files.write_whole(os.path.join(w, "config.json"), json.dumps(record))
  return str(w)


@pytest.mark.slow
@pytest.mark.ci
def test_finetuning_from_and_into_a_bucket_equals_the_local_run(bucket, tmp_path, monkeypatch, capsys):
  from bertjax import finetune
  from bertjax.cli import plot as plot_cli
  from bertjax.cli import predict as predict_cli
  from configs import finetune as finetune_config
  pre = _pretrained_workdir(tmp_path / "pre")
  files.copy(pre, files.join(bucket, "pre"))
  tt.write_sentiment(tmp_path / "train.csv", 96, 0)
  tt.write_sentiment(tmp_path / "dev.csv", 40, 1)
  for name in ("train.csv", "dev.csv"):
    files.copy(str(tmp_path / name), files.join(bucket, "data", name))

  def config(init, data):
    c = finetune_config.get_config(f"task=local,init={init},lr=1e-3,batch=16,epochs=2,seq=32")
    c.data.train_file, c.data.eval_file = files.join(data, "train.csv"), files.join(data, "dev.csv")
    c.data.text_a_column, c.data.label_column, c.data.labels = "sentence", "sentiment", ("neg", "pos")
    return c
  local = finetune.finetune(config(pre, str(tmp_path)), str(tmp_path / "ft"))
  here = tmp_path / "cwd"
  here.mkdir()
  monkeypatch.chdir(here)
  ft = files.join(bucket, "ft")
  remote = finetune.finetune(config(files.join(bucket, "pre"), files.join(bucket, "data")), ft)
  assert remote["report"]["epochs"] == local["report"]["epochs"]
  assert files.read_json(files.join(ft, "report.json")) == files.read_json(str(tmp_path / "ft" / "report.json"))
  meta = files.read_json(files.join(ft, "finetune.json"))
  assert meta["tokenizer"] == "tokenizer/vocab.txt" and files.isfile(files.join(ft, "tokenizer", "vocab.txt"))
  # The finished run is read back from the bucket, not trained again; plot and predict read the bucket.
  assert finetune.report_of(None, ft) == remote["report"]
  capsys.readouterr()
  assert plot_cli.main([ft]) == 0 and files.isfile(files.join(ft, "loss.png"))
  capsys.readouterr()
  assert predict_cli.main(["--workdir", ft, "alpha good river"]) == 0
  printed = capsys.readouterr().out
  assert predict_cli.main(["--workdir", str(tmp_path / "ft"), "alpha good river"]) == 0
  assert capsys.readouterr().out == printed  # the bucket's run predicts as the local run does
  pred = json.loads(printed)
  assert pred["label"] in ("neg", "pos") and set(pred["probabilities"]) == {"neg", "pos"}, pred
  assert pred["label"] == max(pred["probabilities"], key=pred["probabilities"].get)
  assert sum(pred["probabilities"].values()) == pytest.approx(1, abs=1e-5)
  assert os.listdir(here) == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's abandoned reads
@pytest.mark.parametrize("how", ["cut_short", "half_written"])
def test_a_damaged_newest_checkpoint_in_the_bucket_is_set_aside_and_the_run_goes_on(bucket, data_dir, tmp_path,
                                                                                    capsys, how):
  """The newest step's objects cut short (a copy that stopped), or its commit marker missing (a save killed
  part-way): the run resumes from the step before, moves the damaged step to damaged_checkpoints/ in the bucket,
  and saves that step again, as on local disk."""
  local = tmp_path / "w"
  c = tt.small_config(data_dir)
  full = train.train_and_evaluate(c, str(local))  # checkpoints at 3 and 6
  w = files.join(bucket, "w")
  files.copy(str(local), w)
  step6 = files.join(w, "checkpoints", "6")
  if how == "cut_short":
    for rel in files.walk_files(files.join(step6, "state")):
      if "/d/" in f"/{rel}":
        raw = files.read_bytes(files.join(step6, "state", rel))
        files.write_whole(files.join(step6, "state", rel), raw[:len(raw) // 3])
  else:
    files.remove(files.join(step6, "commit_success.txt"))
  capsys.readouterr()
  resumed = train.train_and_evaluate(tt.small_config(data_dir), w)
  out = capsys.readouterr().out
  assert resumed["start_step"] == 3 and resumed["final_step"] == 6
  assert ("moved to gs://" in out) if how == "cut_short" else ("ignoring half-written checkpoint(s) ['6']" in out)
  assert files.isdir(files.join(w, "damaged_checkpoints", "6"))
  assert checkpoint_lib.Checkpointer(w, read_only=True).steps() == [3, 6]
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         full["state"].params, resumed["state"].params)  # the same steps again, the same result
  import gc
  gc.collect()


def test_a_config_cut_short_in_the_bucket_is_no_run_to_resume(bucket, data_dir):
  w = files.join(bucket, "w")
  files.write_whole(files.join(w, "config.json"), '{"mode": "pretr')
  run_lib.check_workdir_mode(w, "finetune")  # unreadable: no mode to refuse by, as on local disk
  with pytest.raises(errors.CheckpointError, match="no checkpoint"):
    checkpoint_lib.Checkpointer(w, read_only=True).restore_params()


def test_a_store_that_refuses_the_credentials_is_one_line(tmp_path):
  """A GCS endpoint answering 401 to every request (a private bucket without credentials): one line naming the
  bucket and the credentials, not a traceback."""
  import http.server
  import threading

  class Refuse(http.server.BaseHTTPRequestHandler):
    def _refuse(self):
      body = b'{"error": {"code": 401, "message": "Anonymous caller does not have storage.objects.list access"}}'
      self.send_response(401)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = _refuse

    def log_message(self, *args):
      pass
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    env = dict(tt.env(), STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{server.server_address[1]}",
               BERTJAX_REMOTE_TIMEOUT_S="20")
    out = subprocess.run([sys.executable, "-m", "bertjax", "plot", "gs://private/w"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
  finally:
    server.shutdown()
  tt.assert_one_line_error(out, r"gs://private: the store refused these credentials")
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_run_killed_in_a_bucket_keeps_its_metrics_up_to_its_checkpoint(bucket, data_dir, tmp_path):
  """Metrics are buffered on the host and reach the bucket with each checkpoint: after kill -9 the bucket holds
  every row up to the last checkpoint, which is where the next run resumes."""
  import signal
  w = files.join(bucket, "w")
  cmd = tt.main_cmd("variant=tiny,seq=32,preds=5,batch=16,steps=1000,shard=dp", w, data_dir,
                    "--config.log_every=1", "--config.checkpoint_every=3", "--config.eval_every=0")
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=tt.env(),
                          cwd=tmp_path)
  committed = files.join(w, "checkpoints", "3", "commit_success.txt")
  deadline = time.time() + 300
  while not files.exists(committed):  # the step-3 checkpoint finishes in the background while steps go on
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = [r["step"] for r in metrics.read_jsonl(files.join(w, "metrics.jsonl")) if r["split"] == "train"]
  assert steps[:3] == [1, 2, 3] and checkpoint_lib.Checkpointer(w, read_only=True).steps()[0] == 3
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_workdir_holding_another_tools_config_is_refused(bucket, tmp_path, where):
  """A --workdir whose config.json another tool wrote (an HF folder, say): a run there would write over it."""
  w = str(tmp_path / "theirs") if where == "local" else files.join(bucket, "theirs")
  files.makedirs(w)
  files.write_whole(files.join(w, "config.json"), json.dumps({"model_type": "bert", "hidden_size": 8}))
  for mode in ("pretrain", "finetune"):
    with pytest.raises(errors.ConfigError, match=r"config.json is not a bertjax run's config .*choose a new --workdir"):
      with run_lib.opened(w, mode):
        pass
  assert files.read_json(files.join(w, "config.json")) == {"model_type": "bert", "hidden_size": 8}
