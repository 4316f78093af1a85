"""Every folder of the zoo (tests/data/zoo, written by the real libraries of each era: `python
tests/zoo/make_zoo.py`) through every bertjax tool that takes it: the embeddings readers (dense, sparse, cross-
encoder, multi-vector, and an HF folder's mean pooling) against the writing library's own outputs, `convert.from_hf`
and the forward against HF's logits, the tokenizer's ids against HF's, `merge` and `extend_vocab` on the HF folders,
and fine-tuning from a couple (`init=`, slow). A folder a tool refuses is refused in one line containing the reason
zoo.json records. Every stored output varies across the fixed texts by at least 100x the tolerance it is compared
with (a reader returning a constant or shuffled rows fails), and docs/model.md's folder table claims no tool on a
folder form that this module does not run."""
import dataclasses
import json
import pathlib
import re
import sys

import numpy as np
import pytest
import zoo_tools as zt

from bertjax import errors
from bertjax.convert import weights
from bertjax.convert.table import ConversionError

sys.path.insert(0, str(zt.ZOO.parent.parent / "zoo"))
import zoo_common  # noqa: E402

CASES = zt.cases()
ATOL = RTOL = 1e-5
SPREAD = 100  # each stored output's rows differ by at least SPREAD x the tolerance they are compared with
REFUSALS = (ConversionError, errors.ConfigError, errors.DataError, errors.CheckpointError, ValueError)
# The default selection (every other case is marked slow): what each fix and each form needs at least once.
FAST_CONVERT = {"st6/bert-model", "st6/bert-forpretraining", "st6/roberta-forsequenceclassification",
                "st6/electra-forpretraining", "st6/xlm-roberta-fortokenclassification", "st3/deberta-v2-model",
                "st5/modernbert-formaskedlm", "st3/bert-formaskedlm-bin", "st6/bert-formaskedlm-sharded"}
# st6/bert-formaskedlm's merge runs in the default selection against torch (test_merge_against_torch)
FAST_MERGE = {"st3/bert-forsequenceclassification", "st3/bert-formaskedlm-bin"}
FAST_VOCAB = {"st3/bert-formaskedlm", "st6/bert-formaskedlm", "st5/modernbert-forsequenceclassification",
              "st6/deberta-v2-model"}
FAST_HF_EMBED = {"st6/bert-model", "st3/bert-formaskedlm-bin"}
FAST_RERANK = {"st2/cross-1label-config-only", "st3/cross-1label-identity-config-only"}


def _select(tool: str, kinds: tuple, fast=None) -> list:
  out = []
  for name, meta in CASES:
    if tool in meta["tools"] and meta["kind"].startswith(kinds):
      marks = () if fast is None or name in fast else (pytest.mark.slow,)
      out.append(pytest.param(name, meta, id=name, marks=marks))
  return out


def _refused(meta: dict, tool: str, call) -> bool:
  """Runs `call`; True when zoo.json says the tool refuses the folder (checked: one line naming the reason)."""
  want = meta["tools"][tool]
  if not want.startswith("refused: "):
    return False
  with pytest.raises(REFUSALS) as e:
    call()
  msg = str(e.value)
  assert "\n" not in msg and want[len("refused: "):] in msg, msg
  return True


def _cli(main, argv, capsys) -> tuple[int, str, str]:
  """(exit code, last stderr line, stdout) of a command: a refusal exits 2 after one line."""
  try:
    rc = main(argv)
  except SystemExit as e:
    rc = e.code
  out, err = capsys.readouterr()
  err = err.strip().splitlines()
  return rc, err[-1] if err else "", out


def _close(got: dict, want: dict, keys) -> None:
  for k in keys:
    assert k in got, k
    np.testing.assert_allclose(np.asarray(got[k], np.float32), want[k], atol=ATOL, rtol=RTOL, err_msg=k)


EMBED = _select("embeddings", ("st-", "pylate"))
HF_EMBED = _select("embeddings", ("hf-",), fast=FAST_HF_EMBED)
RERANK = _select("rerank", ("st-cross",), fast=FAST_RERANK)
CONVERT = _select("convert", ("hf-",), fast=FAST_CONVERT)
TOKENIZER = _select("tokenizer", ("hf-",))
MERGE = _select("merge", ("hf-",), fast=FAST_MERGE)
VOCAB = _select("extend_vocab", ("hf-",), fast=FAST_VOCAB)
PREDICT = [p for p in _select("convert", ("hf-ForMaskedLM", "hf-ForPreTraining"), fast={"st3/bert-formaskedlm"})
           if p.values[1]["family"] == "bert"]
