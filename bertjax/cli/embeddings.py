"""python -m bertjax embeddings MODE --model MODEL ...: one subcommand per mode, each taking only its options.

    embeddings sts    --model M pairs.csv [--columns a,b,score]            STS: Spearman / Pearson of the cosine
    embeddings beir   --model M scifact/ [--run R] [--cache_dir D] ...     exact search, the run, trec_eval's measures
    embeddings suite  --model M scifact/ nfcorpus/ ... [--out report.json] each set's measures and their mean
    embeddings corpus --model M docs/*.jsonl --out DIR                     a corpus into resumable blocks
    embeddings rerank --model CROSS scifact/ first.trec [--run R]         a cross-encoder re-scoring a run

The model is a sentence-transformers folder, an HF folder or a bertjax workdir; its kind (dense, sparse,
multi-vector, cross-encoder) is read once (`kinds.kind_of`), and an option that kind cannot take is one line
(`kinds.settle`); an option of another mode is refused by the mode's parser. The flag spelling (`--sts F`,
`--beir F`, `--beir F --rerank RUN`, `--beir_suite F...`, `--corpus F...`) names the same subcommands
(`from_flags`). Every argument and the data are checked before the model is loaded; no file the command did not
write is written over without --overwrite. Every path may be local or gs:// / s3:// (`bertjax.core.files`); an
unreachable store or a missing bucket is one line before anything is read. docs/embeddings.md.
"""
from __future__ import annotations

import dataclasses
import json
import sys

from bertjax import errors
from bertjax.cli import common
from bertjax.core import files
from bertjax.embeddings import blocks, kinds, quantize, retrieval, suite
from bertjax.embeddings.dense import task as contrastive_task
from bertjax.embeddings.dense.encoder import check_sizes, embed_corpus, sts_scores
from bertjax.embeddings.model import POOLINGS
from bertjax.embeddings.rerank import encoder as rerank

PROG = "python -m bertjax embeddings"
MODES = {"sts": "scored sentence pairs: Spearman and Pearson of the embeddings' cosine similarity",
         "beir": "a BEIR folder: exact search, the TREC run and trec_eval's measures",
         "suite": "several BEIR folders: each one's measures and their mean (NanoBEIR style)",
         "corpus": "embed a corpus into resumable blocks",
         "rerank": "a cross-encoder re-scoring a TREC run's top documents per query"}
# Each mode's subject, read from the positional arguments.
SUBJECTS = {"sts": [("pairs", {"metavar": "PAIRS",
                               "help": ".csv / .tsv / .jsonl with two text columns and a score column"})],
            "beir": [("folder", {"metavar": "FOLDER",
                                 "help": "a BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv"})],
            "suite": [("folders", {"nargs": "+", "metavar": "FOLDER", "help": "BEIR folders"})],
            "corpus": [("files", {"nargs": "+", "metavar": "FILE",
                                  "help": "files or globs (JSONL, Parquet, text; compressed)"})],
            "rerank": [("folder", {"metavar": "FOLDER", "help": "the BEIR folder the run is of"}),
                       ("candidates", {"metavar": "RUN", "help": "the TREC run whose top --depth are re-scored"})]}
