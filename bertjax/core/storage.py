"""Object stores behind the file layer (`bertjax.core.files`): which paths are remote, their fsspec file systems
(listings uncached, so another host's writes are seen at once), a bounded first contact, and the stores' failures
as one-line errors naming the path."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading

from bertjax import errors

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# gcsfs probes each bucket's type over gRPC (zonal and hierarchical buckets) and waits a minute when that channel
# cannot be reached (emulators, restricted networks); bertjax uses plain object semantics and needs neither.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# gcsfs logs each failed request with its traceback before raising it; the failure reaches the user as the one
# line `translated` makes of it.
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


def scheme(path) -> str | None:
  """'gs', 's3', ... for a remote path; None for a local one (file:// included)."""
  m = _SCHEME.match(os.fspath(path))
  if m is None or m.group(1).lower() == "file":
    return None
  return m.group(1).lower()


def is_remote(path) -> bool:
  return scheme(path) is not None


def bucket(path) -> str:
  """'gs://bkt' of 'gs://bkt/a/b'."""
  path = os.fspath(path)
  s = scheme(path)
  return f"{s}://{path.split('://', 1)[1].split('/', 1)[0]}"


@functools.lru_cache(maxsize=None)
def filesystem(name: str):
  """The fsspec file system of a scheme, listings uncached (another host's writes are seen at once)."""
  try:
    import fsspec
    options = {"use_listings_cache": False}
    if name in ("gs", "gcs") and os.environ.get("STORAGE_EMULATOR_HOST"):
      options["token"] = "anon"  # an emulator takes no credentials
    return fsspec.filesystem(name, **options)
  except (ImportError, ValueError) as e:
    extra = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs"}.get(name)
    hint = f" (pip install {extra}, or bash launch/setup.sh tpu)" if extra else ""
    raise errors.DataPathError(f"{name}:// paths need a filesystem driver{hint}: {errors.one_line(e)}") from None


def forget_listings() -> None:
  """Drops the listings every fsspec file system of a remote scheme holds (etils.epath's, which orbax lists
  checkpoints through, caches them): after bertjax moves or deletes objects, the next listing reads the store."""
  import sys
  fsspec = sys.modules.get("fsspec")
  if fsspec is None:
    return
  for name in ("gs", "gcs", "s3"):
    try:
      cls = fsspec.get_filesystem_class(name)
    except (ImportError, ValueError):
      continue
    for instance in list(getattr(cls, "_cache", {}).values()):
      instance.invalidate_cache()


def store_of(path):
  """The fsspec file system of a remote path."""
  return filesystem(scheme(path))


_reached: set[str] = set()


def reach(path) -> None:
  """Checks, within BERTJAX_REMOTE_TIMEOUT_S, that the store of a remote path answers and its bucket exists; a
  local path passes. Every tool calls it before its first remote read or write, so that a wrong endpoint, a
  missing bucket or missing credentials are one line, not minutes of retries."""
  if not is_remote(path):
    return
  root = bucket(path)
  if root in _reached:
    return
  timeout = float(os.environ.get("BERTJAX_REMOTE_TIMEOUT_S", "30"))
  box: dict = {}

  def probe():
    try:
      box["found"] = store_of(root).exists(root)
    except BaseException as e:  # handed to the caller's thread
      box["error"] = e

  worker = threading.Thread(target=probe, daemon=True)  # a daemon: never holds up the exit
  worker.start()
  worker.join(timeout)
  if worker.is_alive():
    raise errors.DataPathError(f"{root}: no answer within {timeout:.0f}s (BERTJAX_REMOTE_TIMEOUT_S); check the "
                               "endpoint, the network and the credentials")
  if "error" in box:
    raise remote_error(box["error"], root) from None
  if not box["found"]:
    raise errors.DataPathError(f"{root}: the bucket does not exist (or these credentials cannot see it)")
  _reached.add(root)


def remote_error(e: BaseException, path: str) -> OSError:
  """A store's failure as one line naming the path."""
  if isinstance(e, errors.Error):
    return e
  if isinstance(e, FileNotFoundError):
    return FileNotFoundError(f"{path}: not found")
  text = errors.one_line(e)
  low = text.lower()
  if any(w in low for w in ("401", "403", "credential", "unauthori", "forbidden", "access denied", "token")):
    return errors.DataPathError(f"{path}: the store refused these credentials ({text[:200]})")
  if any(w in low for w in ("connect", "timeout", "timed out", "name or service", "unreachable", "refused")):
    return errors.DataPathError(f"{path}: cannot reach the store ({text[:200]}); check the endpoint and the network")
  return errors.DataPathError(f"{path}: {type(e).__name__}: {text[:200]}")


@contextlib.contextmanager
def translated(path):
  """Translates a store's exceptions into one-line errors naming `path`."""
  try:
    yield
  except (errors.Error, FileExistsError, IsADirectoryError, NotADirectoryError):
    raise
  except Exception as e:
    raise remote_error(e, os.fspath(path)) from None
