"""Checkpoints with orbax: model state and data-iterator state saved together, restored together.

Layout: WORKDIR/checkpoints/<step>/{state, data}. Saves are asynchronous; `wait()` surfaces their errors.
Restore tries the latest step first and falls back to earlier ones when a checkpoint is unreadable.
"""
from __future__ import annotations

import logging
import re

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import errors
from bertjax.core import files, storage, workdir

CheckpointError = errors.CheckpointError
WorkdirLockedError = errors.WorkdirLockedError
# Holding a workdir (a lock, or a claim on an object store) lives in core/workdir.py; named here beside its checkpoints.
WorkdirLock, Claim = workdir.WorkdirLock, workdir.Claim

# Orbax splits each replicated array among its replicas to write it in parallel, one device-side slice per replica
# (a dispatched and compiled op each). Below a few MiB per slice the writes are too small to gain from splitting,
# and the slices cost more than they save: a one-process save of a small model on 8 devices spent ~6 s in ~1,300
# of them. Larger arrays (BERT's embedding tables) are still written in parallel.
REPLICA_PARALLEL_MIN_BYTES = 4 << 20
# Orbax announces the override with an absl warning on every import (and absl its "logging before flag parsing"
# line with it): expected here, so kept off the terminal.
_absl_logger = logging.getLogger("absl")
_level, _absl_logger.level = _absl_logger.level, logging.ERROR
try:
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES),
      override=True)
finally:
  _absl_logger.setLevel(_level)


