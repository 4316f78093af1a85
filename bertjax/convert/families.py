"""RoBERTa and ModernBERT checkpoints (HF transformers' `roberta` and `modernbert` model types) <-> bertjax.

Both families are `BertConfig` switch settings of the one bertjax encoder:
- roberta: BERT's layer maths, learned positions counted from padding_idx + 1 (`position_offset`), one segment
  type, MLM only (no pooler, no NSP head), LayerNorm eps 1e-5;
- modernbert: pre-norm with a final norm and no norm before layer 0's attention (the embedding norm precedes it),
  no biases, LayerNorm without bias, GeGLU FFN, rotary positions with a global and a local base, sliding-window
  attention in all layers but every `global_every`-th, no segment types, MLM only.

A family's table lists, for every bertjax parameter, its HF name and layout change. ModernBERT stores the query,
key and value projections as one `Wqkv` matrix and the GLU's two input projections as one `Wi`: they are split
into per-projection entries on import and joined on export. Layer 0 of ModernBERT has no attention norm; its
bertjax entry (read by no computation: `first_attention_norm=False`) is filled with the identity on import and
dropped on export.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from bertjax import model as model_lib
from bertjax.convert import hf as bert_hf
from bertjax.convert.files import read_hf_dir, write_hf_dir

ConversionError = bert_hf.ConversionError
FAMILIES = ("bert", "roberta", "modernbert", "electra")
MLM_ARCHITECTURES = {"roberta": "RobertaForMaskedLM", "modernbert": "ModernBertForMaskedLM",
                     "electra": "ElectraForMaskedLM"}
MODERNBERT_SPECIAL_IDS = {"pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281,
                          "cls_token_id": 50281, "sep_token_id": 50282}
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}
_ACTS_BACK = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
# Tensors a checkpoint may carry that are tied to (equal to) others the table reads.
_TIED = {"roberta": ("lm_head.decoder.weight", "lm_head.decoder.bias"), "modernbert": ("decoder.weight",),
         "electra": ("generator_lm_head.weight",)}


def _act(name: str) -> str:
  if name not in _ACTS:
    raise ConversionError(f"activation {name!r} is not supported; one of {sorted(_ACTS)}")
  return _ACTS[name]


# ----------------------------------------------------------------------------- configs
def roberta_config(hf: Mapping, **overrides) -> model_lib.BertConfig:
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
  fields = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 514), type_vocab_size=hf.get("type_vocab_size", 1),
      hidden_act=_act(hf.get("hidden_act", "gelu")), layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
      dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      initializer_range=hf.get("initializer_range", 0.02), position_offset=hf.get("pad_token_id", 1) + 1,
      nsp_head=False, initializer="normal")
  fields.update(overrides)
  return model_lib.BertConfig(**fields)


def roberta_hf_config(cfg: model_lib.BertConfig, architecture: str = "RobertaForMaskedLM") -> dict:
  out = bert_hf.bert_to_hf_config(cfg, architecture)
  out.update(model_type="roberta", pad_token_id=cfg.position_offset - 1, bos_token_id=0, eos_token_id=2,
             type_vocab_size=cfg.type_vocab_size, hidden_act=_ACTS_BACK[cfg.hidden_act])
  return out


def _global_every(layer_types, num_layers: int) -> int:
  """N such that layer i is global iff i % N == 0, from config.json's `layer_types`; errors on other patterns."""
  types = list(layer_types or ["full_attention"] * num_layers)
  for n in range(1, num_layers + 1):
    if all((t == "full_attention") == (i % n == 0) for i, t in enumerate(types)):
      return n
  raise ConversionError(f"layer_types {types} is not 'global every N layers, starting at layer 0'")


def modernbert_config(hf: Mapping, **overrides) -> model_lib.BertConfig:
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
  act = _act(hf.get("hidden_activation", "gelu"))
  if _act(hf.get("classifier_activation", "gelu")) != act:
    raise ConversionError("hidden_activation and classifier_activation differ; bertjax's MLM head uses the "
                          "hidden activation")
  if hf.get("mlp_dropout", 0.0) != hf.get("embedding_dropout", 0.0):
    raise ConversionError("embedding_dropout and mlp_dropout differ; bertjax has one hidden dropout rate")
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
      initializer_range=hf.get("initializer_range", 0.02), initializer="truncated_normal")
  fields.update(overrides)
  return model_lib.BertConfig(**fields)


