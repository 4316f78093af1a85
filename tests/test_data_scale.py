"""Corpora at scale: JSONL / Parquet / compressed / tfds shards, bad shards named, and the Apache Beam pipeline
writing the same dataset as the local worker path."""
import bz2
import glob
import gzip
import json
import os

import numpy as np
import pytest

from bertjax import errors
from bertjax.cli import dataset as dataset_cli
from bertjax.cli import tokenizer as tokenizer_cli
from bertjax.data import tokenizer, vocab_files
from bertjax.data.pretraining import corpus, dataset, demo_corpus
from bertjax.data.pretraining import examples as pretraining

OPTS = pretraining.CreationOptions(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, buffer_documents=40)


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
  """Real prose (Python's own docs) as documents of paragraphs, a one-sentence-per-line corpus and a tokenizer."""
  d = tmp_path_factory.mktemp("prose")
  docs = []
  for _, paragraphs in demo_corpus._stdlib_docstrings():
    text = "\n\n".join(paragraphs[:6])
    if len(corpus.text_to_sentences(text, corpus.ReadOptions())) >= 2:
      docs.append(text)
    if len(docs) == 160:
      break
  lines = d / "lines.txt"
  lines.write_text("".join("\n".join(corpus.text_to_sentences(t, corpus.ReadOptions())) + "\n\n" for t in docs))
  vocab = tokenizer.train([lines], d / "tok", vocab_size=3000)
  return d, docs, lines, vocab


def _write_jsonl(path, texts, opener=open, field="text"):
  with opener(path, "wt", encoding="utf-8") as f:
    for i, t in enumerate(texts):
      f.write(json.dumps({"id": i, field: t, "url": f"https://example.org/{i}"}) + "\n")


def _write_parquet(path, texts, row_group_size=25):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path, row_group_size=row_group_size)


def _arrays(data_dir, split):
  src = dataset.load_source(str(data_dir), split)
  return [src[i] for i in range(len(src))]


