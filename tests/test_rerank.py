"""Cross-encoder rerankers against sentence-transformers 6's CrossEncoder: `predict` of folders its own classes
build and save (BERT with one label and a sigmoid, RoBERTa with three labels), and reranking a TREC run of a BEIR
folder through the command line, scored as ir-measures scores the run CrossEncoder's own scores give."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import helpers  # noqa: E402

from bertjax.data import tokenizer as tokenizer_lib  # noqa: E402
from bertjax.embeddings.rerank import encoder as rerank  # noqa: E402

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
  """`python -m bertjax embeddings rerank F RUN --depth 5`: each judged query's top 5 documents of the run
  re-scored; the metrics before and after equal ir-measures' on the input run and on the run of
  CrossEncoder.predict's scores, and the new run file holds those scores."""
  ir_measures = pytest.importorskip("ir_measures")
  from bertjax.cli import embeddings as embeddings_cli
  path, theirs = bert_cross_encoder
  rng = np.random.default_rng(5)
  docs = {f"d{i}": " ".join(rng.choice(WORDS, 7)) for i in range(20)}
  queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(6)}
  qrels = {q: {f"d{j}": 1 for j in rng.choice(20, 3, replace=False)} for q in list(queries)[:5]}  # q5 unjudged
  beir = helpers.write_beir(tmp_path / "beir", docs, queries, qrels)
  first = {q: {d: float(s) for d, s in zip(docs, rng.normal(size=len(docs)))} for q in queries}
  (tmp_path / "first.trec").write_text("".join(f"{q} Q0 {d} 0 {s:.6f} bm25\n" for q, ds in first.items()
                                               for d, s in ds.items()))
  assert embeddings_cli.main(["rerank", str(beir), str(tmp_path / "first.trec"), "--model", path,
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


def _write_rerank_rows(path, n, seed, per_query=2):
  """(query, document, label): `per_query` documents a query, the first relevant (it holds the query's first
  word), the others holding other topics."""
  import csv
  import random
  rng = random.Random(seed)
  topics, filler = WORDS[5:], WORDS[:5]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["query", "document", "label"])
    for i in range(n):
      t = topics[(i // per_query) % len(topics)]
      other = topics[(i // per_query + 4 + i % per_query) % len(topics)]
      relevant = i % per_query == 0
      # Every third query of a dev file labels its second document instead: rankings that are not all perfect.
      label = relevant != (per_query > 2 and (i // per_query) % 3 == 0 and i % per_query < 2)
      if i % per_query == 0:
        query = f"{t} " + " ".join(rng.sample(filler, 2))
      w.writerow([query,
                  " ".join(rng.sample(filler, 3)) + f" {t if relevant else other}", int(label)])


@pytest.mark.slow
def test_rerank_training_on_8_devices_equals_1_device_and_exports_a_cross_encoder(bert_cross_encoder, tmp_path):
  """task=rerank through the real loop from a CrossEncoder folder: its loss is sentence-transformers'
  BinaryCrossEntropyLoss on the same pairs; 8 fake devices (fsdp) and 1 give the same losses and parameters; the
  report's reranking metrics equal ir-measures' on the model's scores; the export is a CrossEncoder folder that
  sentence-transformers predicts with as the run's model does."""
  import jax
  ir_measures = pytest.importorskip("ir_measures")
  from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

  from bertjax import finetune, predict
  from bertjax import tasks as tasks_lib
  from bertjax.cli import convert as convert_cli
  from bertjax.embeddings.rerank import task as rerank_task
  from configs import common
  from configs import finetune as finetune_config
  path, theirs = bert_cross_encoder
  _write_rerank_rows(tmp_path / "train.csv", 32, 0)
  _write_rerank_rows(tmp_path / "dev.csv", 24, 1, per_query=4)

  def config():
    c = finetune_config.get_config(f"task=rerank,init={path},lr=1e-3,batch=8,epochs=1,seq=24")
    c.data.train_file, c.data.eval_file = str(tmp_path / "train.csv"), str(tmp_path / "dev.csv")
    c.data.text_a_column, c.data.text_b_column, c.data.label_column = "query", "document", "label"
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    c.sharding, c.log_every = common.sharding("fsdp"), 1
    return c
  # The kind's loss on the start's weights equals sentence-transformers' BinaryCrossEntropyLoss.
  c = config()
  task = tasks_lib.get("rerank", config=c)
  kind = tasks_lib.kind(task)
  cfg, params, tok_path, lower = kind.weights(task, path, {})
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  rows = rerank_task.read(str(tmp_path / "train.csv"), c)
  feats = rerank_task.featurize(rows, tok, 24)
  out = kind.head(task, cfg).apply({"params": params}, {k: feats[k] for k in ("input_ids", "input_mask",
                                                                               "segment_ids")})
  ours = kind.loss(task, out, {"labels": feats["labels"], "example_weights": np.ones(len(rows), np.float32)})
  theirs.eval()
  with torch.no_grad():
    want = BinaryCrossEntropyLoss(theirs)([[r["text_a"] for r in rows], [r["text_b"] for r in rows]],
                                          torch.tensor(feats["labels"]))
  np.testing.assert_allclose(float(ours), float(want), rtol=1e-5)
  # 8 devices = 1 through the real loop.
  runs, losses = {}, {}
  for name, devices in (("eight", jax.devices()), ("one", jax.devices()[:1])):
    runs[name] = finetune.finetune(config(), str(tmp_path / name), devices=devices)
    losses[name] = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / name))]
  assert len(losses["one"]) == 4
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(runs["eight"]["state"].params),
                  jax.tree_util.tree_leaves(runs["one"]["state"].params)):
    # Adam moves a weight whose gradient is near 0 by up to lr (1e-3) a step either way: 5e-5 is 5% of a step.
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)
  # The report's metrics are ir-measures' on the trained model's scores of the dev pairs.
  dev = rerank_task.read(str(tmp_path / "dev.csv"), c)
  w = str(tmp_path / "one")
  ce = rerank.CrossEncoder.load(w)
  scores = ce.predict([(r["text_a"], r["text_b"]) for r in dev])
  qid = {q: f"q{i}" for i, q in enumerate(dict.fromkeys(r["text_a"] for r in dev))}
  run = [ir_measures.ScoredDoc(qid[r["text_a"]], f"d{i}", float(s)) for i, (r, s) in enumerate(zip(dev, scores))]
  gold = [ir_measures.Qrel(qid[r["text_a"]], f"d{i}", int(r["label"] >= 0.5)) for i, r in enumerate(dev)]
  measures = {"ndcg@10": ir_measures.nDCG @ 10, "mrr@10": ir_measures.RR @ 10, "map": ir_measures.AP}
  want = ir_measures.calc_aggregate(list(measures.values()), gold, run)
  got = runs["one"]["report"]["epochs"][-1]["validation"]
  for name, m in measures.items():
    assert got[name] == pytest.approx(want[m], abs=1e-6), name
  # Exported as a CrossEncoder folder: sentence-transformers predicts as the workdir does, and so does bertjax.
  assert convert_cli.write(w, str(tmp_path / "ce")) == "CrossEncoder"
  exported = st.CrossEncoder(str(tmp_path / "ce"), device="cpu")
  assert exported.max_length == 24
  pairs = [(r["text_a"], r["text_b"]) for r in dev] + PAIRS
  np.testing.assert_allclose(exported.predict(pairs), ce.predict(pairs), atol=1e-5)
  np.testing.assert_allclose(rerank.CrossEncoder.load(str(tmp_path / "ce")).predict(pairs), ce.predict(pairs),
                             atol=1e-5)
  assert predict.predict_text(w, text=dev[0]["text_a"], pair=dev[0]["text_b"])["score"] == pytest.approx(
      float(scores[0]), abs=1e-5)


def test_weighted_bce_equals_sentence_transformers_pos_weight(bert_cross_encoder, tmp_path):
  """rerank.pos_weight: the kind's loss on the start's weights equals sentence-transformers' BinaryCrossEntropyLoss
  with the same pos_weight on pairs with hard and soft labels; a weight that is not positive, or one given to the
  listwise loss, is a one-line config error."""
  from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

  from bertjax import errors
  from bertjax import tasks as tasks_lib
  from bertjax.embeddings.rerank import task as rerank_task
  from configs import finetune as finetune_config
  path, theirs = bert_cross_encoder
  _write_rerank_rows(tmp_path / "train.csv", 12, 3)
  rows_text = (tmp_path / "train.csv").read_text().splitlines()
  # Two soft labels among the binary ones: the weight scales y·log σ(x) only.
  rows_text[1] = rows_text[1].rsplit(",", 1)[0] + ",0.7"
  rows_text[2] = rows_text[2].rsplit(",", 1)[0] + ",0.2"
  (tmp_path / "train.csv").write_text("\n".join(rows_text) + "\n")
  c = finetune_config.get_config(f"task=rerank,init={path},seq=24")
  c.data.text_a_column, c.data.text_b_column, c.data.label_column = "query", "document", "label"
  c.rerank.pos_weight = 4.0
  task = tasks_lib.get("rerank", config=c)
  kind = tasks_lib.kind(task)
  cfg, params, tok_path, lower = kind.weights(task, path, {})
  rows = rerank_task.read(str(tmp_path / "train.csv"), c)
  assert {r["label"] for r in rows} >= {0.0, 1.0, 0.7}
  feats = rerank_task.featurize(rows, tokenizer_lib.load(tok_path, do_lower_case=lower), 24)
  out = kind.head(task, cfg).apply({"params": params}, {k: feats[k] for k in ("input_ids", "input_mask",
                                                                               "segment_ids")})
  ours = kind.loss(task, out, {"labels": feats["labels"], "example_weights": np.ones(len(rows), np.float32)})
  plain = kind.loss(tasks_lib.get("rerank"), out, {"labels": feats["labels"],
                                                   "example_weights": np.ones(len(rows), np.float32)})
  theirs.eval()
  texts = [[r["text_a"] for r in rows], [r["text_b"] for r in rows]]
  with torch.no_grad():
    want = BinaryCrossEntropyLoss(theirs, pos_weight=torch.tensor(4.0))(texts, torch.tensor(feats["labels"]))
    want_plain = BinaryCrossEntropyLoss(theirs)(texts, torch.tensor(feats["labels"]))
  np.testing.assert_allclose(float(ours), float(want), rtol=1e-5)
  np.testing.assert_allclose(float(plain), float(want_plain), rtol=1e-5)
  assert float(ours) > float(plain) * 1.2
  for loss, weight, match in (("bce", 0.0, "must be positive"), ("listnet", 2.0, "weights the bce loss")):
    c.rerank.loss, c.rerank.pos_weight = loss, weight
    with pytest.raises(errors.ConfigError, match=match):
      tasks_lib.get("rerank", config=c)


def test_listnet_equals_sentence_transformers_on_queries_of_unequal_lists(bert_cross_encoder, tmp_path):
  """rerank.loss=listnet: the kind's listwise loss on the start's weights equals sentence-transformers'
  ListNetLoss on the same queries (3 and 4 documents, graded labels)."""
  from sentence_transformers.cross_encoder.losses import ListNetLoss

  from bertjax import tasks as tasks_lib
  from bertjax.embeddings.rerank import task as rerank_task
  from configs import finetune as finetune_config
  path, theirs = bert_cross_encoder
  lists = [("the river runs", ["past the city", "music", "a model reads text", "trains"], [1.0, 0.0, 0.5, 0.0]),
           ("islands and mountains " * 4, ["mountains islands bridges " * 5, "words", "every query"], [0.0, 1.0, 0.2])]
  with open(tmp_path / "lists.csv", "w") as f:
    f.write("query,document,label\n" + "".join(f'"{q}","{d}",{y}\n' for q, ds, ys in lists for d, y in zip(ds, ys)))
  c = finetune_config.get_config(f"task=rerank,init={path},seq=24")
  c.data.text_a_column, c.data.text_b_column, c.data.label_column = "query", "document", "label"
  c.rerank.loss = "listnet"
  task = tasks_lib.get("rerank", config=c)
  kind = tasks_lib.kind(task)
  cfg, params, tok_path, lower = kind.weights(task, path, {})
  feats = rerank_task.featurize_lists(rerank_task.read(str(tmp_path / "lists.csv"), c),
                                      tokenizer_lib.load(tok_path, do_lower_case=lower), 24)
  assert feats["list_input_ids"].shape[:2] == (2, 4) and feats["list_weights"].sum() == 7
  batch = {**feats, "example_weights": np.ones(2, np.float32)}
  module = kind.head(task, cfg.replace(dropout_rate=0.0, attention_dropout_rate=0.0))
  import jax
  ours, _ = kind.value_and_grad(task, module, params, batch, {"dropout": jax.random.key(0)})
  theirs.eval()
  with torch.no_grad():
    want = ListNetLoss(theirs)([[q for q, _, _ in lists], [ds for _, ds, _ in lists]],
                               [torch.tensor(ys) for _, _, ys in lists])
  np.testing.assert_allclose(float(ours), float(want), rtol=1e-5)


@pytest.mark.slow
def test_listnet_training_on_8_devices_equals_1_device(bert_cross_encoder, tmp_path):
  import jax

  from bertjax import finetune
  from configs import common
  from configs import finetune as finetune_config
  path, _ = bert_cross_encoder
  _write_rerank_rows(tmp_path / "train.csv", 64, 0, per_query=4)
  losses, params = {}, {}
  for name, devices in (("eight", jax.devices()), ("one", jax.devices()[:1])):
    c = finetune_config.get_config(f"task=rerank,init={path},lr=1e-3,batch=8,epochs=1,seq=24")
    c.data.train_file = str(tmp_path / "train.csv")
    c.data.text_a_column, c.data.text_b_column, c.data.label_column = "query", "document", "label"
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    c.sharding, c.log_every, c.rerank.loss = common.sharding("fsdp"), 1, "listnet"
    out = finetune.finetune(c, str(tmp_path / name), devices=devices)
    losses[name] = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / name))]
    params[name] = jax.tree_util.tree_leaves(out["state"].params)
  assert len(losses["one"]) == 2  # 16 queries of 4 documents, 8 queries a step
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  for a, b in zip(params["eight"], params["one"]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)


def test_reranking_many_lengths_compiles_a_few_programs(bert_cross_encoder):
  """Pairs of every length up to 64 tokens: the scores are sentence-transformers' and the command compiles at most
  four programs (jit's cache counts them), not one per multiple of 8."""
  path, _ = bert_cross_encoder
  theirs = st.CrossEncoder(path, device="cpu", max_length=64)
  words = " ".join(WORDS * 4).split()
  pairs = [(" ".join(words[:1 + i % 7]), " ".join(words[i % 11:i % 11 + 2 + 2 * i])) for i in range(40)]
  ce = rerank.CrossEncoder.load(path, max_length=64)
  ours = ce.predict(pairs, batch_size=4)
  np.testing.assert_allclose(ours, theirs.predict(pairs), atol=1e-5)
  lengths = {len(r) for r, _, _ in ce.rows(pairs)}
  assert len({-(-n // 8) for n in lengths}) >= 7  # without buckets: one program per multiple of 8
  assert 1 <= ce._apply._cache_size() <= 4
  ce.predict(pairs[::-1][:9], batch_size=4)
  assert ce._apply._cache_size() <= 4  # a second call reuses them
