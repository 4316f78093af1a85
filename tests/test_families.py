"""RoBERTa and ModernBERT: numerical parity with HF transformers' PyTorch models in both directions (import:
HF weights -> bertjax; export: bertjax weights -> HF's AutoModelForMaskedLM), on padded batches."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402

from bertjax import convert, model  # noqa: E402

ATOL = 1e-5


def _randomise(m, scale=0.1):
  """Non-trivial biases and norm parameters, so that every mapped tensor matters."""
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("bias") or "norm" in name.lower():
        p.add_(torch.randn_like(p) * scale)
  return m


def roberta(layers=2, hidden=64, heads=4, ffn=128, vocab=300, seed=0):
  torch.manual_seed(seed)
  cfg = transformers.RobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=66,
                                   type_vocab_size=1, pad_token_id=1)
  return _randomise(transformers.RobertaForMaskedLM(cfg).eval())


def modernbert(layers=4, hidden=64, heads=4, ffn=96, vocab=320, seed=0, window=8, every=3, **kw):
  torch.manual_seed(seed)
  cfg = transformers.ModernBertConfig(
      vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, max_position_embeddings=128, local_attention=window, global_attn_every_n_layers=every,
      pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3, **kw)
  return _randomise(transformers.ModernBertForMaskedLM(cfg).eval())


def batch_for(vocab, b=3, length=24, p=5, seed=0, pad_id=1):
  """Right-padded rows (lengths 24, 17, 9), real tokens never the pad id, masked positions inside each row."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(4, vocab, (b, length))
  mask = np.ones((b, length), np.int64)
  for row, n in ((1, 17), (2, 9)):
    mask[row, n:] = 0
  ids = np.where(mask > 0, ids, pad_id)
  pos = np.stack([np.sort(rng.choice(np.arange(0, 9), p, replace=False)) for _ in range(b)])
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids), "masked_lm_positions": pos}


def hf_run(m, batch):
  with torch.no_grad():
    out = m(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
            output_hidden_states=True)
    base = next(getattr(m, a) for a in ("roberta", "bert", "model") if hasattr(m, a))
    hidden = base(input_ids=torch.tensor(batch["input_ids"]),
                  attention_mask=torch.tensor(batch["input_mask"])).last_hidden_state.numpy()
  logits = np.take_along_axis(out.logits.numpy(), batch["masked_lm_positions"][..., None], axis=1)
  return hidden, logits


def ours_run(cfg, params, batch):
  jb = {k: np.asarray(v, np.int32) for k, v in batch.items()}
  out = model.for_pretraining(cfg).apply({"params": params}, jb, deterministic=True)
  full = model.BertModel(cfg).apply({"params": params["bert"]}, jb, deterministic=True, pool=False)["hidden"]
  return np.asarray(out["hidden"]), np.asarray(out["mlm_logits"]), np.asarray(full)


def check(cfg, params, m, batch):
  hidden, logits = hf_run(m, batch)
  at_masked, ours_logits, full = ours_run(cfg, params, batch)
  valid = batch["input_mask"].astype(bool)
  diffs = {"hidden": np.abs(full - hidden)[valid].max(),
           "hidden_at_masked": np.abs(at_masked - np.take_along_axis(hidden, batch["masked_lm_positions"][..., None],
                                                                     axis=1)).max(),
           "mlm_logits": np.abs(ours_logits - logits).max()}
  assert all(v <= ATOL for v in diffs.values()), diffs
  return diffs


