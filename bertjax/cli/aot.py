"""Ahead-of-time compile of the real train step for a TPU topology, on a CPU host (no TPU needed).

  python -m bertjax aot --config=configs/pretrain.py:variant=large,seq=512,shard=fsdp --topology=v5e:4x4 \
      [--per_chip_batch=16 | --search] [--num_slices=2] [--out=aot.json]

Builds the same mesh, shardings and jitted step as training (on the topology's devices), lowers it on abstract
inputs, compiles it with libtpu (the `tpu` extra), and prints per-chip memory (arguments, temporaries, outputs,
total against the chip's HBM), FLOPs, and FITS / DOES NOT FIT. `--search` finds the largest per-chip batch
that fits (doubling, then bisection to a multiple of 8).

On a CPU host set TPU_ACCELERATOR_TYPE=v5litepod-4 TPU_WORKER_HOSTNAMES=localhost to silence libtpu's
host discovery, and keep JAX_PLATFORMS=cpu for everything else (this module sets both when unset).
"""
from __future__ import annotations

import json
import os
import sys
import time

from bertjax.cli import common

os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile only: no chip is opened, so no lock is needed

# HBM per chip, GiB (public specifications).
HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}
TOPOLOGIES = {"v4-8": "v4:2x2x1", "v5e-16": "v5e:4x4", "v5p-8": "v5p:2x2x1", "v6e-8": "v6e:2x4"}


def topology_devices(topology: str, num_slices: int = 1):
  from jax.experimental import topologies

  from bertjax import errors
  name = TOPOLOGIES.get(topology, topology)
  kw = {"chip_config_name": "megacore"} if name.startswith(("v4", "v5p")) else {}  # one device per chip
  try:
    topo = topologies.get_topology_desc(platform="tpu", topology_name=name, num_slices=num_slices, **kw)
  except Exception as e:
    raise errors.ConfigError(f"cannot describe TPU topology {name!r} ({type(e).__name__}: {str(e)[:300]}); "
                             "install the tpu extra (pip install -e '.[tpu]') for libtpu") from None
  return list(topo.devices), name


def compile_step(config, topology: str, per_chip_batch: int, num_slices: int = 1) -> dict:
  """Compile the train step for `topology` at `per_chip_batch`; returns memory / FLOP figures and the verdict."""
  import jax

  from bertjax import objectives
  from bertjax import pretrain as train
  from bertjax.core import sharding as sharding_lib
  devices, name = topology_devices(topology, num_slices)
  config = config.copy_and_resolve_references()
  config.unlock()
  config.train.global_batch_size = per_chip_batch * len(devices)
  config.sharding.num_slices = num_slices
  mcfg = train.validate(config, len(devices))
  run = train.build(config, mcfg, devices)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=run.batch_sharding) for k, v in run.dummy.items()}
  chip = name.split(":")[0]
  result = {"topology": name, "chips": len(devices), "per_chip_batch": per_chip_batch,
            "global_batch": config.train.global_batch_size, "variant": config.model.variant,
            "seq": config.data.max_seq_length, "preset": config.sharding.preset, "mesh": dict(run.mesh.shape),
            # the unroll the step is compiled with: the config's auto (0) resolved for the target chips
            "scan_unroll": mcfg.for_platform(devices[0].platform).scan_unroll if mcfg.scan_layers else None,
            "hbm_gib": HBM_GIB.get(chip)}
  t = time.time()
  try:
    with sharding_lib.use_mesh(run.mesh, run.rules):
      lowered = run.train_step.lower(run.abstract, batch)
      compiled = lowered.compile()
  except Exception as e:
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text:
      result.update(fits=False, compile_s=time.time() - t, error=text.splitlines()[0][:300])
      return result
    raise
  result["compile_s"] = time.time() - t
  # Pallas kernels compiled by Mosaic for the chip (attention_impl=splash), as custom calls in the program.
  result["mosaic_kernels"] = compiled.as_text().count('custom_call_target="tpu_custom_call"')
  mem = compiled.memory_analysis()
  gib = 1024 ** 3
  args_b = getattr(mem, "argument_size_in_bytes", 0)
  temp_b = getattr(mem, "temp_size_in_bytes", 0)
  out_b = getattr(mem, "output_size_in_bytes", 0)
  alias_b = getattr(mem, "alias_size_in_bytes", 0)
  total = args_b + temp_b + out_b - alias_b
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  estimate = cost.get("optimal_seconds")
  result.update(arguments_gib=args_b / gib, temporaries_gib=temp_b / gib, outputs_gib=out_b / gib,
                aliased_gib=alias_b / gib, total_gib=total / gib,
                compiler_flops_per_chip=float(cost.get("flops", 0.0)),  # counts a scanned layer body once
                estimated_step_s=estimate if estimate and estimate > 0 else None, fits=True)
  if result["hbm_gib"] and result["total_gib"] > result["hbm_gib"]:
    # The compiler accepted a program whose own memory analysis exceeds the chip's HBM: not counted as fitting.
    result.update(fits=False, error=f"memory analysis {result['total_gib']:.1f} GiB exceeds the chip's "
                                    f"{result['hbm_gib']:.0f} GiB HBM")
  tokens = config.train.global_batch_size * config.data.max_seq_length
  # The objective's count of the global batch's step, shared by the chips.
  result["model_tflops_per_chip"] = objectives.get(config).step_flops(config, mcfg, run.module) / len(devices) / 1e12
  result["tokens_per_step"] = tokens
  return result


