"""Rows of fine-tuning data: GLUE through tfds, users' own CSV/TSV/JSONL files, and sentence (pair)
featurisation as run_classifier.py does it. The task registry is `bertjax.tasks`."""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from bertjax import errors
from bertjax.core import files
from bertjax.data.tasks import rowfile

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


def local_examples(path: str, task, text_a: str, text_b: str = "", label: str = "label") -> list[dict]:
  """Examples from a .csv, .tsv or .jsonl file with named columns; labels must be in the declared set of `task` (a
  `bertjax.tasks.Task`)."""
  path = _found(path)
  convert = Converter(path, task, text_a, text_b, label)
  out = [convert(line, row) for line, row in read_rows(path)]
  if not out:
    raise TaskDataError(f"{path}: no rows")
  return out


def _found(path) -> str:
  path = os.fspath(path)
  files.reach(path)
  if not files.isfile(path):
    raise TaskDataError(f"{path}: file not found")
  return path


class Converter:
  """One row of a task file as an example {"text_a", "text_b", "label"}, checked: the first row it sees must hold
  every named column; each row a value for them, non-empty texts and a label in `task`'s declared set."""

  def __init__(self, path: str, task, text_a: str, text_b: str = "", label: str = "label"):
    self.path, self.task, self.text_a, self.text_b, self.label = path, task, text_a, text_b, label
    self.needed = [c for c in (text_a, text_b, label) if c]
    self.index = {name: i for i, name in enumerate(task.labels)}
    self.first = True

  def __call__(self, line, row: dict) -> dict:
    path, text_a, text_b = self.path, self.text_a, self.text_b
    if self.first:
      missing = [c for c in self.needed if c not in row]
      if missing:
        raise TaskDataError(f"{path}: missing column(s) {missing}; the file has {sorted(row)}")
      self.first = False
    missing = [c for c in self.needed if c not in row or row[c] is None]
    if missing:
      raise TaskDataError(f"{path}:{line}: missing value(s) for {missing}")
    value = row[self.label]
    if self.task.kind == "regression":
      try:
        y = float(value)
      except (TypeError, ValueError):
        raise TaskDataError(f"{path}:{line}: label {value!r} is not a number") from None
      if not math.isfinite(y):
        raise TaskDataError(f"{path}:{line}: label {value!r} is not a finite number")
    else:
      key = str(value)
      if key not in self.index:
        raise TaskDataError(f"{path}:{line}: label {key!r} is not in the declared set {list(self.task.labels)}")
      y = self.index[key]
    empty = [c for c in (text_a, text_b) if c and not str(row[c]).strip()]
    if empty:
      raise TaskDataError(f"{path}:{line}: empty text in column(s) {empty}; remove the row or fill it in")
    return {"text_a": str(row[text_a]), "text_b": str(row[text_b]) if text_b else "", "label": y}


class Streamed:
  """The training features of a row file larger than the row buffer, made batch by batch: `scan` checks every
  row once (`convert(line, row)`, the errors a whole read gives) and keeps its offset; `take(idx)` reads the rows
  a batch needs, converts and featurises them (`featurize(rows)` -> a dict of arrays), and joins the per-row
  `extra` arrays (anything indexed by an index array, such as a teacher's scores) at `idx`. The host holds the
  buffer's blocks and 8 bytes a row; a batch's features are a function of its row indices alone, so a resumed
  run reads the same rows for the same step."""

  def __init__(self, path: str, convert, featurize):
    self.path, self.convert, self.featurize = path, convert, featurize
    self.file = rowfile.RowFile(path)
    self.extra: dict = {}

  def scan(self):
    """Every row converted, in file order; afterwards the file has its offsets (`len`)."""
    for line, row in self.file.scan():
      yield self.convert(line, row)

  def __len__(self) -> int:
    return len(self.file)

  def take(self, idx) -> dict[str, np.ndarray]:
    idx = np.asarray(idx)
    out = self.featurize([self.convert(None, row) for row in self.file.rows(idx)])
    return {**out, **{k: v[idx] for k, v in self.extra.items()}}

  def lengths(self, chunk: int = 1024) -> np.ndarray:
    """Every row's token count ([CLS] and [SEP]s included), encoded in file order a chunk at a time."""
    n = len(self)
    return np.concatenate([np.sum(self.take(np.arange(s, min(n, s + chunk)))["input_mask"], axis=1)
                           for s in range(0, n, chunk)]) if n else np.zeros(0, np.int64)


class StreamedPairs(Streamed):
  """The featurised sentence (pair) examples of a task file larger than the row buffer (`Streamed`). Features of
  row i equal `encode_pairs(local_examples(path, ...))[k][i]`."""

  def __init__(self, path: str, task, columns: tuple, tok, max_seq_length: int, regression: bool):
    super().__init__(path, Converter(path, task, *columns),
                     lambda examples: encode_pairs(examples, tok, max_seq_length, regression))
    seen = set()  # up to two distinct labels: enough to know whether a model can learn from them
    for example in self.scan():
      if len(seen) < 2:
        seen.add(example["label"])
    if not len(self.file):
      raise TaskDataError(f"{path}: no rows")
    self.labels = np.array(sorted(seen), np.float32 if regression else np.int32)


def pair_features(path: str, task, columns: tuple, tok, max_seq_length: int, regression: bool = False):
  """The training features of a sentence (pair) task file: encoded whole (a dict of arrays) when the file fits the
  row buffer ($BERTJAX_ROW_BUFFER), else a `StreamedPairs` that reads and encodes each batch's rows."""
  path = _found(path)
  if fits_buffer(path):
    return encode_pairs(local_examples(path, task, *columns), tok, max_seq_length, regression)
  return StreamedPairs(path, task, columns, tok, max_seq_length, regression)


def fits_buffer(path: str) -> bool:
  """Whether a task file is read whole: at most the row buffer ($BERTJAX_ROW_BUFFER); larger files are `Streamed`."""
  return files.size(path) <= rowfile.buffer_size()


def read_rows(path: str):
  """(line, row dict) of every row of a .csv, .tsv or .jsonl file, streamed in bounded memory (`rowfile`)."""
  yield from rowfile.RowFile(path).scan()


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
