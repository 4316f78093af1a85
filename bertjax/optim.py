"""Optimizers as the original BERT sets them up: AdamW (or LAMB), warmup + linear decay, no decay on LayerNorm/bias.

The original's AdamWeightDecayOptimizer applies no bias correction; optax's adamw and lamb do. With
beta2 = 0.999 the two differ only in the first few thousand steps, which the warmup covers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def schedule(learning_rate: float, warmup_steps: int, num_steps: int):
  """lr·step/warmup during warmup, then lr·(1 - step/num_steps) (the original's polynomial decay, power 1)."""
  def fn(step):
    step = jnp.asarray(step, jnp.float32)
    warm = learning_rate * step / max(warmup_steps, 1)
    decay = learning_rate * jnp.maximum(0.0, 1.0 - step / max(num_steps, 1))
    return jnp.where(step < warmup_steps, warm, decay)
  return fn


def decay_mask(params):
  """True where weight decay applies: not LayerNorm parameters (`*ln*`), not biases (the original's exclusions)."""
  def decide(path, _):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    names = [n for n in names if n != "value"]  # through LogicallyPartitioned boxes
    leaf = names[-1]
    is_ln = any(n == "ln" or n.endswith("_ln") for n in names[:-1])
    return not (is_ln or leaf in ("bias", "mlm_bias"))
  return jax.tree_util.tree_map_with_path(decide, params)


def make(cfg_train) -> tuple[optax.GradientTransformation, callable]:
  """(optimizer, learning-rate schedule) from `config.train`."""
  t = cfg_train
  lr = schedule(t.learning_rate, t.warmup_steps, t.num_steps)
  if t.optimizer == "adamw":
    opt = optax.adamw(lr, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay, mask=decay_mask)
  elif t.optimizer == "lamb":
    opt = optax.lamb(lr, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay, mask=decay_mask)
  else:
    raise ValueError(f"unknown optimizer {t.optimizer!r}; choose adamw or lamb")
  if t.grad_clip_norm and t.grad_clip_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(t.grad_clip_norm), opt)
  return opt, lr
