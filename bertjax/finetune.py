"""Fine-tuning on GLUE, SQuAD, NER or users' own files, with the paper's recipe, reusing the pre-training pieces.

  python -m bertjax.main --config=configs/finetune.py:task=glue/mrpc,init=DIR_OR_HF_DIR --workdir=W

`init` is a bertjax pre-training workdir or an HF safetensors folder (with its vocab.txt); the task head is
fresh; the whole model is trained end to end. After each epoch every eval split is scored with the task's
exact metrics; the best parameters by the main metric are kept in W/best; W/report.json and W/report.txt hold
the results. Evaluation sees every example once: the last batch is padded with zero-weight rows.
"""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from bertjax import checkpoint as checkpoint_lib, convert, losses, metrics as metrics_lib, model as model_lib
from bertjax import optim, scores
from bertjax import sharding as sharding_lib
from bertjax import state as state_lib
from bertjax.data import conll, dataset, packing, squad, tasks, tokenizer as tokenizer_lib


# ----------------------------------------------------------------------------- init: tokenizer, config, encoder
HF_HEADS = {"classification": "sequence_classification", "regression": "sequence_classification",
            "tagging": "token_classification", "qa": "question_answering"}


def load_init(config, task: tasks.Task | None = None):
  """(tokenizer, BertConfig, initial params or None, tokenizer path, lower-casing) from config.init: a bertjax
  pre-training workdir, a fine-tuned workdir, an HF folder, or "" (random init). The params are a partial tree:
  `bert` (the encoder; its pooler may be missing) and, where an HF folder already holds a head of this task's
  kind with the same number of labels (HF's `from_pretrained` keeps it too), that head."""
  init = config.init
  model_over = {k: config.model[k] for k in ("dropout_rate", "attention_dropout_rate", "dtype", "scan_layers",
                                              "scan_unroll", "remat", "attention_impl", "embedding_lookup",
                                              "dropout_impl")}
  tok_path, lower = config.data.tokenizer, config.data.do_lower_case
  if init and os.path.exists(os.path.join(init, "finetune.json")):  # a fine-tuned encoder (e.g. MNLI before RTE)
    meta, _, _, head_params, _ = load_finetuned(init)
    mcfg = model_lib.BertConfig.from_dict({**meta["model"], **model_over})
    params = {"bert": head_params["bert"]}
    if not tok_path:
      tok_path, lower = meta["tokenizer"], meta["do_lower_case"]
  elif init and os.path.isdir(os.path.join(init, "checkpoints")):
    with open(os.path.join(init, "config.json"), encoding="utf-8") as f:
      pre = ml_collections.ConfigDict(json.load(f))
    mcfg = model_lib.BertConfig.from_dict({**pre.model.to_dict(), **model_over})
    params = {"bert": checkpoint_lib.Checkpointer(init).restore_params()["bert"]}
    if not tok_path:
      creation = dataset.read_creation(pre.data.data_dir)
      tok_path, lower = creation["tokenizer"], creation.get("do_lower_case", True)
  elif init:
    hf_cfg, state = convert.read_hf_dir(init)
    mcfg = convert.hf_config_to_bert(hf_cfg, **model_over)
    flat = mcfg.replace(scan_layers=False)
    head = convert.head_of_architecture(hf_cfg)
    params = None
    if task is not None and head == HF_HEADS[task.kind]:
      _, full = convert.from_state_dict(flat, state, head=head)
      head_name = convert.TASK_HEADS[head][2]
      if head == "question_answering" or full[head_name]["kernel"].shape[-1] == task.num_labels:
        params = full
    if params is None:
      params = {"bert": convert.from_state_dict(flat, state, head="encoder")[1]}
    if not tok_path:
      tok_path = os.path.join(init, "vocab.txt")
      tc = os.path.join(init, "tokenizer_config.json")
      if os.path.isfile(tc):
        with open(tc, encoding="utf-8") as f:
          lower = json.load(f).get("do_lower_case", lower)
  else:
    mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
    params = None
  if not tok_path:
    raise tasks.TaskDataError("no tokenizer: set config.data.tokenizer (vocab.txt or .model) or an init with one")
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  if tok.vocab_size != mcfg.vocab_size:
    raise tasks.TaskDataError(f"tokenizer {tok_path} has {tok.vocab_size} pieces, the model {mcfg.vocab_size}")
  if params is not None:
    encoder = params["bert"]["encoder"]
    if mcfg.scan_layers and "layers" not in encoder:
      params["bert"] = convert.stack_layers(params["bert"], mcfg.num_layers)
    elif not mcfg.scan_layers and "layers" in encoder:
      params["bert"] = convert.unstack_layers(params["bert"], mcfg.num_layers)
  return tok, mcfg, params, tok_path, lower