ALL = tuple(MODES)
# Every option: its argparse arguments and the modes that take it (a mode refuses the others by construction).
OPTIONS = {
    "--model": (dict(required=True, help="a sentence-transformers folder, an HF folder or a bertjax workdir"), ALL),
    "--batch_size": (dict(type=int, default=32), ALL),
    "--pooling": (dict(default="", choices=["", *POOLINGS], help="default: the model's own, else mean"),
                  ("sts", "beir", "suite", "corpus")),
    "--columns": (dict(default="sentence1,sentence2,score", help="the text, text and score columns"), ("sts",)),
    "--split": (dict(default="test", help="the judgements qrels/SPLIT.tsv"), ("beir", "suite", "rerank")),
    "--top_k": (dict(type=int, default=1000, help="documents kept per query in the run"), ("beir", "suite", "rerank")),
    "--run": (dict(dest="run_file", metavar="TREC", default="", help="write the run here in TREC format"),
              ("beir", "rerank")),
    "--cache_dir": (dict(default="", help="keep the corpus embeddings here; a rerun resumes"), ("beir",)),
    "--block": (dict(type=int, default=None, help="documents embedded at a time (default 65536; 2048 for a sparse "
                                                   "encoder, 1024 for a multi-vector one)"),
                ("beir", "suite", "corpus")),
    "--score": (dict(default=None, choices=["cos", "dot"], help="default cos; dot, the only one, for a sparse "
                                                                 "encoder"), ("beir", "suite")),
    "--query_prefix": (dict(default=None, help="text put before each query (e.g. 'query: '; default: the model's "
                                               "own query prompt, if any)"), ("beir", "suite", "rerank")),
    "--doc_prefix": (dict(default=None, help="text put before each document (default: the model's own document "
                                             "prompt, if any)"), ("beir", "suite", "corpus", "rerank")),
    "--max_active_dims": (dict(type=int, default=0, help="a sparse encoder: keep each vector's largest terms (0: "
                                                          "all)"), ("beir", "suite")),
    "--precision": (dict(default="float32", choices=quantize.PRECISIONS,
                         help="store / search the corpus embeddings quantized as sentence-transformers' "
                              "quantize_embeddings does (docs/embeddings.md#quantized-embeddings)"),
                    ("beir", "corpus")),
    "--calibration": (dict(default="", help="--precision int8/uint8: a .npy of float embeddings whose per-feature "
                                            "min and max are every block's ranges"), ("beir", "corpus")),
    "--rescore_multiplier": (dict(type=int, default=None, help="a quantized --precision: candidates per result "
                                                              "rescored by the float query (default 2; 0: none)"),
                             ("beir",)),
    "--depth": (dict(type=int, default=None, help="documents re-scored per query (default 100)"), ("rerank",)),
    "--out": (dict(default="", help="corpus: the folder of embeddings (required); suite: the report (JSON), "
                                    "resumable"), ("suite", "corpus")),
    "--id_field": (dict(default="_id", help="the JSONL key / Parquet column of a document's id"), ("corpus",)),
    "--text_field": (dict(default="text", help="... of its text (a title field goes before it)"), ("corpus",)),
    "--overwrite": (dict(action="store_true", help="replace a --run file or --out / --cache_dir folder this command "
                                                   "did not write"), ("beir", "suite", "corpus", "rerank")),
}
# The flag spelling: each mode flag and the subcommand it names.
FLAG_MODES = {"--sts": "sts", "--beir": "beir", "--beir_suite": "suite", "--corpus": "corpus", "--rerank": "rerank"}


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(prog=PROG, description="Evaluate an embedding model on STS or BEIR, embed a corpus, or "
                                                   "re-score a run with a cross-encoder; one subcommand per mode.")
  modes = p.add_subparsers(dest="mode", required=True, metavar="MODE", parser_class=common.ArgumentParser)
  for mode, what in MODES.items():
    sub = modes.add_parser(mode, help=what, description=what)
    for name, kw in SUBJECTS[mode]:
      sub.add_argument(name, **kw)
    for flag, (kw, takers) in OPTIONS.items():
      if mode in takers:
        sub.add_argument(flag, **{**kw, "required": True} if (mode, flag) == ("corpus", "--out") else kw)
  return p


