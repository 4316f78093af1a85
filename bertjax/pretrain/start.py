"""Where a pre-training run starts when its workdir holds no checkpoint: the parameters of an init checkpoint (a
bertjax workdir or an HF folder) fitted to this model, or, to anneal or continue a bertjax run in a new workdir,
that run's whole state (optimizer included) and the learning rate it stood at."""
from __future__ import annotations

import jax
import ml_collections

from bertjax import errors
from bertjax import model as model_lib
from bertjax.convert import weights
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files
from bertjax.core import phases as phases_lib
from bertjax.core import trainer as trainer_lib

INIT_OPTIMIZER = ("reset", "keep")


def load_init_params(path: str, mcfg: model_lib.BertConfig, seq: int = 0, step: int | None = None):
  """Pre-training params (encoder and MLM/NSP heads) from a bertjax workdir (its checkpoint at `step`, default
  its newest) or an HF folder, in mcfg's layout. A rotary checkpoint continued at another length or θ (context
  extension) is announced with both settings."""
  w = weights.load(path, overrides={"scan_layers": mcfg.scan_layers}, head="pretraining", step=step)
  if mcfg.position_embedding == "rotary":
    trained = (w.meta.get("data") or {}).get("max_seq_length")  # a bertjax workdir's run config

    def thetas(c):
      return f"rotary θ {c.rope_theta:g} global / {c.rope_theta_local or c.rope_theta:g} local"
    if (w.cfg.rope_theta, w.cfg.rope_theta_local) != (mcfg.rope_theta, mcfg.rope_theta_local) or (
        seq and trained and trained != seq):
      print(f"init_checkpoint {path}: trained with {thetas(w.cfg)}" + (f" at {trained} tokens" if trained else "")
            + f"; this run uses {thetas(mcfg)}" + (f" at {seq} tokens" if seq else ""), flush=True)
  return w.params


HEAD_NAMES = {"mlm_transform": "MLM head", "mlm_ln": "MLM head", "mlm_bias": "MLM head", "nsp": "NSP head",
              "pooler": "pooler"}


def fit_init_params(init: dict, abstract: dict, path: str, announce=print) -> dict:
  """The init params this model takes: the encoder must be whole and every shared parameter of the model's shape;
  heads the checkpoint lacks start fresh (an HF encoder without an MLM head; BertForMaskedLM, without NSP head
  and pooler, continued with NSP) and heads this model lacks are left out (NSP continued MLM-only), each said."""
  if "bert" not in abstract or "bert" not in init:  # another objective's tree (ELECTRA): every leaf must fit
    checkpoint_lib.check_params_fit(init, abstract)
    return init
  bert = {k: v for k, v in init["bert"].items() if k in abstract["bert"]}
  missing = sorted(k for k in abstract["bert"] if k not in bert and k != "pooler")
  if missing:
    raise checkpoint_lib.CheckpointError(f"init_checkpoint {path}: its encoder lacks {missing}; an init needs the "
                                         "whole encoder")
  out = {"bert": bert, **{k: v for k, v in init.items() if k != "bert" and k in abstract}}
  fresh = sorted({HEAD_NAMES.get(k, k) for k in [*abstract, *abstract["bert"]] if k not in out and k not in bert})
  dropped = sorted({HEAD_NAMES.get(k, k) for k in [*init, *init["bert"]]
                    if k not in abstract and k not in abstract["bert"]})
  if fresh:
    announce(f"init_checkpoint {path}: has no {', '.join(fresh)}: drawn fresh")
  if dropped:
    announce(f"init_checkpoint {path}: its {', '.join(dropped)} is not in this model: left out")
  checkpoint_lib.check_params_fit(out, {"bert": {k: abstract["bert"][k] for k in bert},
                                        **{k: abstract[k] for k in out if k != "bert"}})
  return out


def init_step(config) -> int | None:
  """The step of the init workdir to start from (config.init_step; 0 = its newest)."""
  return config.init_step or None


def init_errors(config) -> list[str]:
  """The init's own settings: keep needs a bertjax pre-training workdir (an HF folder has no optimizer state);
  init_step must be a step the init workdir holds (reset and keep alike start from it)."""
  how = config.init_optimizer
  out = []
  if how not in INIT_OPTIMIZER:
    out.append(f"init_optimizer must be one of {list(INIT_OPTIMIZER)}, got {how!r}")
  step = config.init_step
  if not isinstance(step, int) or step < 0:
    out.append(f"init_step must be an integer >= 0 (0: the newest checkpoint), got {step!r}")
  path = config.init_checkpoint
  if path and how == "keep":
    try:
      kind = weights.source_of(path)
    except errors.Error as e:
      return out + [str(e)]
    if kind != "pretraining":
      out.append(f"init_optimizer=keep continues the optimizer of a bertjax pre-training workdir; {path} is "
                 f"{'an HF folder' if kind == 'hf' else 'a fine-tuned workdir'}, which has none: use "
                 "init_optimizer=reset")
  elif not path and step:
    out.append("init_step is set but init_checkpoint is empty")
  if path and isinstance(step, int) and step > 0:
    out += _step_errors(path, step)
  return out


