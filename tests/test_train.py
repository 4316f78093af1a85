"""Training on 8 fake CPU devices: sharded steps equal single-device ones, resume is exact, errors are clear."""
import functools
import json
import os
import signal
import subprocess
import time

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
import pytest
from helpers import ROOT, env, main_cmd, small_config

from bertjax import errors, predict
from bertjax import model as model_lib
from bertjax import pretrain as train
from bertjax.core import accounting, optim, trainer
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import writers as metrics
from bertjax.data.pretraining import dataset
from bertjax.objectives import mlm as mlm_objective
from configs import common, pretrain


def fixed_batches(n=3, b=16, seq=32, preds=5, vocab=128, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    ids = rng.integers(5, vocab, (b, seq)).astype(np.int32)
    mask = (np.arange(seq)[None] < rng.integers(10, seq + 1, (b, 1))).astype(np.int32)
    out.append({"input_ids": ids * mask, "input_mask": mask, "segment_ids": (np.arange(seq)[None] > 6) * mask,
                "masked_lm_positions": np.sort(rng.choice(np.arange(1, 10), (b, preds)), 1).astype(np.int32),
                "masked_lm_ids": rng.integers(5, vocab, (b, preds)).astype(np.int32),
                "masked_lm_weights": (rng.random((b, preds)) < 0.8).astype(np.float32),
                "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32),
                "next_sentence_weights": np.ones((b,), np.float32)})
  return out


def run_steps(config, devices, batches):
  mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
  run = train.build(config, mcfg, devices)
  state = trainer.init_state(run, 0)
  losses = []
  from bertjax.core import sharding as sharding_lib
  with sharding_lib.use_mesh(run.mesh, run.rules):
    for b in batches:
      state, m = run.train_step(state, jax.device_put(b, run.batch_sharding))
      losses.append(float(m["loss"]))
  return losses, state, run


@functools.lru_cache(maxsize=None)
def single_device_run(modern_switches: bool = False, repeated: bool = False):
  """(losses, parameters) on one device, shard=dp, of the default fixed batches (or, `repeated`, five steps of the
  first one): the reference runs other tests compare with, computed once per test process."""
  c = small_config(shard="dp")
  batches = fixed_batches(1) * 5 if repeated else fixed_batches()
  losses, state, _ = run_steps(modern(c) if modern_switches else c, jax.devices()[:1], batches)
  return losses, jax.device_get(state.params)


MODERN = dict(position_embedding="rotary", rope_theta=160000.0, rope_theta_local=10000.0, local_attention=8,
              global_every=2, ffn="glu", layer_norm="pre", norm_bias=False, use_bias=False,
              first_attention_norm=False, type_vocab_size=0, vocab_multiple=64, nsp_head=False)


def modern(c, **more):
  """ModernBERT's switches (rotary, local/global, GeGLU, pre-norm, no biases, padded vocabulary, MLM only) on
  a small config."""
  for k, v in {**MODERN, **more}.items():
    c.model[k] = v
  c.train.use_nsp = False
  return c


@pytest.mark.parametrize("shard", [pytest.param("fsdp", marks=pytest.mark.slow), "dp_tp"])
def test_sharded_step_with_modern_switches_equals_single_device(shard):
  single, single_params = single_device_run(modern_switches=True)
  losses, state, _ = run_steps(modern(small_config(shard=shard)), jax.devices(), fixed_batches())
  np.testing.assert_allclose(losses, single, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5),
                         state.params, single_params)


@pytest.mark.parametrize("shard,mesh", [pytest.param("dp", (8, 1, 1), marks=pytest.mark.slow), ("fsdp", (1, 8, 1)),
                                        pytest.param("dp_tp", (2, 1, 4), marks=pytest.mark.slow)])
def test_sharded_step_equals_single_device(shard, mesh):
  single, single_params = single_device_run()
  config = small_config(shard=shard)
  losses, state, run = run_steps(config, jax.devices(), fixed_batches())
  assert dict(run.mesh.shape) == dict(zip(("data", "fsdp", "tensor"), mesh))
  np.testing.assert_allclose(losses, single, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5),
                         state.params, single_params)
  emb = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  q = state.params["bert"]["encoder"]["layers"]["layer"]["attention"]["query"]["kernel"]  # [L, d, heads, kv]
  mu = state.opt_state[1][0].mu["bert"]["encoder"]["layers"]["layer"]["attention"]["query"]["kernel"]
  shard_shape = lambda x: x.addressable_shards[0].data.shape  # noqa: E731
  if shard == "dp":
    assert shard_shape(emb) == emb.shape
  elif shard == "fsdp":  # `embed` split 8 ways in parameters and optimizer state alike
    assert shard_shape(emb) == (128, 8) and shard_shape(q) == (2, 8, 4, 16) and shard_shape(mu) == (2, 8, 4, 16)
  else:  # heads split 4 ways, replicated over data
    assert shard_shape(q) == (2, 64, 1, 16) and shard_shape(mu) == (2, 64, 1, 16)
    assert shard_shape(emb) == emb.shape


@pytest.mark.slow
def test_one_hot_embeddings_sharded_equal_gather_on_one_device():
  """The GPU lookup (one-hot matmul against a table split over fsdp) trains like the gather on one device."""
  single, _ = single_device_run()
  config = small_config(shard="fsdp")
  config.model.embedding_lookup = "one_hot"
  losses, _, _ = run_steps(config, jax.devices(), fixed_batches())
  np.testing.assert_allclose(losses, single, atol=1e-5)


