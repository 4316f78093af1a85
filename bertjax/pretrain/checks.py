"""The checks of a pre-training config, every one before anything compiles: `validate` collects them into one
ConfigError (the run's own settings, the mesh, the model, the data, the phases and their sources, the
objective's rules)."""
from __future__ import annotations

import math

from bertjax import errors, objectives
from bertjax import model as model_lib
from bertjax import run as run_lib
from bertjax.core import phases as phases_lib
from bertjax.core import sharding as sharding_lib
from bertjax.data.pretraining import examples as pretraining
from bertjax.pretrain import plan

ConfigError = errors.ConfigError


def resolve(config):
  """Fills the fields a config may leave to be derived (in place): data.max_predictions_per_seq 0 = from the
  sequence length and masking rate, as the data creation derives it."""
  if config.data.max_predictions_per_seq == 0:
    config.data.max_predictions_per_seq = pretraining.max_predictions(config.data.max_seq_length,
                                                                      config.data.masked_lm_prob)
  return config


# ----------------------------------------------------------------------------- checks
def validate(config, num_devices: int, creation: dict | None = None, tokenizer_vocab: int | None = None,
             creations: dict | None = None) -> model_lib.BertConfig:
  """The model config, or one ConfigError listing every problem found: the run's own settings
  (`run.run_errors`), the batch over the mesh, the model, the data it was made with, the phases and their
  sources (`creations`: {source: creation record}; see `bertjax.pretrain.plan`) and the objective's rules. A run
  of its own fixed settings checks its one folder's creation (`creation`, else `creations["data"]`) as its data
  section; a run that moves (`plan.moves`) checks each phase against each source it reads.
  Fills the derived fields first (`resolve`)."""
  resolve(config)
  problems = []
  mcfg = None
  try:
    mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
  except (ValueError, TypeError) as e:
    problems.append(str(e))
  problems += _train_errors(config) + run_lib.run_errors(config) + _mesh_errors(config, num_devices, mcfg)
  if plan.moves(config):
    problems += _data_errors(config, mcfg, creation)
    problems += plan.errors_of(config, mcfg, creations or {}, granularity(config, num_devices))
  else:
    problems += _data_errors(config, mcfg, creation if creation is not None else (creations or {}).get("data"))
  try:
    problems += objectives.get(config).errors(config, mcfg)
  except ConfigError as e:
    problems.append(str(e))
  if tokenizer_vocab is not None and mcfg is not None and tokenizer_vocab != mcfg.vocab_size:
    problems.append(f"model.vocab_size {mcfg.vocab_size} does not match the tokenizer's {tokenizer_vocab}")
  run_lib.raise_if(problems)
  return mcfg


def granularity(config, num_devices: int) -> int:
  """What every global batch must be a multiple of: the data-parallel size times the micro-batches per step."""
  try:
    shape = sharding_lib.mesh_shape(config.sharding.mesh_shape, num_devices)
  except sharding_lib.ShardingConfigError:
    return max(1, config.train.grad_accum_steps)
  sizes = dict(zip(config.sharding.mesh_axes, shape))
  return math.prod(s for a, s in sizes.items() if a in ("data", "fsdp")) * max(1, config.train.grad_accum_steps)


def _train_errors(config) -> list[str]:
  t = config.train
  fields = ("global_batch_size", "grad_accum_steps") + (() if phases_lib.names(config) else ("num_steps",))
  out = [f"train.{name} must be positive, got {getattr(t, name)}" for name in fields if getattr(t, name) <= 0]
  if t.ema_decay and not 0 < t.ema_decay < 1:
    out.append(f"train.ema_decay must be in (0, 1) (0 keeps no average), got {t.ema_decay}")
  if t.learning_rate == 0:
    out.append("train.learning_rate is 0: pre-training would not change the weights")
  if not isinstance(t.warmup_steps, int) or t.warmup_steps < 0:
    out.append(f"train.warmup_steps must be an integer >= 0, got {t.warmup_steps!r}")
  return out


