"""Fine-tuning's pieces against independent references: seqeval's tag schemes, HF's tokenizers, the official
SQuAD v2.0 evaluation script's logic, and the bfloat16 dropout scale."""
import collections
import os
import random
import re
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import tasks as tasks_lib
from bertjax.core import scores
from bertjax.data import tokenizer
from bertjax.data.tasks import rows as tasks
from bertjax.data.tasks import squad
from bertjax.kernels import dropout

transformers = pytest.importorskip("transformers")

WORDS = ("the river runs north past old city walls where a great harbour meets small islands and good "
         "people say fine things about London Paris king queen").split()


@pytest.fixture(scope="module")
def vocab(make_vocab):
  return make_vocab(WORDS, 150, lines=300)


# ------------------------------------------------------------------ NER tag schemes
@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_span_scores_match_seqeval_for_each_scheme(scheme):
  seqeval = pytest.importorskip("seqeval.metrics")
  prefixes = {"IOB1": "BI", "IOB2": "BI", "IOBES": "BIES"}[scheme]
  tags = ["O"] + [f"{p}-{t}" for p in prefixes for t in ("PER", "geo-loc")]
  rng = random.Random(0)
  for _ in range(300):
    gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    pred = [[t if rng.random() < 0.6 else rng.choice(tags) for t in s] for s in gold]
    ours = scores.span_f1(pred, gold)
    assert abs(ours["f1"] - seqeval.f1_score(gold, pred)) < 1e-12, (gold, pred)
    assert abs(ours["precision"] - seqeval.precision_score(gold, pred)) < 1e-12
    assert abs(ours["recall"] - seqeval.recall_score(gold, pred)) < 1e-12
  assert scores.bio_spans(["S-PER", "B-LOC", "E-LOC", "I-PER"]) == {("PER", 0, 0), ("LOC", 1, 2), ("PER", 3, 3)}


@pytest.mark.parametrize("tag", ["U-PER", "L-PER", "PER", "B-"])
def test_tags_outside_the_supported_schemes_are_refused_by_name(tag):
  with pytest.raises(scores.TagSchemeError, match=re.escape(repr(tag))):
    scores.span_f1([["O", tag]], [["O", "O"]])
  with pytest.raises(tasks.TaskDataError, match=re.escape(repr(tag))):
    tasks_lib.get("ner", ("O", "B-PER", tag))


# ------------------------------------------------------------------ tokenisation against HF
def test_literal_special_tokens_map_to_their_ids_as_hf_does(vocab):
  hf = transformers.BertTokenizer.from_pretrained(os.path.dirname(vocab))
  ours = tokenizer.load(vocab, reference="hf")
  for text in ["the [MASK] runs north", "[CLS] old city [SEP] small islands [SEP]", "harbour[MASK]walls",
               "a [mask] in lower case stays text", "[PAD] [UNK] fine"]:
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
  assert ours.mask_id in ours.encode("the [MASK] runs")
  original = tokenizer.load(vocab, reference="original")  # google-research/bert splits it like any text
  assert original.mask_id not in original.encode("the [MASK] runs")


def test_word_length_cap_follows_each_reference(vocab):
  word = "river" * 30  # 150 characters: over HF's 100, under the original's 200
  hf = transformers.BertTokenizer.from_pretrained(os.path.dirname(vocab))
  ours = tokenizer.load(vocab, reference="hf")
  assert ours.encode(word) == hf.encode(word, add_special_tokens=False) == [ours.unk_id]
  original = tokenizer.load(vocab, reference="original")
  assert ours.unk_id not in original.encode(word) and len(original.encode(word)) > 1
  assert original.encode("river" * 41) == [original.unk_id]  # 205 characters


def _original_truncate_seq_pair(tokens_a, tokens_b, max_length):
  """run_classifier.py's _truncate_seq_pair, written out."""
  while True:
    if len(tokens_a) + len(tokens_b) <= max_length:
      break
    if len(tokens_a) > len(tokens_b):
      tokens_a.pop()
    else:
      tokens_b.pop()


def test_pair_encoding_matches_hf_tokenizer_and_the_original_truncation(vocab):
  """[CLS] a [SEP] b [SEP] and segment ids as HF's tokenizer(a, b) makes them; truncation by the original's
  rule (pop from the longer side; from b on a tie), which is HF's longest_first except on ties."""
  hf = transformers.BertTokenizerFast.from_pretrained(os.path.dirname(vocab))
  tok = tokenizer.load(vocab)
  rng = random.Random(1)
  examples = []
  for _ in range(200):
    a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))
    b = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 20)))
    examples.append({"text_a": a, "text_b": b, "label": 0})
  seq = 16
  ours = tasks.encode_pairs(examples, tok, seq)
  same_as_hf = 0
  for i, ex in enumerate(examples):
    a = hf(ex["text_a"], add_special_tokens=False)["input_ids"]
    b = hf(ex["text_b"], add_special_tokens=False)["input_ids"] if ex["text_b"] else []
    _original_truncate_seq_pair(a, b, seq - (3 if b else 2))
    ids = [hf.cls_token_id] + a + [hf.sep_token_id] + (b + [hf.sep_token_id] if b else [])
    n = len(ids)
    assert ours["input_ids"][i, :n].tolist() == ids, ex
    assert ours["segment_ids"][i, :n].tolist() == [0] * (len(a) + 2) + [1] * (n - len(a) - 2)
    assert ours["input_mask"][i].sum() == n and not ours["input_ids"][i, n:].any()
    enc = hf(ex["text_a"], ex["text_b"] or None, truncation=True, max_length=seq)
    if enc["input_ids"] == ids:
      assert enc["token_type_ids"] == ours["segment_ids"][i, :n].tolist()
      same_as_hf += 1
  assert same_as_hf > 150  # all but the truncation ties


