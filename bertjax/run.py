"""The skeleton every training mode runs on (`bertjax.pretrain`, `bertjax.finetune`): the workdir opened (locked,
its mode checked), the checks of a run's own settings, the tokenizer kept in the workdir, the config written, the
state resumed or initialised, the metrics writer, the goodput clock (`bertjax.core.goodput`), and the loop of
`bertjax.core.trainer` with its stop signals.

    with run.opened(workdir, "pretrain"):
      r = run.start(config, workdir, trainer, init=...)   # resume order: the workdir, then `init`, then fresh
      state, step, stopped = r.loop(batches, [run.Stage(trainer, total)], hooks)
      goodput = r.close(stopped)                           # the job's goodput (`bertjax.core.goodput`)
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from typing import Any, Callable

import jax

from bertjax import errors
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files, goodput, optim, writers
from bertjax.core import trainer as trainer_lib
from bertjax.data import tokenizer as tokenizer_lib

PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
MODES = {"pretrain": "pre-training", "finetune": "fine-tuning"}


# ----------------------------------------------------------------------------- a run's own settings
def run_errors(config) -> list[str]:
  """What every mode checks of a run's own settings (optimizer, schedule, PRNG, seed, checkpoints) before
  compiling; each mode adds its own (`bertjax.pretrain.validate`, `bertjax.finetune.validate`)."""
  out = optimizer_errors(config.train)
  if config.train.prng_impl not in PRNG_IMPLS:
    out.append(f"train.prng_impl {config.train.prng_impl!r} is not one of {PRNG_IMPLS}")
  keep = config.keep_checkpoints
  if not _is_int(keep) or keep < 1:
    out.append(f"keep_checkpoints must be an integer >= 1 (how many of the newest checkpoints stay; the newest is "
               f"what a rerun resumes from), got {keep!r}")
  if not _is_int(config.seed) or not 0 <= config.seed < 2 ** 32:
    out.append(f"seed must be an integer in [0, 2**32), got {config.seed!r}")
  return out


def optimizer_errors(train_config) -> list[str]:
  """The optimizer and schedule settings every mode checks before compiling."""
  out = []
  t = optim.settings(train_config)
  if t.schedule not in optim.SCHEDULES:
    out.append(f"train.schedule {t.schedule!r} is not one of {list(optim.SCHEDULES)}")
  if t.decay_shape not in optim.DECAY_SHAPES:
    out.append(f"train.decay_shape {t.decay_shape!r} is not one of {list(optim.DECAY_SHAPES)}")
  if not 0 < t.decay_fraction <= 1:
    out.append(f"train.decay_fraction must be in (0, 1], got {t.decay_fraction}")
  if not 0 <= t.final_lr_ratio <= 1:
    out.append(f"train.final_lr_ratio must be in [0, 1], got {t.final_lr_ratio}")
  if train_config.optimizer not in optim.OPTIMIZERS:
    out.append(f"train.optimizer {train_config.optimizer!r} is not one of {list(optim.OPTIMIZERS)}")
  lr = train_config.learning_rate
  if not _is_number(lr) or not math.isfinite(lr) or lr < 0:
    out.append(f"train.learning_rate must be a finite number >= 0 (0 leaves the weights as they are), got {lr!r}")
  return out


def raise_if(problems: list[str]) -> None:
  """One ConfigError listing every problem found, or nothing."""
  if problems:
    raise errors.ConfigError("invalid config: " + "; ".join(problems))


def _is_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


# ----------------------------------------------------------------------------- the workdir
@contextlib.contextmanager
def opened(workdir: str, mode: str):
  """The workdir locked for the run (a second run pointed at it refuses to start) and checked to hold no run of
  another mode."""
  jax.config.update("jax_threefry_partitionable", True)
  files.reach(workdir)
  with checkpoint_lib.WorkdirLock(workdir):
    check_workdir_mode(workdir, mode)
    yield


def check_workdir_mode(workdir: str, mode: str) -> None:
  """Refuses a workdir that holds a run of the other mode (pre-training vs fine-tuning): its checkpoints are of
  another model, and this run would write over its config."""
  path = files.join(workdir, "config.json")
  if not files.isfile(path):
    return
  try:
    record = files.read_json(path)
    held = record.get("mode", "pretrain")
  except (OSError, ValueError, AttributeError):
    return
  if not ("train" in record or "merged" in record):  # every bertjax run's config has its train section
    raise errors.ConfigError(f"{path} is not a bertjax run's config (another tool's files?); a run there would write "
                             "over it: choose a new --workdir")
  if "merged" in record:
    raise errors.ConfigError(f"{workdir} holds merged weights (python -m bertjax merge), not a run to resume: "
                             f"start from them with init_checkpoint={workdir} and a new --workdir")
  if held != mode:
    hint = (f"; to fine-tune from it pass init={workdir} and a new --workdir" if held == "pretrain" else
            "; choose a new --workdir")
    raise errors.ConfigError(f"{workdir} holds a {MODES.get(held, held)} run, not a {MODES.get(mode, mode)} "
                             f"one{hint}")


def check_same_settings(workdir: str, config, keys: tuple[str, ...], what: str) -> None:
  """Refuses to resume the run in `workdir` (its config.json) with other values of the dotted `keys` (the data,
  start and recipe it learns from): the checkpoint would carry on as if nothing changed and report the old run's
  results as the new settings'."""
  path = files.join(workdir, "config.json")
  if not files.isfile(path):
    return
  try:
    held = files.read_json(path)
  except (OSError, ValueError):
    return
  now = json.loads(config.to_json())

  def at(tree, key):
    for part in key.split("."):
      if not isinstance(tree, dict) or part not in tree:
        return None
      tree = tree[part]
    return tree
  diffs = [f"{k} {at(held, k)!r} there, {at(now, k)!r} here" for k in keys
           if at(held, k) is not None and at(held, k) != at(now, k)]
  if diffs:
    raise errors.ConfigError(f"{workdir} holds a {what} run of other settings ({'; '.join(diffs)}): resume it "
                             "with its own settings or use a new --workdir")


