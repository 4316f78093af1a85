"""The pre-training run: the checks, the phases (`plan`), a trainer per distinct model the phases run, the
pipeline (plain, or phased with its mixtures), then the loop on the skeleton every mode shares (`bertjax.run`;
resume order: the workdir's latest checkpoint, else `init_checkpoint`, else from scratch). No objective is
named here.
"""
from __future__ import annotations

import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors, objectives
from bertjax import model as model_lib
from bertjax import run as run_lib
from bertjax.core import accounting, files, goodput, optim, trainer, writers
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import phases as phases_lib
from bertjax.data import packing
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.pretraining import dataset, mixture
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline
from bertjax.pretrain import checks, plan, start

ConfigError = errors.ConfigError


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


def build(config, mcfg: model_lib.BertConfig, devices=None, special_ids=None, lr_fn=None, mesh=None
          ) -> trainer.Trainer:
  """The trainer of the config's objective (`bertjax.objectives`); `special_ids`: the tokenizer's (cls, sep, mask)
  ids, for an objective that masks in the graph. The optimizer steps with a learning rate of 1 and the step
  scales its update by `lr_fn` at the global step (default: the config's schedule)."""
  checks.resolve(config)
  objective = objectives.get(config)
  if mesh is None:
    mesh, _, _ = trainer.mesh_and_shardings(config, devices)
  mcfg = mcfg.for_platform(mesh.devices.flat[0].platform)
  tx, schedule = optim.make(config.train, lr=optim.unit)
  del schedule
  if lr_fn is None:
    lr_fn = phases_lib.lr_function(phases_lib.plan(config, 1))
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
  """The plain run's training batches: the data's train split (packed, or re-masked each read at the run's rate
  and data.max_predictions_per_seq, as the config says), in the seed's order."""
  seq = config.data.max_seq_length
  transform = None
  if config.data.dynamic_masking:
    opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.masked_lm_prob,
                                          "max_predictions_per_seq": config.data.max_predictions_per_seq,
                                          "whole_word_mask": config.data.whole_word_mask})
    transform = fit_predictions(input_pipeline.dynamic_masking(pretraining.Vocab.of(tok()), opts, config.seed),
                                config.data.max_predictions_per_seq)
  source = dataset.load_source(config.data.data_dir, config.data.train_split, config.data.cache_limit)
  if config.data.packing:
    # The row plan is cached beside local data; a bucket's data may be shared and read-only, so it is planned anew.
    cache = files.join(config.data.data_dir, f"packing_{config.data.train_split}_{seq}_{row_predictions(config)}_"
                       f"{config.data.pack_max_per_row}.npz") if not files.is_remote(config.data.data_dir) else None
    n_examples = len(source)
    source = packing.PackedSource(source, seq, row_predictions(config), config.data.pack_max_per_row, cache=cache)
    if jax.process_index() == 0:
      print(f"packing: {n_examples} examples in {len(source)} rows "
            f"({n_examples / max(len(source), 1):.2f} per row)", flush=True)
  return input_pipeline.Pipeline(source, config.train.global_batch_size, seed=config.seed, sharding=batch_sharding,
                                 transform=transform, prefetch=config.data.prefetch, window=config.data.shuffle_window)


PREDICTION_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def fit_predictions(remask, cap: int):
  """`remask` (example, g) -> example drawing at most `cap` masks, on examples whose prediction arrays hold the
  data's cap: widened with empty slots first (a run's cap above the data's), cut to `cap` after (below it)."""
  def fn(example: dict, g: int) -> dict:
    width = len(example["masked_lm_positions"])
    if width < cap:
      example = dict(example)
      for k in PREDICTION_KEYS:
        v = np.asarray(example[k])
        example[k] = np.concatenate([v, np.zeros(cap - width, v.dtype)])
    out = remask(example, g)
    if width > cap:
      out = {**out, **{k: np.asarray(out[k])[:cap] for k in PREDICTION_KEYS}}
    return out
  return fn


