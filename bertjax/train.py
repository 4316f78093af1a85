"""Pre-training: mesh -> sharded state -> one jitted step -> periodic log / eval / checkpoint.

Reads top to bottom: `validate` (before anything compiles), `build` (the config's objective, from
`bertjax.objectives`, handed to the trainer core), and `train_and_evaluate`, the loop (resume order: the
workdir's latest checkpoint, else `init_checkpoint`, else from scratch). No objective is named here.
"""
from __future__ import annotations

import logging
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import accounting, checkpoint as checkpoint_lib, errors, metrics as metrics_lib
from bertjax import model as model_lib, objectives, optim
from bertjax import sharding as sharding_lib
from bertjax import trainer, weights
from bertjax.data import dataset, input_pipeline, packing, pretraining, tokenizer as tokenizer_lib


ConfigError = errors.ConfigError


def resolve(config):
  """Fills the fields a config may leave to be derived (in place): data.max_predictions_per_seq 0 = from the
  sequence length and masking rate, as the data creation derives it."""
  if config.data.max_predictions_per_seq == 0:
    config.data.max_predictions_per_seq = pretraining.max_predictions(config.data.max_seq_length,
                                                                      config.data.masked_lm_prob)
  return config


def validate(config, num_devices: int, creation: dict | None = None, tokenizer_vocab: int | None = None
             ) -> model_lib.BertConfig:
  """The model config, or a ConfigError listing every problem found. Fills the derived fields first (`resolve`)."""
  resolve(config)
  errors = []
  mcfg = None
  try:
    mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
  except (ValueError, TypeError) as e:
    errors.append(str(e))
  t = config.train
  gbs, accum = t.global_batch_size, t.grad_accum_steps
  for name in ("global_batch_size", "grad_accum_steps", "num_steps"):
    if getattr(t, name) <= 0:
      errors.append(f"train.{name} must be positive, got {getattr(t, name)}")
  errors += trainer.run_errors(config)
  if t.learning_rate == 0:
    errors.append("train.learning_rate is 0: pre-training would not change the weights")
  if not isinstance(t.warmup_steps, int) or t.warmup_steps < 0:
    errors.append(f"train.warmup_steps must be an integer >= 0, got {t.warmup_steps!r}")
  try:
    shape = sharding_lib.mesh_shape(config.sharding.mesh_shape, num_devices)
    dp = math.prod(s for a, s in zip(config.sharding.mesh_axes, shape) if a in ("data", "fsdp"))
    if gbs > 0 and accum > 0:
      if gbs % accum:
        errors.append(f"train.global_batch_size {gbs} is not divisible by train.grad_accum_steps {accum}")
      elif (gbs // accum) % dp:
        errors.append(f"the micro-batch {gbs // accum} (global_batch_size {gbs} / grad_accum_steps {accum}) is not "
                      f"divisible by the data-parallel size {dp} (mesh {dict(zip(config.sharding.mesh_axes, shape))})")
    sizes = dict(zip(config.sharding.mesh_axes, shape))
    if mcfg is not None:
      dims = {"embed": ("hidden_size", mcfg.hidden_size), "heads": ("num_heads", mcfg.num_heads),
              "mlp": ("intermediate_size", mcfg.intermediate_size), "vocab": ("vocab_size", mcfg.vocab_size)}
      for name, axes in sharding_lib.rules(config):
        if name in dims:
          n = math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
          field, value = dims[name]
          if n > 1 and value % n:
            errors.append(f"model.{field} {value} cannot be split over mesh axes {axes} of size {n} "
                          f"(sharding rule {name!r} -> {axes})")
  except sharding_lib.ShardingConfigError as e:
    errors.append(f"sharding: {e}")
  seq = config.data.max_seq_length
  if mcfg is not None and seq > mcfg.max_position_embeddings:
    errors.append(f"data.max_seq_length {seq} exceeds model.max_position_embeddings {mcfg.max_position_embeddings}")
  if creation is not None:
    made = creation["options"]
    for key in ("max_seq_length", "max_predictions_per_seq"):
      if made[key] != config.data[key]:
        errors.append(f"data.{key} is {config.data[key]} but the data in {config.data.data_dir} was made with "
                      f"{made[key]}")
    if mcfg is not None and creation.get("vocab_size") not in (None, mcfg.vocab_size):
      errors.append(f"model.vocab_size {mcfg.vocab_size} does not match the data's tokenizer vocabulary "
                    f"{creation['vocab_size']} ({creation.get('tokenizer')}): pass vocab={creation['vocab_size']} in "
                    f"--config=...:ARGS or --config.model.vocab_size={creation['vocab_size']}")
  if mcfg is not None and mcfg.local_attention and mcfg.local_attention >= seq:
    errors.append(f"model.local_attention {mcfg.local_attention} is not shorter than data.max_seq_length {seq}: "
                  "every layer would attend globally")
  try:
    errors += objectives.get(config).errors(config, mcfg)
  except ConfigError as e:
    errors.append(str(e))
  made_mode = (creation or {}).get("options", {}).get("example_mode", "nsp_pairs")  # data made before the option
  if creation is not None and made_mode != config.data.example_mode:
    errors.append(f"data.example_mode is {config.data.example_mode!r} but the data in {config.data.data_dir} was "
                  f"made as {made_mode!r} (python -m bertjax.data.dataset --example_mode ...)")
  eval_prob = config.data.eval_masked_lm_prob
  if eval_prob and not (0 < eval_prob < 1 and
                        pretraining.max_predictions(seq, eval_prob) <= config.data.max_predictions_per_seq):
    errors.append(f"data.eval_masked_lm_prob {eval_prob} must be in (0, 1) and need no more than "
                  f"data.max_predictions_per_seq {config.data.max_predictions_per_seq} masked positions")
  if config.data.packing and config.data.dynamic_masking:
    errors.append("data.packing with data.dynamic_masking is not supported: masks are drawn per example before "
                  "packing; use static masking with packing")
  if tokenizer_vocab is not None and mcfg is not None and tokenizer_vocab != mcfg.vocab_size:
    errors.append(f"model.vocab_size {mcfg.vocab_size} does not match the tokenizer's {tokenizer_vocab}")
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
  return mcfg


def evaluate(eval_step, params, source, config, batch_sharding) -> dict:
  gbs = config.train.global_batch_size
  limit = config.eval_batches * gbs if config.eval_batches > 0 else None
  total = None
  for batch in input_pipeline.eval_batches(source, gbs, sharding=batch_sharding, limit=limit):
    sums = eval_step(params, batch)
    total = sums if total is None else jax.tree_util.tree_map(jnp.add, total, sums)
  if total is None:
    return {}
  m = objectives.get(config).metrics(jax.device_get(total), config)
  return {k: float(v) for k, v in m.items()}


def load_init_params(path: str, mcfg: model_lib.BertConfig, seq: int = 0):
  """Pre-training params (encoder and MLM/NSP heads) from a bertjax workdir or an HF folder, in mcfg's layout.
  A rotary checkpoint continued at another length or θ (context extension) is announced with both settings."""
  w = weights.load(path, overrides={"scan_layers": mcfg.scan_layers}, head="pretraining")
  if mcfg.position_embedding == "rotary":
    trained = (w.meta.get("data") or {}).get("max_seq_length")  # a bertjax workdir's run config

    def thetas(c):
      return f"rotary θ {c.rope_theta:g} global / {c.rope_theta_local or c.rope_theta:g} local"
    if (w.cfg.rope_theta, w.cfg.rope_theta_local) != (mcfg.rope_theta, mcfg.rope_theta_local) or (
        seq and trained and trained != seq):
      print(f"init_checkpoint {path}: trained with {thetas(w.cfg)}" + (f" at {trained} tokens" if trained else "")
            + f"; this run uses {thetas(mcfg)}" + (f" at {seq} tokens" if seq else ""), flush=True)
  return w.params


HEAD_NAMES = {"mlm_transform": "MLM head", "mlm_ln": "MLM head", "mlm_bias": "MLM head", "nsp": "NSP head",
              "pooler": "pooler"}


def fit_init_params(init: dict, abstract: dict, path: str, announce=print) -> dict:
  """The init params this model takes: the encoder must be whole and every shared parameter of the model's shape;
  heads the checkpoint lacks start fresh (an HF encoder without an MLM head; BertForMaskedLM, without NSP head
  and pooler, continued with NSP) and heads this model lacks are left out (NSP continued MLM-only), each said."""
  if "bert" not in abstract or "bert" not in init:  # another objective's tree (ELECTRA): every leaf must fit
    checkpoint_lib.check_params_fit(init, abstract)
    return init
  bert = {k: v for k, v in init["bert"].items() if k in abstract["bert"]}
  missing = sorted(k for k in abstract["bert"] if k not in bert and k != "pooler")
  if missing:
    raise checkpoint_lib.CheckpointError(f"init_checkpoint {path}: its encoder lacks {missing}; an init needs the "
                                         "whole encoder")
  out = {"bert": bert, **{k: v for k, v in init.items() if k != "bert" and k in abstract}}
  fresh = sorted({HEAD_NAMES.get(k, k) for k in [*abstract, *abstract["bert"]] if k not in out and k not in bert})
  dropped = sorted({HEAD_NAMES.get(k, k) for k in [*init, *init["bert"]]
                    if k not in abstract and k not in abstract["bert"]})
  if fresh:
    announce(f"init_checkpoint {path}: has no {', '.join(fresh)}: drawn fresh")
  if dropped:
    announce(f"init_checkpoint {path}: its {', '.join(dropped)} is not in this model: left out")
  checkpoint_lib.check_params_fit(out, {"bert": {k: abstract["bert"][k] for k in bert},
                                        **{k: abstract[k] for k in out if k != "bert"}})
  return out


def build(config, mcfg: model_lib.BertConfig, devices=None, special_ids=None) -> trainer.Trainer:
  """The trainer of the config's objective (`bertjax.objectives`); `special_ids`: the tokenizer's (cls, sep, mask)
  ids, for an objective that masks in the graph."""
  resolve(config)
  objective = objectives.get(config)
  mesh, _, _ = trainer.mesh_and_shardings(config, devices)
  mcfg = mcfg.for_platform(mesh.devices.flat[0].platform)
  tx, lr_fn = optim.make(config.train)
  micro = config.train.global_batch_size // config.train.grad_accum_steps
  if config.data.packing:
    dummy = packing.dummy_row(config.data.max_seq_length, row_predictions(config), config.data.pack_max_per_row, micro)
  else:
    dummy = model_lib.dummy_batch(mcfg, micro, config.data.max_seq_length, config.data.max_predictions_per_seq)
    dummy["next_sentence_weights"] = np.ones((micro,), np.float32)
  model = objective.module(config, mcfg, special_ids)
  return trainer.build(config, model, tx, lr_fn, dummy, objective.train_step(model, tx, lr_fn, config),
                       objective.eval_step(model, config), mesh=mesh)


def row_predictions(config) -> int:
  return config.data.pack_row_predictions or config.data.max_predictions_per_seq + config.data.pack_max_per_row


init_state = trainer.init_state


def train_and_evaluate(config, workdir: str) -> dict:
  """Pre-train per `config` in `workdir` (resuming if it has checkpoints). Returns a summary dict.

  The workdir is locked for the run: a second run pointed at it refuses to start.
  """
  with checkpoint_lib.WorkdirLock(workdir):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config, workdir: str) -> dict:
  jax.config.update("jax_threefry_partitionable", True)
  is_main = jax.process_index() == 0
  if not config.data.data_dir:
    raise ConfigError("invalid config:\n  - data.data_dir is empty: build data with python -m bertjax.data.dataset")
  trainer.check_workdir_mode(workdir, "pretrain")
  creation = dataset.read_creation(config.data.data_dir)
  mcfg = validate(config, jax.device_count(), creation)
  tok_path, tok_lower = trainer.keep_tokenizer(workdir, *dataset.tokenizer_of(config.data.data_dir, creation))
  if is_main and config.train.warmup_steps >= config.train.num_steps:
    print(f"warning: train.warmup_steps {config.train.warmup_steps} is not below train.num_steps "
          f"{config.train.num_steps}: the learning rate never reaches its peak "
          f"(--config.train.warmup_steps=N sets the warmup)", flush=True)
  special = None
  if objectives.get(config).needs_special_ids:
    tok = tokenizer_lib.load(tok_path, do_lower_case=tok_lower)
    special = (tok.cls_id, tok.sep_id, tok.mask_id)
  run = build(config, mcfg, special_ids=special)
  mesh, batch_sharding = run.mesh, run.batch_sharding
  gbs, seq = config.train.global_batch_size, config.data.max_seq_length

  transform = None
  if config.data.dynamic_masking:
    tok = tokenizer_lib.load(tok_path, do_lower_case=tok_lower)
    opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.masked_lm_prob,
                                          "whole_word_mask": config.data.whole_word_mask})
    transform = input_pipeline.dynamic_masking(pretraining.Vocab.of(tok), opts, config.seed)
  train_source = dataset.load_source(config.data.data_dir, config.data.train_split)
  if config.data.packing:
    cache = os.path.join(config.data.data_dir, f"packing_{config.data.train_split}_{seq}_{row_predictions(config)}_"
                         f"{config.data.pack_max_per_row}.npz") if "://" not in config.data.data_dir else None
    n_examples = len(train_source)
    train_source = packing.PackedSource(train_source, seq, row_predictions(config), config.data.pack_max_per_row,
                                        cache=cache)
    if is_main:
      print(f"packing: {n_examples} examples in {len(train_source)} rows "
            f"({n_examples / max(len(train_source), 1):.2f} per row)", flush=True)
  pipeline = input_pipeline.Pipeline(train_source, gbs, seed=config.seed, sharding=batch_sharding,
                                     transform=transform, prefetch=config.data.prefetch)
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.keep_checkpoints)

  # Resume order: this workdir's checkpoint, else the init checkpoint, else from scratch.
  init_params = None
  if ckpt.latest_step() is None and config.init_checkpoint:
    init_params = fit_init_params(load_init_params(config.init_checkpoint, mcfg, seq), run.abstract.params,
                                  config.init_checkpoint, announce=print if is_main else lambda _: None)
  state, data_state, restored = trainer.resume_or_init(run, ckpt, config.seed, init_params,
                                                       announce=lambda m: print(m, flush=True))
  if data_state is not None:
    pipeline.set_state(data_state)
    logging.info("resumed from %s at step %d", ckpt.directory, restored)
  trainer.write_config(workdir, config)

  eval_source = None
  try:
    eval_source = dataset.load_source(config.data.data_dir, config.data.eval_split)
    if len(eval_source) == 0:
      eval_source = None
    elif config.data.eval_masked_lm_prob:  # e.g. ModernBERT: trains at 30%, evaluates at 15%
      tok = tokenizer_lib.load(tok_path, do_lower_case=tok_lower)
      opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.eval_masked_lm_prob,
                                            "max_predictions_per_seq": config.data.max_predictions_per_seq})
      eval_source = input_pipeline.Remasked(eval_source, pretraining.Vocab.of(tok), opts, seed=config.seed)
  except Exception as e:
    logging.warning("no evaluation split %r: %s", config.data.eval_split, e)

  total = config.train.num_steps
  start = int(jax.device_get(state.step))
  flops_per_step = objectives.get(config).step_flops(config, mcfg, run.module)
  peak, peak_source = accounting.peak_tflops_per_device(config.peak_tflops_per_device)
  writer = metrics_lib.Writer(workdir, start_step=start)
  progress = metrics_lib.Progress(total, start)
  if is_main:
    print(f"bertjax: {accounting.count_params(state.params):,} parameters ({mcfg.num_layers} layers, hidden "
          f"{mcfg.hidden_size}); mesh {dict(mesh.shape)}; {jax.device_count()} {jax.devices()[0].platform} "
          f"device(s); steps {start}->{total}; peak {peak:.2f} TFLOP/s/device ({peak_source})", flush=True)
  summary = {"start_step": start, "preempted": False}
  last_log = [time.time(), start]
  eval_metrics: dict = {}

  def log(step, host):
    now = time.time()
    dt = (now - last_log[0]) / max(step - last_log[1], 1)
    mean = {k: float(np.mean([h[k] for h in host])) for k in host[-1]}
    mean.update(learning_rate=float(host[-1]["learning_rate"]), step_time_s=dt, tokens_per_s=mean.pop("tokens") / dt,
                mfu=accounting.mfu(flops_per_step, dt, peak, jax.device_count()))
    writer.write(step, mean)
    progress.log(step, mean)
    summary["train"] = mean
    last_log[:] = [now, step]

  def run_eval(step, state):
    nonlocal eval_metrics
    eval_metrics = evaluate(run.eval_step, state.params, eval_source, config, run.batch_sharding)
    writer.write(step, eval_metrics, "eval")
    if is_main:
      print(f"eval at step {step}: {_fmt(eval_metrics)}", flush=True)

  def begin(state):
    if start == 0 and eval_source is not None and config.eval_every > 0:
      run_eval(0, state)
      summary["initial_eval"] = eval_metrics

  hooks = trainer.Hooks(
      log=log, save=lambda step, state: ckpt.save(step, state, pipeline.get_state()),
      log_due=lambda step: trainer.every(step, config.log_every, total),
      save_due=lambda step: trainer.every(step, config.checkpoint_every, total),
      evaluate=run_eval, begin=begin,
      eval_due=lambda step: eval_source is not None and trainer.every(step, config.eval_every, total))
  state, step, stopping = trainer.loop(run, state, pipeline, start, total, hooks, config.train.stop_after_steps)
  if stopping is not None:
    if is_main:
      print(f"{stopping}: saved a checkpoint at step {step}; exiting", flush=True)
    summary["preempted"] = True
  ckpt.close()
  pipeline.close()
  writer.close()
  summary.update(final_step=step, eval=eval_metrics, state=state, model_config=mcfg)
  if is_main:
    try:
      summary["plots"] = metrics_lib.plot(workdir)
    except FileNotFoundError:
      summary["plots"] = []
  return summary


def _fmt(m: dict) -> str:
  return ", ".join(f"{k} {v:.4f}" for k, v in sorted(m.items()))
