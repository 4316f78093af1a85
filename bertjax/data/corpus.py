"""Text corpora: robust streaming of documents (lists of sentences) from shards, and the offline demo corpus.

Input formats (`ReadOptions.format`; "auto" picks by file name):
  "lines": the original BERT format, one sentence per line, blank lines between documents (.txt and the rest).
  "paragraphs": plain prose, blank lines between paragraphs (a paragraph is a document); sentences are split.
  "jsonl": one JSON object per line (HF `datasets` exports, FineWeb-style dumps); the record's `text_field` is a
      document (.jsonl, .json).
  "parquet": one row per document, the `text_field` column (.parquet).
  "tfds": `tfds:NAME[/CONFIG][:SPLIT]`, a prepared tensorflow-datasets text dataset (e.g. wikipedia) read through
      `tfds.data_source`; each record's `text_field` is a document.
Files may be compressed (.gz, .bz2, .xz, .zst); inputs may be glob patterns over many shards.

Hostile input never crashes deep in the pipeline: undecodable bytes are replaced, NUL bytes dropped, huge
lines cut into pieces, each counted in `CorpusStats` and reported; a binary shard, a corrupt Parquet/JSONL shard,
a record without the text field or an empty corpus is a clear error naming the shard (and the record), or, with
`skip_bad_records`, skipped and counted.
"""
from __future__ import annotations

import ast
import bz2
import dataclasses
import glob
import gzip
import io
import json
import logging
import lzma
import os
import re
import sysconfig
from typing import IO, Iterator, Sequence

from bertjax import errors

MAX_LINE_BYTES = 1 << 20  # a longer "line" is read in pieces of this size (a 50 MB line never sits in memory twice)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


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


SPLITTERS = ("sentencex", "regex")
FORMATS = ("auto", "lines", "paragraphs", "jsonl", "parquet", "tfds")
_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


@dataclasses.dataclass(frozen=True)
class ReadOptions:
  """How shards become documents (picklable: Beam workers carry it)."""
  format: str = "auto"  # one of FORMATS; auto: .jsonl/.json -> jsonl, .parquet -> parquet, tfds:... -> tfds, else lines
  text_field: str = "text"  # the JSONL key / Parquet column / tfds feature holding a document's text
  splitter: str = "sentencex"  # sentence splitter for paragraphs, jsonl, parquet and tfds text
  language: str = "en"  # the splitter's language (sentencex covers ~300)
  skip_bad_records: bool = False  # skip and count bad records and unreadable shards instead of stopping

  def __post_init__(self):
    if self.format not in FORMATS:
      raise errors.ConfigError(f"unknown corpus format {self.format!r}; choose one of {list(FORMATS)}")
    if self.splitter not in SPLITTERS:
      raise errors.ConfigError(f"unknown sentence splitter {self.splitter!r}; choose one of {list(SPLITTERS)}")

  def format_of(self, path: str) -> str:
    if self.format != "auto":
      return self.format
    if path.startswith("tfds:"):
      return "tfds"
    stem = _strip_compression(path)
    if stem.endswith((".jsonl", ".json", ".ndjson")):
      return "jsonl"
    if stem.endswith(".parquet"):
      return "parquet"
    return "lines"


def split_sentences(text: str, splitter: str = "sentencex", language: str = "en") -> list[str]:
  """Sentences of one paragraph, whitespace normalised. "sentencex" (Wikimedia's rule-based segmenter: known
  abbreviations, initials, decimals, quotes; 43/48 of the English Golden Rules, ~80 MB/s) or "regex" (sentence-final
  punctuation followed by space and a capital or digit: 28/48, no abbreviation list)."""
  text = " ".join(text.split())
  if not text:
    return []
  if splitter == "regex":
    return [s for s in _SENTENCE_END.split(text) if s.strip()]
  import sentencex
  return [s.strip() for s in sentencex.segment(language, text) if s.strip()]


def text_to_sentences(text: str, opts: ReadOptions) -> list[str]:
  """A document's text: paragraphs at blank lines, sentences within each (a sentence never spans two)."""
  return [s for para in re.split(r"\n\s*\n", text) for s in split_sentences(para, opts.splitter, opts.language)]


