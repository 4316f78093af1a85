"""Host memory for XLA:CPU: keep freed buffers in the process instead of handing them back to the kernel.

XLA:CPU allocates each execution's temporaries and outputs with `posix_memalign` from its worker threads. Under
glibc's defaults a request of more than a few MB from a worker thread's arena is served by a fresh `mmap` and
returned with `munmap` when freed, so every train step faults in its gradients and activations page by page
again (the kernel zeroes each 4 KiB page first): on a 2-core CPU, 15-20% of a fine-tuning step of a 6-layer
BERT, and elementwise passes over new buffers at a third of the memory bandwidth of reused ones
(docs/performance.md). One arena, no `mmap` for large blocks and no trimming make freed blocks come back on the
next step, already mapped. Resident memory then stays at the run's peak rather than falling between steps.

Steps of more than `LARGE_STEP_TOKENS` tokens keep glibc's defaults: their temporaries run to GBs in blocks of
many sizes, and a single heap without `mmap` fragments under them (the MiniLM-L6 QA step at 16 x 384 peaked at
11-19 GB resident in some runs, and slowed, against 4.7 GB under the defaults), while the page faults the
setting saves are a small share of such a step.

`keep_freed_memory()` must run before the JAX backend starts its threads (before the first device is used);
the entry points (`python -m bertjax.main`, the demo) call `tune_for_cpu` with their step's size when the run is
on the CPU. Elsewhere (glibc absent, a TPU or GPU run) it does nothing.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
_INT_MAX = 2 ** 31 - 1


def runs_on_cpu() -> bool:
  """True when JAX will run on the CPU: JAX_PLATFORMS names only `cpu`, or is unset and no TPU or GPU plugin
  is installed."""
  platforms = {p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
  if platforms:
    return platforms == {"cpu"}
  return not any(importlib.util.find_spec(m) is not None for m in ("libtpu", "jax_cuda12_plugin",
                                                                  "jax_cuda13_plugin", "jax_rocm7_plugin"))


def keep_freed_memory() -> bool:
  """Sets glibc's allocator to reuse freed blocks (one arena, no mmap for large blocks, no trimming). Returns
  whether it did: False off Linux/glibc, or when the environment already sets MALLOC_ARENA_MAX (the user's
  choice wins)."""
  if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
    return False
  try:
    libc = ctypes.CDLL(None)
    _ = libc.gnu_get_libc_version  # glibc only (not musl): an AttributeError elsewhere
  except (OSError, AttributeError):
    return False
  return all(libc.mallopt(param, value) == 1 for param, value in
             ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, _INT_MAX)))


LARGE_STEP_TOKENS = 4096  # global batch x sequence length above which glibc's defaults are kept


def tune_for_cpu(tokens_per_step: int) -> bool:
  """`keep_freed_memory()` when the run is on the CPU and its steps hold at most `LARGE_STEP_TOKENS` tokens
  (global batch x sequence length); call before JAX's backend starts."""
  return tokens_per_step <= LARGE_STEP_TOKENS and runs_on_cpu() and keep_freed_memory()


def config_tokens(config) -> int:
  """Tokens in one step of a bertjax config: train.global_batch_size x data.max_seq_length (0 when the config
  lacks one; its own checks name what is missing)."""
  try:
    return int(config.train.global_batch_size) * int(config.data.max_seq_length)
  except (AttributeError, KeyError, TypeError, ValueError):
    return 0
