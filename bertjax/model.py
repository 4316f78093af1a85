"""BERT in Flax linen: embeddings, encoder, pooler and the pre-training / fine-tuning heads.

Maths follows the original BERT (post-LayerNorm, exact-erf GELU, learned positions, eps 1e-12);
ablations (sinusoidal positions, pre-LN, ReLU) are switches in `BertConfig`.

Every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`, `layers`, ...);
how they map onto a device mesh is decided by the config's rules (see `sharding.py`). Activations are
constrained with their own names (`activation_batch`, `activation_length`, `activation_embed`, ...).

A batch is a dict with the original BERT feature names: `input_ids`, `input_mask`, `segment_ids`,
and for pre-training `masked_lm_positions`. Packed rows may add `position_ids` (restarting per example)
and `attention_segment_ids` (1..n per example, 0 = padding): tokens then attend only within their example.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import attention as attention_lib
from bertjax import dropout as dropout_lib

# (layers, hidden, heads, ffn) by name.
VARIANTS = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def gelu(x):
  """Exact GELU, x·Φ(x) = x·½·(1 + erf(x/√2)), written as google-research/bert's `gelu` and HF's "gelu" are.

  `jax.nn.gelu(approximate=False)` computes x·½·erfc(-x/√2): the same function (it keeps relative precision in
  the far negative tail, where both are ~0 in absolute terms), but XLA's CPU erfc takes an exp and branches, and
  on a 2-core CPU the BERT-base layer's forward + backward took about 4% longer with it.
  """
  return x * 0.5 * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


ACTIVATIONS = {
    "gelu": gelu,  # exact erf form: BERT's and HF's "gelu"
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture of one BERT. Validated on construction, before anything compiles."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_act: str = "gelu"  # gelu (exact) | gelu_tanh | relu
  position_embedding: str = "learned"  # learned | sinusoidal
  layer_norm: str = "post"  # post (BERT) | pre
  layer_norm_eps: float = 1e-12
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  initializer_range: float = 0.02
  dtype: str = "float32"  # computation dtype of activations and matmuls
  param_dtype: str = "float32"
  scan_layers: bool = False  # nn.scan over layers: compile time flat in depth
  # Layers per scan iteration (scan_layers): 1 = scanned; num_layers or more = all layers in one iteration
  # (unrolled, with the scanned parameter layout kept); 0 = auto: all layers on CPU and GPU, where the loop's
  # stacked buffers (zero-filled, written and read slice by slice every step) cost 15-20% of a BERT-base step on
  # the CPU and a scanned BERT-large step is 1.3x slower on an H100, at the price of compile time growing with
  # depth; 1 on TPU (compile time flat in depth, as pod-scale runs want). See `for_platform`.
  scan_unroll: int = 1
  remat: str = "none"  # none | full | dots (save matmul outputs)
  # xla (einsum) | cudnn | auto: jax.nn.dot_product_attention (fused without dropout) | pallas: bertjax.attention
  # (fused with dropout; GPU, L <= 256, batch and heads may be split over a mesh) | splash: TPU Pallas splash
  # attention (fused without dropout, packed rows by segment ids; the xla path when attention dropout is on)
  attention_impl: str = "xla"
  # Word (and packed-position) lookups: gather | one_hot (a matmul: its gradient is a matmul, not a scatter-add;
  # the original's use_one_hot_embeddings) | auto (one_hot on GPU, where the scatter-add is slow; gather elsewhere).
  embedding_lookup: str = "auto"
  # Dropout masks: rng (flax nn.Dropout: bits from the `dropout` PRNG stream, the mask kept for the backward) |
  # hash (bertjax.dropout: a counter hash fused into the elementwise work, recomputed in the backward).
  dropout_impl: str = "rng"
  # The last layer only at the positions a head reads ([CLS] and, in pre-training, the masked positions): its
  # keys and values still come from every token, so the heads' outputs, the loss and the gradients are the same
  # (exact), while the last layer's queries, output projection, FFN and LayerNorms run on a few rows instead of
  # all. Honoured by BertForPreTraining and BertForSequenceClassification; the per-token heads need every row.
  prune_final_layer: bool = False

  def __post_init__(self):
    positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")
    for name in positive + ("scan_unroll",):
      value, least = getattr(self, name), 0 if name == "scan_unroll" else 1
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        what = "a non-negative integer (0 = auto)" if least == 0 else "a positive integer"
        raise ValueError(f"BertConfig.{name} must be {what}, got {value!r}")
    if self.hidden_size % self.num_heads:
      raise ValueError(f"BertConfig: hidden_size {self.hidden_size} is not divisible by "
                       f"num_heads {self.num_heads}")
    choices = {"hidden_act": ACTIVATIONS, "position_embedding": ("learned", "sinusoidal"),
               "layer_norm": ("post", "pre"), "dtype": DTYPES, "param_dtype": DTYPES,
               "remat": ("none", "full", "dots"), "attention_impl": ("xla", "cudnn", "auto", "pallas", "splash"),
               "embedding_lookup": ("gather", "one_hot", "auto"), "dropout_impl": ("rng", "hash"),
               "prune_final_layer": (False, True)}
    for name, allowed in choices.items():
      if getattr(self, name) not in allowed:
        raise ValueError(f"BertConfig.{name}={getattr(self, name)!r}; choose one of {sorted(allowed)}")
    if self.position_embedding == "sinusoidal" and self.hidden_size % 2:
      raise ValueError("BertConfig: sinusoidal positions need an even hidden_size")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")

  @classmethod
  def from_variant(cls, variant: str, **overrides) -> "BertConfig":
    if variant not in VARIANTS:
      raise ValueError(f"unknown model variant {variant!r}; choose one of {list(VARIANTS)}")
    layers, hidden, heads, ffn = VARIANTS[variant]
    fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=ffn)
    fields.update(overrides)
    return cls(**fields)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "BertConfig":
    """From a config dict; with a `variant`, the size fields left at 0 come from the variant's table row."""
    d = dict(d)
    variant = d.pop("variant", None)
    if variant:
      d = {k: v for k, v in d.items()
           if not (k in ("num_layers", "hidden_size", "num_heads", "intermediate_size") and v == 0)}
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"unknown BertConfig fields: {sorted(unknown)}")
    return cls.from_variant(variant, **d) if variant else cls(**d)

  def for_platform(self, platform: str) -> "BertConfig":
    """This config with `scan_unroll` 0 (auto) resolved for the devices it will run on (a jax platform name):
    the callers that build a mesh resolve it from the mesh's devices, so that a TPU program compiled ahead of
    time on a CPU host (`bertjax.aot`) gets the TPU's choice."""
    if self.scan_unroll:
      return self
    return self.replace(scan_unroll=self.num_layers if platform in ("cpu", "gpu", "cuda", "rocm") else 1)

  def replace(self, **kw) -> "BertConfig":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return DTYPES[self.param_dtype]


