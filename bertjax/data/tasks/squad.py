"""Extractive QA (SQuAD v1.1 / v2.0): reading, sliding windows, and span post-processing, as run_squad.py does.

Windows: `[CLS] question [SEP] context-window [SEP]`, the question cut to `max_query_length` tokens, windows of
the context `doc_stride` apart (run_squad.py), or, with `stride_is_overlap`, overlapping by `doc_stride` tokens
as HF tokenizers' `stride` and run_qa.py have them (fewer windows on long contexts). A token is scored only in
the window where it has the most context on both sides.
Spans map back to the original context through the tokenizer's character offsets.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os

import numpy as np

from bertjax.core import files
from bertjax.data.tasks.rows import TaskDataError, _text, tfds_source


@dataclasses.dataclass
class QAExample:
  qid: str
  question: str
  context: str
  answers: list[tuple[str, int]]  # (text, character start) in the context; [] when unanswerable
  is_impossible: bool = False


def tfds_examples(name: str, split: str, data_dir: str | None = None) -> list[QAExample]:
  import tensorflow_datasets.question_answering  # noqa: F401  (registers squad)
  src = tfds_source(name, split, data_dir)
  out = []
  for i in range(len(src)):
    ex = src[i]
    answers = ex["answers"]
    texts = [_text(t) for t in answers["text"]]
    starts = [int(s) for s in answers["answer_start"]]
    out.append(QAExample(_text(ex["id"]), _text(ex["question"]), _text(ex["context"]), list(zip(texts, starts)),
                         bool(ex.get("is_impossible", False))))
  return out


def json_examples(path: str) -> list[QAExample]:
  """SQuAD-format JSON: {"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers", ...}]}]}]}."""
  path = os.fspath(path)
  files.reach(path)
  if not files.isfile(path):
    raise TaskDataError(f"{path}: file not found")
  try:
    data = json.loads(files.utf8_text(path, TaskDataError))["data"]
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise TaskDataError(f"{path}: not SQuAD-format JSON ({type(e).__name__}: {e})") from None
  out = []
  for article in data:
    for para in article.get("paragraphs", []):
      context = para["context"]
      for qa in para.get("qas", []):
        answers = [(a["text"], int(a["answer_start"])) for a in qa.get("answers", [])]
        out.append(QAExample(str(qa["id"]), qa["question"], context, answers, bool(qa.get("is_impossible", False))))
  return out


@dataclasses.dataclass
class Window:
  example: int  # index into the examples
  offsets: list[tuple[int, int]]  # per input position: character span in the context ((-1, -1) outside it)
  max_context: list[bool]  # per input position: this window is the token's best


def featurize(examples, tok, max_seq_length=384, doc_stride=128, max_query_length=64, training=False,
              stats: dict | None = None, stride_is_overlap: bool = False):
  """(features dict of arrays, windows). Training targets are (0, 0) when the answer is not inside a window.

  A training answer whose text is not at its `answer_start` in the context is skipped and counted in
  stats["answer_not_found"].
  """
  stats = stats if stats is not None else {}
  stats.setdefault("answer_not_found", 0)
  rows = collections.defaultdict(list)
  windows = []
  for ei, ex in enumerate(examples):
    q = tok.encode(ex.question)[:max_query_length]
    doc_ids, doc_off = tok.encode_with_offsets(ex.context)
    answer = None
    if training and ex.answers and not ex.is_impossible:
      text, start = ex.answers[0]
      if ex.context[start:start + len(text)] != text:
        found = ex.context.find(text)
        if found < 0 or not text.strip():
          stats["answer_not_found"] += 1
          continue
        start = found
      end = start + len(text)
      toks = [i for i, (a, b) in enumerate(doc_off) if b > start and a < end]
      if not toks:
        stats["answer_not_found"] += 1
        continue
      answer = (toks[0], toks[-1])
    room = max_seq_length - len(q) - 3
    if room < 1:
      raise TaskDataError(f"max_seq_length {max_seq_length} leaves no room for the context after a "
                          f"{len(q)}-token question")
    if stride_is_overlap and doc_stride >= room:
      raise TaskDataError(f"doc_stride {doc_stride} (an overlap) must be less than the {room} context tokens a "
                          f"window holds after a {len(q)}-token question")
    spans, s = [], 0
    while True:
      length = min(len(doc_ids) - s, room)
      spans.append((s, length))
      if s + length >= len(doc_ids):
        break
      s += length - doc_stride if stride_is_overlap else min(length, doc_stride)
    for start, length in spans:
      ids = [tok.cls_id] + q + [tok.sep_id] + doc_ids[start:start + length] + [tok.sep_id]
      offsets = [(-1, -1)] * (len(q) + 2) + doc_off[start:start + length] + [(-1, -1)]
      best = ([False] * (len(q) + 2) + [_is_max_context(spans, (start, length), start + j) for j in range(length)]
              + [False])
      n = len(ids)
      pad = max_seq_length - n
      rows["input_ids"].append(ids + [0] * pad)
      rows["input_mask"].append([1] * n + [0] * pad)
      rows["segment_ids"].append([0] * (len(q) + 2) + [1] * (length + 1) + [0] * pad)
      sp = ep = 0
      if answer is not None and start <= answer[0] and answer[1] < start + length:
        sp, ep = answer[0] - start + len(q) + 2, answer[1] - start + len(q) + 2
      rows["start_positions"].append(sp)
      rows["end_positions"].append(ep)
      windows.append(Window(ei, offsets + [(-1, -1)] * pad, best + [False] * pad))
  feats = {k: np.asarray(v, np.int32) for k, v in rows.items()}
  if not feats:
    feats = {k: np.zeros((0, max_seq_length) if k.startswith("input") or k == "segment_ids" else (0,), np.int32)
             for k in ("input_ids", "input_mask", "segment_ids", "start_positions", "end_positions")}
  return feats, windows


def _is_max_context(spans, current, position) -> bool:
  best_score, best = None, None
  for i, (start, length) in enumerate(spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best = score, i
  return spans[best] == current


def best_answers(examples, windows, start_logits, end_logits, n_best=20, max_answer_length=30):
  """{qid: (text, score, null_score)}: the best valid span over all of an example's windows."""
  by_example = collections.defaultdict(list)
  for wi, w in enumerate(windows):
    by_example[w.example].append(wi)
  out = {}
  for ei, ex in enumerate(examples):
    best_text, best_score, null = "", -np.inf, np.inf
    for wi in by_example.get(ei, []):
      s, e, w = start_logits[wi], end_logits[wi], windows[wi]
      null = min(null, float(s[0] + e[0]))
      starts = np.argsort(-s)[:n_best]
      ends = np.argsort(-e)[:n_best]
      for i in starts:
        for j in ends:
          if w.offsets[i][0] < 0 or w.offsets[j][0] < 0 or j < i or j - i + 1 > max_answer_length:
            continue
          if not w.max_context[i]:
            continue
          score = float(s[i] + e[j])
          if score > best_score:
            best_score, best_text = score, ex.context[w.offsets[i][0]:w.offsets[j][1]].strip()
    out[ex.qid] = (best_text, best_score, null)
  return out


