"""Killed runs lose nothing; half-written, damaged or foreign checkpoints are handled clearly; invariants hold on
random input."""
import errno
import gc
import json
import os
import shutil
import subprocess
import sys

import helpers as tt
import jax
import numpy as np
import pytest
from helpers import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax import model as model_lib
from bertjax import pretrain as train
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.data.pretraining import dataset
from bertjax.data.pretraining import examples as pretraining

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


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory, data_dir):
  """A small pre-training workdir with checkpoints at steps 3 and 6 (copied by each test that damages it)."""
  w = tmp_path_factory.mktemp("trained") / "w"
  run(tt.small_config(data_dir), w)
  return w


def _damage(step_dir, how):
  """A checkpoint's state damaged as disks and people damage files."""
  state = step_dir / "state"
  data_files = [os.path.join(r, f) for r, _, fs in os.walk(state) for f in fs if os.path.basename(r) == "d"]
  assert data_files
  for p in data_files:
    if how == "truncated":
      with open(p, "r+b") as fh:
        fh.truncate(os.path.getsize(p) // 3)
    elif how == "deleted":
      os.remove(p)
    elif how == "bit_flipped":
      raw = bytearray(open(p, "rb").read())
      for i in range(0, len(raw), 97):
        raw[i] ^= 0xFF
      with open(p, "wb") as fh:
        fh.write(bytes(raw))
  if how == "metadata_deleted":
    os.remove(state / "_METADATA")


@pytest.mark.parametrize("how", ["truncated", "deleted", "bit_flipped", "metadata_deleted"])
def test_damaged_newest_checkpoint_falls_back_and_is_set_aside(tmp_path, data_dir, trained_workdir, how):
  """The newest readable step restores; the damaged one is named and moved to damaged_checkpoints/ (not deleted),
  so the same step saves again; read-only tools read the parameters of the newest readable step."""
  w = tmp_path / "w"
  shutil.copytree(trained_workdir, w)
  _damage(w / "checkpoints" / "6", how)
  want = checkpoint_lib.Checkpointer(str(trained_workdir)).restore_params(step=3)
  notes = []
  params = checkpoint_lib.Checkpointer(str(w)).restore_params(announce=notes.append)
  assert len(notes) == 1 and "skipped the unreadable checkpoint at step 6" in notes[0] and "using step 3" in notes[0]
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(a, b)
  assert (w / "checkpoints" / "6").exists()  # read-only: nothing moved
  c = tt.small_config(data_dir)
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  abstract = train.build(c, mcfg).abstract
  ckpt = checkpoint_lib.Checkpointer(str(w))
  notes = []
  state, data_state, step = ckpt.restore(abstract, announce=notes.append)
  assert step == 3 and data_state["step"] == 3
  assert len(notes) == 1 and "moved to" in notes[0] and len(notes[0]) < 400
  assert (w / "damaged_checkpoints" / "6").is_dir() and not (w / "checkpoints" / "6").exists()
  ckpt.save(6, state, data_state)  # the step a damaged checkpoint held saves again
  ckpt.close()
  assert checkpoint_lib.Checkpointer(str(w)).steps() == [3, 6]


def test_rerunning_after_a_damaged_checkpoint_keeps_working(tmp_path, data_dir, trained_workdir, capsys):
  """Training falls back, saves over the damaged step and reruns again from its own new checkpoints."""
  w = tmp_path / "w"
  shutil.copytree(trained_workdir, w)
  _damage(w / "checkpoints" / "6", "truncated")
  for steps, start in ((7, 3), (8, 7)):
    c = tt.small_config(data_dir)
    c.train.num_steps = steps
    summary = run(c, w)
    assert (summary["start_step"], summary["final_step"]) == (start, steps)
  assert "skipped the unreadable checkpoint at step 6" in capsys.readouterr().out
  steps = [r["step"] for r in tt.metrics_rows(w) if r["split"] == "train"]
  assert steps == sorted(set(steps)) == list(range(1, 9))  # no step logged twice after the resumes


def test_unreadable_best_params_fall_back_to_the_newest_checkpoint(tmp_path, trained_workdir, capsys):
  w = tmp_path / "f"
  shutil.copytree(trained_workdir / "checkpoints", w / "checkpoints")
  os.makedirs(w / "best")
  (w / "best" / "_METADATA").write_text("{not json")
  params = checkpoint_lib.restore_best(str(w))
  want = checkpoint_lib.Checkpointer(str(trained_workdir)).restore_params()
  np.testing.assert_array_equal(jax.tree_util.tree_leaves(params)[0], jax.tree_util.tree_leaves(want)[0])
  assert "best is unreadable" in capsys.readouterr().out


def test_a_workdir_is_self_contained(tmp_path, data_dir, trained_workdir):
  """The workdir keeps its tokenizer: with its data folder gone, it still loads for prediction, conversion and
  init=, and it exports with its tokenizer."""
  from bertjax.cli import convert as convert_cli
  from bertjax.convert import weights
  w = tmp_path / "w"
  shutil.copytree(trained_workdir, w)
  (w / "config.json").write_text((w / "config.json").read_text().replace(data_dir, str(tmp_path / "moved")))
  loaded = weights.load(str(w), head="pretraining")
  assert loaded.tokenizer == str(w / "tokenizer" / "vocab.txt")
  assert convert_cli.write(str(w), str(tmp_path / "hf")) == "BertForPreTraining"
  assert (tmp_path / "hf" / "vocab.txt").read_bytes() == (w / "tokenizer" / "vocab.txt").read_bytes()


def test_a_workdir_refuses_another_tokenizer(tmp_path, trained_workdir):
  from bertjax import errors
  from bertjax import run as run_lib
  other = tmp_path / "vocab.txt"
  other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\n")
  with pytest.raises(errors.TokenizerError, match="was trained with another tokenizer"):
    run_lib.keep_tokenizer(str(trained_workdir), str(other), True)


def test_convert_failing_midway_leaves_out_untouched(tmp_path, trained_workdir, monkeypatch):
  from bertjax.cli import convert as convert_cli
  out = tmp_path / "hf"
  out.mkdir()
  (out / "config.json").write_text("{}")

  def full_disk(workdir, target):
    (tmp_path / "partial").write_text(target)
    open(os.path.join(target, "model.safetensors"), "wb").write(b"x" * 10)
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(convert_cli, "export", full_disk)
  with pytest.raises(OSError, match="No space left on device; .* is untouched"):
    convert_cli.write(str(trained_workdir), str(out), overwrite=True)
  assert os.listdir(out) == ["config.json"] and not os.path.exists((tmp_path / "partial").read_text())


def test_a_background_save_failure_names_its_step(tmp_path, data_dir, trained_workdir, monkeypatch):
  w = tmp_path / "w"
  shutil.copytree(trained_workdir, w)
  ckpt = checkpoint_lib.Checkpointer(str(w))
  ckpt._pending = 9  # a save of step 9 running in the background

  def failed(self):
    raise ValueError("NOT_FOUND: Error writing ... No space left on device [tensorstore_spec='" + "x" * 2000 + "']")
  monkeypatch.setattr(checkpoint_lib.ocp.CheckpointManager, "wait_until_finished", failed)
  with pytest.raises(checkpoint_lib.CheckpointError) as e:
    ckpt.wait()
  assert "at step 9" in str(e.value) and "previous checkpoint (6) is untouched" in str(e.value)
  assert len(str(e.value)) < 400


def test_a_second_signal_ends_the_process_at_once():
  import signal

  from bertjax.core import trainer
  before = signal.getsignal(signal.SIGTERM)
  with trainer.StopFlag() as stop:
    assert signal.getsignal(signal.SIGTERM) == stop._handle
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the next one is not caught
  assert signal.getsignal(signal.SIGTERM) == before


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
                     match=r"does not fit the model \(3 parameter\(s\)\): .*\['mlp'\]\['wi'\]\['bias'\]: "
                           r"checkpoint \(2, 128\), model \(2, 256\)"):
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
                     match="saving the checkpoint at step 6 .* No space left on device. The previous "
                           "checkpoint \\(3\\)"):
    run(tt.small_config(data_dir), w)
  monkeypatch.undo()
  assert checkpoint_lib.Checkpointer(str(w)).steps() == [3]


