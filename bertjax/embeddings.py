"""Embedding sentences with a bertjax encoder: load a sentence-transformers folder (or an HF folder with a
pooling choice), tokenise texts as sentence-transformers does ([CLS] text [SEP], cut at `max_seq_length`), and
embed them in batches.

    enc = embeddings.Encoder.load("all-MiniLM-L6-v2")        # a sentence-transformers folder
    vectors = enc.encode(["a sentence", "another one"])     # [2, 384] float32, unit length

  python -m bertjax.embeddings --model MODEL --sts pairs.csv --columns sentence1,sentence2,score   # STS
  python -m bertjax.embeddings --model MODEL --beir scifact/ --run scifact.trec    # retrieval (docs/embeddings.md)
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import bertjax
from bertjax import convert, errors, retrieval, scores, weights
from bertjax.convert import sentence_transformers as st_lib
from bertjax.data import task_data
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.batching import bucket_multiple
from bertjax.tasks import contrastive as contrastive_task
from bertjax.model.embedding import EmbeddingModel, Pooling


def token_rows(tok, texts: Sequence[str], max_len: int) -> list[list[int]]:
  """[CLS] text [SEP] of each text, cut to `max_len` tokens."""
  return [[tok.cls_id] + tok.encode(t)[:max_len - 2] + [tok.sep_id] for t in texts]


def batch_of(rows_ids: Sequence[Sequence[int]], pad_id: int, max_len: int, rows: int = 0, multiple: int = 1) -> dict:
  """The encoder's batch of token rows: padded to the longest row (rounded up to `multiple`, at most `max_len`)
  and with empty rows up to `rows`."""
  n = max(len(r) for r in rows_ids)
  n = min(-(-n // multiple) * multiple, max_len)
  ids = np.full((max(rows, len(rows_ids)), n), pad_id, np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows_ids):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def _max_seq_length(path: str, folder: str) -> int:
  """sentence_bert_config.json's max_seq_length, else (sentence-transformers >= 6 keeps it with the tokenizer)
  tokenizer_config.json's model_max_length; 0 when neither says."""
  for name, key in ((os.path.join(path, "sentence_bert_config.json"), "max_seq_length"),
                    (os.path.join(folder, "tokenizer_config.json"), "model_max_length")):
    if os.path.isfile(name):
      with open(name, encoding="utf-8") as f:
        value = json.load(f).get(key)
      if isinstance(value, int) and 0 < value < 10 ** 6:
        return value
  return 0


