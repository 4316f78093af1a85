"""The folder zoo's cases and how each bertjax tool is run on a folder (`tests/test_folder_zoo.py`): each returns
the arrays to compare with the writing library's own (NAME.expected.npz)."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from bertjax import convert, model
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings.dense import encoder
from bertjax.embeddings.multivector import encoder as multivector
from bertjax.embeddings.rerank import encoder as rerank
from bertjax.embeddings.sparse import encoder as sparse
from bertjax.model.config import ACTIVATIONS

ZOO = pathlib.Path(__file__).parent / "data" / "zoo"
HEADS = {"ForSequenceClassification": "sequence_classification", "ForTokenClassification": "token_classification",
         "ForQuestionAnswering": "question_answering"}


def cases() -> list[tuple[str, dict]]:
  out = []
  for meta in sorted(ZOO.glob("*/*.zoo.json")):
    name = meta.name[:-len(".zoo.json")]
    out.append((f"{meta.parent.name}/{name}", json.loads(meta.read_text())))
  return out


def folder(case: str) -> str:
  return str(ZOO / case)


def expected(case: str) -> dict:
  with np.load(str(ZOO / case) + ".expected.npz") as z:
    return {k: z[k] for k in z.files}


def batch(exp: dict) -> dict:
  ids = exp["input_ids"].astype(np.int32)
  return {"input_ids": ids, "input_mask": exp["attention_mask"].astype(np.int32), "segment_ids": np.zeros_like(ids)}


def hf_forward(path: str, meta: dict, exp: dict) -> dict:
  """`convert.from_hf` and bertjax's forward of the folder's head: the arrays HF's model gave (out_*)."""
  cfg, params = convert.from_hf(path)
  b = batch(exp)
  head = meta["architecture"].split("For", 1)
  head = "For" + head[1] if len(head) == 2 else "Model"
  if head == "Model":
    bert = params.get("bert", params)
    hidden = model.BertModel(cfg).apply({"params": bert}, b, deterministic=True, pool=False)["hidden"]
    return {"out_last_hidden_state": np.asarray(hidden)}
  if head in HEADS:
    n = 2 if head == "ForQuestionAnswering" else 3
    module = model.for_task(cfg, HEADS[head], n)
    if cfg.classifier_head == "pooler" and "pooler" not in params["bert"]:
      # HF's token-classification and QA models have no pooler and do not use one; bertjax's module still asks
      # for its parameters, so they are NaN: an output that reads them is NaN and fails, and a pooled head
      # without a pooler is refused rather than compared with an invented one.
      assert head != "ForSequenceClassification", f"{path}: from_hf gave no pooler for a pooled classifier"
      import jax
      shapes = jax.eval_shape(module.init, jax.random.key(0), b)["params"]["bert"]["pooler"]
      nan = jax.tree_util.tree_map(lambda x: np.full(x.shape, np.nan, x.dtype), shapes)
      params = {**params, "bert": {**params["bert"], "pooler": nan}}
    out = module.apply({"params": params}, b)
    if head == "ForQuestionAnswering":
      return {"out_start_logits": np.asarray(out["start_logits"]), "out_end_logits": np.asarray(out["end_logits"])}
    return {"out_logits": np.asarray(out["logits"])}
  if "head_out" in params:  # ELECTRA's discriminator
    hidden = model.BertModel(cfg).apply({"params": params["bert"]}, b, deterministic=True, pool=False)["hidden"]
    h = ACTIVATIONS[cfg.hidden_act](hidden @ params["head_dense"]["kernel"] + params["head_dense"]["bias"])
    return {"out_logits": np.asarray(h @ params["head_out"]["kernel"] + params["head_out"]["bias"])[..., 0]}
  if "nsp" not in params:
    cfg = cfg.replace(nsp_head=False)
  positions = np.tile(np.arange(b["input_ids"].shape[1], dtype=np.int32), (b["input_ids"].shape[0], 1))
  out = model.for_pretraining(cfg).apply({"params": params}, {**b, "masked_lm_positions": positions},
                                          deterministic=True)
  key = "out_prediction_logits" if "out_prediction_logits" in exp else "out_logits"
  got = {key: np.asarray(out["mlm_logits"])}
  if "nsp_logits" in out and "out_seq_relationship_logits" in exp:
    got["out_seq_relationship_logits"] = np.asarray(out["nsp_logits"])
  return got


def hf_token_ids(path: str, texts) -> list[list[int]]:
  """bertjax's ids of each text as the HF tokenizer lays out one text: [CLS] pieces [SEP]."""
  tok_path, lower = convert.files.hf_tokenizer(path)
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  return [[tok.cls_id, *tok.encode(t), tok.sep_id] for t in texts]


def embed(path: str, meta: dict, texts, pairs, want=()) -> dict:
  """The folder through its bertjax embeddings reader: the arrays its writing library gave."""
  kind = meta["kind"]
  if kind == "st-dense":
    enc = encoder.Encoder.load(path)
    out = {"encode": enc.encode(texts)}
    if "encode_query" in want:
      out["encode_query"] = enc.encode(texts, prompt=_prompt(path, "query"))
      out["encode_document"] = enc.encode(texts, prompt=_prompt(path, "document"))
    return out
  if kind == "st-sparse":
    enc = sparse.SparseEncoder.load(path)
    return {"encode_query": enc.encode_query(texts), "encode_document": enc.encode_document(texts)}
  if kind == "st-cross":
    return {"predict": rerank.CrossEncoder.load(path).predict(pairs)}
  enc = multivector.MultiVectorEncoder.load(path)
  q, d = enc.encode(texts, task="query"), enc.encode(texts, task="document")
  return {**{f"q_{i}": v for i, v in enumerate(q)}, **{f"d_{i}": v for i, v in enumerate(d)},
          "maxsim": np.asarray(enc.score(q, d))}


def _prompt(path: str, name: str) -> str:
  conf = json.loads((pathlib.Path(path) / "config_sentence_transformers.json").read_text())
  return conf["prompts"][name]
