"""Parameter names and layouts: HF transformers state dicts <-> bertjax params, and the original
google-research/bert checkpoint names."""
from __future__ import annotations

from typing import Callable, Mapping

import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.convert.files import read_hf_dir, write_hf_dir

HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.")
# Fine-tuning heads: HF architecture, whether HF builds the pooler, and the head's rows (bertjax path, HF name,
# original TF name, layout). The original run_classifier / run_squad keep their output weights as [out, in].
TASK_HEADS = {
    "sequence_classification": ("BertForSequenceClassification", True, "classifier"),
    "token_classification": ("BertForTokenClassification", False, "classifier"),
    "question_answering": ("BertForQuestionAnswering", False, "qa_outputs"),
}
_TF_HEAD_NAMES = {"classifier": ("output_weights", "output_bias"),
                  "qa_outputs": ("cls/squad/output_weights", "cls/squad/output_bias")}
IGNORED_BUFFERS = ("embeddings.position_ids",)  # a non-parameter buffer some HF checkpoints carry
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu"}


ConversionError = errors.ConversionError


# ----------------------------------------------------------------------------- layouts
# Each kind maps an HF (PyTorch layout) array to bertjax and back. `d`: shape helpers from the config.
def _layouts(cfg: model_lib.BertConfig) -> dict[str, tuple[Callable, Callable]]:
  h, k, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  ident = (lambda a: a, lambda a: a)
  return {
      "copy": ident,
      "dense": (lambda a: a.T, lambda a: a.T),  # torch [out, in] <-> kernel [in, out]
      "qkv": (lambda a: a.T.reshape(d, h, k), lambda a: a.reshape(d, h * k).T),
      "qkv_bias": (lambda a: a.reshape(h, k), lambda a: a.reshape(h * k)),
      "attn_out": (lambda a: a.T.reshape(h, k, d), lambda a: a.reshape(h * k, d).T),
  }


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


def head_rows(head: str):
  """(bertjax path, HF name, TF name, layout) rows of a fine-tuning head's own parameters."""
  name = TASK_HEADS[head][2]
  tf_w, tf_b = _TF_HEAD_NAMES[name]
  return [((name, "kernel"), f"{name}.weight", tf_w, "dense"), ((name, "bias"), f"{name}.bias", tf_b, "copy")]


def head_of_architecture(hf_cfg: Mapping) -> str | None:
  """The fine-tuning head named by config.json's `architectures`, or None."""
  archs = hf_cfg.get("architectures") or []
  for head, (arch, _, _) in TASK_HEADS.items():
    if arch in archs:
      return head
  return None


# ----------------------------------------------------------------------------- safetensors I/O
def hf_config_to_bert(hf: Mapping, **overrides) -> model_lib.BertConfig:
  if hf.get("model_type", "bert") != "bert":
    raise ConversionError(f"config.json model_type is {hf.get('model_type')!r}, not 'bert'")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
  act = hf.get("hidden_act", "gelu")
  if act not in HF_ACTIVATIONS:
    raise ConversionError(f"hidden_act {act!r} is not supported; one of {sorted(HF_ACTIVATIONS)}")
  fields = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 512), type_vocab_size=hf.get("type_vocab_size", 2),
      hidden_act=HF_ACTIVATIONS[act], layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      initializer_range=hf.get("initializer_range", 0.02))
  fields.update(overrides)
  return model_lib.BertConfig(**fields)


def bert_to_hf_config(cfg: model_lib.BertConfig, architecture: str = "BertForPreTraining") -> dict:
  act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[cfg.hidden_act]
  return {"architectures": [architecture], "model_type": "bert", "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
          "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.intermediate_size,
          "hidden_act": act, "hidden_dropout_prob": cfg.dropout_rate,
          "attention_probs_dropout_prob": cfg.attention_dropout_rate,
          "max_position_embeddings": cfg.max_position_embeddings, "type_vocab_size": cfg.type_vocab_size,
          "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.layer_norm_eps,
          "pad_token_id": 0, "position_embedding_type": "absolute", "tie_word_embeddings": True}


# ----------------------------------------------------------------------------- tree helpers
def _set(tree: dict, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def stack_layers(params: dict, num_layers: int) -> dict:
  """Per-layer `encoder/layer_i` subtrees -> the `nn.scan` layout `encoder/layers/layer` (leading L axis)."""
  def fix(enc):
    layers = [enc.pop(f"layer_{i}") for i in range(num_layers)]
    enc["layers"] = {"layer": jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}
  return _map_encoder(params, fix)


def unstack_layers(params: dict, num_layers: int) -> dict:
  def fix(enc):
    stacked = enc.pop("layers")["layer"]
    for i in range(num_layers):
      enc[f"layer_{i}"] = jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), stacked)
  return _map_encoder(params, fix)


