"""ELECTRA (Clark et al. 2020): replaced-token detection, as google-research/electra's `run_pretraining.py` and
`pretrain_helpers.py` define it.

One forward pass of `ElectraForPreTraining`:
1. the example's original tokens (any static masks in the data put back) are masked again in the graph, as the
   original does: per row max(1, min(P, round(n·mask_prob))) positions among the real tokens that are not
   [CLS]/[SEP]/[MASK] (n counts every real token), 85% of them replaced by [MASK], the rest left as they are;
2. the generator (a smaller encoder) predicts the masked tokens (its MLM logits, tied to the shared word
   embeddings at the embedding width);
3. a replacement is sampled at each masked position from softmax(logits / temperature) with the gradient stopped;
   the corrupted sequence is the original with those samples in place, and a position is "replaced" only if its
   sample differs from the original token;
4. the discriminator reads the corrupted sequence and scores every position (a 1-unit head).
The loss (`electra_sums` / `electra_loss`) is L_gen + λ·L_disc, L_disc the sigmoid cross-entropy over every real
token. Generator and discriminator share the token, position and segment embeddings (and their norm), as the
original ties them; each projects them to its own width when that differs (`embeddings_project`).
With `embedding_sharing="gdes"` (DeBERTa-v3's gradient-disentangled embedding sharing, He et al. 2023) the
discriminator reads the word table as stop_gradient(E) + Δ, Δ its own zero-initialised table: the generator's
MLM loss alone trains E, the discriminator's loss trains Δ, and the discriminator's embeddings are E + Δ
(`split`). The other embedding parameters (positions, segments, norm) stay shared.

Positions are drawn without replacement (Gumbel top-k); the original draws them with replacement, so a row of
its may hold a position twice and mask slightly fewer distinct tokens than the count.

The objective (configs/electra.py) trains both networks in one step, L = L_gen + λ·L_disc.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.core import accounting, losses, trainer
from bertjax.model.config import ACTIVATIONS, BertConfig
from bertjax.model.encoder import BertModel
from bertjax.model.heads import BertForPreTraining
from bertjax.model.layers import Dense, Embeddings
from bertjax.objectives import base

# ELECTRA's sizes (discriminator layers, hidden, heads, FFN, embedding width) and generator fractions, from the
# paper's table 6 and the original's configure_pretraining.py.
ELECTRA_SIZES = {
    "small": dict(num_layers=12, hidden_size=256, num_heads=4, intermediate_size=1024, embedding_size=128,
                  generator_hidden=0.25),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, embedding_size=768,
                 generator_hidden=1 / 3),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096, embedding_size=1024,
                  generator_hidden=0.25),
}


def generator_config(disc: BertConfig, hidden_fraction: float, layers_fraction: float = 1.0) -> BertConfig:
  """The original's `get_generator_config`: hidden round(d·f), 4x FFN, max(1, hidden // 64) heads, layers
  round(L·f_layers), the discriminator's embedding width (the embeddings are shared)."""
  hidden = int(round(disc.hidden_size * hidden_fraction))
  return disc.replace(hidden_size=hidden, intermediate_size=4 * hidden, num_heads=max(1, hidden // 64),
                      num_layers=int(round(disc.num_layers * layers_fraction)), embedding_size=disc.embed_dim,
                      nsp_head=False)


class ElectraDiscriminator(nn.Module):
  """The encoder and its replaced-token head: logits [B, L] (float32), > 0 meaning "replaced"."""
  cfg: BertConfig
  shared_embeddings: nn.Module | None = None

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    cfg = self.cfg
    out = BertModel(cfg, self.shared_embeddings, name="bert")(batch, deterministic, pool=False)
    h = ACTIVATIONS[cfg.hidden_act](Dense((cfg.hidden_size,), ("embed", "mlp"), cfg, name="head_dense")(out["hidden"]))
    out["disc_logits"] = Dense((1,), ("mlp", None), cfg, name="head_out")(h)[..., 0].astype(jnp.float32)
    return out


def _candidates_and_counts(ids, input_mask, num_predictions: int, mask_prob: float, never):
  """(the positions a mask may take [B, L]: real tokens but `never`, masks per row [B]: max(1, min(P,
  round(n·mask_prob))), n every real token)."""
  candidates = input_mask.astype(bool)
  for s in never:
    candidates &= ids != s
  n = jnp.sum(input_mask, axis=-1).astype(jnp.float32)
  return candidates, jnp.clip(jnp.round(n * mask_prob).astype(jnp.int32), 1, num_predictions)


def _draw(draw, key, shape, part):
  """`draw(key, shape)`, or with `part` (i, n) the rows of micro-batch i of n (rows i, i + n, ...) of the draw
  for the whole batch: a micro-batch masks and samples as its rows would in one step of the whole batch."""
  if part is None:
    return draw(key, shape)
  i, n = part
  whole = draw(key, (shape[0] * n,) + tuple(shape[1:]))
  return whole.reshape((shape[0], n) + tuple(shape[1:]))[:, i]


def _electra_mask(rng, ids, input_mask, num_predictions: int, mask_prob: float, special_ids, mask_id: int,
                  part=None):
  """(masked ids, positions [B, P], original ids there, weights [B, P]) by the original's dynamic masking."""
  candidates, count = _candidates_and_counts(ids, input_mask, num_predictions, mask_prob, special_ids)
  k1, k2 = jax.random.split(rng)
  score = jnp.where(candidates, _draw(jax.random.gumbel, k1, ids.shape, part), -jnp.inf)
  top, positions = jax.lax.top_k(score, num_predictions)
  weights = (jnp.arange(num_predictions)[None] < count[:, None]) & jnp.isfinite(top)
  positions = jnp.where(weights, positions, 0).astype(jnp.int32)
  originals = jnp.take_along_axis(ids, positions, axis=1) * weights
  to_mask = weights & (_draw(jax.random.uniform, k2, positions.shape, part) < 0.85)
  rows = jnp.arange(ids.shape[0])[:, None]
  masked = ids.at[rows, jnp.where(to_mask, positions, ids.shape[1])].set(mask_id, mode="drop")
  return masked, positions, originals, weights.astype(jnp.float32)


def masks_in(model: "ElectraForPreTraining", batch):
  """The masked positions `model` draws in the batch's rows in all (what the generator's loss divides by)."""
  candidates, count = _candidates_and_counts(unmask(batch), batch["input_mask"], batch["masked_lm_positions"].shape[1],
                                             model.mask_prob, tuple(model.special_ids) + (model.mask_id,))
  return jnp.sum(jnp.minimum(count, jnp.sum(candidates, axis=-1))).astype(jnp.float32)


def unmask(batch):
  """The original tokens of a batch whose data carries static masks (labels put back at their positions)."""
  ids, w = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["masked_lm_weights"]) > 0
  rows = jnp.arange(ids.shape[0])[:, None]
  pos = jnp.where(w, batch["masked_lm_positions"], ids.shape[1])
  return ids.at[rows, pos].set(batch["masked_lm_ids"], mode="drop")


