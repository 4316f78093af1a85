"""Distillation from a teacher against sentence-transformers 6: MarginMSELoss and DistillKLDivLoss (dense), SpladeLoss
over SparseMarginMSELoss / SparseDistillKLDivLoss, MultiVectorMarginMSELoss / MultiVectorDistillKLDivLoss, value
and gradients on the same arrays; the `teacher` command's scores equal CrossEncoder.predict's logits and
SentenceTransformer's similarities, a resumed run gives the same folder, and its mistakes are one line; a
training run with the loss from a tiny model equals sentence-transformers' loss on the same rows, and on 8 devices
the run on 1 (slow)."""
import csv
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

from bertjax import errors  # noqa: E402
from bertjax import tasks as tasks_lib  # noqa: E402
from bertjax.cli import teacher as teacher_cli  # noqa: E402
from bertjax.embeddings import distill  # noqa: E402

WORDS = ("the river runs past a city where model reads text and predicts words for every query about mountains "
         "islands bridges trains music").split()


def _random(shape, seed):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _t(x):
  return torch.tensor(np.asarray(x), requires_grad=True)


def _st_dense(name, temperature):
  from sentence_transformers.sentence_transformer import losses as st_losses
  if name == "margin_mse":
    return st_losses.MarginMSELoss(model=None)
  return st_losses.DistillKLDivLoss(model=None, temperature=temperature)


@pytest.mark.parametrize("name,negatives,temperature", [
    pytest.param("margin_mse", 1, 1.0, marks=pytest.mark.slow), ("margin_mse", 3, 1.0),
    pytest.param("distill_kl", 1, 1.0, marks=pytest.mark.slow), ("distill_kl", 3, 2.5)])
