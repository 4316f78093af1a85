"""Shards as bytes and lines: the input paths a list of files and patterns names, each opened and decompressed by
its suffix, checked for binary content and read line by line robustly (undecodable bytes replaced, NUL bytes
dropped, huge lines cut into pieces, each counted in `CorpusStats`). `bertjax.data.corpus` makes documents of
them.
"""
from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import lzma
import os
from typing import IO, Iterator, Sequence

from bertjax import errors
from bertjax.core import files

MAX_LINE_BYTES = 1 << 20  # a longer "line" is read in pieces of this size (a 50 MB line never sits in memory twice)
_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


class CorpusError(errors.DataError):
  """A corpus that cannot be used (missing, binary, empty): names the file and what to do."""


class ShardError(CorpusError):
  """A shard whose content cannot be read (binary, corrupt, truncated, without the text column); with
  `skip_bad_records` the rest of it is skipped and counted."""


@dataclasses.dataclass
class CorpusStats:
  files: int = 0
  lines: int = 0
  documents: int = 0
  sentences: int = 0
  undecodable_lines: int = 0
  nul_bytes: int = 0
  split_long_lines: int = 0
  empty_documents: int = 0
  records: int = 0  # JSONL / Parquet / tfds records read
  bad_records: int = 0  # skipped with skip_bad_records
  bad_shards: int = 0  # unreadable shards (or their unreadable rest) skipped with skip_bad_records

  def warnings(self) -> list[str]:
    out = []
    if self.undecodable_lines:
      out.append(f"{self.undecodable_lines} line(s) had bytes that are not UTF-8 (replaced with U+FFFD)")
    if self.nul_bytes:
      out.append(f"{self.nul_bytes} NUL byte(s) dropped")
    if self.split_long_lines:
      out.append(f"{self.split_long_lines} line(s) longer than {MAX_LINE_BYTES} bytes read in pieces")
    if self.empty_documents:
      out.append(f"{self.empty_documents} empty document(s) skipped")
    if self.bad_records:
      out.append(f"{self.bad_records} bad record(s) skipped (skip_bad_records)")
    if self.bad_shards:
      out.append(f"{self.bad_shards} unreadable shard(s) skipped from the first bad byte on (skip_bad_records)")
    return out

  def merge(self, other: "CorpusStats") -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def strip_compression(path: str) -> str:
  root, ext = os.path.splitext(path)
  return root if ext.lower() in _COMPRESSION else path



def expand(patterns: Sequence) -> list[str]:
  """Input paths from files, glob patterns (sorted, each shard once) and tfds: specs, in the order given."""
  out: list[str] = []
  for pattern in patterns:
    pattern = os.fspath(pattern)
    if pattern.startswith("tfds:"):
      out.append(pattern)
      continue
    reach(pattern)  # an unreachable store or a missing bucket: one line, before any listing
    if any(c in pattern for c in "*?["):
      if files.is_remote(pattern):
        matches = remote_glob(pattern)
      else:
        matches = [m for m in files.glob(pattern) if files.isfile(m)]
      if not matches:
        raise CorpusError(f"{pattern}: no file matches this pattern")
      out.extend(matches)
    elif (not files.is_remote(pattern) or _has_driver(pattern)) and files.isdir(pattern):
      raise CorpusError(f"{pattern}: is a folder; name its files, or a pattern such as '{pattern.rstrip('/')}/*.txt'")
    else:
      out.append(files.absolute(pattern))
  seen: set = set()
  return [p for p in out if not (p in seen or seen.add(p))]


def _beam_filesystems():
  """Beam's file systems, for a scheme that fsspec has no driver for here but a Beam worker can read; else None."""
  try:
    from apache_beam.io.filesystems import CompressionTypes, FileSystems
  except ImportError:
    return None
  return FileSystems, CompressionTypes


def _has_driver(path: str) -> bool:
  try:
    files.filesystem(files.scheme(path))
  except (errors.Error, OSError):  # no fsspec driver, or one that cannot start here (hdfs without a JVM)
    if _beam_filesystems() is None:
      raise
    return False
  return True


