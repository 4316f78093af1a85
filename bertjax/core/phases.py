"""A run in phases, as the encoders of 2025 are trained (ModernBERT: 1,024-token pre-training, an 8,192-token
context phase with RoPE θ raised, a decay phase; mmBERT: the masking rate and the mixture's temperature falling
phase by phase): the step arithmetic of each phase and the run's learning rate as one function of the global step.

A config lists its phases in `phase_order` ("stable,context,decay") and describes each in `phases.<name>` with
the fields of `FIELDS` (configs/common.py `phase(...)` writes one); 0, "" and -1 mean "as the run's own
setting" where the table says so. An empty `phase_order` is one phase made of the run's own settings, so every
config is a plan of phases. What a phase reads (its data mixture, its model switches) is the mode's
(`bertjax.pretrain.plan`); this module knows steps, tokens, batch sizes, masking rates and learning rates.
"""
from __future__ import annotations

import dataclasses
import math

import ml_collections

from bertjax.core import optim

PREVIOUS = -1.0  # a learning rate (peak or warmup start) taken from where the previous phase, or the init, ended

# name -> (default, meaning). 0 / "" / -1 defer to the run's own setting where the meaning says so.
FIELDS = {
    "steps": (0, "optimizer steps in the phase (or give tokens)"),
    "tokens": (0, "token slots (sequences x length) in the phase; its steps follow from the batch sizes"),
    "seq": (0, "sequence length; 0 = data.max_seq_length (every source of the phase must be made at it)"),
    "global_batch_size": (0, "sequences per step once warmed up; 0 = train.global_batch_size"),
    "batch_warmup_tokens": (-1, "the batch ramps from batch_warmup_from to global_batch_size over these token "
                                "slots; -1 = train.batch_warmup_tokens, 0 = no ramp"),
    "batch_warmup_from": (0, "the batch at the start of the ramp; 0 = train.batch_warmup_from"),
    "batch_warmup_levels": (0, "distinct batch sizes (compiled shapes) in the ramp; 0 = train.batch_warmup_levels"),
    "mixture": ("", "sources and weights, 'web=0.7,code=0.3' or 'web,code' (weights = sizes); '' = every source "
                    "of data.sources, or data.data_dir"),
    "temperature": (1.0, "p_i ∝ w_i^τ over the mixture's weights (sizes where none are given): 1 keeps them, "
                         "lower evens them out (mmBERT: 0.7, 0.5, 0.3)"),
    "masked_lm_prob": (0.0, "masking rate at the phase's start; 0 = data.masked_lm_prob"),
    "masked_lm_prob_end": (0.0, "masking rate at its end, linear in between; 0 = constant"),
    "rope_theta": (0.0, "rotary θ of the global layers; 0 = model.rope_theta"),
    "rope_theta_local": (0.0, "rotary θ of the sliding-window layers; 0 = model.rope_theta_local"),
    "local_attention": (-1, "sliding window; -1 = model.local_attention"),
    "learning_rate": (0.0, "peak learning rate; 0 = train.learning_rate, -1 = the rate the previous phase (or "
                           "the init checkpoint) ended at"),
    "warmup_steps": (0, "steps from warmup_from up to the peak"),
    "warmup_from": (PREVIOUS, "the rate the warmup starts at; -1 = where the previous phase ended (0 first)"),
    "schedule": ("constant", "after warmup: constant | wsd | linear | linear_from_warmup | cosine | inverse_sqrt"),
    "decay_fraction": (0.1, "wsd: the last fraction of the phase decays (1.0: the whole phase is a decay)"),
    "decay_shape": ("1-sqrt", "wsd: linear | cosine | 1-sqrt"),
    "final_lr_ratio": (0.0, "cosine, wsd: the phase ends at peak x this"),
    "optimizer": ("keep", "keep | reset: the optimizer state (Adam's moments and count) at the phase's start"),
}
# The run-level settings of the same moving parts, for a run of one phase.
RUN_FIELDS = {"batch_warmup_tokens": 0, "batch_warmup_from": 0, "batch_warmup_levels": 4}


def defaults(**overrides) -> ml_collections.ConfigDict:
  """A phase's config: every field of FIELDS at its default but `overrides`."""
  unknown = set(overrides) - set(FIELDS)
  if unknown:
    raise ValueError(f"unknown phase fields {sorted(unknown)}; known: {sorted(FIELDS)}")
  return ml_collections.ConfigDict({k: overrides.get(k, d) for k, (d, _) in FIELDS.items()})


def names(config) -> list[str]:
  """The phases in the order they run (empty for a run of one phase)."""
  order = config.get("phase_order", "") or ""
  return [n.strip() for n in order.split(",") if n.strip()]


def train_setting(config, name: str):
  return config.train.get(name, RUN_FIELDS[name])


