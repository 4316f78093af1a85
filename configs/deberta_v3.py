r"""DeBERTa-v3's pre-training recipe (He et al. 2023): replaced-token detection (the ELECTRA objective) on the
DeBERTa architecture, with gradient-disentangled embedding sharing (GDES): the discriminator reads the
generator's word embeddings with the gradient stopped plus its own zero-initialised delta. The discriminator has
disentangled attention (relative positions in 256 log buckets up to 512, no absolute positions, no segment
types, LayerNorm eps 1e-7); the generator has its width and half its depth; 15% of the tokens masked in the
graph each step, L = L_gen + 50·L_disc. The optimizer and schedule are configs/electra.py's for the same size
(DeBERTa-v3's own batch and step counts are set with --config.train.*). Usage:

  python -m bertjax dataset --input ... --tokenizer tokenizer.json --out DATA --example_mode full_sentences \
      --max_seq_length 512 --max_predictions_per_seq 0
  python -m bertjax train --config=configs/deberta_v3.py:variant=base --workdir=DIR --config.data.data_dir=DATA

Argument keys: as configs/electra.py; variant tiny|base|large; attention by_length|xla|blockwise. The
discriminator exports as HF's DebertaV2Model (fine-tuning reads it with init=DIR).
"""
from configs import electra

SIZES = {"tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, position_buckets=32,
                      max_relative_positions=128),
         "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, position_buckets=256,
                      max_relative_positions=512),
         "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096, position_buckets=256,
                       max_relative_positions=512)}


def get_config(arg=None):
  a = dict(item.split("=", 1) for item in (arg or "").split(",") if "=" in item)
  variant, attention = a.get("variant", "base"), a.pop("attention", "by_length")
  if variant not in SIZES:
    raise ValueError(f"unknown DeBERTa-v3 variant {variant!r}; choose one of {sorted(SIZES)}")
  if attention not in ("by_length", "xla", "blockwise"):
    raise ValueError(f"DeBERTa-v3 attention {attention!r}: by_length, xla or blockwise")
  c = electra.get_config(",".join(f"{k}={v}" for k, v in a.items()))
  for k, v in SIZES[variant].items():
    c.model[k] = v
  c.model.embedding_size = 0  # the hidden width: no factorised embeddings
  c.model.position_embedding = "disentangled"
  c.model.type_vocab_size = 0
  c.model.layer_norm_eps = 1e-7
  # xla below BLOCKWISE_FROM_DISENTANGLED's length (the relative terms a [L, L] score bias), blockwise from it (the
  # terms added block by block); attention=xla|blockwise picks one
  c.model.attention_impl = attention
  c.model.prune_final_layer = False
  c.electra.generator_hidden = 1.0  # the generator: the discriminator's width, half its depth
  c.electra.generator_layers = 0.5
  c.electra.embedding_sharing = "gdes"
  return c
