"""Embedding training (`task=pairs`): (anchor, positive[, hard negatives...]) rows with in-batch negatives from
the whole global batch (sentence-transformers' MultipleNegativesRankingLoss), or scored pairs (CoSENT) with
`data.regression=True`. Evaluated as retrieval (each eval anchor against every distinct positive and negative
text of the eval file: nDCG@10, MRR@10, Recall@1/10) or, for scored pairs, by the rank correlation of cosine
similarity and gold score.
"""
from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import contrastive, errors, retrieval, scores
from bertjax.data import packing, task_data
from bertjax.model.embedding import EmbeddingModel, Pooling
from bertjax.tasks.base import EvalSet, Kind


def _key(text: str) -> int:
  return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


def _encode(texts, tok, seq):
  f = task_data.encode_pairs([{"text_a": t, "text_b": "", "label": 0} for t in texts], tok, seq)
  return f["input_ids"], f["input_mask"]


def read_pairs(path: str, text_a: str, text_b: str, negatives=(), score: str = "") -> list[dict]:
  """Rows {"anchor", "docs": [positive, negatives...], "score"} of a .csv / .tsv / .jsonl file."""
  if not path:
    raise task_data.TaskDataError("task pairs needs config.data.train_file (columns: anchor, positive[, negatives])")
  rows = list(task_data.read_rows(path))
  if not rows:
    raise task_data.TaskDataError(f"{path}: no rows")
  needed = [c for c in (text_a, text_b, *negatives, score) if c]
  missing = [c for c in needed if c not in rows[0][1]]
  if missing:
    raise task_data.TaskDataError(f"{path}: missing column(s) {missing}; the file has {sorted(rows[0][1])}")
  out = []
  for line, row in rows:
    texts = [str(row.get(c) or "") for c in (text_a, text_b, *negatives)]
    empty = [c for c, t in zip((text_a, text_b, *negatives), texts) if not t.strip()]
    if empty:
      raise task_data.TaskDataError(f"{path}:{line}: empty text in column(s) {empty}; remove the row or fill it in")
    try:
      value = float(row[score]) if score else 0.0
    except (TypeError, ValueError):
      raise task_data.TaskDataError(f"{path}:{line}: score {row[score]!r} is not a number") from None
    out.append({"anchor": texts[0], "docs": texts[1:], "score": value})
  return out


def featurize(rows: list[dict], tok, seq: int) -> dict:
  q_ids, q_mask = _encode([r["anchor"] for r in rows], tok, seq)
  k = len(rows[0]["docs"])
  d_ids, d_mask = _encode([d for r in rows for d in r["docs"]], tok, seq)
  return {"input_ids": q_ids, "input_mask": q_mask, "segment_ids": np.zeros_like(q_ids),
          "doc_input_ids": d_ids.reshape(len(rows), k, seq), "doc_input_mask": d_mask.reshape(len(rows), k, seq),
          "query_keys": np.array([_key(r["anchor"]) for r in rows], np.int32),
          "doc_keys": np.array([[_key(d) for d in r["docs"]] for r in rows], np.int32),
          "labels": np.array([r["score"] for r in rows], np.float32)}


def retrieval_scores(queries, corpus, relevant, metrics=("ndcg@10", "mrr@10", "recall@1", "recall@10")
                     ) -> dict[str, float]:
  """Cosine ranking of the whole corpus for each query (one relevant corpus row each), scored by trec_eval's
  measures in `retrieval.evaluate_run`."""
  sims = scores.unit_rows(queries) @ scores.unit_rows(corpus).T
  run = {f"q{i}": {f"d{j}": float(s) for j, s in enumerate(row)} for i, row in enumerate(sims)}
  return retrieval.evaluate_run(run, {f"q{i}": {f"d{r}": 1} for i, r in enumerate(relevant)}, metrics)