def modernbert_hf_config(cfg: model_lib.BertConfig, architecture: str = "ModernBertForMaskedLM") -> dict:
  types = ["sliding_attention" if cfg.layer_is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  return {"architectures": [architecture], "model_type": "modernbert", "vocab_size": cfg.padded_vocab_size,
          "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
          "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.intermediate_size,
          "hidden_activation": _ACTS_BACK[cfg.hidden_act], "classifier_activation": _ACTS_BACK[cfg.hidden_act],
          "max_position_embeddings": cfg.max_position_embeddings, "initializer_range": cfg.initializer_range,
          "norm_eps": cfg.layer_norm_eps, "norm_bias": cfg.norm_bias, "attention_bias": cfg.use_bias,
          "mlp_bias": cfg.use_bias, "classifier_bias": cfg.use_bias, "decoder_bias": True,
          "local_attention": cfg.local_attention or cfg.max_position_embeddings, "layer_types": types,
          "global_attn_every_n_layers": cfg.global_every if cfg.local_attention else 1,
          "rope_parameters": {
              "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
              "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_local or cfg.rope_theta}},
          "embedding_dropout": cfg.dropout_rate, "mlp_dropout": cfg.dropout_rate,
          "attention_dropout": cfg.attention_dropout_rate, "tie_word_embeddings": True,
          # ModernBERT's tokenizer ids where the vocabulary has them; none otherwise (HF checks they fit).
          **{k: (v if v < cfg.padded_vocab_size else None) for k, v in MODERNBERT_SPECIAL_IDS.items()}}


def electra_config(hf: Mapping, **overrides) -> model_lib.BertConfig:
  """An ELECTRA discriminator's or generator's config.json (each is a BERT encoder with its own embedding width)."""
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
  embedding = hf.get("embedding_size", hf["hidden_size"])
  fields = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      embedding_size=0 if embedding == hf["hidden_size"] else embedding,
      max_position_embeddings=hf.get("max_position_embeddings", 512), type_vocab_size=hf.get("type_vocab_size", 2),
      hidden_act=_act(hf.get("hidden_act", "gelu")), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      initializer_range=hf.get("initializer_range", 0.02), nsp_head=False)
  fields.update(overrides)
  return model_lib.BertConfig(**fields)


def electra_hf_config(cfg: model_lib.BertConfig, architecture: str = "ElectraForPreTraining") -> dict:
  out = bert_hf.bert_to_hf_config(cfg, architecture)
  out.update(model_type="electra", embedding_size=cfg.embed_dim, hidden_act=_ACTS_BACK[cfg.hidden_act])
  out.pop("tie_word_embeddings", None)
  return out


def electra_rows(cfg: model_lib.BertConfig, head: str):
  """(bertjax path, HF name, layout): BERT's encoder table under `electra.` (no pooler), the projection from
  the embedding width, and the discriminator's (`discriminator`) or the generator's (`generator`) head."""
  flat = cfg.replace(scan_layers=False)
  enc = [(p, "electra." + hf, kind) for p, hf, _, kind in bert_hf.NAME_TABLE(flat, pretraining=False)
         if p[0] != "pooler"]
  if cfg.embed_dim != cfg.hidden_size:
    enc += [(("embeddings_project", "kernel"), "electra.embeddings_project.weight", "dense"),
            (("embeddings_project", "bias"), "electra.embeddings_project.bias", "copy")]
  if head == "encoder":
    return enc
  enc = [(("bert",) + p, hf, kind) for p, hf, kind in enc]
  if head == "discriminator":
    return enc + [(("head_dense", "kernel"), "discriminator_predictions.dense.weight", "dense"),
                  (("head_dense", "bias"), "discriminator_predictions.dense.bias", "copy"),
                  (("head_out", "kernel"), "discriminator_predictions.dense_prediction.weight", "dense"),
                  (("head_out", "bias"), "discriminator_predictions.dense_prediction.bias", "copy")]
  return enc + [(("mlm_transform", "kernel"), "generator_predictions.dense.weight", "dense"),
                (("mlm_transform", "bias"), "generator_predictions.dense.bias", "copy"),
                (("mlm_ln", "scale"), "generator_predictions.LayerNorm.weight", "copy"),
                (("mlm_ln", "bias"), "generator_predictions.LayerNorm.bias", "copy"),
                (("mlm_bias",), "generator_lm_head.bias", "copy")]


def family_of(cfg: model_lib.BertConfig) -> str:
  """The HF model type whose architecture this config is, or a ConversionError naming what none of them has."""
  modern = dict(ffn="glu", position_embedding="rotary", layer_norm="pre", norm="layernorm", type_vocab_size=0,
                embedding_norm=True, first_attention_norm=False, position_offset=0)
  if all(getattr(cfg, k) == v for k, v in modern.items()):
    return "modernbert"
  classic = dict(ffn="mlp", position_embedding="learned", layer_norm="post", norm="layernorm", norm_bias=True,
                 use_bias=True, embedding_norm=True, local_attention=0)
  off = [f"{k}={getattr(cfg, k)!r}" for k, v in classic.items() if getattr(cfg, k) != v]
  if off:
    raise ConversionError("no HF model type (bert, roberta, modernbert) has this architecture: "
                          + ", ".join(off))
  return "roberta" if cfg.position_offset else "bert"


# ----------------------------------------------------------------------------- tables
def _ln(path, name, cfg):
  rows = [(path + ("scale",), name + ".weight", "copy")]
  if cfg.norm_bias:
    rows.append((path + ("bias",), name + ".bias", "copy"))
  return rows


def _dense(path, name, cfg, layout="dense", bias=None):
  rows = [(path + ("kernel",), name + ".weight", layout)]
  if cfg.use_bias if bias is None else bias:
    rows.append((path + ("bias",), name + ".bias", {"qkv": "qkv_bias"}.get(layout, "copy")))
  return rows


def roberta_rows(cfg: model_lib.BertConfig, pretraining: bool):
  """(bertjax path, HF name, layout): BERT's encoder table under `roberta.` (no pooler) and `lm_head`."""
  flat = cfg.replace(scan_layers=False, position_offset=0)  # the BERT table's check wants plain positions
  enc = [(p, "roberta." + hf, kind) for p, hf, _, kind in bert_hf.NAME_TABLE(flat, pretraining=False)
         if p[0] != "pooler" and (cfg.type_vocab_size or "token_type_embeddings" not in p)]
  if not pretraining:
    return enc
  return [(("bert",) + p, hf, kind) for p, hf, kind in enc] + [
      (("mlm_transform", "kernel"), "lm_head.dense.weight", "dense"),
      (("mlm_transform", "bias"), "lm_head.dense.bias", "copy"),
      (("mlm_ln", "scale"), "lm_head.layer_norm.weight", "copy"),
      (("mlm_ln", "bias"), "lm_head.layer_norm.bias", "copy"),
      (("mlm_bias",), "lm_head.bias", "copy")]


def modernbert_rows(cfg: model_lib.BertConfig, pretraining: bool):
  """(bertjax path, HF name, layout) with ModernBERT's fused tensors as split entries (see `split_fused`)."""
  rows = [(("embeddings", "word_embeddings", "embedding"), "model.embeddings.tok_embeddings.weight", "copy")]
  rows += _ln(("embeddings", "ln"), "model.embeddings.norm", cfg)
  for i in range(cfg.num_layers):
    layer, hf = ("encoder", f"layer_{i}"), f"model.layers.{i}."
    if i:
      rows += _ln(layer + ("attention_ln",), hf + "attn_norm", cfg)
    for n, part in (("query", "Wq"), ("key", "Wk"), ("value", "Wv")):
      rows += _dense(layer + ("attention", n), hf + f"attn.{part}", cfg, "qkv")
    rows += _dense(layer + ("attention", "out"), hf + "attn.Wo", cfg, "attn_out")
    rows += _ln(layer + ("mlp_ln",), hf + "mlp_norm", cfg)
    rows += _dense(layer + ("mlp", "wi"), hf + "mlp.Wi_input", cfg)
    rows += _dense(layer + ("mlp", "wg"), hf + "mlp.Wi_gate", cfg)
    rows += _dense(layer + ("mlp", "wo"), hf + "mlp.Wo", cfg)
  rows += _ln(("encoder", "final_ln"), "model.final_norm", cfg)
  if not pretraining:
    return rows
  rows = [(("bert",) + p, hf, kind) for p, hf, kind in rows]
  rows += _dense(("mlm_transform",), "head.dense", cfg)
  rows += _ln(("mlm_ln",), "head.norm", cfg)
  rows += [(("mlm_bias",), "decoder.bias", "copy")]
  return rows


def split_fused(state: Mapping[str, np.ndarray], cfg: model_lib.BertConfig) -> dict:
  """ModernBERT's Wqkv [3d, d] -> Wq, Wk, Wv and Wi [2F, d] -> Wi_input, Wi_gate (biases likewise)."""
  out = {}
  for name, value in state.items():
    value = np.asarray(value)
    for fused, parts in ((".attn.Wqkv.", ("Wq", "Wk", "Wv")), (".mlp.Wi.", ("Wi_input", "Wi_gate"))):
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
    for fused, parts in ((".attn.Wqkv.", ("Wq", "Wk", "Wv")), (".mlp.Wi.", ("Wi_input", "Wi_gate"))):
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


_ROWS = {"roberta": roberta_rows, "modernbert": modernbert_rows}
_CONFIGS = {"roberta": roberta_config, "modernbert": modernbert_config, "electra": electra_config}
ELECTRA_HEADS = {"ElectraForPreTraining": "discriminator", "ElectraForMaskedLM": "generator"}


def _rows(family, cfg, head):
  if family == "electra":
    return electra_rows(cfg, head)
  return _ROWS[family](cfg, head == "pretraining")


def _expected(family, cfg, head):
  if family != "electra" or head == "encoder":
    return bert_hf._expected_shapes(cfg, head)
  import jax
  from bertjax.model import electra
  module = electra.ElectraDiscriminator(cfg) if head == "discriminator" else model_lib.BertForPreTraining(cfg)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), model_lib.dummy_batch(cfg, 1, 4, 1))["params"])
  shapes = jax.tree_util.tree_map(lambda x: x.shape, bert_hf._unbox(shapes))
  return dict(bert_hf._flatten(shapes))


