"""What a sentence-transformers folder (or a bertjax workdir) says besides its weights, honoured as
sentence-transformers 6 honours it: an MLMTransformer SparseEncoder stack, a folder's max_active_dims, its query /
document prompts, each fine-tuning kind's workdir dispatched to its own reader, every `embeddings` option either
working for the model kind or refused in one line, and a multi-label cross-encoder refused for ranking."""
import json
import shutil
import string

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import helpers  # noqa: E402

from bertjax import errors  # noqa: E402
from bertjax.cli import embeddings as embeddings_cli  # noqa: E402
from bertjax.convert.table import ConversionError  # noqa: E402
from bertjax.core import checkpoint  # noqa: E402
from bertjax.data import tokenizer as tokenizer_lib  # noqa: E402
from bertjax.embeddings.dense import encoder  # noqa: E402
from bertjax.embeddings.multivector import encoder as multivector  # noqa: E402
from bertjax.embeddings.rerank import encoder as rerank  # noqa: E402
from bertjax.embeddings.sparse import encoder as sparse  # noqa: E402

WORDS = ("the river runs past a city where model reads text and predicts words for every query about mountains "
         "islands bridges trains music passage").split()
TEXTS = ["the river runs past the city", "a model reads text", "query about mountains and islands",
         "music", "bridges trains words predicts every model"]
PROMPTS = {"query": "query about ", "document": "passage for every "}
KW = dict(convert_to_tensor=True, convert_to_sparse_tensor=False)


def _bert(cls, tok, **kw):
  torch.manual_seed(0)
  return cls(transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                     pad_token_id=tok.pad_id, **kw))


def _save_hf(m, vocab, out):
  m.save_pretrained(out)
  shutil.copy(vocab, out / "vocab.txt")
  (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
  return str(out)


@pytest.fixture(scope="module")
def base(make_vocab, tmp_path_factory):
  """A vocabulary, an HF BertForMaskedLM (MLM biases moved off zero) and an HF BertModel, tiny and random."""
  vocab = make_vocab(WORDS, 90)
  d = tmp_path_factory.mktemp("folder_settings")
  tok = tokenizer_lib.load(vocab)
  mlm = _bert(transformers.BertForMaskedLM, tok)
  with torch.no_grad():
    mlm.cls.predictions.bias.normal_(0, 1.0)  # many active terms, so max_active_dims matters
  return {"dir": d, "vocab": vocab, "mlm": _save_hf(mlm, vocab, d / "mlm"),
          "enc": _save_hf(_bert(transformers.BertModel, tok, add_pooling_layer=False), vocab, d / "enc")}


def _run_cli(argv, capsys):
  """(exit code, the last stdout line as JSON or None, stderr) of `embeddings` in this process."""
  capsys.readouterr()  # what came before (sentence-transformers' progress bars) is not the command's
  try:
    code = embeddings_cli.main(argv)
  except SystemExit as e:
    code = e.code
  out, err = capsys.readouterr()
  lines = out.strip().splitlines()
  return code, json.loads(lines[-1]) if code == 0 and lines else None, err


def _one_line_error(capsys, argv, pattern):
  import re
  code, _, err = _run_cli(argv, capsys)
  lines = [ln for ln in err.strip().splitlines() if ln.strip()]
  assert code == errors.EXIT_CODE and len(lines) == 1 and lines[0].startswith("error: "), err
  assert re.search(pattern, lines[0]), lines[0]


def _beir(tmp_path, n_docs=9, n_queries=3, seed=0):
  rng = np.random.default_rng(seed)
  docs = {f"d{i}": " ".join(rng.choice(WORDS, 5)) for i in range(n_docs)}
  queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(n_queries)}
  qrels = {q: {f"d{j}": 1 for j in rng.choice(n_docs, 2, replace=False)} for q in queries}
  return str(helpers.write_beir(tmp_path / "beir", docs, queries, qrels)), docs, queries


def _run_scores(path):
  out = {}
  for line in open(path, encoding="utf-8").read().splitlines():
    q, _, d, _, s, _ = line.split()
    out[(q, d)] = float(s)
  return out


# ------------------------------------------------------------------------------------- 1, 2: SparseEncoder folders

