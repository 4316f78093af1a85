"""Sparse encoder training (`task=sparse`): SPLADE on (anchor, positive[, hard negatives...]) rows, the columns
and files of `task=pairs`. The loss is sentence-transformers' SpladeLoss over SparseMultipleNegativesRankingLoss:
InfoNCE on dot products of the term vectors with negatives from the whole global batch, plus FLOPS regularisers on
the documents and (weighted apart) the queries, their weights rising from 0 as (step / W)² over the first third of
the run (its trainer's default SpladeRegularizerWeightSchedulerCallback). Evaluated as retrieval over the eval
file's texts by dot product (nDCG@10, MRR@10, Recall@1/10), with the mean number of non-zero terms per query and
per document; exported as a sentence-transformers SparseEncoder folder.
"""
from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax.convert import weights as weights_lib
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.tasks import rows as task_data
from bertjax.embeddings import distill
from bertjax.embeddings.dense.task import Contrastive, corpus_vectors, iter_pairs, retrieval
from bertjax.embeddings.sparse import encoder as sparse
from bertjax.tasks.base import Task

NAMES = ("sparse",)
METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10")


def task(name, labels, regression, config) -> Task | None:
  """`sparse`: SPLADE on pairs; its options come from `config.sparse` (and hard negatives from
  `config.embedding.negative_columns`)."""
  del labels
  if name != "sparse":
    return None
  if regression:
    raise errors.ConfigError("task sparse trains on (anchor, positive[, negatives]) rows; data.regression=True "
                             "(scored pairs) is task pairs'")
  return Task(name, "sparse", ("text_a", "text_b"), (), METRICS + ("query_active_dims", "document_active_dims"),
              "ndcg@10", options=options(config) if config is not None else ())


def options(config) -> tuple:
  """The task's options from the config's `sparse` section; a SparseEncoder folder init gives its pooling and
  activation unless `sparse.pooling` / `sparse.activation` are set."""
  s = config.sparse
  pooling, activation, side = "max", "relu", "mlm"
  init_static = False
  if config.init and sparse.is_folder(config.init):
    _, pooling, activation = sparse.read_folder(config.init)
    init_static = sparse.read_static_query(config.init) is not None
    side = "static" if init_static else side
  side = s.query_side or side
  if side not in ("mlm", "static") or s.static_lr_ratio <= 0:
    raise errors.ConfigError(f"sparse.query_side {s.query_side!r}: mlm or static (\"\": the init's); "
                             f"sparse.static_lr_ratio {s.static_lr_ratio} must be > 0")
  pooling, activation = s.pooling or pooling, s.activation or activation
  if pooling not in sparse.POOLINGS or activation not in sparse.ACTIVATIONS:
    raise errors.ConfigError(f"sparse.pooling {pooling!r} / sparse.activation {activation!r}: choose from "
                             f"{list(sparse.POOLINGS)} / {list(sparse.ACTIVATIONS)}")
  if s.document_regularizer_weight < 0 or (s.query_regularizer_weight < 0 and s.query_regularizer_weight != -1):
    raise errors.ConfigError(f"sparse.document_regularizer_weight {s.document_regularizer_weight} and "
                             f"query_regularizer_weight {s.query_regularizer_weight} must be >= 0 (the query's -1: "
                             "no query regulariser)")
  if not 0 < s.regularizer_warmup <= 1 or s.max_active_dims < 0 or s.scale <= 0:
    raise errors.ConfigError(f"sparse.regularizer_warmup {s.regularizer_warmup} must be in (0, 1], max_active_dims "
                             f"{s.max_active_dims} >= 0 and scale {s.scale} > 0")
  query_weight = None if s.query_regularizer_weight == -1 else float(s.query_regularizer_weight)
  return (("pooling", pooling), ("activation", activation), ("scale", float(s.scale)),
          ("document_regularizer_weight", float(s.document_regularizer_weight)),
          ("query_regularizer_weight", query_weight), ("regularizer_warmup", float(s.regularizer_warmup)),
          ("max_active_dims", int(s.max_active_dims)),
          ("static_query", float(s.static_lr_ratio) if side == "static" else 0.0),
          # the documents whose IDF starts the static query weights when the init has none
          ("idf_source", json.dumps([config.data.train_file, config.data.text_a_column, config.data.text_b_column,
                                     [c for c in config.embedding.negative_columns if c]])
           if side == "static" and not init_static else "")) + distill.options("sparse", s.loss, s.temperature)