def _map_encoder(params, fn):
  params = jax.tree_util.tree_map(lambda x: x, params)  # a fresh nest of dicts, leaves shared
  params = dict(params)
  root = params["bert"] if "bert" in params else params
  root["encoder"] = dict(root["encoder"])
  fn(root["encoder"])
  return params


def _expected_shapes(cfg: model_lib.BertConfig, head: str, num_labels: int = 2) -> dict:
  if head == "pretraining":
    module = model_lib.BertForPreTraining(cfg)
  elif head == "encoder":
    module = model_lib.BertModel(cfg)
  else:
    module = task_module(cfg, head, num_labels)
  batch = model_lib.dummy_batch(cfg, 1, 4, 1)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), batch)["params"])
  shapes = jax.tree_util.tree_map(lambda x: x.shape, _unbox(shapes))
  return {path: shape for path, shape in _flatten(shapes)}


def task_module(cfg: model_lib.BertConfig, head: str, num_labels: int):
  """The bertjax module of a fine-tuning head."""
  if head == "sequence_classification":
    return model_lib.BertForSequenceClassification(cfg, num_labels)
  if head == "token_classification":
    return model_lib.BertForTokenClassification(cfg, num_labels)
  if head == "question_answering":
    return model_lib.BertForQuestionAnswering(cfg)
  raise errors.ConfigError(f"unknown head {head!r}; choose pretraining, encoder or one of {sorted(TASK_HEADS)}")


def _unbox(tree):
  import flax.linen as nn
  return nn.meta.unbox(tree)


def _flatten(tree, prefix=()):
  if isinstance(tree, Mapping):
    for k, v in tree.items():
      yield from _flatten(v, prefix + (k,))
  else:
    yield prefix, tree


# ----------------------------------------------------------------------------- public API
def from_state_dict(cfg: model_lib.BertConfig, state: Mapping[str, np.ndarray], *, head: str = "auto",
                    names: str = "hf") -> tuple[model_lib.BertConfig, dict]:
  """bertjax params from an HF state dict (`names="hf"`) or original TF variables (`names="tf"`).

  head: "pretraining" (BertForPreTraining tree), "encoder" (BertModel tree; head tensors ignored), a fine-tuning
  head of TASK_HEADS (its `bert` encoder and head; the label count from the head's shape) or "auto"
  (pretraining when the MLM/NSP tensors are present). A checkpoint without a pooler (HF builds none for token
  classification and QA) gives params without `pooler`: the caller keeps a fresh one (no head reads it).
  """
  state = {k: v for k, v in state.items() if not k.endswith(IGNORED_BUFFERS)}
  sep = "." if names == "hf" else "/"
  has_heads = any(k.startswith("cls" + sep) for k in state)
  if head == "auto":
    head = "pretraining" if has_heads else "encoder"
  if head not in ("pretraining", "encoder") and head not in TASK_HEADS:
    raise errors.ConfigError(f"head must be auto, pretraining, encoder or one of {sorted(TASK_HEADS)}, got {head!r}")
  scan = cfg.scan_layers
  cfg_flat = cfg.replace(scan_layers=False)
  pick = (lambda hf, tf: hf) if names == "hf" else (lambda hf, tf: tf)
  num_labels = 2
  if head == "pretraining":
    rows = [(p, pick(hf, tf), kind) for p, hf, tf, kind in NAME_TABLE(cfg_flat, pretraining=True)]
  else:  # an encoder may be stored with or without the "bert" prefix
    prefix = "bert" + sep if any(k.startswith("bert" + sep) for k in state) else ""
    rows = [(p, prefix + pick(hf, tf), kind) for p, hf, tf, kind in NAME_TABLE(cfg_flat, pretraining=False)]
    if head in TASK_HEADS:
      rows = [(("bert",) + p, name, kind) for p, name, kind in rows]
      head_table = [(p, pick(hf, tf), kind) for p, hf, tf, kind in head_rows(head)]
      if head != "question_answering" and head_table[0][1] in state:
        num_labels = int(np.shape(state[head_table[0][1]])[0])
      rows += head_table
  pooler_optional = head in TASK_HEADS and not TASK_HEADS[head][1]
  layouts = _layouts(cfg)
  expected = _expected_shapes(cfg_flat, head, num_labels)
  params, missing, misshaped, used = {}, [], [], set()
  for path, name, kind in rows:
    if name not in state:
      if not (pooler_optional and "pooler" in path):
        missing.append(name)
      continue
    used.add(name)
    arr = np.asarray(state[name])
    if names == "tf" and name.endswith("/kernel"):
      arr = arr.T  # TF kernels are [in, out]; the layouts start from the torch [out, in]
    want = expected[path]
    to_ours, to_theirs = layouts[kind]
    try:
      value = to_ours(arr)
    except ValueError:
      value = None
    if value is None or value.shape != want:
      hf_shape = to_theirs(np.zeros(want, np.float32)).shape
      if names == "tf" and name.endswith("/kernel"):
        hf_shape = hf_shape[::-1]
      misshaped.append(f"{name}: shape {np.shape(state[name])}, expected {hf_shape}")
      continue
    _set(params, path, value.astype(np.float32))
  heads = tuple(p.replace(".", sep) for p in HEAD_PREFIXES)
  heads += tuple("bert" + sep + p for p in heads)
  ignore_heads = head != "pretraining"
  unexpected = sorted(k for k in state if k not in used and not (ignore_heads and k.startswith(heads)))
  problems = []
  if missing:
    problems.append(f"missing {len(missing)}: {missing[:20]}")
  if unexpected:
    problems.append(f"unexpected {len(unexpected)}: {unexpected[:20]}")
  if misshaped:
    problems.append(f"mis-shaped {len(misshaped)}: {misshaped[:20]}")
  if problems:
    raise ConversionError(f"checkpoint does not fit the {head} model ({cfg.num_layers} layers, hidden "
                          f"{cfg.hidden_size}, vocab {cfg.vocab_size}): " + "; ".join(problems))
  if scan:
    params = stack_layers(params, cfg.num_layers)
  return cfg, params