def eval_source(config, creation: dict, tok, data_dir: str | None = None):
  """The held-out split of `data_dir` (default data.data_dir; re-masked once at `data.eval_masked_lm_prob` when
  set), or None when there is none."""
  data_dir = data_dir or config.data.data_dir
  try:
    source = dataset.load_source(data_dir, config.data.eval_split, config.data.cache_limit)
    if len(source) == 0:
      return None
    if config.data.eval_masked_lm_prob:  # e.g. ModernBERT: trains at 30%, evaluates at 15%
      opts = pretraining.CreationOptions(**{**creation["options"], "masked_lm_prob": config.data.eval_masked_lm_prob,
                                            "max_predictions_per_seq": creation["options"]["max_predictions_per_seq"]})
      source = input_pipeline.Remasked(source, pretraining.Vocab.of(tok()), opts, seed=config.seed)
    return source
  except Exception as e:
    logging.warning("no evaluation split %r: %s", config.data.eval_split, e)
    return None


# ----------------------------------------------------------------------------- the run
def train_and_evaluate(config, workdir: str, started: float | None = None) -> dict:
  """Pre-train per `config` in `workdir` (resuming if it has checkpoints). Returns a summary dict (its `goodput`:
  `goodput.summarise` of the job so far).

  The workdir is locked for the run: a second run pointed at it refuses to start. `started`: when the attempt
  began, the origin of its start-up time (a command passes its process's start; default now).
  """
  started = time.time() if started is None else started
  with run_lib.opened(workdir, "pretrain"):
    return _train_and_evaluate(config, workdir, started)


def _data(config):
  """(creation of the run's first source, {source: creation}, its tokenizer (path, lower)); a missing source or
  an empty data_dir is one line."""
  names = plan.sources(config)
  if not names:
    raise ConfigError("invalid config: data.data_dir is empty: build data with python -m bertjax dataset")
  if plan.is_plain(config):
    creation = dataset.read_creation(config.data.data_dir)
    return creation, {"data": creation}, dataset.tokenizer_of(config.data.data_dir, creation)
  creations, problems = plan.read_creations(config)
  run_lib.raise_if(problems)
  first = next(iter(creations))
  return creations[first], creations, dataset.tokenizer_of(names[first], creations[first])