@pytest.mark.slow
def test_pallas_attention_on_a_mesh():
  """The fused kernel per device block (shard_map): without dropout dp 8 and dp 2 x tensor 4 train like the xla
  path on one device; with dropout, dp 8 and fsdp 8 draw the same masks (the same blocks, in the same order)."""
  batches = fixed_batches(n=2)
  c = small_config(shard="dp")
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  single, _, _ = run_steps(c, jax.devices()[:1], batches)
  noise = 0.0
  for shard in ("dp", "dp_tp"):
    c = small_config(shard=shard)
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    c.model.attention_impl = "pallas"
    losses = run_steps(c, jax.devices(), batches)[0]
    np.testing.assert_allclose(losses, single, atol=1e-5)
    noise = max(noise, np.abs(np.subtract(losses, single)).max())
  with_dropout = {}
  for shard in ("dp", "fsdp"):
    c = small_config(shard=shard)
    c.model.dropout_rate, c.model.attention_dropout_rate = 0.0, 0.5  # large, so that its effect shows at init
    c.model.attention_impl = "pallas"
    with_dropout[shard] = run_steps(c, jax.devices(), batches)[0]
  np.testing.assert_allclose(with_dropout["dp"], with_dropout["fsdp"], atol=1e-5)
  # attention dropout did act: far beyond the rounding between meshes (its effect on the loss is small at init)
  assert np.abs(np.subtract(with_dropout["dp"], single)).max() > max(20 * noise, 1e-6)


@pytest.mark.slow
def test_splash_attention_on_a_mesh():
  """The TPU kernel per device block (shard_map, Pallas interpreter here): dp 8 and dp 2 x tensor 4 (heads split)
  train like the xla path on one device, attention dropout off as the kernel has none."""
  batches = fixed_batches(n=2)
  c = small_config(shard="dp")
  c.model.attention_dropout_rate = 0.0
  single, _, _ = run_steps(c, jax.devices()[:1], batches)
  for shard in ("dp", "dp_tp"):
    c = small_config(shard=shard)
    c.model.attention_dropout_rate = 0.0
    c.model.attention_impl = "splash"
    np.testing.assert_allclose(run_steps(c, jax.devices(), batches)[0], single, atol=1e-5)


def test_gradient_accumulation_equals_the_full_batch():
  batches = fixed_batches(2)
  c1 = small_config()
  c2 = small_config(grad_accum_steps=4)
  for c in (c1, c2):
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0
  l1, s1, _ = run_steps(c1, jax.devices(), batches)
  l2, s2, _ = run_steps(c2, jax.devices(), batches)
  np.testing.assert_allclose(l1, l2, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5),
                         s1.params, s2.params)


def test_the_mlm_loss_a_researcher_edits_is_the_one_training_runs(monkeypatch):
  """`mlm.mlm_losses` is the documented hook for the MLM loss: doubling it doubles the MLM term of the loss the
  train step reports and moves its gradient (an edit that training ignored would leave both as they were)."""
  from bertjax.core import sharding as sharding_lib
  batch = fixed_batches(1)[0]
  c = small_config()
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())

  def step():
    run = train.build(c, mcfg, jax.devices()[:1])
    with sharding_lib.use_mesh(run.mesh, run.rules):
      _, m = run.train_step(trainer.init_state(run, 0), jax.device_put(batch, run.batch_sharding))
    return jax.device_get(m), run
  base, _ = step()
  monkeypatch.setattr(mlm_objective, "mlm_losses", lambda logits, ids: 2.0 * mlm_objective.losses.cross_entropy(
      logits, ids))
  doubled, run = step()
  assert float(doubled["mlm_loss"]) == pytest.approx(2 * float(base["mlm_loss"]), rel=1e-5)
  assert float(doubled["loss"]) == pytest.approx(float(base["loss"]) + float(base["mlm_loss"]), rel=1e-5)
  assert abs(float(doubled["grad_norm"]) - float(base["grad_norm"])) > 0.1 * float(base["grad_norm"])



@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_accuracy_counts_what_numpy_argmax_counts_ties_included(dtype):
  """The MLM accuracy's `is_argmax` equals NumPy's argmax == label, the first maximum winning a tie, on logits
  made of a few integers (ties in most rows, as bfloat16 logits of a large vocabulary have)."""
  from bertjax.core import losses
  rng = np.random.default_rng(0)
  logits = rng.integers(-2, 3, (64, 5, 9)).astype(np.float32)
  labels = rng.integers(0, 9, (64, 5))
  want = np.argmax(logits, -1) == labels
  got = np.asarray(losses.is_argmax(jax.numpy.asarray(logits, dtype), jax.numpy.asarray(labels)))
  assert 0.05 < want.mean() < 0.5 and (logits == logits.max(-1, keepdims=True)).sum(-1).max() > 1
  np.testing.assert_array_equal(got, want)

def test_a_new_objective_is_one_module_and_a_registry_line(monkeypatch):
  """docs/architecture.md's worked objective (masked-LM without NSP, accumulating in the core) registered by one
  line trains what the MLM objective with train.use_nsp=False trains, with and without micro-batches."""
  from bertjax import objectives
  from bertjax.objectives import base

  def train_step(model, tx, lr_fn, config):
    def step_fn(state, batch):
      rng = base.dropout_key(config, state.step)
      whole = batch["masked_lm_weights"].sum() + 1e-5

      def loss_fn(params, micro, i):
        out = model.apply({"params": params}, micro, deterministic=False,
                          rngs={"dropout": jax.random.fold_in(rng, i)})
        sums = mlm_objective.pretraining_sums(out, micro)
        return sums["mlm_loss_sum"] / whole, sums

      grads, sums = trainer.accumulate(jax.value_and_grad(loss_fn, has_aux=True), state.params, batch,
                                       config.train.grad_accum_steps)
      return base.apply_gradients(state, grads, mlm_objective.from_sums(sums, use_nsp=False)[1], tx, lr_fn, batch)
    return step_fn

  example = base.Objective("mlm_only", lambda config, mcfg: [], mlm_objective.module, train_step,
                           mlm_objective.eval_step, lambda sums, config: mlm_objective.from_sums(sums, False)[1],
                           mlm_objective.step_flops)
  monkeypatch.setitem(objectives.REGISTRY, "mlm_only", example)
  batches = fixed_batches(2)
  for accum in (1, 2):
    ours, theirs = small_config(grad_accum_steps=accum), small_config(grad_accum_steps=accum, use_nsp=False)
    for c in (ours, theirs):
      c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    ours.objective = "mlm_only"
    np.testing.assert_allclose(run_steps(ours, jax.devices()[:1], batches)[0],
                               run_steps(theirs, jax.devices()[:1], batches)[0], rtol=1e-6)


