"""Pre-training data as a tensorflow-datasets dataset in array_record format (readable without TensorFlow).

    python -m bertjax dataset --input corpus.txt --tokenizer vocab.txt --out DATA_DIR \
        --max_seq_length 128 --max_predictions_per_seq 20 --dupe_factor 5 --workers 2

writes DATA_DIR/bert_pretraining/1.0.0/ with splits `train` and `validation` (every `heldout_every`-th
document is held out), and `creation.json` with the options and tokenizer used.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from typing import Sequence

import numpy as np
import tensorflow_datasets as tfds

from bertjax import errors
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.pretraining import corpus as corpus_lib
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import generation

NAME = "bert_pretraining"


class BertPretraining(tfds.core.GeneratorBasedBuilder):
  """Masked-LM + NSP examples with the original BERT feature names."""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "create_pretraining_data.py semantics."}

  def __init__(self, *, max_seq_length: int = 128, max_predictions_per_seq: int = 20, creation: dict | None = None,
               **kwargs):
    self._max_seq_length = max_seq_length
    self._max_predictions = max_predictions_per_seq
    self._creation = creation or {}
    super().__init__(**kwargs)

  def _info(self):
    seq = lambda d: tfds.features.Tensor(shape=(self._max_seq_length,), dtype=d)  # noqa: E731
    pred = lambda d: tfds.features.Tensor(shape=(self._max_predictions,), dtype=d)  # noqa: E731
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "input_ids": seq(np.int32), "input_mask": seq(np.int32), "segment_ids": seq(np.int32),
            "masked_lm_positions": pred(np.int32), "masked_lm_ids": pred(np.int32),
            "masked_lm_weights": pred(np.float32),
            "next_sentence_labels": tfds.features.Tensor(shape=(), dtype=np.int32)}),
        description="BERT pre-training examples (MLM + NSP).")

  # The corpus is local and nothing is downloaded: tfds's "Downloading and preparing" lines would mislead; the
  # command prints its own progress and summary.
  def _log_download_bytes(self) -> None:
    pass

  def _log_download_done(self) -> None:
    pass

  def _split_generators(self, dl_manager):
    del dl_manager
    splits = {"train": self._generate_examples(heldout=False)}
    if self._creation.get("heldout_every", 20) > 0:
      splits["validation"] = self._generate_examples(heldout=True)
    return splits

  def _generate_examples(self, heldout: bool):
    c = self._creation
    stats = corpus_lib.CorpusStats()
    docs = corpus_lib.read_documents(c["input"], stats=stats, opts=reader_options(c),
                                     tfds_data_dir=c.get("tfds_data_dir"))
    docs = generation.split_documents(docs, c.get("heldout_every", 20), heldout)
    counts: dict = {}
    examples = generation.generate_keyed_examples(  # (the workers load a remote tokenizer's local copy)
        docs, tokenizer_lib.local_copy(c["tokenizer"]), pretraining.CreationOptions(**c["options"]),
        do_lower_case=c.get("do_lower_case", True), num_workers=c.get("workers", 1), stats=counts)
    split = "validation" if heldout else "train"
    start = last = time.time()
    for n, ((b, j), ex) in enumerate(examples, 1):
      yield generation.example_key(b, j), ex
      if PROGRESS["print"] and time.time() - last >= PROGRESS["every_s"]:
        last = time.time()
        print(f"{split}: {n:,} examples ({n / (last - start):,.0f}/s; {stats.documents:,} documents read)",
              flush=True)
    _report(c, split, counts.get("examples", 0), stats)
    if counts.get("examples", 0) == 0 and not heldout:
      raise corpus_lib.CorpusError(f"no training examples came out of {c['input'][:3]}: the corpus is empty or "
                                   "has no text that tokenizes")


PROGRESS = {"print": False, "every_s": 10.0}  # the command line turns progress lines on


class BertPretrainingBeam(BertPretraining, skip_registration=True):
  """The same dataset made by an Apache Beam pipeline (`bertjax.data.beam_pipeline`)."""
  name = NAME

  def _split_generators(self, dl_manager, pipeline):
    del dl_manager
    from bertjax.data.pretraining import beam as beam_pipeline
    return beam_pipeline.split_collections(pipeline, self._creation)

  def _process_pipeline_result(self, pipeline_result):
    from bertjax.data.pretraining import beam as beam_pipeline
    self._creation["beam_metrics"] = beam_pipeline.metrics(pipeline_result)


def reader_options(creation: dict) -> corpus_lib.ReadOptions:
  return corpus_lib.ReadOptions(**creation.get("reader", {"format": creation.get("format", "lines")}))


def _report(creation: dict, split: str, examples: int, stats: corpus_lib.CorpusStats) -> None:
  creation.setdefault("report", {})[split] = {"examples": examples, **dataclasses.asdict(stats),
                                              "warnings": stats.warnings()}
  for w in stats.warnings():
    logging.warning("%s split: %s", split, w)


def _beam_report(creation: dict, builder) -> None:
  m = creation.pop("beam_metrics", {})
  stats = corpus_lib.CorpusStats(**{f.name: m.get(f"corpus.{f.name}", 0) for f in dataclasses.fields(
      corpus_lib.CorpusStats)})
  for split, info in builder.info.splits.items():
    _report(creation, split, info.num_examples, stats)


def create(input_files, tokenizer_path: str, out_dir: str, opts: pretraining.CreationOptions, *,
           fmt: str | None = None, do_lower_case: bool = True, heldout_every: int = 20, workers: int = 1,
           overwrite: bool = False, reader: corpus_lib.ReadOptions | None = None, tfds_data_dir: str | None = None,
           beam_runner: str | None = None, beam_options: Sequence[str] = ()) -> dict:
  """Build the dataset; returns the creation record (options, tokenizer, counts, warnings, timing).

  `beam_runner` (e.g. "DirectRunner", "DataflowRunner") makes it with Apache Beam, `beam_options` being Beam's own
  command-line flags; otherwise `workers` local processes make it. Both write the same examples.
  """
  if not isinstance(heldout_every, int) or heldout_every < 0 or heldout_every == 1:
    raise errors.ConfigError(f"heldout_every {heldout_every!r}: every N-th document is held out, N >= 2 (1 would hold "
                             "out every document and leave none to train on); 0 = no held-out split")
  if not isinstance(workers, int) or workers < 1:
    raise errors.ConfigError(f"workers must be >= 1, got {workers!r}")
  reader = reader or corpus_lib.ReadOptions()
  if fmt is not None:
    reader = dataclasses.replace(reader, format=fmt)
  if not input_files:
    raise corpus_lib.CorpusError("no corpus files given")
  input_files = corpus_lib.expand(input_files)
  out_dir = os.fspath(out_dir)
  files.reach(out_dir)
  if tfds_data_dir and files.isfile(tfds_data_dir):
    raise errors.ConfigError(f"--tfds_data_dir {tfds_data_dir} is a file, not a folder")
  if beam_runner:
    beam_pipeline_options(beam_runner)  # Beam installed and the runner one it knows, before any work
  # Loaded first: a bad tokenizer fails before anything is read or written.
  tok = tokenizer_lib.load(tokenizer_path, do_lower_case=do_lower_case, reference="original")
  if files.is_remote(out_dir):
    _refuse_foreign(out_dir, overwrite)  # (before the claim below is written there)
    if beam_runner and beam_runner not in LOCAL_RUNNERS:
      raise errors.ConfigError(
          f"--beam_runner {beam_runner} with --out {out_dir}: array_record shards are written to local files only "
          f"(its writer cannot open {files.scheme(out_dir)}:// paths), and remote workers cannot write into this "
          f"machine's staging folder; use {' or '.join(LOCAL_RUNNERS)}, or write to a local (or mounted) folder "
          "and copy it")
  with _lock(out_dir):
    return _create(input_files, tokenizer_path, tok, out_dir, opts, reader, do_lower_case=do_lower_case,
                   heldout_every=heldout_every, workers=workers, overwrite=overwrite, tfds_data_dir=tfds_data_dir,
                   beam_runner=beam_runner, beam_options=beam_options)


def beam_pipeline_options(runner: str):
  """Beam's pipeline_options module, once Beam is known to be installed and to know `runner`."""
  try:
    from bertjax.data.pretraining import beam as beam_pipeline
  except ImportError:
    raise errors.ConfigError("--beam_runner needs Apache Beam: bash launch/setup.sh beam, or pip install "
                             "'bertjax[beam]'") from None
  return beam_pipeline.pipeline_options(runner)


