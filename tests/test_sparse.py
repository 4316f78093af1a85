"""Sparse lexical encoders (SPLADE) against sentence-transformers 6's SparseEncoder: encoding of folders built by
its own modules, max_active_dims, and SpladeLoss (ranking loss + FLOPS regularisers) on the same embeddings."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import helpers  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bertjax.convert.table import ConversionError  # noqa: E402
from bertjax.data import tokenizer as tokenizer_lib  # noqa: E402
from bertjax.embeddings.sparse import encoder as sparse  # noqa: E402

WORDS = ("the river runs past a city where model reads text and predicts words for every query about mountains "
         "islands bridges trains music").split()
TEXTS = ["the river runs past the city", "a model reads text", "query about mountains and islands " * 12,
         "music", "bridges trains words predicts every model"]


@pytest.fixture(scope="module")
def splade_folder(make_vocab, tmp_path_factory):
  """An HF BertForMaskedLM (random weights, biases moved off zero) and the SparseEncoder sentence-transformers
  builds on it (fill-mask Transformer at max_seq_length 24, SpladePooling max / relu), saved by its own classes."""
  vocab = make_vocab(WORDS, 90)
  d = tmp_path_factory.mktemp("splade")
  tok = tokenizer_lib.load(vocab)
  torch.manual_seed(0)
  m = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=64, pad_token_id=tok.pad_id))
  with torch.no_grad():
    m.cls.predictions.bias.normal_(0, 1.0)  # many terms above 0, so max pooling and pruning both matter
  m.save_pretrained(d / "mlm")
  (d / "mlm" / "vocab.txt").write_text(open(vocab, encoding="utf-8").read(), encoding="utf-8")
  (d / "mlm" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                               "do_lower_case": True}))
  from sentence_transformers.base.modules import Transformer
  from sentence_transformers.sparse_encoder import SparseEncoder
  from sentence_transformers.sparse_encoder.modules import SpladePooling
  model = SparseEncoder(modules=[Transformer(str(d / "mlm"), transformer_task="fill-mask", max_seq_length=24),
                                 SpladePooling(pooling_strategy="max", activation_function="relu")], device="cpu")
  model.save(str(d / "st"))
  return str(d / "st"), SparseEncoder(str(d / "st"), device="cpu")


def test_sparse_encoding_equals_sentence_transformers(splade_folder):
  path, theirs = splade_folder
  enc = sparse.SparseEncoder.load(path)
  assert (enc.pooling, enc.activation, enc.max_seq_length) == ("max", "relu", 24)
  ours = enc.encode(TEXTS, batch_size=2)
  ref = theirs.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
  assert ours.shape == ref.shape == (len(TEXTS), enc.tok.vocab_size)
  np.testing.assert_allclose(ours, ref, atol=1e-5)
  active = sparse.active_dims(ours)
  assert (active > 5).all() and (active < ours.shape[1]).all()  # sparse, not empty: the check is not vacuous
  # max_active_dims keeps each vector's largest terms, as sentence-transformers' does
  pruned = enc.encode(TEXTS, max_active_dims=4)
  ref4 = theirs.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False, max_active_dims=4).numpy()
  assert (sparse.active_dims(pruned) == 4).all()
  np.testing.assert_allclose(pruned, ref4, atol=1e-5)


def test_sum_pooling_and_log1p_relu_equal_their_definitions():
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 2, (3, 7, 11)).astype(np.float32)
  mask = (np.arange(7)[None] < np.array([[7], [4], [1]])).astype(np.int32)
  for pooling, activation in (("max", "relu"), ("sum", "relu"), ("max", "log1p_relu"), ("sum", "log1p_relu")):
    x = np.log1p(np.maximum(logits * mask[..., None], 0))
    x = np.log1p(x) if activation == "log1p_relu" else x
    want = x.max(1) if pooling == "max" else x.sum(1)
    np.testing.assert_allclose(np.asarray(sparse.splade_pool(jnp.asarray(logits), jnp.asarray(mask), pooling,
                                                             activation)), want, rtol=1e-6)


@pytest.mark.parametrize("pooling", ["max", pytest.param("sum", marks=pytest.mark.slow)])
def test_packed_rows_give_each_text_its_unpacked_term_vector(splade_folder, pooling):
  """Short pairs are packed for training (several examples' texts end to end, each its own attention segment):
  every text's term vector pooled over its own segment equals the vector of that text alone in a padded row."""
  import jax

  from bertjax.data import packing
  from bertjax.embeddings.dense.task import featurize
  path, _ = splade_folder
  enc = sparse.SparseEncoder.load(path)
  module = sparse.SparseModel(enc.cfg, pooling=pooling, activation="log1p_relu")
  rows = [{"anchor": a, "docs": [d, n], "score": 0.0} for a, d, n in
          zip(TEXTS, TEXTS[1:] + TEXTS[:1], TEXTS[2:] + TEXTS[:2])]
  feats = featurize(rows, enc.tok, 24)
  packed, members = packing.pack_contrastive(feats, 144, 3)  # rows of 144 tokens: room for several examples
  assert any(len(m) > 1 for m in members)  # some row holds several examples
  params = {"params": enc.params}
  plain = jax.tree.map(np.asarray, module.apply(params, {k: feats[k] for k in (
      "input_ids", "input_mask", "segment_ids", "doc_input_ids", "doc_input_mask")}))
  keys = ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids", "text_segments")
  out = jax.tree.map(np.asarray, module.apply(params, {k: packed[k] for k in keys}))
  for r, m in enumerate(members):
    for slot, j in enumerate(m):
      np.testing.assert_allclose(out["embedding"][r, slot], plain["embedding"][j], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(out["doc_embedding"][r, slot], plain["doc_embedding"][j], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("negatives,query_weight", [(0, 5e-5), (1, None)])
def test_splade_loss_equals_sentence_transformers(splade_folder, negatives, query_weight):
  """SpladeLoss(SparseMultipleNegativesRankingLoss) on the same non-negative embeddings: each part equal."""
  from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
  _, model = splade_folder
  rng = np.random.default_rng(1)
  b, v = 6, 40
  emb = [np.maximum(rng.normal(0, 1, (b, v)), 0).astype(np.float32) for _ in range(2 + negatives)]
  loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model, scale=1.0), document_regularizer_weight=3e-5,
                    query_regularizer_weight=query_weight)
  theirs = loss.loss.compute_loss_from_embeddings([torch.tensor(e) for e in emb], None)
  doc = loss.document_regularizer.compute_loss_from_embeddings(torch.cat([torch.tensor(e) for e in emb[1:]]))
  ours = sparse.splade_loss(jnp.asarray(emb[0]), jnp.concatenate([jnp.asarray(e) for e in emb[1:]]),
                            document_weight=3e-5, query_weight=query_weight)
  np.testing.assert_allclose(float(ours["base_loss"]), float(theirs), rtol=1e-5)
  np.testing.assert_allclose(float(ours["document_regularizer_loss"]), 3e-5 * float(doc), rtol=1e-5)
  if query_weight is None:
    assert "query_regularizer_loss" not in ours
  else:
    q = loss.query_regularizer.compute_loss_from_embeddings(torch.tensor(emb[0]))
    np.testing.assert_allclose(float(ours["query_regularizer_loss"]), query_weight * float(q), rtol=1e-5)
  # padding rows (weight 0) count for nothing
  w = jnp.asarray([1, 1, 1, 1, 1, 0], jnp.float32)
  padded = sparse.splade_loss(jnp.asarray(emb[0]), jnp.concatenate([jnp.asarray(e) for e in emb[1:]]), 3e-5,
                              query_weight, weights=w)
  cut = sparse.splade_loss(jnp.asarray(emb[0][:5]), jnp.concatenate([jnp.asarray(e[:5]) for e in emb[1:]]), 3e-5,
                           query_weight)
  np.testing.assert_allclose(float(padded["loss"]), float(cut["loss"]), rtol=1e-5)


def test_a_folder_that_is_not_a_sparse_encoder_is_one_line(splade_folder, tmp_path):
  path, _ = splade_folder
  (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "path": "", "type": "x.Transformer"},
                                                     {"idx": 1, "path": "1_Pooling", "type": "x.Pooling"}]))
  with pytest.raises(ConversionError, match=r"modules \['Transformer', 'Pooling'\] are not a sparse encoder's"):
    sparse.SparseEncoder.load(str(tmp_path))
  encoder_only = tmp_path / "encoder"
  transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32)).save_pretrained(
      encoder_only)
  with pytest.raises(ConversionError, match="MLM head"):
    sparse.SparseEncoder.load(str(encoder_only))


