r"""ELECTRA's pre-training recipe (Clark et al. 2020, table 6 and google-research/electra's
configure_pretraining.py): replaced-token detection with a generator of 1/4 (small, large) or 1/3 (base) the
discriminator's width sharing its embeddings, 15% masking (25% for large) drawn in the graph each step, 85% of
them [MASK], replacements sampled at temperature 1, L = L_gen + 50·L_disc; AdamW (the original's update, ε 1e-6,
weight decay 0.01), linear warmup (10k steps) and decay, clipping at 1.0; small: embeddings 128, lr 5e-4, batch
128 x 128 tokens, 1M steps; base: lr 2e-4, batch 256 x 512, 766k steps; large: lr 2e-4, batch 2048 x 512,
400k steps. Usage:

  python -m bertjax dataset --input ... --tokenizer vocab.txt --out DATA --example_mode full_sentences \
      --max_seq_length 128 --max_predictions_per_seq 0
  python -m bertjax train --config=configs/electra.py:variant=small --workdir=DIR --config.data.data_dir=DATA

Argument keys: as configs/pretrain.py; variant tiny|small|base|large. Any architecture switch of
configs/pretrain.py applies to both networks (e.g. --config.model.position_embedding=rotary).
"""
import ml_collections

from bertjax.objectives import electra as electra
from configs import pretrain

RECIPE = {  # learning rate, batch, sequence, steps, masking rate
    "tiny": (1e-3, 32, 128, 1500, 0.15), "small": (5e-4, 128, 128, 1_000_000, 0.15),
    "base": (2e-4, 256, 512, 766_000, 0.15), "large": (2e-4, 2048, 512, 400_000, 0.25)}
TINY = dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, embedding_size=64,
            generator_hidden=0.5)


def get_config(arg=None):
  a = dict(variant="small", preds=0, nsp=False, ln="post", act="gelu", pos="learned")
  a.update(dict(item.split("=", 1) for item in (arg or "").split(",") if "=" in item))
  variant = a.pop("variant")
  if variant not in RECIPE:
    raise ValueError(f"unknown ELECTRA variant {variant!r}; choose one of {sorted(RECIPE)}")
  lr, batch, seq, steps, mask = RECIPE[variant]
  for k, v in dict(batch=batch, seq=seq, steps=steps, mask=mask).items():
    a.setdefault(k, v)
  c = pretrain.get_config(",".join(f"{k}={v}" for k, v in a.items()))
  sizes = dict(TINY if variant == "tiny" else electra.ELECTRA_SIZES[variant])
  c.model.variant = ""  # the sizes below
  c.objective = "electra"  # replaced-token detection (bertjax.model.electra); "mlm" for BERT's objective
  e = ml_collections.ConfigDict()
  e.generator_hidden = sizes.pop("generator_hidden")  # generator width / discriminator width
  e.generator_layers = 1.0  # generator depth / discriminator depth
  e.temperature = 1.0  # sampling temperature of the replacements
  e.disc_weight = 50.0  # λ in L_gen + λ·L_disc
  # 0: both networks train jointly throughout (the original). N > 0: a two-stage schedule (cf. the paper's
  # two-stage ablation): from step N the generator is held fixed and L_gen leaves the loss, so the discriminator
  # and the shared embeddings learn against a stationary generator.
  e.freeze_generator_at = 0
  # shared: one embedding table both networks' losses train (ELECTRA) | gdes: the discriminator reads
  # stop_gradient(E) + its own Δ, so only the generator trains E (DeBERTa-v3's gradient-disentangled sharing)
  e.embedding_sharing = "shared"
  with c.unlocked():
    c.electra = e
  for k, v in sizes.items():
    c.model[k] = v
  c.model.classifier_head = "dense_gelu"  # what fine-tuning puts on the discriminator (ElectraClassificationHead)
  c.data.example_mode = "full_sentences"
  c.train.learning_rate = lr
  c.train.warmup_steps = 10_000 if variant != "tiny" else 150
  c.train.adam_bias_correction = False  # the original's AdamWeightDecayOptimizer, as BERT's
  c.train.eps = 1e-6
  c.train.weight_decay = 0.01
  c.train.grad_clip_norm = 1.0
  c.predict_examples = ()
  return c