@pytest.fixture(scope="module")
def mlm_splade(base):
  """A SparseEncoder of sentence-transformers' own MLMTransformer + SpladePooling (the stack most published SPLADE
  models are), saved with max_active_dims 6 and query / document prompts."""
  from sentence_transformers.sparse_encoder import SparseEncoder
  from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
  model = SparseEncoder(modules=[MLMTransformer(base["mlm"], max_seq_length=24),
                                 SpladePooling(pooling_strategy="max")], max_active_dims=6, prompts=PROMPTS,
                        device="cpu")
  out = base["dir"] / "mlm_splade"
  model.save(str(out))
  return str(out), SparseEncoder(str(out), device="cpu")


@pytest.mark.parametrize("type_name", ["sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer",
                                       "sentence_transformers.sparse_encoder.models.MLMTransformer"],
                         ids=["st6", "st5"])
def test_an_mlm_transformer_sparse_folder_encodes_as_sentence_transformers(mlm_splade, type_name, tmp_path):
  """Fix 1: the folder sentence-transformers 6.2 writes names the module ...modules.mlm_transformer.MLMTransformer
  (5.x wrote ...sparse_encoder.models.MLMTransformer); both read, and encode as sentence-transformers does."""
  path, theirs = mlm_splade
  stack = json.load(open(f"{path}/modules.json"))
  assert stack[0]["type"] == "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer"
  folder = tmp_path / "splade"
  shutil.copytree(path, folder)
  stack[0]["type"] = type_name
  (folder / "modules.json").write_text(json.dumps(stack))
  assert sparse.SparseEncoder.is_model(str(folder))
  enc = sparse.SparseEncoder.load(str(folder), max_active_dims=10 ** 6)  # all terms: the stack's own output
  assert (enc.pooling, enc.activation, enc.max_seq_length) == ("max", "relu", 24)
  ref = theirs.encode(TEXTS, max_active_dims=10 ** 6, prompt="", **KW).numpy()
  np.testing.assert_allclose(enc.encode(TEXTS, prompt=""), ref, atol=1e-5)
  assert (sparse.active_dims(ref) > 6).all()


def test_a_sparse_folders_max_active_dims_prunes_as_sentence_transformers(mlm_splade):
  """Fix 2: config_sentence_transformers.json's max_active_dims (6) keeps each vector's 6 largest terms, as the
  folder's own SparseEncoder encodes; a max_active_dims given (the CLI's flag) replaces it."""
  path, theirs = mlm_splade
  enc = sparse.SparseEncoder.load(path)
  assert enc.max_active_dims == 6
  ours = enc.encode_document(TEXTS)
  np.testing.assert_allclose(ours, theirs.encode_document(TEXTS, **KW).numpy(), atol=1e-5)
  assert (sparse.active_dims(ours) == 6).all()
  three = sparse.SparseEncoder.load(path, max_active_dims=3)
  np.testing.assert_allclose(three.encode_query(TEXTS), theirs.encode_query(TEXTS, max_active_dims=3, **KW).numpy(),
                             atol=1e-5)


# -------------------------------------------------------------------------------------------- 3: prompts

@pytest.fixture(scope="module")
def dense_prompted(base):
  """A dense SentenceTransformer (Transformer, mean Pooling) saved with query and document prompts."""
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  model = SentenceTransformer(modules=[Transformer(base["enc"], max_seq_length=24), Pooling(32, "mean")],
                              prompts=PROMPTS, device="cpu")
  out = base["dir"] / "dense_prompted"
  model.save(str(out))
  return str(out), SentenceTransformer(str(out), device="cpu")


