"""The data tools on gs:// paths, against a real GCS emulator (fake-gcs-server, `gcs_server` / `bucket` in
conftest.py): datasets made straight into a bucket equal the same datasets made locally, tokenizers trained into
and loaded from a bucket, a data dir read back from one, task files read from one, a prefix holding someone
else's objects refused, and no local folder named 'gs:' made on the way."""
import json
import os

import numpy as np
import pytest

from bertjax import errors
from bertjax import tasks as tasks_lib
from bertjax.cli import dataset as dataset_cli
from bertjax.cli import tokenizer as tokenizer_cli
from bertjax.core import files
from bertjax.data import tokenizer
from bertjax.data.pretraining import dataset
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline

OPTS = ["--max_seq_length", "32", "--max_predictions_per_seq", "5", "--dupe_factor", "2", "--heldout_every", "8"]
TIMING = ("seconds", "examples_per_s")  # what differs between two creations of the same data
WHERE = ("input", "tokenizer")  # the paths a creation record names


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
  """Every test runs in its own folder, and leaves no 'gs:' folder there (what os.makedirs('gs://b/x') makes)."""
  monkeypatch.chdir(tmp_path)
  yield
  assert not os.path.exists(tmp_path / "gs:"), "a gs:// path was used as a local one"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
  """A tiny corpus and a WordPiece vocab trained on it, local."""
  d = tmp_path_factory.mktemp("local")
  rng = np.random.default_rng(0)
  words = ("the model reads text and predicts masked words from both sides of each sentence while a second "
           "head guesses whether two segments follow each other").split()
  docs = ["\n".join(" ".join(rng.choice(words, rng.integers(5, 14))).capitalize() + "."
                    for _ in range(rng.integers(2, 9))) for _ in range(60)]
  (d / "corpus.txt").write_text("\n\n".join(docs))
  vocab = tokenizer.train([d / "corpus.txt"], d / "tok", vocab_size=128)
  return d, vocab


def upload(local_path, remote: str) -> str:
  files.copy(str(local_path), remote)
  return remote


def tree(root: str) -> dict:
  """Every file under a folder or prefix -> its bytes; creation.json without its timing and input paths, and no
  lock or claim (a local build's .lock holds its pid)."""
  out = {}
  for rel in files.walk_files(root):
    rel = rel.replace(os.sep, "/")
    if rel in (".lock", ".claim.json") or rel.endswith("/.built/build.json"):  # (its digest names the inputs)
      continue
    raw = files.read_bytes(files.join(root, rel))
    if rel == "creation.json":
      rec = json.loads(raw)
      raw = {k: v for k, v in rec.items() if k not in TIMING + WHERE}
    out[rel] = raw
  return out


def test_dataset_made_into_gcs_equals_the_local_one(local, bucket, tmp_path, capsys):
  d, vocab = local
  corpus = upload(d / "corpus.txt", f"{bucket}/in/corpus.txt")
  vocab_gs = upload(vocab, f"{bucket}/tok/vocab.txt")
  args = [*OPTS, "--workers", "2"]
  dataset_cli.main(["--input", str(d / "corpus.txt"), "--tokenizer", vocab, "--out", str(tmp_path / "data"), *args])
  dataset_cli.main(["--input", corpus, "--tokenizer", vocab_gs, "--out", f"{bucket}/data", *args])
  assert f"wrote {bucket}/data" in capsys.readouterr().out
  local_tree, remote_tree = tree(str(tmp_path / "data")), tree(f"{bucket}/data")
  assert sorted(remote_tree) == sorted(local_tree) and "bert_pretraining/1.0.0/dataset_info.json" in remote_tree
  assert remote_tree == local_tree
  rec = files.read_json(f"{bucket}/data/creation.json")
  assert rec["input"] == [corpus] and rec["tokenizer"] == vocab_gs
  # A finished dataset is not written over without --overwrite, remote as local: one line.
  with pytest.raises(SystemExit):
    dataset_cli.main(["--input", corpus, "--tokenizer", vocab_gs, "--out", f"{bucket}/data", *args])
  err = capsys.readouterr().err
  assert "bert_pretraining exists; pass --overwrite" in err and len(err.strip().splitlines()) == 1
  assert not files.exists(f"{bucket}/data/.claim.json")  # the claim is released


