"""convert, merge, predict, extend_vocab and `init=` with workdirs, HF folders and outputs in a bucket (gs://, on
fake-gcs-server): the same bytes as the local tools write, foreign objects refused, one line for a missing bucket,
and never a local folder named 'gs:'."""
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from bertjax.cli import convert as convert_cli
from bertjax.cli import extend_vocab as extend_cli
from bertjax.cli import merge as merge_cli
from bertjax.cli import predict as predict_cli
from bertjax.convert import weights
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "checkpoints_v0")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A local tiny pre-training workdir (tests/data/checkpoints_v0's run, hidden 16) with three checkpoints (steps
  1-3, the parameters shifted by the step) and its tokenizer copy."""
  w = tmp_path_factory.mktemp("w") / "W"
  os.makedirs(w / "tokenizer")
  run = json.load(open(os.path.join(DATA, "pretrain", "config.json"), encoding="utf-8"))
  run["data"]["data_dir"] = ""
  (w / "config.json").write_text(json.dumps(run, indent=2))
  shutil.copyfile(os.path.join(DATA, "vocab.txt"), w / "tokenizer" / "vocab.txt")
  params = checkpoint_lib.Checkpointer(os.path.join(DATA, "pretrain"), read_only=True).restore_params()
  ckpt = checkpoint_lib.Checkpointer(str(w), keep=5, async_save=False)
  for step in (1, 2, 3):
    ckpt.save(step, {"params": jax.tree_util.tree_map(lambda x, s=step: x + np.asarray(0.01 * s, x.dtype), params)},
              {"step": step})
  ckpt.close()
  return str(w)


@pytest.fixture
def cwd(tmp_path, monkeypatch):
  """Runs the test in an empty folder and checks that no tool took gs://... for a local path there."""
  here = tmp_path / "cwd"
  here.mkdir()
  monkeypatch.chdir(here)
  yield here
  assert not os.path.exists(here / "gs:"), "a tool wrote a gs:// path as a local folder"
  assert not os.path.exists(here / "gs%3A")


def tree(path) -> dict:
  """{relative name: bytes} of every file under a local folder or a prefix."""
  return {rel.replace(os.sep, "/"): files.read_bytes(files.join(path, rel)) for rel in files.walk_files(path)}


def one_line_error(capsys, argv, main, pattern):
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code != 0
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and pattern in err, err
  return err


