"""Data at pod scale, against a real GCS emulator (fake-gcs-server): shards written straight into the bucket by the
workers that make them (local processes or Beam's out-of-process workers, each with a bounded local disk), an
interrupted build continued, and a bucket's data read through a bounded local cache in the same order as from
local disk: windows of shards (order.py), prefetched, the cache's high-water mark under its limit."""
import os

import grain
import helpers
import jax
import numpy as np
import pytest

from bertjax import errors
from bertjax.core import cache as cache_lib
from bertjax.core import files
from bertjax.data import tokenizer
from bertjax.data.pretraining import dataset, order, store
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline

# Small buffers: one shard per 6 documents, so a tiny corpus makes a dataset of many shards.
OPTS = pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2, buffer_documents=6)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  d = tmp_path_factory.mktemp("pod")
  rng = np.random.default_rng(1)
  words = ("the model reads text and predicts masked words from both sides of each sentence while a second "
           "head guesses whether two segments follow each other").split()
  docs = ["\n".join(" ".join(rng.choice(words, rng.integers(5, 14))).capitalize() + "."
                    for _ in range(rng.integers(2, 9))) for _ in range(120)]
  (d / "corpus.txt").write_text("\n\n".join(docs))
  vocab = tokenizer.train([d / "corpus.txt"], d / "tok", vocab_size=128)
  dataset.create([d / "corpus.txt"], vocab, d / "data", OPTS, heldout_every=8)
  return d, vocab


def _shard_bytes(data_dir: str) -> dict:
  folder = store.version_dir(data_dir)
  return {n: files.read_bytes(files.join(folder, n)) for n in files.listdir(folder) if ".array_record-" in n}


# ---------------------------------------------------------------------------------------------- writing
def test_local_workers_write_each_shard_into_the_bucket_as_they_make_it(corpus, bucket, tmp_path, monkeypatch):
  """Two local processes build into the bucket; each holds at most one shard on local disk at a time (the old
  path staged the whole dataset in one local folder), and the bucket's shards are the local build's bytes."""
  d, vocab = corpus
  staging = tmp_path / "tmp"
  staging.mkdir()
  monkeypatch.setenv("TMPDIR", str(staging))  # the worker processes stage their shards under it
  with helpers.DiskWatch(staging) as watch:
    rec = dataset.create([d / "corpus.txt"], vocab, f"{bucket}/data", OPTS, heldout_every=8, workers=2)
  local = _shard_bytes(str(d / "data"))
  assert _shard_bytes(f"{bucket}/data") == local and len(local) >= 15
  biggest = max(len(b) for b in local.values())
  assert watch.seen and 0 < watch.most_one <= biggest and watch.most_all <= 2 * biggest
  assert rec["report"]["train"]["shards"] == len([n for n in local if "-train." in n])


def test_an_interrupted_build_is_continued_and_only_the_missing_shards_are_made(corpus, bucket, monkeypatch):
  d, vocab = corpus
  out = f"{bucket}/cut"
  real, written = store.ShardWriter.write, []

  def dies_after_five(self, split, index, feats, empty=0):
    if len(written) == 5:
      raise OSError(28, "No space left on device")
    written.append((split, index))
    return real(self, split, index, feats, empty)

  monkeypatch.setattr(store.ShardWriter, "write", dies_after_five)
  with pytest.raises(errors.DataPathError, match="shards written so far are kept"):
    dataset.create([d / "corpus.txt"], vocab, out, OPTS, heldout_every=8)
  assert not files.exists(f"{out}/creation.json") and not files.exists(f"{store.version_dir(out)}/dataset_info.json")
  with pytest.raises(FileNotFoundError, match="build did not finish; rerun the same dataset command"):
    dataset.load_source(out, "train")
  first = list(written)
  written.clear()
  monkeypatch.setattr(store.ShardWriter, "write", lambda self, *a: written.append(a[:2]) or real(self, *a))
  dataset.create([d / "corpus.txt"], vocab, out, OPTS, heldout_every=8)
  assert not set(first) & set(written) and len(first) + len(written) == len(_shard_bytes(str(d / "data")))
  assert _shard_bytes(out) == _shard_bytes(str(d / "data"))
  # Other settings never continue another build's shards: a different dupe_factor starts afresh.
  written.clear()
  files.remove(f"{out}/creation.json")
  other = pretraining.CreationOptions(**{**OPTS.__dict__, "dupe_factor": 1})
  dataset.create([d / "corpus.txt"], vocab, out, other, heldout_every=8)
  assert len(written) == len(_shard_bytes(out))