def test_schedule_and_decay_mask_follow_the_original():
  f = optim.schedule(1.0, warmup_steps=10, num_steps=100)
  for step, want in ((0, 0.0), (5, 0.5), (10, 0.9), (55, 0.45), (100, 0.0)):
    assert abs(float(f(step)) - want) < 1e-6, step
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=50, scan_layers=True)
  params = jax.eval_shape(lambda: model_lib.BertForPreTraining(cfg).init(jax.random.key(0),
                                                                         model_lib.dummy_batch(cfg))["params"])
  mask = optim.decay_mask(params)
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
  decayed = sorted(k for k, v in flat.items() if v)
  assert all("kernel" in k or "embedding" in k for k in decayed)
  assert not any("_ln" in k or "'ln'" in k or "bias" in k for k in decayed)
  assert any("word_embeddings" in k for k in decayed)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("clip", [0.0, 0.25])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_adamw_step_matches_a_numpy_adamw(fused, clip, bias_correction):
  """Three AdamW steps, decoupled decay lr·wd·θ on a masked tree and (clip > 0) clipping by global norm (the
  gradients' norm is 1.52, so 0.25 clips), by hand in float64: with bias correction as PyTorch/optax have it,
  and without, transcribed from the original's AdamWeightDecayOptimizer.apply_gradients:
    next_m = β1·m + (1 − β1)·g;  next_v = β2·v + (1 − β2)·g²;  update = next_m / (√next_v + ε) (+ wd·θ);
    θ ← θ − lr·update."""
  c = small_config(grad_clip_norm=clip, fused_update=fused, adam_bias_correction=bias_correction)
  tx, lr = optim.make(c.train)
  params = {"w": np.array([1.0, -2.0, 3.0], np.float32), "bias": np.array([0.5, 0.5], np.float32)}
  grads = {"w": np.array([0.1, 0.2, -0.3], np.float32), "bias": np.array([1.0, -1.0], np.float32)}
  state = tx.init(params)
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  # NumPy reference
  p = {"w": np.array([1.0, -2.0, 3.0]), "bias": np.array([0.5, 0.5])}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
  scale = min(1.0, clip / norm) if clip else 1.0
  assert (scale < 1.0) == bool(clip)
  for t in range(3):
    rate = 1e-3 * t / 2 if t < 2 else 1e-3 * (1 - t / 6)  # warmup 2, 6 steps: written out, not from optim
    assert abs(float(lr(t)) - rate) < 1e-9
    for k in p:
      g = grads[k].astype(np.float64) * scale
      m[k] = 0.9 * m[k] + 0.1 * g
      v[k] = 0.999 * v[k] + 0.001 * g * g
      if bias_correction:
        mh, vh = m[k] / (1 - 0.9 ** (t + 1)), v[k] / (1 - 0.999 ** (t + 1))
      else:
        mh, vh = m[k], v[k]
      upd = mh / (np.sqrt(vh) + 1e-6) + (0.01 * p[k] if k == "w" else 0.0)
      p[k] = p[k] - rate * upd
  for k in p:
    np.testing.assert_allclose(params[k], p[k], rtol=1e-5, atol=1e-7)