def merge_init(fresh: dict, init: dict) -> dict:
  """The freshly initialised params with the init's subtrees in place (a fresh pooler where the init has none)."""
  out = dict(fresh)
  for k, v in init.items():
    out[k] = {**fresh[k], **v} if k == "bert" else v
  return out


def head_module(task: tasks.Task, mcfg):
  if task.kind in ("classification", "regression"):
    return model_lib.BertForSequenceClassification(mcfg, task.num_labels)
  if task.kind == "tagging":
    return model_lib.BertForTokenClassification(mcfg, task.num_labels)
  return model_lib.BertForQuestionAnswering(mcfg)


# ----------------------------------------------------------------------------- data
class EvalSet:
  """Features of one eval split and what scoring needs (examples, windows, word positions)."""

  def __init__(self, name, feats, meta=None):
    self.name, self.feats, self.meta = name, feats, meta or {}


def load_data(config, task, tok):
  d, seq = config.data, config.data.max_seq_length
  stats: dict = {}
  if task.kind in ("classification", "regression"):
    reg = task.kind == "regression"
    if task.name.startswith("glue/"):
      tfds_dir = d.tfds_data_dir or None
      train = tasks.encode_pairs(tasks.glue_examples(task, task.train_split, tfds_dir), tok, seq, reg)
      evals = [EvalSet(s, tasks.encode_pairs(tasks.glue_examples(task, s, tfds_dir), tok, seq, reg))
               for s in task.eval_splits]
    else:
      read = lambda p: tasks.local_examples(p, task, d.text_a_column, d.text_b_column, d.label_column)  # noqa: E731
      train = tasks.encode_pairs(read(d.train_file), tok, seq, reg)
      evals = [EvalSet("validation", tasks.encode_pairs(read(d.eval_file), tok, seq, reg))] if d.eval_file else []
    return train, evals, stats
  if task.kind == "tagging":
    train_s = conll.read(d.train_file)
    train, _ = conll.featurize(train_s, tok, task.labels, seq, stats)
    evals = []
    if d.eval_file:
      ev = conll.read(d.eval_file)
      feats, word_at = conll.featurize(ev, tok, task.labels, seq, stats)
      evals.append(EvalSet("validation", feats, {"sentences": ev, "word_at": word_at}))
    return train, evals, stats
  # QA
  if task.name == "squad_json":
    train_ex = squad.json_examples(d.train_file)
    eval_ex = squad.json_examples(d.eval_file) if d.eval_file else []
  else:
    tfds_dir = d.tfds_data_dir or None
    train_ex = squad.tfds_examples(task.name, "train", tfds_dir)
    eval_ex = squad.tfds_examples(task.name, "validation", tfds_dir)
  kw = dict(max_seq_length=seq, doc_stride=d.doc_stride, max_query_length=d.max_query_length)
  train, _ = squad.featurize(train_ex, tok, training=True, stats=stats, **kw)
  evals = []
  if eval_ex:
    feats, windows = squad.featurize(eval_ex, tok, training=False, **kw)
    evals.append(EvalSet("validation", feats, {"examples": eval_ex, "windows": windows}))
  return train, evals, stats