class _ReadOnlyNotes(logging.Filter):
  """Orbax warns that a read-only manager is read-only (twice per reader): what bertjax asked for, kept off the
  terminal."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not ("read_only=True" in text or "directory is read only" in text)


_absl_logger.addFilter(_ReadOnlyNotes())


_TMP = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")


class Checkpointer:
  """A workdir's checkpoints. `keep`: the newest steps kept; `keep_steps`: steps never deleted (a phased run's
  phase ends: ModernBERT-style pre-decay checkpoints stay for annealing); `read_only`: another run's workdir,
  read and never changed (nothing created, nothing set aside)."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True, keep_steps=(), read_only: bool = False):
    self._pending = None  # the step of a save still running in the background
    self.read_only = read_only
    self.directory = files.join(files.absolute(workdir), "checkpoints")
    if read_only:
      options = ocp.CheckpointManagerOptions(create=False, read_only=True)
    elif keep_steps:
      from orbax.checkpoint import checkpoint_managers as policies
      options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=async_save,
                                             preservation_policy=policies.AnyPreservationPolicy([
                                                 policies.LatestN(keep), policies.CustomSteps(list(keep_steps))]))
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=async_save)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data"),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})

  def _committed(self, step: int) -> bool:
    """Orbax's commit marker is written last, locally and on object stores alike."""
    return files.exists(files.join(self.directory, str(step), "commit_success.txt"))

  def half_written(self) -> list[str]:
    """Entries a killed save left behind: temporary directories and steps without their commit marker."""
    if not files.isdir(self.directory):
      return []
    names = files.listdir(self.directory)
    out = {n for n in names if _TMP.match(n)}
    # Orbax lists only finalised steps on an object store, where a killed save leaves its step's folder without
    # the commit marker: such folders are read off the listing itself.
    out |= {n for n in names if n.isdigit() and not self._committed(int(n))}
    out |= {str(s) for s in self.manager.all_steps() if not self._committed(s)}
    return sorted(out)

  def steps(self) -> list[int]:
    """Committed steps, oldest first."""
    return sorted(s for s in self.manager.all_steps() if self._committed(s))

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, step: int, state, data_state: dict) -> None:
    """Start an asynchronous save; a failure (e.g. disk full) is a CheckpointError naming the step. The previous
    save is finished first, so that its failure is reported under its own step."""
    self.wait()
    try:
      self.manager.save(int(step), args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(dict(data_state))), force=True)
    except Exception as e:
      prev = [s for s in self.steps() if s != step]
      raise CheckpointError(f"saving the checkpoint at step {step} in {self.directory} failed: "
                            f"{short_error(e)}. The previous checkpoint "
                            f"({prev[-1] if prev else 'none'}) is untouched.") from None
    self._pending = int(step)

  def restore(self, abstract_state, step: int | None = None, announce=print):
    """(state, data_state, step) from `step` or the newest readable checkpoint.

    Newer steps that cannot be read (a truncated, deleted or corrupted file) are skipped, each named in one line
    through `announce`, and moved out of the step sequence into WORKDIR/damaged_checkpoints/ (kept, not deleted)
    so that the run can save those steps again. Nothing is moved unless an older step restores.
    """
    candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
    if not candidates:
      raise CheckpointError(f"{self.directory}: no checkpoint")
    skipped = []
    for s in candidates:
      try:
        metadata = _state_metadata(self.manager, s)
      except Exception as e:
        skipped.append((s, short_error(e)))
        continue
      check_params_fit(metadata["params"], abstract_state.params)
      try:
        out = self.manager.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
      except (ValueError, KeyError, TypeError) as e:
        if _is_mismatch(e):
          raise CheckpointError(f"{self.directory}/{s}: checkpoint does not fit this run: {short_error(e)}") from None
        skipped.append((s, short_error(e)))
        continue
      except Exception as e:
        skipped.append((s, short_error(e)))
        continue
      self._set_aside(skipped, announce)
      return out["state"], out["data"], s
    raise CheckpointError(f"{self.directory}: no readable checkpoint among steps {candidates}: "
                          + "; ".join(f"step {s}: {why}" for s, why in skipped))

  def data_state(self, step: int) -> dict:
    """What the checkpoint at `step` keeps beside the state (the data position, the learning rate)."""
    out = self.manager.restore(int(step), args=ocp.args.Composite(data=ocp.args.JsonRestore()))
    return dict(out["data"] or {})

  def set_aside_half_written(self, announce=print) -> None:
    """Moves what killed saves left (temporary folders, steps without their commit marker) to
    WORKDIR/damaged_checkpoints/, so that the run can save those steps again; a training run calls it before it
    saves (read-only tools leave a workdir as it is)."""
    leftovers = self.half_written()
    if leftovers:
      announce(f"note: ignoring half-written checkpoint(s) {leftovers} in {self.directory} (a killed save)")
      self._move_aside([(name, "half-written") for name in leftovers], announce=None)

  def _set_aside(self, skipped, announce) -> None:
    """Moves unreadable steps newer than the restored one to WORKDIR/damaged_checkpoints/ (process 0); a
    read-only checkpointer only names them."""
    if skipped and self.read_only:
      for name, why in skipped:
        announce(f"note: skipped the unreadable checkpoint at step {name} in {self.directory} ({why})")
    elif skipped:
      self._move_aside(skipped, announce)

  def _move_aside(self, entries, announce) -> None:
    aside = files.join(files.parent(self.directory), "damaged_checkpoints")
    for name, why in entries:
      where = ""
      if jax.process_index() == 0:
        files.makedirs(aside)
        target = files.join(aside, str(name))
        n = 1
        while files.exists(target):
          target, n = files.join(aside, f"{name}.{n}"), n + 1
        files.rename(files.join(self.directory, str(name)), target)
        where = f"; moved to {target}"
      if announce is not None:
        announce(f"note: skipped the unreadable checkpoint at step {name} ({why}){where}")
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("bertjax_damaged_checkpoints_set_aside")
    storage.forget_listings()  # orbax lists steps through fsspec, whose listings may predate the move
    self.manager.reload()

  def restore_params(self, step: int | None = None, announce=print, item: str = "params"):
    """The params of the newest readable checkpoint (or of `step`) as host arrays, whatever optimizer wrote it;
    only the parameters are read (`item="ema"`: the moving average of them a run with train.ema_decay keeps).
    Unreadable newer steps are skipped and named through `announce` (nothing is moved: read-only tools do not
    change a workdir)."""
    candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
    if not candidates:
      raise CheckpointError(f"{self.directory}: no checkpoint to initialise from")
    reader = ocp.CheckpointManager(self.directory, item_names=("state", "data"),
                                   item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                                                  "data": ocp.JsonCheckpointHandler()},
                                   options=ocp.CheckpointManagerOptions(create=False))
    skipped = []
    for s in candidates:
      try:
        saved = _state_metadata(reader, s)
        if item not in saved:
          raise CheckpointError(f"{self.directory}/{s}: holds no {item!r}" + (
              " (the run kept no moving average: train.ema_decay was 0)" if item == "ema" else ""))
        meta = saved[item]
        tree = {item: jax.tree_util.tree_map(lambda m: np.zeros(m.shape, m.dtype), meta)}
        restore_args = {item: jax.tree_util.tree_map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), meta)}
        out = reader.restore(s, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=tree, restore_args=restore_args, partial_restore=True)))
      except CheckpointError:
        raise
      except Exception as e:
        skipped.append((s, short_error(e)))
        continue
      for bad, why in skipped:
        announce(f"note: skipped the unreadable checkpoint at step {bad} in {self.directory} ({why}); using step {s}")
      return jax.tree_util.tree_map(np.asarray, out["state"][item])
    raise CheckpointError(f"{self.directory}: no readable checkpoint among steps {candidates}: "
                          + "; ".join(f"step {s}: {why}" for s, why in skipped))

  def wait(self) -> None:
    """Wait for asynchronous saves; their errors surface here as CheckpointError."""
    pending, self._pending = self._pending, None
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      prev = [s for s in self.steps() if s != pending]
      raise CheckpointError(f"saving the checkpoint at step {pending} in {self.directory} failed: {short_error(e)}. "
                            f"The previous checkpoint ({prev[-1] if prev else 'none'}) is untouched.") from None

  def close(self) -> None:
    self.wait()
    self.manager.close()


