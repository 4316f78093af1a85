"""Reading HF model folders: safetensors files checked before anything is allocated, sharded or not, and
never a pickle (`pytorch_model.bin`, `.pt`, `.ckpt`: loading one can run arbitrary code). Folders and files may
be local or in an object store (gs://, s3://; `bertjax.core.files`): safetensors reads a local copy."""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np

from bertjax import errors
from bertjax.core import files

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own cap on the JSON header
ConversionError = errors.ConversionError


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """Load a .safetensors file after checking it is one: refuses pickles, oversized headers, truncation."""
  path = os.fspath(path)
  if path.endswith(PICKLE_SUFFIXES):
    raise ConversionError(f"{path}: refusing to load a pickle-based checkpoint (loading a pickle can run "
                          "arbitrary code). Convert it to safetensors first, e.g. with transformers' "
                          "`save_pretrained(..., safe_serialization=True)` in a trusted environment.")
  if not files.isfile(path):
    raise FileNotFoundError(f"{path}: no such safetensors file")
  local = files.local_copy(path)  # the path itself when local
  size = files.size(local)
  with files.open(local, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise ConversionError(f"{path}: truncated safetensors file ({size} bytes; no header)")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
      raise ConversionError(f"{path}: safetensors header claims {n} bytes, over the {MAX_HEADER_BYTES}-byte cap")
    if 8 + n > size:
      raise ConversionError(f"{path}: truncated safetensors file (header needs {n} bytes, file has {size})")
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ConversionError(f"{path}: corrupt safetensors header ({e})") from None
  data_len = size - 8 - n
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      end = int(info["data_offsets"][1])
    except (KeyError, TypeError, IndexError, ValueError):
      raise ConversionError(f"{path}: corrupt safetensors header entry {name!r}") from None
    if end > data_len:
      raise ConversionError(f"{path}: truncated safetensors file: tensor {name!r} ends at byte {end} of the "
                            f"data section, which has {data_len}")
  from safetensors.numpy import load_file
  try:
    return load_file(local)
  except Exception as e:  # safetensors raises its own error types
    raise ConversionError(f"{path}: cannot read safetensors file: {e}") from None


def read_hf_dir(path: str) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json as a dict, state dict) from an HF model folder: model.safetensors or a sharded index."""
  path = os.fspath(path)
  cfg_path = files.join(path, "config.json")
  if not files.isfile(cfg_path):
    raise FileNotFoundError(f"{path}: no config.json (expected an HF BERT model folder)")
  try:
    hf_cfg = json.loads(files.read_text(cfg_path))
  except json.JSONDecodeError as e:
    raise ConversionError(f"{cfg_path}: not valid JSON ({e})") from None
  single = files.join(path, "model.safetensors")
  index = files.join(path, "model.safetensors.index.json")
  if files.isfile(single):
    return hf_cfg, legacy_names(read_safetensors(single))
  if files.isfile(index):
    shards = sorted(set(files.read_json(index)["weight_map"].values()))
    state = {}
    for shard in shards:
      state.update(read_safetensors(files.join(path, os.path.basename(shard))))
    return hf_cfg, legacy_names(state)
  pickles = [n for n in files.listdir(path) if n.endswith(PICKLE_SUFFIXES)]
  if pickles:
    read_safetensors(files.join(path, pickles[0]))  # raises the refusal with its reason
  raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")


def legacy_names(state: dict) -> dict:
  """LayerNorm.gamma / .beta (as some writers save them, e.g. PyLate 1.6 under transformers 5.3) read as
  LayerNorm.weight / .bias, transformers' own "legacy" renaming on load."""
  names = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}
  out = {}
  for k, v in state.items():
    tail = next((t for t in names if k.endswith(t)), None)
    out[k[:-len(tail)] + names[tail] if tail else k] = v
  return out


def write_hf_dir(out_dir: str, state: dict, hf_cfg: dict) -> None:
  """OUT/model.safetensors (written whole, then renamed into place) and OUT/config.json."""
  from safetensors.numpy import save_file
  files.makedirs(out_dir)
  if files.is_remote(out_dir):  # one upload, atomic on the store
    with files.local_target(files.join(out_dir, "model.safetensors")) as local:
      save_file(state, local, metadata={"format": "pt"})
  else:
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    files.rename(tmp, os.path.join(out_dir, "model.safetensors"))
  files.write_whole(files.join(out_dir, "config.json"), json.dumps(hf_cfg, indent=2))


TOKENIZER_FILES = ("vocab.txt", "spiece.model", "spm.model", "sentencepiece.bpe.model", "vocab.json", "merges.txt",
                   "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# The file an HF folder's tokenizer is read from, first found first: BERT's vocab.txt, a sentencepiece model as
# bertjax exports one, a byte-level BPE's vocab.json (merges.txt beside), a saved tokenizer.json, then the
# sentencepiece models as DeBERTa-v2/v3 (spm.model) and XLM-R (sentencepiece.bpe.model) publish them.
HF_TOKENIZER_FILES = ("vocab.txt", "spiece.model", "vocab.json", "tokenizer.json", "spm.model",
                      "sentencepiece.bpe.model")


def hf_tokenizer(path: str) -> tuple[str, bool]:
  """(the tokenizer file of the HF folder `path`, do_lower_case): the first of HF_TOKENIZER_FILES it holds (a
  local copy for a remote folder, `local_tokenizer`); do_lower_case from tokenizer_config.json for vocab.txt (a
  sentencepiece model keeps its casing in its normaliser or its tokenizer_config.json; byte-level BPE keeps case).
  A folder with none of them gives its vocab.txt path, which `tokenizer.load` reports as not found."""
  present = set(files.listdir(path)) if files.isdir(path) else set()
  name = next((n for n in HF_TOKENIZER_FILES if n in present and files.isfile(files.join(path, n))), None)
  if name is not None and name != "vocab.txt":
    return local_tokenizer(files.join(path, name)), False
  lower = True
  if "tokenizer_config.json" in present:
    lower = files.read_json(files.join(path, "tokenizer_config.json")).get("do_lower_case", lower)
  vocab = files.join(path, "vocab.txt")
  return (local_tokenizer(vocab) if name else vocab), lower


def local_tokenizer(path: str) -> str:
  """A local path of the tokenizer file `path` (the path itself when local): for a remote one, a copy of it in
  the cache (`bertjax.core.files.cache_root`) with the files a tokenizer reads beside it (a byte-level BPE's
  vocab.json needs merges.txt), since the tokenizer libraries read only local files."""
  if not path or not files.is_remote(path):
    return path
  if not files.isfile(path):
    raise FileNotFoundError(f"{path}: no such tokenizer file")
  folder, name = files.parent(path), files.basename(path)
  key = hashlib.sha256(files.absolute(folder).encode()).hexdigest()[:16]
  target = os.path.join(files.cache_root(), key, "tokenizer")
  os.makedirs(target, exist_ok=True)
  present = set(files.listdir(folder))
  for n in dict.fromkeys((name, *TOKENIZER_FILES)):  # each copied afresh: small files, which may have changed
    if n in present:
      files.copy(files.join(folder, n), os.path.join(target, n))
  return os.path.join(target, name)
