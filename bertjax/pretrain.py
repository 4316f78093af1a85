"""Pre-training: mesh -> sharded state -> one jitted step -> periodic log / eval / checkpoint.

Reads top to bottom: `validate` (every check of the config, before anything compiles), `build` (the config's
objective, from `bertjax.objectives`, handed to the trainer core), and `train_and_evaluate`, the run on the
skeleton every mode shares (`bertjax.run`; resume order: the workdir's latest checkpoint, else
`init_checkpoint`, else from scratch). No objective is named here.
"""
from __future__ import annotations

import logging
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors, objectives
from bertjax import model as model_lib
from bertjax import run as run_lib
from bertjax.convert import weights
from bertjax.core import accounting, optim, trainer, writers
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import sharding as sharding_lib
from bertjax.data import packing
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.pretraining import dataset
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline

ConfigError = errors.ConfigError


def resolve(config):
  """Fills the fields a config may leave to be derived (in place): data.max_predictions_per_seq 0 = from the
  sequence length and masking rate, as the data creation derives it."""
  if config.data.max_predictions_per_seq == 0:
    config.data.max_predictions_per_seq = pretraining.max_predictions(config.data.max_seq_length,
                                                                      config.data.masked_lm_prob)
  return config


# ----------------------------------------------------------------------------- checks
def validate(config, num_devices: int, creation: dict | None = None, tokenizer_vocab: int | None = None
             ) -> model_lib.BertConfig:
  """The model config, or one ConfigError listing every problem found: the run's own settings
  (`run.run_errors`), the batch over the mesh, the model, the data it was made with and the objective's rules.
  Fills the derived fields first (`resolve`)."""
  resolve(config)
  problems = []
  mcfg = None
  try:
    mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
  except (ValueError, TypeError) as e:
    problems.append(str(e))
  problems += _train_errors(config) + run_lib.run_errors(config) + _mesh_errors(config, num_devices, mcfg)
  problems += _data_errors(config, mcfg, creation)
  try:
    problems += objectives.get(config).errors(config, mcfg)
  except ConfigError as e:
    problems.append(str(e))
  if tokenizer_vocab is not None and mcfg is not None and tokenizer_vocab != mcfg.vocab_size:
    problems.append(f"model.vocab_size {mcfg.vocab_size} does not match the tokenizer's {tokenizer_vocab}")
  run_lib.raise_if(problems)
  return mcfg


def _train_errors(config) -> list[str]:
  t = config.train
  out = [f"train.{name} must be positive, got {getattr(t, name)}"
         for name in ("global_batch_size", "grad_accum_steps", "num_steps") if getattr(t, name) <= 0]
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
    for key in ("max_seq_length", "max_predictions_per_seq"):
      if made[key] != config.data[key]:
        out.append(f"data.{key} is {config.data[key]} but the data in {config.data.data_dir} was made with "
                   f"{made[key]}")
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


# ----------------------------------------------------------------------------- the model, its start, its data
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


def train_source(config, creation: dict, tok, batch_sharding):
  """The training batches' pipeline: the data's train split (packed, or re-masked each read, as the config says),
  in the seed's order."""
  seq = config.data.max_seq_length
  transform = None
  if config.data.dynamic_masking:
    opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.masked_lm_prob,
                                          "whole_word_mask": config.data.whole_word_mask})
    transform = input_pipeline.dynamic_masking(pretraining.Vocab.of(tok()), opts, config.seed)
  source = dataset.load_source(config.data.data_dir, config.data.train_split)
  if config.data.packing:
    cache = os.path.join(config.data.data_dir, f"packing_{config.data.train_split}_{seq}_{row_predictions(config)}_"
                         f"{config.data.pack_max_per_row}.npz") if "://" not in config.data.data_dir else None
    n_examples = len(source)
    source = packing.PackedSource(source, seq, row_predictions(config), config.data.pack_max_per_row, cache=cache)
    if jax.process_index() == 0:
      print(f"packing: {n_examples} examples in {len(source)} rows "
            f"({n_examples / max(len(source), 1):.2f} per row)", flush=True)
  return input_pipeline.Pipeline(source, config.train.global_batch_size, seed=config.seed, sharding=batch_sharding,
                                 transform=transform, prefetch=config.data.prefetch)


def eval_source(config, creation: dict, tok):
  """The held-out split (re-masked once at `data.eval_masked_lm_prob` when set), or None when there is none."""
  try:
    source = dataset.load_source(config.data.data_dir, config.data.eval_split)
    if len(source) == 0:
      return None
    if config.data.eval_masked_lm_prob:  # e.g. ModernBERT: trains at 30%, evaluates at 15%
      opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.eval_masked_lm_prob,
                                            "max_predictions_per_seq": config.data.max_predictions_per_seq})
      source = input_pipeline.Remasked(source, pretraining.Vocab.of(tok()), opts, seed=config.seed)
    return source
  except Exception as e:
    logging.warning("no evaluation split %r: %s", config.data.eval_split, e)
    return None


