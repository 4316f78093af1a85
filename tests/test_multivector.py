"""Multi-vector (ColBERT) encoders against sentence-transformers 6's MultiVectorEncoder: encode_query and
encode_document of a folder its own classes build and save (prompt markers as added tokens, a 128-style Dense
projection, query expansion with [MASK], the punctuation skiplist on documents, unit vectors), and MaxSim."""
import string

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

from bertjax.convert.table import ConversionError  # noqa: E402
from bertjax.embeddings import multivector  # noqa: E402

WORDS = ("the river runs past a city where model reads text and predicts words for every query about mountains "
         "islands bridges trains music").split()
QUERIES = ["the river runs?", "music", "query about mountains, islands and bridges " * 3]
DOCS = ["past the city, where a model reads text.", "trains! music; words", "every query about mountains " * 6]


@pytest.fixture(scope="module", params=[False, True], ids=["expansion", "attend"])
def mve_folder(request, make_vocab, tmp_path_factory):
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.multi_vector_encoder import MultiVectorEncoder
  from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
  vocab = make_vocab(WORDS + list(".,!?;"), 90)
  d = tmp_path_factory.mktemp("mve")
  with open(vocab, encoding="utf-8") as f:
    pieces = f.read().splitlines()
  (d / "vocab.txt").write_text("\n".join(pieces + ["[Q]", "[D]"]) + "\n", encoding="utf-8")
  torch.manual_seed(0)
  m = transformers.BertModel(transformers.BertConfig(vocab_size=len(pieces) + 2, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64,
                                                     max_position_embeddings=64), add_pooling_layer=False)
  m.save_pretrained(d / "hf")
  tok = transformers.BertTokenizerFast(str(d / "vocab.txt"), do_lower_case=True)
  tok.add_tokens(["[Q]", "[D]"])
  tok.save_pretrained(d / "hf")
  tr = Transformer(str(d / "hf"), max_seq_length=48, query_length=12, document_length=20,
                   query_expansion={"strategy": "fixed", "length": 12, "attend": request.param})
  model = MultiVectorEncoder(modules=[tr, Dense(32, 16, bias=False, activation_function=torch.nn.Identity(),
                                                module_input_name="token_embeddings"),
                                      MultiVectorMask(skiplist_words=list(string.punctuation)),
                                      Normalize(module_input_name="token_embeddings")],
                             prompts={"query": "[Q] ", "document": "[D] "}, device="cpu")
  model.save(str(d / "st"))
  return str(d / "st"), MultiVectorEncoder(str(d / "st"), device="cpu")


def test_multi_vector_encoding_and_maxsim_equal_sentence_transformers(mve_folder):
  path, theirs = mve_folder
  enc = multivector.MultiVectorEncoder.load(path)
  q, d = enc.encode(QUERIES, task="query", batch_size=2), enc.encode(DOCS, task="document", batch_size=2)
  tq, td = theirs.encode_query(QUERIES), theirs.encode_document(DOCS)
  for ours, ref in zip(q + d, list(tq) + list(td)):
    ref = ref.numpy()
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=1e-5)
  assert [len(x) for x in q] == [12, 12, 12]  # expansion to 12 ([MASK]), the long query cut to 12
  assert len(d[0]) < 20 and len(d[2]) == 20  # punctuation dropped; the long document cut at document_length
  np.testing.assert_allclose(enc.score(q, d), theirs.similarity(tq, td).numpy(), rtol=1e-5, atol=1e-5)


def test_a_folder_with_a_module_bertjax_does_not_compute_is_one_line(mve_folder, tmp_path):
  import json
  import shutil
  path, _ = mve_folder
  shutil.copytree(path, tmp_path / "m")
  stack = json.loads((tmp_path / "m" / "modules.json").read_text())
  stack[1]["type"] = "sentence_transformers.base.modules.Pooling"
  (tmp_path / "m" / "modules.json").write_text(json.dumps(stack))
  with pytest.raises(ConversionError, match=r"not supported: \['Pooling'\]"):
    multivector.MultiVectorEncoder.load(str(tmp_path / "m"))


def test_maxsim_beir_search_equals_ir_measures_on_sentence_transformers_scores(mve_folder, tmp_path, capsys):
  """`python -m bertjax embeddings --beir` with a MultiVectorEncoder folder: exact MaxSim over the corpus in
  blocks of 7 documents split over the 8-device mesh; the metrics equal ir-measures' on the run of
  sentence-transformers' own MaxSim scores, and the run file holds those scores."""
  import json
  ir_measures = pytest.importorskip("ir_measures")
  from bertjax.cli import embeddings as embeddings_cli
  path, theirs = mve_folder
  rng = np.random.default_rng(4)
  docs = {f"d{i}": " ".join(rng.choice(WORDS + [",", "."], 8)) for i in range(23)}
  queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(6)}
  qrels = {q: {f"d{j}": 1 for j in rng.choice(23, 2, replace=False)} for q in queries}
  beir = tmp_path / "beir"
  (beir / "qrels").mkdir(parents=True)
  (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
  (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
  (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{q}\t{d}\t1\n" for q, ds in qrels.items() for d in ds))
  assert embeddings_cli.main(["--model", path, "--beir", str(beir), "--run", str(tmp_path / "run.trec"),
                              "--block", "7", "--top_k", "23"]) == 0
  got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  sims = theirs.similarity(theirs.encode_query(list(queries.values())),
                           theirs.encode_document(list(docs.values()))).numpy()
  run = [ir_measures.ScoredDoc(q, d, float(sims[i, j])) for i, q in enumerate(queries) for j, d in enumerate(docs)]
  measures = {"ndcg@10": ir_measures.nDCG @ 10, "mrr@10": ir_measures.RR @ 10, "recall@100": ir_measures.R @ 100,
              "map": ir_measures.AP}
  want = ir_measures.calc_aggregate(list(measures.values()),
                                    [ir_measures.Qrel(q, d, 1) for q, ds in qrels.items() for d in ds], run)
  for name, m in measures.items():
    assert got[name] == pytest.approx(want[m], abs=1e-6), name
  lines = [line.split() for line in (tmp_path / "run.trec").read_text().splitlines()]
  assert len(lines) == len(queries) * len(docs)
  for q, _, d, _, s, _ in lines:
    assert float(s) == pytest.approx(float(sims[int(q[1:]), int(d[1:])]), abs=1e-4)
