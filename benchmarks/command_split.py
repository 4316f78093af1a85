"""Where a whole inference command's seconds go, beside sentence-transformers doing the same work: `python -m bertjax
embeddings beir` (dense and multi-vector), `embeddings rerank`, `mine`, `teacher` and `mteb.evaluate` with
`MtebEncoder`, against `SentenceTransformer.encode` + `util.semantic_search`, `MultiVectorEncoder` + MaxSim,
`CrossEncoder.predict`, `util.mine_hard_negatives`, `CrossEncoder.predict` over the mined triplets and
`mteb.evaluate` with `SentenceTransformer`, on the same texts and weights (benchmarks/inference_vs_st.py's BEIR
folder from this Python's documentation and its models on all-MiniLM-L6-v2; the MTEB tasks are a retrieval task
and an STS task read from that folder), each run a fresh process with an empty compile cache, the two sides
alternating.

  python benchmarks/command_split.py [--kinds beir,multivector,rerank,mine,teacher,mteb] [--repeats 3]
      [--docs 400] [--out benchmarks/results/command_split_cpu.json]

Each process is split, from its spawn, into:
  start-up   the interpreter and the imports up to the command's first line (bertjax: jax's CPU client too)
  tokenize   the tokenizer's calls (bertjax's `Tokenizer.encode` / `encode_head`; the peer's tokenizer's
             `__call__`)
  compile    bertjax: jax's tracing, lowering and XLA compiling (jax.monitoring); the peer: none
  forward    every call of the model's forward (bertjax: each jitted `_apply`, waited for, less the compiling
             inside the call; the peer: each module's `forward`)
  the rest   reading, loading the model, padding, the search or mining, writing the output
Prints a table (medians over the repeats, with their range) and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_vs_st  # noqa: E402
import machine  # noqa: E402

PARTS = ("startup", "tokenize", "compile", "forward", "rest", "process")
KINDS = ("beir", "multivector", "rerank", "mine", "teacher", "mteb")

# MTEB's tasks load from the Hub; these two read the benchmark's BEIR folder instead (both sides run them): a
# retrieval task of its queries and passages, and an STS task of each query with its own passage (score 1) and
# the next query's (0).
MTEB_TASKS = r'''
def mteb_tasks(beir):
    import csv, json
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata
    read = lambda p: [json.loads(l) for l in open(beir + p, encoding="utf-8")]
    corpus = {d["_id"]: d["text"] for d in read("/corpus.jsonl")}
    queries = {q["_id"]: q["text"] for q in read("/queries.jsonl")}
    qrels = {}
    for r in csv.DictReader(open(beir + "/qrels/test.tsv", encoding="utf-8"), delimiter="\t"):
        qrels.setdefault(r["query-id"], {})[r["corpus-id"]] = int(r["score"])
    meta = dict(main_score="ndcg_at_10", description="local", reference="https://docs.python.org/3/",
                category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], date=("2024-01-01", "2024-01-01"),
                dialect=[], domains=[], task_subtypes=[], license="cc-by-4.0", annotations_creators="derived",
                modalities=["text"], sample_creation="found", bibtex_citation="")
    class Retrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(type="Retrieval", name="LocalDocs", dataset={"path": "local/docs", "revision": "1"},
                                **meta)
        def load_data(self, num_proc=None, **kwargs):
            self.dataset = {"default": {"test": {
                "corpus": Dataset.from_list([{"id": i, "title": "", "text": t} for i, t in corpus.items()]),
                "queries": Dataset.from_list([{"id": i, "text": t} for i, t in queries.items()]),
                "relevant_docs": qrels, "top_ranked": None}}}
            self.data_loaded = True
    pairs = [(queries[q], corpus[next(iter(d))]) for q, d in qrels.items()]
    rows = [(a, b, 1.0) for a, b in pairs]
    rows += [(a, pairs[(i + 1) % len(pairs)][1], 0.0) for i, (a, _) in enumerate(pairs)]
    class STS(AbsTaskSTS):
        metadata = TaskMetadata(type="STS", name="LocalPairs", dataset={"path": "local/pairs", "revision": "1"},
                                **{**meta, "main_score": "cosine_spearman"})
        min_score, max_score = 0, 1
        def load_data(self, num_proc=None, **kwargs):
            self.dataset = DatasetDict({"test": Dataset.from_dict({"sentence1": [r[0] for r in rows],
                                        "sentence2": [r[1] for r in rows], "score": [r[2] for r in rows]})})
            self.data_loaded = True
    return [Retrieval(), STS()]
def mteb_run(model, beir, out_file):
    import json, mteb
    result = mteb.evaluate(model, tasks=mteb_tasks(beir), cache=None, show_progress_bar=False)
    scores = {r.task_name: r.scores["test"][0]["main_score"] for r in result.task_results}
    json.dump(scores, open(out_file, "w"))
'''

BERTJAX_SIDE = MTEB_TASKS + r'''
import functools, json, sys, time
spawn, argv = float(sys.argv[1]), sys.argv[2:]
acc = {"tokenize": 0.0, "forward": 0.0, "compile": 0.0}
import jax
jax.devices()
from jax import monitoring
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings.dense import encoder as dense
from bertjax.embeddings.multivector import encoder as multivector
from bertjax.embeddings.rerank import encoder as rerank
def listen(event, secs, **kw):
    if event.startswith("/jax/core/compile/"):
        acc["compile"] += secs
monitoring.register_event_duration_secs_listener(listen)
def timed_tokens(method):
    def run(self, *a, **k):
        t = time.perf_counter(); r = method(self, *a, **k); acc["tokenize"] += time.perf_counter() - t; return r
    return run
for name in ("encode", "encode_head"):  # neither calls the other
    setattr(tokenizer_lib.Tokenizer, name, timed_tokens(getattr(tokenizer_lib.Tokenizer, name)))
def timed_apply(make):
    def prop(self):
        f = make(self)
        def run(*a, **k):
            t, c = time.perf_counter(), acc["compile"]
            r = jax.block_until_ready(f(*a, **k))
            acc["forward"] += time.perf_counter() - t - (acc["compile"] - c)  # less the compiling inside the call
            return r
        return run
    return functools.cached_property(prop)
for cls in (dense.Encoder, multivector.MultiVectorEncoder, rerank.CrossEncoder):
    p = timed_apply(cls.__dict__["_apply"].func); p.__set_name__(cls, "_apply"); setattr(cls, "_apply", p)
from bertjax.__main__ import main
out = {"startup": time.time() - spawn}
if argv[0] == "mteb":  # the Python API under mteb.evaluate, not a command
    from bertjax.embeddings.mteb_model import MtebEncoder
    mteb_run(MtebEncoder(argv[1]), argv[2], argv[3]); rc = 0
else:
    rc = main(argv)
out["process"] = time.time() - spawn
out.update(acc)
out["rest"] = out["process"] - out["startup"] - acc["tokenize"] - acc["compile"] - out["forward"]
print("SPLIT " + json.dumps(out))
sys.exit(rc)
'''

PEER_SIDE = MTEB_TASKS + r'''
import json, sys, time
spawn, kind, model_path, beir, out_file, first = float(sys.argv[1]), *sys.argv[2:7]
import numpy as np, torch
import sentence_transformers
from sentence_transformers import util
from transformers import PreTrainedTokenizerBase
acc = {"tokenize": 0.0, "forward": 0.0, "compile": 0.0}
call = PreTrainedTokenizerBase.__call__
def timed_call(self, *a, **k):
    t = time.perf_counter(); r = call(self, *a, **k); acc["tokenize"] += time.perf_counter() - t; return r
PreTrainedTokenizerBase.__call__ = timed_call
def timed(m):
    fwd = m.forward
    def run(*a, **k):
        t = time.perf_counter(); r = fwd(*a, **k); acc["forward"] += time.perf_counter() - t; return r
    m.forward = run
    return m
out = {"startup": time.time() - spawn}
read = lambda p: [json.loads(l) for l in open(p, encoding="utf-8")]
corpus = read(beir + "/corpus.jsonl"); queries = read(beir + "/queries.jsonl")
docs = [d["text"] for d in corpus]; qs = [q["text"] for q in queries]
def write(run):
    with open(out_file, "w") as f:
        for q, hs in zip(queries, run):
            f.writelines(f"{q['_id']} Q0 {d} {r + 1} {s} st\n" for r, (d, s) in enumerate(hs))
if kind == "beir":
    m = timed(sentence_transformers.SentenceTransformer(model_path, device="cpu"))
    hits = util.semantic_search(m.encode(qs, convert_to_tensor=True), m.encode(docs, convert_to_tensor=True), top_k=100)
    write([[(corpus[h["corpus_id"]]["_id"], h["score"]) for h in hs] for hs in hits])
elif kind == "multivector":
    m = timed(sentence_transformers.MultiVectorEncoder(model_path, device="cpu"))
    scores = torch.as_tensor(m.similarity(m.encode_query(qs), m.encode_document(docs)))
    v, i = torch.topk(scores, min(100, scores.shape[1]), dim=1)
    write([[(corpus[j]["_id"], float(s)) for s, j in zip(vr, ir)] for vr, ir in zip(v.tolist(), i.tolist())])
elif kind == "rerank":
    m = sentence_transformers.CrossEncoder(model_path, device="cpu"); timed(m.model)
    text = {d["_id"]: d["text"] for d in corpus}; qtext = {q["_id"]: q["text"] for q in queries}
    jobs = [l.split() for l in open(first, encoding="utf-8")]
    jobs = [(j[0], j[2]) for j in jobs if int(j[3]) <= 10]
    s = m.predict([(qtext[a], text[b]) for a, b in jobs])
    with open(out_file, "w") as f:
        f.writelines(f"{a} Q0 {b} 0 {float(v)} st\n" for (a, b), v in zip(jobs, s))
elif kind == "teacher":
    m = sentence_transformers.CrossEncoder(model_path, device="cpu"); timed(m.model)
    rows = [json.loads(l) for l in open(first, encoding="utf-8")]
    negs = sorted(k for k in rows[0] if k.startswith("negative"))
    s = m.predict([(r["anchor"], r[c]) for r in rows for c in ["positive", *negs]])
    np.save(out_file + ".npy", np.asarray(s).reshape(len(rows), -1))
elif kind == "mteb":
    mteb_run(timed(sentence_transformers.SentenceTransformer(model_path, device="cpu")), beir, out_file)
else:
    import datasets
    m = timed(sentence_transformers.SentenceTransformer(model_path, device="cpu"))
    pairs = [json.loads(l) for l in open(beir + "/pairs.jsonl", encoding="utf-8")]
    data = datasets.Dataset.from_list(pairs)
    mined = util.mine_hard_negatives(data, m, corpus=docs, num_negatives=3, verbose=False)
    mined.to_json(out_file)
out["process"] = time.time() - spawn
out.update(acc)
out["rest"] = out["process"] - out["startup"] - acc["tokenize"] - acc["forward"]
print("SPLIT " + json.dumps(out))
'''


def bertjax_argv(kind: str, models: dict, beir: str, out: str, first: str) -> list[str]:
  if kind == "mine":
    return ["mine", "--model", models["dense"], "--pairs", os.path.join(beir, "pairs.jsonl"), "--corpus",
            os.path.join(beir, "corpus.jsonl"), "--out", out + ".jsonl", "--num_negatives", "3"]
  if kind == "teacher":
    negs = ",".join(f"negative_{i}" for i in range(1, 4))
    return ["teacher", "--model", models["rerank"], "--pairs", first, "--columns", f"anchor,positive,{negs}",
            "--out", out]
  if kind == "mteb":
    return ["mteb", models["dense"], beir, out]
  if kind == "rerank":
    return ["embeddings", "rerank", beir, first, "--model", models["rerank"], "--depth", "10", "--run", out]
  return ["embeddings", "beir", beir, "--model", models["dense" if kind == "beir" else kind], "--run", out,
          "--top_k", "100"]


def run(cmd: list[str], env: dict) -> dict:
  done = subprocess.run(cmd, env=env, capture_output=True, text=True)
  line = [ln for ln in done.stdout.splitlines() if ln.startswith("SPLIT ")]
  if done.returncode or not line:
    raise RuntimeError(f"{' '.join(cmd[3:8])}: {done.stderr.strip()[-1500:]}")
  return json.loads(line[-1][6:])


def shrink(beir: str, docs: int) -> None:
  """The folder's first `docs` documents, the queries judged against them, and the (query, document) pairs
  `mine` reads."""
  rows = [json.loads(ln) for ln in open(os.path.join(beir, "corpus.jsonl"), encoding="utf-8")][:docs]
  keep = {r["_id"] for r in rows}
  qrels = [ln.split("\t") for ln in open(os.path.join(beir, "qrels", "test.tsv"), encoding="utf-8")][1:]
  qrels = [(q, d) for q, d, _ in qrels if d in keep]
  queries = {json.loads(ln)["_id"]: json.loads(ln) for ln in open(os.path.join(beir, "queries.jsonl"),
                                                                    encoding="utf-8")}
  text = {r["_id"]: r["text"] for r in rows}
  with open(os.path.join(beir, "corpus.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(beir, "queries.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(queries[q]) + "\n" for q, _ in qrels)
  with open(os.path.join(beir, "qrels", "test.tsv"), "w", encoding="utf-8") as f:
    f.write("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels))
  with open(os.path.join(beir, "pairs.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"anchor": queries[q]["text"], "positive": text[d]}) + "\n" for q, d in qrels)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--kinds", default=",".join(KINDS))
  ap.add_argument("--repeats", type=machine.positive_int, default=3)
  ap.add_argument("--docs", type=machine.positive_int, default=400,
                  help="documents of the BEIR folder kept (default: %(default)s)")
  ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "bertjax-command-split"))
  ap.add_argument("--out", default="", help="the results JSON (default: none)")
  a = ap.parse_args()
  kinds = a.kinds.split(",")
  unknown = sorted(set(kinds) - set(KINDS))
  if unknown:
    ap.error(f"--kinds {','.join(unknown)}: not a kind; the kinds are {', '.join(KINDS)}")
  print(f"machine: {machine.describe()}", flush=True)
  os.makedirs(a.work, exist_ok=True)
  beir = os.path.join(a.work, "beir")
  inference_vs_st.write_beir(beir)
  shrink(beir, a.docs)
  models = inference_vs_st.build_models(a.work)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
          "PYTHONPATH": os.path.dirname(HERE), "JAX_COMPILATION_CACHE_DIR": "",
         "JAX_ENABLE_COMPILATION_CACHE": "false"}
  first = os.path.join(a.work, "first.trec")  # the reranking rows read the dense model's run
  subprocess.run([sys.executable, "-m", "bertjax", *bertjax_argv("beir", models, beir, first, "")], env=env,
                 check=True, capture_output=True)
  mined = os.path.join(a.work, "mined")  # the teacher rows score the dense model's mined triplets
  subprocess.run([sys.executable, "-m", "bertjax", *bertjax_argv("mine", models, beir, mined, ""), "--output_format",
                  "n-tuple"], env=env, check=True, capture_output=True)
  results = {}
  for kind in kinds:
    runs = {"bertjax": [], "sentence-transformers": []}
    for r in range(a.repeats):
      for side in ("bertjax", "sentence-transformers") if r % 2 == 0 else ("sentence-transformers", "bertjax"):
        out = os.path.join(a.work, f"{kind}-{side}-{r}")
        if side == "bertjax":
          cmd = [sys.executable, "-c", BERTJAX_SIDE, repr(time.time()),
                 *bertjax_argv(kind, models, beir, out, mined + ".jsonl" if kind == "teacher" else first)]
        else:
          model = models[{"beir": "dense", "mine": "dense", "mteb": "dense", "teacher": "rerank"}.get(kind, kind)]
          cmd = [sys.executable, "-c", PEER_SIDE, repr(time.time()), kind, model, beir, out,
                 mined + ".jsonl" if kind == "teacher" else first]
        runs[side].append(run(cmd, env))
        print(kind, side, json.dumps({k: round(v, 2) for k, v in runs[side][-1].items()}), flush=True)
    results[kind] = runs
  print("\n| command | part | bertjax (s) | sentence-transformers (s) |\n|---|---|---|---|")
  for kind, runs in results.items():
    for part in PARTS:
      cells = []
      for side in runs:
        vals = [x[part] for x in runs[side]]
        cells.append(f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})")
      print(f"| {kind} | {part} | {cells[0]} | {cells[1]} |")
    ratios = [s["process"] / b["process"] for b, s in zip(runs["bertjax"], runs["sentence-transformers"])]
    print(f"| {kind} | peer / bertjax, whole process | {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}) | |")
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": "python benchmarks/command_split.py " + " ".join(sys.argv[1:]),
                               "docs": a.docs, "results": results}), f, indent=2)


if __name__ == "__main__":
  main()
