"""What each phase of a pre-training run reads and runs: its sources (data folders made by `python -m bertjax
dataset`) mixed by weight or temperature, its masking, its model switches (rotary θ, sliding window), and the
checks of all of it against the data and the model, one line per problem, before anything compiles.

`config.data.sources` names the data folders ({name: folder}); a phase's `mixture` picks among them. A run
without sources reads `data.data_dir` alone, as the source named "data". The step arithmetic (lengths, batch
ramps, learning rates) is `bertjax.core.phases`.
"""
from __future__ import annotations

import dataclasses
import math
import random

import ml_collections

from bertjax import errors
from bertjax import model as model_lib
from bertjax.core import files
from bertjax.core import phases as phases_lib
from bertjax.data import packing
from bertjax.data.pretraining import dataset, mixture
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline

WHEN_EXHAUSTED = ("repeat", "stop")
MODEL_FIELDS = ("rope_theta", "rope_theta_local", "local_attention")


def sources(config) -> dict[str, str]:
  """{source name: data folder}: data.sources, or {"data": data.data_dir}."""
  named = dict(config.data.sources)
  if named:
    return {str(k): str(v) for k, v in named.items()}
  return {"data": config.data.data_dir} if config.data.data_dir else {}


def moves(config) -> bool:
  """Whether the run is more than its own fixed settings over data.data_dir: named phases or sources, a batch
  ramp or a moving masking rate. Such a run is checked phase by phase and source by source (`errors_of`); a run
  of fixed settings is checked against its one folder's creation as the data section (`checks.validate`)."""
  return bool(phases_lib.names(config) or config.data.sources or phases_lib.train_setting(config, "batch_warmup_tokens")
              or config.data.masked_lm_prob_end)


def parse_mixture(text: str, known: list[str]) -> tuple[list[tuple[str, float | None]], list[str]]:
  """'web=0.7,code=0.3' | 'web,code' | '' (every source) -> ([(name, weight or None)], problems)."""
  if not text.strip():
    return [(n, None) for n in known], []
  out, problems = [], []
  for item in text.split(","):
    name, _, weight = (s.strip() for s in item.partition("="))
    if name not in known:
      problems.append(f"names the source {name!r}, which data.sources does not define (it has {known})")
      continue
    w = None
    if weight:
      try:
        w = float(weight)
      except ValueError:
        w = math.nan
      if not math.isfinite(w) or w <= 0:
        problems.append(f"gives {name!r} the weight {weight!r}: a weight must be a number > 0")
        continue
    out.append((name, w))
  if len({n for n, _ in out}) != len(out):
    problems.append("names a source twice")
  if out and len({w is None for _, w in out}) > 1:
    problems.append("gives weights to some sources and not to others")
  return out, problems


def mixture_weights(entries, sizes: dict[str, int], temperature: float) -> list[float]:
  """p_i ∝ w_i^τ, w_i the weight given or the source's size."""
  base = [w if w is not None else (sizes.get(n) or 1) for n, w in entries]
  return mixture.temperature_weights(base, temperature)


