"""python -m bertjax dataset --input FILES --tokenizer VOCAB --out DATA [--workers N | --beam_runner R] [...]

Pre-training examples as google-research/bert's create_pretraining_data.py makes them (`bertjax.data.pretraining`):
a tfds dataset of array_record shards and creation.json; docs/data.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys

import tensorflow_datasets as tfds

from bertjax import errors
from bertjax.cli import common
from bertjax.core import files
from bertjax.data.pretraining import corpus as corpus_lib
from bertjax.data.pretraining import dataset, store
from bertjax.data.pretraining import examples as pretraining

INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)


def boolean(text: str) -> bool:
  """A flag's true / false, refusing anything else (`flase` is a mistake, not False)."""
  value = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(text.lower())
  if value is None:
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true / false)")
  return value


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Create BERT pre-training data (create_pretraining_data.py semantics).")
  p.add_argument("--input", nargs="+", required=True,
                 help="shards or glob patterns (text, .jsonl, .parquet, optionally .gz/.bz2/.xz/.zst) or "
                      "tfds:NAME[:SPLIT]")
  p.add_argument("--tokenizer", required=True, help="vocab.txt, sentencepiece .model or byte-level BPE vocab.json")
  p.add_argument("--out", required=True, help="output data_dir")
  p.add_argument("--format", default="auto", choices=list(corpus_lib.FORMATS),
                 help="auto: .jsonl/.json -> jsonl, .parquet -> parquet, tfds:... -> tfds, anything else -> lines "
                      "(one sentence per line, blank line between documents)")
  p.add_argument("--text_field", default="text", help="the JSONL key / Parquet column / tfds feature with the text")
  p.add_argument("--splitter", default="sentencex", choices=list(corpus_lib.SPLITTERS),
                 help="sentence splitter for paragraphs / records")
  p.add_argument("--language", default="en", help="the sentence splitter's language")
  p.add_argument("--skip_bad_records", action="store_true",
                 help="skip and count bad records and unreadable shards instead of stopping at the first")
  p.add_argument("--tfds_data_dir", default=None, help="where tfds: inputs are prepared")
  p.add_argument("--beam_runner", default=None,
                 help="make the examples with Apache Beam on this runner (DirectRunner, DataflowRunner, ...)")
  p.add_argument("--beam_options", default="",
                 help="Beam's own pipeline flags, e.g. '--project=P --region=R --temp_location=gs://B/tmp'")
  p.add_argument("--cased", action="store_true")
  p.add_argument("--heldout_every", type=int, default=20)
  p.add_argument("--workers", type=int, default=1)
  p.add_argument("--overwrite", action="store_true")
  for f in dataclasses.fields(pretraining.CreationOptions):
    kind = boolean if f.type in (bool, "bool") else type(f.default)
    p.add_argument(f"--{f.name}", type=kind, default=f.default)
  return p


@common.guard
def main(argv=None):
  args = parser().parse_args(argv)
  try:
    beam_options = shlex.split(args.beam_options)
  except ValueError as e:
    raise errors.ConfigError(f"--beam_options {args.beam_options!r}: {e}") from None
  # A wrong endpoint, a missing bucket or missing credentials: one line now, not minutes of retries later.
  # (The inputs are reached as they are expanded.)
  for path in (args.out, args.tokenizer):
    files.reach(path)
  tfds.disable_progress_bar()  # its bars are terminal escape codes in a log; PROGRESS prints plain lines
  dataset.PROGRESS["print"] = True
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  if not args.beam_runner and args.workers > cores:
    print(f"note: --workers {args.workers} on {cores} core(s): using {cores} (more processes than cores only "
          "compete for them)", flush=True)
    args.workers = cores
  opts = pretraining.CreationOptions(**{f.name: getattr(args, f.name)
                                        for f in dataclasses.fields(pretraining.CreationOptions)})
  reader = corpus_lib.ReadOptions(format=args.format, text_field=args.text_field, splitter=args.splitter,
                                  language=args.language, skip_bad_records=args.skip_bad_records)
  try:
    rec = dataset.create(args.input, args.tokenizer, args.out, opts, do_lower_case=not args.cased,
                         heldout_every=args.heldout_every, workers=args.workers, overwrite=args.overwrite,
                         reader=reader, tfds_data_dir=args.tfds_data_dir, beam_runner=args.beam_runner,
                         beam_options=beam_options)
  except KeyboardInterrupt:  # Ctrl-C: the worker processes are stopped on the way out (their pool's exit)
    rec = None
  if rec is None:
    done = sum(len(s) for s in store.built_records(args.out).values())
    print(f"error: interrupted: {done} shard(s) finished and kept in {args.out}; rerun the same command to finish",
          file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED)
  for split, r in rec["report"].items():
    print(f"{split}: {r['examples']} examples (corpus: {r['documents']} documents)" +
          "".join(f"; warning: {w}" for w in r["warnings"]))
  print(f"{rec['examples_per_s']:.0f} examples/s; wrote {args.out}")