def test_lamb_matches_the_reference_lamb_in_numpy():
  """LAMB as TF-Addons' and NVIDIA's reference (bias-corrected Adam, decoupled decay, trust ratio ‖θ‖/‖u‖ per
  parameter), LayerNorm and biases excluded from the trust ratio as from weight decay: against the published rule
  in NumPy, and against optax's LAMB and Adam on the parameters each rule covers."""
  c = small_config(optimizer="lamb", grad_clip_norm=0.0, weight_decay=0.01)
  tx, lr = optim.make(c.train)
  params = {"w": np.array([[1.0, -2.0], [3.0, 0.5]], np.float32), "bias": np.array([0.5, 0.25], np.float32),
            "ln": {"scale": np.array([1.0, 1.0], np.float32)}}
  grads = {"w": np.array([[0.1, 0.2], [-0.3, 0.05]], np.float32), "bias": np.array([1.0, -1.0], np.float32),
           "ln": {"scale": np.array([0.3, -0.2], np.float32)}}
  state = tx.init(params)
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  flat = lambda t: {"w": t["w"], "bias": t["bias"], "scale": t["ln"]["scale"]}  # noqa: E731
  p = {k: np.asarray(v, np.float64) for k, v in flat({"w": np.array([[1.0, -2.0], [3.0, 0.5]]),
                                                      "bias": np.array([0.5, 0.25]),
                                                      "ln": {"scale": np.array([1.0, 1.0])}}).items()}
  g = {k: np.asarray(v, np.float64) for k, v in flat(grads).items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  for t in range(3):
    rate = float(lr(t))
    for k in p:
      m[k] = 0.9 * m[k] + 0.1 * g[k]
      v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
      u = (m[k] / (1 - 0.9 ** (t + 1))) / (np.sqrt(v[k] / (1 - 0.999 ** (t + 1))) + 1e-6)
      if k == "w":  # decayed and layer-adapted; bias and LayerNorm scale neither
        u = u + 0.01 * p[k]
        wn, un = np.linalg.norm(p[k]), np.linalg.norm(u)
        u = u * (wn / un if wn > 0 and un > 0 else 1.0)
      p[k] = p[k] - rate * u
  for k, want in p.items():
    np.testing.assert_allclose(flat(params)[k], want, rtol=1e-5, atol=1e-7)
  # Against kept implementations: the decayed weight takes optax.lamb's step, the bias and LayerNorm scale (trust
  # ratio 1 in the reference) optax.adam's; optax.lamb alone scales those two as well, a different result.
  start = {"w": np.array([[1.0, -2.0], [3.0, 0.5]], np.float32), "bias": np.array([0.5, 0.25], np.float32),
           "ln": {"scale": np.ones(2, np.float32)}}

  def run(ref):
    st, q = ref.init(start), start
    for _ in range(3):
      u, st = ref.update(grads, st, q)
      q = optax.apply_updates(q, u)
    return q
  by_lamb = run(optax.lamb(lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=optim.decay_mask))
  by_adam = run(optax.adam(lr, b1=0.9, b2=0.999, eps=1e-6))
  np.testing.assert_allclose(params["w"], by_lamb["w"], rtol=1e-6)
  np.testing.assert_allclose(params["bias"], by_adam["bias"], rtol=1e-6)
  np.testing.assert_allclose(params["ln"]["scale"], by_adam["ln"]["scale"], rtol=1e-6)
  assert not np.allclose(np.asarray(by_lamb["bias"]), p["bias"], rtol=1e-3)


@pytest.mark.slow
def test_fused_update_equals_optax_chain_on_bert():
  """`train.fused_update` against optax's chain(clip_by_global_norm, adamw) on a BERT's real gradients: the same
  state tree (a checkpoint of one restores into the other) and the same parameters and moments after five steps,
  clipping active in some steps and not in others."""
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=128, hidden_size=64, num_heads=4, intermediate_size=128)
  module = model_lib.BertForPreTraining(cfg)
  batch = model_lib.dummy_batch(cfg, 4, 16, 3)
  rng = np.random.default_rng(0)
  batch["input_ids"] = rng.integers(0, 128, batch["input_ids"].shape).astype(np.int32)
  batch["masked_lm_ids"] = rng.integers(0, 128, batch["masked_lm_ids"].shape).astype(np.int32)
  batch["masked_lm_weights"] = np.ones_like(batch["masked_lm_weights"])
  params0 = nn.meta.unbox(module.init(jax.random.key(0), batch)["params"])
  grad_fn = jax.jit(jax.grad(
      lambda p, s: mlm_objective.pretraining_loss(module.apply({"params": p}, batch), batch)[0] * s))
  results = {}
  for fused in (True, False):
    c = small_config(fused_update=fused)
    c.train.grad_clip_norm = 2.0
    tx, _ = optim.make(c.train)
    params, state, norms = params0, tx.init(params0), []
    update = jax.jit(tx.update)
    for s in (1.0, 30.0, 0.1, 50.0, 1.0):  # gradient scales: norms below and above 2.0
      g = grad_fn(params, s)
      norms.append(float(optax.global_norm(g)))
      u, state = update(g, state, params)
      params = optax.apply_updates(params, u)
    results[fused] = (params, state, norms)
  assert min(results[True][2]) < 2.0 < max(results[True][2])
  assert jax.tree_util.tree_structure(results[True][1]) == jax.tree_util.tree_structure(results[False][1])
  for a, b in ((results[True][0], results[False][0]), (results[True][1], results[False][1])):
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5,
                                                                   atol=1e-7), a, b)


# ------------------------------------------------------------------ validation before compiling
def test_config_validation_errors(data_dir):
  creation = dataset.read_creation(data_dir)
  bad = small_config(data_dir)
  bad.model.num_heads = 3
  with pytest.raises(train.ConfigError, match="not divisible by num_heads 3"):
    train.validate(bad, 8, creation)
  bad = small_config(data_dir)
  bad.train.global_batch_size = 12
  with pytest.raises(train.ConfigError, match="micro-batch 12 .* not divisible by the data-parallel size 8"):
    train.validate(bad, 8, creation)
  bad = small_config(data_dir)
  bad.sharding.mesh_shape = (2, 2, 1)
  with pytest.raises(train.ConfigError, match=r"mesh_shape \(2, 2, 1\) has 4 devices but there are 8"):
    train.validate(bad, 8, creation)
  bad = small_config(data_dir)
  bad.data.max_seq_length = 128
  with pytest.raises(train.ConfigError, match="max_seq_length 128 exceeds model.max_position_embeddings 64"):
    train.validate(bad, 8, creation)
  bad = small_config(data_dir)
  bad.model.vocab_size = 30522
  with pytest.raises(train.ConfigError, match="vocab_size 30522 does not match the data's tokenizer vocabulary"):
    train.validate(bad, 8, creation)
  bad = small_config(data_dir)
  bad.train.prng_impl = "philox"
  with pytest.raises(train.ConfigError, match="train.prng_impl 'philox' is not one of"):
    train.validate(bad, 8, creation)
  bad = small_config(data_dir, shard="dp_tp")
  bad.model.num_heads = 2
  with pytest.raises(train.ConfigError, match="num_heads 2 cannot be split"):
    train.validate(bad, 8, creation)
  with pytest.raises(ValueError, match="unknown sharding preset 'zero3'"):
    pretrain.get_config("shard=zero3")
  with pytest.raises(ValueError, match="unknown config argument 'varient'"):
    pretrain.get_config("varient=base")
  with pytest.raises(ValueError, match="seq='long' is not of type int"):
    pretrain.get_config("seq=long")
  with pytest.raises(AttributeError):
    small_config().train.learnin_rate = 1.0  # locked: a typo is an error