@pytest.mark.slow
def test_beam_workers_in_other_processes_write_the_bucket_and_equal_the_local_build(corpus, bucket, tmp_path,
                                                                                      monkeypatch):
  """DirectRunner in multi-processing mode: Beam's SDK workers are other processes with their own temporary
  folders and no shared output folder; each stages one shard at a time and writes it into the bucket."""
  pytest.importorskip("apache_beam")
  d, vocab = corpus
  corpus_gs = f"{bucket}/in/corpus.txt"
  files.copy(str(d / "corpus.txt"), corpus_gs)
  staging = tmp_path / "tmp"
  staging.mkdir()
  monkeypatch.setenv("TMPDIR", str(staging))
  with helpers.DiskWatch(staging) as watch:
    rec = dataset.create([corpus_gs], vocab, f"{bucket}/beam", OPTS, heldout_every=8, workers=2,
                         beam_runner="DirectRunner")
  assert "--direct_running_mode=multi_processing" in rec["beam_options"]
  local = _shard_bytes(str(d / "data"))
  assert _shard_bytes(f"{bucket}/beam") == local
  biggest = max(len(b) for b in local.values())
  # Each worker's folder held one shard at most (a folder of the tokenizer files a worker unpacks is its own);
  # all together a few shards' worth, with Beam's own temporary files: the dataset has len(local) shards.
  assert watch.seen and watch.most_one <= biggest and watch.most_all <= 3 * biggest < len(local) * biggest / 4
  for split in ("train", "validation"):
    a, b = dataset.load_source(str(d / "data"), split), dataset.load_source(f"{bucket}/beam", split)
    assert len(a) == len(b) == rec["report"][split]["examples"] > 0


# ---------------------------------------------------------------------------------------------- the order
def test_a_window_covering_every_shard_is_the_whole_split_shuffle(corpus):
  """window 0 (the default) and a window of every shard read grain's index shuffle of the split, unchanged."""
  d, _ = corpus
  src = dataset.load_source(str(d / "data"), "train")
  want = grain.MapDataset.source(list(range(len(src)))).shuffle(seed=5)
  for window in (0, len(src.shard_lengths), 10 * len(src.shard_lengths)):
    got = order.shuffled(list(range(len(src))) if window == 0 else _Indices(src), 5, window)
    assert [got[g] for g in range(3 * len(src))] == [want[g] for g in range(3 * len(src))]


class _Indices:
  """A source whose examples are their own indices, with a real split's shard lengths."""

  def __init__(self, src):
    self.shard_lengths = src.shard_lengths

  def __len__(self):
    return sum(self.shard_lengths)

  def __getitem__(self, i):
    return i


def test_windows_of_shards_permute_every_epoch_and_read_only_their_window(corpus):
  d, _ = corpus
  src = dataset.load_source(str(d / "data"), "train")
  lengths = np.asarray(src.shard_lengths)
  shard_of = np.repeat(np.arange(len(lengths)), lengths)
  n, w = len(src), 3
  o = order.shuffled(_Indices(src), 7, w)
  epochs = [[o[g] for g in range(e * n, (e + 1) * n)] for e in range(3)]
  for e in epochs:
    assert sorted(e) == list(range(n))  # every example once an epoch
  assert epochs[0] != epochs[1] != epochs[2]
  # Consecutive stream positions come from one window of at most w shards until the window is used up.
  e0 = np.asarray(epochs[0])
  boundaries = np.cumsum([sum(lengths[s] for s in win) for win in _windows(o, 0)])
  for a, b in zip(np.concatenate([[0], boundaries[:-1]]), boundaries):
    assert len(set(shard_of[e0[a:b]])) <= w
  # Same seed, same order; another seed, another.
  assert [order.shuffled(_Indices(src), 7, w)[g] for g in range(n)] == epochs[0]
  assert [order.shuffled(_Indices(src), 8, w)[g] for g in range(n)] != epochs[0]


def _windows(o, epoch):
  return o._epoch(epoch)[0]  # noqa: SLF001


