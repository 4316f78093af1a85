"""Task metrics exactly as the benchmarks define them (NumPy only, host side).

GLUE: accuracy; F1 of the positive class (MRPC, QQP); Matthews correlation (CoLA); Pearson and Spearman
(STS-B). SQuAD: the official v1.1/v2.0 answer normalisation, exact match and token F1 (max over gold answers).
NER: entity-level span F1 with conlleval/seqeval semantics over BIO (IOB2) tags.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Sequence

import numpy as np

from bertjax import errors


def unit_rows(x) -> np.ndarray:
  """Each row divided by its L2 norm (a zero row stays zero)."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def paired_cosine(a, b) -> np.ndarray:
  """Cosine similarity of row i of `a` with row i of `b`."""
  return np.sum(unit_rows(a) * unit_rows(b), axis=-1)


def accuracy(pred, gold) -> float:
  pred, gold = np.asarray(pred), np.asarray(gold)
  return float(np.mean(pred == gold)) if len(gold) else 0.0


def f1_binary(pred, gold, positive=1) -> float:
  pred, gold = np.asarray(pred) == positive, np.asarray(gold) == positive
  tp = np.sum(pred & gold)
  p = tp / max(np.sum(pred), 1)
  r = tp / max(np.sum(gold), 1)
  return float(2 * p * r / (p + r)) if p + r else 0.0


def matthews_corrcoef(pred, gold) -> float:
  """Binary MCC = (tp·tn - fp·fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); 0 when a margin is empty."""
  pred, gold = np.asarray(pred).astype(bool), np.asarray(gold).astype(bool)
  tp, tn = float(np.sum(pred & gold)), float(np.sum(~pred & ~gold))
  fp, fn = float(np.sum(pred & ~gold)), float(np.sum(~pred & gold))
  den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return float((tp * tn - fp * fn) / den) if den else 0.0


def pearson(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  xc, yc = x - x.mean(), y - y.mean()
  den = np.sqrt(np.sum(xc * xc) * np.sum(yc * yc))
  return float(np.sum(xc * yc) / den) if den else 0.0


def _rank(x) -> np.ndarray:
  """Ranks 1..n with ties given their average rank (as scipy.stats.rankdata)."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="mergesort")
  ranks = np.empty(len(x), np.float64)
  sorted_x = x[order]
  i = 0
  while i < len(x):
    j = i
    while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
    i = j + 1
  return ranks


def spearman(x, y) -> float:
  return pearson(_rank(x), _rank(y))


# ----------------------------------------------------------------------------- SQuAD (official script semantics)
def normalize_answer(s: str) -> str:
  """Lower case, drop punctuation, drop articles (a, an, the), squeeze whitespace."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def squad_exact(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
  p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if not p or not g:  # v2.0: an empty answer scores 1 only against an empty gold
    return float(p == g)
  common = collections.Counter(p) & collections.Counter(g)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(p), same / len(g)
  return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict[str, str], golds: dict[str, Sequence[str]]) -> dict:
  """{"exact_match", "f1"} in percent over every gold id (a missing prediction scores 0); [] gold = unanswerable."""
  em = f1 = 0.0
  for qid, answers in golds.items():
    answers = [a for a in answers if normalize_answer(a)] or [""]
    pred = predictions.get(qid)
    if pred is None:
      continue
    em += max(squad_exact(pred, a) for a in answers)
    f1 += max(squad_f1(pred, a) for a in answers)
  n = max(len(golds), 1)
  return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


# ----------------------------------------------------------------------------- NER (seqeval default mode)
TAG_PREFIXES = ("B", "I", "E", "S")  # IOB1, IOB2 (BIO) and IOBES; O outside


class TagSchemeError(errors.ConfigError):
  """A tag outside IOB1 / IOB2 / IOBES (e.g. BILOU's U- and L-, or a bare type): named, never mis-scored."""


def split_tag(tag: str) -> tuple[str, str]:
  """("B", "PER") from "B-PER"; ("O", "") from "O"; refuses what the scorer does not understand."""
  if tag == "O":
    return "O", ""
  prefix, sep, kind = tag.partition("-")
  if not sep or prefix not in TAG_PREFIXES or not kind:
    raise TagSchemeError(f"tag {tag!r} is not O or {'/'.join(TAG_PREFIXES)}-TYPE: the span scorer reads IOB1, "
                         "IOB2 (BIO) and IOBES tags")
  return prefix, kind


def _ends(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
  """conlleval's endOfChunk: the chunk before this tag ends here."""
  return (prev in ("E", "S") or (prev in ("B", "I") and tag in ("B", "S", "O"))
          or (prev != "O" and prev_kind != kind))


def _starts(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
  """conlleval's startOfChunk: a chunk starts at this tag."""
  return (tag in ("B", "S") or (prev in ("E", "S", "O") and tag in ("E", "I"))
          or (tag != "O" and prev_kind != kind))


def bio_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """(type, start, end) chunks as conlleval and seqeval's default mode read IOB1, IOB2 and IOBES: B-/S- start a
  chunk, E-/S- end one, I- continues a chunk of its type or starts one after O, E-, S- or another type."""
  spans, start = set(), None
  prev, prev_kind = "O", ""
  for i, tag in enumerate(list(tags) + ["O"]):
    cur, kind = split_tag(tag)
    if start is not None and _ends(prev, cur, prev_kind, kind):
      spans.add((prev_kind, start, i - 1))
      start = None
    if _starts(prev, cur, prev_kind, kind):
      start = i
    prev, prev_kind = cur, kind
  return spans


def span_f1(pred_sequences: Sequence[Sequence[str]], gold_sequences: Sequence[Sequence[str]]) -> dict:
  tp = n_pred = n_gold = 0
  for p, g in zip(pred_sequences, gold_sequences):
    ps, gs = bio_spans(p), bio_spans(g)
    tp += len(ps & gs)
    n_pred += len(ps)
    n_gold += len(gs)
  precision = tp / n_pred if n_pred else 0.0
  recall = tp / n_gold if n_gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}