def test_dense_and_sparse_folders_prompts_apply_as_encode_query_and_encode_document(dense_prompted, mlm_splade,
                                                                                     tmp_path):
  """Fix 3: a folder's "query" / "document" prompts go before queries and documents as sentence-transformers'
  encode_query / encode_document put them, dense and sparse; plain encode takes default_prompt_name's."""
  path, theirs = dense_prompted
  enc = encoder.Encoder.load(path)
  np.testing.assert_allclose(enc.encode_query(TEXTS), theirs.encode_query(TEXTS), atol=1e-5)
  np.testing.assert_allclose(enc.encode_document(TEXTS), theirs.encode_document(TEXTS), atol=1e-5)
  np.testing.assert_allclose(enc.encode(TEXTS), theirs.encode(TEXTS), atol=1e-5)
  assert not np.allclose(enc.encode_query(TEXTS), enc.encode(TEXTS), atol=1e-3)  # the prompt matters
  conf = json.load(open(f"{path}/config_sentence_transformers.json"))
  folder = tmp_path / "default_prompt"
  shutil.copytree(path, folder)
  (folder / "config_sentence_transformers.json").write_text(json.dumps({**conf, "default_prompt_name": "query"}))
  from sentence_transformers import SentenceTransformer
  np.testing.assert_allclose(encoder.Encoder.load(str(folder)).encode(TEXTS),
                             SentenceTransformer(str(folder), device="cpu").encode(TEXTS), atol=1e-5)
  spath, stheirs = mlm_splade
  senc = sparse.SparseEncoder.load(spath)
  np.testing.assert_allclose(senc.encode_query(TEXTS), stheirs.encode_query(TEXTS, **KW).numpy(), atol=1e-5)
  np.testing.assert_allclose(senc.encode_document(TEXTS), stheirs.encode_document(TEXTS, **KW).numpy(), atol=1e-5)


def test_beir_search_uses_the_folders_prompts_and_an_explicit_prefix_overrides_them(dense_prompted, tmp_path,
                                                                                     capsys):
  """Fix 3 through `embeddings --beir`: the run's scores are the cosine of sentence-transformers' encode_query and
  encode_document vectors; --query_prefix '' / --doc_prefix X replace the folder's prompts."""
  path, theirs = dense_prompted
  beir, docs, queries = _beir(tmp_path)
  argv = ["--model", path, "--beir", beir, "--top_k", "9", "--block", "4"]
  for extra, q_prompt, d_prompt in (([], None, None), (["--query_prefix", "", "--doc_prefix", "music "], "",
                                                       "music ")):
    run = tmp_path / f"run{len(extra)}.trec"
    assert _run_cli(argv + extra + ["--run", str(run)], capsys)[0] == 0
    q = theirs.encode_query(list(queries.values()), prompt=q_prompt, normalize_embeddings=True)
    d = theirs.encode_document(list(docs.values()), prompt=d_prompt, normalize_embeddings=True)
    sims = q @ d.T
    got = _run_scores(run)
    assert len(got) == len(queries) * len(docs)
    for i, qid in enumerate(queries):
      for j, did in enumerate(docs):
        assert got[(qid, did)] == pytest.approx(float(sims[i, j]), abs=1e-5)


# ---------------------------------------------------------------------------- 4, 5: multi-vector and rerank

@pytest.fixture(scope="module")
def mve(base, make_vocab):
  """A MultiVectorEncoder folder built by sentence-transformers' own classes ([Q] / [D] prompts, fixed query
  expansion, a punctuation skiplist) and a task=multivector workdir holding the same weights and settings."""
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.multi_vector_encoder import MultiVectorEncoder
  from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
  d = base["dir"] / "mve"
  d.mkdir()
  vocab = make_vocab(WORDS + list(".,!?;"), 90)
  pieces = open(vocab, encoding="utf-8").read().splitlines()
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
                   query_expansion={"strategy": "fixed", "length": 12, "attend": False})
  model = MultiVectorEncoder(modules=[tr, Dense(32, 16, bias=False, activation_function=torch.nn.Identity(),
                                                module_input_name="token_embeddings"),
                                      MultiVectorMask(skiplist_words=list(string.punctuation)),
                                      Normalize(module_input_name="token_embeddings")],
                             prompts={"query": "[Q] ", "document": "[D] "}, device="cpu")
  model.save(str(d / "st"))
  folder = str(d / "st")
  enc = multivector.MultiVectorEncoder.load(folder)
  settings = json.dumps(multivector.dataclasses.asdict(enc.settings))
  work = _workdir(d / "work", "multivector", "multivector", enc.cfg, enc.params, f"{folder}/tokenizer.json",
                  {"settings": settings, "dim": 16, "scale": 1.0})
  return folder, MultiVectorEncoder(folder, device="cpu"), work


def _workdir(out, task, kind, cfg, params, tokenizer, options, max_seq_length=48):
  """A fine-tuning workdir as `finetune` leaves one: finetune.json, the tokenizer's copy and best/ parameters."""
  out.mkdir(parents=True)
  name = tokenizer.rsplit("/", 1)[-1]
  shutil.copy(tokenizer, out / name)
  (out / "finetune.json").write_text(json.dumps({
      "task": task, "kind": kind, "labels": [], "tokenizer": name, "do_lower_case": True,
      "model": cfg.to_dict(), "max_seq_length": max_seq_length, "predict_settings": {}, "task_options": options}))
  checkpoint.save_best(str(out), params)
  return str(out)


