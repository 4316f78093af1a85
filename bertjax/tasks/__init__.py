"""Fine-tuning task kinds as plug-ins: each kind module owns its task names, head, featurisation, loss, predictions,
scoring, inference and export (`base.Kind`); `get(name)` gives the `Task` a config names and `kind(task)` its Kind.

The registry is `MODULES`, one line per kind module (imported when first asked for, as big_vision picks a model by
name): a new task kind is one module and one line here.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Sequence

from bertjax import errors
from bertjax.tasks.base import EvalSet, Kind, Task, example_mean

MODULES = ("bertjax.tasks.classification", "bertjax.tasks.tagging", "bertjax.tasks.span_qa",
           "bertjax.embeddings.dense.task", "bertjax.embeddings.sparse.task", "bertjax.embeddings.rerank.task",
           "bertjax.embeddings.multivector.task")
TaskDataError = errors.TaskDataError


@functools.cache
def _modules() -> tuple:
  return tuple(importlib.import_module(m) for m in MODULES)


def kinds() -> dict[str, Kind]:
  """Every registered kind by name."""
  return {name: k for m in _modules() for name, k in m.KINDS.items()}


def kind(task: Task) -> Kind:
  found = kinds()
  if task.kind not in found:
    raise TaskDataError(f"task kind {task.kind!r} is not one of {sorted(found)}")
  return found[task.kind]


def names() -> list[str]:
  """Every task name a kind module serves."""
  return [n for m in _modules() for n in m.NAMES]


def get(name: str, labels: Sequence[str] = (), regression: bool = False, config=None, options: tuple = ()) -> Task:
  """The task by name (its kind module decides); `local`, `ner` take their label set from the config, `pairs`
  (embedding training) its options from the run's `config` (None: the defaults); `options` are added to those."""
  labels = tuple(t for t in labels if str(t).strip())  # the config's placeholder ("",) declares nothing
  if len(set(labels)) != len(labels):
    raise TaskDataError(f"config.data.labels {list(labels)} names a label twice")
  for m in _modules():
    found = m.task(name, labels, regression, config)
    if found is not None:
      return dataclasses.replace(found, options=found.options + tuple(options)) if options else found
  raise TaskDataError(f"unknown task {name!r}; choose one of {names()}")


__all__ = ["MODULES", "EvalSet", "Kind", "Task", "TaskDataError", "example_mean", "get", "kind", "kinds", "names"]