def _strip_compression(path: str) -> str:
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
    if any(c in pattern for c in "*?["):
      if "://" in pattern:
        matches = _remote_glob(pattern)
      else:
        matches = sorted(os.path.abspath(m) for m in glob.glob(pattern, recursive=True))
      matches = [m for m in matches if "://" in m or os.path.isfile(m)]
      if not matches:
        raise CorpusError(f"{pattern}: no file matches this pattern")
      out.extend(matches)
    elif "://" not in pattern and os.path.isdir(pattern):
      raise CorpusError(f"{pattern}: is a folder; name its files, or a pattern such as '{pattern.rstrip('/')}/*.txt'")
    else:
      out.append(pattern if "://" in pattern else os.path.abspath(pattern))
  seen: set = set()
  return [p for p in out if not (p in seen or seen.add(p))]


def _remote_glob(pattern: str) -> list[str]:
  """gs://, s3://, hdfs:// ... matches, through Beam's file systems where Beam is installed (what its workers
  use), else etils.epath."""
  try:
    from apache_beam.io.filesystems import FileSystems
  except ImportError:
    from etils import epath
    scheme, rest = pattern.split("://", 1)
    bucket, _, inner = rest.partition("/")
    return sorted(str(p) for p in epath.Path(f"{scheme}://{bucket}").glob(inner))
  return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def _open_raw(path: str) -> IO[bytes]:
  if "://" in path:
    try:
      from apache_beam.io.filesystems import CompressionTypes, FileSystems
    except ImportError:
      from etils import epath
      return epath.Path(path).open("rb")
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
  if not os.path.isfile(path):
    raise CorpusError(f"{path}: corpus file not found")
  return open(path, "rb")


def open_shard(path: str) -> IO[bytes]:
  """A shard's bytes, decompressed by its suffix (.gz, .bz2, .xz, .zst)."""
  raw = _open_raw(path)
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


_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, ValueError)  # corrupt compressed streams raise these


def _check_not_binary(path: str, head: bytes) -> None:
  if not head:
    return
  text = head.decode("utf-8", errors="replace")
  bad = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f\v"))
  if bad > 0.3 * len(text):
    raise ShardError(f"{path}: looks like a binary file ({bad} of the first {len(text)} characters are not "
                      "text); pass UTF-8 text (or name its format)")


def _read_lines(f: IO[bytes], stats: CorpusStats) -> Iterator[str]:
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
  """The decoded lines of one text shard, after checking it is text; a corrupt compressed stream is named."""
  path = os.fspath(path)
  with open_shard(path) as f:
    try:
      f = io.BufferedReader(f) if not hasattr(f, "peek") else f
      _check_not_binary(path, f.peek(8192)[:8192])
      stats.files += 1
      yield from _read_lines(f, stats)
    except CorpusError:
      raise
    except _READ_ERRORS as e:
      raise ShardError(f"{path}: cannot be read past line {stats.lines} ({type(e).__name__}: {e}); the shard "
                        "is corrupt or truncated") from None


def iter_texts(paths: Sequence[str], opts: "ReadOptions | None" = None,
               stats: CorpusStats | None = None) -> Iterator[str]:
  """Every sentence of the corpus, whatever its format (tokenizer training)."""
  for doc in read_documents(paths, opts=opts, stats=stats):
    yield from doc


def _bad(path: str, where: str, why: str, opts: ReadOptions, stats: CorpusStats) -> None:
  """A bad record: an error naming the shard and the record, or counted and skipped."""
  if not opts.skip_bad_records:
    raise CorpusError(f"{path}: {where}: {why} (pass --skip_bad_records to skip and count such records)")
  stats.bad_records += 1
  if stats.bad_records <= 10:
    logging.warning("skipping %s: %s: %s", path, where, why)


def _record_document(text, path: str, where: str, opts: ReadOptions, stats: CorpusStats) -> list[str] | None:
  if isinstance(text, bytes):
    try:
      text = text.decode("utf-8")
    except UnicodeDecodeError:
      stats.undecodable_lines += 1
      text = text.decode("utf-8", errors="replace")
  if not isinstance(text, str):
    _bad(path, where, f"field {opts.text_field!r} is {type(text).__name__}, not text", opts, stats)
    return None
  if "\x00" in text:
    stats.nul_bytes += text.count("\x00")
    text = text.replace("\x00", "")
  stats.records += 1
  return text_to_sentences(text, opts)


