"""merge on every head form an HF folder comes in (BertForPreTraining, BertForMaskedLM, BertModel), TIES as the
authors' code computes it, merge's --last mistakes, and the published sentencepiece tokenizer files of DeBERTa-v3
(spm.model) and XLM-R (sentencepiece.bpe.model) read with HF's ids."""
import json
import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import errors  # noqa: E402
from bertjax.cli import merge as merge_cli  # noqa: E402
from bertjax.convert import files as convert_files  # noqa: E402

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "blue", "sky", "over", "hill"]


def vocab_lines(n=99):
  return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"w{i}" for i in range(n - 5 - len(WORDS))]


def hf_bert(folder, cls, seed, roberta=False):
  """A tiny HF folder (hidden 32, 2 layers) of `cls`, random biases and norms, with BERT's vocab.txt."""
  torch.manual_seed(seed)
  kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=2)
  cfg = (transformers.RobertaConfig if roberta else transformers.BertConfig)(**kw)
  m = cls(cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  m.save_pretrained(folder)
  (folder / "vocab.txt").write_text("\n".join(vocab_lines()) + "\n")
  return str(folder)


def state(folder):
  return convert_files.read_safetensors(f"{folder}/model.safetensors")


def topk_values_mask(m, k_frac):
  """The authors' `topk_values_mask(M, K)` (TIES-merging repo) in NumPy: per row (one task's flattened model),
  keep |M| >= its k-th smallest value, k = d - int(d·K)."""
  n, d = m.shape
  k = d - int(d * k_frac)
  kth = np.sort(np.abs(m), axis=1)[:, k - 1:k]
  return m * (np.abs(m) >= kth)


def ties_authors(flat_base, flat_tasks, k_frac, lam):
  """`ties_merging` (topk_values_mask, resolve_sign with the "majority" rule, disjoint_merge "mean") on task
  vectors flattened over the whole model, then θ = θ_base + λ·τ_m (the authors' notebook)."""
  tv = np.stack([t - flat_base for t in flat_tasks])
  if k_frac < 1:
    tv = topk_values_mask(tv, k_frac)
  sign = np.sign(tv.sum(axis=0))
  sign[sign == 0] = np.sign(sign.sum())  # resolve_zero_signs(sign_to_mult, "majority")
  rows_to_keep = np.where(sign[None] > 0, tv > 0, tv < 0)
  selected = tv * rows_to_keep
  count = (selected != 0).sum(axis=0).astype(np.float64)
  return flat_base + lam * selected.sum(axis=0) / np.maximum(count, 1)


def flatten_states(states, keys):
  return [np.concatenate([s[k].astype(np.float64).ravel() for k in keys]) for s in states]


def unflatten(vec, like, keys):
  out, i = {}, 0
  for k in keys:
    out[k] = vec[i:i + like[k].size].reshape(like[k].shape)
    i += like[k].size
  return out


# ----------------------------------------------------------------------------- merge: head forms
FORMS = [("BertForPreTraining", "BertForPreTraining"), ("BertForMaskedLM", "BertForMaskedLM"),
         ("BertModel", "BertModel")]


@pytest.mark.parametrize("cls_name,arch", FORMS)
def test_merge_reads_and_writes_each_hf_head_form(tmp_path, cls_name, arch):
  """linear and TIES merges of HF folders of one head form are written in that form; the linear mean is NumPy's
  (float64) of the inputs' tensors, TIES is the authors' rule over the whole flattened model, and the workdir
  OUT holds the same tensors as OUT/hf."""
  from bertjax.convert import weights
  cls = getattr(transformers, cls_name)
  a, b, base = (hf_bert(tmp_path / n, cls, s) for n, s in (("a", 1), ("b", 2), ("base", 3)))
  assert merge_cli.main([a, b, "--out", str(tmp_path / "lin")]) == 0
  hf_out = tmp_path / "lin" / "hf"
  assert json.loads((hf_out / "config.json").read_text())["architectures"] == [arch]
  sa, sb, got = state(a), state(b), state(hf_out)
  assert set(got) == set(sa)
  for k in sa:
    np.testing.assert_array_equal(got[k], ((sa[k].astype(np.float64) + sb[k]) / 2).astype(np.float32), err_msg=k)
  transformers.AutoModel.from_pretrained(str(hf_out))  # HF reads it back
  assert (hf_out / "vocab.txt").is_file()

  assert merge_cli.main([a, b, "--method", "ties", "--base", base, "--density", "0.3", "--lam", "0.8",
                         "--out", str(tmp_path / "ties")]) == 0
  got = state(tmp_path / "ties" / "hf")
  assert json.loads((tmp_path / "ties" / "hf" / "config.json").read_text())["architectures"] == [arch]
  keys = sorted(sa)
  sbase = state(base)
  want = unflatten(ties_authors(*[flatten_states([s], keys)[0] for s in (sbase,)], flatten_states([sa, sb], keys),
                                0.3, 0.8), sbase, keys)
  for k in keys:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
  mine = weights.load(str(tmp_path / "ties"), overrides={"scan_layers": False}, head="all")
  theirs = weights.load(str(tmp_path / "ties" / "hf"), overrides={"scan_layers": False}, head="all")
  import jax
  for (p, x), y in zip(jax.tree_util.tree_leaves_with_path(theirs.params), jax.tree_util.tree_leaves(mine.params),
                       strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(p))


def one_line(capsys, argv, pattern):
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    merge_cli.main(argv)
  err = capsys.readouterr().err
  assert e.value.code == errors.EXIT_CODE and pattern in err and err.count("\n") == 1, (argv, err)


ST_ZOO = os.path.join(os.path.dirname(__file__), "data", "zoo", "st6")


@pytest.mark.slow
def test_merging_sentence_transformers_folders_keeps_their_pooling_and_head(tmp_path, capsys):
  """Two sentence-transformers folders (CLS pooling, a Dense layer, Normalize, prompts) merged 0.7 / 0.3: OUT/hf
  loads in SentenceTransformer as the same stack over the averaged encoder, the embeddings of the model torch
  averages; a folder of another pooling is refused in one line."""
  st = pytest.importorskip("sentence_transformers")
  a, b = os.path.join(ST_ZOO, "dense-cls-dense-norm-prompts"), str(tmp_path / "b")
  other = st.SentenceTransformer(a, device="cpu")
  torch.manual_seed(1)
  with torch.no_grad():
    for p in other[0].parameters():
      p.add_(0.05 * torch.randn_like(p))
  other.save(b)
  assert merge_cli.main([a, b, "--weights", "0.7,0.3", "--out", str(tmp_path / "m")]) == 0
  expected = st.SentenceTransformer(a, device="cpu")
  with torch.no_grad():
    for p, q in zip(expected[0].parameters(), other[0].parameters(), strict=True):
      p.mul_(0.7).add_(0.3 * q)
  merged = st.SentenceTransformer(str(tmp_path / "m" / "hf"), device="cpu")
  assert [type(m).__name__ for m in merged] == [type(m).__name__ for m in expected]
  texts = ["the cat sat on the mat", "a dog ran far away over the hill"]
  np.testing.assert_allclose(merged.encode(texts, prompt_name="query"), expected.encode(texts, prompt_name="query"),
                             atol=2e-5)
  mean = os.path.join(ST_ZOO, "dense-max")
  capsys.readouterr()
  with pytest.raises(SystemExit):
    merge_cli.main([a, mean, "--out", str(tmp_path / "bad")])
  err = capsys.readouterr().err.strip()
  assert "sentence-transformers modules differ" in err and len(err.splitlines()) == 1


def test_merge_refuses_unlike_forms_and_families_in_one_line(tmp_path, capsys):
  mlm = hf_bert(tmp_path / "mlm", transformers.BertForMaskedLM, 1)
  pre = hf_bert(tmp_path / "pre", transformers.BertForPreTraining, 2)
  enc = hf_bert(tmp_path / "enc", transformers.BertModel, 3)
  rob = hf_bert(tmp_path / "rob", transformers.RobertaForMaskedLM, 4, roberta=True)
  one_line(capsys, [mlm, pre, "--out", str(tmp_path / "o1")], "different forms (an MLM head vs MLM + NSP heads)")
  one_line(capsys, [mlm, enc, "--out", str(tmp_path / "o2")], "different forms")
  one_line(capsys, [mlm, mlm, "--method", "ties", "--base", enc, "--out", str(tmp_path / "o3")], "different forms")
  one_line(capsys, [mlm, rob, "--out", str(tmp_path / "o4")], "different model families (bert vs roberta)")
  assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))


