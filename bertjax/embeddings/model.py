"""Sentence embedding models: any bertjax encoder, a pooling of its last hidden states, an optional dense
projection and an optional L2 normalisation, as sentence-transformers' Transformer -> Pooling -> Dense ->
Normalize stacks compute them; Matryoshka truncation of the result."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import errors
from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertModel
from bertjax.model.layers import Dense

POOLINGS = ("cls", "mean", "max")
DENSE_ACTIVATIONS = {"identity": lambda x: x, "tanh": jnp.tanh}


@dataclasses.dataclass(frozen=True)
class Pooling:
  """How token states become one vector: `mode` (cls | mean over real tokens | max over real tokens), a dense
  projection to `dense` features (0: none; with `dense_bias` and `dense_activation`), `normalize` to unit length.
  Stored with the model (sentence-transformers folders: 1_Pooling, 2_Dense, Normalize)."""
  mode: str = "mean"
  dense: int = 0
  dense_bias: bool = True
  dense_activation: str = "identity"
  normalize: bool = True

  def __post_init__(self):
    if self.mode not in POOLINGS:
      raise errors.ConfigError(f"pooling {self.mode!r} is not one of {list(POOLINGS)}")
    if self.dense_activation not in DENSE_ACTIVATIONS:
      raise errors.ConfigError(f"dense_activation {self.dense_activation!r} is not one of {list(DENSE_ACTIVATIONS)}")
    if not isinstance(self.dense, int) or self.dense < 0:
      raise errors.ConfigError(f"pooling dense must be an integer >= 0, got {self.dense!r}")


def pool(hidden, mask, mode: str):
  """[B, d] from token states [B, L, d] and the real-token mask [B, L], in float32: [CLS]'s state, the mean of the
  real tokens' (a row without any gives zeros), or their elementwise max (padding at -1e9, as
  sentence-transformers sets it)."""
  h = hidden.astype(jnp.float32)
  m = mask.astype(jnp.float32)[..., None]
  if mode == "cls":
    return h[:, 0]
  if mode == "mean":
    return jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
  return jnp.max(jnp.where(m > 0, h, -1e9), axis=1)


def pool_segments(hidden, segments, first, mode: str, num: int):
  """[B, num, d]: `pool` of each packed text, in float32. `segments` [B, L] numbers a row's texts 1..num (0:
  padding), `first` [B, L] marks each text's first token ([CLS]; only `cls` reads it); `sum` adds a text's
  tokens; a segment with no token gives zeros."""
  b, length, d = hidden.shape
  h = hidden.astype(jnp.float32).reshape(b * length, d)
  ids = (segments.astype(jnp.int32) + (num + 1) * jnp.arange(b, dtype=jnp.int32)[:, None]).reshape(-1)
  n = b * (num + 1)
  counts = jax.ops.segment_sum(jnp.ones((b * length, 1), jnp.float32), ids, n)
  if mode == "cls":
    out = jax.ops.segment_sum(h * first.reshape(-1, 1).astype(jnp.float32), ids, n)
  elif mode == "mean":
    out = jax.ops.segment_sum(h, ids, n) / jnp.maximum(counts, 1e-9)
  elif mode == "sum":
    out = jax.ops.segment_sum(h, ids, n)
  else:
    out = jnp.where(counts > 0, jax.ops.segment_max(h, ids, n), 0.0)
  return out.reshape(b, num + 1, d)[:, 1:]


def normalize(x, eps: float = 1e-12):
  """x / max(‖x‖, eps) along the last axis (torch.nn.functional.normalize). Written as x / √max(Σx², eps²), equal
  in value, so that a zero vector (a padding row's pooled embedding) has a zero gradient rather than NaN."""
  return x / jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


def matryoshka(embeddings, dims: int):
  """The first `dims` features, renormalised to unit length (Matryoshka truncation)."""
  return normalize(embeddings[..., :dims])


class EmbeddingModel(nn.Module):
  """{"embedding": [B, D] float32} of a batch of sequences (`input_ids`, `input_mask`, `segment_ids`); with
  `doc_input_ids` / `doc_input_mask` [B, K, L] (a row's positive and K - 1 hard negatives) also
  {"doc_embedding": [B, K, D]}, from the same encoder."""
  cfg: BertConfig
  pooling: Pooling = Pooling()

  def setup(self):
    self.bert = BertModel(self.cfg)
    if self.pooling.dense:
      self.dense = Dense((self.pooling.dense,), ("embed", "mlp"), self.cfg.replace(dtype="float32"),
                         use_bias=self.pooling.dense_bias)

  def embed(self, batch, deterministic: bool = True):
    out = self.bert(batch, deterministic, pool=False)
    return self.project(pool(out["hidden"], batch["input_mask"], self.pooling.mode))

  def project(self, x):
    if self.pooling.dense:
      x = DENSE_ACTIVATIONS[self.pooling.dense_activation](self.dense(x))
    return normalize(x) if self.pooling.normalize else x

  def packed(self, batch, deterministic: bool):
    """Packed rows (`tasks.contrastive.pack`): every text of a row's examples laid end to end, each its own
    attention segment; `text_segments` [B, k, T] names each example slot's anchor and documents."""
    keys = ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids")
    hidden = self.bert({n: batch[n] for n in keys}, deterministic, pool=False)["hidden"]
    b, k, t = batch["text_segments"].shape
    first = (batch["position_ids"] == 0) & (batch["input_mask"] > 0)
    texts = pool_segments(hidden, batch["attention_segment_ids"], first, self.pooling.mode, k * t)
    # Slot s's text j is segment text_segments[s, j] (1-based; 0 in an empty slot, which reads segment 1 and is
    # weighted out of the loss).
    where = jnp.maximum(batch["text_segments"].reshape(b, k * t) - 1, 0)
    x = self.project(jnp.take_along_axis(texts, where[..., None], axis=1)).astype(jnp.float32)
    x = x.reshape(b, k, t, -1)
    return {"embedding": x[:, :, 0], "doc_embedding": x[:, :, 1:]}

  def __call__(self, batch, deterministic: bool = True):
    if "text_segments" in batch:
      return self.packed(batch, deterministic)
    out = {"embedding": self.embed(batch, deterministic).astype(jnp.float32)}
    if "doc_input_ids" in batch:
      b, k, length = batch["doc_input_ids"].shape
      flat = lambda x: x.reshape(b * k, length)  # noqa: E731
      docs = {"input_ids": flat(batch["doc_input_ids"]), "input_mask": flat(batch["doc_input_mask"]),
              "segment_ids": jnp.zeros((b * k, length), jnp.int32)}
      out["doc_embedding"] = self.embed(docs, deterministic).astype(jnp.float32).reshape(b, k, -1)
    return out


def embed(module: EmbeddingModel, params, batch) -> jax.Array:
  return module.apply({"params": params}, batch)["embedding"]