INIT = ["st3/bert-model", "st3/deberta-v2-model", "st5/dense-mean-dense-identity-prompts"]


@pytest.mark.parametrize("name,meta", EMBED)
def test_embeddings_reader_equals_the_writing_library(name, meta):
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "embeddings", lambda: zt.embed(path, meta, zoo_common.TEXTS, zoo_common.PAIRS, want)):
    return
  got = zt.embed(path, meta, zoo_common.TEXTS, zoo_common.PAIRS, want)
  _close(got, want, want)


@pytest.mark.parametrize("name,meta", RERANK)
def test_cross_encoder_scores_equal_the_writing_library(name, meta):
  """A sentence-transformers CrossEncoder folder through `rerank.CrossEncoder`: its scores of the fixed pairs
  (with the folder's activation) are the library's `predict`."""
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "rerank", lambda: zt.embed(path, meta, zoo_common.TEXTS, zoo_common.PAIRS, want)):
    return
  _close(zt.embed(path, meta, zoo_common.TEXTS, zoo_common.PAIRS, want), want, ["predict"])


@pytest.mark.parametrize("name,meta", HF_EMBED)
def test_hf_folder_embeddings_equal_torch_mean_pooling(name, meta):
  """An HF folder through the dense reader (default pooling: mean over the real tokens, unit length; and the mean
  alone) against the masked mean of HF's last_hidden_state on the fixed texts, computed in torch by the writer."""
  from bertjax.embeddings.dense import encoder
  from bertjax.embeddings.model import EmbeddingModel, Pooling
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "embeddings", lambda: encoder.Encoder.load(path)):
    return
  enc = encoder.Encoder.load(path)
  raw = dataclasses.replace(enc, module=EmbeddingModel(enc.module.cfg, Pooling(mode="mean", normalize=False)))
  _close({"embed_mean_normalized": enc.encode(zoo_common.TEXTS), "embed_mean": raw.encode(zoo_common.TEXTS)}, want,
         ("embed_mean_normalized", "embed_mean"))


@pytest.mark.parametrize("name,meta", CONVERT)
def test_convert_from_hf_forward_equals_hf(name, meta):
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "convert", lambda: zt.hf_forward(path, meta, want)):
    return
  got = zt.hf_forward(path, meta, want)
  assert set(got) == {k for k in want if k.startswith("out_")}, sorted(got)  # every output HF gave is compared
  mask = want["attention_mask"].astype(bool)
  for k, v in got.items():
    v, w = np.asarray(v, np.float32), want[k]
    if v.ndim >= 2 and v.shape[:2] == mask.shape:  # per-token outputs: the real tokens
      v, w = v[mask], w[mask]
    np.testing.assert_allclose(v, w, atol=ATOL, rtol=RTOL, err_msg=k)
  # weights.load (every command's loader) reads it too, with the size the zoo wrote
  assert weights.load(path, head="all").cfg.hidden_size == zoo_common.SIZES["hidden_size"]


@pytest.mark.parametrize("name,meta", TOKENIZER)
def test_tokenizer_ids_equal_hf(name, meta):
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "tokenizer", lambda: zt.hf_token_ids(path, zoo_common.TEXTS)):
    return
  for i, ids in enumerate(zt.hf_token_ids(path, zoo_common.TEXTS)):
    assert ids == want[f"tok_{i}"].tolist(), zoo_common.TEXTS[i]


@pytest.mark.parametrize("name,meta", MERGE)
def test_merge_of_a_folder_with_itself_gives_it_back(name, meta, tmp_path, capsys):
  from bertjax.cli import merge as merge_cli
  path = zt.folder(name)
  want = meta["tools"]["merge"]
  rc, err, _ = _cli(merge_cli.main, [path, path, "--out", str(tmp_path / "m")], capsys)
  if want.startswith("refused: "):
    assert rc != 0 and want[len("refused: "):] in err, err
    return
  assert rc == 0
  a = weights.load(path, overrides={"scan_layers": False}, head="all").params
  b = weights.load(str(tmp_path / "m" / "hf"), overrides={"scan_layers": False}, head="all").params
  import jax
  # bertjax against itself: a dropped or misnamed leaf shows here; averaging, weighting and what HF loads from
  # OUT/hf are checked against torch in test_merge_against_torch
  for (ka, va), (kb, vb) in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b),
                                strict=True):
    assert ka == kb
    np.testing.assert_allclose(np.asarray(vb), np.asarray(va), atol=1e-6)