class ElectraForPreTraining(nn.Module):
  """Generator + discriminator with shared embeddings; see the module docstring. Randomness (masking, sampling)
  comes from the "electra" stream when given, else a fixed key (evaluation)."""
  disc_cfg: BertConfig
  gen_cfg: BertConfig
  mask_prob: float = 0.15
  temperature: float = 1.0
  special_ids: tuple = ()  # never masked: [CLS], [SEP] (and [MASK] itself)
  mask_id: int = 0
  embedding_sharing: str = "shared"  # shared (ELECTRA) | gdes (DeBERTa-v3)

  def setup(self):
    self.embeddings = Embeddings(self.disc_cfg)
    self.generator = BertForPreTraining(self.gen_cfg, self.embeddings)
    disc_embeddings = self.embeddings
    if self.embedding_sharing == "gdes":
      disc_embeddings = DeltaEmbeddings(self.disc_cfg, self.embeddings, name="gdes")
    self.discriminator = ElectraDiscriminator(self.disc_cfg, disc_embeddings)

  def __call__(self, batch, deterministic: bool = True, part=None):
    """`part` (i, n): the batch is micro-batch i of n (`trainer.accumulate`), masked and sampled as its rows
    would be in the whole batch."""
    rng = self.make_rng("electra") if self.has_rng("electra") else jax.random.key(0)
    k_mask, k_sample = jax.random.split(rng)
    ids = unmask(batch)
    masked, positions, originals, weights = _electra_mask(
        k_mask, ids, batch["input_mask"], batch["masked_lm_positions"].shape[1], self.mask_prob,
        tuple(self.special_ids) + (self.mask_id,), self.mask_id, part)
    gen_batch = dict(batch, input_ids=masked, masked_lm_positions=positions)
    gen = self.generator(gen_batch, deterministic)
    logits = jax.lax.stop_gradient(gen["mlm_logits"]) / self.temperature
    if part is None:
      sampled = jax.random.categorical(k_sample, logits, axis=-1).astype(ids.dtype)
    else:  # jax's categorical: the argmax of the logits plus Gumbel noise, here the whole batch's noise
      noise = _draw(lambda k, shape: jax.random.gumbel(k, shape, logits.dtype), k_sample, logits.shape, part)
      sampled = jnp.argmax(noise + logits, axis=-1).astype(ids.dtype)
    rows = jnp.arange(ids.shape[0])[:, None]
    fake = ids.at[rows, jnp.where(weights > 0, positions, ids.shape[1])].set(sampled, mode="drop")
    disc = self.discriminator(dict(batch, input_ids=fake), deterministic)
    return {"mlm_logits": gen["mlm_logits"], "masked_lm_positions": positions, "masked_lm_ids": originals,
            "masked_lm_weights": weights, "sampled_ids": sampled, "disc_logits": disc["disc_logits"],
            "disc_labels": (fake != ids).astype(jnp.float32), "fake_ids": fake}


