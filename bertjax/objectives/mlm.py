"""Masked language modelling, with next-sentence prediction when `train.use_nsp` (BERT): L = L_MLM + L_NSP on
BertForPreTraining; without it, the MLM-only objective of RoBERTa and ModernBERT.

MLM: cross-entropy at the gathered masked positions, weighted mean with denominator sum(weights) + 1e-5 (as
google-research/bert's `run_pretraining.py`). NSP: 2-way cross-entropy on [CLS].

The losses a researcher edits for an ablation are `mlm_losses` (per masked position) and `nsp_losses` (per
example): the train step, evaluation and the helpers `mlm_loss` / `nsp_loss` all reach them through
`pretraining_sums`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import model as model_lib
from bertjax.core import accounting, losses, trainer
from bertjax.objectives import base


def mlm_losses(logits, ids):
  """The MLM loss of each masked position [B, P] (cross-entropy; logits [B, P, V] in float32): what training
  weighs by masked_lm_weights and averages."""
  return losses.cross_entropy(logits, ids)


def nsp_losses(logits, labels):
  """The NSP loss of each example [B]: label 0 = B is the actual next segment, 1 = B is random (the original's
  labels)."""
  return losses.cross_entropy(logits, labels)


def mlm_loss(logits, ids, weights):
  """Mean MLM loss over masked positions: sum(w·loss) / (sum(w) + 1e-5). logits [B, P, V]."""
  return losses.weighted_mean(mlm_losses(logits, ids), weights, eps=1e-5)


def nsp_loss(logits, labels, weights=None):
  """Mean NSP loss (over the examples of weight > 0 when `weights` is given)."""
  ce = nsp_losses(logits, labels)
  return jnp.mean(ce) if weights is None else jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1e-5)


def pretraining_sums(out, batch):
  """Sums over the batch from which every pre-training loss and accuracy is a ratio (exact under micro-batching);
  the losses are `mlm_losses` and `nsp_losses`."""
  w = batch["masked_lm_weights"].astype(jnp.float32)
  ids = batch["masked_lm_ids"]
  sums = {"mlm_loss_sum": jnp.sum(mlm_losses(out["mlm_logits"], ids) * w),
          "mlm_correct": jnp.sum(losses.is_argmax(out["mlm_logits"], ids) * w),
          "mlm_weight": jnp.sum(w)}
  if "next_sentence_labels" in batch and "nsp_logits" in out:  # an MLM-only model has no NSP head
    labels = batch["next_sentence_labels"]
    nw = batch.get("next_sentence_weights")
    nw = jnp.ones(labels.shape, jnp.float32) if nw is None else nw.astype(jnp.float32)
    sums.update(nsp_loss_sum=jnp.sum(nsp_losses(out["nsp_logits"], labels) * nw),
                nsp_correct=jnp.sum((jnp.argmax(out["nsp_logits"], -1) == labels) * nw),
                nsp_weight=jnp.sum(nw))
  return sums


def from_sums(sums, use_nsp: bool = True, mlm_denominator=None, nsp_denominator=None):
  """(loss, metrics) from `pretraining_sums`. Denominators default to the sums' own weights: MLM sum(w) + 1e-5 as
  the original's `get_masked_lm_output`, NSP a plain mean (`reduce_mean`) over the weighted examples.

  Passing the whole batch's denominators to each micro-batch makes the summed gradients equal the full batch's.
  """
  mlm_den = sums["mlm_weight"] + 1e-5 if mlm_denominator is None else mlm_denominator
  metrics = {"mlm_loss": sums["mlm_loss_sum"] / mlm_den, "mlm_accuracy": sums["mlm_correct"] / mlm_den}
  loss = metrics["mlm_loss"]
  if "nsp_loss_sum" in sums:
    nsp_den = jnp.maximum(sums["nsp_weight"], 1e-5) if nsp_denominator is None else nsp_denominator
    metrics["nsp_loss"] = sums["nsp_loss_sum"] / nsp_den
    metrics["nsp_accuracy"] = sums["nsp_correct"] / nsp_den
    if use_nsp:
      loss = loss + metrics["nsp_loss"]
  metrics["loss"] = loss
  return loss, metrics


def pretraining_loss(out, batch, use_nsp: bool = True):
  """(L_MLM + L_NSP, metrics). With `use_nsp=False` the loss is L_MLM alone (the NSP ablation)."""
  return from_sums(pretraining_sums(out, batch), use_nsp)


def errors(config, mcfg) -> list[str]:
  out = []
  if mcfg is not None and config.train.use_nsp and not mcfg.nsp_head:
    out.append("train.use_nsp is True but model.nsp_head is False (an MLM-only model has no NSP head)")
  if config.data.example_mode != "nsp_pairs" and config.train.use_nsp:
    out.append(f"train.use_nsp is True but the data is {config.data.example_mode!r} (no sentence pairs): set "
               "train.use_nsp=False")
  return out


def module(config, mcfg, special_ids=None):
  del config, special_ids
  return model_lib.BertForPreTraining(mcfg)


def train_step(model, tx, lr_fn, config):
  """state, batch -> state, metrics. L = L_MLM + L_NSP over the whole batch's weights, so the micro-batches of
  `trainer.accumulate` sum to the full batch's exact gradient."""
  accum = config.train.grad_accum_steps
  use_nsp = config.train.use_nsp

  def step_fn(state, batch):
    rng = base.dropout_key(config, state.step)
    mlm_den = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5
    nsp_den = jnp.maximum(jnp.sum(batch["next_sentence_weights"].astype(jnp.float32)), 1e-5)

    def loss_fn(params, mb, i):
      r = rng if accum == 1 else jax.random.fold_in(rng, i)
      out = model.apply({"params": params}, mb, deterministic=False, rngs={"dropout": r})
      sums = pretraining_sums(out, mb)
      loss, _ = from_sums(sums, use_nsp, mlm_den, nsp_den)
      return loss, sums

    grads, sums = trainer.accumulate(jax.value_and_grad(loss_fn, has_aux=True), state.params, batch, accum)
    _, metrics = from_sums(sums, use_nsp)
    return base.apply_gradients(state, grads, metrics, tx, lr_fn, batch,
                                ema_decay=trainer.ema_decay(config))

  return step_fn


def eval_step(model, config):
  del config

  def eval_fn(params, batch):
    out = model.apply({"params": params}, batch, deterministic=True)
    return pretraining_sums(out, batch)
  return eval_fn


def metrics(sums, config) -> dict:
  return from_sums(sums, config.train.use_nsp)[1]


def batch_flops(mcfg, batch) -> float:
  """Model FLOPs of one step on a concrete batch (`accounting.batch_flops`), the MLM head at its real masked
  positions."""
  rows, cols = np.nonzero(np.asarray(batch["masked_lm_weights"]) > 0)
  predicted = [(r, int(batch["masked_lm_positions"][r, c])) for r, c in zip(rows, cols)]
  return accounting.batch_flops(mcfg, batch, predicted)


def step_flops(config, mcfg, module_) -> float:
  del module_
  return accounting.pretraining_step_flops(mcfg, config.data.max_seq_length, config.data.max_predictions_per_seq,
                                           config.train.global_batch_size)


OBJECTIVE = base.Objective("mlm", errors, module, train_step, eval_step, metrics, step_flops)
