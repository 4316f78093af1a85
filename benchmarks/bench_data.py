"""Data benchmark (not a test): examples/s of pre-training data creation and batches/s of the input pipeline.

    python benchmarks/bench_data.py --out bench_data.json [--workers 2] [--batch 256] [--no_beam]

Uses the offline demo corpus (real prose); example creation by the local worker path and by the Apache Beam
pipeline on DirectRunner (one process, and `--workers` processes), per core too; prints a table and writes JSON.
"""
import argparse
import glob
import json
import os
import sys
import tempfile
import time

import numpy as np

from bertjax.data import tokenizer
from bertjax.data.pretraining import dataset, demo_corpus
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--out", default="bench_data.json")
  p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--dupe_factor", type=int, default=5)
  p.add_argument("--steps", type=int, default=50)
  p.add_argument("--no_beam", action="store_true", help="skip the Beam rows")
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--example_mode", default="nsp_pairs", choices=list(pretraining.EXAMPLE_MODES))
  args = p.parse_args()
  rows = []
  with tempfile.TemporaryDirectory() as d:
    text = os.path.join(d, "corpus.txt")
    demo_corpus.build_demo_corpus(text)
    vocab = tokenizer.train([text], os.path.join(d, "tok"), vocab_size=8000)
    opts = pretraining.CreationOptions(max_seq_length=args.seq, dupe_factor=args.dupe_factor, buffer_documents=64,
                                       example_mode=args.example_mode, max_predictions_per_seq=0)
    runs = [(f"create, local (workers={w})", w, None) for w in sorted({1, args.workers})]
    if not args.no_beam:
      runs += [(f"create, Beam DirectRunner (workers={w})", w, "DirectRunner") for w in sorted({1, args.workers})]
    for name, workers, runner in runs:
      out = os.path.join(d, f"data{len(rows)}")
      rec = dataset.create([text], vocab, out, opts, workers=workers, beam_runner=runner)
      n = sum(r["examples"] for r in rec["report"].values())
      size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(out, dataset.NAME, "*", "*.array_record*")))
      src = dataset.load_source(out, "train")
      tokens = np.mean([src[i]["input_mask"].sum() for i in range(0, len(src), max(1, len(src) // 2000))])
      rows.append({"stage": name, "items": n, "seconds": rec["seconds"], "rate": rec["examples_per_s"],
                   "unit": "examples/s", "per_core": rec["examples_per_s"] / workers, "bytes_per_example": size / n,
                   "tokens_per_example": float(tokens), "seq": args.seq, "example_mode": args.example_mode})
    out = os.path.join(d, "data0")
    src = dataset.load_source(out, "train")
    for name, transform in (("static", None), ("dynamic masking", input_pipeline.dynamic_masking(
        pretraining.Vocab.of(tokenizer.load(vocab)), opts, seed=0))):
      pipe = input_pipeline.Pipeline(src, args.batch, seed=0, transform=transform, prefetch=2)
      next(pipe)
      t = time.perf_counter()
      for _ in range(args.steps):
        next(pipe)
      dt = time.perf_counter() - t
      pipe.close()
      rows.append({"stage": f"pipeline, {name}, batch {args.batch}", "items": args.steps, "seconds": dt,
                   "rate": args.steps / dt, "unit": "batches/s"})
  print(f"machine: {machine.describe()}")
  print(f"seq {args.seq}, {args.example_mode}, dupe_factor {args.dupe_factor}")
  print(f"{'stage':42s} {'items':>8s} {'seconds':>8s} {'rate':>10s} {'':10s} {'per core':>9s} {'tokens/ex':>9s} "
        f"{'bytes/ex':>8s}")
  for r in rows:
    extra = (f"{r['per_core']:9.1f} {r['tokens_per_example']:9.1f} {r['bytes_per_example']:8.0f}"
             if "per_core" in r else "")
    print(f"{r['stage']:42s} {r['items']:8d} {r['seconds']:8.2f} {r['rate']:10.1f} {r['unit']:10s} {extra}")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp(rows), f, indent=2)


if __name__ == "__main__":
  main()
