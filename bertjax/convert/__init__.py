"""Interchange: HF transformers safetensors <-> bertjax params, and the original google-research/bert names.

Only safetensors and JSON are read: no pickle (`pytorch_model.bin`, `.pt`, `.ckpt`) is ever loaded. One record per
family (`bert`, `roberta` with `xlm-roberta`, `modernbert`, `electra`: `convert/<family>.py`) declares its config
mapping, name table, tied tensors and architectures; `table` walks any of them.

    cfg, params = convert.from_hf("hf_dir")   # any family (config.json's model_type); the head its
                                              # `architectures` names: MLM model, encoder or a fine-tuned head
    model.for_pretraining(cfg).apply({"params": params}, batch)  # "hidden", "mlm_logits" at masked_lm_positions
    convert.to_hf(cfg, params, "out_dir")     # the config's family: its MLM model (BERT: BertForPreTraining)
    cfg, params = convert.from_hf("hf_dir", head="token_classification")   # a fine-tuned model, head included
    convert.to_hf(cfg, params, "out_dir", head="token_classification", labels=("O", "B-PER", ...))

    python -m bertjax convert --workdir W --out DIR     # a bertjax workdir (pre-trained or fine-tuned) as an HF folder
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from bertjax import model as model_lib
from bertjax.convert import bert, deberta, electra, modernbert, roberta, table
from bertjax.convert.bert import NAME_TABLE, from_tf_variables
from bertjax.convert.files import MAX_HEADER_BYTES, PICKLE_SUFFIXES, read_hf_dir, read_safetensors, write_hf_dir
from bertjax.convert.table import (
  ACTIVATIONS,
  IGNORED_BUFFERS,
  TASK_HEADS,
  ConversionError,
  stack_layers,
  unstack_layers,
)
from bertjax.core import files as _files  # not `files`: that name is the submodule bertjax.convert.files
from bertjax.objectives import electra as electra_model

FAMILIES = {f.name: f for f in (bert.FAMILY, roberta.FAMILY, roberta.XLM_FAMILY, modernbert.FAMILY, electra.FAMILY,
                                 deberta.FAMILY)}
# Model types that share another's architecture: a config remembers which it came from (`hf_model_type`).
SHARES_ARCHITECTURE = {"xlm-roberta": "roberta"}


def family(name: str) -> table.Family:
  if name not in FAMILIES:
    raise ConversionError(f"config.json model_type is {name!r}; supported: {list(FAMILIES)}")
  return FAMILIES[name]


def family_of(cfg: model_lib.BertConfig, params: Mapping | None = None) -> str:
  """The HF model type whose architecture this config is (an ELECTRA discriminator by its head's params), or a
  ConversionError naming what none of them has."""
  if cfg.position_embedding == "disentangled":
    return "deberta-v2"
  if params is not None and "head_dense" in params:
    return "electra"
  if cfg.classifier_head == "dense_gelu" or cfg.embed_dim != cfg.hidden_size:
    return "electra"
  modern = dict(ffn="glu", position_embedding="rotary", layer_norm="pre", norm="layernorm", type_vocab_size=0,
                embedding_norm=True, first_attention_norm=False, position_offset=0)
  if all(getattr(cfg, k) == v for k, v in modern.items()):
    return "modernbert"
  classic = dict(ffn="mlp", position_embedding="learned", layer_norm="post", norm="layernorm", norm_bias=True,
                 use_bias=True, embedding_norm=True, local_attention=0)
  off = [f"{k}={getattr(cfg, k)!r}" for k, v in classic.items() if getattr(cfg, k) != v]
  if off:
    raise ConversionError("no HF model type (bert, roberta, modernbert, electra) has this architecture: "
                          + ", ".join(off))
  name = "roberta" if cfg.position_offset else "bert"
  return cfg.hf_model_type if SHARES_ARCHITECTURE.get(cfg.hf_model_type) == name else name


def config_from_hf(hf_cfg: Mapping, **overrides) -> model_lib.BertConfig:
  """The BertConfig of any supported model type's config.json."""
  return family(hf_cfg.get("model_type", "bert")).config_from_hf(hf_cfg, **overrides)


def head_of_architecture(hf_cfg: Mapping) -> str | None:
  """The head config.json's `architectures` names (e.g. "token_classification"), or None."""
  return family(hf_cfg.get("model_type", "bert")).head_of(hf_cfg)


def supported_architectures() -> list[str]:
  return sorted({a for f in FAMILIES.values() for a in (*f.architectures.values(), *f.reads)})


def from_state_dict(cfg: model_lib.BertConfig, state: Mapping[str, np.ndarray], *, head: str = "auto",
                    family_name: str = "bert") -> tuple[model_lib.BertConfig, dict]:
  """(cfg, bertjax params) of `head` from an HF state dict of the family: "pretraining" (the MLM model's tree),
  "encoder" (BertModel's; head tensors passed over), a task head (TASK_HEADS: `bert` and the head, the label
  count from the classifier's shape), ELECTRA's "discriminator" / "generator", or "auto" (the MLM model when
  its tensors are present, else the encoder)."""
  fam = family(family_name)
  if head == "auto":
    head = fam.auto_head(state)
  if fam.name == "bert" and head == "pretraining" and not any(k.startswith("cls.seq_relationship.") for k in state):
    cfg = cfg.replace(nsp_head=False)  # BertForMaskedLM: the MLM head alone, and no pooler
  return cfg, table.load(fam, cfg, state, head)


def to_state_dict(cfg: model_lib.BertConfig, params: Mapping, head: str | None = None,
                  family_name: str | None = None) -> dict[str, np.ndarray]:
  """The HF state dict of bertjax params: with `head` that model, else the MLM model when the params hold its
  head (an ELECTRA discriminator when they hold that), else the encoder."""
  family_name = family_name or family_of(cfg, params)
  return table.dump(family(family_name), cfg, params, head or _head_of_params(FAMILIES[family_name], params))


def _head_of_params(fam: table.Family, params: Mapping) -> str:
  if "head_dense" in params:
    return "discriminator"
  return fam.mlm[1] if "mlm_bias" in params else "encoder"


def from_hf(path: str, *, head: str = "auto", **overrides) -> tuple[model_lib.BertConfig, dict]:
  """(cfg, params) from an HF folder of any supported family (config.json's `model_type`). Overrides go to
  BertConfig (e.g. scan_layers=True). head "auto": the head config.json's `architectures` names (e.g.
  RobertaForTokenClassification), else as `from_state_dict`."""
  hf_cfg, state = read_hf_dir(path)
  fam = family(hf_cfg.get("model_type", "bert"))
  cfg = fam.config_from_hf(hf_cfg, **overrides)
  if head == "auto":
    archs = hf_cfg.get("architectures") or []
    head = fam.head_of(hf_cfg) or "auto"
    if head == "auto" and archs and not any(a.endswith("Model") for a in archs):
      raise ConversionError(f"{path}: architecture {archs[0]} is not supported; supported: "
                            f"{', '.join(supported_architectures())}")
  try:
    return from_state_dict(cfg, state, head=head, family_name=fam.name)
  except ConversionError as e:
    raise ConversionError(f"{path}: {e}") from None


def to_hf(cfg: model_lib.BertConfig, params: Mapping, out_dir: str, *, head: str | None = None, labels=(),
          family: str | None = None) -> None:
  """config.json + model.safetensors that transformers loads: the family's model for `head` (a task head with
  `labels` as config.json's id2label), else its MLM model when the params hold one, else its encoder."""
  name = family or family_of(cfg, params)
  fam = FAMILIES[name]
  head = head or _head_of_params(fam, params)
  if head not in fam.architectures:
    raise ConversionError(f"{name} models export as {sorted(fam.architectures)}, not {head!r}")
  state = table.dump(fam, cfg, params, head)
  hf_cfg = fam.config_to_hf(cfg, fam.architectures[head])
  out_name = "qa_outputs.weight" if head == "question_answering" else next(
      (k for k in ("classifier.weight", "classifier.out_proj.weight") if k in state), None)
  if out_name and head != "question_answering":
    hf_cfg.update(table.label_fields(head, int(state[out_name].shape[0]), labels))
  write_hf_dir(out_dir, state, hf_cfg)


def electra_from_hf(discriminator_dir: str, generator_dir: str, **overrides):
  """(discriminator cfg, generator cfg, ElectraForPreTraining params) from HF's two folders; the embeddings are
  the discriminator's (the generator's copy must be the same shape)."""
  disc_cfg, disc = from_hf(discriminator_dir, head="discriminator", **overrides)
  gen_cfg, gen = from_hf(generator_dir, head="generator", **overrides)
  if disc_cfg.embed_dim != gen_cfg.embed_dim or disc_cfg.vocab_size != gen_cfg.vocab_size:
    raise ConversionError(f"{generator_dir}: the generator's embeddings ({gen_cfg.vocab_size} x {gen_cfg.embed_dim}) "
                          f"do not match the discriminator's ({disc_cfg.vocab_size} x {disc_cfg.embed_dim})")
  return disc_cfg, gen_cfg, electra_model.join(disc, gen)


def electra_to_hf(disc_cfg: model_lib.BertConfig, gen_cfg: model_lib.BertConfig, params: Mapping,
                  out_dir: str) -> None:
  """OUT/discriminator (ElectraForPreTraining) and OUT/generator (ElectraForMaskedLM), as HF publishes ELECTRA."""
  disc, gen = electra_model.split(table.host_params(params))
  to_hf(disc_cfg, disc, _files.join(out_dir, "discriminator"), head="discriminator", family="electra")
  to_hf(gen_cfg, gen, _files.join(out_dir, "generator"), head="generator", family="electra")


__all__ = ["ACTIVATIONS", "FAMILIES", "IGNORED_BUFFERS", "MAX_HEADER_BYTES", "NAME_TABLE", "PICKLE_SUFFIXES",
           "TASK_HEADS", "ConversionError", "config_from_hf", "electra_from_hf", "electra_to_hf", "family",
           "family_of", "from_hf", "from_state_dict", "from_tf_variables", "head_of_architecture", "read_hf_dir",
           "read_safetensors", "stack_layers", "supported_architectures", "to_hf", "to_state_dict",
           "unstack_layers"]
