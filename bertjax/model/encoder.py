"""The layer stack (plain, scanned, rematerialised, its last layer pruned to the rows the heads read) and
`BertModel`, the encoder with its pooler.

A batch is a dict with the original BERT feature names: `input_ids`, `input_mask`, `segment_ids`, and for
pre-training `masked_lm_positions`. Packed rows may add `position_ids` (restarting per example) and
`attention_segment_ids` (1..n per example, 0 = padding): tokens then attend only within their example.
"""
from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import kernels
from bertjax.kernels import attention as attention_lib
from bertjax.kernels.xla import attention_mask, band_mask
from bertjax.model.config import BertConfig
from bertjax.model.layers import (
  Dense,
  Embeddings,
  Layer,
  alibi_bias,
  dropout,
  layer_norm,
  relative_buckets,
  rotary_tables,
  take_rows,
)


class _ScanLayer(nn.Module):
  """Adapter giving `Layer` the (carry, x) -> (carry, y) signature `nn.scan` needs."""
  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x, ctx, index):
    return _layer_class(self.cfg)(self.cfg, name="layer")(x, ctx, self.deterministic, None, index), None


def _layer_class(cfg: BertConfig):
  if cfg.remat == "none":
    return Layer
  policy = None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return nn.remat(Layer, policy=policy, static_argnums=(3,))


def _scanned_layers(cfg: BertConfig, deterministic: bool, length: int, name: str):
  """`length` layers under nn.scan, parameters stacked on a leading `layers` axis (built in the caller's scope).
  Called as (x, ctx, indices): `indices` [length] are the layers' numbers (local or global attention)."""
  unroll = cfg.for_platform(jax.default_backend()).scan_unroll  # built without a mesh: the default backend's
  return nn.scan(_ScanLayer, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                 in_axes=(nn.broadcast, 0), length=length, unroll=min(unroll, length),
                 metadata_params={nn.PARTITION_NAME: "layers"})(cfg, deterministic, name=name)


def _indices(n: int):
  return jnp.arange(n, dtype=jnp.int32)


class _SplitStack(nn.Module):
  """The scanned stack with its last layer computed only at `queries`. Reads the stacked parameters as `head`
  (layers 0..L-2, scanned) and `last` (layer L-1), a view `Encoder` makes with nn.map_variables; apply only."""
  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x, ctx, queries):
    cfg = self.cfg
    last = cfg.num_layers - 1
    if last:
      x, _ = _scanned_layers(cfg, self.deterministic, last, "head")(x, ctx, _indices(last))
    return _layer_class(cfg)(cfg, name="last")(x, ctx, self.deterministic, queries, last)


def _split_last(variables):
  """Stacked layer parameters {"layer": [L, ...]} as {"head": {"layer": [L-1, ...]}, "last": [...]}."""
  layer = variables["params"]["layer"]
  last = jax.tree_util.tree_leaves(layer)[0].shape[0] - 1
  return {"params": {"head": {"layer": jax.tree_util.tree_map(lambda a: a[:last], layer)},
                     "last": jax.tree_util.tree_map(lambda a: a[last], layer)}}


class Encoder(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, ctx, deterministic: bool, queries=None):
    """x [B, L, d] -> [B, L, d]; with `queries` [B, Q], the last layer only at those positions: [B, Q, d].
    `ctx`: what every layer reads (see `context`)."""
    cfg = self.cfg
    if cfg.scan_layers:
      if queries is None or self.is_initializing():  # init always builds the whole stacked layout
        x, _ = _scanned_layers(cfg, deterministic, cfg.num_layers, "layers")(x, ctx, _indices(cfg.num_layers))
        x = x if queries is None else take_rows(x, queries)
      else:  # the same stacked parameters, viewed as layers 0..L-2 and layer L-1
        x = nn.map_variables(_SplitStack, "params", trans_in_fn=_split_last, mutable=False)(
            cfg, deterministic, name="layers")(x, ctx, queries)
    else:
      layer = _layer_class(cfg)
      for i in range(cfg.num_layers):
        x = layer(cfg, name=f"layer_{i}")(x, ctx, deterministic, queries if i == cfg.num_layers - 1 else None, i)
    if cfg.layer_norm == "pre":
      x = layer_norm(cfg, "final_ln")(x).astype(cfg.compute_dtype)
    return x


