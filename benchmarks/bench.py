"""Train-step benchmark, side by side with HF transformers' PyTorch BERT in the same run.

  python benchmarks/bench.py --variant base --seq 128 --batch 8 --regime fixed [--regime pretrain --regime glue]
      [--dtype float32] [--shard dp] [--steps 10] [--peer hf [--peer hf_compile] | --peer none] [--out bench.json]
  python benchmarks/bench.py --family modernbert --variant base --seq 512 --batch 4 --preds 0 --out mb.json

`--family roberta|modernbert` times that family's pre-training step (configs/roberta.py or configs/modernbert.py
at `--variant`, MLM only) against HF's `RobertaForMaskedLM` / `ModernBertForMaskedLM` of the same sizes, in the
`fixed` regime (every row full). `--family electra` (configs/electra.py, variant small|base|large) times the
ELECTRA step (generator + sampling + discriminator) against HF's `ElectraForMaskedLM` + `ElectraForPreTraining`
with tied embeddings, the replacements sampled in PyTorch, L = L_gen + 50·L_disc.

Regimes: `fixed` (every row full), `pretrain` (lengths as data creation makes them with short_seq_prob 0.1),
`glue` (short sentence pairs, pre-training step), `glue_finetune` (the same pairs through the fine-tuning step
of a sentence classifier, against HF `BertForSequenceClassification`). In the variable regimes the peer pads
every example to the sequence length and bertjax packs examples into rows; both are credited with real
(non-padding) tokens only. Peers: `hf` (eager PyTorch, as HF's examples train) and `hf_compile` (the same model
under `torch.compile`, inductor; its compile time is reported apart). The first `--peer` fills `peer` and `ratio`;
every peer is listed under `peers`.

Model FLOPs per sequence: 3·[L·(24·S·d² + 4·S²·d) + 2·P·(d² + d·V) + 2·d²] (S² -> Σ nᵢ² for packed rows).
MFU is model FLOP/s over the peak: on CPU the best `jnp.dot` FLOP/s measured in this run, on GPU/TPU the chip's
dense bf16 peak. Timings go to the table and JSON only; tests check correctness, not speed.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

REGIMES = ("fixed", "pretrain", "glue", "glue_finetune")
FAMILIES = ("bert", "roberta", "modernbert", "electra")
PEERS = {"hf": False, "hf_compile": True}  # name -> through torch.compile


def sample_lengths(regime: str, n: int, seq: int, rng: np.random.Generator) -> np.ndarray:
  if regime == "fixed":
    return np.full(n, seq)
  if regime == "pretrain":  # target length drawn per document: 10% short (uniform), else full
    short = rng.random(n) < 0.1
    return np.where(short, rng.integers(5, seq + 1, n), seq)
  # GLUE-like sentence pairs: [CLS] a [SEP] b [SEP], mostly 20-60 tokens
  return np.clip(rng.lognormal(np.log(38), 0.45, n).astype(int), 8, seq)


def make_examples(lengths, seq, preds, vocab, rng):
  out = []
  for n in lengths:
    n = int(n)
    ids = np.zeros(seq, np.int32)
    ids[:n] = rng.integers(1000, vocab, n)
    ids[0], ids[n - 1] = 101, 102
    p = min(preds, max(1, int(round(n * 0.15))))
    pos = np.zeros(preds, np.int32)
    pos[:p] = np.sort(rng.choice(np.arange(1, max(n - 1, 2)), p, replace=False)) if n > 2 else 1
    w = np.zeros(preds, np.float32)
    w[:p] = 1
    seg = np.zeros(seq, np.int32)
    seg[n // 2:n] = 1
    out.append({"input_ids": ids, "input_mask": (np.arange(seq) < n).astype(np.int32), "segment_ids": seg,
                "masked_lm_positions": pos, "masked_lm_ids": rng.integers(1000, vocab, preds).astype(np.int32),
                "masked_lm_weights": w, "next_sentence_labels": np.int32(rng.integers(0, 2))})
  return out


def stack(rows):
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def bertjax_batches(examples, batch, seq, preds, pack, per_row=8):
  """Batches of `batch` rows; with `pack`, examples packed into rows (plan over all examples, in order)."""
  from bertjax.data import packing
  if not pack:
    rows = examples
    for r in rows:
      r["next_sentence_weights"] = np.float32(1.0)
    sq = [[int(r["input_mask"].sum()) ** 2] for r in rows]
  else:
    lengths = [int(e["input_mask"].sum()) for e in examples]
    npred = [int(e["masked_lm_weights"].sum()) for e in examples]
    row_preds = preds + per_row * 2
    plan = packing.plan(lengths, npred, seq, row_preds, per_row)
    # The plan lists the longest examples first: time rows in a shuffled order, as training sees them.
    plan = [plan[i] for i in np.random.default_rng(1).permutation(len(plan))]
    rows = [packing.pack_row([examples[i] for i in r], seq, row_preds, per_row) for r in plan]
    sq = [[lengths[i] ** 2 for i in r] for r in plan]
  out = []
  for s in range(0, len(rows) - batch + 1, batch):
    out.append((stack(rows[s:s + batch]), sum(sum(x) for x in sq[s:s + batch])))
  return out


def family_config(family, variant, seq, preds, batch, shard, dtype):
  """The pre-training config of a family's recipe at these sizes."""
  import importlib
  recipe = importlib.import_module("configs." + ("pretrain" if family == "bert" else family))
  return recipe.get_config(f"variant={variant},seq={seq},preds={preds},batch={batch},shard={shard},dtype={dtype},"
                           f"steps=1000")


