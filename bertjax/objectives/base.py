"""What every pre-training objective provides (`Objective`), and the optimizer update they all end with."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import model as model_lib
from bertjax.core import trainer
from bertjax.data import packing


def example_batch(config, mcfg, micro: int) -> dict:
  """The example batch of a masked-LM objective (shapes and dtypes for init and compile) of `micro` rows: the
  data's rows, or packed rows with data.packing."""
  data = config.data
  if data.packing:
    return packing.dummy_row(data.max_seq_length, packing.row_predictions(data), data.pack_max_per_row, micro)
  batch = model_lib.dummy_batch(mcfg, micro, data.max_seq_length, data.max_predictions_per_seq)
  batch["next_sentence_weights"] = np.ones((micro,), np.float32)
  return batch


@dataclasses.dataclass(frozen=True)
class Objective:
  """A pre-training objective: functions of (config, model config, ...) that `bertjax.pretrain` calls.

  errors(config, mcfg) -> [problem]: its own config rules (mcfg may be None when the model config is invalid).
  needs_special_ids: whether `module` needs the tokenizer's (cls, sep, mask) ids (in-graph masking).
  module(config, mcfg, special_ids) -> the flax module trained.
  train_step(module, tx, lr_fn, config) -> (state, batch) -> (state, metrics).
  eval_step(module, config) -> (params, batch) -> sums; metrics(sums, config) -> {name: value}.
  step_flops(config, mcfg, module) -> model FLOPs of one optimizer step (for MFU and ahead-of-time compile).
  example_batch(config, mcfg, rows) -> the batch of `rows` rows the trainer is traced with (one micro-batch).
  encoder(params) -> the params `weights.load` reads as the model (e.g. ELECTRA's discriminator).
  has_mlm_head: whether its checkpoints hold an MLM head to continue pre-training from.
  """
  name: str
  errors: Callable[[Any, Any], list]
  module: Callable
  train_step: Callable
  eval_step: Callable
  metrics: Callable
  step_flops: Callable
  example_batch: Callable = example_batch
  needs_special_ids: bool = False
  encoder: Callable[[dict], dict] = lambda params: params
  has_mlm_head: bool = True


def dropout_key(config, step):
  """The step's dropout key: the run's seed folded with 1 (the init's stream is 0) and the step."""
  key = jax.random.key(config.seed, impl=config.train.prng_impl)
  return jax.random.fold_in(jax.random.fold_in(key, 1), step)


def apply_gradients(state, grads, metrics, tx, lr_fn, batch, hold=None, ema_decay: float = 0.0):
  """The optimizer update every pre-training objective ends with (`trainer.apply_gradients`) and the metrics every
  one logs beside its own: (next state, metrics + gradient norm, learning rate, tokens). `tx` steps with a
  learning rate of 1 (`optim.unit`) and the update is scaled by `lr_fn` at the run's global step, so a phase that
  resets the optimizer keeps the schedule. `hold(updates)`, when given, returns the updates with those of
  parameters held fixed this step zeroed."""
  lr = lr_fn(state.step)
  new, grad_norm = trainer.apply_gradients(state, grads, tx, scale=lr, hold=hold, ema_decay=ema_decay)
  metrics.update(grad_norm=grad_norm, learning_rate=lr,
                 tokens=jnp.sum(batch["input_mask"].astype(jnp.float32)))
  return new, metrics
