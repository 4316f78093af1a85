"""The pre-training run, read top to bottom in `_train_and_evaluate`: the data and the checks, the phase plan
(`plan`; a run of its own settings is a plan of one phase), a trainer per distinct model the phases run, the
batches (`mixture.stream` picks the pipeline), the state (resume order: the workdir's latest checkpoint, else
`init_checkpoint`, else from scratch), then the phases as stages of the loop every mode shares (`bertjax.run`),
with `Logger` doing the logging, evaluation and checkpoints. No objective is named here.
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
  """The trainer of the config's objective (`bertjax.objectives`), traced with the objective's example batch of
  one micro-batch; `special_ids`: the tokenizer's (cls, sep, mask) ids, for an objective that masks in the graph.
  The optimizer steps with a learning rate of 1 and the step scales its update by `lr_fn` at the global step
  (default: the config's schedule)."""
  checks.resolve(config)
  objective = objectives.get(config)
  if mesh is None:
    mesh, _, _ = trainer.mesh_and_shardings(config, devices)
  mcfg = mcfg.for_platform(mesh.devices.flat[0].platform)
  tx, _ = optim.make(config.train, lr=optim.unit)
  if lr_fn is None:
    lr_fn = phases_lib.lr_function(phases_lib.plan(config, 1))
  example = objective.example_batch(config, mcfg, config.train.global_batch_size // config.train.grad_accum_steps)
  model = objective.module(config, mcfg, special_ids)
  return trainer.build(config, model, tx, lr_fn, example, objective.train_step(model, tx, lr_fn, config),
                       objective.eval_step(model, config), mesh=mesh)


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


def _warn_if_no_peak(config, say) -> None:
  if not phases_lib.names(config) and config.train.warmup_steps >= config.train.num_steps:
    say(f"warning: train.warmup_steps {config.train.warmup_steps} is not below train.num_steps "
        f"{config.train.num_steps}: the learning rate never reaches its peak "
        f"(--config.train.warmup_steps=N sets the warmup)")


def _train_and_evaluate(config, workdir: str, started: float) -> dict:
  # The data and the checks, before anything compiles.
  creations, (tok_path, tok_lower) = _data(config)
  first = creations[next(iter(creations))]
  mcfg = checks.validate(config, jax.device_count(), creations=creations)
  run_lib.raise_if(start.init_errors(config))
  _check_resume(config, workdir)
  tok_path, tok_lower = run_lib.keep_tokenizer(workdir, tok_path, tok_lower)
  tok = lambda: tokenizer_lib.load(tok_path, do_lower_case=tok_lower)  # noqa: E731  (read when needed)
  say = print if jax.process_index() == 0 else (lambda _: None)
  _warn_if_no_peak(config, say)

  # The plan: the phases (a run of its own settings is one), one learning rate over the global step.
  gran = checks.granularity(config, jax.device_count())
  loaded = plan.train_sources(config, say)
  sizes = {name: len(loaded[folder]) for name, folder in plan.sources(config).items()}
  phases = plan.build_phases(config, gran, creations, sizes, start.checked_rate(config, gran))
  lr_fn = phases_lib.lr_function([p.steps for p in phases])

  # The trainers: one per distinct model the phases run.
  objective = objectives.get(config)
  special = None
  if objective.needs_special_ids:
    t = tok()
    special = (t.cls_id, t.sep_id, t.mask_id)
  trainers = _trainers(phases, mcfg, special, lr_fn)
  first_t = trainers[phases[0].model_key()]

  # The batches: the phases' segments, as one stream (`mixture.stream` picks the pipeline).
  vocab = pretraining.Vocab.of(tok()) if config.data.dynamic_masking else None  # masks drawn in the pipeline
  segs = plan.segments(phases, loaded, config, vocab, creations)
  pipeline = mixture.stream(segs, seed=config.seed, sharding=first_t.batch_sharding, prefetch=config.data.prefetch,
                            window=config.data.shuffle_window)
  for line in plan.describe(phases):
    say(line)
  stop_at = plan.announce_exhaustion(segs, {f: n for n, f in plan.sources(config).items()},
                                     config.data.when_exhausted, say)

  # The state: the workdir's checkpoint, else the init checkpoint, else fresh.
  run = _start(config, workdir, mcfg, first_t, phases, started)
  if run.saved is not None:
    pipeline.set_state(run.saved)
    logging.info("resumed from %s at step %d", run.ckpt.directory, run.start)
  run_lib.write_config(workdir, config)

  # The loop: the phases as stages, logged, evaluated and checkpointed by the logger.
  eval_dir = config.data.eval_dir or config.data.data_dir or phases[0].mixture[0][1]
  evals = eval_source(config, creations.get("data") or dataset.read_creation(eval_dir), tok, eval_dir)
  static_rate = None if config.data.dynamic_masking else first["options"]["masked_lm_prob"]
  logger = Logger(run, mcfg, phases, trainers, pipeline, evals, lr_fn, stop_at, static_rate)
  summary = logger()
  pipeline.close()
  if run.is_main:
    try:
      summary["plots"] = writers.plot(workdir) + goodput.plot(workdir)
    except FileNotFoundError:
      summary["plots"] = []
  return summary


def _data(config):
  """({source: creation}, the first source's tokenizer (path, lower)); a missing source or an empty data_dir is
  one line."""
  names = plan.sources(config)
  if not names:
    raise ConfigError("invalid config: data.data_dir is empty: build data with python -m bertjax dataset")
  creations, problems = plan.read_creations(config)
  run_lib.raise_if(problems)
  first = next(iter(creations))
  return creations, dataset.tokenizer_of(names[first], creations[first])


def _start(config, workdir: str, mcfg, t: trainer.Trainer, phases, started: float) -> run_lib.Run:
  """The run on the skeleton every mode shares, its state by the resume order: the workdir, else the init
  checkpoint's parameters (init_optimizer=reset) or whole state (keep), else fresh; the phases' ends are kept."""
  path, step = config.init_checkpoint, start.init_step(config)
  keep_state = bool(path) and config.init_optimizer == "keep"
  say = print if jax.process_index() == 0 else lambda _: None

  def init(abstract):
    if step is not None:  # reset reads the params of init_step, as keep does (not the newest)
      say(f"init_checkpoint {path}: step {step}, parameters (init_optimizer=reset)")
    return start.fit_init_params(start.load_init_params(path, mcfg, config.data.max_seq_length, step), abstract, path,
                                 announce=say)
  return run_lib.start(config, workdir, t, init=init if path and not keep_state else None,
                       init_state=(lambda: start.restore_full(config, t)) if keep_state else None,
                       keep_steps=[p.steps.end for p in phases[:-1]], started=started)


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


class Logger:
  """The pre-training loop's rhythm: the phases as stages of `Run.loop`, a progress line and a metrics row every
  `log_every` steps (the row also names the phase, its masking rate and mixture: `plan.scalars`), evaluation
  every `eval_every` (and at step 0 of a fresh run), checkpoints every `checkpoint_every`, at each phase's end
  and at a stop."""

  def __init__(self, run: run_lib.Run, mcfg, phases, trainers, pipeline, evals, lr_fn, stop_at, static_rate):
    self.run, self.mcfg, self.phases, self.trainers = run, mcfg, phases, trainers
    self.pipeline, self.evals, self.lr_fn, self.static_rate = pipeline, evals, lr_fn, static_rate
    self.total = phases[-1].steps.end if stop_at is None else min(phases[-1].steps.end, stop_at)
    self.ends = {p.steps.end for p in phases}
    self.phase, self.flops = phases[0], 0.0
    self.last_log = (time.time(), run.start)
    self.summary = {"start_step": run.start, "preempted": False, "eval": {}}
    self.peak, self.peak_source = accounting.peak_tflops_per_device(run.config.peak_tflops_per_device)

  def __call__(self) -> dict:
    """The phases run to the plan's end (or the stop); returns the run's summary."""
    run, config, total = self.run, self.run.config, self.total
    self.writer = run.open_writer()
    self.progress = writers.Progress(total, run.start)
    run.say(f"bertjax: {accounting.count_params(run.state.params):,} parameters ({self.mcfg.num_layers} layers, "
            f"hidden {self.mcfg.hidden_size}); mesh {dict(run.trainer.mesh.shape)}; {jax.device_count()} "
            f"{jax.devices()[0].platform} device(s); steps {run.start}->{total}; peak {self.peak:.2f} "
            f"TFLOP/s/device ({self.peak_source})")
    hooks = trainer.Hooks(
        log=self.log, save=self.save, evaluate=self.evaluate, begin=self.begin,
        log_due=lambda s: trainer.every(s, config.log_every, total) or s in self.ends,
        save_due=lambda s: trainer.every(s, config.checkpoint_every, total) or s in self.ends,
        eval_due=lambda s: self.evals is not None and trainer.every(s, config.eval_every, total))
    stages = [run_lib.Stage(self.trainers[ph.model_key()], min(ph.steps.end, total),
                            lambda state, step, ph=ph: self.enter(ph, state, step)) for ph in self.phases]
    state, step, stopped = run.loop(self.pipeline, stages, hooks)
    if stopped is None and step == total < self.phases[-1].steps.end:
      stopped = trainer.Stop.EXHAUSTED
    if stopped is not None:
      run.say(f"{stopped}: saved a checkpoint at step {step}; exiting")
      self.summary["preempted"] = stopped.preempted
    self.summary["goodput"] = run.close(stopped)
    self.summary.update(final_step=step, state=state, model_config=self.mcfg, phases=[p.name for p in self.phases])
    return self.summary

  def enter(self, ph: plan.Phase, state, step: int):
    """Phase `ph` takes over at `step`: its FLOPs per step for MFU, its line, its optimizer reset."""
    t = self.trainers[ph.model_key()]
    self.phase = ph
    self.flops = objectives.get(ph.config).step_flops(ph.config, plan.model_config(self.mcfg, ph), t.module)
    if step == ph.steps.start and ph.steps.start > 0:
      self.run.say(f"phase {ph.name}: steps {ph.steps.start}->{ph.steps.end}")
      if ph.steps.reset_optimizer:
        state = _reset_optimizer(t, state)
    return state

  def begin(self, state) -> None:
    """Before the first step of a fresh run: the evaluation at step 0."""
    fresh = self.run.start == 0 and "initial_eval" not in self.summary
    if fresh and self.evals is not None and self.run.config.eval_every > 0:
      self.evaluate(0, state)
      self.summary["initial_eval"] = self.summary["eval"]

  def log(self, step: int, host: list) -> None:
    now = time.time()
    dt = (now - self.last_log[0]) / max(step - self.last_log[1], 1)
    mean = {k: float(np.mean([h[k] for h in host])) for k in host[-1]}
    mean.update(learning_rate=float(host[-1]["learning_rate"]), step_time_s=dt, tokens_per_s=mean.pop("tokens") / dt,
                mfu=accounting.mfu(self.flops, dt, self.peak, jax.device_count()))
    named = bool(self.run.config.data.sources)
    self.writer.write(step, {**mean, **plan.scalars(self.phases, self.phase, step, named, self.static_rate)})
    self.progress.log(step, mean)
    self.summary["train"] = mean
    self.last_log = (now, step)

  def evaluate(self, step: int, state) -> None:
    t = self.trainers[self.phase.model_key()]
    self.summary["eval"] = evaluate(t.eval_step, state.params, self.evals, self.run.config, t.batch_sharding)
    self.writer.write(step, self.summary["eval"], "eval")
    self.run.say(f"eval at step {step}: {_fmt(self.summary['eval'])}")

  def save(self, step: int, state) -> None:
    # The rate of the last step taken: what a phase annealing from this checkpoint starts from (learning_rate -1).
    self.run.checkpoint(step, state, {**self.pipeline.get_state(),
                                      "learning_rate": float(self.lr_fn(max(step - 1, 0)))})


def _reset_optimizer(t: trainer.Trainer, state):
  """The state with a fresh optimizer state (Adam's moments and count from zero), on the trainer's shardings."""
  fresh = jax.jit(t.tx.init, out_shardings=t.shardings.opt_state)(state.params)
  return state.replace(opt_state=fresh)


def _fmt(m: dict) -> str:
  return ", ".join(f"{k} {v:.4f}" for k, v in sorted(m.items()))
