"""Checkpoints and logging on an object store against local disk: what a run whose workdir is a bucket pays.

    python benchmarks/storage.py [--repeats 3] [--steps 40] [--out benchmarks/results/storage_cpu.json]

Starts fake-gcs-server (the GCS emulator the tests use, in memory, on 127.0.0.1) and measures, at BERT-base's
parameter shapes (110M float32 parameters plus AdamW's two moments, 1.3 GB), an orbax checkpoint save (until
committed) and restore through bertjax's Checkpointer, to local disk and to the emulator; then runs a tiny
pre-training with its workdir in the bucket and counts the requests the file layer (gcsfs) makes while steps
log every step and checkpoint every 10: metrics are buffered and reach the bucket once per checkpoint. The
emulator runs on this machine, so its figures are the client's and the protocol's cost, not a network's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import machine  # noqa: E402


def bert_base_state():
  """BERT-base's parameter shapes (google-research/bert's names) with AdamW's two moments, float32."""
  import numpy as np
  rng = np.random.default_rng(0)
  h, f, v, layers = 768, 3072, 30522, 12
  shapes = {"word": (v, h), "position": (512, h), "type": (2, h), "emb_ln": (2, h), "pooler": (h, h),
            "mlm_dense": (h, h), "mlm_ln": (2, h), "mlm_bias": (v,), "nsp": (h, 2)}
  for i in range(layers):
    shapes.update({f"l{i}_qkv": (h, 3 * h), f"l{i}_qkv_b": (3 * h,), f"l{i}_out": (h, h), f"l{i}_ln1": (4, h),
                   f"l{i}_ffn_in": (h, f), f"l{i}_ffn_in_b": (f,), f"l{i}_ffn_out": (f, h), f"l{i}_ln2": (2, h)})
  params = {k: rng.standard_normal(s, dtype=np.float32) * 0.02 for k, s in shapes.items()}
  return {"params": params, "mu": {k: a * 0.1 for k, a in params.items()},
          "nu": {k: a * a for k, a in params.items()}}


def time_checkpoints(workdir: str, state, repeats: int) -> dict:
  import jax
  import orbax.checkpoint as ocp

  from bertjax.core import checkpoint as checkpoint_lib
  saves, restores = [], []
  abstract = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
  for r in range(repeats):
    ck = checkpoint_lib.Checkpointer(workdir, keep=2)
    t0 = time.perf_counter()
    ck.save(r + 1, state, {"step": r + 1})
    ck.wait()
    saves.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = ck.manager.restore(r + 1, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                            data=ocp.args.JsonRestore()))
    jax.block_until_ready(out["state"])
    restores.append(time.perf_counter() - t0)
    ck.close()
  return {"save_s": statistics.median(saves), "restore_s": statistics.median(restores), "saves": saves,
          "restores": restores}


def count_logging_requests(bucket: str, steps: int) -> dict:
  """A tiny pre-training in the bucket, logging every step and checkpointing every 10: bertjax's file-layer
  operations (metrics, TensorBoard, config, claim) at the start, on plain steps and on checkpoint steps, and all
  gcsfs requests (orbax's own step listing, metadata and deletions included, which its background thread makes
  while the next steps run)."""
  import pathlib

  import gcsfs.core
  import helpers

  from bertjax import pretrain
  from bertjax.core import files, writers
  calls: list = []
  ops: list = []  # the file layer's remote operations
  marks: list = []  # (step, requests so far, operations so far) at each metrics row
  real_call, real_write, real_remote = gcsfs.core.GCSFileSystem._call, writers.Writer.write, files._remote

  async def counted(self, method, path, *args, **kwargs):
    calls.append(method)
    return await real_call(self, method, path, *args, **kwargs)

  def marked(self, step, scalars, prefix="train"):
    if prefix == "train":
      marks.append((int(step), len(calls), len(ops)))
    return real_write(self, step, scalars, prefix)

  def operation(path):
    ops.append(str(path))
    return real_remote(path)
  gcsfs.core.GCSFileSystem._call, writers.Writer.write, files._remote = counted, marked, operation
  data = helpers.make_pretraining_data(pathlib.Path(tempfile.mkdtemp()))
  c = helpers.small_config(data)
  c.train.num_steps, c.log_every, c.checkpoint_every, c.eval_every = steps, 1, 10, 0
  start = len(calls)
  pretrain.train_and_evaluate(c, f"{bucket}/pre")
  gcsfs.core.GCSFileSystem._call, writers.Writer.write, files._remote = real_call, real_write, real_remote
  # What happens between two rows belongs to the earlier step (its save runs after its row is written).
  req = {step: n for step, n, _ in marks}
  op = {step: n for step, _, n in marks}
  plain = [s for s in range(1, steps) if s % 10]
  saving = [s for s in range(1, steps) if s % 10 == 0]
  return {"steps": steps, "log_every": 1, "checkpoint_every": 10, "requests": len(calls) - start,
          "requests_at_start": req[1] - start, "layer_ops_at_start": op[1],
          "layer_ops_plain_step_max": max(op[s + 1] - op[s] for s in plain),
          "layer_ops_checkpoint_step_mean": statistics.mean(op[s + 1] - op[s] for s in saving),
          "requests_plain_step_mean": statistics.mean(req[s + 1] - req[s] for s in plain),
          "requests_checkpoint_step_mean": statistics.mean(req[s + 1] - req[s] for s in saving),
          "by_method": {m: calls[start:].count(m) for m in sorted(set(calls[start:]))}}


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--out", default="")
  args = p.parse_args()
  import object_store
  server = object_store.FakeGcs()
  os.environ.update(server.env())
  bucket = server.bucket()
  state = bert_base_state()
  size = sum(a.nbytes for part in state.values() for a in part.values())
  rows = {}
  with tempfile.TemporaryDirectory(prefix="bertjax-bench-") as local:
    rows["local disk"] = time_checkpoints(os.path.join(local, "w"), state, args.repeats)
  rows["gs:// (fake-gcs-server)"] = time_checkpoints(f"{bucket}/w", state, args.repeats)
  requests = count_logging_requests(bucket, args.steps)
  print(f"machine: {machine.describe()}")
  print(f"checkpoint: BERT-base shapes + AdamW moments, {size / 1e9:.2f} GB, median of {args.repeats}")
  print(f"{'where':28s} {'save s':>8s} {'MB/s':>8s} {'restore s':>10s} {'MB/s':>8s}")
  for where, r in rows.items():
    r["save_mb_s"], r["restore_mb_s"] = size / 1e6 / r["save_s"], size / 1e6 / r["restore_s"]
    print(f"{where:28s} {r['save_s']:8.2f} {r['save_mb_s']:8.0f} {r['restore_s']:10.2f} {r['restore_mb_s']:8.0f}")
  r = requests
  print(f"{r['steps']} steps logged every step, a checkpoint every 10: bertjax's file-layer operations "
        f"{r['layer_ops_at_start']} at the start, at most {r['layer_ops_plain_step_max']} on a plain step, "
        f"{r['layer_ops_checkpoint_step_mean']:.1f} on a checkpoint step; gcsfs requests in all (orbax's step "
        f"bookkeeping included) {r['requests_at_start']} at the start, {r['requests_plain_step_mean']:.2f} a plain "
        f"step, {r['requests_checkpoint_step_mean']:.1f} a checkpoint step, {r['requests']} in all "
        f"{r['by_method']}; tensorstore's array reads and writes are not counted")
  result = machine.stamp({"checkpoint_bytes": size, "checkpoints": rows, "logging": requests})
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
  server.stop()
  return 0


if __name__ == "__main__":
  sys.exit(main())