def run_bertjax(variant, seq, batch, preds, dtype, shard, steps, regime, examples, overrides=(), profile="",
                warmup=2, family="bert"):
  import jax

  from bertjax import pretrain as train
  from bertjax.core import sharding as sharding_lib
  from bertjax.core import trainer
  from bertjax.objectives import electra as electra_objective
  from bertjax.objectives import mlm as mlm_objective
  from configs import common
  pack = regime != "fixed"
  c = family_config(family, variant, seq, preds, batch, shard, dtype)
  c.train.warmup_steps = 10
  c.data.packing = pack
  c.data.pack_max_per_row = 8
  c.data.pack_row_predictions = preds + 16
  common.override(c, overrides)
  mcfg = train.validate(c, jax.device_count())
  batches = bertjax_batches(examples, batch, seq, preds, pack)
  need = warmup + steps
  if len(batches) < need:
    raise ValueError(f"{len(batches)} batches, need {need}: raise --examples")
  run = train.build(c, mcfg)
  state = trainer.init_state(run, 0)
  with sharding_lib.use_mesh(run.mesh, run.rules):
    compile_s, times, timed = _timed(run.train_step, state, [b for b, _ in batches], warmup, steps,
                                     run.batch_sharding, profile)
  if family == "electra":
    flops = [electra_objective.step_flops_of(mcfg, run.module.gen_cfg, seq, preds, batch)] * steps
  else:
    flops = [mlm_objective.batch_flops(mcfg, b) for b, _ in batches[warmup:warmup + steps]]
  step = statistics.median(times)
  tokens = [float(np.asarray(b["input_mask"]).sum()) for b in timed]
  seqs = [float(np.asarray(b["next_sentence_weights"]).sum()) for b in timed]
  return {"compile_s": compile_s, "step_time_s": step, "tokens_per_s": statistics.median(tokens) / step,
          "model_flops_per_step": statistics.median(flops), "sequences_per_s": statistics.median(seqs) / step}


def _timed(step_fn, state, batches, warmup, steps, sharding, profile=""):
  """(compile s, per-step times, batches timed) of a jitted `step_fn(state, batch) -> (state, metrics)`; with
  `profile` (a folder), a jax.profiler trace (and Perfetto JSON) of three more steps, not timed."""
  import jax
  t = time.perf_counter()
  compiled = step_fn.lower(state, jax.device_put(batches[0], sharding)).compile()
  compile_s = time.perf_counter() - t
  times = []
  for i in range(warmup + steps):
    b = jax.device_put(batches[i], sharding)
    t = time.perf_counter()
    state, m = compiled(state, b)
    jax.block_until_ready(m["loss"])
    if i >= warmup:
      times.append(time.perf_counter() - t)
  if profile:
    with jax.profiler.trace(profile, create_perfetto_trace=True):
      for i in range(3):
        state, m = compiled(state, jax.device_put(batches[i], sharding))
      jax.block_until_ready(m["loss"])
  return compile_s, times, batches[warmup:warmup + steps]


