"""Multi-vector (ColBERT) encoders against sentence-transformers 6's MultiVectorEncoder: encode_query and
encode_document of a folder its own classes build and save (prompt markers as added tokens, a 128-style Dense
projection, query expansion with [MASK], the punctuation skiplist on documents, unit vectors), and MaxSim."""
import string

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import helpers  # noqa: E402

from bertjax.convert.table import ConversionError  # noqa: E402
from bertjax.embeddings.multivector import encoder as multivector  # noqa: E402

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


ATTEND_SLOW = pytest.mark.parametrize("mve_folder", [False, pytest.param(True, marks=pytest.mark.slow)],
                                      indirect=True, ids=["expansion", "attend"])


@ATTEND_SLOW
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


@ATTEND_SLOW
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


@ATTEND_SLOW
def test_packed_rows_give_each_text_its_unpacked_token_vectors_and_loss(mve_folder):
  """Short examples are packed for training (an example's query and documents end to end with others', each text
  its own attention segment, a query's [MASK] expansion scored but attended to only as the settings say): every
  text's scored token vectors gathered back from the row equal that text's alone in a padded row, and the loss
  over the packed slots equals the unpacked batch's."""
  from bertjax import tasks as tasks_lib
  from bertjax.embeddings.multivector import task as multivector_task
  from configs import finetune as finetune_config
  path, _ = mve_folder
  c = finetune_config.get_config(f"task=multivector,init={path},seq=48")
  task = tasks_lib.get("multivector", config=c)
  kind = tasks_lib.kind(task)
  cfg, params, _, _ = kind.weights(task, path, {})
  enc = multivector.MultiVectorEncoder.load(path)
  texts = QUERIES + DOCS
  rows = [{"anchor": texts[i], "docs": [texts[(i + 1) % 6], texts[(i + 2) % 6]]} for i in range(6)]
  feats = multivector_task.featurize(rows, enc.tok, multivector_task._settings(task))
  widest = feats["input_ids"].shape[1] + 2 * feats["doc_input_ids"].shape[2]  # the rows' least length
  packed, members = multivector_task.pack(feats, 2 * widest, 3)  # room for several examples a row
  assert packed["input_ids"].shape[1] == 2 * widest
  assert multivector_task.pack(feats, 1, 3)[0]["input_ids"].shape[1] == widest
  assert any(len(m) > 1 for m in members) and len(members) < len(rows)
  module = kind.head(task, cfg)
  plain = module.apply({"params": params}, feats)
  out = module.apply({"params": params}, {k: v for k, v in packed.items() if k not in ("labels",
                                                                                       "example_slot_weights")})
  for r, m in enumerate(members):
    for slot, j in enumerate(m):
      q = feats["score_mask"][j] > 0
      np.testing.assert_allclose(np.asarray(out["embedding"][r, slot])[q], np.asarray(plain["embedding"][j])[q],
                                 atol=1e-5)
      for x in range(2):
        d = feats["doc_score_mask"][j, x] > 0
        np.testing.assert_allclose(np.asarray(out["doc_embedding"][r, slot, x])[d],
                                   np.asarray(plain["doc_embedding"][j, x])[d], atol=1e-5)
  want = kind.loss(task, plain, {**feats, "example_weights": np.ones(len(rows), np.float32)})
  got = kind.loss(task, out, {**packed, "example_weights": packed["example_slot_weights"]})
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)