def _write_sparse_pairs(path, n, seed):
  """Anchors and positives that share a content word (learnable by exact match), negatives that do not."""
  import csv
  import random
  rng = random.Random(seed)
  topics, filler = WORDS[5:], WORDS[:5]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["anchor", "positive", "negative"])
    for i in range(n):
      t, other = topics[i % len(topics)], topics[(i + 3) % len(topics)]
      w.writerow([f"{t} " + " ".join(rng.sample(filler, 2)), " ".join(rng.sample(filler, 3)) + f" {t}",
                  " ".join(rng.sample(filler, 3)) + f" {other}"])


def _sparse_config(init, tmp_path, batch=8, epochs=1):
  from configs import common
  from configs import finetune as finetune_config
  c = finetune_config.get_config(f"task=sparse,init={init},lr=1e-3,batch={batch},epochs={epochs},seq=16")
  c.data.train_file, c.data.eval_file = str(tmp_path / "train.csv"), str(tmp_path / "dev.csv")
  c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
  c.embedding.negative_columns, c.log_every = ("negative",), 1
  c.sparse.document_regularizer_weight = c.sparse.query_regularizer_weight = 3e-2  # large enough to matter
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0  # masks are drawn per shard layout
  c.sharding = common.sharding("fsdp")
  return c


