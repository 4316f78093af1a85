"""Where a profiled step's time goes: device kernels from a `bench --profile DIR` trace, grouped and ranked.

  python benchmarks/profile_summary.py DIR [--top 30]

Reads the newest perfetto_trace.json.gz under DIR; sums the durations of the accelerator's kernels (the host's
when there is no accelerator) by name and by kind (matrix products, fusions, copies, collectives, the rest), and
prints per-step milliseconds (three steps are profiled). On a CPU the times are per host thread: a YNNPACK
fusion (`ynn_fusion`, counted as matmul; a few are reductions) shows on the thread that called it while it runs
on every core, and the executor's own bookkeeping events (ThunkExecutor, ThreadpoolListener, the `end:` markers)
are left out.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re

KINDS = (("matmul", re.compile(r"gemm|xmma|cutlass|cublas|nvjet|wgmma|dot|convolution|ynn_fusion|xnn_fusion", re.I)),
         ("attention", re.compile(r"cudnn|flash|fmha|attention", re.I)),
         ("collective", re.compile(r"nccl|all-reduce|all-gather|reduce-scatter|all_reduce|all_gather", re.I)),
         ("copy/transpose", re.compile(r"copy|transpose|memcpy|memset|dynamic-update-slice|dynamic_update", re.I)),
         ("reduction fusion", re.compile(r"reduce|reduction", re.I)),
         ("elementwise fusion", re.compile(r"fusion|loop_|input_", re.I)))


BOOKKEEPING = ("$", "ThunkExecutor", "ThreadpoolListener", "end: ", "SlinkyThreadPool", "Wait for")


def kind_of(name):
  for kind, pattern in KINDS:
    if pattern.search(name):
      return kind
  return "other"


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("dir")
  p.add_argument("--top", type=int, default=30)
  p.add_argument("--steps", type=int, default=3)
  args = p.parse_args()
  files = sorted(glob.glob(os.path.join(args.dir, "**", "perfetto_trace.json.gz"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    raise SystemExit(f"no perfetto_trace.json.gz under {args.dir}")
  with gzip.open(files[-1]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  names = {e["pid"]: e["args"].get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  # Only processes with kernel events count: with libtpu installed, a CPU trace also names an empty
  # "/device:CUSTOM:Megascale Trace" process, which would otherwise hide the host's events.
  busy = {e.get("pid") for e in events if e.get("ph") == "X"}
  device = [pid for pid, n in names.items() if pid in busy and re.search(r"GPU|TPU|device", n, re.I)]
  pids = set(device or (busy & set(names)) or names)
  by_name, by_kind = collections.Counter(), collections.Counter()
  count = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in pids and not e["name"].startswith(BOOKKEEPING):
      ms = e.get("dur", 0) / 1e3 / args.steps
      by_name[e["name"]] += ms
      by_kind[kind_of(e["name"])] += ms
      count[e["name"]] += 1
  total = sum(by_kind.values())
  print(f"{files[-1]}\nprocesses: {', '.join(names[p] for p in pids)}\nkernel time per step: {total:.2f} ms")
  for kind, ms in by_kind.most_common():
    print(f"  {kind:20s} {ms:9.2f} ms  {ms / max(total, 1e-9):6.1%}")
  print(f"\ntop {args.top} kernels (ms per step, launches per step):")
  for name, ms in by_name.most_common(args.top):
    print(f"  {ms:8.2f}  {count[name] / args.steps:6.0f}  {name[:110]}")


if __name__ == "__main__":
  main()
