"""Extractive QA (SQuAD v1.1 / v2.0 through tfds or SQuAD-format JSON): start and end scores per token over
windows of the context (doc_stride), the original's n-best answer search, the official exact match and F1."""
from __future__ import annotations

import numpy as np

from bertjax.core import losses, scores
from bertjax.data.tasks import squad
from bertjax.tasks.base import EvalSet, Kind, Task, example_mean

NAMES = ("squad/v1.1", "squad/v2.0", "squad_json")


def task(name, labels, regression, config) -> Task | None:
  """SQuAD v1.1 / v2.0 through tfds, or SQuAD-format JSON files (`squad_json`)."""
  del labels, regression, config
  return Task(name, "qa", metrics=("exact_match", "f1"), main_metric="f1") if name in NAMES else None


def _with_null_answers(task, examples) -> bool:
  """SQuAD v2.0 scoring: the v2.0 task, or a file with unanswerable questions."""
  return task.name == "squad/v2.0" or any(ex.is_impossible for ex in examples)


class SpanQA(Kind):
  name = "qa"
  hf_head = "question_answering"
  pack_keys = None  # SQuAD windows are already full (doc_stride)
  outputs = ("start_logits", "end_logits")

  def load(self, task, config, tok):
    d, stats = config.data, {}
    if task.name == "squad_json":
      train_ex = squad.json_examples(d.train_file)
      eval_ex = squad.json_examples(d.eval_file) if d.eval_file else []
    else:
      tfds_dir = d.tfds_data_dir or None
      train_ex = squad.tfds_examples(task.name, "train", tfds_dir)
      eval_ex = squad.tfds_examples(task.name, "validation", tfds_dir)
    kw = dict(max_seq_length=d.max_seq_length, doc_stride=d.doc_stride, max_query_length=d.max_query_length,
              stride_is_overlap=d.doc_stride_is_overlap)
    train, _ = squad.featurize(train_ex, tok, training=True, stats=stats, **kw)
    evals = []
    if eval_ex:
      feats, windows = squad.featurize(eval_ex, tok, training=False, **kw)
      evals.append(EvalSet("validation", feats, {"examples": eval_ex, "windows": windows}))
    return train, evals, stats

  def loss(self, task, out, batch):
    ce = (losses.cross_entropy(out["start_logits"], batch["start_positions"]) +
          losses.cross_entropy(out["end_logits"], batch["end_positions"])) / 2
    return example_mean(ce, batch["example_weights"])

  def score(self, task, ev, preds, config):
    examples, windows = ev.meta["examples"], ev.meta["windows"]
    answers = squad.best_answers(examples, windows, preds["start_logits"], preds["end_logits"],
                                 config.data.n_best, config.data.max_answer_length)
    golds = {ex.qid: [a for a, _ in ex.answers] if not ex.is_impossible else [] for ex in examples}
    ev.meta["answers"] = answers
    if _with_null_answers(task, examples):
      return squad.v2_scores(answers, golds, scores.squad_exact, scores.squad_f1)
    return scores.squad_scores({q: t for q, (t, _, _) in answers.items()}, golds)

  def prediction_files(self, task, ev):
    """What google-research/bert's run_squad.py and HF's run_qa.py write, for the official evaluation script:
    {qid: answer} (v2.0: "" where the null score beats the best span, threshold 0) and, for v2.0, {qid: null
    score - best span score} (its --na-prob-file)."""
    answers = ev.meta.get("answers")
    if answers is None:
      return {}
    if not _with_null_answers(task, ev.meta["examples"]):
      return {f"{ev.name}_predictions.json": {q: text for q, (text, _, _) in answers.items()}}
    return {f"{ev.name}_predictions.json": squad.apply_null_threshold(answers, 0.0),
            f"{ev.name}_null_odds.json": {q: float(null - s) for q, (_, s, null) in answers.items()}}

  def predict_settings(self, config):  # a long context is cut into the windows the run trained on
    d = config.data
    return {"doc_stride": d.doc_stride, "max_query_length": d.max_query_length,
            "doc_stride_is_overlap": d.doc_stride_is_overlap}

  def predict_text(self, task, module, params, tok, seq, question="", context="", doc_stride=128,
                   max_query_length=64, doc_stride_is_overlap=False, **_):
    ex = [squad.QAExample("q", question, context, [])]
    feats, windows = squad.featurize(ex, tok, max_seq_length=seq, doc_stride=doc_stride,
                                     max_query_length=max_query_length, training=False,
                                     stride_is_overlap=doc_stride_is_overlap)
    out = module.apply({"params": params}, feats)
    (answer, s, null), = squad.best_answers(ex, windows, np.asarray(out["start_logits"]),
                                            np.asarray(out["end_logits"])).values()
    return {"answer": answer, "score": s, "null_score": null}


KINDS = {"qa": SpanQA()}
