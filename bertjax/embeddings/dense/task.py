"""Embedding training (`task=pairs`): (anchor, positive[, hard negatives...]) rows with in-batch negatives from
the whole global batch (sentence-transformers' MultipleNegativesRankingLoss), or scored pairs (CoSENT) with
`data.regression=True`. Evaluated as retrieval (each eval anchor against every distinct positive and negative
text of the eval file: nDCG@10, MRR@10, Recall@1/10) or, for scored pairs, by the rank correlation of cosine
similarity and gold score.
"""
from __future__ import annotations

import array
import dataclasses
import hashlib
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax.convert import weights as weights_lib
from bertjax.core import scores
from bertjax.data import packing
from bertjax.data.tasks import rows as task_data
from bertjax.embeddings import distill, folders, losses, retrieval
from bertjax.embeddings.model import EmbeddingModel, Pooling
from bertjax.tasks.base import EvalSet, Kind, Task

NAMES = ("pairs",)
SECTIONS = {"pairs": "embedding", "sparse": "sparse", "multivector": "multivector"}  # each kind's config section


def task(name, labels, regression, config) -> Task | None:
  """`pairs`: (anchor, positive[, negatives]) rows with in-batch negatives, evaluated as retrieval; with
  `regression`, scored pairs (CoSENT) evaluated by rank correlation. Its options come from `config.embedding`."""
  del labels
  if name != "pairs":
    return None
  opts = options(config) if config is not None else ()
  if regression:
    if dict(opts).get("loss"):
      raise errors.ConfigError(f"embedding.loss {config.embedding.loss}: distillation trains on (anchor, positive, "
                               "negatives) rows; data.regression=True (scored pairs) is CoSENT's")
    return Task(name, "contrastive", ("text_a", "text_b"), (), ("spearman", "pearson"), "spearman",
                options=opts + (("scored", True),))
  return Task(name, "contrastive", ("text_a", "text_b"), (), ("ndcg@10", "mrr@10", "recall@1", "recall@10"),
              "ndcg@10", options=opts)


def options(config) -> tuple:
  """The task's options from the config's `embedding` section; an init that is a sentence-transformers folder
  gives its pooling, dense layer and normalisation unless `embedding.pooling` is set."""
  e = config.embedding
  if config.init and folders.is_folder(config.init) and not e.pooling:
    pooling = folders.read_pooling(config.init)
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
      ("cache_chunk", int(e.cache_chunk))) + distill.options("embedding", e.loss, e.temperature)


def _key(text: str) -> int:
  return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


def _encode(texts, tok, seq):
  f = task_data.encode_pairs([{"text_a": t, "text_b": "", "label": 0} for t in texts], tok, seq)
  return f["input_ids"], f["input_mask"]


class PairRow:
  """One row of a pairs file as {"anchor", "docs": [positive, negatives...], "score"}, checked: the first row must
  hold every named column; each row non-empty texts and, for scored pairs, a finite score."""

  def __init__(self, path: str, text_a: str, text_b: str, negatives=(), score: str = ""):
    self.path, self.columns, self.score = path, (text_a, text_b, *negatives), score
    self.needed = [c for c in (*self.columns, score) if c]
    self.first = True

  def __call__(self, line, row: dict) -> dict:
    path, score = self.path, self.score
    if self.first:
      missing = [c for c in self.needed if c not in row]
      if missing:
        raise task_data.TaskDataError(f"{path}: missing column(s) {missing}; the file has {sorted(row)}")
      self.first = False
    texts = [str(row.get(c) or "") for c in self.columns]
    empty = [c for c, t in zip(self.columns, texts) if not t.strip()]
    if empty:
      raise task_data.TaskDataError(f"{path}:{line}: empty text in column(s) {empty}; remove the row or fill it in")
    try:
      value = float(row[score]) if score else 0.0
    except (TypeError, ValueError):
      raise task_data.TaskDataError(f"{path}:{line}: score {row[score]!r} is not a number") from None
    if not math.isfinite(value):
      raise task_data.TaskDataError(f"{path}:{line}: score {row[score]!r} is not a finite number")
    return {"anchor": texts[0], "docs": texts[1:], "score": value}


def _needs_file(path: str) -> None:
  if not path:
    raise task_data.TaskDataError("task pairs needs config.data.train_file (columns: anchor, positive[, negatives])")


def iter_pairs(path: str, text_a: str, text_b: str, negatives=(), score: str = ""):
  """The rows {"anchor", "docs": [positive, negatives...], "score"} of a .csv / .tsv / .jsonl file, streamed."""
  _needs_file(path)
  convert = PairRow(path, text_a, text_b, negatives, score)
  for line, row in task_data.read_rows(path):
    yield convert(line, row)


def read_pairs(path: str, text_a: str, text_b: str, negatives=(), score: str = "") -> list[dict]:
  """The rows of `iter_pairs`, read whole."""
  out = list(iter_pairs(path, text_a, text_b, negatives, score))
  if not out:
    raise task_data.TaskDataError(f"{path}: no rows")
  return out


