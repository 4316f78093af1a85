"""Run `python -m bertjax train` as N real processes on this machine, each with its own fake CPU devices, joined by
jax.distributed over 127.0.0.1 (gloo collectives) -- the multi-host path of a TPU pod, on one machine.

  python launch/local_cluster.py --processes 2 --devices_per_process 4 -- \
      --config=configs/pretrain.py:variant=tiny --workdir=/tmp/w --config.data.data_dir=...

Every process gets the same arguments plus --coordinator_address/--num_processes/--process_id. Output of
process 0 is streamed; the others' is printed if they fail. Exits non-zero if any process fails.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run(processes: int, devices: int, main_args: list[str], timeout: float = 1200) -> int:
  port = free_port()
  procs = []
  for i in range(processes):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "bertjax", "train", *main_args, f"--coordinator_address=127.0.0.1:{port}",
           f"--num_processes={processes}", f"--process_id={i}"]
    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, text=True,
                                  stdout=None if i == 0 else subprocess.PIPE,
                                  stderr=None if i == 0 else subprocess.STDOUT))
  deadline = time.time() + timeout
  codes = [None] * processes
  while any(c is None for c in codes):
    for i, p in enumerate(procs):
      if codes[i] is None:
        codes[i] = p.poll()
    if any(c not in (None, 0) for c in codes) or time.time() > deadline:
      break  # one failed: the others would wait on collectives forever
    time.sleep(0.2)
  for i, p in enumerate(procs):
    if p.poll() is None:
      p.kill()
      codes[i] = -9
  for i, p in enumerate(procs[1:], 1):
    out = p.stdout.read() if p.stdout else ""
    if codes[i] != 0:
      print(f"--- process {i} exited {codes[i]}:\n{out[-4000:]}", file=sys.stderr)
  return max(abs(c) for c in codes)


def main():
  argv = sys.argv[1:]
  if "--" not in argv:
    print(__doc__, file=sys.stderr)
    return 2
  i = argv.index("--")
  p = argparse.ArgumentParser()
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--devices_per_process", type=int, default=4)
  p.add_argument("--timeout", type=float, default=1200)
  args = p.parse_args(argv[:i])
  return run(args.processes, args.devices_per_process, argv[i + 1:], args.timeout)


if __name__ == "__main__":
  sys.exit(main())