def _train_and_evaluate(config, workdir: str, started: float) -> dict:
  creation, creations, (tok_path, tok_lower) = _data(config)
  mcfg = checks.validate(config, jax.device_count(), creation if plan.is_plain(config) else None,
                         creations=creations)
  run_lib.raise_if(start.init_errors(config))
  _check_resume(config, workdir)
  tok_path, tok_lower = run_lib.keep_tokenizer(workdir, tok_path, tok_lower)
  tok = lambda: tokenizer_lib.load(tok_path, do_lower_case=tok_lower)  # noqa: E731  (read when needed)
  if jax.process_index() == 0 and plan.is_plain(config) and config.train.warmup_steps >= config.train.num_steps:
    print(f"warning: train.warmup_steps {config.train.warmup_steps} is not below train.num_steps "
          f"{config.train.num_steps}: the learning rate never reaches its peak "
          f"(--config.train.warmup_steps=N sets the warmup)", flush=True)
  gran = checks.granularity(config, jax.device_count())
  init_lr = start.checked_rate(config, gran) if config.init_checkpoint else None
  loaded = {}
  if plan.is_plain(config):
    sizes = {"data": None}
  else:
    loaded = {folder: dataset.load_source(folder, config.data.train_split, config.data.cache_limit)
              for folder in plan.sources(config).values()}
    sizes = {name: len(loaded[folder]) for name, folder in plan.sources(config).items()}
  phases = plan.build_phases(config, gran, creations, sizes, init_lr)
  lr_fn = phases_lib.lr_function([p.steps for p in phases])
  special = None
  if objectives.get(config).needs_special_ids:
    t = tok()
    special = (t.cls_id, t.sep_id, t.mask_id)
  trainers = _trainers(phases, mcfg, special, lr_fn)
  first_t = trainers[phases[0].model_key()]
  if plan.is_plain(config):
    pipeline = train_source(config, creation, tok, first_t.batch_sharding)
    stop_at = None
  else:
    segs = plan.segments(phases, loaded, config, pretraining.Vocab.of(tok()))
    pipeline = mixture.PhasedPipeline(segs, seed=config.seed, sharding=first_t.batch_sharding,
                                      prefetch=config.data.prefetch, window=config.data.shuffle_window)
    say = print if jax.process_index() == 0 else (lambda _: None)
    for line in plan.describe(phases):
      say(line)
    stop_at = plan.announce_exhaustion(segs, {f: n for n, f in plan.sources(config).items()},
                                       config.data.get("when_exhausted", "repeat"), say)

  def init(abstract):
    path, step = config.init_checkpoint, start.init_step(config)
    say = print if jax.process_index() == 0 else lambda _: None
    if step is not None:  # reset reads the params of init_step, as keep does (not the newest)
      say(f"init_checkpoint {path}: step {step}, parameters (init_optimizer=reset)")
    return start.fit_init_params(start.load_init_params(path, mcfg, config.data.max_seq_length, step), abstract, path,
                                 announce=say)
  keep_state = config.init_checkpoint and config.get("init_optimizer", "reset") == "keep"
  run = run_lib.start(config, workdir, first_t, init=init if config.init_checkpoint and not keep_state else None,
                      init_state=(lambda: start.restore_full(config, first_t)) if keep_state else None,
                      keep_steps=[p.steps.end for p in phases[:-1]], started=started)
  if run.saved is not None:
    pipeline.set_state(run.saved)
    logging.info("resumed from %s at step %d", run.ckpt.directory, run.start)
  run_lib.write_config(workdir, config)
  eval_dir = config.data.get("eval_dir", "") or config.data.data_dir or phases[0].mixture[0][1]
  evals = eval_source(config, creations.get("data") or dataset.read_creation(eval_dir), tok, eval_dir)
  static_rate = (creation["options"]["masked_lm_prob"] if plan.is_plain(config) and not config.data.dynamic_masking
                 else None)
  summary = _run(run, mcfg, phases, trainers, pipeline, evals, lr_fn, stop_at, static_rate)
  pipeline.close()
  if run.is_main:
    try:
      summary["plots"] = writers.plot(workdir) + goodput.plot(workdir)
    except FileNotFoundError:
      summary["plots"] = []
  return summary


def _check_resume(config, workdir: str) -> None:
  """A workdir holding checkpoints resumes only with the phase plan its config.json holds (`plan.resume_keys`):
  another length, masking rate or mixture of a phase would carry on from the checkpoint as if nothing changed."""
  if not files.isdir(files.join(workdir, "checkpoints")):
    return
  ckpt = checkpoint_lib.Checkpointer(workdir, read_only=True)
  try:
    held = ckpt.steps()
  finally:
    ckpt.manager.close()
  if held:
    run_lib.check_same_settings(workdir, config, plan.resume_keys(config), "pre-training")


def _trainers(phases, mcfg, special, lr_fn) -> dict:
  """One trainer per distinct model the phases run (their rotary θ and window), on one mesh; phases that differ
  only in sequence length or batch share one (a new shape is a new compile of the same step)."""
  out, mesh = {}, None
  for ph in phases:
    key = ph.model_key()
    if key not in out:
      out[key] = build(ph.config, plan.model_config(mcfg, ph), special_ids=special, lr_fn=lr_fn, mesh=mesh)
      mesh = out[key].mesh
  return out


