"""The embeddings command by mode: each flag-spelling line (`--beir F`, `--beir F --rerank RUN`, ...) reaches its
subcommand's runner with the very arguments the subcommand spelling gives, a line the flag spelling cannot map is
one error naming the new spelling, an option of another mode is refused by the mode's parser before the model's
kind is even read, and the kinds' rules (a sparse encoder scores by dot product) live in `kinds.settle` alone."""
import pytest

from bertjax import errors
from bertjax.cli import embeddings as cli
from bertjax.embeddings import kinds, retrieval

# (flag spelling, subcommand spelling): every mode, each option of it, the `--flag=value` form and the mode flag
# anywhere on the line.
SAME = [
    (["--model", "M", "--sts", "p.csv", "--columns", "a,b,s", "--pooling", "cls", "--batch_size", "4"],
     ["sts", "p.csv", "--model", "M", "--columns", "a,b,s", "--pooling", "cls", "--batch_size", "4"]),
    (["--beir", "F", "--model=M", "--split", "dev", "--top_k", "9", "--run", "r.trec", "--cache_dir", "c",
      "--block", "7", "--score", "dot", "--query_prefix", "q: ", "--doc_prefix", "", "--max_active_dims", "3",
      "--precision", "int8", "--calibration", "cal.npy", "--rescore_multiplier", "4", "--overwrite"],
     ["beir", "F", "--model", "M", "--split", "dev", "--top_k", "9", "--run", "r.trec", "--cache_dir", "c",
      "--block", "7", "--score", "dot", "--query_prefix", "q: ", "--doc_prefix", "", "--max_active_dims", "3",
      "--precision", "int8", "--calibration", "cal.npy", "--rescore_multiplier", "4", "--overwrite"]),
    (["--model", "M", "--beir_suite", "A", "B/", "--out", "r.json", "--top_k", "50", "--score", "cos", "--block", "8",
      "--pooling", "mean", "--split", "dev", "--query_prefix", "q", "--doc_prefix", "d", "--max_active_dims", "2"],
     ["suite", "A", "B/", "--model", "M", "--out", "r.json", "--top_k", "50", "--score", "cos", "--block", "8",
      "--pooling", "mean", "--split", "dev", "--query_prefix", "q", "--doc_prefix", "d", "--max_active_dims", "2"]),
    (["--model", "M", "--corpus", "a.jsonl", "b*.parquet", "--out", "E", "--id_field", "id", "--text_field", "body",
      "--block", "2", "--doc_prefix", "passage: ", "--precision", "ubinary", "--overwrite"],
     ["corpus", "a.jsonl", "b*.parquet", "--model", "M", "--out", "E", "--id_field", "id", "--text_field", "body",
      "--block", "2", "--doc_prefix", "passage: ", "--precision", "ubinary", "--overwrite"]),
    (["--model", "CE", "--beir", "F", "--rerank", "first.trec", "--depth", "5", "--run", "new.trec", "--top_k", "3",
      "--query_prefix", "q ", "--doc_prefix", "d ", "--split", "dev", "--batch_size", "2", "--overwrite"],
     ["rerank", "F", "first.trec", "--model", "CE", "--depth", "5", "--run", "new.trec", "--top_k", "3",
      "--query_prefix", "q ", "--doc_prefix", "d ", "--split", "dev", "--batch_size", "2", "--overwrite"]),
    (["--rerank=first.trec", "--model", "CE", "--beir=F"], ["rerank", "F", "first.trec", "--model", "CE"]),
]


@pytest.fixture
def calls(monkeypatch):
  """Each mode's runner replaced by a recorder of (mode, arguments); the model is never read."""
  seen = []
  for mode in cli.MODES:
    monkeypatch.setattr(cli, f"_{mode}", lambda args: seen.append(vars(args).copy()) or 0)
  return seen


@pytest.mark.parametrize("old,new", SAME, ids=[f"{n[0]}-{i}" for i, (_, n) in enumerate(SAME)])
def test_each_flag_spelling_reaches_its_subcommand_with_the_same_arguments(calls, old, new):
  assert cli.main(old) == 0 and cli.main(new) == 0
  assert calls[0] == calls[1] and calls[0]["mode"] == new[0]


@pytest.mark.parametrize("argv,message", [
    (["--model", "M", "--sts", "p", "--beir", "F"], r"--sts and --beir: one mode at a time \(python -m bertjax "
                                                    r"embeddings sts\|beir\|suite\|corpus\|rerank"),
    (["--model", "M", "--corpus", "a", "--beir_suite", "F", "--out", "o"], r"--beir_suite and --corpus: one mode"),
    (["--model", "M", "--sts", "p", "--rerank", "R"], r"--rerank needs --beir, .* \(python -m bertjax embeddings "
                                                     r"rerank --model MODEL FOLDER RUN\)"),
    (["--model", "M"], r"name a mode first: python -m bertjax embeddings sts\|beir"),
    (["--model", "M", "--beir_suite"], r"argument --beir_suite: expected at least one argument"),
    (["--model", "M", "--corpus", "a"], r"the following arguments are required: --out"),
    (["beir", "F", "--model", "M", "--rerank", "R"], r"--rerank: names the mode `rerank`, and this line runs `beir`"),
])
def test_a_flag_spelling_that_maps_to_no_one_mode_is_one_line(calls, capsys, argv, message):
  import re
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and re.search(message, err[0]), err
  assert not calls


