"""The machinery every family's record shares: layouts between HF (PyTorch) arrays and bertjax params, the one
activation table, row helpers, and the state dict <-> params walk over a family's rows (`load`, `dump`).

A row is (bertjax path, HF name, layout) or (bertjax path, HF name, layout, "extra"): "extra" marks a parameter
bertjax's module has and the HF architecture does not (BERT's pooler under a token or span head): it may be
absent on import (the fresh value stays) and is left out on export.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import flax.linen as nn
import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.objectives import electra as electra_model

ConversionError = errors.ConversionError
IGNORED_BUFFERS = ("embeddings.position_ids",)  # a non-parameter buffer some HF checkpoints carry
TASK_HEADS = ("sequence_classification", "token_classification", "question_answering")
# HF activation names -> bertjax's, and back (one table for every family).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu", "silu": "silu"}
ACTIVATIONS_BACK = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def activation(name: str, field: str = "hidden_act") -> str:
  if name not in ACTIVATIONS:
    raise ConversionError(f"{field} {name!r} is not supported; one of {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def classifier_dropout(hf: Mapping, default: float = -1.0) -> float:
  """config.json's classifier_dropout (None: the hidden dropout rate, bertjax's -1)."""
  value = hf.get("classifier_dropout", default)
  return default if value is None else float(value)


@dataclasses.dataclass(frozen=True)
class Family:
  """An HF model type as bertjax reads and writes it.

  config_from_hf(hf_config, **overrides) -> BertConfig; config_to_hf(cfg, architecture) -> config.json dict.
  rows(cfg, head) -> rows (see the module doc) of the model with that head, layers unstacked.
  architectures: {head: HF architecture}; heads without one do not export. reads: {HF architecture: head} of
  further architectures it imports (BERT's MLM-only `BertForMaskedLM` as its pre-training model).
  prefix: the encoder's name prefix ("bert."); heads: name prefixes of the tensors of its heads (what an encoder
  import passes over).
  tied: tensor names equal to others the rows read (the tied decoder), skipped on import.
  mlm: the prefix of its MLM head's tensors and that head's name (ELECTRA: its generator); discriminator: the
  prefix of a replaced-token head's tensors (ELECTRA), "" for none.
  read(state, cfg) / write(state): a state dict's own layout (e.g. fused projections) <-> the rows' names.
  finish(params, cfg): fills what the checkpoint does not hold (in place) after import.
  export_params(params, cfg): the params as the HF model stores them (e.g. a padded decoder bias).
  """
  name: str
  config_from_hf: Callable
  config_to_hf: Callable
  rows: Callable
  architectures: Mapping[str, str]
  prefix: str
  heads: tuple
  mlm: tuple = ("", "pretraining")
  reads: Mapping[str, str] = dataclasses.field(default_factory=dict)
  discriminator: str = ""
  tied: tuple = ()
  read: Callable = lambda state, cfg: state
  write: Callable = lambda state: state
  finish: Callable = lambda params, cfg: None
  export_params: Callable = lambda params, cfg: params

  def auto_head(self, state: Mapping) -> str:
    """The head a bare state dict holds: its MLM model, its replaced-token discriminator or the encoder."""
    if any(k.startswith(self.mlm[0]) for k in state):
      return self.mlm[1]
    if self.discriminator and any(k.startswith(self.discriminator) for k in state):
      return "discriminator"
    return "encoder"

  def head_of(self, hf_cfg: Mapping) -> str | None:
    """The head config.json's `architectures` names, or None."""
    archs = hf_cfg.get("architectures") or []
    return next((h for h, a in self.architectures.items() if a in archs),
                next((self.reads[a] for a in archs if a in self.reads), None))


# ----------------------------------------------------------------------------- layouts and rows
def layouts(cfg: model_lib.BertConfig) -> dict[str, tuple[Callable, Callable]]:
  """Each layout maps an HF (PyTorch layout) array to bertjax and back."""
  h, k, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  ident = (lambda a: a, lambda a: a)
  return {
      "copy": ident,
      "dense": (lambda a: a.T, lambda a: a.T),  # torch [out, in] <-> kernel [in, out]
      "qkv": (lambda a: a.T.reshape(d, h, k), lambda a: a.reshape(d, h * k).T),
      "qkv_bias": (lambda a: a.reshape(h, k), lambda a: a.reshape(h * k)),
      "attn_out": (lambda a: a.T.reshape(h, k, d), lambda a: a.reshape(h * k, d).T),
  }


