"""The demo's targets over seeds: held-out MLM accuracy (top answer and top five), held-out NSP accuracy beside the
training pairs', and the fine-tuning task from the pre-trained model against random weights, one pre-training per
seed on the demo's data.

  python benchmarks/demo_seeds.py --demo runs/demo --seeds 0-4 --out benchmarks/results/demo_seeds_cpu.json

`--demo` is a finished demo workdir (bash launch/demo.sh): its data, tokenizer and topic task are used as they
are; configs/demo.py gives the recipe. Each seed draws the initial weights, dropout, example order and masks of
its pre-training, and the head, dropout and order of both fine-tunings. Prints each target's mean with its 95% t
interval; writes every run's numbers as JSON. Runs are kept under DEMO/seeds/ and read back when finished.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402
import numpy as np  # noqa: E402
from demo_transfer import seeds_arg  # noqa: E402
from finetune_real import paired  # noqa: E402

from bertjax.cli import common  # noqa: E402

# (key, what it is, the demo's target as (words, test) or None)
TARGETS = (("mlm_accuracy", "held-out MLM accuracy", (">= 0.25", lambda x: x >= 0.25)),
           ("top5", "held-out blanks, true token in the top five", None),
           ("nsp_accuracy", "held-out NSP accuracy", (">= 0.65", lambda x: x >= 0.65)),
           ("nsp_train_accuracy", "NSP accuracy, last training batches", None),
           ("transfer", "topic task after 3 epochs, pre-trained minus random", ("> 0", lambda x: x > 0)))


def pretrain(demo_dir: str, seed: int) -> dict:
  """The demo's pre-training with `seed` on the demo's data; its held-out numbers (launch/demo.py's report)."""
  from bertjax import predict
  from bertjax import pretrain as train
  from bertjax.data import tokenizer
  from configs import demo
  from launch import demo as demo_launch
  out = os.path.join(demo_dir, "seeds", f"seed{seed}")
  done = os.path.join(out, "heldout.json")
  if os.path.exists(done):
    with open(done, encoding="utf-8") as f:
      return json.load(f)
  c = demo.get_config()
  c.seed = seed
  c.data.data_dir = os.path.join(demo_dir, "data")
  c.model.vocab_size = tokenizer.load(os.path.join(demo_dir, "tokenizer", "vocab.txt")).vocab_size
  summary = train.train_and_evaluate(c, os.path.join(out, "train"))
  module, params, _ = predict.load(os.path.join(out, "train"))
  got = demo_launch.report_heldout(summary, c.data.data_dir, module, params, c.train.global_batch_size)
  with open(done, "w", encoding="utf-8") as f:
    json.dump(got, f)
  return got


def finetune(demo_dir: str, pretrained: bool, seed: int, vocab_size: int, task: dict) -> list[float]:
  from bertjax import finetune as finetune_lib
  from configs import demo
  out = os.path.join(demo_dir, "seeds", f"seed{seed}", "pretrained" if pretrained else "random")
  init_dir = os.path.join(demo_dir, "seeds", f"seed{seed}")  # finetune_config reads DIR/train
  c = demo.finetune_config(init_dir, task["labels"], vocab_size, pretrained, seed)
  c.data.tokenizer = os.path.join(demo_dir, "tokenizer", "vocab.txt") if not pretrained else c.data.tokenizer
  c.data.train_file = os.path.join(demo_dir, "topic", "train.csv")
  c.data.eval_file = os.path.join(demo_dir, "topic", "dev.csv")
  return [e["validation"]["accuracy"] for e in finetune_lib.report_of(c, out)["epochs"]]


def main() -> None:
  p = common.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--demo", default="runs/demo")
  p.add_argument("--seeds", type=seeds_arg, default="0-4")
  p.add_argument("--out", default="")
  args = p.parse_args()
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import demo_corpus
  if not os.path.exists(os.path.join(args.demo, "data", "creation.json")):
    common.fail(f"{args.demo} holds no demo data: run bash launch/demo.sh first")
  task = demo_corpus.write_topic_task(os.path.join(args.demo, "topic"))
  vocab_size = tokenizer.load(os.path.join(args.demo, "tokenizer", "vocab.txt")).vocab_size
  rows = []
  for seed in args.seeds:
    row = {"seed": seed, **pretrain(args.demo, seed)}
    row["finetune"] = {side: finetune(args.demo, side == "pretrained", seed, vocab_size, task)
                       for side in ("pretrained", "random")}
    row["transfer"] = row["finetune"]["pretrained"][-1] - row["finetune"]["random"][-1]
    rows.append(row)
    print(json.dumps(row), flush=True)
  summary = {}
  print(f"\nmachine: {machine.describe()}\n{len(rows)} seeds ({', '.join(str(r['seed']) for r in rows)})")
  print("| target | mean, 95% interval | min | max | target met |")
  print("|---|---|---|---|---|")
  for key, name, goal in TARGETS:
    v = np.asarray([r[key] for r in rows], np.float64)
    d = paired(v, np.zeros_like(v))
    met = sum(bool(goal[1](x)) for x in v) if goal else None
    summary[key] = {"mean": d["mean"], "interval": [d["mean"] - d["ci95"], d["mean"] + d["ci95"]],
                    "min": float(v.min()), "max": float(v.max()), "met": met}
    print(f"| {name} | {d['mean']:.3f} [{d['mean'] - d['ci95']:.3f}, {d['mean'] + d['ci95']:.3f}] | {v.min():.3f} | "
          f"{v.max():.3f} | {f'{met} of {len(v)} ({goal[0]})' if goal else ''} |")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": "python " + " ".join(sys.argv), "task": task, "runs": rows,
                                "summary": summary}), f, indent=1)


if __name__ == "__main__":
  main()
