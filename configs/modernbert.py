r"""ModernBERT's pre-training recipe (Warner et al. 2024): pre-norm with a final norm and no biases, GeGLU,
rotary positions (θ 160,000 in the global layers, 10,000 in the sliding-window layers), 128-token local
attention with a global layer every third, no segment types, vocabulary 50,368 (a multiple of 64), MLM only at
30% (evaluated at 15%), AdamW β2 0.98, ε 1e-6, weight decay 1e-5, peak lr 8e-4 (base) / 5e-4 (large),
warmup-stable-decay with a 1-sqrt decay, sequences of 1024. Usage:

  python -m bertjax dataset --input ... --tokenizer tokenizer.json --out DATA --example_mode full_sentences \
      --max_seq_length 1024 --masked_lm_prob 0.3 --max_predictions_per_seq 0
  python -m bertjax train --config=configs/modernbert.py:variant=base --workdir=DIR --config.data.data_dir=DATA

Context extension (ModernBERT's second phase): continue a short-context checkpoint at a long length with the
global layers' rotary θ raised (the local layers keep theirs) and attention whose cost follows its mask:

  python -m bertjax train --config=configs/modernbert.py:variant=base,context=8192,init=SHORT_WORKDIR \
      --workdir=LONG --config.data.data_dir=DATA_8192

Argument keys: as configs/pretrain.py; variant tiny|base|large takes ModernBERT's sizes (tiny for tests); theta:
the global layers' rotary θ (160,000 as the released models have it; ModernBERT's first phase ran at 10,000);
context=N with init=PATH (a bertjax workdir or an HF ModernBERT folder): the second phase at N tokens, the global
θ raised to long_theta (160,000), attention_impl blockwise, the learning-rate warmup shortened to 5% of steps.
"""
from configs import pretrain

# (layers, hidden, heads, GLU width, peak lr): the paper's base and large, and a tiny one for tests and demos.
SIZES = {"tiny": (4, 128, 2, 192, 1e-3), "base": (22, 768, 12, 1152, 8e-4), "large": (28, 1024, 16, 2624, 5e-4)}


def get_config(arg=None):
  a = dict(variant="base", seq=1024, preds=0, batch=4608, steps=400_000, nsp=False, mask=0.3, dynamic=True,
           vocab=50368, ln="pre", act="gelu", pos="rotary")
  a.update(dict(item.split("=", 1) for item in (arg or "").split(",") if "=" in item))
  variant = a.pop("variant")
  theta, long_theta = float(a.pop("theta", 160_000.0)), float(a.pop("long_theta", 160_000.0))
  context, init = int(a.pop("context", 0)), a.pop("init", "")
  if context and not init:
    raise ValueError("context=N continues a short-context checkpoint: give init=PATH (a bertjax workdir or an HF "
                     "ModernBERT folder)")
  if context:
    a["seq"] = context
  if variant not in SIZES:
    raise ValueError(f"unknown ModernBERT variant {variant!r}; choose one of {sorted(SIZES)}")
  c = pretrain.get_config(",".join(f"{k}={v}" for k, v in a.items()))
  layers, hidden, heads, ffn, lr = SIZES[variant]
  c.model.variant = ""  # the sizes below, not BERT's table
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  c.model.type_vocab_size = 0
  c.model.ffn = "glu"
  c.model.rope_theta = long_theta if context else theta
  c.model.rope_theta_local = 10_000.0
  c.model.local_attention = min(128, c.data.max_seq_length // 2)
  c.model.global_every = 3
  c.model.norm_bias = False
  c.model.use_bias = False
  c.model.first_attention_norm = False
  c.model.layer_norm_eps = 1e-5
  c.model.vocab_multiple = 64
  c.model.max_position_embeddings = max(c.data.max_seq_length, 8192)
  c.model.dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  c.model.classifier_head = "prediction"  # the fine-tuning heads share the MLM head's dense + norm
  c.data.eval_masked_lm_prob = 0.15
  c.data.example_mode = "full_sentences"
  c.train.learning_rate = lr
  c.train.warmup_steps = 3_000
  c.train.schedule = "wsd"
  c.train.decay_shape = "sqrt"
  c.train.decay_fraction = 0.1
  c.train.b2 = 0.98
  c.train.eps = 1e-6
  c.train.weight_decay = 1e-5
  c.train.adam_bias_correction = True
  c.train.grad_clip_norm = 1.0
  c.predict_examples = ("the [MASK] of the function is returned.",)
  if context:
    c.init_checkpoint = init
    c.model.attention_impl = "blockwise"
    c.train.warmup_steps = max(1, c.train.num_steps // 20)
  return c
