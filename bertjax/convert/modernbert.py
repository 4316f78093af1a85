"""ModernBERT (HF model type `modernbert`): pre-norm with a final norm and no norm before layer 0's attention
(the embedding norm precedes it), no biases, LayerNorm without bias, GeGLU FFN, rotary positions with a global
and a local base, sliding-window attention in all layers but every `global_every`-th, no segment types, MLM only.

ModernBERT stores the query, key and value projections as one `Wqkv` matrix and the GLU's two input projections
as one `Wi`: they are split into per-projection entries on import and joined on export. Layer 0 has no attention
norm; its bertjax entry (read by no computation: `first_attention_norm=False`) is filled with the identity on
import and dropped on export. Its task heads share the MLM head's `ModernBertPredictionHead` (dense, activation,
norm; `head.*`), pooled at [CLS] or by the mean (`classifier_pooling`), then `classifier`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from bertjax import model as model_lib
from bertjax.convert import table
from bertjax.convert.table import ConversionError

SPECIAL_IDS = {"pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281, "cls_token_id": 50281,
               "sep_token_id": 50282}
_FUSED = ((".attn.Wqkv.", ("Wq", "Wk", "Wv")), (".mlp.Wi.", ("Wi_input", "Wi_gate")))


def _global_every(layer_types, num_layers: int) -> int:
  """N such that layer i is global iff i % N == 0, from config.json's `layer_types`; errors on other patterns."""
  types = list(layer_types or ["full_attention"] * num_layers)
  for n in range(1, num_layers + 1):
    if all((t == "full_attention") == (i % n == 0) for i, t in enumerate(types)):
      return n
  raise ConversionError(f"layer_types {types} is not 'global every N layers, starting at layer 0'")


def config_from_hf(hf: Mapping, **overrides) -> model_lib.BertConfig:
  n = hf["num_hidden_layers"]
  if "layer_types" in hf and hf["layer_types"]:
    every = _global_every(hf["layer_types"], n)
  else:
    every = hf.get("global_attn_every_n_layers", 3)
  rope = hf.get("rope_parameters") or {}
  theta = (rope.get("full_attention") or {}).get("rope_theta", hf.get("global_rope_theta", 160000.0))
  theta_local = (rope.get("sliding_attention") or {}).get("rope_theta", hf.get("local_rope_theta", 10000.0))
  for key in ("full_attention", "sliding_attention"):
    kind = (rope.get(key) or {}).get("rope_type", "default")
    if kind != "default":
      raise ConversionError(f"rope_type {kind!r} ({key}) is not supported; only 'default'")
  biases = {k: hf.get(k, False) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
  if len(set(biases.values())) > 1:
    raise ConversionError(f"bertjax has one switch for linear biases; this checkpoint mixes them: {biases}")
  if not hf.get("decoder_bias", True):
    raise ConversionError("decoder_bias=False is not supported (the MLM decoder always has a bias)")
  act = table.activation(hf.get("hidden_activation", "gelu"), "hidden_activation")
  if table.activation(hf.get("classifier_activation", "gelu"), "classifier_activation") != act:
    raise ConversionError("hidden_activation and classifier_activation differ; bertjax's heads use the hidden "
                          "activation")
  if hf.get("mlp_dropout", 0.0) != hf.get("embedding_dropout", 0.0):
    raise ConversionError("embedding_dropout and mlp_dropout differ; bertjax has one hidden dropout rate")
  pooling = hf.get("classifier_pooling", "cls")
  if pooling not in ("cls", "mean"):
    raise ConversionError(f"classifier_pooling {pooling!r} is not supported; one of ['cls', 'mean']")
  window = hf.get("local_attention", 128) if every > 1 else 0
  fields = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=n,
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 8192), type_vocab_size=0, hidden_act=act,
      ffn="glu", position_embedding="rotary", rope_theta=float(theta), rope_theta_local=float(theta_local),
      local_attention=window, global_every=every, layer_norm="pre", norm="layernorm",
      layer_norm_eps=hf.get("norm_eps", 1e-5), norm_bias=hf.get("norm_bias", False),
      use_bias=biases["attention_bias"], embedding_norm=True, first_attention_norm=False, nsp_head=False,
      dropout_rate=hf.get("embedding_dropout", 0.0), attention_dropout_rate=hf.get("attention_dropout", 0.0),
      initializer_range=hf.get("initializer_range", 0.02), initializer="truncated_normal",
      classifier_head="prediction", classifier_pooling=pooling,
      classifier_dropout=table.classifier_dropout(hf, 0.0))
  fields.update(overrides)
  return model_lib.BertConfig(**fields)


