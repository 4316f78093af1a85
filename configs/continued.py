r"""Continued (domain-adaptive) pre-training of a released checkpoint on your own text. Usage:

  python -m bertjax dataset --input domain.txt --tokenizer INIT/vocab.txt --out DATA \
      --example_mode full_sentences --max_seq_length 128
  python -m bertjax train --config=configs/continued.py:init=INIT,steps=2000 --workdir=W --config.data.data_dir=DATA

INIT: an HF folder of any family bertjax reads (bert, roberta, modernbert; with its MLM head or without: a missing
head starts fresh, as the log says) or a bertjax pre-training workdir; `python -m bertjax extend_vocab` makes
one with domain words added. The model section is INIT's architecture, read from its config; the recipe is MLM
only with dynamic masking on FULL-SENTENCES data (the masks drawn anew at seq x 15% positions, whatever cap the data
was made with, so any `seq` reads data made as above), AdamW with bias correction (as HF checkpoints were trained),
peak learning rate 1e-4 after a 6% warmup, linear decay, weight decay 0.01. A stopped run resumes from its
workdir exactly as any run.

Argument keys: init (required), seq, batch, steps, lr, shard, nsp, dtype.
"""
from configs import common, pretrain


def get_config(arg=None):
  a = common.parse_arg(arg, init="", seq=128, batch=32, steps=2000, lr=1e-4, shard="dp", nsp=False, dtype="float32")
  if not a.init:
    raise ValueError("configs/continued.py needs init=HF_FOLDER_OR_WORKDIR (the checkpoint to continue)")
  from bertjax.convert import weights
  arch = weights.config_of(a.init)
  c = pretrain.get_config(f"seq={a.seq},preds=0,batch={a.batch},steps={a.steps},shard={a.shard},nsp={a.nsp},"
                          f"dynamic=True,dtype={a.dtype}")
  for name, value in arch.to_dict().items():
    if name in c.model and name not in ("dtype", "scan_layers", "remat"):
      c.model[name] = value
  c.model.variant = ""
  c.model.nsp_head = a.nsp
  c.init_checkpoint = a.init
  c.data.example_mode = "full_sentences"
  c.train.learning_rate = a.lr
  c.train.warmup_steps = max(1, a.steps * 6 // 100)
  c.train.adam_bias_correction = True
  return c