FAMILY_CASES = {
    "roberta-2x64": lambda: roberta(),
    "roberta-3x96": lambda: roberta(layers=3, hidden=96, heads=6, ffn=160, seed=1),
    "modernbert-4x64-window8": lambda: modernbert(),
    "modernbert-3x96-window4-every2": lambda: modernbert(layers=3, hidden=96, heads=3, ffn=64, window=4, every=2,
                                                         seed=1),
    "modernbert-biases": lambda: modernbert(layers=2, attention_bias=True, mlp_bias=True, classifier_bias=True,
                                            norm_bias=True, seed=2),
}


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
@pytest.mark.parametrize("scan", [False, True])
def test_import_matches_hf(tmp_path, case, scan):
  m = FAMILY_CASES[case]()
  m.save_pretrained(tmp_path / "hf")
  cfg, params = convert.from_hf(str(tmp_path / "hf"), scan_layers=scan)
  assert convert.family_of(cfg) == m.config.model_type
  pad = m.config.pad_token_id
  check(cfg, params, m, batch_for(m.config.vocab_size, pad_id=pad))


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_export_loads_in_hf_automodel(tmp_path, case):
  """bertjax params (the imported ones, perturbed so they are not HF's own) -> to_hf -> AutoModelForMaskedLM."""
  m = FAMILY_CASES[case]()
  m.save_pretrained(tmp_path / "hf")
  cfg, params = convert.from_hf(str(tmp_path / "hf"))
  rng = np.random.default_rng(3)
  params = jax.tree_util.tree_map(lambda a: np.asarray(a) + rng.normal(0, 0.01, np.shape(a)).astype(np.float32),
                                  params)
  convert.to_hf(cfg, params, str(tmp_path / "out"))
  back = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
  assert type(back).__name__ == type(m).__name__
  check(cfg, params, back, batch_for(m.config.vocab_size, pad_id=m.config.pad_token_id, seed=1))


def test_fresh_bertjax_modernbert_exports(tmp_path):
  """A model initialised by bertjax (not imported) with a padded vocabulary exports and matches HF."""
  cfg = convert.config_from_hf(modernbert(layers=3).config.to_dict(), vocab_size=300, vocab_multiple=64)
  batch = batch_for(300, pad_id=0)
  params = jax.tree_util.tree_map(np.asarray, model.for_pretraining(cfg).init(
      jax.random.key(0), {k: np.asarray(v, np.int32) for k, v in batch.items()})["params"])
  params = __import__("flax").linen.meta.unbox(params)
  convert.to_hf(cfg, params, str(tmp_path / "out"))
  back = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
  assert back.config.vocab_size == 320
  hidden, logits = hf_run(back, batch)
  at_masked, ours_logits, full = ours_run(cfg, params, batch)
  valid = batch["input_mask"].astype(bool)
  assert np.abs(full - hidden)[valid].max() <= ATOL
  np.testing.assert_allclose(ours_logits, logits[..., :300], atol=ATOL)
  assert (logits[..., 300:].max() < ours_logits.min() - 100)  # the padding rows are never the prediction


def test_unsupported_architecture_is_named():
  cfg = model.BertConfig(vocab_size=100, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                         norm="rmsnorm", norm_bias=False)
  with pytest.raises(convert.ConversionError, match="norm='rmsnorm'"):
    convert.family_of(cfg)


