"""Task files larger than the row buffer (BERTJAX_ROW_BUFFER) in a bucket: streamed once for their offsets, rows
read back by ranged reads; the rows equal what the csv and json modules read from the whole file, the host holds
a fraction of the file, errors name path:line, and a fine-tuning run on such a file resumes exactly."""
from __future__ import annotations

import csv
import json
import random
import tracemalloc

import helpers
import numpy as np
import pytest

from bertjax import errors, finetune
from bertjax import tasks as tasks_lib
from bertjax.core import files
from bertjax.data import tokenizer
from bertjax.data.tasks import rowfile
from bertjax.data.tasks import rows as task_rows
from configs import finetune as finetune_config

BUFFER = 4096


@pytest.fixture
def small_buffer(monkeypatch):
  monkeypatch.setenv(rowfile.ENV, "4K")
  assert rowfile.buffer_size() == BUFFER


def _texts(rng, n):
  words = "alpha beta gamma delta river é 北京 \u2028 , \" ' \t".split(" ")
  out = []
  for i in range(n):
    text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))
    out.append(text + ("\nsecond line\r\nthird" if i % 7 == 0 else ""))  # quoted newlines in a CSV field
  return out


def _write(path, kind, n, seed=0):
  """~100 KB of rows (sentence, label), written by the csv or json module."""
  rng = random.Random(seed)
  rows = [{"sentence": t, "label": rng.choice(["neg", "pos"])} for t in _texts(rng, n)]
  if kind == "csv":
    with open(path, "w", newline="", encoding="utf-8") as f:
      w = csv.DictWriter(f, ["sentence", "label"])
      w.writeheader()
      w.writerows(rows)
  else:
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _reference(path, kind) -> list[dict]:
  with open(path, newline="", encoding="utf-8") as f:
    if kind == "csv":
      return list(csv.DictReader(f))
    return [json.loads(line) for line in f.read().split("\n") if line.strip()]


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_bucket_file_larger_than_the_buffer_streams_the_rows_of_the_whole_file(bucket, tmp_path, small_buffer,
                                                                                  kind):
  """The streamed rows (in order, and by index in a shuffled order) equal the csv/json modules' reading of the
  whole local file, with tracemalloc's peak a small fraction of the file: a reader that loaded the file, or a
  file object reading ahead in megabyte blocks, would hold all of it."""
  local = tmp_path / f"big.{kind}"
  _write(local, kind, 3000)
  size = local.stat().st_size
  assert size > 20 * BUFFER
  remote = f"{bucket}/t/big.{kind}"
  files.copy(str(local), remote)
  want = _reference(local, kind)
  assert len(want) == 3000 and any("\n" in r["sentence"] for r in want)

  f = rowfile.RowFile(remote)
  assert [row for _, row in f.scan()] == want
  order = np.random.default_rng(0).permutation(len(f))
  assert f.rows(order) == [want[i] for i in order]
  assert f.offsets.dtype == np.int64 and len(f.offsets) == len(want) + 1

  fresh = rowfile.RowFile(remote)
  tracemalloc.start()
  try:
    # Each request peaks at a fixed size whatever it fetches (asyncio reads a socket 256 KiB at a time): the
    # reader's own memory is what it holds beyond one 1-byte request's peak.
    files.read_range(remote, 0, 1)
    _, request_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for _ in fresh.scan():  # rows not kept: what the reader itself holds
      pass
    _, scan_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for i in order[:300]:
      fresh.row(i)
    _, read_peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  print(f"file {size} bytes, buffer {BUFFER}: peak {scan_peak} bytes scanning, {read_peak} reading by index, "
        f"{request_peak} in one 1-byte request")
  # What the reader may hold: the buffer's blocks, the offsets (8 bytes a row, grown in steps) and a fixed
  # allowance for the interpreter's own transient objects (a local scan of 100 KB or 400 KB peaks ~26 KB above
  # its offsets); all of it a fraction of the file.
  allowance = BUFFER + 16 * len(want) + (48 << 10)
  assert allowance < size / 3
  assert scan_peak - request_peak < allowance and read_peak - request_peak < allowance, (
      scan_peak, read_peak, request_peak, size)


