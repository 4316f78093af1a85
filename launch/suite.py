"""A downstream suite in one command: fine-tune one checkpoint on a list of tasks with the papers' protocol (a
learning-rate grid x seeds per task, the best rate chosen on dev by its median over seeds), then one table of
median and mean ± sd per task and their average (the GLUE-style score), as Markdown, JSON and PNG.

  python launch/suite.py run --init runs/pre --tasks glue/sst2,glue/mrpc,glue/stsb,squad \
      --lrs 2e-5,3e-5,5e-5 --seeds 0,1,2,3,4 --root runs/suite [--print] [-- --config.x=y ...]
  python launch/suite.py run --init runs/pre --suite my_tasks.json --root runs/suite
  python launch/suite.py table --root runs/suite        # suite.md, suite.json, suite.png

`--suite FILE`: a JSON list of tasks, each {"name": ..., "config": "configs/finetune.py:task=local,epochs=3",
"overrides": ["--config.data.train_file=...", ...]}; `--tasks` names tasks that need nothing else (GLUE through
tfds, squad, ...), each run with configs/finetune.py. Every run is one `launch/sweep.py` grid point under
ROOT/TASK/; a run whose workdir holds a finished report is not repeated, so an interrupted suite resumes with the
same command. `--print` prints one command per run (for a pod) instead of running them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402

ROOT = sweep.ROOT


class SuiteError(SystemExit):
  pass


def read_suite(path: str) -> list[dict]:
  try:
    with open(path, encoding="utf-8") as f:
      tasks = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise SuiteError(f"error: --suite {path}: {e}") from None
  if not isinstance(tasks, list) or not all(isinstance(t, dict) and "name" in t and "config" in t for t in tasks):
    raise SuiteError(f"error: --suite {path}: expected a JSON list of {{\"name\", \"config\"[, \"overrides\"]}}")
  return tasks


def tasks_of(args) -> list[dict]:
  tasks = read_suite(args.suite) if args.suite else []
  for name in filter(None, (args.tasks or "").split(",")):
    tasks.append({"name": name.replace("/", "-"), "config": f"configs/finetune.py:task={name}"})
  if not tasks:
    raise SuiteError("error: give --tasks and/or --suite")
  names = [t["name"] for t in tasks]
  if len(set(names)) != len(names):
    raise SuiteError(f"error: task names repeat: {names}")
  return tasks


def commands(tasks, init: str, lrs: str, seeds: str, root: str, extra: list[str]):
  """(task, run name, grid point, command) of every run."""
  out = []
  for t in tasks:
    config = t["config"] + ("," if ":" in t["config"] else ":") + f"init={init}" if init else t["config"]
    for name, point, cmd in sweep.commands(config, [f"lr={lrs}", f"seed={seeds}"], os.path.join(root, t["name"]),
                                           list(t.get("overrides", [])) + extra):
      out.append((t["name"], name, point, cmd))
  return out


def finished(workdir: str) -> bool:
  """A fine-tuning run writes report.json once, at its end (a preempted run has none)."""
  return os.path.isfile(os.path.join(workdir, "report.json"))


def summarize(root: str) -> dict:
  """Per task: each rate's median over seeds, the rate with the best median, and at it the median, mean and sd
  over seeds; then the average over tasks of those medians."""
  with open(os.path.join(root, "suite.json.runs"), encoding="utf-8") as f:
    plan = json.load(f)
  rows = []
  for task, runs in plan["tasks"].items():
    by_lr: dict = {}
    for name, point in runs.items():
      r = sweep.result_of(os.path.join(root, task, name))
      if r and r.get("main") is not None:
        by_lr.setdefault(point["lr"], []).append((point["seed"], r["main"], r["main_metric"]))
    if not by_lr:
      rows.append({"task": task, "runs": 0})
      continue
    medians = {lr: statistics.median(v for _, v, _ in results) for lr, results in by_lr.items()}
    best = max(medians, key=lambda lr: medians[lr])
    values = [v for _, v, _ in by_lr[best]]
    rows.append({"task": task, "metric": by_lr[best][0][2], "lr": best, "runs": sum(len(v) for v in by_lr.values()),
                 "seeds": len(values), "median": medians[best], "mean": statistics.mean(values),
                 "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                 "per_seed": {s: v for s, v, _ in by_lr[best]}, "median_by_lr": medians})
  done = [r for r in rows if r["runs"]]
  return {"init": plan["init"], "tasks": rows,
          "average": statistics.mean(r["median"] for r in done) if len(done) == len(rows) and done else None}


def markdown(summary: dict) -> str:
  lines = [f"Suite of `{summary['init']}`: per task, the learning rate with the best median on dev; median and "
           "mean ± sd over seeds at it.", "",
           "| task | metric | lr | seeds | median | mean ± sd |", "|---|---|---|---|---|---|"]
  for r in summary["tasks"]:
    if not r["runs"]:
      lines.append(f"| {r['task']} | - | - | 0 | not run yet | |")
      continue
    lines.append(f"| {r['task']} | {r['metric']} | {r['lr']} | {r['seeds']} | {r['median']:.4f} | "
                 f"{r['mean']:.4f} ± {r['sd']:.4f} |")
  avg = summary["average"]
  lines.append(f"| **average** | | | | {avg:.4f} | |" if avg is not None else "| **average** | | | | incomplete | |")
  return "\n".join(lines) + "\n"


def _plot(summary, path):
  rows = [r for r in summary["tasks"] if r["runs"]]
  sweep.bar_plot(path, [f"{r['task']}\n{r['metric']}" for r in rows], [r["median"] for r in rows],
                 mean=[r["mean"] for r in rows], sd=[r["sd"] for r in rows])


def table(root: str) -> dict:
  summary = summarize(root)
  with open(os.path.join(root, "suite.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
  text = markdown(summary)
  with open(os.path.join(root, "suite.md"), "w", encoding="utf-8") as f:
    f.write(text)
  if any(r["runs"] for r in summary["tasks"]):
    _plot(summary, os.path.join(root, "suite.png"))
  print(text, end="")
  return summary


def main(argv=None):
  argv, extra = sweep.split_extra(argv)
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  r = sub.add_parser("run")
  r.add_argument("--init", default="", help="the checkpoint: a bertjax workdir or an HF / sentence-transformers folder")
  r.add_argument("--tasks", default="", help="task names of configs/finetune.py, comma-separated (glue/sst2, squad)")
  r.add_argument("--suite", default="", help="a JSON list of tasks with their configs and overrides")
  r.add_argument("--lrs", default="2e-5,3e-5,5e-5")
  r.add_argument("--seeds", default="0,1,2")
  r.add_argument("--root", required=True)
  r.add_argument("--print", action="store_true", help="print one command per run instead of running them")
  t = sub.add_parser("table")
  t.add_argument("--root", required=True)
  args = p.parse_args(argv)
  if args.cmd == "table":
    table(args.root)
    return 0
  runs = commands(tasks_of(args), args.init, args.lrs, args.seeds, args.root, extra)
  os.makedirs(args.root, exist_ok=True)
  plan = {"init": args.init, "tasks": {}}
  for task, name, point, _ in runs:
    plan["tasks"].setdefault(task, {})[name] = point
  with open(os.path.join(args.root, "suite.json.runs"), "w", encoding="utf-8") as f:
    json.dump(plan, f, indent=2)
  sweep.execute([(f"{task}/{name}", cmd) for task, name, _, cmd in runs], args.print,
                skip=lambda label: finished(os.path.join(args.root, label)))
  if not args.print:
    table(args.root)
  return 0


if __name__ == "__main__":
  sys.exit(main())