class Sparse(Contrastive):
  """Reads and featurises as `pairs` (anchor, positive[, negatives]); the model is the MLM model with SPLADE
  pooling (`sparse.SparseModel`)."""
  name = "sparse"
  hf_head = "pretraining"

  def weights(self, task, path, overrides):
    """An MLM model (HF folder, pre-training workdir) or a SparseEncoder folder's; the NSP head and pooler left
    out (no term vector reads them)."""
    folder = sparse.read_folder(path)[0] if sparse.is_folder(path) else path
    w = weights_lib.load(folder, overrides=overrides, head="pretraining")
    if "mlm_bias" not in w.params:
      raise errors.ConfigError(f"{path}: no MLM head; a sparse encoder scores the vocabulary with one (start from "
                               "an MLM model: BertForMaskedLM, a pre-training workdir, a SparseEncoder folder)")
    params = {k: v for k, v in w.params.items() if k != "nsp"}
    params["bert"] = {k: v for k, v in params["bert"].items() if k != "pooler"}
    ratio = task.option("static_query") or 0.0
    if not ratio:
      params.pop("static_query", None)
    elif "static_query" not in params:
      static = sparse.read_static_query(path) if sparse.is_folder(path) else None
      if static is not None:
        weights = static[0]
      else:
        tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
        weights = idf(tok, task.option("idf_source"))
      if len(weights) > w.cfg.vocab_size:
        raise errors.ConfigError(f"{path}: {len(weights)} static query weights for a vocabulary of "
                                 f"{w.cfg.vocab_size}")
      params["static_query"] = np.pad(weights, (0, w.cfg.vocab_size - len(weights))) / ratio
    return w.cfg.replace(nsp_head=False), params, w.tokenizer, w.do_lower_case

  def head(self, task, cfg):
    return sparse.SparseModel(cfg.replace(nsp_head=False), pooling=task.option("pooling", "max"),
                              activation=task.option("activation", "relu"),
                              static_query=task.option("static_query") or 0.0)

  def load(self, task, config, tok):
    if config.embedding.cache_chunk:
      raise errors.ConfigError("task sparse does not take embedding.cache_chunk (gradient caching is task pairs')")
    return super().load(task, config, tok)

  def loss(self, task, out, batch, step=None, total_steps=None):
    q, d, w = out["embedding"], out["doc_embedding"], batch["example_weights"]
    if q.ndim == 3:  # packed rows: [rows, slots, ...] -> one example per slot (empty slots weighted 0)
      q, d, w = q.reshape(-1, q.shape[-1]), d.reshape((-1,) + d.shape[2:]), w.reshape(-1)
    docs = d.transpose(1, 0, 2).reshape(-1, d.shape[-1])  # positives first, then each block of negatives
    ramp = 1.0 if step is None else sparse.regularizer_ramp(step, total_steps, task.option("regularizer_warmup"))
    query_weight = task.option("query_regularizer_weight")
    if task.option("loss"):  # SpladeLoss over SparseMarginMSELoss / SparseDistillKLDivLoss
      base = distill.loss(task.option("loss"), distill.pairwise_dot(q, d), batch["teacher_scores"],
                          task.option("temperature", 2.0), w)
      doc_w = jnp.tile(w, docs.shape[0] // q.shape[0])
      out = base + ramp * task.option("document_regularizer_weight") * sparse.flops(docs, doc_w)
      return out if query_weight is None else out + ramp * query_weight * sparse.flops(q, w)
    parts = sparse.splade_loss(q, docs, ramp * task.option("document_regularizer_weight"),
                               None if query_weight is None else ramp * query_weight, task.option("scale", 1.0),
                               weights=w)
    return parts["loss"]

  def value_and_grad(self, task, module, params, batch, rngs, step=None, total_steps=None, accum=1):
    del accum  # refused above 1 (`accumulates`)
    def loss_fn(p):
      out = module.apply({"params": p}, batch, deterministic=False, rngs=rngs)
      return self.loss(task, out, batch, step, total_steps)
    return jax.value_and_grad(loss_fn)(params)

  def score(self, task, ev, preds, config):
    q, d = preds["embedding"], preds["doc_embedding"]
    k = task.option("max_active_dims") or None
    rows = ev.meta["rows"]
    vectors, index = corpus_vectors(rows, ev.meta["corpus"], d)
    q, vectors = sparse.top_k(np.asarray(q, np.float32), k), sparse.top_k(vectors, k)
    sims = q @ vectors.T
    run = {f"q{i}": {f"d{j}": float(s) for j, s in enumerate(row)} for i, row in enumerate(sims)}
    qrels = {f"q{i}": {f"d{index[row['docs'][0]]}": 1} for i, row in enumerate(rows)}
    out = retrieval.evaluate_run(run, qrels, METRICS)
    out["query_active_dims"] = float(np.mean(sparse.active_dims(q)))
    out["document_active_dims"] = float(np.mean(sparse.active_dims(vectors)))
    return out

  def export(self, task, module, params, out, meta):
    """A sentence-transformers SparseEncoder folder: the family's MLM model and its SpladePooling (an
    inference-free run: a Router with its static query weights)."""
    ratio = task.option("static_query") or 0.0
    static = np.asarray(params["static_query"], np.float32) * ratio if ratio else None
    sparse.write_folder(module.cfg, params, out, meta["max_seq_length"], task.option("pooling", "max"),
                        task.option("activation", "relu"), query_weights=static)
    return "SparseEncoder"

  def tokenizer_folders(self, task):
    return (sparse.DOCUMENT_DIR, sparse.QUERY_DIR) if task.option("static_query") else ("",)

  def predict_text(self, task, module, params, tok, seq, text="", top=20, **_):
    """The text's largest terms: {"terms": {piece: weight}} (at most `top`), and how many are non-zero."""
    ids = task_data.encode_pairs([{"text_a": text, "text_b": "", "label": 0}], tok, seq)
    out = module.apply({"params": params}, {"input_ids": ids["input_ids"], "input_mask": ids["input_mask"],
                                            "segment_ids": np.zeros_like(ids["input_ids"])})
    v = np.asarray(out["embedding"][0])
    best = [int(i) for i in np.argsort(-v)[:top] if v[i] > 0]
    return {"terms": {tok.id_to_token(i) if i < tok.vocab_size else f"[{i}]": round(float(v[i]), 6) for i in best},
            "active_dims": int(np.count_nonzero(v))}


def idf(tok, source) -> np.ndarray:
  """[vocabulary] log((N + 1) / (df + 1)) over the N distinct documents (positives and negatives) of the
  training file `source` = JSON [file, anchor column, positive column, negative columns]: a term in every
  document weighs 0, one in none log(N + 1)."""
  path, a, b, negatives = json.loads(source)
  seen, df = set(), np.zeros(tok.vocab_size, np.float64)  # documents by a 16-byte digest: not their texts
  for r in iter_pairs(path, a, b, tuple(negatives)):
    for text in r["docs"]:
      key = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
      if key not in seen:
        seen.add(key)
        df[np.unique(np.asarray(tok.encode(text), np.int64))] += 1
  if not seen:
    raise task_data.TaskDataError(f"{path}: no rows")
  return np.log((len(seen) + 1) / (df + 1)).astype(np.float32)


KINDS = {"sparse": Sparse()}
