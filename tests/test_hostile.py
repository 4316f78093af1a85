"""Every command-line tool on a table of bad input (tests/hostile.py), and a fuzz of the readers and parsers that
user input reaches first: each ends in one `error:` line (or succeeds), never a traceback or a hang."""
import argparse
import gzip
import json
import os
import subprocess
import sys

import helpers
import hostile
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertjax import errors
from bertjax import tasks as tasks_lib
from bertjax.cli import common as cli_common
from bertjax.cli import dataset as dataset_cli
from bertjax.data.pretraining import corpus
from bertjax.data.tasks import conll
from bertjax.data.tasks import rows as tasks
from configs import common


def test_every_cli_refuses_bad_input_in_one_line(tmp_path):
  """The whole table (every command of python -m bertjax and launch/suite.py, launch/sweep.py), one process per
  group side by side."""
  procs = {}
  for group in hostile.GROUPS:
    out = tmp_path / f"{group}.json"
    procs[group] = (out, subprocess.Popen([sys.executable, "tests/hostile.py", "--group", group, "--json", str(out)],
                                          cwd=helpers.ROOT, env=helpers.env(), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
  results = {}
  for out, proc in procs.values():
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    results.update(json.loads(out.read_text()))
  assert len(results) == len(hostile.CASES) >= 150
  from bertjax.cli import COMMANDS
  assert {case[1] for case in hostile.CASES} == set(COMMANDS) | set(hostile.LAUNCH)
  problems = {k: r["problem"] for k, r in results.items() if r["problem"]}
  assert not problems, json.dumps(problems, indent=1)[:6000]


def _options(tool: str) -> set[str]:
  """Every option a tool takes: its argparse parser's, or the absl flags its module defines (read from its
  source: absl refuses a flag defined twice in one process, and aot, parity and train share names)."""
  import ast
  import importlib
  if tool in ("train", "aot", "parity"):
    tree = ast.parse(open(os.path.join(helpers.ROOT, "bertjax", "cli", f"{tool}.py"), encoding="utf-8").read())
    return {f"--{node.args[0].value}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "").startswith("DEFINE_") and node.args
            and isinstance(node.args[0], ast.Constant)}
  if tool in hostile.LAUNCH:
    parser = hostile._tool(tool).__globals__["build_parser"]()
  else:
    parser = importlib.import_module(f"bertjax.cli.{tool}").parser()
  actions = [a for p in [parser, *(sp for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                                   for sp in a.choices.values())] for a in p._actions]
  return {o for a in actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def test_the_table_gives_every_option_of_every_tool_a_case():
  """Each option of each command (argparse's, absl's) has a bad-input case of its tool that exercises it: the
  option is on the case's command line and the expected error (or the case's description) names it, so an option
  that merely rides along with another case's error does not count."""
  missing = []
  for tool in sorted({case[1] for case in hostile.CASES}):
    for option in sorted(_options(tool)):
      name = option[2:].lower()
      if not any(option in {a.split("=", 1)[0] for a in argv}
                 and any(k in f"{pattern} {what}".lower() for k in (name, name.replace("_", " ")))
                 for _, t, argv, pattern, what in hostile.CASES if t == tool):
        missing.append(f"{tool} {option}")
  assert not missing, f"options without a bad-input case of their own: {missing}"


def test_robustness_doc_shows_the_table():
  with open(os.path.join(helpers.ROOT, "docs", "robustness.md"), encoding="utf-8") as f:
    doc = f.read()
  assert hostile.markdown() in doc, "docs/robustness.md: paste the output of python tests/hostile.py --markdown"


# ------------------------------------------------------------------ fuzz
FUZZ = settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.one_of(st.binary(max_size=400), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")))


def _one_line_or_success(fn):
  try:
    fn()
  except errors.USER_ERRORS as e:
    message = errors.one_line(e)
    assert message and "\n" not in message and "Traceback" not in message


@FUZZ
@given(raw=TEXT, suffix=st.sampled_from([".txt", ".jsonl", ".txt.gz", ".parquet"]), skip=st.booleans())
def test_corpus_readers_on_random_bytes(tmp_path, raw, suffix, skip):
  path = tmp_path / f"shard{suffix}"
  path.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
  opts = corpus.ReadOptions(skip_bad_records=skip, splitter="regex")
  _one_line_or_success(lambda: sum(1 for _ in corpus.read_documents([str(path)], opts=opts)))


@FUZZ
@given(raw=TEXT, suffix=st.sampled_from([".csv", ".tsv", ".jsonl"]), regression=st.booleans())
def test_task_file_readers_on_random_bytes(tmp_path, raw, suffix, regression):
  path = tmp_path / f"task{suffix}"
  header = b"sentence,label\n" if suffix == ".csv" else b"sentence\tlabel\n" if suffix == ".tsv" else b""
  path.write_bytes(header + raw)
  task = tasks_lib.get("local", ("neg", "pos"), regression)
  _one_line_or_success(lambda: tasks.local_examples(str(path), task, "sentence", "", "label"))


JSON_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                      st.lists(st.integers(), max_size=2))
RECORD = st.fixed_dictionaries({}, optional={"_id": JSON_VALUE, "text": JSON_VALUE, "title": JSON_VALUE})


@FUZZ
@given(corpus=st.one_of(TEXT, st.lists(RECORD, max_size=4).map(
           lambda rs: "".join(json.dumps(r) + "\n" for r in rs).encode())),
       queries=st.one_of(TEXT, st.lists(RECORD, max_size=4).map(
           lambda rs: "".join(json.dumps(r) + "\n" for r in rs).encode())),
       qrels=st.one_of(TEXT, st.just(b"query-id\tcorpus-id\tscore\n1\ta\t1\n")))
def test_beir_folder_reader_on_random_records_and_bytes(tmp_path, corpus, queries, qrels):
  """A BEIR folder of random bytes or random JSON records (ids and texts of every JSON type) reads or ends in one
  line: the embeddings command's input before any model loads."""
  from bertjax.embeddings import retrieval
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True, exist_ok=True)
  (d / "corpus.jsonl").write_bytes(corpus)
  (d / "queries.jsonl").write_bytes(queries)
  (d / "qrels" / "test.tsv").write_bytes(qrels)
  _one_line_or_success(lambda: retrieval.read_beir(str(d)))


@FUZZ
@given(raw=st.one_of(TEXT, st.lists(RECORD, max_size=4).map(
           lambda rs: "".join(json.dumps(r) + "\n" for r in rs).encode())),
       suffix=st.sampled_from([".jsonl", ".txt", ".jsonl.gz", ".parquet"]))
def test_corpus_to_embed_reader_on_random_records_and_bytes(tmp_path, raw, suffix):
  from bertjax.embeddings import retrieval
  path = tmp_path / f"corpus{suffix}"
  path.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
  _one_line_or_success(lambda: retrieval.read_corpus([str(path)]))


@FUZZ
@given(raw=TEXT)
def test_conll_reader_on_random_bytes(tmp_path, raw):
  path = tmp_path / "ner.txt"
  path.write_bytes(raw)
  _one_line_or_success(lambda: conll.read(str(path)))


@FUZZ
@given(arg=st.text(alphabet=st.sampled_from(list("abcdefgqstv=,.:0123456789-_ ()'\"")), max_size=60))
def test_config_argument_parser_on_random_strings(arg):
  def parse():
    try:
      common.parse_arg(arg, variant="base", seq=128, batch=256, nsp=True, mask=0.15)
    except ValueError as e:  # what the config file raises; python -m bertjax train reports it in one line
      raise errors.ConfigError(str(e)) from None
  _one_line_or_success(parse)


@pytest.mark.parametrize("override", ["train.learning_rate=", "train=1", "a.b.c=1", "=", "model.dtype=bfloat16,x",
                                      "train.num_steps=1e3", "train.use_nsp=2"])
def test_config_overrides_fail_in_one_line(override):
  """Each override is a mistake that stops the run before anything is built, in one line: parsing it or the
  config's checks must refuse it (accepting one in silence fails the test)."""
  from bertjax import pretrain
  from configs import pretrain as pretrain_config
  c = pretrain_config.get_config("variant=tiny")
  with pytest.raises(errors.ConfigError) as refused:
    _as_config_error(lambda: common.override(c, [override]))
    pretrain.validate(c, 8)
  message = errors.one_line(refused.value)
  assert message and "\n" not in message


def _as_config_error(fn):
  try:
    fn()
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None


def test_a_dataset_that_cannot_be_downloaded_is_one_line_in_seconds(tmp_path, monkeypatch):
  """Offline, an unprepared tfds task fails at once with how to prepare it (tfds alone retries for minutes)."""
  import requests
  from tensorflow_datasets.core.download import downloader

  def offline(url, **kwargs):
    raise requests.exceptions.ConnectionError(f"Failed to establish a new connection: {url}")
  monkeypatch.setattr(downloader, "_open_url", offline)
  monkeypatch.setattr(downloader, "MAX_RETRIES", 10)
  with pytest.raises(tasks.TaskDataError, match=r"glue/mrpc: not prepared in .* and its download failed .*"
                                                r"download_and_prepare"):
    tasks.glue_examples(tasks_lib.get("glue/mrpc"), "train", str(tmp_path))
  assert downloader.MAX_RETRIES == tasks.DOWNLOAD_RETRIES


def test_dataset_command_prints_plain_progress_and_caps_workers(tmp_path, capfd):
  from bertjax.data import tokenizer
  text = "\n\n".join("\n".join(f"sentence {i} of document {d} reads a few words." for i in range(4)) for d in range(40))
  (tmp_path / "c.txt").write_text(text)
  vocab = tokenizer.train([tmp_path / "c.txt"], tmp_path / "tok", vocab_size=80)
  cores = len(os.sched_getaffinity(0))
  dataset_cli.main(["--input", str(tmp_path / "c.txt"), "--tokenizer", vocab, "--out", str(tmp_path / "d"),
                "--workers", str(cores + 6), "--max_seq_length", "32", "--max_predictions_per_seq", "5",
                "--heldout_every", "8"])
  out, err = capfd.readouterr()
  assert f"note: --workers {cores + 6} on {cores} core(s): using {cores}" in out
  assert "train: " in out and "wrote " in out
  assert "\x1b[" not in out + err and "\r" not in out + err  # no progress-bar escape codes in a log
  assert "Downloading and preparing" not in out + err and "downloaded and prepared" not in out + err


def test_ctrl_c_during_a_two_worker_dataset_build_is_one_line_and_stops_the_workers(tmp_path, monkeypatch, capfd):
  """Ctrl-C while the worker pool makes shards: one line saying how many shards are kept and to rerun, exit 130
  (the shell's Ctrl-C status), no worker process left; the same command then finishes the build."""
  import multiprocessing as mp

  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset as dataset_lib
  from bertjax.data.pretraining import store
  text = "\n\n".join("\n".join(f"sentence {i} of document {d} reads a few words." for i in range(4))
                     for d in range(60))
  (tmp_path / "c.txt").write_text(text)
  vocab = tokenizer.train([tmp_path / "c.txt"], tmp_path / "tok", vocab_size=80)
  argv = ["--input", str(tmp_path / "c.txt"), "--tokenizer", vocab, "--out", str(tmp_path / "d"), "--workers", "2",
          "--max_seq_length", "32", "--max_predictions_per_seq", "5", "--buffer_documents", "10"]

  class CtrlC(dict):  # the loop over finished shards reads PROGRESS["print"] once a shard: Ctrl-C at the second
    seen = 0

    def __getitem__(self, key):
      if key == "print":
        CtrlC.seen += 1
        if CtrlC.seen == 2:
          assert len(mp.active_children()) == 2  # the pool's workers, busy with the next shards
          raise KeyboardInterrupt
      return super().__getitem__(key)
  monkeypatch.setattr(dataset_lib, "PROGRESS", CtrlC(dataset_lib.PROGRESS))
  workers_when_counted = []  # the command counts the kept shards once the build has stopped its workers
  built = store.built_records
  monkeypatch.setattr(store, "built_records", lambda d: workers_when_counted.append(len(mp.active_children()))
                      or built(d))
  with pytest.raises(SystemExit) as e:
    dataset_cli.main(argv)
  assert e.value.code == 130
  assert workers_when_counted[-1] == 0 and mp.active_children() == []
  monkeypatch.setattr(store, "built_records", built)
  out, err = capfd.readouterr()
  kept = sum(len(v) for v in store.built_records(str(tmp_path / "d")).values())
  assert kept >= 1 and err == (f"error: interrupted: {kept} shard(s) finished and kept in {tmp_path / 'd'}; rerun "
                               "the same command to finish\n"), err
  monkeypatch.setattr(dataset_lib, "PROGRESS", {"print": False, "every_s": 10.0})
  dataset_cli.main(argv)
  out, err = capfd.readouterr()
  assert f"train: {kept} shards an earlier run finished are kept" in out and "wrote " in out, out


def test_dataset_creation_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
  import errno

  from bertjax.data import tokenizer
  from bertjax.data.pretraining import store
  (tmp_path / "c.txt").write_text("one sentence here.\nanother one there.\n\nand a second document.\n")
  vocab = tokenizer.train([tmp_path / "c.txt"], tmp_path / "tok", vocab_size=60)

  def full(self, *args, **kwargs):
    raise RuntimeError("array_record writer failed") from OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(store.ShardWriter, "write", full)
  with pytest.raises(SystemExit) as e:
    dataset_cli.main(["--input", str(tmp_path / "c.txt"), "--tokenizer", vocab, "--out", str(tmp_path / "d")])
  assert e.value.code == 2
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and "writing the dataset in" in lines[0] and "No space left on device" in lines[0], err
  assert "shards written so far are kept" in lines[0]


def test_background_checkpoint_failures_stay_out_of_the_terminal(monkeypatch, capsys):
  """What orbax leaves behind after a failed read or write (abandoned coroutines, callbacks posted to a closed
  event loop) goes to the bertjax.background logger; any other unraisable exception reaches the hook before."""
  import logging
  import sys
  import types
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
  cli_common.quiet_background_failures()
  cli_common.quiet_background_failures()  # once per process: the second call changes nothing
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logging.getLogger("bertjax.background").addHandler(handler)
  logging.getLogger("bertjax.background").setLevel(logging.DEBUG)

  async def pending():
    return 1
  coro = pending()
  args = types.SimpleNamespace(exc_type=RuntimeError, exc_value=RuntimeError("Event loop is closed"),
                               exc_traceback=None, err_msg=None, object=coro)
  sys.unraisablehook(args)
  coro.close()
  other = ValueError("a bug elsewhere")
  sys.unraisablehook(types.SimpleNamespace(exc_type=ValueError, exc_value=other, exc_traceback=None, err_msg=None,
                                           object=object()))
  logging.getLogger("asyncio").error("Future exception was never retrieved")
  logging.getLogger("bertjax.background").removeHandler(handler)
  assert seen == [other]
  assert len(records) == 2 and "Event loop is closed" in records[0].getMessage()
  assert "Future exception" not in capsys.readouterr().err