def _mesh_errors(config, num_devices: int, mcfg) -> list[str]:
  """The batch and the model's axes against the mesh the sharding preset builds on `num_devices`."""
  gbs, accum = config.train.global_batch_size, config.train.grad_accum_steps
  out = []
  try:
    shape = sharding_lib.mesh_shape(config.sharding.mesh_shape, num_devices)
  except sharding_lib.ShardingConfigError as e:
    return [f"sharding: {e}"]
  sizes = dict(zip(config.sharding.mesh_axes, shape))
  dp = math.prod(s for a, s in sizes.items() if a in ("data", "fsdp"))
  if gbs > 0 and accum > 0:
    if gbs % accum:
      out.append(f"train.global_batch_size {gbs} is not divisible by train.grad_accum_steps {accum}")
    elif (gbs // accum) % dp:
      out.append(f"the micro-batch {gbs // accum} (global_batch_size {gbs} / grad_accum_steps {accum}) is not "
                 f"divisible by the data-parallel size {dp} (mesh {sizes})")
  if mcfg is not None:
    dims = {"embed": ("hidden_size", mcfg.hidden_size), "heads": ("num_heads", mcfg.num_heads),
            "mlp": ("intermediate_size", mcfg.intermediate_size), "vocab": ("vocab_size", mcfg.vocab_size)}
    for name, axes in sharding_lib.rules(config):
      if name in dims:
        n = math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
        field, value = dims[name]
        if n > 1 and value % n:
          out.append(f"model.{field} {value} cannot be split over mesh axes {axes} of size {n} "
                     f"(sharding rule {name!r} -> {axes})")
  return out


def _data_errors(config, mcfg, creation: dict | None) -> list[str]:
  """The data settings against the model and against what the data in data_dir was made with."""
  out, seq = [], config.data.max_seq_length
  if mcfg is not None and seq > mcfg.max_position_embeddings:
    out.append(f"data.max_seq_length {seq} exceeds model.max_position_embeddings {mcfg.max_position_embeddings}")
  if mcfg is not None and mcfg.local_attention and mcfg.local_attention >= seq:
    out.append(f"model.local_attention {mcfg.local_attention} is not shorter than data.max_seq_length {seq}: "
               "every layer would attend globally")
  if creation is not None:
    made = creation["options"]
    if made["max_seq_length"] != config.data.max_seq_length:
      out.append(f"data.max_seq_length is {config.data.max_seq_length} but the data in {config.data.data_dir} was "
                 f"made with {made['max_seq_length']}")
    # Static masks are the data's own: the run reads them at the width they were made with. Dynamic masking draws
    # every mask anew at the run's rate and cap (the data's masks are only undone), so any cap serves.
    preds = config.data.max_predictions_per_seq
    if made["max_predictions_per_seq"] != preds and not config.data.dynamic_masking:
      out.append(f"data.max_predictions_per_seq is {preds} but the data in {config.data.data_dir} was made with "
                 f"{made['max_predictions_per_seq']}: set --config.data.max_predictions_per_seq="
                 f"{made['max_predictions_per_seq']}, or data.dynamic_masking=True to mask anew at the run's cap")
    if mcfg is not None and creation.get("vocab_size") not in (None, mcfg.vocab_size):
      fix = ("make the data with the init's own tokenizer, or extend its vocabulary first (python -m bertjax "
             "extend_vocab)" if config.init_checkpoint else
             f"pass vocab={creation['vocab_size']} in --config=...:ARGS or "
             f"--config.model.vocab_size={creation['vocab_size']}")
      out.append(f"model.vocab_size {mcfg.vocab_size} does not match the data's tokenizer vocabulary "
                 f"{creation['vocab_size']} ({creation.get('tokenizer')}): {fix}")
    made_mode = made.get("example_mode", "nsp_pairs")  # data made before the option
    if made_mode != config.data.example_mode:
      out.append(f"data.example_mode is {config.data.example_mode!r} but the data in {config.data.data_dir} was "
                 f"made as {made_mode!r} (python -m bertjax dataset --example_mode ...)")
  eval_prob = config.data.eval_masked_lm_prob
  if eval_prob and not (0 < eval_prob < 1 and
                        pretraining.max_predictions(seq, eval_prob) <= config.data.max_predictions_per_seq):
    out.append(f"data.eval_masked_lm_prob {eval_prob} must be in (0, 1) and need no more than "
               f"data.max_predictions_per_seq {config.data.max_predictions_per_seq} masked positions")
  if config.data.packing and config.data.dynamic_masking:
    out.append("data.packing with data.dynamic_masking is not supported: masks are drawn per example before "
               "packing; use static masking with packing")
  return out
