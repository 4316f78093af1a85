r"""Time to quality: bertjax's pre-training against HF transformers' `run_mlm.py` recipe on the same real text, the
same tokenizer, the same model shape, objective and wall-clock budget, both final and intermediate models scored
by one evaluator on the same held-out masked positions.

  python benchmarks/pretrain_vs_hf.py --root runs/ttq --minutes 15 \
      --sides bertjax,hf,bertjax_nsp --downstream bertjax,hf --lrs 1e-4,1e-3 \
      --out benchmarks/results/pretrain_vs_hf_cpu.json
  python benchmarks/pretrain_vs_hf.py --root runs/ttq --minutes 15 \
      --sides bertjax,roberta,modernbert,electra --downstream bertjax,roberta,modernbert,electra \
      --lrs 1e-4,1e-3 --out benchmarks/results/family_bakeoff_cpu.json

Stages (each skipped when its output exists, so a rerun resumes; `--rerun SIDE` repeats one side):
  corpus    the machine's English manual pages and Python's own documentation, every paragraph once
            (`bertjax.data.demo_corpus.build_offline_corpus(sources=("python", "man"), dedupe=True)`)
  split     one document in 100 (by a hash of its text) held out; the rest is the training text of both sides
  tokenizer one WordPiece vocabulary trained on the training text (`bertjax.data.tokenizer`), read by both sides
  held-out  the held-out text tokenized by HF's BertTokenizerFast, cut into [CLS] 126 tokens [SEP] blocks, 15% of
            the tokens masked once (80/10/10) with a fixed seed: the same positions for every model
  sides     bertjax: its data creation (full_sentences rows, as RoBERTa's FULL-SENTENCES), dynamic masking, its
            train loop (`python -m bertjax train --config=configs/pretrain.py`), MLM only; `bertjax_nsp` is the
            original recipe (NSP pairs, L = L_MLM + L_NSP, dynamic masking). hf: `run_mlm.py`'s way: `datasets`'
            text loader, each line tokenized with its special tokens and the texts grouped into full blocks,
            `DataCollatorForLanguageModeling`, `Trainer` with torch AdamW and the linear schedule.
            The family bake-off adds `roberta`, `modernbert` and `electra`: bertjax's recipes of those families
            (configs/roberta.py, configs/modernbert.py, configs/electra.py; see RECIPES below) on the same data,
            shape and budget; ELECTRA's scored MLM model is its generator, its fine-tuned one the discriminator.
            Both: the same model (BERT, 2 layers x 128, 2 heads, FFN 512, 128 positions: the demo's), batch 32 x
            128, peak learning rate 1e-3 with 10% linear warmup then linear decay to 0, weight decay 0.01,
            clipping at 1.0, dropout 0.1; each optimizer with its own defaults otherwise (bertjax: the original's
            Adam without bias correction, eps 1e-6; torch AdamW: bias correction, eps 1e-8). The shape is chosen
            so that a 15-minute run on 2 CPU cores leaves the unigram plateau (held-out loss about 6.5 on this
            corpus); bertjax's 4 x 256 model stayed on it for 20 minutes at batch 64 (learning rate 5e-4) and
            for 525 steps at batch 32 (1e-3).
  budget    a short probe run of each side measures its start-up time and step rate; the side's number of steps is
            set so that its whole run (start-up, compilation, training, checkpoints) fills the budget, and its
            schedule ends there. Data preparation (bertjax's creation; HF's tokenizing and grouping) is timed apart.
  scoring   every saved checkpoint (bertjax's exported as an HF folder) is scored by `evaluate` below: torch
            BertForMaskedLM, mean cross-entropy and accuracy over the held-out masked positions. Time of a
            checkpoint: when its folder was written, from the side's process start.

Prints one table, writes the JSON and the curves (loss against time and against tokens) as PNG beside it.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import zlib

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import machine  # noqa: E402

SHAPE = dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512)
SEQ, BATCH, VOCAB, LR, WARMUP, WD = 128, 32, 8192, 1e-3, 0.1, 0.01
CHECKPOINTS = 8  # per run, evenly spaced in steps
HELDOUT_BLOCKS = 512
# bertjax's sides: side -> (config, its arguments, overrides beyond the shared ones, masking rate of its data).
# Each family keeps what defines its recipe (objective, masking rate, architecture, its optimizer's β2 / ε / bias
# correction, schedule shape, weight decay, clipping, dropout); the shape, batch, sequence, tokenizer, peak learning
# rate, warmup fraction and budget are the shared ones. ModernBERT's GLU width (344 = 2/3 of 512) matches the
# FFN's parameters; ELECTRA's discriminator is the shared shape with embeddings of the hidden width, its generator
# half as wide (the tiny recipe's ratio).
RECIPES = {
    "bertjax": ("configs/pretrain.py", "variant=base,nsp=False,dynamic=True", 0.15,
                {"model.max_position_embeddings": SEQ, "data.example_mode": "full_sentences"}),
    "bertjax_nsp": ("configs/pretrain.py", "variant=base,nsp=True,dynamic=True", 0.15,
                    {"model.max_position_embeddings": SEQ, "data.example_mode": "nsp_pairs"}),
    "roberta": ("configs/roberta.py", "variant=base", 0.15, {}),
    "modernbert": ("configs/modernbert.py", "variant=tiny,mask=0.3", 0.3, {"model.intermediate_size": 344}),
    "electra": ("configs/electra.py", "variant=tiny", 0.15,
                {"model.max_position_embeddings": SEQ, "model.embedding_size": SHAPE["hidden_size"]}),
}
SIDES = ("bertjax", "hf", "bertjax_nsp", "roberta", "modernbert", "electra")


def log(msg):
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- shared data

def build_corpus(root: str, sources=("python", "man")) -> str:
  path = os.path.join(root, "corpus.txt")
  if not os.path.exists(path):
    from bertjax.data.pretraining import demo_corpus
    t = time.time()
    s = demo_corpus.build_offline_corpus(path, tuple(sources), dedupe=True)
    log(f"corpus: {s.documents} documents, {s.sentences} sentences in {time.time() - t:.0f}s -> {path}")
  return path


def split(root: str, corpus: str) -> tuple[str, str]:
  train, held = os.path.join(root, "train.txt"), os.path.join(root, "heldout.txt")
  if not os.path.exists(held):
    with open(corpus, encoding="utf-8") as f:
      docs = [d.strip() for d in f.read().split("\n\n") if d.strip()]
    parts = {train: [], held: []}
    for d in docs:
      parts[held if zlib.crc32(d.encode()) % 100 == 0 else train].append(d)
    for path, ds in parts.items():
      with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n\n".join(ds) + "\n")
      os.replace(path + ".tmp", path)
    log(f"split: {len(parts[train])} training documents ({os.path.getsize(train) / 1e6:.1f} MB), "
        f"{len(parts[held])} held out ({os.path.getsize(held) / 1e6:.2f} MB)")
  return train, held


def tokenizer(root: str, train: str) -> str:
  vocab = os.path.join(root, "tokenizer", "vocab.txt")
  if not os.path.exists(vocab):
    from bertjax.data import tokenizer as tok_lib
    t = time.time()
    tok_lib.train([train], os.path.dirname(vocab), kind="wordpiece", vocab_size=VOCAB)
    log(f"tokenizer: WordPiece {VOCAB} in {time.time() - t:.0f}s -> {vocab}")
  return vocab


def hf_tokenizer(vocab: str):
  """HF's tokenizer on the same vocabulary; refused unless its ids equal bertjax's on the first held-out lines."""
  from transformers import BertTokenizerFast

  from bertjax.data import tokenizer as tok_lib
  tok = BertTokenizerFast.from_pretrained(os.path.dirname(vocab), do_lower_case=True)
  ours = tok_lib.load(vocab, do_lower_case=True)
  for line in SAMPLE:
    if tok(line, add_special_tokens=False)["input_ids"] != list(ours.encode(line)):
      raise SystemExit(f"error: HF's and bertjax's tokenizers disagree on {line!r}")
  return tok


SAMPLE = ("Return the value of the functional form, unless the file does not exist.",
          "Sets the socket's timeout (in seconds); see setsockopt(2) and ip(7) for details.")


def heldout_set(root: str, held: str, vocab: str) -> str:
  path = os.path.join(root, "heldout.npz")
  if os.path.exists(path):
    return path
  tok = hf_tokenizer(vocab)
  with open(held, encoding="utf-8") as f:
    lines = [ln for ln in f.read().splitlines() if ln.strip()]
  ids = [i for enc in tok(lines, add_special_tokens=False)["input_ids"] for i in enc]
  body = SEQ - 2
  n = min(len(ids) // body, HELDOUT_BLOCKS)
  blocks = np.asarray(ids[:n * body], np.int64).reshape(n, body)
  inputs = np.concatenate([np.full((n, 1), tok.cls_token_id), blocks, np.full((n, 1), tok.sep_token_id)], 1)
  rng = np.random.default_rng(0)
  chosen = rng.random(inputs.shape) < 0.15
  chosen[:, 0] = chosen[:, -1] = False
  labels = np.where(chosen, inputs, -100)
  draw = rng.random(inputs.shape)
  masked = inputs.copy()
  masked[chosen & (draw < 0.8)] = tok.mask_token_id
  rand = chosen & (draw >= 0.8) & (draw < 0.9)
  masked[rand] = rng.integers(0, len(tok), rand.sum())
  np.savez(path, input_ids=masked, labels=labels)
  log(f"held-out: {n} blocks of {SEQ}, {int(chosen.sum())} masked positions -> {path}")
  return path


def evaluate(model_dir: str, heldout: str, batch: int = 64) -> dict:
  """Mean cross-entropy and accuracy of an HF masked-LM folder over the held-out masked positions."""
  import torch
  from transformers import AutoModelForMaskedLM
  d = np.load(heldout)
  model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
  total, correct, count = 0.0, 0, 0
  with torch.no_grad():
    for i in range(0, len(d["input_ids"]), batch):
      ids = torch.from_numpy(d["input_ids"][i:i + batch])
      labels = torch.from_numpy(d["labels"][i:i + batch])
      logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
      m = labels != -100
      total += float(torch.nn.functional.cross_entropy(logits[m], labels[m], reduction="sum"))
      correct += int((logits[m].argmax(-1) == labels[m]).sum())
      count += int(m.sum())
  return {"mlm_loss": total / count, "mlm_accuracy": correct / count, "positions": count}


# ---------------------------------------------------------------- bertjax

def data_key(side: str) -> str:
  """The folder of the data a bertjax side reads: NSP pairs, or FULL-SENTENCES rows with room for its masks."""
  mask = RECIPES[side][2]
  return "data_nsp" if side == "bertjax_nsp" else "data" if mask == 0.15 else f"data_mask{round(mask * 100)}"


def bertjax_data(root: str, train: str, vocab: str, side: str) -> tuple[str, float]:
  nsp, mask = side == "bertjax_nsp", RECIPES[side][2]
  data = os.path.join(root, data_key(side))
  record = os.path.join(data, "creation.json")
  if not os.path.exists(record):
    import tensorflow_datasets as tfds

    from bertjax.data.pretraining import dataset
    from bertjax.data.pretraining import examples as pretraining
    tfds.disable_progress_bar()
    opts = pretraining.CreationOptions(max_seq_length=SEQ, max_predictions_per_seq=0, masked_lm_prob=mask,
                                       dupe_factor=1, example_mode="nsp_pairs" if nsp else "full_sentences")
    t = time.time()
    rec = dataset.create([train], vocab, data, opts, workers=os.cpu_count() or 1, overwrite=True,
                         heldout_every=0)
    rec["bench_seconds"] = time.time() - t
    with open(os.path.join(data, "bench_prep.json"), "w") as f:
      json.dump({"seconds": rec["bench_seconds"]}, f)
    log(f"bertjax data ({opts.example_mode}, {mask:.0%} masks): {rec['report']['train']['examples']} "
        f"examples in {rec['bench_seconds']:.0f}s -> {data}")
  with open(os.path.join(data, "bench_prep.json")) as f:
    return data, json.load(f)["seconds"]


def bertjax_command(side: str, data: str, workdir: str, steps: int, every: int) -> list[str]:
  config, args, mask, own = RECIPES[side]
  from bertjax.data.pretraining import examples as pretraining
  preds = pretraining.max_predictions(SEQ, mask)
  args += f",seq={SEQ},preds={preds},batch={BATCH},steps={steps},shard=dp,vocab={VOCAB}"
  over = {**{f"model.{k}": v for k, v in SHAPE.items()}, "data.data_dir": data,
          "train.learning_rate": LR, "train.warmup_steps": max(1, int(WARMUP * steps)),
          "log_every": min(50, max(1, every // 4)), "eval_every": 0, "eval_batches": 1, "checkpoint_every": every,
          "keep_checkpoints": CHECKPOINTS + 2, **own}
  return ([sys.executable, "-m", "bertjax", "train", f"--config={config}:{args}", f"--workdir={workdir}"]
          + [f"--config.{k}={v}" for k, v in over.items()])


def bertjax_checkpoints(workdir: str):
  """(step, folder mtime) of every checkpoint."""
  out = []
  for d in glob.glob(os.path.join(workdir, "checkpoints", "*")):
    if os.path.basename(d).isdigit():
      out.append((int(os.path.basename(d)), os.path.getmtime(d)))
  return sorted(out)


def bertjax_export(workdir: str, step: int, out: str) -> str:
  """The checkpoint at `step` as HF's folder(s): the family's MLM model, or ELECTRA's two (OUT/discriminator,
  OUT/generator), written whole or not at all."""
  if not os.path.isdir(out):
    from bertjax.convert import export
    from bertjax.core import checkpoint as checkpoint_lib
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      run = json.load(f)
    params = checkpoint_lib.Checkpointer(workdir, read_only=True).restore_params(step, announce=lambda m: None)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    export.pretraining_params(run, params, tmp)
    os.replace(tmp, out)
  return out


def mlm_folder(side: str, folder: str) -> str:
  """The masked-LM model in an exported folder: ELECTRA's is its generator (half the discriminator's width)."""
  return os.path.join(folder, "generator") if side == "electra" else folder


def encoder_folder(side: str, folder: str) -> str:
  """The model that is fine-tuned: ELECTRA's discriminator, every other side's MLM model."""
  return os.path.join(folder, "discriminator") if side == "electra" else folder


# ---------------------------------------------------------------- HF (run_mlm.py's recipe)

def hf_data(root: str, train: str, vocab: str) -> tuple[str, float]:
  """run_mlm.py's preprocessing: `datasets`' text loader, every line tokenized with special tokens, then grouped
  into full blocks of SEQ tokens (the remainder dropped)."""
  out = os.path.join(root, "hf_data")
  if not os.path.exists(os.path.join(out, "prep.json")):
    import datasets
    tok = hf_tokenizer(vocab)
    t = time.time()
    raw = datasets.load_dataset("text", data_files={"train": train}, cache_dir=os.path.join(root, "hf_cache"))
    tokenized = raw.map(lambda b: tok(b["text"], return_special_tokens_mask=True), batched=True,
                        remove_columns=["text"], num_proc=os.cpu_count() or 1)

    def group_texts(examples):
      joined = {k: list(itertools.chain.from_iterable(examples[k])) for k in examples}
      total = (len(joined["input_ids"]) // SEQ) * SEQ
      return {k: [v[i:i + SEQ] for i in range(0, total, SEQ)] for k, v in joined.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=os.cpu_count() or 1)
    grouped["train"].save_to_disk(out)
    with open(os.path.join(out, "prep.json"), "w") as f:
      json.dump({"seconds": time.time() - t, "blocks": len(grouped["train"])}, f)
    log(f"hf data: {len(grouped['train'])} blocks in {time.time() - t:.0f}s -> {out}")
  with open(os.path.join(out, "prep.json")) as f:
    return out, json.load(f)["seconds"]


HF_TRAIN = r'''
import json, os, sys, time
t0 = float(sys.argv[5])
import torch, datasets, transformers
from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments, TrainerCallback)
data, vocab, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
shape, seq, batch, lr, warmup, wd, every = json.loads(sys.argv[6])
tok = BertTokenizerFast.from_pretrained(os.path.dirname(vocab), do_lower_case=True)
transformers.set_seed(0)
config = BertConfig(vocab_size=len(tok), max_position_embeddings=seq, num_hidden_layers=shape["num_layers"],
                    hidden_size=shape["hidden_size"], num_attention_heads=shape["num_heads"],
                    intermediate_size=shape["intermediate_size"], pad_token_id=tok.pad_token_id)
model = BertForMaskedLM(config)
train = datasets.load_from_disk(data)
args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, learning_rate=lr, weight_decay=wd,
                         warmup_steps=max(1, int(warmup * steps)), max_steps=steps, lr_scheduler_type="linear",
                         save_strategy="steps", save_steps=every, save_only_model=True, logging_steps=50,
                         report_to=[], seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)

class Rate(TrainerCallback):
  def on_step_end(self, args, state, control, **kw):
    if state.global_step in (1, 10, steps):
      with open(os.path.join(out, "steps.jsonl"), "a") as f:
        f.write(json.dumps({"step": state.global_step, "t": time.time() - t0}) + "\n")

collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15)
Trainer(model=model, args=args, train_dataset=train, data_collator=collator, callbacks=[Rate()]).train()
'''


def hf_command(data: str, vocab: str, workdir: str, steps: int, every: int, t0: float) -> list[str]:
  return [sys.executable, "-c", HF_TRAIN, data, vocab, workdir, str(steps), repr(t0),
          json.dumps([SHAPE, SEQ, BATCH, LR, WARMUP, WD, every])]


def hf_checkpoints(workdir: str):
  out = []
  for d in glob.glob(os.path.join(workdir, "checkpoint-*")):
    if os.path.exists(os.path.join(d, "model.safetensors")):
      out.append((int(d.rsplit("-", 1)[1]), os.path.getmtime(os.path.join(d, "model.safetensors"))))
  return sorted(out)


# ---------------------------------------------------------------- running a side

def run(cmd: list[str], log_path: str, env=None) -> float:
  """Runs `cmd` with its output in `log_path`; returns its start time."""
  t0 = time.time()
  with open(log_path, "w") as f:
    r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
  if r.returncode:
    raise SystemExit(f"error: {' '.join(cmd[:4])} ... failed (exit {r.returncode}); see {log_path}")
  return t0


def side_run(side: str, root: str, paths: dict, budget_s: float, rerun: bool) -> dict:
  """Probe, then the budgeted run, of one side; returns its record (steps, start-up, rate, checkpoints)."""
  folder = os.path.join(root, side)
  record_path = os.path.join(folder, "record.json")
  if os.path.exists(record_path) and not rerun:
    with open(record_path) as f:
      return json.load(f)
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  probe_steps = 40

  def launch(workdir, steps, every):
    t0 = time.time()
    if side == "hf":
      cmd = hf_command(paths["hf_data"], paths["vocab"], workdir, steps, every, t0)
    else:
      cmd = bertjax_command(side, paths[data_key(side)], workdir, steps, every)
    return run(cmd, workdir + ".log")

  probe = os.path.join(folder, "probe")
  t0 = launch(probe, probe_steps, probe_steps)
  if side == "hf":
    with open(os.path.join(probe, "steps.jsonl")) as f:
      marks = {r["step"]: r["t"] for r in map(json.loads, f)}
    rate = (probe_steps - 10) / (marks[probe_steps] - marks[10])
    startup = marks[10] - 10 / rate
  else:
    rows = [json.loads(ln) for ln in open(os.path.join(probe, "metrics.jsonl"))]
    times = [r["step_time_s"] for r in rows if r["split"] == "train"][1:]  # the first window holds compilation
    rate = 1.0 / float(np.median(times))
    first_ckpt = bertjax_checkpoints(probe)[-1][1] - t0
    startup = first_ckpt - probe_steps / rate
  steps = max(10, int((budget_s - startup) * rate))
  every = max(1, steps // CHECKPOINTS)
  log(f"{side}: probe {rate:.2f} steps/s, start-up {startup:.0f}s -> {steps} steps in {budget_s / 60:.0f} min")
  workdir = os.path.join(folder, "run")
  t0 = launch(workdir, steps, every)
  ckpts = hf_checkpoints(workdir) if side == "hf" else bertjax_checkpoints(workdir)
  record = {"side": side, "steps": steps, "probe_steps_per_s": rate, "probe_startup_s": startup,
            "wall_s": max(t for _, t in ckpts) - t0,
            "checkpoints": [{"step": s, "seconds": t - t0, "tokens": s * BATCH * SEQ} for s, t in ckpts]}
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  log(f"{side}: {steps} steps in {record['wall_s']:.0f}s")
  return record


def score(side: str, root: str, record: dict, heldout: str) -> list[dict]:
  folder = os.path.join(root, side)
  out = []
  for c in record["checkpoints"]:
    cache = os.path.join(folder, f"score_{c['step']}.json")
    if not os.path.exists(cache):
      if side == "hf":
        model = os.path.join(folder, "run", f"checkpoint-{c['step']}")
      else:
        model = mlm_folder(side, bertjax_export(os.path.join(folder, "run"), c["step"],
                                                os.path.join(folder, f"hf_{c['step']}")))
      with open(cache, "w") as f:
        json.dump(evaluate(model, heldout), f)
    with open(cache) as f:
      out.append({**c, **json.load(f)})
  return out


def downstream(side: str, root: str, model: str, seeds: str, lrs: str) -> dict:
  """The side's final model through `launch/suite.py` on two real labelled tasks (review sentiment, tweet NER;
  the data of benchmarks/finetune_real.py), every side fine-tuned by the same bertjax commands."""
  import finetune_real
  work = os.path.join(root, "tasks")
  os.makedirs(work, exist_ok=True)
  suite_file = os.path.join(work, "suite.json")
  if not os.path.exists(suite_file):
    sent, sent_labels = finetune_real.sentiment_data(work, os.path.expanduser("~/.cache/bertjax-bench"))
    ner, ner_labels = finetune_real.ner_data(work)
    tasks = []
    for name, kind, files, labels in (("sentiment", "local", sent, sent_labels), ("ner", "ner", ner, ner_labels)):
      epochs, batch, seq, _ = finetune_real.RECIPES[name]
      config = f"configs/finetune.py:task={kind},batch={batch},epochs={epochs},seq={seq}"
      tasks.append({"name": name, "config": config,
                    "overrides": [f"--config.data.train_file={files['train']}",
                                  f"--config.data.eval_file={files['test']}",
                                  f"--config.data.labels=({','.join(repr(x) for x in labels)},)"]})
    with open(suite_file, "w") as f:
      json.dump(tasks, f, indent=1)
  suite_root = os.path.join(root, side, "suite")
  summary = run_suite(model, suite_file, lrs, seeds, suite_root, side)
  if any(not t.get("runs") for t in summary["tasks"]):
    raise SystemExit(f"error: the suite of {side} left tasks without a finished run; see {suite_root}")
  return summary


def run_suite(model: str, suite_file: str, lrs: str, seeds: str, suite_root: str, label: str) -> dict:
  """launch/suite.py's run and table for `model`; its suite.json summary."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for cmd in (["run", "--init", model, "--suite", suite_file, "--lrs", lrs, "--seeds", seeds, "--root", suite_root],
              ["table", "--root", suite_root]):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "suite.py"), *cmd], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode:
      raise SystemExit(f"error: the suite of {label} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
  with open(os.path.join(suite_root, "suite.json")) as f:
    return json.load(f)


def final_model(side: str, root: str, record: dict, vocab: str) -> str:
  """The side's last checkpoint as an HF folder with the tokenizer beside it (what fine-tuning reads)."""
  from bertjax.convert import export
  step = record["checkpoints"][-1]["step"]
  folder = (os.path.join(root, side, "run", f"checkpoint-{step}") if side == "hf" else
            encoder_folder(side, os.path.join(root, side, f"hf_{step}")))
  if not os.path.exists(os.path.join(folder, "vocab.txt")):
    export.copy_tokenizer(vocab, True, folder)
  return folder


def time_to(curve: list[dict], loss: float) -> float | None:
  """Seconds at which `curve` first reaches `loss`, linearly interpolated between checkpoints."""
  prev = None
  for c in curve:
    if c["mlm_loss"] <= loss:
      if prev is None:
        return c["seconds"]
      f = (prev["mlm_loss"] - loss) / (prev["mlm_loss"] - c["mlm_loss"])
      return prev["seconds"] + f * (c["seconds"] - prev["seconds"])
    prev = c
  return None


def plot(curves: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for side, curve in curves.items():
    side = side + " (generator)" if side == "electra" else side
    axes[0].plot([c["seconds"] / 60 for c in curve], [c["mlm_loss"] for c in curve], "o-", label=side)
    axes[1].plot([c["tokens"] / 1e6 for c in curve], [c["mlm_loss"] for c in curve], "o-", label=side)
  axes[0].set_xlabel("wall-clock minutes (from process start)")
  axes[1].set_xlabel("training tokens (millions)")
  for ax in axes:
    ax.set_ylabel("held-out MLM loss")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--root", default="runs/ttq")
  p.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget of each side's run")
  p.add_argument("--sides", default="bertjax,hf,bertjax_nsp")
  p.add_argument("--rerun", default="", help="comma-separated sides to run again")
  p.add_argument("--out", default="benchmarks/results/pretrain_vs_hf_cpu.json")
  p.add_argument("--downstream", default="", help="sides whose final models go through the suite (sentiment, NER)")
  p.add_argument("--seeds", default="0,1,2", help="fine-tuning seeds of the downstream suite")
  p.add_argument("--lrs", default="1e-4", help="fine-tuning learning rates of the downstream suite")
  args = p.parse_args(argv)
  sides = [s for s in args.sides.split(",") if s]
  for s in sides:
    if s not in SIDES:
      raise SystemExit(f"error: unknown side {s!r}; choose from {list(SIDES)}")
  root = os.path.abspath(args.root)
  os.makedirs(root, exist_ok=True)
  corpus = build_corpus(root)
  train, held = split(root, corpus)
  vocab = tokenizer(root, train)
  heldout = heldout_set(root, held, vocab)
  paths, prep = {"vocab": vocab}, {}
  for s in sides:
    if s == "hf":
      paths["hf_data"], prep[s] = hf_data(root, train, vocab)
    else:
      paths[data_key(s)], prep[s] = bertjax_data(root, train, vocab, s)
  records = {s: side_run(s, root, paths, args.minutes * 60, s in args.rerun.split(",")) for s in sides}
  curves = {s: score(s, root, records[s], heldout) for s in sides}

  suites = {s: downstream(s, root, final_model(s, root, records[s], vocab), args.seeds, args.lrs)
            for s in args.downstream.split(",") if s}

  hf_final = curves["hf"][-1] if "hf" in curves else None
  rows = []
  for s in sides:
    final = curves[s][-1]
    row = {"side": s, "steps": records[s]["steps"], "wall_s": records[s]["wall_s"], "prep_s": prep[s],
           "steps_per_s": records[s]["probe_steps_per_s"], "final_mlm_loss": final["mlm_loss"],
           "final_mlm_accuracy": final["mlm_accuracy"], "tokens": final["tokens"]}
    if s == "electra":
      row["scored_model"] = "generator"  # its MLM loss is the generator's, not comparable with the others'
    if hf_final is not None and s != "electra":
      t = time_to(curves[s], hf_final["mlm_loss"])
      row["seconds_to_hf_final_loss"] = t
      row["fraction_of_hf_time"] = None if t is None else t / hf_final["seconds"]
    if s in suites:
      row["downstream"] = {t["task"]: {k: t.get(k) for k in ("metric", "median", "mean", "sd", "per_seed")}
                           for t in suites[s]["tasks"]}
      row["downstream_average"] = suites[s]["average"]
    rows.append(row)
  print(f"\nmachine: {machine.describe()}")
  print("| side | steps | steps/s | prep s | run s | held-out MLM loss | accuracy | time to HF's final loss |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    frac = r.get("fraction_of_hf_time")
    to_hf = ("-" if "seconds_to_hf_final_loss" not in r else "not reached" if frac is None else f"{frac:.2f}x")
    name = r["side"] + (" (generator)" if r.get("scored_model") else "")
    print(f"| {name} | {r['steps']} | {r['steps_per_s']:.2f} | {r['prep_s']:.0f} | {r['wall_s']:.0f} | "
          f"{r['final_mlm_loss']:.3f} | {r['final_mlm_accuracy']:.3f} | {to_hf} |")
  for s, suite in suites.items():
    print(f"downstream {s}: " + ", ".join(f"{t['task']} {t['metric']} {t['mean']:.4f} ± {t['sd']:.4f}"
                                          for t in suite["tasks"] if t.get("runs")))
  result = {"budget_minutes": args.minutes, "shape": SHAPE, "seq": SEQ, "batch": BATCH, "vocab": VOCAB,
            "learning_rate": LR, "warmup": WARMUP, "weight_decay": WD,
            "corpus_mb": os.path.getsize(train) / 1e6, "heldout_positions": curves[sides[0]][-1]["positions"],
            "rows": rows, "curves": curves, "cores": os.cpu_count()}
  out = os.path.join(ROOT, args.out) if not os.path.isabs(args.out) else args.out
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out, "w") as f:
    json.dump(machine.stamp(result), f, indent=1)
  plot(curves, os.path.splitext(out)[0] + ".png")
  print(f"-> {out}, {os.path.splitext(out)[0]}.png")


if __name__ == "__main__":
  main()