def pack(feats: dict, text_length: int, max_per_row: int) -> tuple[dict, list[list[int]]]:
  """Examples packed into rows of (1 + K)·`text_length` tokens: an example's anchor and its K documents stay
  together (every text its own attention segment, positions restarting at 0), up to `max_per_row` examples
  a row, best-fit-decreasing by the example's total length (`packing.plan`), so every example fits a row.

  Per row: the token features; `text_segments` [k, 1 + K], each slot's texts' segment numbers (0: empty slot);
  `example_slot_weights` [k]; the slot's `query_keys`, `doc_keys` [k, K] and `labels`."""
  q_ids, d_ids = np.asarray(feats["input_ids"]), np.asarray(feats["doc_input_ids"])
  n, n_docs, length = d_ids.shape
  t = 1 + n_docs
  ids = np.concatenate([q_ids[:, None], d_ids], axis=1)  # [N, T, L]
  lengths = np.concatenate([np.asarray(feats["input_mask"])[:, None], np.asarray(feats["doc_input_mask"])],
                           axis=1).sum(-1)
  row_length = t * text_length
  rows = packing.plan(lengths.sum(-1), np.zeros(n, np.int64), row_length, 0, max_per_row)
  r = len(rows)
  out = {name: np.zeros((r, row_length), np.int32) for name in
         ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids")}
  out["text_segments"] = np.zeros((r, max_per_row, t), np.int32)
  out["cls_positions"] = np.zeros((r, max_per_row), np.int32)
  out["example_slot_weights"] = np.zeros((r, max_per_row), np.float32)
  for name in ("query_keys", "doc_keys", "labels"):
    out[name] = np.zeros((r, max_per_row) + feats[name].shape[1:], feats[name].dtype)
  for i, members in enumerate(rows):
    pos = 0
    for slot, j in enumerate(members):
      out["cls_positions"][i, slot] = pos
      for x in range(t):
        m, seg = int(lengths[j, x]), slot * t + x + 1
        out["input_ids"][i, pos:pos + m] = ids[j, x, :m]
        out["input_mask"][i, pos:pos + m] = 1
        out["position_ids"][i, pos:pos + m] = np.arange(m)
        out["attention_segment_ids"][i, pos:pos + m] = seg
        out["text_segments"][i, slot, x] = seg
        pos += m
      out["example_slot_weights"][i, slot] = 1.0
      for name in ("query_keys", "doc_keys", "labels"):
        out[name][i, slot] = feats[name][j]
  return out, rows


class Contrastive(Kind):
  name = "contrastive"
  hf_head = "encoder"
  outputs = ("embedding", "doc_embedding")
  token_outputs = ()
  pack_keys: dict | None = {}

  def can_pack(self, task):
    return not task.option("cache_chunk")  # gradient caching chunks unpacked rows

  def pack(self, feats, row_length, max_per_row):
    return pack(feats, row_length, max_per_row)

  def text_lengths(self, feats):
    return np.concatenate([np.sum(feats["input_mask"], axis=-1), np.sum(feats["doc_input_mask"], axis=-1).ravel()])

  def head(self, task, cfg):
    fields = {f: task.option(f) for f in ("mode", "dense", "dense_bias", "dense_activation", "normalize")
              if task.option(f) is not None}
    return EmbeddingModel(cfg, Pooling(**fields))

  def load(self, task, config, tok):
    d, seq = config.data, config.data.max_seq_length
    negatives = tuple(c for c in config.embedding.negative_columns if c)
    score = d.label_column if task.option("scored") else ""

    def read(p):
      return read_pairs(p, d.text_a_column, d.text_b_column, () if score else negatives, score)
    train_rows = read(d.train_file)
    evals = []
    if d.eval_file:
      rows = read(d.eval_file)
      corpus = sorted({t for r in rows for t in r["docs"]})
      evals.append(EvalSet("validation", featurize(rows, tok, seq), {"rows": rows, "corpus": corpus}))
    stats = {"hard negatives per row": len(negatives)}
    if not score:
      positives = [r["docs"][0] for r in train_rows]
      distinct = len(set(positives))
      if distinct < 2:
        raise task_data.TaskDataError(f"{d.train_file}: every row has the same positive; in-batch negatives need at "
                                      "least two distinct positives")
      # Rows sharing a positive are each other's false negatives: masked in the loss (`ranking_loss` doc_keys).
      stats["rows whose positive another row shares"] = len(positives) - distinct
    return featurize(train_rows, tok, seq), evals, stats

  def loss(self, task, out, batch):
    w = batch["example_weights"]
    q, d = out["embedding"], out["doc_embedding"]
    if q.ndim == 3:  # packed rows: [rows, slots, ...] -> one example per slot (empty slots weighted 0)
      q, d, w = q.reshape(-1, q.shape[-1]), d.reshape((-1,) + d.shape[2:]), w.reshape(-1)
      batch = {**batch, **{n: batch[n].reshape((-1,) + batch[n].shape[2:]) for n in ("doc_keys", "query_keys",
                                                                                   "labels")}}
    scale = task.option("scale", 20.0)
    if task.option("scored"):
      def loss_fn(q, d):
        return contrastive.cosent_loss(q, d[:, 0], batch["labels"], scale, weights=w)
    else:
      keys = batch["doc_keys"].T.reshape(-1)

      def loss_fn(q, d):
        docs = d.transpose(1, 0, 2).reshape(-1, d.shape[-1])  # positives first, then each block of negatives
        return contrastive.ranking_loss(q, docs, scale, task.option("symmetric", False), weights=w, doc_keys=keys,
                                        query_keys=batch["query_keys"])
    dims = tuple(task.option("matryoshka") or ())
    if not dims:
      return loss_fn(q, d)
    if max(dims) > q.shape[-1]:
      raise errors.ConfigError(f"embedding.matryoshka_dims {list(dims)}: the embeddings have {q.shape[-1]} features")
    return contrastive.matryoshka_loss(loss_fn, (q, d), dims)

  def value_and_grad(self, task, module, params, batch, rngs):
    """With the `cache_chunk` option, gradient caching: anchors and documents embedded `cache_chunk` rows at a
    time (`contrastive.cached_value_and_grad`), each chunk's dropout drawn from its first row's index so that the
    embedding pass and the backward pass see the same masks."""
    chunk = int(task.option("cache_chunk") or 0)
    if not chunk:
      return super().value_and_grad(task, module, params, batch, rngs)
    b, k, length = batch["doc_input_ids"].shape
    queries = {"input_ids": batch["input_ids"], "input_mask": batch["input_mask"],
               "segment_ids": batch["segment_ids"], "row": jnp.arange(b)}
    docs = {"input_ids": batch["doc_input_ids"].reshape(b * k, length),
            "input_mask": batch["doc_input_mask"].reshape(b * k, length),
            "segment_ids": jnp.zeros((b * k, length), jnp.int32), "row": b + jnp.arange(b * k)}

    def embed(p, x):
      keys = {name: jax.random.fold_in(key, x["row"][0]) for name, key in rngs.items()}
      return module.apply({"params": p}, {n: v for n, v in x.items() if n != "row"}, False, rngs=keys,
                          method=EmbeddingModel.embed)

    def loss_of(q, d):
      return self.loss(task, {"embedding": q, "doc_embedding": d.reshape(b, k, -1)}, batch)
    return contrastive.cached_value_and_grad(embed, loss_of, params, [queries, docs], chunk)

  def score(self, task, ev, preds, config):
    q, d = preds["embedding"], preds["doc_embedding"]
    if task.option("scored"):
      cos = scores.paired_cosine(q, d[:, 0])
      g = ev.feats["labels"]
      out = {"spearman": scores.spearman(cos, g), "pearson": scores.pearson(cos, g)}
      for dim in task.option("matryoshka") or ():
        if dim < q.shape[-1]:
          out[f"spearman_dim{dim}"] = scores.spearman(scores.paired_cosine(q[:, :dim], d[:, 0, :dim]), g)
      return out
    rows, corpus = ev.meta["rows"], ev.meta["corpus"]
    index = {t: i for i, t in enumerate(corpus)}
    vectors = np.zeros((len(corpus), d.shape[-1]), np.float32)
    for r, row in enumerate(rows):
      for j, text in enumerate(row["docs"]):
        vectors[index[text]] = d[r, j]
    relevant = np.array([index[row["docs"][0]] for row in rows])
    out = retrieval_scores(q, vectors, relevant)
    for dim in task.option("matryoshka") or ():  # the main metric at each Matryoshka width
      if dim < q.shape[-1]:
        out[f"ndcg@10_dim{dim}"] = retrieval_scores(q[:, :dim], vectors[:, :dim], relevant)["ndcg@10"]
    return out

  def predict_text(self, task, module, params, tok, seq, text="", **_):
    ids, mask = _encode([text], tok, seq)
    out = module.apply({"params": params}, {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)})
    return {"embedding": np.asarray(out["embedding"][0]).round(6).tolist()}
