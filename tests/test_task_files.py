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


@pytest.mark.slow
def test_finetuning_on_a_streamed_bucket_file_resumes_exactly(bucket, tmp_path, vocab, monkeypatch):
  """A run on a bucket file 2x the row buffer, stopped mid-epoch and continued, has the per-step losses of the
  uninterrupted run, and both have those of the same file read whole: the same rows in the same order."""
  helpers.write_sentiment(tmp_path / "train.csv", 96, 0)
  remote = f"{bucket}/t/train.csv"
  files.copy(str(tmp_path / "train.csv"), remote)
  size = files.size(remote)

  def config(stop=0):
    c = finetune_config.get_config("task=local,variant=tiny,lr=1e-3,batch=16,epochs=2,seq=32")
    c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 1, 32, 2, 64
    c.model.vocab_size, c.model.max_position_embeddings = tokenizer.load(vocab).vocab_size, 32
    c.data.tokenizer, c.data.train_file, c.data.labels = str(vocab), remote, ("neg", "pos")
    c.data.text_a_column, c.data.label_column, c.data.auto_packing = "sentence", "sentiment", False
    c.log_every, c.checkpoint_every, c.train.stop_after_steps = 1, 2, stop
    return c

  def losses(workdir):
    return {r["step"]: r["loss"] for r in finetune.read_train_metrics(str(tmp_path / workdir))}

  monkeypatch.setenv(rowfile.ENV, str(size // 2))
  whole = finetune.finetune(config(), str(tmp_path / "a"))
  assert isinstance(whole["train_features"], task_rows.StreamedPairs)
  total = whole["plan"].total_steps
  assert total == 12 and whole["step"] == total
  assert finetune.finetune(config(4), str(tmp_path / "b"))["preempted"]  # mid-epoch 1 (6 steps an epoch)
  rest = finetune.finetune(config(), str(tmp_path / "b"))
  assert rest["step"] == total and not rest["preempted"]
  monkeypatch.setenv(rowfile.ENV, str(2 * size))
  in_memory = finetune.finetune(config(), str(tmp_path / "c"))
  assert isinstance(in_memory["train_features"], dict)
  a, b, c = losses("a"), losses("b"), losses("c")
  assert sorted(a) == sorted(b) == list(range(1, total + 1))
  np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], atol=1e-6)
  np.testing.assert_allclose([c[s] for s in a], [a[s] for s in a], atol=1e-6)
