"""Dense retrieval evaluation on a BEIR-format folder: embed the corpus in blocks (resumable: each finished block is
kept on disk), exact search as a blocked matrix product with a running top-k sharded over the device mesh, the
run written in TREC format and scored as trec_eval scores it (nDCG@10, MRR@10, Recall@100, MAP).

A BEIR folder holds `corpus.jsonl` ({"_id", "title", "text"}), `queries.jsonl` ({"_id", "text"}) and
`qrels/<split>.tsv` (query-id, corpus-id, score; a header line). As BEIR does, a document is its title and text
joined by a space, only queries named in the qrels are searched, and a document whose id equals the query's is
left out of that query's results.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax import errors
from bertjax.core import files
from bertjax.embeddings import blocks as blocks_lib

METRICS = ("ndcg@10", "mrr@10", "recall@100", "map")


class RetrievalDataError(errors.DataError):
  """A BEIR folder or run that cannot be evaluated as it is."""


@dataclasses.dataclass
class Beir:
  doc_ids: list[str]
  docs: list[str]
  query_ids: list[str]
  queries: list[str]
  qrels: dict[str, dict[str, int]]
  skipped_queries: int  # queries.jsonl rows without judgements
  empty_docs: int


@dataclasses.dataclass(frozen=True)
class Options:
  """How a BEIR folder is searched and a corpus embedded: the one object the embeddings command fills and
  `kinds.beir_scores`, `suite.run` and `dense.encoder.embed_corpus` read. None: the model kind's own (`kinds.settle`
  fills in its block and score; a prefix left None is the model's own prompt)."""
  split: str = "test"  # the judgements qrels/SPLIT.tsv
  top_k: int = 1000  # documents kept per query in the run
  block: int | None = None  # documents embedded at a time
  batch_size: int = 32
  score: str | None = None  # cos or dot
  query_prefix: str | None = None  # text put before each query
  doc_prefix: str | None = None  # text put before each document
  pooling: str = ""  # a dense model's pooling ("": its own, else mean)
  max_active_dims: int = 0  # a sparse encoder's terms kept per vector (0: all)
  precision: str = "float32"  # corpus embeddings stored and searched quantized (`quantize`)
  calibration: np.ndarray | None = dataclasses.field(default=None, compare=False)  # int8 / uint8 ranges
  rescore_multiplier: int = 2  # quantized search: candidates per result rescored by the float query
  run_file: str = ""  # the run written here in TREC format
  cache_dir: str = ""  # corpus embeddings kept here block by block, so a rerun resumes
  overwrite: bool = False  # write over a run file or folder this command did not write


def _decoded(path: str, f) -> Iterator[tuple[int, str]]:
  """(line number, text) of a binary file's lines (a byte-order mark before the first dropped, as spreadsheet
  programs write one); a line that is not UTF-8 is a one-line error."""
  for line, raw in enumerate(f, 1):
    try:
      yield line, raw.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as e:
      raise RetrievalDataError(f"{path}:{line}: not UTF-8 ({e.reason} at byte {e.start})") from None


def _id(value, where: str, field: str = "_id") -> str:
  """A record's id as text: a string or an integer (BEIR writes both); null, a float or a structure is refused,
  not turned into "None" or "1.0"."""
  if isinstance(value, bool) or not isinstance(value, (str, int)):
    raise RetrievalDataError(f"{where}: {field} {value!r} is not a string or an integer")
  if isinstance(value, str) and not value.strip():
    raise RetrievalDataError(f"{where}: {field} is empty")
  return str(value)


def _text(value, where: str, field: str) -> str:
  """A record's text field: a string, or absent / null (an empty text); a number or a structure is refused."""
  if value is None:
    return ""
  if not isinstance(value, str):
    raise RetrievalDataError(f"{where}: {field} is a {type(value).__name__}, not text")
  return value


def _jsonl(path: str) -> Iterator[tuple[int, dict]]:
  if not files.isfile(path):
    raise RetrievalDataError(f"{path}: no such file")
  with files.open(path, "rb") as f:
    for line, text in _decoded(path, f):
      if not text.strip():
        continue
      row = files.json_object(text, f"{path}:{line}", RetrievalDataError)
      if "_id" not in row:
        raise RetrievalDataError(f"{path}:{line}: a record needs an \"_id\"")
      yield line, row