def resolved(config) -> list[tuple[str, ml_collections.ConfigDict]]:
  """(name, phase config) in order with every deferring field filled from the run's settings. A run without
  `phase_order` is one phase, "main", of its own settings and train.num_steps; its learning rate is the run's
  schedule (`optim.schedule`)."""
  t, d = optim.settings(config.train), config.data
  run = dict(seq=d.max_seq_length, global_batch_size=t.global_batch_size, masked_lm_prob=d.masked_lm_prob,
             masked_lm_prob_end=d.get("masked_lm_prob_end", 0.0) or 0.0, learning_rate=t.learning_rate,
             rope_theta=config.model.get("rope_theta", 0.0), rope_theta_local=config.model.get("rope_theta_local", 0.0),
             local_attention=config.model.get("local_attention", 0),
             **{k: train_setting(config, k) for k in RUN_FIELDS})
  order = names(config)
  if not order:
    p = defaults(steps=t.num_steps, warmup_steps=t.warmup_steps, schedule=t.schedule, decay_fraction=t.decay_fraction,
                 decay_shape=t.decay_shape, final_lr_ratio=t.final_lr_ratio, warmup_from=0.0)
    p.global_batch_size = run["global_batch_size"]
    seqs = [("main", p)]
  else:
    seqs = [(n, ml_collections.ConfigDict(config.phases[n].to_dict())) for n in order if n in config.phases]
  out = []
  for name, p in seqs:
    p = defaults(**{k: v for k, v in p.items() if k in FIELDS})
    for key in ("seq", "global_batch_size", "masked_lm_prob", "batch_warmup_from", "batch_warmup_levels",
                "rope_theta", "rope_theta_local"):
      if not p[key]:
        p[key] = run[key]
    if p.learning_rate == 0:
      p.learning_rate = run["learning_rate"]
    if p.local_attention == -1:
      p.local_attention = run["local_attention"]
    if p.batch_warmup_tokens == -1:
      p.batch_warmup_tokens = run["batch_warmup_tokens"]
    if not p.masked_lm_prob_end:  # a run of one phase may set its own end rate (data.masked_lm_prob_end)
      p.masked_lm_prob_end = (run["masked_lm_prob_end"] if not order else 0.0) or p.masked_lm_prob
    out.append((name, p))
  return out


def field_errors(config, granularity: int) -> list[str]:
  """Every problem of the phases' own settings (what data they read is checked by the mode), one line each."""
  out = []
  order = names(config)
  if len(set(order)) != len(order):
    out.append(f"phase_order {config.phase_order!r} names a phase twice")
  known = sorted(config.get("phases", {}) or {})
  for n in order:
    if n not in known:
      out.append(f"phase_order names {n!r}, which config.phases does not define (it has {known})")
  for name, p in resolved(config):
    where = f"phases.{name}" if order else "train"
    if (p.steps > 0) == (p.tokens > 0) or p.steps < 0 or p.tokens < 0:
      out.append(f"{where}: give its length as steps or as tokens (one of them, positive); got steps={p.steps}, "
                 f"tokens={p.tokens}")
    b = p.global_batch_size
    if not isinstance(b, int) or b <= 0 or b % granularity:
      out.append(f"{where}: global_batch_size {b!r} must be a positive multiple of {granularity} (the data-parallel "
                 "size times train.grad_accum_steps)")
    if p.batch_warmup_tokens:
      if p.batch_warmup_tokens < 0 or not 0 < p.batch_warmup_from < b or p.batch_warmup_from % granularity:
        out.append(f"{where}: the batch warmup ramps from batch_warmup_from ({p.batch_warmup_from}) to "
                   f"global_batch_size ({b}) over batch_warmup_tokens ({p.batch_warmup_tokens}): it needs 0 < from "
                   f"< global_batch_size, from a multiple of {granularity}, and tokens > 0")
      if not isinstance(p.batch_warmup_levels, int) or p.batch_warmup_levels < 2:
        out.append(f"{where}: batch_warmup_levels must be an integer >= 2, got {p.batch_warmup_levels!r}")
    for key in ("masked_lm_prob", "masked_lm_prob_end"):
      if not 0 < p[key] < 1:
        out.append(f"{where}: {key} must be in (0, 1), got {p[key]}")
    if not (isinstance(p.temperature, (int, float)) and math.isfinite(p.temperature) and p.temperature > 0):
      out.append(f"{where}: temperature must be a number > 0 (p_i ∝ w_i^τ), got {p.temperature!r}")
    if p.optimizer not in ("keep", "reset"):
      out.append(f"{where}: optimizer must be keep or reset, got {p.optimizer!r}")
    if p.schedule not in optim.SCHEDULES:
      out.append(f"{where}: schedule {p.schedule!r} is not one of {list(optim.SCHEDULES)}")
    if p.decay_shape not in optim.DECAY_SHAPES:
      out.append(f"{where}: decay_shape {p.decay_shape!r} is not one of {list(optim.DECAY_SHAPES)}")
    if not 0 < p.decay_fraction <= 1 or not 0 <= p.final_lr_ratio <= 1:
      out.append(f"{where}: decay_fraction must be in (0, 1] and final_lr_ratio in [0, 1]")
    if not isinstance(p.warmup_steps, int) or p.warmup_steps < 0:
      out.append(f"{where}: warmup_steps must be an integer >= 0, got {p.warmup_steps!r}")
    for key in ("learning_rate", "warmup_from"):
      v = p[key]
      if not isinstance(v, (int, float)) or not math.isfinite(v) or (v < 0 and v != PREVIOUS):
        out.append(f"{where}: {key} must be a finite number >= 0 or -1 (the previous phase's last rate), got {v!r}")
  return out