@pytest.mark.parametrize("argv,flag,takers", [
    (["sts", "p", "--run", "r.trec"], "--run", "beir, rerank"),
    (["sts", "p", "--doc_prefix", "x"], "--doc_prefix", "beir, suite, corpus, rerank"),
    (["corpus", "a", "--out", "E", "--query_prefix=q"], "--query_prefix", "beir, suite, rerank"),
    (["suite", "F", "--precision", "int8"], "--precision", "beir, corpus"),
    (["suite", "F", "--cache_dir", "c"], "--cache_dir", "beir"),
    (["beir", "F", "--depth", "5"], "--depth", "rerank"),
    (["rerank", "F", "R", "--pooling", "cls"], "--pooling", "sts, beir, suite, corpus"),
    (["rerank", "F", "R", "--block", "4"], "--block", "beir, suite, corpus"),
    (["beir", "F", "--out", "o"], "--out", "suite, corpus"),
    (["--sts", "p", "--query_prefix", "q"], "--query_prefix", "beir, suite, rerank"),  # the flag spelling too
    (["--beir_suite", "F", "--run", "r"], "--run", "beir, rerank"),
])
def test_an_option_of_another_mode_is_refused_before_any_model_is_read(monkeypatch, capsys, argv, flag, takers):
  def never(*a, **k):
    raise AssertionError("the model was read")
  for name in ("kind_of", "load", "beir_scores"):
    monkeypatch.setattr(kinds, name, never)
  monkeypatch.setattr(cli.rerank.CrossEncoder, "load", never)
  with pytest.raises(SystemExit) as e:
    cli.main([*argv, "--model", "M"])
  err = capsys.readouterr().err.strip().splitlines()
  mode = cli.from_flags([*argv, "--model", "M"])[0]
  assert e.value.code == 2 and err == [f"error: {flag}: not an option for `embeddings {mode}`; leave it out (it is "
                                       f"for {takers})"]


def test_every_option_is_taken_by_some_mode_and_each_mode_refuses_the_rest():
  """The parser is the table: a mode's subparser holds exactly the options OPTIONS gives it."""
  import argparse
  sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
  for mode, p in sub.choices.items():
    held = {o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert held == {f for f, (_, takers) in cli.OPTIONS.items() if mode in takers}, mode


def test_the_kind_decides_its_score_and_block_in_one_place():
  """`kinds.settle` alone: a sparse encoder defaults to and accepts only dot, a multi-vector one takes no score, a
  dense one cos or dot; each kind's block; the options a kind cannot take are one line; a cross-encoder embeds
  nothing. `beir_scores` settles the same way, so a direct caller meets the same rule."""
  assert kinds.settle("sparse", retrieval.Options()).score == "dot"
  assert kinds.settle("dense", retrieval.Options()).score == "cos"
  assert kinds.settle("multivector", retrieval.Options()).score is None
  assert [kinds.settle(k, retrieval.Options()).block for k in kinds.KINDS] == [65536, 2048, 1024]
  assert kinds.settle("sparse", retrieval.Options(block=5)).block == 5
  for kind, opts, message in [
      ("sparse", retrieval.Options(score="cos"), "a sparse encoder scores by dot product: --score dot"),
      ("multivector", retrieval.Options(score="dot"), "a multi-vector encoder scores by MaxSim"),
      ("dense", retrieval.Options(score="cosine"), "--score 'cosine': cos or dot"),
      ("sparse", retrieval.Options(precision="int8"), "--precision: not an option for a sparse encoder"),
      ("sparse", retrieval.Options(pooling="cls"), "--pooling: not an option for a sparse encoder"),
      ("multivector", retrieval.Options(cache_dir="c"), "--cache_dir: not an option for a multi-vector encoder"),
      ("dense", retrieval.Options(max_active_dims=3), "--max_active_dims: not an option for a dense embedding"),
      ("rerank", retrieval.Options(), "is a cross-encoder: it re-scores a run")]:
    with pytest.raises(errors.ConfigError, match=message):
      kinds.settle(kind, opts)
  with pytest.raises(errors.ConfigError, match="a sparse encoder scores by dot product"):
    kinds.beir_scores(object(), "sparse", "no-such-folder", retrieval.Options(score="cos"))