class DeltaEmbeddings(nn.Module):
  """The shared embeddings as the discriminator reads them under GDES: the word table stop_gradient(E) + Δ, Δ
  ("delta", zero at the start) this module's own."""
  cfg: BertConfig
  base: nn.Module

  @nn.compact
  def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
    cfg = self.cfg
    delta = self.param("delta", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab", "embed")),
                       (cfg.padded_vocab_size, cfg.embed_dim), cfg.params_dtype)
    return self.base(input_ids, segment_ids, position_ids, deterministic, word_delta=delta)


def electra_sums(out, batch):
  """Sums from which the losses and accuracies are ratios: generator MLM (as BERT's, at the in-graph masks),
  sampled-token accuracy, and the discriminator's sigmoid cross-entropy and accuracy over every real token."""
  w = out["masked_lm_weights"]
  ce = losses.cross_entropy(out["mlm_logits"], out["masked_lm_ids"])
  tok = batch["input_mask"].astype(jnp.float32)
  z, y = out["disc_logits"], out["disc_labels"]
  bce = jnp.maximum(z, 0.0) - z * y + jnp.log1p(jnp.exp(-jnp.abs(z)))
  pred = (z > 0).astype(jnp.float32)
  # ROC counts at AUC_THRESHOLDS probability thresholds, as the original's tf.metrics.auc (200 thresholds):
  # per probability bin, the real tokens that are replaced and those that are not.
  bins = jnp.clip(jnp.floor(jax.nn.sigmoid(z) * AUC_THRESHOLDS), 0, AUC_THRESHOLDS - 1).astype(jnp.int32).ravel()
  pos_hist = jnp.zeros(AUC_THRESHOLDS).at[bins].add((y * tok).ravel())
  neg_hist = jnp.zeros(AUC_THRESHOLDS).at[bins].add(((1 - y) * tok).ravel())
  return {"disc_pos_hist": pos_hist, "disc_neg_hist": neg_hist, "mlm_loss_sum": jnp.sum(ce * w),
          "mlm_weight": jnp.sum(w),
          "mlm_correct": jnp.sum(losses.is_argmax(out["mlm_logits"], out["masked_lm_ids"]) * w),
          "sampled_correct": jnp.sum((out["sampled_ids"] == out["masked_lm_ids"]) * w),
          "disc_loss_sum": jnp.sum(bce * tok), "disc_weight": jnp.sum(tok),
          "disc_correct": jnp.sum((pred == y) * tok), "replaced": jnp.sum(y * tok),
          "disc_true_positive": jnp.sum(pred * y * tok), "disc_predicted": jnp.sum(pred * tok)}


AUC_THRESHOLDS = 200


