"""Token classification (NER) from CoNLL-style files: a token and its BIO tag per line, a blank line between
sentences (`-DOCSTART-` lines skipped; with more than two columns the first is the token, the last the tag).

Each word's label goes on its first sub-token; the other sub-tokens carry weight 0 and are ignored.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from bertjax.core import files
from bertjax.data.tasks.rows import TaskDataError


def read(path: str) -> list[tuple[list[str], list[str]]]:
  path = os.fspath(path)
  files.reach(path)
  if not files.isfile(path):
    raise TaskDataError(f"{path}: file not found")
  sentences, words, tags = [], [], []
  for n, line in enumerate(files.utf8_text(path, TaskDataError).split("\n"), 1):
    line = line.strip()
    if not line or line.startswith("-DOCSTART-"):
      if words:
        sentences.append((words, tags))
      words, tags = [], []
      continue
    parts = line.split()
    if len(parts) < 2:
      raise TaskDataError(f"{path}:{n}: {line!r} has no tag; expected 'token TAG' per line")
    words.append(parts[0])
    tags.append(parts[-1])
  if words:
    sentences.append((words, tags))
  if not sentences:
    raise TaskDataError(f"{path}: no sentences")
  return sentences


def featurize(sentences, tok, labels: Sequence[str], max_seq_length: int, stats: dict | None = None):
  """(features, word index per position (-1 for specials/padding/continuations)). Unknown tags are errors."""
  stats = stats if stats is not None else {}
  stats.setdefault("truncated_words", 0)
  index = {t: i for i, t in enumerate(labels)}
  n = len(sentences)
  ids = np.zeros((n, max_seq_length), np.int32)
  lab = np.zeros_like(ids)
  weights = np.zeros((n, max_seq_length), np.float32)
  word_at = np.full((n, max_seq_length), -1, np.int32)
  mask = np.zeros_like(ids)
  for i, (words, tags) in enumerate(sentences):
    row, row_lab, row_w, row_word = [tok.cls_id], [0], [0.0], [-1]
    for wi, (w, t) in enumerate(zip(words, tags)):
      if t not in index:
        raise TaskDataError(f"sentence {i + 1}: tag {t!r} is not in the declared labels {list(labels)}")
      pieces = tok.encode(w) or [tok.unk_id]
      room = max_seq_length - 1 - len(row)  # one place is kept for [SEP]
      if room <= 0:
        stats["truncated_words"] += len(words) - wi
        break
      # A word cut by the length limit keeps the pieces that fit (its label is on the first), as HF's
      # tokenizer(..., is_split_into_words=True, truncation=True) does.
      pieces = pieces[:room]
      row += pieces
      row_lab += [index[t]] + [0] * (len(pieces) - 1)
      row_w += [1.0] + [0.0] * (len(pieces) - 1)
      row_word += [wi] + [-1] * (len(pieces) - 1)
    row += [tok.sep_id]
    row_lab.append(0)
    row_w.append(0.0)
    row_word.append(-1)
    k = len(row)
    ids[i, :k], lab[i, :k], weights[i, :k], word_at[i, :k] = row, row_lab, row_w, row_word
    mask[i, :k] = 1
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids), "labels": lab,
          "label_weights": weights}, word_at


def decode(pred: np.ndarray, word_at: np.ndarray, sentences, labels: Sequence[str]) -> list[list[str]]:
  """Per-word tags from the first sub-token's prediction; words cut off by truncation get "O"."""
  out = []
  for i, (words, _) in enumerate(sentences):
    tags = ["O"] * len(words)
    for pos in np.nonzero(word_at[i] >= 0)[0]:
      tags[word_at[i, pos]] = labels[int(pred[i, pos])]
    out.append(tags)
  return out
