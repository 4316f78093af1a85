"""Sequence packing: several examples per row, with no attention across them.

A packed row carries, besides the usual features:
  position_ids           positions restarting at 0 for each example
  attention_segment_ids  1..k for the row's examples, 0 for padding (the model's block-diagonal mask)
  cls_positions [K]      where each example's [CLS] is (NSP and pooling per example)
  next_sentence_labels / next_sentence_weights [K]   one per example slot (weight 0 for empty slots)
  masked_lm_*            every example's predictions, positions shifted to the row

`plan` is best-fit-decreasing over (tokens, predictions), deterministic; `PackedSource` serves packed rows by
index, so the index-based pipeline (shuffling, host sharding, resumable state) works on it unchanged.
"""
from __future__ import annotations

import io

import numpy as np

from bertjax import errors
from bertjax.core import files


def plan(lengths, predictions, row_length: int, row_predictions: int, max_per_row: int) -> list[list[int]]:
  """Rows of example indices: best-fit-decreasing by length, within both capacities. Deterministic.

  Examples go longest first (ties by index) into the open row with the least free tokens that still holds them
  (and their masked positions); open rows are kept in buckets by free tokens, so an example costs at most
  `row_length` bucket lookups, not a scan of all rows: 400k GLUE-sized examples plan in seconds.
  """
  lengths = np.asarray(lengths)
  predictions = np.asarray(predictions)
  if np.any(lengths > row_length):
    raise errors.DataError(f"an example of {int(lengths.max())} tokens does not fit a row of {row_length}")
  if np.any(predictions > row_predictions):
    raise errors.DataError(f"an example with {int(predictions.max())} masked positions does not fit a row's "
                     f"{row_predictions}; raise data.pack_row_predictions")
  order = np.lexsort((np.arange(len(lengths)), -lengths))  # longest first, ties by index
  rows: list[list[int]] = []
  free_pred: list[int] = []
  buckets: list[list[int]] = [[] for _ in range(row_length + 1)]  # open rows by free tokens, oldest first
  for i in order:
    n, p = int(lengths[i]), int(predictions[i])
    target = -1
    for f in range(n, row_length + 1):
      for j, r in enumerate(buckets[f]):
        if free_pred[r] >= p:
          target = r
          del buckets[f][j]
          break
      if target >= 0:
        break
    if target < 0:
      target, f = len(rows), row_length
      rows.append([])
      free_pred.append(row_predictions)
    rows[target].append(int(i))
    free_pred[target] -= p
    if len(rows[target]) < max_per_row and f - n > 0:
      buckets[f - n].append(target)
  return rows


def pack_row(examples: list[dict], row_length: int, row_predictions: int, max_per_row: int) -> dict:
  """One packed row from feature dicts (each zero-padded as made by the data creation)."""
  ids = np.zeros(row_length, np.int32)
  mask, seg, pos, att = (np.zeros(row_length, np.int32) for _ in range(4))
  cls = np.zeros(max_per_row, np.int32)
  nsl = np.zeros(max_per_row, np.int32)
  nsw = np.zeros(max_per_row, np.float32)
  mpos = np.zeros(row_predictions, np.int32)
  mids = np.zeros(row_predictions, np.int32)
  mw = np.zeros(row_predictions, np.float32)
  t = q = 0
  for k, ex in enumerate(examples):
    n = int(np.sum(ex["input_mask"]))
    ids[t:t + n] = ex["input_ids"][:n]
    mask[t:t + n] = 1
    seg[t:t + n] = ex["segment_ids"][:n]
    pos[t:t + n] = np.arange(n)
    att[t:t + n] = k + 1
    cls[k] = t
    if "next_sentence_labels" in ex:
      nsl[k] = ex["next_sentence_labels"]
    nsw[k] = ex.get("next_sentence_weights", 1.0)
    if "masked_lm_weights" in ex:
      w = np.asarray(ex["masked_lm_weights"]) > 0
      p = int(w.sum())
      mpos[q:q + p] = np.asarray(ex["masked_lm_positions"])[w] + t
      mids[q:q + p] = np.asarray(ex["masked_lm_ids"])[w]
      mw[q:q + p] = 1.0
      q += p
    t += n
  return {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "position_ids": pos,
          "attention_segment_ids": att, "cls_positions": cls, "next_sentence_labels": nsl,
          "next_sentence_weights": nsw, "masked_lm_positions": mpos, "masked_lm_ids": mids, "masked_lm_weights": mw}