def test_a_multivector_workdir_is_read_and_searched_by_maxsim(mve, tmp_path, capsys):
  """Fix 4: MultiVectorEncoder.load takes a task=multivector workdir (its vectors those of the folder it holds,
  equal to sentence-transformers'); `embeddings --beir` searches it by MaxSim, as the folder; the dense reader
  refuses it in one line instead of mean-pooling it."""
  folder, theirs, work = mve
  assert multivector.is_model(work) and not sparse.SparseEncoder.is_model(work)
  enc = multivector.MultiVectorEncoder.load(work)
  for task in ("query", "document"):
    ours = enc.encode(TEXTS, task)
    ref = (theirs.encode_query if task == "query" else theirs.encode_document)(TEXTS)
    for a, b in zip(ours, ref):
      np.testing.assert_allclose(a, np.asarray(b), atol=1e-5)
  with pytest.raises(ConversionError, match="multi-vector encoder's run"):
    encoder.Encoder.load(work)
  with pytest.raises(ConversionError, match="MultiVectorEncoder folder"):
    encoder.Encoder.load(folder)
  beir = _beir(tmp_path)[0]
  got = [_run_cli(["--model", m, "--beir", beir, "--top_k", "9"], capsys) for m in (folder, work)]
  assert got[0][0] == got[1][0] == 0 and got[0][1] == got[1][1]


@pytest.fixture(scope="module")
def cross(base):
  """A one-label CrossEncoder folder saved by sentence-transformers, and a task=rerank workdir of its weights."""
  torch.manual_seed(0)
  tok = tokenizer_lib.load(base["vocab"])
  m = _bert(transformers.BertForSequenceClassification, tok, num_labels=1, initializer_range=0.3)
  hf = base["dir"] / "ce_hf"
  m.save_pretrained(hf)
  transformers.BertTokenizerFast(base["vocab"], do_lower_case=True).save_pretrained(hf)
  st.CrossEncoder(str(hf), device="cpu", max_length=24).save(str(base["dir"] / "ce"))
  folder = str(base["dir"] / "ce")
  ce = rerank.CrossEncoder.load(folder)
  work = _workdir(base["dir"] / "ce_work", "rerank", "rerank", ce.cfg, ce.params, base["vocab"], {"loss": "bce"}, 24)
  return folder, st.CrossEncoder(folder, device="cpu"), work


def test_a_rerank_workdir_is_a_cross_encoder_to_every_reader(cross, tmp_path, capsys):
  """Fix 4 for task=rerank: CrossEncoder.load reads it (scores equal sentence-transformers'); the dense reader and
  `embeddings --beir` without --rerank refuse it (and a CrossEncoder folder) in one line, not mean-pool it."""
  folder, theirs, work = cross
  pairs = [(TEXTS[0], TEXTS[i]) for i in range(len(TEXTS))]
  np.testing.assert_allclose(rerank.CrossEncoder.load(work).predict(pairs), theirs.predict(pairs), atol=1e-5)
  for m in (folder, work):
    with pytest.raises(ConversionError, match="cross-encoder"):
      encoder.Encoder.load(m)
  beir = _beir(tmp_path)[0]
  for m in (folder, work):
    _one_line_error(capsys, ["--model", m, "--beir", beir], r"is a cross-encoder: it re-scores a run")


