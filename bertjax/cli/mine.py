"""python -m bertjax mine --model MODEL --pairs PAIRS [--corpus CORPUS] --out OUT.jsonl|OUT.csv [options]

Hard negatives for (anchor, positive) pairs, as sentence-transformers' `util.mine_hard_negatives` mines them
(`bertjax.embeddings.mining`; docs/embeddings.md#mining-hard-negatives): the output is a file that
`configs/finetune.py:task=pairs` (triplet, n-tuple) or `task=rerank` (labeled-pair) trains on. Every argument and
the data are checked before a model is loaded; --out is not written over unless this command wrote it, or with
--overwrite. Paths may be local or gs:// / s3://.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os

from bertjax import errors
from bertjax.cli import common
from bertjax.core import files
from bertjax.data.tasks import rows as task_data
from bertjax.embeddings import blocks, mining
from bertjax.embeddings import folders as st_lib
from bertjax.embeddings.dense import task as contrastive_task
from bertjax.embeddings.dense.encoder import Encoder, model_path
from bertjax.embeddings.multivector import encoder as multivector
from bertjax.embeddings.rerank import encoder as rerank


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Mine hard negatives for (anchor, positive) pairs with an embedding model, "
                                        "as sentence-transformers' mine_hard_negatives does.")
  p.add_argument("--model", required=True, help="the embedding model (sentence-transformers folder, HF folder, "
                                                "bertjax workdir)")
  p.add_argument("--pairs", required=True, help=".csv / .tsv / .jsonl with the anchor and positive columns")
  p.add_argument("--columns", default="anchor,positive", help="the pairs' anchor and positive columns")
  p.add_argument("--corpus", default="", help="documents to mine from beside the positives: .txt (a document a "
                                              "line) or .csv / .tsv / .jsonl with a text column; default: the "
                                              "positives")
  p.add_argument("--out", required=True, help="the mined rows: .jsonl or .csv")
  p.add_argument("--num_negatives", type=int, default=3)
  p.add_argument("--range_min", type=int, default=0, help="skip the best range_min candidates")
  p.add_argument("--range_max", type=int, default=None, help="consider candidates up to this rank (default: from "
                                                             "num_negatives, the positives and the filters)")
  p.add_argument("--max_score", type=float, default=None, help="drop candidates scoring above this")
  p.add_argument("--min_score", type=float, default=None, help="drop candidates scoring below this")
  p.add_argument("--absolute_margin", type=float, default=None, help="keep candidates scoring at least this much "
                                                                     "below the positive")
  p.add_argument("--relative_margin", type=float, default=None, help="keep candidates scoring at most "
                                                                     "positive - |positive| * this")
  p.add_argument("--sampling_strategy", default="top", help="top or random")
  p.add_argument("--seed", type=int, default=None, help="random sampling's seed")
  p.add_argument("--output_format", default="triplet", help="triplet, n-tuple, n-tuple-scores, labeled-pair or "
                                                            "labeled-list")
  p.add_argument("--output_scores", action="store_true", help="add the scores to the rows")
  p.add_argument("--include_positives", action="store_true", help="keep the positives among the candidates "
                                                                  "(n-tuple output, a full ranking)")
  p.add_argument("--cross_encoder", default="", help="re-score the candidates with this cross-encoder")
  p.add_argument("--query_prompt", default=None, help="text put before each anchor")
  p.add_argument("--corpus_prompt", default=None, help="text put before each document")
  p.add_argument("--query_prompt_name", default=None, help="the model's prompt of this name before each anchor")
  p.add_argument("--corpus_prompt_name", default=None, help="... before each document")
  p.add_argument("--cache_dir", default="", help="keep the corpus embeddings here in blocks; a rerun resumes")
  p.add_argument("--block", type=int, default=65536, help="documents embedded at a time")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--overwrite", action="store_true", help="replace an --out file this command did not write")
  return p


def _mark(out: str) -> str:
  return f"{out}.mine.json"


def check_out(out: str, overwrite: bool) -> None:
  """--out: a .jsonl or .csv file, not a folder, and not a file this command did not write (its record beside it)
  unless `overwrite`."""
  if not out.endswith((".jsonl", ".csv")):
    raise errors.ConfigError(f"--out {out}: a .jsonl or .csv file")
  if files.isdir(out):
    raise errors.ConfigError(f"--out {out}: exists and is a folder")
  if not overwrite and (files.isfile(out) or (not files.is_remote(out) and os.path.lexists(out))) and not (
      files.isfile(_mark(out))):
    raise errors.ConfigError(f"--out {out}: exists and this command did not write it; pass --overwrite to replace "
                             "it, or choose another path")


def read_corpus(path: str) -> list[str]:
  """The documents of --corpus: a .txt file's non-empty lines, or the `text` column of a .csv / .tsv / .jsonl."""
  if not files.isfile(path):
    raise errors.DataError(f"--corpus {path}: no such file")
  if path.endswith(".txt"):
    docs = [t for t in files.utf8_text(path, task_data.TaskDataError).splitlines() if t.strip()]
  else:
    docs = []
    for line, row in task_data.read_rows(path):
      if "text" not in row:
        raise errors.DataError(f"--corpus {path}:{line}: no 'text' column; it has {sorted(row)}")
      if str(row["text"] or "").strip():
        docs.append(str(row["text"]))
  if not docs:
    raise errors.DataError(f"--corpus {path}: an empty corpus (no documents)")
  return docs


