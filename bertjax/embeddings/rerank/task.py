"""Cross-encoder reranker training (`task=rerank`): (query, document, label) rows, the label a relevance in [0, 1]
(1 relevant, 0 not; soft labels such as a teacher's scores allowed), the pair read together by a sequence
classifier with one output. The loss is sentence-transformers' BinaryCrossEntropyLoss (BCE with logits, the mean
over the batch's pairs). Evaluated as reranking: each eval query's documents ranked by the model's score, nDCG@10,
MRR@10 and MAP against the labels (relevant: label >= 0.5), as its CrossEncoderRerankingEvaluator scores them;
exported as a sentence-transformers CrossEncoder folder (sigmoid activation).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax.data.tasks import rows as task_data
from bertjax.embeddings import retrieval
from bertjax.embeddings.rerank import encoder as rerank
from bertjax.tasks.base import EvalSet, Kind, Task, example_mean

NAMES = ("rerank",)
METRICS = ("ndcg@10", "mrr@10", "map")


LOSSES = ("bce", "listnet")


def task(name, labels, regression, config) -> Task | None:
  """`rerank`: (query, document, relevance) rows from the config's files (data.text_a_column, text_b_column,
  label_column); the loss from `config.rerank.loss`."""
  del labels, regression
  if name != "rerank":
    return None
  options = ()
  if config is not None:
    if config.rerank.loss not in LOSSES:
      raise errors.ConfigError(f"rerank.loss {config.rerank.loss!r} is not one of {list(LOSSES)}")
    pos_weight = float(config.rerank.get("pos_weight", 1.0))
    if not pos_weight > 0:
      raise errors.ConfigError(f"rerank.pos_weight {pos_weight!r} must be positive")
    if pos_weight != 1.0 and config.rerank.loss != "bce":
      raise errors.ConfigError(f"rerank.pos_weight {pos_weight!r} weights the bce loss; rerank.loss is "
                               f"{config.rerank.loss!r}")
    options = (("loss", config.rerank.loss),) + ((("pos_weight", pos_weight),) if pos_weight != 1.0 else ())
  return Task(name, "rerank", ("text_a", "text_b"), (), METRICS, "ndcg@10", options=options)


class RerankRow:
  """One (query, document, label) row as {"text_a", "text_b", "label"}, checked as `rows.local_examples` checks a
  regression row, and its label a relevance in [0, 1]."""

  def __init__(self, path: str, config):
    d = config.data
    if not d.text_b_column:
      raise errors.ConfigError("task rerank reads (query, document, label) rows: set data.text_b_column")
    self.path, self.seen = path, 0
    self.convert = task_data.Converter(path, Task("rerank", "regression"), d.text_a_column, d.text_b_column,
                                       d.label_column)

  def __call__(self, line, row: dict) -> dict:
    example = self.convert(line, row)
    if line is not None:  # the checking pass (a batch's rows were checked in it)
      self.seen += 1
      if not 0.0 <= example["label"] <= 1.0:
        raise task_data.TaskDataError(f"{self.path}: row {self.seen} has label {example['label']!r}; task rerank "
                                      "takes relevance in [0, 1] (binary cross-entropy)")
    return example


def read(path: str, config) -> list[dict]:
  """The rows of a rerank file, read whole."""
  convert = RerankRow(path, config)
  path = task_data._found(path)
  rows = [convert(line, row) for line, row in task_data.read_rows(path)]
  if not rows:
    raise task_data.TaskDataError(f"{path}: no rows")
  return rows


def train_features(path: str, config, tok, seq: int):
  """(features, up to two distinct labels in file order) of a pointwise training file: featurised whole when it fits
  the row buffer ($BERTJAX_ROW_BUFFER), else a `rows.Streamed` that reads and featurises each batch's rows."""
  convert = RerankRow(path, config)
  path = task_data._found(path)
  if task_data.fits_buffer(path):
    rows = read(path, config)
    feats, labels = featurize(rows, tok, seq), (r["label"] for r in rows)
  else:
    feats = task_data.Streamed(path, convert, lambda rows: featurize(rows, tok, seq))
    labels = (r["label"] for r in feats.scan())
  seen = []
  for y in labels:
    if y not in seen and len(seen) < 2:
      seen.append(y)
  if not seen:
    raise task_data.TaskDataError(f"{path}: no rows")
  return feats, seen


def featurize(rows: list[dict], tok, seq: int) -> dict:
  """The pairs as a CrossEncoder lays them out (`rerank.pair_rows`), zero-padded to `seq`."""
  ids = np.full((len(rows), seq), tok.pad_id, np.int32)
  mask, seg = np.zeros_like(ids), np.zeros_like(ids)
  for i, (row, start, segments) in enumerate(rerank.pair_rows(tok, [(r["text_a"], r["text_b"]) for r in rows], seq)):
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
    if segments:
      seg[i, start:len(row)] = 1
  return {"input_ids": ids, "input_mask": mask, "segment_ids": seg,
          "labels": np.array([r["label"] for r in rows], np.float32)}


