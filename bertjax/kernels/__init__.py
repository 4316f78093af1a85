"""Attention backends as one table (`BACKENDS`, run through `attend`), and the kernels behind them: XLA's own ops
(`xla`), FlashAttention-style blocks on XLA (`blockwise`), Pallas attention with fused hash dropout and TPU splash
attention (`attention`), cuDNN through `jax.nn.dot_product_attention`, and hash dropout (`dropout`).

Every backend takes q, k, v [B, L, H, D], the masks the encoder made once per batch (`ctx`, see
`bertjax.model.context`), the model config's attention fields, whether this layer is local (a Python bool, or
traced under a scanned stack), the query rows of a pruned last layer (or None), and the dropout key (None: no
dropout); each returns [B, Q|L, H, D]. Each backend's record (`Backend`) says which score terms, dropout and query
rows it runs; `BertConfig` refuses a family a backend cannot run, and a case it does not run itself (dropout in a
fused kernel, a few query rows in a square-block kernel) runs the XLA path instead.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

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
  """jax.nn.dot_product_attention (cuDNN, or JAX's choice)."""
  del dropout_rng, partition
  mask, _ = _masks(ctx, cfg, local)
  if queries is not None:
    mask = mask_rows(mask, queries)
  # cuDNN takes the mask as a bias of full [B, 1, Lq, Lk] shape, not a key-padding [B, 1, 1, Lk] broadcast.
  mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[1], k.shape[1]))
  return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def _pallas(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition):
  """bertjax's Pallas kernel (square blocks, hash dropout fused)."""
  del queries
  mask, _ = _masks(ctx, cfg, local)
  seed = None if dropout_rng is None else jax.random.bits(dropout_rng, (), jnp.uint32)
  return attention_lib.fused_attention(q, k, v, mask, dropout_rate=cfg.attention_dropout_rate, seed=seed,
                                       partition=partition)


def _splash_on_xla(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition):
  """The XLA path given splash's context, whose mask is segment ids: the [B, 1, L, L] mask they stand for."""
  ids = ctx["mask"]
  mask = attention_mask(ids > 0, ids)
  if cfg.local_attention:
    mask = select(local, mask & band_mask(ids.shape[1], cfg.local_attention), mask)
  mask = mask if queries is None else mask_rows(mask, queries)
  return _xla(q, k, v, ctx, cfg, local=local, queries=queries, dropout_rng=dropout_rng, partition=partition,
              mask=mask)


def _splash(q, k, v, ctx, cfg, *, local, queries, dropout_rng, partition):
  """TPU splash attention over segment ids (`ctx["mask"]` holds them), a local layer's kernel skipping the blocks
  outside its band."""
  del queries, dropout_rng
  ids = ctx["mask"]

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


# The terms a family adds to the scores, each of which a backend runs or does not.
SCORE_TERMS = ("alibi", "disentangled", "window")


@dataclasses.dataclass(frozen=True)
class Backend:
  """An attention backend and what it runs: the score terms it adds itself (ALiBi's bias, DeBERTa's
  disentangled terms, a sliding window), whether it takes more than one of them in the same layer, whether it
  applies attention dropout and runs a pruned last layer's few query rows itself, and the form of the mask the
  encoder's `context` makes for it. A case it does not run itself runs on `fallback` (the XLA path, given the
  same context)."""
  run: Callable
  terms: frozenset = frozenset()
  together: bool = False
  dropout: bool = True
  queries: bool = True
  mask: str = "boolean"  # boolean: [B, 1, L, L] | segments: splash's segment ids | blocks: made block by block
  fallback: Callable = _xla

  def runs(self, terms) -> bool:
    """Whether this backend adds the score terms `terms` (a set of SCORE_TERMS) itself."""
    terms = frozenset(terms)
    return terms <= self.terms and (self.together or len(terms) <= 1)


BACKENDS = {
    "xla": Backend(_xla, terms=frozenset(SCORE_TERMS), together=True),
    "blockwise": Backend(_blockwise, terms=frozenset({"window", "disentangled"}), mask="blocks"),
    "splash": Backend(_splash, terms=frozenset({"window"}), dropout=False, queries=False, mask="segments",
                      fallback=_splash_on_xla),
    "pallas": Backend(_pallas, queries=False),
    "cudnn": Backend(functools.partial(_fused, implementation="cudnn"), dropout=False),
    "auto": Backend(_fused, dropout=False),
}


def runs_on(terms) -> list[str]:
  """The backends that add the score terms `terms` themselves, the XLA path first."""
  return [name for name, backend in BACKENDS.items() if backend.runs(terms)]


def attend(impl: str, q, k, v, ctx, cfg, *, local, queries=None, dropout_rng=None, partition=None):
  """Self-attention by the backend `impl` (a key of BACKENDS; `BertConfig.attention_at` picks it), or by its
  fallback for dropout or query rows it does not run itself."""
  backend = BACKENDS[impl]
  own = (dropout_rng is None or backend.dropout) and (queries is None or backend.queries)
  return (backend.run if own else backend.fallback)(q, k, v, ctx, cfg, local=local, queries=queries,
                                                    dropout_rng=dropout_rng, partition=partition)


__all__ = ["BACKENDS", "Backend", "SCORE_TERMS", "attend", "attention_mask", "band_mask", "dot_product_attention",
           "mask_rows", "rows_of", "runs_on", "select"]