def keep_tokenizer(workdir: str, path: str, do_lower_case: bool) -> tuple[str, bool]:
  """Copies the run's tokenizer into WORKDIR/tokenizer/ (so that prediction, conversion and `init=` need nothing
  outside the workdir) and returns the copy's path; a workdir that already holds another tokenizer is refused."""
  if not path:
    return path, do_lower_case
  folder = files.join(workdir, "tokenizer")
  held = tokenizer_lib.find_in(folder)
  if held is not None:
    if tokenizer_lib.fingerprint(held) != tokenizer_lib.fingerprint(path):
      raise errors.TokenizerError(f"{workdir} was trained with another tokenizer than {path} (its copy: {held}); "
                                  "the ids would not match: use that tokenizer's data or a new --workdir")
    return held, do_lower_case
  if jax.process_index() == 0:
    return tokenizer_lib.copy_into(path, folder), do_lower_case
  return path, do_lower_case


def write_config(workdir: str, config, **json_files: dict) -> None:
  """WORKDIR/config.json (the run's whole config) and any `name=dict` as WORKDIR/name.json (process 0 only)."""
  if jax.process_index() != 0:
    return
  files.makedirs(workdir)
  files.write_whole(files.join(workdir, "config.json"), config.to_json(indent=2))
  for name, obj in json_files.items():
    files.write_whole(files.join(workdir, f"{name}.json"), json.dumps(obj, indent=2))


# ----------------------------------------------------------------------------- the run
@dataclasses.dataclass
class Stage:
  """Steps up to `end` run by one trainer (a pre-training phase; a fine-tuning run is one stage). `enter(state,
  step) -> state` runs where the stage takes over (a phase announces itself, or resets the optimizer)."""
  trainer: trainer_lib.Trainer
  end: int
  enter: Callable[[Any, int], Any] = lambda state, step: state


