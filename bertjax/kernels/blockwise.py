"""Attention whose cost follows its mask, on the XLA path of every backend (`attention_impl="blockwise"`).

- Local layers (a sliding window |i - j| <= W/2): queries in chunks, each against only the key chunks its window
  reaches, so time and memory grow with L·W, not L².
- Global layers, and any layer asked for a few query rows: keys in blocks with an online softmax (a running
  maximum and sum per query, as FlashAttention keeps them) and FlashAttention-2's backward pass (each block's
  probabilities recomputed from the row's log-sum-exp), so memory grows with L, not L².

Padding and packed rows mask by the key mask and segment ids per block; no [L, L] mask is ever built. DeBERTa's
disentangled terms are added block by block from each query's and each key's scores against the relative
embeddings ([L, 2S] each) and the bucket of every (query, key) pair, so they take no [L, L] scores either. Attention
dropout drops the unnormalised probabilities of each block (the same as dropping the normalised ones, since the
normaliser is a per-row constant), with a key folded per block. Rows without any key they may attend to (padding
queries) give zeros.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.kernels import dropout as dropout_lib

# Query rows per tile of a global layer. On the 2-core AVX2 CPU, one head at a time in 1,024-row tiles of 256-key
# blocks (1 MB of scores per tile) takes a 12-head global layer's attention, forward + backward, from 3.4-4.1 s
# (all heads together in 512-row tiles: 6 MB of scores, out of cache) to 1.8-2.2 s at 4,096 tokens, and from
# 14.6 to 7.4 s at 8,192.
QUERY_BLOCK = 1024


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
  valid = _pad(valid.astype(bool), padded, False)
  # Heads lead inside ([B, H, ...]): XLA:CPU runs the batched products ~1.6x faster in that layout.
  q, k, v = (jnp.swapaxes(_pad(x, padded), 1, 2) for x in (q, k, v))

  def windows(x, value=0, axis=1):  # [..., Lp, ...] -> [..., nb, span, ...]: each chunk's neighbourhood of keys
    pads = [(0, 0)] * x.ndim
    pads[axis] = (n * chunk, n * chunk)
    xb = jnp.pad(x, pads, constant_values=value)
    xb = xb.reshape(x.shape[:axis] + (nb + 2 * n, chunk) + x.shape[axis + 1:])
    index = (slice(None),) * axis
    return jnp.concatenate([xb[index + (slice(j, j + nb),)] for j in range(2 * n + 1)], axis=axis + 1)

  qpos = np.arange(padded).reshape(nb, chunk)
  kpos = qpos[:, :1] - n * chunk + np.arange(span)[None]
  mask = jnp.asarray(np.abs(qpos[:, :, None] - kpos[:, None, :]) <= half)[None] & windows(valid, False)[:, :, None]
  if segments is not None:
    seg = _pad(segments, padded)
    segq = seg.reshape(b, nb, chunk)
    mask = mask & (segq[..., None] == windows(seg)[:, :, None]) & (segq[..., None] > 0)
  s = jnp.einsum("bhnqd,bhnkd->bhnqk", q.reshape(b, h, nb, chunk, d), windows(k, axis=2),
                 preferred_element_type=jnp.float32) / np.sqrt(d).astype(np.float32)
  s = jnp.where(mask[:, None], s, -jnp.inf)
  m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
  p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
  total = jnp.sum(p, axis=-1, keepdims=True)
  if dropout_rate > 0.0 and dropout_rng is not None:
    p = _drop(p, dropout_rng, dropout_rate, dropout_impl)
  p = p / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
  out = jnp.einsum("bhnqk,bhnkd->bhnqd", p.astype(v.dtype), windows(v, axis=2))
  return jnp.swapaxes(out.reshape(b, h, padded, d), 1, 2)[:, :length]


def balanced_block(block: int, length: int) -> int:
  """The key-block size, at most `block`, that covers `length` keys in as few blocks as `block` does, with the
  least padding (rounded up to a multiple of 8): 384 keys in two blocks of 192 rather than two of 256, half of
  the second padding."""
  n = -(-length // block)  # blocks
  size = -(-length // n)
  return min(block, -(-size // 8) * 8)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """The static shape of one blocked attention call and the reshapes between its views: rows in query tiles of
  `tile` (heads leading inside: every product is then a plain batched matrix product, which XLA:CPU runs ~1.6x
  faster than the same product over [B, L, H, D], even for one head), keys in blocks of `block`."""
  b: int
  h: int
  d: int
  length: int
  block: int
  nq: int
  tile: int
  window: int
  dropout_rate: float
  dropout_impl: str

  @property
  def nt(self) -> int:
    return -(-self.nq // self.tile)

  @property
  def padded(self) -> int:
    return -(-self.length // self.block) * self.block

  @property
  def nk(self) -> int:
    return self.padded // self.block

  @property
  def scale(self):
    return np.float32(1.0 / np.sqrt(self.d))

  def row_tiles(self, x):  # [B, nt * tile, ...] -> [nt, B, tile, ...]
    return jnp.moveaxis(x.reshape((self.b, self.nt, self.tile) + x.shape[2:]), 1, 0)

  def head_tiles(self, x):  # [B, H, Q, ...] -> [nt, B, H, tile, ...]
    x = _pad(jnp.swapaxes(x, 1, 2), self.nt * self.tile).reshape((self.b, self.nt, self.tile, self.h) + x.shape[3:])
    return jnp.moveaxis(x, 1, 0).swapaxes(2, 3)

  def untile(self, x):  # [nt, B, H, tile, ...] -> [B, H, Q, ...]
    return jnp.moveaxis(x, 0, 2).reshape((self.b, self.h, self.nt * self.tile) + x.shape[4:])[:, :, :self.nq]

  def blocks(self, x, value=0):  # [B, Lp, ...] -> [nk, B, block, ...]
    return jnp.moveaxis(_pad(x, self.padded, value).reshape((self.b, self.nk, self.block) + x.shape[2:]), 1, 0)

  def head_blocks(self, x):  # [B, H, L, D] -> [nk, B, H, block, D]
    x = jnp.pad(x, [(0, 0), (0, 0), (0, self.padded - self.length), (0, 0)])
    return jnp.moveaxis(x.reshape(self.b, self.h, self.nk, self.block, x.shape[-1]), 2, 0)

  def unblock(self, x, like):  # [nk, B, H, block, D] -> [B, H, L, D]
    x = jnp.moveaxis(x, 0, 2).reshape(self.b, self.h, self.padded, x.shape[-1])[:, :, :self.length]
    return x.astype(like.dtype)

  def tile_rng(self, rng, t):
    return rng if rng is None or self.nt == 1 else jax.random.fold_in(rng, t["i"])

  def drop(self, p, j, rng):
    return p if rng is None else _drop(p, jax.random.fold_in(rng, j), self.dropout_rate, self.dropout_impl)


def _relative_bias(lay: _Layout, c, pj, index):
  """DeBERTa's terms of one (query tile, key block): c2p[i, j] = c[i, index[i, j]] and p2c[i, j] =
  pj[j, index[i, j]], for c [B, H, T, R] (the tile's queries against the relative keys), pj [B, H, block, R]
  (the block's keys against the relative queries) and index [B, T, block]."""
  b, h, block, r = pj.shape
  c2p = jnp.take_along_axis(c, index[:, None], axis=-1)
  flat = (index + jnp.arange(block, dtype=index.dtype) * r).reshape(b, 1, -1)
  p2c = jnp.take_along_axis(pj.reshape(b, h, block * r), flat, axis=-1).reshape(c2p.shape)
  return c2p + p2c


def _block_index(lay: _Layout, t, x):
  return jax.lax.dynamic_slice_in_dim(t["index"], x["j"] * lay.block, lay.block, axis=2)


def _probabilities(lay: _Layout, q, kj, x, lse, t):
  """exp(scores - lse) of one key block, 0 where masked; with lse None, the block's scores (masked at -inf)."""
  s = jnp.einsum("bhqd,bhkd->bhqk", q, kj, preferred_element_type=jnp.float32) * lay.scale
  if "c" in t:
    s = s + _relative_bias(lay, t["c"], x["p"], _block_index(lay, t, x))
  mask = x["valid"][:, None, None, :]
  if lay.window:
    kpos = x["j"] * lay.block + jnp.arange(lay.block, dtype=jnp.int32)
    mask = mask & (jnp.abs(t["pos"][:, None, :, None] - kpos[None, None, None, :]) <= lay.window // 2)
  if "seg" in t:
    mask = mask & (t["seg"][:, None, :, None] == x["seg"][:, None, None, :]) & (t["seg"][:, None, :, None] > 0)
  if lse is None:
    return jnp.where(mask, s, -jnp.inf)
  return jnp.where(mask, jnp.exp(s - lse[..., None]), 0.0)


def _forward_tile(lay: _Layout, q, kv, rng, t):
  """(output, log-sum-exp) of one query tile over every key block, by the online softmax."""
  def step(carry, x):
    m, total, acc = carry  # [B, H, T], [B, H, T], [B, H, T, D] float32
    s = _probabilities(lay, q, x["k"], x, None, t)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - m_safe[..., None])
    correction = jnp.exp(m - m_safe)
    total = total * correction + jnp.sum(p, axis=-1)
    acc = acc * correction[..., None] + jnp.einsum(
        "bhqk,bhkd->bhqd", lay.drop(p, x["j"], rng).astype(x["v"].dtype), x["v"], preferred_element_type=jnp.float32)
    return (m_new, total, acc), None
  b, h, tile, d = lay.b, lay.h, lay.tile, lay.d
  init = (jnp.full((b, h, tile), -jnp.inf, jnp.float32), jnp.zeros((b, h, tile), jnp.float32),
          jnp.zeros((b, h, tile, d), jnp.float32))
  (m, total, acc), _ = jax.lax.scan(step, init, kv)
  out = (acc / jnp.maximum(total[..., None], jnp.finfo(jnp.float32).tiny)).astype(q.dtype)
  lse = jnp.where(total > 0, m + jnp.log(jnp.maximum(total, jnp.finfo(jnp.float32).tiny)), jnp.inf)
  return out, lse


def _inputs(lay: _Layout, q, k, v, rel, aux):
  """The key blocks and query tiles the scans run over (with DeBERTa's terms, `rel`, where given)."""
  kv = {"k": lay.head_blocks(k), "v": lay.head_blocks(v), **aux["masks"]}
  tiles = {"q": lay.head_tiles(q), **aux["tiles"]}
  if rel is not None:
    kv["p"], tiles["c"] = lay.head_blocks(rel["p"]), lay.head_tiles(rel["c"])
  return kv, tiles


def _forward(lay: _Layout, q, k, v, rel, rng, aux):  # q [B, H, Q, D], k and v [B, H, L, D]
  kv, tiles = _inputs(lay, q, k, v, rel, aux)
  out, lse = jax.lax.map(lambda t: _forward_tile(lay, t["q"], kv, lay.tile_rng(rng, t), t), tiles)
  return lay.untile(out), lay.untile(lse)


# Everything traced goes in as an argument: a custom_vjp function may not close over traced values.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(lay: _Layout, q, k, v, rel, rng, aux):
  return _forward(lay, q, k, v, rel, rng, aux)[0]


def _attend_fwd(lay, q, k, v, rel, rng, aux):
  out, lse = _forward(lay, q, k, v, rel, rng, aux)
  return out, (q, k, v, rel, rng, aux, out, lse)


def _attend_bwd(lay, res, g):
  """FlashAttention-2's backward: each block's probabilities recomputed from the kept log-sum-exp. DeBERTa's
  terms take the score gradient through their gathers (scatter-adds into [T, R] and [block, R])."""
  q, k, v, rel, rng, aux, out, lse = res
  delta = jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, H, Q]: rowsum(dO * O)
  kv, rows = _inputs(lay, q, k, v, rel, aux)
  rows.update(g=lay.head_tiles(g), lse=lay.head_tiles(lse), delta=lay.head_tiles(delta))

  def backward_tile(acc, t):
    q, g, lse, delta, tile_key = t["q"], t["g"], t["lse"], t["delta"], lay.tile_rng(rng, t)

    def step(carry, x):
      dq, dc = carry
      p = _probabilities(lay, q, x["k"], x, lse, t)
      dv = jnp.einsum("bhqk,bhqd->bhkd", lay.drop(p, x["j"], tile_key).astype(g.dtype), g,
                      preferred_element_type=jnp.float32)
      dp = lay.drop(jnp.einsum("bhqd,bhkd->bhqk", g, x["v"], preferred_element_type=jnp.float32), x["j"], tile_key)
      dscore = p * (dp - delta[..., None])
      ds = dscore * lay.scale
      dq = dq + jnp.einsum("bhqk,bhkd->bhqd", ds.astype(q.dtype), x["k"], preferred_element_type=jnp.float32)
      dk = jnp.einsum("bhqk,bhqd->bhkd", ds.astype(q.dtype), q, preferred_element_type=jnp.float32)
      if "c" not in t:
        return (dq, dc), (dk, dv, ())
      index = _block_index(lay, t, x)
      _, pull = jax.vjp(lambda c, pj: _relative_bias(lay, c, pj, index), t["c"], x["p"])
      dc_j, dp_j = pull(dscore)
      return (dq, dc + dc_j), (dk, dv, dp_j)
    dc0 = jnp.zeros(t["c"].shape, jnp.float32) if "c" in t else ()
    (dq, dc), (dk, dv, dpk) = jax.lax.scan(step, (jnp.zeros(q.shape, jnp.float32), dc0), kv)
    return (acc[0] + dk, acc[1] + dv, jax.tree.map(jnp.add, acc[2], dpk)), (dq, dc)
  zeros = jnp.zeros((lay.nk, lay.b, lay.h, lay.block, lay.d), jnp.float32)
  dp0 = () if rel is None else jnp.zeros(kv["p"].shape, jnp.float32)
  (dk, dv, dpk), (dq, dc) = jax.lax.scan(backward_tile, (zeros, zeros, dp0), rows)
  drel = None if rel is None else {"c": lay.untile(dc).astype(rel["c"].dtype), "p": lay.unblock(dpk, rel["p"])}
  return lay.untile(dq).astype(q.dtype), lay.unblock(dk, k), lay.unblock(dv, v), drel, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def blocked_attention(q, k, v, valid, segments, *, block: int, window: int = 0, queries=None,
                      dropout_rate: float = 0.0, dropout_rng=None, dropout_impl: str = "rng",
                      flash_backward: bool = True, query_block: int = 0, rel=None):
  """Attention of q [B, Q, H, D] over k, v [B, L, H, D] in key blocks of `block` with an online softmax.
  `queries` [B, Q]: the positions of q's rows (None: q is every position); `window` > 0 limits each query to
  |i - j| <= window // 2. valid [B, L] marks real keys; segments [B, L] (or None) keeps a query to its segment.
  With `query_block` < Q the queries go in tiles of that many rows, each over every key block, so that a tile's
  score blocks stay in cache between the softmax's passes over them; each tile draws its dropout from a key of
  its own. `rel`: DeBERTa's disentangled terms as {"c": [B, Q, H, R], "p": [B, L, H, R], "index": [B, Q, L]} (see
  `_relative_bias`), added to the scores.

  The backward pass is FlashAttention-2's: it keeps the output and each row's log-sum-exp, and recomputes each
  block's probabilities from them, so nothing of size [Q, L] is kept and no rescaling is differentiated
  (`flash_backward=False`: JAX's own derivative of the forward scan, the reference the tests compare with)."""
  b, length, h, d = k.shape
  nq = q.shape[1]
  lay = _Layout(b, h, d, length, balanced_block(block, length), nq,
                query_block if query_block and nq > query_block else nq, window, dropout_rate, dropout_impl)
  qpos = jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32)[None], (b, nq)) if queries is None else queries
  # Rows that fill the last tile repeat the last query's position; their outputs are dropped.
  qpos = jnp.concatenate([qpos, jnp.broadcast_to(qpos[:, -1:], (b, lay.nt * lay.tile - nq))], axis=1)
  masks = {"valid": lay.blocks(valid.astype(bool), False), "j": jnp.arange(lay.nk)}
  qtiles = {"pos": lay.row_tiles(qpos), "i": jnp.arange(lay.nt)}
  if segments is not None:
    masks["seg"] = lay.blocks(segments)
    qtiles["seg"] = lay.row_tiles(jnp.take_along_axis(segments, qpos, axis=1))
  rng = dropout_rng if dropout_rate > 0.0 and dropout_rng is not None else None
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
  if rel is not None:
    index = jnp.pad(rel["index"].astype(jnp.int32), [(0, 0), (0, lay.nt * lay.tile - nq), (0, lay.padded - length)])
    qtiles["index"] = lay.row_tiles(index)
    rel = {"c": heads_first(rel["c"]), "p": heads_first(rel["p"])}
  aux = {"tiles": qtiles, "masks": masks}
  q, k, v = heads_first(q), heads_first(k), heads_first(v)
  out = _attend(lay, q, k, v, rel, rng, aux) if flash_backward else _forward(lay, q, k, v, rel, rng, aux)[0]
  return heads_first(out)


