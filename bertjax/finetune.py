"""Fine-tuning on GLUE, SQuAD, NER or users' own files with the paper's recipe: a task-agnostic loop over the
trainer core (`bertjax.trainer`), the task kind's plug-in (`bertjax.tasks`) and one weight loader
(`bertjax.weights`).

  python -m bertjax.main --config=configs/finetune.py:task=glue/mrpc,init=DIR_OR_HF_DIR --workdir=W

`init` is a bertjax pre-training workdir, a fine-tuned workdir (its encoder) or an HF safetensors folder (with
its vocab.txt); the whole model is trained end to end. After each epoch every eval split is scored with the
task's exact metrics; the best parameters by the main metric are kept in W/best; W/report.json and W/report.txt
hold the results. Evaluation sees every example once: the last batch is padded with zero-weight rows.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import ml_collections
import numpy as np
import optax

from bertjax import checkpoint as checkpoint_lib
from bertjax import errors, optim, trainer, weights
from bertjax import metrics as metrics_lib
from bertjax import model as model_lib
from bertjax import sharding as sharding_lib
from bertjax import tasks as tasks_lib
from bertjax.convert import sentence_transformers as st_lib
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.batching import Plan, bucket_multiple, make_batch, predict_all, predict_packed
from bertjax.model.embedding import Pooling
from bertjax.tasks import EvalSet

HF_HEADS = {k: v.hf_head for k, v in tasks_lib.KINDS.items()}
# Model fields a fine-tuning config sets over the init's architecture.
# A fine-tuning config's model fields that describe the architecture: they apply only without an init; the rest
# (dropout, dtype, kernels, the head's initializer) apply over the init's own architecture.
# Dropout rates a fine-tuning config leaves negative are the init's own, as HF's from_pretrained keeps the
# checkpoint's config (0.1 for BERT, RoBERTa and ELECTRA; 0.0 for ModernBERT); BertConfig's without an init.
INIT_RATES = ("dropout_rate", "attention_dropout_rate", "classifier_dropout")
ARCHITECTURE_FIELDS = ("variant", "num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size",
                       "max_position_embeddings")


# ----------------------------------------------------------------------------- init: tokenizer, config, encoder
def load_init(config, task: tasks_lib.Task | None = None):
  """(tokenizer, BertConfig, initial params or None, tokenizer path, lower-casing) from config.init: a bertjax
  pre-training workdir, a fine-tuned workdir, an HF folder, or "" (random init). The params are a partial tree:
  `bert` (the encoder; its pooler may be missing) and, where an HF folder already holds a head of this task's
  kind with the same number of labels (HF's `from_pretrained` keeps it too), that head."""
  tok_path, lower = config.data.tokenizer, config.data.do_lower_case
  if config.init:
    kind = tasks_lib.kind(task) if task is not None else None
    run_fields = {k: v for k, v in config.model.items() if k not in ARCHITECTURE_FIELDS and not _init_rate(k, v)}
    if st_lib.is_folder(config.init):  # a sentence-transformers folder: its encoder and dense layer
      mcfg, params, _, folder = st_lib.read(config.init, **run_fields)
      if not tok_path:
        tok_path, lower = weights.hf_tokenizer(folder)
    else:
      w = weights.load(config.init, overrides=run_fields,
                       head=kind.hf_head if kind else "encoder", num_labels=task.num_labels if task else 0)
      mcfg, params = w.cfg, w.params
      if not tok_path:
        tok_path, lower = w.tokenizer, w.do_lower_case
  else:
    mcfg, params = model_config(config), None
  if not tok_path:
    raise tasks_lib.TaskDataError("no tokenizer: set config.data.tokenizer (vocab.txt or .model) or an init with one")
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  if tok.vocab_size != mcfg.vocab_size:
    raise tasks_lib.TaskDataError(f"tokenizer {tok_path} has {tok.vocab_size} pieces, the model {mcfg.vocab_size}"
                                  + ("" if config.init else f": pass vocab={tok.vocab_size} in --config=...:ARGS"))
  return tok, mcfg, params, tok_path, lower


def _init_rate(field: str, value) -> bool:
  """Whether a fine-tuning config's model field defers to the init's (a dropout rate left negative)."""
  return field in INIT_RATES and value < 0


def task_options(config) -> tuple:
  """The options of an embedding task (`task=pairs`) from the config's `embedding` section; an init that is a
  sentence-transformers folder gives its pooling, dense layer and normalisation unless `embedding.pooling` is set."""
  if config.task != "pairs":
    return ()
  e = config.embedding
  if config.init and st_lib.is_folder(config.init) and not e.pooling:
    pooling = st_lib.read_pooling(config.init)
  else:
    pooling = Pooling(mode=e.pooling or "mean", normalize=bool(e.normalize))
  try:
    dims = tuple(int(x) for x in str(e.matryoshka_dims).replace(" ", "").split(",") if x)
  except ValueError:
    raise errors.ConfigError(f"embedding.matryoshka_dims {e.matryoshka_dims!r}: give widths like 768,512,256") from None
  if any(d < 1 for d in dims) or e.cache_chunk < 0:
    raise errors.ConfigError(f"embedding.matryoshka_dims {e.matryoshka_dims!r} and cache_chunk {e.cache_chunk} must "
                             "be positive (cache_chunk 0: off)")
  return tuple(dataclasses.asdict(pooling).items()) + (
      ("scale", float(e.scale)), ("symmetric", bool(e.symmetric)), ("matryoshka", dims),
      ("cache_chunk", int(e.cache_chunk)))


def model_config(config, **overrides) -> model_lib.BertConfig:
  """The model a fine-tuning config describes without an init: its rates left to the init take BertConfig's
  defaults."""
  fields = {k: v for k, v in config.model.items() if not (_init_rate(k, v) and k != "classifier_dropout")}
  return model_lib.BertConfig.from_dict({**fields, **overrides})


def head_module(task: tasks_lib.Task, mcfg):
  return tasks_lib.kind(task).head(task, mcfg)


def pack_train(train: dict, task: tasks_lib.Task, config, dp: int) -> tuple[dict, int, str]:
  """Packs the training features (`data.packing`) and picks the rows per step that carry, on average, the
  recipe's `global_batch_size` examples (a multiple of the data-parallel size). Evaluation packs its examples
  alike (`batching.predict_packed`)."""
  kind = tasks_lib.kind(task)
  if not kind.can_pack(task):
    raise tasks_lib.TaskDataError(
        "data.packing is for classification, regression, tagging and embedding pairs without "
        "embedding.cache_chunk; SQuAD windows are already full (doc_stride), so there is nothing to pack")
  seq, gbs = config.data.max_seq_length, config.train.global_batch_size
  # A step holds a multiple of `dp` rows: more than global_batch_size / dp examples per row would make the
  # step's batch larger than the recipe's, so the row's capacity is capped there.
  k = min(config.data.pack_max_per_row, max(1, gbs // dp))
  packed, rows = kind.pack(train, seq, k)
  if "example_keys" in kind.pack_keys:
    del packed["example_slot_weights"]  # a per-token loss: label_weights already mark the real tokens
  n, r = len(train["input_ids"]), len(rows)
  per_row = n / r
  rows_per_step = max(dp, int(round(gbs / per_row / dp)) * dp)
  lengths = kind.text_lengths(train)
  row_length = packed["input_ids"].shape[1]
  note = (f"packing: {n} examples in {r} rows of {row_length} (at most {k}, on average {per_row:.2f} per row, "
          f"{float(np.sum(lengths)) / (r * row_length):.1%} of tokens real; "
          f"unpacked {float(np.sum(lengths)) / (len(lengths) * seq):.1%}); {rows_per_step} rows per step "
          f"= {rows_per_step * per_row:.1f} examples on average (global_batch_size {gbs})")
  return packed, rows_per_step, note


def use_packing(config, task: tasks_lib.Task, train: dict) -> bool:
  """Whether the training rows are packed: `data.packing`, or `data.auto_packing` when the task kind packs and
  its texts average at most half of `max_seq_length` (two or more to a row: most of an unpacked batch would
  be padding, and one row shape is one compiled program where length buckets make several)."""
  if config.data.packing:
    return True
  kind = tasks_lib.kind(task)
  if not config.data.auto_packing or not kind.can_pack(task):
    return False
  lengths = kind.text_lengths(train)
  return len(lengths) > 0 and float(np.mean(lengths)) <= config.data.max_seq_length / 2


# ----------------------------------------------------------------------------- steps
def task_loss(task: tasks_lib.Task, out, batch):
  return tasks_lib.kind(task).loss(task, out, batch)


def unit_optimizer(train_config):
  """(optimizer, schedule) of `train_config` with a peak learning rate of 1, for `make_steps`."""
  unit = ml_collections.ConfigDict(train_config.to_dict())
  unit.learning_rate = 1.0
  return optim.make(unit)


def make_steps(module, task, tx, lr_fn, prng_impl="threefry2x32"):
  """(train_step(state, batch, seed, learning_rate), predict_step(params, batch)); build them with
  `trainer.build(..., train_scalars=2)`. `tx` and `lr_fn` are the recipe's with a peak learning rate of 1
  (`unit_optimizer`); the step scales the update by the peak it is given. The seed and the peak are arguments,
  not constants of the program, so that a sweep over seeds and learning rates compiles (or loads from the
  persistent cache) each program once."""
  kind = tasks_lib.kind(task)

  def train_step(state, batch, seed, learning_rate):
    key = jax.random.fold_in(jax.random.key(seed, impl=prng_impl), 2)

    loss, grads = kind.value_and_grad(task, module, state.params, batch,
                                      {"dropout": jax.random.fold_in(key, state.step)})
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    # AdamW's update (weight decay included) is linear in the learning rate: lr·unit(t)·(m̂/(√v̂+ε) + wd·θ).
    updates = jax.tree_util.tree_map(lambda u: u * learning_rate.astype(u.dtype), updates)
    new = trainer.TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                               opt_state=opt_state)
    return new, {"loss": loss, "grad_norm": optax.global_norm(grads),
                 "learning_rate": learning_rate * lr_fn(state.step)}

  def predict_step(params, batch):
    out = module.apply({"params": params}, batch, deterministic=True)
    return {k: out[k] for k in kind.outputs}

  return train_step, predict_step


def read_train_metrics(workdir: str) -> list[dict]:
  """The training rows of WORKDIR/metrics.jsonl (one per logged step)."""
  return [r for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r.get("split") == "train"]


def score(task: tasks_lib.Task, ev: EvalSet, preds: dict, config) -> dict:
  return tasks_lib.kind(task).score(task, ev, preds, config)


def _check(config) -> None:
  problems = trainer.run_errors(config)
  if not isinstance(config.seed, int) or isinstance(config.seed, bool) or not 0 <= config.seed < 2 ** 32:
    problems.append(f"seed must be an integer in [0, 2**32), got {config.seed!r}")
  if config.data.length_buckets < 0:
    problems.append(f"data.length_buckets must be >= 0, got {config.data.length_buckets}")
  if problems:
    raise errors.ConfigError("invalid config: " + "; ".join(problems))


# ----------------------------------------------------------------------------- the loop
def finetune(config, workdir: str) -> dict:
  """Fine-tune per `config` in `workdir`, resuming from its checkpoint if a run was stopped there. The workdir
  is locked for the run."""
  with checkpoint_lib.WorkdirLock(workdir):
    return _finetune(config, workdir)


def _finetune(config, workdir: str) -> dict:
  jax.config.update("jax_threefry_partitionable", True)
  is_main = jax.process_index() == 0
  _check(config)
  trainer.check_workdir_mode(workdir, "finetune")
  task = tasks_lib.get(config.task, tuple(config.data.labels), config.data.regression, task_options(config))
  kind = tasks_lib.kind(task)
  tok, mcfg, init_params, tok_path, lower = load_init(config, task)
  if config.data.max_seq_length > mcfg.max_position_embeddings:
    raise tasks_lib.TaskDataError(f"data.max_seq_length {config.data.max_seq_length} exceeds the model's "
                                  f"max_position_embeddings {mcfg.max_position_embeddings}")
  train, evals, stats = kind.load(task, config, tok)
  n_train = len(train["input_ids"])
  gbs = config.train.global_batch_size

  mesh, _, _ = trainer.mesh_and_shardings(config)
  dp = sharding_lib.data_parallel_size(mesh)
  if gbs % dp:
    raise tasks_lib.TaskDataError(f"global_batch_size {gbs} is not divisible by the data-parallel size {dp}")
  rows_per_step, pack_note = gbs, ""
  packed = use_packing(config, task, train)
  if packed:
    train, rows_per_step, pack_note = pack_train(train, task, config, dp)
    if not config.data.packing:
      pack_note += " (short examples; --config.data.auto_packing=False keeps them one per row)"
  n_rows = len(train["input_ids"])
  if n_rows == 0:
    raise tasks_lib.TaskDataError("no training examples")
  bucket = bucket_multiple(config.data.max_seq_length, config.data.length_buckets)
  grouping = config.data.group_by_length and bucket and not packed
  plan = Plan(n_rows, rows_per_step, config.train.num_epochs, config.seed, config.train.warmup_fraction,
              np.sum(train["input_mask"], axis=1) if grouping else None, bucket if grouping else 0)
  steps_per_epoch, total = plan.steps_per_epoch, plan.total_steps
  tcfg = ml_collections.ConfigDict(config.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = total, plan.warmup_steps
  tx, lr_fn = unit_optimizer(tcfg)

  module = kind.head(task, mcfg.for_platform(mesh.devices.flat[0].platform))
  dummy = make_batch(train, np.arange(min(rows_per_step, n_rows)), rows_per_step)
  t = trainer.build(config, module, tx, lr_fn, dummy,
                    *make_steps(module, task, tx, lr_fn, config.train.prng_impl), mesh=mesh, train_scalars=2)
  if init_params is not None and "pooler" in init_params.get("bert", {}) and "pooler" not in t.abstract.params["bert"]:
    # The init's pooler is read by no head of this model (an embedding model; a family head without one).
    init_params = {**init_params, "bert": {k: v for k, v in init_params["bert"].items() if k != "pooler"}}
  seed, peak_lr = np.uint32(config.seed), np.float32(config.train.learning_rate)
  eval_batch = config.train.eval_batch_size or gbs
  if eval_batch % dp:
    raise tasks_lib.TaskDataError(f"train.eval_batch_size {eval_batch} is not divisible by the data-parallel "
                                  f"size {dp}")
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.keep_checkpoints)
  report = {"task": task.name, "main_metric": task.main_metric, "epochs": [], "best": None}
  state, saved, start = trainer.resume_or_init(t, ckpt, config.seed, init_params)
  if saved is not None:  # a stopped run: continue it exactly (same order, same dropout)
    if saved.get("total_steps") != total:
      raise tasks_lib.TaskDataError(f"{workdir} holds a fine-tuning run of {saved.get('total_steps')} steps; this "
                                    f"config makes {total}: use a new --workdir")
    report = saved["report"]
    if is_main:
      print(f"resuming the fine-tuning run in {workdir} at step {start}/{total}", flush=True)

  os.makedirs(workdir, exist_ok=True)
  kept, _ = trainer.keep_tokenizer(workdir, tok_path, lower)
  kept = os.path.relpath(kept, workdir) if os.path.abspath(kept).startswith(os.path.abspath(workdir) + os.sep) \
      else os.path.abspath(kept)
  meta = {"task": task.name, "kind": task.kind, "labels": list(task.labels), "tokenizer": kept,
          "do_lower_case": lower, "model": mcfg.to_dict(), "max_seq_length": config.data.max_seq_length,
          "predict_settings": kind.predict_settings(config), "task_options": dict(task.options)}
  os.makedirs(workdir, exist_ok=True)
  trainer.write_config(workdir, config, finetune=meta)
  if is_main:
    print(f"fine-tuning {task.name}: {n_train} training examples, {total} steps ({config.train.num_epochs} epochs of "
          f"{steps_per_epoch}), lr {config.train.learning_rate}, batch {gbs}, warmup {tcfg.warmup_steps}"
          + "".join(f"; {k}: {v}" for k, v in stats.items() if v), flush=True)
    if pack_note:
      print(pack_note, flush=True)
  writer = metrics_lib.Writer(workdir, start_step=start)
  t0 = time.time()

  def batches():
    for epoch in range(1, config.train.num_epochs + 1):
      done = max(0, start - (epoch - 1) * steps_per_epoch)  # steps of this epoch run before the resume
      for idx in plan.batches(epoch)[done:]:
        yield jax.device_put(make_batch(train, idx, rows_per_step, bucket), t.batch_sharding)

  def log(step, host):
    m = {k: float(v) for k, v in host[-1].items()}
    writer.write(step, m)
    if is_main:
      eta = (time.time() - t0) / (step - start) * (total - step)
      print(f"epoch {_epoch(step)} step {step}/{total} | loss {m['loss']:.4f} | lr {m['learning_rate']:.2e} | "
            f"ETA {metrics_lib.format_duration(eta)}", flush=True)

  def _epoch(step):
    return -(-step // steps_per_epoch)

  def end_of_epoch(step):
    return step % steps_per_epoch == 0 or step == total

  def evaluate(step, state):
    epoch = _epoch(step)
    row = {"epoch": epoch, "step": step}
    for ev in evals:
      if packed:  # packed like the training rows: one program for every batch, next to no padding
        preds = predict_packed(t.eval_step, state.params, ev.feats, eval_batch, t.batch_sharding,
                               config.data.pack_max_per_row, kind.pack, "token_keys" in kind.pack_keys)
      else:
        preds = predict_all(t.eval_step, state.params, ev.feats, eval_batch, t.batch_sharding, bucket,
                            kind.token_outputs)
      row[ev.name] = kind.score(task, ev, preds, config)
      writer.write(step, row[ev.name], f"eval_{ev.name}")
    report["epochs"].append(row)
    if evals:
      main = row[evals[0].name][task.main_metric]
      if is_main:
        print(f"epoch {epoch}: " + "; ".join(
            f"{ev.name} " + ", ".join(f"{k} {v:.4f}" for k, v in row[ev.name].items()) for ev in evals), flush=True)
      if report["best"] is None or main > report["best"]["value"]:
        report["best"] = {"epoch": epoch, "value": main, "metrics": {ev.name: row[ev.name] for ev in evals}}
        weights.save_best(workdir, state.params)
        if is_main:
          for ev in evals:
            for name, content in kind.prediction_files(task, ev).items():
              _write_json(os.path.join(workdir, name), content)

  # Evaluation and a checkpoint close every epoch (a resume starts the next one); checkpoint_every adds some within.
  hooks = trainer.Hooks(
      log=log, save=lambda step, state: ckpt.save(step, state, {"report": report, "total_steps": total}),
      log_due=lambda step: trainer.every(step, config.log_every, total),
      save_due=lambda step: end_of_epoch(step) or trainer.every(step, config.checkpoint_every),
      evaluate=evaluate, eval_due=end_of_epoch)
  state, step, stopped = trainer.loop(t, state, batches(), start, total, hooks, config.train.stop_after_steps,
                                      step_args=(seed, peak_lr))
  ckpt.close()
  writer.close()
  result = {"report": report, "state": state, "task": task, "preempted": stopped is not None, "step": step,
            "plan": plan, "model_config": mcfg, "train_features": train}
  if stopped is not None:
    if is_main:
      print(f"{stopped}: saved a checkpoint at step {step}/{total}; run the same command to continue", flush=True)
    return result
  if not evals:
    weights.save_best(workdir, state.params)
  if is_main:
    _write_report(workdir, report)
  return result


def report_of(config, workdir: str) -> dict:
  """The report of the fine-tuning run in `workdir`: read back when the run has finished (its report.json), else
  the run made (a stopped one resumes) and its report."""
  path = os.path.join(workdir, "report.json")
  if not os.path.exists(path):
    finetune(config, workdir)
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _write_json(path: str, content) -> None:
  errors.write_whole(path, json.dumps(content, indent=1, ensure_ascii=False))


def _write_report(workdir: str, report: dict) -> None:
  errors.write_whole(os.path.join(workdir, "report.json"), json.dumps(report, indent=2))
  lines = [f"task {report['task']} (main metric: {report['main_metric']})", ""]
  for row in report["epochs"]:
    for split, ms in row.items():
      if isinstance(ms, dict):
        lines.append(f"epoch {row['epoch']:>2}  {split:24s} " + "  ".join(f"{k} {v:8.4f}" for k, v in ms.items()))
  if report["best"]:
    lines += ["", f"best: epoch {report['best']['epoch']}, {report['main_metric']} {report['best']['value']:.4f}"]
  errors.write_whole(os.path.join(workdir, "report.txt"), "\n".join(lines) + "\n")
  print("\n".join(lines), flush=True)
