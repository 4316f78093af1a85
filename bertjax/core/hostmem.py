"""Host memory for XLA:CPU: keep freed buffers in the process instead of handing them back to the kernel.

XLA:CPU allocates each execution's temporaries and outputs with `posix_memalign` from its worker threads. Under
glibc's defaults a request of more than a few MB from a worker thread's arena is served by a fresh `mmap` and
returned with `munmap` when freed, so every train step faults in its gradients and activations page by page
again (the kernel zeroes each 4 KiB page first): on a 2-core CPU, 15-20% of a fine-tuning step of a 6-layer
BERT, and elementwise passes over new buffers at a third of the memory bandwidth of reused ones
(docs/performance.md). One arena, no `mmap` for large blocks and no trimming make freed blocks come back on the
next step, already mapped. Resident memory then stays at the run's peak rather than falling between steps.

Steps whose activations are wide keep `mmap` for large blocks: above `LARGE_STEP_VALUES` (tokens per step x
hidden width) their temporaries run to GBs in blocks of many sizes, and a single heap without `mmap` fragments
under them (the MiniLM-L6 QA step at 16 x 384 peaked at 11-19 GB resident in some runs, and slowed, against
4.7 GB under the defaults; its classifier at 16 x 256 at 8.9 GB against 3.6 GB, 5% faster), while the page
faults the setting saves are a small share of such a step. They get one arena alone (`one_arena`): the blocks
below the mmap threshold that XLA's worker threads free go back to one heap that every thread draws on, rather
than to per-thread arenas (the classifier at 16 x 256: 3.2 GB peak against 3.6 GB, in the same time).

Either setting must be made before the JAX backend starts its threads (before the first device is used); the
entry points (`python -m bertjax train`, the demo) call `tune_for_cpu` with their step's size
(`bertjax.cli.train.step_values`), which applies the
one `cpu_setting` picks when the run is on the CPU. Elsewhere (glibc absent, a TPU or GPU run) it does nothing.

The blocks that stay mapped under one arena are faulted in 4 KiB at a time unless they are marked for
transparent huge pages, and glibc marks its mapped blocks only under the start-up tunable
`glibc.malloc.hugetlb=1`. For such steps `tune_for_cpu` therefore starts the process again with that tunable
when it is missing (`exec_with_huge_pages`): a 2 MiB page is one fault instead of 512, and MiniLM-L6's train
step at 16 x 256 takes ~20% less time (docs/performance.md). Steps that reuse freed blocks fault little and keep
4 KiB pages.

On a virtual machine whose memory balloon reports free pages to the hypervisor (`host_takes_freed_pages`), the
huge pages a step unmaps go back to the host, which discards them, and the next step maps them again through a
fault on the host too: there the restart is skipped. On such a 2-core AMD EPYC (Zen 4) VM, MiniLM-L6's 16 x 256
classifier steps in the whole fine-tuning command averaged 2.40-2.46 s with huge pages (alternating 1.9 and
3.0-3.5 s; 6.5 GiB handed to the host in two minutes) against 2.24-2.35 s with 4 KiB pages (docs/performance.md).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
VIRTIO_DEVICES = "/sys/bus/virtio/devices"
VIRTIO_ID_BALLOON = 5
VIRTIO_BALLOON_F_REPORTING = 5  # the feature bit: the guest reports its free pages to the host

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


def cpu_only_with_libtpu() -> bool:
  """True when libtpu is installed (the `tpu` extra, as the tests install it) but this machine has no TPU and no
  GPU plugin: JAX would then try the TPU first and print libtpu's start-up errors before falling back to the CPU.
  A TPU VM shows its chips as /dev/accel* (v4, v5e) or /dev/vfio/* (v5p, v6e)."""
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return False
  if any(importlib.util.find_spec(m) is not None for m in ("jax_cuda12_plugin", "jax_cuda13_plugin",
                                                          "jax_rocm7_plugin")):
    return False
  devices = os.listdir("/dev") if os.path.isdir("/dev") else []
  vfio = os.listdir("/dev/vfio") if os.path.isdir("/dev/vfio") else []
  return not any(d.startswith("accel") for d in devices) and not any(d.isdigit() for d in vfio)


def _glibc():
  """glibc's handle, or None off Linux/glibc or when the environment already sets MALLOC_ARENA_MAX (the user's
  choice wins)."""
  if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
    return None
  try:
    libc = ctypes.CDLL(None)
    _ = libc.gnu_get_libc_version  # glibc only (not musl): an AttributeError elsewhere
  except (OSError, AttributeError):
    return None
  return libc


def huge_pages_available(setting_file: str = THP_SETTING) -> bool:
  """True when the kernel gives transparent huge pages to the regions a process marks (its setting is
  `[always]` or `[madvise]`, not `[never]`)."""
  try:
    with open(setting_file) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def host_takes_freed_pages(devices: str | None = None) -> bool:
  """True when this machine is a virtual machine whose memory balloon reports free pages to the hypervisor
  (a virtio balloon that negotiated VIRTIO_BALLOON_F_REPORTING; each device's `features` file in sysfs is its
  feature bits as 0/1 from bit 0). The guest kernel then hands blocks of 2 MiB and more that a process unmaps back
  to the host, which discards them, and mapping such memory again costs a fault on the host as well."""
  devices = VIRTIO_DEVICES if devices is None else devices
  try:
    names = os.listdir(devices)
  except OSError:
    return False
  for name in names:
    try:
      with open(os.path.join(devices, name, "device")) as f:
        device = int(f.read().strip(), 16)
      with open(os.path.join(devices, name, "features")) as f:
        features = f.read().strip()
    except (OSError, ValueError):
      continue
    bit = VIRTIO_BALLOON_F_REPORTING
    if device == VIRTIO_ID_BALLOON and len(features) > bit and features[bit] == "1":
      return True
  return False


def huge_pages_env(environ) -> dict | None:
  """The environment to start again with, glibc's huge-page tunable added to GLIBC_TUNABLES, or None when there
  is nothing to do: the tunable or a huge-page choice is already there, or MALLOC_ARENA_MAX is set (the user's
  allocator choice wins)."""
  tunables = environ.get("GLIBC_TUNABLES", "")
  if "MALLOC_ARENA_MAX" in environ or "glibc.malloc.hugetlb" in tunables:
    return None
  env = dict(environ)
  env["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE
  return env


def exec_with_huge_pages() -> None:
  """Starts this process again, the same command line, with glibc's huge-page tunable, when the run is on the CPU
  under glibc, the kernel offers transparent huge pages and the tunable is missing; returns otherwise. glibc
  reads tunables only when a process starts; call it before any work that the restart would lose."""
  env = huge_pages_env(os.environ)
  if env is None or not runs_on_cpu() or _glibc() is None or not huge_pages_available():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def keep_freed_memory() -> bool:
  """Sets glibc's allocator to reuse freed blocks (one arena, no mmap for large blocks, no trimming). Returns
  whether it did (see `_glibc`)."""
  libc = _glibc()
  return libc is not None and all(libc.mallopt(param, value) == 1 for param, value in
                                  ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, _INT_MAX)))


def one_arena() -> bool:
  """Sets glibc's allocator to one arena for every thread, large blocks still mapped and returned: the blocks a
  worker thread frees are reused by the others instead of staying in its own arena. Returns whether it did."""
  libc = _glibc()
  return libc is not None and libc.mallopt(M_ARENA_MAX, 1) == 1


# Tokens per step x hidden width above which large blocks stay mapped: the demo's tiny BERT at 32 x 128 x 128
# (0.5M; 17% faster with `keep_freed_memory`) and MiniLM-L6 at 16 x 128 x 384 (0.8M) keep freed memory,
# MiniLM-L6 at 16 x 256 (1.6M) gets one arena.
LARGE_STEP_VALUES = 2 ** 20
DEFAULT_WIDTH = 768  # BERT-base's, where a config's width cannot be read


def cpu_setting(step_values: int) -> str:
  """The allocator setting for a CPU run whose steps hold `step_values` activation values per layer (tokens per
  step x hidden width): "reuse" (`keep_freed_memory`) up to `LARGE_STEP_VALUES`, else
  "one arena" (`one_arena`)."""
  return "reuse" if step_values <= LARGE_STEP_VALUES else "one arena"


def tune_for_cpu(step_values: int) -> str:
  """Applies `cpu_setting(step_values)` when the run is on the CPU; call before JAX's backend starts. One arena
  first restarts the process with huge pages (`exec_with_huge_pages`) where they are missing, unless the host
  takes freed pages back (`host_takes_freed_pages`). Returns the setting applied, or "" (not on the CPU, not
  glibc, or MALLOC_ARENA_MAX set)."""
  if not runs_on_cpu():
    return ""
  setting = cpu_setting(step_values)
  if setting == "one arena" and not host_takes_freed_pages():
    exec_with_huge_pages()
  applied = keep_freed_memory() if setting == "reuse" else one_arena()
  return setting if applied else ""


def config_tokens(config) -> int:
  """Tokens in one step of a bertjax config: train.global_batch_size x data.max_seq_length (0 when the config
  lacks one; its own checks name what is missing)."""
  try:
    return int(config.train.global_batch_size) * int(config.data.max_seq_length)
  except (AttributeError, KeyError, TypeError, ValueError):
    return 0