def run_bertjax_finetune(variant, seq, batch, dtype, shard, steps, examples, overrides=(), profile="", warmup=2):
  """The fine-tuning step of `finetune.py` (sentence classifier, AdamW, clipping) on packed rows."""
  import ml_collections

  from bertjax import finetune
  from bertjax import model as model_lib
  from bertjax.core import accounting, trainer
  from bertjax.core import sharding as sharding_lib
  from bertjax.data import packing
  from bertjax.data.tasks import batching
  from bertjax.data.tasks import rows as tasks
  from configs import common
  from configs import finetune as ft_config
  c = ft_config.get_config(f"task=local,variant={variant},batch={batch},seq={seq},dtype={dtype}")
  c.sharding = common.sharding(shard)
  common.override(c, overrides)
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  task = tasks.Task(name="glue_like", kind="classification", labels=("0", "1"))
  feats = stack([{k: e[k] for k in ("input_ids", "input_mask", "segment_ids")} for e in examples])
  feats["labels"] = np.asarray([e["next_sentence_labels"] for e in examples], np.int32)
  packed, plan = packing.pack_features(feats, seq, 8)
  # The plan lists the longest examples first: time rows in a shuffled order, as training sees them.
  perm = np.random.default_rng(1).permutation(len(plan))
  packed, plan = {k: v[perm] for k, v in packed.items()}, [plan[i] for i in perm]
  need = warmup + steps
  if len(plan) < need * batch:
    raise ValueError(f"{len(plan)} packed rows, need {need * batch}: raise --examples")
  rows = list(batching.batches(packed, batch))
  tcfg = ml_collections.ConfigDict(c.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = 1000, 100
  tx, lr_fn = finetune.unit_optimizer(tcfg)
  module = finetune.head_module(task, mcfg)
  t = trainer.build(c, module, tx, lr_fn, rows[0], *finetune.make_steps(module, task, tx, lr_fn, c.train.prng_impl),
                    train_scalars=2)
  state = trainer.init_state(t, 0)
  lr = np.float32(c.train.learning_rate)
  with sharding_lib.use_mesh(t.mesh, t.rules):
    compile_s, times, timed = _timed(lambda s, b: t.train_step(s, b, np.uint32(0), lr), state, rows, warmup, steps,
                                     t.batch_sharding, profile)
  step = statistics.median(times)
  flops = [accounting.batch_flops(mcfg, rows[warmup + i]) for i in range(steps)]
  tokens = [float(b["input_mask"].sum()) for b in timed]
  seqs = [float(b["example_weights"].sum()) for b in timed]
  return {"compile_s": compile_s, "step_time_s": step, "tokens_per_s": statistics.median(tokens) / step,
          "model_flops_per_step": statistics.median(flops), "sequences_per_s": statistics.median(seqs) / step}


def _hf_config(variant, seq, **kw):
  import transformers

  from bertjax import model as model_lib
  layers, hidden, heads, ffn = model_lib.VARIANTS[variant]
  return transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                 intermediate_size=ffn, max_position_embeddings=max(512, seq), **kw)


