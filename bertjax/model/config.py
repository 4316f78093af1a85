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

from bertjax import errors, kernels

# (layers, hidden, heads, ffn) by name.
VARIANTS = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


# Row length from which attention_impl="by_length" runs blockwise attention: where blockwise is as fast as dense
# and keeps less of XLA's temporary memory (docs/performance.md#attention-by-row-length has the measurements).
BLOCKWISE_FROM = {"cpu": 256, "other": 1024}
# DeBERTa's disentangled terms cost two gathers per block (and their scatter-adds backward), so blockwise pays
# off from longer rows (docs/families.md, "The fine-tuning step beside HF's, and what disentangled attention
# costs", has the measurements).
BLOCKWISE_FROM_DISENTANGLED = {"cpu": 1024, "other": 1024}


def gelu(x):
  """Exact GELU, x·Φ(x) = x·½·(1 + erf(x/√2)), written as google-research/bert's `gelu` and HF's "gelu" are.

  `jax.nn.gelu(approximate=False)` computes x·½·erfc(-x/√2): the same function (it keeps relative precision in
  the far negative tail, where both are ~0 in absolute terms), but XLA's CPU erfc takes an exp and branches,
  which makes the layer slower.
  """
  return x * 0.5 * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


CLASSIFIER_HEADS = ("pooler", "dense_tanh", "dense_gelu", "prediction")
# The dropout rates a fine-tuning config may leave negative, meaning the init's own (as HF's from_pretrained keeps
# the checkpoint's config: 0.1 for BERT, RoBERTa and ELECTRA; 0.0 for ModernBERT); BertConfig's without an init.
INIT_RATES = ("dropout_rate", "attention_dropout_rate", "classifier_dropout")
ACTIVATIONS = {
    "gelu": gelu,  # exact erf form: BERT's and HF's "gelu"
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,  # SwiGLU's gate (with ffn="glu")
}
POSITIONS = ("learned", "sinusoidal", "rotary", "alibi", "disentangled")
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
  type_vocab_size: int = 2  # segment (token type) embeddings; 0 = none (RoBERTa keeps 1, ModernBERT 0)
  hidden_act: str = "gelu"  # gelu (exact) | gelu_tanh | relu | silu
  # FFN: mlp (act(x·W1)·W2, BERT) | glu (gated: (act(x·W1) ⊙ x·Wg)·W2; GeGLU with gelu, SwiGLU with silu).
  ffn: str = "mlp"
  # learned (a table; BERT, RoBERTa) | sinusoidal (a fixed table added to the embeddings) | rotary (RoPE on queries
  # and keys; ModernBERT) | alibi (a per-head linear distance bias on the attention scores; MosaicBERT) |
  # disentangled (DeBERTa-v2/v3: content-to-position and position-to-content terms over relative positions in log
  # buckets, one normalised table of 2·position_buckets relative embeddings projected by each layer's own query
  # and key projections; no absolute positions)
  position_embedding: str = "learned"
  position_buckets: int = 256  # disentangled: relative positions in [-buckets, buckets), log-bucketed past half
  max_relative_positions: int = 512  # disentangled: the distance the log buckets reach (DeBERTa: max positions)
  position_offset: int = 0  # first position id of a row (RoBERTa counts from padding_idx + 1 = 2)
  # The HF model type of a checkpoint whose architecture another type shares ("xlm-roberta": RoBERTa's layers
  # with a sentencepiece vocabulary), so that it exports as what it was; "" where the architecture says it.
  hf_model_type: str = ""
  rope_theta: float = 10000.0  # rotary base of global-attention layers (ModernBERT: 160000)
  rope_theta_local: float = 0.0  # rotary base of local-attention layers; 0 = rope_theta (ModernBERT: 10000)
  # Sliding-window attention: 0 = every layer global; W > 0 = layers attend within |i - j| <= W/2 (ModernBERT's
  # local_attention = 128), except every `global_every`-th layer (0, N, 2N, ...), which attends globally.
  local_attention: int = 0
  global_every: int = 3
  layer_norm: str = "post"  # post (BERT) | pre (with a final norm after the stack)
  norm: str = "layernorm"  # layernorm | rmsnorm
  layer_norm_eps: float = 1e-12  # epsilon of every norm
  norm_bias: bool = True  # LayerNorm's bias (rmsnorm has none: set False)
  use_bias: bool = True  # biases of the encoder's linear layers and the MLM transform
  embedding_norm: bool = True  # a norm over the summed embeddings
  first_attention_norm: bool = True  # pre-norm: layer 0 normalises its input (ModernBERT: no, the embedding norm does)
  vocab_multiple: int = 1  # the embedding table padded to a multiple of this (64 for throughput); never predicted
  nsp_head: bool = True  # BertForPreTraining builds the pooler and NSP head (RoBERTa/ModernBERT recipes: MLM only)
  # The fine-tuning heads' transform, as each family's HF models build it: pooler (BERT: dropout over the tanh
  # pooler) | dense_tanh (RoBERTa: dropout, dense, tanh, dropout at [CLS]) | dense_gelu (ELECTRA: the same with
  # GELU) | prediction (ModernBERT: dense, activation, norm, dropout; before the token and span heads too).
  classifier_head: str = "pooler"
  classifier_pooling: str = "cls"  # cls | mean (over real tokens): what the prediction head reads per sequence
  classifier_dropout: float = -1.0  # the heads' dropout rate; < 0: dropout_rate
  # Width of the token/position/segment embeddings; 0 = hidden_size. Otherwise a linear layer projects them to
  # hidden_size (ELECTRA-small: 128 -> 256), and the tied MLM decoder works at this width.
  embedding_size: int = 0
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
  # xla (einsum) | cudnn | auto: jax.nn.dot_product_attention (fused without dropout) |
  # pallas: bertjax.kernels.attention
  # (fused with dropout; GPU, L <= 256, batch and heads may be split over a mesh) | splash: TPU Pallas splash
  # attention (fused without dropout, packed rows by segment ids; the xla path when attention dropout is on) |
  # blockwise: bertjax.kernels.blockwise on XLA, any backend (local layers in chunks within their window, global
  # ones in key blocks with an online softmax: time follows the mask, memory grows with L, not L²; for long rows) |
  # by_length: xla for rows shorter than BLOCKWISE_FROM's tokens on the backend, blockwise from there (ALiBi: xla);
  # see `attention_at`
  attention_impl: str = "xla"
  # blockwise: keys per block of a global layer at most, a row split evenly (`blockwise.balanced_block`); local
  # layers: min(this, window / 2)
  attention_block: int = 256
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
                "max_position_embeddings")
    non_negative = ("scan_unroll", "type_vocab_size", "position_offset", "local_attention", "embedding_size")
    for name in positive + non_negative + ("global_every", "vocab_multiple", "attention_block"):
      value, least = getattr(self, name), 0 if name in non_negative else 1
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        what = "a non-negative integer" if least == 0 else "a positive integer"
        raise errors.ConfigError(f"BertConfig.{name} must be {what}, got {value!r}")
    if self.hidden_size % self.num_heads:
      raise errors.ConfigError(f"BertConfig: hidden_size {self.hidden_size} is not divisible by "
                       f"num_heads {self.num_heads}")
    choices = {"hidden_act": ACTIVATIONS, "position_embedding": POSITIONS, "ffn": ("mlp", "glu"),
               "norm": ("layernorm", "rmsnorm"), "norm_bias": (False, True), "use_bias": (False, True),
               "embedding_norm": (False, True), "first_attention_norm": (False, True), "nsp_head": (False, True),
               "layer_norm": ("post", "pre"), "dtype": DTYPES, "param_dtype": DTYPES,
               "remat": ("none", "full", "dots"),
               "attention_impl": ("xla", "cudnn", "auto", "pallas", "splash", "blockwise", "by_length"),
               "embedding_lookup": ("gather", "one_hot", "auto"), "dropout_impl": ("rng", "hash"),
               "prune_final_layer": (False, True), "initializer": ("truncated_normal", "normal"),
               "classifier_head": CLASSIFIER_HEADS, "classifier_pooling": ("cls", "mean")}
    for name, allowed in choices.items():
      if getattr(self, name) not in allowed:
        raise errors.ConfigError(f"BertConfig.{name}={getattr(self, name)!r}; choose one of {sorted(allowed)}")
    if self.position_embedding == "sinusoidal" and self.embed_dim % 2:
      raise errors.ConfigError("BertConfig: sinusoidal positions need an even hidden_size")
    self._check_combinations()
    if self.classifier_pooling == "mean" and self.classifier_head != "prediction":
      raise errors.ConfigError("BertConfig.classifier_pooling='mean' is read by the 'prediction' head (ModernBERT's); "
                               f"classifier_head is {self.classifier_head!r}")
    for name in ("dropout_rate", "attention_dropout_rate", "classifier_dropout"):
      if name == "classifier_dropout" and self.classifier_dropout < 0:
        continue
      if not 0.0 <= getattr(self, name) < 1.0:
        raise errors.ConfigError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")

  def _check_combinations(self):
    """The switches that do not go together, each named with its fix."""
    bad = errors.ConfigError
    if self.position_embedding == "rotary" and self.head_dim % 2:
      raise bad(f"BertConfig: rotary positions need an even head_dim, got {self.head_dim}")
    if self.position_offset and self.position_embedding != "learned":
      raise bad(f"BertConfig.position_offset={self.position_offset} offsets a learned position table; "
                f"position_embedding is {self.position_embedding!r}")
    if (self.rope_theta_local or self.rope_theta != 10000.0) and self.position_embedding != "rotary":
      raise bad("BertConfig.rope_theta / rope_theta_local set, but position_embedding is "
                f"{self.position_embedding!r}, not 'rotary'")
    if min(self.rope_theta, self.rope_theta_local or 1.0) <= 0:
      raise bad("BertConfig.rope_theta and rope_theta_local must be positive")
    if self.norm == "rmsnorm" and self.norm_bias:
      raise bad("BertConfig: norm='rmsnorm' has no bias; set norm_bias=False")
    if not self.first_attention_norm and self.layer_norm != "pre":
      raise bad("BertConfig.first_attention_norm=False applies to pre-norm stacks; layer_norm is 'post'")
    if self.local_attention:
      if self.local_attention % 2 or self.local_attention < 2:
        raise bad(f"BertConfig.local_attention must be an even window of at least 2 tokens, got "
                  f"{self.local_attention}")
      if self.local_attention >= self.max_position_embeddings:
        raise bad(f"BertConfig.local_attention {self.local_attention} is not shorter than "
                  f"max_position_embeddings {self.max_position_embeddings}: every layer would be global")
    if self.position_embedding == "disentangled" and not 1 < self.position_buckets < self.max_relative_positions:
      raise bad(f"BertConfig.position_buckets {self.position_buckets} must be in (1, max_relative_positions "
                f"{self.max_relative_positions})")
    if self.attention_impl != "by_length" and not kernels.BACKENDS[self.attention_impl].runs(self.score_terms):
      names = {"alibi": "position_embedding='alibi'", "disentangled": "position_embedding='disentangled'",
               "window": "local_attention"}
      on = [repr(name) for name in kernels.runs_on(self.score_terms)]
      on = on[0] if len(on) == 1 else ", ".join(on[:-1]) + " or " + on[-1]
      raise bad(f"BertConfig: {' with '.join(names[t] for t in kernels.SCORE_TERMS if t in self.score_terms)} "
                f"runs on attention_impl={on} (a bias or banded mask on the scores), not {self.attention_impl!r}")
    if self.position_offset + 1 > self.max_position_embeddings:
      raise bad(f"BertConfig.position_offset {self.position_offset} leaves no room in max_position_embeddings "
                f"{self.max_position_embeddings}")

  def attention_at(self, length: int, platform: str | None = None) -> str:
    """The attention implementation that runs rows of `length` tokens on `platform` (default: JAX's backend):
    `attention_impl`, or for "by_length" xla below `BLOCKWISE_FROM`'s length and blockwise from it (xla for
    score terms blockwise does not run: ALiBi, DeBERTa's terms beside a sliding window)."""
    if self.attention_impl != "by_length":
      return self.attention_impl
    if not kernels.BACKENDS["blockwise"].runs(self.score_terms):
      return "xla"
    platform = platform or jax.default_backend()
    table = BLOCKWISE_FROM_DISENTANGLED if self.position_embedding == "disentangled" else BLOCKWISE_FROM
    return "blockwise" if length >= table.get(platform, table["other"]) else "xla"

  @property
  def score_terms(self) -> frozenset:
    """The terms this model adds to the attention scores (`kernels.SCORE_TERMS`), which its backend must run."""
    return frozenset(t for t, on in (("alibi", self.position_embedding == "alibi"),
                                     ("disentangled", self.position_embedding == "disentangled"),
                                     ("window", self.local_attention > 0)) if on)

  def layer_is_local(self, i: int) -> bool:
    """Whether layer i attends within the sliding window (ModernBERT: every layer but 0, N, 2N, ...)."""
    return bool(self.local_attention) and i % self.global_every != 0

  @property
  def max_length(self) -> int:
    """The longest sequence the positions allow (a learned table less its offset)."""
    return self.max_position_embeddings - self.position_offset

  @property
  def embed_dim(self) -> int:
    """Width of the embeddings (and of the tied MLM decoder)."""
    return self.embedding_size or self.hidden_size

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the word-embedding table: vocab_size rounded up to a multiple of vocab_multiple."""
    return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

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

  @property
  def head_dropout_rate(self) -> float:
    return self.dropout_rate if self.classifier_dropout < 0 else self.classifier_dropout

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
