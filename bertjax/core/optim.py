"""Optimizers as the original BERT sets them up: AdamW (or LAMB), warmup + linear decay, no decay on LayerNorm/bias.

`train.adam_bias_correction`: the original's AdamWeightDecayOptimizer divides m by √v as they are, with no bias
correction; optax's and PyTorch's AdamW divide m/(1 − β1^t) by √(v/(1 − β2^t)). Early on the original's steps are
larger by (1 − β1^t)/√(1 − β2^t): ×3.2 at step 100 and ×1.8 at step 360 with β2 = 0.999 — inside pre-training's
10k-step warmup this hardly matters (×1.0 from step ~5k), over a fine-tuning run of a few hundred steps it
doubles to quintuples every step. False reproduces the original; True is AdamW as PyTorch, HF and optax have it.

`train.schedule`: linear (the original: lr·t/w during warmup, then lr·(1 − t/T)) | linear_from_warmup (HF's
get_linear_schedule_with_warmup: lr·(T − t)/(T − w) after warmup, reaching 0 at T from the peak) | cosine |
wsd (warmup-stable-decay; `decay_fraction`, `decay_shape`) | constant; see `schedule`.

`train.optimizer`: adamw | lamb | stable_adamw. StableAdamW (Wortsman et al. 2023; ModernBERT's optimizer) is AdamW
whose step on each tensor is divided by max(1, RMS), RMS = √mean(g² / max(v̂, ε²)): a tensor whose gradient is
large against its second-moment estimate (a loss spike in the making) takes a smaller step, without the global
clipping that slows every tensor down. `stable_adamw`.

The learning rate of a pre-training run is not inside the optimizer: the optimizer steps with a rate of 1 and the
train step multiplies its update by the schedule at the run's global step (`trainer.apply_gradients`, `scale`).
AdamW's, LAMB's and StableAdamW's updates, weight decay included, are linear in the rate, so the result is the
same; it is what lets a phased run reset the optimizer state (a fresh Adam count) and keep its schedule.

LAMB follows the reference used for BERT (NVIDIA's and TF-Addons'): LayerNorm parameters and biases are left out
of the layer-wise trust ratio as they are of weight decay (`optax.lamb` applies the ratio to every parameter).

`train.fused_update` (the configs' default) runs clipping + AdamW as `fused_adamw`: the same maths and the same
optimizer-state tree as optax's `chain(clip_by_global_norm, adamw)`, written as one elementwise expression per
parameter, so that no clipped copy of the gradients is made between the two (on a 2-core CPU, BERT-base: 0.10 s
per update against optax's 0.22-0.27 s).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax import errors

SCHEDULES = ("linear", "linear_from_warmup", "cosine", "wsd", "inverse_sqrt", "constant")
DECAY_SHAPES = ("linear", "cosine", "sqrt", "1-sqrt")  # sqrt and 1-sqrt are one shape: 1 - √progress
OPTIMIZERS = ("adamw", "lamb", "stable_adamw")


def schedule(learning_rate: float, warmup_steps: int, num_steps: int, kind: str = "linear", *,
             decay_fraction: float = 0.1, decay_shape: str = "linear", final_lr_ratio: float = 0.0,
             warmup_from: float = 0.0):
  """The learning rate at a step: lr·step/warmup during warmup (from `warmup_from` rather than 0 when given: a
  phase that warms up again from where the previous one ended), then by `kind`:

  linear: lr·(1 - step/num_steps), the original's polynomial decay of power 1 (from 0, so the end of warmup is
  below the peak); linear_from_warmup: lr·(num_steps - step)/(num_steps - warmup), HF's linear schedule;
  cosine: from lr down to lr·final_lr_ratio along half a cosine over the steps after warmup;
  wsd (warmup-stable-decay, as ModernBERT and MiniCPM train): lr until the last `decay_fraction` of the steps,
  then down to lr·final_lr_ratio with `decay_shape` linear, cosine or 1-sqrt (1 - √progress; also named sqrt);
  inverse_sqrt: lr·√(warmup/step) after warmup (the Transformer's rule; no end);
  constant: lr after warmup.
  """
  if kind not in SCHEDULES:
    raise errors.ConfigError(f"unknown train.schedule {kind!r}; choose one of {list(SCHEDULES)}")
  if decay_shape not in DECAY_SHAPES:
    raise errors.ConfigError(f"unknown train.decay_shape {decay_shape!r}; choose one of {list(DECAY_SHAPES)}")
  floor = learning_rate * final_lr_ratio

  def shaped(progress, shape):  # 1 -> 0 as progress goes 0 -> 1
    progress = jnp.clip(progress, 0.0, 1.0)
    if shape == "cosine":
      return 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    if shape in ("sqrt", "1-sqrt"):
      return 1.0 - jnp.sqrt(progress)
    return 1.0 - progress

  def fn(step):
    step = jnp.asarray(step, jnp.float32)
    if warmup_from:
      warm = warmup_from + (learning_rate - warmup_from) * step / max(warmup_steps, 1)
    else:
      warm = learning_rate * step / max(warmup_steps, 1)
    if kind == "linear":
      after = learning_rate * jnp.maximum(0.0, 1.0 - step / max(num_steps, 1))
    elif kind == "linear_from_warmup":
      after = learning_rate * jnp.maximum(0.0, (num_steps - step) / max(num_steps - warmup_steps, 1))
    elif kind == "cosine":
      progress = (step - warmup_steps) / max(num_steps - warmup_steps, 1)
      after = floor + (learning_rate - floor) * shaped(progress, "cosine")
    elif kind == "wsd":
      decay_steps = max(int(round(num_steps * decay_fraction)), 1)
      progress = (step - (num_steps - decay_steps)) / decay_steps
      after = floor + (learning_rate - floor) * shaped(progress, decay_shape)
    elif kind == "inverse_sqrt":
      after = learning_rate * jnp.sqrt(max(warmup_steps, 1) / jnp.maximum(step, 1.0))
    else:
      after = jnp.full_like(step, learning_rate)
    return jnp.where(step < warmup_steps, warm, after)
  return fn


def decay_mask(params):
  """True where weight decay applies: not norm parameters (`ln`, `*_ln`, a task head's `norm`), not biases (the
  original's exclusions, and HF Trainer's)."""
  def decide(path, _):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    names = [n for n in names if n != "value"]  # through LogicallyPartitioned boxes
    leaf = names[-1]
    is_ln = any(n in ("ln", "norm") or n.endswith("_ln") for n in names[:-1])
    return not (is_ln or leaf in ("bias", "mlm_bias"))
  return jax.tree_util.tree_map_with_path(decide, params)


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool = True) -> optax.GradientTransformation:
  """optax.scale_by_adam, or with `bias_correction=False` the original BERT's m/(√v + eps) (same state tree)."""
  if bias_correction:
    return optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
  base = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

  def update(grads, state, params=None):
    del params
    mu = jax.tree_util.tree_map(lambda g, m: b1 * m + (1.0 - b1) * g, grads, state.mu)
    nu = jax.tree_util.tree_map(lambda g, v: b2 * v + (1.0 - b2) * g * g, grads, state.nu)
    updates = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, state._replace(count=optax.safe_increment(state.count), mu=mu, nu=nu)

  return optax.GradientTransformation(base.init, update)


def adamw(learning_rate, b1, b2, eps, weight_decay, mask, bias_correction=True) -> optax.GradientTransformation:
  """optax.adamw's chain (same state tree) with the bias correction as a switch."""
  return optax.chain(scale_by_adam(b1, b2, eps, bias_correction), optax.add_decayed_weights(weight_decay, mask),
                     optax.scale_by_learning_rate(learning_rate))


def lamb(learning_rate, b1, b2, eps, weight_decay, mask) -> optax.GradientTransformation:
  """LAMB as NVIDIA's and TF-Addons' reference: Adam, decoupled weight decay on `mask`, then the layer-wise trust
  ratio ‖θ‖/‖u‖ on the same `mask` only (LayerNorm and biases take the Adam step as it is)."""
  return optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), optax.add_decayed_weights(weight_decay, mask),
                     optax.masked(optax.scale_by_trust_ratio(), mask), optax.scale_by_learning_rate(learning_rate))