def test_byte_level_bpe_ids_match_roberta_tokenizer_fast(tmp_path):
  """A byte-level BPE trained on real prose (the `this` module's Zen and the standard library's docstrings),
  read from vocab.json + merges.txt, gives HF RobertaTokenizerFast's ids on text it was not trained on."""
  import codecs
  import json as json_mod

  from bertjax.data import tokenizer
  texts = [codecs.decode(__import__("this").s, "rot13")]
  texts += [m.__doc__ for m in (json_mod, np, pytest, codecs) if m.__doc__]
  (tmp_path / "corpus.txt").write_text("\n".join(texts), encoding="utf-8")
  path = tokenizer.train([tmp_path / "corpus.txt"], tmp_path / "tok", kind="byte_bpe", vocab_size=600)
  tok = tokenizer.load(path)
  hf = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path / "tok"))  # reads vocab.json + merges.txt
  probes = ["Hello world, it's 2026!", "  leading spaces and\ttabs\nnew lines", "naïve café — résumé ☃ 東京",
            "Fill the <mask> here.", "emoji 🙂 and numbers 3.14159", "UPPER lower MiXeD"]
  for text in probes:
    assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"], text
    assert tok.decode(tok.encode(text)) == text
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (
      hf.cls_token_id, hf.pad_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("family", [pytest.param("roberta", marks=pytest.mark.slow), "xlm-roberta",
                                    pytest.param("modernbert", marks=pytest.mark.slow),
                                    pytest.param("deberta", marks=pytest.mark.slow)])
def test_finetuning_starts_from_a_family_checkpoint(tmp_path, family):
  """`init=` an HF roberta / modernbert folder (with its byte-level BPE tokenizer) or an XLM-R folder (its
  sentencepiece tokenizer.json): the encoder loads, the task head starts fresh, and a learnable sentence task is
  learnt through the same fine-tuning path as BERT's."""
  import shutil

  import helpers

  from bertjax.data import tokenizer
  text = tmp_path / "corpus.txt"
  helpers.write_sentiment(text, 300, 5)
  if family == "xlm-roberta":
    xlm_roberta(tmp_path / "hf", lines=text.read_text().splitlines()[1:] * 3)
  elif family == "deberta":  # DeBERTa-v3's layers (a WordPiece vocabulary: the model is what is tested)
    helpers.tiny_deberta_folder([text], tmp_path / "hf")
  else:
    path = tokenizer.train([text], tmp_path / "tok", kind="byte_bpe", vocab_size=320)
    vocab = tokenizer.load(path).vocab_size
    m = roberta(vocab=vocab) if family == "roberta" else modernbert(vocab=vocab, layers=3, window=8)
    m.save_pretrained(tmp_path / "hf")
    for name in ("vocab.json", "merges.txt"):
      shutil.copy(tmp_path / "tok" / name, tmp_path / "hf" / name)
  out = helpers.finetune_sentiment(tmp_path, tmp_path / "hf")
  assert out["report"]["best"]["metrics"]["validation"]["accuracy"] > 0.9, out["report"]
  # The family's own head (RobertaClassificationHead; ModernBERT's prediction head, started from the MLM head as
  # HF's from_pretrained starts it), and the workdir exports as the family's classifier with equal probabilities.
  from bertjax import predict
  from bertjax.cli import convert as convert_cli
  params = out["state"].params
  if family != "modernbert":
    assert set(params) == {"bert", "head", "classifier"} and "pooler" not in params["bert"]
  else:
    assert set(params["head"]) == {"dense", "norm"}
  arch = convert_cli.write(str(tmp_path / "w"), str(tmp_path / "exported"))
  assert arch == {"roberta": "RobertaForSequenceClassification", "xlm-roberta": "XLMRobertaForSequenceClassification",
                  "modernbert": "ModernBertForSequenceClassification",
                  "deberta": "DebertaV2ForSequenceClassification"}[family]
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
  hf_clf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
  assert hf_clf.config.id2label == {0: "neg", 1: "pos"}
  for text in ("a good river", "the bad bridge was long"):
    with torch.no_grad():
      probs = torch.softmax(hf_clf(**hf_tok(text, return_tensors="pt")).logits[0], -1).numpy()
    ours = predict.predict_text(str(tmp_path / "w"), text)["probabilities"]
    np.testing.assert_allclose([ours["neg"], ours["pos"]], probs, atol=1e-4)


def test_mlm_only_bert_exports_as_bert_for_masked_lm(tmp_path):
  """A BERT pre-trained without NSP (no pooler, no NSP head) exports as HF's BertForMaskedLM and matches it."""
  from bertjax.model.config import BertConfig
  cfg = BertConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                   max_position_embeddings=32, nsp_head=False)
  batch = batch_for(300, pad_id=0)
  params = jax.tree_util.tree_map(np.asarray, model.for_pretraining(cfg).init(
      jax.random.key(0), {k: np.asarray(v, np.int32) for k, v in batch.items()})["params"])
  params = __import__("flax").linen.meta.unbox(params)
  assert "nsp" not in params and "pooler" not in params["bert"]
  convert.to_hf(cfg, params, str(tmp_path / "out"))
  back = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
  assert type(back).__name__ == "BertForMaskedLM"
  hidden, logits = hf_run(back, batch)
  _, ours_logits, full = ours_run(cfg, params, batch)
  assert np.abs(full - hidden)[batch["input_mask"].astype(bool)].max() <= ATOL
  np.testing.assert_allclose(ours_logits, logits, atol=ATOL)
  # ... and reads back, as it reads HF's own BertForMaskedLM (what run_mlm.py saves)
  cfg2, params2 = convert.from_hf(str(tmp_path / "out"))
  assert not cfg2.nsp_head
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params2, params)
  theirs = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
      max_position_embeddings=32, pad_token_id=0)).eval()
  theirs.save_pretrained(tmp_path / "theirs")
  cfg3, params3 = convert.from_hf(str(tmp_path / "theirs"))
  hidden, logits = hf_run(theirs, batch)
  _, ours_logits, full = ours_run(cfg3, params3, batch)
  assert np.abs(full - hidden)[batch["input_mask"].astype(bool)].max() <= ATOL
  np.testing.assert_allclose(ours_logits, logits, atol=ATOL)


