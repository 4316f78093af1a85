"""python -m bertjax embeddings --model MODEL (--sts FILE | --beir FOLDER | --beir_suite FOLDERS | --corpus FILES
--out DIR) [...]

Evaluates an embedding model (a sentence-transformers folder, an HF folder or a bertjax workdir) on scored
sentence pairs (STS) or a BEIR folder (exact search, TREC run, trec_eval's measures), or embeds a corpus into
resumable blocks; a sparse encoder (a SparseEncoder folder or a task=sparse workdir) searches BEIR by the dot
product of its term vectors; docs/embeddings.md. Every argument and the data are checked before the model is
loaded; no file the command did not write is written over without --overwrite. Every path (the model, the data,
--out, --cache_dir, --run) may be local or gs:// / s3:// (`bertjax.core.files`); an unreachable store or a missing
bucket is one line before anything is read.
"""
from __future__ import annotations

import dataclasses
import json

from bertjax import errors
from bertjax.cli import common
from bertjax.core import files
from bertjax.embeddings import blocks, quantize, retrieval
from bertjax.embeddings.dense import task as contrastive_task
from bertjax.embeddings.dense.encoder import Encoder, beir_scores, check_sizes, embed_corpus, sts_scores
from bertjax.embeddings.model import POOLINGS, Pooling
from bertjax.embeddings.multivector import encoder as multivector
from bertjax.embeddings.rerank import encoder as rerank
from bertjax.embeddings.sparse import encoder as sparse


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Evaluate an embedding model (a sentence-transformers folder, an HF folder "
                                        "or a bertjax workdir) on scored sentence pairs (STS) or a BEIR folder, or "
                                        "embed a corpus.")
  p.add_argument("--model", required=True)
  task = p.add_mutually_exclusive_group(required=True)
  task.add_argument("--sts", help=".csv / .tsv / .jsonl with two text columns and a score column")
  task.add_argument("--beir", help="a BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv")
  task.add_argument("--beir_suite", nargs="+", metavar="FOLDER",
                    help="several BEIR folders: each one's metrics and their mean (NanoBEIR style); with --out, a "
                         "resumable report")
  task.add_argument("--corpus", nargs="+", help="embed these files or globs (JSONL, Parquet, text; compressed) "
                                                "into --out: block-NNNNN.npy and ids.json, resumable")
  p.add_argument("--out", default="", help="--corpus: the folder of embeddings; --beir_suite: the report (JSON)")
  p.add_argument("--id_field", default="_id", help="--corpus: the JSONL key / Parquet column of a document's id")
  p.add_argument("--text_field", default="text", help="--corpus: ... of its text (a title field goes before it)")
  p.add_argument("--split", default="test", help="--beir: the qrels file qrels/SPLIT.tsv")
  p.add_argument("--top_k", type=int, default=1000, help="--beir: documents kept per query in the run")
  p.add_argument("--run", default="", help="--beir: write the run here in TREC format")
  p.add_argument("--cache_dir", default="", help="--beir: keep corpus embeddings here; a rerun resumes")
  p.add_argument("--block", type=int, default=None, help="--beir, --corpus: documents embedded at a time (default "
                                                          "65536; 2048 for a sparse encoder, whose vectors span the "
                                                          "vocabulary; 1024 for a multi-vector one)")
  p.add_argument("--score", default=None, choices=["cos", "dot"],
                 help="--beir: cosine or dot product (default cos; dot, the only one, for a sparse encoder)")
  p.add_argument("--query_prefix", default=None, help="--beir: text put before each query (e.g. 'query: '; "
                                                       "default: the model's own query prompt, if any)")
  p.add_argument("--doc_prefix", default=None, help="--beir, --corpus: text put before each document (e.g. "
                                                     "'passage: '; default: the model's own document prompt, if any)")
  p.add_argument("--columns", default="sentence1,sentence2,score", help="--sts: the text, text and score columns")
  p.add_argument("--pooling", default="", choices=["", *POOLINGS], help="default: the model's own, else mean")
  p.add_argument("--rerank", default="", help="--beir: rerank this TREC run's top --depth documents per query "
                                             "with --model, a cross-encoder")
  p.add_argument("--depth", type=int, default=None, help="--rerank: documents re-scored per query (default 100)")
  p.add_argument("--max_active_dims", type=int, default=0,
                 help="--beir with a sparse encoder: keep each vector's largest terms (0: all)")
  p.add_argument("--precision", default="float32", choices=quantize.PRECISIONS,
                 help="--corpus, --beir: store / search the corpus embeddings quantized as sentence-transformers' "
                      "quantize_embeddings does (docs/embeddings.md#quantized-embeddings)")
  p.add_argument("--calibration", default="", help="--precision int8/uint8: a .npy of float embeddings whose "
                                                   "per-feature min and max are every block's ranges")
  p.add_argument("--rescore_multiplier", type=int, default=None,
                 help="--beir with --precision: candidates per result rescored by the float query (default 2; 0: "
                      "no rescoring)")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--overwrite", action="store_true", help="replace a --run file or --out / --cache_dir folder "
                                                         "this command did not write")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  for path in (args.model, args.sts, args.beir, *(args.corpus or ()), *(args.beir_suite or ()), args.out, args.run,
               args.cache_dir, args.rerank, args.calibration):
    if path:
      files.reach(path)  # once per bucket: a wrong endpoint or a missing bucket is one line, not minutes of retries
  check_sizes(top_k=args.top_k, block=65536 if args.block is None else args.block, batch_size=args.batch_size)
  pooling = Pooling(mode=args.pooling) if args.pooling else None
  if args.max_active_dims < 0:
    raise errors.ConfigError(f"--max_active_dims {args.max_active_dims}: a count of terms >= 0 (0: all)")
  if args.rerank and not args.beir:
    raise errors.ConfigError("--rerank needs --beir, the folder whose queries, corpus and judgements the run is of")
  if args.query_prefix is not None and not (args.beir or args.beir_suite):
    raise errors.ConfigError("--query_prefix is for --beir and --beir_suite (the queries' text)")
  if args.doc_prefix is not None and args.sts:
    raise errors.ConfigError("--doc_prefix is for --beir and --corpus (the documents' text), not --sts")
  calibration = _quantization(args)
  if args.rerank:
    _refuse(args, "--rerank (a cross-encoder re-scoring a run)", "cache_dir", "block", "score", "pooling",
            "max_active_dims")
    return _rerank(args)
  if args.depth is not None:
    raise errors.ConfigError("--depth is for --rerank (documents re-scored per query)")
  is_sparse = sparse.SparseEncoder.is_model(args.model)
  is_multi = multivector.is_model(args.model)
  if not is_sparse and not is_multi and rerank.CrossEncoder.is_reranker(args.model):
    raise errors.ConfigError(f"{args.model} is a cross-encoder: it re-scores a run (--beir FOLDER --rerank RUN), it "
                             "does not embed texts")
  if (is_sparse or is_multi) and args.precision != "float32":
    raise errors.ConfigError(f"--precision {args.precision}: a sparse or multi-vector model cannot be quantized")
  if is_multi and args.score:
    raise errors.ConfigError("a multi-vector encoder scores by MaxSim (its folder's similarity): leave out --score")
  if is_multi:
    _refuse(args, f"a multi-vector encoder ({args.model})", "cache_dir", "pooling", "max_active_dims")
  elif is_sparse:
    _refuse(args, f"a sparse encoder ({args.model}), which pools by its own SpladePooling", "pooling")
  else:
    _refuse(args, f"a dense embedding model ({args.model}); it prunes a sparse encoder's term vectors",
            "max_active_dims")
  args.block = args.block or (2048 if is_sparse else 1024 if is_multi else 65536)
  args.score = args.score or ("dot" if is_sparse else "cos")
  if args.beir_suite is not None:
    return _suite(args, pooling)
  if is_sparse and not args.beir:
    raise errors.ConfigError(f"{args.model} is a sparse encoder: it takes --beir (STS and --corpus are for dense "
                             "embedding models)")
  if is_sparse and args.score != "dot":
    raise errors.ConfigError("a sparse encoder scores by dot product: --score dot")
  if is_multi:
    return _late_interaction(args)
  # The data and every output are checked before the model is loaded.
  if args.corpus:
    if not args.out:
      raise errors.ConfigError("--corpus needs --out, the folder for the embeddings")
    blocks.check_folder(args.out, "--out", args.overwrite)
    ids, texts = retrieval.read_corpus(args.corpus, args.id_field, args.text_field)
    enc = Encoder.load(args.model, pooling)
    print(json.dumps(embed_corpus(enc, ids, texts, args.out, args.block, args.batch_size, args.doc_prefix,
                                  overwrite=args.overwrite, precision=args.precision, calibration=calibration)))
    return 0
  if args.beir:
    if args.run:
      retrieval.check_run_file(args.run, args.overwrite)
    if args.cache_dir:
      blocks.check_folder(args.cache_dir, "--cache_dir", args.overwrite)
    data = retrieval.read_beir(args.beir, args.split)
    enc = (sparse.SparseEncoder.load(args.model, max_active_dims=args.max_active_dims or None) if is_sparse
           else Encoder.load(args.model, pooling))
    print(json.dumps(beir_scores(enc, data, args.split, args.top_k, args.run, args.cache_dir, args.block,
                                 args.batch_size, args.query_prefix, args.doc_prefix, args.score, args.overwrite,
                                 args.precision, calibration, args.rescore_multiplier)))
    return 0
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) != 3 or not all(names):
    raise errors.ConfigError(f"--columns {args.columns!r}: give three names (text, text, score)")
  rows = contrastive_task.read_pairs(args.sts, names[0], names[1], score=names[2])
  enc = Encoder.load(args.model, pooling)
  print(json.dumps(sts_scores(enc, [(r["anchor"], r["docs"][0], r["score"]) for r in rows], args.batch_size)))
  return 0


