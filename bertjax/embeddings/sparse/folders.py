"""sentence-transformers SparseEncoder folders: a fill-mask Transformer (or the older MLMTransformer) then
SpladePooling, or an inference-free one, a Router whose query route is a SparseStaticEmbedding (a weight per
vocabulary term) and whose document route is that Transformer and pooling. Read and written here; encoding is
`bertjax.embeddings.sparse.encoder`'s. A folder may be a gs:// or s3:// one (`bertjax.core.files`): its JSON read there,
written into a local folder that is uploaded when complete."""
from __future__ import annotations

import json
import os

import numpy as np
import safetensors.numpy

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert.table import ConversionError
from bertjax.core import files

POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
# The stack's first module: sentence-transformers >= 5.4's fill-mask Transformer, or the MLMTransformer that 5.0-5.3
# saved (sentence_transformers.sparse_encoder.models.MLMTransformer, since
# sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer): a fill-mask Transformer alike.
_TRANSFORMERS = ("Transformer", "MLMTransformer")


ROUTER = "sentence_transformers.base.modules.router.Router"
_TYPES = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
          "SpladePooling": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
          "SparseStaticEmbedding": "sentence_transformers.sparse_encoder.modules.sparse_static_embedding."
                                   "SparseStaticEmbedding"}
QUERY_DIR, DOCUMENT_DIR = "query_0_SparseStaticEmbedding", "document_0_Transformer"
POOLING_DIR = "document_1_SpladePooling"


def write_folder(cfg: model_lib.BertConfig, params, out: str, max_seq_length: int, pooling: str = "max",
                 activation: str = "relu", query_weights: np.ndarray | None = None,
                 max_active_dims: int | None = None) -> tuple[str, ...]:
  """A sentence-transformers SparseEncoder folder: the family's MLM model (a fill-mask Transformer) and its
  SpladePooling; with `query_weights` an inference-free one, a Router whose query route is a
  SparseStaticEmbedding of those weights and whose document route is the MLM model and pooling. Returns the
  sub-folders that take the tokenizer's files (the caller's). A gs:// or s3:// `out` is written locally and
  uploaded when complete (`files.local_target`). `max_active_dims`: the terms each vector keeps (None: all)."""
  with files.local_target(out) as local:
    return _write_folder(cfg, params, local, max_seq_length, pooling, activation, query_weights, max_active_dims)