# ----------------------------------------------------------------------------- public API
def from_state_dict(family: str, cfg: model_lib.BertConfig, state: Mapping[str, np.ndarray], *,
                    head: str = "auto") -> dict:
  """bertjax params (BertForPreTraining tree for head "pretraining", BertModel tree for "encoder"; "auto" picks
  pretraining when the checkpoint has the MLM head) from a roberta / modernbert state dict. ELECTRA: head
  "discriminator" (`model.electra.ElectraDiscriminator`'s tree), "generator" (BertForPreTraining's) or "encoder"."""
  state = {k: v for k, v in state.items() if not k.endswith(bert_hf.IGNORED_BUFFERS) and k not in _TIED[family]}
  if family == "modernbert":
    state = split_fused(state, cfg)
  mlm_prefix = {"roberta": "lm_head.", "modernbert": "head.", "electra": "generator_predictions."}[family]
  has_mlm = any(k.startswith(mlm_prefix) for k in state)
  if head == "auto":
    if family == "electra":
      head = ("generator" if has_mlm else "discriminator"
              if any(k.startswith("discriminator_predictions.") for k in state) else "encoder")
    else:
      head = "pretraining" if has_mlm else "encoder"
  heads = ("discriminator", "generator", "encoder") if family == "electra" else ("pretraining", "encoder")
  if head not in heads:
    raise ConversionError(f"{family} checkpoints load as one of {list(heads)}, not {head!r}")
  flat = cfg.replace(scan_layers=False)
  enc_prefix = {"roberta": "roberta.", "modernbert": "model.", "electra": "electra."}[family]
  rows = _rows(family, flat, head)
  if head == "encoder" and not any(k.startswith(enc_prefix) for k in state):  # a bare encoder, names unprefixed
    rows = [(p, hf[len(enc_prefix):], kind) for p, hf, kind in rows]
  layouts = bert_hf._layouts(cfg)
  expected = _expected(family, flat, head)
  params, missing, misshaped, used = {}, [], [], set()
  for path, name, kind in rows:
    if name not in state:
      missing.append(name)
      continue
    used.add(name)
    value = layouts[kind][0](np.asarray(state[name])) if np.ndim(state[name]) else None
    if value is None or value.shape != expected[path]:
      misshaped.append(f"{name}: shape {np.shape(state[name])}")
      continue
    bert_hf._set(params, path, value.astype(np.float32))
  if family == "modernbert" and not cfg.first_attention_norm:  # layer 0 reads no attention norm: the identity
    root = params.get("bert", params)
    ln = {"scale": np.ones((cfg.hidden_size,), np.float32)}
    if cfg.norm_bias:
      ln["bias"] = np.zeros((cfg.hidden_size,), np.float32)
    root.setdefault("encoder", {}).setdefault("layer_0", {})["attention_ln"] = ln
  ignore = () if head in ("pretraining", "discriminator", "generator") else (
      mlm_prefix, "classifier.", "qa_outputs.", "decoder.", "dense.", "discriminator_predictions.",
      "generator_lm_head.")
  unexpected = sorted(k for k in state if k not in used and not k.startswith(ignore)
                      and not k.startswith(tuple(enc_prefix + p for p in ("pooler.",))))
  problems = [f"{what} {len(names)}: {names[:20]}" for what, names in
              (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)) if names]
  if problems:
    raise ConversionError(f"checkpoint does not fit the {family} {head} model ({cfg.num_layers} layers, hidden "
                          f"{cfg.hidden_size}, vocab {cfg.vocab_size}): " + "; ".join(problems))
  return bert_hf.stack_layers(params, cfg.num_layers) if cfg.scan_layers else params