def test_gcs_data_dir_feeds_the_input_pipeline_as_the_local_one(local, bucket, tmp_path):
  d, vocab = local
  opts = pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
  dataset.create([d / "corpus.txt"], vocab, tmp_path / "data", opts, heldout_every=8)
  files.copy(str(tmp_path / "data"), f"{bucket}/data")
  for split in ("train", "validation"):
    here, there = dataset.load_source(str(tmp_path / "data"), split), dataset.load_source(f"{bucket}/data", split)
    assert len(here) == len(there) > 0
  batches = [next(iter(input_pipeline.Pipeline(dataset.load_source(p, "train"), 8, seed=3, prefetch=0)))
             for p in (str(tmp_path / "data"), f"{bucket}/data")]
  assert batches[0].keys() == batches[1].keys()
  for k in batches[0]:
    np.testing.assert_array_equal(batches[0][k], batches[1][k])
  # Training's packing plan is cached beside a remote data dir as beside a local one.
  from bertjax.data import packing
  cache = f"{bucket}/data/packing_train_32_5_4.npz"
  planned = packing.PackedSource(dataset.load_source(f"{bucket}/data", "train"), 32, 5, 4, cache=cache)
  assert files.isfile(cache)
  assert packing.PackedSource(None, 32, 5, 4, cache=cache).rows == planned.rows
  path, _ = dataset.tokenizer_of(f"{bucket}/data")
  assert path == f"{bucket}/data/tokenizer/vocab.txt"
  assert tokenizer.load(path).pieces == tokenizer.load(vocab).pieces


def test_tokenizers_train_into_and_load_from_gcs(local, bucket, tmp_path, capsys):
  d, _ = local
  corpus = upload(d / "corpus.txt", f"{bucket}/in/corpus.txt")
  tokenizer_cli.main(["--input", corpus, "--out", f"{bucket}/tok", "--vocab_size", "100"])
  assert f"wrote {bucket}/tok/vocab.txt" in capsys.readouterr().out
  tokenizer_cli.main(["--input", str(d / "corpus.txt"), "--out", str(tmp_path / "tok"), "--vocab_size", "100"])
  assert files.read_bytes(f"{bucket}/tok/vocab.txt") == (tmp_path / "tok" / "vocab.txt").read_bytes()
  assert files.listdir(f"{bucket}/tok") == ["vocab.txt"]  # no temporary folder left there
  with pytest.raises(SystemExit):
    tokenizer_cli.main(["--input", corpus, "--out", f"{bucket}/tok", "--vocab_size", "60"])
  assert "already holds ['vocab.txt']; pass --overwrite" in capsys.readouterr().err
  # A byte-level BPE's vocab.json is read with the merges.txt beside it; a sentencepiece model through a copy.
  for kind, size in (("byte_bpe", 300), ("unigram", 100)):
    path = tokenizer.train([corpus], f"{bucket}/{kind}", kind=kind, vocab_size=size)
    ref = tokenizer.train([d / "corpus.txt"], tmp_path / kind, kind=kind, vocab_size=size)
    remote, here = tokenizer.load(path), tokenizer.load(ref)
    assert remote.path == path and remote.pieces == here.pieces
    assert remote.encode("the model reads text") == here.encode("the model reads text")
    assert tokenizer.fingerprint(path) == tokenizer.fingerprint(ref)