@ATTEND_SLOW
def test_maxsim_beir_search_equals_ir_measures_on_sentence_transformers_scores(mve_folder, tmp_path, capsys):
  """`python -m bertjax embeddings beir` with a MultiVectorEncoder folder: exact MaxSim over the corpus in
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
  beir = helpers.write_beir(tmp_path / "beir", docs, queries, qrels)
  assert embeddings_cli.main(["beir", str(beir), "--model", path, "--run", str(tmp_path / "run.trec"),
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


# Query vectors 12, document widths up to 48: one query's scores against one document take 4 * 12 * 48 bytes.
PER_QUERY = 4 * 12 * 48


@pytest.mark.parametrize("mve_folder", [False], indirect=True, ids=["expansion"])
@pytest.mark.parametrize("tile,block", [(1, 23), (4 * PER_QUERY, 23), (12 * PER_QUERY, 23), (12 * PER_QUERY, 7),
                                        (multivector.TILE_BYTES, 23)],
                         ids=["1-query-1-doc", "4-queries", "6-queries-2-docs", "blocks-of-7", "default"])
def test_maxsim_search_in_tiles_equals_sentence_transformers_similarity(mve_folder, tile, block):
  """`multivector.search` over the 8-device mesh, its scores in tiles of 1 query x 1 document, 4 queries (the 6
  padded to 8), 6 queries x 2 documents (each device's 3 documents padded to 4), in one block or blocks of 7:
  the top 10 of every query equal sentence-transformers' MaxSim (`similarity`) of the same texts."""
  path, theirs = mve_folder
  rng = np.random.default_rng(5)
  docs = [" ".join(rng.choice(WORDS + [",", "."], int(n))) for n in rng.integers(2, 30, 23)]
  queries = [" ".join(rng.choice(WORDS, int(n))) for n in rng.integers(1, 8, 6)]
  enc = multivector.MultiVectorEncoder.load(path)
  scores, rows = multivector.search(enc, queries, docs, 10, block=block, batch_size=4, tile_bytes=tile)
  sims = theirs.similarity(theirs.encode_query(queries), theirs.encode_document(docs)).numpy()
  want = np.argsort(-sims, axis=1, kind="stable")[:, :10]
  np.testing.assert_array_equal(rows, want)
  np.testing.assert_allclose(scores, np.take_along_axis(sims, want, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mean,chunk", [(False, 1), (False, 3), (True, 2)])
def test_block_maxsim_takes_each_max_over_a_documents_own_tokens(mean, chunk):
  """The scoring program on the 8-device mesh against ColBERT's rule written in NumPy: Σ_i max_j q_i·d_j over the
  query's real vectors i and the document's real tokens j (divided by the query's count for meanmaxsim). Every
  real product is negative, so a padding token (a zero vector) that entered a max would win it."""
  import jax
  from jax.sharding import Mesh
  rng = np.random.default_rng(6)
  q = np.abs(rng.normal(size=(3, 5, 4))).astype(np.float32)
  docs = -np.abs(rng.normal(size=(48, 7, 4))).astype(np.float32)
  qm, dm = rng.random((3, 5)) < 0.7, np.arange(7)[None] < rng.integers(1, 8, 48)[:, None]
  qm[:, 0] = True
  docs[~dm] = 0.0
  f = multivector._block_maxsim(mean, Mesh(np.array(jax.devices()), ("docs",)), chunk)
  got = np.asarray(f(q, qm, docs, dm))
  want = np.array([[sum(max(float(q[a, i] @ docs[b, j]) for j in range(7) if dm[b, j]) for i in range(5) if qm[a, i])
                    / (qm[a].sum() if mean else 1) for b in range(48)] for a in range(3)])
  np.testing.assert_allclose(got, want, rtol=1e-5)


def _write_pairs(path, n, seed):
  import csv
  import random
  rng = random.Random(seed)
  topics, filler = WORDS[5:], WORDS[:5]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["anchor", "positive", "negative"])
    for i in range(n):
      t, other = topics[i % len(topics)], topics[(i + 3) % len(topics)]
      w.writerow([f"{t} " + " ".join(rng.sample(filler, 2)) + "?", " ".join(rng.sample(filler, 3)) + f", {t}.",
                  " ".join(rng.sample(filler, 3)) + f" {other}"])


@pytest.mark.slow
def test_multivector_training_equals_sentence_transformers_loss_8_devices_1_and_exports(mve_folder, tmp_path):
  """task=multivector from a MultiVectorEncoder folder: the kind's loss on the start's weights equals
  sentence-transformers' multi-vector MultipleNegativesRankingLoss on the same rows; 8 fake devices (fsdp) equal
  1 through the real loop on packed rows (two examples a row, 8 rows a step on either mesh); the export is a
  MultiVectorEncoder folder that sentence-transformers encodes as the run's model does."""
  import jax
  from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

  from bertjax import finetune
  from bertjax import tasks as tasks_lib
  from bertjax.cli import convert as convert_cli
  from bertjax.data import tokenizer as tokenizer_lib
  from bertjax.embeddings.dense.task import read_pairs
  from bertjax.embeddings.multivector import task as multivector_task
  from configs import common
  from configs import finetune as finetune_config
  path, theirs = mve_folder
  _write_pairs(tmp_path / "train.csv", 64, 0)
  _write_pairs(tmp_path / "dev.csv", 12, 1)

  def config():
    c = finetune_config.get_config(f"task=multivector,init={path},lr=1e-3,batch=16,epochs=1,seq=48")
    c.data.pack_max_per_row = 2
    c.data.train_file, c.data.eval_file = str(tmp_path / "train.csv"), str(tmp_path / "dev.csv")
    c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
    c.embedding.negative_columns, c.log_every = ("negative",), 1
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    c.sharding = common.sharding("fsdp")
    return c
  c = config()
  task = tasks_lib.get("multivector", config=c)
  kind = tasks_lib.kind(task)
  cfg, params, tok_path, lower = kind.weights(task, path, {})
  rows = read_pairs(str(tmp_path / "train.csv"), "anchor", "positive", ("negative",))[:8]
  feats = multivector_task.featurize(rows, tokenizer_lib.load(tok_path, do_lower_case=lower),
                                     multivector_task._settings(task))
  out = kind.head(task, cfg).apply({"params": params}, feats)
  ours = kind.loss(task, out, {**feats, "example_weights": np.ones(8, np.float32)})
  theirs.eval()
  # bertjax trains with the folder's prompts, as encode uses them (sentence-transformers' trainer adds prompts
  # only when its arguments name them per column): the reference gets them in the text.
  cols = [["[Q] " + r["anchor"] for r in rows], ["[D] " + r["docs"][0] for r in rows],
          ["[D] " + r["docs"][1] for r in rows]]
  features = [dict(theirs.preprocess(col, task=t), task=t) for col, t in zip(cols, ("query", "document",
                                                                                    "document"))]
  with torch.no_grad():
    want = MultiVectorMultipleNegativesRankingLoss(theirs)(features, None)
  np.testing.assert_allclose(float(ours), float(want), rtol=1e-5)
  runs, losses = {}, {}
  for name, devices in (("eight", jax.devices()), ("one", jax.devices()[:1])):
    runs[name] = finetune.finetune(config(), str(tmp_path / name), devices=devices)
    losses[name] = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / name))]
  # The short pairs train packed: 64 examples two a row, 8 rows a step.
  assert finetune.use_packing(c, task, multivector_task.featurize(
      read_pairs(str(tmp_path / "train.csv"), "anchor", "positive", ("negative",)),
      tokenizer_lib.load(tok_path, do_lower_case=lower), multivector_task._settings(task)))
  assert len(losses["one"]) == 4
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(runs["eight"]["state"].params),
                  jax.tree_util.tree_leaves(runs["one"]["state"].params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)
  got = runs["one"]["report"]["epochs"][-1]["validation"]
  assert 0 < got["ndcg@10"] <= 1
  assert convert_cli.write(str(tmp_path / "one"), str(tmp_path / "mve")) == "MultiVectorEncoder"
  exported = st.MultiVectorEncoder(str(tmp_path / "mve"), device="cpu")
  mine = multivector.MultiVectorEncoder.load(str(tmp_path / "mve"))
  for ours, ref in zip(mine.encode(QUERIES, "query") + mine.encode(DOCS, "document"),
                       list(exported.encode_query(QUERIES)) + list(exported.encode_document(DOCS))):
    np.testing.assert_allclose(ours, ref.numpy(), atol=1e-5)
  # The exported model is the run's: its vectors of a dev query equal the trained module's.
  dev = read_pairs(str(tmp_path / "dev.csv"), "anchor", "positive", ("negative",))
  f = multivector_task.featurize(dev[:1], mine.tok, multivector_task._settings(task))
  q = kind.head(task, runs["one"]["model_config"]).apply({"params": runs["one"]["state"].params}, f)["embedding"]
  np.testing.assert_allclose(np.asarray(q)[0][f["score_mask"][0] > 0], mine.encode([dev[0]["anchor"]], "query")[0],
                             atol=1e-5)
