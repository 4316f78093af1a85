r"""ModernBERT's whole pre-training in one run (Warner et al. 2024, §2.2): three phases on one workdir.

  stable   1.7T tokens at 1,024, rotary θ 10,000, the batch ramping from 768 to 4,608 sequences over the first
           50B tokens, peak lr 8e-4 after a 3B-token warmup, held (warmup-stable-decay's stable part);
  context  250B tokens at 8,192, the global layers' θ raised to 160,000, lr 3e-4, the batch in sequences cut so
           that a step holds as many tokens as before;
  decay    50B tokens at 8,192, lr 3e-4 -> 0 along 1-sqrt.

StableAdamW (β 0.9/0.98, ε 1e-6), weight decay 1e-5 fully decoupled (here 1e-5/peak: the coupled form equals it),
30% masking drawn in the pipeline, MLM only. The stable phase's end is kept as a checkpoint (the pre-decay
checkpoint others anneal from). Usage, with data made at each length by `python -m bertjax dataset`
(--example_mode full_sentences --masked_lm_prob 0.3 --max_predictions_per_seq 0):

  python -m bertjax train --config=configs/modernbert_phases.py:variant=base,data=D1024,long_data=D8192 \
      --workdir=W

Argument keys: variant (tiny|base|large), data, long_data, decay_data (default long_data), seq, long_seq, batch,
batch_from, tokens, long_tokens, decay_tokens, batch_warmup_tokens, warmup_tokens, lr, long_lr, theta, long_theta,
vocab (the data's tokenizer vocabulary; default ModernBERT's 50,368). Token counts are token slots (sequences x
length); phase lengths in steps follow from them.
"""
import math

import ml_collections

from configs import common, modernbert


def get_config(arg=None):
  a = common.parse_arg(arg, variant="base", data="", long_data="", decay_data="", seq=1024, long_seq=8192, batch=4608,
                       batch_from=768, tokens=1_700_000_000_000, long_tokens=250_000_000_000,
                       decay_tokens=50_000_000_000, batch_warmup_tokens=50_000_000_000, warmup_tokens=3_000_000_000,
                       lr=0.0, long_lr=3e-4, theta=10_000.0, long_theta=160_000.0, vocab=50368, shard="fsdp")
  c = modernbert.get_config(f"variant={a.variant},seq={a.seq},batch={a.batch},steps=1,theta={a.theta},shard={a.shard},"
                            f"vocab={a.vocab}")
  lr = a.lr or c.train.learning_rate
  c.model.max_position_embeddings = max(a.long_seq, a.seq)
  c.data.data_dir = ""
  c.data.sources = ml_collections.ConfigDict({"short": a.data, "long": a.long_data,
                                              "decay": a.decay_data or a.long_data})
  c.train.optimizer = "stable_adamw"
  c.train.weight_decay = 1e-5 / lr
  c.train.learning_rate = lr
  c.train.num_steps = 0
  long_batch = max(1, a.batch * a.seq // a.long_seq)
  warmup_steps = max(1, math.ceil(a.warmup_tokens / (a.batch_from * a.seq)))
  c.phases = ml_collections.ConfigDict({
      "stable": common.phase(tokens=a.tokens, seq=a.seq, mixture="short", batch_warmup_tokens=a.batch_warmup_tokens,
                             batch_warmup_from=a.batch_from, batch_warmup_levels=6, learning_rate=lr,
                             warmup_steps=warmup_steps, warmup_from=0.0, rope_theta=a.theta, rope_theta_local=a.theta),
      "context": common.phase(tokens=a.long_tokens, seq=a.long_seq, global_batch_size=long_batch, mixture="long",
                              batch_warmup_tokens=0, learning_rate=a.long_lr, warmup_from=a.long_lr,
                              rope_theta=a.long_theta, rope_theta_local=10_000.0),
      "decay": common.phase(tokens=a.decay_tokens, seq=a.long_seq, global_batch_size=long_batch, mixture="decay",
                            batch_warmup_tokens=0, learning_rate=-1.0, schedule="wsd", decay_fraction=1.0,
                            decay_shape="1-sqrt", rope_theta=a.long_theta, rope_theta_local=10_000.0)})
  c.phase_order = "stable,context,decay"
  c.lock()
  return c