def _lock(out_dir: str):
  """The lock two creations into one folder take (the second refuses, naming the first's pid); on an object
  store, the claim checkpoint.WorkdirLock takes there."""
  from bertjax.core import checkpoint as checkpoint_lib
  return checkpoint_lib.WorkdirLock(os.fspath(out_dir))


# Beam runners whose workers run on this machine, so can write the local staging folder a remote --out is built in.
LOCAL_RUNNERS = ("DirectRunner", "PrismRunner")
# What this tool (and training, its packing plans) writes in a data dir; anything else is someone else's.
OWN_NAMES = ("creation.json", NAME, "tokenizer", ".lock", ".claim.json")


def _refuse_foreign(out_dir: str, overwrite: bool) -> None:
  """A remote --out that holds objects this tool did not write (another dataset, a checkpoint, a bucket's root)
  is refused without --overwrite, which writes the dataset beside them (they are left as they are)."""
  foreign = [n for n in files.listdir(out_dir)
             if n not in OWN_NAMES and not (n.startswith("packing_") and n.endswith(".npz"))]
  if foreign and not overwrite:
    shown = ", ".join(foreign[:5]) + (f", ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
    raise FileExistsError(f"{out_dir}: holds objects this tool did not write ({shown}); pass --overwrite to write the "
                          "dataset beside them, or choose another --out")


def _create(input_files, tokenizer_path, tok, out_dir, opts, reader, *, do_lower_case, heldout_every, workers,
            overwrite, tfds_data_dir, beam_runner, beam_options) -> dict:
  record_path = files.join(out_dir, "creation.json")
  target = files.join(out_dir, NAME)
  if files.exists(target):
    complete = files.exists(files.join(target, BertPretraining.VERSION.__str__(), "dataset_info.json"))
    if files.is_remote(out_dir):  # an upload cut short has not uploaded creation.json, which goes last
      complete = complete and files.exists(record_path)
    if complete and not overwrite:
      raise FileExistsError(f"{out_dir}/{NAME} exists; pass --overwrite to rebuild it")
    files.rmtree(target)  # a finished dataset the user asked to replace, or what a failed run left
  if not files.is_remote(out_dir):
    return _build(input_files, tokenizer_path, tok, out_dir, out_dir, opts, reader, do_lower_case=do_lower_case,
                  heldout_every=heldout_every, workers=workers, tfds_data_dir=tfds_data_dir, beam_runner=beam_runner,
                  beam_options=beam_options)
  # array_record writes local files only: the dataset is built in a local staging folder, then uploaded, the
  # creation record last (a reader that finds it finds the whole dataset).
  with tempfile.TemporaryDirectory(prefix="bertjax-data-") as staging:
    creation = _build(input_files, tokenizer_path, tok, out_dir, staging, opts, reader, do_lower_case=do_lower_case,
                      heldout_every=heldout_every, workers=workers, tfds_data_dir=tfds_data_dir,
                      beam_runner=beam_runner, beam_options=beam_options)
    files.rmtree(files.join(out_dir, "tokenizer"))  # (a previous build's other tokenizer files would be found)
    for name in (NAME, "tokenizer"):
      files.copy(os.path.join(staging, name), files.join(out_dir, name))
    files.copy(os.path.join(staging, "creation.json"), record_path)
  return creation


def _build(input_files, tokenizer_path, tok, out_dir, build_dir, opts, reader, *, do_lower_case, heldout_every,
           workers, tfds_data_dir, beam_runner, beam_options) -> dict:
  """The dataset, its tokenizer's copy and creation.json written into the local folder `build_dir` (`out_dir`
  itself, or the staging folder of a remote one)."""
  record_path = os.path.join(build_dir, "creation.json")
  creation = {"input": input_files, "tokenizer": files.absolute(tokenizer_path),
              "tokenizer_sha256": tokenizer_lib.fingerprint(tokenizer_path), "do_lower_case": do_lower_case,
              "format": reader.format, "reader": dataclasses.asdict(reader), "heldout_every": heldout_every,
              "workers": workers, "options": dataclasses.asdict(opts), "vocab_size": tok.vocab_size,
              "tfds_data_dir": tfds_data_dir, "builder": "beam" if beam_runner else "local"}
  kind = BertPretrainingBeam if beam_runner else BertPretraining
  builder = kind(data_dir=build_dir, max_seq_length=opts.max_seq_length,
                 max_predictions_per_seq=opts.max_predictions_per_seq, creation=creation, file_format="array_record")
  download_config = tfds.download.DownloadConfig(download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS)
  if beam_runner:
    pipeline_options = beam_pipeline_options(beam_runner)
    flags = list(beam_options)
    if beam_runner == "DirectRunner" and workers > 1 and not any(f.startswith("--direct_") for f in flags):
      flags += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    creation["beam_runner"], creation["beam_options"] = beam_runner, flags
    download_config = tfds.download.DownloadConfig(
        download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS, beam_runner=beam_runner,
        beam_options=pipeline_options.PipelineOptions(flags))
  start = time.time()
  # The runner logs a worker's error with its traceback before re-raising it; the error itself is reported once.
  beam_log = logging.getLogger("apache_beam.runners.common")
  level = beam_log.level
  try:
    if beam_runner:
      beam_log.setLevel(logging.CRITICAL)
    builder.download_and_prepare(download_config=download_config)
  except Exception as e:
    user = _user_error(e, input_files, heldout_every, out_dir)
    if user is None:
      raise
    raise user from None
  finally:
    beam_log.setLevel(level)
  if beam_runner:  # (an empty split never gets here: tfds refuses to write it, `_user_error` names it)
    _beam_report(creation, builder)
  creation["seconds"] = time.time() - start
  total = sum(r["examples"] for r in creation.get("report", {}).values())
  creation["examples_per_s"] = total / max(creation["seconds"], 1e-9)
  # The data dir keeps the tokenizer its ids come from.
  copy = tokenizer_lib.copy_into(tokenizer_path, os.path.join(build_dir, "tokenizer"))
  if tokenizer_lib.fingerprint(copy) != creation["tokenizer_sha256"]:
    raise tokenizer_lib.TokenizerError(f"{tokenizer_path}: changed while the data was being made; rebuild")
  files.write_whole(record_path, json.dumps(creation, indent=2))
  return creation


def _user_error(e: BaseException, input_files, heldout_every: int, out_dir: str = "") -> BaseException | None:
  """The user's mistake behind a failed build: an empty split (tfds refuses to write one), or a bertjax error
  that a runner wrapped (Beam re-raises a worker's error inside its own)."""
  text = str(e)
  if not isinstance(e, errors.Error) and ("No examples" in text or "number of generated examples is 0" in text):
    if "validation" in text:
      return corpus_lib.CorpusError(f"the held-out split came out empty: the corpus has too few documents for "
                                    f"heldout_every={heldout_every}; lower it, or pass 0 for no held-out split")
    return corpus_lib.CorpusError(f"no training examples came out of {input_files[:3]}: the corpus is empty or "
                                  "has no text that tokenizes")
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, errors.Error):
      return e
    text = str(e)
    for kind in (corpus_lib.ShardError, corpus_lib.CorpusError):
      marker = f"{kind.__name__}: "
      if marker in text:
        return kind(text[text.rindex(marker) + len(marker):].strip().splitlines()[0])
    if isinstance(e, OSError) or "No space left on device" in text or "Read-only file system" in text:
      # A write that failed (a full disk, a read-only folder): the finished dataset is never half-written (tfds
      # writes into a temporary folder), so a rerun after freeing space starts clean.
      first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
      return errors.DataPathError(f"writing the dataset in {out_dir} failed: {first[:300]}; nothing half-written "
                                  "is kept, rerun when the problem is fixed")
    e = e.__cause__ or e.__context__
  return None


