"""sentence-transformers folders <-> bertjax embedding models.

A folder's modules.json lists its stack: a Transformer (the HF model in the folder's root or a sub-folder), a
Pooling (1_Pooling/config.json: cls, mean or max), optionally a Dense (2_Dense: config.json and
model.safetensors with `linear.weight` / `linear.bias`) and a Normalize. `read` gives the encoder's config and
params (any family `convert.from_hf` reads) with the `Pooling` settings; `write` makes a folder
`SentenceTransformer(path)` loads. Either may be a gs:// or s3:// folder (`bertjax.core.files`): read from a local
copy, written into a local folder that is uploaded when complete.
"""
from __future__ import annotations

import dataclasses
import json
import os
import string

import numpy as np
from safetensors.numpy import save_file

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert import files as convert_files
from bertjax.convert.table import ConversionError, host_params
from bertjax.core import files
from bertjax.embeddings.model import Pooling

_TRANSFORMER = "sentence_transformers.models.Transformer"
_MODULES = {"Transformer", "Pooling", "Dense", "Normalize"}
_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max"}
_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}


def is_folder(path: str) -> bool:
  return files.isfile(files.join(path, "modules.json"))


def _json(path: str) -> dict:
  try:
    return files.read_json(path)
  except FileNotFoundError:
    raise ConversionError(f"{path}: missing (a sentence-transformers folder names it in modules.json)") from None
  except (OSError, ValueError) as e:
    raise ConversionError(f"{path}: not readable JSON ({str(e).splitlines()[0][:200]})") from None


def read_pooling(path: str) -> Pooling:
  """The folder's Pooling settings (its JSON files only; no weights are read)."""
  stack = _json(files.join(path, "modules.json"))
  kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
  mode, settings = "mean", {}
  for m, kind in zip(stack[1:], kinds[1:]):
    sub = files.join(path, m.get("path", ""))
    if kind == "Pooling":
      mode = _pooling_mode(sub)
    elif kind == "Dense":
      conf = _json(files.join(sub, "config.json"))
      settings.update(dense=int(conf["out_features"]), dense_bias=bool(conf.get("bias", True)),
                      dense_activation=_activation(sub, conf))
  return Pooling(mode=mode, normalize="Normalize" in kinds, **settings)


def _pooling_mode(sub: str) -> str:
  conf = _json(files.join(sub, "config.json"))
  if isinstance(conf.get("pooling_mode"), (str, list)):  # sentence-transformers >= 6 names the mode(s)
    named = conf["pooling_mode"] if isinstance(conf["pooling_mode"], list) else [conf["pooling_mode"]]
    on = [m for m in named if m in _MODES.values()]
    extra = [m for m in named if m not in _MODES.values()]
  else:
    on = [v for k, v in _MODES.items() if conf.get(k)]
    extra = [k for k, v in conf.items() if k.startswith("pooling_mode") and v and k not in _MODES]
  if len(on) != 1 or extra:
    raise ConversionError(f"{sub}/config.json: pooling {on + extra} is not one of cls, mean, max alone")
  return on[0]


def _activation(sub: str, conf: dict) -> str:
  act = _ACTIVATIONS.get(conf.get("activation_function", "torch.nn.modules.activation.Tanh"))
  if act is None:
    raise ConversionError(f"{sub}: activation {conf.get('activation_function')} is not one of {sorted(_ACTIVATIONS)}")
  return act