@pytest.mark.parametrize("name,meta", VOCAB)
def test_extend_vocab(name, meta, tmp_path, capsys):
  from bertjax.cli import extend_vocab as cli
  path = zt.folder(name)
  want = meta["tools"]["extend_vocab"]
  rc, err, _ = _cli(cli.main, ["--model", path, "--tokens", "xylophone,quartz", "--out", str(tmp_path / "x")], capsys)
  if want.startswith("refused: "):
    assert rc != 0 and want[len("refused: "):] in err, err
    return
  assert rc == 0
  w = weights.load(str(tmp_path / "x"), head="all")
  assert w.params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape[0] >= w.cfg.vocab_size
  import transformers  # the extended folder in transformers: the new tokens' ids, and the MLM model loads
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "x"))
  new = [a["id"] for a in json.loads((tmp_path / "x" / "extend_vocab.json").read_text())["added"]]
  assert tok("xylophone quartz", add_special_tokens=False)["input_ids"] == new
  m = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "x"))
  assert m.get_input_embeddings().weight.shape[0] >= max(new) + 1


def test_zoo_is_complete_and_small():
  kinds = {meta["kind"] for _, meta in CASES}
  assert {"st-dense", "st-sparse", "st-cross", "st-multivector", "hf-Model", "hf-ForMaskedLM"} <= kinds, kinds
  size = sum(p.stat().st_size for p in zt.ZOO.rglob("*") if p.is_file())
  assert size < 7.5 * 2 ** 20, size


def _rows(exp: dict) -> dict:
  """Each stored float output as rows, one per fixed text (per row of the fixed ids for HF's outputs): a per-token
  output at the positions real in every row, the multi-vector token vectors (q_i, d_i) at the positions every
  text has. Ids (input_ids, tok_i) are inputs or compared exactly."""
  mask = exp.get("attention_mask")
  out = {}
  for k, v in exp.items():
    if k in ("input_ids", "attention_mask") or re.fullmatch(r"(tok|q|d)_\d+", k):
      continue
    v = np.asarray(v, np.float64)
    if mask is not None and v.ndim >= 2 and v.shape[:2] == mask.shape:
      v = v[:, mask.astype(bool).all(0)]
    out[k] = v
  for p in ("q", "d"):
    vs = [np.asarray(exp[f"{p}_{i}"], np.float64) for i in range(len(exp)) if f"{p}_{i}" in exp]
    if vs:
      n = min(len(v) for v in vs)
      out[f"{p}_*"] = np.stack([v[:n] for v in vs])
  return out


def _spread(rows: np.ndarray) -> float:
  """The smallest difference (max over elements) between two of the rows: a reader that swaps two rows misses the
  stored output by at least this, and one that returns the same row for all by at least half of it."""
  flat = rows.reshape(len(rows), -1)
  return min(float(np.abs(flat[i] - flat[j]).max()) for i in range(len(flat)) for j in range(i))


def test_every_stored_output_varies_across_the_fixed_texts():
  """Every stored output's rows differ from each other by >= 100x the tolerance (atol + rtol * max |value|) it is
  compared with, so that a reader returning a constant, or the rows in another order, fails."""
  low, seen = [], 0
  for name, _ in CASES:
    for k, rows in _rows(zt.expected(name)).items():
      assert len(rows) >= 2, (name, k)
      tol = ATOL + RTOL * float(np.abs(rows).max())
      seen += 1
      if not _spread(rows) >= SPREAD * tol:
        low.append(f"{name} {k}: {_spread(rows):.3g} < {SPREAD} x {tol:.3g}")
  assert seen > len(CASES) and not low, low


def test_every_tool_a_record_names_is_run_on_its_folder():
  """Each tool a zoo.json names (what the zoo claims of a folder) is a test here run on that folder."""
  runs = {"embeddings": EMBED + HF_EMBED, "rerank": RERANK, "convert": CONVERT, "tokenizer": TOKENIZER,
          "merge": MERGE, "extend_vocab": VOCAB}
  ran = {(tool, p.values[0]) for tool, params in runs.items() for p in params}
  missing = [(tool, name) for name, meta in CASES for tool in meta["tools"] if (tool, name) not in ran]
  assert not missing, missing


