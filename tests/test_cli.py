"""Every command-line tool reports a user's mistake as one `error:` line with exit code 2, never a traceback."""
import sys

import pytest
from helpers import assert_one_line_error, main_cmd, run_cmd


@pytest.mark.slow
def test_pretraining_refusals_are_one_line_errors(tmp_path, data_dir):
  """The same three mistakes as tests/test_finetune.py::test_finetune_refusals_are_one_line_errors, in
  pre-training: a locked workdir, a non-finite loss, a bad config value."""
  from bertjax.core import checkpoint as checkpoint_lib
  args = "variant=tiny,seq=32,preds=5,batch=16,steps=5,shard=dp"
  locked = tmp_path / "locked"
  with checkpoint_lib.WorkdirLock(str(locked)):
    assert_one_line_error(run_cmd(main_cmd(args, locked, data_dir)), "locked|in use|another")
  assert_one_line_error(run_cmd(main_cmd(args, tmp_path / "nan", data_dir, "--config.train.learning_rate=1e30")),
                        "non-finite loss")
  assert_one_line_error(run_cmd(main_cmd(args, tmp_path / "sched", data_dir, "--config.train.schedule=cosine_typo")),
                        "train.schedule")


def test_command_line_mistakes_are_one_line_errors(tmp_path):
  """A mistyped --config key, an unknown flag, a config file that is not there."""
  main = [sys.executable, "-m", "bertjax", "train", f"--workdir={tmp_path / 'w'}"]
  assert_one_line_error(run_cmd(main + ["--config=configs/pretrain.py:variant=tiny", "--config.train.lerning_rate=1"]),
                        r"bad command line: --config.train.lerning_rate: no such config field 'lerning_rate' in "
                        r"train; did you mean 'train.learning_rate'")
  assert_one_line_error(run_cmd(main + ["--config=configs/pretrain.py:variant=tiny", "--bogus=1"]),
                        "bad command line: Unknown command line flag 'bogus'")
  assert_one_line_error(run_cmd(main + ["--config=configs/no_such_config.py"]), "no_such_config.py")


def test_train_reads_configs_from_any_folder_and_lists_them_in_its_help(tmp_path):
  """`--config=configs/...` as the docs give it also works from another folder (the checkout's configs/), and
  `train --help` names every recipe; `--help FILE` gives a recipe's arguments."""
  import subprocess

  from helpers import env
  main = [sys.executable, "-m", "bertjax", "train", f"--workdir={tmp_path / 'w'}"]
  away = subprocess.run(main + ["--config=configs/finetune.py:task=pairs", "--config.train.lerning_rate=1"],
                        cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
  assert_one_line_error(away, "no such config field 'lerning_rate'")  # the file was found and built
  help_ = subprocess.run([sys.executable, "-m", "bertjax", "train", "--help"], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=300)
  assert help_.returncode == 0
  for name in ("pretrain", "finetune", "embedding", "roberta", "modernbert", "electra", "deberta_v3", "demo"):
    assert f"configs/{name}.py: " in help_.stdout
  one = subprocess.run([sys.executable, "-m", "bertjax", "train", "--help", "configs/finetune.py"], cwd=tmp_path,
                       env=env(), capture_output=True, text=True, timeout=300)
  assert one.returncode == 0 and "Argument keys: task" in one.stdout


def test_data_tools_bad_input_is_one_line_errors(tmp_path):
  binary = tmp_path / "corpus.bin"
  binary.write_bytes(bytes(range(256)) * 8)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
  dataset = [sys.executable, "-m", "bertjax", "dataset", "--out", str(tmp_path / "d")]
  assert_one_line_error(run_cmd(dataset + ["--input", str(binary), "--tokenizer", str(vocab)]),
                        "corpus.bin: looks like a binary file")
  assert_one_line_error(run_cmd(dataset + ["--input", str(binary), "--tokenizer", str(tmp_path / "none.txt")]),
                        "none.txt: tokenizer file not found")
  assert_one_line_error(run_cmd([sys.executable, "-m", "bertjax", "tokenizer", "--input", str(tmp_path / "nope.txt"),
                                 "--out", str(tmp_path / "tok"), "--vocab_size", "64"]), "nope.txt")
  assert_one_line_error(run_cmd([sys.executable, "-m", "bertjax", "predict", "--workdir", str(tmp_path / "none"),
                                 "a [MASK] b"]), "no config.json")
