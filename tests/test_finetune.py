"""Fine-tuning: metrics against independent references, SQuAD windows, end to end on tiny configs, bad input."""
import json
import os
import random
import subprocess
import sys

import helpers
import jax
import numpy as np
import pytest
from helpers import ROOT, assert_one_line_error, run_cmd

from bertjax import errors, finetune, predict
from bertjax import tasks as tasks_lib
from bertjax.cli import predict as predict_cli
from bertjax.core import scores
from bertjax.data import tokenizer
from bertjax.data.tasks import batching, conll, squad
from bertjax.data.tasks import rows as tasks
from configs import common
from configs import finetune as finetune_config


# ------------------------------------------------------------------ metrics vs independent references
def test_classification_metrics_match_sklearn():
  from sklearn import metrics as skm
  rng = np.random.default_rng(0)
  for _ in range(20):
    g = rng.integers(0, 2, 50)
    p = np.where(rng.random(50) < 0.7, g, 1 - g)
    assert abs(scores.accuracy(p, g) - skm.accuracy_score(g, p)) < 1e-12
    assert abs(scores.f1_binary(p, g) - skm.f1_score(g, p)) < 1e-12
    assert abs(scores.matthews_corrcoef(p, g) - skm.matthews_corrcoef(g, p)) < 1e-12
  assert scores.matthews_corrcoef([1, 1, 1], [1, 0, 1]) == skm.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0


def test_correlations_match_scipy_with_ties():
  from scipy import stats
  rng = np.random.default_rng(1)
  for _ in range(20):
    x = rng.integers(0, 6, 40).astype(float)  # many ties, as STS-B's 0..5 scores have
    y = x + rng.normal(0, 1.5, 40)
    assert abs(scores.pearson(x, y) - stats.pearsonr(x, y)[0]) < 1e-10
    assert abs(scores.spearman(x, y) - stats.spearmanr(x, y)[0]) < 1e-10


def test_squad_metrics_hand_worked():
  assert scores.normalize_answer("The  Eiffel Tower!") == "eiffel tower"
  assert scores.normalize_answer("an apple, a pear and the fig.") == "apple pear and fig"
  assert scores.normalize_answer("  théâtre  ") == "théâtre"
  assert scores.squad_exact("the Denver Broncos", "Denver Broncos") == 1.0
  # prediction "Denver Broncos won", gold "Broncos": overlap 1, precision 1/3, recall 1 -> F1 0.5
  assert abs(scores.squad_f1("Denver Broncos won", "Broncos") - 0.5) < 1e-12
  assert scores.squad_f1("", "") == 1.0 and scores.squad_f1("x", "") == 0.0 and scores.squad_f1("", "x") == 0.0
  # max over golds; a missing prediction counts 0; an unanswerable question ([]) wants ""
  r = scores.squad_scores({"a": "Broncos", "c": ""}, {"a": ["Denver Broncos", "Broncos"], "b": ["x"], "c": []})
  assert abs(r["exact_match"] - 200 / 3) < 1e-9 and abs(r["f1"] - 200 / 3) < 1e-9


def test_ner_span_f1_matches_seqeval():
  seqeval = pytest.importorskip("seqeval.metrics")
  rng = random.Random(0)
  tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
  for _ in range(200):
    n = rng.randint(1, 12)
    gold = [[rng.choice(tags) for _ in range(n)] for _ in range(3)]
    pred = [[t if rng.random() < 0.7 else rng.choice(tags) for t in s] for s in gold]
    ours = scores.span_f1(pred, gold)
    assert abs(ours["f1"] - seqeval.f1_score(gold, pred)) < 1e-12, (gold, pred)
    assert abs(ours["precision"] - seqeval.precision_score(gold, pred)) < 1e-12
  assert scores.bio_spans(["I-PER", "I-PER", "O", "B-LOC", "I-PER"]) == {("PER", 0, 1), ("LOC", 3, 3), ("PER", 4, 4)}


# ------------------------------------------------------------------ SQuAD windows and post-processing
@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  d = tmp_path_factory.mktemp("ft_tok")
  rng = random.Random(0)
  words = ("alpha beta gamma delta river mountain city island harbour north south east west old new great small "
           "good bad fine poor nice awful Zanzibar Pemba Island king queen John Smith Paris London").split()
  lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
  (d / "t.txt").write_text("\n".join(lines))
  return tokenizer.train([d / "t.txt"], d / "tok", vocab_size=200)


def planted_example(qid="q1", seed=0):
  rng = random.Random(seed)
  filler = "alpha beta gamma delta river mountain city harbour north south east west".split()
  before = " ".join(rng.choice(filler) for _ in range(150))
  after = " ".join(rng.choice(filler) for _ in range(150))
  context = f"{before} the old harbour of Zanzibar Pemba Island lies {after}."
  answer = "Zanzibar Pemba Island"
  return squad.QAExample(qid, "which island has the old harbour", context, [(answer, context.index(answer))])


def perfect_logits(feats, windows, null_bias=0.0):
  s = np.full(feats["input_ids"].shape, -10.0)
  e = np.full(feats["input_ids"].shape, -10.0)
  for i in range(len(windows)):
    s[i, feats["start_positions"][i]] = 10.0
    e[i, feats["end_positions"][i]] = 10.0
    s[i, 0] += null_bias
    e[i, 0] += null_bias
  return s, e


def test_planted_answer_across_windows_is_recovered_exactly(vocab):
  tok = tokenizer.load(vocab)
  ex = planted_example()
  feats, windows = squad.featurize([ex], tok, max_seq_length=64, doc_stride=16, max_query_length=16, training=True)
  assert len(windows) > 5  # the context is split into many windows
  inside = [i for i in range(len(windows)) if feats["start_positions"][i] > 0]
  assert inside and all(feats["end_positions"][i] >= feats["start_positions"][i] for i in inside)
  s, e = perfect_logits(feats, windows)
  (text, score, null), = squad.best_answers([ex], windows, s, e).values()
  assert text == "Zanzibar Pemba Island"  # the original casing, from the original context
  assert score > null


def test_v2_null_answer_when_the_null_score_wins(vocab):
  tok = tokenizer.load(vocab)
  ex = planted_example()
  feats, windows = squad.featurize([ex], tok, max_seq_length=64, doc_stride=16, max_query_length=16, training=True)
  s, e = perfect_logits(feats, windows, null_bias=30.0)
  answers = squad.best_answers([ex], windows, s, e)
  assert squad.apply_null_threshold(answers, 0.0) == {"q1": ""}
  assert squad.apply_null_threshold(answers, 1e9) == {"q1": "Zanzibar Pemba Island"}
  # The dev threshold: q1 answerable (span wins by 40), q2 unanswerable (null wins by 5) -> one in between.
  answers = squad.best_answers([ex], windows, *perfect_logits(feats, windows))
  answers["q2"] = ("Paris", 1.0, 6.0)
  golds = {"q1": ["Zanzibar Pemba Island"], "q2": []}
  one = lambda p, g: max(scores.squad_f1(p, a) for a in (g or [""]))  # noqa: E731
  t, best = squad.best_threshold(answers, golds, one)
  assert best == 1.0
  assert squad.apply_null_threshold(answers, t) == {"q1": "Zanzibar Pemba Island", "q2": ""}


