"""The layers of the encoder: embeddings, self-attention (its backends are `bertjax.kernels`), FFN, LayerNorm,
dropout, one block.

Every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`, `layers`, ...); how they map
onto a device mesh is decided by the config's rules (`bertjax.core.sharding`). Activations are constrained with their
own names (`activation_batch`, `activation_length`, `activation_embed`, ...).
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import kernels
from bertjax.kernels import dropout as dropout_lib
from bertjax.kernels.xla import select
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
  """The config's norm (LayerNorm, with or without bias, or RMSNorm), computed in float32."""
  scale = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
  if cfg.norm == "rmsnorm":
    return nn.RMSNorm(epsilon=cfg.layer_norm_eps, dtype=jnp.float32, param_dtype=cfg.params_dtype,
                      scale_init=scale, name=name)
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=jnp.float32, param_dtype=cfg.params_dtype,
                      use_bias=cfg.norm_bias, scale_init=scale,
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), name=name)


class HashDropout(nn.Module):
  """`nn.Dropout`'s interface over `bertjax.kernels.dropout.hash_dropout`, its per-call seed from the `dropout`
  stream."""
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


def rotary_tables(positions, head_dim: int, theta: float):
  """cos, sin [B|1, L, head_dim] (float32) of rotary embeddings at `positions` [B|1, L]: angle(i, k) = i·θ^(-2k/D)
  for k < D/2, the halves repeated (the rotate-half layout of RoFormer's GPT-NeoX form, as HF's Llama and
  ModernBERT have it)."""
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x, cos, sin):
  """x [B, L, H, D] rotated by the tables [B|1, L, D]: x·cos + rotate_half(x)·sin, in float32."""
  dtype = x.dtype
  x = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's per-head slopes (Press et al.): 2^(-8k/n) for k = 1..n with n a power of two; otherwise those of
  the next lower power of two followed by every other slope of the next higher one (as MosaicBERT builds them)."""
  def powers(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (k + 1) for k in range(n)]
  closest = 2 ** int(np.floor(np.log2(num_heads)))
  slopes = powers(closest)
  if closest < num_heads:
    slopes += powers(2 * closest)[0::2][:num_heads - closest]
  return np.asarray(slopes, np.float32)


def alibi_bias(positions, num_heads: int):
  """The symmetric ALiBi bias -m_h·|i - j| [B|1, H, L, L] (float32) of `positions` [B|1, L]."""
  distance = jnp.abs(positions[:, :, None] - positions[:, None, :]).astype(jnp.float32)
  return -jnp.asarray(alibi_slopes(num_heads))[None, :, None, None] * distance[:, None]


def take_rows(x, positions):
  """x[b, positions[b]]: [B, L, ...] -> [B, Q, ...]."""
  return jnp.take_along_axis(x, positions.reshape(positions.shape + (1,) * (x.ndim - 2)).astype(jnp.int32), axis=1)


def relative_buckets(positions, buckets: int, max_position: int):
  """[B, L, L] indices into the 2·buckets relative embeddings of DeBERTa-v2: δ = p_i − p_j kept as is within
  ±buckets/2 and log-bucketed beyond, up to `max_position` (HF's make_log_bucket_position, in float32), then
  shifted by `buckets` and clipped to the table."""
  rel = (positions[:, :, None] - positions[:, None, :]).astype(jnp.int32)
  mid = buckets // 2
  sign = jnp.sign(rel).astype(jnp.float32)
  abs_pos = jnp.where((rel < mid) & (rel > -mid), mid - 1, jnp.abs(rel)).astype(jnp.float32)
  log_pos = jnp.ceil(jnp.log(abs_pos / mid) / jnp.log(jnp.float32((max_position - 1) / mid)) * (mid - 1)) + mid
  bucket = jnp.where(abs_pos <= mid, rel.astype(jnp.float32), log_pos * sign).astype(jnp.int32)
  return jnp.clip(bucket + buckets, 0, 2 * buckets - 1)


def disentangled_bias(q, k, pos_q, pos_k, index):
  """DeBERTa's content-to-position plus position-to-content scores, [B, H, L, L] in float32, scaled by
  1/sqrt(3·D): c2p[i, j] = q_i · K_r[index(i, j)], p2c[i, j] = k_j · Q_r[index(i, j)], where K_r, Q_r are the
  relative embeddings [2S, H, D] projected once per layer (not per head or per row) by the layer's key and
  query projections."""
  f32 = jnp.float32
  c2p = jnp.einsum("bqhd,rhd->bhqr", q, pos_k, preferred_element_type=f32)
  c2p = jnp.take_along_axis(c2p, index[:, None], axis=-1)
  p2c = jnp.einsum("bkhd,rhd->bhkr", k, pos_q, preferred_element_type=f32)
  p2c = jnp.swapaxes(jnp.take_along_axis(p2c, jnp.swapaxes(index, 1, 2)[:, None], axis=-1), -1, -2)
  return (c2p + p2c) / jnp.sqrt(f32(3 * q.shape[-1]))


def disentangled_terms(q, k, pos_q, pos_k, index):
  """The same terms as `disentangled_bias` before their gathers, for attention that adds them block by block:
  {"c": [B, Q, H, 2S] (each query against K_r), "p": [B, L, H, 2S] (each key against Q_r), "index": [B, Q, L]},
  float32, scaled by 1/sqrt(3·D)."""
  f32 = jnp.float32
  scale = 1.0 / jnp.sqrt(f32(3 * q.shape[-1]))
  return {"c": jnp.einsum("bqhd,rhd->bqhr", q, pos_k, preferred_element_type=f32) * scale,
          "p": jnp.einsum("bkhd,rhd->bkhr", k, pos_q, preferred_element_type=f32) * scale, "index": index}


def disentangled_scores(ctx, query, key, x, q, k, queries, impl):
  """DeBERTa: the relative-position terms as the layer's score bias (or, blockwise, the terms it adds block by
  block: no [L, L] bias), and the content query scaled so that content scores come at 1/sqrt(3·D)."""
  rel_q, rel_k, index = query(ctx["rel"]), key(ctx["rel"]), ctx["rel_index"]
  if impl == "blockwise":
    rows = index if queries is None else take_rows(index, queries)
    ctx = {**ctx, "rel_terms": disentangled_terms(q, k, rel_q, rel_k, rows)}
  else:
    ctx = {**ctx, "bias": disentangled_bias(query(x) if queries is not None else q, k, rel_q, rel_k, index)}
  return ctx, q / jnp.sqrt(3.0).astype(q.dtype)


def rotate(ctx, q, k, local, queries):
  """Rotary positions on queries and keys, with the local layers' own θ where the stack has one."""
  cos, sin = select(local, ctx["rope_local"], ctx["rope"]) if "rope_local" in ctx else ctx["rope"]
  k = apply_rotary(k, cos, sin)
  if queries is not None:
    cos, sin = (take_rows(jnp.broadcast_to(t, (k.shape[0],) + t.shape[1:]), queries) for t in (cos, sin))
  return apply_rotary(q, cos, sin), k


