"""python -m bertjax plot WORKDIR: redraws the workdir's PNG curves (loss, accuracies) from its metrics.jsonl."""
from __future__ import annotations

from bertjax.cli import common
from bertjax.core import files, writers


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Redraw a workdir's PNG curves from its metrics.jsonl.")
  p.add_argument("workdir", help="a bertjax training or fine-tuning workdir")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  files.reach(args.workdir)
  if not files.isfile(files.join(args.workdir, "metrics.jsonl")):
    raise FileNotFoundError(f"{args.workdir}: no metrics.jsonl (not a bertjax workdir, or nothing logged yet)")
  for p in writers.plot(args.workdir):
    print(p)
  return 0
