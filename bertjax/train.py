"""Pre-training: mesh -> sharded state -> one jitted step -> periodic log / eval / checkpoint.

Reads top to bottom: `validate` (before anything compiles), `make_train_step` and `make_eval_step` (the
objective, handed to the trainer core by `build`), and `train_and_evaluate`, the loop (resume order: the
workdir's latest checkpoint, else `init_checkpoint`, else from scratch).
"""
from __future__ import annotations

import logging
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import accounting, checkpoint as checkpoint_lib, errors, losses, metrics as metrics_lib
from bertjax import model as model_lib, optim
from bertjax.model import electra as electra_lib
from bertjax import sharding as sharding_lib
from bertjax import state as state_lib
from bertjax import trainer, weights
from bertjax.data import dataset, input_pipeline, packing, pretraining, tokenizer as tokenizer_lib


ConfigError = errors.ConfigError
NonFiniteError = errors.NonFiniteError
PRNG_IMPLS = trainer.PRNG_IMPLS
prng_impl_error = trainer.prng_impl_error
StopFlag = trainer.StopFlag


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
  if is_electra(config):
    if accum != 1:
      errors.append("objective 'electra' takes train.grad_accum_steps=1 (its masks are drawn per step in the graph)")
    if config.data.get("packing"):
      errors.append("objective 'electra' does not take data.packing (its masks are drawn per row in the graph)")
    if config.train.use_nsp:
      errors.append("objective 'electra' has no NSP: set train.use_nsp=False")
    freeze_at = config.electra.get("freeze_generator_at", 0)
    if not isinstance(freeze_at, int) or freeze_at < 0:
      errors.append(f"electra.freeze_generator_at must be a step >= 0 (0: joint throughout), got {freeze_at!r}")
    if mcfg is not None:
      try:
        electra_lib.generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
      except (ValueError, TypeError) as e:
        errors.append(f"electra generator: {e}")
  elif mcfg is not None and config.train.use_nsp and not mcfg.nsp_head:
    errors.append("train.use_nsp is True but model.nsp_head is False (an MLM-only model has no NSP head)")
  made_mode = (creation or {}).get("options", {}).get("example_mode", "nsp_pairs")
  if creation is not None and made_mode != config.data.get("example_mode", "nsp_pairs"):
    errors.append(f"data.example_mode is {config.data.example_mode!r} but the data in {config.data.data_dir} was "
                  f"made as {made_mode!r} (python -m bertjax.data.dataset --example_mode ...)")
  if made_mode != "nsp_pairs" and config.train.use_nsp:
    errors.append(f"train.use_nsp is True but the data is {made_mode!r} (no sentence pairs): set "
                  "train.use_nsp=False")
  eval_prob = config.data.get("eval_masked_lm_prob", 0.0)
  if eval_prob and not (0 < eval_prob < 1 and
                        pretraining.max_predictions(seq, eval_prob) <= config.data.max_predictions_per_seq):
    errors.append(f"data.eval_masked_lm_prob {eval_prob} must be in (0, 1) and need no more than "
                  f"data.max_predictions_per_seq {config.data.max_predictions_per_seq} masked positions")
  if config.data.get("packing") and config.data.dynamic_masking:
    errors.append("data.packing with data.dynamic_masking is not supported: masks are drawn per example before "
                  "packing; use static masking with packing")
  if tokenizer_vocab is not None and mcfg is not None and tokenizer_vocab != mcfg.vocab_size:
    errors.append(f"model.vocab_size {mcfg.vocab_size} does not match the tokenizer's {tokenizer_vocab}")
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
  return mcfg


def _tree_add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


