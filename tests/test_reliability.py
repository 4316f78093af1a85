"""Killed runs lose nothing; half-written or foreign checkpoints are handled clearly; invariants hold on random input."""
import errno
import gc
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bertjax import checkpoint as checkpoint_lib, train
from bertjax.data import dataset, pretraining
import helpers as tt

from helpers import ROOT

# After a read error (a truncated file, a shape that does not match) orbax abandons its other pending array
# reads; their coroutines are reported as "never awaited" when garbage-collected, dozens of tracebacks in some
# runs (with, at times, one from its reader thread posting to the closed event loop), landing on whichever test is
# running then. The tests here check the errors and fallbacks themselves, so those two reports, and only those, are
# ignored in this module, and each test collects its garbage before it ends so none reach the next module.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Exception ignored in. <coroutine object _read_array_index_and_device_put"
                               ":pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(autouse=True)
def _collect_abandoned_reads():
  yield
  gc.collect()


def run(config, workdir):
  return train.train_and_evaluate(config, str(workdir))


@pytest.mark.slow
@pytest.mark.ci
def test_chaos_kill9_three_times_resumes_bitwise(tmp_path, data_dir):
  out = subprocess.run([sys.executable, "tests/chaos.py", "--kills", "3", "--steps", "18", "--seed", "1",
                        "--workdir", str(tmp_path), "--data_dir", data_dir], capture_output=True, text=True,
                       cwd=ROOT, env=tt.env(), timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert "kills 3" in out.stdout and "max |param diff| 0" in out.stdout and "-> OK" in out.stdout


def test_half_written_checkpoints_are_skipped(tmp_path, data_dir, capsys):
  w = tmp_path / "w"
  run(tt.small_config(data_dir), w)  # checkpoints at 3 and 6
  ck = w / "checkpoints"
  shutil.copytree(ck / "6", ck / "9.orbax-checkpoint-tmp-123")  # a save killed before its rename
  shutil.copytree(ck / "6", ck / "12")
  os.remove(ck / "12" / "commit_success.txt")  # a step without its commit marker
  c = tt.small_config(data_dir)
  c.train.num_steps = 7
  summary = run(c, w)
  assert summary["start_step"] == 6 and summary["final_step"] == 7
  out = capsys.readouterr().out
  assert "ignoring half-written checkpoint(s)" in out and "9.orbax-checkpoint-tmp-123" in out and "'12'" in out


def test_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path, data_dir, caplog):
  w = tmp_path / "w"
  run(tt.small_config(data_dir), w)
  state_dir = w / "checkpoints" / "6" / "state"
  for root, _, files in os.walk(state_dir):
    for f in files:
      if "ocdbt" in root or f.startswith("d"):
        p = os.path.join(root, f)
        with open(p, "r+b") as fh:
          fh.truncate(max(0, os.path.getsize(p) // 3))
  c = tt.small_config(data_dir)
  mcfg = train.model_lib.BertConfig.from_dict(c.model.to_dict())
  abstract = train.build(c, mcfg).abstract
  state, data_state, step = checkpoint_lib.Checkpointer(str(w)).restore(abstract)
  assert step == 3 and data_state["step"] == 3


def test_no_readable_checkpoint_is_an_error_not_a_restart(tmp_path, data_dir):
  w = tmp_path / "w"
  run(tt.small_config(data_dir, stop_after_steps=3), w)
  for root, _, files in os.walk(w / "checkpoints" / "3" / "state"):
    for f in files:
      with open(os.path.join(root, f), "wb") as fh:
        fh.write(b"garbage")
  with pytest.raises(checkpoint_lib.CheckpointError, match="no readable checkpoint among steps \\[3\\]"):
    run(tt.small_config(data_dir), w)
  assert (w / "checkpoints" / "3").exists()  # nothing was overwritten


def test_resuming_with_another_model_names_the_mismatch(tmp_path, data_dir):
  w = tmp_path / "w"
  run(tt.small_config(data_dir, stop_after_steps=3), w)
  c = tt.small_config(data_dir)
  c.model.intermediate_size = 256
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"does not fit the model \(3 parameter\(s\)\): .*\['mlp'\]\['wi'\]\['bias'\]: checkpoint \(2, 128\), model \(2, 256\)"):
    run(c, w)


def test_second_run_on_the_same_workdir_refuses(tmp_path, data_dir):
  w = tmp_path / "w"
  with checkpoint_lib.WorkdirLock(str(w)):
    with pytest.raises(checkpoint_lib.WorkdirLockedError, match=f"in use by another run \\(pid {os.getpid()}\\)"):
      run(tt.small_config(data_dir), w)
  assert not (w / "checkpoints").exists()
  run(tt.small_config(data_dir, stop_after_steps=1), w)  # free again once released


def test_disk_full_while_saving_is_a_clear_error_and_keeps_the_previous(tmp_path, data_dir, monkeypatch):
  w = tmp_path / "w"
  run(tt.small_config(data_dir, stop_after_steps=3), w)
  real_save = checkpoint_lib.ocp.CheckpointManager.save

  def full_disk(self, step, *a, **k):
    if step >= 6:
      raise OSError(errno.ENOSPC, "No space left on device")
    return real_save(self, step, *a, **k)

  monkeypatch.setattr(checkpoint_lib.ocp.CheckpointManager, "save", full_disk)
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match="saving the checkpoint at step 6 .* No space left on device. The previous checkpoint \\(3\\)"):
    run(tt.small_config(data_dir), w)
  monkeypatch.undo()
  assert checkpoint_lib.Checkpointer(str(w)).steps() == [3]


