r"""RoBERTa's pre-training recipe (Liu et al. 2019, table 9): BERT's architecture with learned positions from 2, one
segment type, byte-level BPE (50,265 ids), MLM only (no NSP) at 15% with dynamic masking on FULL-SENTENCES data,
Adam β2 0.98, ε 1e-6, peak lr 6e-4 (base) / 4e-4 (large), 24k / 30k warmup steps then linear decay, batch 8k
sequences of 512, weight decay 0.01, no gradient clipping. Usage:

  python -m bertjax dataset --input ... --tokenizer vocab.json --out DATA --example_mode full_sentences \
      --max_seq_length 512 --max_predictions_per_seq 0
  python -m bertjax train --config=configs/roberta.py:variant=base --workdir=DIR --config.data.data_dir=DATA

Argument keys: as configs/pretrain.py (variant base|large and the BERT sizes; seq, batch, steps, mask, ...).
"""
from configs import pretrain

_RECIPE = {"base": dict(lr=6e-4, warmup=24_000), "large": dict(lr=4e-4, warmup=30_000)}


def get_config(arg=None):
  a = dict(variant="base", seq=512, preds=0, batch=8192, steps=500_000, nsp=False, dynamic=True, vocab=50265,
           ln="post", act="gelu", pos="learned")
  user = dict(item.split("=", 1) for item in (arg or "").split(",") if "=" in item)
  a.update(user)
  c = pretrain.get_config(",".join(f"{k}={v}" for k, v in a.items()))
  recipe = _RECIPE.get(c.model.variant, _RECIPE["base"])
  c.model.type_vocab_size = 1
  c.model.position_offset = 2  # positions count from padding_idx + 1
  c.model.max_position_embeddings = c.data.max_seq_length + 2
  c.model.layer_norm_eps = 1e-5
  c.model.initializer = "normal"  # fairseq's init_bert_params: N(0, 0.02²)
  c.model.classifier_head = "dense_tanh"  # RobertaClassificationHead when fine-tuned
  c.data.example_mode = "full_sentences"  # what the data must have been made with (checked)
  c.train.learning_rate = recipe["lr"]
  c.train.warmup_steps = recipe["warmup"]
  c.train.schedule = "linear_from_warmup"  # fairseq's polynomial_decay: peak at the end of warmup, 0 at the end
  c.train.b2 = 0.98
  c.train.eps = 1e-6
  c.train.adam_bias_correction = True  # fairseq's Adam
  c.train.grad_clip_norm = 0.0
  c.predict_examples = ("the [MASK] of the function is returned.",)  # [MASK]: the tokenizer's mask token
  return c
