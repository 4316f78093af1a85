"""Train state, built sharded from the start: eval_shape -> logical specs -> NamedShardings -> jit(init)."""
from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import sharding as sharding_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def _init_boxed(model, tx, batch, rng):
  params = model.init({"params": rng, "dropout": rng}, batch)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def abstract_state(model, tx, batch, mesh, rules):
  """(abstract unboxed state with shardings, state shardings). Nothing is allocated."""
  key = jax.eval_shape(lambda: jax.random.key(0))  # abstract: nothing is created on any device
  with sharding_lib.use_mesh(mesh, rules):
    boxed = jax.eval_shape(lambda r: _init_boxed(model, tx, batch, r), key)
    shardings = sharding_lib.logical_to_shardings(boxed, mesh, rules)
  abstract = nn.meta.unbox(boxed)
  abstract = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                    abstract, shardings)
  return abstract, shardings


def init_state(model, tx, batch, mesh, rules, shardings, rng):
  """The initial state, each array created directly in its shards (never unsharded on one device)."""
  def fn(r):
    return nn.meta.unbox(_init_boxed(model, tx, batch, r))
  with sharding_lib.use_mesh(mesh, rules):
    return jax.jit(fn, out_shardings=shardings)(rng)


def fresh_params(model, batch, mesh, rules, shardings, rng, keep):
  """The subtree of the initial params that `keep(params)` selects, as `init_state` would draw it (the same RNG
  streams, so the same values), compiled as a program that returns only that subtree: XLA drops the random
  draws and the forward pass that nothing returned depends on. Fine-tuning draws just its fresh head this way
  rather than the whole model (the word-embedding table alone is 11.7M normal draws for a 384-wide BERT)."""
  def fn(r):
    return keep(nn.meta.unbox(model.init({"params": r, "dropout": r}, batch)["params"]))
  out_shardings = keep(shardings.params)
  with sharding_lib.use_mesh(mesh, rules):
    return jax.jit(fn, out_shardings=out_shardings)(rng)


def with_params(params, tx, shardings, mesh, rules) -> TrainState:
  """A fresh state (step 0, new optimizer state) around given params, placed on `shardings`."""
  params = jax.device_put(params, shardings.params)
  def fn(p):
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))
  with sharding_lib.use_mesh(mesh, rules):
    return jax.jit(fn, out_shardings=shardings)(params)
