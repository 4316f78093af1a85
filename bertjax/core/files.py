"""The one file layer: every path a tool reads or writes (a workdir, `init=`, data, a tokenizer, an output folder)
goes through these functions, so that a local path and an object-store path (gs://, s3://, any fsspec scheme)
behave alike.

Local paths use the operating system directly (os, open), exactly as a local run always has. Remote paths go
through fsspec (gcsfs, s3fs), the stack orbax, tfds and etils.epath use. What differs on an object store:
- there are no folders, only names with slashes: `makedirs` is a no-op and a "folder" exists when an object
  is under it;
- an upload is atomic, so `write_whole` is one upload where a local write is write-then-rename;
- listings are not cached (a second host's writes must be seen at once);
- an unreachable store answers nothing for minutes while the client retries: `reach` bounds the first contact
  (BERTJAX_REMOTE_TIMEOUT_S, 30 s by default) and every failure to reach a store is one `DataPathError` line.

Libraries that read or write only local files (sentencepiece, tokenizers, safetensors, matplotlib, tensorboardX
event files) get a local copy through `local_copy` or write into `local_target`, which uploads when done.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from typing import IO, Iterator

from bertjax.core import storage

# What the layer offers of the stores themselves: which paths are remote, their buckets, a bounded first contact.
scheme, is_remote, bucket, reach, filesystem = (storage.scheme, storage.is_remote, storage.bucket, storage.reach,
                                                storage.filesystem)
_fs, _remote = storage.store_of, storage.translated


def _local(path) -> str:
  path = os.fspath(path)
  return path[len("file://"):] if path.startswith("file://") else path


# ----------------------------------------------------------------------------- names
def join(base, *parts: str) -> str:
  base = os.fspath(base)
  if is_remote(base):
    out = base.rstrip("/")
    for p in parts:
      out = f"{out}/{p.strip('/')}" if p else out
    return out
  return os.path.join(base, *parts)


def parent(path) -> str:
  path = os.fspath(path)
  if is_remote(path):
    head, _, _ = path.rstrip("/").rpartition("/")
    return head if "://" in head and not head.endswith(":/") else path
  return os.path.dirname(path)


def basename(path) -> str:
  path = os.fspath(path)
  return path.rstrip("/").rpartition("/")[2] if is_remote(path) else os.path.basename(path)


def absolute(path) -> str:
  """A local path made absolute; a remote one as it is (without a trailing slash)."""
  path = os.fspath(path)
  return path.rstrip("/") if is_remote(path) else os.path.abspath(_local(path))


# ----------------------------------------------------------------------------- queries
def exists(path) -> bool:
  if not is_remote(path):
    return os.path.exists(_local(path))
  with _remote(path):
    return _fs(path).exists(path)


def isfile(path) -> bool:
  if not is_remote(path):
    return os.path.isfile(_local(path))
  with _remote(path):
    return _fs(path).isfile(path)


def isdir(path) -> bool:
  """A local folder, or a remote prefix with at least one object under it."""
  if not is_remote(path):
    return os.path.isdir(_local(path))
  with _remote(path):
    return _fs(path).isdir(os.fspath(path).rstrip("/"))


def listdir(path) -> list[str]:
  """The names directly under a folder or prefix, sorted; [] for a remote prefix with nothing under it."""
  if not is_remote(path):
    return sorted(os.listdir(_local(path)))
  with _remote(path):
    fs = _fs(path)
    path = os.fspath(path).rstrip("/")
    if not fs.isdir(path):
      return []
    return sorted({p.rstrip("/").rpartition("/")[2] for p in fs.ls(path, detail=False)} - {""})


def glob(pattern) -> list[str]:
  """Matches of a glob pattern, sorted, as full paths (with the scheme for remote ones)."""
  pattern = os.fspath(pattern)
  if not is_remote(pattern):
    import glob as glob_lib
    return sorted(os.path.abspath(m) for m in glob_lib.glob(_local(pattern), recursive=True))
  s = scheme(pattern)
  with _remote(pattern):
    return sorted(p if "://" in p else f"{s}://{p}" for p in _fs(pattern).glob(pattern))


def size(path) -> int:
  if not is_remote(path):
    return os.path.getsize(_local(path))
  with _remote(path):
    return int(_fs(path).size(path))


def sizes(path) -> dict[str, int]:
  """{name: bytes} of the files directly under a folder or prefix, from one listing (not one request a file)."""
  if not is_remote(path):
    root = _local(path)
    return {n: os.path.getsize(os.path.join(root, n)) for n in sorted(os.listdir(root))
            if os.path.isfile(os.path.join(root, n))}
  with _remote(path):
    fs = _fs(path)
    path = os.fspath(path).rstrip("/")
    return {e["name"].rstrip("/").rpartition("/")[2]: int(e["size"]) for e in fs.ls(path, detail=True)
            if e.get("type") == "file"}


def walk_files(path) -> list[str]:
  """Every file under a folder or prefix, as paths relative to it, sorted."""
  if not is_remote(path):
    root = _local(path)
    out = []
    for d, _, names in os.walk(root):
      out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)
  with _remote(path):
    fs = _fs(path)
    path = os.fspath(path).rstrip("/")
    inner = path.split("://", 1)[1]
    return sorted(p[len(inner) + 1:] for p in fs.find(path) if p.startswith(inner + "/"))


# ----------------------------------------------------------------------------- reading and writing
def open(path, mode: str = "r", encoding: str | None = None, errors_: str | None = None) -> IO:  # noqa: A001
  """A file object; text modes decode UTF-8 unless `encoding` says otherwise. Remote writes ("w", "wb") become
  one object when the file is closed."""
  if "b" not in mode and encoding is None:
    encoding = "utf-8"
  if not is_remote(path):
    return builtins.open(_local(path), mode, encoding=encoding, errors=errors_)
  if "a" in mode or "+" in mode:
    raise ValueError(f"{path}: objects cannot be appended to or updated in place ({mode!r})")
  with _remote(path):
    return _fs(path).open(os.fspath(path), mode, encoding=encoding, errors=errors_)


def read_bytes(path) -> bytes:
  if not is_remote(path):
    with builtins.open(_local(path), "rb") as f:
      return f.read()
  with _remote(path):
    return _fs(path).cat_file(os.fspath(path))


def read_range(path, start: int, end: int) -> bytes:
  """Bytes [start, end) of a file: on an object store one ranged request, so that a reader holds what it asked
  for and no more (a remote file object reads ahead in blocks of megabytes)."""
  if not is_remote(path):
    with builtins.open(_local(path), "rb") as f:
      f.seek(start)
      return f.read(max(0, end - start))
  with _remote(path):
    return _fs(path).cat_file(os.fspath(path), start=start, end=end)


def read_text(path) -> str:
  return read_bytes(path).decode("utf-8")


def read_json(path):
  return json.loads(read_bytes(path))


def write_whole(path, data: str | bytes) -> None:
  """`data` into `path`, written whole: locally into a temporary file then renamed (a killed run leaves the
  previous file, not half of one); on an object store as one upload, which is atomic there."""
  raw = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(path):
    with _remote(path):
      _fs(path).pipe_file(os.fspath(path), raw)
    return
  path = _local(path)
  tmp = f"{path}.tmp-{os.getpid()}"
  with builtins.open(tmp, "wb") as f:
    f.write(raw)
  os.replace(tmp, path)


def append_text(path, text: str) -> None:
  """Appends `text` to a local file; an object is rewritten whole with it (callers buffer their lines, so that
  this happens at their flushes, not per line)."""
  if not is_remote(path):
    with builtins.open(_local(path), "a", encoding="utf-8") as f:
      f.write(text)
    return
  old = read_bytes(path) if exists(path) else b""
  write_whole(path, old + text.encode("utf-8"))


def makedirs(path) -> None:
  """A local folder and its parents; nothing on an object store, where a prefix exists once an object is in it."""
  if not is_remote(path):
    os.makedirs(_local(path), exist_ok=True)


def remove(path) -> None:
  """A file or object, if there."""
  if not is_remote(path):
    with contextlib.suppress(FileNotFoundError):
      os.remove(_local(path))
    return
  with _remote(path), contextlib.suppress(FileNotFoundError):
    _fs(path).rm_file(os.fspath(path))


def rmtree(path) -> None:
  """A folder or prefix and everything in it, if there."""
  if not is_remote(path):
    shutil.rmtree(_local(path), ignore_errors=True)
    return
  with _remote(path):
    fs = _fs(path)
    if fs.exists(path):
      fs.rm(os.fspath(path).rstrip("/"), recursive=True)


def rename(src, dst) -> None:
  """A local rename (atomic); on an object store a copy then a delete."""
  if not is_remote(src) and not is_remote(dst):
    os.replace(_local(src), _local(dst))
    return
  copy(src, dst)
  if isdir(src):
    rmtree(src)
  else:
    remove(src)


def copy(src, dst) -> None:
  """A file or a whole folder from `src` to `dst`, either side local or remote; a file is written whole."""
  if isdir(src):
    for rel in walk_files(src):
      target = join(dst, *rel.split(os.sep))
      makedirs(parent(target))
      copy(join(src, *rel.split(os.sep)), target)
    return
  if not is_remote(src) and not is_remote(dst):
    tmp = f"{_local(dst)}.tmp-{os.getpid()}"
    shutil.copyfile(_local(src), tmp)
    os.replace(tmp, _local(dst))
    return
  if is_remote(dst) and not is_remote(src):
    with _remote(dst):
      _fs(dst).put_file(_local(src), os.fspath(dst))
    return
  if is_remote(src) and not is_remote(dst):
    tmp = f"{_local(dst)}.tmp-{os.getpid()}"
    with _remote(src):
      _fs(src).get_file(os.fspath(src), tmp)
    os.replace(tmp, _local(dst))
    return
  write_whole(dst, read_bytes(src))


# ----------------------------------------------------------------------------- local stand-ins for local-only libraries
def cache_root() -> str:
  """Where remote files are copied for libraries that read only local files (BERTJAX_CACHE, else a folder in
  the system's temporary directory)."""
  return os.environ.get("BERTJAX_CACHE") or os.path.join(tempfile.gettempdir(), "bertjax-cache")


def local_copy(path) -> str:
  """A local path holding what `path` holds (a file or a folder): the path itself when it is local, else a copy
  in the cache, keyed by the remote path and refreshed when an object's size changed."""
  if not is_remote(path):
    return _local(path)
  path = os.fspath(path).rstrip("/")
  key = hashlib.sha256(path.encode()).hexdigest()[:16]
  target = os.path.join(cache_root(), key, basename(path))
  if isdir(path):
    os.makedirs(target, exist_ok=True)
    for rel in walk_files(path):
      _refresh(join(path, rel), os.path.join(target, rel))
  else:
    _refresh(path, target)
  return target


def _refresh(remote: str, local: str) -> None:
  if os.path.isfile(local) and os.path.getsize(local) == size(remote):
    return
  os.makedirs(os.path.dirname(local), exist_ok=True)
  copy(remote, local)


@contextlib.contextmanager
def local_target(path) -> Iterator[str]:
  """A local path to write `path`'s contents into (a file or a folder), uploaded to `path` when the block ends
  without error; for a local `path`, the path itself."""
  if not is_remote(path):
    yield _local(path)
    return
  with tempfile.TemporaryDirectory(prefix="bertjax-out-") as tmp:
    local = os.path.join(tmp, basename(path))
    yield local
    if os.path.isdir(local):
      copy(local, path)
    elif os.path.exists(local):
      copy(local, path)


# ----------------------------------------------------------------------------- users' text
def utf8_text(path: str, error: type[Exception]) -> str:
  """A text file's contents (a leading byte-order mark dropped, as spreadsheet programs write one); bytes that
  are not UTF-8 are `error` naming the line, not characters silently replaced."""
  raw = read_bytes(path)
  try:
    return raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise error(f"{path}:{line}: not UTF-8 ({e.reason} at byte {e.start}); save the file as UTF-8") from None


def json_object(text: str, where: str, error: type[Exception]) -> dict:
  """One JSONL record as a dict; anything else is `error` naming `where` (path:line)."""
  try:
    row = json.loads(text)
  except json.JSONDecodeError as e:
    raise error(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
  if not isinstance(row, dict):
    raise error(f"{where}: not a JSON object (a {type(row).__name__})")
  return row