def row_predictions(data_config) -> int:
  """Masked positions per packed row: data.pack_row_predictions, 0 = max_predictions_per_seq + pack_max_per_row."""
  return data_config.pack_row_predictions or data_config.max_predictions_per_seq + data_config.pack_max_per_row


def dummy_row(row_length: int, row_predictions: int, max_per_row: int, batch: int) -> dict:
  """A zero batch of packed rows (shapes and dtypes for init and compile)."""
  row = pack_row([], row_length, row_predictions, max_per_row)
  return {k: np.stack([v] * batch) for k, v in row.items()}


def example_sizes(source) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.zeros(len(source), np.int32)
  preds = np.zeros(len(source), np.int32)
  for i in range(len(source)):
    ex = source[i]
    lengths[i] = int(np.sum(ex["input_mask"]))
    preds[i] = int(np.sum(np.asarray(ex["masked_lm_weights"]) > 0))
  return lengths, preds


class PackedSource:
  """Random access to packed rows of a source (the plan is computed once and cached beside the data)."""

  def __init__(self, source, row_length: int, row_predictions: int, max_per_row: int, cache: str | None = None):
    self.source, self.row_length = source, row_length
    self.row_predictions, self.max_per_row = row_predictions, max_per_row
    if cache and files.exists(cache):
      data = np.load(io.BytesIO(files.read_bytes(cache)))
      flat, starts = data["flat"], data["starts"]
      self.rows = [flat[starts[i]:starts[i + 1]].tolist() for i in range(len(starts) - 1)]
    else:
      lengths, preds = example_sizes(source)
      self.rows = plan(lengths, preds, row_length, row_predictions, max_per_row)
      if cache:
        flat = np.concatenate([np.asarray(r, np.int64) for r in self.rows]) if self.rows else np.zeros(0, np.int64)
        starts = np.cumsum([0] + [len(r) for r in self.rows])
        buf = io.BytesIO()
        np.savez(buf, flat=flat, starts=starts)
        files.write_whole(cache, buf.getvalue())  # (a remote cache: one upload)

  def __len__(self):
    return len(self.rows)

  def __getitem__(self, i):
    examples = [dict(self.source[j]) for j in self.rows[i]]
    return pack_row(examples, self.row_length, self.row_predictions, self.max_per_row)


