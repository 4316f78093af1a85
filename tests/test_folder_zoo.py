"""Every folder of the zoo (tests/data/zoo, written by the real libraries of each era: `python
tests/zoo/make_zoo.py`) through every bertjax tool that takes it: the embeddings readers (dense, sparse, cross-
encoder, multi-vector) against the writing library's own outputs, `convert.from_hf` and the forward against HF's
logits, the tokenizer's ids against HF's, `merge` and `extend_vocab` on the HF folders, and fine-tuning from a
couple (`init=`, slow). A folder a tool refuses is refused in one line containing the reason zoo.json records."""
import json
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
ATOL = 1e-5
REFUSALS = (ConversionError, errors.ConfigError, errors.DataError, errors.CheckpointError, ValueError)
# The default selection (every other case is marked slow): what each fix and each form needs at least once.
FAST_CONVERT = {"st6/bert-model", "st6/bert-forpretraining", "st6/roberta-forsequenceclassification",
                "st6/electra-forpretraining", "st6/xlm-roberta-fortokenclassification", "st3/deberta-v2-model",
                "st5/modernbert-formaskedlm", "st3/bert-formaskedlm-bin", "st6/bert-formaskedlm-sharded"}
FAST_MERGE = {"st6/bert-formaskedlm", "st3/bert-forsequenceclassification", "st3/bert-formaskedlm-bin"}
FAST_VOCAB = {"st3/bert-formaskedlm", "st6/bert-formaskedlm", "st5/modernbert-forsequenceclassification",
              "st6/deberta-v2-model"}


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
    np.testing.assert_allclose(np.asarray(got[k], np.float32), want[k], atol=ATOL, rtol=1e-5, err_msg=k)


@pytest.mark.parametrize("name,meta", _select("embeddings", ("st-", "pylate")))
def test_embeddings_reader_equals_the_writing_library(name, meta):
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "embeddings", lambda: zt.embed(path, meta, zoo_common.TEXTS, zoo_common.PAIRS, want)):
    return
  got = zt.embed(path, meta, zoo_common.TEXTS, zoo_common.PAIRS, want)
  _close(got, want, want)


@pytest.mark.parametrize("name,meta", _select("convert", ("hf-",), fast=FAST_CONVERT))
def test_convert_from_hf_forward_equals_hf(name, meta):
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "convert", lambda: zt.hf_forward(path, meta, want)):
    return
  got = zt.hf_forward(path, meta, want)
  assert got
  mask = want["attention_mask"].astype(bool)
  for k, v in got.items():
    v, w = np.asarray(v, np.float32), want[k]
    if v.ndim >= 2 and v.shape[:2] == mask.shape:  # per-token outputs: the real tokens
      v, w = v[mask], w[mask]
    np.testing.assert_allclose(v, w, atol=ATOL, rtol=1e-5, err_msg=k)
  # weights.load (every command's loader) reads it too, with the size the zoo wrote
  assert weights.load(path, head="all").cfg.hidden_size == zoo_common.SIZES["hidden_size"]


@pytest.mark.parametrize("name,meta", _select("tokenizer", ("hf-",)))
def test_tokenizer_ids_equal_hf(name, meta):
  path, want = zt.folder(name), zt.expected(name)
  if _refused(meta, "tokenizer", lambda: zt.hf_token_ids(path, zoo_common.TEXTS)):
    return
  for i, ids in enumerate(zt.hf_token_ids(path, zoo_common.TEXTS)):
    assert ids == want[f"tok_{i}"].tolist(), zoo_common.TEXTS[i]


@pytest.mark.parametrize("name,meta", _select("merge", ("hf-",), fast=FAST_MERGE))
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


@pytest.mark.parametrize("name,meta", _select("extend_vocab", ("hf-",), fast=FAST_VOCAB))
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


@pytest.mark.parametrize("name,meta", [p for p in _select("convert", ("hf-ForMaskedLM", "hf-ForPreTraining"),
                                                           fast={"st3/bert-formaskedlm"})
                                       if p.values[1]["family"] == "bert"])
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
@pytest.mark.parametrize("name", ["st3/bert-model", "st3/deberta-v2-model", "st5/dense-mean-dense-identity-prompts"])
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
