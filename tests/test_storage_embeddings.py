"""`python -m bertjax embeddings` on gs:// paths (a real fake-gcs-server): a corpus embedded into a bucket equals
the local folder byte for byte, a run killed part-way resumes from the blocks already in the bucket, --cache_dir
and --run in a bucket, models and BEIR folders read from one, model folders written to one, objects the tool did
not write refused without --overwrite, and nothing written to a local folder named 'gs:'."""
import json
import os
import shutil

import helpers
import jax
import numpy as np
import pytest

from bertjax.cli import embeddings as embeddings_cli
from bertjax.core import files
from bertjax.embeddings import folders as st_lib
from bertjax.embeddings.dense import encoder as encoder_lib
from bertjax.embeddings.model import EmbeddingModel, Pooling
from bertjax.embeddings.retrieval import Options

WORDS = ("the model reads text and finds documents near each query while a block of vectors waits in a bucket "
         "for the next run to resume from where the last one stopped").split()


@pytest.fixture(scope="module")
def st_model(tmp_path_factory, make_vocab):
  """A tiny sentence-transformers folder (random BERT, mean pooling, a dense layer, normalised) written by
  bertjax, with its WordPiece vocabulary."""
  from bertjax import model as model_lib
  vocab = make_vocab(WORDS, 80)
  n = sum(1 for _ in open(vocab, encoding="utf-8"))
  cfg = model_lib.BertConfig(vocab_size=n, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_position_embeddings=64, dropout_rate=0.0, attention_dropout_rate=0.0)
  pooling = Pooling(mode="mean", dense=8, normalize=True)
  ids = np.ones((1, 8), np.int32)
  params = EmbeddingModel(cfg, pooling).init(jax.random.key(0), {"input_ids": ids, "input_mask": ids,
                                                                 "segment_ids": 0 * ids})["params"]
  out = str(tmp_path_factory.mktemp("st") / "model")
  st_lib.write(cfg, params, pooling, out, max_seq_length=32)
  shutil.copy(vocab, os.path.join(out, "vocab.txt"))
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    f.write('{"do_lower_case": true}')
  return out


def _texts(n, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(3, 14))) for _ in range(n)]


def _corpus(path, n=14):
  with open(path, "w") as f:
    for i, t in enumerate(_texts(n)):
      f.write(json.dumps({"_id": f"d{i}", "title": "T" if i % 4 == 0 else "", "text": t}) + "\n")
  return str(path)


def _beir(folder, n=16):
  texts = _texts(n, 1)
  docs = {f"d{i}": t for i, t in enumerate(texts)}
  queries = {f"q{i}": " ".join(t.split()[:3]) for i, t in enumerate(texts[:8])}
  qrels = {f"q{i}": {f"d{i}": 1} for i in range(8)}
  return str(helpers.write_beir(folder, docs, queries, qrels))


def _tree(path) -> dict:
  """{relative name: bytes} of every file under a local folder or a remote prefix."""
  return {rel: files.read_bytes(files.join(path, rel)) for rel in files.walk_files(path)}


def _generations(path) -> dict:
  fs = files.filesystem("gs")
  return {rel: fs.info(files.join(path, rel)).get("generation") for rel in files.walk_files(path)}


def _last_json(capsys):
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_corpus_embedded_into_a_bucket_equals_the_local_folder(st_model, tmp_path, bucket, monkeypatch, capsys):
  """Model and corpus read from the bucket, the blocks written there: the same bytes as a local run; nothing
  lands in a local folder named 'gs:'."""
  monkeypatch.chdir(tmp_path)
  corpus = _corpus(tmp_path / "corpus.jsonl")
  files.copy(st_model, f"{bucket}/models/st")
  files.copy(corpus, f"{bucket}/data/corpus.jsonl")
  argv = ["--block", "4", "--batch_size", "4"]
  assert embeddings_cli.main(["corpus", corpus, "--model", st_model, "--out", str(tmp_path / "local"), *argv]) == 0
  local = _last_json(capsys)
  out = f"{bucket}/emb"
  assert embeddings_cli.main(["corpus", f"{bucket}/data/*.jsonl", "--model", f"{bucket}/models/st", "--out", out,
                              *argv]) == 0
  remote = _last_json(capsys)
  assert remote == {**local, "out": out} and remote["blocks"] == 4
  want = _tree(str(tmp_path / "local"))
  assert sorted(want) == ["block-0000{}.{}".format(b, x) for b in range(4) for x in ("json", "npy")] + [
      "ids.json", "manifest.json"]
  assert _tree(out) == want
  assert not os.path.exists(tmp_path / "gs:") and not os.path.exists(os.path.join(helpers.ROOT, "gs:"))
  # A second run finds every block done and writes nothing.
  before = _generations(out)
  assert embeddings_cli.main(["corpus", f"{bucket}/data/*.jsonl", "--model", f"{bucket}/models/st", "--out", out,
                              *argv]) == 0
  assert _last_json(capsys)["embedded now"] == 0 and _generations(out) == before


