"""What a fine-tuning task kind provides to the task-agnostic fine-tuning loop (`bertjax.finetune`).

A kind (sentence classification or regression, tagging, span QA) is one module with one `Kind` object that owns
its head, its featurisation, its loss, its predictions, its scoring and its inference on raw text. Adding a task
kind is adding one such module and registering it in `bertjax.tasks.KINDS`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import model as model_lib
from bertjax.data import packing, task_data


@dataclasses.dataclass
class EvalSet:
  """Features of one eval split and what scoring needs (examples, windows, word positions)."""
  name: str
  feats: dict
  meta: dict = dataclasses.field(default_factory=dict)


def example_mean(values, weights):
  """Σ values·weights / Σ weights (zero-weight rows fill partial batches and count for nothing)."""
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-5)


class Kind:
  """The interface; each method is the kind's own. `task` is the `bertjax.data.task_data.Task` being run."""
  name = ""
  hf_head = ""  # the HF architecture family (convert.TASK_HEADS) that holds this kind's head
  pack_keys: dict | None = None  # packing.pack_features keyword arguments; None: the kind cannot be packed
  outputs: tuple[str, ...] = ("logits",)  # what predictions keep of the model's outputs
  token_outputs: tuple[str, ...] | None = None  # those of them per token (None: those as long as the batch)

  def head(self, task: task_data.Task, cfg):
    """The flax module: the encoder with this kind's head, the family's own (`model.for_task`)."""
    return model_lib.for_task(cfg, self.hf_head, task.num_labels)

  def load(self, task: task_data.Task, config, tok) -> tuple[dict, list[EvalSet], dict]:
    """(training features, eval sets, featurisation statistics to report) from the config's data settings."""
    raise NotImplementedError

  def loss(self, task: task_data.Task, out: dict, batch: dict):
    """The mean training loss over the batch's real examples (`example_weights`)."""
    raise NotImplementedError

  def can_pack(self, task: task_data.Task) -> bool:
    """Whether this task's examples can be packed several to a row (`data.packing`)."""
    del task
    return self.pack_keys is not None

  def pack(self, feats: dict, row_length: int, max_per_row: int) -> tuple[dict, list[list[int]]]:
    """(packed rows, the plan: each row's example indices) of features whose texts are `row_length` long."""
    return packing.pack_features(feats, row_length, max_per_row, **self.pack_keys)

  def text_lengths(self, feats: dict) -> np.ndarray:
    """The token count of every text of the features (what packing lays end to end)."""
    return np.sum(feats["input_mask"], axis=1)

  def value_and_grad(self, task: task_data.Task, module, params, batch: dict, rngs: dict):
    """(loss, gradient w.r.t. params) of one training batch, dropout from `rngs`."""
    def loss_fn(p):
      return self.loss(task, module.apply({"params": p}, batch, deterministic=False, rngs=rngs), batch)
    return jax.value_and_grad(loss_fn)(params)

  def score(self, task: task_data.Task, ev: EvalSet, preds: dict, config) -> dict[str, float]:
    """The task's metrics from the predictions for every row of `ev.feats`, in order."""
    raise NotImplementedError

  def prediction_files(self, task: task_data.Task, ev: EvalSet) -> dict[str, object]:
    """JSON files (name -> content) of the predictions `score` last scored on `ev`, written into the workdir
    beside the best parameters; none by default."""
    del task, ev
    return {}

  def predict_settings(self, config) -> dict:
    """Data settings a fine-tuned workdir keeps (in finetune.json) for `predict_text` to featurise as the run did."""
    del config
    return {}

  def predict_text(self, task: task_data.Task, module, params, tok, seq: int, **text: Any) -> dict:
    """A prediction for raw text (`python -m bertjax.predict` on a fine-tuned workdir); the keyword arguments also
    carry the run's `predict_settings`."""
    raise NotImplementedError
