"""DeBERTa-v2 and -v3 (HF model type `deberta-v2`): BERT's post-norm layers with disentangled attention
(`position_embedding="disentangled"`: relative positions in log buckets, one LayerNorm'd table of relative
embeddings that each layer projects with its own query and key projections, `share_att_key`), no absolute
positions, LayerNorm eps 1e-7, MLM only. bertjax computes the configuration DeBERTa-v3 and the v2 checkpoints
without absolute positions use (relative_attention, pos_att_type c2p|p2c, share_att_key, norm_rel_ebd
layer_norm, position_biased_input false); the others (a convolution layer, absolute positions, talking heads,
a factorised embedding) are a one-line error naming them.
"""
from __future__ import annotations

from typing import Mapping

from bertjax import model as model_lib
from bertjax.convert import bert, table
from bertjax.convert.table import ConversionError

_NAMES = {"attention.self.query.": "attention.self.query_proj.", "attention.self.key.": "attention.self.key_proj.",
          "attention.self.value.": "attention.self.value_proj."}


def _unsupported(hf: Mapping) -> list[str]:
  """The options of a DeBERTa config.json that bertjax does not compute."""
  pos_att = hf.get("pos_att_type") or []
  pos_att = pos_att.split("|") if isinstance(pos_att, str) else list(pos_att)
  checks = {"relative_attention=false": not hf.get("relative_attention", False),
            f"pos_att_type {pos_att} (not c2p and p2c)": sorted(pos_att) != ["c2p", "p2c"],
            "share_att_key=false": not hf.get("share_att_key", False),
            "norm_rel_ebd without layer_norm": "layer_norm" not in str(hf.get("norm_rel_ebd", "none")),
            "position_biased_input (absolute positions)": hf.get("position_biased_input", True),
            f"conv_kernel_size {hf.get('conv_kernel_size')}": bool(hf.get("conv_kernel_size", 0)),
            "talking_head": bool(hf.get("talking_head", False)),
            "embedding_size != hidden_size": hf.get("embedding_size", hf.get("hidden_size")) != hf.get("hidden_size"),
            f"position_buckets {hf.get('position_buckets', -1)} (bertjax needs > 0)": hf.get("position_buckets",
                                                                                           -1) <= 0}
  return [what for what, bad in checks.items() if bad]


def config_from_hf(hf: Mapping, **overrides) -> model_lib.BertConfig:
  bad = _unsupported(hf)
  if bad:
    raise ConversionError(f"this DeBERTa checkpoint uses options bertjax does not compute: {', '.join(bad)}")
  max_pos = hf.get("max_position_embeddings", 512)
  max_rel = hf.get("max_relative_positions", -1)
  act = hf.get("pooler_hidden_act", "gelu")
  if act not in ("gelu", "tanh") or hf.get("pooler_hidden_size", hf["hidden_size"]) != hf["hidden_size"]:
    raise ConversionError(f"this DeBERTa checkpoint's ContextPooler ({act}, width "
                          f"{hf.get('pooler_hidden_size')}) is not one bertjax computes (gelu or tanh at "
                          "hidden_size)")
  # The sequence head is ContextPooler (dense, activation at [CLS]) then the classifier: ELECTRA's head shape.
  fields = dict(position_embedding="disentangled", position_buckets=hf["position_buckets"],
                max_relative_positions=max_rel if max_rel and max_rel > 0 else max_pos, nsp_head=False,
                initializer="normal", classifier_head="dense_gelu" if act == "gelu" else "dense_tanh",
                classifier_dropout=hf["cls_dropout"] if hf.get("cls_dropout") is not None else -1.0)
  defaults = {"type_vocab_size": 0, "layer_norm_eps": 1e-7, "max_position_embeddings": max_pos}
  return bert.config_from_hf({**hf, "position_embedding_type": "absolute"}, defaults, **{**fields, **overrides})