@dataclasses.dataclass
class Encoder:
  module: EmbeddingModel
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_seq_length: int

  @classmethod
  def load(cls, path: str, pooling: Pooling | None = None, max_seq_length: int = 0, **overrides) -> "Encoder":
    """A sentence-transformers folder (its pooling, dense layer, normalisation and max_seq_length), or any model
    `weights.load` reads (an HF folder, a bertjax workdir) with `pooling` (default mean + normalize)."""
    if st_lib.is_folder(path):
      cfg, params, found, folder = st_lib.read(path, **overrides)
      tok_path, lower = weights.hf_tokenizer(folder)
      pooling = pooling or found
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
    else:
      w = weights.load(path, overrides=overrides, head="encoder")
      cfg, params, tok_path, lower = w.cfg, w.params, w.tokenizer, w.do_lower_case
      pooling = pooling or Pooling()
    if not tok_path:
      raise convert.ConversionError(f"{path}: no tokenizer files (vocab.txt, vocab.json + merges.txt, or a "
                                    "sentencepiece model)")
    tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
    limit = cfg.max_length
    return cls(EmbeddingModel(cfg, pooling), params, tok, min(max_seq_length or limit, limit))

  @functools.cached_property
  def _apply(self):
    return jax.jit(lambda params, batch: self.module.apply({"params": params}, batch)["embedding"])

  @functools.cached_property
  def fingerprint(self) -> str:
    """A digest of the weights, pooling and length: what decides the embeddings."""
    h = hashlib.sha256(repr((self.module.pooling, self.module.cfg, self.max_seq_length)).encode())
    for leaf in jax.tree_util.tree_leaves(self.params):
      h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()

  @functools.cached_property
  def _local_mesh(self) -> Mesh | None:
    """A one-axis mesh over this host's devices, or None with one device."""
    devices = jax.local_devices()
    return Mesh(np.array(devices), ("batch",)) if len(devices) > 1 else None

  @functools.cached_property
  def _device_params(self):
    """The weights on this host's devices (replicated), placed once rather than sent with every batch."""
    mesh = self._local_mesh
    return jax.device_put(self.params, NamedSharding(mesh, P()) if mesh else jax.local_devices()[0])

  def _row_sharding(self, batch_size: int) -> NamedSharding | None:
    """Rows split over this host's devices when they divide the batch, else None (one device)."""
    mesh = self._local_mesh
    return NamedSharding(mesh, P("batch")) if mesh and batch_size % mesh.size == 0 else None

  def encode(self, texts: Sequence[str], batch_size: int = 32, multiple: int = 0) -> np.ndarray:
    """Embeddings [len(texts), D] in the order given. Texts run longest first by token count, in batches of
    `batch_size` rows padded to their longest row rounded up to `multiple` tokens: little compute goes to padding,
    and a long list compiles at most max_seq_length / multiple shapes. `multiple` 0: 8 on CPU, where compiling
    is cheap and every padded token costs; on accelerators the fine-tuning buckets' (8 lengths up to
    max_seq_length), where one compile (seconds) outweighs the padding's compute."""
    if not len(texts):
      return np.zeros((0, 0), np.float32)
    if not multiple:
      multiple = 8 if jax.default_backend() == "cpu" else bucket_multiple(self.max_seq_length, 8)
    rows = token_rows(self.tok, texts, self.max_seq_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    sharding = self._row_sharding(batch_size)
    params = self._device_params
    out = []
    for i in range(0, len(texts), batch_size):
      chunk = [rows[j] for j in order[i:i + batch_size]]
      batch = batch_of(chunk, self.tok.pad_id, self.max_seq_length, rows=batch_size, multiple=multiple)
      if sharding is not None:
        batch = jax.device_put(batch, sharding)
      # Results stay on the device until the end, so the host pads the next batch while the device runs this one.
      out.append((self._apply(params, batch), len(chunk)))
    out = [np.asarray(v)[:n] for v, n in out]
    vectors = np.concatenate(out)
    result = np.empty_like(vectors)
    result[order] = vectors
    return result


def sts_scores(encoder: Encoder, pairs: Sequence[tuple[str, str, float]], batch_size: int = 32) -> dict[str, float]:
  """Spearman and Pearson correlation of the cosine similarity of each pair's embeddings with its gold score."""
  if len(pairs) < 2:
    raise task_data.TaskDataError(f"STS needs at least two scored pairs, got {len(pairs)}")
  a = encoder.encode([p[0] for p in pairs], batch_size)
  b = encoder.encode([p[1] for p in pairs], batch_size)
  cos = scores.paired_cosine(a, b)
  gold = np.array([p[2] for p in pairs], np.float64)
  return {"spearman": scores.spearman(cos, gold), "pearson": scores.pearson(cos, gold), "pairs": len(pairs)}


def beir_scores(encoder: Encoder, folder: str | retrieval.Beir, split: str = "test", top_k: int = 1000,
                run_file: str = "", cache_dir: str = "", block: int = 65536, batch_size: int = 32,
                query_prefix: str = "", doc_prefix: str = "", score: str = "cos") -> dict:
  """nDCG@10, MRR@10, Recall@100 and MAP of exact search (cosine or dot product) over a BEIR folder's corpus,
  the run (top `top_k` per query) written to `run_file` in TREC format; `cache_dir` keeps the corpus embeddings
  block by block so an interrupted run resumes."""
  if score not in ("cos", "dot"):
    raise errors.ConfigError(f"--score {score!r}: cos or dot")
  if top_k < 1 or block < 1:
    raise errors.ConfigError(f"--top_k and --block must be >= 1, got {top_k} and {block}")
  beir = folder if isinstance(folder, retrieval.Beir) else retrieval.read_beir(folder, split)
  prep = scores.unit_rows if score == "cos" else (lambda x: x)
  queries = prep(encoder.encode([query_prefix + t for t in beir.queries], batch_size))
  blocks = retrieval.corpus_blocks(lambda texts: prep(encoder.encode([doc_prefix + t for t in texts], batch_size)),
                                   beir.docs, block, cache_dir, f"{encoder.fingerprint}|{doc_prefix}|{score}")
  s, rows = retrieval.search(queries, blocks, top_k)
  run = retrieval.make_run(beir, s, rows)
  if run_file:
    retrieval.write_trec(run, run_file)
  return {**retrieval.evaluate_run(run, beir.qrels), "queries": len(beir.queries), "documents": len(beir.docs),
          "queries without judgements": beir.skipped_queries, "empty documents": beir.empty_docs}


def embed_corpus(encoder: Encoder, ids: Sequence[str], texts: Sequence[str], out: str, block: int = 65536,
                 batch_size: int = 32, prefix: str = "", log=print) -> dict:
  """Embeds a corpus into `out`: `block-NNNNN.npy` ([rows, width] float32, written whole and then renamed) and
  `ids.json` (every id, in row order), `manifest.json` binding the folder to the model, prefix and corpus. A
  killed run resumes at its first missing block (none embedded twice); each host embeds the blocks b with
  b % hosts == its index, its rows split over its devices, texts longest first."""
  if block < 1:
    raise errors.ConfigError(f"--block must be >= 1, got {block}")
  os.makedirs(out, exist_ok=True)
  if jax.process_index() == 0:
    errors.write_whole(os.path.join(out, "ids.json"), json.dumps(list(ids)))
  n_blocks = -(-len(texts) // block)
  mine = [b for b in range(n_blocks) if b % jax.process_count() == jax.process_index()]
  todo = [b for b in mine if not os.path.isfile(os.path.join(out, f"block-{b:05d}.npy"))]
  log(f"embedding {len(texts)} documents in {n_blocks} blocks of {block} into {out}: {len(mine)} on this host, "
      f"{len(mine) - len(todo)} done before", flush=True)
  state = {"done": 0, "docs": 0, "t0": time.time()}

  def embed(chunk):
    vectors = encoder.encode([prefix + t for t in chunk], batch_size)
    state["done"] += 1
    state["docs"] += len(chunk)
    rate = state["docs"] / max(time.time() - state["t0"], 1e-9)
    left = sum(len(texts[b * block:(b + 1) * block]) for b in todo[state["done"]:])
    log(f"block {state['done']}/{len(todo)}: {rate:.1f} documents/s, ETA {left / max(rate, 1e-9):.0f} s", flush=True)
    return vectors
  wanted = set(todo)
  for _ in retrieval.corpus_blocks(embed, texts, block, out, f"{encoder.fingerprint}|{prefix}|corpus",
                                   select=wanted.__contains__):
    pass
  return {"documents": len(texts), "blocks": n_blocks, "embedded now": len(todo), "out": out}


@errors.guard
def main(argv=None) -> int:
  p = errors.ArgumentParser(description="Evaluate an embedding model (a sentence-transformers folder, an HF folder "
                                        "or a bertjax workdir) on scored sentence pairs (STS) or a BEIR folder.")
  p.add_argument("--model", required=True)
  task = p.add_mutually_exclusive_group(required=True)
  task.add_argument("--sts", help=".csv / .tsv / .jsonl with two text columns and a score column")
  task.add_argument("--beir", help="a BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv")
  task.add_argument("--corpus", nargs="+", help="embed these files or globs (JSONL, Parquet, text; compressed) "
                                                "into --out: block-NNNNN.npy and ids.json, resumable")
  p.add_argument("--out", default="", help="--corpus: the folder of embeddings")
  p.add_argument("--id_field", default="_id", help="--corpus: the JSONL key / Parquet column of a document's id")
  p.add_argument("--text_field", default="text", help="--corpus: ... of its text (a title field goes before it)")
  p.add_argument("--split", default="test", help="--beir: the qrels file qrels/SPLIT.tsv")
  p.add_argument("--top_k", type=int, default=1000, help="--beir: documents kept per query in the run")
  p.add_argument("--run", default="", help="--beir: write the run here in TREC format")
  p.add_argument("--cache_dir", default="", help="--beir: keep corpus embeddings here; a rerun resumes")
  p.add_argument("--block", type=int, default=65536, help="--beir, --corpus: documents embedded at a time")
  p.add_argument("--score", default="cos", help="--beir: cos | dot")
  p.add_argument("--query_prefix", default="", help="--beir: text put before each query (e.g. 'query: ')")
  p.add_argument("--doc_prefix", default="", help="--beir, --corpus: text put before each document (e.g. 'passage: ')")
  p.add_argument("--columns", default="sentence1,sentence2,score", help="the text, text and score column names")
  p.add_argument("--pooling", default="", help="cls | mean | max (default: the folder's, else mean)")
  p.add_argument("--batch_size", type=int, default=32)
  args = p.parse_args(argv)
  # Compiled programs persist as for `python -m bertjax.main`: on an accelerator each padded length compiles for
  # seconds, and a second command over the same lengths loads them instead.
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    jax.config.update("jax_compilation_cache_dir", bertjax.COMPILE_CACHE)
  # The data is read (and any mistake in it reported) before the model is loaded.
  if args.corpus:
    if not args.out:
      raise errors.ConfigError("--corpus needs --out, the folder for the embeddings")
    ids, texts = retrieval.read_corpus(args.corpus, args.id_field, args.text_field)
    enc = Encoder.load(args.model, Pooling(mode=args.pooling) if args.pooling else None)
    print(json.dumps(embed_corpus(enc, ids, texts, args.out, args.block, args.batch_size, args.doc_prefix)))
    return 0
  if args.beir:
    data = retrieval.read_beir(args.beir, args.split)
    enc = Encoder.load(args.model, Pooling(mode=args.pooling) if args.pooling else None)
    print(json.dumps(beir_scores(enc, data, args.split, args.top_k, args.run, args.cache_dir, args.block,
                                 args.batch_size, args.query_prefix, args.doc_prefix, args.score)))
    return 0
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) != 3:
    raise errors.ConfigError(f"--columns {args.columns!r}: give three names (text, text, score)")
  rows = contrastive_task.read_pairs(args.sts, names[0], names[1], score=names[2])
  enc = Encoder.load(args.model, Pooling(mode=args.pooling) if args.pooling else None)
  result = sts_scores(enc, [(r["anchor"], r["docs"][0], r["score"]) for r in rows], args.batch_size)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