def _step_errors(path: str, step: int) -> list[str]:
  """init_step against the steps the init holds: an HF folder or a fine-tuned workdir has none."""
  try:
    kind = weights.source_of(path)
  except errors.Error as e:
    return [str(e)]
  if kind != "pretraining":
    return [f"init_step {step}: init_checkpoint {path} is {'an HF folder' if kind == 'hf' else 'a fine-tuned workdir'}"
            ", which has no steps: set init_step=0"]
  try:
    ckpt = checkpoint_lib.Checkpointer(path, read_only=True)
    try:
      held = ckpt.steps()
    finally:
      ckpt.manager.close()
  except (OSError, ValueError) as e:
    return [f"init_step {step}: cannot list the checkpoints of init_checkpoint {path} ({errors.one_line(e)})"]
  if step not in held:
    return [f"init_step {step}: init_checkpoint {path} holds no checkpoint at that step; it holds steps {held}"]
  return []


def _run_config(path: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(files.read_json(files.join(path, "config.json")))


def init_rate(config, granularity: int) -> float | None:
  """The learning rate the init checkpoint stood at (the rate of the last step it took), for a phase that
  starts from it (learning_rate or warmup_from -1); None for an HF folder, which does not say. Read from the
  checkpoint's saved data state, else recomputed from the run's config."""
  path = config.init_checkpoint
  if not path or weights.source_of(path) != "pretraining":
    return None
  ckpt = checkpoint_lib.Checkpointer(path, read_only=True)
  try:
    step = init_step(config) or ckpt.latest_step()
    saved = ckpt.data_state(step) if step is not None else {}
  finally:
    ckpt.manager.close()
  if step is None:
    raise checkpoint_lib.CheckpointError(f"init_checkpoint {path}: no checkpoint")
  if "learning_rate" in saved:
    return float(saved["learning_rate"])
  run = _run_config(path)
  return float(phases_lib.lr_function(phases_lib.plan(run, granularity, None))(max(step - 1, 0)))


def restore_full(config, t: trainer_lib.Trainer, announce=print):
  """The init workdir's whole state (params, optimizer state; its moving average when both runs keep one) at
  init_step (or its newest), placed on this run's shardings, with the step set to 0: this run counts its own steps;
  Adam's count, inside the optimizer state, goes on from the init's."""
  path = config.init_checkpoint
  ckpt = checkpoint_lib.Checkpointer(path, read_only=True)
  base = dict(step=t.abstract.step, params=t.abstract.params, opt_state=t.abstract.opt_state)
  step = init_step(config) or ckpt.latest_step()
  try:
    has_ema = step is not None and "ema" in ckpt.manager.item_metadata(step)["state"]
  except Exception:  # an unreadable step: `restore` names it
    has_ema = False
  abstract = (trainer_lib.EmaTrainState(**base, ema=t.abstract.params) if has_ema else trainer_lib.TrainState(**base))
  try:
    state, _, step = ckpt.restore(abstract, step=init_step(config), announce=announce)
  except checkpoint_lib.CheckpointError as e:
    raise checkpoint_lib.CheckpointError(f"init_checkpoint {path} (init_optimizer=keep): {e}; its optimizer must be "
                                         "this run's (train.optimizer and the model alike)") from None
  finally:
    ckpt.manager.close()
  announce(f"init_checkpoint {path}: step {step}, parameters and optimizer state (init_optimizer=keep)")
  fields = dict(step=jax.numpy.zeros_like(state.step), params=state.params, opt_state=state.opt_state)
  if t.ema:
    return trainer_lib.EmaTrainState(**fields, ema=state.ema if has_ema else state.params)
  return trainer_lib.TrainState(**fields)


def checked_rate(config, granularity: int) -> float | None:
  """`init_rate`, with an unreadable init said in one line."""
  try:
    return init_rate(config, granularity)
  except (OSError, ValueError, KeyError) as e:
    raise errors.CheckpointError(f"init_checkpoint {config.init_checkpoint}: cannot tell the learning rate it "
                                 f"stood at ({errors.one_line(e)}); set the first phase's learning_rate") from None

