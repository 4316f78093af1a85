"""Attention on XLA's own ops: softmax(QKᵀ/√d_k + bias)·V with a boolean mask (every backend's reference, and the
path for sliding windows and ALiBi), and the masks every backend is given."""
from __future__ import annotations

import functools

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
  masked = jnp.where(mask, np.float32(0.0), jnp.finfo(jnp.float32).min)
  bias = masked if bias is None else bias + masked
  keep = None
  if not deterministic and dropout_rate > 0.0:
    shape = q.shape[:3] + k.shape[2:3]
    if dropout_impl == "hash":
      keep = dropout_lib.keep_mask(jax.random.bits(dropout_rng, (), jnp.uint32), shape, dropout_rate)
    else:
      keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, shape)
  out = _attend(q, k, v, bias, keep, float(1.0 / np.sqrt(q.shape[-1])), float(dropout_rate))
  return jnp.swapaxes(out, 1, 2)


# The softmax in the form XLA:CPU fuses with the two products: the mask added as a bias (a select breaks the
# fusion) and the row sums dividing the [Lq, D] context rather than the [Lq, Lk] probabilities, so no [Lq, Lk]
# tensor is written out between them (docs/performance.md#attention-on-the-cpu). The backward recomputes the
# probabilities from the saved row maxima and sums, as FlashAttention's does, instead of keeping them.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attend(q, k, v, bias, keep, scale, rate):
  return _attend_fwd(q, k, v, bias, keep, scale, rate)[0]


def _scores(q, k, bias, scale):
  return jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * np.float32(scale) + bias


def _dropped(p, keep, rate):
  return p if keep is None else jnp.where(keep, p * np.float32(1.0 / (1.0 - rate)), np.float32(0.0))


def _attend_fwd(q, k, v, bias, keep, scale, rate):
  s = _scores(q, k, bias, scale)
  top = jnp.max(s, axis=-1, keepdims=True)
  e = jnp.exp(s - top)
  inv = 1.0 / jnp.sum(e, axis=-1, keepdims=True)
  out = jnp.einsum("bhqk,bhkd->bhqd", _dropped(e, keep, rate).astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  out = (out * inv).astype(v.dtype)
  return out, (q, k, v, bias, keep, out, top, inv)


def _attend_bwd(scale, rate, res, g):
  q, k, v, bias, keep, out, top, inv = res
  p = jnp.exp(_scores(q, k, bias, scale) - top) * inv
  dv = jnp.einsum("bhqk,bhqd->bhkd", _dropped(p, keep, rate).astype(g.dtype), g, preferred_element_type=jnp.float32)
  dp = _dropped(jnp.einsum("bhqd,bhkd->bhqk", g, v, preferred_element_type=jnp.float32), keep, rate)
  # d softmax: p * (dp - sum_k p dp), and sum_k p dp = g . out (dropout's mask and scale included in both).
  ds = p * (dp - jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True))
  # A row with every key masked is a constant (the mean of v), as the select form makes it: no score gradient.
  ds = jnp.where(top > jnp.finfo(jnp.float32).min, ds, np.float32(0.0))
  wide = tuple(i for i, n in enumerate(bias.shape) if n == 1 and ds.shape[i] != 1)
  dbias = jnp.sum(ds, axis=wide, keepdims=True).astype(bias.dtype)
  ds = ds * np.float32(scale)
  dq = jnp.einsum("bhqk,bhkd->bhqd", ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
  dk = jnp.einsum("bhqk,bhqd->bhkd", ds.astype(q.dtype), q, preferred_element_type=jnp.float32)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dbias, None


_attend.defvjp(_attend_fwd, _attend_bwd)
