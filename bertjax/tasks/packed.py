"""Packing a fine-tuning task's training rows: several short examples laid end to end in one row
(`data.packing`, or `data.auto_packing` for short texts), and the rows per step that carry the recipe's batch."""
from __future__ import annotations

import numpy as np

from bertjax import tasks as tasks_lib
from bertjax.data.tasks import rowfile
from bertjax.tasks import TaskDataError


def pack_train(train: dict, task: tasks_lib.Task, config, dp: int) -> tuple[dict, int, str]:
  """Packs the training features (`data.packing`) and picks the rows per step that carry, on average, the
  recipe's `global_batch_size` examples (a multiple of the data-parallel size times `train.grad_accum_steps`).
  Evaluation packs its examples alike (`batching.predict_packed`)."""
  kind = tasks_lib.kind(task)
  if not kind.can_pack(task):
    raise TaskDataError("data.packing is for classification, regression, tagging and embedding pairs without "
                        "embedding.cache_chunk; SQuAD windows are already full (doc_stride), so there is nothing "
                        "to pack")
  seq, gbs = config.data.max_seq_length, config.train.global_batch_size
  # A step holds a multiple of `unit` rows (each micro-batch a row or more per device): more than
  # global_batch_size / unit examples per row would make the step's batch larger than the recipe's, so the row's
  # capacity is capped there.
  unit = dp * config.train.grad_accum_steps
  k = min(config.data.pack_max_per_row, max(1, gbs // unit))
  packed, rows = kind.pack(train, seq, k)
  if "example_keys" in kind.pack_keys:
    del packed["example_slot_weights"]  # a per-token loss: label_weights already mark the real tokens
  n, r = len(train["input_ids"]), len(rows)
  per_row = n / r
  rows_per_step = max(unit, int(round(gbs / per_row / unit)) * unit)
  lengths = kind.text_lengths(train)
  row_length = packed["input_ids"].shape[1]
  note = (f"packing: {n} examples in {r} rows of {row_length} (at most {k}, on average {per_row:.2f} per row, "
          f"{float(np.sum(lengths)) / (r * row_length):.1%} of tokens real; "
          f"unpacked {float(np.sum(lengths)) / (len(lengths) * seq):.1%}); {rows_per_step} rows per step "
          f"= {rows_per_step * per_row:.1f} examples on average (global_batch_size {gbs})")
  return packed, rows_per_step, note


def use_packing(config, task: tasks_lib.Task, train: dict) -> bool:
  """Whether the training rows are packed: `data.packing`, or `data.auto_packing` when the task kind packs and
  its texts average at most half of `max_seq_length` (two or more to a row: most of an unpacked batch would
  be padding, and one row shape is one compiled program where length buckets make several)."""
  if config.data.packing and not isinstance(train, dict):  # a file larger than the row buffer, encoded per batch
    raise TaskDataError(f"data.packing lays every example out in memory; {train.path} is larger than the row "
                        f"buffer ({rowfile.ENV}={rowfile.buffer_size()} bytes): raise it, or train without packing")
  if config.data.packing:
    return True
  kind = tasks_lib.kind(task)
  if not isinstance(train, dict) or not config.data.auto_packing or not kind.can_pack(task):
    return False
  lengths = kind.text_lengths(train)
  return len(lengths) > 0 and float(np.mean(lengths)) <= config.data.max_seq_length / 2