def _original_best_span(ex, windows, start_logits, end_logits, n_best, max_answer_length):
  """run_squad.py's write_predictions, written out: the n_best start and end indexes of each window, skipping
  positions outside the context, end < start, spans over max_answer_length and starts without max context; the
  best start + end logit over all windows."""
  best = (-np.inf, "")
  for wi, w in enumerate(windows):
    s, e = start_logits[wi], end_logits[wi]
    starts = sorted(range(len(s)), key=lambda i: -s[i])[:n_best]
    ends = sorted(range(len(e)), key=lambda i: -e[i])[:n_best]
    for i in starts:
      for j in ends:
        if w.offsets[i][0] < 0 or w.offsets[j][0] < 0 or not w.max_context[i]:
          continue
        if j < i or j - i + 1 > max_answer_length:
          continue
        if s[i] + e[j] > best[0]:
          best = (float(s[i] + e[j]), ex.context[w.offsets[i][0]:w.offsets[j][1]].strip())
  return best[1]


@pytest.mark.parametrize("n_best,max_len", [(20, 30), (3, 4), (1, 2)])
def test_squad_post_processing_matches_the_original_rules(vocab, n_best, max_len):
  """Random logits (where end < start, over-long spans and low-ranked indexes matter) against a transcription of
  the original's n-best search, and the end-to-end EM/F1 of the predictions."""
  tok = tokenizer.load(vocab)
  exs = [planted_example(f"q{k}", seed=k) for k in range(3)]
  feats, windows = squad.featurize(exs, tok, max_seq_length=64, doc_stride=16, max_query_length=16, training=False)
  rng = np.random.default_rng(n_best)
  s = rng.normal(0, 3, feats["input_ids"].shape)
  e = rng.normal(0, 3, feats["input_ids"].shape)
  answers = squad.best_answers(exs, windows, s, e, n_best=n_best, max_answer_length=max_len)
  for k, ex in enumerate(exs):
    mine = [i for i, w in enumerate(windows) if w.example == k]
    want = _original_best_span(ex, [windows[i] for i in mine], s[mine], e[mine], n_best, max_len)
    assert answers[ex.qid][0] == want
  # end to end: the gold span's logits raised in one window make EM and F1 100 for that question only
  task = tasks_lib.get("squad_json")
  tf, _ = squad.featurize([exs[0]], tok, max_seq_length=64, doc_stride=16, max_query_length=16, training=True)
  # example 0's windows come first in both featurisations; take one that is the answer's max-context window
  hit = [j for j in range(len(tf["input_ids"]))
         if tf["start_positions"][j] > 0 and windows[j].max_context[tf["start_positions"][j]]][0]
  s[hit, tf["start_positions"][hit]] = e[hit, tf["end_positions"][hit]] = 50.0
  ev = tasks_lib.EvalSet("validation", feats, {"examples": exs, "windows": windows})
  c = finetune_config.get_config("task=squad_json")
  c.data.n_best, c.data.max_answer_length = n_best, max(max_len, 3)
  got = tasks_lib.kind(task).score(task, ev, {"start_logits": s, "end_logits": e}, c)
  golds = {ex.qid: [a for a, _ in ex.answers] for ex in exs}
  preds = {q: t for q, (t, _, _) in squad.best_answers(exs, windows, s, e, n_best, max(max_len, 3)).items()}
  assert preds["q0"] == "Zanzibar Pemba Island"
  em = np.mean([max(scores.squad_exact(preds[q], a) for a in golds[q]) for q in golds]) * 100
  f1 = np.mean([max(scores.squad_f1(preds[q], a) for a in golds[q]) for q in golds]) * 100
  assert abs(got["exact_match"] - em) < 1e-9 and abs(got["f1"] - f1) < 1e-9 and got["exact_match"] >= 100 / 3


def test_answer_not_in_context_is_a_counted_skip(vocab):
  tok = tokenizer.load(vocab)
  ex = planted_example()
  bad = squad.QAExample("q2", "where", "alpha beta gamma", [("Paris", 3)])
  stats = {}
  feats, windows = squad.featurize([ex, bad], tok, max_seq_length=64, doc_stride=16, max_query_length=16,
                                   training=True, stats=stats)
  assert stats["answer_not_found"] == 1 and all(w.example == 0 for w in windows)


def test_squad_json_reader_and_errors(tmp_path):
  ex = planted_example()
  (tmp_path / "s.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": ex.context, "qas": [
      {"id": "q1", "question": ex.question, "answers": [{"text": ex.answers[0][0], "answer_start": ex.answers[0][1]}]},
      {"id": "q2", "question": "none?", "answers": [], "is_impossible": True}]}]}]}))
  got = squad.json_examples(tmp_path / "s.json")
  assert [g.qid for g in got] == ["q1", "q2"] and got[1].is_impossible and got[0].answers == ex.answers
  (tmp_path / "bad.json").write_text('{"version": 1}')
  with pytest.raises(tasks.TaskDataError, match="not SQuAD-format JSON"):
    squad.json_examples(tmp_path / "bad.json")


def test_tfds_readers_under_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  import tensorflow_datasets.question_answering  # noqa: F401  (registers squad)
  import tensorflow_datasets.text  # noqa: F401
  with tfds.testing.mock_data(num_examples=7):
    glue = tasks.glue_examples(tasks_lib.get("glue/mnli"), "validation_matched")
    assert len(glue) == 7 and all(isinstance(g["text_a"], str) and g["label"] in (0, 1, 2) for g in glue)
    stsb = tasks.glue_examples(tasks_lib.get("glue/stsb"), "train")
    assert all(isinstance(g["label"], float) for g in stsb)
    qa = squad.tfds_examples("squad/v2.0", "validation")
    assert len(qa) == 7 and all(isinstance(q.context, str) for q in qa)


# ------------------------------------------------------------------ end to end on tiny configs
def tiny_config(task, vocab_path, **data):
  c = finetune_config.get_config(f"task={task},variant=tiny,lr=1e-3,batch=16,epochs=3,seq=32")
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 2, 64, 4, 128
  c.model.vocab_size = tokenizer.load(vocab_path).vocab_size
  c.model.max_position_embeddings = 64
  c.data.tokenizer = str(vocab_path)
  c.log_every = 10
  for k, v in data.items():
    c.data[k] = v
  return c


@pytest.mark.slow
def test_learnable_local_classification_above_90_percent(tmp_path, vocab):
  helpers.write_sentiment(tmp_path / "train.csv", 480, 0)
  helpers.write_sentiment(tmp_path / "dev.csv", 200, 1)
  c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), eval_file=str(tmp_path / "dev.csv"),
                  text_a_column="sentence", label_column="sentiment", labels=("neg", "pos"))
  out = finetune.finetune(c, str(tmp_path / "w"))
  best = out["report"]["best"]
  assert best["metrics"]["validation"]["accuracy"] > 0.9, out["report"]
  assert (tmp_path / "w" / "report.json").exists() and "best: epoch" in (tmp_path / "w" / "report.txt").read_text()
  pred = predict.predict_text(str(tmp_path / "w"), text="alpha river good city")
  assert pred["label"] == "pos"


