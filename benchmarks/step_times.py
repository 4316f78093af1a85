r"""Every train step of a real `python -m bertjax train` run, timed: the command runs as it is given, with its train
step waited on after each call, and each step's batch shape, seconds and resident memory printed and written to
--out. A run's goodput record gives its steps' total; this shows how they spread (a step that alternates between
two times, the first step of each new batch width, a step after an evaluation).

  python benchmarks/step_times.py --out steps.json -- train --config=configs/finetune.py:task=local,... \
      --config.data.train_file=... --workdir=W

Waiting on each step keeps the host from running ahead of it (a real run keeps up to two in flight), so the
total can differ from the run's own by a little.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def _resident_gib() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 30


def main() -> int:
  argv = sys.argv[1:]
  split = argv.index("--") if "--" in argv else len(argv)
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="", help="the results JSON (every step, and the run's command)")
  a = ap.parse_args(argv[:split])
  command = argv[split + 1:]
  if not command:
    ap.error("give the bertjax command after --, e.g. -- train --config=...")
  import jax

  from bertjax.core import trainer
  steps = []
  build = trainer.build

  def timed_build(*args, **kwargs):
    t = build(*args, **kwargs)
    step = t.train_step

    def timed(state, batch, *rest):
      start = time.perf_counter()
      out = jax.block_until_ready(step(state, batch, *rest))
      seconds = time.perf_counter() - start
      shape = list(max((v.shape for v in batch.values()), key=len))  # [rows, width] of the token arrays
      steps.append({"shape": shape, "seconds": seconds, "resident_gib": _resident_gib()})
      print(f"step {len(steps)}: {shape} {seconds:.3f} s, resident {steps[-1]['resident_gib']:.2f} GiB",
            file=sys.stderr, flush=True)
      return out
    return dataclasses.replace(t, train_step=timed)

  trainer.build = timed_build
  from bertjax.__main__ import main as bertjax_main
  try:
    rc = bertjax_main(command)
  except SystemExit as e:  # the train command exits through absl's app.run
    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  # A width's first step loads or compiles its program; the rest are the steady steps.
  seen, steady = set(), []
  for s in steps:
    key = tuple(s["shape"])
    if key in seen:
      steady.append(s["seconds"])
    seen.add(key)
  if steady:
    print(f"{len(steps)} steps; {len(steady)} after each width's first: mean {statistics.mean(steady):.3f} s, "
          f"median {statistics.median(steady):.3f}, {min(steady):.3f}-{max(steady):.3f}; peak resident "
          f"{max(s['resident_gib'] for s in steps):.2f} GiB")
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": command, "steps": steps,
                               "steady_mean_s": statistics.mean(steady) if steady else None}), f, indent=1)
  return rc


if __name__ == "__main__":
  sys.exit(main())
