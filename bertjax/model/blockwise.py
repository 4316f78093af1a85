"""Attention whose cost follows its mask, on the XLA path of every backend (`attention_impl="blockwise"`).

- Local layers (a sliding window |i - j| <= W/2): queries in chunks, each against only the key chunks its window
  reaches, so time and memory grow with L·W, not L².
- Global layers, and any layer asked for a few query rows: keys in blocks with an online softmax (a running
  maximum and sum per query, as FlashAttention and Rabe & Staats' memory-efficient attention keep them); each
  block's step is rematerialised in the backward pass, so memory grows with L, not L².

Padding and packed rows mask by the key mask and segment ids per block; no [L, L] mask is ever built. Attention
dropout drops the unnormalised probabilities of each block (the same as dropping the normalised ones, since the
normaliser is a per-row constant), with a key folded per block. Rows without any key they may attend to (padding
queries) give zeros.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.kernels import dropout as dropout_lib


def _drop(p, rng, rate: float, impl: str):
  if impl == "hash":
    return dropout_lib.hash_dropout(p, jax.random.bits(rng, (), jnp.uint32), rate)
  keep = jax.random.bernoulli(rng, 1.0 - rate, p.shape)
  return jnp.where(keep, p / (1.0 - rate), 0.0)


def _pad(x, length: int, value=0):
  return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2), constant_values=value)


def local_attention(q, k, v, valid, segments, window: int, chunk: int, *, dropout_rate: float = 0.0,
                    dropout_rng=None, dropout_impl: str = "rng"):
  """Sliding-window attention (|i - j| <= window // 2) of every position: q, k, v [B, L, H, D]; valid [B, L]
  (real keys); segments [B, L] (packed rows; 0 = padding) or None. Queries go in chunks of `chunk` positions,
  each against the (2n + 1) key chunks around it, n = ceil(window / 2 / chunk). Softmax in float32."""
  b, length, h, d = q.shape
  half = window // 2
  n = -(-half // chunk)
  padded = -(-length // chunk) * chunk
  nb, span = padded // chunk, (2 * n + 1) * chunk
  q, k, v, valid = _pad(q, padded), _pad(k, padded), _pad(v, padded), _pad(valid.astype(bool), padded, False)

  def windows(x, value=0):  # [B, Lp, ...] -> [B, nb, span, ...]: each chunk's neighbourhood of keys
    xp = jnp.pad(x, [(0, 0), (n * chunk, n * chunk)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
    xb = xp.reshape((b, nb + 2 * n, chunk) + x.shape[2:])
    return jnp.concatenate([xb[:, j:j + nb] for j in range(2 * n + 1)], axis=2)

  qpos = np.arange(padded).reshape(nb, chunk)
  kpos = qpos[:, :1] - n * chunk + np.arange(span)[None]
  mask = jnp.asarray(np.abs(qpos[:, :, None] - kpos[:, None, :]) <= half)[None] & windows(valid, False)[:, :, None]
  if segments is not None:
    seg = _pad(segments, padded)
    segq = seg.reshape(b, nb, chunk)
    mask = mask & (segq[..., None] == windows(seg)[:, :, None]) & (segq[..., None] > 0)
  s = jnp.einsum("bnqhd,bnkhd->bhnqk", q.reshape(b, nb, chunk, h, d), windows(k),
                 preferred_element_type=jnp.float32) / np.sqrt(d).astype(np.float32)
  s = jnp.where(mask[:, None], s, -jnp.inf)
  m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
  p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
  total = jnp.sum(p, axis=-1, keepdims=True)
  if dropout_rate > 0.0 and dropout_rng is not None:
    p = _drop(p, dropout_rng, dropout_rate, dropout_impl)
  p = p / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
  out = jnp.einsum("bhnqk,bnkhd->bnqhd", p.astype(v.dtype), windows(v))
  return out.reshape(b, padded, h, d)[:, :length]


def blocked_attention(q, k, v, valid, segments, *, block: int, window: int = 0, queries=None,
                      dropout_rate: float = 0.0, dropout_rng=None, dropout_impl: str = "rng"):
  """Attention of q [B, Q, H, D] over k, v [B, L, H, D] in key blocks of `block` with an online softmax.
  `queries` [B, Q]: the positions of q's rows (None: q is every position); `window` > 0 limits each query to
  |i - j| <= window // 2. valid [B, L] marks real keys; segments [B, L] (or None) keeps a query to its segment."""
  b, length, h, d = k.shape
  nq = q.shape[1]
  padded = -(-length // block) * block
  nk = padded // block
  qpos = jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32)[None], (b, nq)) if queries is None else queries
  qseg = None
  if segments is not None:
    qseg = segments if queries is None else jnp.take_along_axis(segments, queries, axis=1)
  blocks = lambda x, value=0: jnp.moveaxis(  # noqa: E731  [B, Lp, ...] -> [nk, B, block, ...]
      _pad(x, padded, value).reshape((b, nk, block) + x.shape[2:]), 1, 0)
  xs = {"k": blocks(k), "v": blocks(v), "valid": blocks(valid.astype(bool), False), "j": jnp.arange(nk)}
  if segments is not None:
    xs["seg"] = blocks(segments)
  scale = np.float32(1.0 / np.sqrt(d))
  training = dropout_rate > 0.0 and dropout_rng is not None

  def step(carry, x):
    m, total, acc = carry  # [B, H, Q], [B, H, Q], [B, Q, H, D] float32
    s = jnp.einsum("bqhd,bkhd->bhqk", q, x["k"], preferred_element_type=jnp.float32) * scale
    mask = x["valid"][:, None, None, :]
    if window:
      kpos = x["j"] * block + jnp.arange(block, dtype=jnp.int32)
      mask = mask & (jnp.abs(qpos[:, None, :, None] - kpos[None, None, None, :]) <= window // 2)
    if qseg is not None:
      mask = mask & (qseg[:, None, :, None] == x["seg"][:, None, None, :]) & (qseg[:, None, :, None] > 0)
    s = jnp.where(mask, s, -jnp.inf)
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(s, axis=-1)))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - m_safe[..., None])
    correction = jnp.exp(m - m_safe)
    total = total * correction + jnp.sum(p, axis=-1)
    if training:
      p = _drop(p, jax.random.fold_in(dropout_rng, x["j"]), dropout_rate, dropout_impl)
    acc = acc * jnp.moveaxis(correction, 1, 2)[..., None] + jnp.einsum(
        "bhqk,bkhd->bqhd", p.astype(v.dtype), x["v"], preferred_element_type=jnp.float32)
    return (m_new, total, acc), None

  init = (jnp.full((b, h, nq), -jnp.inf, jnp.float32), jnp.zeros((b, h, nq), jnp.float32),
          jnp.zeros((b, nq, h, d), jnp.float32))
  (_, total, acc), _ = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), init, xs)
  total = jnp.moveaxis(total, 1, 2)[..., None]
  return (acc / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)).astype(v.dtype)


def attention(q, k, v, valid, segments, *, local, window: int, block: int, queries=None, dropout_rate: float = 0.0,
              dropout_rng=None, dropout_impl: str = "rng"):
  """A layer's attention: local (sliding window) or global, `local` a Python bool or a traced one (a scanned
  stack, where the untaken branch is not run). Local layers over every position run in chunks of
  min(block, window / 2); global ones, and local ones asked for a few `queries`, in key blocks of `block`."""
  kw = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng, dropout_impl=dropout_impl)

  def global_(q, k, v):
    return blocked_attention(q, k, v, valid, segments, block=block, queries=queries, **kw)

  def local_(q, k, v):
    if queries is not None:
      return blocked_attention(q, k, v, valid, segments, block=block, window=window, queries=queries, **kw)
    return local_attention(q, k, v, valid, segments, window, max(1, min(block, window // 2)), **kw)

  if not window:
    return global_(q, k, v)
  if isinstance(local, (bool, np.bool_)):
    return (local_ if local else global_)(q, k, v)
  return jax.lax.cond(local, local_, global_, q, k, v)