def to_state_dict(family: str, cfg: model_lib.BertConfig, params: Mapping) -> dict[str, np.ndarray]:
  """The HF state dict of a roberta / modernbert model (MLM when params hold the MLM head, else the encoder)."""
  import jax
  params = jax.tree_util.tree_map(np.asarray, jax.device_get(bert_hf._unbox(params)))
  if cfg.scan_layers:
    params = bert_hf.unstack_layers(params, cfg.num_layers)
  if family == "modernbert" and cfg.padded_vocab_size != cfg.vocab_size:
    params = _pad_bias(params, cfg)
  flat = cfg.replace(scan_layers=False)
  layouts = bert_hf._layouts(cfg)
  if family == "electra":
    rows = _rows(family, flat, "generator" if "mlm_bias" in params else "discriminator" if "head_dense" in params
                 else "encoder")
  else:
    rows = _rows(family, flat, "pretraining" if "mlm_bias" in params else "encoder")
  state = {hf: np.ascontiguousarray(layouts[kind][1](bert_hf._get(params, path)).astype(np.float32))
           for path, hf, kind in rows}
  return join_fused(state) if family == "modernbert" else state


def _pad_bias(params, cfg):
  """ModernBERT's decoder bias has a row per table row: the padding rows get a bias no logit reaches."""
  bias = params["mlm_bias"]
  params = dict(params)
  params["mlm_bias"] = np.concatenate([bias, np.full((cfg.padded_vocab_size - cfg.vocab_size,), -1e4, bias.dtype)])
  return params