DataPathError = errors.DataPathError


def read_creation(data_dir: str) -> dict:
  data_dir = os.fspath(data_dir)
  path = files.join(data_dir, "creation.json")
  try:
    files.reach(data_dir)  # a remote store that does not answer: one line within BERTJAX_REMOTE_TIMEOUT_S
    text = files.read_bytes(path)
  except FileNotFoundError:
    raise FileNotFoundError(f"{data_dir}: no creation.json; build the data with python -m bertjax dataset") from None
  except (errors.Error, OSError) as e:
    raise DataPathError(f"{data_dir}: cannot be read ({errors.one_line(e)[:300]}). Check the path, the network "
                        "and credentials.") from None
  try:
    return json.loads(text)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataPathError(f"{path}: not valid JSON ({e}); rebuild the data with --overwrite") from None


def tokenizer_of(data_dir: str, creation: dict | None = None) -> tuple[str, bool]:
  """(path, do_lower_case) of the tokenizer a data dir was made with: its own copy (DATA/tokenizer/) when it has
  one, else the file it names; a tokenizer whose content changed since the data was made is refused."""
  creation = read_creation(data_dir) if creation is None else creation
  path, lower = creation.get("tokenizer", ""), creation.get("do_lower_case", True)
  copy = tokenizer_lib.find_in(files.join(os.fspath(data_dir), "tokenizer"))
  if copy is not None:
    path = copy
  want = creation.get("tokenizer_sha256")
  if want and path and files.exists(path) and tokenizer_lib.fingerprint(path) != want:
    raise tokenizer_lib.TokenizerError(
        f"{path}: this tokenizer changed since the data in {data_dir} was made with it (sha256 {want[:12]}...); "
        "its ids no longer match the data: restore it or rebuild the data with --overwrite")
  return path, lower


