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
same command. `--print` prints one command per run (for a pod) instead of running them. Relative paths (--root,
--init, --suite and the paths in overrides) are read from the folder the command runs in. A run that fails puts
its one-line error in the table and makes the command fail. --root (and --init) may be in a bucket
(gs://BUCKET/suite on a TPU VM): the runs, the plan and the tables are written there.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402

from bertjax import errors as bertjax_errors  # noqa: E402  (on the path through sweep)
from bertjax.core import files  # noqa: E402

ROOT = sweep.ROOT


LaunchError = sweep.LaunchError


def read_suite(path: str) -> list[dict]:
  try:
    with open(path, encoding="utf-8") as f:
      tasks = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise LaunchError(f"--suite {path}: {' '.join(str(e).split())}") from None
  ok = isinstance(tasks, list) and tasks and all(
      isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"] and isinstance(t.get("config"), str)
      and isinstance(t.get("overrides", []), list) and all(isinstance(o, str) for o in t.get("overrides", []))
      for t in tasks)
  if not ok:
    raise LaunchError(f"--suite {path}: expected a JSON list of {{\"name\": text, \"config\": text[, "
                      "\"overrides\": [text, ...]]}")
  return tasks


def tasks_of(args) -> list[dict]:
  tasks = read_suite(args.suite) if args.suite else []
  given = [n for n in (args.tasks or "").split(",") if n]
  if given:
    sys.path.insert(0, sweep.ROOT)
    from bertjax import tasks as tasks_lib
    unknown = [n for n in given if n not in tasks_lib.names()]
    if unknown:
      raise LaunchError(f"--tasks: unknown task {unknown[0]!r}; choose among {tasks_lib.names()}")
  for name in given:
    tasks.append({"name": name.replace("/", "-"), "config": f"configs/finetune.py:task={name}"})
  if not tasks:
    raise LaunchError("give --tasks and/or --suite")
  names = [t["name"] for t in tasks]
  if len(set(names)) != len(names):
    raise LaunchError(f"task names repeat: {names}")
  bad = [n for n in names if not n.replace("-", "").replace("_", "").replace(".", "").isalnum()]
  if bad:
    raise LaunchError(f"task name {bad[0]!r}: letters, digits, '-', '_' and '.' only (it names a folder)")
  for t in tasks:
    t["config"] = sweep.config_path(t["config"])
  return tasks


def grid_values(lrs: str, seeds: str) -> tuple[str, str]:
  """The learning rates (positive numbers) and seeds (integers >= 0), checked before any run starts."""
  for v in lrs.split(","):
    try:
      ok = float(v) > 0 and math.isfinite(float(v))
    except ValueError:
      ok = False
    if not ok:
      raise LaunchError(f"--lrs {lrs!r}: {v!r} is not a positive number")
  for v in seeds.split(","):
    if not v.strip().isdigit():
      raise LaunchError(f"--seeds {seeds!r}: {v!r} is not an integer >= 0")
  return lrs, seeds


def commands(tasks, init: str, lrs: str, seeds: str, root: str, extra: list[str]):
  """(task, run name, grid point, command) of every run."""
  if init:
    files.reach(init)
    if not files.exists(init):
      raise LaunchError(f"--init {init}: no such workdir or folder")
  init = files.absolute(init) if init else ""
  out = []
  for t in tasks:
    config = t["config"] + ("," if ":" in t["config"] else ":") + f"init={init}" if init else t["config"]
    for name, point, cmd in sweep.commands(config, [f"lr={lrs}", f"seed={seeds}"], files.join(root, t["name"]),
                                           list(t.get("overrides", [])) + extra):
      out.append((t["name"], name, point, cmd))
  return out


finished = sweep.finished  # a fine-tuning run writes report.json once, at its end (a preempted run has none)


def summarize(root: str) -> dict:
  """Per task: each rate's median over seeds, the rate with the best median, and at it the median, mean and sd
  over seeds; then the average over tasks of those medians. Failed runs are counted, with the first one's error."""
  plan = files.read_json(files.join(sweep.existing_root(root, "suite.json.runs"), "suite.json.runs"))
  rows = []
  errors = plan.get("errors", {})
  for task, runs in plan["tasks"].items():
    failed = {name: errors[f"{task}/{name}"] for name in runs if f"{task}/{name}" in errors}
    by_lr: dict = {}
    for name, point in runs.items():
      r = sweep.result_of(files.join(root, task, name))
      if r and r.get("main") is not None:
        by_lr.setdefault(point["lr"], []).append((point["seed"], r["main"], r["main_metric"]))
    if not by_lr:
      rows.append({"task": task, "runs": 0, "failed": len(failed), "error": next(iter(failed.values()), None)})
      continue
    medians = {lr: statistics.median(v for _, v, _ in results) for lr, results in by_lr.items()}
    best = max(medians, key=lambda lr: medians[lr])
    values = [v for _, v, _ in by_lr[best]]
    rows.append({"task": task, "metric": by_lr[best][0][2], "lr": best, "runs": sum(len(v) for v in by_lr.values()),
                 "seeds": len(values), "median": medians[best], "mean": statistics.mean(values),
                 "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                 "per_seed": {s: v for s, v, _ in by_lr[best]}, "median_by_lr": medians, "failed": len(failed),
                 "error": next(iter(failed.values()), None)})
  done = [r for r in rows if r["runs"]]
  return {"init": plan["init"], "tasks": rows,
          "average": statistics.mean(r["median"] for r in done) if len(done) == len(rows) and done else None}


def markdown(summary: dict) -> str:
  lines = [f"Suite of `{summary['init']}`: per task, the learning rate with the best median on dev; median and "
           "mean ± sd over seeds at it.", "",
           "| task | metric | lr | seeds | median | mean ± sd |", "|---|---|---|---|---|---|"]
  for r in summary["tasks"]:
    failed = f" ({r['failed']} run(s) failed: {r['error']})" if r.get("failed") else ""
    if not r["runs"]:
      lines.append(f"| {r['task']} | - | - | 0 | {'failed' if failed else 'not run yet'}{failed} | |")
      continue
    lines.append(f"| {r['task']} | {r['metric']} | {r['lr']} | {r['seeds']} | {r['median']:.4f}{failed} | "
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
  files.write_whole(files.join(root, "suite.json"), json.dumps(summary, indent=2))
  text = markdown(summary)
  files.write_whole(files.join(root, "suite.md"), text)
  if any(r["runs"] for r in summary["tasks"]):
    _plot(summary, files.join(root, "suite.png"))
  print(text, end="")
  return summary


def main(argv=None):
  try:
    return _main(argv)
  except (LaunchError, bertjax_errors.Error) as e:  # an unreachable store, a missing bucket
    return sweep.fail(str(e))


def build_parser() -> sweep.Parser:
  def run_args(r):
    r.add_argument("--init", default="", help="the checkpoint: a bertjax workdir or an HF / sentence-transformers "
                                              "folder")
    r.add_argument("--tasks", default="", help="task names of configs/finetune.py, comma-separated (glue/sst2, squad)")
    r.add_argument("--suite", default="", help="a JSON list of tasks with their configs and overrides")
    r.add_argument("--lrs", default="2e-5,3e-5,5e-5")
    r.add_argument("--seeds", default="0,1,2")
  return sweep.parser(__doc__.split("\n\n")[0], run_args)[0]


def _main(argv):
  argv, extra = sweep.split_extra(argv)
  args = build_parser().parse_args(argv)
  files.reach(args.root)  # a wrong endpoint or a missing bucket: one line now, not minutes of retries later
  if args.cmd == "table":
    table(args.root)
    return 0
  runs = commands(tasks_of(args), args.init, *grid_values(args.lrs, args.seeds), args.root, extra)
  files.makedirs(args.root)
  plan = {"init": args.init, "tasks": {}}
  for task, name, point, _ in runs:
    plan["tasks"].setdefault(task, {})[name] = point
  plan_path = files.join(args.root, "suite.json.runs")
  files.write_whole(plan_path, json.dumps(plan, indent=2))
  plan["errors"] = sweep.execute([(f"{task}/{name}", cmd) for task, name, _, cmd in runs], args.print,
                                 skip=lambda label: finished(files.join(args.root, label)))
  if args.print:
    return 0
  files.write_whole(plan_path, json.dumps(plan, indent=2))
  table(args.root)
  return 1 if plan["errors"] else 0


if __name__ == "__main__":
  sys.exit(main())
