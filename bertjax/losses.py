"""Losses and accuracies, all in float32.

MLM: cross-entropy at the gathered masked positions, weighted mean with denominator sum(weights) + 1e-5
(as google-research/bert `run_pretraining.py`). NSP: 2-way cross-entropy on [CLS]. L = L_MLM + L_NSP.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits, labels):
  """Per-example -log softmax(logits)[label], float32. logits [..., C], labels [...] int."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def weighted_mean(values, weights, eps=0.0):
  weights = weights.astype(jnp.float32)
  return jnp.sum(values * weights) / (jnp.sum(weights) + eps)


def mlm_loss(logits, ids, weights):
  """Mean cross-entropy over masked positions: sum(w·CE) / (sum(w) + 1e-5). logits [B, P, V]."""
  return weighted_mean(cross_entropy(logits, ids), weights, eps=1e-5)


def accuracy(logits, labels, weights=None):
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  if weights is None:
    return jnp.mean(correct)
  return weighted_mean(correct, weights, eps=1e-5)


def nsp_loss(logits, labels, weights=None):
  """NSP cross-entropy: label 0 = B is the actual next segment, 1 = B is random (the original's labels)."""
  ce = cross_entropy(logits, labels)
  return jnp.mean(ce) if weights is None else jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1e-5)


def pretraining_sums(out, batch):
  """Sums over the batch from which every pre-training loss and accuracy is a ratio (exact under micro-batching)."""
  w = batch["masked_lm_weights"].astype(jnp.float32)
  ids = batch["masked_lm_ids"]
  sums = {"mlm_loss_sum": jnp.sum(cross_entropy(out["mlm_logits"], ids) * w),
          "mlm_correct": jnp.sum((jnp.argmax(out["mlm_logits"], -1) == ids) * w),
          "mlm_weight": jnp.sum(w)}
  if "next_sentence_labels" in batch and "nsp_logits" in out:  # an MLM-only model has no NSP head
    labels = batch["next_sentence_labels"]
    nw = batch.get("next_sentence_weights")
    nw = jnp.ones(labels.shape, jnp.float32) if nw is None else nw.astype(jnp.float32)
    sums.update(nsp_loss_sum=jnp.sum(cross_entropy(out["nsp_logits"], labels) * nw),
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
