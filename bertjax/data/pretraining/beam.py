"""Pre-training example creation as an Apache Beam pipeline (DirectRunner locally, Dataflow/Flink/Spark at scale).

The same examples as the local worker path (`generation.generate_examples`), made in parallel by Beam:

  shards --Read (one shard per element)--> (shard, document index in shard, sentences)
         --document counts per shard--> global document index (shards in the order given, as the local path reads them)
         --held-out split, buffer index (local index // buffer_documents)--> GroupByKey per buffer
         --tokenize + create_instances with buffer_rng(seed, buffer)--> (key, features)

The keys equal the local path's (buffer << 32 | position in the buffer), and tensorflow-datasets orders the written
examples by a hash of the key, so both paths write the same examples in the same order to array_record shards
that `dataset.load_source` reads unchanged. Parallelism is per shard when reading (a corpus at scale comes in many
shards) and per buffer of documents when tokenizing and creating examples (the costly part).
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


class MakeExamples(beam.DoFn):
  """(buffer index, [(position, document)]) -> (key, features), exactly as one buffer of the local path."""

  def __init__(self, bundle: dict, do_lower_case: bool, opts: pretraining.CreationOptions, split: str):
    self._bundle, self._lower, self._opts, self._split = bundle, do_lower_case, opts, split

  def setup(self):
    self._dir = tempfile.mkdtemp(prefix="bertjax-tok-")
    for name, data in self._bundle["files"].items():
      with open(os.path.join(self._dir, name), "wb") as f:
        f.write(data)
    generation.init_worker(os.path.join(self._dir, self._bundle["main"]), self._lower)

  def process(self, element):
    buffer_index, items = element
    documents = [doc for _, doc in sorted(items, key=lambda item: item[0])]
    feats, empty = generation.process_buffer((buffer_index, documents, self._opts))
    beam.metrics.Metrics.counter(NAMESPACE, f"{self._split}.examples").inc(len(feats))
    beam.metrics.Metrics.counter(NAMESPACE, f"{self._split}.untokenizable_documents").inc(empty)
    for j, f in enumerate(feats):
      yield generation.example_key(buffer_index, j), f


def _offsets(counts: dict, num_shards: int) -> dict:
  out, total = {}, 0
  for s in range(num_shards):
    out[s] = total
    total += counts.get(s, 0)
  return out


def _to_buffer(item, offsets, heldout_every: int, heldout: bool, buffer_documents: int):
  """(global index, doc) -> (buffer, (position, doc)) for the documents of this split, numbered as
  `generation.split_documents` numbers them."""
  shard, i, doc = item
  g = offsets[shard] + i
  is_heldout = heldout_every > 0 and g % heldout_every == heldout_every - 1
  if is_heldout != heldout:
    return
  local = g // heldout_every if heldout else (g - g // heldout_every if heldout_every > 0 else g)
  yield local // buffer_documents, (local % buffer_documents, doc)


def split_collections(pipeline, creation: dict) -> dict:
  """{split: PCollection of (key, features)} for the creation record `dataset.create` writes."""
  c = creation
  opts = pretraining.CreationOptions(**c["options"])
  read_opts = corpus_lib.ReadOptions(**c.get("reader", {}))
  shards = list(enumerate(c["input"]))
  bundle = tokenizer_bundle(c["tokenizer"])
  docs = (pipeline
          | "Shards" >> beam.Create(shards)
          | "SpreadShards" >> beam.Reshuffle()
          | "ReadShards" >> beam.ParDo(ReadShard(read_opts, c.get("tfds_data_dir"))))
  offsets = (docs
             | "ShardOf" >> beam.Map(lambda d: (d[0], 1))
             | "CountPerShard" >> beam.CombinePerKey(sum)
             | "Counts" >> beam.combiners.ToDict()
             | "Offsets" >> beam.Map(_offsets, len(shards)))
  heldout_every = c.get("heldout_every", 20)
  splits = [("train", False)] + ([("validation", True)] if heldout_every > 0 else [])
  out = {}
  for split, heldout in splits:
    out[split] = (docs
                  | f"{split}:Buffer" >> beam.FlatMap(_to_buffer, beam.pvalue.AsSingleton(offsets), heldout_every,
                                                      heldout, opts.buffer_documents)
                  | f"{split}:GroupBuffers" >> beam.GroupByKey()
                  | f"{split}:Examples" >> beam.ParDo(MakeExamples(bundle, c.get("do_lower_case", True), opts,
                                                                   split)))
  return out


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