def context(cfg: BertConfig, batch):
  """What every layer reads, made once per batch: the attention mask in the form the attention implementation
  takes, and as the switches ask, the sliding-window mask, rotary tables (global and local θ) and ALiBi bias."""
  length = batch["input_ids"].shape[1]
  form = kernels.BACKENDS[cfg.attention_at(length)].mask
  if form == "blocks":  # masks made block by block from the key mask and segment ids
    ctx = {"valid": batch["input_mask"].astype(bool)}
    if batch.get("attention_segment_ids") is not None:
      ctx["segments"] = batch["attention_segment_ids"]
  else:
    if form == "segments":  # the kernel masks by segment ids, not a boolean [L, L] mask
      mask = attention_lib.splash_segments(batch["input_mask"], batch.get("attention_segment_ids"))
    else:
      mask = attention_mask(batch["input_mask"], batch.get("attention_segment_ids"))
    ctx = {"mask": mask}
    if cfg.local_attention and form == "boolean":  # splash takes the window as a kernel mask
      ctx["local_mask"] = mask & band_mask(length, cfg.local_attention)
  positions = batch.get("position_ids")
  positions = jnp.arange(length, dtype=jnp.int32)[None] if positions is None else positions
  if cfg.position_embedding == "rotary":
    ctx["rope"] = rotary_tables(positions, cfg.head_dim, cfg.rope_theta)
    if cfg.local_attention and cfg.rope_theta_local and cfg.rope_theta_local != cfg.rope_theta:
      ctx["rope_local"] = rotary_tables(positions, cfg.head_dim, cfg.rope_theta_local)
  elif cfg.position_embedding == "alibi":
    ctx["alibi"] = alibi_bias(positions, cfg.num_heads)
  elif cfg.position_embedding == "disentangled":
    positions = jnp.broadcast_to(positions, batch["input_ids"].shape)
    ctx["rel_index"] = relative_buckets(positions, cfg.position_buckets, cfg.max_relative_positions)
  return ctx


ENCODER_KEYS = ("input_ids", "input_mask", "segment_ids")


def check_batch(cfg: BertConfig, batch: Mapping[str, Any], required=ENCODER_KEYS):
  """Raise a clear error for a batch the model cannot take (before anything is traced further)."""
  missing = [k for k in required if k not in batch]
  if missing:
    raise KeyError(f"batch is missing {missing}; it has {sorted(batch)} "
                   f"(expected the original BERT feature names {list(required)})")
  shape = tuple(batch["input_ids"].shape)
  if len(shape) != 2:
    raise ValueError(f"input_ids must be [batch, length], got shape {shape}")
  for k in ("input_mask", "segment_ids", "position_ids", "attention_segment_ids"):
    if k in batch and tuple(batch[k].shape) != shape:
      raise ValueError(f"{k} has shape {tuple(batch[k].shape)}, input_ids has {shape}")
  # Packed rows carry explicit positions (each text's restart at 0) and may be longer than the position table.
  if shape[1] > cfg.max_length and "position_ids" not in batch:
    raise ValueError(f"sequence length {shape[1]} exceeds max_position_embeddings "
                     f"{cfg.max_position_embeddings}" + (f" less position_offset {cfg.position_offset}"
                                                          if cfg.position_offset else ""))