def write_rows(rows: list[dict], out: str) -> None:
  """JSON lines, or CSV (list cells as JSON), written whole then renamed, with the record that marks it ours."""
  buf = io.StringIO()
  if out.endswith(".jsonl"):
    buf.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  else:
    names = list(rows[0]) if rows else []
    w = csv.DictWriter(buf, names, lineterminator="\n")
    w.writeheader()
    for r in rows:
      w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
  files.write_whole(_mark(out), json.dumps({"command": "mine", "rows": len(rows)}))
  files.write_whole(out, buf.getvalue())


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  for path in (args.model, args.pairs, args.corpus, args.out, args.cross_encoder, args.cache_dir):
    if path:
      files.reach(path)
  mining.check_options(args.num_negatives, args.range_min, args.range_max, args.sampling_strategy,
                       args.output_format, args.batch_size, args.block)
  for name in ("max_score", "min_score", "absolute_margin", "relative_margin"):
    if getattr(args, name) is not None and not math.isfinite(getattr(args, name)):
      raise errors.ConfigError(f"--{name} {getattr(args, name)}: a finite number")
  for side in ("query", "corpus"):
    if getattr(args, f"{side}_prompt") is not None and getattr(args, f"{side}_prompt_name") is not None:
      raise errors.ConfigError(f"--{side}_prompt and --{side}_prompt_name: give one (a text, or the name of one of "
                               "the model's prompts)")
  if args.include_positives and args.output_format not in ("n-tuple", "n-tuple-scores"):
    raise errors.ConfigError(f"--include_positives keeps the ranking order in n-tuple rows; --output_format "
                             f"{args.output_format} does not go with it")
  if not files.exists(args.model):
    raise errors.ConfigError(f"--model {args.model}: no such model folder or workdir")
  if args.seed is not None and args.sampling_strategy != "random":
    raise errors.ConfigError("--seed is for --sampling_strategy random")
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) != 2 or not all(names):
    raise errors.ConfigError(f"--columns {args.columns!r}: give two names (anchor, positive)")
  check_out(args.out, args.overwrite)
  if args.cache_dir:
    blocks.check_folder(args.cache_dir, "--cache_dir", args.overwrite)
  pairs = contrastive_task.read_pairs(args.pairs, names[0], names[1])
  corpus = read_corpus(args.corpus) if args.corpus else None
  if corpus is not None:
    known = set(corpus)
    missing = [i for i, r in enumerate(pairs) if r["docs"][0] not in known]
    if missing:
      raise errors.DataError(f"--pairs {args.pairs}: {len(missing)} positive(s) missing from --corpus {args.corpus}, "
                             f"the first of pair {missing[0] + 1} ({pairs[missing[0]]['docs'][0][:60]!r})")
  ce = None
  if args.cross_encoder:
    if not rerank.CrossEncoder.is_model(model_path(args.cross_encoder)):
      raise errors.ConfigError(f"--cross_encoder {args.cross_encoder}: not a cross-encoder (a CrossEncoder folder, an "
                               "HF *ForSequenceClassification folder or a bertjax classification workdir)")
    ce = rerank.CrossEncoder.load(args.cross_encoder)
    rerank.check_ranker(ce, f"--cross_encoder {args.cross_encoder}")
  local = model_path(args.model)
  if multivector.is_model(local) or rerank.CrossEncoder.is_reranker(local):
    kind = "a multi-vector encoder" if multivector.is_model(local) else "a cross-encoder"
    raise errors.ConfigError(f"--model {args.model}: {kind}; mining ranks the corpus with a dense embedding model "
                             "(a cross-encoder rescores through --cross_encoder)")
  prompts = (st_lib.st_config(local).get("prompts") or {}) if st_lib.is_folder(local) else {}
  for side in ("query", "corpus"):  # a prompt name the model lacks: one line before it loads
    mining.resolve_prompt(prompts, getattr(args, f"{side}_prompt_name"), None, f"{side}_prompt_name")
  enc = Encoder.load(args.model)
  rows = mining.mine_hard_negatives(
      enc, [r["anchor"] for r in pairs], [r["docs"][0] for r in pairs], corpus, cross_encoder=ce,
      range_min=args.range_min, range_max=args.range_max, max_score=args.max_score, min_score=args.min_score,
      absolute_margin=args.absolute_margin, relative_margin=args.relative_margin, num_negatives=args.num_negatives,
      sampling_strategy=args.sampling_strategy, query_prompt_name=args.query_prompt_name,
      query_prompt=args.query_prompt, corpus_prompt_name=args.corpus_prompt_name, corpus_prompt=args.corpus_prompt,
      prompts=prompts, include_positives=args.include_positives, output_format=args.output_format,
      output_scores=args.output_scores, batch_size=args.batch_size, block=args.block, out=args.cache_dir,
      overwrite=args.overwrite, seed=args.seed, anchor_column=names[0], positive_column=names[1])
  write_rows(rows, args.out)
  print(json.dumps({"rows": len(rows), "pairs": len(pairs), "out": args.out}))
  return 0