def from_flags(argv: list[str]) -> list[str]:
  """The subcommand line of a line in the flag spelling: `--beir F ...` is `beir F ...`, `--beir F --rerank RUN`
  is `rerank F RUN`, `--beir_suite F...` is `suite F...`. A line that starts with its mode (or any word, which the
  parser then judges) is returned as it is."""
  if not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help"):
    return list(argv)
  old = common.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
  for flag in FLAG_MODES:
    old.add_argument(flag, nargs="+" if flag in ("--beir_suite", "--corpus") else None)
  known, rest = old.parse_known_args(argv)
  given = [flag for flag in FLAG_MODES if getattr(known, flag[2:]) is not None]
  if "--rerank" in given and "--beir" not in given:
    raise errors.ConfigError("--rerank needs --beir, the folder whose queries, corpus and judgements the run is of "
                             f"({PROG} rerank --model MODEL FOLDER RUN)")
  if given == ["--beir", "--rerank"]:
    return ["rerank", known.beir, known.rerank, *rest]
  if len(given) != 1:
    if given:
      raise errors.ConfigError(f"{' and '.join(given)}: one mode at a time ({PROG} {'|'.join(MODES)} ...)")
    raise errors.ConfigError(f"name a mode first: {PROG} {'|'.join(MODES)} --model MODEL ... (see {PROG} --help)")
  subject = getattr(known, given[0][2:])
  return [FLAG_MODES[given[0]], *(subject if isinstance(subject, list) else [subject]), *rest]


def parse(argv: list[str]):
  """The subcommand's arguments; an option of another mode is one line naming the modes that take it."""
  args, extra = parser().parse_known_args(from_flags(argv))
  flag = next((a.split("=", 1)[0] for a in extra if a.startswith("-")), None)
  if flag in OPTIONS:
    raise errors.ConfigError(f"{flag}: not an option for `embeddings {args.mode}`; leave it out (it is for "
                             f"{', '.join(OPTIONS[flag][1])})")
  if flag in FLAG_MODES:
    raise errors.ConfigError(f"{flag}: names the mode `{FLAG_MODES[flag]}`, and this line runs `{args.mode}`; one "
                             "mode at a time")
  if extra:
    common.fail(f"bad command line: unrecognized arguments: {' '.join(extra)} (see {PROG} {args.mode} --help)")
  return args


@common.guard
def main(argv=None) -> int:
  args = parse(list(sys.argv[1:] if argv is None else argv))
  given = vars(args)
  for path in (args.model, given.get("pairs"), given.get("folder"), given.get("candidates"), *given.get("files", ()),
               *given.get("folders", ()), given.get("out"), given.get("run_file"), given.get("cache_dir"),
               given.get("calibration")):
    if path:
      files.reach(path)  # once per bucket: a wrong endpoint or a missing bucket is one line, not minutes of retries
  check_sizes(**{k: given[k] for k in ("top_k", "block", "batch_size", "depth") if given.get(k) is not None})
  if given.get("max_active_dims", 0) < 0:
    raise errors.ConfigError(f"--max_active_dims {args.max_active_dims}: a count of terms >= 0 (0: all)")
  return {"sts": _sts, "beir": _beir, "suite": _suite, "corpus": _corpus, "rerank": _rerank}[args.mode](args)


def _options(args, kind: str) -> retrieval.Options:
  """The options object of this line, settled for the model's kind (its block and score; what it refuses)."""
  fields = {f.name for f in dataclasses.fields(retrieval.Options)} - {"calibration"}  # a path here, read below
  opts = retrieval.Options(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
  if opts.precision == "float32" and vars(args).get("rescore_multiplier") is not None:
    raise errors.ConfigError("--rescore_multiplier is for `embeddings beir` with a quantized --precision")
  if opts.rescore_multiplier < 0:
    raise errors.ConfigError(f"--rescore_multiplier {opts.rescore_multiplier}: an integer >= 1 (0: no rescoring)")
  opts = kinds.settle(kind, opts, args.model)
  if not vars(args).get("calibration"):
    return opts
  if opts.precision not in quantize.SCALAR:
    raise errors.ConfigError(f"--calibration: only --precision int8 or uint8 has ranges to calibrate, not "
                             f"{opts.precision}")
  return dataclasses.replace(opts, calibration=quantize.load_calibration(args.calibration))


def _kind(args, dense_only: bool = False) -> str:
  """The model's kind, read once; sts and corpus embed with a dense model only."""
  kind = kinds.kind_of(args.model)
  if dense_only and kind in ("sparse", "multivector"):
    raise errors.ConfigError(f"{args.model} is {kinds.WHAT[kind]}: it takes `embeddings beir` or `embeddings "
                             "suite` (sts and corpus are for dense embedding models)")
  return kind


def _sts(args) -> int:
  kind = _kind(args, dense_only=True)
  opts = _options(args, kind)
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) != 3 or not all(names):
    raise errors.ConfigError(f"--columns {args.columns!r}: give three names (text, text, score)")
  rows = contrastive_task.read_pairs(args.pairs, names[0], names[1], score=names[2])
  enc = kinds.load(args.model, kind, opts)
  print(json.dumps(sts_scores(enc, [(r["anchor"], r["docs"][0], r["score"]) for r in rows], opts.batch_size)))
  return 0


