"""Long-context cost: ModernBERT (configs/modernbert.py sizes, 128-token windows, a global layer every third)
forward + backward of the MLM loss at 1,024-8,192 tokens, bertjax's dense banded attention (`xla`) and its
blockwise attention beside HF transformers' `ModernBertForMaskedLM` (SDPA, and any faster attention it loads on
the machine) from the same config, on the same machine. Per row: step time, tokens/s, peak memory, MFU, and each
side's growth from the previous length; then one local and one global layer alone (bertjax), the per-layer split.

  python benchmarks/long_context.py --lengths 1024,2048,4096,8192 --out long_context.json --png long_context.png

Each row runs in its own process (its peak memory is its own; an out-of-memory row is reported, not fatal). Model
FLOPs count what the masks need (a local layer's scores over its window only) and the MLM head at the masked
positions (30%), for every side alike. Peak memory: the device's peak bytes in use on a GPU, the process's peak
resident set on a CPU (weights and all). On a CPU the bertjax rows run under the host allocator setting that
`python -m bertjax train` makes for a step of that size (`bertjax.hostmem.tune_for_cpu`).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def _config(variant, length, impl, dtype, block, unroll=0, remat="none"):
  from bertjax import model as model_lib
  from configs import modernbert
  c = modernbert.get_config(f"variant={variant},seq={length}")
  cfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  return cfg.replace(attention_impl=impl if impl != "hf" else "xla", dtype=dtype, attention_block=block,
                     scan_unroll=unroll or cfg.num_layers, remat=remat)


def _batch(length, vocab, rate=0.3, seed=0):
  rng = np.random.default_rng(seed)
  preds = int(round(rate * length))
  pos = np.sort(rng.choice(np.arange(1, length - 1), preds, replace=False))[None].astype(np.int32)
  return {"input_ids": rng.integers(5, vocab, (1, length)).astype(np.int32),
          "input_mask": np.ones((1, length), np.int32), "segment_ids": np.zeros((1, length), np.int32),
          "masked_lm_positions": pos, "masked_lm_ids": rng.integers(5, vocab, (1, preds)).astype(np.int32),
          "masked_lm_weights": np.ones((1, preds), np.float32), "next_sentence_labels": np.zeros((1,), np.int32)}


def model_flops(cfg, length, preds):
  """Training FLOPs (3x forward) of one row: projections and FFN at every position, attention over the keys
  each layer's mask allows, the MLM head at the masked positions."""
  d, ffn = cfg.hidden_size, cfg.intermediate_size
  mats = 3 if cfg.ffn == "glu" else 2
  total = 0.0
  for i in range(cfg.num_layers):
    keys = min(length, cfg.local_attention + 1) if cfg.layer_is_local(i) else length
    total += 2 * length * (4 * d * d + mats * d * ffn) + 4 * length * keys * d
  total += 2 * preds * (d * d + d * cfg.vocab_size)
  return 3.0 * total


def _peak_memory_bytes():
  import jax
  dev = jax.devices()[0]
  if dev.platform != "cpu":
    return float((dev.memory_stats() or {}).get("peak_bytes_in_use", 0))
  return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def run_bertjax(args):
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from bertjax import model as model_lib
  from bertjax.core import hostmem
  from bertjax.model import encoder as encoder_lib
  from bertjax.model.layers import Layer
  from bertjax.objectives import mlm as mlm_objective
  cfg = _config(args.variant, args.length, args.side, args.dtype, args.block, args.unroll, args.remat)
  # The host allocator setting bertjax's entry points make for a step of this size (bertjax.hostmem); it must
  # precede the first use of a device.
  hostmem.tune_for_cpu(args.length * cfg.hidden_size)
  batch = _batch(args.length, cfg.vocab_size)
  module = model_lib.for_pretraining(cfg)
  params = jax.jit(lambda: nn.meta.unbox(module.init(jax.random.key(0), batch)["params"]))()

  def loss(p, b):
    s = mlm_objective.pretraining_sums(module.apply({"params": p}, b), b)
    return s["mlm_loss_sum"] / s["mlm_weight"]
  step = jax.jit(jax.value_and_grad(loss))
  t = time.perf_counter()
  compiled = step.lower(params, batch).compile()
  compile_s = time.perf_counter() - t
  times = []
  for i in range(args.warmup + args.steps):
    t = time.perf_counter()
    jax.block_until_ready(compiled(params, batch))
    if i >= args.warmup:
      times.append(time.perf_counter() - t)
  row = {"step_s": statistics.median(times), "compile_s": compile_s, "peak_bytes": _peak_memory_bytes(),
         "flops": model_flops(cfg, args.length, batch["masked_lm_ids"].shape[1]), "where": jax.devices()[0].device_kind}
  if args.layers:  # one local and one global layer alone, forward + backward
    ctx = encoder_lib.context(cfg, batch)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(1, args.length, cfg.hidden_size)), cfg.compute_dtype)
    for name, index in (("global_layer_s", 0), ("local_layer_s", 1)):
      layer = Layer(cfg)
      lp = layer.init(jax.random.key(0), x, ctx, True, None, index)["params"]
      f = jax.jit(jax.grad(lambda p, x, index=index, layer=layer: jnp.sum(
          layer.apply({"params": p}, x, ctx, True, None, index).astype(jnp.float32)), argnums=(0, 1)))
      jax.block_until_ready(f(lp, x))
      ts = []
      for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(f(lp, x))
        ts.append(time.perf_counter() - t)
      row[name] = min(ts)
  return row