@pytest.mark.slow
def test_sparse_training_on_8_devices_equals_1_device_and_exports_a_sparse_encoder(splade_folder, tmp_path):
  """task=sparse through the real loop from an HF BertForMaskedLM: 8 fake devices (fsdp) and 1 give the same
  losses and parameters (negatives and FLOPS means over the whole global batch); the report's retrieval scores
  are ir-measures' on the model's own term vectors; the workdir exports as a SparseEncoder folder that
  sentence-transformers encodes as bertjax does, and bertjax reads back."""
  import jax
  ir_measures = pytest.importorskip("ir_measures")
  from sentence_transformers.sparse_encoder import SparseEncoder as TheirEncoder

  from bertjax import finetune, predict
  from bertjax.cli import convert as convert_cli
  from bertjax.embeddings.dense.task import featurize, read_pairs
  path, _ = splade_folder
  init = path.replace("/st", "/mlm")
  _write_sparse_pairs(tmp_path / "train.csv", 32, 0)
  _write_sparse_pairs(tmp_path / "dev.csv", 12, 1)
  out, losses = {}, {}
  for name, devices in (("eight", jax.devices()), ("one", jax.devices()[:1])):
    out[name] = finetune.finetune(_sparse_config(init, tmp_path), str(tmp_path / name), devices=devices)
    losses[name] = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / name))]
  assert len(losses["one"]) == 4 and len(jax.tree_util.tree_leaves(out["eight"]["state"].params)[0].sharding
                                           .device_set) == 8
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(out["eight"]["state"].params),
                  jax.tree_util.tree_leaves(out["one"]["state"].params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  # The report scores the dev file as ir-measures does on dot products of the model's term vectors.
  w = str(tmp_path / "one")
  rows = read_pairs(str(tmp_path / "dev.csv"), "anchor", "positive", ("negative",))
  feats = featurize(rows, tokenizer_lib.load(f"{init}/vocab.txt"), 16)
  module = out["one"]["model_config"]
  from bertjax import tasks as tasks_lib
  model = tasks_lib.kind(out["one"]["task"]).head(out["one"]["task"], module)
  emb = model.apply({"params": out["one"]["state"].params}, {k: feats[k] for k in (
      "input_ids", "input_mask", "segment_ids", "doc_input_ids", "doc_input_mask")})
  q, d = np.asarray(emb["embedding"]), np.asarray(emb["doc_embedding"])
  corpus = sorted({t for r in rows for t in r["docs"]})
  vec = {t: d[i, j] for i, r in enumerate(rows) for j, t in enumerate(r["docs"])}
  run = [ir_measures.ScoredDoc(f"q{i}", f"d{corpus.index(t)}", float(q[i] @ vec[t])) for i in range(len(rows))
         for t in corpus]
  qrels = [ir_measures.Qrel(f"q{i}", f"d{corpus.index(r['docs'][0])}", 1) for i, r in enumerate(rows)]
  measures = [ir_measures.nDCG @ 10, ir_measures.RR @ 10, ir_measures.R @ 1, ir_measures.R @ 10]
  want = ir_measures.calc_aggregate(measures, qrels, run)
  got = out["one"]["report"]["epochs"][-1]["validation"]
  np.testing.assert_allclose([got[m] for m in ("ndcg@10", "mrr@10", "recall@1", "recall@10")],
                             [want[m] for m in measures], atol=1e-6)
  assert got["query_active_dims"] == pytest.approx(np.mean(np.count_nonzero(q, axis=1)))
  # Exported, sentence-transformers' SparseEncoder encodes as the run's model; bertjax reads both back.
  assert convert_cli.write(w, str(tmp_path / "st")) == "SparseEncoder"
  texts = [r["anchor"] for r in rows[:5]]
  theirs = TheirEncoder(str(tmp_path / "st"), device="cpu")
  assert theirs.max_seq_length == 16
  ref = theirs.encode(texts, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
  np.testing.assert_allclose(ref, q[:5], atol=1e-5)
  for source in (str(tmp_path / "st"), w):
    np.testing.assert_allclose(sparse.SparseEncoder.load(source).encode(texts), q[:5], atol=1e-5)
  top = predict.predict_text(w, text=texts[0])
  assert top["active_dims"] == np.count_nonzero(q[0]) and len(top["terms"]) == min(20, top["active_dims"])


def test_the_regularizer_ramp_is_sentence_transformers_scheduler():
  """The weight factor at each step equals SpladeRegularizerWeightSchedulerCallback's (quadratic, 1/3 warmup)."""
  from types import SimpleNamespace

  from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import SpladeRegularizerWeightSchedulerCallback
  from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
  loss = SpladeLoss(SimpleNamespace(), SparseMultipleNegativesRankingLoss.__new__(SparseMultipleNegativesRankingLoss),
                    document_regularizer_weight=1.0, query_regularizer_weight=2.0)
  for total, ratio in ((30, 1 / 3), (7, 0.5), (2, 1 / 3)):
    cb = SpladeRegularizerWeightSchedulerCallback(loss, warmup_ratio=ratio)
    cb.on_train_begin(None, SimpleNamespace(max_steps=total), None)
    for step in range(total):
      cb.on_step_begin(None, SimpleNamespace(global_step=step), None)
      assert float(sparse.regularizer_ramp(step, total, ratio)) == pytest.approx(loss.document_regularizer_weight)
      assert 2 * float(sparse.regularizer_ramp(step, total, ratio)) == pytest.approx(loss.query_regularizer_weight)


def test_sparse_beir_search_equals_sentence_transformers_scores_with_ir_measures(splade_folder, tmp_path, capsys):
  """`python -m bertjax embeddings beir` with a SparseEncoder folder: exact search over the term vectors in
  blocks on the 8-device mesh, pruned to 12 terms a vector; the metrics equal ir-measures' on the run that
  sentence-transformers' own vectors give, and the run file holds the same documents."""
  ir_measures = pytest.importorskip("ir_measures")
  from bertjax.cli import embeddings as embeddings_cli
  path, theirs = splade_folder
  rng = np.random.default_rng(3)
  docs = {f"d{i}": " ".join(rng.choice(WORDS, 6)) for i in range(37)}
  queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(9)}
  qrels = {q: {f"d{j}": 1 for j in rng.choice(37, 2, replace=False)} for q in queries}
  beir = helpers.write_beir(tmp_path / "beir", docs, queries, qrels)
  assert embeddings_cli.main(["beir", str(beir), "--model", path, "--run", str(tmp_path / "run.trec"),
                              "--max_active_dims", "12", "--block", "7", "--top_k", "37"]) == 0
  got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  q = theirs.encode(list(queries.values()), convert_to_tensor=True, convert_to_sparse_tensor=False,
                    max_active_dims=12).numpy()
  d = theirs.encode(list(docs.values()), convert_to_tensor=True, convert_to_sparse_tensor=False,
                    max_active_dims=12).numpy()
  sims = q @ d.T
  run = [ir_measures.ScoredDoc(qid, did, float(sims[i, j])) for i, qid in enumerate(queries)
         for j, did in enumerate(docs)]
  measures = {"ndcg@10": ir_measures.nDCG @ 10, "mrr@10": ir_measures.RR @ 10, "recall@100": ir_measures.R @ 100,
              "map": ir_measures.AP}
  want = ir_measures.calc_aggregate(list(measures.values()),
                                    [ir_measures.Qrel(qid, did, 1) for qid, ds in qrels.items() for did in ds], run)
  for name, m in measures.items():
    assert got[name] == pytest.approx(want[m], abs=1e-6), name
  assert got["query active dims"] == got["document active dims"] == 12
  ours = {}
  for line in (tmp_path / "run.trec").read_text().splitlines():
    qid, _, did, _, score, _ = line.split()
    ours[(qid, did)] = float(score)
  assert len(ours) == len(queries) * len(docs)
  for i, qid in enumerate(queries):
    for j, did in enumerate(docs):
      assert ours[(qid, did)] == pytest.approx(float(sims[i, j]), rel=1e-4, abs=1e-4)


@pytest.fixture(scope="module")
def inference_free_folder(splade_folder, tmp_path_factory):
  """An inference-free SparseEncoder built by sentence-transformers' own classes: a Router whose query route is a
  SparseStaticEmbedding (random positive weights) and whose document route is the fill-mask Transformer and
  SpladePooling of `splade_folder`'s MLM model."""
  from sentence_transformers.base.modules import Router, Transformer
  from sentence_transformers.sparse_encoder import SparseEncoder
  from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling
  mlm = splade_folder[0].replace("/st", "/mlm")
  d = tmp_path_factory.mktemp("inference_free")
  tr = Transformer(mlm, transformer_task="fill-mask", max_seq_length=24)
  torch.manual_seed(1)
  weight = torch.rand(len(tr.tokenizer.get_vocab())) * 3
  router = Router.for_query_document(query_modules=[SparseStaticEmbedding(tokenizer=tr.tokenizer, weight=weight)],
                                     document_modules=[tr, SpladePooling(pooling_strategy="max")])
  SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(d / "st"))
  return str(d / "st"), SparseEncoder(str(d / "st"), device="cpu")


