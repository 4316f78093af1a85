"""Users' row files (CSV, TSV, JSONL) in bounded host memory, as grain and seqio read line-oriented files: one
streaming pass decodes and checks every row and keeps each row's byte offset (an int64 a row, never the text);
row i is then read back by a ranged read of its bytes, through a small cache of blocks so that neighbouring rows
share one request.

The bound is `BERTJAX_ROW_BUFFER` (bytes, or with a K/M/G suffix: 64M, 1G), 256 MiB by default: the blocks of a
file held at once, in the pass and in the cache alike (a single row longer than that is still read whole). A CSV
field may hold newlines inside quotes, so a CSV row's end is where the csv module finishes the record, not the
next newline. Errors name path:line as a whole-file read names them.
"""
from __future__ import annotations

import array
import collections
import csv
import io
import os
import re

import numpy as np

from bertjax import errors
from bertjax.core import cache, files

ENV = "BERTJAX_ROW_BUFFER"
DEFAULT_BUFFER = 256 << 20
MAX_BLOCK = 4 << 20  # one request: large enough to amortise a round trip to a bucket, small against the bound
BOM = b"\xef\xbb\xbf"
# A JSONL record ends at "\n" only (a JSON string may hold U+2028); a CSV line where io's newline="" ends one.
_ENDS = {"jsonl": re.compile(rb"\n"), "csv": re.compile(rb"\r\n|\r|\n")}
# A text field may be a whole document: no cap below what fits in memory (the csv module's default is 131,072).
csv.field_size_limit(2 ** 31 - 1)


def buffer_size() -> int:
  """The host memory a row file may hold at once: $BERTJAX_ROW_BUFFER, else 256 MiB."""
  value = os.environ.get(ENV)
  return cache.parse_size(value, ENV) if value else DEFAULT_BUFFER


def _kind(path: str) -> str:
  return "jsonl" if path.endswith(".jsonl") else "csv"


class RowFile:
  """The rows of one .csv / .tsv / .jsonl file: `scan` streams them once, in order, as (line, row dict) and keeps
  their offsets; afterwards `len` and `rows(indices)` read any of them back."""

  def __init__(self, path: str, buffer: int | None = None):
    self.path = os.fspath(path)
    self.buffer = buffer or buffer_size()
    self.block = min(MAX_BLOCK, max(256, self.buffer // 4))
    self.kind = _kind(self.path)
    self.delimiter = "\t" if self.path.endswith(".tsv") else ","
    self.header: list[str] | None = None
    self.bom = 0
    self.offsets: np.ndarray | None = None  # [rows + 1]: row i is bytes offsets[i]:offsets[i + 1]
    self._blocks: collections.OrderedDict[int, bytes] = collections.OrderedDict()

  # --------------------------------------------------------------------------- the streaming pass
  def _lines(self):
    """(byte offset, raw line with its terminator) of every line, read a block at a time."""
    size = files.size(self.path)
    ends = _ENDS[self.kind]
    buf, pos, at = b"", 0, 0
    for start in range(0, size, self.block):
      chunk = files.read_range(self.path, start, min(size, start + self.block))
      if start == 0 and chunk.startswith(BOM):
        chunk, at, self.bom = chunk[len(BOM):], len(BOM), len(BOM)
      buf, pos = buf[pos:] + chunk, 0
      last = start + self.block >= size
      while (m := ends.search(buf, pos)) is not None:
        if m.group() == b"\r" and m.end() == len(buf) and not last:
          break  # a "\r" at the block's end may be the first half of "\r\n"
        yield at, buf[pos:m.end()]
        at += m.end() - pos
        pos = m.end()
    if pos < len(buf):
      yield at, buf[pos:]

  def _texts(self, span: list):
    """Each line decoded; `span` follows the byte offsets [start, end) of the last line given out."""
    newlines = 0
    for at, raw in self._lines():
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise errors.TaskDataError(f"{self.path}:{newlines + 1}: not UTF-8 ({e.reason} at byte "
                                   f"{at - self.bom + e.start}); save the file as UTF-8") from None
      newlines += raw.count(b"\n")
      span[:] = at, at + len(raw)
      yield text

  def scan(self):
    """(line, row) of every row in file order, each checked as it is decoded; keeps the offsets."""
    offsets, span = array.array("q"), [0, 0]
    if self.kind == "jsonl":
      for n, text in enumerate(self._texts(span), 1):
        text = text[:-1] if text.endswith("\n") else text
        if text.strip():
          offsets.append(span[0])
          yield n, files.json_object(text, f"{self.path}:{n}", errors.TaskDataError)
    else:
      reader = csv.DictReader(self._texts(span), delimiter=self.delimiter, quoting=csv.QUOTE_MINIMAL)
      try:
        self.header = reader.fieldnames
        offsets.append(span[1])
        for row in reader:  # the reader pulls a record's lines and no more: span ends where the record does
          offsets.append(span[1])
          yield reader.line_num, row
      except csv.Error as e:
        raise errors.TaskDataError(f"{self.path}:{reader.line_num}: not readable as "
                                   f"{'TSV' if self.delimiter == chr(9) else 'CSV'} ({e})") from None
      offsets.pop()  # the last record's end is the file's end, appended below for both kinds
    offsets.append(span[1])
    self.offsets = np.frombuffer(offsets, np.int64)

  # --------------------------------------------------------------------------- random access
  def __len__(self) -> int:
    return len(self.offsets) - 1

  def _read(self, start: int, end: int) -> bytes:
    """Bytes [start, end) through the block cache (least recently used blocks leave first)."""
    parts, keep = [], max(1, self.buffer // self.block)
    for b in range(start // self.block, (end - 1) // self.block + 1):
      data = self._blocks.pop(b, None)
      if data is None:
        data = files.read_range(self.path, b * self.block, (b + 1) * self.block)
      self._blocks[b] = data
      while len(self._blocks) > keep:
        self._blocks.popitem(last=False)
      lo, hi = max(start, b * self.block) - b * self.block, min(end, (b + 1) * self.block) - b * self.block
      parts.append(data[lo:hi])
    return b"".join(parts)

  def row(self, i: int) -> dict:
    start, end = int(self.offsets[i]), int(self.offsets[i + 1])
    text = self._read(start, end).decode("utf-8")
    if self.kind == "jsonl":
      return files.json_object(text.split("\n", 1)[0], f"{self.path} (row {i + 1})", errors.TaskDataError)
    reader = csv.DictReader(io.StringIO(text, newline=""), self.header, delimiter=self.delimiter,
                            quoting=csv.QUOTE_MINIMAL)
    return next(reader)

  def rows(self, indices) -> list[dict]:
    return [self.row(int(i)) for i in indices]