def auc_from_histograms(pos_hist, neg_hist):
  """Area under the ROC curve from per-bin counts (trapezoids between the bins' thresholds)."""
  tp = jnp.cumsum(pos_hist[::-1])[::-1]  # predicted positive at threshold i: bins >= i
  fp = jnp.cumsum(neg_hist[::-1])[::-1]
  tpr = jnp.concatenate([tp / jnp.maximum(tp[0], 1e-6), jnp.zeros(1)])
  fpr = jnp.concatenate([fp / jnp.maximum(fp[0], 1e-6), jnp.zeros(1)])
  return jnp.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2.0)


def electra_loss(sums, disc_weight: float = 50.0, denominators=None):
  """(L_gen + λ·L_disc, metrics) from `electra_sums`, the denominators as the original's (+1e-6).
  `denominators` (generator's, discriminator's): the whole batch's, for a micro-batch's share of its loss."""
  mlm_den, disc_den = denominators or (sums["mlm_weight"] + 1e-6, sums["disc_weight"] + 1e-6)
  m = {"mlm_loss": sums["mlm_loss_sum"] / mlm_den,
       "mlm_accuracy": sums["mlm_correct"] / (sums["mlm_weight"] + 1e-6),
       "sampled_accuracy": sums["sampled_correct"] / (sums["mlm_weight"] + 1e-6),
       "disc_loss": sums["disc_loss_sum"] / disc_den,
       "disc_accuracy": sums["disc_correct"] / (sums["disc_weight"] + 1e-6),
       "disc_baseline_accuracy": 1.0 - sums["replaced"] / (sums["disc_weight"] + 1e-6),
       "disc_precision": sums["disc_true_positive"] / (sums["disc_predicted"] + 1e-6),
       "disc_recall": sums["disc_true_positive"] / (sums["replaced"] + 1e-6),
       "disc_auc": auc_from_histograms(sums["disc_pos_hist"], sums["disc_neg_hist"])}
  m["loss"] = m["mlm_loss"] + disc_weight * m["disc_loss"]
  return m["loss"], m


def join(discriminator: dict, generator: dict) -> dict:
  """`ElectraForPreTraining`'s tree from a discriminator's (`ElectraDiscriminator`) and a generator's
  (`BertForPreTraining`) trees; the shared embeddings are the discriminator's."""
  disc_bert = {k: v for k, v in discriminator["bert"].items() if k != "embeddings"}
  gen_bert = {k: v for k, v in generator["bert"].items() if k != "embeddings"}
  return {"embeddings": discriminator["bert"]["embeddings"],
          "discriminator": {**{k: v for k, v in discriminator.items() if k != "bert"}, "bert": disc_bert},
          "generator": {**{k: v for k, v in generator.items() if k != "bert"}, "bert": gen_bert}}


def split(params: dict) -> tuple[dict, dict]:
  """(discriminator tree, generator tree), each with its own copy of the shared embeddings (as HF stores them);
  under GDES the discriminator's word table is E + Δ."""
  def whole(part, embeddings):
    return {**{k: v for k, v in part.items() if k != "bert"}, "bert": {**part["bert"], "embeddings": embeddings}}
  disc_embeddings = params["embeddings"]
  if "gdes" in params:
    words = params["embeddings"]["word_embeddings"]["embedding"]
    disc_embeddings = {**disc_embeddings, "word_embeddings": {"embedding": words + params["gdes"]["delta"]}}
  return whole(params["discriminator"], disc_embeddings), whole(params["generator"], params["embeddings"])


# ----------------------------------------------------------------------------- the objective
def errors(config, mcfg) -> list[str]:
  out = []
  if config.data.packing:
    out.append("objective 'electra' does not take data.packing (its masks are drawn per row in the graph)")
  if config.train.use_nsp:
    out.append("objective 'electra' has no NSP: set train.use_nsp=False")
  if embedding_sharing(config) not in ("shared", "gdes"):
    out.append(f"electra.embedding_sharing {embedding_sharing(config)!r} is not one of ['shared', 'gdes']")
  freeze_at = config.electra.freeze_generator_at
  if not isinstance(freeze_at, int) or isinstance(freeze_at, bool) or freeze_at < 0:
    out.append(f"electra.freeze_generator_at must be a step >= 0 (0: joint throughout), got {freeze_at!r}")
  if mcfg is not None:
    try:
      generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
    except (ValueError, TypeError) as e:
      out.append(f"electra generator: {e}")
  return out