class SelfAttention(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, ctx, deterministic: bool, queries=None, index=0):
    """softmax(QKᵀ/√d_k + bias + mask)·V over heads, then the output projection: self-attention of x [B, L, d];
    with `queries` [B, Q] only those positions' outputs ([B, Q, d]), every position still a key and value. `ctx`
    is what every layer shares (see `context`); `index` the layer's number (a Python int, or traced under
    nn.scan), which picks local or global attention. The families' terms are `disentangled_scores` (DeBERTa),
    `rotate` (RoPE), ALiBi's bias and the sliding window (in `ctx`, applied by the backend)."""
    cfg = self.cfg
    dense = functools.partial(Dense, (cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"), cfg,
                              use_bias=cfg.use_bias)
    query, key = dense(name="query"), dense(name="key")
    q = query(x if queries is None else take_rows(x, queries))
    k = key(x)
    v = dense(name="value")(x)
    impl = cfg.attention_at(k.shape[1])
    local = (index % cfg.global_every != 0) if cfg.local_attention else False
    if "rel" in ctx:
      ctx, q = disentangled_scores(ctx, query, key, x, q, k, queries, impl)
    if "rope" in ctx:
      q, k = rotate(ctx, q, k, local, queries)
    names = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    q, k, v = (_constrain(t, names) for t in (q, k, v))
    # One key per layer, drawn where dropout applies, whatever the backend (the same stream for every one).
    no_dropout = deterministic or cfg.attention_dropout_rate == 0.0
    z = kernels.attend(impl, q, k, v, ctx, cfg, local=local, queries=queries,
                       dropout_rng=None if no_dropout else self.make_rng("dropout"),
                       partition=nn.logical_to_mesh_axes(names))
    return Dense((cfg.hidden_size,), ("heads", "kv", "embed"), cfg, in_dims=2, use_bias=cfg.use_bias,
                 name="out")(_constrain(z, names))


class Mlp(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    up = functools.partial(Dense, (cfg.intermediate_size,), ("embed", "mlp"), cfg, use_bias=cfg.use_bias)
    h = ACTIVATIONS[cfg.hidden_act](up(name="wi")(x))
    if cfg.ffn == "glu":  # GeGLU / SwiGLU: the activation gates a second projection
      h = h * up(name="wg")(x)
    h = _constrain(h, ("activation_batch", "activation_length", "activation_mlp"))
    return Dense((cfg.hidden_size,), ("mlp", "embed"), cfg, use_bias=cfg.use_bias, name="wo")(h)


class Layer(nn.Module):
  """One encoder block: self-attention and FFN, each with residual + norm (post or pre)."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, ctx, deterministic: bool, queries=None, index=0):
    """x [B, L, d] -> [B, L, d]; with `queries` [B, Q] the block's output at those positions only, [B, Q, d].
    `index`: the layer's number (a Python int, or traced under nn.scan)."""
    cfg = self.cfg
    drop = dropout(cfg)
    act_names = ("activation_batch", "activation_length", "activation_embed")
    dtype = cfg.compute_dtype
    rows = (lambda t: t) if queries is None else (lambda t: take_rows(t, queries))
    attention = SelfAttention(cfg, name="attention")
    if cfg.layer_norm == "post":
      a = attention(x, ctx, deterministic, queries, index)
      x = layer_norm(cfg, "attention_ln")(drop(a, deterministic=deterministic) + rows(x)).astype(dtype)
      f = Mlp(cfg, name="mlp")(x)
      x = layer_norm(cfg, "mlp_ln")(drop(f, deterministic=deterministic) + x).astype(dtype)
    else:
      h = layer_norm(cfg, "attention_ln")(x).astype(dtype)
      if not cfg.first_attention_norm:  # layer 0 reads the embedding norm's output as it is (ModernBERT)
        h = select(index == 0, x, h)
      a = attention(h, ctx, deterministic, queries, index)
      x = rows(x) + drop(a, deterministic=deterministic)
      f = Mlp(cfg, name="mlp")(layer_norm(cfg, "mlp_ln")(x).astype(dtype))
      x = x + drop(f, deterministic=deterministic)
    return _constrain(x, act_names)


class Embeddings(nn.Module):
  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    embed = functools.partial(nn.Embed, features=cfg.embed_dim, dtype=cfg.compute_dtype,
                              param_dtype=cfg.params_dtype)
    self.word_embeddings = embed(cfg.padded_vocab_size, embedding_init=nn.with_logical_partitioning(
        _init(cfg), ("vocab", "embed")))
    if cfg.type_vocab_size:
      self.token_type_embeddings = embed(cfg.type_vocab_size, embedding_init=nn.with_logical_partitioning(
          _init(cfg), ("segment_type", "embed")))
    if cfg.position_embedding == "learned":
      self.position_embeddings = embed(cfg.max_position_embeddings, embedding_init=nn.with_logical_partitioning(
          _init(cfg), ("position", "embed")))
    if cfg.embedding_norm:
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

  def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool, word_delta=None):
    """position_ids None: 0..L-1 in every row, added as a slice of the table (as the original does), so its
    gradient is a sum over the batch rather than a scatter-add with every row hitting the same entries.
    A learned table is read from `position_offset` on (RoBERTa's positions start after its padding index).
    `word_delta` (a table of the word table's shape): the words read from stop_gradient(table) + word_delta
    (DeBERTa-v3's gradient-disentangled sharing: this reader's loss trains the delta, not the table)."""
    cfg = self.cfg
    if word_delta is None:
      x = self._lookup(self.word_embeddings, input_ids)
    else:
      table = jax.lax.stop_gradient(self.word_embeddings.embedding) + word_delta
      gather = cfg.embedding_lookup == "gather" or (cfg.embedding_lookup == "auto" and jax.default_backend() != "gpu")
      x = jnp.take(table, input_ids, axis=0).astype(cfg.compute_dtype) if gather else self._one_hot(table, input_ids)
    if cfg.type_vocab_size:
      # Segment types: always one-hot, as in the original (a 2-row table: a scatter-add into it is all collisions).
      # With one type (RoBERTa) every token takes it, the second segment of a pair included, as RoBERTa is fed.
      if cfg.type_vocab_size == 1:
        segment_ids = jnp.zeros_like(segment_ids)
      x = x + self._one_hot(self.token_type_embeddings.embedding, segment_ids)
    length, offset = input_ids.shape[-1], cfg.position_offset
    if cfg.position_embedding == "learned":
      if position_ids is None:
        x = x + self.position_embeddings.embedding[offset:offset + length].astype(x.dtype)
      else:
        x = x + self._lookup(self.position_embeddings, position_ids + offset)
    elif cfg.position_embedding == "sinusoidal":
      table = jnp.asarray(sinusoidal_positions(cfg.max_position_embeddings, cfg.embed_dim))
      pos = table[:length] if position_ids is None else jnp.take(table, position_ids, axis=0)
      x = x + pos.astype(x.dtype)
    if cfg.embedding_norm:
      x = self.ln(x)
    x = self.dropout(x.astype(cfg.compute_dtype), deterministic=deterministic)
    return _constrain(x, ("activation_batch", "activation_length", "activation_embed"))
