"""Reading HF model folders: safetensors files checked before anything is allocated, sharded or not, and
never a pickle (`pytorch_model.bin`, `.pt`, `.ckpt`: loading one can run arbitrary code)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from bertjax import errors

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
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such safetensors file")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
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
    return load_file(path)
  except Exception as e:  # safetensors raises its own error types
    raise ConversionError(f"{path}: cannot read safetensors file: {e}") from None


def read_hf_dir(path: str) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json as a dict, state dict) from an HF model folder: model.safetensors or a sharded index."""
  path = os.fspath(path)
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"{path}: no config.json (expected an HF BERT model folder)")
  with open(cfg_path, encoding="utf-8") as f:
    try:
      hf_cfg = json.load(f)
    except json.JSONDecodeError as e:
      raise ConversionError(f"{cfg_path}: not valid JSON ({e})") from None
  single = os.path.join(path, "model.safetensors")
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(single):
    return hf_cfg, read_safetensors(single)
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for shard in shards:
      state.update(read_safetensors(os.path.join(path, os.path.basename(shard))))
    return hf_cfg, state
  pickles = [n for n in os.listdir(path) if n.endswith(PICKLE_SUFFIXES)]
  if pickles:
    read_safetensors(os.path.join(path, pickles[0]))  # raises the refusal with its reason
  raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")


def write_hf_dir(out_dir: str, state: dict, hf_cfg: dict) -> None:
  """OUT/model.safetensors (written whole, then renamed into place) and OUT/config.json."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  tmp = os.path.join(out_dir, "model.safetensors.tmp")
  save_file(state, tmp, metadata={"format": "pt"})
  os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
  with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(hf_cfg, f, indent=2)