def fused_adamw(learning_rate, b1: float, b2: float, eps: float, weight_decay: float, mask,
                clip_norm: float = 0.0, bias_correction: bool = True) -> optax.GradientTransformation:
  """`optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(...))` (the chain without clipping when
  `clip_norm` is 0) computed in one elementwise pass per parameter.

  For a gradient g with global norm n, s = min(1, clip_norm / n) (optax's rule) and step t = count + 1:
    m <- b1·m + (1 - b1)·s·g,   v <- b2·v + (1 - b2)·s²·g²,
    update = -lr(count)·[ (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd·θ·mask ].
  Folding s into the scalar coefficients (rather than scaling g first, as the chain does) leaves no clipped copy
  of the gradients between clipping and the moments. `init` is the chain's own, so the state tree, and any
  checkpoint of it, is the same under either implementation. Without bias correction both divisors are 1.
  """
  reference = adamw(learning_rate, b1, b2, eps, weight_decay, mask)
  if clip_norm > 0:
    reference = optax.chain(optax.clip_by_global_norm(clip_norm), reference)

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("fused_adamw needs the parameters (for weight decay)")
    clip_state, inner = state if clip_norm > 0 else (None, state)
    adam, masked, sched = inner
    count = optax.safe_increment(adam.count)
    t = count.astype(jnp.float32)
    bc1, bc2 = (1.0 - b1 ** t, 1.0 - b2 ** t) if bias_correction else (1.0, 1.0)
    lr = learning_rate(sched.count) if callable(learning_rate) else learning_rate
    scale = jnp.float32(1.0)
    if clip_norm > 0:
      norm = optax.global_norm(grads)
      scale = jnp.where(norm < clip_norm, 1.0, clip_norm / norm)
    c1, c2 = (1.0 - b1) * scale, (1.0 - b2) * scale * scale
    decay = mask(params) if callable(mask) else mask
    if decay is None:
      decay = jax.tree_util.tree_map(lambda _: True, params)

    def leaf(g, m, v, p, d):
      m = b1 * m + c1.astype(m.dtype) * g
      # (c2·g)·g rather than c2·g²: a g² would be shared with the global norm's and kept in memory between the two.
      v = b2 * v + (c2.astype(v.dtype) * g) * g
      u = (m / bc1) / (jnp.sqrt(v / bc2) + eps)
      if d:
        u = u + weight_decay * p
      return m, v, (-lr * u).astype(p.dtype)

    out = jax.tree_util.tree_map(leaf, grads, adam.mu, adam.nu, params, decay)
    treedef = jax.tree_util.tree_structure(grads)
    mu, nu, updates = (treedef.unflatten(x) for x in zip(*treedef.flatten_up_to(out)))
    inner = (adam._replace(count=count, mu=mu, nu=nu), masked,
             sched._replace(count=optax.safe_increment(sched.count)))
    return updates, ((clip_state, inner) if clip_norm > 0 else inner)

  return optax.GradientTransformation(reference.init, update)