def fused_global(q, k, v, valid):
  """cuDNN's fused (flash) attention over every key of right-padded rows (a key-length per row): the global
  layers' kernel on a GPU in bfloat16 / float16 without dropout or packed rows. cuDNN's windows are one-sided
  (causal), so the local layers stay on the chunked path."""
  lengths = jnp.sum(valid.astype(jnp.int32), axis=-1)
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")


def _one_head_at_a_time(fn, q, k, v, rel, dropout_rng):
  """fn(q, k, v, rel, rng) over [B, L, 1, D] slices of each head in turn (a loop, each head its own dropout key;
  DeBERTa's per-head terms sliced alike, their bucket index shared)."""
  heads = lambda x: jnp.moveaxis(x, 2, 0)[..., None, :]  # noqa: E731  [B, L, H, D] -> [H, B, L, 1, D]
  rngs = None if dropout_rng is None else jax.random.split(dropout_rng, q.shape[2])
  per_head = None if rel is None else {"c": heads(rel["c"]), "p": heads(rel["p"])}

  def one(a):
    q, k, v, terms, rng = a
    return fn(q, k, v, None if rel is None else {**terms, "index": rel["index"]}, rng)
  out = jax.lax.map(one, (heads(q), heads(k), heads(v), per_head, rngs))
  return jnp.moveaxis(out[..., 0, :], 0, 2)


