"""Final parameters of fixed-seed tiny runs at two commits, compared byte for byte: pre-training plain (and with
micro-batches), in two phases, ELECTRA, and fine-tuning a classifier on a local CSV. A refactor that should
change nothing must leave every leaf equal (np.array_equal), not merely close.

    python benchmarks/same_params.py BASE [NEW]     # NEW defaults to HEAD; each runs in a `git worktree`

Each commit runs in its own worktree under the system's temp folder (removed afterwards), with this file's copy
of the runs (`--dump OUT.npz` runs them in the current checkout). The tiny configs are those of tests/helpers.py.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dump(root: str, out: str) -> None:
  """Runs the tiny runs with the code under `root` and writes every final parameter leaf to `out` (npz)."""
  sys.path[:0] = [root, os.path.join(root, "tests")]
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from pathlib import Path

  import helpers
  import jax
  import numpy as np

  import bertjax
  from bertjax import finetune
  from bertjax import pretrain as train
  from configs import common, electra
  from configs import finetune as finetune_config
  assert os.path.dirname(bertjax.__file__) == os.path.join(root, "bertjax"), bertjax.__file__
  leaves = {}

  def keep(name, params):
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(params)):
      leaves[name + jax.tree_util.keystr(path)] = np.asarray(leaf)

  # One fixed folder: a phased run seeds each source's order with its folder's path.
  tmp = Path(tempfile.gettempdir()) / "bertjax-same-params"
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir()
  try:
    data = helpers.make_pretraining_data(tmp)
    runs = {"plain": helpers.small_config(data), "accum": helpers.small_config(data, grad_accum_steps=2)}
    c = helpers.small_config(data)
    c.train.num_steps = 0
    c.data.dynamic_masking = True
    c.phases = {"first": common.phase(steps=3), "second": common.phase(steps=3, masked_lm_prob=0.1, learning_rate=-1,
                                                                       warmup_steps=1, optimizer="reset")}
    c.phase_order = "first,second"
    runs["phased"] = c
    e = electra.get_config("variant=tiny,seq=32,preds=5,batch=16,steps=6,shard=dp,vocab=128")
    e.model.vocab_size = c.model.vocab_size
    e.data.example_mode = "nsp_pairs"  # the tiny data's pairs, read as ELECTRA's plain sequences
    e.data.data_dir, e.data.prefetch, e.train.warmup_steps, e.log_every, e.eval_every, e.eval_batches = (
        data, 0, 2, 1, 3, 2)
    runs["electra"] = e
    for name, config in runs.items():
      summary = train.train_and_evaluate(config, str(tmp / name))
      keep(name, summary["state"].params)
    helpers.write_sentiment(tmp / "train.csv", 64, 0)
    helpers.write_sentiment(tmp / "dev.csv", 32, 1)
    f = finetune_config.get_config(f"task=local,init={tmp / 'plain'},lr=1e-3,batch=16,epochs=2,seq=32")
    f.data.train_file, f.data.eval_file = str(tmp / "train.csv"), str(tmp / "dev.csv")
    f.data.text_a_column, f.data.label_column, f.data.labels = "sentence", "sentiment", ("neg", "pos")
    keep("finetune", finetune.finetune(f, str(tmp / "finetune"))["state"].params)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  np.savez(out, **leaves)


def compare(a: str, b: str) -> int:
  import numpy as np
  x, y = np.load(a), np.load(b)
  bad = sorted(set(x.files) ^ set(y.files))
  bad += [k for k in sorted(set(x.files) & set(y.files)) if not np.array_equal(x[k], y[k])]
  runs = sorted({k.split("[")[0] for k in x.files})
  for run in runs:
    keys = [k for k in x.files if k.split("[")[0] == run]
    diff = [k for k in bad if k.split("[")[0] == run]
    print(f"{run}: {len(keys)} leaves, {len(diff)} differ" + (f" (e.g. {diff[0]})" if diff else ""))
  print("byte-identical" if not bad else f"DIFFERENT: {len(bad)} leaves")
  return 1 if bad else 0


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("base", nargs="?")
  p.add_argument("new", nargs="?", default="HEAD")
  p.add_argument("--dump", help="run here (the checkout holding this file, or --root) and write OUT.npz")
  p.add_argument("--root", default=ROOT)
  args = p.parse_args()
  if args.dump:
    dump(args.root, args.dump)
    return 0
  outs = []
  with tempfile.TemporaryDirectory() as tmp:
    for i, commit in enumerate((args.base, args.new)):
      wt = os.path.join(tmp, f"wt{i}")
      subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", wt, commit], check=True)
      try:
        out = os.path.join(tmp, f"{i}.npz")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--dump", out, "--root", wt], cwd=wt, check=True,
                       env={**os.environ, "PYTHONPATH": wt})
        outs.append(out)
      finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", wt], check=True)
    print(f"{args.base} vs {args.new}:")
    return compare(*outs)


if __name__ == "__main__":
  sys.exit(main())
