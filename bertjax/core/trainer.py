"""The trainer core that pre-training, fine-tuning, the benchmark and ahead-of-time compile share.

From (config, module, optimizer, example batch, the objective's step functions) it builds the mesh, the abstract
sharded state and the jitted steps (`build`); it creates or resumes the state (`resume_or_init`); it ends every
step with one optimizer update (`apply_gradients`); and it runs the loop every mode shares (`loop`): the stop flag
for SIGTERM/SIGINT, the non-finite check, the periodic-action rule. An objective (pre-training's MLM + NSP, a
fine-tuning task) hands its train and eval functions to `build`; the core never imports an objective.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import signal
import sys
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import errors
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import goodput as goodput_lib
from bertjax.core import sharding as sharding_lib
from bertjax.core import writers as metrics_lib

every = metrics_lib.every  # the one rule for periodic actions: every `interval` steps, and at the last step


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@flax.struct.dataclass
class EmaTrainState(TrainState):
  """A state that also keeps an exponential moving average of the weights (`train.ema_decay`), sharded as the
  params are. A separate class: a run without it saves and restores exactly the three fields it always had."""
  ema: Any = None


def _init_boxed(model, tx, batch, rng, ema: bool = False):
  params = model.init({"params": rng, "dropout": rng}, batch)["params"]
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return EmaTrainState(**vars(state), ema=params) if ema else state


def ema_decay(config) -> float:
  return float(config.train.get("ema_decay", 0.0) or 0.0)


def _abstract_state(model, tx, batch, mesh, rules, ema: bool = False):
  """(abstract unboxed state with shardings, state shardings), built sharded from the start: eval_shape ->
  logical specs -> NamedShardings. Nothing is allocated."""
  key = jax.eval_shape(lambda: jax.random.key(0))  # abstract: nothing is created on any device
  with sharding_lib.use_mesh(mesh, rules):
    boxed = jax.eval_shape(lambda r: _init_boxed(model, tx, batch, r, ema), key)
    shardings = sharding_lib.logical_to_shardings(boxed, mesh, rules)
  abstract = nn.meta.unbox(boxed)
  abstract = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                    abstract, shardings)
  return abstract, shardings


@dataclasses.dataclass
class Trainer:
  """Everything a loop (and the benchmark and AOT compile) needs from a config, before any array exists."""
  mesh: jax.sharding.Mesh
  rules: tuple
  batch_sharding: jax.sharding.NamedSharding
  module: Any
  tx: optax.GradientTransformation
  lr_fn: Callable
  dummy: dict
  abstract: TrainState
  shardings: TrainState
  train_step: Callable  # jitted (state, batch) -> (state, metrics); the state is donated
  eval_step: Callable   # jitted (params, batch) -> outputs
  ema: bool = False     # the state keeps a moving average of the weights (EmaTrainState)

  @property
  def platform(self) -> str:
    return self.mesh.devices.flat[0].platform


def mesh_and_shardings(config, devices=None):
  """(mesh, logical rules, batch sharding) for the config's sharding preset on `devices` (default: all)."""
  mesh = sharding_lib.make_mesh(config, devices)
  return mesh, sharding_lib.rules(config), sharding_lib.batch_sharding(mesh)


def build(config, module, tx, lr_fn, dummy: dict, train_fn: Callable, eval_fn: Callable, mesh=None,
          devices=None, train_scalars: int = 0) -> Trainer:
  """The abstract sharded state of `module` + `tx` (shaped by the example batch `dummy`) and the jitted steps.

  `train_fn(state, batch, *scalars) -> (state, metrics)` and `eval_fn(params, batch) -> outputs` are the
  objective's; `train_scalars` counts the replicated scalar arguments after the batch (a run's seed passed as one
  rather than closed over keeps the compiled program, and its persistent-cache entry, the same for every seed).
  The train step donates the state, so the loop must use the state it returns."""
  if mesh is None:
    mesh, rules, batch_sharding = mesh_and_shardings(config, devices)
  else:
    rules, batch_sharding = sharding_lib.rules(config), sharding_lib.batch_sharding(mesh)
  ema = ema_decay(config) > 0
  abstract, shardings = _abstract_state(module, tx, dummy, mesh, rules, ema)
  scalar = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  train_step = jax.jit(train_fn, in_shardings=(shardings, batch_sharding) + (scalar,) * train_scalars,
                       out_shardings=(shardings, None), donate_argnums=(0,))
  eval_step = jax.jit(eval_fn, in_shardings=(shardings.params, batch_sharding))
  return Trainer(mesh, rules, batch_sharding, module, tx, lr_fn, dummy, abstract, shardings, train_step, eval_step,
                 ema)