def test_a_killed_corpus_embedding_resumes_from_the_blocks_in_the_bucket(st_model, tmp_path, bucket, capsys):
  corpus = _corpus(tmp_path / "corpus.jsonl", 18)
  out = f"{bucket}/emb"
  from bertjax.embeddings import retrieval
  ids, docs = retrieval.read_corpus([corpus])
  enc = encoder_lib.Encoder.load(st_model)
  calls = []

  class Killed(Exception):
    pass

  def dies_after_two(batch, *a):
    if len(calls) == 2:
      raise Killed
    calls.append(len(batch))
    return real(batch, *a)
  real, enc.encode = enc.encode, dies_after_two
  with pytest.raises(Killed):
    encoder_lib.embed_corpus(enc, ids, docs, out, Options(block=5, batch_size=4), log=lambda *a, **k: None)
  assert files.listdir(out) == ["block-00000.json", "block-00000.npy", "block-00001.json", "block-00001.npy",
                                "ids.json", "manifest.json"]
  first = _generations(out)
  argv = ["corpus", corpus, "--model", st_model, "--block", "5", "--batch_size", "4"]
  assert embeddings_cli.main([*argv, "--out", out]) == 0
  assert _last_json(capsys)["embedded now"] == 2  # blocks 2 and 3 only
  after = _generations(out)
  assert {k: after[k] for k in first} == first  # nothing written again
  assert embeddings_cli.main([*argv, "--out", str(tmp_path / "whole")]) == 0
  assert _tree(out) == _tree(str(tmp_path / "whole"))


