"""Pre-training data as a tensorflow-datasets dataset in array_record format (readable without TensorFlow).

    python -m bertjax dataset --input corpus.txt --tokenizer vocab.txt --out DATA_DIR \
        --max_seq_length 128 --max_predictions_per_seq 20 --dupe_factor 5 --workers 2

writes DATA_DIR/bert_pretraining/1.0.0/ with splits `train` and `validation` (every `heldout_every`-th
document is held out), and `creation.json` with the options and tokenizer used.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import threading
import time
from typing import Sequence

import numpy as np
import tensorflow_datasets as tfds

from bertjax import errors
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
    examples = generation.generate_keyed_examples(
        docs, c["tokenizer"], pretraining.CreationOptions(**c["options"]), do_lower_case=c.get("do_lower_case", True),
        num_workers=c.get("workers", 1), stats=counts)
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
  # Loaded first: a bad tokenizer fails before anything is read or written.
  tok = tokenizer_lib.load(tokenizer_path, do_lower_case=do_lower_case, reference="original")
  local = "://" not in os.fspath(out_dir)
  lock = _lock(out_dir) if local else contextlib.nullcontext()
  with lock:
    return _create(input_files, tokenizer_path, tok, out_dir, opts, reader, do_lower_case=do_lower_case,
                   heldout_every=heldout_every, workers=workers, overwrite=overwrite, tfds_data_dir=tfds_data_dir,
                   beam_runner=beam_runner, beam_options=beam_options)


def _lock(out_dir: str):
  """The lock two creations into one folder take (the second refuses, naming the first's pid)."""
  from bertjax.core import checkpoint as checkpoint_lib
  return checkpoint_lib.WorkdirLock(os.fspath(out_dir))


def _create(input_files, tokenizer_path, tok, out_dir, opts, reader, *, do_lower_case, heldout_every, workers,
            overwrite, tfds_data_dir, beam_runner, beam_options) -> dict:
  record_path = os.path.join(out_dir, "creation.json")
  target = os.path.join(out_dir, NAME)
  if os.path.exists(target):
    complete = os.path.exists(os.path.join(target, BertPretraining.VERSION.__str__(), "dataset_info.json"))
    if complete and not overwrite:
      raise FileExistsError(f"{out_dir}/{NAME} exists; pass --overwrite to rebuild it")
    shutil.rmtree(target)  # a finished dataset the user asked to replace, or what a failed run left
  creation = {"input": input_files, "tokenizer": os.path.abspath(tokenizer_path),
              "tokenizer_sha256": tokenizer_lib.fingerprint(tokenizer_path), "do_lower_case": do_lower_case,
              "format": reader.format, "reader": dataclasses.asdict(reader), "heldout_every": heldout_every,
              "workers": workers, "options": dataclasses.asdict(opts), "vocab_size": tok.vocab_size,
              "tfds_data_dir": tfds_data_dir, "builder": "beam" if beam_runner else "local"}
  kind = BertPretrainingBeam if beam_runner else BertPretraining
  builder = kind(data_dir=out_dir, max_seq_length=opts.max_seq_length,
                 max_predictions_per_seq=opts.max_predictions_per_seq, creation=creation, file_format="array_record")
  download_config = tfds.download.DownloadConfig(download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS)
  if beam_runner:
    try:
      from apache_beam.options import pipeline_options
    except ImportError:
      raise errors.ConfigError("--beam_runner needs Apache Beam: bash launch/setup.sh beam, or pip install "
                               "'bertjax[beam]'") from None
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
  if "://" not in os.fspath(out_dir):  # the data dir keeps the tokenizer its ids come from
    copy = tokenizer_lib.copy_into(tokenizer_path, os.path.join(out_dir, "tokenizer"))
    if tokenizer_lib.fingerprint(copy) != creation["tokenizer_sha256"]:
      raise tokenizer_lib.TokenizerError(f"{tokenizer_path}: changed while the data was being made; rebuild")
  tmp = f"{record_path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(creation, f, indent=2)
  os.replace(tmp, record_path)
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
  from etils import epath
  data_dir = os.fspath(data_dir)
  path = epath.Path(data_dir) / "creation.json"

  def read():
    exists = path.exists()
    return exists, (path.read_text() if exists else None)

  try:
    if "://" in data_dir:  # remote stores retry for minutes when unreachable: bound the wait
      timeout = float(os.environ.get("BERTJAX_REMOTE_TIMEOUT_S", "30"))
      box: dict = {}

      def target():
        try:
          box["value"] = read()
        except Exception as e:
          box["error"] = e

      worker = threading.Thread(target=target, daemon=True)  # a daemon: never holds up the exit
      worker.start()
      worker.join(timeout)
      if worker.is_alive():
        raise DataPathError(f"{data_dir}: no answer within {timeout:.0f}s (BERTJAX_REMOTE_TIMEOUT_S). Check the path, "
                            "the network and credentials.")
      if "error" in box:
        raise box["error"]
      exists, text = box["value"]
    else:
      exists, text = read()
  except DataPathError:
    raise
  except Exception as e:
    raise DataPathError(f"{data_dir}: cannot be read ({type(e).__name__}: {str(e)[:200]}). Check the path, the network "
                        "and credentials; gs:// paths need gcsfs (pip install gcsfs) or TensorFlow.") from None
  if not exists:
    raise FileNotFoundError(f"{data_dir}: no creation.json; build the data with python -m bertjax dataset")
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise DataPathError(f"{path}: not valid JSON ({e}); rebuild the data with --overwrite") from None


def tokenizer_of(data_dir: str, creation: dict | None = None) -> tuple[str, bool]:
  """(path, do_lower_case) of the tokenizer a data dir was made with: its own copy (DATA/tokenizer/) when it has
  one, else the file it names; a tokenizer whose content changed since the data was made is refused."""
  creation = read_creation(data_dir) if creation is None else creation
  path, lower = creation.get("tokenizer", ""), creation.get("do_lower_case", True)
  local = "://" not in os.fspath(data_dir)
  copy = tokenizer_lib.find_in(os.path.join(data_dir, "tokenizer")) if local else None
  if copy is not None:
    path = copy
  want = creation.get("tokenizer_sha256")
  if want and path and os.path.exists(path) and tokenizer_lib.fingerprint(path) != want:
    raise tokenizer_lib.TokenizerError(
        f"{path}: this tokenizer changed since the data in {data_dir} was made with it (sha256 {want[:12]}...); "
        "its ids no longer match the data: restore it or rebuild the data with --overwrite")
  return path, lower


def load_source(data_dir: str, split: str):
  """A random-access data source of feature dicts (numpy), via tfds over array_record; no TensorFlow."""
  c = read_creation(data_dir)
  o = c["options"]
  builder = BertPretraining(data_dir=data_dir, max_seq_length=o["max_seq_length"],
                            max_predictions_per_seq=o["max_predictions_per_seq"], file_format="array_record")
  return builder.as_data_source(split=split)


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
