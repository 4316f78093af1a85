"""Chaos check: kill -9 a tiny pre-training run at random moments, resume each time, compare with an uninterrupted run.

  python tests/chaos.py --kills 10 [--steps 30] [--seed 0] [--workdir /tmp/chaos] [--victim gs://B/chaos --fresh_hosts]

Prints one summary line (kills, resumes, max parameter difference, losses equal) and exits non-zero on any
difference. The data is a small offline corpus built on the spot. `--victim` puts the killed run's workdir elsewhere
(a bucket); `--fresh_hosts` starts every run in a new working directory with a new local cache, as a preempted
VM's replacement would.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_data(d: str) -> str:
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset, demo_corpus
  from bertjax.data.pretraining import examples as pretraining
  text = os.path.join(d, "corpus.txt")
  demo_corpus.build_demo_corpus(text)
  with open(text, encoding="utf-8") as f:
    small = f.read()[:200_000]
  small = small[: small.rfind("\n\n")] + "\n"
  with open(text, "w", encoding="utf-8") as f:
    f.write(small)
  vocab = tokenizer.train([text], os.path.join(d, "tok"), vocab_size=512)
  out = os.path.join(d, "data")
  dataset.create([text], vocab, out, pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5,
                                                                 dupe_factor=1), heldout_every=0)
  return out


def command(workdir: str, data_dir: str, steps: int) -> list[str]:
  from bertjax.data.pretraining import dataset
  vocab = dataset.read_creation(data_dir)["vocab_size"]
  return [sys.executable, "-m", "bertjax", "train",
          f"--config={ROOT}/configs/pretrain.py:variant=tiny,seq=32,preds=5,batch=8,shard=dp,steps={steps}",
          f"--workdir={workdir}", f"--config.data.data_dir={data_dir}", f"--config.model.vocab_size={vocab}",
          "--config.model.hidden_size=64", "--config.model.num_heads=4", "--config.model.intermediate_size=128",
          "--config.model.max_position_embeddings=32", "--config.train.warmup_steps=3",
          "--config.log_every=1", "--config.eval_every=0", "--config.checkpoint_every=3", "--config.keep_checkpoints=2"]


FRESH_HOSTS = False


def host() -> tuple[str, dict]:
  """(working directory, environment) of a run: ROOT and this environment, or with --fresh_hosts a new empty
  working directory and a new local cache each time."""
  e = dict(os.environ)
  e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
  e.setdefault("JAX_PLATFORMS", "cpu")
  if not FRESH_HOSTS:
    return ROOT, e
  e["BERTJAX_CACHE"] = tempfile.mkdtemp(prefix="chaos-cache-")
  return tempfile.mkdtemp(prefix="chaos-host-"), e


def run_to_end(cmd) -> None:
  cwd, e = host()
  out = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=cwd, timeout=900)
  if out.returncode != 0:
    raise RuntimeError(f"run failed ({out.returncode}):\n{out.stderr[-3000:]}")


def run_and_kill(cmd, rng: random.Random, steps: int, seen_leftovers: list) -> bool:
  """Start the run, kill -9 it after a random number of logged steps plus a random delay. True if killed."""
  cwd, e = host()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=e, cwd=cwd)
  target = rng.randint(1, max(1, steps // 3))
  seen = 0
  for line in proc.stdout:
    if line.startswith("note: ignoring half-written"):
      seen_leftovers.append(line.strip())  # the previous kill landed inside an asynchronous save
    if line.startswith("step "):
      seen += 1
      if seen >= target:
        time.sleep(rng.uniform(0.0, 0.4))  # anywhere: inside a step, an asynchronous save, a log write
        break
  if proc.poll() is None:
    proc.kill()
    proc.wait()
    return True
  return False


def final(workdir: str):
  from bertjax.core import checkpoint, files
  from bertjax.core import writers as metrics
  ck = checkpoint.Checkpointer(workdir)
  step = ck.latest_step()
  params = ck.restore_params(step)
  losses = {}
  for r in metrics.read_jsonl(files.join(workdir, "metrics.jsonl")):
    if r["split"] == "train":
      losses[r["step"]] = r["loss"]  # the last write of each step wins (a resumed run rewrites them)
  import orbax.checkpoint as ocp
  data = ck.manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
  return step, params, losses, data


def chaos(kills: int, steps: int, seed: int, workdir: str, data_dir: str | None = None, victim: str = "") -> dict:
  import jax

  from bertjax.core import files
  os.makedirs(workdir, exist_ok=True)
  data_dir = data_dir or build_data(workdir)
  ref, victim = os.path.join(workdir, "reference"), victim or os.path.join(workdir, "chaos")
  for d in (ref, victim):
    files.rmtree(d)
  run_to_end(command(ref, data_dir, steps))
  rng = random.Random(seed)
  done_kills = resumes = 0
  leftovers: list = []
  while done_kills < kills:
    if run_and_kill(command(victim, data_dir, steps), rng, steps, leftovers):
      done_kills += 1
    resumes += 1
  run_to_end(command(victim, data_dir, steps))
  s1, p1, l1, d1 = final(ref)
  s2, p2, l2, d2 = final(victim)
  diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(np.max(np.abs(a - b))), p1, p2))
  result = {"kills": done_kills, "resumes": resumes, "kills_during_save": len(leftovers),
            "final_step": (s1, s2), "max_param_diff": max(diffs),
            "losses_equal": l1 == l2, "data_position_equal": d1 == d2}
  result["ok"] = (s1 == s2 == steps and result["max_param_diff"] == 0.0 and result["losses_equal"]
                  and result["data_position_equal"])
  return result


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--kills", type=int, default=10)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--workdir", default="")
  p.add_argument("--data_dir", default="")
  p.add_argument("--victim", default="", help="the killed run's workdir (default WORKDIR/chaos), e.g. gs://B/chaos")
  p.add_argument("--fresh_hosts", action="store_true",
                 help="every run in a new working directory with a new local cache (BERTJAX_CACHE)")
  args = p.parse_args()
  global FRESH_HOSTS
  FRESH_HOSTS = args.fresh_hosts
  workdir = args.workdir or tempfile.mkdtemp(prefix="bertjax_chaos_")
  r = chaos(args.kills, args.steps, args.seed, workdir, args.data_dir or None, args.victim)
  print(f"chaos: kills {r['kills']} ({r['kills_during_save']} seen inside a save), resumes {r['resumes']}, "
        f"final step {r['final_step'][1]}/{args.steps}, "
        f"max |param diff| {r['max_param_diff']:.3g}, losses identical {r['losses_equal']}, "
        f"data position identical {r['data_position_equal']} -> {'OK' if r['ok'] else 'MISMATCH'}")
  return 0 if r["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