def read_corpus(patterns: Sequence[str], id_field: str = "_id", text_field: str = "text",
                title_field: str = "title") -> tuple[list[str], list[str]]:
  """(ids, texts) of a corpus to embed: JSONL records (an id, the text and an optional title put before it, as
  BEIR joins them), Parquet rows (the same columns) or plain text (one document a line, id `FILE:LINE`); files,
  globs, compressed shards. A repeated id, a record without the fields, non-UTF-8 or broken JSON is a one-line
  error naming the file and line."""
  from bertjax.data import shards
  ids, texts, seen = [], [], {}

  def add(i, text, where):
    if i in seen:
      raise RetrievalDataError(f"{where}: document id {i!r} repeats {seen[i]}")
    seen[i] = where
    ids.append(i)
    texts.append(text)

  paths = shards.expand(patterns)
  if not paths:
    raise RetrievalDataError(f"no corpus files match {list(patterns)}")
  for path in paths:
    stem = shards.strip_compression(path)
    if stem.endswith(".parquet"):
      import pyarrow.parquet as pq
      try:
        if files.is_remote(path):
          with files.open(path, "rb") as f:
            table = pq.read_table(f)
        else:
          table = pq.read_table(path)
      except Exception as e:  # pyarrow raises several types for a corrupt file
        raise RetrievalDataError(f"{path}: not a readable Parquet file ({str(e)[:200]})") from None
      missing = [c for c in (id_field, text_field) if c not in table.column_names]
      if missing:
        raise RetrievalDataError(f"{path}: no column(s) {missing}; it has {table.column_names}")
      cols = table.to_pydict()
      titles = cols.get(title_field) or [""] * table.num_rows
      for r, (i, text, title) in enumerate(zip(cols[id_field], cols[text_field], titles)):
        where = f"{path}: row {r}"
        add(_id(i, where, id_field), f"{_text(title, where, title_field)} {_text(text, where, text_field)}".strip(),
            where)
      continue
    jsonl = stem.endswith((".jsonl", ".json", ".ndjson"))
    with shards.open_shard(path) as f:
      for line, text in _decoded(path, f):
        if not jsonl:  # the id names the file as given, so that d1/a.txt and d2/a.txt stay apart
          add(f"{path}:{line}", text.rstrip("\r\n"), f"{path}:{line}")
          continue
        if not text.strip():
          continue
        row = files.json_object(text, f"{path}:{line}", RetrievalDataError)
        where = f"{path}:{line}"
        if id_field not in row or text_field not in row:
          raise RetrievalDataError(f"{where}: a record needs {id_field!r} and {text_field!r}")
        add(_id(row[id_field], where, id_field), f"{_text(row.get(title_field), where, title_field)} "
            f"{_text(row[text_field], where, text_field)}".strip(), where)
  if not ids:
    raise RetrievalDataError(f"{', '.join(paths)}: no documents")
  return ids, texts


def read_qrels(path: str) -> dict[str, dict[str, int]]:
  """{query id: {doc id: relevance}} of a BEIR qrels .tsv (query-id, corpus-id, score; the header is optional)."""
  if not files.isfile(path):
    raise RetrievalDataError(f"{path}: no such file")
  qrels: dict[str, dict[str, int]] = {}
  with files.open(path, "rb") as f:
    for line, raw in enumerate(f, 1):
      try:
        cols = raw.decode("utf-8").rstrip("\r\n").split("\t")
      except UnicodeDecodeError as e:
        raise RetrievalDataError(f"{path}:{line}: not UTF-8 ({e.reason} at byte {e.start})") from None
      if cols == [""]:
        continue
      if len(cols) != 3:
        raise RetrievalDataError(f"{path}:{line}: {len(cols)} column(s); a qrels line is query-id, corpus-id, score")
      try:
        rel = int(cols[2])
      except ValueError:
        if line == 1:
          continue  # the header
        raise RetrievalDataError(f"{path}:{line}: score {cols[2]!r} is not an integer") from None
      qrels.setdefault(cols[0], {})[cols[1]] = rel
  if not qrels:
    raise RetrievalDataError(f"{path}: no judgements")
  return qrels