def load_source(data_dir: str, split: str):
  """A random-access data source of feature dicts (numpy), via tfds over array_record; no TensorFlow."""
  c = read_creation(data_dir)
  o = c["options"]
  builder = BertPretraining(data_dir=local_data(data_dir), max_seq_length=o["max_seq_length"],
                            max_predictions_per_seq=o["max_predictions_per_seq"], file_format="array_record")
  return builder.as_data_source(split=split)


def local_data(data_dir: str) -> str:
  """A data dir array_record can read: a local one itself; a remote one's dataset copied into the local cache
  (array_record opens local files only), in a folder keyed by the path and its creation.json's content (a data
  dir rebuilt in place, whose shards may keep their sizes, gets a fresh copy), each file copied once."""
  data_dir = os.fspath(data_dir)
  if not files.is_remote(data_dir):
    return data_dir
  record = files.read_bytes(files.join(data_dir, "creation.json"))
  key = hashlib.sha256(data_dir.rstrip("/").encode() + b"\0" + record).hexdigest()[:16]
  local = os.path.join(files.cache_root(), f"data-{key}")
  source = files.join(data_dir, NAME)
  for rel in files.walk_files(source):
    target = os.path.join(local, NAME, rel)
    if not (os.path.isfile(target) and os.path.getsize(target) == files.size(files.join(source, rel))):
      os.makedirs(os.path.dirname(target), exist_ok=True)
      files.copy(files.join(source, rel), target)
  return local


