"""Inference on raw text, in one place: fill in the blank with a pre-trained workdir, or a fine-tuned workdir's
prediction by its task's kind (a label with probabilities, a value, per-word tags, an answer span).

  python -m bertjax predict --workdir DIR "the capital of france is [MASK] ." [--top_k 5]
  python -m bertjax predict --workdir FINETUNED "a sentence" [--pair "another"] [--question "..."]

Reads DIR/config.json (written by training), the workdir's tokenizer and its newest readable checkpoint (or, for
a fine-tuned workdir, its best parameters). DIR may be local or in an object store (gs://, s3://).
"""
from __future__ import annotations

import re

import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax import tasks as tasks_lib
from bertjax.convert import weights
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib

MASK = "[MASK]"


def encode_with_masks(tok: tokenizer_lib.Tokenizer, text: str, max_len: int):
  """[CLS] text [SEP] with every literal "[MASK]", or the tokenizer's own mask token ("<mask>" in RoBERTa's and
  XLM-R's vocabularies), as the mask token; returns (ids, mask positions)."""
  spellings = sorted({MASK, tok.id_to_token(tok.mask_id)}, key=len, reverse=True)
  parts = re.split("|".join(map(re.escape, spellings)), text)
  ids = [tok.cls_id]
  positions = []
  for i, part in enumerate(parts):
    ids += tok.encode(part)
    if i < len(parts) - 1:
      positions.append(len(ids))
      ids.append(tok.mask_id)
  ids.append(tok.sep_id)
  if not positions:
    raise errors.DataError(f"no {' or '.join(spellings)} in {text!r}")
  if len(ids) > max_len:
    raise errors.DataError(f"{len(ids)} tokens, over the model's {max_len}")
  return ids, positions


def fill_mask(module, params, tok, text: str, top_k: int = 5, max_len: int = 512):
  """[(position, [(token, probability), ...]), ...] for each [MASK] in text."""
  ids, positions = encode_with_masks(tok, text, max_len)
  n = len(ids)
  batch = {"input_ids": np.array([ids], np.int32), "input_mask": np.ones((1, n), np.int32),
           "segment_ids": np.zeros((1, n), np.int32), "masked_lm_positions": np.array([positions], np.int32)}
  logits = module.apply({"params": params}, batch)["mlm_logits"][0]
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  out = []
  for j, pos in enumerate(positions):
    top = np.argsort(-probs[j])[:top_k]
    out.append((pos, [(tok.id_to_token(int(i)), float(probs[j, i])) for i in top]))
  return out


def load(workdir: str):
  """(module, params, tokenizer) from a pre-training workdir (its latest checkpoint)."""
  files.reach(workdir)
  if not files.isfile(files.join(workdir, "config.json")):
    raise FileNotFoundError(f"{workdir}: no config.json; is it a bertjax training workdir?")
  w = weights.load(workdir)
  if not w.tokenizer:
    raise errors.DataError(f"{workdir}: the tokenizer of its data ({w.meta['data']['data_dir']}) cannot be read")
  if "mlm_bias" not in w.params:
    raise errors.ConfigError(f"{workdir}: no MLM head (an encoder, classifier or embedding model); predict fills "
                             "[MASK] with a pre-training workdir or an HF *ForMaskedLM / *ForPreTraining folder")
  cfg = w.cfg if "nsp" in w.params else w.cfg.replace(nsp_head=False)  # an HF *ForMaskedLM folder has no NSP head
  return model_lib.BertForPreTraining(cfg), w.params, tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)


def load_finetuned(workdir: str):
  """(finetune.json, task, module, best params, tokenizer) of a fine-tuned workdir."""
  w = weights.load(workdir)
  meta = w.meta
  task = tasks_lib.Task(meta["task"], meta["kind"], labels=tuple(meta["labels"]),
                        options=tuple(meta.get("task_options", {}).items()))
  tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
  return meta, task, tasks_lib.kind(task).head(task, w.cfg), w.params, tok


def predict_text(workdir: str, text: str = "", pair: str = "", question: str = "", context: str = ""):
  """A label (with probabilities), a value, per-word tags, or an answer span, by the task's kind."""
  meta, task, module, params, tok = load_finetuned(workdir)
  return tasks_lib.kind(task).predict_text(task, module, params, tok, meta["max_seq_length"], text=text, pair=pair,
                                           question=question, context=context, **meta.get("predict_settings", {}))