def test_overlapping_squad_windows_are_hfs_overflowing_tokens(vocab):
  """`stride_is_overlap`: the windows of a long context are those of HF's tokenizer(question, context,
  truncation="only_second", stride=doc_stride, return_overflowing_tokens=True), as run_qa.py makes them; the
  original's windows start doc_stride apart (more of them while doc_stride is under half a window)."""
  hf = transformers.BertTokenizerFast.from_pretrained(os.path.dirname(vocab))
  tok = tokenizer.load(vocab)
  rng = random.Random(2)
  for n_words, seq, stride in ((60, 32, 8), (300, 64, 16), (301, 64, 40), (12, 32, 8)):
    context = " ".join(rng.choice(WORDS) for _ in range(n_words))
    question = " ".join(rng.choice(WORDS) for _ in range(5))
    ex = squad.QAExample("q", question, context, [])
    ours, windows = squad.featurize([ex], tok, max_seq_length=seq, doc_stride=stride, max_query_length=16,
                                    stride_is_overlap=True)
    enc = hf(question, context, truncation="only_second", max_length=seq, stride=stride,
             return_overflowing_tokens=True)
    assert len(windows) == len(enc["input_ids"]) and len(windows) >= (2 if n_words > 12 else 1)
    for i, ids in enumerate(enc["input_ids"]):
      assert ours["input_ids"][i, :len(ids)].tolist() == ids, (n_words, i)
      assert not ours["input_ids"][i, len(ids):].any()
    original, _ = squad.featurize([ex], tok, max_seq_length=seq, doc_stride=stride, max_query_length=16)
    if stride <= 16:
      assert len(original["input_ids"]) > len(windows) or n_words == 12
  with pytest.raises(tasks.TaskDataError, match="doc_stride 60 .*less than"):
    squad.featurize([ex], tok, max_seq_length=64, doc_stride=60, max_query_length=16, stride_is_overlap=True)


def _run_qa_train_features(hf, questions, contexts, answers, max_length, stride):
  """HF's run_qa.py `prepare_train_features`, transcribed: windows by the fast tokenizer's overflow, each answer's
  first and last token found through the offsets, [CLS] (0) when the answer is absent or not whole in a window."""
  enc = hf([q.lstrip() for q in questions], contexts, truncation="only_second", max_length=max_length,
           stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
  starts, ends = [], []
  for i, offsets in enumerate(enc["offset_mapping"]):
    ids, seq = enc["input_ids"][i], enc.sequence_ids(i)
    cls_index = ids.index(hf.cls_token_id)
    answer = answers[enc["overflow_to_sample_mapping"][i]]
    if answer is None:
      starts.append(cls_index)
      ends.append(cls_index)
      continue
    start_char, end_char = answer[1], answer[1] + len(answer[0])
    a = 0
    while seq[a] != 1:
      a += 1
    b = len(ids) - 1
    while seq[b] != 1:
      b -= 1
    if not (offsets[a][0] <= start_char and offsets[b][1] >= end_char):
      starts.append(cls_index)
      ends.append(cls_index)
      continue
    while a < len(offsets) and offsets[a][0] <= start_char:
      a += 1
    starts.append(a - 1)
    while offsets[b][1] >= end_char:
      b -= 1
    ends.append(b + 1)
  return enc, starts, ends


def test_squad_training_features_are_run_qas(vocab):
  """Training windows and answer targets (first/last answer token; [CLS] for an unanswerable question or an answer
  not whole in the window) equal run_qa.py's preprocessing over HF's tokenizer, on contexts long enough for
  several windows, answers anywhere in them (punctuation beside them), and SQuAD v2.0 impossible questions; but
  for run_qa's one slip, an answer at the end of a window."""
  hf = transformers.BertTokenizerFast.from_pretrained(os.path.dirname(vocab))
  tok = tokenizer.load(vocab)
  rng = random.Random(7)
  examples, answers = [], []
  for n in range(40):
    words = [rng.choice(WORDS) + rng.choice(["", "", "", ",", "."]) for _ in range(rng.randint(8, 90))]
    context = " ".join(words)
    question = " " * rng.randint(0, 2) + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) + "?"
    if n % 5 == 0:
      examples.append(squad.QAExample(f"q{n}", question, context, [], is_impossible=True))
      answers.append(None)
      continue
    i = rng.randrange(len(words))
    j = min(len(words), i + rng.randint(1, 4))
    start = len(" ".join(words[:i])) + (1 if i else 0)
    text = " ".join(words[i:j]).rstrip(",.")
    examples.append(squad.QAExample(f"q{n}", question, context, [(text, start)]))
    answers.append((text, start))
  for seq, stride in ((48, 12), (64, 24)):
    ours, windows = squad.featurize(examples, tok, max_seq_length=seq, doc_stride=stride, max_query_length=16,
                                    training=True, stride_is_overlap=True)
    enc, starts, ends = _run_qa_train_features(hf, [e.question for e in examples], [e.context for e in examples],
                                               answers, seq, stride)
    assert len(windows) == len(enc["input_ids"]) > len(examples)
    np.testing.assert_array_equal(ours["input_ids"], np.asarray(enc["input_ids"]))
    np.testing.assert_array_equal(ours["segment_ids"], np.asarray(enc["token_type_ids"]))
    for i, (s, e) in enumerate(zip(starts, ends)):
      if s > e:
        # run_qa's start scan passes the window's last context token when the answer is that token: the [SEP]
        # and padding after it have offsets (0, 0), which pass its `offsets[a][0] <= start_char` test. The
        # target is that one token.
        s = e
      assert (ours["start_positions"][i], ours["end_positions"][i]) == (s, e), (i, examples[windows[i].example])
    answered = sum(s > 0 for s in starts)
    assert 0 < answered < len(starts)  # both kinds of target occur


