"""Cross-encoder rerankers against sentence-transformers 6's CrossEncoder: `predict` of folders its own classes
build and save (BERT with one label and a sigmoid, RoBERTa with three labels), and reranking a TREC run of a BEIR
folder through the command line, scored as ir-measures scores the run CrossEncoder's own scores give."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

from bertjax.data import tokenizer as tokenizer_lib  # noqa: E402
from bertjax.embeddings import rerank  # noqa: E402

WORDS = ("the river runs past a city where model reads text and predicts words for every query about mountains "
         "islands bridges trains music").split()
PAIRS = [("the river runs", "past the city where a model reads text"), ("music", "trains"),
         ("query about mountains and islands " * 6, "bridges trains words " * 9), ("a model", "reads every word"),
         ("islands", "mountains islands bridges and the river " * 5)]


def _randomise(m):
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("bias") or "norm" in name.lower():
        p.add_(torch.randn_like(p) * 0.5)
  return m.eval()


@pytest.fixture(scope="module")
def bert_cross_encoder(make_vocab, tmp_path_factory):
  """An HF BertForSequenceClassification with one label (random weights) made a CrossEncoder at max_length 24 and
  saved by sentence-transformers' own classes."""
  vocab = make_vocab(WORDS, 90)
  d = tmp_path_factory.mktemp("ce")
  torch.manual_seed(0)
  m = _randomise(transformers.BertForSequenceClassification(transformers.BertConfig(
      vocab_size=tokenizer_lib.load(vocab).vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=64, num_labels=1, initializer_range=0.3)))
  m.save_pretrained(d / "hf")
  transformers.BertTokenizerFast(vocab, do_lower_case=True).save_pretrained(d / "hf")
  model = st.CrossEncoder(str(d / "hf"), device="cpu", max_length=24)
  model.save(str(d / "ce"))
  return str(d / "ce"), st.CrossEncoder(str(d / "ce"), device="cpu")


def test_bert_cross_encoder_predicts_as_sentence_transformers(bert_cross_encoder):
  path, theirs = bert_cross_encoder
  ce = rerank.CrossEncoder.load(path)
  assert (ce.num_labels, ce.activation, ce.max_length) == (1, "sigmoid", 24)
  ours, ref = ce.predict(PAIRS, batch_size=2), theirs.predict(PAIRS)
  assert ours.shape == ref.shape == (len(PAIRS),)
  np.testing.assert_allclose(ours, ref, atol=1e-5)
  assert np.ptp(ref) > 1e-3  # the pairs score differently: the comparison is not vacuous


def test_roberta_cross_encoder_with_three_labels_predicts_as_sentence_transformers(tmp_path):
  """<s> q </s></s> d </s>, no segment ids, three labels with the identity activation."""
  import codecs

  from bertjax.data import tokenizer
  (tmp_path / "corpus.txt").write_text(codecs.decode(__import__("this").s, "rot13") + "\n" + " ".join(WORDS) * 3,
                                       encoding="utf-8")
  tok_dir = tokenizer.train([tmp_path / "corpus.txt"], tmp_path / "hf", kind="byte_bpe", vocab_size=400)
  hf_tok = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path / "hf"))
  torch.manual_seed(1)
  m = _randomise(transformers.RobertaForSequenceClassification(transformers.RobertaConfig(
      vocab_size=tokenizer.load(tok_dir).vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, num_labels=3,
      initializer_range=0.3)))
  m.save_pretrained(tmp_path / "hf")
  hf_tok.save_pretrained(tmp_path / "hf")
  st.CrossEncoder(str(tmp_path / "hf"), device="cpu", max_length=20).save(str(tmp_path / "ce"))
  theirs = st.CrossEncoder(str(tmp_path / "ce"), device="cpu")
  ce = rerank.CrossEncoder.load(str(tmp_path / "ce"))
  assert (ce.num_labels, ce.activation, ce.max_length) == (3, "identity", 20)
  ref = theirs.predict(PAIRS)
  assert ref.shape == (len(PAIRS), 3)
  np.testing.assert_allclose(ce.predict(PAIRS), ref, atol=1e-5)
  ids = hf_tok(PAIRS[0][0], PAIRS[0][1], truncation=True, max_length=20)["input_ids"]
  assert ce.rows(PAIRS[:1])[0][0] == ids


