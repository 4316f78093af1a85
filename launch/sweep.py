"""Sweeps: a grid of config overrides, run one after another here or printed for a TPU pod, then tabulated.

  # fine-tuning: lr x seed (the convention is 5 seeds), median and best per setting
  python launch/sweep.py run --config "configs/finetune.py:task=glue/mrpc,init=runs/pre" \
      --grid lr=2e-5,3e-5,5e-5 --grid seed=0,1,2,3,4 --root runs/mrpc_sweep [--print] [-- --config.x=y ...]
  # pre-training ablations: held-out MLM / NSP accuracy
  python launch/sweep.py run --config "configs/pretrain.py:variant=mini" --grid ln=post,pre --grid act=gelu,relu \
      --root runs/ablation -- --config.data.data_dir=data/
  python launch/sweep.py table --root runs/mrpc_sweep     # table + sweep.json + sweep.png

Grid keys are the config's argument keys (`configs/*.py:key=value`); `seed` is pooled (median and best). Paths
(--root, the config file, paths in overrides) are the caller's: relative ones are read from the folder the command
runs in. --root may be a bucket (gs://BUCKET/sweep on a TPU VM): the runs' workdirs, the plan and the table are
written there. A run whose workdir holds a finished fine-tuning report (report.json) is not repeated, so an
interrupted sweep resumes with the same command. A run that fails is named with its one-line error in the table,
and the command then fails too.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
from bertjax import errors  # noqa: E402
from bertjax.core import files  # noqa: E402  (the root and the runs' workdirs: a folder or a bucket)


class LaunchError(Exception):
  """A mistake in a launch command's arguments: one line, exit code 2."""


def fail(message: str) -> int:
  print(f"error: {message}", file=sys.stderr, flush=True)
  return 2


class Parser(argparse.ArgumentParser):
  """argparse whose mistakes are one `error:` line (exit code 2), as bertjax's own commands report them."""

  def error(self, message):
    raise LaunchError(f"bad command line: {message} (see {self.prog} --help)")


def config_path(spec: str) -> str:
  """`FILE[:ARGS]` with FILE as the caller gives it, or under this repository when the caller's folder has no such
  file (configs/finetune.py from anywhere)."""
  path, sep, args = spec.partition(":")
  if not os.path.isfile(path) and os.path.isfile(os.path.join(ROOT, path)):
    path = os.path.join(ROOT, path)
  if not os.path.isfile(path):
    raise LaunchError(f"config file {path} not found")
  return os.path.abspath(path) + sep + args


def expand(grid: list[str]) -> list[dict]:
  axes = []
  for g in grid:
    key, _, values = g.partition("=")
    if not key or not values or any(not v for v in values.split(",")):
      raise LaunchError(f"--grid {g!r}: expected key=v1,v2,...")
    axes.append([(key, v) for v in values.split(",")])
  return [dict(c) for c in itertools.product(*axes)] if axes else [{}]


def run_name(point: dict) -> str:
  return "_".join(f"{k}-{v}" for k, v in point.items()).replace("/", "-") or "base"


def commands(config: str, grid: list[str], root: str, extra: list[str]) -> list[tuple[str, dict, list[str]]]:
  out = []
  for point in expand(grid):
    arg = ",".join(f"{k}={v}" for k, v in point.items())
    cfg = config + ("," if ":" in config else ":") + arg if arg else config
    name = run_name(point)
    out.append((name, point, [sys.executable, "-m", "bertjax", "train", f"--config={cfg}",
                              f"--workdir={files.absolute(files.join(root, name))}", *extra]))
  return out


def result_of(workdir: str) -> dict:
  """The run's numbers: a fine-tuning report's best metrics, or pre-training's last held-out evaluation."""
  report = files.join(workdir, "report.json")
  if files.exists(report):
    r = files.read_json(report)
    if not r.get("best"):
      return {}
    first_split = next(iter(r["best"]["metrics"].values()))
    return {"main": r["best"]["value"], "main_metric": r["main_metric"], **first_split}
  from bertjax.core import writers as metrics
  evals = [x for x in metrics.read_jsonl(files.join(workdir, "metrics.jsonl")) if x["split"] == "eval"]
  if not evals:
    return {}
  last = max(evals, key=lambda x: x["step"])
  return {"main": last.get("mlm_accuracy"), "main_metric": "mlm_accuracy",
          **{k: v for k, v in last.items() if k not in ("step", "split")}}


def tabulate(root: str) -> list[dict]:
  runs = files.read_json(files.join(root, "sweep_runs.json"))
  groups: dict = {}
  for name, point in runs.items():
    r = result_of(files.join(root, name))
    if not r or r.get("main") is None:
      continue
    key = tuple((k, v) for k, v in point.items() if k != "seed")
    groups.setdefault(key, []).append((point.get("seed", "0"), r))
  rows = []
  for key, results in sorted(groups.items()):
    mains = [r["main"] for _, r in results]
    rows.append({"setting": dict(key), "metric": results[0][1]["main_metric"], "runs": len(results),
                 "median": statistics.median(mains), "best": max(mains), "worst": min(mains),
                 "per_seed": {s: r["main"] for s, r in results}})
  files.write_whole(files.join(root, "sweep.json"), json.dumps(rows, indent=2))
  if rows:
    _plot(rows, files.join(root, "sweep.png"))
  return rows