def test_merge_last_must_be_positive_and_not_with_a_selector(tmp_path, capsys):
  a = hf_bert(tmp_path / "a", transformers.BertForMaskedLM, 1)
  w = str(tmp_path / "w")
  assert merge_cli.main([a, a, "--out", w]) == 0  # a merge's output is a workdir with one checkpoint
  one_line(capsys, [w, "--last", "0", "--out", str(tmp_path / "o1")], "--last must be >= 1")
  one_line(capsys, [w, "--last", "-2", "--out", str(tmp_path / "o2")], "--last must be >= 1")
  one_line(capsys, [f"{w}@ema", "--last", "3", "--out", str(tmp_path / "o3")], "@ema and --last do not combine")
  one_line(capsys, [f"{w}@0", "--last", "1", "--out", str(tmp_path / "o4")], "@0 and --last do not combine")
  assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))
  assert merge_cli.main([w, "--last", "1", "--out", str(tmp_path / "o5")]) == 0
  # a merge of one model with itself, and of its one checkpoint, is that model: HF's own tensors come back
  want = state(a)
  for got in (state(f"{w}/hf"), state(tmp_path / "o5" / "hf")):
    assert set(got) == set(want)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# ----------------------------------------------------------------------------- published sentencepiece tokenizers
TEXTS = ["the cat sat on the mat", "Über naïve café: hello world, quickly running away!", "xyzzy token izer 42",
         "  two  spaces and\ttabs  "]


