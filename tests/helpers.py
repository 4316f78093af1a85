"""What several test modules share: small configs, the entry-point command lines and their checks.

Fixtures live in conftest.py; plain functions here (`import helpers`)."""
import csv
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_pretraining_data(d) -> str:
  """A tiny pre-training data_dir (seq 32, 5 predictions, vocab 128) built from generated text under `d`."""
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset
  from bertjax.data.pretraining import examples as pretraining
  rng = np.random.default_rng(0)
  words = ("the model reads text and predicts masked words from both sides of each sentence while a second "
           "head guesses whether two segments follow each other").split()
  docs = ["\n".join(" ".join(rng.choice(words, rng.integers(5, 14))).capitalize() + "."
                    for _ in range(rng.integers(2, 9))) for _ in range(80)]
  (d / "corpus.txt").write_text("\n\n".join(docs))
  vocab = tokenizer.train([d / "corpus.txt"], d / "tok", vocab_size=128)
  opts = pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2)
  dataset.create([d / "corpus.txt"], vocab, d / "data", opts, heldout_every=8)
  return str(d / "data")


def small_config(data_dir="", shard="dp", **train_kw):
  from bertjax.data.pretraining import dataset
  from configs import pretrain
  c = pretrain.get_config(f"variant=tiny,seq=32,preds=5,batch=16,shard={shard},tp=4,steps=6")
  c.model.hidden_size = 64
  c.model.num_heads = 4
  c.model.intermediate_size = 128
  c.model.max_position_embeddings = 64
  c.model.vocab_size = dataset.read_creation(data_dir)["vocab_size"] if data_dir else 128
  c.data.data_dir = data_dir
  c.data.prefetch = 0
  c.train.warmup_steps = 2
  c.train.learning_rate = 1e-3
  c.log_every = 1
  c.eval_every = 3
  c.eval_batches = 2
  c.checkpoint_every = 3
  for k, v in train_kw.items():
    c.train[k] = v
  return c


def main_cmd(config_arg, workdir, data_dir, *extra):
  """`python -m bertjax train` pre-training the small model of `small_config` on `data_dir`."""
  from bertjax.data.pretraining import dataset
  return [sys.executable, "-m", "bertjax", "train", f"--config={ROOT}/configs/pretrain.py:{config_arg}",
          f"--workdir={workdir}", f"--config.data.data_dir={data_dir}", "--config.model.hidden_size=64",
          "--config.model.num_heads=4", "--config.model.intermediate_size=128",
          f"--config.model.vocab_size={dataset.read_creation(data_dir)['vocab_size']}",
          "--config.model.max_position_embeddings=64", "--config.train.warmup_steps=2", *extra]


def metrics_rows(workdir) -> list:
  """The rows of WORKDIR/metrics.jsonl."""
  import json
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def env():
  e = dict(os.environ)
  e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
  return e


def run_cmd(cmd, timeout=600):
  return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout, check=False)


def assert_one_line_error(proc, pattern):
  """Exit code 2, exactly one `error:` line matching `pattern`, and no traceback."""
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and re.search(pattern, lines[0]), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def write_sentiment(path, n, seed):
  """A CSV (sentence, sentiment) whose label is decided by one planted word among filler: learnable in seconds."""
  rng = random.Random(seed)
  pos, neg = ["good", "fine", "nice"], ["bad", "poor", "awful"]
  filler = "alpha beta gamma delta river mountain city island".split()
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["sentence", "sentiment"])
    for _ in range(n):
      label = rng.choice(["pos", "neg"])
      words = [rng.choice(filler) for _ in range(rng.randint(4, 10))]
      words.insert(rng.randrange(len(words) + 1), rng.choice(pos if label == "pos" else neg))
      w.writerow([" ".join(words), label])


def finetune_sentiment(tmp_path, init, epochs=3) -> dict:
  """Fine-tunes from `init` (a workdir or an HF folder with its tokenizer) on a learnable local sentiment task
  (480 training rows, 200 held out, `epochs` epochs at seq 32); returns finetune's summary."""
  from bertjax import finetune
  from configs import finetune as finetune_config
  write_sentiment(tmp_path / "train.csv", 480, 0)
  write_sentiment(tmp_path / "dev.csv", 200, 1)
  c = finetune_config.get_config(f"task=local,init={init},lr=1e-3,batch=16,epochs={epochs},seq=32")
  c.data.train_file, c.data.eval_file = str(tmp_path / "train.csv"), str(tmp_path / "dev.csv")
  c.data.text_a_column, c.data.label_column, c.data.labels = "sentence", "sentiment", ("neg", "pos")
  return finetune.finetune(c, str(tmp_path / "w"))


def write_beir(folder, docs: dict, queries: dict, qrels: dict):
  """A BEIR folder: corpus.jsonl and queries.jsonl ({id: text}) and qrels/test.tsv ({query: {doc: relevance}})."""
  import json
  folder = Path(folder)
  (folder / "qrels").mkdir(parents=True)
  (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
  (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
  (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{q}\t{d}\t{r}\n" for q, ds in qrels.items() for d, r in ds.items()))
  return folder


def tiny_deberta_folder(texts, out, vocab_size=320):
  """An HF DebertaV2ForMaskedLM folder in DeBERTa-v3's layout (relative attention, p2c + c2p, 16 buckets, no
  absolute positions) at a tiny size, with a WordPiece vocabulary trained on `texts` (a list of files)."""
  import shutil

  import torch
  import transformers

  from bertjax.data import tokenizer
  path = tokenizer.train(texts, Path(out).parent / "tok", kind="wordpiece", vocab_size=vocab_size)
  torch.manual_seed(0)
  transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(
      vocab_size=tokenizer.load(path).vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=128, max_position_embeddings=128, relative_attention=True, pos_att_type=["p2c", "c2p"],
      position_buckets=16, max_relative_positions=128, share_att_key=True, norm_rel_ebd="layer_norm",
      position_biased_input=False, type_vocab_size=0)).save_pretrained(out)
  shutil.copy(path, Path(out) / "vocab.txt")
  return out


class DiskWatch:
  """Polls the folders under `root` from another thread: the most bytes any one of them, and all together, held."""

  def __init__(self, root):
    self.root, self.most_one, self.most_all, self.seen = str(root), 0, 0, 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    while not self._stop.is_set():
      total = 0
      for d, _, names in os.walk(self.root):
        here = 0
        for n in names:
          try:
            here += os.path.getsize(os.path.join(d, n))
          except OSError:
            pass
        self.most_one = max(self.most_one, here)
        total += here
        self.seen += bool(here)
      self.most_all = max(self.most_all, total)
      time.sleep(0.002)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