def test_convert_between_buckets_writes_the_local_conversion_byte_for_byte(workdir, bucket, cwd, tmp_path, capsys):
  files.copy(workdir, f"{bucket}/W")
  assert convert_cli.main(["--workdir", workdir, "--out", str(tmp_path / "hf")]) == 0
  assert convert_cli.main(["--workdir", f"{bucket}/W", "--out", f"{bucket}/out/hf"]) == 0
  local, remote = tree(tmp_path / "hf"), tree(f"{bucket}/out/hf")
  assert set(local) == {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"}
  assert remote == local  # the safetensors bytes included
  assert not [n for n in files.listdir(f"{bucket}/out") if n != "hf"]  # no staging objects left beside it
  # A local workdir to a bucket, and a bucket workdir to a local folder: the same bytes again.
  assert convert_cli.main(["--workdir", workdir, "--out", f"{bucket}/out2"]) == 0
  assert tree(f"{bucket}/out2") == local
  assert convert_cli.main(["--workdir", f"{bucket}/W", "--out", "here"]) == 0
  assert tree(cwd / "here") == local


def test_an_output_prefix_with_foreign_objects_is_refused_without_overwrite(workdir, bucket, cwd, capsys):
  files.copy(workdir, f"{bucket}/W")
  files.write_whole(f"{bucket}/out/notes.txt", "someone else's")
  argv = ["--workdir", f"{bucket}/W", "--out", f"{bucket}/out"]
  one_line_error(capsys, argv, convert_cli.main, "exists and is not empty; pass --overwrite")
  assert files.read_text(f"{bucket}/out/notes.txt") == "someone else's"
  assert convert_cli.main([*argv, "--overwrite"]) == 0  # replaced whole: the foreign object is gone
  assert sorted(files.listdir(f"{bucket}/out")) == ["config.json", "model.safetensors", "tokenizer_config.json",
                                                     "vocab.txt"]
  # A workdir is never written over, --overwrite or not; nor is the workdir itself an output.
  one_line_error(capsys, ["--workdir", f"{bucket}/W", "--out", f"{bucket}/W", "--overwrite"], convert_cli.main,
                 "is the workdir being converted")
  files.copy(workdir, f"{bucket}/W2")
  one_line_error(capsys, ["--workdir", f"{bucket}/W", "--out", f"{bucket}/W2", "--overwrite"], convert_cli.main,
                 "holds a bertjax workdir")
  # merge: an --out holding objects a merge did not write is refused even with --overwrite.
  one_line_error(capsys, [f"{bucket}/W@1", f"{bucket}/W@2", "--out", f"{bucket}/out", "--overwrite"],
                 merge_cli.main, "holds files a merge did not write")


def test_init_from_a_workdir_and_an_hf_folder_in_a_bucket(workdir, bucket, cwd, tmp_path):
  files.copy(workdir, f"{bucket}/W")
  assert convert_cli.main(["--workdir", workdir, "--out", str(tmp_path / "hf")]) == 0
  files.copy(str(tmp_path / "hf"), f"{bucket}/hf")
  for local, remote, kind in ((workdir, f"{bucket}/W", "pretraining"), (str(tmp_path / "hf"), f"{bucket}/hf", "hf")):
    assert weights.source_of(remote) == kind
    assert weights.config_of(remote) == weights.config_of(local)
    want, got = weights.load(local, head="pretraining"), weights.load(remote, head="pretraining")
    assert got.source == kind and got.cfg == want.cfg and got.do_lower_case == want.do_lower_case
    assert os.path.isfile(got.tokenizer) and open(got.tokenizer, "rb").read() == open(want.tokenizer, "rb").read()
    for a, b in zip(jax.tree_util.tree_leaves(got.params), jax.tree_util.tree_leaves(want.params), strict=True):
      np.testing.assert_array_equal(a, b)
  with pytest.raises(Exception, match="neither a bertjax workdir"):
    weights.source_of(f"{bucket}/nothing")
  with pytest.raises(OSError, match="bucket does not exist"):
    weights.source_of("gs://no-such-bucket-for-bertjax/W")


def merged_params(path):
  return checkpoint_lib.Checkpointer(path, read_only=True).restore_params()


def test_merge_in_a_bucket(workdir, bucket, cwd, tmp_path, capsys):
  files.copy(workdir, f"{bucket}/W")
  assert merge_cli.main([workdir, "--last", "3", "--out", str(tmp_path / "avg")]) == 0
  assert merge_cli.main([f"{bucket}/W", "--last", "3", "--out", f"{bucket}/avg"]) == 0
  for a, b in zip(jax.tree_util.tree_leaves(merged_params(f"{bucket}/avg")),
                  jax.tree_util.tree_leaves(merged_params(str(tmp_path / "avg"))), strict=True):
    np.testing.assert_array_equal(a, b)
  local = tree(tmp_path / "avg" / "hf")
  assert tree(f"{bucket}/avg/hf") == local and "model.safetensors" in local
  assert files.read_bytes(f"{bucket}/avg/tokenizer/vocab.txt") == open(os.path.join(DATA, "vocab.txt"), "rb").read()
  assert json.loads(files.read_text(f"{bucket}/avg/config.json"))["merged"]["inputs"] == [
      f"{bucket}/W@{s}" for s in (1, 2, 3)]
  # An earlier merge is replaced only with --overwrite; the merged workdir is itself an input to merge.
  argv = [f"{bucket}/W@1", f"{bucket}/avg", "--out", f"{bucket}/avg"]
  one_line_error(capsys, argv, merge_cli.main, "is one of the inputs")
  argv = [f"{bucket}/W@1", f"{bucket}/W@3", "--out", f"{bucket}/avg"]
  one_line_error(capsys, argv, merge_cli.main, "holds an earlier merge; pass --overwrite")
  assert merge_cli.main([*argv, "--overwrite"]) == 0
  want = merged_params(f"{bucket}/W")  # step 3; the mean of steps 1 and 3 is step 2's
  got = merged_params(f"{bucket}/avg")
  step2 = checkpoint_lib.Checkpointer(f"{bucket}/W", read_only=True).restore_params(2)
  for a, b, c in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(step2), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert a.shape == c.shape


def test_predict_with_a_workdir_in_a_bucket(workdir, bucket, cwd, capsys):
  files.copy(workdir, f"{bucket}/W")
  text = "the [MASK] is here ."
  assert predict_cli.main(["--workdir", workdir, "--top_k", "3", text]) == 0
  local = capsys.readouterr().out
  assert predict_cli.main(["--workdir", f"{bucket}/W", "--top_k", "3", text]) == 0
  assert capsys.readouterr().out == local and "[MASK] ->" in local
  one_line_error(capsys, ["--workdir", f"{bucket}/nothing", text], predict_cli.main, "no config.json")


def test_extend_vocab_from_and_to_a_bucket(workdir, bucket, cwd, tmp_path, capsys):
  files.copy(workdir, f"{bucket}/W")
  files.write_whole(f"{bucket}/tokens.txt", "zebra\nquokka\n")
  assert extend_cli.main(["--model", workdir, "--tokens", "zebra,quokka", "--out", str(tmp_path / "ext")]) == 0
  assert extend_cli.main(["--model", f"{bucket}/W", "--tokens", f"{bucket}/tokens.txt", "--out",
                          f"{bucket}/ext"]) == 0
  local, remote = tree(tmp_path / "ext"), tree(f"{bucket}/ext")
  assert set(remote) == set(local) and "model.safetensors" in remote
  for name in remote:
    if name != "extend_vocab.json":  # it names its --model
      assert remote[name] == local[name], name
  files.write_whole(f"{bucket}/theirs/a.txt", "x")
  one_line_error(capsys, ["--model", f"{bucket}/W", "--tokens", "zebra", "--out", f"{bucket}/theirs"], extend_cli.main,
                 "pass --overwrite")


def test_a_missing_bucket_is_one_line(gcs_server, capsys, cwd):
  one_line_error(capsys, ["--workdir", "gs://no-such-bucket-for-bertjax/W", "--out", "out"], convert_cli.main,
                 "gs://no-such-bucket-for-bertjax: the bucket does not exist")
  one_line_error(capsys, ["gs://no-such-bucket-for-bertjax/W", "--last", "2", "--out", "out"], merge_cli.main,
                 "the bucket does not exist")
  one_line_error(capsys, ["--workdir", "gs://no-such-bucket-for-bertjax/W", "text [MASK]"], predict_cli.main,
                 "the bucket does not exist")
  assert not os.path.exists(cwd / "out")


def test_a_fine_tuned_workdir_in_a_bucket_converts_and_predicts(bucket, cwd, tmp_path, capsys):
  ft = tmp_path / "ft"
  shutil.copytree(os.path.join(DATA, "finetune"), ft)
  os.makedirs(ft / "tokenizer")
  shutil.copyfile(os.path.join(DATA, "vocab.txt"), ft / "tokenizer" / "vocab.txt")
  meta = json.loads((ft / "finetune.json").read_text())
  meta["tokenizer"] = "tokenizer/vocab.txt"  # relative: the workdir's copy, as fine-tuning writes it today
  (ft / "finetune.json").write_text(json.dumps(meta))
  files.copy(str(ft), f"{bucket}/ft")
  assert weights.source_of(f"{bucket}/ft") == "finetuned"
  assert convert_cli.main(["--workdir", str(ft), "--out", str(tmp_path / "hf")]) == 0
  assert convert_cli.main(["--workdir", f"{bucket}/ft", "--out", f"{bucket}/hf"]) == 0
  local = tree(tmp_path / "hf")
  assert tree(f"{bucket}/hf") == local and "model.safetensors" in local
  capsys.readouterr()
  assert predict_cli.main(["--workdir", str(ft), "the model reads text"]) == 0
  want = capsys.readouterr().out
  assert predict_cli.main(["--workdir", f"{bucket}/ft", "the model reads text"]) == 0
  assert capsys.readouterr().out == want and '"label"' in want


@pytest.mark.slow
def test_the_commands_in_subprocesses(workdir, gcs_server, bucket, tmp_path, tmp_path_factory, capsys):
  """`python -m bertjax convert / merge / predict` on gs:// paths, run from an empty folder (the emulator's
  variables in their environment)."""
  import subprocess
  import sys

  import helpers
  files.copy(workdir, f"{bucket}/W")
  env = {**helpers.env(), **gcs_server.env()}

  def run(*argv):
    proc = subprocess.run([sys.executable, "-m", "bertjax", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
  here = tmp_path_factory.mktemp("in_process")  # the same commands in this process on local paths
  run("convert", "--workdir", f"{bucket}/W", "--out", f"{bucket}/hf")
  assert convert_cli.main(["--workdir", workdir, "--out", str(here / "hf")]) == 0
  assert tree(f"{bucket}/hf") == tree(here / "hf")
  run("merge", f"{bucket}/W", "--last", "3", "--out", f"{bucket}/avg")
  assert merge_cli.main([workdir, "--last", "3", "--out", str(here / "avg")]) == 0
  for a, b in zip(jax.tree_util.tree_leaves(merged_params(f"{bucket}/avg")),
                  jax.tree_util.tree_leaves(merged_params(str(here / "avg"))), strict=True):
    np.testing.assert_array_equal(a, b)
  printed = run("predict", "--workdir", f"{bucket}/avg", "--top_k", "3", "the [MASK] is here .")
  lines = printed.splitlines()
  assert len(lines) == 2 and lines[0] == "the [MASK] is here ." and lines[1].startswith("   [MASK] -> "), printed
  assert len(re.findall(r" \(\d\.\d{3}\)", lines[1])) == 3, lines[1]
  capsys.readouterr()
  assert predict_cli.main(["--workdir", str(here / "avg"), "--top_k", "3", "the [MASK] is here ."]) == 0
  assert capsys.readouterr().out == printed
  proc = subprocess.run([sys.executable, "-m", "bertjax", "convert", "--workdir", f"{bucket}/W", "--out",
                         f"{bucket}/hf"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  helpers.assert_one_line_error(proc, "pass --overwrite")
  assert sorted(os.listdir(tmp_path)) == []  # nothing local: no 'gs:' folder, no staging left behind