class Survey:
  """What the training checks need of every row, in memory independent of the texts: up to two distinct scores
  and an 8-byte digest of each row's positive."""

  def __init__(self, rows):
    self.scores, digests = set(), array.array("Q")
    for r in rows:
      if len(self.scores) < 2:
        self.scores.add(r["score"])
      digests.append(int.from_bytes(hashlib.blake2b(r["docs"][0].encode("utf-8"), digest_size=8).digest(), "little"))
    self.rows = len(digests)
    self.distinct_positives = len(np.unique(np.frombuffer(digests, np.uint64))) if digests else 0


def train_pairs(path: str, text_a: str, text_b: str, negatives, score: str, featurize_rows, featurize_batch=None):
  """(features, `Survey`) of a training pairs file: featurised whole (`featurize_rows(rows)`) when the file fits the
  row buffer ($BERTJAX_ROW_BUFFER), else a `rows.Streamed` that reads and featurises each batch's rows
  (`featurize_batch`, by default `featurize_rows`)."""
  _needs_file(path)
  if task_data.fits_buffer(path):
    rows = read_pairs(path, text_a, text_b, negatives, score)
    return featurize_rows(rows), Survey(rows)
  feats = task_data.Streamed(path, PairRow(path, text_a, text_b, negatives, score), featurize_batch or featurize_rows)
  survey = Survey(feats.scan())
  if not survey.rows:
    raise task_data.TaskDataError(f"{path}: no rows")
  return feats, survey


def featurize(rows: list[dict], tok, seq: int) -> dict:
  q_ids, q_mask = _encode([r["anchor"] for r in rows], tok, seq)
  k = len(rows[0]["docs"])
  d_ids, d_mask = _encode([d for r in rows for d in r["docs"]], tok, seq)
  return {"input_ids": q_ids, "input_mask": q_mask, "segment_ids": np.zeros_like(q_ids),
          "doc_input_ids": d_ids.reshape(len(rows), k, seq), "doc_input_mask": d_mask.reshape(len(rows), k, seq),
          "query_keys": np.array([_key(r["anchor"]) for r in rows], np.int32),
          "doc_keys": np.array([[_key(d) for d in r["docs"]] for r in rows], np.int32),
          "labels": np.array([r["score"] for r in rows], np.float32)}


def corpus_vectors(rows: list[dict], corpus: list[str], docs) -> tuple[np.ndarray, dict[str, int]]:
  """[len(corpus), D] vectors of the eval file's distinct texts from the rows' document vectors `docs` [rows, K, D]
  (each text's vector as the last row holding it gives it), and each text's row in them."""
  index = {t: i for i, t in enumerate(corpus)}
  vectors = np.zeros((len(corpus), docs.shape[-1]), np.float32)
  for r, row in enumerate(rows):
    for j, text in enumerate(row["docs"]):
      vectors[index[text]] = docs[r, j]
  return vectors, index


def retrieval_scores(queries, corpus, relevant, metrics=("ndcg@10", "mrr@10", "recall@1", "recall@10")
                     ) -> dict[str, float]:
  """Cosine ranking of the whole corpus for each query (one relevant corpus row each), scored by trec_eval's
  measures in `retrieval.evaluate_run`."""
  sims = scores.unit_rows(queries) @ scores.unit_rows(corpus).T
  run = {f"q{i}": {f"d{j}": float(s) for j, s in enumerate(row)} for i, row in enumerate(sims)}
  return retrieval.evaluate_run(run, {f"q{i}": {f"d{r}": 1} for i, r in enumerate(relevant)}, metrics)