def pack_train(train: dict, task: tasks.Task, config, dp: int) -> tuple[dict, int, str]:
  """Packs the training features (`data.packing`) and picks the rows per step that carry, on average, the
  recipe's `global_batch_size` examples (a multiple of the data-parallel size). Evaluation stays unpacked."""
  if task.kind == "qa":
    raise tasks.TaskDataError("data.packing is for classification, regression and tagging; SQuAD windows are "
                              "already full (doc_stride), so there is nothing to pack")
  keys = dict(token_keys=("labels", "label_weights"), example_keys=()) if task.kind == "tagging" else {}
  seq, gbs = config.data.max_seq_length, config.train.global_batch_size
  # A step holds a multiple of `dp` rows: more than global_batch_size / dp examples per row would make the
  # step's batch larger than the recipe's, so the row's capacity is capped there.
  k = min(config.data.pack_max_per_row, max(1, gbs // dp))
  packed, rows = packing.pack_features(train, seq, k, **keys)
  if task.kind == "tagging":
    del packed["example_slot_weights"]  # the loss is per token: label_weights already mark the real ones
  n, r = len(train["input_ids"]), len(rows)
  per_row = n / r
  rows_per_step = max(dp, int(round(gbs / per_row / dp)) * dp)
  real = float(np.sum(train["input_mask"])) / (r * seq)
  note = (f"packing: {n} examples in {r} rows of {seq} (at most {k}, on average {per_row:.2f} per row, "
          f"{real:.1%} of tokens real; "
          f"unpacked {float(np.sum(train['input_mask'])) / (n * seq):.1%}); {rows_per_step} rows per step "
          f"= {rows_per_step * per_row:.1f} examples on average (global_batch_size {gbs})")
  return packed, rows_per_step, note


# ----------------------------------------------------------------------------- steps
def task_loss(task: tasks.Task, out, batch):
  w = batch["example_weights"]
  if task.kind == "classification":
    return jnp.sum(losses.cross_entropy(out["logits"], batch["labels"]) * w) / jnp.maximum(jnp.sum(w), 1e-5)
  if task.kind == "regression":
    return jnp.sum((out["logits"][..., 0] - batch["labels"]) ** 2 * w) / jnp.maximum(jnp.sum(w), 1e-5)
  if task.kind == "tagging":
    lw = batch["label_weights"] * w[:, None]
    return jnp.sum(losses.cross_entropy(out["logits"], batch["labels"]) * lw) / jnp.maximum(jnp.sum(lw), 1e-5)
  ce = (losses.cross_entropy(out["start_logits"], batch["start_positions"]) +
        losses.cross_entropy(out["end_logits"], batch["end_positions"])) / 2
  return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1e-5)


def make_steps(module, task, tx, lr_fn, seed, prng_impl="threefry2x32"):
  key = jax.random.fold_in(jax.random.key(seed, impl=prng_impl), 2)

  def train_step(state, batch):
    def loss_fn(params):
      out = module.apply({"params": params}, batch, deterministic=False,
                         rngs={"dropout": jax.random.fold_in(key, state.step)})
      return task_loss(task, out, batch)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new = state_lib.TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                               opt_state=opt_state)
    return new, {"loss": loss, "grad_norm": optax.global_norm(grads), "learning_rate": lr_fn(state.step)}

  def predict_step(params, batch):
    out = module.apply({"params": params}, batch, deterministic=True)
    if task.kind == "qa":
      return {"start_logits": out["start_logits"], "end_logits": out["end_logits"]}
    return {"logits": out["logits"]}

  return train_step, predict_step


# Per-token features: cut to the batch's bucket length with the rows (the rest are per-row or per-slot).
TOKEN_KEYS = ("input_ids", "input_mask", "segment_ids", "labels", "label_weights", "position_ids",
              "attention_segment_ids")


