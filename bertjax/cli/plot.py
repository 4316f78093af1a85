"""python -m bertjax plot WORKDIR: redraws the workdir's PNG curves (loss, accuracies) from its metrics.jsonl, and
its goodput (productive time and each badput, per attempt and for the job) from its goodput.jsonl."""
from __future__ import annotations

from bertjax.cli import common
from bertjax.core import files, goodput, writers


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Redraw a workdir's PNG curves from its metrics.jsonl and goodput.jsonl, "
                            "and print its goodput.")
  p.add_argument("workdir", help="a bertjax training or fine-tuning workdir")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  files.reach(args.workdir)
  if not files.isfile(files.join(args.workdir, "metrics.jsonl")):
    raise FileNotFoundError(f"{args.workdir}: no metrics.jsonl (not a bertjax workdir, or nothing logged yet)")
  for p in writers.plot(args.workdir) + goodput.plot(args.workdir):
    print(p)
  records = goodput.read(args.workdir)
  if records:
    print(goodput.line(goodput.summarise(records)))
  return 0