def test_reranking_a_run_equals_ir_measures_on_cross_encoder_scores(bert_cross_encoder, tmp_path, capsys):
  """`python -m bertjax embeddings --beir F --rerank RUN --depth 5`: each judged query's top 5 documents of the run
  re-scored; the metrics before and after equal ir-measures' on the input run and on the run of
  CrossEncoder.predict's scores, and the new run file holds those scores."""
  ir_measures = pytest.importorskip("ir_measures")
  from bertjax.cli import embeddings as embeddings_cli
  path, theirs = bert_cross_encoder
  rng = np.random.default_rng(5)
  docs = {f"d{i}": " ".join(rng.choice(WORDS, 7)) for i in range(20)}
  queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(6)}
  qrels = {q: {f"d{j}": 1 for j in rng.choice(20, 3, replace=False)} for q in list(queries)[:5]}  # q5 unjudged
  beir = tmp_path / "beir"
  (beir / "qrels").mkdir(parents=True)
  (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
  (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
  (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{q}\t{d}\t1\n" for q, ds in qrels.items() for d in ds))
  first = {q: {d: float(s) for d, s in zip(docs, rng.normal(size=len(docs)))} for q in queries}
  (tmp_path / "first.trec").write_text("".join(f"{q} Q0 {d} 0 {s:.6f} bm25\n" for q, ds in first.items()
                                               for d, s in ds.items()))
  assert embeddings_cli.main(["--model", path, "--beir", str(beir), "--rerank", str(tmp_path / "first.trec"),
                              "--depth", "5", "--run", str(tmp_path / "new.trec"), "--batch_size", "4"]) == 0
  got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  measures = {"ndcg@10": ir_measures.nDCG @ 10, "mrr@10": ir_measures.RR @ 10, "recall@100": ir_measures.R @ 100,
              "map": ir_measures.AP}
  gold = [ir_measures.Qrel(q, d, 1) for q, ds in qrels.items() for d in ds]

  def scored(run):
    return ir_measures.calc_aggregate(list(measures.values()), gold, [
        ir_measures.ScoredDoc(q, d, s) for q, ds in run.items() for d, s in ds.items()])
  first_read = {q: {d: round(s, 6) for d, s in ds.items()} for q, ds in first.items() if q in qrels}
  want_before = scored(first_read)
  top = {q: sorted(ds, key=lambda d: -ds[d])[:5] for q, ds in first_read.items()}
  want_run = {q: {d: float(s) for d, s in zip(ds, theirs.predict([(queries[q], docs[d]) for d in ds]))}
              for q, ds in top.items()}
  want_after = scored(want_run)
  lines = [line.split() for line in (tmp_path / "new.trec").read_text().splitlines()]
  assert len(lines) == 25
  for q, _, d, _, s, _ in lines:
    assert float(s) == pytest.approx(want_run[q][d], abs=1e-5)
  for name, m in measures.items():
    assert got[f"{name} before"] == pytest.approx(want_before[m], abs=1e-6), name
    assert got[name] == pytest.approx(want_after[m], abs=1e-6), name
  assert got["pairs scored"] == 25 and got["queries of the run without judgements"] == 1


def test_a_run_that_names_unknown_documents_or_repeats_one_is_one_line(tmp_path):
  from bertjax import errors
  (tmp_path / "a.trec").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d9 2 1.0 x\n")
  with pytest.raises(errors.DataError, match=r"a.trec:2: document 'd9' is not in the corpus"):
    rerank.read_run(str(tmp_path / "a.trec"), ["d1", "d2"])
  (tmp_path / "b.trec").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d1 2 1.0 x\n")
  with pytest.raises(errors.DataError, match=r"b.trec:2: document 'd1' is listed twice for query 'q1'"):
    rerank.read_run(str(tmp_path / "b.trec"))
  (tmp_path / "c.trec").write_text("q1 d1 2.0\n")
  with pytest.raises(errors.DataError, match=r"c.trec:1: not a TREC run line"):
    rerank.read_run(str(tmp_path / "c.trec"))


def test_longest_first_truncation_equals_hf_tokenizers():
  """Every split of two texts of 0-12 pieces at every budget equals HF tokenizers' LongestFirst on a pair."""
  from tokenizers import Tokenizer, models
  tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(30)}, unk_token="w0"))
  from tokenizers.pre_tokenizers import WhitespaceSplit
  tok.pre_tokenizer = WhitespaceSplit()
  for n1 in range(13):
    for n2 in range(13):
      for budget in range(1, 15):
        a, b = list(range(1, n1 + 1)), list(range(1, n2 + 1))
        tok.enable_truncation(budget, strategy="longest_first")
        enc = tok.encode(" ".join(f"w{i}" for i in a), " ".join(f"w{i}" for i in b))
        want = (sum(1 for s in enc.sequence_ids if s == 0), sum(1 for s in enc.sequence_ids if s == 1))
        rerank.truncate_longest_first(a, b, budget)
        assert (len(a), len(b)) == want, (n1, n2, budget)
