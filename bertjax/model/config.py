"""The model's configuration: sizes, switches and their validation, with the tables they are checked against
(variants, activations, dtypes). The defaults are the recommended settings; the original BERT's maths is the
first choice of every maths switch."""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors

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
  the far negative tail, where both are ~0 in absolute terms), but XLA's CPU erfc takes an exp and branches,
  which makes the layer slower.
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
  # Fresh weights (all of them in pre-training from scratch; the task head and pooler in fine-tuning):
  # truncated_normal (the original's tf.truncated_normal_initializer(initializer_range), cut at 2σ) | normal
  # (N(0, initializer_range²), as HF transformers' _init_weights).
  initializer: str = "truncated_normal"
  dtype: str = "float32"  # computation dtype of activations and matmuls
  param_dtype: str = "float32"
  scan_layers: bool = False  # nn.scan over layers: compile time flat in depth
  # Layers per scan iteration (scan_layers): 1 = a loop over layers; num_layers or more = all layers in one
  # iteration (unrolled, the scanned parameter layout kept); 0 = auto: all layers on CPU and GPU, where a loop's
  # stacked buffers (zero-filled, written and read slice by slice every step) make the step slower, at the price
  # of compile time growing with depth; 1 on TPU (compile time flat in depth, as pod-scale runs want). See
  # `for_platform`; docs/performance.md has the measurements.
  scan_unroll: int = 0
  remat: str = "none"  # none | full | dots (save matmul outputs)
  # xla (einsum) | cudnn | auto: jax.nn.dot_product_attention (fused without dropout) | pallas: bertjax.kernels.attention
  # (fused with dropout; GPU, L <= 256, batch and heads may be split over a mesh) | splash: TPU Pallas splash
  # attention (fused without dropout, packed rows by segment ids; the xla path when attention dropout is on)
  attention_impl: str = "xla"
  # Word (and packed-position) lookups: gather | one_hot (a matmul: its gradient is a matmul, not a scatter-add;
  # the original's use_one_hot_embeddings) | auto (one_hot on GPU, where the scatter-add is slow; gather elsewhere).
  embedding_lookup: str = "auto"
  # Dropout masks: rng (flax nn.Dropout: bits from the `dropout` PRNG stream, the mask kept for the backward) |
  # hash (bertjax.kernels.dropout: a counter hash fused into the elementwise work, recomputed in the backward).
  dropout_impl: str = "hash"
  # The last layer only at the positions a head reads ([CLS] and, in pre-training, the masked positions): its
  # keys and values still come from every token, so the heads' outputs, the loss and the gradients are the same
  # (exact), while the last layer's queries, output projection, FFN and LayerNorms run on a few rows instead of
  # all. Honoured by BertForPreTraining and BertForSequenceClassification; the per-token heads need every row.
  # BertForPreTraining's "hidden" is then at the masked positions only, [B, P, d]; BertModel's is every position.
  prune_final_layer: bool = True

  def __post_init__(self):
    positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")
    for name in positive + ("scan_unroll",):
      value, least = getattr(self, name), 0 if name == "scan_unroll" else 1
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        what = "a non-negative integer (0 = auto)" if least == 0 else "a positive integer"
        raise errors.ConfigError(f"BertConfig.{name} must be {what}, got {value!r}")
    if self.hidden_size % self.num_heads:
      raise errors.ConfigError(f"BertConfig: hidden_size {self.hidden_size} is not divisible by "
                       f"num_heads {self.num_heads}")
    choices = {"hidden_act": ACTIVATIONS, "position_embedding": ("learned", "sinusoidal"),
               "layer_norm": ("post", "pre"), "dtype": DTYPES, "param_dtype": DTYPES,
               "remat": ("none", "full", "dots"), "attention_impl": ("xla", "cudnn", "auto", "pallas", "splash"),
               "embedding_lookup": ("gather", "one_hot", "auto"), "dropout_impl": ("rng", "hash"),
               "prune_final_layer": (False, True), "initializer": ("truncated_normal", "normal")}
    for name, allowed in choices.items():
      if getattr(self, name) not in allowed:
        raise errors.ConfigError(f"BertConfig.{name}={getattr(self, name)!r}; choose one of {sorted(allowed)}")
    if self.position_embedding == "sinusoidal" and self.hidden_size % 2:
      raise errors.ConfigError("BertConfig: sinusoidal positions need an even hidden_size")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise errors.ConfigError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")

  @classmethod
  def from_variant(cls, variant: str, **overrides) -> "BertConfig":
    if variant not in VARIANTS:
      raise errors.ConfigError(f"unknown model variant {variant!r}; choose one of {list(VARIANTS)}")
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
      raise errors.ConfigError(f"unknown BertConfig fields: {sorted(unknown)}")
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