def stable_adamw(learning_rate, b1: float, b2: float, eps: float, weight_decay: float, mask
                 ) -> optax.GradientTransformation:
  """StableAdamW (Wortsman et al. 2023, Algorithm 2; optimi's StableAdamW): AdamW with bias-corrected moments whose
  step on each tensor, weight decay included, is divided by max(1, RMS_t), RMS_t = √mean(g² / max(v̂_t, ε²)), v̂_t
  the bias-corrected second moment after this step's gradient. Weight decay is decoupled and scaled by the
  learning rate (optimi's default); a fully decoupled decay λ (θ ← θ(1 − λ·lr/peak)) is weight_decay = λ/peak.
  The state is optax.scale_by_adam's, with the schedule's count beside it."""
  base = optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), optax.scale_by_learning_rate(learning_rate))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("stable_adamw needs the parameters (for weight decay)")
    adam, sched = state
    count = optax.safe_increment(adam.count)
    t = count.astype(jnp.float32)
    bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    lr = learning_rate(sched.count) if callable(learning_rate) else learning_rate
    decay = mask(params) if callable(mask) else mask
    if decay is None:
      decay = jax.tree_util.tree_map(lambda _: True, params)

    def leaf(g, m, v, p, d):
      m = b1 * m + (1.0 - b1) * g
      v = b2 * v + (1.0 - b2) * g * g
      v_hat = v / bc2
      rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v_hat, eps * eps)))
      u = (m / bc1) / (jnp.sqrt(v_hat) + eps)
      if d:
        u = u + weight_decay * p
      return m, v, (-lr * u / jnp.maximum(1.0, rms)).astype(p.dtype)

    out = jax.tree_util.tree_map(leaf, grads, adam.mu, adam.nu, params, decay)
    treedef = jax.tree_util.tree_structure(grads)
    mu, nu, updates = (treedef.unflatten(x) for x in zip(*treedef.flatten_up_to(out)))
    return updates, (adam._replace(count=count, mu=mu, nu=nu), sched._replace(count=optax.safe_increment(sched.count)))

  return optax.GradientTransformation(base.init, update)