def _quantization(args):
  """--precision, --calibration and --rescore_multiplier checked together; the calibration embeddings (or None)."""
  quantized = args.precision != "float32"
  if quantized and (args.rerank or not (args.corpus or args.beir)):
    raise errors.ConfigError(f"--precision {args.precision}: for --corpus and --beir (a corpus of embeddings)")
  if args.rescore_multiplier is not None:
    if args.rescore_multiplier < 0:
      raise errors.ConfigError(f"--rescore_multiplier {args.rescore_multiplier}: an integer >= 1 (0: no rescoring)")
    if not (quantized and args.beir):
      raise errors.ConfigError("--rescore_multiplier is for --beir with a quantized --precision")
  args.rescore_multiplier = 2 if args.rescore_multiplier is None else args.rescore_multiplier  # ST's default
  if not args.calibration:
    return None
  if args.precision not in quantize.SCALAR:
    raise errors.ConfigError(f"--calibration: only --precision int8 or uint8 has ranges to calibrate, not "
                             f"{args.precision}")
  return quantize.load_calibration(args.calibration)


def _refuse(args, kind: str, *names: str) -> None:
  """A one-line error naming the first of these options given (not left at its default) and the model kind or
  mode that takes no such option."""
  for name in names:
    if getattr(args, name) not in (None, "", 0):
      raise errors.ConfigError(f"--{name}: not an option for {kind}; leave it out")