def test_unreachable_remote_data_path_is_one_clear_line(monkeypatch):
  monkeypatch.setenv("BERTJAX_REMOTE_TIMEOUT_S", "3")
  with pytest.raises(dataset.DataPathError, match="gs://no-such-bucket/data: (cannot be read|no answer within 3s)"):
    dataset.read_creation("gs://no-such-bucket/data")


def test_metrics_line_cut_by_a_kill_loses_only_that_line(tmp_path):
  from bertjax.core import writers as metrics
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 2.0}\n{"step": 2, "spl')
  w = metrics.Writer(str(tmp_path))
  w.write(2, {"loss": 1.5})
  w.close()
  rows = metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 2.0), (2, 1.5)]


def test_a_report_killed_while_written_leaves_the_previous_file(tmp_path, monkeypatch):
  """A workdir's report.json (as its config.json and finetune.json) is written whole, then renamed: a kill after
  the write and before the rename (simulated) leaves the previous file intact, and the next write completes."""
  from bertjax import finetune
  from bertjax.core import files
  (tmp_path / "report.json").write_text('{"old": true}')
  report = {"task": "t", "main_metric": "accuracy", "epochs": [], "best": None}
  monkeypatch.setattr(files.os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
  with pytest.raises(KeyboardInterrupt):
    finetune._write_report(str(tmp_path), report)
  assert (tmp_path / "report.json").read_text() == '{"old": true}'
  monkeypatch.undo()
  finetune._write_report(str(tmp_path), report)
  assert json.loads((tmp_path / "report.json").read_text())["task"] == "t"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.txt"]


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
  for x, base in ((a, 0), (b, 100)):  # each a contiguous window of its own list
    assert not x or (x == list(range(x[0], x[0] + len(x))) and base <= x[0] and x[-1] < base + 60)


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


@pytest.mark.parametrize("bound", [True, False])
def test_the_host_runs_at_most_two_steps_ahead_of_the_device(monkeypatch, bound):
  """Dispatch is asynchronous; the loop keeps at most trainer.IN_FLIGHT steps unfinished, so a stop signal
  (a preemption notice) is answered within two steps rather than after every step queued before the next log.
  Unbounded (the second case), the host does run far ahead: the check can fail."""
  import types

  import jax.numpy as jnp

  from bertjax.core import trainer
  if not bound:
    monkeypatch.setattr(trainer, "IN_FLIGHT", 10_000)

  @jax.jit
  def slow(x, batch):
    for _ in range(30):
      x = jnp.tanh(x @ x) * batch
    return x, {"loss": x[0, 0], "grad_norm": x[0, 1]}

  losses, unfinished = [], []

  def train_step(state, batch):
    unfinished.append(sum(not loss.is_ready() for loss in losses))
    state, m = slow(state, batch)
    losses.append(m["loss"])
    return state, m

  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  t = types.SimpleNamespace(train_step=train_step, mesh=mesh, rules=())
  hooks = trainer.Hooks(log=lambda s, h: None, save=lambda s, st: None, log_due=lambda s: False,
                        save_due=lambda s: False)
  slow(jnp.eye(384), 1.0)[0].block_until_ready()  # compiled before timing matters
  state, step, _ = trainer.loop(t, jnp.eye(384) * 0.5, iter([1.0] * 40), 0, 40, hooks)
  jax.block_until_ready(state)
  assert step == 40
  if bound:
    assert max(unfinished) <= trainer.IN_FLIGHT, unfinished
  else:
    assert max(unfinished) > 2, unfinished