# ---------------------------------------------------------------------------------------------- the cache
def test_cache_sizes_and_limits_are_one_line_errors(monkeypatch):
  assert cache_lib.parse_size("4G") == 4 << 30 and cache_lib.parse_size("512m") == 512 << 20
  assert cache_lib.parse_size("1.5K") == 1536 and cache_lib.parse_size("1000") == 1000
  for bad in ("", "-1G", "four", "4X", "0"):
    with pytest.raises(errors.ConfigError, match="BERTJAX_CACHE_LIMIT"):
      cache_lib.parse_size(bad)
  monkeypatch.setenv("BERTJAX_CACHE_LIMIT", "3M")
  assert cache_lib.limit_of() == 3 << 20 and cache_lib.limit_of("2K") == 2048
  monkeypatch.delenv("BERTJAX_CACHE_LIMIT")
  assert cache_lib.limit_of() == cache_lib.DEFAULT_LIMIT


def test_a_bucket_read_through_the_cache_equals_local_data_and_stays_under_its_limit(corpus, bucket, tmp_path,
                                                                                      monkeypatch):
  """A bucket's split 4x the cache limit, read in windows of 2 shards over two epochs: the same batches as from
  local disk, and the cache folder (watched from outside) never above the limit."""
  d, _ = corpus
  files.copy(str(d / "data"), f"{bucket}/data")
  here = dataset.load_source(str(d / "data"), "train")
  total = sum(os.path.getsize(p) for p in here.paths)
  limit = total // 4
  assert limit >= 4 * max(os.path.getsize(p) for p in here.paths)  # two windows of 2 shards fit
  monkeypatch.setenv("BERTJAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("BERTJAX_CACHE_LIMIT", str(limit))
  there = dataset.load_source(f"{bucket}/data", "train")
  steps = 2 * len(here) // 8 + 1
  with helpers.DiskWatch(tmp_path / "cache") as watch:
    a = input_pipeline.Pipeline(here, 8, seed=3, prefetch=0, window=2)
    b = input_pipeline.Pipeline(there, 8, seed=3, prefetch=2, window=2)
    for _ in range(steps):
      x, y = next(a), next(b)
      for k in x:
        np.testing.assert_array_equal(x[k], y[k])
    b.close()
  assert watch.seen and 0 < watch.most_all <= limit
  assert there.cache.high_water <= limit and there.cache.downloads > len(there.paths)  # shards came and went
  # A window the cache cannot hold, or the whole split without windows, is refused before any read.
  with pytest.raises(cache_lib.CacheError, match=r"data.shuffle_window=\d+ needs up to"):
    input_pipeline.Pipeline(there, 8, seed=3, window=len(there.paths) - 1)
  with pytest.raises(cache_lib.CacheError, match="larger than the local cache limit"):
    input_pipeline.Pipeline(there, 8, seed=3, window=0)
  with pytest.raises(errors.ConfigError, match=r"data.shuffle_window=-1: .* >= 0"):
    input_pipeline.Pipeline(here, 8, seed=3, window=-1)


@pytest.mark.slow
def test_pretraining_from_a_bucket_four_times_the_cache_equals_local_data(corpus, bucket, tmp_path, monkeypatch):
  """The real training loop on a bucket's data 4x the cache limit: parameters bitwise those of the same run on
  local data."""
  from bertjax.pretrain import loop as train
  d, _ = corpus
  files.copy(str(d / "data"), f"{bucket}/data")
  total = sum(len(b) for b in _shard_bytes(str(d / "data")).values())
  runs = {}
  for name, data in (("local", str(d / "data")), ("bucket", f"{bucket}/data")):
    c = helpers.small_config(data)
    c.data.shuffle_window = 2
    c.data.cache_limit = str(total // 4)
    c.train.num_steps = 12  # more than an epoch's worth of windows
    monkeypatch.setenv("BERTJAX_CACHE", str(tmp_path / f"cache-{name}"))
    with helpers.DiskWatch(tmp_path / f"cache-{name}") as watch:
      runs[name] = train.train_and_evaluate(c, str(tmp_path / name))
    if name == "bucket":
      assert watch.seen and watch.most_all <= total // 4
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         runs["local"]["state"].params, runs["bucket"]["state"].params)