class BertModel(nn.Module):
  """The encoder: {"hidden": [B, L, d], "pooled": [B, d]} (pooled = tanh(W·h_[CLS] + b)).

  `shared_embeddings`: an `Embeddings` module owned by a parent, whose parameters this encoder reads rather than
  owning its own (ELECTRA's generator and discriminator share one)."""
  cfg: BertConfig
  shared_embeddings: nn.Module | None = None

  def setup(self):
    cfg = self.cfg
    if self.shared_embeddings is None:
      self.embeddings = Embeddings(cfg)
    if cfg.embed_dim != cfg.hidden_size:
      self.embeddings_project = Dense((cfg.hidden_size,), (None, "embed"), cfg)
    self.encoder = Encoder(cfg)
    self.pooler = Dense((cfg.hidden_size,), ("embed", "mlp"), cfg)
    if cfg.position_embedding == "disentangled":  # one table of relative embeddings, normalised, for every layer
      self.rel_embeddings = self.param("rel_embeddings", nn.with_logical_partitioning(
          nn.initializers.normal(cfg.initializer_range), (None, "embed")), (2 * cfg.position_buckets,
                                                                            cfg.hidden_size), cfg.params_dtype)
      self.rel_ln = layer_norm(cfg)
      self.rel_dropout = dropout(cfg)

  def __call__(self, batch, deterministic: bool = True, positions=None, pool: bool | str = True):
    """With `positions` [B, Q] (prune_final_layer): "hidden" is [B, Q, d] at those positions only, the last layer
    computed at them and at [CLS] alone; "pooled" is the same as without. `pool=False`: no pooler (nor [CLS]
    row), as an MLM-only model has none; `pool="cls"`: "cls_hidden", the [CLS] rows' final states, and no
    pooler (the heads of families without one read them)."""
    check_batch(self.cfg, batch)
    ids = batch["input_ids"]
    ctx = context(self.cfg, batch)
    if self.cfg.position_embedding == "disentangled":
      rel = self.rel_ln(self.rel_embeddings).astype(self.cfg.compute_dtype)
      ctx["rel"] = self.rel_dropout(rel, deterministic=deterministic)
    x = self.embedder(ids, batch["segment_ids"], batch.get("position_ids"), deterministic)
    if self.cfg.embed_dim != self.cfg.hidden_size:
      x = self.embeddings_project(x)
    cls_positions = batch.get("cls_positions")
    if positions is None:
      h = self.encoder(x, ctx, deterministic)
      if not pool:
        return {"hidden": h}
      cls_hidden = h[:, 0] if cls_positions is None else take_rows(h, cls_positions)
    else:
      if not pool:
        return {"hidden": self.encoder(x, ctx, deterministic, positions.astype(jnp.int32))}
      cls = jnp.zeros((ids.shape[0], 1), jnp.int32) if cls_positions is None else cls_positions.astype(jnp.int32)
      h = self.encoder(x, ctx, deterministic, jnp.concatenate([cls, positions.astype(jnp.int32)], axis=1))
      k = cls.shape[1]
      h, cls_hidden = h[:, k:], (h[:, 0] if cls_positions is None else h[:, :k])
    if pool == "cls":
      return {"hidden": h, "cls_hidden": cls_hidden}
    return {"hidden": h, "pooled": self.pool(cls_hidden)}

  def pool(self, cls_hidden):
    """tanh(Dense(h_[CLS])) of the [CLS] states: [B, d], or [B, K, d] for packed rows (one per example)."""
    return jnp.tanh(self.pooler(cls_hidden))

  @property
  def embedder(self):
    """The embeddings this encoder reads: its own, or the shared ones."""
    return self.embeddings if self.shared_embeddings is None else self.shared_embeddings

  def attend(self, x):
    """Logits against the word-embedding table (the tied MLM decoder), in float32; the rows padding the table
    to `vocab_multiple` are left out (never predicted)."""
    table = self.embedder.word_embeddings.embedding
    logits = jnp.einsum("...d,vd->...v", x, table.astype(x.dtype), preferred_element_type=jnp.float32)
    return logits[..., :self.cfg.vocab_size] if self.cfg.padded_vocab_size != self.cfg.vocab_size else logits


def dummy_batch(cfg: BertConfig, batch_size: int = 2, seq_len: int = 16, max_predictions: int = 4):
  """A zero batch of the right shapes and dtypes, for init and eval_shape."""
  ids = np.zeros((batch_size, seq_len), np.int32)
  preds = np.zeros((batch_size, max_predictions), np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": ids,
          "masked_lm_positions": preds, "masked_lm_ids": preds,
          "masked_lm_weights": np.zeros((batch_size, max_predictions), np.float32),
          "next_sentence_labels": np.zeros((batch_size,), np.int32)}
