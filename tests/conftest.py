"""Tests run on 8 fake CPU devices; the flags must be set before jax initialises."""
import atexit
import os
import shutil
import tempfile

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One persistent XLA compilation cache per test session, inherited by the subprocesses the tests start: the same
# small programs compile once instead of in every restarted or second process (chaos restarts, multi-host pairs).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bertjax-xla-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import jax  # noqa: E402

jax.config.update("jax_threefry_partitionable", True)

import random  # noqa: E402

import pytest  # noqa: E402

# Under CI=true a skip for a missing package fails, whether a test or a module's collection skipped
from skip_guard import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402, F401


@pytest.fixture(scope="session")
def make_vocab(tmp_path_factory):
  """make_vocab(words, vocab_size) -> path of a WordPiece vocab.txt trained on random lines of `words`."""
  def make(words, vocab_size, lines=400, words_per_line=12, seed=0):
    from bertjax.data import tokenizer
    d = tmp_path_factory.mktemp("vocab")
    rng = random.Random(seed)
    text = "\n".join(" ".join(rng.choice(words) for _ in range(words_per_line)) for _ in range(lines))
    (d / "t.txt").write_text(text)
    return tokenizer.train([d / "t.txt"], d / "tok", vocab_size=vocab_size)
  return make


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """A tiny pre-training data_dir (seq 32, 5 predictions, vocab 128): helpers.make_pretraining_data."""
  import helpers
  return helpers.make_pretraining_data(tmp_path_factory.mktemp("train_data"))


@pytest.fixture(scope="session")
def gcs_server():
  """fake-gcs-server for this test process, its variables set here (for in-process tools) and in `.env()` (for
  subprocesses)."""
  import object_store
  server = object_store.FakeGcs()
  os.environ.update(server.env())
  yield server
  server.stop()


@pytest.fixture
def bucket(gcs_server):
  """A new empty bucket on the emulator: 'gs://NAME'."""
  return gcs_server.bucket()