def test_packed_finetune_rows_equal_unpacked_examples():
  """Each example's logits in a packed row equal its unpacked logits, and the packed loss equals the unpacked one
  (classification, regression and tagging), with the same parameters."""
  import flax.linen as nn
  import jax

  from bertjax import model as model_lib
  from bertjax.data import packing
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=101, max_position_embeddings=64)
  rng = np.random.default_rng(0)
  n, seq = 11, 24
  lengths = rng.integers(3, seq + 1, n)
  feats = {"input_ids": np.zeros((n, seq), np.int32), "segment_ids": np.zeros((n, seq), np.int32),
           "input_mask": (np.arange(seq)[None] < lengths[:, None]).astype(np.int32),
           "tags": np.zeros((n, seq), np.int32), "tag_weights": np.zeros((n, seq), np.float32)}
  for i, L in enumerate(lengths):
    feats["input_ids"][i, :L] = rng.integers(5, 101, L)
    feats["segment_ids"][i, L // 2:L] = 1
    feats["tags"][i, :L] = rng.integers(0, 5, L)
    feats["tag_weights"][i, 1:L - 1] = rng.random(L - 2) < 0.7
  cases = [("classification", 3, rng.integers(0, 3, n).astype(np.int32)),
           ("regression", 1, rng.random(n).astype(np.float32) * 5), ("tagging", 5, None)]
  for kind, num_labels, labels in cases:
    task = tasks_lib.Task(name="t", kind=kind, labels=tuple(map(str, range(num_labels))))
    base = dict(feats)
    if kind == "tagging":
      base["labels"], base["label_weights"] = base.pop("tags"), base.pop("tag_weights")
      keys = dict(token_keys=("labels", "label_weights"), example_keys=())
    else:
      base = {k: v for k, v in base.items() if not k.startswith("tag")}
      base["labels"], keys = labels, {}
    packed, rows = packing.pack_features(base, 64, 4, **keys)
    assert sorted(j for r in rows for j in r) == list(range(n)) and all(len(r) <= 4 for r in rows)
    assert len(rows) < n  # something was packed
    if kind == "tagging":
      del packed["example_slot_weights"]
    module = tasks_lib.kind(task).head(task, cfg)
    ub = next(batching.batches(base, n))
    pb = next(batching.batches(packed, len(rows)))
    params = nn.meta.unbox(module.init(jax.random.key(0), ub)["params"])
    uo = module.apply({"params": params}, ub)
    po = module.apply({"params": params}, pb)
    for r, members in enumerate(rows):
      t = 0
      for slot, j in enumerate(members):
        L = int(lengths[j])
        if kind == "tagging":
          np.testing.assert_allclose(po["logits"][r, t:t + L], uo["logits"][j, :L], atol=1e-5)
        else:
          np.testing.assert_allclose(po["logits"][r, slot], uo["logits"][j], atol=1e-5)
        t += L
    lu, lp = tasks_lib.kind(task).loss(task, uo, ub), tasks_lib.kind(task).loss(task, po, pb)
    assert abs(float(lu) - float(lp)) < 1e-5, (kind, lu, lp)


def test_learnable_classification_with_packing(tmp_path, vocab, capsys):
  helpers.write_sentiment(tmp_path / "train.csv", 480, 0)
  helpers.write_sentiment(tmp_path / "dev.csv", 200, 1)
  c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), eval_file=str(tmp_path / "dev.csv"),
                  text_a_column="sentence", label_column="sentiment", labels=("neg", "pos"), packing=True,
                  max_seq_length=64)
  c.train.num_epochs = 4  # ~6 examples per row: 4 epochs of packed rows are ~100 steps, like 3 unpacked epochs
  out = finetune.finetune(c, str(tmp_path / "w"))
  log = capsys.readouterr().out
  assert "packing: 480 examples in" in log, log
  assert out["report"]["best"]["metrics"]["validation"]["accuracy"] > 0.9, out["report"]


@pytest.mark.parametrize("packed", [pytest.param(False, marks=pytest.mark.slow), True])
def test_stopped_finetuning_resumes_exactly(tmp_path, vocab, capsys, packed):
  """Stopped mid-epoch and again across an epoch's end, then continued with the same command: the same per-step
  losses, evaluations and best epoch as one uninterrupted run; one example per row and packed rows alike."""
  helpers.write_sentiment(tmp_path / "train.csv", 128, 0)
  helpers.write_sentiment(tmp_path / "dev.csv", 40, 1)

  def config(stop=0):
    c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), eval_file=str(tmp_path / "dev.csv"),
                    text_a_column="sentence", label_column="sentiment", labels=("neg", "pos"), auto_packing=packed)
    c.log_every, c.checkpoint_every, c.train.stop_after_steps = 1, 3, stop
    return c

  whole = finetune.finetune(config(), str(tmp_path / "a"))
  per_epoch, total = whole["plan"].steps_per_epoch, whole["plan"].total_steps
  assert total == 3 * per_epoch and (per_epoch == 8 if not packed else per_epoch > 4)
  assert whole["step"] == total and not whole["preempted"]
  first = per_epoch - 3  # mid-epoch 1, then 7 more: across the end of epoch 1
  parts = [finetune.finetune(config(first), str(tmp_path / "b")), finetune.finetune(config(7), str(tmp_path / "b"))]
  assert [p["step"] for p in parts] == [first, first + 7] and all(p["preempted"] for p in parts)
  assert len(parts[1]["report"]["epochs"]) == 1  # epoch 1 was evaluated once, before the second stop
  rest = finetune.finetune(config(), str(tmp_path / "b"))
  assert "resuming the fine-tuning run" in capsys.readouterr().out and rest["step"] == total

  def train_losses(w):
    rows = [json.loads(x) for x in (tmp_path / w / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}
  a, b = train_losses("a"), train_losses("b")
  assert sorted(a) == sorted(b) == list(range(1, total + 1))
  np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], atol=1e-6)
  ra = json.loads((tmp_path / "a" / "report.json").read_text())
  rb = json.loads((tmp_path / "b" / "report.json").read_text())
  assert ra["epochs"] == rb["epochs"] and ra["best"] == rb["best"]
  # A fine-tuned workdir initialises a further fine-tuning (intermediate-task training): its best encoder.
  c = config()
  c.init, c.data.tokenizer, c.train.learning_rate, c.train.num_epochs = str(tmp_path / "a"), "", 0.0, 1
  out = finetune.finetune(c, str(tmp_path / "c"))
  _, _, _, best, _ = predict.load_finetuned(str(tmp_path / "a"))
  import jax
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(out["state"].params["bert"]), best["bert"])


def test_sharded_finetune_equals_data_parallel(tmp_path, vocab):
  helpers.write_sentiment(tmp_path / "train.csv", 64, 0)
  losses = {}
  for shard in ("dp", "fsdp"):
    c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), text_a_column="sentence",
                    label_column="sentiment", labels=("neg", "pos"), auto_packing=False)
    c.sharding = common.sharding(shard)
    c.train.num_epochs, c.log_every = 1, 1
    finetune.finetune(c, str(tmp_path / shard))
    rows = [json.loads(x) for x in (tmp_path / shard / "metrics.jsonl").read_text().splitlines()]
    losses[shard] = [r["loss"] for r in rows if r["split"] == "train"]
  assert len(losses["dp"]) == 4
  np.testing.assert_allclose(losses["fsdp"], losses["dp"], atol=1e-5)


def test_glue_end_to_end_under_tfds_mocks(tmp_path, vocab):
  tfds = pytest.importorskip("tensorflow_datasets")
  import tensorflow_datasets.text  # noqa: F401
  c = tiny_config("glue/mrpc", vocab)
  c.train.num_epochs = 1
  with tfds.testing.mock_data(num_examples=40):
    out = finetune.finetune(c, str(tmp_path / "w"))
    examples = list(tasks.glue_examples(out["task"], "validation"))
  m = out["report"]["epochs"][0]["validation"]
  # The report's scores are sklearn's on the final (one-epoch) model's own argmax over the validation split.
  sklearn = pytest.importorskip("sklearn.metrics")
  tok = tokenizer.load(str(vocab))
  feats = tasks.encode_pairs(examples, tok, 32)
  batch = {k: np.asarray(feats[k]) for k in ("input_ids", "input_mask", "segment_ids")}
  module = tasks_lib.kind(out["task"]).head(out["task"], out["model_config"])
  pred = np.argmax(np.asarray(module.apply({"params": out["state"].params}, batch)["logits"]), -1)
  gold = np.asarray(feats["labels"])
  assert len(gold) == 40 and set(m) == {"f1", "accuracy"}
  np.testing.assert_allclose([m["accuracy"], m["f1"]],
                             [sklearn.accuracy_score(gold, pred), sklearn.f1_score(gold, pred)], atol=1e-6)