def apply_gradients(state, grads, metrics, tx, lr_fn, batch, hold=None):
  """The optimizer update every pre-training objective ends with: (next state, metrics + grad norm, lr, tokens).
  `hold(updates)`, when given, returns the updates with those of parameters held fixed this step zeroed."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  if hold is not None:
    updates = hold(updates)
  params = optax.apply_updates(state.params, updates)
  metrics.update(grad_norm=optax.global_norm(grads), learning_rate=lr_fn(state.step),
                 tokens=jnp.sum(batch["input_mask"].astype(jnp.float32)))
  return state_lib.TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def make_train_step(model, tx, lr_fn, config):
  """state, batch -> state, metrics. L = L_MLM + L_NSP; micro-batches sum to the full batch's exact gradient."""
  accum = config.train.grad_accum_steps
  use_nsp = config.train.use_nsp
  seed, impl = config.seed, config.train.get("prng_impl", "threefry2x32")

  def step_fn(state, batch):
    rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed, impl=impl), 1), state.step)
    mlm_den = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5
    nsp_den = jnp.maximum(jnp.sum(batch["next_sentence_weights"].astype(jnp.float32)), 1e-5)

    def loss_fn(params, mb, r):
      out = model.apply({"params": params}, mb, deterministic=False, rngs={"dropout": r})
      sums = losses.pretraining_sums(out, mb)
      loss, _ = losses.from_sums(sums, use_nsp, mlm_den, nsp_den)
      return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accum == 1:
      (_, sums), grads = grad_fn(state.params, batch, rng)
    else:
      # Row r goes to micro-batch r % accum, so each device's rows stay on that device.
      micro = jax.tree_util.tree_map(
          lambda x: x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1), batch)
      first = jax.tree_util.tree_map(lambda x: x[0], micro)
      sums_shape = jax.eval_shape(lambda: grad_fn(state.params, first, rng)[0][1])
      zeros = (jax.tree_util.tree_map(jnp.zeros_like, state.params),
               jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape))

      def body(carry, xs):
        mb, i = xs
        (_, s), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return (_tree_add(carry[0], g), _tree_add(carry[1], s)), None

      (grads, sums), _ = jax.lax.scan(body, zeros, (micro, jnp.arange(accum)))
    _, metrics = losses.from_sums(sums, use_nsp)
    return apply_gradients(state, grads, metrics, tx, lr_fn, batch)

  return step_fn


def make_eval_step(model):
  def eval_fn(params, batch):
    out = model.apply({"params": params}, batch, deterministic=True)
    return losses.pretraining_sums(out, batch)
  return eval_fn


def evaluate(eval_step, params, source, config, batch_sharding) -> dict:
  gbs = config.train.global_batch_size
  limit = config.eval_batches * gbs if config.eval_batches > 0 else None
  total = None
  for batch in input_pipeline.eval_batches(source, gbs, sharding=batch_sharding, limit=limit):
    sums = eval_step(params, batch)
    total = sums if total is None else _tree_add(total, sums)
  if total is None:
    return {}
  total = jax.device_get(total)
  if is_electra(config):
    _, m = electra_lib.electra_loss(total, config.electra.disc_weight)
  else:
    _, m = losses.from_sums(total, config.train.use_nsp)
  return {k: float(v) for k, v in m.items()}


def load_init_params(path: str, mcfg: model_lib.BertConfig):
  """Pre-training params (encoder and MLM/NSP heads) from a bertjax workdir or an HF folder, in mcfg's layout."""
  return weights.load(path, overrides={"scan_layers": mcfg.scan_layers}, head="pretraining").params


def build(config, mcfg: model_lib.BertConfig, devices=None, special_ids=None) -> trainer.Trainer:
  """The trainer of the config's objective: MLM (+ NSP) on BertForPreTraining, or ELECTRA's replaced-token
  detection (`special_ids`: the tokenizer's (cls, sep, mask) ids, which ELECTRA's in-graph masking needs)."""
  resolve(config)
  mesh, _, _ = trainer.make_mesh(config, devices)
  mcfg = mcfg.for_platform(mesh.devices.flat[0].platform)
  tx, lr_fn = optim.make(config.train)
  micro = config.train.global_batch_size // config.train.grad_accum_steps
  if config.data.get("packing"):
    dummy = packing.dummy_row(config.data.max_seq_length, row_predictions(config), config.data.pack_max_per_row, micro)
  else:
    dummy = model_lib.dummy_batch(mcfg, micro, config.data.max_seq_length, config.data.max_predictions_per_seq)
    dummy["next_sentence_weights"] = np.ones((micro,), np.float32)
  if is_electra(config):
    model = electra_module(config, mcfg, special_ids)
    steps = (make_electra_train_step(model, tx, lr_fn, config), make_electra_eval_step(model, config))
  else:
    model = model_lib.BertForPreTraining(mcfg)
    steps = (make_train_step(model, tx, lr_fn, config), make_eval_step(model))
  return trainer.build(config, model, tx, lr_fn, dummy, *steps, mesh=mesh)


