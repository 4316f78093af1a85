"""Checkpoints with orbax: model state and data-iterator state saved together, restored together.

Layout: WORKDIR/checkpoints/<step>/{state, data}. Saves are asynchronous; `wait()` surfaces their errors.
Restore tries the latest step first and falls back to earlier ones when a checkpoint is unreadable.
"""
from __future__ import annotations

import logging
import os

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """No usable checkpoint where one was expected, or one that does not fit the model."""


class Checkpointer:
  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict) -> None:
    self.manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(dict(data_state))), force=True)

  def restore(self, abstract_state, step: int | None = None):
    """(state, data_state, step) from `step` or the newest readable checkpoint."""
    candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
    if not candidates:
      raise CheckpointError(f"{self.directory}: no checkpoint")
    errors = []
    for s in candidates:
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
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _is_mismatch(e: Exception) -> bool:
  text = str(e).lower()
  return any(w in text for w in ("shape", "structure", "mismatch", "does not match", "not compatible"))