def test_config_overrides_are_typed_and_checked():
  c = common.override(small_config(), ["model.attention_impl=cudnn", "train.learning_rate=2e-4",
                                       "train.use_nsp=false", "data.packing=True", "train.grad_accum_steps=2"])
  assert (c.model.attention_impl, c.train.learning_rate, c.train.use_nsp, c.data.packing,
          c.train.grad_accum_steps) == ("cudnn", 2e-4, False, True, 2)
  for item, msg in (("model.nope=1", "no such config field"), ("x.y=1", "no such config section 'x'"),
                    ("train.learning_rate=fast", "train.learning_rate='fast' is not of type float"),
                    ("train.use_nsp=maybe", "is not of type bool"), ("learning_rate", "is not key=value")):
    with pytest.raises(ValueError, match=msg):
      common.override(small_config(), [item])


@pytest.mark.slow
def test_prng_impl_switch_changes_only_the_dropout_bits():
  """rbg dropout bits: deterministic run to run, different masks from threefry's, the same loss without dropout."""
  batches = fixed_batches(n=2)
  runs = {("threefry2x32", 0.1): [single_device_run()[0][:2]]}  # the default config: threefry, dropout 0.1
  for impl, rate in (("rbg", 0.1), ("rbg", 0.1), ("threefry2x32", 0.0), ("rbg", 0.0)):
    c = small_config(prng_impl=impl)
    c.model.dropout_rate = c.model.attention_dropout_rate = rate
    runs.setdefault((impl, rate), []).append(run_steps(c, jax.devices()[:1], batches)[0])
  assert runs[("rbg", 0.1)][0] == runs[("rbg", 0.1)][1]
  assert abs(runs[("rbg", 0.1)][0][0] - runs[("threefry2x32", 0.1)][0][0]) > 1e-6
  np.testing.assert_allclose(runs[("rbg", 0.0)][0], runs[("threefry2x32", 0.0)][0], rtol=1e-6)


def test_every_ablation_switch_builds():
  """Each config argument sets the field it names (and only a valid model and optimizer come of it)."""
  switches = {"ln=pre": ("model.layer_norm", "pre"), "act=relu": ("model.hidden_act", "relu"),
              "pos=sinusoidal": ("model.position_embedding", "sinusoidal"), "nsp=False": ("train.use_nsp", False),
              "mask=0.2": ("data.masked_lm_prob", 0.2), "wwm=True": ("data.whole_word_mask", True),
              "dynamic=True": ("data.dynamic_masking", True), "opt=lamb": ("train.optimizer", "lamb"),
              "dtype=bfloat16": ("model.dtype", "bfloat16"), "remat=full": ("model.remat", "full"),
              "scan=False": ("model.scan_layers", False), "shard=fsdp_tp": ("sharding.preset", "fsdp_tp")}
  base = pretrain.get_config("variant=tiny")
  for arg, (field, value) in switches.items():
    c = pretrain.get_config("variant=tiny," + arg)
    section, name = field.split(".")
    got = c[section][name]
    assert got == value and base[section][name] != value, (arg, got, base[section][name])
    model_lib.BertConfig.from_dict(c.model.to_dict())
    optim.make(c.train)



# ------------------------------------------------------------------ the loop: resume, meshes, signals, NaN
def run_loop(config, workdir):
  summary = train.train_and_evaluate(config, str(workdir))
  return summary, [r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["split"] == "train"]


def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, data_dir):
  full, full_rows = run_loop(small_config(data_dir), tmp_path / "full")
  c = small_config(data_dir, stop_after_steps=3)
  part, _ = run_loop(c, tmp_path / "resumed")
  assert part["preempted"] and part["final_step"] == 3
  c = small_config(data_dir)
  resumed, rows = run_loop(c, tmp_path / "resumed")
  assert resumed["start_step"] == 3 and resumed["final_step"] == 6
  a = {r["step"]: r["loss"] for r in full_rows}
  b = {r["step"]: r["loss"] for r in rows}
  assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]  # identical, data position included
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         full["state"].params, resumed["state"].params)  # bitwise equal


def test_restore_on_a_different_mesh(tmp_path, data_dir):
  c = small_config(data_dir, shard="dp")
  first, _ = run_loop(c, tmp_path / "w")
  c = small_config(data_dir, shard="fsdp")
  c.train.num_steps = 7
  c.checkpoint_every = 100
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path / "w"))
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  run = train.build(c, mcfg)
  assert (mcfg.scan_unroll, run.module.cfg.scan_unroll) == (0, 2)  # the configs' auto: both layers per step on CPU
  state, data_state, step = ckpt.restore(run.abstract)
  assert step == 6 and data_state["step"] == 6
  emb = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert emb.addressable_shards[0].data.shape == (emb.shape[0], 8)  # now split 8 ways on `embed`
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         first["state"].params, state.params)


def test_checkpoint_of_another_model_is_refused(tmp_path, data_dir):
  run_loop(small_config(data_dir), tmp_path / "w")
  c = small_config(data_dir)
  c.model.intermediate_size = 256
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  params = train.load_init_params(str(tmp_path / "w"), mcfg)
  run = train.build(c, mcfg)
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"wi.*kernel.*checkpoint \(2, 64, 128\), model \(2, 64, 256\)"):
    checkpoint_lib.check_params_fit(params, run.abstract.params)


