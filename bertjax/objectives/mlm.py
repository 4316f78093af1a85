"""Masked language modelling, with next-sentence prediction when `train.use_nsp` (BERT): L = L_MLM + L_NSP on
BertForPreTraining; without it, the MLM-only objective of RoBERTa and ModernBERT."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax import accounting, losses
from bertjax import model as model_lib
from bertjax.objectives import base


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
      sums = losses.pretraining_sums(out, mb)
      loss, _ = losses.from_sums(sums, use_nsp, mlm_den, nsp_den)
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
    _, metrics = losses.from_sums(sums, use_nsp)
    return base.apply_gradients(state, grads, metrics, tx, lr_fn, batch)

  return step_fn


def eval_step(model, config):
  del config

  def eval_fn(params, batch):
    out = model.apply({"params": params}, batch, deterministic=True)
    return losses.pretraining_sums(out, batch)
  return eval_fn


def metrics(sums, config) -> dict:
  return losses.from_sums(sums, config.train.use_nsp)[1]


def step_flops(config, mcfg, module_) -> float:
  del module_
  return accounting.pretraining_step_flops(mcfg, config.data.max_seq_length, config.data.max_predictions_per_seq,
                                           config.train.global_batch_size)


def _tree_add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


OBJECTIVE = base.Objective("mlm", errors, module, train_step, eval_step, metrics, step_flops)