# docs/model.md's folder table: each row's folder form as zoo cases, each column's tool as the cases this module
# runs it on and the zoo.json entry that says whether the tool reads or refuses them.
DOC_ROWS = [
    ("HF `*Model`", lambda m: m["kind"] in ("hf-Model", "hf-ForMaskedLM", "hf-ForPreTraining")
     and "pytorch_model.bin" not in m["files"]),
    ("HF `*ForSequenceClassification`", lambda m: m["kind"] in (
        "hf-ForSequenceClassification", "hf-ForTokenClassification", "hf-ForQuestionAnswering")),
    ("HF sharded safetensors", lambda m: "model.safetensors.index.json" in m.get("files", ())),
    ("HF `pytorch_model.bin` only", lambda m: "pytorch_model.bin" in m.get("files", ())),
    ("tokenizers:", lambda m: m["kind"].startswith("hf-")),
    ("sentence-transformers dense", lambda m: m["kind"] == "st-dense"
     and not m["tools"]["embeddings"].startswith("refused")),
    ("dense with Pooling `mean_sqrt_len_tokens`", lambda m: "pooling" in m["tools"].get("embeddings", "")),
    ("dense whose `2_Dense`", lambda m: "pytorch_model.bin" in m["tools"].get("embeddings", "")),
    ("sparse:", lambda m: m["kind"] == "st-sparse"),
    ("cross-encoder:", lambda m: m["kind"] == "st-cross"),
    ("sentence-transformers 6 MultiVectorEncoder", lambda m: m["kind"] == "st-multivector"),
    ("PyLate ColBERT", lambda m: m["kind"] == "pylate-colbert"),
]
DOC_COLUMNS = {"embeddings": ([EMBED, HF_EMBED, RERANK], "embeddings"), "predict": ([PREDICT], "convert"),
               "convert / from_hf": ([CONVERT], "convert"), "merge": ([MERGE], "merge"),
               "extend_vocab": ([VOCAB], "extend_vocab"), "init=": ([INIT], None)}
NOT_RUN = "not run in the zoo"


def _doc_table() -> tuple[list[str], list[list[str]]]:
  text = (pathlib.Path(__file__).parent.parent / "docs" / "model.md").read_text()
  part = text[text.index("### Folder forms"):]
  lines = [ln for ln in part.splitlines() if ln.startswith("|")]
  split = lambda ln: [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]  # noqa: E731
  return split(lines[0]), [split(ln) for ln in lines[2:]]


def test_model_md_folder_table_claims_only_what_the_zoo_runs():
  """A cell of docs/model.md's folder table that says "read", "fill-mask", "ids equal" or "refused" names a
  tool this module runs on a zoo folder of that row, and zoo.json agrees (read: one such folder is not refused;
  refused: every one is), or the cell says it is not run in the zoo."""
  header, rows = _doc_table()
  assert header[1:] == list(DOC_COLUMNS), header
  wrong, matched = [], set()
  for row in rows:
    form = next((test for prefix, test in DOC_ROWS if row[0].startswith(prefix)), None)
    assert form is not None, f"docs/model.md: a folder form this test does not know: {row[0][:60]}"
    matched.add(row[0])
    for col, cell in zip(header[1:], row[1:], strict=True):
      above = cell
      if cell.startswith("as above"):
        cell = rows[rows.index(row) - 1][header.index(col)]
      claim = re.match(r"(read|fill-mask|ids equal|refused)", cell)
      if not claim or NOT_RUN in above or NOT_RUN in cell:
        continue
      params, key = DOC_COLUMNS[col]
      if row[0].startswith("tokenizers:"):
        params, key = [TOKENIZER], "tokenizer"
      names = {p if isinstance(p, str) else p.values[0] for ps in params for p in ps}
      run = [meta for name, meta in CASES if name in names and form(meta)]
      says = [(meta["tools"].get(key, meta["tools"].get("rerank")) if key else "equal").startswith("refused")
              for meta in run]
      if not run:
        wrong.append(f"{row[0][:40]} / {col}: {claim[1]!r}, and no test here runs it")
      elif claim[1] == "refused" and not all(says):
        wrong.append(f"{row[0][:40]} / {col}: 'refused', but zoo.json has it read")
      elif claim[1] != "refused" and all(says):
        wrong.append(f"{row[0][:40]} / {col}: {claim[1]!r}, but zoo.json has every such folder refused")
  assert len(matched) == len(rows) and not wrong, wrong