def _rerank(args) -> int:
  """--beir F --rerank RUN: the run's top --depth documents per judged query re-scored by the cross-encoder (each
  query with --query_prefix, each document with --doc_prefix before it); the metrics of the run before and after,
  the new run (its top --top_k per query) written to --run."""
  args.depth = 100 if args.depth is None else args.depth
  check_sizes(depth=args.depth)
  if args.run:
    retrieval.check_run_file(args.run, args.overwrite)
  data = retrieval.read_beir(args.beir, args.split)
  run = rerank.read_run(args.rerank, data.doc_ids)
  judged = {q: run[q] for q in data.query_ids if q in run}
  if not judged:
    raise errors.DataError(f"{args.rerank}: no query of the run has judgements in qrels/{args.split}.tsv")
  if not rerank.CrossEncoder.is_model(args.model):
    raise errors.ConfigError(f"{args.model}: not a cross-encoder (a CrossEncoder folder, an HF "
                             "*ForSequenceClassification folder or a bertjax classification workdir)")
  ce = rerank.CrossEncoder.load(args.model)
  rerank.check_ranker(ce, args.model)
  qp, dp = args.query_prefix or "", args.doc_prefix or ""
  new = rerank.rerank(ce, judged, {q: qp + t for q, t in zip(data.query_ids, data.queries)},
                      {d: dp + t for d, t in zip(data.doc_ids, data.docs)}, args.depth, args.batch_size)
  new = {q: dict(sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:args.top_k]) for q, docs in new.items()}
  if args.run:
    retrieval.write_trec(new, args.run)
  before = retrieval.evaluate_run(judged, data.qrels)
  print(json.dumps({**retrieval.evaluate_run(new, data.qrels), **{f"{k} before": v for k, v in before.items()},
                    "queries": len(data.queries), "pairs scored": sum(len(v) for v in new.values()),
                    "queries of the run without judgements": len(run) - len(judged)}))
  return 0