def read(path: str, **overrides):
  """(BertConfig, params {"bert": ..., "dense"?: ...}, Pooling, transformer sub-folder) of a sentence-transformers
  folder; a module bertjax does not compute is a one-line error naming it. A remote folder is read from a local
  copy (the transformer sub-folder returned is that copy's)."""
  path = files.local_copy(path)
  stack = _json(os.path.join(path, "modules.json"))
  kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
  unknown = [k for k in kinds if k not in _MODULES]
  if unknown or not kinds or kinds[0] != "Transformer":
    raise ConversionError(f"{path}: modules {kinds} are not Transformer, Pooling[, Dense][, Normalize]; "
                          f"not supported: {unknown or kinds[:1]}")
  folder = os.path.join(path, stack[0].get("path", ""))
  cfg, params = convert.from_hf(folder, head="encoder", **overrides)
  pooling = read_pooling(path)
  params = {"bert": params.get("bert", params)}
  for m, kind in zip(stack[1:], kinds[1:]):
    if kind == "Dense":
      sub = files.join(path, m.get("path", ""))
      if not files.isfile(files.join(sub, "model.safetensors")) and files.isfile(
          files.join(sub, "pytorch_model.bin")):  # sentence-transformers < 3 saved its Dense as a pickle
        raise ConversionError(f"{sub}: the Dense layer is only in pytorch_model.bin, a pickle bertjax does not "
                              "load; re-save the folder with sentence-transformers >= 3 (model.safetensors)")
      state = convert_files.read_safetensors(files.join(sub, "model.safetensors"))
      params["dense"] = {"kernel": np.asarray(state["linear.weight"], np.float32).T}
      if pooling.dense_bias:
        params["dense"]["bias"] = np.asarray(state["linear.bias"], np.float32)
  return cfg, params, pooling, folder


def write(cfg: model_lib.BertConfig, params, pooling: Pooling, out: str, max_seq_length: int = 512,
          family: str | None = None) -> None:
  """A sentence-transformers folder: the encoder as the family's HF model in `out`, 1_Pooling, and 2_Dense /
  Normalize where the model has them (the tokenizer files are the caller's). A gs:// or s3:// `out` is written
  locally and uploaded when complete (`files.local_target`)."""
  params = host_params(params)
  with files.local_target(out) as local:
    _write(cfg, params, pooling, local, max_seq_length, family)