def config_to_hf(cfg: model_lib.BertConfig, architecture: str = "ModernBertForMaskedLM") -> dict:
  types = ["sliding_attention" if cfg.layer_is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  act = table.ACTIVATIONS_BACK[cfg.hidden_act]
  return {"architectures": [architecture], "model_type": "modernbert", "vocab_size": cfg.padded_vocab_size,
          "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
          "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.intermediate_size,
          "hidden_activation": act, "classifier_activation": act,
          "max_position_embeddings": cfg.max_position_embeddings, "initializer_range": cfg.initializer_range,
          "norm_eps": cfg.layer_norm_eps, "norm_bias": cfg.norm_bias, "attention_bias": cfg.use_bias,
          "mlp_bias": cfg.use_bias, "classifier_bias": cfg.use_bias, "decoder_bias": True,
          "classifier_pooling": cfg.classifier_pooling, "classifier_dropout": cfg.head_dropout_rate,
          "local_attention": cfg.local_attention or cfg.max_position_embeddings, "layer_types": types,
          "global_attn_every_n_layers": cfg.global_every if cfg.local_attention else 1,
          "rope_parameters": {
              "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
              "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_local or cfg.rope_theta}},
          "embedding_dropout": cfg.dropout_rate, "mlp_dropout": cfg.dropout_rate,
          "attention_dropout": cfg.attention_dropout_rate, "tie_word_embeddings": True,
          # ModernBERT's tokenizer ids where the vocabulary has them; none otherwise (HF checks they fit).
          **{k: (v if v < cfg.padded_vocab_size else None) for k, v in SPECIAL_IDS.items()}}


def _rows(cfg: model_lib.BertConfig, head: str):
  """(bertjax path, HF name, layout) with the fused tensors as split entries (see `split_fused`)."""
  rows = [(("embeddings", "word_embeddings", "embedding"), "model.embeddings.tok_embeddings.weight", "copy")]
  rows += table.ln_rows(("embeddings", "ln"), "model.embeddings.norm", cfg)
  for i in range(cfg.num_layers):
    layer, hf = ("encoder", f"layer_{i}"), f"model.layers.{i}."
    if i:
      rows += table.ln_rows(layer + ("attention_ln",), hf + "attn_norm", cfg)
    for n, part in (("query", "Wq"), ("key", "Wk"), ("value", "Wv")):
      rows += table.dense_rows(layer + ("attention", n), hf + f"attn.{part}", cfg, "qkv")
    rows += table.dense_rows(layer + ("attention", "out"), hf + "attn.Wo", cfg, "attn_out")
    rows += table.ln_rows(layer + ("mlp_ln",), hf + "mlp_norm", cfg)
    rows += table.dense_rows(layer + ("mlp", "wi"), hf + "mlp.Wi_input", cfg)
    rows += table.dense_rows(layer + ("mlp", "wg"), hf + "mlp.Wi_gate", cfg)
    rows += table.dense_rows(layer + ("mlp", "wo"), hf + "mlp.Wo", cfg)
  rows += table.ln_rows(("encoder", "final_ln"), "model.final_norm", cfg)
  if head == "encoder":
    return rows
  if head == "pretraining":
    return (table.under(rows, ("bert",)) + table.dense_rows(("mlm_transform",), "head.dense", cfg)
            + table.ln_rows(("mlm_ln",), "head.norm", cfg) + [(("mlm_bias",), "decoder.bias", "copy")])
  if head not in table.TASK_HEADS:
    raise ConversionError(f"modernbert checkpoints load as pretraining, encoder or one of "
                          f"{list(table.TASK_HEADS)}, not {head!r}")
  return table.task_rows(cfg.replace(classifier_head="prediction"), head, rows, "classifier",
                         dense="head.dense", norm="head.norm")


def split_fused(state: Mapping[str, np.ndarray], cfg: model_lib.BertConfig) -> dict:
  """Wqkv [3d, d] -> Wq, Wk, Wv and Wi [2F, d] -> Wi_input, Wi_gate (biases likewise)."""
  del cfg
  out = {}
  for name, value in state.items():
    value = np.asarray(value)
    for fused, parts in _FUSED:
      if fused in name:
        if value.shape[0] % len(parts):
          raise ConversionError(f"{name}: shape {value.shape} does not split into {len(parts)} parts")
        for part, piece in zip(parts, np.split(value, len(parts), axis=0)):
          out[name.replace(fused, fused.replace(fused.split(".")[2], part))] = piece
        break
    else:
      out[name] = value
  return out


def join_fused(state: Mapping[str, np.ndarray]) -> dict:
  """The inverse of `split_fused`."""
  out, groups = {}, {}
  for name, value in state.items():
    for fused, parts in _FUSED:
      head = fused.split(".")[1]
      hit = [p for p in parts if f".{head}.{p}." in name]
      if hit:
        key = name.replace(f".{head}.{hit[0]}.", fused)
        groups.setdefault(key, {})[hit[0]] = value
        groups[key]["_order"] = parts
        break
    else:
      out[name] = value
  for key, pieces in groups.items():
    out[key] = np.concatenate([pieces[p] for p in pieces["_order"]], axis=0)
  return out


def _identity_first_norm(params: dict, cfg: model_lib.BertConfig) -> None:
  """Layer 0 reads no attention norm: its entry is the identity."""
  if cfg.first_attention_norm:
    return
  root = params.get("bert", params)
  ln = {"scale": np.ones((cfg.hidden_size,), np.float32)}
  if cfg.norm_bias:
    ln["bias"] = np.zeros((cfg.hidden_size,), np.float32)
  root.setdefault("encoder", {}).setdefault("layer_0", {})["attention_ln"] = ln


def _pad_bias(params: dict, cfg: model_lib.BertConfig) -> dict:
  """The decoder bias has a row per table row: the padding rows get a bias no logit reaches."""
  if "mlm_bias" not in params or cfg.padded_vocab_size == cfg.vocab_size:
    return params
  bias = params["mlm_bias"]
  return {**params, "mlm_bias": np.concatenate([bias, np.full((cfg.padded_vocab_size - cfg.vocab_size,), -1e4,
                                                              bias.dtype)])}


FAMILY = table.Family(
    name="modernbert", mlm=("head.", "pretraining"),
    config_from_hf=config_from_hf, config_to_hf=config_to_hf, rows=_rows, prefix="model.",
    heads=("head.", "decoder.", "classifier.", "dense."), tied=("decoder.weight",), read=split_fused,
    write=join_fused, finish=_identity_first_norm, export_params=_pad_bias,
    architectures={"pretraining": "ModernBertForMaskedLM", "encoder": "ModernBertModel",
                   "sequence_classification": "ModernBertForSequenceClassification",
                   "token_classification": "ModernBertForTokenClassification",
                   "question_answering": "ModernBertForQuestionAnswering"})
