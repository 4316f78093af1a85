"""Attention on XLA's own ops: softmax(QKᵀ/√d_k + bias)·V with a boolean mask (every backend's reference, and the
path for sliding windows and ALiBi), and the masks every backend is given."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.kernels import dropout as dropout_lib


def band_mask(length: int, window: int):
  """[1, 1, L, L] boolean: |i - j| <= window // 2 (a sliding window of `window` tokens, ModernBERT's
  local_attention)."""
  i = np.arange(length)
  return jnp.asarray(np.abs(i[:, None] - i[None, :]) <= window // 2)[None, None]


def rows_of(x, queries):
  """x [B|1, H|1, L, ...] at query rows `queries` [B, Q] on axis 2 -> [B, H|1, Q, ...] (x broadcast over B)."""
  x = jnp.broadcast_to(x, (queries.shape[0],) + x.shape[1:])
  return jnp.take_along_axis(x, queries.reshape(queries.shape[:1] + (1, -1) + (1,) * (x.ndim - 3)), axis=2)


def select(flag, when_true, when_false):
  """`when_true` if flag else `when_false`, for a Python flag (static) or a traced one (a scanned layer)."""
  if isinstance(flag, (bool, np.bool_)):
    return when_true if flag else when_false
  return jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), when_true, when_false)


def attention_mask(input_mask, attention_segment_ids=None):
  """Boolean mask [B, 1, Lq, Lk]: True where query q may attend to key k. No causal part.

  Without segment ids a query attends to every real (input_mask=1) key. With them (packed rows) it attends
  only to keys of its own example.
  """
  keys = input_mask.astype(bool)[:, None, None, :]
  if attention_segment_ids is None:
    return keys
  seg = attention_segment_ids
  same = seg[:, None, :, None] == seg[:, None, None, :]
  return same & keys & (seg[:, None, :, None] > 0)


def mask_rows(mask, queries):
  """The rows of a boolean mask [B, 1, Lq|1, Lk] for the query positions `queries` [B, Q]."""
  if mask.shape[2] == 1:
    return mask
  return jnp.take_along_axis(mask, queries[:, None, :, None], axis=2)


def dot_product_attention(q, k, v, mask, *, dropout_rate=0.0, dropout_rng=None, deterministic=True,
                          dropout_impl="rng", bias=None):
  """softmax(QKᵀ/√d_k + bias)·V per head. q, k, v: [B, L, H, D]; mask [B, 1|H, Lq, Lk]; bias (float32)
  broadcastable to [B, H, Lq, Lk]. Softmax in float32."""
  # Heads moved next to the batch first: XLA's CPU dot then runs batched [L, D] x [D, L] products.
  q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
  scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
  scores = scores * np.float32(1.0 / np.sqrt(q.shape[-1]))
  if bias is not None:
    scores = scores + bias
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  if not deterministic and dropout_rate > 0.0:
    if dropout_impl == "hash":
      probs = dropout_lib.hash_dropout(probs, jax.random.bits(dropout_rng, (), jnp.uint32), dropout_rate)
    else:
      keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
      probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.swapaxes(jnp.einsum("bhqk,bhkd->bhqd", probs.astype(v.dtype), v), 1, 2)
