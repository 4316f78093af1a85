"""Every command-line tool on a table of bad input (tests/hostile.py), and a fuzz of the readers and parsers that
user input reaches first: each ends in one `error:` line (or succeeds), never a traceback or a hang."""
import gzip
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import helpers
import hostile
from bertjax import errors
from bertjax.data import conll, corpus, tasks
from configs import common


def test_every_cli_refuses_bad_input_in_one_line(tmp_path):
  """The whole table (>= 60 cases over main in both modes, dataset, tokenizer, predict, convert, aot), two
  processes side by side."""
  procs = {}
  for group in ("main", "aot"):
    out = tmp_path / f"{group}.json"
    procs[group] = (out, subprocess.Popen([sys.executable, "tests/hostile.py", "--group", group, "--json", str(out)],
                                          cwd=helpers.ROOT, env=helpers.env(), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
  results = {}
  for out, proc in procs.values():
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    results.update(json.loads(out.read_text()))
  assert len(results) == len(hostile.CASES) >= 60
  tools = {case[1] for case in hostile.CASES}
  assert tools == {"main", "dataset", "tokenizer", "predict", "convert", "aot"}
  problems = {k: r["problem"] for k, r in results.items() if r["problem"]}
  assert not problems, json.dumps(problems, indent=1)[:6000]


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
  task = tasks.get("local", ("neg", "pos"), regression)
  _one_line_or_success(lambda: tasks.local_examples(str(path), task, "sentence", "", "label"))


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
    except ValueError as e:  # what the config file raises; bertjax.main reports it in one line
      raise errors.ConfigError(str(e)) from None
  _one_line_or_success(parse)


@pytest.mark.parametrize("override", ["train.learning_rate=", "train=1", "a.b.c=1", "=", "model.dtype=bfloat16,x",
                                      "train.num_steps=1e3", "train.use_nsp=2"])
def test_config_overrides_fail_in_one_line(override):
  from configs import pretrain
  _one_line_or_success(lambda: _as_config_error(lambda: common.override(pretrain.get_config("variant=tiny"),
                                                                        [override])))


def _as_config_error(fn):
  try:
    fn()
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
