"""What a fine-tuning task kind provides to the task-agnostic fine-tuning loop (`bertjax.finetune`): the `Task`
a run's config names, and the `Kind` that owns its head, featurisation, loss, predictions, scoring, inference on
raw text and export.

A kind module (classification, tagging, span QA, the embedding kinds) defines `KINDS` ({kind name: Kind}),
`NAMES` (the task names it serves, for messages) and `task(name, labels, regression, config)` (its Task for a
name, else None; `config`, the run's, may be None); adding one is adding such a module and its line in
`bertjax.tasks.MODULES`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert import export as export_lib
from bertjax.convert import weights as weights_lib
from bertjax.core import trainer
from bertjax.data import packing


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  kind: str  # a kind name of a module in bertjax.tasks.MODULES: classification | regression | qa | tagging | ...
  text_keys: tuple[str, ...] = ()
  labels: tuple[str, ...] = ()
  metrics: tuple[str, ...] = ("accuracy",)
  main_metric: str = "accuracy"
  train_split: str = "train"
  eval_splits: tuple[str, ...] = ("validation",)
  options: tuple = ()  # (name, value) pairs a kind reads (e.g. an embedding task's pooling and loss scale)

  def option(self, name: str, default=None):
    return dict(self.options).get(name, default)

  @property
  def num_labels(self) -> int:
    return 1 if self.kind == "regression" else len(self.labels)


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
  """The interface; each method is the kind's own. `task` is the `Task` being run."""
  name = ""
  hf_head = ""  # the HF architecture family (convert.TASK_HEADS) that holds this kind's head
  pack_keys: dict | None = None  # packing.pack_features keyword arguments; None: the kind cannot be packed
  outputs: tuple[str, ...] = ("logits",)  # what predictions keep of the model's outputs
  token_outputs: tuple[str, ...] | None = None  # those of them per token (None: those as long as the batch)

  def head(self, task: Task, cfg):
    """The flax module: the encoder with this kind's head, the family's own (`model.for_task`)."""
    return model_lib.for_task(cfg, self.hf_head, task.num_labels)

  def weights(self, task: Task | None, path: str, overrides: dict) -> tuple:
    """(BertConfig, params, tokenizer path, lower-casing) of an init at `path` (`convert.weights.load`): its
    encoder, and the head of this kind an HF folder already holds with the task's label count (HF's
    `from_pretrained` keeps it too). `overrides`: the run's model fields over the init's architecture."""
    w = weights_lib.load(path, overrides=overrides, head=self.hf_head or "encoder",
                         num_labels=task.num_labels if task is not None else 0)
    return w.cfg, w.params, w.tokenizer, w.do_lower_case

  def load(self, task: Task, config, tok) -> tuple[dict, list[EvalSet], dict]:
    """(training features, eval sets, featurisation statistics to report) from the config's data settings."""
    raise NotImplementedError

  def loss(self, task: Task, out: dict, batch: dict):
    """The mean training loss over the batch's real examples (`example_weights`)."""
    raise NotImplementedError

  def tokenizer_folders(self, task: Task) -> tuple[str, ...]:
    """The export's sub-folders that take the run's tokenizer files ("": the folder itself)."""
    return ("",)

  def can_pack(self, task: Task) -> bool:
    """Whether this task's examples can be packed several to a row (`data.packing`)."""
    del task
    return self.pack_keys is not None

  def pack(self, feats: dict, row_length: int, max_per_row: int) -> tuple[dict, list[list[int]]]:
    """(packed rows, the plan: each row's example indices) of features whose texts are `row_length` long."""
    return packing.pack_features(feats, row_length, max_per_row, **self.pack_keys)

  def text_lengths(self, feats: dict) -> np.ndarray:
    """The token count of every text of the features (what packing lays end to end)."""
    return np.sum(feats["input_mask"], axis=1)

  def loss_weights(self, task: Task, batch: dict):
    """The weights `loss` takes its mean over (the batch's real examples), by which micro-batches are summed."""
    del task
    return batch["example_weights"]

  def accumulates(self, task: Task) -> bool:
    """Whether the loss is a mean over `loss_weights`, so that micro-batches sum to the whole batch's gradient
    (`train.grad_accum_steps`); a loss comparing rows across the batch (in-batch negatives) is not."""
    del task
    return True

  def value_and_grad(self, task: Task, module, params, batch: dict, rngs: dict, step=None, total_steps=None,
                     accum: int = 1):
    """(loss, gradient w.r.t. params) of one training batch, dropout from `rngs`; `step` (traced) and
    `total_steps` for a loss that follows the run's progress (the sparse kind's regulariser ramp). With `accum`
    > 1 the batch runs as that many micro-batches (`trainer.accumulate`), each micro-batch's mean weighted by
    its share of `loss_weights`, so they sum to the whole batch's mean; micro-batch i draws dropout from
    `rngs` folded with i."""
    del step, total_steps
    total = jnp.maximum(jnp.sum(self.loss_weights(task, batch)), 1e-5)

    def grad_fn(p, mb, i):
      def loss_fn(p):
        keys = rngs if accum == 1 else {name: jax.random.fold_in(key, i) for name, key in rngs.items()}
        loss = self.loss(task, module.apply({"params": p}, mb, deterministic=False, rngs=keys), mb)
        if accum > 1:
          loss = loss * jnp.sum(self.loss_weights(task, mb)) / total
        return loss, loss
      return jax.value_and_grad(loss_fn, has_aux=True)(p)
    grads, loss = trainer.accumulate(grad_fn, params, batch, accum)
    return loss, grads

  def score(self, task: Task, ev: EvalSet, preds: dict, config) -> dict[str, float]:
    """The task's metrics from the predictions for every row of `ev.feats`, in order."""
    raise NotImplementedError

  def prediction_files(self, task: Task, ev: EvalSet) -> dict[str, object]:
    """JSON files (name -> content) of the predictions `score` last scored on `ev`, written into the workdir
    beside the best parameters; none by default."""
    del task, ev
    return {}

  def export(self, task: Task, module, params, out: str, meta: dict) -> str:
    """The fine-tuned model as its family's HF task model in the folder `out` (the tokenizer files are the
    caller's); returns the architecture written. `meta`: the run's finetune.json."""
    del meta
    convert.to_hf(module.cfg, params, out, head=self.hf_head, labels=task.labels)
    return export_lib.architecture(out)

  def predict_settings(self, config) -> dict:
    """Data settings a fine-tuned workdir keeps (in finetune.json) for `predict_text` to featurise as the run did."""
    del config
    return {}

  def predict_text(self, task: Task, module, params, tok, seq: int, **text: Any) -> dict:
    """A prediction for raw text (`python -m bertjax predict` on a fine-tuned workdir); the keyword arguments also
    carry the run's `predict_settings`."""
    raise NotImplementedError