def test_dense_losses_equal_sentence_transformers_value_and_gradients(name, negatives, temperature):
  """The pairs kind's distillation loss (through `Contrastive.loss`) on embeddings [B, D] and the teacher's scores
  [B, 1 + n] equals MarginMSELoss / DistillKLDivLoss's compute_loss_from_embeddings; so do its gradients."""
  b, k = 6, 1 + negatives
  q, d, teacher = _random((b, 8), 0), _random((b, k, 8), 1), 4 * _random((b, k), 2)
  task = tasks_lib.get("pairs", options=(("scale", 20.0), ("loss", name), ("temperature", temperature)))
  kind = tasks_lib.kind(task)
  batch = {"example_weights": np.ones(b, np.float32), "teacher_scores": teacher}
  ours, (gq, gd) = jax.value_and_grad(
      lambda q, d: kind.loss(task, {"embedding": q, "doc_embedding": d}, batch), argnums=(0, 1))(q, d)
  tq, td = _t(q), _t(d)
  want = _st_dense(name, temperature).compute_loss_from_embeddings([tq] + [td[:, j] for j in range(k)],
                                                                    torch.tensor(teacher))
  want.backward()
  np.testing.assert_allclose(float(ours), want.item(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gq), tq.grad.numpy(), rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(gd), td.grad.numpy(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["margin_mse", pytest.param("distill_kl", marks=pytest.mark.slow)])
def test_padding_rows_count_for_nothing(name):
  s, t = _random((6, 3), 3), _random((6, 3), 4)
  w = jnp.array([1, 1, 1, 1, 0, 0], jnp.float32)
  full = jax.value_and_grad(lambda x: distill.loss(name, x, t, 2.0, w))(s)
  real = jax.value_and_grad(lambda x: distill.loss(name, x, t[:4], 2.0))(s[:4])
  np.testing.assert_allclose(float(full[0]), float(real[0]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(full[1])[:4], np.asarray(real[1]), atol=1e-7)
  assert np.all(np.asarray(full[1])[4:] == 0)


@pytest.mark.parametrize("name,query_weight", [pytest.param("margin_mse", 5e-2, marks=pytest.mark.slow),
                                               ("distill_kl", 5e-2), ("distill_kl", None)])
def test_sparse_losses_equal_splade_loss_value_and_gradients(name, query_weight):
  """The sparse kind's loss equals SpladeLoss's parts over SparseMarginMSELoss / SparseDistillKLDivLoss (its
  temperature 2): the base loss plus FLOPS on the documents (positives and negatives) and on the queries."""
  from sentence_transformers.sparse_encoder import losses as sp_losses
  b, k, v = 5, 3, 40
  q, d = np.abs(_random((b, v), 5)), np.abs(_random((b, k, v), 6))
  teacher = 3 * _random((b, k), 7)
  options = (("scale", 1.0), ("document_regularizer_weight", 3e-2), ("query_regularizer_weight", query_weight),
             ("regularizer_warmup", 1 / 3), ("loss", name), ("temperature", 2.0))
  task = tasks_lib.get("sparse", options=options)
  batch = {"example_weights": np.ones(b, np.float32), "teacher_scores": teacher}
  ours, (gq, gd) = jax.value_and_grad(lambda q, d: tasks_lib.kind(task).loss(
      task, {"embedding": q, "doc_embedding": d}, batch), argnums=(0, 1))(q, d)
  base = sp_losses.SparseMarginMSELoss(None) if name == "margin_mse" else sp_losses.SparseDistillKLDivLoss(None)
  flops = sp_losses.FlopsLoss(None)
  tq, td = _t(q), _t(d)
  cols = [tq] + [td[:, j] for j in range(k)]
  want = base.compute_loss_from_embeddings(cols, torch.tensor(teacher)) + 3e-2 * flops.compute_loss_from_embeddings(
      torch.cat(cols[1:]))
  if query_weight is not None:
    want = want + query_weight * flops.compute_loss_from_embeddings(tq)
  want.backward()
  np.testing.assert_allclose(float(ours), want.item(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gq), tq.grad.numpy(), rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(gd), td.grad.numpy(), rtol=1e-5, atol=2e-6)


class _Precomputed(torch.nn.Module):
  """A stand-in MultiVectorEncoder: a column's token vectors and scoring mask as given."""

  def forward(self, features, task=None):
    del task
    return {"token_embeddings": features["vectors"], "attention_mask": features["attention_mask"]}


@pytest.mark.parametrize("name,temperature", [("margin_mse", 1.0), ("distill_kl", 1.0), ("distill_kl", 0.5)])
def test_multivector_losses_equal_sentence_transformers_value_and_gradients(name, temperature):
  """The multivector kind's loss on token vectors with score masks equals MultiVectorMarginMSELoss /
  MultiVectorDistillKLDivLoss (MaxSim of each query with its own documents)."""
  from sentence_transformers.multi_vector_encoder import losses as mv_losses
  b, k, lq, ld, dim = 4, 3, 5, 7, 6
  q, d = _random((b, lq, dim), 8), _random((b, k, ld, dim), 9)
  rng = np.random.default_rng(10)
  q_mask = (np.arange(lq)[None] < rng.integers(2, lq + 1, (b, 1))).astype(np.int32)
  d_mask = (np.arange(ld)[None, None] < rng.integers(2, ld + 1, (b, k, 1))).astype(np.int32)
  teacher = 3 * _random((b, k), 11)
  task = tasks_lib.get("multivector", options=(("scale", 1.0), ("loss", name), ("temperature", temperature)))
  batch = {"example_weights": np.ones(b, np.float32), "teacher_scores": teacher, "score_mask": q_mask,
           "doc_score_mask": d_mask}
  ours, (gq, gd) = jax.value_and_grad(lambda q, d: tasks_lib.kind(task).loss(
      task, {"embedding": q, "doc_embedding": d}, batch), argnums=(0, 1))(q, d)
  model = _Precomputed()
  ref = (mv_losses.MultiVectorMarginMSELoss(model) if name == "margin_mse"
         else mv_losses.MultiVectorDistillKLDivLoss(model, temperature=temperature))
  tq, td = _t(q), _t(d)
  # A key of its own per column: sentence-transformers embeds each column apart (no merged forward).
  features = [{"vectors": tq, "attention_mask": torch.tensor(q_mask), "input_ids": torch.tensor(q_mask)}] + [
      {"vectors": td[:, j], "attention_mask": torch.tensor(d_mask[:, j]), f"column{j}": torch.zeros(b)}
      for j in range(k)]
  want = ref(features, torch.tensor(teacher))
  want.backward()
  np.testing.assert_allclose(float(ours), want.item(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gq), tq.grad.numpy(), rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(gd), td.grad.numpy(), rtol=1e-5, atol=2e-6)


# ------------------------------------------------------------------------------------- the teacher command


@pytest.fixture(scope="module")
def models(make_vocab, tmp_path_factory):
  """A CrossEncoder (one label, sigmoid) and a SentenceTransformer (mean pooling, normalised) around random BERTs,
  saved by sentence-transformers' own classes, on one vocabulary."""
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling as StPooling
  vocab = make_vocab(WORDS, 90)
  d = tmp_path_factory.mktemp("teachers")
  shutil.copy(vocab, d / "vocab.txt")  # the vocabulary, for students of the same tokenizer
  torch.manual_seed(0)
  cfg = dict(vocab_size=sum(1 for _ in open(vocab, encoding="utf-8")), hidden_size=32, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, initializer_range=0.3)
  transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=1, **cfg)).save_pretrained(d / "hf")
  transformers.BertTokenizerFast(vocab, do_lower_case=True).save_pretrained(d / "hf")
  st.CrossEncoder(str(d / "hf"), device="cpu", max_length=32).save(str(d / "ce"))
  transformers.BertModel(transformers.BertConfig(**cfg)).save_pretrained(d / "enc")
  transformers.BertTokenizerFast(vocab, do_lower_case=True).save_pretrained(d / "enc")
  st.SentenceTransformer(modules=[Transformer(str(d / "enc"), max_seq_length=32), StPooling(32, pooling_mode="mean"),
                                  Normalize()], device="cpu").save(str(d / "bi"))
  return str(d / "ce"), str(d / "bi")


