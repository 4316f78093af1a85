"""Sparse lexical encoders (SPLADE): a text is a vector over the vocabulary, each term's weight
max (or sum) over the text's tokens of log(1 + ReLU(MLM logit)), so most terms are exactly 0.

    enc = sparse.SparseEncoder.load("splade-folder")     # sentence-transformers SparseEncoder folder, or an MLM
    vectors = enc.encode(["a query"], max_active_dims=64)  # [1, V] float32, at most 64 non-zero terms
    sparse.active_dims(vectors)                          # non-zero terms per vector

A sentence-transformers `SparseEncoder` folder is a fill-mask Transformer (or the older MLMTransformer) followed by
SpladePooling (`pooling_strategy` max | sum, `activation_function` relu | log1p_relu); `encode` follows its
`encode`: [CLS] text [SEP] cut at max_seq_length, the logits of padding positions zeroed before the activation,
and `max_active_dims` keeping each vector's largest terms. `splade_loss` is its SpladeLoss over
SparseMultipleNegativesRankingLoss: in-batch InfoNCE on dot products plus FLOPS regularisers (the squared mean
weight of each term, summed) on the documents and, weighted apart, the queries.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert import weights
from bertjax.convert.table import ConversionError
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import buckets, losses
from bertjax.embeddings import folders as st_lib
from bertjax.embeddings.dense.encoder import _max_seq_length, batch_of, finetune_kind, model_path, token_rows
from bertjax.embeddings.model import pool_segments
from bertjax.embeddings.sparse.folders import (  # noqa: F401  (the folder layer, read and written here too)
  ACTIVATIONS,
  DOCUMENT_DIR,
  POOLINGS,
  QUERY_DIR,
  is_folder,
  read_folder,
  read_static_query,
  write_folder,
)
from bertjax.model.heads import BertForPreTraining

BLOCK = 2048  # documents embedded at a time: each vector spans the vocabulary (30522 float32 terms)


def activate(logits, mask, activation: str = "relu"):
  """log(1 + ReLU(logits)) at the real tokens (0 at padding); log1p_relu takes log(1 + ·) once more."""
  x = jnp.log1p(jax.nn.relu(logits * mask[..., None].astype(logits.dtype)))
  return jnp.log1p(x) if activation == "log1p_relu" else x


def splade_pool(logits, mask, pooling: str = "max", activation: str = "relu"):
  """[B, V] term weights from MLM logits [B, L, V] and the token mask [B, L]."""
  x = activate(logits, mask, activation)
  return x.max(axis=1) if pooling == "max" else x.sum(axis=1)


def flops(embeddings, weights=None):
  """Σ_j (mean_i w_ij)²: the FLOPS regulariser over the batch's real rows (`weights` [N], 0 for padding)."""
  if weights is None:
    return jnp.sum(jnp.mean(embeddings, axis=0) ** 2)
  w = weights.astype(embeddings.dtype)
  mean = jnp.sum(embeddings * w[:, None], axis=0) / jnp.maximum(jnp.sum(w), 1.0)
  return jnp.sum(mean ** 2)