class Contrastive(Kind):
  name = "contrastive"
  hf_head = "encoder"
  outputs = ("embedding", "doc_embedding")
  token_outputs = ()
  pack_keys: dict | None = {}

  def can_pack(self, task):
    # gradient caching chunks unpacked rows; a teacher's scores go with unpacked rows
    return not task.option("cache_chunk") and not task.option("loss")

  def pack(self, feats, row_length, max_per_row):
    """Rows of (1 + K)·`row_length` tokens: room for an example whose texts are all that long."""
    return packing.pack_contrastive(feats, (1 + feats["doc_input_ids"].shape[1]) * row_length, max_per_row)

  def text_lengths(self, feats):
    return np.concatenate([np.sum(feats["input_mask"], axis=-1), np.sum(feats["doc_input_mask"], axis=-1).ravel()])

  def weights(self, task, path, overrides):
    """A sentence-transformers folder's encoder and dense layer, and the tokenizer beside its transformer; any
    other init as every kind reads it."""
    if not folders.is_folder(path):
      return super().weights(task, path, overrides)
    cfg, params, _, folder = folders.read(path, **overrides)
    return (cfg, params, *weights_lib.hf_tokenizer(folder))

  def head(self, task, cfg):
    fields = {f: task.option(f) for f in ("mode", "dense", "dense_bias", "dense_activation", "normalize")
              if task.option(f) is not None}
    return EmbeddingModel(cfg, Pooling(**fields))

  def load(self, task, config, tok):
    d, seq = config.data, config.data.max_seq_length
    negatives = tuple(c for c in config.embedding.negative_columns if c)
    score = d.label_column if task.option("scored") else ""
    columns = (d.text_a_column, d.text_b_column, () if score else negatives, score)
    feats, survey = train_pairs(d.train_file, *columns, lambda rows: featurize(rows, tok, seq))
    evals = []
    if d.eval_file:
      rows = read_pairs(d.eval_file, *columns)
      corpus = sorted({t for r in rows for t in r["docs"]})
      evals.append(EvalSet("validation", featurize(rows, tok, seq), {"rows": rows, "corpus": corpus}))
    stats = {"hard negatives per row": len(negatives)}
    if score and len(survey.scores) < 2:
      raise task_data.TaskDataError(f"{d.train_file}: every row has the same score; CoSENT learns from pairs whose "
                                    "scores differ (its loss is 0 here)")
    if not score and not negatives and config.train.global_batch_size < 2:
      raise task_data.TaskDataError("task pairs with train.global_batch_size 1 and no hard negatives has no "
                                    "negative for any anchor (every loss is 0); use a batch of 2 or more, or "
                                    "embedding.negative_columns")
    if not score:
      if survey.distinct_positives < 2:
        raise task_data.TaskDataError(f"{d.train_file}: every row has the same positive; in-batch negatives need at "
                                      "least two distinct positives")
      # Rows sharing a positive are each other's false negatives: masked in the loss (`ranking_loss` doc_keys).
      stats["rows whose positive another row shares"] = survey.rows - survey.distinct_positives
    if task.option("loss"):
      feats = distill.attach(feats, task.option("loss"), SECTIONS[task.name], d)
    return feats, evals, stats

  def loss(self, task, out, batch):
    w = batch["example_weights"]
    q, d = out["embedding"], out["doc_embedding"]
    if q.ndim == 3:  # packed rows: [rows, slots, ...] -> one example per slot (empty slots weighted 0)
      q, d, w = q.reshape(-1, q.shape[-1]), d.reshape((-1,) + d.shape[2:]), w.reshape(-1)
      batch = {**batch, **{n: batch[n].reshape((-1,) + batch[n].shape[2:]) for n in ("doc_keys", "query_keys",
                                                                                   "labels")}}
    scale = task.option("scale", 20.0)
    if task.option("loss"):  # distillation: the student's dot products against the teacher's scores
      def loss_fn(q, d):
        return distill.loss(task.option("loss"), distill.pairwise_dot(q, d), batch["teacher_scores"],
                            task.option("temperature", 1.0), w)
    elif task.option("scored"):
      def loss_fn(q, d):
        return losses.cosent_loss(q, d[:, 0], batch["labels"], scale, weights=w)
    else:
      keys = batch["doc_keys"].T.reshape(-1)

      def loss_fn(q, d):
        docs = d.transpose(1, 0, 2).reshape(-1, d.shape[-1])  # positives first, then each block of negatives
        return losses.ranking_loss(q, docs, scale, task.option("symmetric", False), weights=w, doc_keys=keys,
                                        query_keys=batch["query_keys"])
    dims = tuple(task.option("matryoshka") or ())
    if not dims:
      return loss_fn(q, d)
    if max(dims) > q.shape[-1]:
      raise errors.ConfigError(f"embedding.matryoshka_dims {list(dims)}: the embeddings have {q.shape[-1]} features")
    return losses.matryoshka_loss(loss_fn, (q, d), dims)

  def accumulates(self, task):
    del task
    return False  # in-batch negatives: a micro-batch's rows would see fewer negatives (embedding.cache_chunk)

  def value_and_grad(self, task, module, params, batch, rngs, step=None, total_steps=None, accum=1):
    """With the `cache_chunk` option, gradient caching: anchors and documents embedded `cache_chunk` rows at a
    time (`contrastive.cached_value_and_grad`), each chunk's dropout drawn from its first row's index so that the
    embedding pass and the backward pass see the same masks."""
    chunk = int(task.option("cache_chunk") or 0)
    if not chunk:
      return super().value_and_grad(task, module, params, batch, rngs, step, total_steps)
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
    return losses.cached_value_and_grad(embed, loss_of, params, [queries, docs], chunk)

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
    rows = ev.meta["rows"]
    vectors, index = corpus_vectors(rows, ev.meta["corpus"], d)
    relevant = np.array([index[row["docs"][0]] for row in rows])
    out = retrieval_scores(q, vectors, relevant)
    for dim in task.option("matryoshka") or ():  # the main metric at each Matryoshka width
      if dim < q.shape[-1]:
        out[f"ndcg@10_dim{dim}"] = retrieval_scores(q[:, :dim], vectors[:, :dim], relevant)["ndcg@10"]
    return out

  def export(self, task, module, params, out, meta):
    """A sentence-transformers folder: the encoder, its pooling, dense layer and normalisation."""
    folders.write(module.cfg, params, module.pooling, out, max_seq_length=meta["max_seq_length"])
    return "SentenceTransformer"

  def predict_text(self, task, module, params, tok, seq, text="", **_):
    ids, mask = _encode([text], tok, seq)
    out = module.apply({"params": params}, {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)})
    return {"embedding": np.asarray(out["embedding"][0]).round(6).tolist()}


KINDS = {"contrastive": Contrastive()}
