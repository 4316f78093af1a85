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
  return jnp.mean(ce) if weights is None else weighted_mean(ce, weights, eps=1e-5)


def pretraining_loss(out, batch, use_nsp: bool = True):
  """(L_MLM + L_NSP, metrics). With `use_nsp=False` the loss is L_MLM alone (the NSP ablation).

  Packed rows carry `next_sentence_labels` [B, K] and `next_sentence_weights` [B, K] (one per example).
  """
  w = batch["masked_lm_weights"]
  mlm = mlm_loss(out["mlm_logits"], batch["masked_lm_ids"], w)
  metrics = {"mlm_loss": mlm, "mlm_accuracy": accuracy(out["mlm_logits"], batch["masked_lm_ids"], w),
             "mlm_weight": jnp.sum(w.astype(jnp.float32))}
  loss = mlm
  if "next_sentence_labels" in batch:
    labels = batch["next_sentence_labels"]
    nsp_w = batch.get("next_sentence_weights")
    nsp = nsp_loss(out["nsp_logits"], labels, nsp_w)
    metrics["nsp_loss"] = nsp
    metrics["nsp_accuracy"] = accuracy(out["nsp_logits"], labels, nsp_w)
    if use_nsp:
      loss = loss + nsp
  metrics["loss"] = loss
  return loss, metrics
