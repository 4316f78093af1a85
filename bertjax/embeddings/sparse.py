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
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import model as model_lib
from bertjax.convert import weights
from bertjax.convert.table import ConversionError
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import losses
from bertjax.embeddings.encoder import _max_seq_length, batch_of, token_rows

POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
_TRANSFORMERS = ("Transformer", "MLMTransformer")


def splade_pool(logits, mask, pooling: str = "max", activation: str = "relu"):
  """[B, V] term weights from MLM logits [B, L, V] and the token mask [B, L]."""
  x = jnp.log1p(jax.nn.relu(logits * mask[..., None].astype(logits.dtype)))
  if activation == "log1p_relu":
    x = jnp.log1p(x)
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


def read_folder(path: str) -> tuple[str, str, str]:
  """(transformer sub-folder, pooling, activation) of a sentence-transformers SparseEncoder folder; a stack that
  is not a Transformer then SpladePooling is a one-line error naming its modules."""
  try:
    with open(os.path.join(path, "modules.json"), encoding="utf-8") as f:
      stack = json.load(f)
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
  except (OSError, ValueError, AttributeError, TypeError) as e:
    raise ConversionError(f"{path}/modules.json: not a list of modules ({str(e).splitlines()[0][:200]})") from None
  if len(kinds) != 2 or kinds[0] not in _TRANSFORMERS or kinds[1] != "SpladePooling":
    raise ConversionError(f"{path}: modules {kinds} are not a sparse encoder's Transformer, SpladePooling")
  sub = os.path.join(path, stack[1].get("path", ""))
  try:
    with open(os.path.join(sub, "config.json"), encoding="utf-8") as f:
      conf = json.load(f)
  except (OSError, ValueError) as e:
    raise ConversionError(f"{sub}/config.json: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  pooling, activation = conf.get("pooling_strategy", "max"), conf.get("activation_function", "relu")
  if pooling not in POOLINGS or activation not in ACTIVATIONS:
    raise ConversionError(f"{sub}/config.json: SpladePooling {pooling!r}, {activation!r}; bertjax computes "
                          f"pooling {POOLINGS} with activation {ACTIVATIONS}")
  return os.path.join(path, stack[0].get("path", "")), pooling, activation


@dataclasses.dataclass
class SparseEncoder:
  cfg: model_lib.BertConfig
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_seq_length: int
  pooling: str = "max"
  activation: str = "relu"

  @classmethod
  def load(cls, path: str, max_seq_length: int = 0, pooling: str = "max", activation: str = "relu",
           **overrides) -> "SparseEncoder":
    """A SparseEncoder folder (its pooling, activation and max_seq_length) or any folder holding an MLM model
    (HF, bertjax pre-training workdir) with the `pooling` and `activation` given."""
    folder = path
    if os.path.isfile(os.path.join(path, "modules.json")):
      folder, pooling, activation = read_folder(path)
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
    w = weights.load(folder, overrides=overrides, head="pretraining")
    if "mlm_bias" not in w.params:
      raise ConversionError(f"{folder}: no MLM head; a sparse encoder scores the vocabulary with one")
    if not w.tokenizer:
      raise ConversionError(f"{folder}: no tokenizer files (vocab.txt, vocab.json + merges.txt, tokenizer.json)")
    tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
    cfg = w.cfg.replace(nsp_head=w.cfg.nsp_head and "nsp" in w.params)  # HF's BertForMaskedLM has no NSP head
    params = {k: v for k, v in w.params.items() if k != "nsp"}
    if not cfg.nsp_head:
      params["bert"] = {k: v for k, v in params["bert"].items() if k != "pooler"}
    limit = cfg.max_length
    return cls(cfg.replace(nsp_head=False), params, tok, min(max_seq_length or limit, limit), pooling, activation)

  @functools.cached_property
  def _apply(self):
    module = model_lib.for_pretraining(self.cfg)
    vocab = self.tok.vocab_size

    def embed(params, batch):
      n = batch["input_ids"].shape[1]
      batch = {**batch, "masked_lm_positions": jnp.broadcast_to(jnp.arange(n), batch["input_ids"].shape)}
      logits = module.apply({"params": params}, batch, deterministic=True)["mlm_logits"][..., :vocab]
      return splade_pool(logits, batch["input_mask"], self.pooling, self.activation)
    return jax.jit(embed)

  def encode(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None) -> np.ndarray:
    """[len(texts), vocab] term weights, longest texts batched together, in the order given."""
    if not len(texts):
      return np.zeros((0, self.tok.vocab_size), np.float32)
    rows = token_rows(self.tok, texts, self.max_seq_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    out = np.zeros((len(texts), self.tok.vocab_size), np.float32)
    for i in range(0, len(texts), batch_size):
      idx = order[i:i + batch_size]
      batch = batch_of([rows[j] for j in idx], self.tok.pad_id, self.max_seq_length, rows=batch_size, multiple=8)
      out[idx] = np.asarray(self._apply(self.params, batch))[:len(idx)]
    return top_k(out, max_active_dims)
