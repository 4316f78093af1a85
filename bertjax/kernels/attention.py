"""Fused self-attention with dropout for GPUs: one Pallas (Triton) program per (batch row, head).

softmax(QKᵀ/√d_k + mask)·V with dropout on the probabilities, forward and backward, for sequences that fit one block
(L <= 256: BERT's 128 and GLUE lengths). The XLA path writes the [B, H, L, L] scores, probabilities, dropout bits
and mask to memory and reads them back several times; here they never leave the chip. The dropout mask is a
counter-based hash of (seed, batch, head, query, key), so the backward pass recomputes the forward's mask exactly
and nothing [B, H, L, L] is stored. Used by `model.SelfAttention` when `attention_impl="pallas"`; on CPU the same
kernels run in Pallas' interpreter (tests); on TPU use `xla` or `splash`.

For TPUs, `splash_attention` wraps JAX's Pallas splash attention kernel (`attention_impl="splash"`): fused, no
dropout, packed rows masked by segment ids.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from bertjax import errors
from bertjax.kernels import dropout as dropout_lib

MAX_LENGTH = 256


def keep_mask(seed, b, h, num_heads, length_q, length_k, rate, q_index, k_index):
  """Dropout keep mask of row b, head h (q_index/k_index: broadcastable uint32 positions). P(keep) = 1 - rate
  to within 2⁻²⁴. The same function serves the kernels and the reference."""
  base = (b * num_heads + h) * length_q
  counter = ((base + q_index) * jnp.uint32(length_k) + k_index).astype(jnp.uint32)
  return dropout_lib.keep_from_counter(seed, counter, rate)


def reference(q, k, v, mask, seed, rate):
  """The same function in plain jnp (for tests): q, k, v [B, L, H, D], mask [B, 1, L, L] bool."""
  b, lq, h, d = q.shape
  lk = k.shape[1]
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(d).astype(np.float32)
  s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
  p = jax.nn.softmax(s, axis=-1)
  if rate > 0:
    bi = jnp.arange(b, dtype=jnp.uint32)[:, None, None, None]
    hi = jnp.arange(h, dtype=jnp.uint32)[None, :, None, None]
    qi = jnp.arange(lq, dtype=jnp.uint32)[None, None, :, None]
    ki = jnp.arange(lk, dtype=jnp.uint32)[None, None, None, :]
    keep = keep_mask(jnp.asarray(seed, jnp.uint32), bi, hi, h, lq, lk, rate, qi, ki)
    p = jnp.where(keep, p / (1.0 - rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)


def _dot(a, b, trans_a=False, trans_b=False):
  if trans_a:
    a = a.T
  if trans_b:
    b = b.T
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _softmax_and_keep(q, k, mask, seed, scale, rate, num_heads):
  b, h = pl.program_id(0), pl.program_id(1)
  s = _dot(q, k, trans_b=True) * scale
  s = jnp.where(mask != 0, s, jnp.finfo(jnp.float32).min)
  s = s - jnp.max(s, axis=-1, keepdims=True)
  e = jnp.exp(s)
  p = e / jnp.sum(e, axis=-1, keepdims=True)
  if rate == 0.0:
    return p, None
  lq, lk = p.shape
  qi = jax.lax.broadcasted_iota(jnp.uint32, (lq, lk), 0)
  ki = jax.lax.broadcasted_iota(jnp.uint32, (lq, lk), 1)
  keep = keep_mask(seed, b.astype(jnp.uint32), h.astype(jnp.uint32), num_heads, lq, lk, rate, qi, ki)
  return p, keep


def _fwd_kernel(seed_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, *, scale, rate, num_heads):
  q, k, v = q_ref[...], k_ref[...], v_ref[...]
  p, keep = _softmax_and_keep(q, k, mask_ref[...], seed_ref[0], scale, rate, num_heads)
  if keep is not None:
    p = jnp.where(keep, p * (1.0 / (1.0 - rate)), 0.0)
  o_ref[...] = _dot(p.astype(v.dtype), v).astype(o_ref.dtype)


def _bwd_kernel(seed_ref, q_ref, k_ref, v_ref, mask_ref, do_ref, dq_ref, dk_ref, dv_ref, *, scale, rate, num_heads):
  q, k, v, do, mask = q_ref[...], k_ref[...], v_ref[...], do_ref[...], mask_ref[...]
  p, keep = _softmax_and_keep(q, k, mask, seed_ref[0], scale, rate, num_heads)
  inv = 1.0 / (1.0 - rate)
  pd = p if keep is None else jnp.where(keep, p * inv, 0.0)  # the probabilities the forward multiplied V by
  dv_ref[...] = _dot(pd.astype(do.dtype), do, trans_a=True).astype(dv_ref.dtype)
  dp = _dot(do, v, trans_b=True)  # d loss / d pd
  if keep is not None:
    dp = jnp.where(keep, dp * inv, 0.0)
  ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True)) * scale
  ds = jnp.where(mask != 0, ds, 0.0).astype(q.dtype)  # masked scores are constants: no gradient flows through them
  dq_ref[...] = _dot(ds, k).astype(dq_ref.dtype)
  dk_ref[...] = _dot(ds, q, trans_a=True).astype(dk_ref.dtype)


def _specs(shape, mask_shape):
  _, length, _, dim = shape
  row = pl.BlockSpec((None, length, None, dim), lambda b, h: (b, 0, h, 0))
  mask = pl.BlockSpec((None, None, mask_shape[2], mask_shape[3]), lambda b, h: (b, 0, 0, 0))
  seed = pl.BlockSpec((1,), lambda b, h: (0,))
  return seed, row, mask


def _call(kernel, n_out, q, mask, args, rate, interpret):
  b, length, h, d = q.shape
  seed_spec, row, mask_spec = _specs(q.shape, mask.shape)
  in_specs = [seed_spec, row, row, row, mask_spec] + [row] * (len(args) - 5)
  params = None
  if not interpret:
    from jax.experimental.pallas import triton as pl_triton
    params = pl_triton.CompilerParams(num_warps=8 if length >= 128 else 4, num_stages=1)
  out = jax.ShapeDtypeStruct(q.shape, q.dtype)
  return pl.pallas_call(
      functools.partial(kernel, scale=float(1.0 / np.sqrt(d)), rate=float(rate), num_heads=h),
      grid=(b, h), in_specs=in_specs, out_specs=[row] * n_out if n_out > 1 else row,
      out_shape=[out] * n_out if n_out > 1 else out, interpret=interpret, compiler_params=params)(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, mask, seed, rate, interpret):
  return _call(_fwd_kernel, 1, q, mask, (seed, q, k, v, mask), rate, interpret)


def _attention_fwd(q, k, v, mask, seed, rate, interpret):
  return _attention(q, k, v, mask, seed, rate, interpret), (q, k, v, mask, seed)


def _attention_bwd(rate, interpret, res, do):
  q, k, v, mask, seed = res
  dq, dk, dv = _call(_bwd_kernel, 3, q, mask, (seed, q, k, v, mask, do.astype(q.dtype)), rate, interpret)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def fused_attention(q, k, v, mask, *, dropout_rate=0.0, seed=None, interpret=None, partition=None):
  """q, k, v [B, L, H, D]; mask broadcastable to [B, 1, L, L] (True = attend); seed: uint32 scalar (dropout).

  `partition`: the mesh axes of q's [batch, length, heads, kv] dimensions (a PartitionSpec) when tracing under a
  mesh of several devices. The kernel then runs on each device's block through `shard_map` (it cannot be split by
  the compiler), each block's seed offset by its position along the batch and head axes so that no two blocks
  share dropout bits; length and head size must not be split."""
  b, length, h, d = q.shape
  if length > MAX_LENGTH or length & (length - 1) or length < 16:
    raise errors.ConfigError(f"attention_impl='pallas' takes sequence lengths 16..{MAX_LENGTH} that are powers of two, "
                     f"got {length}; use attention_impl='xla'")
  if d & (d - 1) or d < 16:
    raise errors.ConfigError(f"attention_impl='pallas' needs a power-of-two head size >= 16, got {d}")
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  mask = jnp.broadcast_to(mask, (b, 1, length, k.shape[1])).astype(jnp.int8)
  rate = float(dropout_rate) if seed is not None else 0.0
  seed = jnp.reshape(jnp.asarray(0 if seed is None else seed, jnp.uint32), (1,))
  mesh, axes = _local_axes(partition, "pallas")
  if mesh is None:
    return _attention(q, k, v, mask, seed, rate, interpret)
  batch_axes, head_axes = axes
  spec = jax.sharding.PartitionSpec(batch_axes or None, None, head_axes or None, None)
  mask_spec = jax.sharding.PartitionSpec(batch_axes or None, None, None, None)

  def local(q, k, v, mask, seed):
    block = jnp.uint32(0)
    for a in batch_axes + head_axes:
      block = block * jnp.uint32(mesh.shape[a]) + jax.lax.axis_index(a).astype(jnp.uint32)
    return _attention(q, k, v, mask, seed + block * dropout_lib.GOLDEN, rate, interpret)

  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, mask_spec, jax.sharding.PartitionSpec()),
                       out_specs=spec, check_vma=False)(q, k, v, mask, seed)


def _local_axes(partition, impl):
  """(mesh, (batch axes, head axes)) for running a kernel per device block through `shard_map`, or (None, None)
  on one device. Kernels cannot be split by the compiler; the sequence and head size must not be split."""
  mesh = jax.sharding.get_abstract_mesh()
  if partition is None or mesh.empty or mesh.size == 1:
    return None, None
  parts = (list(partition) + [None] * 4)[:4]
  batch_axes, length_axes, head_axes, dim_axes = (
      tuple(a) if isinstance(a, (tuple, list)) else (() if a is None else (a,)) for a in parts)
  if any(mesh.shape[a] > 1 for a in length_axes + dim_axes):
    raise errors.ConfigError(f"attention_impl={impl!r} cannot split the sequence or head size over mesh axes "
                     f"{length_axes + dim_axes}; use attention_impl='xla'")
  return mesh, (batch_axes, head_axes)


# --- TPU: Pallas splash attention (block-sparse flash attention; packed rows through segment ids) ---------------

SPLASH_MAX_BLOCK = 512


def splash_segments(input_mask, attention_segment_ids=None):
  """The [B, L] int32 segment ids splash attention masks by: a query attends to the keys of its own segment.
  Unpacked rows: 1 for tokens, 0 for padding; packed rows: each example's id, 0 for padding. Real tokens see
  exactly what `model.attention_mask` lets them see (padding rows see only padding; their outputs are unused)."""
  if attention_segment_ids is not None:
    return attention_segment_ids.astype(jnp.int32)
  return input_mask.astype(jnp.int32)


def _splash_kernel(num_heads, length, interpret, window=0):
  """Built afresh in every trace: the kernel object holds arrays made while tracing, so a cached one leaks
  tracers from one jit into the next. `window`: a sliding window of that many tokens (|i - j| <= window / 2,
  as `model.band_mask`), whose blocks outside the band the kernel skips; 0: every key."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  block = min(length, SPLASH_MAX_BLOCK)
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  one = (sm.LocalMask((length, length), window_size=(window // 2, window // 2), offset=0) if window else
         sm.FullMask((length, length)))  # bidirectional
  mask = sm.MultiHeadMask([one for _ in range(num_heads)])
  return sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret), sk


def splash_attention(q, k, v, segment_ids, *, window=0, interpret=None, partition=None):
  """softmax(QKᵀ/√d_k)·V through the TPU splash kernel, without dropout. q, k, v [B, L, H, D];
  segment_ids [B, L] from `splash_segments`; `window` > 0: a sliding window (ModernBERT's local layers).
  `partition` as in `fused_attention` (batch and heads may be split).
  The kernel's blocks are multiples of 128 long: shorter or uneven rows are padded to the next multiple of 128
  (of 512 past 512) with a segment id no real token has, and the padding is cut from the output.
  On CPU the kernel runs in Pallas' interpreter (tests); on GPU use attention_impl='pallas' or 'cudnn'."""
  length, d = q.shape[1], q.shape[3]
  if interpret is None and jax.default_backend() == "gpu":
    raise errors.ConfigError("attention_impl='splash' is the TPU kernel; on GPU use attention_impl='pallas' or 'cudnn'")
  unit = 128 if length <= SPLASH_MAX_BLOCK else SPLASH_MAX_BLOCK
  padded = -(-length // unit) * unit
  scale = np.float32(1.0 / np.sqrt(d))

  def run_with(interpret, q, k, v, segment_ids):
    kernel, sk = _splash_kernel(q.shape[2], padded, interpret, window)
    pad = [(0, 0), (0, padded - length), (0, 0), (0, 0)]
    heads_first = lambda t: jnp.swapaxes(jnp.pad(t, pad), 1, 2)  # [B, L, H, D] -> [B, H, L', D]
    segment_ids = jnp.pad(segment_ids, [(0, 0), (0, padded - length)], constant_values=-1)
    one = lambda q, k, v, s: kernel(q, k, v, segment_ids=sk.SegmentIds(q=s, kv=s))
    out = jax.vmap(one)(heads_first(q * scale.astype(q.dtype)), heads_first(k), heads_first(v), segment_ids)
    return jnp.swapaxes(out, 1, 2)[:, :length]

  def run(*args):
    if interpret is not None:
      return run_with(interpret, *args)
    # Mosaic when lowering for TPU (on a TPU, or ahead of time for one from a CPU host: bertjax.aot), the
    # interpreter elsewhere; only the branch of the platform compiled for is lowered.
    return jax.lax.platform_dependent(*args, tpu=functools.partial(run_with, False),
                                      default=functools.partial(run_with, True))

  mesh, axes = _local_axes(partition, "splash")
  if mesh is None:
    return run(q, k, v, segment_ids)
  batch_axes, head_axes = axes
  spec = jax.sharding.PartitionSpec(batch_axes or None, None, head_axes or None, None)
  seg_spec = jax.sharding.PartitionSpec(batch_axes or None, None)
  return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec, seg_spec), out_specs=spec,
                       check_vma=False)(q, k, v, segment_ids)