def test_every_option_works_for_a_multivector_model_or_is_one_line(mve, tmp_path, capsys):
  """Fix 5, multi-vector: --query_prefix / --doc_prefix replace its prompts (the run's scores are MaxSim of
  sentence-transformers' vectors with those prompts); --cache_dir, --max_active_dims, --pooling, --depth are one
  line naming the option."""
  folder, theirs, work = mve
  beir, docs, queries = _beir(tmp_path)
  run = tmp_path / "mv.trec"
  assert _run_cli(["--model", work, "--beir", beir, "--top_k", "9", "--run", str(run), "--query_prefix", "",
                   "--doc_prefix", "music "], capsys)[0] == 0
  q = theirs.encode_query(list(queries.values()), prompt="")
  d = theirs.encode_document(list(docs.values()), prompt="music ")
  want = theirs.similarity(q, d).numpy()  # sentence-transformers' own MaxSim
  got = _run_scores(run)
  assert len(got) == len(queries) * len(docs)
  for i, qid in enumerate(queries):
    for j, did in enumerate(docs):
      assert got[(qid, did)] == pytest.approx(float(want[i, j]), abs=1e-4)
  for flag, value in (("--cache_dir", str(tmp_path / "cache")), ("--max_active_dims", "4"), ("--pooling", "cls"),
                      ("--depth", "5")):
    _one_line_error(capsys, ["--model", folder, "--beir", beir, flag, value], rf"{flag}.*(multi-vector|rerank)")
  assert not (tmp_path / "cache").exists()


def test_every_rerank_option_works_or_is_one_line(cross, base, tmp_path, capsys):
  """Fix 5, --rerank: --top_k keeps that many documents per query, the prefixes go before the query and the
  document of each pair (scores equal sentence-transformers' predict on them); --cache_dir, --pooling,
  --max_active_dims, --score, --block are one line; so is --max_active_dims for a dense model."""
  folder, theirs, work = cross
  beir, docs, queries = _beir(tmp_path)
  first = tmp_path / "first.trec"
  first.write_text("".join(f"{q} Q0 {d} {r + 1} {9 - r} x\n" for q in queries for r, d in enumerate(docs)))
  new = tmp_path / "new.trec"
  code, _, err = _run_cli(["--model", work, "--beir", beir, "--rerank", str(first), "--depth", "6", "--top_k", "2",
                           "--query_prefix", "music ", "--doc_prefix", "passage ", "--run", str(new)], capsys)
  assert code == 0, err
  got = _run_scores(new)
  assert sorted({q for q, _ in got}) == sorted(queries) and len(got) == 2 * len(queries)
  for (q, d), s in got.items():
    assert s == pytest.approx(float(theirs.predict([("music " + queries[q], "passage " + docs[d])])[0]), abs=1e-5)
  for flag, value in (("--cache_dir", str(tmp_path / "cache")), ("--pooling", "cls"), ("--max_active_dims", "4"),
                      ("--score", "dot"), ("--block", "4")):
    _one_line_error(capsys, ["--model", folder, "--beir", beir, "--rerank", str(first), flag, value],
                    rf"{flag}: not an option for `embeddings rerank`")
  _one_line_error(capsys, ["--model", base["enc"], "--beir", beir, "--max_active_dims", "4"],
                  r"--max_active_dims: not an option for a dense embedding model")


# -------------------------------------------------------------------------------- 6: multi-label ranking

def test_a_multi_label_cross_encoder_is_refused_for_ranking_as_sentence_transformers_rank(base, tmp_path, capsys):
  """Fix 6: sentence-transformers' CrossEncoder.rank raises for num_labels != 1; `--rerank` with a 3-label model
  is one line saying so, not a ranking by label 0."""
  tok = tokenizer_lib.load(base["vocab"])
  m = _bert(transformers.BertForSequenceClassification, tok, num_labels=3)
  m.save_pretrained(tmp_path / "hf")
  transformers.BertTokenizerFast(base["vocab"], do_lower_case=True).save_pretrained(tmp_path / "hf")
  theirs = st.CrossEncoder(str(tmp_path / "hf"), device="cpu", max_length=24)
  theirs.save(str(tmp_path / "ce3"))
  with pytest.raises(ValueError, match="num_labels=1"):
    theirs.rank(TEXTS[0], TEXTS[1:])
  beir, docs, queries = _beir(tmp_path)
  run = tmp_path / "first.trec"
  run.write_text("".join(f"{q} Q0 {d} {r + 1} {9 - r} x\n" for q in queries for r, d in enumerate(docs)))
  _one_line_error(capsys, ["--model", str(tmp_path / "ce3"), "--beir", beir, "--rerank", str(run)],
                  r"3 labels; ranking needs a cross-encoder with one score per pair")
  ce = rerank.CrossEncoder.load(str(tmp_path / "ce3"))
  with pytest.raises(errors.ConfigError, match="3 labels"):
    rerank.rerank(ce, {"q0": {"d0": 1.0}}, {"q0": "a"}, {"d0": "b"})
