"""Fine-tuning on GLUE, SQuAD, NER, embedding pairs or users' own files with the paper's recipe: a task-agnostic
run on the skeleton every mode shares (`bertjax.run`), the task kind's plug-in (`bertjax.tasks`) and one weight
loader (`bertjax.convert.weights`).

  python -m bertjax train --config=configs/finetune.py:task=glue/mrpc,init=DIR_OR_HF_DIR --workdir=W

`init` is a bertjax pre-training workdir, a fine-tuned workdir (its encoder), an HF safetensors folder (with its
vocab.txt) or a sentence-transformers folder; the whole model is trained end to end. After each epoch every eval
split is scored with the task's exact metrics; the best parameters by the main metric are kept in W/best;
W/report.json and W/report.txt hold the results. Evaluation sees every example once: the last batch is padded with
zero-weight rows.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import ml_collections
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax import run as run_lib
from bertjax import tasks as tasks_lib
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files, goodput, optim, trainer, writers
from bertjax.core import sharding as sharding_lib
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.tasks import batching
from bertjax.data.tasks.batching import Plan, bucket_multiple, make_batch, predict_all, predict_packed
from bertjax.model.config import INIT_RATES
from bertjax.tasks import EvalSet
from bertjax.tasks.packed import pack_train, use_packing  # noqa: F401  (finetune.pack_train: the public name)

# A fine-tuning config's model fields that describe the architecture: they apply only without an init; the rest
# (dropout, dtype, kernels, the head's initializer) apply over the init's own architecture.
ARCHITECTURE_FIELDS = ("variant", "num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size",
                       "max_position_embeddings")
TaskDataError = tasks_lib.TaskDataError


# ----------------------------------------------------------------------------- checks, init, data
def validate(config) -> None:
  """Every check of a fine-tuning config's own settings, before anything is read or built; the task's data and
  the init are checked as they are read (`load_init`, the task kind's `load`)."""
  problems = run_lib.run_errors(config)
  if config.data.length_buckets < 0:
    problems.append(f"data.length_buckets must be >= 0, got {config.data.length_buckets}")
  accum = config.train.grad_accum_steps
  if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
    problems.append(f"train.grad_accum_steps must be a positive integer, got {accum!r}")
  run_lib.raise_if(problems)


def load_init(config, task: tasks_lib.Task | None = None):
  """(tokenizer, BertConfig, initial params or None, tokenizer path, lower-casing) from config.init: a bertjax
  pre-training workdir, a fine-tuned workdir, an HF folder, a sentence-transformers folder, or "" (random init).
  The params are a partial tree: `bert` (the encoder; its pooler may be missing) and whatever head of this task's
  kind the init already holds (the kind's `weights`)."""
  tok_path, lower = config.data.tokenizer, config.data.do_lower_case
  if config.init:
    run_fields = {k: v for k, v in config.model.items() if k not in ARCHITECTURE_FIELDS and not _init_rate(k, v)}
    kind = tasks_lib.kind(task) if task is not None else tasks_lib.Kind()
    mcfg, params, init_tok, init_lower = kind.weights(task, config.init, run_fields)
    if not tok_path:
      tok_path, lower = init_tok, init_lower
  else:
    mcfg, params = model_config(config), None
  if not tok_path:
    raise TaskDataError("no tokenizer: set config.data.tokenizer (vocab.txt or .model) or an init with one")
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  if tok.vocab_size != mcfg.vocab_size:
    raise TaskDataError(f"tokenizer {tok_path} has {tok.vocab_size} pieces, the model {mcfg.vocab_size}"
                        + ("" if config.init else f": pass vocab={tok.vocab_size} in --config=...:ARGS"))
  return tok, mcfg, params, tok_path, lower


def _init_rate(field: str, value) -> bool:
  """Whether a fine-tuning config's model field defers to the init's (a dropout rate left negative)."""
  return field in INIT_RATES and value < 0


def model_config(config, **overrides) -> model_lib.BertConfig:
  """The model a fine-tuning config describes without an init: its rates left to the init take BertConfig's
  defaults."""
  fields = {k: v for k, v in config.model.items() if not (_init_rate(k, v) and k != "classifier_dropout")}
  return model_lib.BertConfig.from_dict({**fields, **overrides})


@dataclasses.dataclass
class TrainData:
  """The featurised training rows (packed or not), the evaluation sets and the plan of the run's steps."""
  train: dict
  evals: list[EvalSet]
  stats: dict
  n_examples: int
  packed: bool
  rows_per_step: int
  plan: Plan
  bucket: int
  note: str = ""


def prepare_data(config, task: tasks_lib.Task, tok, dp: int) -> TrainData:
  """The task kind's features, packed when `use_packing` says so, and the epochs' batches (`Plan`)."""
  kind = tasks_lib.kind(task)
  train, evals, stats = kind.load(task, config, tok)
  n_train, gbs = batching.num_rows(train), config.train.global_batch_size
  accum = config.train.grad_accum_steps
  if gbs % (dp * accum):
    raise TaskDataError(f"global_batch_size {gbs} is not divisible by the data-parallel size {dp}"
                        + (f" times train.grad_accum_steps {accum}" if accum > 1 else ""))
  rows_per_step, note = gbs, ""
  packed = use_packing(config, task, train)
  if packed:
    train, rows_per_step, note = pack_train(train, task, config, dp)
    if not config.data.packing:
      note += " (short examples; --config.data.auto_packing=False keeps them one per row)"
  n_rows = batching.num_rows(train)
  if n_rows == 0:
    raise TaskDataError("no training examples")
  # Packed rows are nearly full: cutting a batch to its longest row saves little and compiles one program per
  # length, so they keep their one shape.
  bucket = 0 if packed else bucket_multiple(config.data.max_seq_length, config.data.length_buckets)
  grouping = config.data.group_by_length and bucket
  plan = Plan(n_rows, rows_per_step, config.train.num_epochs, config.seed, config.train.warmup_fraction,
              batching.row_lengths(train) if grouping else None, bucket if grouping else 0)
  return TrainData(train, evals, stats, n_train, packed, rows_per_step, plan, bucket, note)


# ----------------------------------------------------------------------------- steps
def unit_optimizer(train_config):
  """(optimizer, schedule) of `train_config` with a peak learning rate of 1, for `make_steps`."""
  unit = ml_collections.ConfigDict(train_config.to_dict())
  unit.learning_rate = 1.0
  return optim.make(unit)


def make_steps(module, task, tx, lr_fn, prng_impl="threefry2x32", total_steps=None, accum=1):
  """(train_step(state, batch, seed, learning_rate), predict_step(params, batch)); build them with
  `trainer.build(..., train_scalars=2)`. `tx` and `lr_fn` are the recipe's with a peak learning rate of 1
  (`unit_optimizer`); the step scales the update by the peak it is given. The seed and the peak are arguments,
  not constants of the program, so that a sweep over seeds and learning rates compiles (or loads from the
  persistent cache) each program once. `total_steps`: the run's length, for kinds whose loss follows the step
  (`Kind.value_and_grad`). `accum`: micro-batches per step (`train.grad_accum_steps`)."""
  kind = tasks_lib.kind(task)

  def train_step(state, batch, seed, learning_rate):
    key = jax.random.fold_in(jax.random.key(seed, impl=prng_impl), 2)
    loss, grads = kind.value_and_grad(task, module, state.params, batch,
                                      {"dropout": jax.random.fold_in(key, state.step)},
                                      step=state.step, total_steps=total_steps, accum=accum)
    new, grad_norm = trainer.apply_gradients(state, grads, tx, scale=learning_rate)
    return new, {"loss": loss, "grad_norm": grad_norm, "learning_rate": learning_rate * lr_fn(state.step)}

  def predict_step(params, batch):
    out = module.apply({"params": params}, batch, deterministic=True)
    return {k: out[k] for k in kind.outputs}

  return train_step, predict_step


def accum(config, task: tasks_lib.Task) -> int:
  """The micro-batches per step (`train.grad_accum_steps`), refused for a kind whose loss compares rows across
  the batch."""
  steps = config.train.grad_accum_steps
  if steps > 1 and not tasks_lib.kind(task).accumulates(task):
    raise errors.ConfigError(f"train.grad_accum_steps {steps}: this task's loss compares rows across the whole "
                             "batch (in-batch negatives, ListNet lists), so micro-batches would change it; "
                             "embedding.cache_chunk bounds a contrastive step's memory instead")
  return steps


def build(config, task: tasks_lib.Task, mcfg, data: TrainData, mesh) -> trainer.Trainer:
  """The trainer of the task kind's model: the recipe's optimizer over the plan's steps, traced on one batch."""
  tcfg = ml_collections.ConfigDict(config.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = data.plan.total_steps, data.plan.warmup_steps
  tx, lr_fn = unit_optimizer(tcfg)
  module = tasks_lib.kind(task).head(task, mcfg.for_platform(mesh.devices.flat[0].platform))
  dummy = make_batch(data.train, np.arange(min(data.rows_per_step, batching.num_rows(data.train))),
                     data.rows_per_step)
  return trainer.build(config, module, tx, lr_fn, dummy, *make_steps(module, task, tx, lr_fn, config.train.prng_impl,
                                                                  data.plan.total_steps, accum(config, task)),
                       mesh=mesh, train_scalars=2)


def read_train_metrics(workdir: str) -> list[dict]:
  """The training rows of WORKDIR/metrics.jsonl (one per logged step)."""
  return [r for r in writers.read_jsonl(files.join(workdir, "metrics.jsonl")) if r.get("split") == "train"]


# ----------------------------------------------------------------------------- the run
# What a fine-tuning run learns from: a resume with other values would report the old run as the new one's.
RUN_SETTINGS = ("task", "init", "seed", "data.train_file", "data.labels", "data.max_seq_length",
                "train.learning_rate", "train.global_batch_size")


def finetune(config, workdir: str, devices=None, started: float | None = None) -> dict:
  """Fine-tune per `config` in `workdir`, resuming from its checkpoint if a run was stopped there, on `devices`
  (default: all). The workdir is locked for the run. `started`: when the attempt began, the origin of its
  goodput's start-up time (a command passes its process's start; default now)."""
  started = time.time() if started is None else started
  with run_lib.opened(workdir, "finetune"):
    return _finetune(config, workdir, devices, started)


def _finetune(config, workdir: str, devices, started: float) -> dict:
  validate(config)
  task = tasks_lib.get(config.task, tuple(config.data.labels), config.data.regression, config)
  accum(config, task)
  tok, mcfg, init_params, tok_path, lower = load_init(config, task)
  if config.data.max_seq_length > mcfg.max_position_embeddings:
    raise TaskDataError(f"data.max_seq_length {config.data.max_seq_length} exceeds the model's "
                        f"max_position_embeddings {mcfg.max_position_embeddings}")
  mesh, _, _ = trainer.mesh_and_shardings(config, devices)
  data = prepare_data(config, task, tok, sharding_lib.data_parallel_size(mesh))
  t = build(config, task, mcfg, data, mesh)
  eval_batch = config.train.eval_batch_size or config.train.global_batch_size
  if eval_batch % sharding_lib.data_parallel_size(mesh):
    raise TaskDataError(f"train.eval_batch_size {eval_batch} is not divisible by the data-parallel "
                        f"size {sharding_lib.data_parallel_size(mesh)}")
  run = run_lib.start(config, workdir, t, init=(lambda abstract: _fit_init(init_params, abstract))
                      if init_params is not None else None, started=started)
  total = data.plan.total_steps
  report = {"task": task.name, "main_metric": task.main_metric, "epochs": [], "best": None}
  if run.saved is not None:  # a stopped run: continue it exactly (same order, same dropout)
    run_lib.check_same_settings(workdir, config, RUN_SETTINGS, "fine-tuning")
    if run.saved.get("total_steps") != total:
      raise TaskDataError(f"{workdir} holds a fine-tuning run of {run.saved.get('total_steps')} steps; this "
                          f"config makes {total}: use a new --workdir")
    report = run.saved["report"]
    run.say(f"resuming the fine-tuning run in {workdir} at step {run.start}/{total}")
  _write_meta(run, task, mcfg, tok_path, lower)
  run.say(f"fine-tuning {task.name}: {data.n_examples} training examples, {total} steps ({config.train.num_epochs} "
          f"epochs of {data.plan.steps_per_epoch}), lr {config.train.learning_rate}, batch "
          f"{config.train.global_batch_size}, warmup {data.plan.warmup_steps}"
          + "".join(f"; {k}: {v}" for k, v in data.stats.items() if v))
  if data.note:
    run.say(data.note)
  return _train(run, task, mcfg, data, report, eval_batch)


def _fit_init(init_params: dict, abstract: dict) -> dict:
  """The init's params this model takes: the encoder's pooler left out when no head of this model reads it (an
  embedding model; a family head without one)."""
  if "pooler" in init_params.get("bert", {}) and "pooler" not in abstract["bert"]:
    return {**init_params, "bert": {k: v for k, v in init_params["bert"].items() if k != "pooler"}}
  return init_params


def _write_meta(run: run_lib.Run, task, mcfg, tok_path: str, lower: bool) -> None:
  """The workdir's tokenizer copy, config.json and finetune.json: what prediction, export and `init=` read."""
  config, workdir = run.config, run.workdir
  files.makedirs(workdir)
  kept, _ = run_lib.keep_tokenizer(workdir, tok_path, lower)
  root = files.absolute(workdir)
  sep = "/" if files.is_remote(workdir) else os.sep
  kept = files.absolute(kept)
  kept = kept[len(root) + 1:] if kept.startswith(root + sep) else kept
  meta = {"task": task.name, "kind": task.kind, "labels": list(task.labels), "tokenizer": kept,
          "do_lower_case": lower, "model": mcfg.to_dict(), "max_seq_length": config.data.max_seq_length,
          "predict_settings": tasks_lib.kind(task).predict_settings(config), "task_options": dict(task.options)}
  run_lib.write_config(workdir, config, finetune=meta)


def _train(run: run_lib.Run, task, mcfg, data: TrainData, report: dict, eval_batch: int) -> dict:
  """The epochs: a progress line every `log_every` steps, evaluation, the best parameters and a checkpoint at the
  end of each epoch (and every `checkpoint_every` steps within), the report at the end."""
  config, t, start, total = run.config, run.trainer, run.start, data.plan.total_steps
  steps_per_epoch = data.plan.steps_per_epoch
  writer = run.open_writer()
  evaluator = Evaluator(run, task, data, report, eval_batch)
  t0 = time.time()

  def batches():
    for epoch in range(1, config.train.num_epochs + 1):
      done = max(0, start - (epoch - 1) * steps_per_epoch)  # steps of this epoch run before the resume
      for idx in data.plan.batches(epoch)[done:]:
        yield jax.device_put(make_batch(data.train, idx, data.rows_per_step, data.bucket), t.batch_sharding)

  def log(step, host):
    m = {k: float(v) for k, v in host[-1].items()}
    writer.write(step, m)
    eta = (time.time() - t0) / (step - start) * (total - step)
    run.say(f"epoch {evaluator.epoch(step)} step {step}/{total} | loss {m['loss']:.4f} | lr "
            f"{m['learning_rate']:.2e} | ETA {writers.format_duration(eta)}")

  def end_of_epoch(step):
    return step % steps_per_epoch == 0 or step == total

  # Evaluation and a checkpoint close every epoch (a resume starts the next one); checkpoint_every adds some within.
  hooks = trainer.Hooks(
      log=log, save=lambda step, state: run.checkpoint(step, state, {"report": report, "total_steps": total}),
      log_due=lambda step: trainer.every(step, config.log_every, total),
      save_due=lambda step: end_of_epoch(step) or trainer.every(step, config.checkpoint_every),
      evaluate=evaluator, eval_due=end_of_epoch)
  state, step, stopped = run.loop(batches(), [run_lib.Stage(t, total)], hooks,
                                  step_args=(np.uint32(config.seed), np.float32(config.train.learning_rate)))
  result = {"report": report, "state": state, "task": task, "preempted": stopped is not None, "step": step,
            "plan": data.plan, "model_config": mcfg, "train_features": data.train, "goodput": run.close(stopped)}
  run.say(goodput.line(result["goodput"]))
  if stopped is not None:
    run.say(f"{stopped}: saved a checkpoint at step {step}/{total}; run the same command to continue")
    return result
  if not data.evals:
    checkpoint_lib.save_best(run.workdir, state.params)
  if run.is_main:
    _write_report(run.workdir, report)
  return result


class Evaluator:
  """The end-of-epoch evaluation: every eval split scored with the task's metrics, the row added to the report,
  and the best parameters (and the kind's prediction files) kept when the main metric improves."""

  def __init__(self, run: run_lib.Run, task, data: TrainData, report: dict, eval_batch: int):
    self.run, self.task, self.data, self.report, self.eval_batch = run, task, data, report, eval_batch
    self.kind = tasks_lib.kind(task)

  def epoch(self, step: int) -> int:
    return -(-step // self.data.plan.steps_per_epoch)

  def predictions(self, ev: EvalSet, params) -> dict:
    t, config = self.run.trainer, self.run.config
    if self.data.packed:  # packed like the training rows: one program for every batch, next to no padding
      return predict_packed(t.eval_step, params, ev.feats, self.eval_batch, t.batch_sharding,
                            config.data.pack_max_per_row, self.kind.pack, "token_keys" in self.kind.pack_keys)
    return predict_all(t.eval_step, params, ev.feats, self.eval_batch, t.batch_sharding, self.data.bucket,
                       self.kind.token_outputs)

  def __call__(self, step: int, state) -> None:
    evals, run, task = self.data.evals, self.run, self.task
    row = {"epoch": self.epoch(step), "step": step}
    for ev in evals:
      row[ev.name] = self.kind.score(task, ev, self.predictions(ev, state.params), run.config)
      run.writer.write(step, row[ev.name], f"eval_{ev.name}")
    self.report["epochs"].append(row)
    if not evals:
      return
    run.say(f"epoch {row['epoch']}: " + "; ".join(
        f"{ev.name} " + ", ".join(f"{k} {v:.4f}" for k, v in row[ev.name].items()) for ev in evals))
    main = row[evals[0].name][task.main_metric]
    if self.report["best"] is None or main > self.report["best"]["value"]:
      self.report["best"] = {"epoch": row["epoch"], "value": main,
                             "metrics": {ev.name: row[ev.name] for ev in evals}}
      checkpoint_lib.save_best(run.workdir, state.params)
      if run.is_main:
        for ev in evals:
          for name, content in self.kind.prediction_files(task, ev).items():
            files.write_whole(files.join(run.workdir, name), json.dumps(content, indent=1, ensure_ascii=False))


def report_of(config, workdir: str) -> dict:
  """The report of the fine-tuning run in `workdir`: read back when the run has finished (its report.json), else
  the run made (a stopped one resumes) and its report."""
  path = files.join(workdir, "report.json")
  if not files.exists(path):
    finetune(config, workdir)
  return files.read_json(path)


def _write_report(workdir: str, report: dict) -> None:
  files.write_whole(files.join(workdir, "report.json"), json.dumps(report, indent=2))
  lines = [f"task {report['task']} (main metric: {report['main_metric']})", ""]
  for row in report["epochs"]:
    for split, ms in row.items():
      if isinstance(ms, dict):
        lines.append(f"epoch {row['epoch']:>2}  {split:24s} " + "  ".join(f"{k} {v:8.4f}" for k, v in ms.items()))
  if report["best"]:
    lines += ["", f"best: epoch {report['best']['epoch']}, {report['main_metric']} {report['best']['value']:.4f}"]
  files.write_whole(files.join(workdir, "report.txt"), "\n".join(lines) + "\n")
  print("\n".join(lines), flush=True)