def _plot(rows, path):
  labels = [",".join(f"{k}={v}" for k, v in r["setting"].items()) or "all" for r in rows]
  bar_plot(path, labels, [r["median"] for r in rows], ylabel=rows[0]["metric"], best=[r["best"] for r in rows])


def bar_plot(path, labels, medians, ylabel="", best=None, mean=None, sd=None):
  """Medians over seeds as bars, with the best run or the mean ± sd beside each, into `path` (local or remote)."""
  with files.local_target(path) as local:
    _bar_plot(local, labels, medians, ylabel, best, mean, sd)


def _bar_plot(path, labels, medians, ylabel, best, mean, sd):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(labels)), 4))
  x = list(range(len(labels)))
  ax.bar(x, medians, color="tab:blue", label="median over seeds")
  if best is not None:
    ax.scatter(x, best, color="tab:orange", zorder=3, label="best")
  if mean is not None:
    ax.errorbar(x, mean, yerr=sd, fmt="o", color="tab:orange", label="mean ± sd")
  ax.set_xticks(x, labels, rotation=30 if best is not None else 0, ha="right" if best is not None else "center")
  if ylabel:
    ax.set_ylabel(ylabel)
  ax.legend()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)


def split_extra(argv):
  """`args -- overrides`: the part after `--` goes to every run unchanged."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []


def finished(workdir: str) -> bool:
  """A fine-tuning run writes report.json once, at its end (a preempted run has none)."""
  return files.isfile(files.join(workdir, "report.json"))


def execute(runs, print_only: bool, skip=lambda label: False) -> dict[str, str]:
  """Runs each (label, command) here one after another, in the caller's folder, or prints one command line per run
  for a pod. Returns {label: its one-line error} of the runs that failed (the rest go on); `skip(label)` keeps a
  finished run."""
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  failed = {}
  for label, cmd in runs:
    if print_only:
      print(" ".join(shlex.quote(c) for c in cmd))
      continue
    if skip(label):
      print(f"== {label}: finished before, kept", flush=True)
      continue
    print(f"== {label}", flush=True)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    tail = []
    for line in proc.stderr:  # shown as it comes, the last lines kept for the one-line error
      sys.stderr.write(line)
      tail = (tail + [line.rstrip()])[-50:]
    if proc.wait() != 0:
      said = [line[len("error: "):] for line in tail if line.startswith("error: ")]
      failed[label] = said[-1] if said else f"exit code {proc.returncode}: {next(reversed(tail), '')[:200]}"
      print(f"   {label} failed: {failed[label]}; continuing", flush=True)
  return failed


def print_table(rows):
  if not rows:
    print("no finished runs")
    return
  print(f"{'setting':40s} {'metric':14s} {'runs':>4s} {'median':>9s} {'best':>9s} {'worst':>9s}")
  for r in rows:
    setting = ",".join(f"{k}={v}" for k, v in r["setting"].items()) or "all"
    print(f"{setting:40s} {r['metric']:14s} {r['runs']:4d} {r['median']:9.4f} {r['best']:9.4f} {r['worst']:9.4f}")


def parser(description: str, run_args) -> tuple[Parser, argparse.ArgumentParser]:
  """The `run` / `table` command line both launch tools share; `run_args(run_parser)` adds a tool's own."""
  p = Parser(description=description)
  sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
  r = sub.add_parser("run")
  run_args(r)
  r.add_argument("--root", required=True, help="the folder of the runs (relative: to the folder the command runs in)")
  r.add_argument("--print", action="store_true", help="print the commands (e.g. for every TPU pod) instead of running")
  sub.add_parser("table").add_argument("--root", required=True)
  return p, r


def existing_root(root: str, runs_file: str) -> str:
  if not files.isfile(files.join(root, runs_file)):
    raise LaunchError(f"--root {root}: no {runs_file} (not the root of a run of this tool)")
  return root


def main(argv=None):
  try:
    return _main(argv)
  except (LaunchError, errors.Error) as e:  # errors.Error: a store that cannot be reached, a missing bucket
    return fail(str(e))


def build_parser() -> Parser:
  def run_args(r):
    r.add_argument("--config", required=True)
    r.add_argument("--grid", action="append", default=[])
  return parser("Run or tabulate a grid of bertjax runs.", run_args)[0]


def _main(argv):
  argv, extra = split_extra(argv)
  args = build_parser().parse_args(argv)
  files.reach(args.root)  # a wrong endpoint or a missing bucket: one line now, not minutes of retries later
  if args.cmd == "table":
    print_table(tabulate(existing_root(args.root, "sweep_runs.json")))
    return 0
  cmds = commands(config_path(args.config), args.grid, args.root, extra)
  files.makedirs(args.root)
  files.write_whole(files.join(args.root, "sweep_runs.json"),
                    json.dumps({name: point for name, point, _ in cmds}, indent=2))
  failed = execute([(name, cmd) for name, _, cmd in cmds], args.print,
                   skip=lambda name: finished(files.join(args.root, name)))
  if args.print:
    return 0
  print_table(tabulate(args.root))
  for name, why in failed.items():
    print(f"failed: {name}: {why}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