def _write_rows(path, n, seed, negatives=2):
  import random
  rng = random.Random(seed)
  topics, filler = WORDS[5:], WORDS[:5]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["anchor", "positive"] + [f"negative_{i + 1}" for i in range(negatives)])
    for i in range(n):
      t = topics[i % len(topics)]
      w.writerow([f"{t} " + " ".join(rng.sample(filler, 2)) + "?", " ".join(rng.sample(filler, 3)) + f", {t}."] +
                 [" ".join(rng.sample(filler, 3)) + f" {topics[(i + 3 + j) % len(topics)]}" for j in range(negatives)])
  return str(path)


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _run(argv, capsys):
  """(exit code, stdout, stderr) of `python -m bertjax teacher ARGV`."""
  try:
    code = teacher_cli.main(argv)
  except SystemExit as e:
    code = e.code
  out, err = capsys.readouterr()
  return code, out, err


COLUMNS = "anchor,positive,negative_1,negative_2"


def test_cross_encoder_scores_are_its_logits_and_a_resume_gives_the_same_folder(models, tmp_path, capsys):
  ce, _ = models
  pairs = _write_rows(tmp_path / "train.csv", 9, 0)
  out = str(tmp_path / "scores")
  code, printed, err = _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", out, "--block", "4"],
                            capsys)
  assert code == 0, err
  assert json.loads(printed)["blocks_scored"] == 3 and json.loads(printed)["teacher"] == "cross-encoder"
  got = distill.read_scores(out, pairs, 9, 3)
  theirs = st.CrossEncoder(ce, device="cpu", activation_fn=torch.nn.Identity())
  rows = _rows(pairs)
  want = theirs.predict([(r["anchor"], r[c]) for r in rows for c in COLUMNS.split(",")[1:]]).reshape(9, 3)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # A run killed after its first block: the rerun scores the other two and gives the same folder.
  before = {n: (tmp_path / "scores" / n).read_bytes() for n in os.listdir(out)}
  for n in ("scores_00001.npy", "scores_00002.npy"):
    os.remove(os.path.join(out, n))
  code, printed, err = _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", out, "--block", "4"],
                            capsys)
  assert code == 0 and json.loads(printed)["blocks_scored"] == 2, err
  assert {n: (tmp_path / "scores" / n).read_bytes() for n in os.listdir(out)} == before
  code, printed, _ = _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", out, "--block", "4"],
                          capsys)
  assert code == 0 and json.loads(printed)["blocks_scored"] == 0