def _write_folder(cfg, params, out: str, max_seq_length: int, pooling: str, activation: str,
                  query_weights: np.ndarray | None, max_active_dims: int | None = None) -> tuple[str, ...]:
  doc = out if query_weights is None else os.path.join(out, DOCUMENT_DIR)
  pool_dir = "1_SpladePooling" if query_weights is None else POOLING_DIR
  files.makedirs(doc)
  convert.to_hf(cfg.replace(nsp_head=False), {k: v for k, v in params.items() if k not in ("nsp", "static_query")},
                doc, head="pretraining")
  files.makedirs(os.path.join(out, pool_dir))
  transformer = {"max_seq_length": max_seq_length, "do_lower_case": False, "transformer_task": "fill-mask",
                 "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                 "module_output_name": "token_embeddings"}
  documents = {
      "sentence_bert_config.json" if query_weights is None else f"{DOCUMENT_DIR}/sentence_bert_config.json":
          transformer,
      "config_sentence_transformers.json": {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
                                            "default_prompt_name": None, "similarity_fn_name": "dot",
                                            "max_active_dims": max_active_dims or None},
      f"{pool_dir}/config.json": {"pooling_strategy": pooling, "activation_function": activation,
                                  "embedding_dimension": None}}
  if query_weights is None:
    documents["modules.json"] = [{"idx": 0, "name": "0", "path": "", "type": _TYPES["Transformer"]},
                                 {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": _TYPES["SpladePooling"]}]
    subs: tuple[str, ...] = ("",)
  else:
    files.makedirs(os.path.join(out, QUERY_DIR))
    safetensors.numpy.save_file({"weight": np.asarray(query_weights, np.float32)},
                                os.path.join(out, QUERY_DIR, "model.safetensors"))
    documents["modules.json"] = [{"idx": 0, "name": "0", "path": "", "type": ROUTER}]
    documents["router_config.json"] = {
        "types": {QUERY_DIR: _TYPES["SparseStaticEmbedding"], DOCUMENT_DIR: _TYPES["Transformer"],
                  POOLING_DIR: _TYPES["SpladePooling"]},
        "structure": {"query": [QUERY_DIR], "document": [DOCUMENT_DIR, POOLING_DIR]},
        "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}}
    documents[f"{QUERY_DIR}/config.json"] = {"frozen": False}
    subs = (DOCUMENT_DIR, QUERY_DIR)
  for name, content in documents.items():
    with files.open(os.path.join(out, name), "w") as f:
      json.dump(content, f, indent=2)
  return subs


def _modules(path: str) -> list:
  try:
    stack = files.read_json(files.join(path, "modules.json"))
    [m.get("type", "") for m in stack]
    return stack
  except (OSError, ValueError, AttributeError, TypeError) as e:
    raise ConversionError(f"{path}/modules.json: not a list of modules ({str(e).splitlines()[0][:200]})") from None


def _router(path: str) -> dict | None:
  """The routes of a folder whose stack is one Router ({"query": [sub-folders], "document": [...]} and the
  sub-folders' module kinds), or None for a plain stack."""
  stack = _modules(path)
  if len(stack) != 1 or not stack[0].get("type", "").endswith(".Router"):
    return None
  try:
    conf = files.read_json(files.join(path, "router_config.json"))
    kinds = {name: t.rsplit(".", 1)[-1] for name, t in conf["types"].items()}
    routes = {route: list(conf["structure"][route]) for route in ("query", "document")}
  except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
    raise ConversionError(f"{path}/router_config.json: not a Router's types and query / document structure "
                          f"({str(e).splitlines()[0][:200]})") from None
  return {"routes": routes, "kinds": kinds}


def is_folder(path: str) -> bool:
  """Whether `path` is a sentence-transformers folder whose stack (or a Router's) has a SpladePooling module."""
  for name in ("modules.json", "router_config.json"):
    try:
      if "SpladePooling" in files.read_text(files.join(path, name)):
        return True
    except OSError:
      pass
  return False


def read_folder(path: str) -> tuple[str, str, str]:
  """(transformer sub-folder, pooling, activation) of a sentence-transformers SparseEncoder folder, or of an
  inference-free one's document route; a stack that is not a Transformer then SpladePooling (or a Router with a
  SparseStaticEmbedding query route) is a one-line error naming its modules."""
  router = _router(path)
  if router is None:
    stack = _modules(path)
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
    subs = [m.get("path", "") for m in stack]
  else:
    subs = router["routes"]["document"]
    kinds = [router["kinds"].get(n, "?") for n in subs]
    query = [router["kinds"].get(n, "?") for n in router["routes"]["query"]]
    if query != ["SparseStaticEmbedding"] and query != kinds:
      raise ConversionError(f"{path}: a Router whose query route is {query}; bertjax reads a SparseStaticEmbedding "
                            "(inference-free) or the document route's modules")
  if len(kinds) != 2 or kinds[0] not in _TRANSFORMERS or kinds[1] != "SpladePooling":
    raise ConversionError(f"{path}: modules {kinds} are not a sparse encoder's Transformer, SpladePooling")
  sub = files.join(path, subs[1])
  try:
    conf = files.read_json(files.join(sub, "config.json"))
  except (OSError, ValueError) as e:
    raise ConversionError(f"{sub}/config.json: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  pooling, activation = conf.get("pooling_strategy", "max"), conf.get("activation_function", "relu")
  if pooling not in POOLINGS or activation not in ACTIVATIONS:
    raise ConversionError(f"{sub}/config.json: SpladePooling {pooling!r}, {activation!r}; bertjax computes "
                          f"pooling {POOLINGS} with activation {ACTIVATIONS}")
  return files.join(path, subs[0]), pooling, activation


def read_static_query(path: str) -> tuple[np.ndarray, int | None] | None:
  """(weights [vocabulary], the query length limit or None) of an inference-free folder's SparseStaticEmbedding,
  or None when the folder encodes queries with its MLM model."""
  router = _router(path)
  if router is None or [router["kinds"].get(n) for n in router["routes"]["query"]] != ["SparseStaticEmbedding"]:
    return None
  sub = files.join(path, router["routes"]["query"][0])
  try:
    weight = safetensors.numpy.load(files.read_bytes(files.join(sub, "model.safetensors")))["weight"]
  except (OSError, KeyError, ValueError) as e:
    raise ConversionError(f"{sub}/model.safetensors: no SparseStaticEmbedding weight "
                          f"({str(e).splitlines()[0][:200]})") from None
  limit = None
  try:
    m = files.read_json(files.join(sub, "tokenizer_config.json")).get("model_max_length")
    limit = int(m) if isinstance(m, (int, float)) and m < 1e9 else None
  except (OSError, ValueError):
    pass
  return np.asarray(weight, np.float32).reshape(-1), limit
