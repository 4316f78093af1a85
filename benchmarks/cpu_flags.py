"""XLA:CPU options against the default, on the MiniLM-L6 fine-tuning step and its forward pass (finetune_step.py),
each option set in its own process, side by side in one run; prints a table and writes JSON.

  python benchmarks/cpu_flags.py [--shapes 32x64,16x256] [--steps 10] [--out benchmarks/results/cpu_flags.json]

The options are XLA's own (`XLA_FLAGS`): the vector width its code generator prefers, oneDNN or XNNPACK / YNNPACK
kernels for matrix products and their fused neighbours. A setting is worth keeping where it speeds the step on
every CPU kind it is measured on (the table names the CPU).
"""
import argparse
import json
import os
import re
import subprocess
import sys

import machine

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = {
    "default": "",
    "vector width 512": "--xla_cpu_prefer_vector_width=512",
    "oneDNN matmuls": "--xla_cpu_use_onednn=true",
    "oneDNN fusions": "--xla_cpu_experimental_onednn_fusion_type=dot,eltwise",
    "XNNPACK fusions": "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce",
    "XNNPACK dots": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "YNNPACK fusions": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
    "no XNNPACK": "--xla_cpu_use_xnnpack=false",
}
LINE = re.compile(r"train step (\d+) ms .*forward \+ backward (\d+) ms; forward \(eval\) (\d+) ms; optimizer update "
                  r"(\d+) ms")


def measure(flags: str, batch: int, length: int, steps: int) -> dict:
  env = {**os.environ, "XLA_FLAGS": " ".join(x for x in (os.environ.get("XLA_FLAGS", ""), flags) if x),
         "JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false"}
  done = subprocess.run([sys.executable, os.path.join(HERE, "finetune_step.py"), "--batch", str(batch), "--length",
                         str(length), "--steps", str(steps)], env=env, capture_output=True, text=True)
  m = LINE.search(done.stdout)
  if done.returncode or not m:
    return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
  step, fwd_bwd, fwd, update = (int(v) for v in m.groups())
  return {"train_step_ms": step, "forward_backward_ms": fwd_bwd, "forward_ms": fwd, "update_ms": update}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--shapes", default="32x64,16x256", help="batch x length of each measured step")
  ap.add_argument("--steps", type=int, default=10, help="steps measured in each (default: %(default)s)")
  ap.add_argument("--sets", default=",".join(SETS),
                  help="comma-separated names of the option sets, of: " + "; ".join(SETS))
  ap.add_argument("--out", default="cpu_flags.json", help="the results JSON (default: %(default)s)")
  a = ap.parse_args()
  unknown = [n for n in a.sets.split(",") if n not in SETS]
  if unknown:
    ap.error(f"--sets {unknown[0]!r}: not an option set; the sets are: {'; '.join(SETS)}")
  print(f"machine: {machine.describe()}", flush=True)
  shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
  rows = []
  for name in a.sets.split(","):
    for batch, length in shapes:
      r = {"options": name, "xla_flags": SETS[name], "batch": batch, "length": length,
           **measure(SETS[name], batch, length, a.steps)}
      rows.append(r)
      print(json.dumps(r), flush=True)
  base = {(r["batch"], r["length"]): r for r in rows if r["options"] == "default" and "error" not in r}
  print("\n| options | shape | train step ms | vs default | forward ms | vs default |\n|---|---|---|---|---|---|")
  for r in rows:
    b = base.get((r["batch"], r["length"]))
    if "error" in r:
      print(f"| {r['options']} | {r['batch']}x{r['length']} | {r['error']} | | | |")
      continue
    ratio = (lambda k: f"{b[k] / r[k]:.2f}x" if b else "")
    print(f"| {r['options']} | {r['batch']}x{r['length']} | {r['train_step_ms']} | {ratio('train_step_ms')} | "
          f"{r['forward_ms']} | {ratio('forward_ms')} |")
  with open(a.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp({"command": "python benchmarks/cpu_flags.py " + " ".join(sys.argv[1:]), "rows": rows}),
              f, indent=2)


if __name__ == "__main__":
  main()