@pytest.mark.slow
def test_squad_json_and_ner_end_to_end(tmp_path, vocab, monkeypatch):
  examples = [planted_example(f"q{i}", seed=i) for i in range(32)]
  data = {"data": [{"title": "t", "paragraphs": [{"context": ex.context, "qas": [
      {"id": ex.qid, "question": ex.question,
       "answers": [{"text": ex.answers[0][0], "answer_start": ex.answers[0][1]}]}]} for ex in examples]}]}
  (tmp_path / "squad.json").write_text(json.dumps(data))
  c = tiny_config("squad_json", vocab, train_file=str(tmp_path / "squad.json"), eval_file=str(tmp_path / "squad.json"),
                  max_seq_length=64, doc_stride=32, max_query_length=16)
  c.train.num_epochs = 1
  out = finetune.finetune(c, str(tmp_path / "qa"))
  assert set(out["report"]["epochs"][0]["validation"]) == {"exact_match", "f1"}
  # `python -m bertjax predict --question` answers as the exported BertForQuestionAnswering does under HF's own
  # tokenizer and run_qa.py's decoding (the best start + end logit over context spans of at most 30 tokens;
  # transformers 5 has no question-answering pipeline).
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from bertjax.cli import convert as convert_cli
  assert convert_cli.write(str(tmp_path / "qa"), str(tmp_path / "qa_hf")) == "BertForQuestionAnswering"
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "qa_hf")
  hf_qa = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa_hf").eval()
  rng = random.Random(5)
  filler = "alpha beta gamma delta river mountain city harbour north south east west".split()
  for _ in range(4):  # contexts that fit one window, so that both sides see the same one
    context = (" ".join(rng.choice(filler) for _ in range(rng.randint(3, 12))) + " the old harbour of Zanzibar Pemba "
               "Island lies " + " ".join(rng.choice(filler) for _ in range(rng.randint(3, 12))) + ".")
    question = "which island has the old harbour"
    printed = _predict_cli(["--workdir", str(tmp_path / "qa"), "--question", question, context])
    enc = hf_tok(question, context, return_offsets_mapping=True)
    assert len(enc["input_ids"]) <= 64
    with torch.no_grad():
      o = hf_qa(input_ids=torch.tensor([enc["input_ids"]]), token_type_ids=torch.tensor([enc["token_type_ids"]]))
    start, end = o.start_logits[0].numpy(), o.end_logits[0].numpy()
    ctx = [i for i, s in enumerate(enc.sequence_ids()) if s == 1]
    i, j = max(((i, j) for i in ctx for j in ctx if i <= j < i + 30), key=lambda p: start[p[0]] + end[p[1]])
    offsets = enc["offset_mapping"]
    assert printed["answer"] == context[offsets[i][0]:offsets[j][1]], (printed, context)
  cut, real_featurize = [], squad.featurize
  monkeypatch.setattr(squad, "featurize", lambda *a, **kw: cut.append(kw) or real_featurize(*a, **kw))
  ans = predict.predict_text(str(tmp_path / "qa"), question=examples[0].question, context=examples[0].context)
  monkeypatch.undo()
  assert isinstance(ans["answer"], str) and ans["answer"] in examples[0].context
  # prediction cuts the windows the run trained on
  assert [(k["doc_stride"], k["max_query_length"], k["stride_is_overlap"]) for k in cut] == [(32, 16, False)]
  c.data.packing = True
  with pytest.raises(tasks.TaskDataError, match="SQuAD windows are already full"):
    finetune.finetune(c, str(tmp_path / "qa_packed"))
  rng = random.Random(0)
  lines = []
  for _ in range(48):
    for w in rng.sample(["John", "Smith", "went", "to", "Paris", "and", "London"], 5):
      tag = {"John": "B-PER", "Smith": "I-PER", "Paris": "B-LOC", "London": "B-LOC"}.get(w, "O")
      lines.append(f"{w} {tag}")
    lines.append("")
  (tmp_path / "ner.txt").write_text("-DOCSTART- O\n\n" + "\n".join(lines))
  c = tiny_config("ner", vocab, train_file=str(tmp_path / "ner.txt"), eval_file=str(tmp_path / "ner.txt"),
                  labels=("O", "B-PER", "I-PER", "B-LOC", "I-LOC"), packing=True)  # tagging trains on packed rows
  c.train.num_epochs = 1
  out = finetune.finetune(c, str(tmp_path / "ner"))
  assert set(out["report"]["epochs"][0]["validation"]) == {"f1", "precision", "recall"}
  tags = predict.predict_text(str(tmp_path / "ner"), text="John went to Paris")["tags"]
  assert [w for w, _ in tags] == ["John", "went", "to", "Paris"]
  # The exported tagger in HF's token-classification pipeline: each word's tag is its first piece's.
  assert convert_cli.write(str(tmp_path / "ner"), str(tmp_path / "ner_hf")) == "BertForTokenClassification"
  pipe = transformers.pipeline("token-classification", model=str(tmp_path / "ner_hf"), ignore_labels=[])
  pieces = pipe("John went to Paris")
  first = [p["entity"] for p in pieces if not p["word"].startswith("##")]
  assert [t for _, t in tags] == first


def test_squad_v2_end_to_end_writes_predictions_the_official_script_scores_as_the_report(tmp_path, vocab):
  """A SQuAD v2.0 file with unanswerable questions: the run writes run_squad's / run_qa's prediction files (answers
  with "" where the null score wins, and the null odds), and the official evaluation script's logic over those
  files gives the report's exact, F1 and best-threshold numbers."""
  from test_references import _official_v2
  examples = [planted_example(f"q{i}", seed=i) for i in range(24)]
  rng = random.Random(1)
  filler = "alpha beta gamma delta river mountain city harbour north south east west".split()
  paragraphs = [{"context": ex.context, "qas": [{"id": ex.qid, "question": ex.question, "answers": [
      {"text": ex.answers[0][0], "answer_start": ex.answers[0][1]}], "is_impossible": False}]} for ex in examples]
  for i in range(12):
    context = " ".join(rng.choice(filler) for _ in range(300)) + "."
    paragraphs.append({"context": context, "qas": [{"id": f"n{i}", "question": "which island has the old harbour",
                                                    "answers": [], "is_impossible": True}]})
  (tmp_path / "v2.json").write_text(json.dumps({"version": "v2.0", "data": [{"title": "t",
                                                                             "paragraphs": paragraphs}]}))
  c = tiny_config("squad_json", vocab, train_file=str(tmp_path / "v2.json"), eval_file=str(tmp_path / "v2.json"),
                  max_seq_length=64, doc_stride=32, max_query_length=16)
  c.train.num_epochs = 1
  out = finetune.finetune(c, str(tmp_path / "qa"))
  got = out["report"]["best"]["metrics"]["validation"]
  assert {"HasAns_exact", "NoAns_exact", "best_f1", "best_f1_thresh"} <= set(got)
  preds = json.loads((tmp_path / "qa" / "validation_predictions.json").read_text())
  odds = json.loads((tmp_path / "qa" / "validation_null_odds.json").read_text())
  golds = {q["id"]: [a["text"] for a in q["answers"]] for p in paragraphs for q in p["qas"]}
  assert set(preds) == set(odds) == set(golds)
  assert all(p == "" for q, p in preds.items() if odds[q] > 0) and all(p for q, p in preds.items() if odds[q] <= 0)
  official = _official_v2(preds, odds, golds)
  for key, value in official.items():
    assert got[key] == pytest.approx(value, abs=1e-9), key