def ln_rows(path, name, cfg):
  rows = [(path + ("scale",), name + ".weight", "copy")]
  if cfg.norm_bias:
    rows.append((path + ("bias",), name + ".bias", "copy"))
  return rows


def dense_rows(path, name, cfg=None, layout="dense", bias=None):
  rows = [(path + ("kernel",), name + ".weight", layout)]
  if (cfg.use_bias if bias is None else bias):
    rows.append((path + ("bias",), name + ".bias", {"qkv": "qkv_bias"}.get(layout, "copy")))
  return rows


def under(rows, path_prefix=(), name_prefix=""):
  """`rows` with the bertjax paths and HF names prefixed."""
  return [(path_prefix + r[0], name_prefix + r[1]) + tuple(r[2:]) for r in rows]


def task_rows(cfg: model_lib.BertConfig, head: str, encoder: list, classifier: str, dense: str = "",
              norm: str = ""):
  """A task model's rows: the encoder under `bert`, the family's head transform (its dense layer at `dense`,
  its norm at `norm`: HF names, "" = none) and the classifier (HF name `classifier`; span QA's `qa_outputs`
  in bertjax)."""
  rows = under(encoder, ("bert",))
  sequence = head == "sequence_classification"
  if dense and (sequence or cfg.classifier_head == "prediction"):
    rows += dense_rows(("head", "dense"), dense, cfg, bias=cfg.use_bias if norm else True)
  if norm and cfg.classifier_head == "prediction":
    rows += ln_rows(("head", "norm"), norm, cfg)
  out = "qa_outputs" if head == "question_answering" else "classifier"
  rows += dense_rows((out,), classifier, bias=True)
  return rows


def dense_head_task_rows(cfg: model_lib.BertConfig, head: str, encoder: list, family: str,
                         others=("pretraining", "encoder")):
  """The task rows of a family whose sequence head is a dense layer and `out_proj` (`classifier.dense`,
  `classifier.out_proj`: RoBERTa, ELECTRA) and whose token and span heads are a linear layer."""
  if head not in TASK_HEADS:
    raise ConversionError(f"{family} checkpoints load as one of {list(others) + list(TASK_HEADS)}, not {head!r}")
  if head == "sequence_classification":
    return task_rows(cfg, head, encoder, "classifier.out_proj", dense="classifier.dense")
  return task_rows(cfg, head, encoder, "qa_outputs" if head == "question_answering" else "classifier")


# ----------------------------------------------------------------------------- trees
def set_path(tree: dict, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def flatten(tree, prefix=()):
  if isinstance(tree, Mapping):
    for k, v in tree.items():
      yield from flatten(v, prefix + (k,))
  else:
    yield prefix, tree


def host_params(params) -> dict:
  return jax.tree_util.tree_map(np.asarray, jax.device_get(nn.meta.unbox(params)))


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


def module_for(cfg: model_lib.BertConfig, head: str, num_labels: int = 2):
  """The bertjax module whose params a head's rows fill."""
  if head in ("pretraining", "generator"):
    return model_lib.BertForPreTraining(cfg)
  if head == "encoder":
    return model_lib.BertModel(cfg)
  if head == "discriminator":
    return electra_model.ElectraDiscriminator(cfg)
  if head in TASK_HEADS:
    return model_lib.for_task(cfg, head, num_labels)
  raise errors.ConfigError(f"unknown head {head!r}; choose pretraining, encoder or one of {list(TASK_HEADS)}")


def expected_shapes(cfg: model_lib.BertConfig, head: str, num_labels: int = 2) -> dict:
  module = module_for(cfg, head, num_labels)
  batch = model_lib.dummy_batch(cfg, 1, 4, 1)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), batch)["params"])
  return {path: x.shape for path, x in flatten(nn.meta.unbox(shapes))}


