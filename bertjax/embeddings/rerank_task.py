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
from bertjax.embeddings import rerank, retrieval
from bertjax.tasks.base import EvalSet, Kind, Task, example_mean

NAMES = ("rerank",)
METRICS = ("ndcg@10", "mrr@10", "map")


def task(name, labels, regression, config) -> Task | None:
  """`rerank`: (query, document, relevance) rows from the config's files (data.text_a_column, text_b_column,
  label_column)."""
  del labels, regression, config
  if name != "rerank":
    return None
  return Task(name, "rerank", ("text_a", "text_b"), (), METRICS, "ndcg@10")


def read(path: str, config) -> list[dict]:
  d = config.data
  if not d.text_b_column:
    raise errors.ConfigError("task rerank reads (query, document, label) rows: set data.text_b_column")
  as_scores = Task("rerank", "regression")
  rows = task_data.local_examples(path, as_scores, d.text_a_column, d.text_b_column, d.label_column)
  bad = next((i for i, r in enumerate(rows) if not 0.0 <= r["label"] <= 1.0), None)
  if bad is not None:
    raise task_data.TaskDataError(f"{path}: row {bad + 1} has label {rows[bad]['label']!r}; task rerank takes "
                                  "relevance in [0, 1] (binary cross-entropy)")
  return rows


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


def bce_with_logits(logits, labels):
  """Per pair: −[y·log σ(x) + (1 − y)·log(1 − σ(x))], computed stably (torch's BCEWithLogitsLoss)."""
  return jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))


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
    train_rows = read(config.data.train_file, config)
    if len({r["label"] for r in train_rows}) < 2:
      raise task_data.TaskDataError(f"{config.data.train_file}: every row has the label {train_rows[0]['label']!r}; "
                                    "a reranker learns from relevant and non-relevant pairs")
    evals = []
    if config.data.eval_file:
      rows = read(config.data.eval_file, config)
      evals.append(EvalSet("validation", featurize(rows, tok, seq), {"rows": rows}))
    return featurize(train_rows, tok, seq), evals, {}

  def loss(self, task, out, batch):
    return example_mean(bce_with_logits(out["logits"][..., 0], batch["labels"]), batch["example_weights"])

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