def test_init_from_hf_checkpoint(tmp_path, data_dir):
  from bertjax import convert
  c = small_config(data_dir)
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  params = jax.device_get(trainer.init_state(train.build(c, mcfg), 5).params)
  convert.to_hf(mcfg, params, str(tmp_path / "hf"))
  c.init_checkpoint = str(tmp_path / "hf")
  c.train.num_steps = 1
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  summary, _ = run_loop(c, tmp_path / "w")
  # The first step's learning rate is 0 (warmup starts there): after it every parameter is still the HF
  # folder's, and none is the fresh init the run's own seed would have drawn.
  fresh = jax.device_get(trainer.init_state(train.build(c, mcfg), c.seed).params)
  after = jax.device_get(summary["state"].params)
  at = lambda tree, path: np.asarray(functools.reduce(lambda t, k: t[k.key], path, tree))  # noqa: E731
  for path, value in jax.tree_util.tree_leaves_with_path(params):
    np.testing.assert_array_equal(at(after, path), np.asarray(value), err_msg=jax.tree_util.keystr(path))
    if np.asarray(value).std() > 0:
      assert not np.array_equal(at(fresh, path), np.asarray(value)), jax.tree_util.keystr(path)


def test_an_init_is_fitted_to_the_model_head_by_head_and_refused_without_its_whole_encoder():
  """fit_init_params on trees of shapes: heads the checkpoint lacks are announced as fresh, heads the model lacks
  as left out; an encoder part missing or of another shape is a CheckpointError naming it."""
  a = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)  # noqa: E731
  z = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
  model = {"bert": {"embeddings": {"w": a(8, 4)}, "encoder": {"k": a(4, 4)}, "pooler": {"k": a(4, 4)}},
           "mlm_bias": a(8), "nsp": {"k": a(4, 2)}}
  said = []
  # BertForMaskedLM's tree continued with NSP: no pooler, no NSP head; an extra head is left out.
  init = {"bert": {"embeddings": {"w": z(8, 4)}, "encoder": {"k": z(4, 4)}}, "mlm_bias": z(8), "sop": {"k": z(4, 2)}}
  out = train.fit_init_params(init, model, "CKPT", announce=said.append)
  assert sorted(out) == ["bert", "mlm_bias"] and sorted(out["bert"]) == ["embeddings", "encoder"]
  assert said == ["init_checkpoint CKPT: has no NSP head, pooler: drawn fresh",
                  "init_checkpoint CKPT: its sop is not in this model: left out"]
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"CKPT: its encoder lacks \['encoder'\]"):
    train.fit_init_params({"bert": {"embeddings": {"w": z(8, 4)}}}, model, "CKPT", announce=said.append)
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"\['bert'\]\['encoder'\]\['k'\]: checkpoint \(4, 3\)"):
    train.fit_init_params({"bert": {"embeddings": {"w": z(8, 4)}, "encoder": {"k": z(4, 3)}}}, model, "CKPT",
                          announce=said.append)


@pytest.mark.slow
def test_continued_pretraining_from_an_hf_encoder_draws_its_heads_and_resumes_exactly(tmp_path, data_dir, capsys):
  """An HF encoder without heads (BertModel) continues pre-training through configs/continued.py (the model is the
  folder's architecture): the MLM and NSP heads and the pooler are drawn fresh and said so; stopped and resumed
  it equals the uninterrupted run bit for bit."""
  from bertjax import convert
  c = small_config(data_dir)
  mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  params = jax.device_get(trainer.init_state(train.build(c, mcfg), 5).params)
  convert.to_hf(mcfg, {k: v for k, v in params["bert"].items() if k != "pooler"}, str(tmp_path / "hf"),
                head="encoder")

  def config(**train_kw):  # configs/continued.py on the test's data (NSP pairs, 5 predictions, 6 steps)
    from configs import continued
    cc = continued.get_config(f"init={tmp_path / 'hf'},seq=32,batch=16,steps=6,nsp=True")
    cc.data.data_dir, cc.data.example_mode, cc.data.prefetch = data_dir, "nsp_pairs", 0
    cc.log_every, cc.eval_every, cc.eval_batches, cc.checkpoint_every = 1, 3, 2, 3
    for k, v in train_kw.items():
      cc.train[k] = v
    return cc
  cc = config()
  assert model_lib.BertConfig.from_dict(cc.model.to_dict()) == mcfg.replace(scan_layers=cc.model.scan_layers)
  full, full_rows = run_loop(cc, tmp_path / "full")
  assert "has no MLM head, NSP head, pooler: drawn fresh" in capsys.readouterr().out
  run_loop(config(stop_after_steps=3), tmp_path / "resumed")
  resumed, rows = run_loop(config(), tmp_path / "resumed")
  assert resumed["start_step"] == 3 and resumed["final_step"] == 6
  assert {r["step"]: r["loss"] for r in full_rows} == {r["step"]: r["loss"] for r in rows}
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         full["state"].params, resumed["state"].params)


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):
  c = small_config(data_dir, stop_after_steps=3)
  run_loop(c, tmp_path / "w")
  c = small_config(data_dir, learning_rate=1e30)
  with pytest.raises(errors.NonFiniteError, match="non-finite loss or gradient at step [4-6]"):
    run_loop(c, tmp_path / "w")
  assert checkpoint_lib.Checkpointer(str(tmp_path / "w")).steps() == [3]


