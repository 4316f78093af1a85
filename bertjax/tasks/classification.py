"""Sentence (pair) classification and regression: GLUE through tfds and users' CSV/TSV/JSONL files; the
pooled [CLS] state feeds a linear head; cross-entropy (or squared error for regression)."""
from __future__ import annotations

import numpy as np

from bertjax.core import losses, scores
from bertjax.data.tasks import rows as task_data
from bertjax.tasks.base import EvalSet, Kind, Task, example_mean

GLUE = {
    "cola": Task("glue/cola", "classification", ("sentence",), ("unacceptable", "acceptable"), ("mcc", "accuracy"),
                 "mcc"),
    "sst2": Task("glue/sst2", "classification", ("sentence",), ("negative", "positive")),
    "mrpc": Task("glue/mrpc", "classification", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
                 ("f1", "accuracy"), "f1"),
    "qqp": Task("glue/qqp", "classification", ("question1", "question2"), ("not_duplicate", "duplicate"),
                ("f1", "accuracy"), "f1"),
    "stsb": Task("glue/stsb", "regression", ("sentence1", "sentence2"), (), ("pearson", "spearman"), "pearson"),
    "mnli": Task("glue/mnli", "classification", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
                 eval_splits=("validation_matched", "validation_mismatched")),
    "qnli": Task("glue/qnli", "classification", ("question", "sentence"), ("entailment", "not_entailment")),
    "rte": Task("glue/rte", "classification", ("sentence1", "sentence2"), ("entailment", "not_entailment")),
    "wnli": Task("glue/wnli", "classification", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
}
NAMES = tuple(f"glue/{k}" for k in GLUE) + ("local",)


def task(name, labels, regression, config) -> Task | None:
  """GLUE's tasks by name (through tfds); `local`: sentence (pair) classification, or regression with
  `regression`, from the config's files and declared labels."""
  del config
  if name.startswith("glue/") and name[5:] in GLUE:
    return GLUE[name[5:]]
  if name != "local":
    return None
  if regression:
    return Task(name, "regression", ("text_a", "text_b"), (), ("pearson", "spearman"), "pearson")
  if not labels:
    raise task_data.TaskDataError("task local needs its label set declared: --config.data.labels='(\"neg\",\"pos\")' "
                                  "(or --config.data.regression=True for scores)")
  metrics = ("accuracy", "f1") if len(labels) == 2 else ("accuracy",)
  return Task(name, "classification", ("text_a", "text_b"), tuple(labels), metrics)


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

    columns = (d.text_a_column, d.text_b_column, d.label_column)

    def read(p):
      return task_data.local_examples(p, task, *columns)
    train = task_data.pair_features(d.train_file, task, columns, tok, seq, self.regression)
    labels = train["labels"] if isinstance(train, dict) else train.labels
    if len(np.unique(labels)) < 2:
      raise task_data.TaskDataError(f"{d.train_file}: every row has the {'score' if self.regression else 'label'} "
                                    f"{labels[0]!r}; a model learns nothing from it")
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


KINDS = {"classification": Classification(), "regression": Classification(regression=True)}