def _init(cfg: BertConfig):
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
  """`nn.Dropout`'s interface over `bertjax.dropout.hash_dropout`, its per-call seed from the `dropout` stream."""
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


class _ScanLayer(nn.Module):
  """Adapter giving `Layer` the (carry, x) -> (carry, y) signature `nn.scan` needs."""
  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x, mask):
    return _layer_class(self.cfg)(self.cfg, name="layer")(x, mask, self.deterministic), None


def _layer_class(cfg: BertConfig):
  if cfg.remat == "none":
    return Layer
  policy = None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return nn.remat(Layer, policy=policy, static_argnums=(3,))


def _scanned_layers(cfg: BertConfig, deterministic: bool, length: int, name: str):
  """`length` layers under nn.scan, parameters stacked on a leading `layers` axis (built in the caller's scope)."""
  unroll = cfg.for_platform(jax.default_backend()).scan_unroll  # built without a mesh: the default backend's
  return nn.scan(_ScanLayer, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                 in_axes=(nn.broadcast,), length=length, unroll=min(unroll, length),
                 metadata_params={nn.PARTITION_NAME: "layers"})(cfg, deterministic, name=name)


class _SplitStack(nn.Module):
  """The scanned stack with its last layer computed only at `queries`. Reads the stacked parameters as `head`
  (layers 0..L-2, scanned) and `last` (layer L-1), a view `Encoder` makes with nn.map_variables; apply only."""
  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x, mask, queries):
    cfg = self.cfg
    if cfg.num_layers > 1:
      x, _ = _scanned_layers(cfg, self.deterministic, cfg.num_layers - 1, "head")(x, mask)
    return _layer_class(cfg)(cfg, name="last")(x, mask, self.deterministic, queries)


def _split_last(variables):
  """Stacked layer parameters {"layer": [L, ...]} as {"head": {"layer": [L-1, ...]}, "last": [...]}."""
  layer = variables["params"]["layer"]
  last = jax.tree_util.tree_leaves(layer)[0].shape[0] - 1
  return {"params": {"head": {"layer": jax.tree_util.tree_map(lambda a: a[:last], layer)},
                     "last": jax.tree_util.tree_map(lambda a: a[last], layer)}}