def init_state(t: Trainer, seed: int) -> TrainState:
  """The initial state, each array created directly in its shards (never unsharded on one device)."""
  def fn(r):
    return nn.meta.unbox(_init_boxed(t.module, t.tx, t.dummy, r, t.ema))
  with sharding_lib.use_mesh(t.mesh, t.rules):
    return jax.jit(fn, out_shardings=t.shardings)(jax.random.key(seed))


def fresh_params(t: Trainer, seed: int, keep):
  """The subtree of the initial params that `keep(params)` selects, as `init_state` would draw it (the same RNG
  streams, so the same values), compiled as a program that returns only that subtree: XLA drops the random
  draws and the forward pass that nothing returned depends on. Fine-tuning draws just its fresh head this way
  rather than the whole model (the word-embedding table alone is 11.7M normal draws for a 384-wide BERT)."""
  def fn(r):
    return keep(nn.meta.unbox(t.module.init({"params": r, "dropout": r}, t.dummy)["params"]))
  with sharding_lib.use_mesh(t.mesh, t.rules):
    return jax.jit(fn, out_shardings=keep(t.shardings.params))(jax.random.key(seed))


def with_params(t: Trainer, params) -> TrainState:
  """A fresh state (step 0, new optimizer state) around given params, placed on the trainer's shardings."""
  params = jax.device_put(params, t.shardings.params)
  def fn(p):
    state = TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=t.tx.init(p))
    return EmaTrainState(**vars(state), ema=p) if t.ema else state
  with sharding_lib.use_mesh(t.mesh, t.rules):
    return jax.jit(fn, out_shardings=t.shardings)(params)


def merge_params(fresh: dict, init: dict) -> dict:
  """The freshly initialised params with the init's subtrees in place; under `bert` the init's entries replace
  the fresh ones one by one (so a fresh pooler stays where the init has none)."""
  out = dict(fresh)
  for k, v in init.items():
    out[k] = {**fresh[k], **v} if k == "bert" and k in fresh else v
  return out


def not_in(init: dict):
  """A selector of the params `merge_params(fresh, init)` takes from `fresh`: what `init` does not replace."""
  def keep(params: dict) -> dict:
    out = {k: v for k, v in params.items() if k not in init}
    if "bert" in params and "bert" in init:
      rest = {k: v for k, v in params["bert"].items() if k not in init["bert"]}
      if rest:
        out["bert"] = rest
    return out
  return keep