@dataclasses.dataclass
class Run:
  """A run under way: its trainer, checkpoints and state; `saved` is what the resumed checkpoint keeps beside the
  state (the data position, a fine-tuning run's report), None for a fresh start; `clock` times the attempt for
  the job's goodput."""
  config: Any
  workdir: str
  trainer: trainer_lib.Trainer
  ckpt: checkpoint_lib.Checkpointer
  state: Any
  saved: dict | None
  start: int
  clock: goodput.Recorder
  writer: writers.Writer | None = None

  @property
  def is_main(self) -> bool:
    return jax.process_index() == 0

  def say(self, message: str) -> None:
    """A line on the console, from process 0."""
    if self.is_main:
      print(message, flush=True)

  def open_writer(self) -> writers.Writer:
    """The metrics writer (TensorBoard, metrics.jsonl): rows a stopped run logged past its checkpoint dropped."""
    self.writer = writers.Writer(self.workdir, start_step=self.start)
    self.clock.writer = self.writer
    return self.writer

  def checkpoint(self, step: int, state, data_state: dict) -> None:
    """A checkpoint of `state` with what the mode keeps beside it, and the metrics logged so far written out with
    it (a remote workdir's metrics are buffered until then): a resume finds every row up to its checkpoint."""
    self.ckpt.save(step, state, data_state)
    if self.writer is not None:
      self.writer.flush()

  def loop(self, batches, stages: list[Stage], hooks: trainer_lib.Hooks, step_args: tuple = ()):
    """The run's steps, stage after stage (`Stage`; a stage a resumed run has passed is skipped), on the loop of
    `bertjax.core.trainer` with one rhythm of `hooks`; train.stop_after_steps counts from the run's start across
    stages. Returns (state, last step run, the `trainer.Stop` or None)."""
    step, stopped, stop_after = self.start, None, self.config.train.stop_after_steps
    for stage in stages:
      if stage.end <= step:
        continue
      self.trainer = stage.trainer
      self.state = stage.enter(self.state, step)
      remaining = stop_after - (step - self.start) if stop_after else 0
      self.state, step, stopped = trainer_lib.loop(stage.trainer, self.state, batches, step, stage.end, hooks,
                                                   remaining, step_args, self.clock)
      if stopped is not None:
        break
    return self.state, step, stopped

  def close(self, stopped: trainer_lib.Stop | None = None) -> dict:
    """Waits for the last save, closes the writer and ends the attempt's goodput record (`stopped`: the loop's
    stop reason, None for a finished run); returns the job's goodput summary (`goodput.summarise`)."""
    with self.clock.timing("checkpoint_save"):
      self.ckpt.close()
    if self.writer is not None:
      self.writer.close()
    return self.clock.close(stopped)


def start(config, workdir: str, t: trainer_lib.Trainer, init: Callable[[Any], dict] | None = None,
          init_state: Callable[[], Any] | None = None, keep_steps=(), started: float | None = None) -> Run:
  """The run's state by the resume order: this workdir's newest readable checkpoint, else `init(abstract params)`
  (a partial tree of params to start from: what it holds replaces the fresh parameters) or `init_state()` (a
  whole state: another run's, optimizer included), else fresh. `keep_steps`: checkpoints never rotated out.
  `started`: when the attempt began (the process's start for a command; default now), its goodput's origin."""
  clock = goodput.Recorder(workdir, started)
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.keep_checkpoints, keep_steps=keep_steps)
  init_params = None
  if ckpt.latest_step() is None and init is not None:
    init_params = init(t.abstract.params)
  if ckpt.latest_step() is None and init_state is not None:
    ckpt.set_aside_half_written(lambda m: print(m, flush=True))
    return Run(config, workdir, t, ckpt, init_state(), None, 0, clock)
  with clock.timing("checkpoint_restore") if ckpt.latest_step() is not None else contextlib.nullcontext():
    state, saved, step = trainer_lib.resume_or_init(t, ckpt, config.seed, init_params,
                                                    announce=lambda m: print(m, flush=True))
  return Run(config, workdir, t, ckpt, state, saved, step, clock)
