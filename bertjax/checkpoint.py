"""Checkpoints with orbax: model state and data-iterator state saved together, restored together.

Layout: WORKDIR/checkpoints/<step>/{state, data}. Saves are asynchronous; `wait()` surfaces their errors.
Restore tries the latest step first and falls back to earlier ones when a checkpoint is unreadable.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import errors


CheckpointError = errors.CheckpointError
WorkdirLockedError = errors.WorkdirLockedError


class WorkdirLock:
  """An exclusive lock on WORKDIR/.lock (released by the OS when the holder dies, even by kill -9).

  Remote workdirs (gs://) cannot be locked this way; there the launcher must start one run per workdir.
  """

  def __init__(self, workdir: str):
    self.path = None if "://" in workdir else os.path.join(workdir, ".lock")
    self._fd = None

  def __enter__(self):
    if self.path is None or jax.process_index() != 0:
      return self
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      if e.errno in (errno.EAGAIN, errno.EACCES):
        raise WorkdirLockedError(f"{os.path.dirname(self.path)} is in use by another run (pid {holder}); "
                                 "two runs must not write one workdir. Stop it or choose another --workdir.") from None
      raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    self._fd = fd
    return self

  def __exit__(self, *exc):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


_TMP = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")


class Checkpointer:
  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data"),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})

  def _committed(self, step: int) -> bool:
    if "://" in self.directory:
      return True  # remote stores: orbax's own atomic finalisation
    return os.path.exists(os.path.join(self.directory, str(step), "commit_success.txt"))

  def half_written(self) -> list[str]:
    """Entries a killed save left behind: temporary directories and steps without their commit marker."""
    if "://" in self.directory or not os.path.isdir(self.directory):
      return []
    out = [n for n in os.listdir(self.directory) if _TMP.match(n)]
    out += [str(s) for s in self.manager.all_steps() if not self._committed(s)]
    return sorted(out)

  def steps(self) -> list[int]:
    """Committed steps, oldest first."""
    return sorted(s for s in self.manager.all_steps() if self._committed(s))

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, step: int, state, data_state: dict) -> None:
    """Start an asynchronous save; a failure (e.g. disk full) is a CheckpointError naming the step."""
    try:
      self.manager.save(int(step), args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(dict(data_state))), force=True)
    except Exception as e:  # pylint: disable=broad-except
      prev = [s for s in self.steps() if s != step]
      raise CheckpointError(f"saving the checkpoint at step {step} in {self.directory} failed: "
                            f"{type(e).__name__}: {e}. The previous checkpoint "
                            f"({prev[-1] if prev else 'none'}) is untouched.") from e

  def restore(self, abstract_state, step: int | None = None):
    """(state, data_state, step) from `step` or the newest readable checkpoint."""
    candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
    if not candidates:
      raise CheckpointError(f"{self.directory}: no checkpoint")
    errors = [f"{name}: half-written (no commit marker), skipped" for name in self.half_written()]
    for s in candidates:
      try:
        metadata = self.manager.item_metadata(s)["state"]
      except Exception:  # pylint: disable=broad-except
        metadata = None  # unreadable metadata: the restore below reports it
      if metadata is not None and "params" in metadata:
        check_params_fit(metadata["params"], abstract_state.params)
      try:
        out = self.manager.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        if errors:
          logging.warning("restored checkpoint %d after skipping unreadable ones: %s", s, "; ".join(errors))
        return out["state"], out["data"], s
      except (ValueError, KeyError, TypeError) as e:
        if _is_mismatch(e):
          raise CheckpointError(f"{self.directory}/{s}: checkpoint does not fit this model: {e}") from None
        errors.append(f"step {s}: {type(e).__name__}: {str(e)[:300]}")
      except Exception as e:  # unreadable (half-written, truncated): try an older one
        errors.append(f"step {s}: {type(e).__name__}: {str(e)[:300]}")
    raise CheckpointError(f"{self.directory}: no readable checkpoint among steps {candidates}: " + "; ".join(errors))

  def restore_params(self, step: int | None = None):
    """The params of a checkpoint as host arrays, whatever optimizer wrote it (for an init checkpoint)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"{self.directory}: no checkpoint to initialise from")
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(None)))
    return jax.tree_util.tree_map(np.asarray, out["state"]["params"])

  def wait(self) -> None:
    """Wait for asynchronous saves; their errors surface here as CheckpointError."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"an asynchronous checkpoint save in {self.directory} failed: {type(e).__name__}: "
                            f"{e}") from e

  def close(self) -> None:
    self.wait()
    self.manager.close()


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


def _is_mismatch(e: Exception) -> bool:
  text = str(e).lower()
  return any(w in text for w in ("shape", "structure", "mismatch", "does not match", "not compatible"))
