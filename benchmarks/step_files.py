"""Which bertjax files one pre-training step runs through: the reading path of the code, measured.

    python benchmarks/step_files.py [--out step_files.json]

Runs a tiny pre-training (generated corpus) and records, with a profiler on every thread, the package files
entered while the loop runs step 5 (a plain step), step 6 (a log step) and step 8 (a checkpoint step, the last),
and the files the first step reaches while it compiles (config -> data -> model -> loss -> optimizer). On the
2-core CPU it takes about half a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import machine  # noqa: E402

PACKAGE = os.path.join(ROOT, "bertjax") + os.sep


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--out", default="")
  args = p.parse_args()
  from bertjax import pretrain as train
  from bertjax.core import trainer
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset
  from bertjax.data.pretraining import examples as pretraining
  from configs import pretrain

  current = {"step": 0}
  seen: dict[int, set] = {}

  def profile(frame, event, arg):
    del arg
    if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
      seen.setdefault(current["step"], set()).add(os.path.relpath(frame.f_code.co_filename, ROOT))

  build = trainer.build

  def counting_build(*a, **k):
    t = build(*a, **k)
    step_fn = t.train_step

    def train_step(*xs):
      current["step"] += 1
      return step_fn(*xs)
    t.train_step = train_step
    return t
  trainer.build = counting_build

  rng = random.Random(0)
  words = "the model reads text and predicts masked words from both sides of each sentence".split()
  with tempfile.TemporaryDirectory() as tmp:
    corpus = os.path.join(tmp, "c.txt")
    with open(corpus, "w") as f:
      f.write("\n\n".join("\n".join(" ".join(rng.choice(words) for _ in range(8)) + "." for _ in range(5))
                          for _ in range(40)))
    vocab = tokenizer.train([corpus], os.path.join(tmp, "tok"), vocab_size=128)
    n = tokenizer.load(vocab).vocab_size
    dataset.create([corpus], vocab, os.path.join(tmp, "data"),
                   pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2),
                   heldout_every=8)
    c = pretrain.get_config(f"variant=tiny,seq=32,preds=5,batch=8,steps=8,shard=dp,vocab={n}")
    c.data.data_dir = os.path.join(tmp, "data")
    c.log_every, c.eval_every, c.checkpoint_every = 3, 0, 100
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
      train.train_and_evaluate(c, os.path.join(tmp, "run"))
    finally:
      sys.setprofile(None)
      threading.setprofile(None)
  # Files entered between the call of step k's train step and step k+1's belong to step k.
  rows = {"first step (compiles)": seen.get(1, set()), "plain step (5)": seen.get(5, set()),
          "log step (6)": seen.get(6, set()), "checkpoint step (8, last)": seen.get(8, set())}
  print(f"machine: {machine.describe()}")
  for name, files in rows.items():
    print(f"{name}: {len(files)} files: {', '.join(sorted(files))}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(machine.stamp({k: sorted(v) for k, v in rows.items()}), f, indent=2)


if __name__ == "__main__":
  main()
