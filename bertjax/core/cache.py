"""A bounded local cache of remote objects for readers that open local files only (array_record).

A host never holds more than the cache limit of a remote dataset: objects are downloaded whole when first read
(or ahead, when a reader knows what it needs next), kept in least-recently-used order and evicted when a new one
needs the room. An object being read is pinned and never evicted under its reader. The limit is
`BERTJAX_CACHE_LIMIT` (bytes, or with a K/M/G/T suffix: 512M, 4G) unless a caller passes one (a run's
`data.cache_limit`); by default 4 GiB, far below a pre-training corpus.

`high_water` is the most bytes the cache held at once, downloads in flight included: what the host's disk needed.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import re
import shutil
import threading
from typing import Callable, Iterator

from bertjax import errors
from bertjax.core import files

DEFAULT_LIMIT = 4 << 30
ENV = "BERTJAX_CACHE_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class CacheError(errors.DataError):
  """The cache cannot hold what a reader needs at once: names the sizes and what to change."""


def parse_size(text, where: str = ENV) -> int:
  """'4G', '512M', '1.5G', '1000000' -> bytes; anything else is a one-line ConfigError naming `where`."""
  m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
  if m is None or float(m.group(1)) <= 0:
    raise errors.ConfigError(f"{where}={text!r}: a size in bytes, or with a K/M/G/T suffix (e.g. 4G, 512M)")
  return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def limit_of(value: str | int | None = None) -> int:
  """The cache limit in bytes: `value` (a run's data.cache_limit) when set, else $BERTJAX_CACHE_LIMIT, else 4 GiB."""
  if value not in (None, "", 0):
    return parse_size(value, "data.cache_limit")
  if os.environ.get(ENV):
    return parse_size(os.environ[ENV])
  return DEFAULT_LIMIT


def human(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n:.1f} TiB"


_SHARED: dict[str, "Cache"] = {}
_SHARED_LOCK = threading.Lock()


def shared(limit: int) -> "Cache":
  """This process's one cache (every remote dataset it reads shares the limit), in BERTJAX_CACHE's folder."""
  try:
    import jax
    process = jax.process_index()
  except Exception:  # noqa: BLE001  (no backend: a tool outside training)
    process = 0
  folder = os.path.join(files.cache_root(), "shards", f"p{process}")
  with _SHARED_LOCK:
    cache = _SHARED.get(folder)
    if cache is None or cache.closed:
      cache = _SHARED[folder] = Cache(folder, limit)
    elif limit != cache.limit:  # the newest setting (a run's data.cache_limit) holds from here on
      with cache._lock:  # noqa: SLF001
        cache.limit = int(limit)
        cache._make_room(0)  # noqa: SLF001
    return cache


class Cache:
  """Remote objects of known sizes held in local `folder` within `limit` bytes (see the module docstring)."""

  def __init__(self, folder: str, limit: int, threads: int = 4):
    self.folder, self.limit = folder, int(limit)
    self._listeners: list[Callable[[str], None]] = []
    self.closed = False
    os.makedirs(folder, exist_ok=True)
    self._lock = threading.Condition()
    self._held: collections.OrderedDict[str, int] = collections.OrderedDict()  # key -> bytes, oldest first
    self._remote: dict[str, str] = {}  # key -> remote path
    self._pins: collections.Counter = collections.Counter()
    self._loading: dict[str, concurrent.futures.Future] = {}
    self._reserved = 0
    self.high_water = 0
    self.downloads = 0
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bertjax-cache")
    for name in sorted(os.listdir(folder)):  # what an earlier run on this host left: counted, and evicted first
      path = os.path.join(folder, name)
      if name.endswith(".part"):
        os.remove(path)
      elif os.path.isfile(path):
        self._held[name] = os.path.getsize(path)
        self._remote[name] = name
    with self._lock:
      self._make_room(0)

  def on_evict(self, fn: Callable[[str], None]) -> None:
    """`fn(remote)` runs before an object's local copy is deleted (a reader closes its file)."""
    self._listeners.append(fn)

  @property
  def used(self) -> int:
    return sum(self._held.values()) + self._reserved

  def local_path(self, remote: str) -> str:
    return os.path.join(self.folder, _key(remote))

  def _known(self, remote: str) -> str:
    self._remote[_key(remote)] = remote
    return _key(remote)

  @contextlib.contextmanager
  def use(self, remote: str, size: int) -> Iterator[str]:
    """The local copy of `remote` (downloaded if absent), pinned while the block runs."""
    future = self._start(remote, size)
    with self._lock:
      self._pins[_key(remote)] += 1
    try:
      future.result()
      with self._lock:
        self._held.move_to_end(_key(remote))
      yield self.local_path(remote)
    finally:
      with self._lock:
        self._pins[_key(remote)] -= 1
        if self._pins[_key(remote)] <= 0:
          del self._pins[_key(remote)]

  def prefetch(self, items) -> None:
    """Starts downloading each (remote, size) not held yet, in the background; none that the cache cannot hold
    beside what is pinned (a prefetch never fails a run: the read that needs the object reports it)."""
    for remote, size in items:
      with self._lock:
        if _key(remote) in self._held or _key(remote) in self._loading:
          continue
        if size + self._pinned_bytes() > self.limit:
          return
      self._start(remote, size)

  def _pinned_bytes(self) -> int:
    return sum(self._held.get(k, 0) for k in self._pins)

  def _start(self, remote: str, size: int) -> concurrent.futures.Future:
    with self._lock:
      key = self._known(remote)
      if key in self._held:
        done = concurrent.futures.Future()
        done.set_result(None)
        return done
      if key in self._loading:
        return self._loading[key]
      self._make_room(size)
      self._reserved += size
      self.high_water = max(self.high_water, self.used)
      future = self._pool.submit(self._download, remote, size)
      self._loading[key] = future
      return future

  def _download(self, remote: str, size: int) -> None:
    key = _key(remote)
    tmp = self.local_path(remote) + ".part"
    try:
      files.copy(remote, tmp)
      got = os.path.getsize(tmp)
      if got != size:
        raise errors.DataPathError(f"{remote}: {got} bytes read, {size} expected (changed or cut while read); "
                                   "rebuild the data or rerun")
      os.replace(tmp, self.local_path(remote))
      with self._lock:
        self._held[key] = size
        self.downloads += 1
    except BaseException:
      with contextlib.suppress(OSError):
        os.remove(tmp)
      raise
    finally:
      with self._lock:
        self._reserved -= size
        self._loading.pop(key, None)
        self._lock.notify_all()

  def _make_room(self, size: int) -> None:
    """Evicts unpinned objects, oldest first, until `size` more bytes fit (called with the lock held)."""
    while self.used + size > self.limit:
      victim = next((k for k in self._held if k not in self._pins), None)
      if victim is None:
        if self._loading:  # a download in flight frees its reservation or becomes evictable when it ends
          self._lock.wait(1.0)
          continue
        raise CacheError(
            f"the local cache cannot hold {human(size)} more beside {human(self.used)} in use (limit "
            f"{human(self.limit)}, {ENV} or data.cache_limit): raise the limit or lower data.shuffle_window")
      for fn in self._listeners:
        fn(self._remote[victim])
      nbytes = self._held.pop(victim)
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(self.folder, victim))
      del nbytes

  def close(self) -> None:
    self.closed = True
    self._pool.shutdown(wait=True, cancel_futures=True)

  def clear(self) -> None:
    self.close()
    shutil.rmtree(self.folder, ignore_errors=True)


def _key(remote: str) -> str:
  """A remote object's local file name: a digest of its path (one cache holds several datasets' shards) and its
  last path part (for a reader of the folder)."""
  import hashlib
  remote = remote.rstrip("/")
  return f"{hashlib.sha256(remote.encode()).hexdigest()[:12]}-{remote.rpartition('/')[2]}"