def _predict_cli(argv) -> dict:
  """What `python -m bertjax predict ARGV` prints, parsed."""
  import contextlib
  import io
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert predict_cli.main(argv) in (0, None)
  return json.loads(out.getvalue().strip().splitlines()[-1])


def test_a_sentence_pair_classifier_predicts_as_hf_text_classification_pipeline(tmp_path, vocab):
  """`python -m bertjax predict --pair` on a fine-tuned pair task gives the probabilities HF's text-classification
  pipeline gives for {text, text_pair} on the exported model."""
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  import csv
  rng = random.Random(0)
  words = "alpha beta gamma delta river mountain city island good bad".split()
  with open(tmp_path / "pairs.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["first", "second", "label"])
    for _ in range(64):
      a, b = (" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(2))
      w.writerow([a, b, "same" if ("good" in a) == ("good" in b) else "different"])
  c = tiny_config("local", vocab, train_file=str(tmp_path / "pairs.csv"), eval_file=str(tmp_path / "pairs.csv"),
                  text_a_column="first", text_b_column="second", label_column="label", labels=("same", "different"))
  c.train.num_epochs = 1
  finetune.finetune(c, str(tmp_path / "w"))
  from bertjax.cli import convert as convert_cli
  assert convert_cli.write(str(tmp_path / "w"), str(tmp_path / "hf")) == "BertForSequenceClassification"
  pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), top_k=None)
  for a, b in (("alpha good river", "city bad island"), ("good good", "mountain good"), ("beta", "delta gamma")):
    ours = _predict_cli(["--workdir", str(tmp_path / "w"), "--pair", b, a])
    theirs = {d["label"]: d["score"] for d in pipe({"text": a, "text_pair": b})}
    np.testing.assert_allclose([ours["probabilities"][k] for k in ("same", "different")],
                               [theirs[k] for k in ("same", "different")], atol=1e-4)  # printed to 4 places


