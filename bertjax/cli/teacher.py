"""python -m bertjax teacher --model TEACHER --pairs FILE --columns anchor,positive,negative_1,... --out SCORES

A teacher's score of each row's query with each of its documents (the positive, then the negatives), for training
a student with a distillation loss (`*.loss=margin_mse|distill_kl`, `data.teacher_scores=SCORES`;
docs/embeddings.md#distillation-from-a-teacher). A cross-encoder teacher (a CrossEncoder folder, an HF
*ForSequenceClassification folder, a bertjax rerank / classification workdir) gives its logits; a bi-encoder (a
sentence-transformers folder, an HF encoder, a bertjax workdir) the similarity of the embeddings (the folder's,
cosine by default). SCORES is a folder written in blocks of --block rows, each whole before the next: a rerun after
a kill scores only the blocks that are missing. It records the teacher and the SHA-256 of --pairs, so that a
training run refuses the scores of another file; a folder this command did not write is never written into.
"""
from __future__ import annotations

import json

from bertjax import errors
from bertjax.cli import common
from bertjax.core import files
from bertjax.embeddings import distill, teacher
from bertjax.embeddings.dense import task as contrastive_task


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Score a training file's (query, positive, negatives) rows with a teacher "
                                        "(cross-encoder or bi-encoder) for distillation.")
  p.add_argument("--model", required=True, help="the teacher: a cross-encoder or an embedding model")
  p.add_argument("--pairs", required=True, help="the training file (.csv / .tsv / .jsonl)")
  p.add_argument("--columns", default="anchor,positive,negative",
                 help="its query, positive and negative columns, in the order the training run reads them")
  p.add_argument("--out", required=True, help="the score folder (data.teacher_scores)")
  p.add_argument("--block", type=int, default=4096, help="rows scored and written at a time")
  p.add_argument("--batch_size", type=int, default=32, help="texts (or pairs) per forward pass")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  for path in (args.model, args.pairs, args.out):
    files.reach(path)
  for name in ("block", "batch_size"):
    if getattr(args, name) < 1:
      raise errors.ConfigError(f"--{name} {getattr(args, name)} must be >= 1")
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) < 2 or not all(names) or len(set(names)) != len(names):
    raise errors.ConfigError(f"--columns {args.columns!r}: give the query, positive and negative columns, each once")
  if not files.isfile(args.pairs):
    raise errors.DataError(f"--pairs {args.pairs}: no such file")
  if not files.isdir(args.model):
    raise errors.ConfigError(f"--model {args.model}: no such model folder or workdir")
  rows = contrastive_task.read_pairs(args.pairs, names[0], names[1], tuple(names[2:]))
  record = {"command": "teacher", "teacher": files.absolute(args.model), "pairs": files.absolute(args.pairs),
            "fingerprint": distill.fingerprint(args.pairs), "columns": names, "rows": len(rows), "block": args.block}
  teacher.open_folder(args.out, {**record, "kind": ""})  # refuse a foreign --out before a model loads
  kind, score = teacher.teacher_scorer(args.model, rows, args.batch_size)
  done = teacher.write_scores(args.out, {**record, "kind": kind}, score)
  print(json.dumps({"rows": len(rows), "scores_per_row": len(names) - 1, "teacher": kind, "blocks_scored": done,
                    "out": args.out}))
  return 0
