r"""What the recipe tools buy: each against the plain recipe on the bake-off's text, tokenizer and model shape
(benchmarks/pretrain_vs_hf.py: manual pages + Python docs, WordPiece 8192, BERT 2 x 128, batch 32 x 128, peak lr
1e-3, 10% warmup, MLM only on full-sentence rows with dynamic masking), over paired pre-training seeds.

  python benchmarks/recipe_ablation.py --root runs/ttq --minutes 5 --seeds 0,1,2 \
      --out benchmarks/results/recipe_ablation_cpu.json

Arms (each changes one thing of the plain recipe, which decays linearly to 0):
  plain     the bake-off's bertjax side;
  wsd       warmup-stable-decay: the peak held, then the last 20% of the steps decay along 1-sqrt;
  avg3      the plain run's last three checkpoints averaged (`python -m bertjax merge --last 3`; no training);
  ramp      batch-size warmup: 8 -> 32 sequences over the first 10% of the tokens (3 compiled shapes), the run
            as many tokens as plain's;
  maskfall  the masking rate falling 30% -> 15% over the run (mmBERT's direction), data made at 30%;
  stable    StableAdamW (bias-corrected, per-tensor update clipping) in place of the original's AdamW.

Equal wall-clock: a probe of each arm (run alone, before anything else) measures its step rate; each arm gets the
steps that fill `--minutes` at that rate (ramp: plain's tokens), then runs to that many steps, so that a machine
busy with other work while the runs go changes their time, not their results. With --steps N instead: equal
steps (ramp: equal tokens) and no probes. Scoring: held-out MLM loss (one
evaluator for every model, pretrain_vs_hf.evaluate) of the final model, and the downstream sentiment task
(launch/suite.py, the best of two fine-tuning learning rates); per arm the paired difference against plain over
the seeds, mean and 95% interval (t distribution). Writes JSON and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
import pretrain_vs_hf as bake  # noqa: E402

ROOT = bake.ROOT
ARMS = ("plain", "wsd", "avg3", "ramp", "maskfall", "stable")
PLAIN = ("configs/pretrain.py", "variant=base,nsp=False,dynamic=True", 0.15,
         {"model.max_position_embeddings": bake.SEQ, "data.example_mode": "full_sentences"})
EXTRA = {
    "plain": {},
    "wsd": {"train.schedule": "wsd", "train.decay_fraction": 0.2, "train.decay_shape": "1-sqrt"},
    "ramp": {"train.batch_warmup_from": 8, "train.batch_warmup_levels": 3},
    "maskfall": {"data.masked_lm_prob": 0.3, "data.masked_lm_prob_end": 0.15},
    "stable": {"train.optimizer": "stable_adamw"},
}


def recipe(arm: str, seed: int):
  config, args, mask, own = PLAIN
  return (config, args, 0.3 if arm == "maskfall" else mask, {**own, **EXTRA[arm], "seed": seed})


def probe_rate(arm: str, root: str, paths: dict) -> float:
  """Steps per second of the arm measured alone (the median step time of a short run, compilation left out)."""
  cache = os.path.join(root, "ablation", f"probe_{arm}.json")
  if os.path.exists(cache):
    with open(cache) as f:
      return json.load(f)["steps_per_s"]
  side = f"ablation_{arm}_probe"
  bake.RECIPES[side] = recipe(arm, 0)
  work = os.path.join(root, "ablation", side)
  subprocess.run(["rm", "-rf", work])
  cmd = bake.bertjax_command(side, paths[bake.data_key(side)], work, 80, 80)
  if arm == "ramp":  # the rate at the full batch: the ramp's smaller steps are accounted for by tokens
    cmd = [c for c in cmd if "batch_warmup" not in c]
  bake.run(cmd, work + ".log")
  rows = [json.loads(ln) for ln in open(os.path.join(work, "metrics.jsonl"))]
  times = [r["step_time_s"] for r in rows if r["split"] == "train"][1:]
  rate = 1.0 / float(np.median(times))
  with open(cache, "w") as f:
    json.dump({"steps_per_s": rate}, f)
  return rate


def ramp_steps(tokens: int) -> int:
  from bertjax.core import phases
  p = phases.defaults(tokens=tokens, seq=bake.SEQ, global_batch_size=bake.BATCH,
                      batch_warmup_tokens=int(0.1 * tokens), batch_warmup_from=8, batch_warmup_levels=3)
  return len(phases.batch_sizes(p))


def train(arm: str, seed: int, steps: int, root: str, paths: dict) -> dict:
  side = f"ablation_{arm}_s{seed}"
  bake.RECIPES[side] = recipe(arm, seed)
  folder = os.path.join(root, "ablation", side)
  record_path = os.path.join(folder, "record.json")
  if os.path.exists(record_path):
    with open(record_path) as f:
      return json.load(f)
  subprocess.run(["rm", "-rf", folder])
  os.makedirs(folder)
  every = max(1, steps // bake.CHECKPOINTS)
  cmd = bake.bertjax_command(side, paths[bake.data_key(side)], os.path.join(folder, "run"), steps, every)
  if arm == "ramp":
    cmd.append(f"--config.train.batch_warmup_tokens={int(0.1 * bake.BATCH * bake.SEQ * steps)}")
  t0 = bake.run(cmd, os.path.join(folder, "run.log"))
  ckpts = bake.bertjax_checkpoints(os.path.join(folder, "run"))
  record = {"arm": arm, "seed": seed, "steps": steps, "wall_s": max(t for _, t in ckpts) - t0,
            "checkpoints": [{"step": s, "seconds": t - t0} for s, t in ckpts]}
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  bake.log(f"{side}: {steps} steps in {record['wall_s']:.0f}s")
  return record


def final_folder(arm: str, seed: int, root: str, record: dict, vocab: str) -> str:
  """The arm's final model as an HF folder with the tokenizer (avg3: the plain run's last three averaged)."""
  from bertjax.convert import export
  if arm == "avg3":
    plain = os.path.join(root, "ablation", f"ablation_plain_s{seed}")
    out = os.path.join(root, "ablation", f"ablation_avg3_s{seed}", "merged")
    if not os.path.isdir(out):
      os.makedirs(os.path.dirname(out), exist_ok=True)
      subprocess.run([sys.executable, "-m", "bertjax", "merge", os.path.join(plain, "run"), "--last", "3", "--out",
                      out], cwd=ROOT, check=True, capture_output=True)
    folder = os.path.join(out, "hf")
  else:
    side = f"ablation_{arm}_s{seed}"
    step = record["checkpoints"][-1]["step"]
    folder = bake.bertjax_export(os.path.join(root, "ablation", side, "run"), step,
                                 os.path.join(root, "ablation", side, f"hf_{step}"))
  if not os.path.exists(os.path.join(folder, "vocab.txt")):
    export.copy_tokenizer(vocab, True, folder)
  return folder


def downstream(arm: str, seed: int, root: str, model: str, lrs: str) -> float:
  """Sentiment accuracy (the best of `lrs`, fine-tuning seed 0) of the model through launch/suite.py."""
  import finetune_real
  work = os.path.join(root, "tasks")
  os.makedirs(work, exist_ok=True)
  suite_file = os.path.join(work, "suite_sentiment.json")
  if not os.path.exists(suite_file):
    files, labels = finetune_real.sentiment_data(work, os.path.expanduser("~/.cache/bertjax-bench"))
    epochs, batch, seq, _ = finetune_real.RECIPES["sentiment"]
    with open(suite_file, "w") as f:
      json.dump([{"name": "sentiment", "config": f"configs/finetune.py:task=local,batch={batch},epochs={epochs},"
                  f"seq={seq}", "overrides": [f"--config.data.train_file={files['train']}",
                                             f"--config.data.eval_file={files['test']}",
                                             f"--config.data.labels=({','.join(repr(x) for x in labels)},)"]}], f)
  suite_root = os.path.join(root, "ablation", f"suite_{arm}_s{seed}")
  summary = bake.run_suite(model, suite_file, lrs, "0", suite_root, f"{arm} seed {seed}")
  return float(summary["tasks"][0]["mean"])


def paired(a: list[float], b: list[float]) -> dict:
  """Mean of b - a over paired seeds with its 95% interval (t distribution)."""
  from scipy import stats
  d = np.asarray(b) - np.asarray(a)
  half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
  return {"mean": float(d.mean()), "low": float(d.mean() - half), "high": float(d.mean() + half),
          "per_seed": d.tolist()}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", required=True, help="the bake-off's folder (its corpus, tokenizer and held-out set)")
  p.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget of each run")
  p.add_argument("--steps", type=int, default=0,
                 help="equal steps (ramp: equal tokens) for every arm instead of equal wall-clock; no probes, so the "
                      "machine may be busy meanwhile")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--lrs", default="1e-4,1e-3", help="fine-tuning learning rates of the downstream task")
  p.add_argument("--sources", default="python,man",
                 help="the corpus's offline sources (the bake-off's: python,man; python alone builds in seconds)")
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  root = os.path.abspath(args.root)
  os.makedirs(os.path.join(root, "ablation"), exist_ok=True)
  corpus = bake.build_corpus(root, args.sources.split(","))
  train_txt, held = bake.split(root, corpus)
  vocab = bake.tokenizer(root, train_txt)
  heldout = bake.heldout_set(root, held, vocab)
  paths = {"vocab": vocab}
  arms = args.arms.split(",")
  for arm in arms:
    if arm != "avg3":
      bake.RECIPES[f"ablation_{arm}_probe"] = recipe(arm, 0)
      key = bake.data_key(f"ablation_{arm}_probe")
      paths[key] = bake.bertjax_data(root, train_txt, vocab, f"ablation_{arm}_probe")[0]
  if args.steps:
    rates = {}
    steps = {arm: args.steps for arm in arms if arm != "avg3"}
  else:
    rates = {arm: probe_rate(arm, root, paths) for arm in arms if arm != "avg3"}
    steps = {arm: int(args.minutes * 60 * r) for arm, r in rates.items()}
  if "ramp" in steps:
    steps["ramp"] = ramp_steps(steps["ramp"] * bake.BATCH * bake.SEQ)
  bake.log("steps per arm: " + ", ".join(f"{a} {s}" + (f" ({rates[a]:.2f}/s)" if a in rates else "")
                                       for a, s in steps.items()))
  seeds = [int(s) for s in args.seeds.split(",")]
  results = {}
  order = [a for a in arms if a != "avg3"] + (["avg3"] if "avg3" in arms else [])
  for seed in seeds:
    for arm in order:
      record = train("plain" if arm == "avg3" else arm, seed, steps["plain" if arm == "avg3" else arm], root, paths)
      model = final_folder(arm, seed, root, record, vocab)
      cache = os.path.join(root, "ablation", f"score_{arm}_s{seed}.json")
      if not os.path.exists(cache):
        scored = bake.evaluate(model, heldout)
        scored["sentiment"] = downstream(arm, seed, root, model, args.lrs)
        scored["wall_s"] = record["wall_s"]
        with open(cache, "w") as f:
          json.dump(scored, f)
      with open(cache) as f:
        results[(arm, seed)] = json.load(f)
      bake.log(f"{arm} seed {seed}: held-out MLM loss {results[(arm, seed)]['mlm_loss']:.4f}, sentiment "
               f"{results[(arm, seed)]['sentiment']:.4f}")
  rows = []
  for arm in order:
    loss = [results[(arm, s)]["mlm_loss"] for s in seeds]
    sent = [results[(arm, s)]["sentiment"] for s in seeds]
    row = {"arm": arm, "steps": steps.get(arm, steps.get("plain")), "mlm_loss": loss, "sentiment": sent,
           "mean_mlm_loss": float(np.mean(loss)), "mean_sentiment": float(np.mean(sent))}
    if arm != "plain":
      row["mlm_loss_minus_plain"] = paired([results[("plain", s)]["mlm_loss"] for s in seeds], loss)
      row["sentiment_minus_plain"] = paired([results[("plain", s)]["sentiment"] for s in seeds], sent)
    rows.append(row)
  out = {"budget_minutes": None if args.steps else args.minutes, "equal_steps": args.steps or None, "seeds": seeds,
         "sources": args.sources,
         "command": "python benchmarks/recipe_ablation.py " + " ".join(sys.argv[1:]),
         "steps_per_s": rates, "rows": rows, "cores": os.cpu_count(),
         "date": time.strftime("%Y-%m-%d")}
  with open(args.out, "w") as f:
    json.dump(machine.stamp(out), f, indent=1)
  print(f"machine: {machine.describe()}")
  print(f"{'arm':<10} {'steps':>6} {'MLM loss':>9} {'Δ vs plain (95% CI)':>26} {'sentiment':>10} {'Δ (95% CI)':>24}")
  for r in rows:
    d = r.get("mlm_loss_minus_plain")
    e = r.get("sentiment_minus_plain")
    fmt = lambda x: f"{x['mean']:+.4f} [{x['low']:+.4f}, {x['high']:+.4f}]" if x else "-"  # noqa: E731
    print(f"{r['arm']:<10} {r['steps']:>6} {r['mean_mlm_loss']:>9.4f} {fmt(d):>26} {r['mean_sentiment']:>10.4f} "
          f"{fmt(e):>24}")


if __name__ == "__main__":
  main()