MULTILINGUAL = ["Příliš žluťoučký kůň úpěl ďábelské ódy.", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
                "東京は日本の首都です。北京是中国的首都。", "مرحبا بالعالم، هذا اختبار بسيط.",
                "naïve café résumé 🙂 emoji 🚀", "Ünïcödé façade — Zürich, São Paulo, Kraków."]


def xlm_roberta(folder, layers=2, hidden=64, heads=4, ffn=128, seed=0, lines=()):
  """An XLM-RoBERTa folder built by HF's own classes: a sentencepiece unigram vocabulary trained here (on the Zen
  of Python, standard-library docstrings and text in five scripts), laid out as fairseq does (<s> <pad> </s> <unk>,
  the pieces, <mask>) by `XLMRobertaTokenizer`, and an `XLMRobertaForMaskedLM` of that vocabulary's size."""
  import codecs
  import json as json_mod

  import sentencepiece as spm
  folder.mkdir(parents=True, exist_ok=True)
  texts = [codecs.decode(__import__("this").s, "rot13")] + [m.__doc__ for m in (json_mod, codecs, np) if m.__doc__]
  (folder / "corpus.txt").write_text("\n".join(texts + MULTILINGUAL * 20 + list(lines)), encoding="utf-8")
  # identity normalisation: the precompiled normaliser would need sentencepiece's protobuf module
  spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "sp"), vocab_size=500,
                                 model_type="unigram", character_coverage=1.0, normalization_rule_name="identity",
                                 hard_vocab_limit=False, minloglevel=2)
  sp = spm.SentencePieceProcessor(model_file=str(folder / "sp.model"))
  vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
  vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())] + [("<mask>", 0.0)]
  tok = transformers.XLMRobertaTokenizer(vocab=vocab)
  tok.save_pretrained(folder)
  for f in ("corpus.txt", "sp.model", "sp.vocab"):
    (folder / f).unlink()
  torch.manual_seed(seed)
  cfg = transformers.XLMRobertaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=66,
                                      type_vocab_size=1, pad_token_id=1)
  _randomise(transformers.XLMRobertaForMaskedLM(cfg).eval()).save_pretrained(folder)
  return tok


def test_xlm_roberta_reads_and_writes_with_its_sentencepiece_ids(tmp_path):
  """An XLM-R folder imports (forward parity with HF's XLMRobertaForMaskedLM), its tokenizer.json gives HF's ids in
  several scripts (fairseq's shifted sentencepiece ids, <mask> last), and the export is an XLM-R folder again:
  XLMRobertaForMaskedLM with equal outputs, and a tokenizer AutoTokenizer reads with the same ids."""
  from bertjax.convert import export, weights
  from bertjax.data import tokenizer
  hf_tok = xlm_roberta(tmp_path / "hf")
  m = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
  assert type(m).__name__ == "XLMRobertaForMaskedLM"
  cfg, params = convert.from_hf(str(tmp_path / "hf"))
  assert cfg.hf_model_type == "xlm-roberta" and convert.family_of(cfg) == "xlm-roberta"
  check(cfg, params, m, batch_for(m.config.vocab_size, pad_id=1))

  path, _ = weights.hf_tokenizer(str(tmp_path / "hf"))
  tok = tokenizer.load(path)
  assert tok.kind == "metaspace" and tok.vocab_size == len(hf_tok) == m.config.vocab_size
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (
      hf_tok.cls_token_id, hf_tok.pad_token_id, hf_tok.sep_token_id, hf_tok.unk_token_id, hf_tok.mask_token_id) == (
      0, 1, 2, 3, len(hf_tok) - 1)
  probes = MULTILINGUAL + ["Words it never saw: Reykjavík, Ελληνικά, हिन्दी, 한국어 <mask> end.",
                           "  spaces\tand\nlines  "]
  for text in probes:
    ids = tok.encode(text)
    assert ids == hf_tok(text, add_special_tokens=False)["input_ids"], text
    starts = [not tok.continues_word[i] for i in ids]
    assert starts[0] and all(s == tok.id_to_token(i).startswith("\u2581") or i in tok.special_ids
                             for s, i in zip(starts, ids))

  rng = np.random.default_rng(3)
  params = jax.tree_util.tree_map(lambda a: np.asarray(a) + rng.normal(0, 0.01, np.shape(a)).astype(np.float32),
                                  params)
  convert.to_hf(cfg, params, str(tmp_path / "out"))
  export.copy_tokenizer(path, False, str(tmp_path / "out"))
  back = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
  assert type(back).__name__ == "XLMRobertaForMaskedLM" and back.config.pad_token_id == 1
  check(cfg, params, back, batch_for(m.config.vocab_size, pad_id=1, seed=1))
  again = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
  for text in probes:
    assert again(text)["input_ids"] == hf_tok(text)["input_ids"], text
    assert again(text, "a pair")["input_ids"] == hf_tok(text, "a pair")["input_ids"], text


