"""MaxSim scoring on this CPU: bertjax's search program (`multivector.encoder._block_maxsim`: tiles of a query
group against a few documents, each product reduced to its maxima while it is in cache), the whole block's
[queries, documents, query tokens, document tokens] scores at once (one einsum, then the masked max), and
sentence-transformers' `util.maxsim` (what `MultiVectorEncoder.similarity` runs) on the same arrays. Median of
--steps after a first call; prints a table and writes JSON.

  python benchmarks/maxsim.py [--queries 64] [--docs 400] [--query_tokens 32] [--doc_tokens 256] [--dim 128]
      [--steps 5] [--out benchmarks/results/maxsim_cpu.json]
"""
import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import machine  # noqa: E402
from profile_vs_torch import median_time  # noqa: E402

from bertjax.embeddings.multivector import encoder as multivector  # noqa: E402


def whole_block(q, qm, docs, dm):
  s = jnp.einsum("qid,njd->qnij", q, docs, preferred_element_type=jnp.float32)
  best = jnp.max(jnp.where(dm[None, :, None, :], s, -jnp.inf), axis=-1)
  return jnp.sum(jnp.where(qm[:, None, :], best, 0.0), axis=-1)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  for name, default in (("queries", 64), ("docs", 400), ("query_tokens", 32), ("doc_tokens", 256), ("dim", 128),
                        ("steps", 5)):
    ap.add_argument(f"--{name}", type=int, default=default)
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  print(f"machine: {machine.describe()}", flush=True)
  rng = np.random.default_rng(0)
  q = rng.normal(size=(a.queries, a.query_tokens, a.dim)).astype(np.float32)
  docs = rng.normal(size=(a.docs, a.doc_tokens, a.dim)).astype(np.float32)
  qm = rng.random((a.queries, a.query_tokens)) < 0.9
  dm = np.arange(a.doc_tokens)[None] < rng.integers(a.doc_tokens // 8, a.doc_tokens + 1, a.docs)[:, None]
  docs[~dm] = 0.0
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("docs",))
  group, chunk = multivector.tiling(a.queries, a.query_tokens, a.doc_tokens, a.docs)
  while a.docs % chunk:  # the benchmark's documents are not padded to whole steps
    chunk -= 1
  tiled = multivector._block_maxsim(False, mesh, chunk)
  forms = {f"bertjax (tiles: {group} queries x {chunk} documents)":
           lambda: np.concatenate([np.asarray(tiled(q[i:i + group], qm[i:i + group], docs, dm))
                                   for i in range(0, a.queries, group)]),
           "whole block, one einsum": (lambda f=jax.jit(whole_block): np.asarray(f(q, qm, docs, dm)))}
  import torch
  from sentence_transformers import util
  tq, tqm, td, tdm = (torch.from_numpy(x) for x in (q, qm, docs, dm))
  forms["sentence-transformers util.maxsim"] = lambda: util.maxsim(tq, td, tqm, tdm).numpy()
  want = forms["whole block, one einsum"]()
  flop = 2 * a.queries * a.query_tokens * a.docs * a.doc_tokens * a.dim
  rows = []
  for name, f in forms.items():
    diff = float(np.abs(f() - want).max() / np.abs(want).max())
    ms = 1000 * median_time(f, a.steps)
    rows.append({"form": name, "ms": round(ms, 1), "gflop_s": round(flop / ms / 1e6, 1), "max_rel_diff": diff})
    print(json.dumps(rows[-1]), flush=True)
  print(f"\n{a.queries} queries x {a.query_tokens} vectors against {a.docs} documents x {a.doc_tokens} tokens, "
        f"dim {a.dim}\n\n| form | ms | GFLOP/s |\n|---|---|---|")
  for r in rows:
    print(f"| {r['form']} | {r['ms']} | {r['gflop_s']} |")
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": "python benchmarks/maxsim.py " + " ".join(sys.argv[1:]), "rows": rows}),
                f, indent=2)


if __name__ == "__main__":
  main()
