"""The pre-training dataset's shards: each written where its examples are made, straight into the data dir (a
local folder or a bucket), and read back by random access, through a bounded local cache when remote.

Layout, tensorflow-datasets' array_record layout (so `tfds.data_source` reads it too):
  DATA/bert_pretraining/1.0.0/bert_pretraining-{split}.array_record-{b:05d}   the examples of document buffer b
  DATA/bert_pretraining/1.0.0/dataset_info.json, features.json                 the splits' shard lengths, last
  DATA/bert_pretraining/1.0.0/.built/{split}-{b:05d}.json                      a finished shard's counts (build state)

One shard per buffer of `buffer_documents` documents: a buffer is the unit every worker (a local process or a Beam
worker) makes independently from its own seeded generator, so a worker writes its shard as soon as it has made it
and holds one shard on local disk at a time (array_record writes local files only: the shard is written into a
temporary file, then moved or uploaded whole and deleted). A shard's record is written after the shard, so a rerun
of an interrupted build keeps every shard that has one and makes only the rest.
"""
from __future__ import annotations

import bisect
import json
import os
import tempfile
import threading

import numpy as np
import tensorflow_datasets as tfds
from array_record.python import array_record_module

from bertjax import errors
from bertjax.core import cache as cache_lib
from bertjax.core import files

NAME = "bert_pretraining"
VERSION = "1.0.0"
TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"
BUILT = ".built"
WRITER_OPTIONS = "group_size:1"  # one record per chunk: random access reads one chunk (tfds and grain write this)


def features(max_seq_length: int, max_predictions_per_seq: int) -> tfds.features.FeaturesDict:
  """The examples' features, with google-research/bert's names."""
  seq = lambda d: tfds.features.Tensor(shape=(max_seq_length,), dtype=d)  # noqa: E731
  pred = lambda d: tfds.features.Tensor(shape=(max_predictions_per_seq,), dtype=d)  # noqa: E731
  return tfds.features.FeaturesDict({
      "input_ids": seq(np.int32), "input_mask": seq(np.int32), "segment_ids": seq(np.int32),
      "masked_lm_positions": pred(np.int32), "masked_lm_ids": pred(np.int32), "masked_lm_weights": pred(np.float32),
      "next_sentence_labels": tfds.features.Tensor(shape=(), dtype=np.int32)})


def version_dir(data_dir: str) -> str:
  return files.join(os.fspath(data_dir), NAME, VERSION)


def shard_name(split: str, index: int) -> str:
  return f"{NAME}-{split}.array_record-{index:05d}"


# ----------------------------------------------------------------------------------------------- writing
class ShardWriter:
  """Writes buffers' examples as shards into a data dir's version folder (local or remote), one at a time."""

  def __init__(self, data_dir: str, max_seq_length: int, max_predictions_per_seq: int):
    self.folder = version_dir(data_dir)
    self._features = features(max_seq_length, max_predictions_per_seq)

  def record_path(self, split: str, index: int) -> str:
    return files.join(self.folder, BUILT, f"{split}-{index:05d}.json")

  def _serialize(self, example: dict) -> bytes:
    """tfds's tf.train.Example bytes, with the feature map in a fixed order: a protobuf map's own order differs
    from process to process, and the shards of two builds (or of two Beam workers) must be the same bytes."""
    proto = self._features._example_serializer.get_tf_example(self._features.encode_example(example))  # noqa: SLF001
    return proto.SerializeToString(deterministic=True)

  def done(self, split: str, index: int) -> dict | None:
    """A finished shard's record ({"examples", "bytes", "empty_documents"}), or None when it is to be made."""
    path = self.record_path(split, index)
    if not files.exists(path):
      return None
    try:
      record = json.loads(files.read_bytes(path))
    except (ValueError, OSError):
      return None
    return record if files.exists(files.join(self.folder, shard_name(split, index))) else None

  def write(self, split: str, index: int, feats: list[dict], empty_documents: int = 0) -> dict:
    target = files.join(self.folder, shard_name(split, index))
    remote = files.is_remote(self.folder)
    if remote:  # staged in a folder of this worker's own, one shard at a time
      local = os.path.join(tempfile.mkdtemp(prefix="bertjax-shard-"), shard_name(split, index))
    else:
      files.makedirs(self.folder)
      local = f"{target}.tmp-{os.getpid()}"
    writer = array_record_module.ArrayRecordWriter(local, WRITER_OPTIONS)
    try:
      for f in feats:
        writer.write(self._serialize(f))
    finally:
      writer.close()
    nbytes = os.path.getsize(local)
    try:
      if remote:
        files.copy(local, target)
      else:
        files.rename(local, target)
    finally:
      if os.path.exists(local):
        os.remove(local)
      if remote:
        os.rmdir(os.path.dirname(local))
    record = {"examples": len(feats), "bytes": nbytes, "empty_documents": int(empty_documents)}
    files.makedirs(files.parent(self.record_path(split, index)))
    files.write_whole(self.record_path(split, index), json.dumps(record))
    return record


