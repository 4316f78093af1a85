"""Tweet NER over several random splits: bertjax against HF's loop, split by split and pooled, from the JSON files
that `benchmarks/finetune_real.py --tasks ner --split K` writes (several files of one split are merged, runs of
one side and seed counted once).

  python benchmarks/tagging_splits.py benchmarks/results/tagging_splits_cpu_split*.json \\
      benchmarks/results/tagging_study_h200.json --out benchmarks/results/tagging_splits_summary.json

Per split: the seeds both sides ran, each side's mean span F1 and seed-to-seed standard deviation, the paired
difference bertjax − HF with its 95% t interval, the ratio of the two standard deviations, the per-epoch mean F1
and how many runs score 0 after the first epoch. Pooled: the paired differences of every split together, and the
spread as the root mean of the per-split variances (so split-to-split differences do not count as spread). By
seed: a seed draws the same head on every split (each side its own), so the pairs of one seed are not independent
draws; the mean difference of each seed over its splits, and the interval over seeds, count each head once.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

from scipy import stats


def runs_of(path: str) -> tuple[int, dict]:
  """(split, {side: {seed: run}}) of one results file (finetune_real's, or the study's layout with `runs` at the
  top, which is split 0)."""
  with open(path, encoding="utf-8") as f:
    r = json.load(f)
  if "tasks" in r:
    r = r["tasks"]["ner"]
  sides = {side: {x["seed"]: x for x in runs} for side, runs in r["runs"].items()}
  return int(r.get("split", 0)), sides


def interval(d: list[float]) -> tuple[float, float]:
  if len(d) < 2:
    return (d[0] if d else float("nan")), float("nan")
  return statistics.mean(d), stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))


def summarize(paths: list[str], side: str = "bertjax") -> dict:
  """The table for bertjax's row `side` (another name: a `--variant` or `--head_from` row) against HF's."""
  splits: dict[int, dict] = {}
  for p in paths:
    k, sides = runs_of(p)
    for name, by_seed in sides.items():
      if name in (side, "hf"):
        splits.setdefault(k, {"bertjax": {}, "hf": {}})["hf" if name == "hf" else "bertjax"].update(by_seed)
  out, diffs, var, per_seed = {"splits": {}}, [], {"bertjax": [], "hf": []}, {}
  for k in sorted(splits):
    b, h = splits[k]["bertjax"], splits[k]["hf"]
    seeds = sorted(set(b) & set(h))
    if not seeds:
      continue
    row = {"seeds": seeds}
    for side, runs in (("bertjax", b), ("hf", h)):
      scores = [runs[s]["score"] for s in seeds]
      row[side] = {"mean": statistics.mean(scores), "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                   "scores": scores,
                   "per_epoch_mean": [statistics.mean(e) for e in zip(*(runs[s]["per_epoch"] for s in seeds))],
                   "zero_after_epoch_1": sum(runs[s]["per_epoch"][0] == 0 for s in seeds)}
      if len(scores) > 1:
        var[side].append(row[side]["sd"] ** 2)
    d = [b[s]["score"] - h[s]["score"] for s in seeds]
    diffs += d
    for s, x in zip(seeds, d):
      per_seed.setdefault(s, []).append(x)
    row["bertjax_minus_hf"], row["ci95"] = interval(d)
    row["sd_ratio"] = row["bertjax"]["sd"] / row["hf"]["sd"] if row["hf"]["sd"] else float("nan")
    out["splits"][str(k)] = row
  mean, half = interval(diffs)
  spread = {side: math.sqrt(statistics.mean(v)) if v else float("nan") for side, v in var.items()}
  out["pooled"] = {"pairs": len(diffs), "bertjax_minus_hf": mean, "ci95": half,
                   "negative_pairs": sum(x < 0 for x in diffs), "spread_bertjax": spread["bertjax"],
                   "spread_hf": spread["hf"], "sd_ratio": spread["bertjax"] / spread["hf"]}
  seed_means = [statistics.mean(v) for _, v in sorted(per_seed.items())]
  mean, half = interval(seed_means)
  out["by_seed"] = {"seeds": len(seed_means), "bertjax_minus_hf": mean, "ci95": half,
                    "per_seed": {str(k): statistics.mean(v) for k, v in sorted(per_seed.items())}}
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("files", nargs="+")
  p.add_argument("--side", default="bertjax", help="bertjax's row to compare with HF's (default: bertjax)")
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  for path in a.files:
    try:
      runs_of(path)
    except (OSError, ValueError, KeyError) as e:
      raise SystemExit(f"{path}: not a tweet-NER results file ({type(e).__name__}: {e})") from None
  s = summarize(a.files, a.side)
  if not s["splits"]:
    raise SystemExit(f"no split has both a {a.side!r} row and HF's row over common seeds")
  print(f"{'split':>5s} {'seeds':>5s} {'bertjax':>15s} {'HF':>15s} {'bertjax - HF':>22s} {'sd ratio':>8s} "
        f"{'F1=0 after ep. 1':>17s}")
  for k, r in s["splits"].items():
    b, h = r["bertjax"], r["hf"]
    print(f"{k:>5s} {len(r['seeds']):5d} {b['mean']:7.3f} ± {b['sd']:.3f} {h['mean']:7.3f} ± {h['sd']:.3f} "
          f"{r['bertjax_minus_hf']:+8.3f} [{r['bertjax_minus_hf'] - r['ci95']:+.3f}, "
          f"{r['bertjax_minus_hf'] + r['ci95']:+.3f}] {r['sd_ratio']:8.2f} {b['zero_after_epoch_1']:>8d} vs "
          f"{h['zero_after_epoch_1']}")
  q = s["pooled"]
  print(f"pooled over {q['pairs']} pairs: bertjax - HF {q['bertjax_minus_hf']:+.4f} ± {q['ci95']:.4f} (95% t), "
        f"{q['negative_pairs']} negative; within-split spread {q['spread_bertjax']:.3f} vs {q['spread_hf']:.3f} "
        f"({q['sd_ratio']:.2f}x)")
  q = s["by_seed"]
  print(f"by seed (each head once) over {q['seeds']} seeds: bertjax - HF {q['bertjax_minus_hf']:+.4f} ± "
        f"{q['ci95']:.4f} (95% t)")
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump({"command": " ".join(["python", "benchmarks/tagging_splits.py", *sys.argv[1:]]), "side": a.side, **s},
                f, indent=2)


if __name__ == "__main__":
  main()
