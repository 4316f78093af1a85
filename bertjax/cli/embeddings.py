"""python -m bertjax embeddings --model MODEL (--sts FILE | --beir FOLDER | --corpus FILES --out DIR) [...]

Evaluates an embedding model (a sentence-transformers folder, an HF folder or a bertjax workdir) on scored
sentence pairs (STS) or a BEIR folder (exact search, TREC run, trec_eval's measures), or embeds a corpus into
resumable blocks; docs/embeddings.md. Every argument and the data are checked before the model is loaded; no file
the command did not write is written over without --overwrite.
"""
from __future__ import annotations

import json

from bertjax import errors
from bertjax.cli import common
from bertjax.embeddings import blocks, retrieval
from bertjax.embeddings import task as contrastive_task
from bertjax.embeddings.encoder import Encoder, beir_scores, check_sizes, embed_corpus, sts_scores
from bertjax.embeddings.model import POOLINGS, Pooling


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Evaluate an embedding model (a sentence-transformers folder, an HF folder "
                                        "or a bertjax workdir) on scored sentence pairs (STS) or a BEIR folder, or "
                                        "embed a corpus.")
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
  p.add_argument("--score", default="cos", choices=["cos", "dot"], help="--beir: cosine or dot product")
  p.add_argument("--query_prefix", default="", help="--beir: text put before each query (e.g. 'query: ')")
  p.add_argument("--doc_prefix", default="", help="--beir, --corpus: text put before each document (e.g. 'passage: ')")
  p.add_argument("--columns", default="sentence1,sentence2,score", help="--sts: the text, text and score columns")
  p.add_argument("--pooling", default="", choices=["", *POOLINGS], help="default: the model's own, else mean")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--overwrite", action="store_true", help="replace a --run file or --out / --cache_dir folder "
                                                         "this command did not write")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  check_sizes(top_k=args.top_k, block=args.block, batch_size=args.batch_size)
  pooling = Pooling(mode=args.pooling) if args.pooling else None
  # The data and every output are checked before the model is loaded.
  if args.corpus:
    if not args.out:
      raise errors.ConfigError("--corpus needs --out, the folder for the embeddings")
    blocks.check_folder(args.out, "--out", args.overwrite)
    ids, texts = retrieval.read_corpus(args.corpus, args.id_field, args.text_field)
    enc = Encoder.load(args.model, pooling)
    print(json.dumps(embed_corpus(enc, ids, texts, args.out, args.block, args.batch_size, args.doc_prefix,
                                  overwrite=args.overwrite)))
    return 0
  if args.beir:
    if args.run:
      retrieval.check_run_file(args.run, args.overwrite)
    if args.cache_dir:
      blocks.check_folder(args.cache_dir, "--cache_dir", args.overwrite)
    data = retrieval.read_beir(args.beir, args.split)
    enc = Encoder.load(args.model, pooling)
    print(json.dumps(beir_scores(enc, data, args.split, args.top_k, args.run, args.cache_dir, args.block,
                                 args.batch_size, args.query_prefix, args.doc_prefix, args.score, args.overwrite)))
    return 0
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) != 3 or not all(names):
    raise errors.ConfigError(f"--columns {args.columns!r}: give three names (text, text, score)")
  rows = contrastive_task.read_pairs(args.sts, names[0], names[1], score=names[2])
  enc = Encoder.load(args.model, pooling)
  print(json.dumps(sts_scores(enc, [(r["anchor"], r["docs"][0], r["score"]) for r in rows], args.batch_size)))
  return 0