# ----------------------------------------------------------------------------- checks
def errors_of(config, mcfg, creations: dict[str, dict], granularity: int) -> list[str]:
  """Every problem of the phases and their sources; `creations` holds each readable source's creation record
  (an unreadable one is already a problem of its own)."""
  out = phases_lib.field_errors(config, granularity)
  names = phases_lib.names(config)
  if config.data.when_exhausted not in WHEN_EXHAUSTED:
    out.append(f"data.when_exhausted {config.data.when_exhausted!r} is not one of {list(WHEN_EXHAUSTED)}")
  total = config.train.num_steps
  if names and not out:
    plan_steps = sum(p.steps for p in phases_lib.plan(config, granularity, init_lr=0.0))
    if total and total != plan_steps:
      out.append(f"the phases add up to {plan_steps} steps but train.num_steps is {total}: set "
                 f"--config.train.num_steps=0 (the phases' total) or change the phases")
  if config.data.packing:
    out.append("data.packing with phases, sources or moving batch/masking is not supported: use unpacked data")
  known = list(sources(config))
  tok_of, vocab_of = {}, {}
  for name, p in phases_lib.resolved(config):
    where = f"phases.{name}" if names else "the run"
    entries, problems = parse_mixture(p.mixture, known)
    out += [f"{where}: mixture {p.mixture!r} {m}" for m in problems]
    if mcfg is not None:
      out += _model_errors(where, p, mcfg)
    made = []
    for src, _ in entries:
      c = creations.get(src)
      if c is None:
        continue
      o = c["options"]
      made.append((src, o))
      tok_of[src] = c.get("tokenizer_sha256") or c.get("tokenizer")
      if o["max_seq_length"] != p.seq:
        out.append(f"{where}: source {src!r} ({sources(config)[src]}) was made at max_seq_length "
                   f"{o['max_seq_length']}, the phase runs at {p.seq}")
      if mcfg is not None and c.get("vocab_size") not in (None, mcfg.vocab_size):
        vocab_of[src] = c["vocab_size"]
      if o.get("example_mode", "nsp_pairs") != config.data.example_mode:
        out.append(f"{where}: source {src!r} was made as {o.get('example_mode', 'nsp_pairs')!r}, the run reads "
                   f"{config.data.example_mode!r}")
      need = pretraining.max_predictions(p.seq, max(p.masked_lm_prob, p.masked_lm_prob_end))
      moving = p.masked_lm_prob != p.masked_lm_prob_end or not math.isclose(p.masked_lm_prob, o["masked_lm_prob"])
      if moving and not config.data.dynamic_masking:
        out.append(f"{where}: masks at {p.masked_lm_prob}-{p.masked_lm_prob_end} but source {src!r} was masked "
                   f"once at {o['masked_lm_prob']}: set data.dynamic_masking=True to mask in the pipeline")
      elif need > o["max_predictions_per_seq"]:
        out.append(f"{where}: masking at {max(p.masked_lm_prob, p.masked_lm_prob_end)} needs {need} masked "
                   f"positions per example, source {src!r} holds {o['max_predictions_per_seq']}: make it with "
                   f"--max_predictions_per_seq {need} or more")
    if len({o["max_predictions_per_seq"] for _, o in made}) > 1:
      out.append(f"{where}: its sources hold different max_predictions_per_seq "
                 f"({ {s: o['max_predictions_per_seq'] for s, o in made} }): make them alike")
  if len(set(tok_of.values())) > 1:
    out.append(f"the sources were made with different tokenizers ({sorted(tok_of)}): a run reads one vocabulary")
  out += _vocab_errors(config, mcfg, vocab_of)
  return out


def _vocab_errors(config, mcfg, vocab_of: dict[str, int]) -> list[str]:
  """One line for the sources whose vocabulary is not the model's (not one per phase that reads them), with the fix:
  the model's vocab_size set to the data's (the recipe's vocab= argument), or for an init checkpoint, data made
  with its tokenizer."""
  if not vocab_of:
    return []
  made = sorted(set(vocab_of.values()))
  listed = ", ".join(f"{s!r} ({sources(config)[s]}) {v}" for s, v in vocab_of.items())
  if config.init_checkpoint:
    fix = ("make the data with the init's own tokenizer, or extend its vocabulary first (python -m bertjax "
           "extend_vocab)")
  elif len(made) == 1:
    fix = f"pass vocab={made[0]} in --config=...:ARGS or --config.model.vocab_size={made[0]}"
  else:
    fix = "make every source with one tokenizer, then set --config.model.vocab_size to its vocabulary"
  return [f"the sources were made with a vocabulary the model does not have ({listed}; model.vocab_size "
          f"{mcfg.vocab_size}): {fix} (a phase cannot change the vocabulary)"]


def _model_errors(where: str, p, mcfg) -> list[str]:
  out = []
  if p.seq > mcfg.max_position_embeddings:
    out.append(f"{where}: seq {p.seq} exceeds model.max_position_embeddings {mcfg.max_position_embeddings}")
  rotary = mcfg.position_embedding == "rotary"
  for key in ("rope_theta", "rope_theta_local"):
    if p[key] and p[key] != getattr(mcfg, key) and not rotary:
      out.append(f"{where}: sets {key} but the model's positions are {mcfg.position_embedding!r}, not rotary: a "
                 "phase cannot change the architecture")
    if p[key] and (not math.isfinite(p[key]) or p[key] <= 0):
      out.append(f"{where}: {key} must be > 0, got {p[key]}")
  if p.local_attention and p.local_attention >= p.seq:
    out.append(f"{where}: local_attention {p.local_attention} is not shorter than its seq {p.seq}")
  if p.local_attention < 0:
    out.append(f"{where}: local_attention must be >= 0 (or -1: the model's), got {p.local_attention}")
  return out


def read_creations(config) -> tuple[dict[str, dict], list[str]]:
  """({source: creation record}, problems): a named source whose folder holds no readable data is one line; a run
  of data.data_dir alone raises that folder's own error."""
  out, problems = {}, []
  for name, folder in sources(config).items():
    if not config.data.sources:
      out[name] = dataset.read_creation(folder)
      continue
    if not folder:
      problems.append(f"data.sources.{name} is empty: give the folder `python -m bertjax dataset` made")
      continue
    try:
      out[name] = dataset.read_creation(folder)
    except (OSError, errors.Error) as e:
      problems.append(f"data.sources.{name}: {errors.one_line(e)}")
  return out, problems


