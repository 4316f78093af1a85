"""A folder of embedding blocks that a killed run resumes: `manifest.json` binds it to one model, corpus and
block size; each finished block is `block-NNNNN.npy` (or `.npz` for sparse and multi-vector blocks), written whole
(locally then renamed; on an object store one upload), with `block-NNNNN.json` beside it holding its rows, shape
and SHA-256. A block is trusted only when its record is there and its bytes still match it. The folder may be a
local path or a gs:// / s3:// prefix (`bertjax.core.files`).

The folder is the command's own: one that holds files of the same names without a manifest, or another run's
manifest, or a model folder or workdir, is refused unless `overwrite` (which replaces only these names).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from typing import Callable, Iterator, Sequence

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
      if _read_json(files.join(folder, "manifest.json")) != key:
        raise BlockStoreError(f"{flag} {folder}: process 0 did not open it for this run")

  def _prepare(self, overwrite: bool) -> None:
    folder, key, flag = self.folder, self.key, self.flag
    check_folder(folder, flag, overwrite)
    files.makedirs(folder)
    manifest = files.join(folder, "manifest.json")
    found = _read_json(manifest) if files.isfile(manifest) else None
    if found == key:
      return
    if found is not None and not (isinstance(found, dict) and isinstance(found.get("fingerprint"), str)):
      raise BlockStoreError(f"{flag} {folder}: its manifest.json is not a block folder's (no model fingerprint); "
                            f"choose another {flag}")
    if found is not None and not overwrite:
      held = found if isinstance(found, dict) else {}
      was, now = held.get("precision", "float32"), key.get("precision", "float32")
      if was != now or held.get("calibration") != key.get("calibration"):  # quantized blocks (embeddings.quantize)
        raise BlockStoreError(f"{flag} {folder}: holds {was} embeddings{' of another --calibration' * (was == now)}"
                              f", and this run asks for {now}; choose another {flag}, or pass --overwrite to "
                              "replace them")
      raise BlockStoreError(f"{flag} {folder}: holds embeddings of another model, corpus or block size "
                            f"({held.get('documents', '?')} documents, block {held.get('block', '?')}); choose "
                            f"another {flag}, or pass --overwrite to replace them")
    for n in files.listdir(folder):  # another run's blocks, or (with --overwrite) files of these names
      if OWN.match(n):
        files.remove(files.join(folder, n))
    files.write_whole(manifest, json.dumps(key))

  def path(self, b: int, suffix: str = ".npy") -> str:
    return files.join(self.folder, f"block-{b:05d}{suffix}")

  def done(self, b: int) -> bool:
    return files.isfile(self.path(b, ".json"))

  def done_blocks(self, n: int) -> list[int]:
    return [b for b in range(n) if self.done(b)]

  def read(self, b: int, rows: int):
    """Block b's array (or, from an .npz, its dict of arrays), checked against its record: None when the block
    was never finished (a run killed before its record was written embeds it again)."""
    if not self.done(b):
      return None
    record = _read_json(self.path(b, ".json"))
    path = self.path(b, record.get("suffix", ".npy")) if isinstance(record, dict) else ""
    if not isinstance(record, dict) or not files.isfile(path):
      raise BlockStoreError(f"{self.path(b, '.json')}: not a record of a finished block; delete it to embed that "
                            "block again")
    raw = files.read_bytes(path)
    if hashlib.sha256(raw).hexdigest() != record.get("sha256") or record.get("rows") != rows:
      raise BlockStoreError(f"{path}: changed since it was written (its SHA-256 or rows differ from "
                            f"{files.basename(self.path(b, '.json'))}: truncated or replaced); delete both files "
                            "to embed that block again")
    loaded = np.load(io.BytesIO(raw), allow_pickle=False)
    return dict(loaded) if isinstance(loaded, np.lib.npyio.NpzFile) else loaded

  def write(self, b: int, payload, rows: int) -> None:
    """Block b written whole (locally into a temporary file then renamed, on an object store one upload), then its
    record (the block counts as done from there)."""
    suffix = ".npz" if isinstance(payload, dict) else ".npy"
    buf = io.BytesIO()
    if isinstance(payload, dict):
      np.savez(buf, **payload)
    else:
      np.save(buf, payload)
    raw = buf.getvalue()
    files.write_whole(self.path(b, suffix), raw)
    digest = hashlib.sha256(raw).hexdigest()
    files.write_whole(self.path(b, ".json"), json.dumps({"rows": rows, "suffix": suffix, "sha256": digest}))


def each_block(embed: Callable[[Sequence[str]], object], texts: Sequence[str], block: int,
               store: BlockStore | None = None, select: Callable[[int], bool] | None = None
               ) -> Iterator[tuple[int, object]]:
  """(b, payload) of each block of `block` texts: the store's copy when it holds the finished block (checked
  against its record), else `embed(chunk)`, kept in the store before it is yielded, so a killed run resumes at its
  first missing block. `select(b)`: only those blocks (one host's share); the others are neither embedded nor
  yielded."""
  for b, start in enumerate(range(0, len(texts), block)):
    if select is not None and not select(b):
      continue
    chunk = texts[start:start + block]
    held = store.read(b, len(chunk)) if store is not None else None
    if held is None:
      held = embed(chunk)
      if store is not None:
        store.write(b, held, len(chunk))
    yield b, held


def check_folder(folder: str, flag: str = "--out", overwrite: bool = False) -> None:
  """What can be said of a block folder before the model is loaded: not a file, not a model folder or workdir; without
  a manifest (a folder this tool has not opened), no files of a block folder's names (another tool's, or a user's)
  and no other files, unless `overwrite` (which replaces only files of the block folder's names)."""
  if files.is_remote(folder):
    files.reach(folder)
    if files.isfile(folder):
      raise BlockStoreError(f"{flag} {folder}: exists and is not a folder")
    if not files.isdir(folder):
      return
  elif not os.path.lexists(folder):  # a dangling link is refused below, not written through
    return
  elif not files.isdir(folder):
    raise BlockStoreError(f"{flag} {folder}: exists and is not a folder")
  held = [n for n in MODEL_FILES if files.exists(files.join(folder, n))]
  if held:
    raise BlockStoreError(f"{flag} {folder}: holds a model or workdir ({', '.join(held)}); embeddings go in a "
                          "folder of their own")
  if files.isfile(files.join(folder, "manifest.json")):
    return
  names = sorted(files.listdir(folder))
  own = [n for n in names if OWN.match(n)]
  if own and not overwrite:
    raise BlockStoreError(f"{flag} {folder}: holds files it did not write ({', '.join(own[:3])}"
                          f"{', ...' if len(own) > 3 else ''}); choose another {flag}, or pass --overwrite to replace "
                          "them")
  others = [n for n in names if not OWN.match(n)]
  if others and not overwrite:
    raise BlockStoreError(f"{flag} {folder}: a folder with other files ({', '.join(others[:3])}"
                          f"{', ...' if len(others) > 3 else ''}); embeddings go in a new or empty folder (--overwrite "
                          "writes beside them)")


def _read_json(path: str):
  try:
    return files.read_json(path)
  except (OSError, ValueError):
    return None