def read_beir(folder: str, split: str = "test") -> Beir:
  corpus_path = files.join(folder, "corpus.jsonl")
  doc_ids, docs, seen, empty = [], [], {}, 0
  for line, row in _jsonl(corpus_path):
    where = f"{corpus_path}:{line}"
    i = _id(row["_id"], where)
    if i in seen:
      raise RetrievalDataError(f"{where}: document id {i!r} repeats line {seen[i]}")
    seen[i] = line
    text = (_text(row.get("title"), where, "title") + " " + _text(row.get("text"), where, "text")).strip()
    empty += not text
    doc_ids.append(i)
    docs.append(text)
  if not docs:
    raise RetrievalDataError(f"{corpus_path}: no documents")
  qrels_path = files.join(folder, "qrels", f"{split}.tsv")
  qrels = read_qrels(qrels_path)
  queries_path = files.join(folder, "queries.jsonl")
  query_text, query_line, skipped = {}, {}, 0
  for line, row in _jsonl(queries_path):
    where = f"{queries_path}:{line}"
    i = _id(row["_id"], where)
    if i in query_line:
      raise RetrievalDataError(f"{where}: query id {i!r} repeats line {query_line[i]}")
    query_line[i] = line
    text = _text(row.get("text"), where, "text").strip()
    if i not in qrels:
      skipped += 1
      continue
    if not text:
      raise RetrievalDataError(f"{where}: query {i!r} has no text")
    query_text[i] = text
  for q, judged in qrels.items():
    if q not in query_text:
      raise RetrievalDataError(f"{qrels_path}: query id {q!r} is not in {queries_path}")
    unknown = [d for d in judged if d not in seen]
    if unknown:
      raise RetrievalDataError(f"{qrels_path}: query {q!r} judges document id {unknown[0]!r}, which is not in "
                               f"{corpus_path}")
  ids = list(query_text)
  return Beir(doc_ids, docs, ids, [query_text[i] for i in ids], qrels, skipped, empty)


# ----------------------------------------------------------------------------------------------- exact search


@functools.lru_cache(maxsize=None)
def _block_search(mesh: jax.sharding.Mesh, k: int):
  """jit(q [Q, D], docs [N, D] sharded over every mesh axis, valid [N]) -> top-k (scores, indices) [Q, k]: each
  device scores its rows of the block and keeps its own top-k, and the devices' candidates merge into one."""
  axes = tuple(mesh.axis_names)

  def local(q, docs, valid):
    s = jnp.where(valid[None, :], q @ docs.T, -jnp.inf)
    v, i = jax.lax.top_k(s, min(k, docs.shape[0]))
    offset = jax.lax.axis_index(axes) * docs.shape[0]
    v, i = jax.lax.all_gather(v, axes, axis=1, tiled=True), jax.lax.all_gather(i + offset, axes, axis=1, tiled=True)
    top, j = jax.lax.top_k(v, min(k, v.shape[1]))
    return top, jnp.take_along_axis(i, j, axis=1)

  f = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axes), P(axes)), out_specs=(P(), P()), check_vma=False)
  return jax.jit(f)


def _merge(scores, ids, new_scores, new_ids, k):
  s, i = np.concatenate([scores, new_scores], 1), np.concatenate([ids, new_ids], 1)
  order = np.argsort(-s, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)