def test_beir_with_its_folder_cache_and_run_in_a_bucket(st_model, tmp_path, bucket, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  beir = _beir(tmp_path / "beir")
  files.copy(beir, f"{bucket}/beir")
  argv = ["--model", st_model, "--block", "5", "--batch_size", "4", "--top_k", "10"]
  assert embeddings_cli.main([*argv, "--beir", beir, "--run", str(tmp_path / "run.trec"),
                              "--cache_dir", str(tmp_path / "cache")]) == 0
  local = _last_json(capsys)
  run, cache = f"{bucket}/out/run.trec", f"{bucket}/out/cache"
  remote_argv = [*argv, "--beir", f"{bucket}/beir", "--run", run, "--cache_dir", cache]
  assert embeddings_cli.main(remote_argv) == 0
  assert _last_json(capsys) == local and local["queries"] == 8 and local["documents"] == 16
  assert files.read_bytes(run) == (tmp_path / "run.trec").read_bytes()
  assert _tree(cache) == _tree(str(tmp_path / "cache"))
  assert files.listdir(f"{bucket}/out") == ["cache", "run.trec"]  # no temporary object left
  # A rerun reads every block from the bucket and replaces its own run.
  before = _generations(cache)
  assert embeddings_cli.main(remote_argv) == 0
  assert _last_json(capsys) == local and _generations(cache) == before
  assert files.read_bytes(run) == (tmp_path / "run.trec").read_bytes()
  assert not os.path.exists(tmp_path / "gs:")


def _one_line(capsys, exc, pattern):
  assert exc.value.code == 2
  lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
  assert len(lines) == 1, lines
  assert pattern in lines[0], lines[0]


def test_objects_the_tool_did_not_write_are_refused_without_overwrite(st_model, tmp_path, bucket, capsys):
  corpus = _corpus(tmp_path / "corpus.jsonl", 6)
  base = ["corpus", corpus, "--model", st_model, "--block", "4"]
  foreign = f"{bucket}/foreign"
  files.write_whole(f"{foreign}/block-00000.npy", b"someone else's")
  files.write_whole(f"{foreign}/notes.txt", b"keep me")
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main([*base, "--out", foreign])
  _one_line(capsys, e, "holds files it did not write (block-00000.npy)")
  assert files.read_bytes(f"{foreign}/block-00000.npy") == b"someone else's"
  files.write_whole(f"{bucket}/model/config.json", b"{}")
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main([*base, "--out", f"{bucket}/model", "--overwrite"])
  _one_line(capsys, e, "holds a model or workdir (config.json)")
  files.write_whole(f"{bucket}/a-file", b"x")
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main([*base, "--out", f"{bucket}/a-file"])
  _one_line(capsys, e, "exists and is not a folder")
  # A run file that is not a run, and a cache prefix of foreign blocks, before the model loads.
  beir = _beir(tmp_path / "beir")
  files.write_whole(f"{bucket}/run.trec", b"not a run\n")
  beir_argv = ["beir", beir, "--model", st_model, "--block", "8"]
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main([*beir_argv, "--run", f"{bucket}/run.trec"])
  _one_line(capsys, e, "is not a run this command wrote")
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main([*beir_argv, "--cache_dir", foreign])
  _one_line(capsys, e, "--cache_dir")
  # --overwrite replaces the tool's own names and leaves the rest.
  assert embeddings_cli.main([*base, "--out", foreign, "--overwrite"]) == 0
  capsys.readouterr()
  assert files.read_bytes(f"{foreign}/notes.txt") == b"keep me"
  assert "manifest.json" in files.listdir(foreign)
  assert embeddings_cli.main([*beir_argv, "--run", f"{bucket}/run.trec", "--overwrite"]) == 0
  assert files.read_text(f"{bucket}/run.trec").splitlines()[0].endswith(" bertjax")


def test_a_missing_bucket_is_one_line(st_model, tmp_path, gcs_server, capsys):
  corpus = _corpus(tmp_path / "corpus.jsonl", 3)
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main(["corpus", corpus, "--model", st_model, "--out", "gs://no-such-bucket-here/emb"])
  _one_line(capsys, e, "gs://no-such-bucket-here: the bucket does not exist")


def test_a_sentence_transformers_folder_written_to_and_read_from_a_bucket(st_model, bucket):
  enc = encoder_lib.Encoder.load(st_model)
  out = f"{bucket}/exported"
  st_lib.write(enc.module.cfg, enc.params, enc.module.pooling, out, max_seq_length=32)
  for name in ("vocab.txt", "tokenizer_config.json"):
    files.copy(os.path.join(st_model, name), files.join(out, name))
  assert st_lib.is_folder(out) and st_lib.read_pooling(out) == enc.module.pooling
  again = encoder_lib.Encoder.load(out)
  texts = _texts(5, 3)
  np.testing.assert_array_equal(again.encode(texts), enc.encode(texts))
  assert _tree(out) == _tree(st_model)


@pytest.mark.slow
def test_a_corpus_embedding_killed_with_sigkill_resumes_in_the_bucket(st_model, tmp_path, bucket, gcs_server):
  """A real `python -m bertjax embeddings --corpus ... --out gs://...` process killed with SIGKILL part-way, then
  run again: the prefix ends byte for byte as an uninterrupted local run's folder (no half-written object)."""
  import signal
  import subprocess
  import sys
  import time
  corpus = _corpus(tmp_path / "corpus.jsonl", 60)
  out = f"{bucket}/emb"
  env = {**helpers.env(), **gcs_server.env()}

  def cmd(where):
    return [sys.executable, "-m", "bertjax", "embeddings", "corpus", corpus, "--model", st_model, "--out", where,
            "--block", "2", "--batch_size", "2"]
  killed = subprocess.Popen(cmd(out), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 180
  while killed.poll() is None and time.time() < deadline and not files.exists(f"{out}/block-00003.json"):
    time.sleep(0.05)
  killed.send_signal(signal.SIGKILL)
  assert killed.wait() == -signal.SIGKILL
  done = len([n for n in files.listdir(out) if n.endswith(".json") and n.startswith("block-")])
  assert 4 <= done < 30
  for where in (out, str(tmp_path / "whole")):
    proc = subprocess.run(cmd(where), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
  assert _tree(out) == _tree(str(tmp_path / "whole"))
  assert not os.path.exists(tmp_path / "gs:")


def _tiny_cfg(vocab):
  from bertjax import model as model_lib
  from bertjax.data import tokenizer as tokenizer_lib
  return model_lib.BertConfig(vocab_size=tokenizer_lib.load(vocab).vocab_size, hidden_size=16, num_layers=1,
                              num_heads=2, intermediate_size=32, max_position_embeddings=64, dropout_rate=0.0,
                              attention_dropout_rate=0.0)


def _batch(extra=()):
  ids = np.ones((1, 8), np.int32)
  return {"input_ids": ids, "input_mask": ids, "segment_ids": 0 * ids, **dict(extra)}


def _with_vocab(folder, vocab, subs=("",)):
  for sub in subs:
    files.copy(vocab, files.join(folder, sub, "vocab.txt") if sub else files.join(folder, "vocab.txt"))
    target = files.join(folder, sub, "tokenizer_config.json") if sub else files.join(folder, "tokenizer_config.json")
    files.write_whole(target, '{"do_lower_case": true}')
  return folder


@pytest.mark.slow
def test_sparse_multivector_and_cross_encoder_folders_in_a_bucket(make_vocab, tmp_path, bucket, monkeypatch, capsys):
  """Each kind of folder written to the bucket by its writer (`files.local_target`) and searched from there:
  the same metrics, run and folder bytes as the local folder; the reranked run read from and written to it."""
  from bertjax import convert
  from bertjax import model as model_lib
  from bertjax.embeddings.multivector import encoder as multivector
  from bertjax.embeddings.multivector import task as multivector_task
  from bertjax.embeddings.rerank import encoder as rerank
  from bertjax.embeddings.sparse import encoder as sparse
  from bertjax.model.heads import BertForPreTraining
  monkeypatch.chdir(tmp_path)
  vocab = make_vocab(WORDS, 80)
  cfg = _tiny_cfg(vocab)
  beir = _beir(tmp_path / "beir")
  files.copy(beir, f"{bucket}/beir")
  key = jax.random.key(1)
  mlm = BertForPreTraining(cfg).init(key, _batch({"masked_lm_positions": np.zeros((1, 2), np.int32)}))["params"]
  encoder = EmbeddingModel(cfg, Pooling()).init(key, _batch())["params"]
  dense = {"kernel": np.asarray(jax.random.normal(key, (16, 8)), np.float32)}

  def write_sparse(out):
    _with_vocab(out, vocab, sparse.write_folder(cfg, mlm, out, 32))

  def write_multivector(out):
    multivector_task.write_folder(cfg, {"bert": encoder["bert"], "dense": dense}, out,
                                  multivector.Settings(max_seq_length=32))
    _with_vocab(out, vocab)
  for kind, write in (("sparse", write_sparse), ("multivector", write_multivector)):
    local, remote = str(tmp_path / kind), f"{bucket}/models/{kind}"
    write(local)
    write(remote)
    assert _tree(remote) == _tree(local), kind
    results = []
    for model, where in ((local, str(tmp_path / f"{kind}.trec")), (remote, f"{bucket}/runs/{kind}.trec")):
      assert embeddings_cli.main(["beir", f"{bucket}/beir", "--model", model, "--run", where, "--top_k", "10",
                                  "--batch_size", "4"]) == 0
      results.append((_last_json(capsys), files.read_bytes(where)))
    assert results[0] == results[1], kind
  # A CrossEncoder folder in the bucket reranks a run in the bucket into a run in the bucket.
  ce = model_lib.for_task(cfg, "sequence_classification", 1).init(key, _batch())["params"]
  for out in (str(tmp_path / "ce"), f"{bucket}/models/ce"):
    with files.local_target(out) as target:
      convert.to_hf(cfg, ce, target, head="sequence_classification")
      rerank.write_folder(target, "sigmoid", 24)
    _with_vocab(out, vocab)
  assert rerank.CrossEncoder.is_model(f"{bucket}/models/ce")
  assert not sparse.SparseEncoder.is_model(f"{bucket}/models/ce") and not multivector.is_folder(f"{bucket}/models/ce")
  got = []
  for model, run, new in ((str(tmp_path / "ce"), str(tmp_path / "multivector.trec"), str(tmp_path / "re.trec")),
                          (f"{bucket}/models/ce", f"{bucket}/runs/multivector.trec", f"{bucket}/runs/re.trec")):
    assert embeddings_cli.main(["rerank", f"{bucket}/beir", run, "--model", model, "--depth", "5",
                                "--run", new, "--batch_size", "4"]) == 0
    got.append((_last_json(capsys), files.read_bytes(new)))
  assert got[0] == got[1] and got[0][0]["pairs scored"] == 40
  assert not os.path.exists(tmp_path / "gs:")