def unit(count):
  """A learning rate of 1 at every step, as a schedule (so the optimizer state keeps its schedule count)."""
  del count
  return jnp.ones((), jnp.float32)


# The optimizer's settings that a `config.train` may leave out (a config written before the setting existed), each
# with its one default: the original BERT's choice. The recipes in configs/ state them for the reader.
DEFAULTS = {"schedule": "linear", "decay_fraction": 0.1, "decay_shape": "linear", "final_lr_ratio": 0.0,
            "adam_bias_correction": False, "fused_update": True}


def settings(cfg_train):
  """`config.train` with DEFAULTS under it: what `make` and the config checks read."""
  return ml_collections.ConfigDict({**DEFAULTS, **cfg_train.to_dict()})


def make(cfg_train, lr=None) -> tuple[optax.GradientTransformation, callable]:
  """(optimizer, learning-rate schedule) from `config.train`. `lr`, when given, is the rate inside the optimizer
  instead of the config's schedule: `unit` for a step that scales the update itself."""
  t = settings(cfg_train)
  if lr is None:
    lr = schedule(t.learning_rate, t.warmup_steps, t.num_steps, t.schedule, decay_fraction=t.decay_fraction,
                  decay_shape=t.decay_shape, final_lr_ratio=t.final_lr_ratio)
  clip = t.grad_clip_norm if t.grad_clip_norm and t.grad_clip_norm > 0 else 0.0
  bias_correction = t.adam_bias_correction
  if t.optimizer == "adamw" and t.fused_update:
    return fused_adamw(lr, t.b1, t.b2, t.eps, t.weight_decay, decay_mask, clip, bias_correction), lr
  if t.optimizer == "adamw":
    opt = adamw(lr, t.b1, t.b2, t.eps, t.weight_decay, decay_mask, bias_correction)
  elif t.optimizer == "lamb":
    opt = lamb(lr, t.b1, t.b2, t.eps, t.weight_decay, decay_mask)
  elif t.optimizer == "stable_adamw":
    opt = stable_adamw(lr, t.b1, t.b2, t.eps, t.weight_decay, decay_mask)
  else:
    raise errors.ConfigError(f"unknown optimizer {t.optimizer!r}; choose one of {list(OPTIMIZERS)}")
  if clip:
    opt = optax.chain(optax.clip_by_global_norm(clip), opt)
  return opt, lr