def run_hf(args):
  import torch
  import transformers

  from bertjax import convert
  cfg = _config(args.variant, args.length, "hf", "float32", args.block)
  impl = args.side.split("-", 1)[1]
  hf_cfg = transformers.AutoConfig.for_model(**convert.FAMILIES["modernbert"].config_to_hf(cfg))
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.set_num_threads(os.cpu_count() or 1)
  m = transformers.AutoModelForMaskedLM.from_config(hf_cfg, attn_implementation=impl).to(device).train()
  b = _batch(args.length, cfg.vocab_size)
  labels = np.full(b["input_ids"].shape, -100, np.int64)
  labels[0, b["masked_lm_positions"][0]] = b["masked_lm_ids"][0]
  inputs = {"input_ids": torch.tensor(b["input_ids"], dtype=torch.long, device=device),
            "attention_mask": torch.tensor(b["input_mask"], dtype=torch.long, device=device),
            "labels": torch.tensor(labels, device=device)}
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  times = []
  for i in range(args.warmup + args.steps):
    m.zero_grad(set_to_none=True)
    sync()
    t = time.perf_counter()
    with autocast:
      loss = m(**inputs).loss
    loss.backward()
    sync()
    if i >= args.warmup:
      times.append(time.perf_counter() - t)
  peak = (torch.cuda.max_memory_allocated() if device == "cuda"
          else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
  where = torch.cuda.get_device_name() if device == "cuda" else f"{torch.get_num_threads()} threads"
  return {"step_s": statistics.median(times), "compile_s": 0.0, "peak_bytes": float(peak),
          "flops": model_flops(cfg, args.length, b["masked_lm_ids"].shape[1]),
          "where": f"HF transformers {transformers.__version__} ModernBertForMaskedLM ({impl}), PyTorch "
                   f"{torch.__version__}, {where}"}


def _peak_tflops(dtype):
  import jax

  from bertjax.core import accounting
  if jax.devices()[0].platform == "cpu":
    return max(accounting.measure_matmul_tflops(n) for n in (1024, 2048)), "best jnp.dot float32 on this CPU"
  peak, source = accounting.peak_tflops_per_device()
  return peak, f"{source} dense bf16 spec"


def plot(rows, path, title):
  """Step time and peak memory of each side against length (log-log), as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for side in dict.fromkeys(r["side"] for r in rows):
    ok = [r for r in rows if r["side"] == side and "step_s" in r]
    axes[0].plot([r["length"] for r in ok], [r["step_s"] for r in ok], "o-", label=side)
    axes[1].plot([r["length"] for r in ok], [r["peak_bytes"] / 1e9 for r in ok], "o-", label=side)
  for ax, label in zip(axes, ("forward + backward, s", "peak memory, GB")):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per row")
    ax.set_ylabel(label)
    ax.legend()
  fig.suptitle(title[:100])
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--lengths", default="1024,2048,4096,8192")
  p.add_argument("--sides", default="xla,blockwise,hf-sdpa", help="xla | blockwise | hf-IMPL (sdpa, flash_attention_2, "
                                                                 "flex_attention, eager)")
  p.add_argument("--variant", default="base")
  p.add_argument("--dtype", default="float32")
  p.add_argument("--block", type=int, default=256, help="blockwise: keys per block of a global layer")
  p.add_argument("--unroll", type=int, default=0, help="layers per scan iteration (0: all, unrolled; 1: a loop, "
                                                       "which compiles faster)")
  p.add_argument("--remat", default="none", help="bertjax sides: none | dots (keep matmul outputs, recompute the "
                                                  "rest in the backward) | full")
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--layers", action="store_true", help="also time one local and one global layer (bertjax sides)")
  p.add_argument("--row_timeout", type=int, default=1200)
  p.add_argument("--out", default="long_context.json")
  p.add_argument("--png", default="")
  p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--side", default="", help=argparse.SUPPRESS)
  p.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.one:
    row = run_hf(args) if args.side.startswith("hf-") else run_bertjax(args)
    print("ROW " + json.dumps(row), flush=True)
    return 0
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  peak, peak_source = _peak_tflops(args.dtype)
  rows = []
  for length in [int(x) for x in args.lengths.split(",")]:
    for side in args.sides.split(","):
      cmd = [sys.executable, os.path.abspath(__file__), "--one", "--side", side, "--length", str(length),
             "--variant", args.variant, "--dtype", args.dtype, "--block", str(args.block), "--unroll",
             str(args.unroll), "--steps", str(args.steps), "--warmup", str(args.warmup), "--remat", args.remat]
      cmd += ["--layers"] if args.layers else []
      row = {"side": side, "length": length, "variant": args.variant, "dtype": args.dtype}
      if args.remat != "none" and not side.startswith("hf-"):
        row["remat"] = args.remat
      failed = [q for q in rows if q["side"] == side and q.get("error") == "out of memory"]
      if failed:  # a side out of memory at a shorter length is not run longer
        row["error"] = f"out of memory (at {failed[0]['length']})"
        rows.append(row)
        print(json.dumps(row), flush=True)
        continue
      try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.row_timeout)
        found = [line for line in r.stdout.splitlines() if line.startswith("ROW ")]
        if found:
          row.update(json.loads(found[-1][4:]))
        else:
          tail = (r.stderr or r.stdout).strip().splitlines()
          oom = any(w in (r.stderr or "") for w in ("RESOURCE_EXHAUSTED", "out of memory", "OutOfMemory"))
          row["error"] = "out of memory" if oom or r.returncode in (-9, 137) else (tail[-1] if tail else
                                                                                   f"exit {r.returncode}")
      except subprocess.TimeoutExpired:
        row["error"] = f"over {args.row_timeout} s"
      if "step_s" in row:
        row["tokens_per_s"] = length / row["step_s"]
        row["mfu"] = row["flops"] / row["step_s"] / 1e12 / peak
        prev = [q for q in rows if q["side"] == side and q["length"] == length // 2 and "step_s" in q]
        row["growth"] = row["step_s"] / prev[0]["step_s"] if prev else None
      rows.append(row)
      print(json.dumps(row), flush=True)
  hf = {r["length"]: r for r in rows if r["side"].startswith("hf-") and "step_s" in r}
  print(f"\nmachine: {machine.describe()}")
  print(f"peak {peak:.1f} TFLOP/s ({peak_source}); ModernBERT-{args.variant}, batch 1, {args.dtype}\n")
  print(f"{'length':>6s} {'side':18s} {'step s':>8s} {'tok/s':>8s} {'peak GB':>8s} {'MFU':>6s} {'x2 len':>7s} "
        f"{'vs HF':>6s} {'local s':>8s} {'global s':>8s}")
  for r in rows:
    label = r["side"] + (f" remat={r['remat']}" if r.get("remat") else "")
    if "step_s" not in r:
      print(f"{r['length']:6d} {label:18s} {r['error']}")
      continue
    vs = f"{r['tokens_per_s'] / hf[r['length']]['tokens_per_s']:6.2f}" if r["length"] in hf else f"{'-':>6s}"
    growth = f"{r['growth']:7.2f}" if r.get("growth") else f"{'-':>7s}"
    layer = "".join(f" {r[k]:8.3f}" if k in r else f" {'-':>8s}" for k in ("local_layer_s", "global_layer_s"))
    print(f"{r['length']:6d} {label:18s} {r['step_s']:8.3f} {r['tokens_per_s']:8.0f} {r['peak_bytes'] / 1e9:8.2f} "
          f"{r['mfu']:6.3f} {growth} {vs}{layer}")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp({"peak_tflops": peak, "peak_source": peak_source, "rows": rows}), f, indent=2)
  if args.png:
    plot(rows, args.png, f"ModernBERT-{args.variant} {args.dtype}, {rows[0].get('where', '')}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