# ----------------------------------------------------------------------------- the run
def train_and_evaluate(config, workdir: str) -> dict:
  """Pre-train per `config` in `workdir` (resuming if it has checkpoints). Returns a summary dict.

  The workdir is locked for the run: a second run pointed at it refuses to start.
  """
  with run_lib.opened(workdir, "pretrain"):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config, workdir: str) -> dict:
  if not config.data.data_dir:
    raise ConfigError("invalid config: data.data_dir is empty: build data with python -m bertjax dataset")
  creation = dataset.read_creation(config.data.data_dir)
  mcfg = validate(config, jax.device_count(), creation)
  tok_path, tok_lower = run_lib.keep_tokenizer(workdir, *dataset.tokenizer_of(config.data.data_dir, creation))
  tok = lambda: tokenizer_lib.load(tok_path, do_lower_case=tok_lower)  # noqa: E731  (read when needed)
  if jax.process_index() == 0 and config.train.warmup_steps >= config.train.num_steps:
    print(f"warning: train.warmup_steps {config.train.warmup_steps} is not below train.num_steps "
          f"{config.train.num_steps}: the learning rate never reaches its peak "
          f"(--config.train.warmup_steps=N sets the warmup)", flush=True)
  special = None
  if objectives.get(config).needs_special_ids:
    t = tok()
    special = (t.cls_id, t.sep_id, t.mask_id)
  t = build(config, mcfg, special_ids=special)
  pipeline = train_source(config, creation, tok, t.batch_sharding)

  def init(abstract):
    path = config.init_checkpoint
    return fit_init_params(load_init_params(path, mcfg, config.data.max_seq_length), abstract, path,
                           announce=print if jax.process_index() == 0 else lambda _: None)
  run = run_lib.start(config, workdir, t, init=init if config.init_checkpoint else None)
  if run.saved is not None:
    pipeline.set_state(run.saved)
    logging.info("resumed from %s at step %d", run.ckpt.directory, run.start)
  run_lib.write_config(workdir, config)
  summary = _run(run, mcfg, pipeline, eval_source(config, creation, tok))
  pipeline.close()
  if run.is_main:
    try:
      summary["plots"] = writers.plot(workdir)
    except FileNotFoundError:
      summary["plots"] = []
  return summary


def _run(run: run_lib.Run, mcfg, pipeline, evals) -> dict:
  """The loop: a progress line every `log_every` steps, evaluation every `eval_every` (and at step 0 of a fresh
  run), checkpoints every `checkpoint_every` and at a stop."""
  config, t = run.config, run.trainer
  total, start = config.train.num_steps, run.start
  flops_per_step = objectives.get(config).step_flops(config, mcfg, t.module)
  peak, peak_source = accounting.peak_tflops_per_device(config.peak_tflops_per_device)
  writer = run.open_writer()
  progress = writers.Progress(total, start)
  run.say(f"bertjax: {accounting.count_params(run.state.params):,} parameters ({mcfg.num_layers} layers, hidden "
          f"{mcfg.hidden_size}); mesh {dict(t.mesh.shape)}; {jax.device_count()} {jax.devices()[0].platform} "
          f"device(s); steps {start}->{total}; peak {peak:.2f} TFLOP/s/device ({peak_source})")
  summary = {"start_step": start, "preempted": False, "eval": {}}
  last_log = [time.time(), start]

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
    summary["eval"] = evaluate(t.eval_step, state.params, evals, config, t.batch_sharding)
    writer.write(step, summary["eval"], "eval")
    run.say(f"eval at step {step}: {_fmt(summary['eval'])}")

  def begin(state):
    if start == 0 and evals is not None and config.eval_every > 0:
      run_eval(0, state)
      summary["initial_eval"] = summary["eval"]

  hooks = trainer.Hooks(
      log=log, save=lambda step, state: run.ckpt.save(step, state, pipeline.get_state()),
      log_due=lambda step: trainer.every(step, config.log_every, total),
      save_due=lambda step: trainer.every(step, config.checkpoint_every, total),
      evaluate=run_eval, begin=begin,
      eval_due=lambda step: evals is not None and trainer.every(step, config.eval_every, total))
  state, step, stopping = run.loop(pipeline, total, hooks)
  if stopping is not None:
    run.say(f"{stopping}: saved a checkpoint at step {step}; exiting")
    summary["preempted"] = True
  run.close()
  summary.update(final_step=step, state=state, model_config=mcfg)
  return summary


def _fmt(m: dict) -> str:
  return ", ".join(f"{k} {v:.4f}" for k, v in sorted(m.items()))