# ------------------------------------------------------------------ SQuAD v2.0, as the official script scores it
def _official_normalize(s):
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def _official_f1(gold, pred):
  g, p = _official_normalize(gold).split(), _official_normalize(pred).split()
  if not g or not p:
    return int(g == p)
  common = collections.Counter(g) & collections.Counter(p)
  same = sum(common.values())
  if same == 0:
    return 0
  prec, rec = same / len(p), same / len(g)
  return 2 * prec * rec / (prec + rec)


def _official_v2(preds, na_probs, golds):
  """evaluate-v2.0.py's get_raw_scores, make_eval_dict and find_best_thresh, written out here."""
  has_ans = {q: bool(g) for q, g in golds.items()}
  exact, f1 = {}, {}
  for q, g in golds.items():
    gold = g or [""]
    exact[q] = max(int(_official_normalize(a) == _official_normalize(preds[q])) for a in gold)
    f1[q] = max(_official_f1(a, preds[q]) for a in gold)
  out = {"exact": 100.0 * sum(exact.values()) / len(golds), "f1": 100.0 * sum(f1.values()) / len(golds)}
  for name, raw in (("exact", exact), ("f1", f1)):
    cur = best = sum(1 for q in golds if not has_ans[q])
    thresh = 0.0
    for q in sorted(na_probs, key=lambda k: na_probs[k]):
      cur += raw[q] if has_ans[q] else (-1 if preds[q] else 0)
      if cur > best:
        best, thresh = cur, na_probs[q]
    out[f"best_{name}"], out[f"best_{name}_thresh"] = 100.0 * best / len(golds), thresh
  return out


def test_squad_v2_scores_match_the_official_script():
  rng = random.Random(2)
  words = "the denver broncos won super bowl fifty in santa clara a an".split()
  for _ in range(20):
    answers, golds = {}, {}
    for i in range(30):
      q = f"q{i}"
      golds[q] = [] if rng.random() < 0.4 else [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))]
      text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
      answers[q] = (text, rng.gauss(0, 2), rng.gauss(0, 2))
    ours = squad.v2_scores(answers, golds, scores.squad_exact, scores.squad_f1)
    preds = {q: ("" if null - s > 0 else t) for q, (t, s, null) in answers.items()}
    theirs = _official_v2(preds, {q: null - s for q, (t, s, null) in answers.items()}, golds)
    for k, v in theirs.items():
      assert abs(ours[k] - v) < 1e-9, (k, ours[k], v)
    assert "HasAns_f1" in ours and "NoAns_exact" in ours


# ------------------------------------------------------------------ bfloat16 dropout
def test_bfloat16_hash_dropout_scales_in_float32():
  """Kept elements are x·(1/(1 − r)) computed in float32 and rounded once; a bfloat16 scale (1.109375 for
  r = 0.1) would shrink the mean by 0.16%."""
  x = jax.random.uniform(jax.random.key(0), (512, 1024), jnp.float32, 1.0, 2.0).astype(jnp.bfloat16)
  y = dropout.hash_dropout(x, jnp.uint32(7), 0.1)
  keep = np.asarray(y) != 0
  want = (np.asarray(x, np.float32) / 0.9).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(y)[keep], np.asarray(want)[keep])
  ratio = np.asarray(y, np.float64)[keep].sum() / np.asarray(x, np.float64)[keep].sum()
  assert abs(ratio * 0.9 - 1.0) < 2e-4, ratio
