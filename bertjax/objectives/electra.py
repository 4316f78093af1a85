"""ELECTRA's replaced-token detection (configs/electra.py): a generator and a discriminator trained together in one
step, L = L_gen + λ·L_disc (`bertjax.model.electra` holds the model and the loss)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax import accounting, convert
from bertjax import model as model_lib
from bertjax.model import electra as electra_lib
from bertjax.objectives import base


def errors(config, mcfg) -> list[str]:
  out = []
  if config.train.grad_accum_steps != 1:
    out.append("objective 'electra' takes train.grad_accum_steps=1 (its masks are drawn per step in the graph)")
  if config.data.packing:
    out.append("objective 'electra' does not take data.packing (its masks are drawn per row in the graph)")
  if config.train.use_nsp:
    out.append("objective 'electra' has no NSP: set train.use_nsp=False")
  freeze_at = config.electra.freeze_generator_at
  if not isinstance(freeze_at, int) or isinstance(freeze_at, bool) or freeze_at < 0:
    out.append(f"electra.freeze_generator_at must be a step >= 0 (0: joint throughout), got {freeze_at!r}")
  if mcfg is not None:
    try:
      electra_lib.generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
    except (ValueError, TypeError) as e:
      out.append(f"electra generator: {e}")
  return out


def module(config, mcfg, special_ids=None):
  cls_id, sep_id, mask_id = special_ids or (2, 3, 4)  # placeholders for timing and AOT builds without data
  gen = electra_lib.generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
  return electra_lib.ElectraForPreTraining(mcfg, gen, mask_prob=config.data.masked_lm_prob,
                                           temperature=config.electra.temperature, special_ids=(cls_id, sep_id),
                                           mask_id=mask_id)


def train_step(model, tx, lr_fn, config):
  """state, batch -> state, metrics: L = L_gen + λ·L_disc in one step for both networks (ELECTRA)."""
  weight = config.electra.disc_weight
  freeze_at = config.electra.freeze_generator_at

  def step_fn(state, batch):
    r_drop, r_electra = jax.random.split(base.dropout_key(config, state.step))
    joint = state.step < freeze_at if freeze_at else True

    def loss_fn(params):
      out = model.apply({"params": params}, batch, deterministic=False,
                        rngs={"dropout": r_drop, "electra": r_electra})
      sums = electra_lib.electra_sums(out, batch)
      loss, m = electra_lib.electra_loss(sums, weight)
      return jnp.where(joint, loss, weight * m["disc_loss"]), sums

    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    _, metrics = electra_lib.electra_loss(sums, weight)
    hold = None
    if freeze_at:  # the generator stops at freeze_at: its updates (AdamW's momentum and decay too) are zero
      hold = lambda u: {**u, "generator": jax.tree.map(lambda x: jnp.where(joint, x, 0), u["generator"])}  # noqa: E731
    return base.apply_gradients(state, grads, metrics, tx, lr_fn, batch, hold)

  return step_fn


def eval_step(model, config):
  def eval_fn(params, batch):  # the same masks and samples at every evaluation: a fixed stream
    key = jax.random.key(config.seed, impl=config.train.prng_impl)
    out = model.apply({"params": params}, batch, deterministic=True, rngs={"electra": key})
    return electra_lib.electra_sums(out, batch)
  return eval_fn


def metrics(sums, config) -> dict:
  return electra_lib.electra_loss(sums, config.electra.disc_weight)[1]


def step_flops(config, mcfg, module_) -> float:
  return step_flops_of(mcfg, module_.gen_cfg, config.data.max_seq_length,
                                       config.data.max_predictions_per_seq, config.train.global_batch_size)


def export(run: dict, params: dict, out: str) -> tuple[str, tuple[str, ...]]:
  """OUT/discriminator and OUT/generator, as HF publishes ELECTRA: (architectures, the folders written)."""
  disc_cfg = model_lib.BertConfig.from_dict(run["model"])
  gen_cfg = electra_lib.generator_config(disc_cfg, run["electra"]["generator_hidden"],
                                         run["electra"]["generator_layers"])
  convert.electra_to_hf(disc_cfg, gen_cfg, params, out)
  return "ElectraForPreTraining + ElectraForMaskedLM", ("discriminator", "generator")


OBJECTIVE = base.Objective("electra", errors, module, train_step, eval_step, metrics, step_flops,
                           needs_special_ids=True, encoder=lambda params: electra_lib.split(params)[0],
                           has_mlm_head=False, export=export)


def step_flops_of(disc_cfg, gen_cfg, seq_len: int, num_predictions: int, global_batch: int) -> float:
  """Model FLOPs of one ELECTRA step: the generator's MLM step (at the embedding width for the decoder) and the
  discriminator over every position with its 1-unit head (no MLM decoder)."""
  gen = accounting.model_flops_per_sequence(gen_cfg, seq_len, 0)
  gen += 3.0 * 2 * num_predictions * (gen_cfg.hidden_size * gen_cfg.embed_dim + gen_cfg.embed_dim * gen_cfg.vocab_size)
  disc = (accounting.model_flops_per_sequence(disc_cfg, seq_len, 0)
          + 3.0 * 2 * seq_len * (disc_cfg.hidden_size ** 2 + disc_cfg.hidden_size))
  return (gen + disc) * global_batch