def _jsonl_documents(path: str, opts: ReadOptions, stats: CorpusStats) -> Iterator[list[str]]:
  for n, line in enumerate(_file_lines(path, stats), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      _bad(path, f"line {n}", f"not valid JSON ({e.msg} at column {e.colno})", opts, stats)
      continue
    if not isinstance(record, dict) or opts.text_field not in record:
      keys = sorted(record)[:8] if isinstance(record, dict) else type(record).__name__
      _bad(path, f"line {n}", f"no field {opts.text_field!r} (it has {keys}); name the field with --text_field",
           opts, stats)
      continue
    doc = _record_document(record[opts.text_field], path, f"line {n}", opts, stats)
    if doc is not None:
      yield doc


def _parquet_documents(path: str, opts: ReadOptions, stats: CorpusStats) -> Iterator[list[str]]:
  import pyarrow as pa
  import pyarrow.parquet as pq
  with _open_raw(path) as raw:
    try:
      pf = pq.ParquetFile(raw)
    except (pa.ArrowException, OSError, ValueError) as e:
      raise ShardError(f"{path}: not a readable Parquet file ({str(e)[:200]})") from None
    names = pf.schema_arrow.names
    if opts.text_field not in names:
      raise ShardError(f"{path}: no column {opts.text_field!r} (columns: {names[:12]}); name it with --text_field")
    stats.files += 1
    row = 0
    for group in range(pf.num_row_groups):
      try:
        column = pf.read_row_group(group, columns=[opts.text_field]).column(0).to_pylist()
      except (pa.ArrowException, OSError, ValueError) as e:
        raise ShardError(f"{path}: row group {group} cannot be read ({str(e)[:200]}); the shard is corrupt or "
                          "truncated") from None
      for text in column:
        row += 1
        doc = _record_document(text, path, f"row {row}", opts, stats)
        if doc is not None:
          yield doc


def _tfds_documents(spec: str, opts: ReadOptions, stats: CorpusStats, data_dir: str | None
                    ) -> Iterator[list[str]]:
  import tensorflow_datasets as tfds
  name, _, split = spec[len("tfds:"):].partition(":")
  try:
    source = tfds.data_source(name, split=split or "train", data_dir=data_dir)
  except Exception as e:
    raise CorpusError(f"{spec}: cannot open the tfds dataset ({type(e).__name__}: {str(e)[:200]}); prepare it "
                      "first (tfds build) and pass its --tfds_data_dir") from None
  stats.files += 1
  for i in range(len(source)):
    record = source[i]
    if opts.text_field not in record:
      raise CorpusError(f"{spec}: no feature {opts.text_field!r} (features: {sorted(record)}); name it with "
                        "--text_field")
    doc = _record_document(record[opts.text_field], spec, f"record {i}", opts, stats)
    if doc is not None:
      yield doc


def _text_documents(path: str, fmt: str, opts: ReadOptions, stats: CorpusStats) -> Iterator[list[str]]:
  doc: list[str] = []
  for line in _file_lines(path, stats):
    line = line.strip()
    if not line:
      if doc:
        yield _finish(doc, fmt, opts)
      doc = []
      continue
    doc.append(line)
  if doc:
    yield _finish(doc, fmt, opts)


def _finish(doc: list[str], fmt: str, opts: ReadOptions) -> list[str]:
  if fmt == "paragraphs":
    return split_sentences(" ".join(doc), opts.splitter, opts.language)
  return doc


def read_shard(path: str, opts: ReadOptions, stats: CorpusStats, tfds_data_dir: str | None = None
               ) -> Iterator[list[str]]:
  """The non-empty documents of one shard, counted in `stats`."""
  fmt = opts.format_of(path)
  if fmt == "jsonl":
    docs = _jsonl_documents(path, opts, stats)
  elif fmt == "parquet":
    docs = _parquet_documents(path, opts, stats)
  elif fmt == "tfds":
    docs = _tfds_documents(path, opts, stats, tfds_data_dir)
  else:
    docs = _text_documents(path, fmt, opts, stats)
  try:
    for doc in docs:
      if not doc:
        stats.empty_documents += 1
        continue
      stats.documents += 1
      stats.sentences += len(doc)
      yield doc
  except ShardError as e:
    if not opts.skip_bad_records:
      raise
    stats.bad_shards += 1
    logging.warning("skipping the rest of a shard: %s", e)


def read_documents(paths: Sequence[str], fmt: str | None = None, stats: CorpusStats | None = None, *,
                   opts: ReadOptions | None = None, tfds_data_dir: str | None = None) -> Iterator[list[str]]:
  """Documents (lists of sentences) from shards in order, streaming; never holds the corpus."""
  opts = opts or ReadOptions()
  if fmt is not None:
    opts = dataclasses.replace(opts, format=fmt)
  stats = stats if stats is not None else CorpusStats()
  if not paths:
    raise CorpusError("no corpus files given")
  for path in expand(paths):
    yield from read_shard(path, opts, stats, tfds_data_dir)


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