def from_hf_dir(hf_cfg: Mapping, state: Mapping[str, np.ndarray], *, head: str = "auto", **overrides):
  """(cfg, params) from a roberta or modernbert folder's config.json and state dict."""
  family = hf_cfg.get("model_type")
  cfg = _CONFIGS[family](hf_cfg, **overrides)
  if family == "electra" and head == "auto":
    head = next((h for a, h in ELECTRA_HEADS.items() if a in (hf_cfg.get("architectures") or [])), "auto")
  return cfg, from_state_dict(family, cfg, state, head=head)


def to_hf(cfg: model_lib.BertConfig, params: Mapping, out_dir: str, family: str) -> None:
  """config.json + model.safetensors that `AutoModelForMaskedLM` (MLM head present) or `AutoModel` loads."""
  state = to_state_dict(family, cfg, params)
  pretraining = "mlm_bias" in params
  make = {"roberta": roberta_hf_config, "modernbert": modernbert_hf_config, "electra": electra_hf_config}[family]
  bare = {"roberta": "RobertaModel", "modernbert": "ModernBertModel", "electra": "ElectraModel"}[family]
  arch = MLM_ARCHITECTURES[family] if pretraining else "ElectraForPreTraining" if "head_dense" in params else bare
  hf_cfg = make(cfg, arch)
  write_hf_dir(out_dir, state, hf_cfg)