@pytest.mark.slow
@pytest.mark.ci
def test_main_entry_point_end_to_end(tmp_path, data_dir):
  w = tmp_path / "w"
  cmd = main_cmd("variant=tiny,seq=32,preds=5,batch=16,steps=4,shard=fsdp", w, data_dir,
                 "--config.log_every=2", "--config.eval_every=2", "--config.checkpoint_every=2",
                 "--config.eval_batches=1")
  out = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "step 4/4" in out.stdout and "done at step 4" in out.stdout
  assert sorted(os.listdir(w / "checkpoints")) == ["2", "4"]
  rows = metrics.read_jsonl(str(w / "metrics.jsonl"))
  assert {r["split"] for r in rows} == {"train", "eval", "goodput"}
  assert [r["step"] for r in rows if r["split"] == "goodput"] == [2, 4]  # at each log point
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(w / "tensorboard"))
  for png in ("loss.png", "mlm_accuracy.png", "nsp_accuracy.png"):
    assert (w / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert json.loads((w / "config.json").read_text())["train"]["num_steps"] == 4
  module, params, tok = predict.load(str(w))
  (pos, cands), = predict.fill_mask(module, params, tok, "the model reads [MASK] .", 3, 64)
  # HF's fill-mask pipeline on the exported workdir names the same three pieces with the same probabilities.
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  from bertjax.cli import convert as convert_cli
  convert_cli.write(str(w), str(tmp_path / "hf"))
  fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), tokenizer=str(tmp_path / "hf"))
  theirs = fill("the model reads [MASK] .", top_k=3)
  hf_tok = fill.tokenizer
  assert [hf_tok.convert_tokens_to_ids(t) for t, _ in cands] == [r["token"] for r in theirs]
  np.testing.assert_allclose([p for _, p in cands], [r["score"] for r in theirs], atol=1e-4)
  # A typo in an override is an error before anything runs.
  bad = subprocess.run(main_cmd("variant=tiny", w, data_dir, "--config.train.learnin_rate=1"), capture_output=True,
                       text=True, env=env(), timeout=300, cwd=ROOT)
  assert bad.returncode != 0 and "learnin_rate" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.ci), signal.SIGINT],
                         ids=["SIGTERM", "SIGINT"])  # CI runs SIGTERM, what a preempted TPU VM gets
def test_signal_saves_and_exits_cleanly(tmp_path, data_dir, sig):
  w = tmp_path / "w"
  cmd = main_cmd("variant=tiny,seq=32,preds=5,batch=16,steps=100000,shard=dp", w, data_dir,
                 "--config.log_every=1", "--config.checkpoint_every=100000", "--config.eval_every=0")
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
  deadline = time.time() + 300
  for line in proc.stdout:
    if line.startswith("step 3/"):
      break
    assert time.time() < deadline
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  import re
  said = re.search(rf"{sig.name}: saved a checkpoint at step (\d+)", out)
  assert said, out[-2000:]
  steps = checkpoint_lib.Checkpointer(str(w)).steps()
  assert steps == [int(said.group(1))] and steps[0] >= 3  # the step it reports is the step on disk
  # The next start resumes from it.
  out = subprocess.run(main_cmd(f"variant=tiny,seq=32,preds=5,batch=16,steps={steps[0] + 1},shard=dp", w, data_dir,
                                "--config.log_every=1", "--config.eval_every=0"),
                       capture_output=True, text=True, env=env(), timeout=300, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"steps {steps[0]}->{steps[0] + 1}" in out.stdout


def test_periodic_rule():
  assert [s for s in range(1, 11) if metrics.every(s, 4, 10)] == [4, 8, 10]
  assert [s for s in range(1, 4) if metrics.every(s, 0, 3)] == [3]
  assert common.parse_arg("a=1,b=true", a=0, b=False).to_dict() == {"a": 1, "b": True}


def test_cpu_peak_is_shared_by_fake_devices(monkeypatch):
  """One device's jnp.dot already uses every core, so each of the 8 fake CPU devices gets an eighth of it: MFU over
  8 devices is then model FLOP/s over the machine's measured peak, not over 8 times it."""
  monkeypatch.setattr(accounting, "measure_matmul_tflops", lambda *a, **k: 0.4)
  monkeypatch.setattr(accounting, "_MEASURED", {})
  peak, source = accounting.peak_tflops_per_device()
  assert jax.local_device_count() == 8 and peak == pytest.approx(0.05) and "shared by 8" in source
  assert accounting.peak_tflops_per_device(2.5) == (2.5, "configured")


# The default selection trains the modern switches together (bfloat16, remat); the others run with -m slow (LAMB's
# update is checked against NumPy, bfloat16's float32 islands in test_bfloat16_keeps_logits_softmax_and_losses_...).
@pytest.mark.parametrize("switch", [pytest.param(s, marks=pytest.mark.slow) for s in (
    "lamb", "no_nsp", "remat_dots", "bfloat16", "alibi_rmsnorm_swiglu")] + ["modern_bfloat16_remat"])
def test_each_switch_runs_training_steps(switch):
  """Steps that were only ever built: LAMB, the NSP ablation, remat of matmul outputs, bfloat16 activations, the
  modern switches under bfloat16 with remat, ALiBi with RMSNorm and SwiGLU. Each trains (the loss of a repeated
  batch falls), on one device, against the same model's float32 AdamW run."""
  c = small_config(shard="dp")
  if switch == "modern_bfloat16_remat":
    c = modern(c, dtype="bfloat16", remat="dots")
  elif switch == "alibi_rmsnorm_swiglu":
    c = modern(c, position_embedding="alibi", rope_theta=10000.0, rope_theta_local=0.0, local_attention=0,
               norm="rmsnorm", hidden_act="silu", first_attention_norm=True)
  elif switch == "lamb":
    c.train.optimizer = "lamb"
  elif switch == "no_nsp":
    c.train.use_nsp = False
  elif switch == "remat_dots":
    c.model.remat = "dots"
  else:
    c.model.dtype = "bfloat16"
  batch = fixed_batches(1)[0]
  losses, state, _ = run_steps(c, jax.devices()[:1], [batch] * 5)
  assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
  assert all(x.dtype == np.float32 for x in jax.tree_util.tree_leaves(state.params))  # parameters stay float32
  if switch == "remat_dots":  # remat recomputes; the numbers are the plain step's
    np.testing.assert_allclose(losses, single_device_run(repeated=True)[0], rtol=1e-5)
  if switch == "no_nsp":  # the loss is L_MLM alone: below the combined loss of the same steps
    assert losses[0] < single_device_run(repeated=True)[0][0]


@pytest.mark.slow
@pytest.mark.ci
def test_bfloat16_keeps_logits_softmax_and_losses_in_float32():
  """With bfloat16 activations the MLM/NSP logits, the loss and the gradients are float32, and the loss and the
  gradients are those of the float32 model within bfloat16's precision."""
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=128, hidden_size=64, num_heads=4, intermediate_size=128,
                                          max_position_embeddings=64, dropout_rate=0.0, attention_dropout_rate=0.0)
  batch = fixed_batches(1, b=4)[0]
  f32 = model_lib.BertForPreTraining(cfg)
  bf16 = model_lib.BertForPreTraining(cfg.replace(dtype="bfloat16"))
  params = nn.meta.unbox(f32.init(jax.random.key(0), batch)["params"])

  def loss(module, p):
    out = module.apply({"params": p}, batch)
    value, _ = mlm_objective.pretraining_loss(out, batch)
    return value, out

  (l32, o32), g32 = jax.jit(jax.value_and_grad(lambda p: loss(f32, p), has_aux=True))(params)
  (l16, o16), g16 = jax.jit(jax.value_and_grad(lambda p: loss(bf16, p), has_aux=True))(params)
  assert o16["mlm_logits"].dtype == o16["nsp_logits"].dtype == l16.dtype == np.float32
  assert all(g.dtype == np.float32 for g in jax.tree_util.tree_leaves(g16))
  assert abs(float(l16) - float(l32)) / float(l32) < 2e-2
  a = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(g16)])
  b = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(g32)])
  assert np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) > 0.99


