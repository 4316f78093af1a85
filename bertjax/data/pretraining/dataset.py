"""Pre-training data as a tensorflow-datasets dataset in array_record format (readable without TensorFlow).

    python -m bertjax dataset --input corpus.txt --tokenizer vocab.txt --out DATA_DIR \
        --max_seq_length 128 --max_predictions_per_seq 20 --dupe_factor 5 --workers 2

writes DATA_DIR/bert_pretraining/1.0.0/ with splits `train` and `validation` (every `heldout_every`-th
document is held out), and `creation.json` with the options and tokenizer used. DATA_DIR may be a bucket
(gs://, s3://): every shard goes there as soon as it is made (store.py), by local processes or by Apache Beam's
workers on any runner.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Sequence

import numpy as np

from bertjax import errors
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.pretraining import corpus as corpus_lib
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import generation, store

NAME = store.NAME


PROGRESS = {"print": False, "every_s": 10.0}  # the command line turns progress lines on


def reader_options(creation: dict) -> corpus_lib.ReadOptions:
  return corpus_lib.ReadOptions(**creation.get("reader", {"format": creation.get("format", "lines")}))


def _report(creation: dict, split: str, examples: int, stats: corpus_lib.CorpusStats) -> None:
  creation.setdefault("report", {})[split] = {"examples": examples, **dataclasses.asdict(stats),
                                              "warnings": stats.warnings()}
  for w in stats.warnings():
    logging.warning("%s split: %s", split, w)


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
  """Builds the dataset into `out_dir` (local or remote), shard by shard where the examples are made; the
  tokenizer's copy, dataset_info.json and creation.json last, so a reader that finds creation.json finds a whole
  dataset. An unfinished build of the same settings is continued: its finished shards are kept."""
  record_path = files.join(out_dir, "creation.json")
  target = files.join(out_dir, NAME)
  creation = {"input": input_files, "tokenizer": files.absolute(tokenizer_path),
              "tokenizer_sha256": tokenizer_lib.fingerprint(tokenizer_path), "do_lower_case": do_lower_case,
              "format": reader.format, "reader": dataclasses.asdict(reader), "heldout_every": heldout_every,
              "workers": workers, "options": dataclasses.asdict(opts), "vocab_size": tok.vocab_size,
              "tfds_data_dir": tfds_data_dir, "builder": "beam" if beam_runner else "local"}
  identity = _identity(creation)
  claim = files.join(store.version_dir(out_dir), store.BUILT, "build.json")
  if files.exists(target):
    complete = files.exists(files.join(store.version_dir(out_dir), "dataset_info.json")) and files.exists(record_path)
    if complete and not overwrite:
      raise FileExistsError(f"{out_dir}/{NAME} exists; pass --overwrite to rebuild it")
    if complete or _claimed(claim) != identity:
      files.rmtree(target)  # a finished dataset the user asked to replace, or an unfinished build of other settings
  files.remove(record_path)
  files.makedirs(files.parent(claim))
  files.write_whole(claim, json.dumps({"identity": identity}))
  start = time.time()
  splits = [("train", False)] + ([("validation", True)] if heldout_every > 0 else [])
  try:
    if beam_runner:
      _build_beam(creation, out_dir, splits, beam_runner, beam_options)
    else:
      _build_local(creation, out_dir, splits, opts, reader)
  except Exception as e:
    user = _user_error(e, input_files, heldout_every, out_dir)
    if user is None:
      raise
    raise user from None
  records = _finished_splits(out_dir, [s for s, _ in splits])
  for split, recs in records.items():
    creation["report"][split]["examples"] = sum(r["examples"] for r in recs)
    creation["report"][split]["shards"] = len(recs)
  if creation["report"]["train"]["examples"] == 0:
    raise corpus_lib.CorpusError(f"no training examples came out of {input_files[:3]}: the corpus is empty or "
                                 "has no text that tokenizes")
  if heldout_every > 0 and creation["report"]["validation"]["examples"] == 0:
    raise corpus_lib.CorpusError(f"the held-out split came out empty: the corpus has too few documents for "
                                 f"heldout_every={heldout_every}; lower it, or pass 0 for no held-out split")
  store.write_info(out_dir, opts.max_seq_length, opts.max_predictions_per_seq, records)
  creation["seconds"] = time.time() - start
  total = sum(r["examples"] for r in creation["report"].values())
  creation["examples_per_s"] = total / max(creation["seconds"], 1e-9)
  # The data dir keeps the tokenizer its ids come from.
  tokenizer_dir = files.join(out_dir, "tokenizer")
  files.rmtree(tokenizer_dir)  # (a previous build's other tokenizer files would be found)
  with files.local_target(tokenizer_dir) as local:
    copy = tokenizer_lib.copy_into(tokenizer_path, local)
    if tokenizer_lib.fingerprint(copy) != creation["tokenizer_sha256"]:
      raise tokenizer_lib.TokenizerError(f"{tokenizer_path}: changed while the data was being made; rebuild")
  files.write_whole(record_path, json.dumps(creation, indent=2))
  return creation


def _identity(creation: dict) -> str:
  """What an unfinished build's shards depend on: the settings, the tokenizer's content and the inputs' sizes."""
  keys = ("input", "tokenizer_sha256", "do_lower_case", "reader", "heldout_every", "options", "tfds_data_dir")
  listed: dict[str, dict] = {}  # one listing a folder, not one request an input (a corpus comes in many shards)
  inputs = []
  for p in creation["input"]:
    folder = files.parent(p)
    if folder not in listed:
      try:
        listed[folder] = files.sizes(folder)
      except (OSError, errors.Error):
        listed[folder] = {}
    inputs.append(listed[folder].get(files.basename(p)))
  raw = json.dumps([{k: creation[k] for k in keys}, inputs], sort_keys=True, default=str)
  return hashlib.sha256(raw.encode()).hexdigest()