def bucket_multiple(max_seq_length: int, buckets: int) -> int:
  """The padding multiple giving at most `buckets` lengths up to `max_seq_length`: a multiple of 8, at least 16
  (16 at 64 or 128, 48 at 384, 64 at 512); 0 (no bucketing) when `buckets` is 0."""
  if not buckets:
    return 0
  return max(16, -(-max_seq_length // (buckets * 8)) * 8)


def bucket_length(mask: np.ndarray, multiple: int, full: int) -> int:
  """The smallest multiple of `multiple` that holds the longest row of `mask` (at most `full`; `full` when
  `multiple` is 0). Each distinct length is one compiled program: at most full/multiple of them."""
  if not multiple:
    return full
  longest = int(np.max(np.sum(mask, axis=1))) if mask.size else 0
  return min(full, max(multiple, -(-longest // multiple) * multiple))


class Plan:
  """Which rows each step trains on: every epoch a permutation (seed, epoch), cut into batches of
  `rows_per_step`; the last batch of an epoch may be partial (filled with zero-weight rows), so every example is
  seen once per epoch. A resume at step k recomputes the same batches and skips the first k.

  With `lengths` and `bucket` (length grouping), the permuted rows are grouped by their bucket length (the
  smallest multiple of `bucket` holding the row) and each group is cut into batches, whose order is then
  shuffled: a batch holds `rows_per_step` random rows of one length bucket, so it is padded to that bucket
  rather than to its longest row's (each group's last batch may be partial)."""

  def __init__(self, n_rows: int, rows_per_step: int, num_epochs: int, seed: int, warmup_fraction: float,
               lengths: np.ndarray | None = None, bucket: int = 0):
    self.n_rows, self.rows_per_step, self.num_epochs, self.seed = n_rows, rows_per_step, num_epochs, seed
    self.row_bucket = None
    if lengths is not None and bucket:
      self.row_bucket = np.maximum(1, -(-np.asarray(lengths) // bucket))
      counts = np.bincount(self.row_bucket)
      self.steps_per_epoch = int(sum(-(-int(c) // rows_per_step) for c in counts if c))
    else:
      self.steps_per_epoch = -(-n_rows // rows_per_step)
    self.total_steps = self.steps_per_epoch * num_epochs
    self.warmup_steps = int(warmup_fraction * self.total_steps)

  def order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)

  def batches(self, epoch: int) -> list[np.ndarray]:
    order, r = self.order(epoch), self.rows_per_step
    if self.row_bucket is None:
      return [order[s:s + r] for s in range(0, self.n_rows, r)]
    grouped = order[np.argsort(self.row_bucket[order], kind="stable")]  # random order within each bucket
    edges = np.flatnonzero(np.diff(self.row_bucket[grouped])) + 1
    out = [g[s:s + r] for g in np.split(grouped, edges) for s in range(0, len(g), r)]
    shuffle = np.random.default_rng([self.seed, epoch, 1]).permutation(len(out))
    return [out[i] for i in shuffle]

  def epoch_batches(self) -> list[list[np.ndarray]]:
    return [self.batches(e) for e in range(1, self.num_epochs + 1)]


def make_batch(feats: dict, idx: np.ndarray, batch_size: int, bucket: int = 0) -> dict:
  """The rows `idx` of `feats` as one batch of `batch_size` rows (zero rows of weight 0 fill a partial batch),
  per-token features cut to the bucket length of its longest row."""
  b = {k: v[idx] for k, v in feats.items()}
  w = np.ones(len(idx), np.float32)
  if len(idx) < batch_size:
    extra = batch_size - len(idx)
    b = {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)]) for k, v in b.items()}
    w = np.concatenate([w, np.zeros(extra, np.float32)])
  full = b["input_ids"].shape[1]
  length = bucket_length(b["input_mask"], bucket, full)
  if length < full:
    b = {k: (v[:, :length] if k in TOKEN_KEYS and v.ndim >= 2 else v) for k, v in b.items()}
  # Packed rows carry one weight per example slot (0 for an empty slot): scaled by the row's weight.
  slots = b.pop("example_slot_weights", None)
  b["example_weights"] = w if slots is None else slots * w[:, None]
  return b


def batches(feats, batch_size):
  """The rows of `feats` in order, as full batches of `batch_size` (a last partial batch is left out)."""
  n = len(next(iter(feats.values())))
  for s in range(0, n - n % batch_size, batch_size):
    yield make_batch(feats, np.arange(s, s + batch_size), batch_size)


def _pad_tokens(x: np.ndarray, length: int, fill) -> np.ndarray:
  if x.ndim < 2 or x.shape[1] >= length:
    return x
  pad = np.full((x.shape[0], length - x.shape[1]) + x.shape[2:], fill, x.dtype)
  return np.concatenate([x, pad], axis=1)


def predict_all(predict_step, params, feats, batch_size, batch_sharding, bucket=0):
  """Outputs for every row of `feats` in order. Rows are batched by length (shortest first) so that each batch
  is padded only to its own bucket; per-token outputs come back at the features' full length."""
  n = len(feats["input_ids"])
  if n == 0:
    return {}
  full = feats["input_ids"].shape[1]
  order = np.argsort(np.sum(feats["input_mask"], axis=1), kind="stable") if bucket else np.arange(n)
  outs = []
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  for s in range(0, n, batch_size):
    b = make_batch(feats, order[s:s + batch_size], batch_size, bucket)
    out = predict_step(params, jax.device_put(b, batch_sharding))
    # Rows live on every process's devices: gather them everywhere (a plain copy in one process).
    out = jax.tree_util.tree_map(np.asarray, multihost_utils.process_allgather(out, tiled=True))
    outs.append({k: _pad_tokens(v, full, np.finfo(np.float32).min if k.endswith("_logits") else 0)
                 for k, v in out.items()})
  merged = {k: np.concatenate([o[k] for o in outs])[:n] for k in outs[0]}
  inverse = np.empty(n, np.int64)
  inverse[order] = np.arange(n)
  return {k: v[inverse] for k, v in merged.items()}


def read_train_metrics(workdir: str) -> list[dict]:
  """The training rows of WORKDIR/metrics.jsonl (one per logged step)."""
  return [r for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r.get("split") == "train"]


def score(task: tasks.Task, ev: EvalSet, preds: dict, config) -> dict:
  if task.kind == "classification":
    p, g = preds["logits"].argmax(-1), ev.feats["labels"]
    fns = {"accuracy": scores.accuracy, "f1": scores.f1_binary, "mcc": scores.matthews_corrcoef}
    return {m: fns[m](p, g) for m in task.metrics}
  if task.kind == "regression":
    p, g = preds["logits"][:, 0], ev.feats["labels"]
    return {"pearson": scores.pearson(p, g), "spearman": scores.spearman(p, g)}
  if task.kind == "tagging":
    pred_tags = conll.decode(preds["logits"].argmax(-1), ev.meta["word_at"], ev.meta["sentences"], task.labels)
    return scores.span_f1(pred_tags, [t for _, t in ev.meta["sentences"]])
  examples, windows = ev.meta["examples"], ev.meta["windows"]
  answers = squad.best_answers(examples, windows, preds["start_logits"], preds["end_logits"], config.data.n_best,
                               config.data.max_answer_length)
  golds = {ex.qid: [a for a, _ in ex.answers] if not ex.is_impossible else [] for ex in examples}
  if task.name == "squad/v2.0" or any(ex.is_impossible for ex in examples):
    return squad.v2_scores(answers, golds, scores.squad_exact, scores.squad_f1)
  return scores.squad_scores({q: t for q, (t, _, _) in answers.items()}, golds)


# ----------------------------------------------------------------------------- the loop
def finetune(config, workdir: str) -> dict:
  """Fine-tune per `config` in `workdir`, resuming from its checkpoint if a run was stopped there. The workdir
  is locked for the run."""
  with checkpoint_lib.WorkdirLock(workdir):
    return _finetune(config, workdir)


def _finetune(config, workdir: str) -> dict:
  from bertjax import train as train_lib  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_threefry_partitionable", True)
  is_main = jax.process_index() == 0
  if prng_problem := train_lib.prng_impl_error(config):
    raise train_lib.ConfigError(prng_problem)
  if config.train.get("schedule", "linear") not in optim.SCHEDULES:
    raise train_lib.ConfigError(f"train.schedule {config.train.schedule!r} is not one of {list(optim.SCHEDULES)}")
  if config.train.optimizer not in ("adamw", "lamb"):
    raise train_lib.ConfigError(f"train.optimizer {config.train.optimizer!r} is not one of ['adamw', 'lamb']")
  if config.data.get("length_buckets", 0) < 0:
    raise train_lib.ConfigError(f"data.length_buckets must be >= 0, got {config.data.length_buckets}")
  task = tasks.get(config.task, tuple(config.data.labels), config.data.regression)
  tok, mcfg, init_params, tok_path, lower = load_init(config, task)
  if config.data.max_seq_length > mcfg.max_position_embeddings:
    raise tasks.TaskDataError(f"data.max_seq_length {config.data.max_seq_length} exceeds the model's "
                              f"max_position_embeddings {mcfg.max_position_embeddings}")
  train, evals, stats = load_data(config, task, tok)
  n_train = len(train["input_ids"])
  gbs = config.train.global_batch_size

  mesh = sharding_lib.make_mesh(config)
  rules = sharding_lib.rules(config)
  batch_sharding = sharding_lib.batch_sharding(mesh)
  dp = sharding_lib.data_parallel_size(mesh)
  if gbs % dp:
    raise tasks.TaskDataError(f"global_batch_size {gbs} is not divisible by the data-parallel size {dp}")
  rows_per_step, pack_note = gbs, ""
  if config.data.packing:
    train, rows_per_step, pack_note = pack_train(train, task, config, dp)
  n_rows = len(train["input_ids"])
  if n_rows == 0:
    raise tasks.TaskDataError("no training examples")
  bucket = bucket_multiple(config.data.max_seq_length, config.data.get("length_buckets", 0))
  grouping = config.data.get("group_by_length", False) and bucket and not config.data.packing
  plan = Plan(n_rows, rows_per_step, config.train.num_epochs, config.seed, config.train.warmup_fraction,
              np.sum(train["input_mask"], axis=1) if grouping else None, bucket if grouping else 0)
  steps_per_epoch, total = plan.steps_per_epoch, plan.total_steps
  tcfg = ml_collections.ConfigDict(config.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = total, plan.warmup_steps
  tx, lr_fn = optim.make(tcfg)

  module = head_module(task, mcfg.for_platform(mesh.devices.flat[0].platform))
  dummy = make_batch(train, np.arange(min(rows_per_step, n_rows)), rows_per_step)
  abstract, shardings = state_lib.abstract_state(module, tx, dummy, mesh, rules)
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.keep_checkpoints)
  report = {"task": task.name, "main_metric": task.main_metric, "epochs": [], "best": None}
  start = 0
  if ckpt.latest_step() is not None:  # a stopped run: continue it exactly (same order, same dropout)
    state, saved, start = ckpt.restore(abstract)
    if saved.get("total_steps") != total:
      raise tasks.TaskDataError(f"{workdir} holds a fine-tuning run of {saved.get('total_steps')} steps; this config "
                                f"makes {total}: use a new --workdir")
    report = saved["report"]
    if is_main:
      print(f"resuming the fine-tuning run in {workdir} at step {start}/{total}", flush=True)
  else:
    state = state_lib.init_state(module, tx, dummy, mesh, rules, shardings, jax.random.key(config.seed))
    if init_params is not None:
      fresh = jax.device_get(state.params)
      params = merge_init(fresh, init_params)
      checkpoint_lib.check_params_fit(params, fresh)
      state = state_lib.with_params(state, params, tx, shardings, mesh, rules)
  train_step_fn, predict_fn = make_steps(module, task, tx, lr_fn, config.seed, config.train.prng_impl)
  train_step = jax.jit(train_step_fn, in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None),
                       donate_argnums=(0,))
  predict_step = jax.jit(predict_fn, in_shardings=(shardings.params, batch_sharding))
  eval_batch = config.train.get("eval_batch_size", 0) or gbs
  if eval_batch % dp:
    raise tasks.TaskDataError(f"train.eval_batch_size {eval_batch} is not divisible by the data-parallel size {dp}")

  os.makedirs(workdir, exist_ok=True)
  meta = {"task": task.name, "kind": task.kind, "labels": list(task.labels), "tokenizer": os.path.abspath(tok_path),
          "do_lower_case": lower, "model": mcfg.to_dict(), "max_seq_length": config.data.max_seq_length}
  if is_main:
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
      f.write(config.to_json(indent=2))
    with open(os.path.join(workdir, "finetune.json"), "w", encoding="utf-8") as f:
      json.dump(meta, f, indent=2)
    print(f"fine-tuning {task.name}: {n_train} training examples, {total} steps ({config.train.num_epochs} epochs of "
          f"{steps_per_epoch}), lr {config.train.learning_rate}, batch {gbs}, warmup {tcfg.warmup_steps}"
          + "".join(f"; {k}: {v}" for k, v in stats.items() if v), flush=True)
    if pack_note:
      print(pack_note, flush=True)
  writer = metrics_lib.Writer(workdir)
  best_dir = os.path.join(os.path.abspath(workdir), "best")
  step = start
  t0 = time.time()
  stopped = None

  def save(step):
    ckpt.save(step, state, {"report": report, "total_steps": total})

  with train_lib.StopFlag() as stop, sharding_lib.use_mesh(mesh, rules):
    for epoch in range(1, config.train.num_epochs + 1):
      if epoch * steps_per_epoch <= start and any(r["epoch"] == epoch for r in report["epochs"]):
        continue  # finished (and evaluated) before the resume
      done = max(0, start - (epoch - 1) * steps_per_epoch)  # steps of this epoch run before the resume
      for idx in plan.batches(epoch)[done:]:
        b = make_batch(train, idx, rows_per_step, bucket)
        state, m = train_step(state, jax.device_put(b, batch_sharding))
        step += 1
        if metrics_lib.every(step, config.log_every, total):
          m = {k: float(v) for k, v in jax.device_get(m).items()}
          if not np.isfinite(m["loss"]):
            raise train_lib.NonFiniteError(f"non-finite loss at step {step}; lower train.learning_rate")
          writer.write(step, m)
          if is_main:
            eta = (time.time() - t0) / (step - start) * (total - step)
            print(f"epoch {epoch} step {step}/{total} | loss {m['loss']:.4f} | lr {m['learning_rate']:.2e} | "
                  f"ETA {metrics_lib.format_duration(eta)}", flush=True)
        if config.train.stop_after_steps and step - start >= config.train.stop_after_steps and stop.signal is None:
          stop.signal = "stop_after_steps"
        stopping = stop.signal  # read once: a later signal is acted on at the next step, never half-way
        if stopping is not None and step < epoch * steps_per_epoch:
          save(step)
          stopped = stopping
          break
        if config.checkpoint_every and step % config.checkpoint_every == 0 and step < epoch * steps_per_epoch:
          save(step)
      if stopped is not None:
        break
      row = {"epoch": epoch, "step": step}
      for ev in evals:
        preds = predict_all(predict_step, state.params, ev.feats, eval_batch, batch_sharding, bucket)
        row[ev.name] = score(task, ev, preds, config)
        writer.write(step, row[ev.name], f"eval_{ev.name}")
      report["epochs"].append(row)
      if evals:
        main = row[evals[0].name][task.main_metric]
        if is_main:
          print(f"epoch {epoch}: " + "; ".join(f"{ev.name} " + ", ".join(f"{k} {v:.4f}" for k, v in row[ev.name].items())
                                            for ev in evals), flush=True)
        if report["best"] is None or main > report["best"]["value"]:
          report["best"] = {"epoch": epoch, "value": main, "metrics": {ev.name: row[ev.name] for ev in evals}}
          _save_params(best_dir, state.params)
      save(step)  # after the epoch's evaluation: a resume starts the next epoch
      if stop.signal is not None:
        stopped = stop.signal
        break
  ckpt.close()
  writer.close()
  if stopped is not None:
    if is_main:
      print(f"{stopped}: saved a checkpoint at step {step}/{total}; run the same command to continue", flush=True)
    return {"report": report, "state": state, "task": task, "preempted": True, "step": step, "plan": plan,
            "model_config": mcfg, "train_features": train}
  if not evals:
    _save_params(best_dir, state.params)
  if is_main:
    _write_report(workdir, report)
  return {"report": report, "state": state, "task": task, "preempted": False, "step": step, "plan": plan,
          "model_config": mcfg, "train_features": train}


def _save_params(path: str, params) -> None:
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(path, params, force=True)
  ckpt.wait_until_finished()


def _write_report(workdir: str, report: dict) -> None:
  with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  lines = [f"task {report['task']} (main metric: {report['main_metric']})", ""]
  for row in report["epochs"]:
    for split, ms in row.items():
      if isinstance(ms, dict):
        lines.append(f"epoch {row['epoch']:>2}  {split:24s} " + "  ".join(f"{k} {v:8.4f}" for k, v in ms.items()))
  if report["best"]:
    lines += ["", f"best: epoch {report['best']['epoch']}, {report['main_metric']} {report['best']['value']:.4f}"]
  with open(os.path.join(workdir, "report.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines), flush=True)


# ----------------------------------------------------------------------------- prediction from a fine-tuned workdir
def load_finetuned(workdir: str):
  with open(os.path.join(workdir, "finetune.json"), encoding="utf-8") as f:
    meta = json.load(f)
  mcfg = model_lib.BertConfig.from_dict(meta["model"])
  task = tasks.Task(meta["task"], meta["kind"], labels=tuple(meta["labels"]))
  tok = tokenizer_lib.load(meta["tokenizer"], do_lower_case=meta["do_lower_case"])
  params = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(workdir), "best"))
  params = jax.tree_util.tree_map(np.asarray, params)
  return meta, task, head_module(task, mcfg), params, tok


def predict_text(workdir: str, text: str = "", pair: str = "", question: str = "", context: str = ""):
  """A label (with probabilities), a value, per-word tags, or an answer span, by the task's kind."""
  meta, task, module, params, tok = load_finetuned(workdir)
  seq = meta["max_seq_length"]
  if task.kind in ("classification", "regression"):
    feats = tasks.encode_pairs([{"text_a": text, "text_b": pair, "label": 0}], tok, seq, task.kind == "regression")
    logits = np.asarray(module.apply({"params": params}, feats)["logits"][0])
    if task.kind == "regression":
      return {"value": float(logits[0])}
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    return {"label": task.labels[int(probs.argmax())], "probabilities": dict(zip(task.labels, probs.round(4).tolist()))}
  if task.kind == "tagging":
    words = text.split()
    sents = [(words, ["O"] * len(words))]
    feats, word_at = conll.featurize(sents, tok, task.labels or ("O",), seq)
    logits = np.asarray(module.apply({"params": params}, feats)["logits"])
    return {"tags": list(zip(words, conll.decode(logits.argmax(-1), word_at, sents, task.labels)[0]))}
  ex = [squad.QAExample("q", question, context, [])]
  feats, windows = squad.featurize(ex, tok, max_seq_length=seq, training=False)
  out = module.apply({"params": params}, feats)
  (text_out, s, null), = squad.best_answers(ex, windows, np.asarray(out["start_logits"]),
                                            np.asarray(out["end_logits"])).values()
  return {"answer": text_out, "score": s, "null_score": null}