def _beir(args) -> int:
  kind = _kind(args)
  opts = _options(args, kind)
  if opts.run_file:
    retrieval.check_run_file(opts.run_file, opts.overwrite)
  if opts.cache_dir:
    blocks.check_folder(opts.cache_dir, "--cache_dir", opts.overwrite)
  data = retrieval.read_beir(args.folder, opts.split)
  print(json.dumps(kinds.beir_scores(kinds.load(args.model, kind, opts), kind, data, opts)))
  return 0


def _suite(args) -> int:
  """Every folder's metrics, their mean (NanoBEIREvaluator's), a resumable --out report."""
  kind = _kind(args)
  opts = _options(args, kind)
  suite.check_folders(args.folders, opts.split)
  suite.check_report(args.out, opts.overwrite)
  model = kinds.load(args.model, kind, opts)
  report = suite.run(model, kind, args.model, args.folders, opts, args.out, opts.overwrite)
  print(suite.table(report))
  print(json.dumps({k: report[k] for k in ("mean", "primary_metric", report["primary_metric"], "suite")}))
  return 0


def _corpus(args) -> int:
  kind = _kind(args, dense_only=True)
  opts = _options(args, kind)
  blocks.check_folder(args.out, "--out", opts.overwrite)
  ids, texts = retrieval.read_corpus(args.files, args.id_field, args.text_field)
  enc = kinds.load(args.model, kind, opts)
  print(json.dumps(embed_corpus(enc, ids, texts, args.out, opts)))
  return 0


def _rerank(args) -> int:
  """The run's top --depth documents per judged query re-scored by the cross-encoder (each query with
  --query_prefix, each document with --doc_prefix before it); the metrics of the run before and after, the new
  run (its top --top_k per query) written to --run."""
  depth = 100 if args.depth is None else args.depth
  if args.run_file:
    retrieval.check_run_file(args.run_file, args.overwrite)
  data = retrieval.read_beir(args.folder, args.split)
  run = rerank.read_run(args.candidates, data.doc_ids)
  judged = {q: run[q] for q in data.query_ids if q in run}
  if not judged:
    raise errors.DataError(f"{args.candidates}: no query of the run has judgements in qrels/{args.split}.tsv")
  if not rerank.CrossEncoder.is_model(args.model):
    raise errors.ConfigError(f"{args.model}: not a cross-encoder (a CrossEncoder folder, an HF "
                             "*ForSequenceClassification folder or a bertjax classification workdir)")
  ce = rerank.CrossEncoder.load(args.model)
  rerank.check_ranker(ce, args.model)
  qp, dp = args.query_prefix or "", args.doc_prefix or ""
  new = rerank.rerank(ce, judged, {q: qp + t for q, t in zip(data.query_ids, data.queries)},
                      {d: dp + t for d, t in zip(data.doc_ids, data.docs)}, depth, args.batch_size)
  new = {q: dict(sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:args.top_k]) for q, docs in new.items()}
  if args.run_file:
    retrieval.write_trec(new, args.run_file)
  before = retrieval.evaluate_run(judged, data.qrels)
  print(json.dumps({**retrieval.evaluate_run(new, data.qrels), **{f"{k} before": v for k, v in before.items()},
                    "queries": len(data.queries), "pairs scored": sum(len(v) for v in new.values()),
                    "queries of the run without judgements": len(run) - len(judged)}))
  return 0