def apply_null_threshold(answers: dict, threshold: float) -> dict[str, str]:
  """v2.0: predict no answer ("") when null_score - best_span_score > threshold."""
  return {q: ("" if null - score > threshold else text) for q, (text, score, null) in answers.items()}


def best_threshold(answers: dict, golds: dict, score_one) -> tuple[float, float]:
  """The null threshold maximising the mean of `score_one(prediction, gold_answers)` on dev (the official sweep).

  Sorted by null_score - span_score, each question flips from "" to its span as the threshold passes its
  difference; the running total is updated in O(1) per flip. Returns (threshold, best mean score).
  """
  items = []
  total = 0.0
  for q, gold in golds.items():
    text, score, null = answers.get(q, ("", -np.inf, np.inf))
    s_null, s_text = score_one("", gold), score_one(text, gold)
    total += s_null
    diff = null - score
    if np.isfinite(diff):
      items.append((diff, s_text - s_null))
  items.sort()
  best_total, best_t = total, -np.inf
  for diff, gain in items:
    total += gain
    if total > best_total:
      best_total, best_t = total, diff
  return float(best_t), best_total / max(len(golds), 1)


def v2_scores(answers: dict, golds: dict, exact_fn, f1_fn) -> dict:
  """SQuAD v2.0 scores as the official evaluation script reports them.

  exact / f1: the predictions at null threshold 0 ("" where null_score > best span score), as HF's run_qa
  writes them; HasAns_* / NoAns_*: the same over answerable / unanswerable questions; best_exact / best_f1 and
  their thresholds: the script's sweep over no-answer scores (null_score − best span score), each metric on its
  own, flipping questions from "" to the threshold-0 prediction in increasing order of that score."""
  preds = apply_null_threshold(answers, 0.0)
  na_prob = {q: (answers[q][2] - answers[q][1]) if q in answers else np.inf for q in golds}
  has_ans = {q: bool(g) for q, g in golds.items()}
  out = {}
  for name, fn in (("exact", exact_fn), ("f1", f1_fn)):
    raw = {q: max(fn(preds.get(q, ""), a) for a in (g or [""])) for q, g in golds.items()}
    out[name] = 100.0 * sum(raw.values()) / max(len(raw), 1)
    for part, want in (("HasAns", True), ("NoAns", False)):
      qs = [q for q in raw if has_ans[q] == want]
      if qs:
        out[f"{part}_{name}"] = 100.0 * sum(raw[q] for q in qs) / len(qs)
    score = sum(1 for q in golds if not has_ans[q])  # every question answered ""
    best, best_thresh = score, 0.0
    for q in sorted(golds, key=lambda k: na_prob[k]):
      score += raw[q] if has_ans[q] else (-1 if preds.get(q, "") else 0)
      if score > best:
        best, best_thresh = score, na_prob[q]
    out[f"best_{name}"] = 100.0 * best / max(len(golds), 1)
    out[f"best_{name}_thresh"] = float(best_thresh)
  return out
