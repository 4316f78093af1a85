"""The layers of the encoder: embeddings, self-attention (five backends), FFN, LayerNorm, dropout, one block.

Every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`, `layers`, ...); how they map
onto a device mesh is decided by the config's rules (see `sharding.py`). Activations are constrained with their
own names (`activation_batch`, `activation_length`, `activation_embed`, ...).
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.kernels import attention as attention_lib
from bertjax.kernels import dropout as dropout_lib
from bertjax.model.config import ACTIVATIONS, BertConfig

def _init(cfg: BertConfig):
  if cfg.initializer == "normal":
    return nn.initializers.normal(cfg.initializer_range)
  return nn.initializers.truncated_normal(cfg.initializer_range)


def _constrain(x, names):
  return nn.with_logical_constraint(x, names)


class Dense(nn.Module):
  """y = x·W + b over the last `in_dims` axes of x, with an N-D kernel named by `names`.

  A plain `self.param` + tensordot: `nn.DenseGeneral` with logical partitioning of N-D kernels fails under
  a mesh with rules in flax 0.12.
  """
  features: tuple[int, ...]
  names: tuple[str | None, ...]  # logical names of the kernel: input axes then output axes
  cfg: BertConfig
  in_dims: int = 1
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    features = tuple(self.features)
    in_shape = x.shape[-self.in_dims:]
    kernel = self.param("kernel", nn.with_logical_partitioning(_init(self.cfg), self.names),
                        in_shape + features, self.cfg.params_dtype)
    dtype = self.cfg.compute_dtype
    contract = tuple(range(x.ndim - self.in_dims, x.ndim))
    y = jnp.tensordot(x.astype(dtype), kernel.astype(dtype), axes=(contract, tuple(range(self.in_dims))))
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.names[self.in_dims:]),
                        features, self.cfg.params_dtype)
      y = y + bias.astype(dtype)
    return y


def layer_norm(cfg: BertConfig, name: str | None = None):
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=jnp.float32, param_dtype=cfg.params_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                      name=name)


class HashDropout(nn.Module):
  """`nn.Dropout`'s interface over `bertjax.kernels.dropout.hash_dropout`, its per-call seed from the `dropout` stream."""
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    return dropout_lib.hash_dropout(x, jax.random.bits(self.make_rng("dropout"), (), jnp.uint32), self.rate)


def dropout(cfg: BertConfig):
  """Hidden dropout at `cfg.dropout_rate`, masks drawn as `cfg.dropout_impl` says."""
  return HashDropout(cfg.dropout_rate) if cfg.dropout_impl == "hash" else nn.Dropout(cfg.dropout_rate)


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
  """PE(i, 2k) = sin(i / 10000^(2k/d)), PE(i, 2k+1) = cos(i / 10000^(2k/d))."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  two_k = np.arange(0, dim, 2, dtype=np.float64)[None, :]
  angle = pos / np.power(10000.0, two_k / dim)
  pe = np.zeros((length, dim), np.float64)
  pe[:, 0::2] = np.sin(angle)
  pe[:, 1::2] = np.cos(angle)
  return pe.astype(np.float32)


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


def take_rows(x, positions):
  """x[b, positions[b]]: [B, L, ...] -> [B, Q, ...]."""
  return jnp.take_along_axis(x, positions.reshape(positions.shape + (1,) * (x.ndim - 2)).astype(jnp.int32), axis=1)


def dot_product_attention(q, k, v, mask, *, dropout_rate=0.0, dropout_rng=None, deterministic=True,
                          dropout_impl="rng"):
  """softmax(QKᵀ/√d_k)·V per head. q, k, v: [B, L, H, D]; mask [B, 1|H, Lq, Lk]. Softmax in float32."""
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
  scores = scores / np.sqrt(q.shape[-1]).astype(np.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  if not deterministic and dropout_rate > 0.0:
    if dropout_impl == "hash":
      probs = dropout_lib.hash_dropout(probs, jax.random.bits(dropout_rng, (), jnp.uint32), dropout_rate)
    else:
      keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
      probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)


class SelfAttention(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool, queries=None):
    """Self-attention of x [B, L, d]; with `queries` [B, Q] only those positions' outputs ([B, Q, d]), every
    position still a key and value. `mask` as the attention implementation takes it (see BertModel)."""
    cfg = self.cfg
    shape = (cfg.num_heads, cfg.head_dim)
    q = Dense(shape, ("embed", "heads", "kv"), cfg, name="query")(x if queries is None else take_rows(x, queries))
    k = Dense(shape, ("embed", "heads", "kv"), cfg, name="key")(x)
    v = Dense(shape, ("embed", "heads", "kv"), cfg, name="value")(x)
    names = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    q, k, v = (_constrain(t, names) for t in (q, k, v))
    no_dropout = deterministic or cfg.attention_dropout_rate == 0.0
    use_fused = cfg.attention_impl in ("cudnn", "auto") and no_dropout
    impl = cfg.attention_impl
    if queries is not None:  # a few query rows: the Pallas kernels take square blocks; masks as the XLA path has
      mask = mask_rows(attention_mask(mask > 0, mask) if impl == "splash" else mask, queries)
      impl = impl if use_fused else "xla"
    if impl == "splash":  # `mask` holds splash_segments ids [B, L]
      if no_dropout:
        z = attention_lib.splash_attention(q, k, v, mask, partition=nn.logical_to_mesh_axes(names))
      else:
        z = dot_product_attention(q, k, v, attention_mask(mask > 0, mask),
                                  dropout_rate=cfg.attention_dropout_rate, dropout_rng=self.make_rng("dropout"),
                                  deterministic=False, dropout_impl=cfg.dropout_impl)
    elif impl == "pallas":
      training = not deterministic and cfg.attention_dropout_rate > 0.0
      seed = jax.random.bits(self.make_rng("dropout"), (), jnp.uint32) if training else None
      z = attention_lib.fused_attention(q, k, v, mask, dropout_rate=cfg.attention_dropout_rate, seed=seed,
                                        partition=nn.logical_to_mesh_axes(names))
    elif use_fused:
      impl = "cudnn" if impl == "cudnn" else None
      # cuDNN takes the mask as a bias of full [B, 1, Lq, Lk] shape, not a key-padding [B, 1, 1, Lk] broadcast.
      mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[1], k.shape[1]))
      z = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)
    else:
      rng = None if deterministic or cfg.attention_dropout_rate == 0.0 else self.make_rng("dropout")
      z = dot_product_attention(q, k, v, mask, dropout_rate=cfg.attention_dropout_rate,
                                dropout_rng=rng, deterministic=deterministic, dropout_impl=cfg.dropout_impl)
    z = _constrain(z, names)
    return Dense((cfg.hidden_size,), ("heads", "kv", "embed"), cfg, in_dims=2, name="out")(z)


class Mlp(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    h = Dense((cfg.intermediate_size,), ("embed", "mlp"), cfg, name="wi")(x)
    h = ACTIVATIONS[cfg.hidden_act](h)
    h = _constrain(h, ("activation_batch", "activation_length", "activation_mlp"))
    return Dense((cfg.hidden_size,), ("mlp", "embed"), cfg, name="wo")(h)


class Layer(nn.Module):
  """One encoder block: self-attention and FFN, each with residual + LayerNorm (post or pre)."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool, queries=None):
    """x [B, L, d] -> [B, L, d]; with `queries` [B, Q] the block's output at those positions only, [B, Q, d]."""
    cfg = self.cfg
    drop = dropout(cfg)
    act_names = ("activation_batch", "activation_length", "activation_embed")
    dtype = cfg.compute_dtype
    rows = (lambda t: t) if queries is None else (lambda t: take_rows(t, queries))
    if cfg.layer_norm == "post":
      a = SelfAttention(cfg, name="attention")(x, mask, deterministic, queries)
      x = layer_norm(cfg, "attention_ln")(drop(a, deterministic=deterministic) + rows(x)).astype(dtype)
      f = Mlp(cfg, name="mlp")(x)
      x = layer_norm(cfg, "mlp_ln")(drop(f, deterministic=deterministic) + x).astype(dtype)
    else:
      a = SelfAttention(cfg, name="attention")(layer_norm(cfg, "attention_ln")(x).astype(dtype), mask,
                                               deterministic, queries)
      x = rows(x) + drop(a, deterministic=deterministic)
      f = Mlp(cfg, name="mlp")(layer_norm(cfg, "mlp_ln")(x).astype(dtype))
      x = x + drop(f, deterministic=deterministic)
    return _constrain(x, act_names)