def built_records(data_dir: str) -> dict[str, dict[int, dict]]:
  """{split: {shard index: record}} of every finished shard in a data dir (the build state a rerun keeps)."""
  folder = files.join(version_dir(data_dir), BUILT)
  out: dict[str, dict[int, dict]] = {}
  if not files.isdir(folder):
    return out
  for name in files.listdir(folder):
    split, _, rest = name.rpartition("-")
    if not rest.endswith(".json") or not rest[:-5].isdigit():
      continue
    try:
      out.setdefault(split, {})[int(rest[:-5])] = json.loads(files.read_bytes(files.join(folder, name)))
    except (ValueError, OSError):
      continue
  return out


def write_info(data_dir: str, max_seq_length: int, max_predictions_per_seq: int,
               splits: dict[str, list[dict]]) -> None:
  """dataset_info.json and features.json (tfds's own files, by tfds) for `splits` {name: [shard records]} whose
  shard i is `shard_name(name, i)`; written when every shard is."""
  with tempfile.TemporaryDirectory(prefix="bertjax-info-") as tmp:
    info = tfds.core.DatasetInfo(
        builder=tfds.core.DatasetIdentity(name=NAME, version=tfds.core.Version(VERSION), data_dir=tmp,
                                          module_name=__name__),
        features=features(max_seq_length, max_predictions_per_seq),
        description="BERT pre-training examples (MLM + NSP), google-research/bert's features.")
    info.set_file_format("array_record")
    infos = []
    for name, records in splits.items():
      template = tfds.core.ShardedFileTemplate(data_dir=tfds.core.Path(tmp), template=TEMPLATE, dataset_name=NAME,
                                               split=name, filetype_suffix="array_record")
      infos.append(tfds.core.SplitInfo(name=name, shard_lengths=[r["examples"] for r in records],
                                       num_bytes=sum(r["bytes"] for r in records), filename_template=template))
    info.set_splits(tfds.core.SplitDict(infos))
    info.write_to_directory(tmp)
    for name in ("features.json", "dataset_info.json"):  # dataset_info.json last: a reader that finds it is done
      files.write_whole(files.join(version_dir(data_dir), name), files.read_bytes(os.path.join(tmp, name)))


# ----------------------------------------------------------------------------------------------- reading
def split_shards(data_dir: str, split: str) -> list[tuple[str, int, int]]:
  """[(path, examples, bytes)] of a split's shards, from dataset_info.json (this layout and tfds's default one)."""
  folder = version_dir(data_dir)
  path = files.join(folder, "dataset_info.json")
  try:
    info = json.loads(files.read_bytes(path))
  except FileNotFoundError:
    raise errors.DataPathError(f"{data_dir}: no {NAME}/{VERSION}/dataset_info.json (the build did not finish); "
                               "rerun python -m bertjax dataset") from None
  except ValueError as e:
    raise errors.DataPathError(f"{path}: not valid JSON ({e}); rebuild the data with --overwrite") from None
  for s in info.get("splits", []):
    if s["name"] != split:
      continue
    lengths = [int(n) for n in s.get("shardLengths", [])]
    template = tfds.core.ShardedFileTemplate(
        data_dir=tfds.core.Path("/"), template=s.get("filepathTemplate") or tfds.core.naming.DEFAULT_FILENAME_TEMPLATE,
        dataset_name=NAME, split=split, filetype_suffix=info.get("fileFormat", "array_record"))
    names = [os.path.basename(os.fspath(p)) for p in template.sharded_filepaths(len(lengths))]
    paths = [files.join(folder, n) for n in names]
    if not files.is_remote(folder):
      return [(p, n, 0) for p, n in zip(paths, lengths)]
    listed = files.sizes(folder)
    absent = [n for n in names if n not in listed]
    if absent:
      raise errors.DataPathError(f"{folder}: shard {absent[0]} is missing ({len(absent)} of {len(names)}); rebuild "
                                 "the data")
    return [(p, n, listed[name]) for p, n, name in zip(paths, lengths, names)]
  known = ", ".join(s["name"] for s in info.get("splits", []))
  raise errors.DataError(f"{data_dir}: no split {split!r} (it has {known})")