def is_electra(config) -> bool:
  return config.get("objective", "mlm") == "electra"


def electra_module(config, mcfg, special_ids=None):
  cls_id, sep_id, mask_id = special_ids or (2, 3, 4)  # placeholders for timing and AOT builds without data
  gen = electra_lib.generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
  return electra_lib.ElectraForPreTraining(mcfg, gen,
                                           mask_prob=config.data.masked_lm_prob,
                                           temperature=config.electra.temperature, special_ids=(cls_id, sep_id),
                                           mask_id=mask_id)


def make_electra_train_step(model, tx, lr_fn, config):
  """state, batch -> state, metrics: L = L_gen + λ·L_disc in one step for both networks (ELECTRA)."""
  seed, impl = config.seed, config.train.get("prng_impl", "threefry2x32")
  weight = config.electra.disc_weight
  freeze_at = config.electra.get("freeze_generator_at", 0)

  def step_fn(state, batch):
    rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed, impl=impl), 1), state.step)
    r_drop, r_electra = jax.random.split(rng)
    joint = state.step < freeze_at if freeze_at else True

    def loss_fn(params):
      out = model.apply({"params": params}, batch, deterministic=False,
                        rngs={"dropout": r_drop, "electra": r_electra})
      sums = electra_lib.electra_sums(out, batch)
      loss, m = electra_lib.electra_loss(sums, weight)
      return jnp.where(joint, loss, weight * m["disc_loss"]), sums

    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    _, metrics = electra_lib.electra_loss(sums, weight)
    hold = None
    if freeze_at:  # the generator stops at freeze_at: its updates (AdamW's momentum and decay too) are zero
      hold = lambda u: {**u, "generator": jax.tree.map(lambda x: jnp.where(joint, x, 0), u["generator"])}  # noqa: E731
    return apply_gradients(state, grads, metrics, tx, lr_fn, batch, hold)

  return step_fn


