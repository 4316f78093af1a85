"""Data at pod scale: what building a dataset into a bucket and training from it cost against local disk.

    python benchmarks/data_pod.py [--dupe_factor 20] [--steps 40] [--parts build,read,train,goodput]
        [--out data_pod_cpu.json]

Starts fake-gcs-server (the GCS emulator the tests use, in memory, on 127.0.0.1) and measures, on the demo's
corpus (this Python's documentation):
1. building: `bertjax dataset` into a local folder and into the bucket with 1 and 2 worker processes, examples/s
   and shard MB/s per worker, and the most local disk the workers' staging folders held (polled from outside);
2. reading: the training input pipeline's batches/s from local disk and from the bucket, the cache limit at 10%
   of the split (data.shuffle_window sized to fit it), and the cache folder's high-water mark;
3. training: steps/s of the demo's model (2 layers, 32 x 128) from local data and from the bucket at that limit,
   and of BERT-base's shapes (12 layers, 8 x 128) for a few steps;
4. goodput: a pre-training run with its workdir and data in the bucket, killed with SIGKILL twice and resumed to
   its end, as the goodput record summarises it.
The emulator runs on this machine: its figures are the client's and the protocol's cost, not a network's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import helpers  # noqa: E402  (tests/helpers.py: DiskWatch)
import machine  # noqa: E402


def shard_bytes(data_dir: str) -> int:
  from bertjax.core import files
  from bertjax.data.pretraining import store
  return sum(n for name, n in files.sizes(store.version_dir(data_dir)).items() if ".array_record-" in name)


def build(corpus: str, vocab: str, out: str, opts, workers: int, tmp: str) -> dict:
  from bertjax.data.pretraining import dataset
  os.makedirs(tmp, exist_ok=True)
  os.environ["TMPDIR"] = tempfile.tempdir = tmp  # this process and its workers stage their shards under it
  with helpers.DiskWatch(tmp) as watch:
    start = time.perf_counter()
    rec = dataset.create([corpus], vocab, out, opts, workers=workers)
    seconds = time.perf_counter() - start
  examples = sum(r["examples"] for r in rec["report"].values())
  size = shard_bytes(out)
  return {"workers": workers, "seconds": round(seconds, 2), "examples": examples,
          "shards": sum(r["shards"] for r in rec["report"].values()), "mb": round(size / 1e6, 1),
          "examples_per_s_per_worker": round(examples / seconds / workers), "mb_per_s_per_worker":
          round(size / 1e6 / seconds / workers, 2), "staging_high_water_mb": round(watch.most_all / 1e6, 2)}


def read_rate(data_dir: str, batch: int, steps: int, window: int, limit: int, cache_dir: str) -> dict:
  from bertjax.core import cache as cache_lib
  from bertjax.data.pretraining import dataset
  from bertjax.data.pretraining import pipeline as input_pipeline
  os.environ["BERTJAX_CACHE"] = cache_dir
  cache_lib._SHARED.clear()  # noqa: SLF001  (a fresh, empty cache for each measurement)
  src = dataset.load_source(data_dir, "train", cache_limit=limit)
  with helpers.DiskWatch(cache_dir) as watch:
    p = input_pipeline.Pipeline(src, batch, seed=0, prefetch=2, window=window)
    start = time.perf_counter()
    for _ in range(steps):
      next(p)
    seconds = time.perf_counter() - start
    p.close()
  return {"batches_per_s": round(steps / seconds, 1), "examples_per_s": round(steps * batch / seconds),
          "cache_high_water_mb": round(watch.most_all / 1e6, 2),
          "downloads": src.cache.downloads if src.cache is not None else 0}


def train_rate(data_dir: str, workdir: str, window: int, limit: int, steps: int, variant: str, cache_dir: str) -> dict:
  """Steps/s of a pre-training command after its first step (compile excluded), from its metrics.jsonl."""
  from bertjax.data.pretraining import dataset
  vocab = dataset.read_creation(data_dir)["vocab_size"]
  base = ["variant=tiny,seq=128,preds=20,batch=32,shard=dp"] if variant == "demo" else \
      ["variant=base,seq=128,preds=20,batch=8,shard=dp"]
  cmd = [sys.executable, "-m", "bertjax", "train", f"--config={ROOT}/configs/pretrain.py:{base[0]}",
         f"--workdir={workdir}", f"--config.data.data_dir={data_dir}", f"--config.model.vocab_size={vocab}",
         f"--config.train.num_steps={steps}", "--config.log_every=1", "--config.eval_every=100000",
         "--config.checkpoint_every=100000", f"--config.data.shuffle_window={window}",
         f"--config.data.cache_limit={limit}"]
  env = {**os.environ, "BERTJAX_CACHE": cache_dir}
  with helpers.DiskWatch(cache_dir) as watch:
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
  from bertjax.core import files
  rows = [json.loads(line) for line in files.read_text(files.join(workdir, "metrics.jsonl")).splitlines() if line]
  times = [r["step_time_s"] for r in rows if r.get("split") == "train" and r["step"] > 2 and "step_time_s" in r]
  mean = sum(times) / max(len(times), 1)
  return {"steps_per_s": round(1 / mean, 3) if mean else None, "steps_timed": len(times),
          "cache_high_water_mb": round(watch.most_all / 1e6, 2)}


def goodput_of_killed_run(data_dir: str, workdir: str, steps: int, env: dict) -> dict:
  """A run killed with SIGKILL at about a third and two thirds of its steps, resumed each time to its end."""
  from bertjax.core import files, goodput
  from bertjax.data.pretraining import dataset
  vocab = dataset.read_creation(data_dir)["vocab_size"]
  cmd = [sys.executable, "-m", "bertjax", "train",
         f"--config={ROOT}/configs/pretrain.py:variant=tiny,seq=128,preds=20,batch=32,shard=dp",
         f"--workdir={workdir}", f"--config.data.data_dir={data_dir}", f"--config.model.vocab_size={vocab}",
         f"--config.train.num_steps={steps}", "--config.log_every=1", "--config.eval_every=100000",
         f"--config.checkpoint_every={max(steps // 6, 1)}", "--config.eval_every=100000"]
  every = max(steps // 6, 1)
  for kill_at in (steps // 3 + every // 2, 2 * steps // 3 + every // 2):  # half-way between two checkpoints
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
      if line.startswith("step") and int(line.split()[1].rstrip(":").split("/")[0]) >= kill_at:
        proc.send_signal(signal.SIGKILL)
        break
    proc.wait()
  subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
  s = goodput.summarise(goodput.read(workdir))
  del files
  return {"line": goodput.line(s), **s}


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--dupe_factor", type=int, default=20, help="passes over the corpus (the dataset's size)")
  p.add_argument("--buffer_documents", type=int, default=8, help="documents per shard")
  p.add_argument("--steps", type=int, default=40, help="training steps per measurement")
  p.add_argument("--parts", default="build,read,train,goodput", help="which measurements to make (comma-separated)")
  p.add_argument("--out", default="data_pod_cpu.json")
  args = p.parse_args()
  parts = set(args.parts.split(","))
  if parts - {"build", "read", "train", "goodput"}:
    p.error(f"--parts: unknown {sorted(parts - {'build', 'read', 'train', 'goodput'})}; "
            "choose from build, read, train, goodput")
  import object_store

  from bertjax.core import files
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import demo_corpus
  from bertjax.data.pretraining import examples as pretraining
  server = object_store.FakeGcs()
  os.environ.update(server.env())
  bucket = server.bucket()
  print(f"machine: {machine.describe()}", flush=True)
  work = tempfile.mkdtemp(prefix="bertjax-data-pod-")
  result: dict = {"build": [], "read": [], "train": []}
  try:
    corpus = os.path.join(work, "corpus.txt")
    demo_corpus.build_demo_corpus(corpus)
    vocab = tokenizer.train([corpus], os.path.join(work, "tok"), vocab_size=8000)
    opts = pretraining.CreationOptions(max_seq_length=128, max_predictions_per_seq=20,
                                       dupe_factor=args.dupe_factor, buffer_documents=args.buffer_documents)
    for workers in ((1, 2) if "build" in parts else (1,)):
      for where, out in (("local", os.path.join(work, f"data{workers}")), ("bucket", f"{bucket}/data{workers}")):
        row = {"where": where, **build(corpus, vocab, out, opts, workers, os.path.join(work, f"tmp-{where}{workers}"))}
        if "build" in parts:
          result["build"].append(row)
        print("build", row, flush=True)
    local, remote = os.path.join(work, "data1"), f"{bucket}/data1"
    total = shard_bytes(local)
    biggest = max(files.sizes(os.path.join(local, "bert_pretraining", "1.0.0")).values())
    limit = total // 10
    window = max(1, limit // (2 * biggest))
    result.update({"dataset_mb": round(total / 1e6, 1), "largest_shard_mb": round(biggest / 1e6, 2),
                   "cache_limit_mb": round(limit / 1e6, 1), "shuffle_window": window})
    for _ in range(2 if "read" in parts else 0):  # alternating sides, twice
      for where, d in (("local", local), ("bucket", remote)):
        row = {"where": where, **read_rate(d, 32, 200, window, limit, os.path.join(work, f"cache-r-{where}"))}
        result["read"].append(row)
        print("read", row, flush=True)
    for variant, steps in ((("demo", args.steps), ("base", 6)) if "train" in parts else ()):
      for where, d in (("local", local), ("bucket", remote)):
        w = os.path.join(work, f"w-{variant}-{where}")
        row = {"model": variant, "where": where,
               **train_rate(d, w, window, limit, steps, variant, os.path.join(work, f"cache-t-{variant}-{where}"))}
        result["train"].append(row)
        print("train", row, flush=True)
        shutil.rmtree(w, ignore_errors=True)
    if "goodput" in parts:
      result["goodput"] = goodput_of_killed_run(remote, f"{bucket}/killed", 3 * args.steps,
                                                {**os.environ, "BERTJAX_CACHE": os.path.join(work, "cache-g")})
      print("goodput", result["goodput"]["line"], flush=True)
  finally:
    server.stop()
    shutil.rmtree(work, ignore_errors=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp(result), f, indent=2)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
