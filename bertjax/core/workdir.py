"""Holding a workdir for one run: a lock on local disk, a claim object on an object store."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid

import jax

from bertjax import errors
from bertjax.core import files

WorkdirLockedError = errors.WorkdirLockedError


class WorkdirLock:
  """A workdir held by one run. Local: an exclusive lock on WORKDIR/.lock, released by the OS when the holder
  dies, even by kill -9. On an object store, where nothing can be locked: a claim (`Claim`), WORKDIR/.claim.json
  naming the holder, refreshed while the run lives, taken over once stale. On a pod, process 0 holds it."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = None if files.is_remote(workdir) else os.path.join(workdir, ".lock")
    self._fd = None
    self._claim = None

  def __enter__(self):
    if jax.process_index() != 0:
      return self
    if self.path is None:
      self._claim = Claim(self.workdir).take()
      return self
    if os.path.lexists(self.workdir) and not os.path.isdir(self.workdir):
      raise FileExistsError(f"--workdir {self.workdir}: exists and is not a folder; a workdir is a folder of its own")
    files.makedirs(os.path.dirname(self.path))
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      if e.errno in (errno.EAGAIN, errno.EACCES):
        raise WorkdirLockedError(f"{os.path.dirname(self.path)} is in use by another run (pid {holder}); "
                                 "two runs must not write one workdir. Stop it or choose another --workdir.") from None
      raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    self._fd = fd
    return self

  def __exit__(self, *exc):
    if self._claim is not None:
      self._claim.release()
      self._claim = None
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


def _dead_here(held: dict) -> bool:
  """A claim naming a process of this host that has ended (a kill -9 on this machine)."""
  if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
    return False
  try:
    os.kill(held["pid"], 0)
  except ProcessLookupError:
    return True
  except OSError:
    return False
  return False


class Claim:
  """A remote workdir's claim: WORKDIR/.claim.json = {host, pid, token, started, heartbeat} (times in seconds
  since the epoch). A claim whose heartbeat is fresher than BERTJAX_CLAIM_STALE_S (300 s) is another live run's
  and refused, unless it names a process of this host that no longer exists; an older one is a dead run's (a
  preempted VM, kill -9 elsewhere) and taken over. The holder refreshes the
  heartbeat every stale/5 seconds from a daemon thread and deletes the claim on exit. Two runs starting together
  both write, wait, and read back: the one whose token is not there refuses."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = files.join(workdir, ".claim.json")
    self.stale_s = float(os.environ.get("BERTJAX_CLAIM_STALE_S", "300"))
    self.token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    self.record = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token, "started": time.time()}
    self._stop = threading.Event()
    self._thread = None

  def held(self) -> dict | None:
    try:
      held = json.loads(files.read_bytes(self.path))
    except FileNotFoundError:
      return None
    except ValueError:
      return None  # a claim cut short counts as none
    return held if isinstance(held, dict) else None

  def _refused(self, held: dict) -> WorkdirLockedError:
    age = time.time() - float(held.get("heartbeat", 0))
    return WorkdirLockedError(
        f"{self.workdir} is claimed by another run (host {held.get('host')}, pid {held.get('pid')}, heartbeat "
        f"{age:.0f}s ago; {self.path}); two runs must not write one workdir. Stop it, choose another --workdir, or "
        f"wait {max(0.0, self.stale_s - age):.0f}s for the claim to go stale if that run is dead.")

  def _write(self) -> None:
    files.write_whole(self.path, json.dumps({**self.record, "heartbeat": time.time()}))

  def take(self) -> "Claim":
    files.reach(self.workdir)
    held = self.held()
    if held is not None and time.time() - float(held.get("heartbeat", 0)) < self.stale_s and not _dead_here(held):
      raise self._refused(held)
    if held is not None:
      print(f"note: taking over the stale claim of host {held.get('host')} pid {held.get('pid')} on "
            f"{self.workdir}", flush=True)
    self._write()
    time.sleep(float(os.environ.get("BERTJAX_CLAIM_SETTLE_S", "1")))
    held = self.held()
    if held is None or held.get("token") != self.token:
      raise self._refused(held or {})
    self._thread = threading.Thread(target=self._beat, daemon=True)
    self._thread.start()
    return self

  def _beat(self) -> None:
    while not self._stop.wait(self.stale_s / 5):
      try:
        held = self.held()
        if held is not None and held.get("token") != self.token:
          print(f"warning: {self.path} now names another run (host {held.get('host')}, pid {held.get('pid')})",
                flush=True)
          return
        self._write()
      except OSError:
        pass  # a passing store error: the next beat tries again

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(5)
    held = self.held()
    if held is not None and held.get("token") == self.token:
      files.remove(self.path)
