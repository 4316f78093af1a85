"""Token classification (NER) on CoNLL files: a linear head on every token, the label on each word's first
piece, entity-level span F1 as conlleval and seqeval score it."""
from __future__ import annotations

import numpy as np

from bertjax.core import losses, scores
from bertjax.data.tasks import conll
from bertjax.tasks.base import EvalSet, Kind, Task, example_mean

NAMES = ("ner",)


def task(name, labels, regression, config) -> Task | None:
  """`ner`: CoNLL files, the tag set declared in the config (IOB1, IOB2/BIO or IOBES tags)."""
  del regression, config
  if name != "ner":
    return None
  if not labels:
    raise conll.TaskDataError("task ner needs its tag set declared: --config.data.labels='(\"O\",\"B-PER\",\"I-PER\")'")
  for t in labels:
    try:
      scores.split_tag(t)
    except scores.TagSchemeError as e:
      raise conll.TaskDataError(f"config.data.labels: {e}") from None
  return Task(name, "tagging", labels=tuple(labels), metrics=("f1", "precision", "recall"), main_metric="f1")


class Tagging(Kind):
  name = "tagging"
  hf_head = "token_classification"
  # Labels are laid end to end in a packed row; the loss is per token, so no per-example slot weights.
  pack_keys: dict | None = dict(token_keys=("labels", "label_weights"), example_keys=())

  def load(self, task, config, tok):
    d, seq, stats = config.data, config.data.max_seq_length, {}
    sentences = conll.read(d.train_file)
    tags = {t for _, ts in sentences for t in ts}
    if len(tags) < 2:
      raise conll.TaskDataError(f"{d.train_file}: every word is tagged {tags.pop()!r}; a model learns nothing from "
                                "it")
    train, _ = conll.featurize(sentences, tok, task.labels, seq, stats)
    evals = []
    if d.eval_file:
      sentences = conll.read(d.eval_file)
      feats, word_at = conll.featurize(sentences, tok, task.labels, seq, stats)
      evals.append(EvalSet("validation", feats, {"sentences": sentences, "word_at": word_at}))
    return train, evals, stats

  def loss(self, task, out, batch):
    return example_mean(losses.cross_entropy(out["logits"], batch["labels"]), self.loss_weights(task, batch))

  def loss_weights(self, task, batch):
    del task
    return batch["label_weights"] * batch["example_weights"][:, None]

  def score(self, task, ev, preds, config):
    sentences = ev.meta["sentences"]
    tags = conll.decode(preds["logits"].argmax(-1), ev.meta["word_at"], sentences, task.labels)
    return scores.span_f1(tags, [t for _, t in sentences])

  def predict_text(self, task, module, params, tok, seq, text="", **_):
    words = text.split()
    sents = [(words, ["O"] * len(words))]
    feats, word_at = conll.featurize(sents, tok, task.labels or ("O",), seq)
    logits = np.asarray(module.apply({"params": params}, feats)["logits"])
    return {"tags": list(zip(words, conll.decode(logits.argmax(-1), word_at, sents, task.labels)[0]))}


KINDS = {"tagging": Tagging()}
