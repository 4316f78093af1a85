"""Sentence (pair) classification and regression: GLUE through tfds and users' CSV/TSV/JSONL files; the
pooled [CLS] state feeds a linear head; cross-entropy (or squared error for regression)."""
from __future__ import annotations

import numpy as np

from bertjax import losses, scores
from bertjax.data import task_data
from bertjax.tasks.base import EvalSet, Kind, example_mean


class Classification(Kind):
  name = "classification"
  hf_head = "sequence_classification"
  pack_keys: dict | None = {}

  def __init__(self, regression: bool = False):
    self.regression = regression
    self.name = "regression" if regression else "classification"

  def load(self, task, config, tok):
    d, seq = config.data, config.data.max_seq_length
    if task.name.startswith("glue/"):
      tfds_dir = d.tfds_data_dir or None
      train = task_data.encode_pairs(task_data.glue_examples(task, task.train_split, tfds_dir), tok, seq,
                                     self.regression)
      evals = [EvalSet(s, task_data.encode_pairs(task_data.glue_examples(task, s, tfds_dir), tok, seq,
                                                 self.regression)) for s in task.eval_splits]
      return train, evals, {}

    def read(p):
      return task_data.local_examples(p, task, d.text_a_column, d.text_b_column, d.label_column)
    train = task_data.encode_pairs(read(d.train_file), tok, seq, self.regression)
    evals = [EvalSet("validation", task_data.encode_pairs(read(d.eval_file), tok, seq, self.regression))] \
        if d.eval_file else []
    return train, evals, {}

  def loss(self, task, out, batch):
    w = batch["example_weights"]
    if self.regression:
      return example_mean((out["logits"][..., 0] - batch["labels"]) ** 2, w)
    return example_mean(losses.cross_entropy(out["logits"], batch["labels"]), w)

  def score(self, task, ev, preds, config):
    g = ev.feats["labels"]
    if self.regression:
      p = preds["logits"][:, 0]
      return {"pearson": scores.pearson(p, g), "spearman": scores.spearman(p, g)}
    p = preds["logits"].argmax(-1)
    fns = {"accuracy": scores.accuracy, "f1": scores.f1_binary, "mcc": scores.matthews_corrcoef}
    return {m: fns[m](p, g) for m in task.metrics}

  def predict_text(self, task, module, params, tok, seq, text="", pair="", **_):
    feats = task_data.encode_pairs([{"text_a": text, "text_b": pair, "label": 0}], tok, seq, self.regression)
    logits = np.asarray(module.apply({"params": params}, feats)["logits"][0])
    if self.regression:
      return {"value": float(logits[0])}
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    return {"label": task.labels[int(probs.argmax())],
            "probabilities": dict(zip(task.labels, probs.round(4).tolist()))}