@pytest.mark.slow
@pytest.mark.ci
def test_finetune_from_an_hf_folder_through_main(tmp_path, vocab):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import shutil
  n = tokenizer.load(vocab).vocab_size
  torch.manual_seed(0)
  hm = transformers.BertModel(transformers.BertConfig(vocab_size=n, hidden_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=128,
                                                      max_position_embeddings=64))
  hm.save_pretrained(tmp_path / "hf")
  shutil.copy(vocab, tmp_path / "hf" / "vocab.txt")
  helpers.write_sentiment(tmp_path / "train.csv", 64, 0)
  helpers.write_sentiment(tmp_path / "dev.csv", 20, 1)
  cmd = [sys.executable, "-m", "bertjax", "train",
         f"--config={ROOT}/configs/finetune.py:task=local,init={tmp_path / 'hf'},batch=16,epochs=1,seq=32",
         f"--workdir={tmp_path / 'w'}", f"--config.data.train_file={tmp_path / 'train.csv'}",
         f"--config.data.eval_file={tmp_path / 'dev.csv'}", "--config.data.text_a_column=sentence",
         "--config.data.label_column=sentiment", "--config.data.labels=('neg','pos')"]
  env = dict(os.environ, PYTHONPATH=ROOT)
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "best: epoch 1" in out.stdout
  pred = subprocess.run([sys.executable, "-m", "bertjax", "predict", "--workdir", str(tmp_path / "w"), "a good river"],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
  assert pred.returncode == 0
  # Exported, the fine-tuned model and its tokenizer give HF the same probabilities.
  exp = subprocess.run([sys.executable, "-m", "bertjax", "convert", "--workdir", str(tmp_path / "w"), "--out",
                        str(tmp_path / "exported")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
  assert exp.returncode == 0 and "BertForSequenceClassification" in exp.stdout, exp.stderr[-2000:]
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
  hf_clf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
  with torch.no_grad():
    probs = torch.softmax(hf_clf(**hf_tok("a good river", return_tensors="pt")).logits[0], -1).numpy()
  ours = json.loads(pred.stdout.splitlines()[-1])["probabilities"]
  assert hf_clf.config.id2label == {0: "neg", 1: "pos"}
  np.testing.assert_allclose([ours["neg"], ours["pos"]], probs, atol=1e-4)
  assert json.loads(pred.stdout.splitlines()[-1])["label"] == ("neg", "pos")[int(np.argmax(probs))]


def test_init_from_an_hf_folder_takes_the_architecture_from_it_and_the_run_settings_from_the_config(tmp_path,
                                                                                                   vocab):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  n = tokenizer.load(vocab).vocab_size
  transformers.BertModel(transformers.BertConfig(vocab_size=n, hidden_size=64, num_hidden_layers=3,
                                                 num_attention_heads=4, intermediate_size=128,
                                                 max_position_embeddings=64)).save_pretrained(tmp_path / "hf")
  c = finetune_config.get_config(f"task=local,init={tmp_path / 'hf'},seq=32")
  c.data.tokenizer = vocab
  c.model.scan_layers, c.model.scan_unroll, c.model.attention_impl = True, 3, "splash"
  c.model.embedding_lookup, c.model.attention_dropout_rate = "one_hot", 0.0
  _, mcfg, params, _, _ = finetune.load_init(c)
  assert (mcfg.num_layers, mcfg.hidden_size, mcfg.vocab_size) == (3, 64, n)
  assert (mcfg.scan_layers, mcfg.scan_unroll, mcfg.attention_impl, mcfg.embedding_lookup) == (
      True, 3, "splash", "one_hot")
  from safetensors.numpy import load_file
  stored = load_file(str(tmp_path / "hf" / "model.safetensors"))
  np.testing.assert_array_equal(params["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                stored["embeddings.word_embeddings.weight"])
  np.testing.assert_array_equal(params["bert"]["encoder"]["layers"]["layer"]["mlp"]["wo"]["kernel"][2],
                                stored["encoder.layer.2.output.dense.weight"].T)  # scanned: layer 2 of the stack


def test_a_bad_prng_impl_stops_finetuning_before_it_starts(tmp_path, vocab):
  c = finetune_config.get_config("task=local,seq=32")
  c.train.prng_impl = "philox"
  with pytest.raises(ValueError, match="train.prng_impl 'philox' is not one of"):
    finetune._finetune(c, str(tmp_path / "w"), None, 0.0)
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("seed", [-1, 2 ** 32])
def test_a_seed_the_step_cannot_take_stops_finetuning_before_it_starts(tmp_path, seed):
  c = finetune_config.get_config("task=local,seq=32")
  c.seed = seed
  with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*32\)"):
    finetune._finetune(c, str(tmp_path / "w"), None, 0.0)
  assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ bad input
def test_bad_task_files(tmp_path, vocab):
  task = tasks_lib.get("local", ("neg", "pos"))
  (tmp_path / "a.csv").write_text("text,label\nhello,pos\n")
  with pytest.raises(tasks.TaskDataError,
                     match=r"missing column\(s\) \['sentence'\]; the file has \['label', 'text'\]"):
    tasks.local_examples(tmp_path / "a.csv", task, "sentence")
  (tmp_path / "b.tsv").write_text("text\tlabel\nhello\tpos\nbye\tmaybe\n")
  with pytest.raises(tasks.TaskDataError, match=r"b.tsv:3: label 'maybe' is not in the declared set \['neg', 'pos'\]"):
    tasks.local_examples(tmp_path / "b.tsv", task, "text")
  (tmp_path / "c.jsonl").write_text('{"text": "x", "label": "pos"}\n[1, 2]\n')
  with pytest.raises(tasks.TaskDataError, match="c.jsonl:2: not a JSON object"):
    tasks.local_examples(tmp_path / "c.jsonl", task, "text")
  (tmp_path / "ner.txt").write_text("John B-PER\nSmith\n")
  with pytest.raises(tasks.TaskDataError, match=r"ner.txt:2: 'Smith' has no tag"):
    conll.read(tmp_path / "ner.txt")
  # Bytes that are not UTF-8: the file and line named in every format, nothing replaced in silence; a byte-order
  # mark is not part of the first column's name.
  bad = {"d.csv": b"text,label\ncaf\xe9,neg\nhello,pos\n", "d.jsonl": b'{"text": "x"}\n{"text": "\xff"}\n',
         "d.txt": b"John B-PER\nSm\xefth I-PER\n", "d.json": b'{"data": []}\n"\xe9"'}
  readers = {"csv": lambda p: tasks.local_examples(p, task, "text"), "jsonl": lambda p: list(tasks.read_rows(str(p))),
             "txt": conll.read, "json": squad.json_examples}
  for name, body in bad.items():
    (tmp_path / name).write_bytes(body)
    with pytest.raises(tasks.TaskDataError, match=rf"{name}:2: not UTF-8 \("):
      readers[name.split(".")[1]](tmp_path / name)
  (tmp_path / "bom.csv").write_bytes("\ufefftext,label\nhello,pos\n".encode("utf-8"))
  assert [e["text_a"] for e in tasks.local_examples(tmp_path / "bom.csv", task, "text")] == ["hello"]
  tok = tokenizer.load(vocab)
  with pytest.raises(tasks.TaskDataError, match="tag 'B-ORG' is not in the declared labels"):
    conll.featurize([(["x"], ["B-ORG"])], tok, ("O", "B-PER"), 16)
  with pytest.raises(tasks.TaskDataError, match="unknown task 'glue/mrcp'"):
    tasks_lib.get("glue/mrcp")
  with pytest.raises(tasks.TaskDataError, match="needs its label set declared: --config.data.labels"):
    tasks_lib.get("local")


def test_classification_features_follow_run_classifier(vocab):
  tok = tokenizer.load(vocab)
  f = tasks.encode_pairs([{"text_a": "alpha beta gamma delta river", "text_b": "city island", "label": 1}], tok, 8)
  a, b = tok.encode("alpha beta gamma delta river"), tok.encode("city island")
  tasks.truncate_pair(a, b, 5)
  assert f["input_ids"][0].tolist() == [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id]
  assert f["segment_ids"][0].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert len(a) + len(b) == 5 and len(a) >= len(b)  # popped from the end of the longer side


@pytest.mark.slow
def test_sweep_runs_a_grid_and_tabulates_median_and_best(tmp_path, vocab):
  helpers.write_sentiment(tmp_path / "train.csv", 48, 0)
  helpers.write_sentiment(tmp_path / "dev.csv", 16, 1)
  n = tokenizer.load(vocab).vocab_size
  base = "configs/finetune.py:task=local,variant=tiny,batch=16,epochs=1,seq=32,vocab=" + str(n)
  extra = ["--", f"--config.data.train_file={tmp_path / 'train.csv'}",
           f"--config.data.eval_file={tmp_path / 'dev.csv'}",
           "--config.data.text_a_column=sentence", "--config.data.label_column=sentiment",
           "--config.data.labels=('neg','pos')", f"--config.data.tokenizer={vocab}",
           "--config.model.max_position_embeddings=64"]
  root = tmp_path / "sweep"
  env = dict(os.environ, PYTHONPATH=ROOT)
  printed = subprocess.run([sys.executable, "launch/sweep.py", "run", "--config", base, "--grid", "lr=1e-3,3e-4",
                            "--grid", "seed=0,1", "--root", str(root), "--print", *extra],
                           capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
  assert printed.returncode == 0 and len(printed.stdout.strip().splitlines()) == 4
  out = subprocess.run([sys.executable, "launch/sweep.py", "run", "--config", base, "--grid", "lr=1e-3,3e-4",
                        "--grid", "seed=0,1", "--root", str(root), *extra],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = json.loads((root / "sweep.json").read_text())
  assert [r["setting"] for r in rows] == [{"lr": "1e-3"}, {"lr": "3e-4"}]
  for r in rows:
    seeds = list(r["per_seed"].values())
    assert r["runs"] == 2 and r["median"] == pytest.approx(np.median(seeds)) and r["best"] == max(seeds)
  assert (root / "sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_stops_finetuning_with_a_checkpoint(tmp_path, vocab, sig):
  """A preempted fine-tuning run (through the real entry point) saves at the current step, exits 0, and the same
  command resumes from that step."""
  import re
  import signal
  helpers.write_sentiment(tmp_path / "train.csv", 2000, 0)
  n = tokenizer.load(vocab).vocab_size

  def cmd(*extra):
    return [sys.executable, "-m", "bertjax", "train",
            f"--config={ROOT}/configs/finetune.py:task=local,batch=16,epochs=3,seq=32", f"--workdir={tmp_path / 'w'}",
            f"--config.data.tokenizer={vocab}", f"--config.data.train_file={tmp_path / 'train.csv'}",
            "--config.data.text_a_column=sentence", "--config.data.label_column=sentiment",
            "--config.data.labels=('neg','pos')", "--config.model.num_layers=2", "--config.model.hidden_size=64",
            "--config.model.num_heads=4", "--config.model.intermediate_size=128", f"--config.model.vocab_size={n}",
            "--config.model.max_position_embeddings=64", "--config.log_every=1", *extra]

  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.Popen(cmd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
  for line in proc.stdout:
    if line.startswith("epoch 1 step 3/"):
      break
  proc.send_signal(getattr(signal, sig))
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  said = re.search(rf"{sig}: saved a checkpoint at step (\d+)/375", out)
  assert said, out[-2000:]
  step = int(said.group(1))
  assert 3 <= step < 375 and (tmp_path / "w" / "checkpoints" / str(step)).is_dir()
  again = subprocess.run(cmd("--config.train.stop_after_steps=1"), capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"at step {step}/375" in again.stdout and f"step {step + 1}/375" in again.stdout, again.stdout[-2000:]


# ------------------------------------------------------------------ refusals through the real entry point
def finetune_cmd(tmp_path, vocab, workdir, *extra, lr="1e-3"):
  helpers.write_sentiment(tmp_path / "train.csv", 40, 0)
  n = tokenizer.load(vocab).vocab_size
  return [sys.executable, "-m", "bertjax", "train",
          f"--config={ROOT}/configs/finetune.py:task=local,variant=tiny,lr={lr},batch=8,epochs=1,seq=32",
          f"--workdir={workdir}", f"--config.data.train_file={tmp_path / 'train.csv'}",
          "--config.data.text_a_column=sentence", "--config.data.label_column=sentiment",
          "--config.data.labels=('neg','pos')", f"--config.data.tokenizer={vocab}", f"--config.model.vocab_size={n}",
          "--config.model.hidden_size=32", "--config.model.num_heads=2", "--config.model.intermediate_size=64",
          "--config.model.max_position_embeddings=64", "--config.log_every=1", *extra]


@pytest.mark.slow
def test_finetune_refusals_are_one_line_errors(tmp_path, vocab):
  """A locked workdir, a non-finite loss, a bad config value and a tokenizer that does not fit the model each
  give one `error:` line and exit code 2 through python -m bertjax train (as pre-training does)."""
  from bertjax.core import checkpoint as checkpoint_lib
  locked = tmp_path / "locked"
  with checkpoint_lib.WorkdirLock(str(locked)):
    assert_one_line_error(run_cmd(finetune_cmd(tmp_path, vocab, locked)), "locked|in use|another")
  assert_one_line_error(run_cmd(finetune_cmd(tmp_path, vocab, tmp_path / "nan", lr="1e30")), "non-finite loss")
  assert_one_line_error(run_cmd(finetune_cmd(tmp_path, vocab, tmp_path / "sched",
                                             "--config.train.schedule=cosine_typo")), "train.schedule")
  assert_one_line_error(run_cmd(finetune_cmd(tmp_path, vocab, tmp_path / "vocab", "--config.model.vocab_size=7")),
                        "pieces, the model 7")


@pytest.mark.slow
def test_fewer_examples_than_a_batch_train_on_one_partial_batch(tmp_path, vocab):
  """Every example is seen once per epoch: 5 examples and batch 16 make one step per epoch (zero-weight rows
  fill the batch), and an empty training file is refused."""
  helpers.write_sentiment(tmp_path / "train.csv", 5, 0)
  c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), text_a_column="sentence",
                  label_column="sentiment", labels=("neg", "pos"), auto_packing=False)
  out = finetune.finetune(c, str(tmp_path / "w"))
  assert out["plan"].steps_per_epoch == 1 and out["step"] == 3
  plan = batching.Plan(37, 8, 2, 0, 0.1)
  for epoch in plan.epoch_batches():
    assert sorted(np.concatenate(epoch).tolist()) == list(range(37)) and [len(b) for b in epoch] == [8, 8, 8, 8, 5]
  (tmp_path / "empty.csv").write_text("sentence,sentiment\n")
  c.data.train_file = str(tmp_path / "empty.csv")
  with pytest.raises(tasks.TaskDataError, match="no rows"):
    finetune.finetune(c, str(tmp_path / "w2"))


@pytest.mark.slow
def test_bucketed_batches_give_the_same_loss_as_full_length_ones(vocab):
  """A batch cut to its bucket length and the same batch at max_seq_length give the same loss and gradients
  (padding is masked out everywhere), so bucketing changes speed only."""
  import jax

  from bertjax import model as model_lib
  tok = tokenizer.load(vocab)
  rng = random.Random(0)
  words = "alpha beta gamma delta river mountain city island good bad".split()
  ex = [{"text_a": " ".join(rng.choice(words) for _ in range(rng.randint(2, 9))), "text_b": "", "label": i % 2}
        for i in range(8)]
  feats = tasks.encode_pairs(ex, tok, 64)
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                                          dropout_rate=0.0, attention_dropout_rate=0.0)
  module = model_lib.BertForSequenceClassification(cfg, 2)
  task = tasks_lib.Task("local", "classification", labels=("a", "b"))
  full = batching.make_batch(feats, np.arange(8), 8, bucket=0)
  cut = batching.make_batch(feats, np.arange(8), 8, bucket=16)
  assert full["input_ids"].shape[1] == 64 and cut["input_ids"].shape[1] == 16
  params = module.init(jax.random.key(0), full)["params"]
  loss = lambda p, b: tasks_lib.kind(task).loss(task, module.apply({"params": p}, b), b)  # noqa: E731
  grad = jax.jit(jax.value_and_grad(loss))
  (a, ga), (b, gb) = grad(params, full), grad(params, cut)
  assert abs(float(a) - float(b)) < 1e-5
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-6), ga, gb)


def test_length_grouped_plan_sees_every_example_once_in_batches_of_neighbouring_lengths():
  rng = np.random.default_rng(0)
  # Most rows long, a few sparse short buckets (long documents cut at max length): no step per sparse bucket.
  lengths = np.concatenate([rng.integers(3, 129, 200), np.full(300, 128), [20, 40, 60]])
  plan = batching.Plan(503, 16, 3, 7, 0.1, lengths, batching.bucket_multiple(128, 8))
  assert batching.bucket_multiple(128, 8) == 16 and batching.bucket_multiple(384, 8) == 48
  assert batching.bucket_multiple(64, 8) == 16 and batching.bucket_multiple(128, 0) == 0
  assert plan.steps_per_epoch == 32  # ceil(503 / 16), as without grouping
  epochs = plan.epoch_batches()
  for batches in epochs:
    assert len(batches) == plan.steps_per_epoch
    assert sorted(np.concatenate(batches).tolist()) == list(range(503))
    sizes = sorted(len(b) for b in batches)
    assert sizes[0] == 503 % 16 and sizes[1:] == [16] * 31  # only one batch partial
    spans = sorted((int(plan.row_bucket[b].min()), int(plan.row_bucket[b].max())) for b in batches)
    assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:]))  # no bucket interleaves
    assert sum(lo != hi for lo, hi in spans) <= 8  # a batch spans buckets only where one ends
    partial = next(b for b in batches if len(b) < 16)  # the partial batch holds the shortest rows
    assert plan.row_bucket[partial].max() <= min(plan.row_bucket[b].min() for b in batches if len(b) == 16)
  assert [b.tolist() for b in epochs[0]] != [b.tolist() for b in epochs[1]]  # reshuffled every epoch
  again = batching.Plan(503, 16, 3, 7, 0.1, lengths, 16).batches(2)  # a resume recomputes the same batches
  assert [b.tolist() for b in again] == [b.tolist() for b in epochs[1]]


@pytest.mark.slow
def test_runs_of_a_seed_and_learning_rate_sweep_share_their_compiled_programs(tmp_path, vocab):
  """The seed and the peak learning rate are arguments of the train step, not constants of it: a run with another
  seed and learning rate finds every program it runs in the persistent compilation cache the first one filled,
  and still trains differently."""
  cache = tmp_path / "xla"
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  entries, losses = [], []
  for seed, lr in ((0, "1e-3"), (1, "5e-4")):
    w = tmp_path / f"s{seed}"
    cmd = finetune_cmd(tmp_path, vocab, w, lr=lr)
    cmd[4] += f",seed={seed}"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries.append(sorted(os.listdir(cache)))
    losses.append([json.loads(x)["loss"] for x in (w / "metrics.jsonl").read_text().splitlines()
                   if json.loads(x)["split"] == "train"])
  assert any("train_step" in e for e in entries[0]), entries[0]
  assert entries[1] == entries[0]
  assert losses[0] != losses[1]


def test_a_workdir_holding_a_run_of_another_length_is_refused(tmp_path, vocab):
  helpers.write_sentiment(tmp_path / "train.csv", 64, 0)

  def config(epochs, stop):
    c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), text_a_column="sentence",
                    label_column="sentiment", labels=("neg", "pos"), auto_packing=False)
    c.train.num_epochs, c.train.stop_after_steps = epochs, stop
    return c
  assert finetune.finetune(config(1, 1), str(tmp_path / "w"))["preempted"]
  with pytest.raises(tasks.TaskDataError, match="holds a fine-tuning run of 4 steps; this config makes 8"):
    finetune.finetune(config(2, 0), str(tmp_path / "w"))