class Embeddings(nn.Module):
  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=cfg.compute_dtype,
                              param_dtype=cfg.params_dtype)
    self.word_embeddings = embed(cfg.vocab_size, embedding_init=nn.with_logical_partitioning(
        _init(cfg), ("vocab", "embed")))
    self.token_type_embeddings = embed(cfg.type_vocab_size, embedding_init=nn.with_logical_partitioning(
        _init(cfg), ("segment_type", "embed")))
    if cfg.position_embedding == "learned":
      self.position_embeddings = embed(cfg.max_position_embeddings, embedding_init=nn.with_logical_partitioning(
          _init(cfg), ("position", "embed")))
    self.ln = layer_norm(cfg)
    self.dropout = dropout(cfg)

  def _one_hot(self, table, ids):
    """table[ids] as a one-hot matmul (exact: one non-zero product per output)."""
    dtype = self.cfg.compute_dtype
    return jnp.einsum("...v,vd->...d", jax.nn.one_hot(ids, table.shape[0], dtype=dtype), table.astype(dtype),
                      precision=jax.lax.Precision.HIGHEST)

  def _lookup(self, embed, ids):
    how = self.cfg.embedding_lookup
    if how == "auto":
      how = "one_hot" if jax.default_backend() == "gpu" else "gather"
    return embed(ids) if how == "gather" else self._one_hot(embed.embedding, ids)

  def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
    """position_ids None: 0..L-1 in every row, added as a slice of the table (as the original does), so its
    gradient is a sum over the batch rather than a scatter-add with every row hitting the same entries."""
    cfg = self.cfg
    # Segment types: always one-hot, as in the original (a 2-row table: a scatter-add into it is all collisions).
    x = self._lookup(self.word_embeddings, input_ids) + self._one_hot(self.token_type_embeddings.embedding,
                                                                       segment_ids)
    length = input_ids.shape[-1]
    if cfg.position_embedding == "learned":
      if position_ids is None:
        x = x + self.position_embeddings.embedding[:length].astype(x.dtype)
      else:
        x = x + self._lookup(self.position_embeddings, position_ids)
    else:
      table = jnp.asarray(sinusoidal_positions(cfg.max_position_embeddings, cfg.hidden_size))
      pos = table[:length] if position_ids is None else jnp.take(table, position_ids, axis=0)
      x = x + pos.astype(x.dtype)
    x = self.ln(x).astype(cfg.compute_dtype)
    x = self.dropout(x, deterministic=deterministic)
    return _constrain(x, ("activation_batch", "activation_length", "activation_embed"))
