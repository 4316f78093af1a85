"""Text corpora: robust streaming of documents from files, and the offline demo corpus.

Input formats:
  "lines": the original BERT format, one sentence per line, blank lines between documents.
  "paragraphs": plain prose, blank lines between paragraphs (a paragraph is a document); sentences are split.

Hostile input never crashes deep in the pipeline: undecodable bytes are replaced, NUL bytes dropped, huge
lines cut into pieces, each counted in `CorpusStats` and reported; a binary file or an empty corpus is a clear
error naming the file.
"""
from __future__ import annotations

import ast
import dataclasses
import logging
import os
import re
import sysconfig
from typing import Iterator, Sequence

from bertjax import errors

MAX_LINE_BYTES = 1 << 20  # a longer "line" is read in pieces of this size (a 50 MB line never sits in memory twice)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


class CorpusError(errors.DataError):
  """A corpus that cannot be used (missing, binary, empty): names the file and what to do."""


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
    return out

  def merge(self, other: "CorpusStats") -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def split_sentences(text: str) -> list[str]:
  """A plain rule-based splitter: sentence-final punctuation followed by space and a capital or digit."""
  text = " ".join(text.split())
  return [s for s in _SENTENCE_END.split(text) if s.strip()]


def _check_not_binary(path: str) -> None:
  with open(path, "rb") as f:
    head = f.read(8192)
  if not head:
    return
  text = head.decode("utf-8", errors="replace")
  bad = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f\v"))
  if bad > 0.3 * len(text):
    raise CorpusError(f"{path}: looks like a binary file ({bad} of the first {len(text)} characters are not "
                      "text); pass UTF-8 text files")


def _read_lines(path: str, stats: CorpusStats) -> Iterator[str]:
  with open(path, "rb") as f:
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
        yield _decode(piece, stats)
        continue
      piece, pending = pending + chunk, b""
      yield _decode(piece, stats)
    if pending:
      yield _decode(pending, stats)


def _decode(raw: bytes, stats: CorpusStats) -> str:
  stats.lines += 1
  if b"\x00" in raw:
    stats.nul_bytes += raw.count(b"\x00")
    raw = raw.replace(b"\x00", b"")
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    stats.undecodable_lines += 1
    return raw.decode("utf-8", errors="replace")


def _file_lines(path, stats: CorpusStats) -> Iterator[str]:
  """The decoded lines of one corpus file, after checking it exists and is text."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise CorpusError(f"{path}: corpus file not found")
  _check_not_binary(path)
  stats.files += 1
  yield from _read_lines(path, stats)


def iter_lines(paths: Sequence[str], stats: CorpusStats | None = None) -> Iterator[str]:
  """Every line of the files, decoded as `read_documents` does (for tokenizer training)."""
  stats = stats if stats is not None else CorpusStats()
  for path in paths:
    yield from _file_lines(path, stats)


def read_documents(paths: Sequence[str], fmt: str = "lines", stats: CorpusStats | None = None
                   ) -> Iterator[list[str]]:
  """Yield documents (lists of sentences) from text files, streaming; never holds the corpus."""
  if fmt not in ("lines", "paragraphs"):
    raise errors.ConfigError(f"unknown corpus format {fmt!r}; choose lines or paragraphs")
  stats = stats if stats is not None else CorpusStats()
  if not paths:
    raise CorpusError("no corpus files given")
  for path in paths:
    doc: list[str] = []
    for line in _file_lines(path, stats):
      line = line.strip()
      if not line:
        if doc:
          stats.documents += 1
          yield _finish(doc, fmt, stats)
        doc = []
        continue
      doc.append(line)
    if doc:
      stats.documents += 1
      yield _finish(doc, fmt, stats)


def _finish(doc: list[str], fmt: str, stats: CorpusStats) -> list[str]:
  if fmt == "paragraphs":
    doc = split_sentences(" ".join(doc))
  stats.sentences += len(doc)
  return doc


# ----------------------------------------------------------------------------- the demo corpus
def _stdlib_docstrings() -> Iterator[tuple[str, list[str]]]:
  """(module name, paragraphs) from the standard library's source, parsed (never imported)."""
  root = sysconfig.get_paths()["stdlib"]
  skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip",
          "__pycache__", "tkinter"}
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith(("test", "config-")))
    files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
  for path in sorted(files):
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    paragraphs = []
    for node in ast.walk(tree):
      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(node)
        if doc:
          paragraphs += _prose_paragraphs(doc)
    if paragraphs:
      yield os.path.relpath(path, root), paragraphs


def _prose_paragraphs(text: str) -> list[str]:
  out = []
  for para in re.split(r"\n\s*\n", text):
    lines = [ln.strip() for ln in para.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith((">>>", "...", "$", "#", "|", "+-", "=="))]
    para = " ".join(lines)
    letters = sum(c.isalpha() for c in para)
    if len(para) > 40 and letters > 0.6 * len(para) and " " in para:
      out.append(para)
  return out


def _pydoc_topics() -> Iterator[tuple[str, list[str]]]:
  try:
    from pydoc_data import topics
  except ImportError:
    return
  for name in sorted(topics.topics):
    paragraphs = _prose_paragraphs(topics.topics[name])
    if paragraphs:
      yield f"pydoc:{name}", paragraphs


def build_demo_corpus(out_path: str, min_sentences: int = 2) -> CorpusStats:
  """Write the offline demo corpus (Python's own docs) in the original format; deterministic, no network.

  One document per module docstring set / pydoc topic; one sentence per line; blank lines between documents.
  """
  stats = CorpusStats()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = out_path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for source in (_stdlib_docstrings(), _pydoc_topics()):
      for _, paragraphs in source:
        sentences = [s for p in paragraphs for s in split_sentences(p)]
        if len(sentences) < min_sentences:
          stats.empty_documents += 1
          continue
        stats.documents += 1
        stats.sentences += len(sentences)
        f.write("\n".join(sentences) + "\n\n")
  os.replace(tmp, out_path)
  if stats.documents == 0:
    raise CorpusError("the demo corpus came out empty: this Python ships no docstrings or pydoc topics")
  logging.info("demo corpus: %d documents, %d sentences -> %s", stats.documents, stats.sentences, out_path)
  return stats