def featurize_lists(rows: list[dict], tok, seq: int) -> dict:
  """The rows grouped by query (in order of first appearance) for a listwise loss: `list_*` [Q, K, L] and
  `list_labels`, `list_weights` [Q, K] (0 where a query has fewer than K documents); `input_ids` etc. [Q, L] hold
  each query's first pair (what the model is traced on)."""
  groups: dict[str, list[int]] = {}
  for i, r in enumerate(rows):
    groups.setdefault(r["text_a"], []).append(i)
  pairs = featurize(rows, tok, seq)
  k = max(len(g) for g in groups.values())
  index = np.zeros((len(groups), k), np.int64)
  weights = np.zeros((len(groups), k), np.float32)
  for q, members in enumerate(groups.values()):
    index[q, :len(members)], weights[q, :len(members)] = members, 1.0
  out = {f"list_{n}": pairs[n][index] for n in ("input_ids", "input_mask", "segment_ids", "labels")}
  out["list_weights"] = weights
  out.update({n: pairs[n][index[:, 0]] for n in ("input_ids", "input_mask", "segment_ids", "labels")})
  return out


def list_net(scores, labels, weights):
  """sentence-transformers' ListNetLoss per query [Q]: −Σ_k softmax(labels)_k · log softmax(scores)_k over the
  query's real documents (`weights` 1)."""
  real = weights > 0
  target = jax.nn.softmax(jnp.where(real, labels, -jnp.inf), axis=-1)
  log_p = jax.nn.log_softmax(jnp.where(real, scores, -1e16), axis=-1)
  return -jnp.sum(jnp.where(real, target * log_p, 0.0), axis=-1)


def bce_with_logits(logits, labels, pos_weight=1.0):
  """Per pair: −[p·y·log σ(x) + (1 − y)·log(1 − σ(x))], computed stably (torch's BCEWithLogitsLoss with
  pos_weight p)."""
  return pos_weight * labels * jax.nn.softplus(-logits) + (1 - labels) * jax.nn.softplus(logits)


class Rerank(Kind):
  name = "rerank"
  hf_head = "sequence_classification"
  pack_keys = None  # a pair is one row, as the CrossEncoder reads it

  def weights(self, task, path, overrides):
    return super().weights(dataclasses.replace(task, kind="regression"), path, overrides)  # one output

  def head(self, task, cfg):
    return super().head(dataclasses.replace(task, kind="regression"), cfg)

  def load(self, task, config, tok):
    seq = config.data.max_seq_length
    listwise = task.option("loss") == "listnet"  # a query's documents together: the file read whole
    if listwise:
      train_rows = read(config.data.train_file, config)
      labels = list(dict.fromkeys(r["label"] for r in train_rows))
    else:
      train, labels = train_features(config.data.train_file, config, tok, seq)
    if len(labels) < 2:
      raise task_data.TaskDataError(f"{config.data.train_file}: every row has the label {labels[0]!r}; "
                                    "a reranker learns from relevant and non-relevant pairs")
    evals = []
    if config.data.eval_file:
      rows = read(config.data.eval_file, config)
      evals.append(EvalSet("validation", featurize(rows, tok, seq), {"rows": rows}))
    if listwise:
      train = featurize_lists(train_rows, tok, seq)
      return train, evals, {"queries": len(train["input_ids"]),
                            "documents per query (at most)": train["list_weights"].shape[1]}
    return train, evals, {}

  def loss(self, task, out, batch):
    return example_mean(bce_with_logits(out["logits"][..., 0], batch["labels"], task.option("pos_weight", 1.0)),
                        batch["example_weights"])

  def accumulates(self, task):
    return task.option("loss") != "listnet"

  def value_and_grad(self, task, module, params, batch, rngs, step=None, total_steps=None, accum=1):
    """ListNet: every (query, document) pair of the batch's queries scored in one pass, the loss over each
    query's list; BCE: the kind's `loss` on the batch's pairs."""
    if task.option("loss") != "listnet":
      return super().value_and_grad(task, module, params, batch, rngs, step, total_steps, accum)
    q, k, length = batch["list_input_ids"].shape
    flat = {n: batch[f"list_{n}"].reshape(q * k, length) for n in ("input_ids", "input_mask", "segment_ids")}

    def loss_fn(p):
      scores = module.apply({"params": p}, flat, deterministic=False, rngs=rngs)["logits"][:, 0].reshape(q, k)
      w = batch["list_weights"] * batch["example_weights"][:, None]
      return example_mean(list_net(scores, batch["list_labels"], w), batch["example_weights"])
    return jax.value_and_grad(loss_fn)(params)

  def score(self, task, ev, preds, config):
    rows, logits = ev.meta["rows"], np.asarray(preds["logits"])[:, 0]
    queries = {r["text_a"]: f"q{i}" for i, r in enumerate(rows)}
    run: dict[str, dict[str, float]] = {}
    qrels: dict[str, dict[str, int]] = {}
    for i, (r, s) in enumerate(zip(rows, logits)):
      q = queries[r["text_a"]]
      run.setdefault(q, {})[f"d{i}"] = float(s)
      qrels.setdefault(q, {})[f"d{i}"] = int(r["label"] >= 0.5)
    return retrieval.evaluate_run(run, {q: j for q, j in qrels.items() if any(j.values())}, METRICS)

  def export(self, task, module, params, out, meta):
    """A sentence-transformers CrossEncoder folder: the family's sequence classifier, sigmoid activation."""
    super().export(dataclasses.replace(task, kind="regression"), module, params, out, meta)
    rerank.write_folder(out, "sigmoid", meta["max_seq_length"])
    return "CrossEncoder"

  def predict_text(self, task, module, params, tok, seq, text="", pair="", **_):
    feats = featurize([{"text_a": text, "text_b": pair, "label": 0.0}], tok, seq)
    logit = float(np.asarray(module.apply({"params": params}, feats)["logits"])[0, 0])
    return {"score": float(jax.nn.sigmoid(logit))}


KINDS = {"rerank": Rerank()}
