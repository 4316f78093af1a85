"""Text corpora: robust streaming of documents (lists of sentences) from shards (the offline demo corpus is
`bertjax.data.demo_corpus`).

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

import dataclasses
import json
import logging
import re
from typing import Iterator, Sequence

from bertjax import errors
from bertjax.data.shards import (  # noqa: F401
  MAX_LINE_BYTES,
  CorpusError,
  CorpusStats,
  ShardError,
  expand,
  file_lines,
  open_raw,
  open_shard,
  strip_compression,
)

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


SPLITTERS = ("sentencex", "regex")
FORMATS = ("auto", "lines", "paragraphs", "jsonl", "parquet", "tfds")


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
    stem = strip_compression(path)
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
  for n, line in enumerate(file_lines(path, stats), 1):
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
  with open_raw(path) as raw:
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
  for line in file_lines(path, stats):
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