def _same_examples(a, b):
  return len(a) == len(b) and all(all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------- readers
@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.gz", "jsonl.zst", "json.bz2"])
def test_jsonl_shards_read_as_the_lines_corpus(prose, tmp_path, suffix):
  _, docs, lines, _ = prose
  half = len(docs) // 2
  for i, part in enumerate((docs[:half], docs[half:])):
    path = tmp_path / f"part-{i:05d}.{suffix}"
    if suffix.endswith(".gz"):
      _write_jsonl(path, part, gzip.open)
    elif suffix.endswith(".bz2"):
      _write_jsonl(path, part, bz2.open)
    elif suffix.endswith(".zst"):
      import zstandard
      raw = "".join(json.dumps({"text": t}) + "\n" for t in part).encode()
      path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    else:
      _write_jsonl(path, part)
  stats = corpus.CorpusStats()
  got = list(corpus.read_documents([str(tmp_path / f"part-*.{suffix}")], stats=stats))
  assert got == list(corpus.read_documents([lines]))
  assert stats.records == len(docs) and stats.files == 2


def test_parquet_and_text_field(prose, tmp_path):
  _, docs, lines, _ = prose
  _write_parquet(tmp_path / "a.parquet", docs[:70])
  _write_parquet(tmp_path / "b.parquet", docs[70:])
  got = list(corpus.read_documents([tmp_path / "a.parquet", tmp_path / "b.parquet"]))
  assert got == list(corpus.read_documents([lines]))
  _write_jsonl(tmp_path / "c.jsonl", docs[:3], field="content")
  opts = corpus.ReadOptions(text_field="content")
  assert list(corpus.read_documents([tmp_path / "c.jsonl"], opts=opts)) == got[:3]


def test_gzip_original_format_and_glob_order(prose, tmp_path):
  _, _, lines, _ = prose
  text = lines.read_text()
  cut = text.index("\n\n", len(text) // 2) + 2
  with gzip.open(tmp_path / "b.txt.gz", "wt") as f:  # the glob sorts shards by name: a, then b
    f.write(text[cut:])
  (tmp_path / "a.txt").write_text(text[:cut])
  assert list(corpus.read_documents([str(tmp_path / "*.t*")])) == list(corpus.read_documents([lines]))
  with pytest.raises(corpus.CorpusError, match="no file matches"):
    corpus.expand([str(tmp_path / "*.parquet")])


def test_tfds_text_dataset_through_data_source(prose, tmp_path):
  import tensorflow_datasets as tfds
  _, docs, lines, _ = prose

  class ProseText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"title": tfds.features.Text(), "text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, t in enumerate(docs):
        yield i, {"title": f"doc {i}", "text": t}

  ProseText(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  got = list(corpus.read_documents(["tfds:prose_text:train"], tfds_data_dir=str(tmp_path)))
  expect = list(corpus.read_documents([lines]))
  assert sorted(got) == sorted(expect)  # tfds orders records by a hash of their key
  with pytest.raises(corpus.CorpusError, match="tfds:prose_text:train: no feature 'body'"):
    list(corpus.read_documents(["tfds:prose_text:train"], opts=corpus.ReadOptions(text_field="body"),
                               tfds_data_dir=str(tmp_path)))
  with pytest.raises(corpus.CorpusError, match="tfds:no_such_dataset: cannot open"):
    list(corpus.read_documents(["tfds:no_such_dataset"], tfds_data_dir=str(tmp_path)))


def test_sentence_splitter_handles_abbreviations_the_regex_does_not():
  text = "Mr. Smith went to Washington. He arrived at 5 p.m. and left at 9 a.m. on Friday. It cost $3.50 in total."
  assert corpus.split_sentences(text) == ["Mr. Smith went to Washington.",
                                          "He arrived at 5 p.m. and left at 9 a.m. on Friday.",
                                          "It cost $3.50 in total."]
  assert corpus.split_sentences(text, "regex")[0] == "Mr."  # why the library is the default
  with pytest.raises(errors.ConfigError, match="sentence splitter 'nltk'"):
    corpus.ReadOptions(splitter="nltk")


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_records_are_named_or_skipped_and_counted(prose, tmp_path):
  _, docs, _, _ = prose
  p = tmp_path / "bad.jsonl"
  p.write_text(json.dumps({"text": docs[0]}) + "\n{not json\n" + json.dumps({"body": "x"}) + "\n" +
               json.dumps({"text": None}) + "\n" + json.dumps({"text": docs[1]}) + "\n")
  with pytest.raises(corpus.CorpusError, match=r"bad.jsonl: line 2: not valid JSON"):
    list(corpus.read_documents([p]))
  p2 = tmp_path / "nofield.jsonl"
  p2.write_text(json.dumps({"body": "x"}) + "\n")
  with pytest.raises(corpus.CorpusError, match=r"nofield.jsonl: line 1: no field 'text' \(it has \['body'\]\)"):
    list(corpus.read_documents([p2]))
  stats = corpus.CorpusStats()
  got = list(corpus.read_documents([p], stats=stats, opts=corpus.ReadOptions(skip_bad_records=True)))
  assert len(got) == 2 and stats.bad_records == 3 and stats.records == 2
  assert any("3 bad record(s) skipped" in w for w in stats.warnings())


def test_bad_shards_are_named_or_skipped(prose, tmp_path):
  _, docs, _, _ = prose
  _write_parquet(tmp_path / "good.parquet", docs[:10])
  data = (tmp_path / "good.parquet").read_bytes()
  (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
  (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 40)
  with gzip.open(tmp_path / "t.txt.gz", "wb") as f:
    f.write(("A sentence here.\n" * 20000).encode())
  gz = (tmp_path / "t.txt.gz").read_bytes()
  (tmp_path / "cut.txt.gz").write_bytes(gz[: len(gz) // 2])
  cases = {"truncated.parquet": "not a readable Parquet file", "binary.txt": "looks like a binary file",
           "cut.txt.gz": "cannot be read past line", "missing.jsonl": "corpus file not found"}
  for name, message in cases.items():
    with pytest.raises(corpus.CorpusError, match=f"{name}: {message}"):
      list(corpus.read_documents([tmp_path / name]))
  with pytest.raises(corpus.CorpusError, match="good.parquet: no column 'body'"):
    list(corpus.read_documents([tmp_path / "good.parquet"], opts=corpus.ReadOptions(text_field="body")))
  stats = corpus.CorpusStats()
  shards = [tmp_path / n for n in ("truncated.parquet", "binary.txt", "cut.txt.gz", "good.parquet")]
  got = list(corpus.read_documents(shards, stats=stats, opts=corpus.ReadOptions(skip_bad_records=True)))
  assert len(got) >= 10 and stats.bad_shards == 3


# ---------------------------------------------------------------------------------------------- Beam
@pytest.mark.parametrize("mode,kind", [("nsp_pairs", "wordpiece"), ("full_sentences", "byte_bpe")])
def test_beam_writes_the_local_paths_dataset(prose, tmp_path, mode, kind):
  """DirectRunner output equals the local worker path's, example for example and in the same order, from JSONL
  shards of real prose (the byte-level BPE's merges.txt travels to the workers with its vocab.json)."""
  pytest.importorskip("apache_beam")
  _, docs, lines, vocab = prose
  if kind == "byte_bpe":
    vocab = tokenizer.train([lines], tmp_path / "bpe", kind="byte_bpe", vocab_size=800)
  for i in range(3):
    _write_jsonl(tmp_path / f"shard-{i}.jsonl.gz", docs[i * 50:(i + 1) * 50 + (10 if i == 2 else 0)], gzip.open)
  opts = pretraining.CreationOptions(**{**OPTS.__dict__, "example_mode": mode})
  inputs = [str(tmp_path / "shard-*.jsonl.gz")]
  local = dataset.create(inputs, vocab, tmp_path / "local", opts, heldout_every=10, workers=1)
  beam = dataset.create(inputs, vocab, tmp_path / "beam", opts, heldout_every=10, beam_runner="DirectRunner")
  for split in ("train", "validation"):
    assert beam["report"][split]["examples"] == local["report"][split]["examples"] > 0
    assert _same_examples(_arrays(tmp_path / "local", split), _arrays(tmp_path / "beam", split))
  assert beam["report"]["train"]["records"] == len(docs[:160]) and beam["builder"] == "beam"
  for f in glob.glob(str(tmp_path / "local" / dataset.NAME / "1.0.0" / "*.array_record*")):
    with open(f, "rb") as a, open(f.replace(os.sep + "local" + os.sep, os.sep + "beam" + os.sep), "rb") as b:
      assert a.read() == b.read()


def test_beam_names_a_bad_shard_and_the_cli_runs(prose, tmp_path):
  pytest.importorskip("apache_beam")
  _, docs, _, vocab = prose
  _write_jsonl(tmp_path / "a.jsonl", docs[:60])
  (tmp_path / "b.jsonl").write_text(json.dumps({"text": docs[60]}) + "\n{broken\n")
  with pytest.raises(corpus.CorpusError, match=r"b.jsonl: line 2: not valid JSON"):
    dataset.create([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], vocab, tmp_path / "out", OPTS, heldout_every=10,
                   beam_runner="DirectRunner")
  with pytest.raises(corpus.CorpusError, match="held-out split came out empty"):
    dataset.create([tmp_path / "b.jsonl"], vocab, tmp_path / "out", OPTS, heldout_every=20, beam_runner="DirectRunner",
                   reader=corpus.ReadOptions(skip_bad_records=True))
  rc = dataset_cli.main(["--input", str(tmp_path / "*.jsonl"), "--tokenizer", vocab, "--out", str(tmp_path / "cli"),
                     "--beam_runner", "DirectRunner", "--skip_bad_records", "--heldout_every", "10",
                     "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "1"])
  assert not rc
  rec = dataset.read_creation(str(tmp_path / "cli"))
  assert rec["report"]["train"]["bad_records"] == 1 and rec["report"]["train"]["examples"] > 0
  assert len(dataset.load_source(str(tmp_path / "cli"), "train")) == rec["report"]["train"]["examples"]


def test_tokenizer_trains_on_jsonl_shards(prose, tmp_path):
  _, docs, _, _ = prose
  _write_jsonl(tmp_path / "a.jsonl.gz", docs, gzip.open)
  path = tokenizer.train([str(tmp_path / "*.jsonl.gz")], tmp_path / "tok", vocab_size=1000)
  tok = tokenizer.load(path)
  assert tok.vocab_size > 500 and tok.encode("The module provides functions.")[0] != tok.token_to_id("[UNK]")


def test_tokenizer_cli_names_or_skips_a_bad_record(prose, tmp_path, capsys):
  _, docs, _, _ = prose
  (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in docs[:50]) + "{bad\n")
  argv = ["--input", str(tmp_path / "*.jsonl"), "--text_field", "body", "--vocab_size", "500", "--out",
          str(tmp_path / "tok")]
  with pytest.raises(SystemExit) as stop:
    tokenizer_cli.main(argv)
  assert stop.value.code == 2 and "a.jsonl: line 51: not valid JSON" in capsys.readouterr().err
  assert not tokenizer_cli.main(argv + ["--skip_bad_records"])
  assert (tmp_path / "tok" / "vocab.txt").exists()


def test_tokenizer_files_are_what_load_reads(tmp_path):
  """What a Beam worker receives: a vocab.json travels with merges.txt and, when present, the tokenizer.json that
  `tokenizer.load` prefers."""
  for name in ("vocab.json", "merges.txt", "vocab.txt", "spm.model"):
    (tmp_path / name).write_text("x")
  assert vocab_files.files(str(tmp_path / "vocab.json")) == [str(tmp_path / n) for n in ("vocab.json", "merges.txt")]
  (tmp_path / "tokenizer.json").write_text("{}")
  assert vocab_files.files(str(tmp_path / "vocab.json"))[-1] == str(tmp_path / "tokenizer.json")
  assert vocab_files.files(str(tmp_path / "tokenizer.json")) == [str(tmp_path / "tokenizer.json")]
  assert vocab_files.files(str(tmp_path / "vocab.txt")) == [str(tmp_path / "vocab.txt")]
  assert vocab_files.files(str(tmp_path / "spm.model")) == [str(tmp_path / "spm.model")]
