r"""mmBERT's schedule of masking and languages (Marone et al. 2025) on the ModernBERT architecture: three phases
whose masking rate falls 30% -> 15% -> 5% while the language sampling temperature falls 0.7 -> 0.5 -> 0.3
(p_lang ∝ n_lang^τ: ever closer to uniform) and languages join the mixture phase by phase (60 -> 110 -> 1,833
in the paper; the last ones only in the short decay phase).

  pretrain  2.3T tokens, the `sources` languages, masking 30%, τ 0.7, warmup then a stable peak lr;
  mid       600B tokens, + the `mid` languages, masking 15%, τ 0.5, the peak held;
  decay     100B tokens, + the `late` languages, masking 5%, τ 0.3, lr -> 0 along 1-sqrt.

Every phase runs at `seq` here; mmBERT's context extension in its mid phase is ModernBERT's
(configs/modernbert_phases.py shows the θ and length switches a phase takes). Usage, one data folder per
language made with one tokenizer (masked at 30%: the rate the first phase needs the most positions for):

  python -m bertjax train --config="configs/mmbert.py:variant=small,sources=en:D_en;fr:D_fr,mid=sw:D_sw,late=fo:D_fo" \
      --workdir=W

Argument keys: variant (tiny|small|base), sources/mid/late ('name:folder;name:folder'), seq, batch, tokens,
mid_tokens, decay_tokens, warmup_tokens, lr, vocab.
"""
import math

import ml_collections

from configs import common, modernbert

# (layers, hidden, heads, intermediate, peak lr): mmBERT small and base (22 layers, GLU width 1152), tiny for tests.
SIZES = {"tiny": (2, 64, 2, 96, 1e-3), "small": (22, 384, 6, 1152, 8e-4), "base": (22, 768, 12, 1152, 8e-4)}


def named_folders(text: str) -> dict:
  out = {}
  for item in text.split(";"):
    if item.strip():
      name, sep, folder = item.partition(":")
      if not sep or not name.strip() or not folder.strip():
        raise ValueError(f"mmbert: {item!r} is not name:folder")
      out[name.strip()] = folder.strip()
  return out


def get_config(arg=None):
  a = common.parse_arg(arg, variant="base", sources="", mid="", late="", seq=1024, batch=4608,
                       tokens=2_300_000_000_000, mid_tokens=600_000_000_000, decay_tokens=100_000_000_000,
                       warmup_tokens=4_000_000_000, lr=0.0, vocab=256_000, shard="fsdp")
  if a.variant not in SIZES:
    raise ValueError(f"unknown mmBERT variant {a.variant!r}; choose one of {sorted(SIZES)}")
  c = modernbert.get_config(f"variant=tiny,seq={a.seq},batch={a.batch},steps=1,theta=160000,shard={a.shard},"
                            f"vocab={a.vocab}")
  layers, hidden, heads, ffn, lr = SIZES[a.variant]
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  lr = a.lr or lr
  early, mid, late = named_folders(a.sources), named_folders(a.mid), named_folders(a.late)
  c.data.data_dir = ""
  c.data.sources = ml_collections.ConfigDict({**early, **mid, **late})
  c.train.optimizer = "stable_adamw"
  c.train.learning_rate = lr
  c.train.weight_decay = 1e-5 / lr
  c.train.num_steps = 0
  warmup = max(1, math.ceil(a.warmup_tokens / (a.batch * a.seq)))
  join = lambda *groups: ",".join(n for g in groups for n in g)  # noqa: E731
  c.phases = ml_collections.ConfigDict({
      "pretrain": common.phase(tokens=a.tokens, mixture=join(early), temperature=0.7, masked_lm_prob=0.3,
                               learning_rate=lr, warmup_steps=warmup, warmup_from=0.0),
      "mid": common.phase(tokens=a.mid_tokens, mixture=join(early, mid), temperature=0.5, masked_lm_prob=0.15,
                          learning_rate=lr),
      "decay": common.phase(tokens=a.decay_tokens, mixture=join(early, mid, late), temperature=0.3,
                            masked_lm_prob=0.05, learning_rate=-1.0, schedule="wsd", decay_fraction=1.0,
                            decay_shape="1-sqrt")})
  c.phase_order = "pretrain,mid,decay"
  c.lock()
  return c