def test_a_bad_row_deep_in_a_big_remote_file_is_one_line_naming_its_line(bucket, tmp_path, small_buffer):
  task = tasks_lib.get("local", ("neg", "pos"))
  rows = ['{"sentence": "fine %d", "label": "pos"}' % i for i in range(3000)]
  rows[2500] = '{"sentence": "cut off"'
  files.write_whole(f"{bucket}/t/bad.jsonl", "\n".join(rows) + "\n")
  with pytest.raises(errors.TaskDataError) as e:
    task_rows.local_examples(f"{bucket}/t/bad.jsonl", task, "sentence")
  assert str(e.value) == (f"{bucket}/t/bad.jsonl:2501: not a JSON object (Expecting ',' delimiter at column 23)")
  # The same checks as a small local file's: a label outside the declared set, a byte that is not UTF-8.
  text = "sentence,label\n" + "".join(f'"row {i}\nstill row {i}",pos\n' for i in range(2000)) + "late,maybe\n"
  files.write_whole(f"{bucket}/t/bad.csv", text)
  with pytest.raises(errors.TaskDataError, match=r"^gs://.*/t/bad.csv:4002: label 'maybe' is not in the declared "
                                                 r"set \['neg', 'pos'\]$"):
    task_rows.pair_features(f"{bucket}/t/bad.csv", task, ("sentence", "", "label"), None, 32)
  files.write_whole(f"{bucket}/t/latin.csv", text.encode().replace(b"late", b"l\xe4te"))
  with pytest.raises(errors.TaskDataError, match=r"/t/latin.csv:4002: not UTF-8 \(invalid continuation byte at "
                                                 rf"byte {len(text.encode()) - 10}\); save the file as UTF-8$"):
    list(task_rows.read_rows(f"{bucket}/t/latin.csv"))


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  d = tmp_path_factory.mktemp("tok")
  rng = random.Random(0)
  words = "alpha beta gamma delta river mountain city island good bad fine poor nice awful".split()
  (d / "t.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)))
  return tokenizer.train([d / "t.txt"], d / "tok", vocab_size=120)


def test_a_streamed_file_gives_every_step_the_batch_of_the_file_read_whole(bucket, tmp_path, vocab, small_buffer):
  """The batch of step s is a function of (seed, s) over row indices: a fresh reader (a resumed process) gives the
  steps from s on exactly the batches of the whole file's features, length grouping included."""
  from bertjax.data.tasks.batching import Plan, make_batch, row_lengths
  helpers.write_sentiment(tmp_path / "train.csv", 150, 0)
  remote = f"{bucket}/t/train.csv"
  files.copy(str(tmp_path / "train.csv"), remote)
  task, tok = tasks_lib.get("local", ("neg", "pos")), tokenizer.load(vocab)
  columns = ("sentence", "", "sentiment")
  whole = task_rows.encode_pairs(task_rows.local_examples(str(tmp_path / "train.csv"), task, *columns), tok, 32)
  assert files.size(remote) > BUFFER
  streamed = task_rows.pair_features(remote, task, columns, tok, 32)
  assert isinstance(streamed, task_rows.StreamedPairs) and len(streamed) == 150
  np.testing.assert_array_equal(row_lengths(streamed), row_lengths(whole))
  c = finetune_config.get_config("task=local")
  c.data.packing = True
  with pytest.raises(errors.TaskDataError, match=r"^data.packing lays every example out in memory; gs://.*/train.csv "
                                                 r"is larger than the row buffer \(BERTJAX_ROW_BUFFER=4096 bytes\)"):
    finetune.use_packing(c, task, streamed)
  c.data.packing, c.data.auto_packing = False, True
  assert finetune.use_packing(c, task, whole) and not finetune.use_packing(c, task, streamed)
  steps = [idx for epoch in Plan(150, 16, 2, 7, 0.1, row_lengths(whole), 16).epoch_batches() for idx in epoch]
  resumed = task_rows.pair_features(remote, task, columns, tok, 32)  # a new process: its offsets scanned again
  again = [idx for epoch in Plan(150, 16, 2, 7, 0.1, row_lengths(resumed), 16).epoch_batches() for idx in epoch]
  assert len(steps) == len(again) == 20
  for s in (0, 5, 9, 10, 19):  # mid-epoch, an epoch's partial last batch, the next epoch's first, the last
    np.testing.assert_array_equal(again[s], steps[s])
    a, b = make_batch(resumed, steps[s], 16, 16), make_batch(whole, steps[s], 16, 16)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), s