def test_inference_free_encoding_and_search_equal_sentence_transformers(inference_free_folder, tmp_path, capsys):
  """An inference-free folder: queries are its static weights at their tokens (encode_query), documents its MLM
  side (encode = encode_document), each equal to sentence-transformers'; BEIR search with it equals ir-measures
  on the run sentence-transformers' own vectors give."""
  ir_measures = pytest.importorskip("ir_measures")
  from bertjax.cli import embeddings as embeddings_cli
  path, theirs = inference_free_folder
  enc = sparse.SparseEncoder.load(path)
  assert enc.query_weights is not None and (enc.pooling, enc.max_seq_length) == ("max", 24)
  kw = dict(convert_to_tensor=True, convert_to_sparse_tensor=False)
  np.testing.assert_allclose(enc.encode_query(TEXTS), theirs.encode_query(TEXTS, **kw).numpy(), atol=1e-6)
  np.testing.assert_allclose(enc.encode(TEXTS), theirs.encode_document(TEXTS, **kw).numpy(), atol=1e-5)
  hf = transformers.AutoTokenizer.from_pretrained(f"{path}/document_0_Transformer")
  assert list(sparse.active_dims(enc.encode_query(TEXTS[:2]))) == [  # a query holds its own terms only
      len(set(hf(t, add_special_tokens=False)["input_ids"])) for t in TEXTS[:2]]
  rng = np.random.default_rng(4)
  docs = {f"d{i}": " ".join(rng.choice(WORDS, 6)) for i in range(23)}
  queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(7)}
  qrels = {q: {f"d{j}": 1 for j in rng.choice(23, 2, replace=False)} for q in queries}
  beir = helpers.write_beir(tmp_path / "beir", docs, queries, qrels)
  assert embeddings_cli.main(["beir", str(beir), "--model", path, "--block", "5", "--top_k", "23"]) == 0
  got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  sims = theirs.encode_query(list(queries.values()), **kw).numpy() @ theirs.encode_document(
      list(docs.values()), **kw).numpy().T
  run = [ir_measures.ScoredDoc(qid, did, float(sims[i, j])) for i, qid in enumerate(queries)
         for j, did in enumerate(docs)]
  measures = {"ndcg@10": ir_measures.nDCG @ 10, "map": ir_measures.AP}
  want = ir_measures.calc_aggregate(list(measures.values()),
                                    [ir_measures.Qrel(qid, did, 1) for qid, ds in qrels.items() for did in ds], run)
  for name, m in measures.items():
    assert got[name] == pytest.approx(want[m], abs=1e-6), name