def restore_best(workdir: str) -> dict:
  """The parameters a fine-tuning run kept as its best (WORKDIR/best), as host arrays."""
  best = files.join(files.absolute(workdir), "best")
  has_steps = files.isdir(files.join(workdir, "checkpoints"))
  if not files.isdir(best) and not has_steps:
    raise CheckpointError(f"{workdir}: no best/ parameters (the fine-tuning run has not finished an epoch)")
  try:
    if not files.isdir(best):
      raise FileNotFoundError("missing")
    params = ocp.StandardCheckpointer().restore(best)
  except Exception as e:
    why = short_error(e)
    if not has_steps:
      raise CheckpointError(f"{best}: unreadable ({why}) and the workdir holds no other checkpoint") from None
    print(f"note: {best} is unreadable ({why}); using the newest readable training checkpoint instead",
          flush=True)
    return Checkpointer(workdir, read_only=True).restore_params()
  return jax.tree_util.tree_map(np.asarray, params)


def save_best(workdir: str, params) -> None:
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(files.join(files.absolute(workdir), "best"), params, force=True)
  ckpt.wait_until_finished()


def check_params_fit(params, abstract_params) -> None:
  """A clear error naming every parameter whose presence or shape differs from the model's."""
  def shapes(tree):
    return {jax.tree_util.keystr(p): tuple(getattr(x, "shape", np.shape(x)))
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}
  got, want = shapes(params), shapes(abstract_params)
  problems = [f"{k}: checkpoint {got[k]}, model {want[k]}" for k in sorted(set(got) & set(want)) if got[k] != want[k]]
  problems += [f"{k}: missing from the checkpoint" for k in sorted(set(want) - set(got))]
  problems += [f"{k}: not in the model" for k in sorted(set(got) - set(want))]
  if problems:
    raise CheckpointError(f"checkpoint does not fit the model ({len(problems)} parameter(s)): "
                          + "; ".join(problems[:20]))


def _state_metadata(manager, step: int):
  """The state item's tree metadata at `step`; a ValueError naming the file when it is missing or unreadable."""
  try:
    metadata = manager.item_metadata(step)["state"]
  except Exception as e:
    raise ValueError(f"state/_METADATA unreadable ({short_error(e, 100)})") from None
  if metadata is None or "params" not in metadata:
    raise ValueError("state/_METADATA is missing")
  return metadata


def short_error(e: BaseException, limit: int = 160) -> str:
  """An exception as a short phrase: its type and the first line of its message, cut at `limit` characters
  (tensorstore's messages repeat the whole spec of the array they failed on)."""
  first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
  text = f"{type(e).__name__}: {first}" if first else type(e).__name__
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_mismatch(e: Exception) -> bool:
  text = str(e).lower()
  return any(w in text for w in ("shape", "structure", "mismatch", "does not match", "not compatible"))
