"""Pre-training example creation as an Apache Beam pipeline (DirectRunner locally, Dataflow/Flink/Spark at scale).

The same shards as the local worker path (`generation.write_shards`), made in parallel by Beam:

  shards --Read (one shard per element)--> (shard, document index in shard, sentences)
         --document counts per shard--> global document index (shards in the order given, as the local path reads them)
         --held-out split, buffer index (local index // buffer_documents)--> GroupByKey per buffer
         --tokenize + create_instances with buffer_rng(seed, buffer), write the buffer's shard--> shard record

Each worker writes the shards it makes straight into the data dir (a bucket at scale: no worker needs another's
disk, so any runner works), holding one shard on its local disk at a time; buffers whose shard an earlier,
interrupted run finished are left out before any work. Parallelism is per corpus shard when reading (a corpus at
scale comes in many shards) and per buffer of documents when tokenizing, making and writing examples.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

import apache_beam as beam

from bertjax import errors
from bertjax.core import files
from bertjax.data import vocab_files
from bertjax.data.pretraining import corpus as corpus_lib
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import generation

NAMESPACE = "bertjax"


def tokenizer_bundle(path: str) -> dict:
  """The tokenizer's files by name (`tokenizer.files`), so workers that cannot see the submitting machine's disk
  load the same tokenizer."""
  bundle = {files.basename(f): files.read_bytes(f) for f in vocab_files.files(path)}
  return {"main": files.basename(path), "files": bundle}


class ReadShard(beam.DoFn):
  """One shard -> (shard index, document index within the shard, sentences); its corpus counters as Beam metrics."""

  def __init__(self, read_opts: corpus_lib.ReadOptions, tfds_data_dir: str | None):
    self._opts = read_opts
    self._tfds_data_dir = tfds_data_dir

  def process(self, element):
    shard_index, path = element
    stats = corpus_lib.CorpusStats()
    for i, doc in enumerate(corpus_lib.read_shard(path, self._opts, stats, self._tfds_data_dir)):
      yield shard_index, i, doc
    for f in dataclasses.fields(stats):
      if getattr(stats, f.name):
        beam.metrics.Metrics.counter(NAMESPACE, f"corpus.{f.name}").inc(getattr(stats, f.name))


class WriteShards(beam.DoFn):
  """(buffer index, [(position, document)]) -> the buffer's shard written into the data dir, exactly as one buffer
  of the local path; yields (split, buffer index, examples)."""

  def __init__(self, bundle: dict, do_lower_case: bool, opts: pretraining.CreationOptions, split: str,
               data_dir: str):
    self._bundle, self._lower, self._opts, self._split, self._data_dir = bundle, do_lower_case, opts, split, data_dir

  def setup(self):
    self._dir = tempfile.mkdtemp(prefix="bertjax-tok-")
    for name, data in self._bundle["files"].items():
      with open(os.path.join(self._dir, name), "wb") as f:
        f.write(data)
    generation.init_worker(os.path.join(self._dir, self._bundle["main"]), self._lower)

  def process(self, element):
    buffer_index, items = element
    documents = [doc for _, doc in sorted(items, key=lambda item: item[0])]
    record = generation.write_buffer((buffer_index, documents, self._opts, self._data_dir, self._split))
    beam.metrics.Metrics.counter(NAMESPACE, f"{self._split}.examples").inc(record["examples"])
    beam.metrics.Metrics.counter(NAMESPACE, f"{self._split}.untokenizable_documents").inc(record["empty_documents"])
    yield self._split, buffer_index, record["examples"]


def _offsets(counts: dict, num_shards: int) -> dict:
  out, total = {}, 0
  for s in range(num_shards):
    out[s] = total
    total += counts.get(s, 0)
  return out


def _to_buffer(item, offsets, heldout_every: int, heldout: bool, buffer_documents: int, done: frozenset):
  """(global index, doc) -> (buffer, (position, doc)) for the documents of this split, numbered as
  `generation.split_documents` numbers them; none for a buffer in `done` (its shard is written)."""
  shard, i, doc = item
  g = offsets[shard] + i
  is_heldout = heldout_every > 0 and g % heldout_every == heldout_every - 1
  if is_heldout != heldout:
    return
  local = g // heldout_every if heldout else (g - g // heldout_every if heldout_every > 0 else g)
  if local // buffer_documents not in done:
    yield local // buffer_documents, (local % buffer_documents, doc)


def build(pipeline, creation: dict, data_dir: str, splits, done: dict) -> None:
  """Adds the dataset's steps to `pipeline`: every split's shards but those in `done` {split: [buffer]} written
  into `data_dir` (the creation record `dataset.create` writes names the rest)."""
  c = creation
  opts = pretraining.CreationOptions(**c["options"])
  read_opts = corpus_lib.ReadOptions(**c["reader"])
  shards = list(enumerate(c["input"]))
  bundle = tokenizer_bundle(c["tokenizer"])
  docs = (pipeline
          | "Shards" >> beam.Create(shards)
          | "SpreadShards" >> beam.Reshuffle()
          | "ReadShards" >> beam.ParDo(ReadShard(read_opts, c["tfds_data_dir"])))
  offsets = (docs
             | "ShardOf" >> beam.Map(lambda d: (d[0], 1))
             | "CountPerShard" >> beam.CombinePerKey(sum)
             | "Counts" >> beam.combiners.ToDict()
             | "Offsets" >> beam.Map(_offsets, len(shards)))
  for split in splits:
    heldout = split == "validation"
    (docs
     | f"{split}:Buffer" >> beam.FlatMap(_to_buffer, beam.pvalue.AsSingleton(offsets), c["heldout_every"], heldout,
                                         opts.buffer_documents, frozenset(done.get(split, ())))
     | f"{split}:GroupBuffers" >> beam.GroupByKey()
     | f"{split}:WriteShards" >> beam.ParDo(WriteShards(bundle, c["do_lower_case"], opts, split, data_dir)))


def run(creation: dict, data_dir: str, splits, done: dict, runner: str, options) -> dict[str, int]:
  """Runs the pipeline on `runner` with Beam's `options` until it ends; its counters by name."""
  try:
    pipeline = beam.Pipeline(runner=runner, options=options)
  except ValueError as e:  # the runner's own check of its options (Dataflow: project, region, temp_location, ...)
    if "validation" not in str(e):
      raise
    missing = "; ".join(line.strip() for line in str(e).splitlines()[1:] if line.strip())
    raise errors.ConfigError(f"--beam_runner {runner}: {missing} (pass them in --beam_options)") from None
  build(pipeline, creation, data_dir, splits, done)
  result = pipeline.run()
  result.wait_until_finish()
  return metrics(result)


def metrics(result) -> dict[str, int]:
  """The pipeline's counters by name (committed values where the runner has them)."""
  out = {}
  for counter in result.metrics().query(beam.metrics.MetricsFilter().with_namespace(NAMESPACE))["counters"]:
    value = counter.committed if counter.committed is not None else counter.attempted
    out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + int(value or 0)
  return out


def pipeline_options(runner: str):
  """Beam's pipeline_options module, once `runner` is a runner Beam knows (its message names them)."""
  from apache_beam.options import pipeline_options as options
  from apache_beam.runners import runner as runners
  try:
    runners.create_runner(runner)
  except ValueError as e:
    raise errors.ConfigError(f"--beam_runner '{runner}': {str(e).splitlines()[0]}") from None
  return options