def _late_interaction(args) -> int:
  """--beir with a MultiVectorEncoder folder: exact MaxSim search, the run and its metrics."""
  if not args.beir:
    raise errors.ConfigError(f"{args.model} is a multi-vector encoder: it takes --beir (STS and --corpus are for "
                             "dense embedding models)")
  if args.run:
    retrieval.check_run_file(args.run, args.overwrite)
  data = retrieval.read_beir(args.beir, args.split)
  enc = multivector.MultiVectorEncoder.load(args.model)
  prompts = {k: v for k, v in (("query_prompt", args.query_prefix), ("document_prompt", args.doc_prefix))
             if v is not None}  # given: they replace the model's own prompts
  enc = dataclasses.replace(enc, settings=dataclasses.replace(enc.settings, **prompts)) if prompts else enc
  s, rows = multivector.search(enc, data.queries, data.docs, args.top_k, args.block, args.batch_size)
  run = retrieval.make_run(data, s, rows)
  if args.run:
    retrieval.write_trec(run, args.run)
  print(json.dumps({**retrieval.evaluate_run(run, data.qrels), "queries": len(data.queries),
                    "documents": len(data.docs), "queries without judgements": data.skipped_queries,
                    "empty documents": data.empty_docs}))
  return 0


def _suite(args, pooling) -> int:
  """--beir_suite F1 F2 ...: every folder's metrics, their mean (NanoBEIREvaluator's), a resumable --out report."""
  from bertjax.embeddings import suite
  _refuse(args, "--beir_suite (no run file or corpus cache per set)", "run", "cache_dir", "calibration")
  if args.precision != "float32":
    raise errors.ConfigError(f"--precision {args.precision}: not an option for --beir_suite; leave it out")
  kind = suite.kind_of(args.model)
  if kind == "sparse" and args.score != "dot":
    raise errors.ConfigError("a sparse encoder scores by dot product: --score dot")
  suite.check_folders(args.beir_suite, args.split)
  suite.check_report(args.out, args.overwrite)
  model = suite.load(args.model, kind, pooling, args.max_active_dims)
  opts = suite.Options(args.split, args.top_k, args.block, args.batch_size, args.score, args.query_prefix,
                       args.doc_prefix, args.max_active_dims)
  report = suite.run(model, kind, args.model, args.beir_suite, opts, args.out, args.overwrite)
  print(suite.table(report))
  print(json.dumps({k: report[k] for k in ("mean", "primary_metric", report["primary_metric"], "suite")}))
  return 0