def _time_torch(m, lr, examples, batch, steps, warmup, labels_fn, dtype="float32", compile_model=False,
                segments=True):
  """Times full PyTorch train steps (forward, backward, clipping, AdamW) on `batch`-sized slices of `examples`;
  `labels_fn(stacked_batch)` gives the loss's keyword arguments. On a CUDA GPU when PyTorch sees one (parameters
  in float32, bfloat16 autocast when `dtype` is bfloat16, as bertjax computes), else on all CPU cores.
  `compile_model`: the model's forward (and so its backward) through `torch.compile`; every batch has the same
  shape, so it compiles once, in the first warm-up step, whose time is returned as `compile_s`."""
  import torch
  import transformers
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.set_num_threads(os.cpu_count() or 1)
  if len(examples) < (warmup + steps) * batch:
    raise ValueError("not enough examples for the peer")
  m = m.to(device)
  params = list(m.parameters())
  if compile_model:
    torch.compiler.reset()  # each row times its own compile, none cached
    m = torch.compile(m, dynamic=False)
  opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                          fused=device == "cuda")
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  times, tokens, first = [], [], 0.0
  for i in range(warmup + steps):
    b = stack(examples[i * batch:(i + 1) * batch])
    args = dict(input_ids=torch.tensor(b["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(b["input_mask"], dtype=torch.long),
                **{k: torch.tensor(v) for k, v in labels_fn(b).items()})
    if segments:
      args["token_type_ids"] = torch.tensor(b["segment_ids"], dtype=torch.long)
    args = {k: v.to(device) for k, v in args.items()}
    sync()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with autocast:
      loss = m(**args).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sync()
    if i == 0:
      first = time.perf_counter() - t
    if i >= warmup:
      times.append(time.perf_counter() - t)
      tokens.append(float(b["input_mask"].sum()))
  step = statistics.median(times)
  where = torch.cuda.get_device_name() if device == "cuda" else f"{torch.get_num_threads()} threads"
  return {"step_time_s": step, "tokens_per_s": statistics.median(tokens) / step, "sequences_per_s": batch / step,
          "compile_s": max(first - step, 0.0) if compile_model else None, "version": transformers.__version__,
          "torch": torch.__version__, "where": where}


def _release_torch_memory():
  import gc

  import torch
  gc.collect()
  if torch.cuda.is_available():
    torch.cuda.empty_cache()


def run_hf_finetune(variant, seq, batch, steps, examples, dtype="float32", warmup=2, compile_model=False):
  """HF `BertForSequenceClassification`, each example padded to `seq`, AdamW and clipping."""
  import transformers
  m = transformers.BertForSequenceClassification(_hf_config(variant, seq, num_labels=2)).train()
  return _time_torch(m, 2e-5, examples, batch, steps, warmup,
                     lambda b: {"labels": b["next_sentence_labels"].astype(np.int64)}, dtype, compile_model)


def run_hf(variant, seq, batch, preds, steps, examples, dtype="float32", warmup=2, compile_model=False):
  """HF `BertForPreTraining` (MLM over the full sequence with -100 labels off the masked positions, NSP)."""
  del preds  # the peer's MLM head runs over every position; labels select the masked ones
  import transformers
  m = transformers.BertForPreTraining(_hf_config(variant, seq)).train()

  def labels_fn(b):
    return {"labels": _mlm_labels(b), "next_sentence_label": b["next_sentence_labels"].astype(np.int64)}

  return _time_torch(m, 1e-4, examples, batch, steps, warmup, labels_fn, dtype, compile_model)


def _mlm_labels(b):
  labels = np.full(b["input_ids"].shape, -100, np.int64)
  for r in range(len(labels)):
    w = b["masked_lm_weights"][r] > 0
    labels[r, b["masked_lm_positions"][r][w]] = b["masked_lm_ids"][r][w]
  return labels


def run_hf_family(family, variant, seq, batch, steps, examples, dtype="float32", warmup=2, compile_model=False):
  """HF's masked-LM model of the family (`RobertaForMaskedLM`, `ModernBertForMaskedLM`) from the same config
  bertjax trains, through bertjax's own exporter's config.json (the same sizes, activations, window, bases)."""
  import transformers

  from bertjax import convert
  from bertjax import model as model_lib
  c = family_config(family, variant, seq, 0, batch, "dp", "float32")
  cfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  make = convert.FAMILIES[family].config_to_hf
  hf_cfg = transformers.AutoConfig.for_model(**make(cfg))
  m = transformers.AutoModelForMaskedLM.from_config(hf_cfg).train()
  lr = c.train.learning_rate
  return _time_torch(m, lr, examples, batch, steps, warmup, lambda b: {"labels": _mlm_labels(b)}, dtype,
                     compile_model, segments=False)


def run_hf_electra(variant, seq, batch, steps, examples, dtype="float32", warmup=2, compile_model=False):
  """HF's ELECTRA pair as its users pre-train it: ElectraForMaskedLM (generator) and ElectraForPreTraining
  (discriminator) sharing the embeddings, the generator's logits sampled (Gumbel-max, no gradient), the
  discriminator's labels = sampled != original, L = L_gen + 50·L_disc."""
  import torch
  import transformers

  from bertjax import convert
  from bertjax import model as model_lib
  from bertjax.objectives import electra as electra
  c = family_config("electra", variant, seq, 0, batch, "dp", "float32")
  dcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  gcfg = electra.generator_config(dcfg, c.electra.generator_hidden, c.electra.generator_layers)
  make = convert.FAMILIES["electra"].config_to_hf
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**make(dcfg)))
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**make(gcfg, "ElectraForMaskedLM")))
  gen.electra.embeddings = disc.electra.embeddings  # tied, as the paper trains them

  class Pair(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.gen, self.disc = gen, disc

    def forward(self, input_ids, attention_mask, labels, original_ids):
      g = self.gen(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
      masked = labels != -100
      with torch.no_grad():
        noise = -torch.log(-torch.log(torch.rand_like(g.logits) + 1e-9) + 1e-9)
        sampled = torch.argmax(g.logits + noise, dim=-1)
      fake = torch.where(masked, sampled, original_ids)
      d = self.disc(input_ids=fake, attention_mask=attention_mask, labels=(fake != original_ids).long())
      return types.SimpleNamespace(loss=g.loss + 50.0 * d.loss)

  def labels_fn(b):
    original = b["input_ids"].astype(np.int64).copy()
    for r in range(len(original)):
      w = b["masked_lm_weights"][r] > 0
      original[r, b["masked_lm_positions"][r][w]] = b["masked_lm_ids"][r][w]
    return {"labels": _mlm_labels(b), "original_ids": original}

  return _time_torch(Pair().train(), c.train.learning_rate, examples, batch, steps, warmup, labels_fn, dtype,
                     compile_model, segments=False)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--family", default="bert", choices=FAMILIES)
  p.add_argument("--variant", default="base")
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--preds", type=int, default=20)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--shard", default="dp")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--regime", action="append", choices=REGIMES)
  p.add_argument("--peer", action="append", choices=list(PEERS) + ["none"],
                 help="repeatable; the first fills `peer`/`ratio` (default: hf)")
  p.add_argument("--examples", type=int, default=0, help="examples per regime (default: enough for the steps)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="config override for bertjax, e.g. model.attention_impl=cudnn or train.prng_impl=rbg")
  p.add_argument("--profile", default="", help="write a jax.profiler trace of three extra steps to this folder")
  p.add_argument("--out", default="bench.json")
  args = p.parse_args(argv)
  if args.family != "bert" and (args.regime or ["fixed"]) != ["fixed"]:
    p.error(f"--family {args.family} runs the fixed regime only")
  if args.preds == 0:  # derived from the recipe's masking rate, as the data creation derives it
    from bertjax.data.pretraining import examples as pretraining
    args.preds = pretraining.max_predictions(args.seq, family_config(args.family, args.variant, args.seq, 0, 1, "dp",
                                                                     "float32").data.masked_lm_prob)
  # JAX would otherwise take most of a GPU's memory up front, leaving none to the PyTorch peer on the same GPU.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  import jax

  from bertjax.core import accounting
  regimes = args.regime or ["fixed"]
  peers = list(dict.fromkeys(args.peer or ["hf"]))
  if "none" in peers:
    if len(peers) > 1:
      p.error("--peer none cannot be combined with other peers")
    peers = []
  platform = jax.devices()[0].platform

  def cpu_peak():
    return max(accounting.measure_matmul_tflops(n) for n in (1024, 2048, 3072))

  if platform == "cpu":
    # Measured before the first regime and again after each: a row's peak is the best seen up to its end, so a
    # quiet moment at the start of a run on a shared machine cannot shrink the denominator of every later row.
    peak = cpu_peak()
    peak_source = "best jnp.dot float32 on this CPU, this run (before and after the steps)"
  else:
    peak, peak_source = accounting.peak_tflops_per_device()
    measured = accounting.measure_matmul_tflops(8192, repeats=10, dtype=jax.numpy.bfloat16)
    peak_source += f" dense bf16 spec (a bf16 8192^3 jnp.dot measured {measured:.0f} TFLOP/s in this run)"
  if platform != "cpu":  # fake CPU devices share the host's cores: the measured peak is already the machine's
    peak *= jax.device_count()
  rows = []
  for regime in regimes:
    rng = np.random.default_rng(0)
    n = args.examples or (args.steps + 2) * args.batch * (8 if regime != "fixed" else 1)
    examples = make_examples(sample_lengths(regime, n, args.seq, rng), args.seq, args.preds, 30522, rng)
    if args.family != "bert":  # one segment, as these families' MLM-only data has it
      for e in examples:
        e["segment_ids"] = np.zeros_like(e["segment_ids"])
    finetuning = regime == "glue_finetune"
    theirs = {}
    for name in peers if platform in ("cpu", "gpu") else ():  # first, so that its GPU memory is released before ours
      if args.family == "electra":
        run = run_hf_electra
      elif args.family != "bert":
        run = functools.partial(run_hf_family, args.family)
      else:
        run = run_hf_finetune if finetuning else functools.partial(run_hf, preds=args.preds)
      theirs[name] = run(args.variant, args.seq, args.batch, steps=args.steps, examples=examples, dtype=args.dtype,
                         compile_model=PEERS[name])
      _release_torch_memory()
    if finetuning:
      ours = run_bertjax_finetune(args.variant, args.seq, args.batch, args.dtype, args.shard, args.steps, examples,
                                  args.set, args.profile)
    else:
      ours = run_bertjax(args.variant, args.seq, args.batch, args.preds, args.dtype, args.shard, args.steps, regime,
                         [dict(e) for e in examples], args.set, args.profile, family=args.family)
    if platform == "cpu":
      peak = max(peak, cpu_peak())
    row = {"config": " ".join([args.family, args.variant, f"seq {args.seq} batch {args.batch}", args.dtype,
                               args.shard, regime, *args.set]), "family": args.family,
           "regime": regime, "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
           "tokens_per_s": ours["tokens_per_s"], "sequences_per_s": ours["sequences_per_s"],
           "step_time_s": ours["step_time_s"], "compile_s": ours["compile_s"],
           "model_tflops_per_s": ours["model_flops_per_step"] / ours["step_time_s"] / 1e12,
           "matmul_peak_tflops_per_s": peak, "peak_source": peak_source}
    row["mfu"] = row["model_tflops_per_s"] / peak
    row["peer"] = None
    row["peer_tokens_per_s"] = None
    row["ratio"] = None
    row["peers"] = []
    head = "BertForSequenceClassification" if finetuning else "BertForPreTraining"
    if args.family != "bert":
      head = {"roberta": "RobertaForMaskedLM", "modernbert": "ModernBertForMaskedLM",
              "electra": "ElectraForMaskedLM + ElectraForPreTraining"}[args.family]
    for name, t in theirs.items():
      mode = "torch.compile" if PEERS[name] else "eager"
      row["peers"].append({"name": name, "peer": f"HF transformers {t['version']} {head} (PyTorch {t['torch']} "
                                                 f"{mode}, {t['where']}, padded)",
                           "tokens_per_s": t["tokens_per_s"], "sequences_per_s": t["sequences_per_s"],
                           "step_time_s": t["step_time_s"], "compile_s": t["compile_s"],
                           "ratio": row["tokens_per_s"] / t["tokens_per_s"]})
    if row["peers"]:
      first = row["peers"][0]
      row.update(peer=first["peer"], peer_tokens_per_s=first["tokens_per_s"],
                 peer_sequences_per_s=first["sequences_per_s"], peer_step_time_s=first["step_time_s"],
                 ratio=first["ratio"])
    rows.append(row)
    print(json.dumps(row), flush=True)
  print(f"\nmachine: {machine.describe()}")
  print(f"{'regime':13s} {'tok/s':>9s} {'seq/s':>8s} {'step s':>8s} {'compile s':>9s} {'TFLOP/s':>8s} {'peak':>7s} "
        f"{'MFU':>6s} {'peer tok/s':>10s} {'ratio':>6s}")
  for r in rows:
    peer = f"{r['peer_tokens_per_s']:10.0f}" if r["peer_tokens_per_s"] else f"{'-':>10s}"
    ratio = f"{r['ratio']:6.2f}" if r["ratio"] else f"{'-':>6s}"
    print(f"{r['regime']:13s} {r['tokens_per_s']:9.0f} {r['sequences_per_s']:8.1f} {r['step_time_s']:8.3f} "
          f"{r['compile_s']:9.1f} "
          f"{r['model_tflops_per_s']:8.3f} {r['matmul_peak_tflops_per_s']:7.3f} {r['mfu']:6.2f} {peer} {ratio}")
  extra = [(r["regime"], q) for r in rows for q in r["peers"][1:]]
  if extra:
    print(f"\n{'regime':13s} {'other peer':12s} {'tok/s':>9s} {'step s':>8s} {'compile s':>9s} {'ratio':>6s}")
    for regime, q in extra:
      comp = f"{q['compile_s']:9.1f}" if q["compile_s"] is not None else f"{'-':>9s}"
      print(f"{regime:13s} {q['name']:12s} {q['tokens_per_s']:9.0f} {q['step_time_s']:8.3f} {comp} {q['ratio']:6.2f}")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp(rows), f, indent=2)


if __name__ == "__main__":
  main()