def _write(cfg, params, pooling: Pooling, out: str, max_seq_length: int, family: str | None) -> None:
  convert.to_hf(cfg, params["bert"], out, head="encoder", family=family)
  stack = [{"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER}]
  files.makedirs(os.path.join(out, "1_Pooling"))
  with files.open(os.path.join(out, "1_Pooling", "config.json"), "w") as f:
    json.dump({"word_embedding_dimension": cfg.hidden_size, **{k: v == pooling.mode for k, v in _MODES.items()},
               "pooling_mode_mean_sqrt_len_tokens": False}, f, indent=2)
  stack.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
  if pooling.dense:
    sub = os.path.join(out, "2_Dense")
    files.makedirs(sub)
    state = {"linear.weight": np.ascontiguousarray(np.asarray(params["dense"]["kernel"], np.float32).T)}
    if pooling.dense_bias:
      state["linear.bias"] = np.asarray(params["dense"]["bias"], np.float32)
    save_file(state, os.path.join(sub, "model.safetensors"))
    act = {v: k for k, v in _ACTIVATIONS.items()}[pooling.dense_activation]
    with files.open(os.path.join(sub, "config.json"), "w") as f:
      json.dump({"in_features": cfg.hidden_size, "out_features": pooling.dense, "bias": pooling.dense_bias,
                 "activation_function": act}, f, indent=2)
    stack.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
  if pooling.normalize:
    stack.append({"idx": len(stack), "name": str(len(stack)), "path": f"{len(stack)}_Normalize",
                  "type": "sentence_transformers.models.Normalize"})
    files.makedirs(os.path.join(out, stack[-1]["path"]))
  with files.open(os.path.join(out, "modules.json"), "w") as f:
    json.dump(stack, f, indent=2)
  with files.open(os.path.join(out, "sentence_bert_config.json"), "w") as f:
    json.dump({"max_seq_length": max_seq_length, "do_lower_case": False}, f, indent=2)


def lowercases(path: str) -> bool:
  """Whether the folder's Transformer lowercases each text before its tokenizer (sentence_bert_config.json's
  do_lower_case: sentence-transformers applies str.lower() to the text, whatever the tokenizer does)."""
  if not files.isfile(files.join(path, "modules.json")):
    return False
  stack = _json(files.join(path, "modules.json"))
  first = stack[0] if isinstance(stack, list) and stack and isinstance(stack[0], dict) else {}
  return transformer_lowercases(files.join(path, first.get("path", "")))


def transformer_lowercases(folder: str) -> bool:
  """Whether a Transformer module's own folder has do_lower_case in its sentence_bert_config.json."""
  name = files.join(folder, "sentence_bert_config.json")
  return files.isfile(name) and _json(name).get("do_lower_case") is True


def lowercased(tok):
  """`tok` encoding each text lower-cased first, as sentence-transformers' Transformer(do_lower_case=True) does."""
  encode, offsets = tok._encode, tok._offsets
  tok._encode, tok._offsets = (lambda s: encode(s.lower())), (lambda s: offsets(s.lower()))
  return tok


def pylate_settings(path: str, conf: dict) -> dict:
  """The multi-vector Settings fields (but max_seq_length) of a PyLate ColBERT folder's
  config_sentence_transformers.json, PyLate's defaults where it is silent: the prefix token put after [CLS] by its
  id ("[Q] " / "[D] ", none when ""), texts cut at query_length / document_length with it, a query padded with
  [MASK] to query_length (do_query_expansion), attended or not (attend_to_expansion_tokens), the skiplist
  (punctuation; a word outside the vocabulary skips [UNK], as PyLate's ids give) dropped from documents, unit
  vectors, MaxSim."""
  similarity = str(conf.get("similarity_fn_name") or "MaxSim")
  if similarity.lower() != "maxsim":
    raise ConversionError(f"{path}: similarity {similarity!r}; a PyLate ColBERT folder scores with MaxSim")
  q_prefix, d_prefix, skip = conf.get("query_prefix"), conf.get("document_prefix"), conf.get("skiplist_words")
  q_len = int(conf.get("query_length") or 32)
  expansion = None
  if conf.get("do_query_expansion", True):
    expansion = ("fixed", bool(conf.get("attend_to_expansion_tokens", False)), None, q_len)
  return dict(query_length=q_len, document_length=int(conf.get("document_length") or 180), expansion=expansion,
              query_prompt="[Q] " if q_prefix is None else q_prefix,
              document_prompt="[D] " if d_prefix is None else d_prefix,
              skiplist=tuple(string.punctuation if skip is None else skip), skiplist_tasks=("document",),
              normalize=True, similarity="maxsim", prefix_tokens=True, skip_unknown=True)


@dataclasses.dataclass(frozen=True)
class Prompts:
  """The texts put before a query, a document and any other text (sentence-transformers' encode_query,
  encode_document and encode)."""
  query: str = ""
  document: str = ""
  default: str = ""


def st_config(path: str) -> dict:
  """The folder's config_sentence_transformers.json ({} when it has none)."""
  name = files.join(path, "config_sentence_transformers.json")
  if not files.isfile(name):
    return {}
  conf = _json(name)
  if not isinstance(conf, dict):
    raise ConversionError(f"{name}: not a JSON object")
  return conf


def read_prompts(path: str, conf: dict | None = None) -> Prompts:
  """The folder's prompts as sentence-transformers applies them: `default_prompt_name`'s prompt for `encode`; for
  encode_query the prompt named "query" (else the default); for encode_document the first of "document",
  "passage", "corpus" (else the default)."""
  conf = st_config(path) if conf is None else conf
  prompts = conf.get("prompts") or {}
  where = files.join(path, "config_sentence_transformers.json")
  if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
    raise ConversionError(f"{where}: prompts {prompts!r} is not a map of names to texts")
  name = conf.get("default_prompt_name")
  if name is not None and name not in prompts:
    raise ConversionError(f"{where}: default_prompt_name {name!r} is not one of the prompts {sorted(prompts)}")
  default = prompts[name] if name is not None else ""
  document = next((prompts[n] for n in ("document", "passage", "corpus") if n in prompts), default)
  return Prompts(prompts.get("query", default), document, default)


def pools_prompt(path: str) -> bool:
  """Whether the folder's Pooling averages the prompt's tokens with the text's (its `include_prompt`, default
  true); bertjax pools every token, so a folder that leaves the prompt out is refused when it has one."""
  stack = _json(files.join(path, "modules.json"))
  for m in stack if isinstance(stack, list) else []:
    if str(m.get("type", "")).rsplit(".", 1)[-1] == "Pooling":
      conf = _json(files.join(files.join(path, m.get("path", "")), "config.json"))
      return bool(conf.get("include_prompt", True))
  return True