def config_from_hf(hf_cfg: Mapping, **overrides) -> model_lib.BertConfig:
  """The BertConfig of any supported model type's config.json."""
  family = hf_cfg.get("model_type", "bert")
  if family not in FAMILIES:
    raise ConversionError(f"config.json model_type is {family!r}; supported: {list(FAMILIES)}")
  if family == "bert":
    return bert_hf.hf_config_to_bert(hf_cfg, **overrides)
  return _CONFIGS[family](hf_cfg, **overrides)


def from_hf(path: str, *, head: str = "auto", **overrides) -> tuple[model_lib.BertConfig, dict]:
  """(cfg, params) from an HF folder of model type bert, roberta or modernbert (config.json's `model_type`).
  Overrides go to BertConfig (e.g. scan_layers=True). BERT also loads fine-tuned heads (see `hf.from_hf`)."""
  hf_cfg, state = read_hf_dir(path)
  family = hf_cfg.get("model_type", "bert")
  if family not in FAMILIES:
    raise ConversionError(f"{path}: config.json model_type is {family!r}; supported: {list(FAMILIES)}")
  if family == "bert":
    return bert_hf.from_hf(path, head=head, **overrides)
  return from_hf_dir(hf_cfg, state, head=head, **overrides)


def to_hf_any(cfg: model_lib.BertConfig, params: Mapping, out_dir: str, *, head: str | None = None, labels=(),
              family: str | None = None) -> None:
  """Write an HF folder of the config's family (`family_of`): BERT as `hf.to_hf` (fine-tuned heads too),
  RoBERTa and ModernBERT as their MaskedLM (or bare encoder) models."""
  if family is None and "head_dense" in params:  # an ELECTRA discriminator (its generator: family="electra")
    family = "electra"
  family = family or family_of(cfg)
  if family == "bert":
    return bert_hf.to_hf(cfg, params, out_dir, head=head, labels=labels)
  if head is not None:
    raise ConversionError(f"fine-tuned heads export for bert checkpoints; this model is {family}")
  return to_hf(cfg, params, out_dir, family)


def electra_from_hf(discriminator_dir: str, generator_dir: str, **overrides):
  """(discriminator cfg, generator cfg, ElectraForPreTraining params) from HF's two folders; the embeddings are
  the discriminator's (the generator's copy must be the same shape)."""
  from bertjax.model import electra
  disc_cfg, disc = from_hf(discriminator_dir, head="discriminator", **overrides)
  gen_cfg, gen = from_hf(generator_dir, head="generator", **overrides)
  if disc_cfg.embed_dim != gen_cfg.embed_dim or disc_cfg.vocab_size != gen_cfg.vocab_size:
    raise ConversionError(f"{generator_dir}: the generator's embeddings ({gen_cfg.vocab_size} x {gen_cfg.embed_dim}) "
                          f"do not match the discriminator's ({disc_cfg.vocab_size} x {disc_cfg.embed_dim})")
  return disc_cfg, gen_cfg, electra.join(disc, gen)


def electra_to_hf(disc_cfg: model_lib.BertConfig, gen_cfg: model_lib.BertConfig, params: Mapping,
                  out_dir: str) -> None:
  """OUT/discriminator (ElectraForPreTraining) and OUT/generator (ElectraForMaskedLM), as HF publishes ELECTRA."""
  import jax
  from bertjax.model import electra
  disc, gen = electra.split(jax.tree_util.tree_map(np.asarray, bert_hf._unbox(params)))
  to_hf(disc_cfg, disc, os.path.join(out_dir, "discriminator"), "electra")
  to_hf(gen_cfg, gen, os.path.join(out_dir, "generator"), "electra")
