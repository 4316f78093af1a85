"""Dropout whose mask is a hash of (seed, element index), recomputed in the backward pass.

`model.dropout_impl="rng"` (`BertConfig`'s default) is flax's `nn.Dropout`: the mask comes from the `dropout` PRNG
stream (threefry or rbg bits, `train.prng_impl`) and is kept from the forward pass for the backward. With `"hash"`
(the default of `configs/pretrain.py` and `configs/finetune.py`; hidden and XLA-path attention dropout) the
mask is a 32-bit integer hash of a counter (the element's flat index) and a per-call seed drawn from the same
stream: a few integer operations that fuse into the surrounding elementwise work, and a backward pass that
recomputes the mask instead of reading a stored one, so nothing of the activation's size is written for it. The
fused attention kernel (`bertjax.kernels.attention`) draws its probability dropout the same way.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors

GOLDEN = np.uint32(0x9E3779B9)


def mix(x):
  """A bijective 32-bit integer hash (xor-shift-multiply, 'lowbias32'): uniform bits from a counter."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def keep_from_counter(seed, counter, rate):
  """True where an element with this uint32 counter is kept: P(keep) = 1 - rate to within 2⁻²⁴."""
  bits = mix(counter ^ mix(seed.astype(jnp.uint32) + GOLDEN))
  threshold = np.int32(round(rate * (1 << 24)))
  return (bits >> 8).astype(jnp.int32) >= threshold


COUNTER_LIMIT = 1 << 32  # a uint32 counter names this many elements


def keep_mask(seed, shape, rate):
  """The keep mask of a tensor of `shape`: element i (row-major flat index) kept per its hash. A tensor of 2³² or
  more elements hashes each leading-axis slice under a seed of its own, so that no two elements share a counter."""
  seed = jnp.asarray(seed, jnp.uint32)
  first = 0
  if int(np.prod(shape)) >= COUNTER_LIMIT and len(shape) > 1:
    seed = mix(seed + jax.lax.broadcasted_iota(jnp.uint32, shape, 0) * GOLDEN)
    first = 1
  if int(np.prod(shape[first:])) >= COUNTER_LIMIT:
    raise errors.ConfigError(f"hash dropout: {shape[first:]} has 2^32 or more elements; split the tensor or use "
                     "model.dropout_impl='rng'")
  counter = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(first, len(shape))):
    counter = counter + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
    stride *= shape[axis]
  return keep_from_counter(seed, counter, rate)


def _apply(x, seed, rate):
  keep = keep_mask(seed, x.shape, rate)
  # The scale stays float32: rounded to bfloat16, 1/(1 - 0.1) is 1.109375, a 0.16% shrink at every site.
  scaled = (x.astype(jnp.float32) * jnp.float32(1.0 / (1.0 - rate))).astype(x.dtype)
  return jnp.where(keep, scaled, jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def hash_dropout(x, seed, rate: float):
  """x with each element zeroed with probability `rate` and the rest scaled by 1/(1 - rate); seed: uint32 scalar.

  The same (seed, shape) always gives the same mask; the gradient is the incoming one through the same mask."""
  return _apply(x, seed, rate)


def _fwd(x, seed, rate):
  return _apply(x, seed, rate), seed


def _bwd(rate, seed, g):
  # The barrier makes the backward's mask a computation of its own: without it XLA's common-subexpression pass
  # may merge it with the forward's and keep that mask in memory between the two passes.
  seed = jax.lax.optimization_barrier(seed)
  return _apply(g, seed, rate), None


hash_dropout.defvjp(_fwd, _bwd)
