"""Attention backends as one table (`BACKENDS`, run through `attend`), and the kernels behind them: XLA's own ops
(`xla`), FlashAttention-style blocks on XLA (`blockwise`), Pallas attention with fused hash dropout and TPU splash
attention (`attention`), cuDNN through `jax.nn.dot_product_attention`, and hash dropout (`dropout`).

Every backend takes q, k, v [B, L, H, D], the masks the encoder made once per batch (`ctx`, see
`bertjax.model.context`), the model config's attention fields, whether this layer is local (a Python bool, or
traced under a scanned stack), the query rows of a pruned last layer (or None), and the dropout key (None: no
dropout); each returns [B, Q|L, H, D]. A backend that cannot run a case (dropout in a fused kernel, a few query
rows in a square-block kernel) runs the XLA path instead.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.kernels import attention as attention_lib
from bertjax.kernels import blockwise
from bertjax.kernels.xla import attention_mask, band_mask, dot_product_attention, mask_rows, rows_of, select


def _masks(ctx, cfg, local):
  """The boolean mask of this layer (its sliding window when local) and the additive score bias, if any: the
  layer's own ("bias", DeBERTa's disentangled terms) or the stack's ALiBi."""
  mask = ctx["mask"]
  if cfg.local_attention:
    mask = select(local, ctx["local_mask"], mask)
  return mask, ctx.get("bias", ctx.get("alibi"))


def _xla(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition, mask=None, bias=None):
  del partition
  if mask is None:
    mask, bias = _masks(ctx, cfg, local)
    if queries is not None:
      mask = mask_rows(mask, queries)
      bias = None if bias is None else rows_of(bias, queries)
  return dot_product_attention(q, k, v, mask, dropout_rate=cfg.attention_dropout_rate, dropout_rng=dropout_rng,
                               deterministic=dropout_rng is None, dropout_impl=cfg.dropout_impl, bias=bias)


def _fused(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition, implementation=None):
  """jax.nn.dot_product_attention (cuDNN, or JAX's choice), which runs without dropout."""
  if dropout_rng is not None:
    return _xla(q, k, v, ctx, cfg, local=local, queries=queries, dropout_rng=dropout_rng, partition=partition)
  mask, _ = _masks(ctx, cfg, local)
  if queries is not None:
    mask = mask_rows(mask, queries)
  # cuDNN takes the mask as a bias of full [B, 1, Lq, Lk] shape, not a key-padding [B, 1, 1, Lk] broadcast.
  mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[1], k.shape[1]))
  return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def _pallas(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition):
  """bertjax's Pallas kernel (square blocks, hash dropout fused)."""
  if queries is not None:
    return _xla(q, k, v, ctx, cfg, local=local, queries=queries, dropout_rng=dropout_rng, partition=partition)
  mask, _ = _masks(ctx, cfg, local)
  seed = None if dropout_rng is None else jax.random.bits(dropout_rng, (), jnp.uint32)
  return attention_lib.fused_attention(q, k, v, mask, dropout_rate=cfg.attention_dropout_rate, seed=seed,
                                       partition=partition)


def _splash_as_boolean(ids, cfg, local):
  """The [B, 1, L, L] mask the XLA path takes in place of the splash kernel's segment ids."""
  dense = attention_mask(ids > 0, ids)
  if not cfg.local_attention:
    return dense
  return select(local, dense & band_mask(ids.shape[1], cfg.local_attention), dense)


def _splash(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition):
  """TPU splash attention over segment ids (`ctx["mask"]` holds them), a local layer's kernel skipping the blocks
  outside its band; without dropout only."""
  ids = ctx["mask"]
  if queries is not None or dropout_rng is not None:
    mask = _splash_as_boolean(ids, cfg, local)
    mask = mask if queries is None else mask_rows(mask, queries)
    return _xla(q, k, v, ctx, cfg, local=local, queries=queries, dropout_rng=dropout_rng, partition=partition,
                mask=mask)

  def kernel(window):
    return lambda q, k, v: attention_lib.splash_attention(q, k, v, ids, window=window, partition=partition)
  if not cfg.local_attention or isinstance(local, (bool, np.bool_)):
    return kernel(cfg.local_attention if local else 0)(q, k, v)
  return jax.lax.cond(local, kernel(cfg.local_attention), kernel(0), q, k, v)  # a scanned stack: the layer's own


def _blockwise(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition):
  """Key blocks with an online softmax (global layers) or chunks within the window (local layers): time follows
  the mask, memory grows with L."""
  del partition
  no_dropout = dropout_rng is None
  return blockwise.attention(q, k, v, ctx["valid"], ctx.get("segments"), local=local, window=cfg.local_attention,
                             block=cfg.attention_block, queries=queries,
                             dropout_rate=0.0 if no_dropout else cfg.attention_dropout_rate, dropout_rng=dropout_rng,
                             dropout_impl=cfg.dropout_impl,
                             fused=(no_dropout and "segments" not in ctx and jax.default_backend() == "gpu"
                                    and q.dtype in (jnp.bfloat16, jnp.float16)),
                             per_head=jax.default_backend() == "cpu", rel=ctx.get("rel_terms"))


BACKENDS = {"xla": _xla, "cudnn": functools.partial(_fused, implementation="cudnn"), "auto": _fused,
            "pallas": _pallas, "splash": _splash, "blockwise": _blockwise}


def attend(impl: str, q, k, v, ctx, cfg, *, local, queries=None, dropout_rng=None, partition=None):
  """Self-attention by the backend `impl` (a key of BACKENDS; `BertConfig.attention_at` picks it)."""
  return BACKENDS[impl](q, k, v, ctx, cfg, local=local, queries=queries, dropout_rng=dropout_rng,
                        partition=partition)


__all__ = ["BACKENDS", "attend", "attention_mask", "band_mask", "dot_product_attention", "mask_rows", "rows_of",
           "select"]