# ----------------------------------------------------------------------------- the walk
def load(family: Family, cfg: model_lib.BertConfig, state: Mapping[str, np.ndarray], head: str,
         rows: list | None = None, transpose_kernels: bool = False) -> dict:
  """bertjax params (layers stacked if cfg.scan_layers) of `head` from a state dict, every problem (missing,
  unexpected, mis-shaped tensors) named in one ConversionError. `rows`: the family's rows unless given (BERT's
  original TF names); `transpose_kernels`: TF `.../kernel` arrays are [in, out]."""
  state = {k: v for k, v in state.items() if not k.endswith(IGNORED_BUFFERS) and k not in family.tied}
  state = family.read(state, cfg)
  flat = cfg.replace(scan_layers=False)
  rows = family.rows(flat, head) if rows is None else rows
  sep = family.prefix[-1:] or "."
  if head == "encoder" and family.prefix and not any(k.startswith(family.prefix) for k in state):
    n = len(family.prefix)  # a bare encoder: names unprefixed
    rows = [(r[0], r[1][n:] if r[1].startswith(family.prefix) else r[1]) + tuple(r[2:]) for r in rows]
  num_labels = 2
  out_kernel = next((r[1] for r in rows if r[0] == ("classifier", "kernel")), None)
  if out_kernel in state and np.ndim(state[out_kernel]) == 2:
    in_out = transpose_kernels and out_kernel.endswith(sep + "kernel")
    num_labels = int(np.shape(state[out_kernel])[1 if in_out else 0])
  expected = expected_shapes(flat, head, num_labels)
  lay = layouts(cfg)
  params, missing, misshaped, used = {}, [], [], set()
  for path, name, kind, *extra in rows:
    if name not in state:
      if not extra:
        missing.append(name)
      continue
    used.add(name)
    arr = np.asarray(state[name])
    if transpose_kernels and name.endswith(sep + "kernel"):
      arr = arr.T
    try:
      value = lay[kind][0](arr) if arr.ndim else None
    except ValueError:
      value = None
    want = expected.get(path)
    if value is None or value.shape != want:
      theirs = lay[kind][1](np.zeros(want, np.float32)).shape if want is not None else "none"
      misshaped.append(f"{name}: shape {np.shape(state[name])}, expected {theirs}")
      continue
    set_path(params, path, value.astype(np.float32))
  family.finish(params, cfg)
  passed = (family.prefix + "pooler" + sep,)
  if head == "encoder":  # a bare encoder's pooler (HF's RobertaModel keeps one) and any head's tensors
    passed += ("pooler" + sep,)
    passed += family.heads + tuple(family.prefix + h for h in family.heads)
  unexpected = sorted(k for k in state if k not in used and not k.startswith(passed))
  problems = [f"{what} {len(names)}: {names[:20]}" for what, names in
              (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)) if names]
  if problems:
    raise ConversionError(f"checkpoint does not fit the {family.name} {head} model ({cfg.num_layers} layers, hidden "
                          f"{cfg.hidden_size}, vocab {cfg.vocab_size}): " + "; ".join(problems))
  return stack_layers(params, cfg.num_layers) if cfg.scan_layers else params


def dump(family: Family, cfg: model_lib.BertConfig, params: Mapping, head: str) -> dict[str, np.ndarray]:
  """The HF state dict (PyTorch layouts; a tied decoder stored once, as HF does) of `head`'s params."""
  params = host_params(params)
  if cfg.scan_layers:
    params = unstack_layers(params, cfg.num_layers)
  params = family.export_params(params, cfg)
  lay = layouts(cfg)
  # A bare encoder is saved as HF saves its base model: names without the encoder's prefix.
  strip = len(family.prefix) if head == "encoder" else 0
  # A model without a pooler (an embedding model, a family head that reads none) exports without one: HF's
  # encoder classes then draw a pooler nothing reads.
  has_pooler = "pooler" in params.get("bert", params)
  state = {name[strip:]: np.ascontiguousarray(lay[kind][1](get_path(params, path)).astype(np.float32))
           for path, name, kind, *extra in family.rows(cfg.replace(scan_layers=False), head)
           if not extra and (has_pooler or "pooler" not in path)}
  return family.write(state)


def label_fields(head: str, num_labels: int, labels=()) -> dict:
  """config.json's id2label / label2id (and regression's problem_type) of a classifier with `num_labels` outputs."""
  if head not in ("sequence_classification", "token_classification"):
    return {}
  names = list(labels) if len(labels) == num_labels else [f"LABEL_{i}" for i in range(num_labels)]
  out = {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}
  if head == "sequence_classification" and num_labels == 1:
    out["problem_type"] = "regression"
  return out
