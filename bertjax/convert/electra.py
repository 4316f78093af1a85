"""ELECTRA (HF model type `electra`): a BERT encoder (no pooler) with its own embedding width projected to the
hidden size (`embeddings_project`), published as two folders: the discriminator (`ElectraForPreTraining`, head
`discriminator`) and the generator (`ElectraForMaskedLM`, head `generator`). Fine-tuned models start from the
discriminator; the sequence head is `ElectraClassificationHead` at [CLS]: dropout, dense, GELU, dropout,
out_proj."""
from __future__ import annotations

from typing import Mapping

from bertjax import model as model_lib
from bertjax.convert import bert, table


def config_from_hf(hf: Mapping, **overrides) -> model_lib.BertConfig:
  """A discriminator's or generator's config.json (each is a BERT encoder with its own embedding width)."""
  embedding = hf.get("embedding_size", hf["hidden_size"])
  fields = dict(embedding_size=0 if embedding == hf["hidden_size"] else embedding, nsp_head=False,
                classifier_head="dense_gelu")
  return bert.config_from_hf(hf, **{**fields, **overrides})


def config_to_hf(cfg: model_lib.BertConfig, architecture: str = "ElectraForPreTraining") -> dict:
  out = bert.config_to_hf(cfg, architecture)
  out.update(model_type="electra", embedding_size=cfg.embed_dim)
  out.pop("tie_word_embeddings", None)
  return out


def _rows(cfg: model_lib.BertConfig, head: str):
  """BERT's encoder table under `electra.` (no pooler), the projection from the embedding width, and the head."""
  enc = [(p, "electra." + hf, kind) for p, hf, _, kind in bert.NAME_TABLE(cfg, pretraining=False)
         if p[0] != "pooler"]
  if cfg.embed_dim != cfg.hidden_size:
    enc += [(("embeddings_project", "kernel"), "electra.embeddings_project.weight", "dense"),
            (("embeddings_project", "bias"), "electra.embeddings_project.bias", "copy")]
  if head == "encoder":
    return enc
  if head == "discriminator":
    return table.under(enc, ("bert",)) + [
        (("head_dense", "kernel"), "discriminator_predictions.dense.weight", "dense"),
        (("head_dense", "bias"), "discriminator_predictions.dense.bias", "copy"),
        (("head_out", "kernel"), "discriminator_predictions.dense_prediction.weight", "dense"),
        (("head_out", "bias"), "discriminator_predictions.dense_prediction.bias", "copy")]
  if head == "generator":
    return table.under(enc, ("bert",)) + [
        (("mlm_transform", "kernel"), "generator_predictions.dense.weight", "dense"),
        (("mlm_transform", "bias"), "generator_predictions.dense.bias", "copy"),
        (("mlm_ln", "scale"), "generator_predictions.LayerNorm.weight", "copy"),
        (("mlm_ln", "bias"), "generator_predictions.LayerNorm.bias", "copy"),
        (("mlm_bias",), "generator_lm_head.bias", "copy")]
  return table.dense_head_task_rows(cfg, head, enc, "electra", ("discriminator", "generator", "encoder"))


FAMILY = table.Family(
    name="electra", mlm=("generator_predictions.", "generator"),
    discriminator="discriminator_predictions.",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rows=_rows, prefix="electra.",
    heads=("generator_predictions.", "generator_lm_head.", "discriminator_predictions.", "classifier.",
           "qa_outputs."),
    tied=("generator_lm_head.weight",),
    architectures={"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM",
                   "encoder": "ElectraModel", "sequence_classification": "ElectraForSequenceClassification",
                   "token_classification": "ElectraForTokenClassification",
                   "question_answering": "ElectraForQuestionAnswering"})