def config_to_hf(cfg: model_lib.BertConfig, architecture: str = "DebertaV2ForMaskedLM") -> dict:
  out = bert.config_to_hf(cfg, architecture)
  for key in ("position_embedding_type", "tie_word_embeddings"):
    out.pop(key, None)
  out.update(model_type="deberta-v2", relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True,
             norm_rel_ebd="layer_norm", position_biased_input=False, position_buckets=cfg.position_buckets,
             max_relative_positions=cfg.max_relative_positions, legacy=True, pad_token_id=0,
             pooler_hidden_size=cfg.hidden_size, pooler_dropout=0,
             pooler_hidden_act="gelu" if cfg.classifier_head == "dense_gelu" else "tanh",
             cls_dropout=cfg.classifier_dropout if cfg.classifier_dropout >= 0 else None)
  return out


def _encoder_rows(cfg: model_lib.BertConfig):
  learned = cfg.replace(position_embedding="learned")  # the BERT table's check: its layer rows are DeBERTa's
  rows = []
  for p, hf, _, kind in bert.NAME_TABLE(learned, pretraining=False):
    if p[0] == "pooler" or "position_embeddings" in p or ("token_type_embeddings" in p and not cfg.type_vocab_size):
      continue
    for old, new in _NAMES.items():
      hf = hf.replace(old, new)
    rows.append((p, "deberta." + hf, kind))
  return rows + [(("rel_embeddings",), "deberta.encoder.rel_embeddings.weight", "copy"),
                 (("rel_ln", "scale"), "deberta.encoder.LayerNorm.weight", "copy"),
                 (("rel_ln", "bias"), "deberta.encoder.LayerNorm.bias", "copy")]


def _rows(cfg: model_lib.BertConfig, head: str):
  enc = _encoder_rows(cfg)
  if head == "encoder":
    return enc
  if head == "pretraining":  # the legacy head (HF's default): cls.predictions, decoder tied to the embeddings
    return table.under(enc, ("bert",)) + [
        (("mlm_transform", "kernel"), "cls.predictions.transform.dense.weight", "dense"),
        (("mlm_transform", "bias"), "cls.predictions.transform.dense.bias", "copy"),
        (("mlm_ln", "scale"), "cls.predictions.transform.LayerNorm.weight", "copy"),
        (("mlm_ln", "bias"), "cls.predictions.transform.LayerNorm.bias", "copy"),
        (("mlm_bias",), "cls.predictions.bias", "copy")]
  if head not in table.TASK_HEADS:
    raise ConversionError(f"deberta-v2 checkpoints load as pretraining, encoder or one of {list(table.TASK_HEADS)}, "
                          f"not {head!r}")
  if head == "sequence_classification":
    return table.task_rows(cfg, head, enc, "classifier", dense="pooler.dense")
  return table.task_rows(cfg, head, enc, "qa_outputs" if head == "question_answering" else "classifier")


def read(state: dict, cfg) -> dict:
  """The non-legacy MLM head (`lm_predictions.lm_head.*`, DeBERTa-v3's own checkpoints) under the legacy names."""
  del cfg
  moved = {"lm_predictions.lm_head.dense.": "cls.predictions.transform.dense.",
           "lm_predictions.lm_head.LayerNorm.": "cls.predictions.transform.LayerNorm.",
           "lm_predictions.lm_head.bias": "cls.predictions.bias"}
  out = {}
  for name, value in state.items():
    for old, new in moved.items():
      if name.startswith(old):
        name = new + name[len(old):]
    out[name] = value
  return out


FAMILY = table.Family(
    name="deberta-v2", mlm=("cls.", "pretraining"), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    rows=_rows, prefix="deberta.", heads=("cls.", "lm_predictions.", "mask_predictions.", "pooler.", "classifier."),
    tied=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"), read=read,
    architectures={"pretraining": "DebertaV2ForMaskedLM", "encoder": "DebertaV2Model",
                   "sequence_classification": "DebertaV2ForSequenceClassification",
                   "token_classification": "DebertaV2ForTokenClassification",
                   "question_answering": "DebertaV2ForQuestionAnswering"})
