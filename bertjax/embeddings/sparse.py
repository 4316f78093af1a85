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
import json
import os
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert import weights
from bertjax.convert.table import ConversionError
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import losses
from bertjax.embeddings.encoder import _max_seq_length, batch_of, token_rows
from bertjax.embeddings.model import pool_segments
from bertjax.model.heads import BertForPreTraining

POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
_TRANSFORMERS = ("Transformer", "MLMTransformer")


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


ROUTER = "sentence_transformers.base.modules.router.Router"
_TYPES = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
          "SpladePooling": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
          "SparseStaticEmbedding": "sentence_transformers.sparse_encoder.modules.sparse_static_embedding."
                                   "SparseStaticEmbedding"}
QUERY_DIR, DOCUMENT_DIR = "query_0_SparseStaticEmbedding", "document_0_Transformer"
POOLING_DIR = "document_1_SpladePooling"


def write_folder(cfg: model_lib.BertConfig, params, out: str, max_seq_length: int, pooling: str = "max",
                 activation: str = "relu", query_weights: np.ndarray | None = None) -> tuple[str, ...]:
  """A sentence-transformers SparseEncoder folder: the family's MLM model (a fill-mask Transformer) and its
  SpladePooling; with `query_weights` an inference-free one, a Router whose query route is a
  SparseStaticEmbedding of those weights and whose document route is the MLM model and pooling. Returns the
  sub-folders that take the tokenizer's files (the caller's)."""
  doc = out if query_weights is None else os.path.join(out, DOCUMENT_DIR)
  pool_dir = "1_SpladePooling" if query_weights is None else POOLING_DIR
  os.makedirs(doc, exist_ok=True)
  convert.to_hf(cfg.replace(nsp_head=False), {k: v for k, v in params.items() if k not in ("nsp", "static_query")},
                doc, head="pretraining")
  os.makedirs(os.path.join(out, pool_dir), exist_ok=True)
  transformer = {"max_seq_length": max_seq_length, "do_lower_case": False, "transformer_task": "fill-mask",
                 "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                 "module_output_name": "token_embeddings"}
  documents = {
      "sentence_bert_config.json" if query_weights is None else f"{DOCUMENT_DIR}/sentence_bert_config.json":
          transformer,
      "config_sentence_transformers.json": {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
                                            "default_prompt_name": None, "similarity_fn_name": "dot"},
      f"{pool_dir}/config.json": {"pooling_strategy": pooling, "activation_function": activation,
                                  "embedding_dimension": None}}
  if query_weights is None:
    documents["modules.json"] = [{"idx": 0, "name": "0", "path": "", "type": _TYPES["Transformer"]},
                                 {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": _TYPES["SpladePooling"]}]
    subs: tuple[str, ...] = ("",)
  else:
    os.makedirs(os.path.join(out, QUERY_DIR), exist_ok=True)
    safetensors.numpy.save_file({"weight": np.asarray(query_weights, np.float32)},
                                os.path.join(out, QUERY_DIR, "model.safetensors"))
    documents["modules.json"] = [{"idx": 0, "name": "0", "path": "", "type": ROUTER}]
    documents["router_config.json"] = {
        "types": {QUERY_DIR: _TYPES["SparseStaticEmbedding"], DOCUMENT_DIR: _TYPES["Transformer"],
                  POOLING_DIR: _TYPES["SpladePooling"]},
        "structure": {"query": [QUERY_DIR], "document": [DOCUMENT_DIR, POOLING_DIR]},
        "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}}
    documents[f"{QUERY_DIR}/config.json"] = {"frozen": False}
    subs = (DOCUMENT_DIR, QUERY_DIR)
  for name, content in documents.items():
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2)
  return subs


def top_k(vectors: np.ndarray, k: int | None) -> np.ndarray:
  """Each row's k largest terms kept, the rest 0 (sentence-transformers' max_active_dims)."""
  if not k or k >= vectors.shape[1]:
    return vectors
  keep = np.argpartition(-vectors, k - 1, axis=1)[:, :k]
  out = np.zeros_like(vectors)
  np.put_along_axis(out, keep, np.take_along_axis(vectors, keep, axis=1), axis=1)
  return out


def active_dims(vectors: np.ndarray) -> np.ndarray:
  """Non-zero terms per vector."""
  return np.count_nonzero(vectors, axis=1)


def _modules(path: str) -> list:
  try:
    with open(os.path.join(path, "modules.json"), encoding="utf-8") as f:
      stack = json.load(f)
    [m.get("type", "") for m in stack]
    return stack
  except (OSError, ValueError, AttributeError, TypeError) as e:
    raise ConversionError(f"{path}/modules.json: not a list of modules ({str(e).splitlines()[0][:200]})") from None


def _router(path: str) -> dict | None:
  """The routes of a folder whose stack is one Router ({"query": [sub-folders], "document": [...]} and the
  sub-folders' module kinds), or None for a plain stack."""
  stack = _modules(path)
  if len(stack) != 1 or not stack[0].get("type", "").endswith(".Router"):
    return None
  try:
    with open(os.path.join(path, "router_config.json"), encoding="utf-8") as f:
      conf = json.load(f)
    kinds = {name: t.rsplit(".", 1)[-1] for name, t in conf["types"].items()}
    routes = {route: list(conf["structure"][route]) for route in ("query", "document")}
  except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
    raise ConversionError(f"{path}/router_config.json: not a Router's types and query / document structure "
                          f"({str(e).splitlines()[0][:200]})") from None
  return {"routes": routes, "kinds": kinds}


def is_folder(path: str) -> bool:
  """Whether `path` is a sentence-transformers folder whose stack (or a Router's) has a SpladePooling module."""
  for name in ("modules.json", "router_config.json"):
    try:
      with open(os.path.join(path, name), encoding="utf-8") as f:
        if "SpladePooling" in f.read():
          return True
    except OSError:
      pass
  return False


def read_folder(path: str) -> tuple[str, str, str]:
  """(transformer sub-folder, pooling, activation) of a sentence-transformers SparseEncoder folder, or of an
  inference-free one's document route; a stack that is not a Transformer then SpladePooling (or a Router with a
  SparseStaticEmbedding query route) is a one-line error naming its modules."""
  router = _router(path)
  if router is None:
    stack = _modules(path)
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
    subs = [m.get("path", "") for m in stack]
  else:
    subs = router["routes"]["document"]
    kinds = [router["kinds"].get(n, "?") for n in subs]
    query = [router["kinds"].get(n, "?") for n in router["routes"]["query"]]
    if query != ["SparseStaticEmbedding"] and query != kinds:
      raise ConversionError(f"{path}: a Router whose query route is {query}; bertjax reads a SparseStaticEmbedding "
                            "(inference-free) or the document route's modules")
  if len(kinds) != 2 or kinds[0] not in _TRANSFORMERS or kinds[1] != "SpladePooling":
    raise ConversionError(f"{path}: modules {kinds} are not a sparse encoder's Transformer, SpladePooling")
  sub = os.path.join(path, subs[1])
  try:
    with open(os.path.join(sub, "config.json"), encoding="utf-8") as f:
      conf = json.load(f)
  except (OSError, ValueError) as e:
    raise ConversionError(f"{sub}/config.json: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  pooling, activation = conf.get("pooling_strategy", "max"), conf.get("activation_function", "relu")
  if pooling not in POOLINGS or activation not in ACTIVATIONS:
    raise ConversionError(f"{sub}/config.json: SpladePooling {pooling!r}, {activation!r}; bertjax computes "
                          f"pooling {POOLINGS} with activation {ACTIVATIONS}")
  return os.path.join(path, subs[0]), pooling, activation


def read_static_query(path: str) -> tuple[np.ndarray, int | None] | None:
  """(weights [vocabulary], the query length limit or None) of an inference-free folder's SparseStaticEmbedding,
  or None when the folder encodes queries with its MLM model."""
  router = _router(path)
  if router is None or [router["kinds"].get(n) for n in router["routes"]["query"]] != ["SparseStaticEmbedding"]:
    return None
  sub = os.path.join(path, router["routes"]["query"][0])
  try:
    weight = safetensors.numpy.load_file(os.path.join(sub, "model.safetensors"))["weight"]
  except (OSError, KeyError, ValueError) as e:
    raise ConversionError(f"{sub}/model.safetensors: no SparseStaticEmbedding weight "
                          f"({str(e).splitlines()[0][:200]})") from None
  limit = None
  try:
    with open(os.path.join(sub, "tokenizer_config.json"), encoding="utf-8") as f:
      m = json.load(f).get("model_max_length")
    limit = int(m) if isinstance(m, (int, float)) and m < 1e9 else None
  except (OSError, ValueError):
    pass
  return np.asarray(weight, np.float32).reshape(-1), limit


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

  @classmethod
  def load(cls, path: str, max_seq_length: int = 0, pooling: str = "max", activation: str = "relu",
           max_active_dims: int | None = None, **overrides) -> "SparseEncoder":
    """A SparseEncoder folder (its pooling, activation and max_seq_length), a bertjax `task=sparse` workdir (its
    best parameters and settings), or any folder holding an MLM model (HF, bertjax pre-training workdir) with the
    `pooling` and `activation` given."""
    folder, static, query_limit = path, None, None
    if os.path.isfile(os.path.join(path, "modules.json")):
      folder, pooling, activation = read_folder(path)
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
      found = read_static_query(path)
      if found is not None:
        static, query_limit = found
    elif weights.source_of(path) == "finetuned":
      meta = weights.finetune_meta(path)
      if meta.get("kind") != "sparse":
        raise ConversionError(f"{path}: a {meta.get('kind')!r} fine-tuning run, not a sparse encoder's (task=sparse)")
      opts = meta.get("task_options", {})
      pooling, activation = opts.get("pooling", pooling), opts.get("activation", activation)
      max_seq_length = max_seq_length or int(meta.get("max_seq_length", 0))
    w = weights.load(folder, overrides=overrides, head="pretraining")
    if "static_query" in w.params:  # a task=sparse run with inference-free queries: the weights stored scaled
      ratio = float(weights.finetune_meta(path).get("task_options", {}).get("static_query") or 1.0)
      static = np.asarray(w.params["static_query"], np.float32) * ratio
    if "mlm_bias" not in w.params:
      raise ConversionError(f"{folder}: no MLM head; a sparse encoder scores the vocabulary with one")
    if not w.tokenizer:
      raise ConversionError(f"{folder}: no tokenizer files (vocab.txt, vocab.json + merges.txt, tokenizer.json)")
    tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
    params = {k: v for k, v in w.params.items() if k != "nsp"}
    params["bert"] = {k: v for k, v in params["bert"].items() if k != "pooler"}  # no NSP head reads it
    params.pop("static_query", None)
    limit = w.cfg.max_length
    if static is not None:
      if len(static) > w.cfg.vocab_size:
        raise ConversionError(f"{path}: {len(static)} static query weights for a vocabulary of {w.cfg.vocab_size}")
      static = np.pad(static, (0, w.cfg.vocab_size - len(static)))
    return cls(w.cfg.replace(nsp_head=False), params, tok, min(max_seq_length or limit, limit), pooling, activation,
               max_active_dims, static, query_limit)

  @classmethod
  def is_model(cls, path: str) -> bool:
    """Whether `path` is a SparseEncoder folder or a bertjax `task=sparse` workdir."""
    if is_folder(path):
      return True
    if not os.path.isfile(os.path.join(path, "finetune.json")):
      return False
    return weights.finetune_meta(path).get("kind") == "sparse"

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
  def _apply(self):
    module = SparseModel(self.cfg, pooling=self.pooling, activation=self.activation)
    return jax.jit(lambda params, batch: module.apply({"params": params}, batch, method=SparseModel.terms))

  def encode(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None) -> np.ndarray:
    """[len(texts), dims] term weights, longest texts batched together, in the order given; at most
    `max_active_dims` (else the encoder's own) non-zero terms each."""
    if not len(texts):
      return np.zeros((0, self.dims), np.float32)
    rows = token_rows(self.tok, texts, self.max_seq_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    out = np.zeros((len(texts), self.dims), np.float32)
    for i in range(0, len(texts), batch_size):
      idx = order[i:i + batch_size]
      batch = batch_of([rows[j] for j in idx], self.tok.pad_id, self.max_seq_length, rows=batch_size, multiple=8)
      out[idx] = np.asarray(self._apply(self.params, batch))[:len(idx)]
    return top_k(out, max_active_dims or self.max_active_dims)

  def encode_query(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None
                   ) -> np.ndarray:
    """Queries' term weights: an inference-free encoder's static weights at the terms each query's tokens hold
    (no special tokens, as its SparseStaticEmbedding tokenises), else `encode`."""
    if self.query_weights is None:
      return self.encode(texts, batch_size, max_active_dims)
    out = np.zeros((len(texts), self.dims), np.float32)
    for i, text in enumerate(texts):
      ids = np.asarray(self.tok.encode(text)[:self.query_max_length], np.int64)
      out[i, ids] = self.query_weights[ids]
    return top_k(out, max_active_dims or self.max_active_dims)