def test_a_workdir_holding_a_run_on_other_data_is_refused(tmp_path, vocab):
  """A stopped run rerun on another training file of the same size (so of as many steps), or at another seed, is
  refused by name: resuming would carry the old run on and report it as the new one's; its own settings resume."""
  from bertjax import errors
  helpers.write_sentiment(tmp_path / "a.csv", 64, 0)
  helpers.write_sentiment(tmp_path / "b.csv", 64, 1)

  def config(train, seed=0, stop=1):
    c = tiny_config("local", vocab, train_file=str(tmp_path / train), text_a_column="sentence",
                    label_column="sentiment", labels=("neg", "pos"), auto_packing=False)
    c.seed, c.train.stop_after_steps = seed, stop
    return c
  assert finetune.finetune(config("a.csv"), str(tmp_path / "w"))["preempted"]
  with pytest.raises(errors.ConfigError, match=r"holds a fine-tuning run of other settings \(data.train_file "
                                               r"'.*a.csv' there, '.*b.csv' here\)"):
    finetune.finetune(config("b.csv"), str(tmp_path / "w"))
  with pytest.raises(errors.ConfigError, match="seed 0 there, 3 here"):
    finetune.finetune(config("a.csv", seed=3), str(tmp_path / "w"))
  assert not finetune.finetune(config("a.csv", stop=0), str(tmp_path / "w"))["preempted"]