def attention(q, k, v, valid, segments, *, local, window: int, block: int, queries=None, dropout_rate: float = 0.0,
              dropout_rng=None, dropout_impl: str = "rng", fused: bool = False, per_head: bool = False, rel=None):
  """A layer's attention: local (sliding window) or global, `local` a Python bool or a traced one (a scanned
  stack, where the untaken branch is not run). Local layers over every position run in chunks of
  min(block, window / 2); global ones, and local ones asked for a few `queries`, in key blocks of `block`, or
  with `fused` (see `fused_global`) in cuDNN's kernel. `per_head`: the key-block path takes one head at a time,
  so that a tile's scores stay in a CPU core's cache (on accelerators all heads together fill the chip). `rel`:
  DeBERTa's disentangled terms (global layers only; see `blocked_attention`)."""
  kw = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng, dropout_impl=dropout_impl)

  def blocked(q, k, v):
    def run(q, k, v, terms, rng):
      return blocked_attention(q, k, v, valid, segments, block=block, queries=queries, query_block=QUERY_BLOCK,
                               rel=terms, **{**kw, "dropout_rng": rng})
    if per_head and q.shape[2] > 1:
      return _one_head_at_a_time(run, q, k, v, rel, dropout_rng if dropout_rate > 0.0 else None)
    return run(q, k, v, rel, dropout_rng)

  def global_(q, k, v):
    if fused and queries is None and rel is None:
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
  if rel is not None:
    raise ValueError("blockwise attention adds DeBERTa's disentangled terms on global layers only, not with a window")
  if isinstance(local, (bool, np.bool_)):
    return (local_ if local else global_)(q, k, v)
  return jax.lax.cond(local, local_, global_, q, k, v)