class ShardedSource:
  """A split as a random-access source of feature dicts (numpy), read by array_record; a remote split's shards
  come through a `cache.Cache` bounded by `cache_limit` (bytes; see core/cache.py), never copied whole."""

  def __init__(self, data_dir: str, split: str, max_seq_length: int, max_predictions_per_seq: int,
               cache_limit: int | str | None = None):
    self.data_dir, self.split = os.fspath(data_dir), split
    shards = split_shards(self.data_dir, split)
    self.paths = [p for p, _, _ in shards]
    self.shard_lengths = [n for _, n, _ in shards]
    self.shard_bytes = [b for _, _, b in shards]
    self._starts = np.concatenate([[0], np.cumsum(self.shard_lengths)]).astype(np.int64).tolist()
    self._features = features(max_seq_length, max_predictions_per_seq)
    self._readers: dict[str, array_record_module.ArrayRecordReader] = {}
    self._lock = threading.Lock()
    self.cache = None
    if files.is_remote(self.data_dir):
      limit = cache_lib.limit_of(cache_limit)
      self.cache = cache_lib.shared(limit)
      self.cache.on_evict(self._closed)
      biggest = max(self.shard_bytes, default=0)
      if biggest > limit:
        raise cache_lib.CacheError(f"{self.data_dir}: a {split} shard of {cache_lib.human(biggest)} is larger than "
                                   f"the local cache limit {cache_lib.human(limit)} ({cache_lib.ENV} or "
                                   "data.cache_limit); raise the limit or rebuild with a smaller buffer_documents")

  def __len__(self) -> int:
    return self._starts[-1]

  @property
  def nbytes(self) -> int:
    return sum(self.shard_bytes)

  def shard_of(self, index: int) -> tuple[int, int]:
    """(shard, position in it) of example `index`."""
    s = bisect.bisect_right(self._starts, index) - 1
    return s, index - self._starts[s]

  def __getitem__(self, index: int) -> dict:
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f"example {index} of a split of {len(self)}")
    s, k = self.shard_of(index)
    if self.cache is None:
      raw = self._reader(s, self.paths[s]).read([k])[0]
    else:
      with self.cache.use(self.paths[s], self.shard_bytes[s]) as local:
        raw = self._reader(s, local).read([k])[0]
    return self._features.deserialize_example_np(raw)

  def prefetch(self, shards) -> None:
    """Starts fetching these shards into the cache (remote splits; nothing for local ones)."""
    if self.cache is not None:
      self.cache.prefetch((self.paths[s], self.shard_bytes[s]) for s in shards)

  def _reader(self, s: int, local: str):
    with self._lock:
      reader = self._readers.get(self.paths[s])
      if reader is None:
        reader = array_record_module.ArrayRecordReader(local, "readahead_buffer_size:0")
        self._readers[self.paths[s]] = reader
      return reader

  def _closed(self, remote: str) -> None:
    """The cache evicts `remote`'s copy: its reader goes first (it is not pinned, so not being read)."""
    with self._lock:
      reader = self._readers.pop(remote, None)
      if reader is not None:
        reader.close()

  def close(self) -> None:
    """Closes this source's files (the process's cache stays, for its other readers)."""
    with self._lock:
      for r in self._readers.values():
        r.close()
      self._readers.clear()