@pytest.mark.slow
def test_the_suite_runs_every_task_once_and_tabulates_the_best_rate(tmp_path, vocab):
  """`launch/suite.py`, run from the caller's own folder with relative paths: two local tasks x two rates x two
  seeds through sweep's commands; per task the rate with the best median over seeds (read back from each run's
  own report here), its median and mean ± sd, the average over tasks; a task whose runs fail is in the table with
  its one-line error and makes the command fail; a second invocation repeats no finished run."""
  for split, n, seed in (("train", 48, 0), ("dev", 16, 1), ("train2", 48, 2), ("dev2", 16, 3)):
    helpers.write_sentiment(tmp_path / f"{split}.csv", n, seed)
  n = tokenizer.load(vocab).vocab_size
  common = ["--config.data.text_a_column=sentence", "--config.data.label_column=sentiment",
            "--config.data.labels=('neg','pos')", f"--config.data.tokenizer={vocab}",
            "--config.model.max_position_embeddings=64"]
  cfg = f"configs/finetune.py:task=local,variant=tiny,batch=16,epochs=1,seq=32,vocab={n}"
  suite = [{"name": name, "config": cfg, "overrides": [f"--config.data.train_file={tr}.csv",
                                                       f"--config.data.eval_file={dv}.csv"]}
           for name, tr, dv in (("first", "train", "dev"), ("second", "train2", "dev2"), ("broken", "none", "dev"))]
  (tmp_path / "suite.json").write_text(json.dumps(suite))
  root = tmp_path / "suite"
  env = dict(os.environ, PYTHONPATH=ROOT)
  cmd = [sys.executable, os.path.join(ROOT, "launch/suite.py"), "run", "--suite", "suite.json", "--lrs",
         "1e-3,1e-5", "--seeds", "0,1", "--root", "suite", "--", *common]
  printed = subprocess.run(cmd[:3] + ["--print"] + cmd[3:], capture_output=True, text=True, cwd=tmp_path, env=env,
                           timeout=120)
  assert printed.returncode == 0 and len(printed.stdout.strip().splitlines()) == 12, printed.stderr[-2000:]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1200)
  assert out.returncode == 1, out.stderr[-3000:]  # the broken task's four runs failed
  summary = json.loads((root / "suite.json").read_text())
  broken = next(r for r in summary["tasks"] if r["task"] == "broken")
  assert broken["runs"] == 0 and broken["failed"] == 4 and "none.csv: file not found" in broken["error"]
  assert "none.csv: file not found" in (root / "suite.md").read_text()
  for row in summary["tasks"]:
    if row["task"] == "broken":
      continue
    got = {}
    for lr in ("1e-3", "1e-5"):
      got[lr] = [json.loads((root / row["task"] / f"lr-{lr}_seed-{s}" / "report.json").read_text())["best"]["value"]
                 for s in (0, 1)]
    best = max(got, key=lambda lr: np.median(got[lr]))
    assert row["lr"] == best and row["seeds"] == 2 and row["runs"] == 4
    assert row["median"] == pytest.approx(np.median(got[best])) and row["mean"] == pytest.approx(np.mean(got[best]))
    assert row["sd"] == pytest.approx(np.std(got[best], ddof=1))
  assert summary["average"] is None  # a task without a result leaves the average incomplete
  assert "| **average** |" in (root / "suite.md").read_text() and (root / "suite.png").read_bytes()[:4] == b"\x89PNG"
  reports = {p: p.stat().st_mtime for p in root.glob("*/*/report.json")}
  again = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
  assert again.returncode == 1 and again.stdout.count("finished before, kept") == 8
  assert {p: p.stat().st_mtime for p in root.glob("*/*/report.json")} == reports


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_accumulated_finetuning_equals_the_whole_batch_step(tmp_path, vocab, packed):
  """train.grad_accum_steps=4 runs each step as four micro-batches whose weighted gradients sum to the whole
  batch's: the losses and the parameters equal a run of whole-batch steps (dropout off) within float tolerance."""
  helpers.write_sentiment(tmp_path / "train.csv", 112, 0)
  out = {}
  for accum in (1, 4):
    c = tiny_config("local", vocab, train_file=str(tmp_path / "train.csv"), text_a_column="sentence",
                    label_column="sentiment", labels=("neg", "pos"), auto_packing=packed)
    c.model.dropout_rate = c.model.attention_dropout_rate = c.model.classifier_dropout = 0.0
    c.train.num_epochs, c.log_every, c.train.grad_accum_steps = 1, 1, accum
    # Unpacked: four micro-batches of one row per fake device. Packed, on one device: 2.8 examples per row make
    # 44 examples 16 rows per step with or without micro-batches (rows per step round to a multiple of them).
    c.train.global_batch_size = 44 if packed else 32
    finetune.finetune(c, str(tmp_path / f"a{accum}"), devices=jax.devices()[:1] if packed else None)
    rows = [json.loads(x) for x in (tmp_path / f"a{accum}" / "metrics.jsonl").read_text().splitlines()]
    _, _, _, params, _ = predict.load_finetuned(str(tmp_path / f"a{accum}"))
    out[accum] = ([r["loss"] for r in rows if r["split"] == "train"], params)
  assert len(out[1][0]) >= 3
  np.testing.assert_allclose(out[4][0], out[1][0], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(out[4][1]), jax.tree_util.tree_leaves(out[1][1]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_accumulation_is_refused_for_losses_across_the_batch():
  from configs import embedding as embedding_config
  c = embedding_config.get_config("variant=tiny")
  c.train.grad_accum_steps = 2
  task = tasks_lib.get(c.task, tuple(c.data.labels), c.data.regression, c)
  with pytest.raises(errors.ConfigError, match="grad_accum_steps 2: this task's loss compares rows"):
    finetune.accum(c, task)
  c.task, c.data.labels = "local", ("a", "b")
  assert finetune.accum(c, tasks_lib.get(c.task, tuple(c.data.labels), c.data.regression, c)) == 2


@pytest.mark.parametrize("accum", [1, 4])
def test_packed_steps_with_micro_batches_carry_the_recipes_batch(accum):
  """Packed rows hold at most global_batch_size / (devices x micro-batches) examples, so a step of whole
  micro-batches (a row per device in each) carries global_batch_size examples on average, not more."""
  n, seq = 400, 64
  lengths = np.random.default_rng(0).integers(3, 9, n)
  train = {"input_ids": np.ones((n, seq), np.int32), "segment_ids": np.zeros((n, seq), np.int32),
           "input_mask": (np.arange(seq)[None] < lengths[:, None]).astype(np.int32),
           "labels": np.zeros(n, np.int32), "example_weights": np.ones(n, np.float32)}
  c = finetune_config.get_config("task=local,variant=tiny,batch=8,seq=64")
  c.train.grad_accum_steps = accum
  task = tasks_lib.Task(name="t", kind="classification", labels=("a", "b"))
  packed, rows_per_step, _ = finetune.pack_train(train, task, c, dp=1)
  per_row = n / batching.num_rows(packed)
  assert rows_per_step % accum == 0
  assert per_row <= 8 // accum
  assert abs(rows_per_step * per_row - 8) <= per_row / 2 + 1e-9