def test_unreachable_remote_data_path_is_one_clear_line(monkeypatch):
  monkeypatch.setenv("BERTJAX_REMOTE_TIMEOUT_S", "3")
  with pytest.raises(dataset.DataPathError, match="gs://no-such-bucket/data: (cannot be read|no answer within 3s)"):
    dataset.read_creation("gs://no-such-bucket/data")


def test_metrics_line_cut_by_a_kill_loses_only_that_line(tmp_path):
  from bertjax import metrics
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 2.0}\n{"step": 2, "spl')
  w = metrics.Writer(str(tmp_path))
  w.write(2, {"loss": 1.5})
  w.close()
  rows = metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 2.0), (2, 1.5)]


# ------------------------------------------------------------------ property tests
VOCAB = pretraining.Vocab(60, 2, 3, 4, np.array([i % 4 == 3 and i >= 5 for i in range(60)]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(5, 59), min_size=1, max_size=80), st.floats(0.01, 0.9), st.integers(1, 30),
       st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_masking_invariants(body, prob, max_pred, wwm, seed):
  import random
  tokens = [2] + body + [3]
  out, positions, labels = pretraining.create_masked_lm_predictions(tokens, prob, max_pred, VOCAB,
                                                                     random.Random(seed), wwm)
  cap = min(max_pred, max(1, int(round(len(tokens) * prob))))
  assert len(positions) <= cap
  if not wwm:
    assert len(positions) == min(cap, len(body))
  assert positions == sorted(set(positions))
  assert all(tokens[p] not in (2, 3) for p in positions)
  assert labels == [tokens[p] for p in positions]
  assert all(out[i] == tokens[i] for i in range(len(tokens)) if i not in positions)
  assert len(out) == len(tokens)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60), st.integers(2, 50), st.integers(0, 2 ** 32 - 1))
def test_truncation_invariants(na, nb, max_tokens, seed):
  import random
  a, b = list(range(na)), list(range(100, 100 + nb))
  pretraining.truncate_seq_pair(a, b, max_tokens, random.Random(seed))
  assert len(a) + len(b) <= max(max_tokens, 0) or (na + nb <= max_tokens)
  if na + nb > max_tokens:
    assert len(a) + len(b) == max_tokens
    assert abs(len(a) - len(b)) <= 1 or min(na, nb) == min(len(a), len(b))  # only the longer side shrank
  for x, base in ((a, 0), (b, 100)):
    assert x == list(range(x[0], x[0] + len(x))) if x else True  # a contiguous window


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300), st.integers(2, 200), st.integers(0, 2 ** 32 - 1))
def test_truncation_equals_the_originals_token_by_token_loop(na, nb, max_tokens, seed):
  import random
  import original_create_pretraining_data as original
  a, b = list(range(na)), list(range(1000, 1000 + nb))
  ra, rb = list(a), list(b)
  rng, ref_rng = random.Random(seed), random.Random(seed)
  pretraining.truncate_seq_pair(a, b, max_tokens, rng)
  original.truncate_seq_pair(ra, rb, max_tokens, ref_rng)
  assert (a, b) == (ra, rb)
  assert rng.random() == ref_rng.random()  # the same number of draws


def test_truncating_one_huge_segment_is_linear():
  """A 2M-token segment (one long line without sentence breaks) fits in one pass; removing from the front of a
  list one token at a time would take tens of minutes."""
  import random
  a, b = list(range(2_000_000)), [1, 2, 3]
  pretraining.truncate_seq_pair(a, b, 125, random.Random(0))
  assert len(a) + len(b) == 125 and a == list(range(a[0], a[0] + len(a)))
