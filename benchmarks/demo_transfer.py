"""What the demo's pre-training is worth downstream: its fine-tuning task (launch/demo.py, step 6) from the
pre-trained model and from random weights of the same architecture, paired by seed.

  python benchmarks/demo_transfer.py --demo runs/demo --seeds 0-9 --out benchmarks/results/demo_transfer_cpu.json

`--demo` is a finished demo workdir (bash launch/demo.sh). Each seed draws the task head, the dropout and the
example order; both sides of a seed share them. Prints held-out accuracy per epoch and side, and the paired
difference (pre-trained minus random) with its 95% t interval; writes every run's accuracies as JSON. Runs are
kept under DEMO/transfer/ and read back when finished.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402
import numpy as np  # noqa: E402
from finetune_real import paired  # noqa: E402

from bertjax.cli import common  # noqa: E402


def seeds_arg(text: str) -> list[int]:
  """'0-9' or '0,3,5' -> the seeds."""
  lo, _, hi = text.partition("-")
  try:
    seeds = list(range(int(lo), int(hi) + 1)) if hi else [int(s) for s in text.split(",")]
  except ValueError:
    seeds = []
  if not seeds:
    raise argparse.ArgumentTypeError(f"--seeds {text!r}: give a range such as 0-9 or a list such as 0,3,5")
  return seeds


def run(demo_dir: str, pretrained: bool, seed: int, vocab_size: int, task: dict) -> list[float]:
  from bertjax import finetune
  from configs import demo
  out = os.path.join(demo_dir, "transfer", f"{'pretrained' if pretrained else 'random'}_seed{seed}")
  report = finetune.report_of(demo.finetune_config(demo_dir, task["labels"], vocab_size, pretrained, seed), out)
  return [e["validation"]["accuracy"] for e in report["epochs"]]


def main() -> None:
  p = common.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--demo", default="runs/demo")
  p.add_argument("--seeds", type=seeds_arg, default="0-9")
  p.add_argument("--out", default="")
  args = p.parse_args()
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import demo_corpus
  train_dir = os.path.join(args.demo, "train")
  if not os.path.isdir(os.path.join(train_dir, "checkpoints")):
    common.fail(f"{train_dir} holds no pre-trained model: run bash launch/demo.sh first")
  task = demo_corpus.write_topic_task(os.path.join(args.demo, "topic"))
  vocab_size = tokenizer.load(os.path.join(args.demo, "tokenizer", "vocab.txt")).vocab_size
  rows = []
  for seed in args.seeds:
    for pretrained in (True, False):
      rows.append({"seed": seed, "init": "pretrained" if pretrained else "random",
                   "accuracy": run(args.demo, pretrained, seed, vocab_size, task)})
      print(json.dumps(rows[-1]), flush=True)
  by = {(r["seed"], r["init"]): np.asarray(r["accuracy"]) for r in rows}
  seeds = sorted({r["seed"] for r in rows})
  pre, rnd = (np.stack([by[(s, side)] for s in seeds]) for side in ("pretrained", "random"))
  summary = []
  print(f"\nmachine: {machine.describe()}")
  print(f"{len(seeds)} seeds; labels {task['labels']}; always the most frequent: {task['majority']:.3f}")
  print("| epoch | pre-trained | random weights | difference, 95% interval | pre-trained ahead |")
  print("|---|---|---|---|---|")
  for e in range(pre.shape[1]):
    d = paired(pre[:, e], rnd[:, e])
    summary.append({"epoch": e + 1, "pretrained_mean": float(pre[:, e].mean()), "pretrained_sd": float(
        pre[:, e].std(ddof=1)), "random_mean": float(rnd[:, e].mean()), "random_sd": float(rnd[:, e].std(ddof=1)),
        "difference": d["mean"], "interval": [d["mean"] - d["ci95"], d["mean"] + d["ci95"]],
        "wins": int((pre[:, e] > rnd[:, e]).sum())})
    s = summary[-1]
    print(f"| {e + 1} | {s['pretrained_mean']:.3f} ± {s['pretrained_sd']:.3f} | {s['random_mean']:.3f} ± "
          f"{s['random_sd']:.3f} | {s['difference']:+.3f} [{s['interval'][0]:+.3f}, {s['interval'][1]:+.3f}] | "
          f"{s['wins']}/{len(seeds)} |")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": "python " + " ".join(sys.argv), "task": task, "runs": rows,
                                "summary": summary}), f, indent=1)


if __name__ == "__main__":
  main()
