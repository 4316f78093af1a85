"""A folder of embedding blocks that a killed run resumes: `manifest.json` binds it to one model, corpus and
block size; each finished block is `block-NNNNN.npy` (or `.npz` for sparse and multi-vector blocks), written whole
and then renamed, with `block-NNNNN.json` beside it holding its rows, shape and SHA-256. A block is trusted only
when its record is there and its bytes still match it.

The folder is the command's own: one that holds files of the same names without a manifest, or another run's
manifest, or a model folder or workdir, is refused unless `overwrite` (which replaces only these names).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Sequence

import jax
import numpy as np

from bertjax import errors
from bertjax.core import files

OWN = re.compile(r"^(manifest\.json|ids\.json|block-\d{5}\.(npy|npz|json))$")
MODEL_FILES = ("config.json", "modules.json", "model.safetensors", "finetune.json", "checkpoints", "creation.json")


class BlockStoreError(errors.DataError):
  """A block folder that is not this run's, or a block that changed since it was written."""


def corpus_key(fingerprint: str, texts: Sequence[str], block: int, ids: Sequence[str] = ()) -> dict:
  """What binds a folder: a digest of the model's fingerprint, the texts (and ids) in order, and the block size."""
  h = hashlib.sha256(fingerprint.encode())
  for t in texts:
    h.update(t.encode("utf-8", "surrogatepass") + b"\0")
  for i in ids:
    h.update(b"\1" + i.encode("utf-8", "surrogatepass"))
  return {"fingerprint": h.hexdigest(), "documents": len(texts), "block": block}


class BlockStore:
  def __init__(self, folder: str, key: dict, flag: str = "--out", overwrite: bool = False):
    """Opens (or makes) `folder` for the run `key` names (`corpus_key`); `flag` names it in messages. Process 0
    checks and prepares the folder, the others wait for it (each writes its own blocks)."""
    self.folder, self.key, self.flag = folder, key, flag
    if jax.process_index() == 0:
      self._prepare(overwrite)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("bertjax_block_store")
      if _read_json(os.path.join(folder, "manifest.json")) != key:
        raise BlockStoreError(f"{flag} {folder}: process 0 did not open it for this run")

  def _prepare(self, overwrite: bool) -> None:
    folder, key, flag = self.folder, self.key, self.flag
    check_folder(folder, flag, overwrite)
    os.makedirs(folder, exist_ok=True)
    manifest = os.path.join(folder, "manifest.json")
    found = _read_json(manifest) if os.path.isfile(manifest) else None
    if found == key:
      return
    if found is not None and not overwrite:
      held = found if isinstance(found, dict) else {}
      raise BlockStoreError(f"{flag} {folder}: holds embeddings of another model, corpus or block size "
                            f"({held.get('documents', '?')} documents, block {held.get('block', '?')}); choose "
                            f"another {flag}, or pass --overwrite to replace them")
    for n in os.listdir(folder):  # another run's blocks, or (with --overwrite) files of these names
      if OWN.match(n):
        os.remove(os.path.join(folder, n))
    files.write_whole(manifest, json.dumps(key))

  def path(self, b: int, suffix: str = ".npy") -> str:
    return os.path.join(self.folder, f"block-{b:05d}{suffix}")

  def done(self, b: int) -> bool:
    return os.path.isfile(self.path(b, ".json"))

  def done_blocks(self, n: int) -> list[int]:
    return [b for b in range(n) if self.done(b)]

  def read(self, b: int, rows: int):
    """Block b's array (or, from an .npz, its dict of arrays), checked against its record: None when the block
    was never finished (a run killed before its record was written embeds it again)."""
    if not self.done(b):
      return None
    record = _read_json(self.path(b, ".json"))
    path = self.path(b, record.get("suffix", ".npy")) if isinstance(record, dict) else ""
    if not isinstance(record, dict) or not os.path.isfile(path):
      raise BlockStoreError(f"{self.path(b, '.json')}: not a record of a finished block; delete it to embed that "
                            "block again")
    with open(path, "rb") as f:
      raw = f.read()
    if hashlib.sha256(raw).hexdigest() != record.get("sha256") or record.get("rows") != rows:
      raise BlockStoreError(f"{path}: changed since it was written (its SHA-256 or rows differ from "
                            f"{os.path.basename(self.path(b, '.json'))}: truncated or replaced); delete both files "
                            "to embed that block again")
    import io
    loaded = np.load(io.BytesIO(raw), allow_pickle=False)
    return dict(loaded) if isinstance(loaded, np.lib.npyio.NpzFile) else loaded

  def write(self, b: int, payload, rows: int) -> None:
    """Block b written whole and renamed into place, then its record (the block counts as done from there)."""
    suffix = ".npz" if isinstance(payload, dict) else ".npy"
    path = self.path(b, suffix)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
      if isinstance(payload, dict):
        np.savez(f, **payload)
      else:
        np.save(f, payload)
    os.replace(tmp, path)
    with open(path, "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    files.write_whole(self.path(b, ".json"), json.dumps({"rows": rows, "suffix": suffix, "sha256": digest}))


def check_folder(folder: str, flag: str = "--out", overwrite: bool = False) -> None:
  """What can be said of a block folder before the model is loaded: not a file, not a model folder or workdir, and
  no files of a block folder's names without its manifest (another tool's, or a user's) unless `overwrite`."""
  if not os.path.lexists(folder):
    return
  if not os.path.isdir(folder):
    raise BlockStoreError(f"{flag} {folder}: exists and is not a folder")
  held = [n for n in MODEL_FILES if os.path.exists(os.path.join(folder, n))]
  if held:
    raise BlockStoreError(f"{flag} {folder}: holds a model or workdir ({', '.join(held)}); embeddings go in a "
                          "folder of their own")
  own = sorted(n for n in os.listdir(folder) if OWN.match(n) and n != "manifest.json")
  if own and not os.path.isfile(os.path.join(folder, "manifest.json")) and not overwrite:
    raise BlockStoreError(f"{flag} {folder}: holds files it did not write ({', '.join(own[:3])}"
                          f"{', ...' if len(own) > 3 else ''}); choose another {flag}, or pass --overwrite to replace "
                          "them")


def _read_json(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