def _claimed(claim: str) -> str | None:
  try:
    return json.loads(files.read_bytes(claim)).get("identity")
  except (FileNotFoundError, ValueError):
    return None


def _build_local(creation: dict, out_dir: str, splits, opts, reader) -> None:
  """Each split's shards made by `workers` local processes, each writing the shards it makes (one at a time)."""
  c = creation
  tokenizer = tokenizer_lib.local_copy(c["tokenizer"])  # (the workers load a remote tokenizer's local copy)
  for split, heldout in splits:
    stats = corpus_lib.CorpusStats()
    docs = corpus_lib.read_documents(c["input"], stats=stats, opts=reader, tfds_data_dir=c.get("tfds_data_dir"))
    docs = generation.split_documents(docs, c["heldout_every"], heldout)
    done = set(store.built_records(out_dir).get(split, {}))
    if done and PROGRESS["print"]:
      print(f"{split}: {len(done)} shards an earlier run finished are kept", flush=True)
    start = last = time.time()
    n = 0
    for b, record in generation.write_shards(docs, tokenizer, opts, data_dir=out_dir, split=split,
                                             do_lower_case=c["do_lower_case"], num_workers=c["workers"], skip=done):
      n += record["examples"]
      if PROGRESS["print"] and time.time() - last >= PROGRESS["every_s"]:
        last = time.time()
        print(f"{split}: shard {b}, {n:,} examples ({n / (last - start):,.0f}/s; {stats.documents:,} documents "
              "read)", flush=True)
    _report(c, split, n, stats)


def _build_beam(creation: dict, out_dir: str, splits, runner: str, beam_options) -> None:
  """The shards made by an Apache Beam pipeline on `runner`; its workers write them straight into `out_dir`."""
  from bertjax.data.pretraining import beam as beam_pipeline
  pipeline_options = beam_pipeline_options(runner)
  flags = list(beam_options)
  if runner == "DirectRunner" and creation["workers"] > 1 and not any(f.startswith("--direct_") for f in flags):
    flags += [f"--direct_num_workers={creation['workers']}", "--direct_running_mode=multi_processing"]
  creation["beam_runner"], creation["beam_options"] = runner, flags
  done = {split: sorted(store.built_records(out_dir).get(split, {})) for split, _ in splits}
  # The runner logs a worker's error with its traceback before re-raising it; the error itself is reported once.
  beam_log = logging.getLogger("apache_beam.runners.common")
  level = beam_log.level
  beam_log.setLevel(logging.CRITICAL)
  try:
    counters = beam_pipeline.run(creation, out_dir, [s for s, _ in splits], done, runner,
                                 pipeline_options.PipelineOptions(flags))
  finally:
    beam_log.setLevel(level)
  stats = corpus_lib.CorpusStats(**{f.name: counters.get(f"corpus.{f.name}", 0) for f in dataclasses.fields(
      corpus_lib.CorpusStats)})
  for split, _ in splits:
    _report(creation, split, 0, stats)


def _finished_splits(out_dir: str, splits) -> dict[str, list[dict]]:
  """{split: [record of shard 0, 1, ...]}; a gap (a shard that no worker finished) is an error naming it."""
  built = store.built_records(out_dir)
  out = {}
  for split in splits:
    recs = built.get(split, {})
    missing = sorted(set(range(len(recs))) - set(recs)) or sorted(b for b in recs if b >= len(recs))
    if missing:
      raise DataPathError(f"{out_dir}: {split} shard {missing[0]} was not written (a worker failed); rerun the "
                          "same command to make the missing shards")
    out[split] = [recs[b] for b in range(len(recs))]
  return out


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
      # A write that failed (a full disk, a read-only folder, a store that refused): every shard is written whole
      # and the dataset is only found once creation.json is, so a rerun continues from the finished shards.
      first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
      return errors.DataPathError(f"writing the dataset in {out_dir} failed: {first[:300]}; the shards written so "
                                  "far are kept: rerun the same command when the problem is fixed")
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
    if files.exists(files.join(store.version_dir(data_dir), store.BUILT, "build.json")):
      raise FileNotFoundError(f"{data_dir}: no creation.json: its build did not finish; rerun the same dataset "
                              "command to make the missing shards") from None
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


def load_source(data_dir: str, split: str, cache_limit: int | str | None = None) -> store.ShardedSource:
  """A random-access data source of feature dicts (numpy) over the split's array_record shards; no TensorFlow. A
  remote data dir is read shard by shard through a local cache of at most `cache_limit` bytes (default
  $BERTJAX_CACHE_LIMIT, else 4 GiB): never copied whole."""
  c = read_creation(data_dir)
  o = c["options"]
  return store.ShardedSource(os.fspath(data_dir), split, o["max_seq_length"], o["max_predictions_per_seq"],
                             cache_limit=cache_limit)


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
