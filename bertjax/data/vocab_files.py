"""A tokenizer's files on disk: which files one is made of, its content hash, copies of it, finding it in a folder,
and a check that a serialised protobuf (a sentencepiece model) ends on a record boundary."""
from __future__ import annotations

import hashlib
import os

from bertjax.core import files as store  # (named so: `files` below is this module's own function)


def files(path: str) -> list[str]:
  """Every file `load(path)` reads: the path itself, and for a byte-level BPE `vocab.json` the `merges.txt` and
  `tokenizer.json` beside it when present (the latter wins, as in `load`)."""
  path = os.fspath(path)
  out = [path]
  if path.endswith(".json") and store.basename(path) != "tokenizer.json":
    folder = store.parent(path)
    out += [store.join(folder, n) for n in ("merges.txt", "tokenizer.json")
            if store.isfile(store.join(folder, n))]
  return out


def fingerprint(path: str) -> str:
  """sha256 over every file `load(path)` reads (names and bytes): what data dirs and workdirs record of their
  tokenizer, to refuse one that changed."""
  h = hashlib.sha256()
  for f in files(path):
    h.update(store.basename(f).encode() + b"\0")
    with store.open(f, "rb") as fh:
      for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    h.update(b"\0")
  return h.hexdigest()


def copy_into(path: str, folder: str) -> str:
  """Copies the tokenizer's files into `folder` (each written whole, then renamed); returns the copy's path."""
  store.makedirs(folder)
  for f in files(path):
    store.copy(f, store.join(folder, store.basename(f)))
  return store.join(folder, store.basename(os.fspath(path)))


MAIN_FILES = ("vocab.txt", "spm.model", "vocab.json", "tokenizer.json")


def find_in(folder: str) -> str | None:
  """The tokenizer a folder holds (a workdir's or data dir's copy), or None."""
  for name in MAIN_FILES:
    if store.isfile(store.join(folder, name)):
      return store.join(folder, name)
  models = [n for n in store.listdir(folder) if n.endswith(".model")] if store.isdir(folder) else []
  return store.join(folder, models[0]) if models else None


def proto_records(raw: bytes) -> list[tuple[int, int | bytes]] | None:
  """(field number, value) of each top-level record of a serialised protobuf message (a varint or fixed-width
  field as an int, a length-delimited one as bytes), or None if it ends inside a record."""
  def varint(i):
    shift = value = 0
    while True:
      if i >= len(raw):
        raise IndexError
      b = raw[i]
      value |= (b & 0x7F) << shift
      i, shift = i + 1, shift + 7
      if not b & 0x80:
        return value, i
  out, i = [], 0
  try:
    while i < len(raw):
      key, i = varint(i)
      wire = key & 7
      if wire == 0:
        value, i = varint(i)
      elif wire in (1, 5):
        width = 8 if wire == 1 else 4
        if i + width > len(raw):
          raise IndexError
        value, i = int.from_bytes(raw[i:i + width], "little"), i + width
      elif wire == 2:
        n, i = varint(i)
        if i + n > len(raw):
          raise IndexError
        value, i = raw[i:i + n], i + n
      else:
        return None
      out.append((key >> 3, value))
  except IndexError:
    return None
  return out


def proto_fields(raw: bytes) -> set[int] | None:
  """The top-level field numbers of a serialised protobuf message, or None if it ends inside a record."""
  records = proto_records(raw)
  return None if records is None else {field for field, _ in records}