def pack_features(feats: dict, row_length: int, max_per_row: int, example_keys=("labels",),
                  token_keys=()) -> tuple[dict, list[list[int]]]:
  """Packs fine-tuning features ([N, S] token arrays, [N] example arrays) into rows of `row_length`.

  Returns (packed features, the plan). Token arrays (`token_keys`, e.g. a tagger's labels and label_weights) are
  laid end to end like the input ids; example arrays (`example_keys`, e.g. a classifier's labels) become [R, K]
  slots read at each example's [CLS] (`cls_positions`), with `example_slot_weights` 1 for a filled slot, 0 for
  an empty one. Rows come in plan order; the caller shuffles rows, not examples.
  """
  mask = np.asarray(feats["input_mask"])
  lengths = mask.sum(axis=1).astype(np.int64)
  rows = plan(lengths, np.zeros_like(lengths), row_length, 0, max_per_row)
  r = len(rows)
  out = {k: np.zeros((r, row_length), np.int32) for k in
         ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids")}
  for k in token_keys:
    out[k] = np.zeros((r, row_length), feats[k].dtype)
  out["cls_positions"] = np.zeros((r, max_per_row), np.int32)
  out["example_slot_weights"] = np.zeros((r, max_per_row), np.float32)
  for k in example_keys:
    out[k] = np.zeros((r, max_per_row), feats[k].dtype)
  for i, members in enumerate(rows):
    t = 0
    for slot, j in enumerate(members):
      n = int(lengths[j])
      for k in ("input_ids", "segment_ids", *token_keys):
        out[k][i, t:t + n] = feats[k][j, :n]
      out["input_mask"][i, t:t + n] = 1
      out["position_ids"][i, t:t + n] = np.arange(n)
      out["attention_segment_ids"][i, t:t + n] = slot + 1
      out["cls_positions"][i, slot] = t
      out["example_slot_weights"][i, slot] = 1.0
      for k in example_keys:
        out[k][i, slot] = feats[k][j]
      t += n
  return out, rows


def pack_contrastive(feats: dict, row_length: int, max_per_row: int,
                     starts: bool = False) -> tuple[dict, list[list[int]]]:
  """Examples packed into rows of `row_length` tokens: an example's anchor and its K documents stay
  together (every text its own attention segment, positions restarting at 0), up to `max_per_row` examples
  a row, best-fit-decreasing by the example's total length (`packing.plan`), so every example fits a row.

  Per row: the token features; `text_segments` [k, 1 + K], each slot's texts' segment numbers (0: empty slot);
  `example_slot_weights` [k]; the slot's `query_keys`, `doc_keys` [k, K] and `labels`; with `starts`,
  `text_starts` [k, 1 + K], each text's first position. An `attend_mask` [N, L] in `feats` is the query's
  attention mask where it differs from its length (`input_mask`): its other positions are laid out, not attended."""
  q_ids, d_ids = np.asarray(feats["input_ids"]), np.asarray(feats["doc_input_ids"])
  n, n_docs, length = d_ids.shape
  t = 1 + n_docs
  ids = np.concatenate([q_ids[:, None], d_ids], axis=1)  # [N, T, L]
  lengths = np.concatenate([np.asarray(feats["input_mask"])[:, None], np.asarray(feats["doc_input_mask"])],
                           axis=1).sum(-1)
  rows = plan(lengths.sum(-1), np.zeros(n, np.int64), row_length, 0, max_per_row)
  r = len(rows)
  out = {name: np.zeros((r, row_length), np.int32) for name in
         ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids")}
  out["text_segments"] = np.zeros((r, max_per_row, t), np.int32)
  out["cls_positions"] = np.zeros((r, max_per_row), np.int32)
  out["example_slot_weights"] = np.zeros((r, max_per_row), np.float32)
  if starts:
    out["text_starts"] = np.zeros((r, max_per_row, t), np.int32)
  attend = feats.get("attend_mask")
  for name in ("query_keys", "doc_keys", "labels"):
    out[name] = np.zeros((r, max_per_row) + feats[name].shape[1:], feats[name].dtype)
  for i, members in enumerate(rows):
    pos = 0
    for slot, j in enumerate(members):
      out["cls_positions"][i, slot] = pos
      for x in range(t):
        m, seg = int(lengths[j, x]), slot * t + x + 1
        out["input_ids"][i, pos:pos + m] = ids[j, x, :m]
        out["input_mask"][i, pos:pos + m] = 1 if attend is None or x else attend[j, :m]
        if starts:
          out["text_starts"][i, slot, x] = pos
        out["position_ids"][i, pos:pos + m] = np.arange(m)
        out["attention_segment_ids"][i, pos:pos + m] = seg
        out["text_segments"][i, slot, x] = seg
        pos += m
      out["example_slot_weights"][i, slot] = 1.0
      for name in ("query_keys", "doc_keys", "labels"):
        out[name][i, slot] = feats[name][j]
  return out, rows