def warmup_levels(target: int, start: int, levels: int) -> list[int]:
  """The batch sizes of a ramp from `start` to `target`: `levels` evenly spaced sizes, each rounded down to a
  multiple of gcd(start, target), repeats dropped. The unit is the config's, not the data-parallel size's: a run
  resumed on another number of devices runs the same sizes, and every size stays a multiple of any data-parallel
  size that divides both ends (what `field_errors` asks)."""
  unit = math.gcd(start, target)
  sizes = []
  for k in range(levels):
    size = start + (target - start) * k / (levels - 1)
    size = max(unit, int(size // unit) * unit)
    if not sizes or size > sizes[-1]:
      sizes.append(size)
  sizes[-1] = target
  return sizes


def batch_sizes(p) -> tuple[int, ...]:
  """The global batch of each step of a phase: during the ramp, the largest level not above the linear ramp at
  the token slots read so far; then global_batch_size. The phase's length in steps is p.steps, or the steps it
  takes to read p.tokens."""
  target, seq = p.global_batch_size, p.seq
  out, tokens = [], 0
  if p.batch_warmup_tokens > 0:
    levels = warmup_levels(target, p.batch_warmup_from, p.batch_warmup_levels)
    start = levels[0]
    while tokens < p.batch_warmup_tokens and (p.steps == 0 or len(out) < p.steps) and (
        p.tokens == 0 or tokens < p.tokens):
      ramp = start + (target - start) * tokens / p.batch_warmup_tokens
      size = max(s for s in levels if s <= ramp)
      out.append(size)
      tokens += size * seq
  if p.steps:
    out += [target] * (p.steps - len(out))
  else:
    out += [target] * max(0, math.ceil((p.tokens - tokens) / (target * seq)))
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class PhaseSteps:
  """One phase's steps: global steps [start, end) (the update of step k moves the state from k to k + 1)."""
  name: str
  start: int
  end: int
  settings: ml_collections.ConfigDict
  batch_sizes: tuple
  lr_peak: float
  lr_from: float

  @property
  def steps(self) -> int:
    return self.end - self.start

  @property
  def reset_optimizer(self) -> bool:
    return self.settings.optimizer == "reset"

  def mask_rate(self, step: int) -> float:
    """The masking rate at global step `step`: linear from masked_lm_prob to masked_lm_prob_end."""
    a, b = self.settings.masked_lm_prob, self.settings.masked_lm_prob_end
    return a + (b - a) * (step - self.start) / max(self.steps - 1, 1)

  def local_lr(self):
    p = self.settings
    return optim.schedule(self.lr_peak, p.warmup_steps, self.steps, p.schedule, decay_fraction=p.decay_fraction,
                          decay_shape=p.decay_shape, final_lr_ratio=p.final_lr_ratio, warmup_from=self.lr_from)

  def last_lr(self) -> float:
    return float(self.local_lr()(self.steps - 1))


def plan(config, granularity: int, init_lr: float | None = None) -> list[PhaseSteps]:
  """The phases' steps in order. `init_lr`: the rate an init checkpoint stood at (for learning_rate or
  warmup_from -1 in the first phase). Checked settings are assumed (`field_errors`). The plan is the config's
  alone, the same on any number of devices; a ValueError names a batch that `granularity` (the data-parallel size
  times the micro-batches per step) does not divide."""
  out, start, previous = [], 0, init_lr
  for name, p in resolved(config):
    sizes = batch_sizes(p)
    odd = sorted({b for b in sizes if b % granularity})
    if odd:
      raise ValueError(f"phase {name!r}: batch sizes {odd} are not multiples of {granularity} (the data-parallel "
                       "size times train.grad_accum_steps)")
    peak, begin = p.learning_rate, p.warmup_from
    if peak == PREVIOUS or begin == PREVIOUS:
      if previous is None and (peak == PREVIOUS or (begin == PREVIOUS and out)):
        raise ValueError(f"phase {name!r} starts from the previous phase's learning rate, and there is none")
      peak = previous if peak == PREVIOUS else peak
      begin = (previous if previous is not None else 0.0) if begin == PREVIOUS else begin
    phase = PhaseSteps(name, start, start + len(sizes), p, sizes, float(peak), float(begin))
    out.append(phase)
    start, previous = phase.end, phase.last_lr() if phase.steps else previous
  return out


def lr_function(phases: list[PhaseSteps]):
  """The run's learning rate at a global step: each phase's segment over its own steps (the last one's beyond)."""
  import jax.numpy as jnp
  fns = [(p.start, p.end, p.local_lr()) for p in phases]

  def fn(step):
    step = jnp.asarray(step)
    out = fns[-1][2](step - fns[-1][0])
    for start, end, f in reversed(fns[:-1]):
      out = jnp.where(step < end, f(step - start), out)
    return out
  return fn