def test_optimizer_defaults_are_stated_once():
  """optim.DEFAULTS (the original BERT's choices) is where a missing optimizer setting comes from; each recipe
  states the same value or one of its listed deltas."""
  from bertjax.core import optim
  from configs import electra, finetune, modernbert, pretrain, roberta
  hf_adam = {"adam_bias_correction": True}  # fairseq's, ModernBERT's and HF's AdamW correct the moments' bias
  deltas = {"finetune": {**hf_adam, "schedule": "linear_from_warmup"},
            "roberta": {**hf_adam, "schedule": "linear_from_warmup"},
            "modernbert": {**hf_adam, "schedule": "wsd", "decay_shape": "sqrt"}, "pretrain": {}, "electra": {}}
  for name, module in (("pretrain", pretrain), ("finetune", finetune), ("roberta", roberta),
                       ("modernbert", modernbert), ("electra", electra)):
    t = module.get_config().train
    stated = {k: t[k] for k in optim.DEFAULTS if k in t}
    differ = {k: v for k, v in stated.items() if v != optim.DEFAULTS[k]}
    assert differ == {k: v for k, v in deltas[name].items() if k in stated}, name
  bare = ml_collections.ConfigDict({"learning_rate": 1e-4, "warmup_steps": 1, "num_steps": 4, "grad_clip_norm": 1.0,
                                    "optimizer": "adamw", "b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.01})
  assert dict(optim.settings(bare)) == {**optim.DEFAULTS, **bare.to_dict()}


def test_model_defaults_are_stated_once():
  """Every recipe's model section is model.BertConfig's defaults except its listed deltas (the dataclass holds each
  default once; a family recipe states only what differs from BERT's)."""
  import dataclasses

  from configs import demo, electra, finetune, modernbert, pretrain, roberta
  defaults = {f.name: f.default for f in dataclasses.fields(model_lib.BertConfig)}
  scanned = {"scan_layers": True}
  deltas = {
      "pretrain": scanned, "demo": {**scanned, "attention_dropout_rate": 0.0, "dropout_rate": 0.0,
                                   "max_position_embeddings": 128, "vocab_size": 8000},
      # the fresh head drawn as HF draws it; the dropout rates the init's own; attention by row length
      "finetune": {"initializer": "normal", "dropout_rate": -1.0, "attention_dropout_rate": -1.0,
                   "attention_impl": "by_length"},
      "roberta": {**scanned, "classifier_head": "dense_tanh", "initializer": "normal", "layer_norm_eps": 1e-05,
                  "max_position_embeddings": 514,
                  "nsp_head": False, "position_offset": 2, "type_vocab_size": 1, "vocab_size": 50265},
      "modernbert": {**scanned, "attention_dropout_rate": 0.0, "classifier_head": "prediction", "dropout_rate": 0.0,
                     "ffn": "glu",
                     "first_attention_norm": False, "layer_norm": "pre", "layer_norm_eps": 1e-05,
                     "local_attention": 128, "max_position_embeddings": 8192, "norm_bias": False, "nsp_head": False,
                     "position_embedding": "rotary", "rope_theta": 160000.0, "rope_theta_local": 10000.0,
                     "type_vocab_size": 0, "use_bias": False, "vocab_multiple": 64, "vocab_size": 50368},
      "electra": {**scanned, "classifier_head": "dense_gelu", "embedding_size": 128, "nsp_head": False}}
  for name, module in (("pretrain", pretrain), ("demo", demo), ("finetune", finetune), ("roberta", roberta),
                       ("modernbert", modernbert), ("electra", electra)):
    model = module.get_config().model
    sizes = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
    differ = {k: model[k] for k in model if k in defaults and k not in sizes and model[k] != defaults[k]}
    assert differ == deltas[name], name
    assert set(model) - set(defaults) == {"variant"}, name
