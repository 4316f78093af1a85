"""python -m bertjax merge INPUT... --out OUT: average or merge checkpoints of one architecture.

    python -m bertjax merge W --last 3 --out AVG                      # the mean of W's newest 3 checkpoints
    python -m bertjax merge W@ema --out EMA                           # (one input: its moving average as it is)
    python -m bertjax merge A B C --method ties --base PRE --density 0.2 --out MERGED
    python -m bertjax merge hf_a hf_b --weights 0.7,0.3 --out SOUP    # HF folders too

An INPUT is a bertjax pre-training workdir (its newest checkpoint; W@STEP a given step; W@ema its moving average)
or an HF folder of the same family and sizes. OUT becomes a workdir (init_checkpoint=OUT continues from it) with
OUT/hf, the HF folder. See `bertjax.convert.merge`.
"""
from __future__ import annotations

from bertjax import errors
from bertjax.cli import common
from bertjax.convert import merge as merge_lib
from bertjax.core import files


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Average or merge checkpoints (linear, TIES) into a workdir and HF folder.")
  p.add_argument("inputs", nargs="+", help="workdirs (W, W@STEP, W@ema) or HF folders")
  p.add_argument("--out", required=True, help="a new folder (an earlier merge's, with --overwrite)")
  p.add_argument("--method", default="linear", choices=merge_lib.METHODS)
  p.add_argument("--weights", default="", help="one number > 0 per input, comma-separated (default: equal)")
  p.add_argument("--last", type=int, default=None, help="with one workdir: average its newest K checkpoints")
  p.add_argument("--base", default="", help="ties: the checkpoint the task vectors are taken from")
  p.add_argument("--density", type=float, default=0.2, help="ties: the fraction of each task vector kept")
  p.add_argument("--lam", type=float, default=1.0, help="ties: the merged task vector's scale")
  p.add_argument("--overwrite", action="store_true", help="replace an earlier merge's --out")
  return p


def _weights(text: str):
  if not text:
    return None
  try:
    return [float(x) for x in text.split(",")]
  except ValueError:
    raise errors.ConfigError(f"--weights {text!r}: give numbers separated by commas") from None


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  specs = list(args.inputs)
  for path in (*specs, args.base, args.out):  # a wrong endpoint or a missing bucket: one line, before any work
    if path:
      files.reach(path)
  if args.last is not None:
    if len(specs) != 1:
      raise errors.ConfigError(f"--last {args.last} averages the checkpoints of one workdir; got {len(specs)} inputs")
    specs = merge_lib.last_steps(specs[0], args.last)
  density = args.density if args.method == "ties" else 1.0
  if len(specs) == 1 and args.method == "linear":
    specs = specs * 2  # one input (W@ema, W@STEP): written out as it is
  record = merge_lib.merge(specs, args.out, args.method, _weights(args.weights), args.base, density, args.lam,
                           args.overwrite)
  print(f"wrote {args.out} ({record['method']} of {len(set(specs))} checkpoint(s); HF folder {args.out}/hf, "
        f"{record['architecture']})")
  return 0
