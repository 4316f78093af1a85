"""Token classification (NER) on CoNLL files: a linear head on every token, the label on each word's first
piece, entity-level span F1 as conlleval and seqeval score it."""
from __future__ import annotations

import numpy as np

from bertjax import losses, scores
from bertjax.data import conll
from bertjax.tasks.base import EvalSet, Kind, example_mean


class Tagging(Kind):
  name = "tagging"
  hf_head = "token_classification"
  # Labels are laid end to end in a packed row; the loss is per token, so no per-example slot weights.
  pack_keys: dict | None = dict(token_keys=("labels", "label_weights"), example_keys=())

  def load(self, task, config, tok):
    d, seq, stats = config.data, config.data.max_seq_length, {}
    train, _ = conll.featurize(conll.read(d.train_file), tok, task.labels, seq, stats)
    evals = []
    if d.eval_file:
      sentences = conll.read(d.eval_file)
      feats, word_at = conll.featurize(sentences, tok, task.labels, seq, stats)
      evals.append(EvalSet("validation", feats, {"sentences": sentences, "word_at": word_at}))
    return train, evals, stats

  def loss(self, task, out, batch):
    return example_mean(losses.cross_entropy(out["logits"], batch["labels"]),
                         batch["label_weights"] * batch["example_weights"][:, None])

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
