"""DeBERTa-v3's fine-tuning step against HF's PyTorch DebertaV2ForSequenceClassification, with BERT of the same
shape beside it on both sides (what DeBERTa's disentangled attention costs over BERT's), at several lengths.

  python benchmarks/deberta_step.py [--shape base] [--points 8x128,2x512,1x2048] [--steps 3] \\
      [--out benchmarks/results/deberta_step_cpu.json]

Each (family, side, batch x length) runs in a fresh process: a sequence classifier with two labels in training
mode (dropout on), AdamW with weight decay and gradient clipping at 1.0 (the fine-tuning recipe), random token
ids. Time: the median of --steps whole train steps after one warm-up step. Memory: the process's peak resident
memory (parameters, optimizer state, activations, the runtime and, for bertjax, the compiler); bertjax also reports
the temporary bytes XLA's compiled step needs (activations and workspace). Shapes: DeBERTa-v3 (relative attention,
p2c + c2p, 256 position buckets, shared key/query projections, LayerNorm'd relative embeddings, no absolute
positions, 128,100 pieces) and BERT with the same width, depth and vocabulary size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHAPES = {"xsmall": (384, 12, 6, 1536), "small": (768, 6, 12, 3072), "base": (768, 12, 12, 3072),
          "large": (1024, 24, 16, 4096)}  # hidden, layers, heads, intermediate (the DeBERTa-v3 releases')


def hf_config(family: str, shape: str, max_len: int):
  import transformers
  hidden, layers, heads, inter = SHAPES[shape]
  common = dict(vocab_size=128100, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=inter, num_labels=2, max_position_embeddings=max(512, max_len))
  if family == "bert":
    return transformers.BertConfig(**common)
  return transformers.DebertaV2Config(**common, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                      position_buckets=256, max_relative_positions=-1, share_att_key=True,
                                      norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)


def measure(step, steps: int) -> dict:
  import resource
  step()  # warm-up: compiled (bertjax) and optimizer state allocated (PyTorch's AdamW allocates it lazily)
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
  times.sort()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return {"seconds": times[len(times) // 2], "peak_resident_bytes": peak}


def run_hf(family, shape, batch, length, steps) -> dict:
  import numpy as np
  import torch
  import transformers
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  cls = (transformers.BertForSequenceClassification if family == "bert"
         else transformers.DebertaV2ForSequenceClassification)
  model = cls(hf_config(family, shape, length)).train()
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
  rng = np.random.default_rng(0)
  ids = torch.tensor(rng.integers(1000, 20000, (batch, length)))
  labels = torch.tensor(rng.integers(0, 2, batch))
  mask = torch.ones_like(ids)

  def step():
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
  return measure(step, steps)


def run_bertjax(family, shape, batch, length, steps, attention="") -> dict:
  sys.path.insert(0, ROOT)
  from bertjax.core import hostmem
  hidden = SHAPES[shape][0]
  hostmem.tune_for_cpu(batch * length * hidden)  # as `python -m bertjax train` sets it
  import jax
  import ml_collections
  import numpy as np

  from bertjax import convert, finetune
  from bertjax import tasks as tasks_lib
  from bertjax.core import trainer
  from configs import finetune as ft_config
  c = ft_config.get_config(f"task=local,lr=2e-5,batch={batch},seq={length}")
  c.unlock()
  c.data.labels = ("neg", "pos")
  task = tasks_lib.get("local", c.data.labels)
  mcfg = convert.config_from_hf(hf_config(family, shape, length).to_dict(), dropout_rate=0.1,
                                attention_dropout_rate=0.1, attention_impl=attention or c.model.attention_impl)
  module = tasks_lib.kind(task).head(task, mcfg.for_platform(jax.default_backend()))
  tcfg = ml_collections.ConfigDict(c.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = 1000, 100
  tx, lr_fn = finetune.unit_optimizer(tcfg)
  rng = np.random.default_rng(0)
  shape2 = (batch, length)
  b = {"input_ids": rng.integers(1000, 20000, shape2).astype(np.int32), "input_mask": np.ones(shape2, np.int32),
       "segment_ids": np.zeros(shape2, np.int32), "labels": rng.integers(0, 2, batch).astype(np.int32),
       "example_weights": np.ones(batch, np.float32)}
  t = trainer.build(c, module, tx, lr_fn, b, *finetune.make_steps(module, task, tx, lr_fn), train_scalars=2)
  box = [trainer.init_state(t, 0)]
  lr = np.float32(2e-5)
  compiled = t.train_step.lower(box[0], b, np.uint32(0), lr).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes

  def step():
    box[0], m = compiled(box[0], b, np.uint32(0), lr)
    jax.block_until_ready(m)
  return {**measure(step, steps), "xla_temp_bytes": temp, "attention": mcfg.attention_at(length)}


def child(args) -> None:
  if args.side == "bertjax":
    out = run_bertjax(args.family, args.shape, args.batch, args.length, args.steps, args.attention)
  else:
    out = run_hf(args.family, args.shape, args.batch, args.length, args.steps)
  print(json.dumps(out))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", default="base", choices=sorted(SHAPES))
  p.add_argument("--points", default="8x128,2x512,1x2048", help="batch x length, comma-separated")
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--families", default="deberta,bert")
  p.add_argument("--attention", default="", help="bertjax's attention_impl (default: the fine-tuning config's)")
  p.add_argument("--out", default="")
  p.add_argument("--side", default="", help=argparse.SUPPRESS)  # one measurement in this process
  p.add_argument("--family", default="", help=argparse.SUPPRESS)
  p.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.side:
    return child(args)
  print(f"machine: {machine.describe()}", flush=True)
  rows = []
  for point in args.points.split(","):
    batch, length = (int(x) for x in point.split("x"))
    for family in args.families.split(","):
      row = {"family": family, "batch": batch, "length": length}
      for side in ("bertjax", "hf"):
        out = subprocess.run([sys.executable, __file__, "--side", side, "--family", family, "--shape", args.shape,
                              "--batch", str(batch), "--length", str(length), "--steps", str(args.steps),
                              "--attention", args.attention],
                             cwd=ROOT, capture_output=True, text=True)
        if out.returncode:
          raise SystemExit(f"{family} {side} {point}: {out.stderr.strip().splitlines()[-1]}")
        row[side] = json.loads(out.stdout.strip().splitlines()[-1])
      rows.append(row)
      b, h = row["bertjax"], row["hf"]
      print(f"{family:8s} {batch:3d} x {length:5d}  bertjax {b['seconds']:7.2f} s "
            f"{b['peak_resident_bytes'] / 2**30:5.2f} "
            f"GiB (XLA temp {b['xla_temp_bytes'] / 2**20:.0f} MiB, {b['attention']})  HF {h['seconds']:7.2f} s "
            f"{h['peak_resident_bytes'] / 2**30:5.2f} GiB  HF/bertjax time {h['seconds'] / b['seconds']:.2f}",
            flush=True)
  import torch
  import transformers
  summary = {"shape": args.shape, "dims": SHAPES[args.shape], "steps": args.steps, "rows": rows,
             "cpus": os.cpu_count(), "torch": torch.__version__,
             "transformers": transformers.__version__}
  for r in rows:
    if r["family"] == "deberta":
      bert = next((x for x in rows if x["family"] == "bert" and x["length"] == r["length"]
                   and x["batch"] == r["batch"]), None)
      if bert:
        for side in ("bertjax", "hf"):
          r[side]["time_over_bert"] = r[side]["seconds"] / bert[side]["seconds"]
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp(summary), f, indent=2)


if __name__ == "__main__":
  main()