def search(queries: np.ndarray, doc_blocks: Iterator[np.ndarray], k: int, mesh: jax.sharding.Mesh | None = None,
           query_block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
  """Exact inner-product top-k of every query over a corpus that arrives in blocks: (scores, corpus row indices),
  each [Q, k] (fewer columns when the corpus is smaller), best first. Memory holds one block and the running
  top-k; each block's rows are split over the mesh's devices."""
  mesh = mesh or jax.sharding.Mesh(np.array(jax.devices()), ("docs",))
  n_dev = mesh.devices.size
  queries = np.asarray(queries, np.float32)
  best_s = np.full((len(queries), 0), -np.inf, np.float32)
  best_i = np.zeros((len(queries), 0), np.int64)
  spec = NamedSharding(mesh, P(tuple(mesh.axis_names)))
  f = _block_search(mesh, k)
  start = 0
  for block in doc_blocks:
    block = np.asarray(block, np.float32)
    n = len(block)
    padded = np.zeros((-(-n // n_dev) * n_dev, block.shape[1]), np.float32)
    padded[:n] = block
    docs, valid = jax.device_put(padded, spec), jax.device_put(np.arange(len(padded)) < n, spec)
    parts = [f(queries[q0:q0 + query_block], docs, valid) for q0 in range(0, len(queries), query_block)]
    s = np.concatenate([np.asarray(p[0]) for p in parts])
    i = np.concatenate([np.asarray(p[1]) for p in parts]).astype(np.int64) + start
    best_s, best_i = _merge(best_s, best_i, s, np.where(np.isfinite(s), i, -1), k)
    start += n
  keep = int(np.sum(np.all(np.isfinite(best_s), axis=0)))
  return best_s[:, :keep], best_i[:, :keep]


# ------------------------------------------------------------------------------------------------ run, metrics


def make_run(beir: Beir, scores: np.ndarray, rows: np.ndarray, ignore_identical_ids: bool = True
             ) -> dict[str, dict[str, float]]:
  run = {}
  for qi, q in enumerate(beir.query_ids):
    run[q] = {beir.doc_ids[r]: float(s) for s, r in zip(scores[qi], rows[qi])
              if r >= 0 and not (ignore_identical_ids and beir.doc_ids[r] == q)}
  return run


def check_run_file(path: str, overwrite: bool = False) -> None:
  """Refuses to write a run over a file that is not one (a folder, a model's config.json, any other file) unless
  `overwrite`; a TREC run an earlier command wrote (every line tagged `bertjax`) is replaced."""
  if overwrite:
    return
  if files.is_remote(path):
    if files.isdir(path):
      raise RetrievalDataError(f"--run {path}: exists and is not a file")
    if not files.isfile(path):
      return
  elif not os.path.lexists(path):  # a dangling link is refused below, not written through
    return
  elif not files.isfile(path):
    raise RetrievalDataError(f"--run {path}: exists and is not a file")
  with files.open(path, "rb") as f:
    head = f.read(1 << 20)
  lines = [ln.split() for ln in head.decode("utf-8", "replace").splitlines() if ln.strip()]
  if not lines or not all(len(p) == 6 and p[1] == "Q0" and p[5] == "bertjax" for p in lines[:-1] or lines):
    raise RetrievalDataError(f"--run {path}: exists and is not a run this command wrote; pass --overwrite to "
                             "replace it, or choose another path")


def write_trec(run: dict[str, dict[str, float]], path: str, name: str = "bertjax") -> None:
  """`qid Q0 docid rank score name` lines, best first; written whole, then moved into place (on an object store,
  one upload of the finished file)."""
  with files.local_target(path) as local:
    tmp = f"{local}.tmp{os.getpid()}"
    with files.open(tmp, "w") as f:
      for q, docs in run.items():
        for rank, (d, s) in enumerate(_ranked(docs), 1):
          f.write(f"{q} Q0 {d} {rank} {s:.6f} {name}\n")
    files.rename(tmp, local)


def _ranked(docs: dict[str, float]) -> list[tuple[str, float]]:
  """trec_eval's order: score descending, ties by document id descending."""
  return sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)


def query_metrics(docs: dict[str, float], judged: dict[str, int], metrics: Sequence[str] = METRICS
                  ) -> dict[str, float]:
  """trec_eval's measures of one query's retrieved documents: `ndcg@k` (ndcg_cut, graded gains, log2 discount),
  `mrr@k` (recip_rank cut at k), `recall@k` and `map` (relevant: relevance >= 1)."""
  ranked = [d for d, _ in _ranked(docs)]
  relevant = {d for d, r in judged.items() if r >= 1}
  hits = [d in relevant for d in ranked]
  n_rel = len(relevant)
  out = {}
  for m in metrics:
    name, _, cut = m.partition("@")
    k = int(cut) if cut else len(ranked)
    if name == "ndcg":
      dcg = sum(max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
      ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:k]
      idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
      out[m] = dcg / idcg if idcg else 0.0
    elif name == "mrr":
      first = next((i for i, h in enumerate(hits[:k]) if h), None)
      out[m] = 1.0 / (first + 1) if first is not None else 0.0
    elif name == "recall":
      out[m] = sum(hits[:k]) / n_rel if n_rel else 0.0
    elif name == "map":
      out[m] = sum(sum(hits[:i + 1]) / (i + 1) for i, h in enumerate(hits[:k]) if h) / n_rel if n_rel else 0.0
    else:
      raise ValueError(f"unknown retrieval metric {m!r}: ndcg@k, mrr@k, recall@k or map")
  return out


def evaluate_run(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]],
                 metrics: Sequence[str] = METRICS) -> dict[str, float]:
  """The mean over the judged queries of each metric; a judged query absent from the run scores 0."""
  per_query = [query_metrics(run.get(q, {}), judged, metrics) for q, judged in qrels.items()]
  return {m: float(np.mean([p[m] for p in per_query])) for m in metrics}


# ------------------------------------------------------------------------------------------- corpus embedding


def corpus_blocks(embed: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str], block: int,
                  store: blocks_lib.BlockStore | None = None, select: Callable[[int], bool] | None = None
                  ) -> Iterator[np.ndarray]:
  """The corpus embeddings block by block. With a `store`, each finished block is kept there and a rerun reads it
  (checked against its record) instead of embedding it again, so a killed run resumes at its first missing
  block. `select(b)`: only those blocks (one host's share); the others are neither embedded nor yielded."""
  for _, vectors in blocks_lib.each_block(lambda chunk: np.asarray(embed(chunk), np.float32), texts, block, store,
                                         select):
    yield vectors