@pytest.mark.slow
def test_a_teacher_of_another_tokenizer_scores_the_text_with_its_own(tmp_path, capsys):
  """Scores are computed from the rows' text, so a teacher need not share the student's tokenizer: a RoBERTa
  (byte-level BPE) cross-encoder, written by sentence-transformers from a zoo folder, gives its own logits."""
  root = os.path.join(os.path.dirname(__file__), "data", "zoo", "st6", "roberta-model")
  torch.manual_seed(0)
  st.CrossEncoder(root, num_labels=1, device="cpu", max_length=32).save(str(tmp_path / "ce"))
  pairs = _write_rows(tmp_path / "train.csv", 5, 2)
  out = str(tmp_path / "scores")
  code, _, err = _run(["--model", str(tmp_path / "ce"), "--pairs", pairs, "--columns", COLUMNS, "--out", out], capsys)
  assert code == 0, err
  theirs = st.CrossEncoder(str(tmp_path / "ce"), device="cpu", activation_fn=torch.nn.Identity())
  want = theirs.predict([(r["anchor"], r[c]) for r in _rows(pairs) for c in COLUMNS.split(",")[1:]]).reshape(5, 3)
  np.testing.assert_allclose(distill.read_scores(out, pairs, 5, 3), want, atol=1e-5)


def test_bi_encoder_scores_are_its_cosine_similarities(models, tmp_path, capsys):
  _, bi = models
  pairs = _write_rows(tmp_path / "train.csv", 5, 1, negatives=1)
  out = str(tmp_path / "scores")
  code, printed, err = _run(["--model", bi, "--pairs", pairs, "--columns", "anchor,positive,negative_1", "--out",
                             out], capsys)
  assert code == 0, err
  model = st.SentenceTransformer(bi, device="cpu")
  rows = _rows(pairs)
  q = model.encode_query([r["anchor"] for r in rows], convert_to_tensor=True)
  want = np.stack([model.similarity_pairwise(q, model.encode_document([r[c] for r in rows], convert_to_tensor=True))
                   .numpy() for c in ("positive", "negative_1")], axis=1)
  np.testing.assert_allclose(distill.read_scores(out, pairs, 5, 2), want, atol=1e-5)


def test_mistakes_are_one_line(models, tmp_path, capsys):
  """A folder of another training file (fingerprint), a folder with another number of scores a row, an
  unfinished folder, a teacher that is not a model, an --out the command did not write."""
  ce, _ = models
  pairs = _write_rows(tmp_path / "train.csv", 4, 0)
  other = _write_rows(tmp_path / "other.csv", 4, 5)
  out = str(tmp_path / "scores")
  assert _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", out, "--block", "2"], capsys)[0] == 0
  with pytest.raises(errors.TaskDataError, match="scores of another training file"):
    distill.read_scores(out, other, 4, 3)
  with pytest.raises(errors.TaskDataError, match="3 scores per row .* the training rows have 2 documents"):
    distill.read_scores(out, pairs, 4, 2)
  with pytest.raises(errors.TaskDataError, match="not a teacher score folder"):
    distill.read_scores(str(tmp_path), pairs, 4, 3)
  os.remove(os.path.join(out, "scores_00001.npy"))
  with pytest.raises(errors.TaskDataError, match="unfinished"):
    distill.read_scores(out, pairs, 4, 3)
  (tmp_path / "not_a_model").mkdir()
  (tmp_path / "not_a_model" / "notes.txt").write_text("hello")
  code, _, err = _run(["--model", str(tmp_path / "not_a_model"), "--pairs", pairs, "--columns", COLUMNS, "--out",
                       str(tmp_path / "s2")], capsys)
  assert code == 2 and err.count("\n") == 1 and "not_a_model" in err, err
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "precious.txt").write_text("keep")
  code, _, err = _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", str(tmp_path / "mine")],
                      capsys)
  assert code == 2 and "did not write it" in err and err.count("\n") == 1, err
  # The same folder resumed for another file is refused too.
  code, _, err = _run(["--model", ce, "--pairs", other, "--columns", COLUMNS, "--out", out, "--block", "2"], capsys)
  assert code == 2 and "fingerprint" in err, err


