"""RoBERTa (HF model type `roberta`): BERT's layer maths, learned positions counted from padding_idx + 1
(`position_offset`), one segment type, MLM only (no NSP head), LayerNorm eps 1e-5. HF's `RobertaModel` keeps
BERT's tanh pooler, which the encoder reads where a folder holds one; the MLM and task models have none. Its
sequence head is `RobertaClassificationHead` at <s>: dropout, dense, tanh, dropout, out_proj.

XLM-RoBERTa (`xlm-roberta`) is the same model under its own names (`XLMRobertaForMaskedLM`, ...; the encoder's
tensors under `roberta.` too) with a sentencepiece vocabulary whose ids fairseq shifts by one (<s> <pad> </s> <unk>
first, <mask> last), which its tokenizer.json holds."""
from __future__ import annotations

import dataclasses
from typing import Mapping

from bertjax import model as model_lib
from bertjax.convert import bert, table


def config_from_hf(hf: Mapping, **overrides) -> model_lib.BertConfig:
  """BERT's layout with positions offset past the padding id and the family's classification head."""
  fields = dict(position_offset=hf.get("pad_token_id", 1) + 1, nsp_head=False, initializer="normal",
                classifier_head="dense_tanh")
  return bert.config_from_hf(hf, {"max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
                             **{**fields, **overrides})


def config_to_hf(cfg: model_lib.BertConfig, architecture: str = "RobertaForMaskedLM") -> dict:
  out = bert.config_to_hf(cfg, architecture)
  out.update(model_type="roberta", pad_token_id=cfg.position_offset - 1, bos_token_id=0, eos_token_id=2,
             type_vocab_size=cfg.type_vocab_size)
  return out


def _rows(cfg: model_lib.BertConfig, head: str):
  flat = cfg.replace(position_offset=0)  # the BERT table's check wants plain positions
  enc = [(p, "roberta." + hf, kind) for p, hf, _, kind in bert.NAME_TABLE(flat, pretraining=False)
         if cfg.type_vocab_size or "token_type_embeddings" not in p]
  if head == "encoder":  # RobertaModel's pooler, where the folder holds one; an embedding model's export has none
    return [r + ("extra",) if r[0][0] == "pooler" else r for r in enc]
  enc = [r for r in enc if r[0][0] != "pooler"]  # the MLM and task models build no pooler
  if head == "pretraining":
    return table.under(enc, ("bert",)) + [
        (("mlm_transform", "kernel"), "lm_head.dense.weight", "dense"),
        (("mlm_transform", "bias"), "lm_head.dense.bias", "copy"),
        (("mlm_ln", "scale"), "lm_head.layer_norm.weight", "copy"),
        (("mlm_ln", "bias"), "lm_head.layer_norm.bias", "copy"),
        (("mlm_bias",), "lm_head.bias", "copy")]
  return table.dense_head_task_rows(cfg, head, enc, "roberta")


FAMILY = table.Family(
    name="roberta", mlm=("lm_head.", "pretraining"),
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rows=_rows, prefix="roberta.",
    heads=("lm_head.", "classifier.", "qa_outputs."), tied=("lm_head.decoder.weight", "lm_head.decoder.bias"),
    architectures={"pretraining": "RobertaForMaskedLM", "encoder": "RobertaModel",
                   "sequence_classification": "RobertaForSequenceClassification",
                   "token_classification": "RobertaForTokenClassification",
                   "question_answering": "RobertaForQuestionAnswering"})


def xlm_config_from_hf(hf: Mapping, **overrides) -> model_lib.BertConfig:
  return config_from_hf(hf, **{"hf_model_type": "xlm-roberta", **overrides})


def xlm_config_to_hf(cfg: model_lib.BertConfig, architecture: str = "XLMRobertaForMaskedLM") -> dict:
  return {**config_to_hf(cfg, architecture), "model_type": "xlm-roberta"}


XLM_FAMILY = dataclasses.replace(
    FAMILY, name="xlm-roberta", config_from_hf=xlm_config_from_hf, config_to_hf=xlm_config_to_hf,
    architectures={head: "XLM" + arch for head, arch in FAMILY.architectures.items()})