def _run(run: run_lib.Run, mcfg, phases, trainers, pipeline, evals, lr_fn, stop_at, static_rate=None) -> dict:
  """The loop: phase after phase, a progress line every `log_every` steps (its metrics row also names the phase,
  its masking rate and mixture: `plan.scalars`), evaluation every `eval_every` (and at step 0 of a fresh run),
  checkpoints every `checkpoint_every`, at each phase's end and at a stop."""
  config = run.config
  total, begin_step = phases[-1].steps.end, run.start
  if stop_at is not None:
    total = min(total, stop_at)
  peak, peak_source = accounting.peak_tflops_per_device(config.peak_tflops_per_device)
  writer = run.open_writer()
  progress = writers.Progress(total, begin_step)
  t0 = run.trainer
  run.say(f"bertjax: {accounting.count_params(run.state.params):,} parameters ({mcfg.num_layers} layers, hidden "
          f"{mcfg.hidden_size}); mesh {dict(t0.mesh.shape)}; {jax.device_count()} {jax.devices()[0].platform} "
          f"device(s); steps {begin_step}->{total}; peak {peak:.2f} TFLOP/s/device ({peak_source})")
  summary = {"start_step": begin_step, "preempted": False, "eval": {}}
  current = {"phase": phases[0], "flops": 0.0}
  last_log = [time.time(), begin_step]
  ends = {p.steps.end for p in phases}

  def log(step, host):
    now = time.time()
    dt = (now - last_log[0]) / max(step - last_log[1], 1)
    mean = {k: float(np.mean([h[k] for h in host])) for k in host[-1]}
    mean.update(learning_rate=float(host[-1]["learning_rate"]), step_time_s=dt, tokens_per_s=mean.pop("tokens") / dt,
                mfu=accounting.mfu(current["flops"], dt, peak, jax.device_count()))
    writer.write(step, {**mean, **plan.scalars(phases, current["phase"], step, plan.is_plain(config), static_rate)})
    progress.log(step, mean)
    summary["train"] = mean
    last_log[:] = [now, step]

  def run_eval(step, state):
    t = trainers[current["phase"].model_key()]
    summary["eval"] = evaluate(t.eval_step, state.params, evals, config, t.batch_sharding)
    writer.write(step, summary["eval"], "eval")
    run.say(f"eval at step {step}: {_fmt(summary['eval'])}")

  def save(step, state):
    # The rate of the last step taken: what a phase annealing from this checkpoint starts from (learning_rate -1).
    run.checkpoint(step, state, {**pipeline.get_state(), "learning_rate": float(lr_fn(max(step - 1, 0)))})

  state, step, stopping = run.state, begin_step, None
  for ph in phases:
    if ph.steps.end <= step or step >= total:
      continue
    t = trainers[ph.model_key()]
    current.update(phase=ph, flops=objectives.get(ph.config).step_flops(ph.config, plan.model_config(mcfg, ph),
                                                                        t.module))
    if step == ph.steps.start and ph.steps.start > 0:
      run.say(f"phase {ph.name}: steps {ph.steps.start}->{ph.steps.end}")
      if ph.steps.reset_optimizer:
        state = _reset_optimizer(t, state)
    first = step == begin_step

    def begin(s, first=first):
      if first and begin_step == 0 and evals is not None and config.eval_every > 0:
        run_eval(0, s)
        summary["initial_eval"] = summary["eval"]
    hooks = trainer.Hooks(
        log=log, save=save, evaluate=run_eval, begin=begin,
        log_due=lambda s: trainer.every(s, config.log_every, total) or s in ends,
        save_due=lambda s: trainer.every(s, config.checkpoint_every, total) or s in ends,
        eval_due=lambda s: evals is not None and trainer.every(s, config.eval_every, total))
    stop_after = config.train.stop_after_steps
    remaining = stop_after - (step - begin_step) if stop_after else 0
    run.trainer = t
    state, step, stopping = trainer.loop(t, state, pipeline, step, min(ph.steps.end, total), hooks, remaining,
                                         clock=run.clock)
    run.state = state
    if stopping is not None:
      break
  if stopping is None and stop_at is not None and step == stop_at < phases[-1].steps.end:
    stopping = "a source ran out (data.when_exhausted=stop)"
  if stopping is not None:
    run.say(f"{stopping}: saved a checkpoint at step {step}; exiting")
    summary["preempted"] = stopping != "a source ran out (data.when_exhausted=stop)"
  summary["goodput"] = run.close(stopping)
  summary.update(final_step=step, state=state, model_config=mcfg, phases=[p.name for p in phases])
  return summary


def _reset_optimizer(t: trainer.Trainer, state):
  """The state with a fresh optimizer state (Adam's moments and count from zero), on the trainer's shardings."""
  fresh = jax.jit(t.tx.init, out_shardings=t.shardings.opt_state)(state.params)
  return state.replace(opt_state=fresh)


def _fmt(m: dict) -> str:
  return ", ".join(f"{k} {v:.4f}" for k, v in sorted(m.items()))
