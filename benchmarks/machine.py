"""The machine a benchmark ran on, for its JSON and its table: CPU vendor, model, family/model numbers, the
instruction-set flags that change XLA's and PyTorch's kernels (AVX-512, its bf16 extension, AMX), cores, and the
versions of jax and torch; and the argument type the benchmarks' counts share."""
from __future__ import annotations

import argparse
import os
import platform


def cpu() -> dict:
  info: dict = {}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if not line.strip():
          break  # the first processor's block is enough
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
  except OSError:
    pass
  flags = set(info.get("flags", "").split())
  return {"vendor": info.get("vendor_id", platform.processor()), "model_name": info.get("model name", ""),
          "family": info.get("cpu family"), "model": info.get("model"), "cores": os.cpu_count(),
          "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
          "amx": any(f.startswith("amx") for f in flags)}


def versions() -> dict:
  from importlib import metadata
  out = {}
  for name in ("jax", "jaxlib", "flax", "orbax-checkpoint", "torch", "transformers", "sentence-transformers"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def describe() -> str:
  """One line: 'Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 207), 2 cores, AVX-512'."""
  c = cpu()
  isa = "AVX-512" if c["avx512f"] else "AVX2" if c["avx2"] else "no AVX2"
  if c["avx512_bf16"]:
    isa += "+bf16"
  if c["amx"]:
    isa += "+AMX"
  return f"{c['model_name']} ({c['vendor']} family {c['family']} model {c['model']}), {c['cores']} cores, {isa}"


def stamp(result):
  """`result` with the machine it ran on: a dict gains "machine" (cpu() and "describe": describe()) and "versions"
  (versions()), replacing any it had; a list of rows becomes {"machine": ..., "versions": ..., "rows": the list}."""
  here = {"machine": {**cpu(), "describe": describe()}, "versions": versions()}
  if isinstance(result, dict):
    return {**result, **here}
  if isinstance(result, list):
    return {**here, "rows": result}
  raise TypeError(f"stamp takes a dict or a list of rows, not {type(result).__name__}")


def rows(data):
  """The rows of a results file read back: the plain list older files hold, or the "rows" of a stamped one."""
  return data["rows"] if isinstance(data, dict) and "machine" in data and "rows" in data else data


def positive_int(text: str) -> int:
  """An argparse type for a count: an integer of at least 1, else argparse's one-line error."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
  return value
