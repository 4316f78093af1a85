"""Fine-tuning task kinds as plug-ins: each module owns its head, featurisation, loss, predictions, scoring and
inference (`base.Kind`); `kind(task)` picks the one for a `bertjax.data.task_data.Task`."""
from bertjax.data.task_data import Task, TaskDataError, get
from bertjax.tasks.base import EvalSet, Kind
from bertjax.tasks.classification import Classification
from bertjax.tasks.contrastive import Contrastive
from bertjax.tasks.span_qa import SpanQA
from bertjax.tasks.tagging import Tagging

KINDS: dict[str, Kind] = {"classification": Classification(), "regression": Classification(regression=True),
                          "tagging": Tagging(), "qa": SpanQA(), "contrastive": Contrastive()}


def kind(task: Task) -> Kind:
  if task.kind not in KINDS:
    raise TaskDataError(f"task kind {task.kind!r} is not one of {sorted(KINDS)}")
  return KINDS[task.kind]


__all__ = ["Task", "TaskDataError", "get", "EvalSet", "Kind", "KINDS", "kind", "Classification", "Contrastive",
           "SpanQA", "Tagging"]