def _tiny_run(task, vocab, train_file, stop):
  """A one-layer model's run of 2 epochs of 16-row batches on `train_file`, a checkpoint every 2 steps, stopped
  after `stop` steps (0: not)."""
  c = finetune_config.get_config(f"task={task},variant=tiny,lr=1e-3,batch=16,epochs=2,seq=32")
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 1, 32, 2, 64
  c.model.vocab_size, c.model.max_position_embeddings = tokenizer.load(vocab).vocab_size, 32
  c.data.tokenizer, c.data.train_file, c.data.auto_packing = str(vocab), train_file, False
  c.log_every, c.checkpoint_every, c.train.stop_after_steps = 1, 2, stop
  return c


def _losses(workdir) -> dict:
  return {r["step"]: r["loss"] for r in finetune.read_train_metrics(str(workdir))}


def _three_runs(config, root, buffer: int, stop: int, streamed, monkeypatch):
  """Runs of `config(stop)` (12 steps) on a file streamed through a row buffer of `buffer` bytes: `a` whole, `b`
  stopped after `stop` steps and continued; and `c` with the file read whole, whose per-step losses must be a's.
  Returns (a's result, b's result, a's losses, b's losses) by step."""
  monkeypatch.setenv(rowfile.ENV, str(buffer))
  whole = finetune.finetune(config(), str(root / "a"))
  assert isinstance(whole["train_features"], streamed)
  total = whole["plan"].total_steps
  assert total == 12 and whole["step"] == total
  assert finetune.finetune(config(stop), str(root / "b"))["preempted"]  # mid-epoch 1 (6 steps an epoch)
  rest = finetune.finetune(config(), str(root / "b"))
  assert rest["step"] == total and not rest["preempted"]
  monkeypatch.setenv(rowfile.ENV, str(1 << 30))
  in_memory = finetune.finetune(config(), str(root / "c"))
  assert isinstance(in_memory["train_features"], dict)
  a, b, c = _losses(root / "a"), _losses(root / "b"), _losses(root / "c")
  assert sorted(a) == sorted(b) == sorted(c) == list(range(1, total + 1))
  np.testing.assert_allclose([c[s] for s in a], [a[s] for s in a], atol=1e-6)
  return whole, rest, a, b


@pytest.mark.slow
def test_finetuning_on_a_streamed_bucket_file_resumes_exactly(bucket, tmp_path, vocab, monkeypatch):
  """A run on a bucket file 2x the row buffer, stopped mid-epoch and continued, has the per-step losses of the
  uninterrupted run, and both have those of the same file read whole: the same rows in the same order."""
  helpers.write_sentiment(tmp_path / "train.csv", 96, 0)
  remote = f"{bucket}/t/train.csv"
  files.copy(str(tmp_path / "train.csv"), remote)
  size = files.size(remote)

  def config(stop=0):
    c = _tiny_run("local", vocab, remote, stop)
    c.data.labels, c.data.text_a_column, c.data.label_column = ("neg", "pos"), "sentence", "sentiment"
    return c

  _, _, a, b = _three_runs(config, tmp_path, size // 2, 4, task_rows.StreamedPairs, monkeypatch)
  np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], atol=1e-6)


# ------------------------------------------------------------------------------ embedding training files
NEGATIVES = ("negative_1", "negative_2", "negative_3")


