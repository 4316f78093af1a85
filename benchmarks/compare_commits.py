r"""A regression guard: one command timed at two commits, alternating on the same machine, and the ratio.

    python benchmarks/compare_commits.py --base 53c3733 --head HEAD --repeats 3 --out guard.json -- \
        /abs/path/python -m bertjax embeddings corpus /abs/path/corpus.jsonl --model M --out {out}

Each commit is checked out in its own git worktree (in a temporary folder; the working tree is not touched) and
the command runs there (the worktree's code first on the path; `{out}` in the command becomes a fresh folder per
run), base and head alternating so that drift in the machine's speed falls on both sides. Prints each run's wall
time, the median per side, and the ratio base/head (above 1: head is faster) with its range over the pairs; with
`--out`, writes the same as JSON stamped with the machine. These VMs vary by up to 30% between runs of one command:
take three repeats or more and read the range, not one pair; `--base X --head X` (the same commit on both sides)
shows the spread the machine alone gives. The command runs inside each worktree: give its program and data files
as absolute paths.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402


def commit(rev: str) -> str:
  sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True,
                       text=True)
  if sha.returncode:
    raise SystemExit(f"error: {rev!r} is not a commit of this repository")
  return sha.stdout.strip()


def worktree(sha: str, path: str) -> str:
  subprocess.run(["git", "worktree", "add", "--detach", "-q", path, sha], cwd=ROOT, check=True)
  return path


def timed(cmd: list[str], cwd: str, scratch: str) -> float:
  out = tempfile.mkdtemp(dir=scratch)
  shutil.rmtree(out)  # a fresh, absent folder: tools refuse to write into one they did not create
  args = [a.replace("{out}", out) for a in cmd]
  env = {**os.environ, "PYTHONPATH": cwd + os.pathsep + os.environ.get("PYTHONPATH", "")}
  start = time.perf_counter()
  try:
    done = subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  except OSError as e:  # the command runs in the worktree: a relative program path names a file there
    raise SystemExit(f"error: cannot run {args[0]!r} in {cwd}: {e.strerror} "
                     "(give the program's absolute path)") from None
  seconds = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"error: the command failed in {cwd} (exit {done.returncode}): "
                     f"{(done.stderr.strip().splitlines() or [''])[-1][:300]}")
  return seconds


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--base", required=True, help="the commit to compare against (e.g. an issue's starting commit)")
  p.add_argument("--head", default="HEAD", help="the commit under test (default HEAD)")
  p.add_argument("--repeats", type=int, default=3, help="runs per side, alternating (default 3)")
  p.add_argument("--out", default="", help="write the result as JSON here")
  p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command, run in each worktree")
  args = p.parse_args(argv)
  cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not cmd:
    p.error("give the command to time after --")
  if args.repeats < 1:
    p.error("--repeats must be >= 1")
  if args.out and os.path.exists(args.out):
    p.error(f"--out {args.out} exists; give a new path")
  if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
    p.error(f"--out {args.out}: its folder does not exist")
  shas = {"base": commit(args.base), "head": commit(args.head)}
  where = tempfile.mkdtemp(prefix="bertjax-compare-")
  trees = {}
  try:
    for side, sha in shas.items():  # one worktree a side, the same commit on both for an A/A run
      trees[side] = worktree(sha, os.path.join(where, side))
    runs: dict[str, list[float]] = {"base": [], "head": []}
    for i in range(args.repeats):
      for side in (("base", "head") if i % 2 == 0 else ("head", "base")):
        runs[side].append(timed(cmd, trees[side], where))
        print(f"run {i + 1}/{args.repeats} {side}: {runs[side][-1]:.2f} s", flush=True)
  finally:
    for path in trees.values():
      subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ROOT, capture_output=True)
    shutil.rmtree(where, ignore_errors=True)
  ratios = [b / h for b, h in zip(runs["base"], runs["head"], strict=True)]
  result = {"command": cmd, "base": args.base, "head": args.head, "commits": shas, "seconds": runs,
            "median_s": {k: statistics.median(v) for k, v in runs.items()},
            "ratio_base_over_head": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
  print(f"base {result['median_s']['base']:.2f} s, head {result['median_s']['head']:.2f} s (medians): head is "
        f"{result['ratio_base_over_head']:.2f}x base's speed (pairs: {min(ratios):.2f}-{max(ratios):.2f})")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp(result), f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
