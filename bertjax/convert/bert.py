"""BERT (HF model type `bert`) and the original google-research/bert checkpoint names.

`NAME_TABLE(cfg)` lists, for every bertjax parameter, its HF state-dict name, its original TF variable name and
the layout change between them; `from_tf_variables` reads the original's variables with it (any TF-checkpoint
reader). The fine-tuning heads are HF's `BertFor{SequenceClassification,TokenClassification,QuestionAnswering}`:
the tanh pooler then the classifier; HF builds no pooler for the token and span heads.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from bertjax import model as model_lib
from bertjax.convert import table
from bertjax.convert.table import ConversionError

# The original run_classifier / run_squad keep their output weights as [out, in].
_TF_HEAD_NAMES = {"classifier": ("output_weights", "output_bias"),
                  "qa_outputs": ("cls/squad/output_weights", "cls/squad/output_bias")}


def _layer_entries(i: int):
  """(bertjax path inside a layer, HF suffix, TF suffix, layout) for encoder layer i."""
  hf, tf = f"encoder.layer.{i}.", f"encoder/layer_{i}/"
  rows = []
  for n in ("query", "key", "value"):
    rows += [(("attention", n, "kernel"), f"{hf}attention.self.{n}.weight", f"{tf}attention/self/{n}/kernel", "qkv"),
             (("attention", n, "bias"), f"{hf}attention.self.{n}.bias", f"{tf}attention/self/{n}/bias", "qkv_bias")]
  rows += [
      (("attention", "out", "kernel"), f"{hf}attention.output.dense.weight", f"{tf}attention/output/dense/kernel", "attn_out"),
      (("attention", "out", "bias"), f"{hf}attention.output.dense.bias", f"{tf}attention/output/dense/bias", "copy"),
      (("attention_ln", "scale"), f"{hf}attention.output.LayerNorm.weight", f"{tf}attention/output/LayerNorm/gamma", "copy"),
      (("attention_ln", "bias"), f"{hf}attention.output.LayerNorm.bias", f"{tf}attention/output/LayerNorm/beta", "copy"),
      (("mlp", "wi", "kernel"), f"{hf}intermediate.dense.weight", f"{tf}intermediate/dense/kernel", "dense"),
      (("mlp", "wi", "bias"), f"{hf}intermediate.dense.bias", f"{tf}intermediate/dense/bias", "copy"),
      (("mlp", "wo", "kernel"), f"{hf}output.dense.weight", f"{tf}output/dense/kernel", "dense"),
      (("mlp", "wo", "bias"), f"{hf}output.dense.bias", f"{tf}output/dense/bias", "copy"),
      (("mlp_ln", "scale"), f"{hf}output.LayerNorm.weight", f"{tf}output/LayerNorm/gamma", "copy"),
      (("mlp_ln", "bias"), f"{hf}output.LayerNorm.bias", f"{tf}output/LayerNorm/beta", "copy"),
  ]
  return rows


def NAME_TABLE(cfg: model_lib.BertConfig, pretraining: bool = True):  # noqa: N802 (a table)
  """Rows (bertjax path, HF name, original TF name, layout) with per-layer paths (`encoder/layer_i/...`).

  Encoder rows are relative to the encoder (HF names without "bert.", TF names without "bert/").
  With `pretraining=True` the heads follow with their full names.
  """
  if cfg.position_embedding != "learned" or cfg.layer_norm != "post":
    raise ConversionError("HF/TF BERT checkpoints have learned positions and post-LayerNorm; this config has "
                          f"position_embedding={cfg.position_embedding!r}, layer_norm={cfg.layer_norm!r}")
  rows = [
      (("embeddings", "word_embeddings", "embedding"), "embeddings.word_embeddings.weight", "embeddings/word_embeddings", "copy"),
      (("embeddings", "token_type_embeddings", "embedding"), "embeddings.token_type_embeddings.weight", "embeddings/token_type_embeddings", "copy"),
      (("embeddings", "position_embeddings", "embedding"), "embeddings.position_embeddings.weight", "embeddings/position_embeddings", "copy"),
      (("embeddings", "ln", "scale"), "embeddings.LayerNorm.weight", "embeddings/LayerNorm/gamma", "copy"),
      (("embeddings", "ln", "bias"), "embeddings.LayerNorm.bias", "embeddings/LayerNorm/beta", "copy"),
  ]
  for i in range(cfg.num_layers):
    rows += [(("encoder", f"layer_{i}") + p, hf, tf, kind) for p, hf, tf, kind in _layer_entries(i)]
  rows += [(("pooler", "kernel"), "pooler.dense.weight", "pooler/dense/kernel", "dense"),
           (("pooler", "bias"), "pooler.dense.bias", "pooler/dense/bias", "copy")]
  if not pretraining:
    return rows
  rows = [(("bert",) + p, "bert." + hf, "bert/" + tf, kind) for p, hf, tf, kind in rows]
  rows += [
      (("mlm_transform", "kernel"), "cls.predictions.transform.dense.weight", "cls/predictions/transform/dense/kernel", "dense"),
      (("mlm_transform", "bias"), "cls.predictions.transform.dense.bias", "cls/predictions/transform/dense/bias", "copy"),
      (("mlm_ln", "scale"), "cls.predictions.transform.LayerNorm.weight", "cls/predictions/transform/LayerNorm/gamma", "copy"),
      (("mlm_ln", "bias"), "cls.predictions.transform.LayerNorm.bias", "cls/predictions/transform/LayerNorm/beta", "copy"),
      (("mlm_bias",), "cls.predictions.bias", "cls/predictions/output_bias", "copy"),
      (("nsp", "kernel"), "cls.seq_relationship.weight", "cls/seq_relationship/output_weights", "dense"),
      (("nsp", "bias"), "cls.seq_relationship.bias", "cls/seq_relationship/output_bias", "copy"),
  ]
  return rows


def _rows(cfg: model_lib.BertConfig, head: str, tf: bool = False):
  pick = (lambda hf, t: t) if tf else (lambda hf, t: hf)
  sep = "/" if tf else "."
  if head == "pretraining":
    rows = [(p, pick(hf, t), kind) for p, hf, t, kind in NAME_TABLE(cfg, pretraining=True)]
    if cfg.nsp_head:
      return rows
    # MLM-only pre-training: HF's BertForMaskedLM, which has neither the NSP classifier nor a pooler.
    return [r + ("extra",) if r[0][1:2] == ("pooler",) else r for r in rows if r[0][0] != "nsp"]
  enc = [(p, "bert" + sep + pick(hf, t), kind) for p, hf, t, kind in NAME_TABLE(cfg, pretraining=False)]
  if head == "encoder":  # an embedding model's export has no pooler: nothing reads it
    return [r + ("extra",) if r[0][0] == "pooler" else r for r in enc]
  if head not in table.TASK_HEADS:
    raise ConversionError(f"bert checkpoints load as pretraining, encoder or one of {list(table.TASK_HEADS)}, "
                          f"not {head!r}")
  if head != "sequence_classification":  # HF builds no pooler for these: bertjax keeps a fresh one
    enc = [r + ("extra",) if r[0][0] == "pooler" else r for r in enc]
  rows = table.under(enc, ("bert",))
  name = "qa_outputs" if head == "question_answering" else "classifier"
  if tf:
    w, b = _TF_HEAD_NAMES[name]
    return rows + [((name, "kernel"), w, "dense"), ((name, "bias"), b, "copy")]
  return rows + table.dense_rows((name,), name, bias=True)


def config_from_hf(hf: Mapping, defaults: Mapping | None = None, **overrides) -> model_lib.BertConfig:
  """A BERT-layout HF config; `defaults` are the family's values of keys its config.json may leave out
  (RoBERTa: 514 positions, one segment type, eps 1e-5)."""
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
  hf = {"max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, **(defaults or {}), **hf}
  fields = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf["max_position_embeddings"], type_vocab_size=hf["type_vocab_size"],
      hidden_act=table.activation(hf.get("hidden_act", "gelu")), layer_norm_eps=hf["layer_norm_eps"],
      dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      initializer_range=hf.get("initializer_range", 0.02), classifier_dropout=table.classifier_dropout(hf))
  fields.update(overrides)
  return model_lib.BertConfig(**fields)


def config_to_hf(cfg: model_lib.BertConfig, architecture: str = "BertForPreTraining") -> dict:
  if architecture == "BertForPreTraining" and not cfg.nsp_head:
    architecture = "BertForMaskedLM"
  return {"architectures": [architecture], "model_type": "bert", "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
          "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.intermediate_size,
          "hidden_act": table.ACTIVATIONS_BACK[cfg.hidden_act], "hidden_dropout_prob": cfg.dropout_rate,
          "attention_probs_dropout_prob": cfg.attention_dropout_rate,
          "max_position_embeddings": cfg.max_position_embeddings, "type_vocab_size": cfg.type_vocab_size,
          "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.layer_norm_eps,
          "classifier_dropout": cfg.classifier_dropout if cfg.classifier_dropout >= 0 else None,
          "pad_token_id": 0, "position_embedding_type": "absolute", "tie_word_embeddings": True}


FAMILY = table.Family(
    name="bert", mlm=("cls.", "pretraining"), reads={"BertForMaskedLM": "pretraining"},
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rows=_rows, prefix="bert.",
    heads=("cls.", "classifier.", "qa_outputs."),
    architectures={"pretraining": "BertForPreTraining", "encoder": "BertModel",
                   "sequence_classification": "BertForSequenceClassification",
                   "token_classification": "BertForTokenClassification",
                   "question_answering": "BertForQuestionAnswering"})
_TF = table.Family(name="bert", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                   rows=lambda cfg, head: _rows(cfg, head, tf=True), prefix="bert/",
                   heads=("cls/", "classifier/", "qa_outputs/", "output_"), architectures={})


def from_tf_variables(cfg: model_lib.BertConfig, variables: Mapping[str, np.ndarray], *, head: str = "auto"):
  """(cfg, bertjax params) from original google-research/bert variables ({name: array}, any TF-checkpoint
  reader). Optimizer slots (`.../adam_m`, `.../adam_v`) and `global_step` are dropped."""
  variables = {k: v for k, v in variables.items()
               if not (k.endswith(("/adam_m", "/adam_v")) or k == "global_step")}
  if head == "auto":
    head = "pretraining" if any(k.startswith("cls/") for k in variables) else "encoder"
  return cfg, table.load(_TF, cfg, variables, head, transpose_kernels=True)