def train_sources(config, announce=print) -> dict:
  """{folder: its train split} of every source, each example a packed row when data.packing (the row plan
  cached beside local data; a bucket's data may be shared and read-only, so it is planned anew)."""
  out = {}
  for folder in sources(config).values():
    source = dataset.load_source(folder, config.data.train_split, config.data.cache_limit)
    if config.data.packing:
      seq, preds = config.data.max_seq_length, packing.row_predictions(config.data)
      cache = None if files.is_remote(folder) else files.join(
          folder, f"packing_{config.data.train_split}_{seq}_{preds}_{config.data.pack_max_per_row}.npz")
      n_examples = len(source)
      source = packing.PackedSource(source, seq, preds, config.data.pack_max_per_row, cache=cache)
      announce(f"packing: {n_examples} examples in {len(source)} rows ({n_examples / max(len(source), 1):.2f} per "
               "row)")
    out[folder] = source
  return out


# ----------------------------------------------------------------------------- the phases as run
@dataclasses.dataclass
class Phase:
  """A phase as the run executes it: its steps and the config its trainer is built from."""
  steps: phases_lib.PhaseSteps
  config: ml_collections.ConfigDict  # the run's config with the phase's seq, batch, masking and model switches
  mixture: list  # [(source name, folder, weight)]

  @property
  def name(self) -> str:
    return self.steps.name

  def model_key(self) -> tuple:
    return tuple(self.config.model[k] for k in MODEL_FIELDS)


def build_phases(config, granularity: int, creations: dict[str, dict], sizes: dict[str, int],
                 init_lr: float | None = None) -> list[Phase]:
  """The run's phases, each with its own config (for its trainer and its pipeline)."""
  names = phases_lib.names(config)
  try:
    steps = phases_lib.plan(config, granularity, init_lr)
  except ValueError as e:
    why = (f"; the init checkpoint {config.init_checkpoint} does not record the rate it stood at (an HF folder)"
           if config.init_checkpoint else "")
    raise errors.ConfigError(f"invalid config: {e}{why}: set the phase's learning_rate (and warmup_from)") from None
  out = []
  for s in steps:
    p = s.settings
    entries, _ = parse_mixture(p.mixture, list(sources(config)))
    weights = mixture_weights(entries, sizes, p.temperature)
    c = ml_collections.ConfigDict(config.to_dict())
    c.data.max_seq_length = p.seq
    first = creations.get(entries[0][0]) if entries else None
    if first is not None:
      c.data.max_predictions_per_seq = first["options"]["max_predictions_per_seq"]
    c.data.masked_lm_prob = p.masked_lm_prob
    c.train.global_batch_size = p.global_batch_size
    c.train.num_steps = steps[-1].end if names else config.train.num_steps
    for key in MODEL_FIELDS:
      c.model[key] = p[key]
    out.append(Phase(s, c, [(n, sources(config)[n], w) for (n, _), w in zip(entries, weights)]))
  return out


def segments(phases: list[Phase], loaded: dict, config, vocab, creations: dict[str, dict]) -> list[mixture.Segment]:
  """The data segments of the phases: each source read through its own shuffled order, continuing across
  phases; masks drawn in the pipeline when the run masks dynamically (`_masking`)."""
  out, offsets = [], {}
  for ph in phases:
    srcs = tuple((folder, loaded[folder], w) for _, folder, w in ph.mixture)
    transform = _masking(ph, vocab, config, creations, alone=len(phases) == 1) if config.data.dynamic_masking else None
    seg = mixture.Segment(ph.name, ph.steps.start, ph.steps.end, srcs, ph.steps.batch_sizes, dict(offsets), transform)
    out.append(seg)
    offsets = {**offsets, **seg.draws(seg.end)}
  return out