class Encoder(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool, queries=None):
    """x [B, L, d] -> [B, L, d]; with `queries` [B, Q], the last layer only at those positions: [B, Q, d]."""
    cfg = self.cfg
    if cfg.scan_layers:
      if queries is None or self.is_initializing():  # init always builds the whole stacked layout
        x, _ = _scanned_layers(cfg, deterministic, cfg.num_layers, "layers")(x, mask)
        x = x if queries is None else take_rows(x, queries)
      else:  # the same stacked parameters, viewed as layers 0..L-2 and layer L-1
        x = nn.map_variables(_SplitStack, "params", trans_in_fn=_split_last, mutable=False)(
            cfg, deterministic, name="layers")(x, mask, queries)
    else:
      layer = _layer_class(cfg)
      for i in range(cfg.num_layers):
        x = layer(cfg, name=f"layer_{i}")(x, mask, deterministic, queries if i == cfg.num_layers - 1 else None)
    if cfg.layer_norm == "pre":
      x = layer_norm(cfg, "final_ln")(x).astype(cfg.compute_dtype)
    return x


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
  if shape[1] > cfg.max_position_embeddings:
    raise ValueError(f"sequence length {shape[1]} exceeds max_position_embeddings "
                     f"{cfg.max_position_embeddings}")


class BertModel(nn.Module):
  """The encoder: {"hidden": [B, L, d], "pooled": [B, d]} (pooled = tanh(W·h_[CLS] + b))."""
  cfg: BertConfig

  def setup(self):
    self.embeddings = Embeddings(self.cfg)
    self.encoder = Encoder(self.cfg)
    self.pooler = Dense((self.cfg.hidden_size,), ("embed", "mlp"), self.cfg)

  def __call__(self, batch, deterministic: bool = True, positions=None):
    """With `positions` [B, Q] (prune_final_layer): "hidden" is [B, Q, d] at those positions only, the last layer
    computed at them and at [CLS] alone; "pooled" is the same as without."""
    check_batch(self.cfg, batch)
    ids = batch["input_ids"]
    if self.cfg.attention_impl == "splash":  # the kernel masks by segment ids, not a boolean [L, L] mask
      mask = attention_lib.splash_segments(batch["input_mask"], batch.get("attention_segment_ids"))
    else:
      mask = attention_mask(batch["input_mask"], batch.get("attention_segment_ids"))
    x = self.embeddings(ids, batch["segment_ids"], batch.get("position_ids"), deterministic)
    cls_positions = batch.get("cls_positions")
    if positions is None:
      h = self.encoder(x, mask, deterministic)
      return {"hidden": h, "pooled": self.pool(h[:, 0] if cls_positions is None else take_rows(h, cls_positions))}
    cls = jnp.zeros((ids.shape[0], 1), jnp.int32) if cls_positions is None else cls_positions.astype(jnp.int32)
    h = self.encoder(x, mask, deterministic, jnp.concatenate([cls, positions.astype(jnp.int32)], axis=1))
    k = cls.shape[1]
    return {"hidden": h[:, k:], "pooled": self.pool(h[:, 0] if cls_positions is None else h[:, :k])}

  def pool(self, cls_hidden):
    """tanh(Dense(h_[CLS])) of the [CLS] states: [B, d], or [B, K, d] for packed rows (one per example)."""
    return jnp.tanh(self.pooler(cls_hidden))

  def attend(self, x):
    """Logits against the word-embedding table (the tied MLM decoder), in float32."""
    table = self.embeddings.word_embeddings.embedding
    return jnp.einsum("...d,vd->...v", x, table.astype(x.dtype), preferred_element_type=jnp.float32)


class BertForPreTraining(nn.Module):
  """Encoder + MLM head (only at `masked_lm_positions`: [B, P, V] logits) + NSP head on the pooled output."""
  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.bert = BertModel(cfg)
    self.mlm_transform = Dense((cfg.hidden_size,), ("embed", "mlp"), cfg)
    self.mlm_ln = layer_norm(cfg)
    self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                               (cfg.vocab_size,), cfg.params_dtype)
    self.nsp = Dense((2,), ("mlp", "classes"), cfg)

  def __call__(self, batch, deterministic: bool = True):
    check_batch(self.cfg, batch, ENCODER_KEYS + ("masked_lm_positions",))
    positions = batch["masked_lm_positions"]
    if self.cfg.prune_final_layer:
      out = self.bert(batch, deterministic, positions)
      x = out["hidden"]  # [B, P, d]
    else:
      out = self.bert(batch, deterministic)
      x = take_rows(out["hidden"], positions)  # [B, P, d]
    x = ACTIVATIONS[self.cfg.hidden_act](self.mlm_transform(x))
    x = self.mlm_ln(x).astype(self.cfg.compute_dtype)
    out["mlm_logits"] = self.bert.attend(x) + self.mlm_bias.astype(jnp.float32)
    out["nsp_logits"] = self.nsp(out["pooled"]).astype(jnp.float32)
    return out