def test_static_queries_start_from_the_training_documents_idf(splade_folder, tmp_path):
  """task=sparse with sparse.query_side=static from a plain MLM model: the static query weights start as
  log((N + 1) / (df + 1)) over the training file's distinct documents, df counted with HF's tokenizer."""
  from bertjax import tasks as tasks_lib
  path, _ = splade_folder
  mlm = path.replace("/st", "/mlm")
  _write_sparse_pairs(tmp_path / "train.csv", 24, 0)
  _write_sparse_pairs(tmp_path / "dev.csv", 6, 1)
  c = _sparse_config(mlm, tmp_path)
  c.sparse.query_side = "static"
  task = tasks_lib.get("sparse", config=c)
  _, params, _, _ = tasks_lib.kind(task).weights(task, mlm, {})
  got = np.asarray(params["static_query"]) * c.sparse.static_lr_ratio
  import csv
  with open(tmp_path / "train.csv", encoding="utf-8") as f:
    docs = sorted({t for r in csv.DictReader(f) for t in (r["positive"], r["negative"])})
  hf = transformers.AutoTokenizer.from_pretrained(mlm)
  df = np.zeros(len(got))
  for text in docs:
    df[sorted(set(hf(text, add_special_tokens=False)["input_ids"]))] += 1
  np.testing.assert_allclose(got, np.log((len(docs) + 1) / (df + 1)), rtol=1e-6)
  assert got.min() < got.max()


