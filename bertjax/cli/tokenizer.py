"""python -m bertjax tokenizer --input FILES --out DIR [--kind wordpiece|unigram|bpe|byte_bpe] [--vocab_size N]

Trains a tokenizer on text files (`bertjax.data.tokenizer`); the same command gives the same files.
"""
from __future__ import annotations

import time

from bertjax.cli import common
from bertjax.core import files
from bertjax.data import tokenizer
from bertjax.data.pretraining import corpus


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Train a BERT tokenizer (WordPiece or sentencepiece) on text files.")
  p.add_argument("--input", nargs="+", required=True,
                 help="shards or glob patterns (text, .jsonl, .parquet, optionally compressed) or tfds:NAME[:SPLIT]")
  p.add_argument("--text_field", default="text", help="the JSONL key / Parquet column with the text")
  p.add_argument("--skip_bad_records", action="store_true",
                 help="skip and count bad records and unreadable shards instead of stopping at the first")
  p.add_argument("--out", required=True, help="output folder")
  p.add_argument("--kind", default="wordpiece", choices=["wordpiece", "unigram", "bpe", "byte_bpe"])
  p.add_argument("--vocab_size", type=int, default=30522)
  p.add_argument("--cased", action="store_true", help="keep case and accents")
  p.add_argument("--overwrite", action="store_true", help="replace the tokenizer files already in --out")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  files.reach(args.out)  # an unreachable store or a missing bucket: one line (the inputs: as they are expanded)
  start = time.time()

  def progress(lines):
    print(f"tokenizer: read {lines:,} lines ({time.time() - start:.0f} s)", flush=True)
  path = tokenizer.train(args.input, args.out, args.kind, args.vocab_size, do_lower_case=not args.cased,
               reader=corpus.ReadOptions(text_field=args.text_field, skip_bad_records=args.skip_bad_records),
               overwrite=args.overwrite, progress=progress)
  tok = tokenizer.load(path, do_lower_case=not args.cased)
  print(f"wrote {path} ({tok.vocab_size} pieces, {time.time() - start:.1f} s)")
  if tok.vocab_size > args.vocab_size:
    print(f"note: the corpus' characters alone take {tok.vocab_size} pieces, more than the {args.vocab_size} asked "
          f"for; a model on this tokenizer needs vocab_size {tok.vocab_size}", flush=True)
  if tok.vocab_size < args.vocab_size:
    print(f"note: the corpus yields {tok.vocab_size} pieces, fewer than the {args.vocab_size} asked for; a model on "
          f"this tokenizer needs vocab_size {tok.vocab_size} (e.g. configs/pretrain.py:...,vocab={tok.vocab_size})",
          flush=True)
  return 0