class BertForSequenceClassification(nn.Module):
  """softmax(W·pooled) over `num_labels` classes; `num_labels=1` is regression (e.g. STS-B)."""
  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    none = jnp.zeros((batch["input_ids"].shape[0], 0), jnp.int32)  # pruned: the last layer at [CLS] only
    out = BertModel(self.cfg, name="bert")(batch, deterministic, none if self.cfg.prune_final_layer else None)
    x = dropout(self.cfg)(out["pooled"], deterministic=deterministic)
    out["logits"] = Dense((self.num_labels,), ("mlp", "classes"), self.cfg, name="classifier")(x).astype(
        jnp.float32)
    return out


class BertForTokenClassification(nn.Module):
  """softmax(W·h_i) per token (e.g. NER tags)."""
  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    out = BertModel(self.cfg, name="bert")(batch, deterministic)
    x = dropout(self.cfg)(out["hidden"], deterministic=deterministic)
    out["logits"] = Dense((self.num_labels,), ("embed", "classes"), self.cfg, name="classifier")(x).astype(
        jnp.float32)
    return out


class BertForQuestionAnswering(nn.Module):
  """Span QA: start score s·h_i and end score e·h_i; padding positions get -inf-like logits."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    out = BertModel(self.cfg, name="bert")(batch, deterministic)
    logits = Dense((2,), ("embed", "classes"), self.cfg, name="qa_outputs")(out["hidden"]).astype(jnp.float32)
    valid = batch["input_mask"].astype(bool)
    neg = jnp.finfo(jnp.float32).min
    out["start_logits"] = jnp.where(valid, logits[..., 0], neg)
    out["end_logits"] = jnp.where(valid, logits[..., 1], neg)
    return out


def dummy_batch(cfg: BertConfig, batch_size: int = 2, seq_len: int = 16, max_predictions: int = 4):
  """A zero batch of the right shapes and dtypes, for init and eval_shape."""
  ids = np.zeros((batch_size, seq_len), np.int32)
  preds = np.zeros((batch_size, max_predictions), np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": ids,
          "masked_lm_positions": preds, "masked_lm_ids": preds,
          "masked_lm_weights": np.zeros((batch_size, max_predictions), np.float32),
          "next_sentence_labels": np.zeros((batch_size,), np.int32)}


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def model_flops_per_sequence(cfg: BertConfig, seq_len: int, num_predictions: int,
                             seq_len_squared: float | None = None, final_layer_rows: int | None = None) -> float:
  """Training FLOPs (forward + backward = 3x forward) of one sequence, MLM head at gathered positions only.

  3·[L·(24·S·d² + 4·S²·d) + 2·P·(d² + d·V) + 2·d²]; for packed rows pass the sum of each example's squared
  length as `seq_len_squared`. (Counts the 4·d² attention projections and 2·d·d_ff FFN with d_ff = 4d, as
  the usual 24·S·d²; for other FFN widths the FFN term is scaled.) With `final_layer_rows` Q (prune_final_layer:
  [CLS] and the masked positions of an unpacked row), less what the last layer then leaves out.
  """
  d, L, V, P = cfg.hidden_size, cfg.num_layers, cfg.vocab_size, num_predictions
  s2 = seq_len * seq_len if seq_len_squared is None else seq_len_squared
  per_layer = 2 * seq_len * (4 * d * d + 2 * d * cfg.intermediate_size) + 4 * s2 * d
  total = 3.0 * (L * per_layer + 2 * P * (d * d + d * V) + 2 * d * d)
  if final_layer_rows is not None:
    total -= pruned_final_layer_flops(cfg, seq_len - final_layer_rows, s2 - final_layer_rows * seq_len)
  return total


def pruned_final_layer_flops(cfg: BertConfig, rows: float, score_pairs: float) -> float:
  """Training FLOPs the pruned last layer leaves out: for each of `rows` positions no head reads, its query and
  output projections and FFN (its key and value projections stay: every position is a key); `score_pairs`
  (query, key) pairs fewer in QKᵀ and in the probabilities times V."""
  d = cfg.hidden_size
  return 3.0 * (2 * rows * (2 * d * d + 2 * d * cfg.intermediate_size) + 4 * score_pairs * d)
