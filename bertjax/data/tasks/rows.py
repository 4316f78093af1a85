"""Rows of fine-tuning data: GLUE through tfds, users' own CSV/TSV/JSONL files, and sentence (pair)
featurisation as run_classifier.py does it. The task registry is `bertjax.tasks`."""
from __future__ import annotations

import csv
import io
import math
import os
from typing import Sequence

import numpy as np

from bertjax import errors
from bertjax.core import files

TaskDataError = errors.TaskDataError


def _text(v) -> str:
  return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


DOWNLOAD_RETRIES = 3  # tfds retries a failed download 10 times with growing waits: minutes before an offline error


def tfds_source(name: str, split: str, data_dir: str | None = None):
  """`tfds.data_source(name)`, downloading and preparing it where it is not prepared; a download that fails (no
  network) is one TaskDataError saying how to prepare the data elsewhere, after a few seconds."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core.download import downloader
  downloader.MAX_RETRIES = min(downloader.MAX_RETRIES, DOWNLOAD_RETRIES)
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir)
  except Exception as e:  # requests' and urllib3's connection errors, wrapped by tfds in its own
    chain, seen = [], e
    while seen is not None and len(chain) < 10:
      chain.append(f"{type(seen).__name__} {seen}")
      seen = seen.__cause__ or seen.__context__
    text = " ".join(chain)
    if not any(w in text for w in ("ConnectionError", "MaxRetryError", "NameResolution", "Max retries",
                                   "Failed to establish", "DownloadError")):
      raise
    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
    raise TaskDataError(
        f"{name}: not prepared in {data_dir or '~/tensorflow_datasets'} and its download failed ({first}); "
        f"prepare it where the network is reachable (python -c \"import tensorflow_datasets as tfds; "
        f"tfds.builder('{name}').download_and_prepare()\") and copy the folder here, or set "
        "config.data.tfds_data_dir") from None


def glue_examples(task, split: str, data_dir: str | None = None) -> list[dict]:
  """[{"text_a", "text_b", "label"}] of a GLUE `bertjax.tasks.Task` from `tfds.data_source` (array_record; no
  TensorFlow needed)."""
  import tensorflow_datasets.text  # noqa: F401  (registers glue)
  src = tfds_source(task.name, split, data_dir)
  out = []
  for i in range(len(src)):  # one by one: mocked sources support neither slicing nor __getitems__
    ex = src[i]
    out.append({"text_a": _text(ex[task.text_keys[0]]),
                "text_b": _text(ex[task.text_keys[1]]) if len(task.text_keys) > 1 else "",
                "label": float(ex["label"]) if task.kind == "regression" else int(ex["label"])})
  return out


# A text field may be a whole document: no cap below what fits in memory (the csv module's default is 131,072).
csv.field_size_limit(2 ** 31 - 1)


def local_examples(path: str, task, text_a: str, text_b: str = "", label: str = "label") -> list[dict]:
  """Examples from a .csv, .tsv or .jsonl file with named columns; labels must be in the declared set of `task` (a
  `bertjax.tasks.Task`)."""
  path = os.fspath(path)
  files.reach(path)
  if not files.isfile(path):
    raise TaskDataError(f"{path}: file not found")
  rows = list(read_rows(path))
  if not rows:
    raise TaskDataError(f"{path}: no rows")
  needed = [c for c in (text_a, text_b, label) if c]
  first_line, first = rows[0]
  missing = [c for c in needed if c not in first]
  if missing:
    raise TaskDataError(f"{path}: missing column(s) {missing}; the file has {sorted(first)}")
  index = {name: i for i, name in enumerate(task.labels)}
  out = []
  for line, row in rows:
    missing = [c for c in needed if c not in row or row[c] is None]
    if missing:
      raise TaskDataError(f"{path}:{line}: missing value(s) for {missing}")
    value = row[label]
    if task.kind == "regression":
      try:
        y = float(value)
      except (TypeError, ValueError):
        raise TaskDataError(f"{path}:{line}: label {value!r} is not a number") from None
      if not math.isfinite(y):
        raise TaskDataError(f"{path}:{line}: label {value!r} is not a finite number")
    else:
      key = str(value)
      if key not in index:
        raise TaskDataError(f"{path}:{line}: label {key!r} is not in the declared set {list(task.labels)}")
      y = index[key]
    empty = [c for c in (text_a, text_b) if c and not str(row[c]).strip()]
    if empty:
      raise TaskDataError(f"{path}:{line}: empty text in column(s) {empty}; remove the row or fill it in")
    out.append({"text_a": str(row[text_a]), "text_b": str(row[text_b]) if text_b else "", "label": y})
  return out


def read_rows(path: str):
  text = files.utf8_text(path, TaskDataError)
  if path.endswith(".jsonl"):
    for n, line in enumerate(text.split("\n"), 1):  # a JSON string may hold U+2028, which splitlines() cuts at
      if line.strip():
        yield n, files.json_object(line, f"{path}:{n}", TaskDataError)
    return
  delimiter = "\t" if path.endswith(".tsv") else ","
  with io.StringIO(text, newline="") as f:
    reader = csv.DictReader(f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
    try:
      for row in reader:
        yield reader.line_num, row
    except csv.Error as e:
      raise TaskDataError(f"{path}:{reader.line_num}: not readable as {'TSV' if delimiter == chr(9) else 'CSV'} "
                          f"({e})") from None


def truncate_pair(a: list, b: list, max_tokens: int) -> None:
  """run_classifier's rule: pop from the end of the longer list until the pair fits (in place)."""
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()


def encode_pairs(examples: Sequence[dict], tok, max_seq_length: int, regression: bool = False) -> dict[str, np.ndarray]:
  """[CLS] a [SEP] (b [SEP]) with segment ids, zero-padded; labels int32 (float32 for regression)."""
  n = len(examples)
  ids = np.zeros((n, max_seq_length), np.int32)
  seg = np.zeros_like(ids)
  mask = np.zeros_like(ids)
  for i, ex in enumerate(examples):
    a = tok.encode(ex["text_a"])
    b = tok.encode(ex["text_b"]) if ex.get("text_b") else []
    truncate_pair(a, b, max_seq_length - (3 if b else 2))
    row = [tok.cls_id] + a + [tok.sep_id] + (b + [tok.sep_id] if b else [])
    ids[i, :len(row)] = row
    seg[i, len(a) + 2:len(row)] = 1
    mask[i, :len(row)] = 1
  labels = np.array([ex["label"] for ex in examples], np.float32 if regression else np.int32)
  return {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "labels": labels}