@pytest.mark.parametrize("name,meta", PREDICT)
def test_predict_fills_a_mask_from_an_hf_mlm_folder(name, meta, capsys):
  """The printed five are HF's AutoModelForMaskedLM's top five on the folder (a near tie may swap two, so each
  printed token is at least as likely for HF as its fifth) with HF's probabilities to the 3 printed decimals."""
  import re

  import torch
  import transformers

  from bertjax.cli import predict as predict_cli
  path, text = zt.folder(name), "the [MASK] of the list"
  rc, err, out = _cli(predict_cli.main, ["--workdir", path, text], capsys)
  if meta["tools"]["convert"].startswith("refused: "):
    assert rc != 0 and meta["tools"]["convert"][len("refused: "):] in err, err
    return
  assert rc == 0, err
  lines = out.splitlines()
  assert len(lines) == 2 and lines[0] == text and lines[1].startswith("   [MASK] -> "), out
  printed = [(t, float(p)) for t, p in re.findall(r"(\S+) \((\d\.\d{3})\)", lines[1])]
  assert len(printed) == 5 and len({t for t, _ in printed}) == 5, lines[1]
  tok = transformers.AutoTokenizer.from_pretrained(path)
  hf = transformers.AutoModelForMaskedLM.from_pretrained(path).eval()
  enc = tok(text.replace("[MASK]", tok.mask_token), return_tensors="pt")
  with torch.no_grad():
    logits = hf(**enc).logits[0, int((enc["input_ids"][0] == tok.mask_token_id).nonzero()[0, 0])]
  probs = torch.softmax(logits.double(), -1).numpy()
  fifth = np.sort(probs)[-5]
  for token, p in printed:
    want = probs[tok.convert_tokens_to_ids(token)]
    assert want >= fifth - 1e-6 and p == pytest.approx(want, abs=6e-4), (token, p, want, fifth)
  assert [p for _, p in printed] == sorted((p for _, p in printed), reverse=True), lines[1]


def _sentiment_csv(path, n: int, seed: int) -> None:
  """A CSV (sentence, label) from the zoo's words, the label decided by one planted word."""
  import csv
  import random
  rng, words = random.Random(seed), zoo_common.WORDS
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["sentence", "label"])
    for _ in range(n):
      label = rng.choice(["pos", "neg"])
      text = [rng.choice(words[10:]) for _ in range(rng.randint(3, 8))]
      text.insert(rng.randrange(len(text) + 1), words[0] if label == "pos" else words[1])
      w.writerow([" ".join(text), label])


@pytest.mark.slow
@pytest.mark.parametrize("name", INIT)
def test_finetuning_init_from_a_zoo_folder_starts_from_its_weights(name, tmp_path):
  """init= a transformers 4.x BERT, a DeBERTa-v2 with its spm.model, a sentence-transformers dense folder: the
  run's starting encoder is the folder's (as convert.from_hf reads it), and one epoch runs."""
  import jax

  from bertjax import convert, finetune
  from configs import finetune as finetune_config
  path = zt.folder(name)
  _sentiment_csv(tmp_path / "train.csv", 32, 0)
  _sentiment_csv(tmp_path / "dev.csv", 16, 1)
  c = finetune_config.get_config(f"task=local,init={path},lr=1e-3,batch=8,epochs=1,seq=16")
  for k, v in dict(train_file=str(tmp_path / "train.csv"), eval_file=str(tmp_path / "dev.csv"),
                   text_a_column="sentence", label_column="label", labels=("neg", "pos")).items():
    c.data[k] = v
  tok, mcfg, params, tok_path, _ = finetune.load_init(c)
  assert tok.vocab_size == mcfg.vocab_size and tok_path.startswith(path), tok_path
  _, ref = convert.from_hf(path, head="encoder", scan_layers=mcfg.scan_layers)
  ref = ref.get("bert", ref)
  for key, want in jax.tree_util.tree_leaves_with_path(ref):
    got = params["bert"]
    for k in key:
      got = got[k.key]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=jax.tree_util.keystr(key))
  out = finetune.finetune(c, str(tmp_path / "w"))
  # One epoch ran and scored the 16 dev rows, each once: accuracy is k/16 (a padding row counted, or a row dropped,
  # gives another fraction)
  assert [row["epoch"] for row in out["report"]["epochs"]] == [1], out["report"]
  accuracy = out["report"]["best"]["metrics"]["validation"]["accuracy"]
  assert accuracy * 16 in range(17), accuracy