def _masking(ph: Phase, vocab, config, creations: dict[str, dict], alone: bool):
  """A phase's dynamic masking. The one phase of a run reading one source at one batch and one rate masks each
  stream position by itself (`mixture.PerPosition`) at the run's rate and cap (data.max_predictions_per_seq,
  the data's own widened or cut to it), so it reads as a plain stream; otherwise the mask of position g at step s
  follows the phase's rate at s."""
  s = ph.steps
  if alone and len(ph.mixture) == 1 and len(set(s.batch_sizes)) == 1 and s.mask_rate(s.start) == s.mask_rate(s.end):
    made = creations[ph.mixture[0][0]]["options"]
    opts = pretraining.CreationOptions(**{**made, "masked_lm_prob": config.data.masked_lm_prob,
                                          "max_predictions_per_seq": config.data.max_predictions_per_seq,
                                          "whole_word_mask": config.data.whole_word_mask})
    cap = config.data.max_predictions_per_seq
    return mixture.PerPosition(input_pipeline.fit_predictions(input_pipeline.dynamic_masking(vocab, opts,
                                                                                             config.seed), cap))
  base = pretraining.CreationOptions(max_seq_length=s.settings.seq,
                                     max_predictions_per_seq=ph.config.data.max_predictions_per_seq,
                                     whole_word_mask=config.data.whole_word_mask)
  seed, name = config.seed, ph.name

  def fn(example: dict, g: int, step: int) -> dict:
    opts = dataclasses.replace(base, masked_lm_prob=s.mask_rate(step))
    return pretraining.remask(example, vocab, opts, random.Random(f"{seed}/dynamic/{name}/{g}"))
  return fn


def announce_exhaustion(segs: list[mixture.Segment], names: dict[str, str], when: str, say) -> int | None:
  """Says where each source runs out (a folder read past its end) and what the run does then; returns the step
  the run stops at (data.when_exhausted=stop), or None."""
  stop = None
  for seg in segs:
    for folder, step in sorted(mixture.exhaustion(seg).items(), key=lambda kv: kv[1]):
      label = names.get(folder, folder)
      if when == "stop":
        say(f"source {label!r} ({folder}) runs out at step {step} in phase {seg.name!r}: the run stops there with "
            "a checkpoint (data.when_exhausted=stop)")
        stop = step if stop is None else min(stop, step)
      else:
        say(f"source {label!r} ({folder}) runs out at step {step} in phase {seg.name!r}: it is read again in a "
            "new order (data.when_exhausted=repeat)")
  return stop


# The run-level settings a phase falls back on (`phases.resolved`): a phased run resumed with another of them runs
# another plan, as with another phase field.
DEFERRED_KEYS = ("data.max_seq_length", "data.masked_lm_prob", "train.global_batch_size", "train.learning_rate",
                 "train.batch_warmup_tokens", "train.batch_warmup_from", "train.batch_warmup_levels")


def resume_keys(config) -> tuple[str, ...]:
  """The dotted keys of the phase plan a resumed run must hold as its workdir's config.json does
  (`run.check_same_settings`): the phase order and every field of every phase, and for a run of phases the
  run-level settings they fall back on. (A run without phases may go on for more train.num_steps.)"""
  names = phases_lib.names(config)
  keys = ["phase_order"] + [f"phases.{n}.{f}" for n in names for f in phases_lib.FIELDS]
  return tuple(keys + (list(DEFERRED_KEYS) if names else []))


def scalars(phases: list[Phase], phase: Phase, step: int, named: bool, data_rate: float | None = None) -> dict:
  """What a metrics row says of the phase its steps ran in: the phase's index, the masking rate of the row's last
  update (step - 1; `data_rate`: the rate a run without dynamic masking reads its data's static masks at) and,
  for a run of `named` sources, the mixture's weights as `mixture/<source>`."""
  rate = data_rate if data_rate is not None else phase.steps.mask_rate(max(step - 1, phase.steps.start))
  out = {"phase": phases.index(phase), "masked_lm_prob": rate}
  if named:
    out.update({f"mixture/{name}": w for name, _, w in phase.mixture})
  return out


def model_config(mcfg: model_lib.BertConfig, phase: Phase) -> model_lib.BertConfig:
  """The model a phase runs: the run's architecture with the phase's rotary θ and sliding window."""
  return dataclasses.replace(mcfg, **{k: phase.config.model[k] for k in MODEL_FIELDS})


def describe(phases: list[Phase]) -> list[str]:
  """One line per phase for the run's start."""
  out = []
  for ph in phases:
    s, p = ph.steps, ph.steps.settings
    sizes = sorted(set(s.batch_sizes))
    batch = f"batch {sizes[0]}->{sizes[-1]} ({len(sizes)} shapes)" if len(sizes) > 1 else f"batch {sizes[0]}"
    mask = (f"mask {p.masked_lm_prob:g}->{p.masked_lm_prob_end:g}" if p.masked_lm_prob != p.masked_lm_prob_end
            else f"mask {p.masked_lm_prob:g}")
    mix = ", ".join(f"{n} {w:.2f}" for n, _, w in ph.mixture)
    out.append(f"phase {ph.name}: steps {s.start}->{s.end}, seq {p.seq}, {batch}, {mask}, lr {s.lr_from:.3g}->"
               f"{s.lr_peak:.3g} ({p.schedule}), mixture [{mix}]" + (", optimizer reset" if s.reset_optimizer
                                                                     and s.start else ""))
  return out