# ------------------------------------------------------------------------------------------- training


def _config(bi, pairs, scores, name, batch=8):
  from configs import finetune as finetune_config
  c = finetune_config.get_config(f"task=pairs,init={bi},lr=1e-3,batch={batch},epochs=1,seq=32")
  c.data.train_file, c.data.teacher_scores = pairs, scores
  c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
  c.embedding.negative_columns = ("negative_1", "negative_2")
  c.embedding.loss, c.embedding.temperature = name, 1.0
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  c.log_every = 1
  return c


@pytest.mark.parametrize("name", ["margin_mse", pytest.param("distill_kl", marks=pytest.mark.slow)])
def test_training_with_a_teacher_equals_sentence_transformers_loss(models, tmp_path, capsys, name):
  """task=pairs with embedding.loss margin_mse / distill_kl from a SentenceTransformer folder and a cross-encoder
  teacher's scores: the kind's loss on the start's weights equals sentence-transformers' on the same rows (the run
  through the loop: `test_distillation_on_8_devices_equals_1_device`)."""
  from sentence_transformers.sentence_transformer import losses as st_losses

  from bertjax.data import tokenizer as tokenizer_lib
  from bertjax.embeddings.dense import task as pairs_task
  ce, bi = models
  pairs = _write_rows(tmp_path / "train.csv", 16, 2)
  scores = str(tmp_path / "scores")
  assert _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", scores], capsys)[0] == 0
  c = _config(bi, pairs, scores, name)
  task = tasks_lib.get("pairs", config=c)
  kind = tasks_lib.kind(task)
  cfg, params, tok_path, lower = kind.weights(task, bi, {"dropout_rate": 0.0, "attention_dropout_rate": 0.0})
  feats, _, _ = kind.load(task, c, tokenizer_lib.load(tok_path, do_lower_case=lower))
  first = {k: v[:8] for k, v in feats.items()}
  out = kind.head(task, cfg).apply({"params": params}, first)
  ours = kind.loss(task, out, {**first, "example_weights": np.ones(8, np.float32)})
  theirs = st.SentenceTransformer(bi, device="cpu").eval()
  rows = pairs_task.read_pairs(pairs, "anchor", "positive", ("negative_1", "negative_2"))[:8]
  cols = [[r["anchor"] for r in rows]] + [[r["docs"][j] for r in rows] for j in range(3)]
  ref = st_losses.MarginMSELoss(theirs) if name == "margin_mse" else st_losses.DistillKLDivLoss(theirs)
  with torch.no_grad():
    want = ref([theirs.preprocess(col) for col in cols], torch.tensor(first["teacher_scores"]))
  np.testing.assert_allclose(float(ours), want.item(), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind_name,section", [("pairs", "embedding"), ("sparse", "sparse"),
                                               ("multivector", "multivector")])