def unigram_baseline(data_dir: str, train_split: str = "train", eval_split: str = "validation",
                     max_examples: int = 20_000) -> dict:
  """What a model that ignores the context scores on the held-out masked positions: the unigram distribution of
  the training split's masked tokens (add-one smoothed) as its prediction; its accuracy (always the most frequent
  token) and mean cross-entropy, the floor a pre-trained model's held-out numbers should clear."""
  def labels(split):
    src = load_source(data_dir, split)
    out = []
    for i in range(min(len(src), max_examples)):
      ex = src[i]
      out.append(np.asarray(ex["masked_lm_ids"])[np.asarray(ex["masked_lm_weights"]) > 0])
    return np.concatenate(out) if out else np.zeros(0, np.int64)
  train, held = labels(train_split), labels(eval_split)
  if not len(train) or not len(held):
    raise errors.DataError(f"{data_dir}: no masked positions in {train_split!r} or {eval_split!r}")
  size = max(read_creation(data_dir)["vocab_size"], int(train.max()) + 1, int(held.max()) + 1)
  counts = np.bincount(train, minlength=size).astype(np.float64) + 1.0
  logp = np.log(counts / counts.sum())
  return {"mlm_accuracy": float(np.mean(held == np.argmax(counts))), "mlm_loss": float(-logp[held].mean()),
          "positions": int(len(held))}