@pytest.mark.slow
def test_inference_free_training_exports_a_router_that_sentence_transformers_encodes_alike(inference_free_folder,
                                                                                           tmp_path):
  """task=sparse from an inference-free folder through the real loop: the static query weights are learnt (at
  static_lr_ratio times the encoder's rate), and the export is a Router folder whose queries and documents
  sentence-transformers encodes as bertjax's encoder of the run does."""
  from sentence_transformers.sparse_encoder import SparseEncoder as TheirEncoder

  from bertjax import finetune
  from bertjax.cli import convert as convert_cli
  path, _ = inference_free_folder
  _write_sparse_pairs(tmp_path / "train.csv", 32, 0)
  _write_sparse_pairs(tmp_path / "dev.csv", 12, 1)
  c = _sparse_config(path, tmp_path)
  c.sparse.query_regularizer_weight = 0.0
  out = finetune.finetune(c, str(tmp_path / "w"))
  assert dict(out["task"].options)["static_query"] == 50.0
  start = sparse.SparseEncoder.load(path)
  ours = sparse.SparseEncoder.load(str(tmp_path / "w"))
  moved = np.abs(ours.query_weights - start.query_weights)
  # the queries' terms move; [PAD], in no query, only by weight decay
  assert moved.max() > 1e-2 and moved.max() > 100 * moved[0]
  assert convert_cli.write(str(tmp_path / "w"), str(tmp_path / "st")) == "SparseEncoder"
  theirs = TheirEncoder(str(tmp_path / "st"), device="cpu")
  kw = dict(convert_to_tensor=True, convert_to_sparse_tensor=False)
  np.testing.assert_allclose(theirs.encode_query(TEXTS, **kw).numpy(), ours.encode_query(TEXTS), atol=1e-5)
  np.testing.assert_allclose(theirs.encode_document(TEXTS, **kw).numpy(), ours.encode(TEXTS), atol=1e-5)
  back = sparse.SparseEncoder.load(str(tmp_path / "st"))
  np.testing.assert_allclose(back.encode_query(TEXTS), ours.encode_query(TEXTS), atol=1e-6)


def test_a_bad_query_side_or_router_is_one_line(inference_free_folder, tmp_path):
  """sparse.query_side other than mlm / static, and a Router whose query route bertjax does not compute, are
  one-line errors naming the value or the modules."""
  import shutil

  from bertjax import errors
  from bertjax import tasks as tasks_lib
  path, _ = inference_free_folder
  c = _sparse_config(path, tmp_path)
  c.sparse.query_side = "dense"
  with pytest.raises(errors.ConfigError, match="sparse.query_side 'dense': mlm or static"):
    tasks_lib.get("sparse", config=c)
  bad = tmp_path / "bad"
  shutil.copytree(path, bad)
  conf = json.loads((bad / "router_config.json").read_text())
  conf["types"]["query_0_SparseStaticEmbedding"] = "sentence_transformers.base.modules.Pooling"
  (bad / "router_config.json").write_text(json.dumps(conf))
  with pytest.raises(ConversionError, match=r"query route is \['Pooling'\]"):
    sparse.SparseEncoder.load(str(bad))