def make_electra_eval_step(model, config):
  def eval_fn(params, batch):  # the same masks and samples at every evaluation: a fixed stream
    key = jax.random.key(config.seed, impl=config.train.get("prng_impl", "threefry2x32"))
    out = model.apply({"params": params}, batch, deterministic=True, rngs={"electra": key})
    return electra_lib.electra_sums(out, batch)
  return eval_fn


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
  if is_electra(config):
    tok = tokenizer_lib.load(tok_path, do_lower_case=tok_lower)
    special = (tok.cls_id, tok.sep_id, tok.mask_id)
  run = build(config, mcfg, special_ids=special)
  mesh, rules, batch_sharding = run.mesh, run.rules, run.batch_sharding
  gbs, seq, preds = config.train.global_batch_size, config.data.max_seq_length, config.data.max_predictions_per_seq

  transform = None
  if config.data.dynamic_masking:
    tok = tokenizer_lib.load(tok_path, do_lower_case=tok_lower)
    opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.masked_lm_prob,
                                          "whole_word_mask": config.data.whole_word_mask})
    transform = input_pipeline.dynamic_masking(pretraining.Vocab.of(tok), opts, config.seed)
  train_source = dataset.load_source(config.data.data_dir, config.data.train_split)
  if config.data.get("packing"):
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
    init_params = load_init_params(config.init_checkpoint, mcfg)
    checkpoint_lib.check_params_fit(init_params, run.abstract.params)  # every leaf: nothing stays fresh
  state, data_state, restored = trainer.resume_or_init(run, ckpt, config.seed, init_params,
                                                       announce=lambda m: print(m, flush=True))
  if data_state is not None:
    pipeline.set_state(data_state)
    logging.info("resumed from %s at step %d", ckpt.directory, restored)
  trainer.write_config(workdir, config)

  train_step, eval_step = run.train_step, run.eval_step
  eval_source = None
  try:
    eval_source = dataset.load_source(config.data.data_dir, config.data.eval_split)
    if len(eval_source) == 0:
      eval_source = None
    elif config.data.get("eval_masked_lm_prob", 0.0):  # e.g. ModernBERT: trains at 30%, evaluates at 15%
      tok = tokenizer_lib.load(tok_path, do_lower_case=tok_lower)
      opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.eval_masked_lm_prob,
                                            "max_predictions_per_seq": config.data.max_predictions_per_seq})
      eval_source = input_pipeline.Remasked(eval_source, pretraining.Vocab.of(tok), opts, seed=config.seed)
  except Exception as e:
    logging.warning("no evaluation split %r: %s", config.data.eval_split, e)

  total = config.train.num_steps
  start = int(jax.device_get(state.step))
  flops_per_step = accounting.pretraining_step_flops(mcfg, seq, preds, gbs)
  if is_electra(config):
    flops_per_step = accounting.electra_step_flops(mcfg, run.module.gen_cfg, seq, preds, gbs)
  peak, peak_source = accounting.peak_tflops_per_device(config.peak_tflops_per_device)
  writer = metrics_lib.Writer(workdir, start_step=start)
  progress = metrics_lib.Progress(total, start)
  if is_main:
    print(f"bertjax: {accounting.count_params(state.params):,} parameters ({mcfg.num_layers} layers, hidden "
          f"{mcfg.hidden_size}); mesh {dict(mesh.shape)}; {jax.device_count()} {jax.devices()[0].platform} "
          f"device(s); steps {start}->{total}; peak {peak:.2f} TFLOP/s/device ({peak_source})", flush=True)
  summary = {"start_step": start, "preempted": False}
  pending: list = []
  last_log = (time.time(), start)
  eval_metrics: dict = {}
  with trainer.StopFlag() as stop, sharding_lib.use_mesh(mesh, rules):
    if start == 0 and eval_source is not None and config.eval_every > 0:
      eval_metrics = evaluate(eval_step, state.params, eval_source, config, batch_sharding)
      writer.write(0, eval_metrics, "eval")
      summary["initial_eval"] = eval_metrics
      if is_main:
        print(f"eval at step 0: {_fmt(eval_metrics)}", flush=True)
    step = start
    for step in range(start + 1, total + 1):
      batch = next(pipeline)
      state, m = train_step(state, batch)
      pending.append((step, m))
      log_now = trainer.every(step, config.log_every, total)
      if config.train.stop_after_steps and step - start >= config.train.stop_after_steps and stop.signal is None:
        stop.signal = "stop_after_steps"
      # Read the flag once per step: a signal arriving later in this step is acted on after the next one, never
      # between deciding to save and deciding to stop.
      stopping = stop.signal
      save_now = trainer.every(step, config.checkpoint_every, total) or stopping is not None
      if log_now or save_now:
        host = trainer.check_finite(pending)
        now = time.time()
        if log_now:
          dt = (now - last_log[0]) / max(step - last_log[1], 1)
          mean = {k: float(np.mean([h[k] for h in host])) for k in host[-1]}
          mean.update(learning_rate=float(host[-1]["learning_rate"]), step_time_s=dt,
                      tokens_per_s=mean.pop("tokens") / dt,
                      mfu=accounting.mfu(flops_per_step, dt, peak, jax.device_count()))
          writer.write(step, mean)
          progress.log(step, mean)
          summary["train"] = mean
          last_log = (now, step)
        pending = []
      if eval_source is not None and trainer.every(step, config.eval_every, total):
        eval_metrics = evaluate(eval_step, state.params, eval_source, config, batch_sharding)
        writer.write(step, eval_metrics, "eval")
        if is_main:
          print(f"eval at step {step}: {_fmt(eval_metrics)}", flush=True)
      if save_now:
        ckpt.save(step, state, pipeline.get_state())
      if stopping is not None:
        if is_main:
          print(f"{stopping}: saved a checkpoint at step {step}; exiting", flush=True)
        summary["preempted"] = True
        break
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