def splade_loss(queries, documents, document_weight: float, query_weight: float | None = None, scale: float = 1.0,
                weights=None) -> dict:
  """sentence-transformers' SpladeLoss(SparseMultipleNegativesRankingLoss(scale)): `queries` [B, V], `documents`
  [B·(1+n), V] (positives, then blocks of hard negatives). Returns its parts and their sum ("loss")."""
  b = queries.shape[0]
  parts = {"base_loss": losses.ranking_loss(queries, documents, scale=scale, weights=weights, similarity="dot")}
  doc_w = None if weights is None else jnp.tile(weights, documents.shape[0] // b)
  parts["document_regularizer_loss"] = document_weight * flops(documents, doc_w)
  if query_weight is not None:
    parts["query_regularizer_loss"] = query_weight * flops(queries, weights)
  parts["loss"] = sum(parts.values())
  return parts


def regularizer_ramp(step, total_steps: int, warmup_ratio: float = 1 / 3):
  """The regularisers' weight factor at `step` (0-based, a traced value inside the train step): (step / W)² below
  W = int(total_steps · warmup_ratio) (at least 1), then 1, as sentence-transformers'
  SpladeRegularizerWeightSchedulerCallback (quadratic) sets it at the start of each step."""
  warmup = max(int(total_steps * warmup_ratio), 1)
  ratio = jnp.asarray(step, jnp.float32) / warmup
  return jnp.where(ratio < 1.0, ratio * ratio, 1.0)


class SparseModel(BertForPreTraining):
  """{"embedding": [B, V]} term weights (`splade_pool` of the MLM logits at every position) of a batch of texts;
  with `doc_input_ids` / `doc_input_mask` [B, K, L] also {"doc_embedding": [B, K, V]}. The parameters are the
  pre-training module's (encoder + MLM head, no NSP), so any MLM checkpoint is a start and the result exports as
  the family's MLM model."""
  pooling: str = "max"
  activation: str = "relu"
  # > 0: inference-free queries (sentence-transformers' SparseStaticEmbedding): a query's vector is a learned
  # weight per vocabulary term at the terms its tokens hold, no encoder pass. The weights are stored divided by
  # this factor, so that Adam moves them this many times faster than the encoder (its learning_rate_mapping).
  static_query: float = 0.0

  def setup(self):
    super().setup()
    if self.static_query:
      self.query_terms = self.param(
          "static_query", nn.with_logical_partitioning(nn.initializers.constant(1.0 / self.static_query),
                                                       ("vocab",)), (self.cfg.vocab_size,), jnp.float32)

  def static_terms(self, ids, segments, num: int):
    """[B, num, V]: each text's static query vector from the token ids of rows whose texts are numbered by
    `segments` 1..num (0: padding); a text's first and last token ([CLS], [SEP]) are left out, as the static
    module reads a query without special tokens."""
    b = ids.shape[0]
    zero = jnp.zeros((b, 1), segments.dtype)
    prev, nxt = jnp.concatenate([zero, segments[:, :-1]], 1), jnp.concatenate([segments[:, 1:], zero], 1)
    keep = ((segments > 0) & (prev == segments) & (nxt == segments)).astype(jnp.float32)
    presence = jnp.zeros((b, num + 1, self.cfg.vocab_size), jnp.float32).at[
        jnp.arange(b)[:, None], segments, ids].max(keep)
    return presence[:, 1:] * (self.static_query * self.query_terms)

  def logits(self, batch, deterministic: bool):
    n = batch["input_ids"].shape[1]
    positions = jnp.broadcast_to(jnp.arange(n), batch["input_ids"].shape)
    out = BertForPreTraining.__call__(self, {**batch, "masked_lm_positions": positions}, deterministic)
    return out["mlm_logits"].astype(jnp.float32)

  def terms(self, batch, deterministic: bool = True):
    return splade_pool(self.logits(batch, deterministic), batch["input_mask"], self.pooling, self.activation)

  def packed(self, batch, deterministic: bool):
    """Packed rows (`packing.pack_contrastive`): each text's term vector pooled over its own attention segment
    (max or sum of the activated logits), then laid out per example slot as the dense model's packed path does."""
    keys = ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids")
    x = activate(self.logits({n: batch[n] for n in keys}, deterministic), batch["input_mask"], self.activation)
    b, k, t = batch["text_segments"].shape
    texts = pool_segments(x, batch["attention_segment_ids"], None, self.pooling, k * t)
    where = jnp.maximum(batch["text_segments"].reshape(b, k * t) - 1, 0)  # an empty slot reads segment 1, weight 0
    v = jnp.take_along_axis(texts, where[..., None], axis=1).reshape(b, k, t, -1)
    out = {"embedding": v[:, :, 0], "doc_embedding": v[:, :, 1:]}
    if self.static_query:
      static = self.static_terms(batch["input_ids"], batch["attention_segment_ids"], k * t)
      out["embedding"] = jnp.take_along_axis(static, where.reshape(b, k, t)[:, :, :1], axis=1)
    return out

  def __call__(self, batch, deterministic: bool = True):
    if "text_segments" in batch:
      return self.packed(batch, deterministic)
    if self.static_query:
      out = {"embedding": self.static_terms(batch["input_ids"], batch["input_mask"], 1)[:, 0]}
    else:
      out = {"embedding": self.terms({k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")},
                                     deterministic)}
    if "doc_input_ids" in batch:
      b, k, length = batch["doc_input_ids"].shape
      docs = {"input_ids": batch["doc_input_ids"].reshape(b * k, length),
              "input_mask": batch["doc_input_mask"].reshape(b * k, length),
              "segment_ids": jnp.zeros((b * k, length), jnp.int32)}
      out["doc_embedding"] = self.terms(docs, deterministic).reshape(b, k, -1)
    return out


def top_k(vectors: np.ndarray, k: int | None) -> np.ndarray:
  """Each row's k largest terms kept, the rest 0 (sentence-transformers' max_active_dims)."""
  if not k or k >= vectors.shape[1]:
    return vectors
  keep = np.argpartition(-vectors, k - 1, axis=1)[:, :k]
  out = np.zeros_like(vectors)
  np.put_along_axis(out, keep, np.take_along_axis(vectors, keep, axis=1), axis=1)
  return out


def _active_dims(path: str, value) -> int | None:
  """A model's own max_active_dims (config_sentence_transformers.json, a task=sparse run's option): a positive
  integer or None."""
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ConversionError(f"{path}: max_active_dims {value!r} is not a positive integer")
  return value


def _mlm_weights(folder: str, overrides: dict) -> weights.Weights:
  """`weights.load(folder, head="pretraining")` of the HF MLM model in a SparseEncoder folder's transformer
  sub-folder (which may be the folder itself, with its modules.json): read as an HF folder whatever the stack's
  first module is called (Transformer, MLMTransformer)."""
  meta, state = convert.read_hf_dir(folder)
  cfg = convert.config_from_hf(meta, **overrides)
  params = weights._hf_params(folder, meta, state, cfg, "pretraining", 0)
  params["bert"] = weights.to_layout(params["bert"], cfg, False)
  tok, lower = weights.hf_tokenizer(folder)
  return weights.Weights("hf", cfg, params, tok, lower, meta)


def active_dims(vectors: np.ndarray) -> np.ndarray:
  """Non-zero terms per vector."""
  return np.count_nonzero(vectors, axis=1)


@dataclasses.dataclass
class SparseEncoder:
  cfg: model_lib.BertConfig
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_seq_length: int
  pooling: str = "max"
  activation: str = "relu"
  max_active_dims: int | None = None  # keep each vector's largest terms (None: all)
  # Inference-free: a query is the weights of the terms its tokens hold (sentence-transformers'
  # SparseStaticEmbedding), cut at `query_max_length` tokens (None: whole); None: queries encode as documents.
  query_weights: np.ndarray | None = None
  query_max_length: int | None = None
  prompts: st_lib.Prompts = st_lib.Prompts()  # the folder's query / document / default prompts

  @classmethod
  def load(cls, path: str, max_seq_length: int = 0, pooling: str = "max", activation: str = "relu",
           max_active_dims: int | None = None, **overrides) -> "SparseEncoder":
    """A SparseEncoder folder (its pooling, activation, max_seq_length, max_active_dims and prompts), a bertjax
    `task=sparse` workdir (its best parameters and settings), or any folder holding an MLM model (HF, bertjax
    pre-training workdir) with the `pooling` and `activation` given. `max_active_dims` given replaces the model's
    own. A gs:// or s3:// folder is read from a local copy (`files.local_copy`)."""
    path = model_path(path)
    folder, static, query_limit, own_dims, prompts = path, None, None, None, st_lib.Prompts()
    st_folder = files.isfile(files.join(path, "modules.json"))
    if st_folder:
      folder, pooling, activation = read_folder(path)
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
      found = read_static_query(path)
      if found is not None:
        static, query_limit = found
      conf = st_lib.st_config(path)
      own_dims, prompts = _active_dims(path, conf.get("max_active_dims")), st_lib.read_prompts(path, conf)
    elif weights.source_of(path) == "finetuned":
      meta = weights.finetune_meta(path)
      if meta.get("kind") != "sparse":
        raise ConversionError(f"{path}: a {meta.get('kind')!r} fine-tuning run, not a sparse encoder's (task=sparse)")
      opts = meta.get("task_options", {})
      pooling, activation = opts.get("pooling", pooling), opts.get("activation", activation)
      max_seq_length = max_seq_length or int(meta.get("max_seq_length", 0))
    # A folder's MLM model is read from its own sub-folder: weights.load takes a folder with modules.json for a
    # stack whose first module is a Transformer, and a SparseEncoder's may be the older MLMTransformer.
    w = _mlm_weights(folder, overrides) if st_folder else weights.load(folder, overrides=overrides, head="pretraining")
    if "static_query" in w.params:  # a task=sparse run with inference-free queries: the weights stored scaled
      ratio = float(weights.finetune_meta(path).get("task_options", {}).get("static_query") or 1.0)
      static = np.asarray(w.params["static_query"], np.float32) * ratio
    if "mlm_bias" not in w.params:
      raise ConversionError(f"{folder}: no MLM head; a sparse encoder scores the vocabulary with one")
    if not w.tokenizer:
      raise ConversionError(f"{folder}: no tokenizer files (vocab.txt, vocab.json + merges.txt, tokenizer.json)")
    tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
    if st_folder and st_lib.transformer_lowercases(folder):  # sentence_bert_config.json's do_lower_case
      tok = st_lib.lowercased(tok)
    params = {k: v for k, v in w.params.items() if k != "nsp"}
    params["bert"] = {k: v for k, v in params["bert"].items() if k != "pooler"}  # no NSP head reads it
    params.pop("static_query", None)
    limit = w.cfg.max_length
    if static is not None:
      if len(static) > w.cfg.vocab_size:
        raise ConversionError(f"{path}: {len(static)} static query weights for a vocabulary of {w.cfg.vocab_size}")
      static = np.pad(static, (0, w.cfg.vocab_size - len(static)))
    return cls(w.cfg.replace(nsp_head=False), params, tok, min(max_seq_length or limit, limit), pooling, activation,
               max_active_dims or own_dims, static, query_limit, prompts)

  @classmethod
  def is_model(cls, path: str) -> bool:
    """Whether `path` is a SparseEncoder folder or a bertjax `task=sparse` workdir."""
    if is_folder(path):
      return True
    return finetune_kind(path) == "sparse"

  @functools.cached_property
  def fingerprint(self) -> str:
    """A digest of the weights and settings: what decides the term vectors."""
    h = hashlib.sha256(repr(("sparse", self.cfg, self.max_seq_length, self.pooling, self.activation,
                             self.max_active_dims, self.query_max_length)).encode())
    if self.query_weights is not None:
      h.update(np.ascontiguousarray(self.query_weights).tobytes())
    for leaf in jax.tree_util.tree_leaves(self.params):
      h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()

  @property
  def dims(self) -> int:
    """Terms per vector: the MLM head's output width (sentence-transformers' embedding dimension)."""
    return self.cfg.vocab_size

  @functools.cached_property
  def lengths(self) -> buckets.Lengths:
    """The padded lengths compiled so far, shared by queries and documents."""
    return buckets.Lengths(self.max_seq_length)

  @functools.cached_property
  def _apply(self):
    module = SparseModel(self.cfg, pooling=self.pooling, activation=self.activation)
    return jax.jit(lambda params, batch: module.apply({"params": params}, batch, method=SparseModel.terms))

  def encode(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None,
             prompt: str | None = None) -> np.ndarray:
    """[len(texts), dims] term weights, longest texts batched together, in the order given; at most
    `max_active_dims` (else the encoder's own) non-zero terms each; `prompt` (else the folder's default prompt)
    put before each text."""
    if not len(texts):
      return np.zeros((0, self.dims), np.float32)
    prompt = self.prompts.default if prompt is None else prompt
    rows = token_rows(self.tok, [prompt + t for t in texts] if prompt else texts, self.max_seq_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    out = np.zeros((len(texts), self.dims), np.float32)
    for start, stop, width, n in self.lengths.batches([len(rows[j]) for j in order], batch_size):
      idx = order[start:stop]
      batch = batch_of([rows[j] for j in idx], self.tok.pad_id, width, rows=n, length=width)
      out[idx] = np.asarray(self._apply(self.params, batch))[:len(idx)]
    return top_k(out, max_active_dims or self.max_active_dims)

  def encode_document(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None,
                      prompt: str | None = None) -> np.ndarray:
    """`encode` with the folder's document prompt (sentence-transformers' encode_document), or `prompt`."""
    return self.encode(texts, batch_size, max_active_dims, self.prompts.document if prompt is None else prompt)

  def encode_query(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None,
                   prompt: str | None = None) -> np.ndarray:
    """Queries' term weights, the folder's query prompt (or `prompt`) before each: an inference-free encoder's
    static weights at the terms each query's tokens hold (no special tokens, as its SparseStaticEmbedding
    tokenises), else `encode`."""
    prompt = self.prompts.query if prompt is None else prompt
    if self.query_weights is None:
      return self.encode(texts, batch_size, max_active_dims, prompt)
    out = np.zeros((len(texts), self.dims), np.float32)
    for i, text in enumerate(texts):
      ids = np.asarray(self.tok.encode(prompt + text)[:self.query_max_length], np.int64)
      out[i, ids] = self.query_weights[ids]
    return top_k(out, max_active_dims or self.max_active_dims)
