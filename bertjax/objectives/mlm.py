"""Masked language modelling, with next-sentence prediction when `train.use_nsp` (BERT): L = L_MLM + L_NSP on
BertForPreTraining; without it, the MLM-only objective of RoBERTa and ModernBERT.

MLM: cross-entropy at the gathered masked positions, weighted mean with denominator sum(weights) + 1e-5 (as
google-research/bert's `run_pretraining.py`). NSP: 2-way cross-entropy on [CLS].
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax import model as model_lib
from bertjax.core import accounting, losses, trainer
from bertjax.objectives import base


def mlm_loss(logits, ids, weights):
  """Mean cross-entropy over masked positions: sum(w·CE) / (sum(w) + 1e-5). logits [B, P, V]."""
  return losses.weighted_mean(losses.cross_entropy(logits, ids), weights, eps=1e-5)


def nsp_loss(logits, labels, weights=None):
  """NSP cross-entropy: label 0 = B is the actual next segment, 1 = B is random (the original's labels)."""
  ce = losses.cross_entropy(logits, labels)
  return jnp.mean(ce) if weights is None else jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1e-5)


def pretraining_sums(out, batch):
  """Sums over the batch from which every pre-training loss and accuracy is a ratio (exact under micro-batching)."""
  w = batch["masked_lm_weights"].astype(jnp.float32)
  ids = batch["masked_lm_ids"]
  sums = {"mlm_loss_sum": jnp.sum(losses.cross_entropy(out["mlm_logits"], ids) * w),
          "mlm_correct": jnp.sum((jnp.argmax(out["mlm_logits"], -1) == ids) * w),
          "mlm_weight": jnp.sum(w)}
  if "next_sentence_labels" in batch and "nsp_logits" in out:  # an MLM-only model has no NSP head
    labels = batch["next_sentence_labels"]
    nw = batch.get("next_sentence_weights")
    nw = jnp.ones(labels.shape, jnp.float32) if nw is None else nw.astype(jnp.float32)
    sums.update(nsp_loss_sum=jnp.sum(losses.cross_entropy(out["nsp_logits"], labels) * nw),
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
  """state, batch -> state, metrics. L = L_MLM + L_NSP; micro-batches sum to the full batch's exact gradient."""
  accum = config.train.grad_accum_steps
  use_nsp = config.train.use_nsp

  def step_fn(state, batch):
    rng = base.dropout_key(config, state.step)
    mlm_den = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5
    nsp_den = jnp.maximum(jnp.sum(batch["next_sentence_weights"].astype(jnp.float32)), 1e-5)

    def loss_fn(params, mb, r):
      out = model.apply({"params": params}, mb, deterministic=False, rngs={"dropout": r})
      sums = pretraining_sums(out, mb)
      loss, _ = from_sums(sums, use_nsp, mlm_den, nsp_den)
      return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accum == 1:
      (_, sums), grads = grad_fn(state.params, batch, rng)
    else:
      # Row r goes to micro-batch r % accum, so each device's rows stay on that device.
      micro = jax.tree_util.tree_map(
          lambda x: x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1), batch)
      first = jax.tree_util.tree_map(lambda x: x[0], micro)
      sums_shape = jax.eval_shape(lambda: grad_fn(state.params, first, rng)[0][1])
      zeros = (jax.tree_util.tree_map(jnp.zeros_like, state.params),
               jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape))

      def body(carry, xs):
        mb, i = xs
        (_, s), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return (_tree_add(carry[0], g), _tree_add(carry[1], s)), None

      (grads, sums), _ = jax.lax.scan(body, zeros, (micro, jnp.arange(accum)))
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


def step_flops(config, mcfg, module_) -> float:
  del module_
  return accounting.pretraining_step_flops(mcfg, config.data.max_seq_length, config.data.max_predictions_per_seq,
                                           config.train.global_batch_size)


def _tree_add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


OBJECTIVE = base.Objective("mlm", errors, module, train_step, eval_step, metrics, step_flops)