def test_distillation_on_8_devices_equals_1_device(models, tmp_path, capsys, kind_name, section):
  """python -m bertjax train's run (in process) with `{section}.loss` distill_kl (a sparse encoder from an MLM
  model, a multi-vector one from the bi-encoder's transformer): 8 fake devices (fsdp) give the losses and
  parameters of 1."""
  from bertjax import finetune
  from configs import common
  ce, bi = models
  init = bi
  if kind_name == "sparse":
    init = str(tmp_path / "mlm")
    torch.manual_seed(0)
    vocab = os.path.join(os.path.dirname(ce), "vocab.txt")
    cfg = transformers.BertConfig(vocab_size=sum(1 for _ in open(vocab, encoding="utf-8")), hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64)
    transformers.BertForMaskedLM(cfg).save_pretrained(init)
    transformers.BertTokenizerFast(vocab, do_lower_case=True).save_pretrained(init)
  pairs = _write_rows(tmp_path / "train.csv", 32, 3)
  scores = str(tmp_path / "scores")
  assert _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", scores], capsys)[0] == 0
  runs, losses = {}, {}
  for n, devices in (("eight", jax.devices()), ("one", jax.devices()[:1])):
    c = _config(init, pairs, scores, "mnrl", batch=16)
    c.task = kind_name
    getattr(c, section).loss = "distill_kl"
    c.sharding = common.sharding("fsdp")
    runs[n] = finetune.finetune(c, str(tmp_path / n), devices=devices)
    losses[n] = [r["loss"] for r in finetune.read_train_metrics(str(tmp_path / n))]
  assert len(jax.devices()) == 8 and len(losses["one"]) == 2
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(runs["eight"]["state"].params),
                  jax.tree_util.tree_leaves(runs["one"]["state"].params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)


def test_a_distillation_config_without_scores_or_negatives_is_one_line(models, tmp_path):
  from bertjax.data import tokenizer as tokenizer_lib
  _, bi = models
  pairs = _write_rows(tmp_path / "train.csv", 4, 0)
  c = _config(bi, pairs, "", "margin_mse")
  task = tasks_lib.get("pairs", config=c)
  _, _, tok_path, lower = tasks_lib.kind(task).weights(task, bi, {})
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  with pytest.raises(errors.ConfigError, match="set data.teacher_scores"):
    tasks_lib.kind(task).load(task, c, tok)
  c = _config(bi, pairs, str(tmp_path), "margin_mse")
  c.embedding.negative_columns = ("",)
  with pytest.raises(errors.ConfigError, match="set embedding.negative_columns"):
    tasks_lib.kind(task).load(task, c, tok)
  c = _config(bi, pairs, "", "kl")
  with pytest.raises(errors.ConfigError, match="embedding.loss 'kl'"):
    tasks_lib.get("pairs", config=c)


@pytest.mark.parametrize("kind_name,section", [("pairs", "embedding"), ("sparse", "sparse"),
                                               ("multivector", "multivector")])
def test_each_kind_reads_the_teacher_scores_beside_its_rows(models, tmp_path, capsys, kind_name, section):
  """`{section}.loss` margin_mse: the kind's training features carry the folder's scores, row by row, and its rows
  are not packed (the scores go with each unpacked row)."""
  from bertjax.data import tokenizer as tokenizer_lib
  ce, bi = models
  pairs = _write_rows(tmp_path / "train.csv", 6, 4)
  scores = str(tmp_path / "scores")
  assert _run(["--model", ce, "--pairs", pairs, "--columns", COLUMNS, "--out", scores, "--block", "4"], capsys)[0] == 0
  c = _config(bi, pairs, scores, "mnrl")
  c.task = kind_name
  getattr(c, section).loss = "margin_mse"
  task = tasks_lib.get(kind_name, config=c)
  assert task.option("loss") == "margin_mse" and not tasks_lib.kind(task).can_pack(task)
  pairs_task = tasks_lib.get("pairs", options=())
  _, _, tok_path, lower = tasks_lib.kind(pairs_task).weights(pairs_task, bi, {})
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  feats, _, _ = tasks_lib.kind(task).load(task, c, tok)
  np.testing.assert_array_equal(feats["teacher_scores"], distill.read_scores(scores, pairs, 6, 3))
  assert feats["doc_input_ids"].shape[:2] == (6, 3)