def _write_tuples(path, n, negatives=(), seed=0, score=False):
  """(anchor, positive[, negatives...][, score]) rows as `mine` writes n-tuples, by the csv or json module."""
  rng = random.Random(seed)
  texts = _texts(rng, n * (2 + len(negatives)))
  rows = []
  for i in range(n):
    r = {"anchor": texts[i], "positive": texts[n + i % (n // 2)]}  # half the positives shared by two rows
    r.update({c: texts[(2 + j) * n + i] for j, c in enumerate(negatives)})
    if score:
      r["score"] = str(round(rng.random(), 3))
    rows.append(r)
  if str(path).endswith(".jsonl"):
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  else:
    with open(path, "w", newline="", encoding="utf-8") as f:
      w = csv.DictWriter(f, list(rows[0]), delimiter="\t" if str(path).endswith(".tsv") else ",")
      w.writeheader()
      w.writerows(rows)


def _plain_pairs(path, negatives=()):
  """The rows as the embedding tasks take them, read with the csv / json modules from the whole local file."""
  kind = "jsonl" if str(path).endswith(".jsonl") else "csv"
  if str(path).endswith(".tsv"):
    with open(path, newline="", encoding="utf-8") as f:
      rows = list(csv.DictReader(f, delimiter="\t"))
  else:
    rows = _reference(path, kind)
  return [{"anchor": r["anchor"], "docs": [r["positive"], *(r[c] for c in negatives)], "score": 0.0} for r in rows]


def _score_folder(out, train_local, remote, n, docs, block=64, seed=3):
  """A teacher score folder of the bucket file, as `teacher.write_scores` lays it out, with random scores; returns
  them [n, docs]."""
  import hashlib

  from bertjax.embeddings import teacher
  want = np.random.default_rng(seed).normal(size=(n, docs)).astype(np.float32)
  record = {"command": "teacher", "teacher": "t", "pairs": remote, "columns": ["anchor", "positive", *NEGATIVES],
            "fingerprint": hashlib.sha256(open(train_local, "rb").read()).hexdigest(), "rows": n, "block": block,
            "kind": "cross-encoder"}
  teacher.write_scores(out, record, lambda start, stop: want[start:stop])
  return want


@pytest.mark.parametrize("name,negatives", [("pairs.csv", ()), ("mined.jsonl", NEGATIVES), ("triplets.tsv",
                                                                                               NEGATIVES[:1])])
def test_an_embedding_training_file_larger_than_the_buffer_streams_from_a_bucket(bucket, tmp_path, vocab,
                                                                                 small_buffer, name, negatives):
  """Pairs, triplets and mined n-tuples (with a teacher's scores) in a bucket, 20x the row buffer: the scan holds a
  fraction of the file, and the batch of every step - for a fresh reader too (a resumed process) - equals the
  features of the rows the csv / json modules read from the whole file, with the teacher's scores of those rows."""
  from bertjax.data.tasks.batching import Plan, make_batch
  from bertjax.embeddings import distill
  from bertjax.embeddings.dense import task as dense_task
  local = tmp_path / name
  _write_tuples(local, 1500, negatives)
  size = local.stat().st_size
  assert size > 20 * BUFFER
  remote = f"{bucket}/t/{name}"
  files.copy(str(local), remote)
  want = _plain_pairs(local, negatives)
  assert len(want) == 1500 and any("\n" in r["anchor"] for r in want)
  tok = tokenizer.load(vocab)

  def featurize(rows):
    return dense_task.featurize(rows, tok, 32)

  def open_file():
    return dense_task.train_pairs(remote, "anchor", "positive", negatives, "", featurize)

  tracemalloc.start()
  try:
    files.read_range(remote, 0, 1)
    _, request_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    feats, survey = open_file()
    _, scan_peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  print(f"{name}: file {size} bytes, buffer {BUFFER}: peak {scan_peak - request_peak} bytes above one request's "
        "in the checking pass")
  assert scan_peak - request_peak < BUFFER + 16 * len(want) + (48 << 10) < size / 3
  assert isinstance(feats, task_rows.Streamed) and len(feats) == 1500
  assert survey.rows == 1500 and survey.distinct_positives == len({r["docs"][0] for r in want}) == 750

  whole = featurize(want)
  if negatives == NEGATIVES:  # mined n-tuples distilled from a teacher's scores of them
    scores = _score_folder(f"{bucket}/scores", local, remote, 1500, 4)
    data = type("Data", (), {"teacher_scores": f"{bucket}/scores", "train_file": remote})
    feats = distill.attach(feats, "margin_mse", "embedding", data)
    whole["teacher_scores"] = scores
  plan = Plan(1500, 64, 2, 5, 0.1)
  steps = [idx for epoch in plan.epoch_batches() for idx in epoch]
  resumed = open_file()[0]
  if negatives == NEGATIVES:
    resumed = distill.attach(resumed, "margin_mse", "embedding", data)
  for s in (0, 11, 23, 24, 47):  # mid-epoch, an epoch's partial last batch, the next epoch's first, the last
    for reader in (feats, resumed):
      a, b = make_batch(reader, steps[s], 64), make_batch(whole, steps[s], 64)
      assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), (s, [k for k in a if not
                                                                                        np.array_equal(a[k], b[k])])
  if negatives == NEGATIVES:
    cache = feats.extra["teacher_scores"]._cache
    assert sum(v.nbytes for v in cache.values()) <= BUFFER and len(cache) >= 1


def test_a_streamed_multivector_file_pads_every_batch_to_one_shape(bucket, tmp_path, vocab, small_buffer):
  """task=multivector on n-tuples 20x the buffer: each streamed batch has the side lengths' shape (one compiled
  program), and holds the whole file's features of its rows (read with the json module), padded."""
  from bertjax.data.tasks.batching import Plan
  from bertjax.embeddings.dense import task as dense_task
  from bertjax.embeddings.multivector import encoder as multivector
  from bertjax.embeddings.multivector import task as multivector_task
  local = tmp_path / "mined.jsonl"
  _write_tuples(local, 800, NEGATIVES[:2], seed=2)
  assert local.stat().st_size > 20 * BUFFER
  files.copy(str(local), f"{bucket}/t/mined.jsonl")
  tok, s = tokenizer.load(vocab), multivector.Settings(max_seq_length=32, query_length=12, document_length=24)
  feats, _ = dense_task.train_pairs(f"{bucket}/t/mined.jsonl", "anchor", "positive", NEGATIVES[:2], "",
                                    lambda rows: multivector_task.featurize(rows, tok, s),
                                    lambda rows: multivector_task.featurize(rows, tok, s, full=True))
  assert isinstance(feats, task_rows.Streamed)
  whole = multivector_task.featurize(_plain_pairs(local, NEGATIVES[:2]), tok, s)
  for idx in Plan(800, 32, 1, 4, 0.0).batches(1)[:3]:
    got = feats.take(idx)
    assert got["input_ids"].shape == (32, 12) and got["doc_input_ids"].shape == (32, 3, 24)
    for k, want in whole.items():
      want = want[idx]
      pad = [(0, 0)] + [(0, g - w) for g, w in zip(got[k].shape[1:], want.shape[1:])]
      np.testing.assert_array_equal(got[k], np.pad(want, pad, constant_values=tok.pad_id if "ids" in k else 0), k)


def test_bad_rows_deep_in_big_embedding_files_are_one_line_naming_their_line(bucket, tmp_path, small_buffer):
  """The checks of a whole read, at the row where the streamed pass meets them: an empty text, a score that is not
  a number, a rerank label outside [0, 1], a missing column, another file's teacher scores."""
  import ml_collections

  from bertjax.embeddings import distill
  from bertjax.embeddings.dense import task as dense_task
  from bertjax.embeddings.rerank import task as rerank_task
  ident = lambda rows: {"doc_input_ids": np.zeros((len(rows), len(rows[0]["docs"]), 1))}  # noqa: E731
  rows = [{"q": f"query {i} " * 5, "d": f"document {i} " * 5, "s": "0.5"} for i in range(1200)]
  rows[1100]["d"] = " "
  files.write_whole(f"{bucket}/t/empty.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(errors.TaskDataError, match=r"^gs://.*/t/empty.jsonl:1101: empty text in column\(s\) \['d'\]; "):
    dense_task.train_pairs(f"{bucket}/t/empty.jsonl", "q", "d", (), "", ident)
  rows[1100]["d"], rows[1150]["s"] = "fine", "high"
  files.write_whole(f"{bucket}/t/score.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(errors.TaskDataError, match=r"/t/score.jsonl:1151: score 'high' is not a number$"):
    dense_task.train_pairs(f"{bucket}/t/score.jsonl", "q", "d", (), "s", ident)
  with pytest.raises(errors.TaskDataError, match=r"/t/score.jsonl: missing column\(s\) \['n'\]; the file has "
                                                 r"\['d', 'q', 's'\]$"):
    dense_task.train_pairs(f"{bucket}/t/score.jsonl", "q", "d", ("n",), "", ident)
  rows[1150]["s"] = "1.5"
  files.write_whole(f"{bucket}/t/rerank.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
  c = ml_collections.ConfigDict({"data": {"text_a_column": "q", "text_b_column": "d", "label_column": "s"}})
  with pytest.raises(errors.TaskDataError, match=r"/t/rerank.jsonl: row 1151 has label 1.5; task rerank takes "
                                                 r"relevance in \[0, 1\]"):
    rerank_task.train_features(f"{bucket}/t/rerank.jsonl", c, None, 32)
  rows[1150]["s"] = "0.5"
  files.write_whole(f"{bucket}/t/fine.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
  feats, _ = dense_task.train_pairs(f"{bucket}/t/fine.jsonl", "q", "d", ("q",), "", ident)
  data = type("Data", (), {"teacher_scores": f"{bucket}/scores", "train_file": f"{bucket}/t/fine.jsonl"})
  (tmp_path / "x").write_text("another file")
  _score_folder(f"{bucket}/scores", tmp_path / "x", f"{bucket}/t/x", 1200, 2)
  with pytest.raises(errors.TaskDataError, match=r"data.teacher_scores gs://.*/scores: scores of another training "
                                                 r"file \(gs://.*/t/x, fingerprint "):
    distill.attach(feats, "margin_mse", "embedding", data)


def test_a_streamed_rerank_file_gives_the_batches_of_the_file_read_whole(bucket, tmp_path, vocab, small_buffer):
  """Pointwise (query, document, label) rows in a bucket, 10x the buffer: a fresh reader's batches equal the
  features of the rows the csv module reads from the whole file."""
  import ml_collections

  from bertjax.data.tasks.batching import Plan, make_batch
  from bertjax.embeddings.rerank import task as rerank_task
  rng = random.Random(1)
  texts = _texts(rng, 1000)
  with open(tmp_path / "r.csv", "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["query", "doc", "label"])
    w.writerows([texts[i % 100], texts[i], rng.choice(["0", "1", "0.25"])] for i in range(500))
  assert (tmp_path / "r.csv").stat().st_size > 10 * BUFFER
  files.copy(str(tmp_path / "r.csv"), f"{bucket}/t/r.csv")
  with open(tmp_path / "r.csv", newline="", encoding="utf-8") as f:
    want = [{"text_a": r["query"], "text_b": r["doc"], "label": float(r["label"])} for r in csv.DictReader(f)]
  c = ml_collections.ConfigDict({"data": {"text_a_column": "query", "text_b_column": "doc", "label_column": "label"}})
  tok = tokenizer.load(vocab)
  feats, labels = rerank_task.train_features(f"{bucket}/t/r.csv", c, tok, 32)
  assert isinstance(feats, task_rows.Streamed) and len(feats) == 500 and len(labels) == 2
  whole = rerank_task.featurize(want, tok, 32)
  for idx in Plan(500, 32, 1, 2, 0.0).batches(1)[:4]:
    a, b = make_batch(feats, idx, 32), make_batch(whole, idx, 32)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_distillation_on_a_streamed_bucket_file_of_mined_tuples_resumes_bitwise(bucket, tmp_path, vocab, monkeypatch):
  """task=pairs with margin_mse on a bucket file of n-tuples 3x the row buffer and its teacher's scores: a run
  stopped mid-epoch and continued ends with the parameters of the uninterrupted run, bit for bit, and both have
  the per-step losses of the same file read whole."""
  import jax
  local = tmp_path / "mined.jsonl"
  _write_tuples(local, 96, NEGATIVES, seed=4)
  remote = f"{bucket}/t/mined.jsonl"
  files.copy(str(local), remote)
  _score_folder(f"{bucket}/scores", local, remote, 96, 4, block=16)
  size = files.size(remote)

  def config(stop=0):
    c = _tiny_run("pairs", vocab, remote, stop)
    c.data.teacher_scores, c.data.text_a_column, c.data.text_b_column = f"{bucket}/scores", "anchor", "positive"
    c.embedding.negative_columns, c.embedding.loss = NEGATIVES, "margin_mse"
    return c

  whole, rest, a, b = _three_runs(config, tmp_path, size // 3, 5, task_rows.Streamed, monkeypatch)
  for x, y in zip(jax.tree_util.tree_leaves(whole["state"].params), jax.tree_util.tree_leaves(rest["state"].params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  np.testing.assert_array_equal([b[s] for s in a], [a[s] for s in a])