def train_spm(path, **ids):
  """A small sentencepiece model (unigram, vocab ~200) on generated text, written to `path`."""
  import io

  import sentencepiece as spm
  rng = random.Random(0)
  words = WORDS + ["Über", "naïve", "café", "hello", "world", "quickly", "running", "token", "izer", "42", "!", ","]
  lines = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(3000)]
  model = io.BytesIO()
  spm.SentencePieceTrainer.Train(sentence_iterator=iter(lines), model_writer=model, vocab_size=200,
                                 model_type="unigram", hard_vocab_limit=False, minloglevel=2, num_threads=1, **ids)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(model.getvalue())
  return spm.SentencePieceProcessor(model_file=str(path))


def charsmap(path):
  """The model's precompiled normalisation map (NormalizerSpec.precompiled_charsmap), as HF's converters read it:
  parsed by protobuf with sentencepiece's own schema, the descriptor its sentencepiece_model_pb2 carries (that
  module's gencode asks a newer protobuf runtime than the lock's, so the descriptor is loaded into a fresh pool)."""
  import ast
  import pathlib

  import sentencepiece
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
  src = (pathlib.Path(sentencepiece.__file__).parent / "sentencepiece_model_pb2.py").read_text()
  raw = next(n.args[0].value for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "AddSerializedFile")
  pool = descriptor_pool.DescriptorPool()
  pool.Add(descriptor_pb2.FileDescriptorProto.FromString(raw))
  model = message_factory.GetMessageClass(pool.FindMessageTypeByName("sentencepiece.ModelProto"))()
  model.ParseFromString(path.read_bytes())
  assert model.normalizer_spec.precompiled_charsmap, "the model has no precompiled charsmap to compare with"
  return model.normalizer_spec.precompiled_charsmap


def deberta_folder(tmp_path):
  folder = tmp_path / "deberta"
  sp = train_spm(folder / "spm.model", pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2,
                 eos_piece="[SEP]", unk_id=3, unk_piece="[UNK]")
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False, "split_by_punct": False, "vocab_type": "spm",
       "bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
       "cls_token": "[CLS]", "mask_token": "[MASK]"}))
  return folder, sp