@pytest.mark.slow
def test_predict_fills_an_xlm_roberta_mask_as_hfs_pipeline_does(tmp_path):
  """`predict` on an HF XLM-R folder fills its own mask token (<mask>) as well as [MASK]: the same top pieces and
  probabilities as HF's fill-mask pipeline on that folder."""
  from bertjax import predict
  xlm_roberta(tmp_path / "hf", seed=4)
  module, params, tok = predict.load(str(tmp_path / "hf"))
  text = "naïve café <mask> emoji"
  (pos, cands), = predict.fill_mask(module, params, tok, text, 3, 64)
  assert predict.fill_mask(module, params, tok, text.replace("<mask>", "[MASK]"), 3, 64) == [(pos, cands)]
  fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), tokenizer=str(tmp_path / "hf"))
  theirs = fill(text, top_k=3)
  assert [fill.tokenizer.convert_tokens_to_ids(t) for t, _ in cands] == [r["token"] for r in theirs]
  np.testing.assert_allclose([p for _, p in cands], [r["score"] for r in theirs], atol=1e-4)


def test_a_modernbert_folder_with_gemmas_tokenizer_reads_and_writes(tmp_path):
  """mmBERT's layout: a ModernBERT model whose tokenizer is Gemma's kind (byte-fallback BPE over '▁'-marked text,
  <pad> <eos> <bos> <unk> <mask> at 0-4; the config's cls/sep ids are <bos>/<eos>), built by HF's GemmaTokenizer
  over a BPE trained here on text in five scripts: bertjax reads the ids HF's AutoTokenizer gives, byte fallback
  for a script it never saw included, imports the model with parity, and exports both so that AutoTokenizer and
  AutoModelForMaskedLM read them back."""
  import json as json_mod

  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

  from bertjax.convert import export, weights
  from bertjax.data import tokenizer
  bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
  bpe.normalizer = normalizers.Replace(" ", "\u2581")
  bpe.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
  specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{i:02X}>" for i in range(256)]
  bpe.train_from_iterator(MULTILINGUAL * 30, trainers.BpeTrainer(vocab_size=700, special_tokens=specials,
                                                                 show_progress=False))
  spec = json_mod.loads(bpe.to_str())
  hf_tok = transformers.GemmaTokenizer(vocab=spec["model"]["vocab"],
                                       merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                               for m in spec["model"]["merges"]])
  hf_tok.save_pretrained(tmp_path / "hf")
  m = modernbert(vocab=len(hf_tok), layers=3)
  m.config.update(dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1))
  m.save_pretrained(tmp_path / "hf")

  path, _ = weights.hf_tokenizer(str(tmp_path / "hf"))
  tok = tokenizer.load(path)
  assert tok.kind == "metaspace" and tok.vocab_size == len(hf_tok)
  assert (tok.pad_id, tok.sep_id, tok.cls_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
  probes = MULTILINGUAL + ["ಕನ್ನಡ and ქართული are bytes here", "  two  spaces"]
  for text in probes:
    assert tok.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"], text
  assert tok.id_to_token(tok.encode("ಕ")[0]) == "<0xE0>"  # byte fallback for an unseen script
  cfg, params = convert.from_hf(str(tmp_path / "hf"))
  check(cfg, params, m, batch_for(len(hf_tok), pad_id=0))
  convert.to_hf(cfg, params, str(tmp_path / "out"))
  export.copy_tokenizer(path, False, str(tmp_path / "out"))
  back = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
  assert (back.config.pad_token_id, back.config.cls_token_id, back.config.sep_token_id) == (0, 2, 1)
  check(cfg, params, back, batch_for(len(hf_tok), pad_id=0, seed=1))
  again = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
  for text in probes:
    assert again(text, add_special_tokens=False)["input_ids"] == hf_tok(text, add_special_tokens=False)["input_ids"]