def fit_batch(config, topology: str, num_slices: int = 1, headroom: float = 0.95, verify: bool = True) -> dict:
  """The largest per-chip batch (multiple of 8) by a linear fit of memory in batch (compiles at 8 and 16); with
  `verify`, that batch is compiled too (stepping down by 8 while it does not fit): three compiles instead of a
  search's five to eight. Without, the result is the fit's prediction (`predicted: True`)."""
  a = compile_step(config, topology, 8, num_slices)
  if not a["fits"]:
    for b in (4, 2, 1):
      r = compile_step(config, topology, b, num_slices)
      if r["fits"]:
        return r
    return a
  b = compile_step(config, topology, 16, num_slices)
  if not b["fits"]:
    return a
  slope = max((b["total_gib"] - a["total_gib"]) / 8, 1e-9)
  fixed = a["total_gib"] - 8 * slope
  guess = int((a["hbm_gib"] * headroom - fixed) / slope) // 8 * 8
  if not verify:
    return {**b, "per_chip_batch": max(guess, 16), "total_gib": fixed + slope * max(guess, 16), "predicted": True}
  return verify_batch(config, topology, guess, b, num_slices)


def verify_batch(config, topology: str, guess: int, floor: dict, num_slices: int = 1) -> dict:
  """Compiles the predicted per-chip batch `guess`, stepping down by 8 (twice at most) while it does not fit;
  `floor` (a fitting compile at a smaller batch) is the answer when none of them fits."""
  for cand in (guess, guess - 8, guess - 16):
    if cand <= floor["per_chip_batch"]:
      break
    r = compile_step(config, topology, cand, num_slices)
    if r["fits"]:
      return r
  return floor


def search_batch(config, topology: str, num_slices: int = 1, start: int = 8, limit: int = 1024) -> dict:
  """The largest per-chip batch (a multiple of 8, or less than 8) that compiles within HBM."""
  best, b = None, start
  fail = None
  while b <= limit:
    r = compile_step(config, topology, b, num_slices)
    if not r["fits"]:
      fail = b
      break
    best, b = r, b * 2
  if best is None:  # even `start` does not fit: try below it
    for b in (4, 2, 1):
      r = compile_step(config, topology, b, num_slices)
      if r["fits"]:
        return r
    return r
  lo = best["per_chip_batch"]
  hi = fail if fail is not None else lo
  while fail is not None and hi - lo > 8:
    mid = (lo + hi) // 2 // 8 * 8
    if mid <= lo:
      break
    r = compile_step(config, topology, mid, num_slices)
    if r["fits"]:
      best, lo = r, mid
    else:
      hi = mid
  return best


def main(argv=None):
  from absl import flags
  from ml_collections import config_flags
  flags_ = flags.FLAGS
  if "topology" not in flags_:  # defined once per process (main may be called again, e.g. by tests)
    config_flags.DEFINE_config_file("config", None, "config, e.g. configs/pretrain.py:variant=large")
    flags.DEFINE_string("topology", "v5e:2x2", "TPU topology name (v4:2x2x1, v5e:4x4, ...) or v4-8/v5e-16/v5p-8/v6e-8")
    flags.DEFINE_integer("per_chip_batch", 8, "per-chip batch (global = per chip x chips)")
    flags.DEFINE_bool("search", False, "find the largest per-chip batch that fits")
    flags.DEFINE_integer("num_slices", 1, "multi-slice (DCN) count")
    flags.DEFINE_string("out", "", "write the result as JSON here")

  def run(_):
    from bertjax import errors
    for name in ("per_chip_batch", "num_slices"):
      if flags_[name].value < 1:
        raise errors.ConfigError(f"--{name} must be >= 1, got {flags_[name].value}")
    from bertjax.core import files
    if flags_.out:  # a wrong endpoint or a missing bucket: one line, before the compilation
      files.reach(flags_.out)
    fn = search_batch if flags_.search else compile_step
    args = (flags_.config, flags_.topology) + (() if flags_.search else (flags_.per_chip_batch,))
    r = fn(*args, num_slices=flags_.num_slices)
    verdict = "FITS" if r["fits"] else "DOES NOT FIT"
    print(f"{r['variant']} seq {r['seq']} {r['preset']} on {r['topology']} ({r['chips']} chips, mesh {r['mesh']}), "
          f"per-chip batch {r['per_chip_batch']}: {verdict}")
    if r["fits"]:
      print(f"  per chip: arguments {r['arguments_gib']:.2f} GiB, temporaries {r['temporaries_gib']:.2f} GiB, "
            f"outputs {r['outputs_gib']:.2f} GiB (donated {r['aliased_gib']:.2f}), total {r['total_gib']:.2f} GiB "
            f"of {r['hbm_gib']} GiB HBM; model {r['model_tflops_per_chip']:.2f} TFLOP per chip per step"
            + (f"; compiler's estimate {r['estimated_step_s'] * 1e3:.1f} ms/step" if r.get("estimated_step_s") else "")
            + f"; compiled in {r['compile_s']:.1f}s")
    else:
      print(f"  {r.get('error', '')}")
    if flags_.out:
      files.write_whole(flags_.out, json.dumps(r, indent=2))

  common.run_absl(run, argv=[sys.argv[0], *(sys.argv[1:] if argv is None else argv)])