def test_deberta_v3_spm_model_reads_with_hf_ids(tmp_path):
  """A DeBERTa-v3 folder as published (spm.model + tokenizer_config.json, no tokenizer.json) is found and read with
  HF DebertaV2Tokenizer's ids: the model's own ([PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3), [MASK] appended at the piece count
  (128000 in DeBERTa-v3). HF's tokenizer is built from the model's pieces and scores (transformers 5 cannot read
  spm.model alone here); bertjax's exported tokenizer.json gives the same ids."""
  from bertjax.convert import export
  from bertjax.data import tokenizer
  folder, sp = deberta_folder(tmp_path)
  path, lower = convert_files.hf_tokenizer(str(folder))
  assert path == str(folder / "spm.model") and lower is False
  tok = tokenizer.load(path)
  n = sp.GetPieceSize()
  assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.mask_id, tok.vocab_size) == (0, 1, 2, 3, n, n + 1)
  hf = transformers.DebertaV2Tokenizer(vocab=[(sp.IdToPiece(i), sp.GetScore(i)) for i in range(n)])
  assert hf.mask_token_id == tok.mask_id and hf.pad_token_id == tok.pad_id and hf.unk_token_id == tok.unk_id
  ours = export.sentencepiece_as_hf(path)
  for text in TEXTS:
    ids = tok.encode(text)
    assert ids == sp.encode(text)  # the transcription: DeBERTa's SPMTokenizer encodes with the model itself
    assert hf(text)["input_ids"] == [1, *ids, 2], text
    assert ours.encode(text).ids == [1, *ids, 2], text
  assert tok.decode(tok.encode("the cat") + [tok.mask_id]) == "the cat [MASK]"


def test_xlmr_sentencepiece_bpe_model_reads_with_fairseq_ids(tmp_path):
  """XLM-R's sentencepiece.bpe.model (<unk>=0 <s>=1 </s>=2 in the model) reads with HF XLMRobertaTokenizer's ids:
  <s>=0 <pad>=1 </s>=2 <unk>=3, every other piece one above its id in the model, <mask> last; HF's tokenizer built
  as its converter builds it (fairseq's four tokens, the model's pieces from id 3, <mask>; its normaliser)."""
  from bertjax.convert import export
  from bertjax.data import tokenizer
  folder = tmp_path / "xlmr"
  sp = train_spm(folder / "sentencepiece.bpe.model")
  path, _ = convert_files.hf_tokenizer(str(folder))
  assert path == str(folder / "sentencepiece.bpe.model")
  tok = tokenizer.load(path)
  n = sp.GetPieceSize()
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id, tok.vocab_size) == (0, 1, 2, 3, n + 1, n + 2)
  vocab = [(t, 0.0) for t in ("<s>", "<pad>", "</s>", "<unk>")]
  vocab += [(sp.IdToPiece(i), sp.GetScore(i)) for i in range(3, n)] + [("<mask>", 0.0)]
  hf = transformers.XLMRobertaTokenizer(vocab=vocab,
                                        _spm_precompiled_charsmap=charsmap(folder / "sentencepiece.bpe.model"))
  assert hf.mask_token_id == tok.mask_id
  ours = export.sentencepiece_as_hf(path)
  for text in TEXTS + ["€ unknown ☃", "ﬁne ＣＡＴ on the ｍａｔ"]:  # the last needs the NFKC map
    ids = tok.encode(text)
    assert ids == [i + 1 if i else 3 for i in sp.encode(text)]  # fairseq's offset, spm's <unk> as 3
    assert hf(text)["input_ids"] == [0, *ids, 2], text
    assert ours.encode(text).ids == [0, *ids, 2], text
  assert tok.decode(tok.encode("hello world")) == "hello world"


def test_deberta_v3_folder_tokenizer_is_found_by_weights(tmp_path):
  from bertjax.convert import weights
  folder, _ = deberta_folder(tmp_path)
  assert weights.hf_tokenizer(str(folder))[0] == str(folder / "spm.model")