def test_task_files_on_gcs(bucket, tmp_path):
  from bertjax.data.tasks import conll, squad
  from bertjax.data.tasks import rows as task_rows
  task = tasks_lib.get("local", ("neg", "pos"))
  files.write_whole(f"{bucket}/t/a.csv", "\ufeffsentence,label\ngood film,pos\nbad film,neg\n")
  files.write_whole(f"{bucket}/t/a.tsv", "sentence\tlabel\ngood film\tpos\n")
  files.write_whole(f"{bucket}/t/a.jsonl", '{"sentence": "bad", "label": "neg"}\n')
  assert [r["label"] for r in task_rows.local_examples(f"{bucket}/t/a.csv", task, "sentence")] == [1, 0]
  assert task_rows.local_examples(f"{bucket}/t/a.tsv", task, "sentence")[0]["text_a"] == "good film"
  assert task_rows.local_examples(f"{bucket}/t/a.jsonl", task, "sentence")[0]["label"] == 0
  squad_json = {"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [
      {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
  files.write_whole(f"{bucket}/t/squad.json", json.dumps(squad_json))
  [ex] = squad.json_examples(f"{bucket}/t/squad.json")
  assert ex.answers == [("France", 12)]
  files.write_whole(f"{bucket}/t/ner.txt", "-DOCSTART- O\n\nParis B-LOC\nis O\n\nRome B-LOC\n")
  assert conll.read(f"{bucket}/t/ner.txt") == [(["Paris", "is"], ["B-LOC", "O"]), (["Rome"], ["B-LOC"])]
  with pytest.raises(task_rows.TaskDataError, match="file not found"):
    task_rows.local_examples(f"{bucket}/t/missing.csv", task, "sentence")


def test_a_prefix_with_foreign_objects_is_refused_and_a_bad_bucket_is_one_line(local, bucket, capsys):
  d, vocab = local
  files.write_whole(f"{bucket}/data/notes.txt", "someone else's")
  with pytest.raises(SystemExit):
    dataset_cli.main(["--input", str(d / "corpus.txt"), "--tokenizer", vocab, "--out", f"{bucket}/data", *OPTS])
  err = capsys.readouterr().err
  assert "holds objects this tool did not write (notes.txt); pass --overwrite" in err
  assert files.listdir(f"{bucket}/data") == ["notes.txt"]  # nothing written, no claim left
  with pytest.raises(SystemExit):
    dataset_cli.main(["--input", str(d / "corpus.txt"), "--tokenizer", vocab, "--out", "gs://no-such-bucket-bj/d",
                      *OPTS])
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: gs://no-such-bucket-bj: the bucket does not exist"), err
  with pytest.raises(SystemExit):
    tokenizer_cli.main(["--input", "gs://no-such-bucket-bj/c.txt", "--out", "tok"])
  assert "the bucket does not exist" in capsys.readouterr().err


def test_beam_direct_runner_into_gcs(local, bucket, tmp_path):
  d, vocab = local
  corpus = upload(d / "corpus.txt", f"{bucket}/in/corpus.txt")
  opts = pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2)
  dataset.create([d / "corpus.txt"], vocab, tmp_path / "data", opts, heldout_every=8)
  rec = dataset.create([corpus], upload(vocab, f"{bucket}/vocab.txt"), f"{bucket}/beam", opts, heldout_every=8,
                       beam_runner="DirectRunner")
  assert rec["builder"] == "beam" and files.exists(f"{bucket}/beam/creation.json")
  for split in ("train", "validation"):
    here, there = dataset.load_source(str(tmp_path / "data"), split), dataset.load_source(f"{bucket}/beam", split)
    assert len(here) == len(there) > 0
    for i in range(len(here)):
      for k in here[i]:
        np.testing.assert_array_equal(here[i][k], there[i][k])
  # A runner whose workers are elsewhere writes into the bucket too: what stops this one is Dataflow's own check
  # of its options, one line.
  with pytest.raises(errors.ConfigError, match="DataflowRunner: Missing .*project"):
    dataset.create([corpus], vocab, f"{bucket}/flow", opts, beam_runner="DataflowRunner")


def test_the_dataset_command_writes_gcs_from_another_folder_and_an_unreachable_store_is_one_line(
    local, bucket, gcs_server, tmp_path):
  import subprocess
  import sys

  import helpers
  import object_store
  d, vocab = local
  corpus = upload(d / "corpus.txt", f"{bucket}/in/corpus.txt")
  env = {**helpers.env(), **gcs_server.env()}
  cmd = [sys.executable, "-m", "bertjax", "dataset", "--input", corpus, "--tokenizer", vocab, *OPTS]
  proc = subprocess.run(cmd + ["--out", f"{bucket}/data"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert files.isfile(f"{bucket}/data/bert_pretraining/1.0.0/dataset_info.json")
  assert len(dataset.load_source(f"{bucket}/data", "train")) > 0
  nowhere = f"http://127.0.0.1:{object_store.free_port()}"  # nothing listens there
  dead = {**env, "STORAGE_EMULATOR_HOST": nowhere, "BERTJAX_REMOTE_TIMEOUT_S": "3"}
  proc = subprocess.run(cmd + ["--out", f"{bucket}/other"], cwd=tmp_path, env=dead, capture_output=True, text=True,
                        timeout=600, check=False)
  helpers.assert_one_line_error(proc, rf"{bucket}: (no answer within 3s|cannot reach)")