def embedding_sharing(config) -> str:
  """The run's electra.embedding_sharing; a workdir written before the setting existed (its config.json has no
  such key) shared the embeddings as ELECTRA does."""
  return config.electra.get("embedding_sharing", "shared")


def module(config, mcfg, special_ids=None):
  cls_id, sep_id, mask_id = special_ids or (2, 3, 4)  # placeholders for timing and AOT builds without data
  gen = generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
  return ElectraForPreTraining(mcfg, gen, mask_prob=config.data.masked_lm_prob,
                                           temperature=config.electra.temperature, special_ids=(cls_id, sep_id),
                                           mask_id=mask_id,
                                           embedding_sharing=embedding_sharing(config))


def train_step(model, tx, lr_fn, config):
  """state, batch -> state, metrics: L = L_gen + λ·L_disc in one step for both networks (ELECTRA). With
  micro-batches (`trainer.accumulate`) each draws the masks and samples of its rows in the whole batch and
  divides by the whole batch's totals, so the step is the whole batch's."""
  weight = config.electra.disc_weight
  freeze_at = config.electra.freeze_generator_at
  accum = config.train.grad_accum_steps

  def step_fn(state, batch):
    r_drop, r_electra = jax.random.split(base.dropout_key(config, state.step))
    joint = state.step < freeze_at if freeze_at else True
    whole = None
    if accum > 1:
      whole = (masks_in(model, batch) + 1e-6, jnp.sum(batch["input_mask"].astype(jnp.float32)) + 1e-6)

    def loss_fn(params, mb, i):
      part, drop = (None, r_drop) if accum == 1 else ((i, accum), jax.random.fold_in(r_drop, i))
      out = model.apply({"params": params}, mb, deterministic=False, part=part,
                        rngs={"dropout": drop, "electra": r_electra})
      sums = electra_sums(out, mb)
      loss, m = electra_loss(sums, weight, whole)
      return jnp.where(joint, loss, weight * m["disc_loss"]), sums

    grads, sums = trainer.accumulate(jax.value_and_grad(loss_fn, has_aux=True), state.params, batch, accum)
    _, metrics = electra_loss(sums, weight)
    hold = None
    if freeze_at:  # the generator stops at freeze_at: its updates (AdamW's momentum and decay too) are zero
      hold = lambda u: {**u, "generator": jax.tree.map(lambda x: jnp.where(joint, x, 0), u["generator"])}  # noqa: E731
    return base.apply_gradients(state, grads, metrics, tx, lr_fn, batch, hold,
                                ema_decay=trainer.ema_decay(config))

  return step_fn


def eval_step(model, config):
  def eval_fn(params, batch):  # the same masks and samples at every evaluation: a fixed stream
    key = jax.random.key(config.seed, impl=config.train.prng_impl)
    out = model.apply({"params": params}, batch, deterministic=True, rngs={"electra": key})
    return electra_sums(out, batch)
  return eval_fn


def metrics(sums, config) -> dict:
  return electra_loss(sums, config.electra.disc_weight)[1]


def step_flops(config, mcfg, module_) -> float:
  return step_flops_of(mcfg, module_.gen_cfg, config.data.max_seq_length, config.data.max_predictions_per_seq,
                       config.train.global_batch_size)


OBJECTIVE = base.Objective("electra", errors, module, train_step, eval_step, metrics, step_flops,
                           needs_special_ids=True, encoder=lambda params: split(params)[0], has_mlm_head=False)


def step_flops_of(disc_cfg, gen_cfg, seq_len: int, num_predictions: int, global_batch: int) -> float:
  """Model FLOPs of one ELECTRA step: the generator's MLM step (at the embedding width for the decoder) and the
  discriminator over every position with its 1-unit head (no MLM decoder)."""
  gen = accounting.model_flops_per_sequence(gen_cfg, seq_len, 0)
  gen += 3.0 * 2 * num_predictions * (gen_cfg.hidden_size * gen_cfg.embed_dim + gen_cfg.embed_dim * gen_cfg.vocab_size)
  disc = (accounting.model_flops_per_sequence(disc_cfg, seq_len, 0)
          + 3.0 * 2 * seq_len * (disc_cfg.hidden_size ** 2 + disc_cfg.hidden_size))
  return (gen + disc) * global_batch