def from_hf(path: str, *, head: str = "auto", **overrides) -> tuple[model_lib.BertConfig, dict]:
  """Load an HF BERT folder (config.json + safetensors). Overrides go to BertConfig (e.g. scan_layers=True).
  head "auto" also recognises a fine-tuned model by config.json's `architectures` (e.g. BertForTokenClassification)."""
  hf_cfg, state = read_hf_dir(path)
  cfg = hf_config_to_bert(hf_cfg, **overrides)
  if head == "auto":
    head = head_of_architecture(hf_cfg) or "auto"
  return from_state_dict(cfg, state, head=head, names="hf")


def from_tf_variables(cfg: model_lib.BertConfig, variables: Mapping[str, np.ndarray], *, head: str = "auto"):
  """bertjax params from original google-research/bert variables ({name: array}, any TF-checkpoint reader).

  Optimizer slots (`.../adam_m`, `.../adam_v`) and `global_step` are dropped.
  """
  variables = {k: v for k, v in variables.items()
               if not (k.endswith(("/adam_m", "/adam_v")) or k == "global_step")}
  return from_state_dict(cfg, variables, head=head, names="tf")


def to_state_dict(cfg: model_lib.BertConfig, params: Mapping, head: str | None = None) -> dict[str, np.ndarray]:
  """HF state dict (PyTorch layouts, tied decoder saved once as HF does) from bertjax params: BertForPreTraining,
  BertModel, or with `head` (TASK_HEADS) a fine-tuned model (no pooler where HF's architecture has none)."""
  params = jax.tree_util.tree_map(np.asarray, jax.device_get(_unbox(params)))
  if cfg.scan_layers:
    params = unstack_layers(params, cfg.num_layers)
  layouts = _layouts(cfg)
  flat = cfg.replace(scan_layers=False)
  if head is not None:
    arch, pooler, _ = TASK_HEADS[head]
    rows = [(("bert",) + p, "bert." + hf, kind) for p, hf, _, kind in NAME_TABLE(flat, pretraining=False)
            if pooler or p[0] != "pooler"]
    rows += [(p, hf, kind) for p, hf, _, kind in head_rows(head)]
  else:
    rows = [(p, hf, kind) for p, hf, _, kind in NAME_TABLE(flat, pretraining="mlm_bias" in params)]
  return {hf: np.ascontiguousarray(layouts[kind][1](_get(params, path)).astype(np.float32))
          for path, hf, kind in rows}


def to_hf(cfg: model_lib.BertConfig, params: Mapping, out_dir: str, *, head: str | None = None,
          labels=()) -> None:
  """Write config.json + model.safetensors that transformers loads: BertForPreTraining or BertModel, or with
  `head` the fine-tuned model (`labels` become config.json's id2label)."""
  state = to_state_dict(cfg, params, head)
  if head is not None:
    arch = TASK_HEADS[head][0]
  else:
    arch = "BertForPreTraining" if any(k.startswith("cls.") for k in state) else "BertModel"
  hf_cfg = bert_to_hf_config(cfg, arch)
  if head in ("sequence_classification", "token_classification"):
    n = int(state["classifier.weight"].shape[0])
    names = list(labels) if len(labels) == n else [f"LABEL_{i}" for i in range(n)]
    hf_cfg["id2label"] = {str(i): name for i, name in enumerate(names)}
    hf_cfg["label2id"] = {name: i for i, name in enumerate(names)}
    if head == "sequence_classification" and n == 1:
      hf_cfg["problem_type"] = "regression"
  write_hf_dir(out_dir, state, hf_cfg)
