"""Attention whose cost follows its mask, on the XLA path of every backend (`attention_impl="blockwise"`).

- Local layers (a sliding window |i - j| <= W/2): queries in chunks, each against only the key chunks its window
  reaches, so time and memory grow with L·W, not L².
- Global layers, and any layer asked for a few query rows: keys in blocks with an online softmax (a running
  maximum and sum per query, as FlashAttention keeps them) and FlashAttention-2's backward pass (each block's
  probabilities recomputed from the row's log-sum-exp), so memory grows with L, not L².

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


# Query rows per tile of a global layer: 512 x 256-key score blocks were the fastest on the 2-core CPU at 4,096
# tokens (2.25 s forward + backward for 12 heads, against 2.78 s untiled).
QUERY_BLOCK = 512


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
                      dropout_rate: float = 0.0, dropout_rng=None, dropout_impl: str = "rng",
                      flash_backward: bool = True, query_block: int = 0):
  """Attention of q [B, Q, H, D] over k, v [B, L, H, D] in key blocks of `block` with an online softmax.
  `queries` [B, Q]: the positions of q's rows (None: q is every position); `window` > 0 limits each query to
  |i - j| <= window // 2. valid [B, L] marks real keys; segments [B, L] (or None) keeps a query to its segment.

  The backward pass is FlashAttention-2's: it keeps the output and each row's log-sum-exp, and recomputes each
  block's probabilities from them, so nothing of size [Q, L] is kept and no rescaling is differentiated
  (`flash_backward=False`: JAX's own derivative of the forward scan, the reference the tests compare with)."""
  b, length, h, d = k.shape
  nq = q.shape[1]
  if query_block and nq > query_block:
    return _in_query_blocks(q, k, v, valid, segments, queries, query_block, block=block, window=window,
                            dropout_rate=dropout_rate, dropout_rng=dropout_rng, dropout_impl=dropout_impl,
                            flash_backward=flash_backward)
  padded = -(-length // block) * block
  nk = padded // block
  qpos = jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32)[None], (b, nq)) if queries is None else queries
  qseg = None
  if segments is not None:
    qseg = segments if queries is None else jnp.take_along_axis(segments, queries, axis=1)
  blocks = lambda x, value=0: jnp.moveaxis(  # noqa: E731  [B, Lp, ...] -> [nk, B, block, ...]
      _pad(x, padded, value).reshape((b, nk, block) + x.shape[2:]), 1, 0)
  masks = {"valid": blocks(valid.astype(bool), False), "j": jnp.arange(nk)}
  if segments is not None:
    masks["seg"] = blocks(segments)
  scale = np.float32(1.0 / np.sqrt(d))
  rng = dropout_rng if dropout_rate > 0.0 and dropout_rng is not None else None

  def probabilities(q, kj, x, lse, qpos, qseg):
    """exp(scores - lse) of one key block, 0 where masked; with lse None, the block's scores (masked at -inf)."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, kj, preferred_element_type=jnp.float32) * scale
    mask = x["valid"][:, None, None, :]
    if window:
      kpos = x["j"] * block + jnp.arange(block, dtype=jnp.int32)
      mask = mask & (jnp.abs(qpos[:, None, :, None] - kpos[None, None, None, :]) <= window // 2)
    if qseg is not None:
      mask = mask & (qseg[:, None, :, None] == x["seg"][:, None, None, :]) & (qseg[:, None, :, None] > 0)
    if lse is None:
      return jnp.where(mask, s, -jnp.inf)
    return jnp.where(mask, jnp.exp(s - lse[..., None]), 0.0)

  def drop(p, j, rng):
    return p if rng is None else _drop(p, jax.random.fold_in(rng, j), dropout_rate, dropout_impl)

  def forward(q, k, v, rng, aux):
    def step(carry, x):
      m, total, acc = carry  # [B, H, Q], [B, H, Q], [B, Q, H, D] float32
      s = probabilities(q, x["k"], x, None, aux["qpos"], aux["qseg"])
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      p = jnp.exp(s - m_safe[..., None])
      correction = jnp.exp(m - m_safe)
      total = total * correction + jnp.sum(p, axis=-1)
      acc = acc * jnp.moveaxis(correction, 1, 2)[..., None] + jnp.einsum(
          "bhqk,bkhd->bqhd", drop(p, x["j"], rng).astype(v.dtype), x["v"], preferred_element_type=jnp.float32)
      return (m_new, total, acc), None
    init = (jnp.full((b, h, nq), -jnp.inf, jnp.float32), jnp.zeros((b, h, nq), jnp.float32),
            jnp.zeros((b, nq, h, d), jnp.float32))
    (m, total, acc), _ = jax.lax.scan(step, init, {"k": blocks(k), "v": blocks(v), **aux["masks"]})
    out = (acc / jnp.maximum(jnp.moveaxis(total, 1, 2)[..., None], jnp.finfo(jnp.float32).tiny)).astype(v.dtype)
    lse = jnp.where(total > 0, m + jnp.log(jnp.maximum(total, jnp.finfo(jnp.float32).tiny)), jnp.inf)
    return out, lse

  # Everything traced goes in as an argument: a custom_vjp function may not close over traced values.
  @jax.custom_vjp
  def attend(q, k, v, rng, aux):
    return forward(q, k, v, rng, aux)[0]

  def attend_fwd(q, k, v, rng, aux):
    out, lse = forward(q, k, v, rng, aux)
    return out, (q, k, v, rng, aux, out, lse)

  def attend_bwd(res, g):
    q, k, v, rng, aux, out, lse = res
    g32 = g.astype(jnp.float32)
    delta = jnp.moveaxis(jnp.sum(g32 * out.astype(jnp.float32), axis=-1), 1, 2)  # [B, H, Q]: rowsum(dO * O)

    def step(dq, x):
      p = probabilities(q, x["k"], x, lse, aux["qpos"], aux["qseg"])
      dv = jnp.einsum("bhqk,bqhd->bkhd", drop(p, x["j"], rng).astype(g.dtype), g, preferred_element_type=jnp.float32)
      dp = drop(jnp.einsum("bqhd,bkhd->bhqk", g, x["v"], preferred_element_type=jnp.float32), x["j"], rng)
      ds = p * (dp - delta[..., None]) * scale
      dq = dq + jnp.einsum("bhqk,bkhd->bqhd", ds.astype(q.dtype), x["k"], preferred_element_type=jnp.float32)
      dk = jnp.einsum("bhqk,bqhd->bkhd", ds.astype(q.dtype), q, preferred_element_type=jnp.float32)
      return dq, (dk, dv)
    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32),
                                {"k": blocks(k), "v": blocks(v), **aux["masks"]})
    unblock = lambda x, like: jnp.moveaxis(x, 0, 1).reshape((b, padded) + x.shape[3:])[:, :length].astype(  # noqa
        like.dtype)
    return dq.astype(q.dtype), unblock(dk, k), unblock(dv, v), None, None

  attend.defvjp(attend_fwd, attend_bwd)
  aux = {"qpos": qpos, "qseg": qseg, "masks": masks}
  return attend(q, k, v, rng, aux) if flash_backward else forward(q, k, v, rng, aux)[0]


def _in_query_blocks(q, k, v, valid, segments, queries, query_block: int, *, dropout_rng, **kw):
  """`blocked_attention` of `query_block` query rows at a time (a loop over query tiles, each over every key
  block): each tile's score blocks are small enough to stay in cache between the softmax's passes over them.
  Each tile draws its dropout from a key of its own."""
  b, nq = q.shape[:2]
  n = -(-nq // query_block)
  pos = jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32)[None], (b, nq)) if queries is None else queries
  pos = _pad(pos, n * query_block, nq - 1)  # padded rows repeat the last position; their outputs are dropped
  tiles = {"q": jnp.moveaxis(_pad(q, n * query_block).reshape((b, n, query_block) + q.shape[2:]), 1, 0),
           "pos": jnp.moveaxis(pos.reshape(b, n, query_block), 1, 0), "i": jnp.arange(n)}

  def tile(x):
    rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, x["i"])
    return blocked_attention(x["q"], k, v, valid, segments, queries=x["pos"], dropout_rng=rng, **kw)
  out = jax.lax.map(tile, tiles)
  return jnp.moveaxis(out, 0, 1).reshape((b, n * query_block) + q.shape[2:])[:, :nq]


def fused_global(q, k, v, valid):
  """cuDNN's fused (flash) attention over every key of right-padded rows (a key-length per row): the global
  layers' kernel on a GPU in bfloat16 / float16 without dropout or packed rows. cuDNN's windows are one-sided
  (causal), so the local layers stay on the chunked path."""
  lengths = jnp.sum(valid.astype(jnp.int32), axis=-1)
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")


def attention(q, k, v, valid, segments, *, local, window: int, block: int, queries=None, dropout_rate: float = 0.0,
              dropout_rng=None, dropout_impl: str = "rng", fused: bool = False):
  """A layer's attention: local (sliding window) or global, `local` a Python bool or a traced one (a scanned
  stack, where the untaken branch is not run). Local layers over every position run in chunks of
  min(block, window / 2); global ones, and local ones asked for a few `queries`, in key blocks of `block`, or
  with `fused` (see `fused_global`) in cuDNN's kernel."""
  kw = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng, dropout_impl=dropout_impl)

  def blocked(q, k, v):
    return blocked_attention(q, k, v, valid, segments, block=block, queries=queries, query_block=QUERY_BLOCK, **kw)

  def global_(q, k, v):
    if fused and queries is None:
      # cuDNN takes a key length per row, which is the mask only when every row is right-padded; a batch padded
      # on the left (or with holes) takes the blocked path instead.
      lengths = jnp.sum(valid.astype(jnp.int32), axis=-1, keepdims=True)
      right_padded = jnp.all(valid == (jnp.arange(valid.shape[-1]) < lengths))
      return jax.lax.cond(right_padded, lambda q, k, v: fused_global(q, k, v, valid), blocked, q, k, v)
    return blocked(q, k, v)

  def local_(q, k, v):
    if queries is not None:
      return blocked_attention(q, k, v, valid, segments, block=block, window=window, queries=queries, **kw)
    return local_attention(q, k, v, valid, segments, window, max(1, min(block, window // 2)), **kw)

  if not window:
    return global_(q, k, v)
  if isinstance(local, (bool, np.bool_)):
    return (local_ if local else global_)(q, k, v)
  return jax.lax.cond(local, local_, global_, q, k, v)