def reach(path: str) -> None:
  """`files.reach` for a path this machine has a driver for (a scheme only Beam knows is left to Beam)."""
  if files.is_remote(path) and _has_driver(path):
    files.reach(path)


def remote_glob(pattern: str) -> list[str]:
  """gs://, s3://, ... matches through `bertjax.core.files` (fsspec); a scheme only Beam's file systems know
  (on a Beam worker) through those."""
  if _has_driver(pattern):
    files.reach(pattern)
    return files.glob(pattern)
  FileSystems, _ = _beam_filesystems()
  return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def open_raw(path: str) -> IO[bytes]:
  if files.is_remote(path):
    if not _has_driver(path):
      FileSystems, CompressionTypes = _beam_filesystems()
      return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    files.reach(path)
    try:
      return files.open(path, "rb")
    except FileNotFoundError:
      raise CorpusError(f"{path}: corpus file not found") from None
  if not files.isfile(path):
    raise CorpusError(f"{path}: corpus file not found")
  return files.open(path, "rb")


def open_shard(path: str) -> IO[bytes]:
  """A shard's bytes, decompressed by its suffix (.gz, .bz2, .xz, .zst)."""
  raw = open_raw(path)
  kind = _COMPRESSION.get(os.path.splitext(path)[1].lower())
  if kind == "gzip":
    return gzip.GzipFile(fileobj=raw)
  if kind == "bz2":
    return bz2.BZ2File(raw)
  if kind == "xz":
    return lzma.LZMAFile(raw)
  if kind == "zstd":
    import zstandard
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
  return raw


READ_ERRORS = (OSError, EOFError, lzma.LZMAError, ValueError)  # corrupt compressed streams raise these


def check_not_binary(path: str, head: bytes) -> None:
  if not head:
    return
  text = head.decode("utf-8", errors="replace")
  bad = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f\v"))
  if bad > 0.3 * len(text):
    raise ShardError(f"{path}: looks like a binary file ({bad} of the first {len(text)} characters are not "
                      "text); pass UTF-8 text (or name its format)")


def read_lines(f: IO[bytes], stats: CorpusStats) -> Iterator[str]:
  pending = b""
  while True:
    limit = max(1, MAX_LINE_BYTES - len(pending))  # the carried-over tail + this chunk stay within the cap
    chunk = f.readline(limit)
    if not chunk:
      break
    if not chunk.endswith(b"\n") and len(chunk) >= limit:
      # Cut a huge line at its last whitespace so no word is broken; the rest starts the next piece.
      stats.split_long_lines += 1
      cut = max(chunk.rfind(b" "), chunk.rfind(b"\t"))
      if cut > 0:
        chunk, pending_next = chunk[:cut], chunk[cut + 1:]
      else:
        pending_next = b""
      piece = pending + chunk
      pending = pending_next
      yield decode_line(piece, stats)
      continue
    piece, pending = pending + chunk, b""
    yield decode_line(piece, stats)
  if pending:
    yield decode_line(pending, stats)


def decode_line(raw: bytes, stats: CorpusStats) -> str:
  stats.lines += 1
  if b"\x00" in raw:
    stats.nul_bytes += raw.count(b"\x00")
    raw = raw.replace(b"\x00", b"")
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    stats.undecodable_lines += 1
    return raw.decode("utf-8", errors="replace")


def file_lines(path, stats: CorpusStats) -> Iterator[str]:
  """The decoded lines of one text shard, after checking it is text; a corrupt compressed stream is named."""
  path = os.fspath(path)
  with open_shard(path) as f:
    try:
      f = io.BufferedReader(f) if not hasattr(f, "peek") else f
      check_not_binary(path, f.peek(8192)[:8192])
      stats.files += 1
      yield from read_lines(f, stats)
    except CorpusError:
      raise
    except READ_ERRORS as e:
      raise ShardError(f"{path}: cannot be read past line {stats.lines} ({type(e).__name__}: {e}); the shard "
                        "is corrupt or truncated") from None