def apply_gradients(state: TrainState, grads, tx: optax.GradientTransformation, scale=None, hold=None,
                    ema_decay: float = 0.0):
  """The optimizer update every mode ends its step with: (next state, the gradients' global norm). `scale`, when
  given, multiplies the updates (the learning rate at this step, or a fine-tuning run's peak, an argument of the
  step: the optimizers' updates, weight decay included, are linear in the learning rate); `hold(updates)`
  returns the updates with those of parameters held fixed this step zeroed (ELECTRA's frozen generator). An
  EmaTrainState's average moves by `ema_decay`: ema <- d·ema + (1 - d)·params after the update."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  if hold is not None:
    updates = hold(updates)
  if scale is not None:
    updates = jax.tree_util.tree_map(lambda u: u * jnp.asarray(scale).astype(u.dtype), updates)
  params = optax.apply_updates(state.params, updates)
  new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  if isinstance(state, EmaTrainState):
    new = new.replace(ema=jax.tree_util.tree_map(lambda e, p: ema_decay * e + (1.0 - ema_decay) * p.astype(e.dtype),
                                                 state.ema, params))
  return new, optax.global_norm(grads)


def accumulate(grad_fn: Callable, params, batch: dict, steps: int):
  """(gradients, aux) of `batch` as `steps` micro-batches, summed: `grad_fn(params, micro_batch, i)` returns
  ((loss, aux), gradients) with an aux of sums, i the micro-batch's index (0 for one). An objective whose loss
  divides by the whole batch's totals gets exactly the full batch's gradient. Row r goes to micro-batch
  r % steps, so each device's rows stay on that device. One micro-batch is the batch itself."""
  if steps == 1:
    (_, aux), grads = grad_fn(params, batch, 0)
    return grads, aux
  micro = jax.tree_util.tree_map(lambda x: x.reshape((x.shape[0] // steps, steps) + x.shape[1:]).swapaxes(0, 1),
                                 batch)
  first = jax.tree_util.tree_map(lambda x: x[0], micro)
  aux_shape = jax.eval_shape(lambda: grad_fn(params, first, 0)[0][1])
  zeros = (jax.tree_util.tree_map(jnp.zeros_like, params),
           jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shape))

  def body(carry, xs):
    mb, i = xs
    (_, aux), g = grad_fn(params, mb, i)
    return (_tree_add(carry[0], g), _tree_add(carry[1], aux)), None

  (grads, aux), _ = jax.lax.scan(body, zeros, (micro, jnp.arange(steps)))
  return grads, aux


def _tree_add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


def resume_or_init(t: Trainer, ckpt: checkpoint_lib.Checkpointer, seed: int, init_params: dict | None = None,
                   announce: Callable[[str], None] = print):
  """(state, saved data state or None, start step): the workdir's latest checkpoint, else a fresh state with
  `init_params` (a partial tree: what it holds replaces the fresh parameters, checked shape by shape), else a
  fresh state."""
  quiet = announce if jax.process_index() == 0 else lambda _: None
  ckpt.set_aside_half_written(quiet)
  if ckpt.latest_step() is not None:
    return ckpt.restore(t.abstract, announce=quiet)
  if init_params is None:
    return init_state(t, seed), None, 0
  # Only what the init does not hold is drawn (the values a whole-model init would give them).
  fresh = fresh_params(t, seed, not_in(init_params))
  params = merge_params(jax.device_get(fresh), init_params)
  checkpoint_lib.check_params_fit(params, t.abstract.params)
  return with_params(t, params), None, 0


class Stop(enum.StrEnum):
  """Why a loop ended before its last step: a signal (SIGTERM from a TPU preemption notice, SIGINT),
  train.stop_after_steps, or a source read to its end under data.when_exhausted=stop."""
  SIGTERM = "SIGTERM"
  SIGINT = "SIGINT"
  STEPS = "stop_after_steps"
  EXHAUSTED = "a source ran out (data.when_exhausted=stop)"

  @property
  def preempted(self) -> bool:
    """Whether the same command continues the run: every stop but the data's end."""
    return self is not Stop.EXHAUSTED


class StopFlag:
  """Set by SIGTERM (TPU preemption) or SIGINT: save at the current step and exit cleanly."""

  def __init__(self):
    self.signal = None
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.signal = Stop(signal.Signals(signum).name)
    # A second signal of the same kind ends the process at once (e.g. while a program is still compiling, which
    # Python cannot interrupt): the handler is the system's default from here on.
    signal.signal(signum, signal.SIG_DFL)
    if jax.process_index() == 0:
      print(f"{self.signal}: stopping after this step with a checkpoint; send it again to stop at once without one",
            file=sys.stderr, flush=True)

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def check_finite(pending: list) -> list[dict]:
  """The host values of `pending` [(step, metrics)]; raises NonFiniteError at the first non-finite loss or
  gradient norm, naming the step."""
  host = jax.device_get([m for _, m in pending])
  for (step, _), m in zip(pending, host):
    if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
      raise errors.NonFiniteError(
          f"non-finite loss or gradient at step {step} (loss={m['loss']}, grad_norm={m['grad_norm']}, "
          f"learning_rate={m['learning_rate']:.3g}); stopping without writing a checkpoint from this state. The "
          "latest checkpoint is the last good one; lower train.learning_rate or check the data.")
  return host


@dataclasses.dataclass
class Hooks:
  """What a mode does at the points of a run's rhythm; `loop` decides when.

  `log(step, host)` gets the host metrics of every step since the last log or save (already checked finite);
  `evaluate(step, state)` runs where `eval_due(step)`; `save(step, state)` where `save_due(step)`, and at a stop;
  `begin(state)` once before the first step.
  Evaluation comes before saving, so a checkpoint taken after an evaluation carries what it found."""
  log: Callable[[int, list], None]
  save: Callable[[int, Any], None]
  log_due: Callable[[int], bool]
  save_due: Callable[[int], bool]
  evaluate: Callable[[int, Any], None] = lambda step, state: None
  eval_due: Callable[[int], bool] = lambda step: False
  begin: Callable[[Any], None] = lambda state: None  # before the first step (under the stop flag and the mesh)


IN_FLIGHT = 2  # train steps dispatched and not yet finished, at most


def loop(t: Trainer, state, batches, start: int, total: int, hooks: Hooks, stop_after_steps: int = 0,
         step_args: tuple = (), clock: goodput_lib.Recorder | None = None):
  """The training loop of every mode: steps start+1..total over `batches` (an iterator of the batches of exactly
  those steps), the stop signals (SIGTERM/SIGINT, `stop_after_steps`) answered with a checkpoint, the
  non-finite check before anything is logged or saved. Returns (state, last step run, the `Stop` or None).
  The train step donates its state, so only the returned state is valid afterwards. `clock` (the run's goodput
  recorder) is told where the loop's time goes: the batch waits, the first (compiling) step, the steps, the
  evaluations and saves."""
  clock = clock if clock is not None else goodput_lib.Recorder(None)
  pending: list = []
  in_flight: collections.deque = collections.deque(maxlen=IN_FLIGHT)
  step = start
  with StopFlag() as stop, sharding_lib.use_mesh(t.mesh, t.rules):
    with clock.timing("evaluation"):  # a mode's `begin` is its evaluation before the first step
      hooks.begin(state)
    clock.began(start)
    for step in range(start + 1, total + 1):
      t_wait = clock.now()
      batch = next(batches)
      t_step = clock.now()
      clock.add("data_wait", t_step - t_wait)
      state, m = t.train_step(state, batch, *step_args)
      # Dispatch is asynchronous: unbounded, the host would queue every step up to the next log before the
      # device ran them, and a stop signal (a preemption notice) would wait for all of them. Waiting for the step
      # IN_FLIGHT back keeps the device fed and answers a signal within IN_FLIGHT steps.
      if len(in_flight) == IN_FLIGHT:
        jax.block_until_ready(in_flight[0])
      in_flight.append(m["loss"])
      pending.append((step, m))
      if stop_after_steps and step - start >= stop_after_steps and stop.signal is None:
        stop.signal = Stop.STEPS
      # Read the flag once per step: a signal arriving later in this step is acted on after the next one, never
      # between deciding to save and deciding to stop.
      stopping = stop.signal
      log_now, save_now = hooks.log_due(step), hooks.save_due(step) or stopping is not None
      host = check_finite(pending) if log_now or save_now else None  # waits for the steps: their time
      clock.stepped(step, clock.now() - t_step, first=step == start + 1)
      if host is not None:
        if log_now:
          hooks.log(step, host)
          clock.logged(step)
        pending = []
      if hooks.eval_due(step):
        with clock.timing("evaluation"):
          hooks.evaluate(step, state)
      if save_now:
        with clock.timing("checkpoint_save"):
          hooks.save(step, state)
        clock.saved(step)
      if stopping is not None:
        return state, step, stopping
  return state, step, None
