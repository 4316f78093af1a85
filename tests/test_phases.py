"""Pre-training as today's encoders are trained: schedules against closed forms, batch ramps, grain mixtures
(proportions, seeds, positions, exhaustion), StableAdamW against a NumPy transcription of the published rule, the
moving average of the weights, and the ModernBERT and mmBERT recipes end to end at tiny shapes, resumed mid-phase
and at a phase boundary byte-identical to an uninterrupted run, annealed from their pre-decay checkpoints."""
import math
import sys

import helpers as tt
import jax
import ml_collections
import numpy as np
import optax
import pytest

from bertjax import errors
from bertjax import pretrain as train
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import optim, trainer
from bertjax.core import phases as phases_lib
from bertjax.data.pretraining import dataset, mixture, pipeline
from bertjax.data.pretraining import examples as pretraining
from configs import common, mmbert, modernbert_phases


# ----------------------------------------------------------------------------- schedules
def closed_form(kind, lr, warm, total, step, frac=0.1, shape="linear", floor=0.0, start=0.0):
  """The schedules written out from their definitions (not from optim)."""
  if step < warm:
    return start + (lr - start) * step / warm
  if kind == "constant":
    return lr
  if kind == "inverse_sqrt":
    return lr * math.sqrt(warm / step)
  if kind == "linear":
    return lr * max(0.0, 1 - step / total)
  if kind == "cosine":
    p = min(max((step - warm) / (total - warm), 0), 1)
    return floor * lr + (lr - floor * lr) * 0.5 * (1 + math.cos(math.pi * p))
  d = round(total * frac)
  p = min(max((step - (total - d)) / d, 0), 1)
  f = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)), "1-sqrt": 1 - math.sqrt(p)}[shape]
  return floor * lr + (lr - floor * lr) * f


@pytest.mark.parametrize("kind,shape", [("constant", "linear"), ("inverse_sqrt", "linear"), ("linear", "linear"),
                                        ("cosine", "linear"), ("wsd", "linear"), ("wsd", "cosine"),
                                        ("wsd", "1-sqrt")])
def test_each_schedule_follows_its_closed_form(kind, shape):
  for start in (0.0, 0.3):
    f = optim.schedule(1.0, 8, 100, kind, decay_fraction=0.25, decay_shape=shape, final_lr_ratio=0.1,
                       warmup_from=start)
    for step in range(0, 101, 3):
      want = closed_form(kind, 1.0, 8, 100, step, 0.25, shape, 0.1, start)
      assert abs(float(f(step)) - want) < 1e-5, (kind, shape, start, step)


def three_phases(**over):
  c = tt.small_config()
  c.unlock()
  c.phases = ml_collections.ConfigDict({
      "a": common.phase(steps=10, warmup_steps=4, learning_rate=1e-3),
      "b": common.phase(steps=6, learning_rate=5e-4, warmup_steps=2, schedule="cosine", final_lr_ratio=0.2),
      "c": common.phase(steps=8, learning_rate=-1.0, schedule="wsd", decay_fraction=1.0, decay_shape="1-sqrt")})
  c.phase_order = "a,b,c"
  c.train.num_steps = 0
  for k, v in over.items():
    c.phases[k.split("__")[0]][k.split("__")[1]] = v
  c.lock()
  return c


def test_a_run_of_phases_has_one_learning_rate_piecewise_over_the_global_step():
  """a: 0 -> 1e-3 over 4 steps then held; b: from a's last rate (1e-3) to 5e-4 over 2 steps, then cosine to 1e-4;
  c: from b's last rate along 1-sqrt to 0 over 8 steps."""
  fn = phases_lib.lr_function(phases_lib.plan(three_phases(), 1))
  b_last = closed_form("cosine", 5e-4, 2, 6, 5, floor=0.2, start=1e-3)
  for step in range(24):
    if step < 10:
      want = closed_form("constant", 1e-3, 4, 10, step)
    elif step < 16:
      want = closed_form("cosine", 5e-4, 2, 6, step - 10, floor=0.2, start=1e-3)
    else:
      want = closed_form("wsd", b_last, 0, 8, step - 16, frac=1.0, shape="1-sqrt")
    assert abs(float(fn(step)) - want) < 1e-8, step


def test_batch_warmup_ramps_in_few_shapes_and_phase_tokens_set_the_steps():
  p = phases_lib.defaults(tokens=100_000, seq=128, global_batch_size=64, batch_warmup_tokens=40_000,
                          batch_warmup_from=8, batch_warmup_levels=4)
  sizes = phases_lib.batch_sizes(p)
  levels = sorted(set(sizes))
  assert levels == [8, 24, 40, 64] and list(sizes) == sorted(sizes)
  tokens = 0
  for b in sizes:  # every batch is at most the linear ramp at the tokens read so far
    assert b <= 8 + (64 - 8) * min(tokens / 40_000, 1) + 1e-9
    tokens += b * 128
  assert tokens >= 100_000 and tokens - sizes[-1] * 128 < 100_000  # the last step is the one that reaches it
  fixed = phases_lib.defaults(tokens=100_000, seq=128, global_batch_size=64)
  assert phases_lib.batch_sizes(fixed) == (64,) * math.ceil(100_000 / (64 * 128))


# ----------------------------------------------------------------------------- mixtures
@pytest.mark.parametrize("weights", [[0.7, 0.3], [1, 2, 3], [0.2, 0.5, 0.3, 0.01]])
def test_source_counts_are_grains_interleaving(weights):
  import grain
  mixed = grain.MapDataset.mix([grain.MapDataset.range(mixture.BIG).map(lambda j, i=i: (i, j))
                                for i in range(len(weights))], weights)
  seen = [0] * len(weights)
  for g in range(1500):
    i, j = mixed[g]
    assert j == seen[i]
    seen[i] += 1
    assert mixture.counts(g + 1, weights) == seen


class Rows:
  """An in-memory source whose rows name their source and index."""

  def __init__(self, tag, n):
    self.tag, self.n = tag, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return {"src": np.int32(self.tag), "i": np.int32(i), "input_mask": np.ones(4, np.int32)}


def drawn(segments, seed, steps):
  p = mixture.PhasedPipeline(segments, seed=seed, prefetch=0)
  out = [next(p) for _ in range(steps)]
  p.close()
  return np.concatenate([b["src"] for b in out]), np.concatenate([b["i"] for b in out])


def test_mixture_proportions_order_and_reading_through_each_source():
  weights = mixture.temperature_weights([300, 100], 0.5)  # p ∝ n^0.5: 0.634 / 0.366
  assert np.allclose(weights, np.sqrt([300, 100]) / np.sqrt([300, 100]).sum())
  seg = mixture.Segment("a", 0, 50, (("x", Rows(0, 300), weights[0]), ("y", Rows(1, 100), weights[1])), (16,) * 50)
  src, idx = drawn([seg], 0, 50)
  n = len(src)
  for tag, p in enumerate(weights):  # within the binomial 99.9% interval of n draws at p
    assert abs(np.mean(src == tag) - p) < 3.3 * math.sqrt(p * (1 - p) / n)
  x = idx[src == 0]
  assert sorted(x[:300]) == list(range(300))  # each source read through once before any repeats
  again, idx2 = drawn([seg], 0, 50)
  assert (again == src).all() and (idx2 == idx).all()
  _, other = drawn([seg], 1, 50)
  assert (other != idx).any()


def test_a_later_phase_continues_each_source_and_exhaustion_is_found():
  a = mixture.Segment("a", 0, 5, (("x", Rows(0, 40), 1.0),), (8,) * 5)
  b = mixture.Segment("b", 5, 12, (("x", Rows(0, 40), 1.0), ("y", Rows(1, 30), 1.0)), (8,) * 7, a.draws(5))
  src, idx = drawn([a, b], 3, 12)
  assert sorted(idx[(src == 0)][:40]) == list(range(40))  # phase b goes on with x's order, no example repeated
  assert mixture.exhaustion(a) == {}
  steps = mixture.exhaustion(b)
  for key, step in steps.items():  # the first step whose batch reads past the end, by brute force
    first = next(s for s in range(b.start, b.end) if b.draws(s + 1)[key] > {"x": 40, "y": 30}[key])
    assert step == first
  assert set(steps) == {"x"}


def test_a_resumed_stream_checks_its_sources_positions():
  seg = mixture.Segment("a", 0, 6, (("x", Rows(0, 50), 0.5), ("y", Rows(1, 50), 0.5)), (4,) * 6)
  p = mixture.PhasedPipeline([seg], seed=0, prefetch=0)
  for _ in range(3):
    next(p)
  state = p.get_state()
  assert state["source_positions"] == {"x": 6, "y": 6}
  q = mixture.PhasedPipeline([seg], seed=0, prefetch=0)
  q.set_state(state)
  np.testing.assert_array_equal(next(q)["i"], next(p)["i"])
  changed = mixture.Segment("a", 0, 6, (("x", Rows(0, 50), 0.7), ("y", Rows(1, 50), 0.3)), (4,) * 6)
  with pytest.raises(pipeline.StateMismatchError, match="mixture, batch sizes or phases changed"):
    mixture.PhasedPipeline([changed], seed=0, prefetch=0).set_state(state)


# ----------------------------------------------------------------------------- StableAdamW, EMA
def test_stable_adamw_matches_the_published_algorithm_in_numpy():
  """Wortsman et al. 2023, Algorithm 2, written with its debiased betas β̂ = β(1 − β^(t−1))/(1 − β^t) (so the
  moments carry their own bias correction): v_t = β̂2·v + (1 − β̂2)·g², m_t = β̂1·m + (1 − β̂1)·g,
  RMS_t = √mean(g²/max(v_t, ε²)), η_t = lr/max(1, RMS_t), θ ← θ − η_t·λ·θ (decayed leaves), θ ← θ − η_t·m_t/(√v_t + ε).
  A large gradient in the fourth step drives one tensor's RMS above 1, so the clipping is exercised."""
  c = tt.small_config(optimizer="stable_adamw", grad_clip_norm=0.0, weight_decay=0.1, b2=0.95)
  tx, _ = optim.make(c.train, lr=optim.unit)
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(3, 4)).astype(np.float32), "bias": rng.normal(size=4).astype(np.float32)}
  grads = [{k: rng.normal(size=v.shape).astype(np.float32) * (30.0 if t == 3 and k == "w" else 1.0)
            for k, v in params.items()} for t in range(5)]
  rates = [1e-2, 2e-2, 3e-2, 3e-2, 1e-2]
  state, ours = tx.init(params), dict(params)
  for g, lr in zip(grads, rates):
    updates, state = tx.update(g, state, ours)
    ours = optax.apply_updates(ours, jax.tree_util.tree_map(lambda u: u * lr, updates))
  p = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  clipped = []
  for t, (g, lr) in enumerate(zip(grads, rates), start=1):
    b1h = 0.9 * (1 - 0.9 ** (t - 1)) / (1 - 0.9 ** t)
    b2h = 0.95 * (1 - 0.95 ** (t - 1)) / (1 - 0.95 ** t)
    for k in p:
      gk = g[k].astype(np.float64)
      v[k] = b2h * v[k] + (1 - b2h) * gk ** 2
      m[k] = b1h * m[k] + (1 - b1h) * gk
      rms = np.sqrt(np.mean(gk ** 2 / np.maximum(v[k], 1e-12)))
      clipped.append(rms > 1)
      eta = lr / max(1.0, rms)
      if k == "w":
        p[k] = p[k] - eta * 0.1 * p[k]
      p[k] = p[k] - eta * m[k] / (np.sqrt(v[k]) + 1e-6)
  assert any(clipped)
  for k in p:
    np.testing.assert_allclose(ours[k], p[k], rtol=2e-5, atol=1e-6)


def test_the_moving_average_follows_its_recurrence():
  params = {"w": np.array([1.0, -1.0], np.float32)}
  tx = optax.sgd(1.0)
  state = trainer.EmaTrainState(step=np.int32(0), params=params, opt_state=tx.init(params), ema=params)
  want = params["w"].astype(np.float64)
  for g in ([0.5, 0.5], [-1.0, 2.0], [0.25, 0.0]):
    state, _ = trainer.apply_gradients(state, {"w": np.array(g, np.float32)}, tx, ema_decay=0.9)
    want = 0.9 * want + 0.1 * np.asarray(state.params["w"], np.float64)
  np.testing.assert_allclose(state.ema["w"], want, rtol=1e-6)
  assert isinstance(state, trainer.EmaTrainState)


# ----------------------------------------------------------------------------- recipes end to end
@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """Three sources made with one tokenizer (web and code at 32 tokens, web at 64; full sentences, masked at 30%)
  and a small fourth one that runs out."""
  d = tmp_path_factory.mktemp("phase_sources")
  base = tt.make_pretraining_data(d)
  vocab = str(d / "tok" / "vocab.txt")
  (d / "code.txt").write_text("\n\n".join("\n".join(f"def f{i} ( x ) : return x + {j} ." for j in range(5))
                                          for i in range(60)))
  (d / "few.txt").write_text("\n\n".join(f"a second head guesses {i} ." for i in range(12)))
  out = {"vocab_size": dataset.read_creation(base)["vocab_size"]}
  for name, text, seq in (("web", "corpus.txt", 32), ("code", "code.txt", 32), ("web64", "corpus.txt", 64),
                          ("few", "few.txt", 32)):
    opts = pretraining.CreationOptions(max_seq_length=seq, masked_lm_prob=0.3, dupe_factor=1,
                                       max_predictions_per_seq=pretraining.max_predictions(seq, 0.3),
                                       example_mode="full_sentences")
    dataset.create([d / text], vocab, d / name, opts, heldout_every=6 if name != "few" else 0)
    out[name] = str(d / name)
  return out


def tiny(c, vocab_size):
  c.unlock()
  c.model.vocab_size, c.model.vocab_multiple = vocab_size, 1
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 2, 32, 2, 48
  c.model.local_attention = 8
  c.sharding = common.sharding("dp")
  c.data.prefetch, c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 0, 1, 0, 1, 2
  c.keep_checkpoints = 1
  c.lock()
  return c


def modernbert_tiny(sources, **over):
  arg = (f"variant=tiny,data={sources['web']},long_data={sources['web64']},decay_data={sources['code']},seq=32,"
         f"long_seq=64,batch=16,batch_from=8,tokens={16 * 32 * 4},long_tokens={8 * 64 * 3},decay_tokens={8 * 64 * 3},"
         f"batch_warmup_tokens={12 * 32 * 2},warmup_tokens={8 * 32},lr=2e-3,shard=dp")
  c = tiny(modernbert_phases.get_config(arg), sources["vocab_size"])
  c.unlock()
  c.phases.decay.seq = 32  # the decay reads the 32-token code data
  c.phases.decay.global_batch_size = 16
  c.data.eval_dir = sources["web"]
  c.lock()
  return overridden(c, **over)


def overridden(c, **over):
  """The config with dotted fields set ("phases.decay.seq": 32)."""
  c.unlock()
  for k, v in over.items():
    node, _, leaf = k.rpartition(".")
    target = c
    for part in node.split(".") if node else []:
      target = target[part]
    target[leaf] = v
  c.lock()
  return c


@pytest.fixture(scope="module")
def modernbert_run(sources, tmp_path_factory):
  """ModernBERT's three phases at tiny shapes with a moving average of the weights: the workdir and its summary."""
  w = tmp_path_factory.mktemp("modernbert_phases") / "w"
  summary = train.train_and_evaluate(modernbert_tiny(sources, **{"train.ema_decay": 0.9}), str(w))
  return w, summary


def test_modernbert_recipe_runs_its_three_phases_end_to_end(modernbert_run, sources):
  """Batch 8 -> 16 over the first 768 token slots at 32 tokens and θ 10k (6 steps), then 64 tokens at θ 160k with
  8 sequences a step (3 steps), then the 1-sqrt decay on other data (3 steps); each phase's end is kept as a
  checkpoint (keep_checkpoints=1 keeps only the newest otherwise) with every source's position."""
  w, s = modernbert_run
  assert s["phases"] == ["stable", "context", "decay"] and s["final_step"] == 12
  ckpt = checkpoint_lib.Checkpointer(str(w), read_only=True)
  assert ckpt.steps() == [6, 9, 12]
  web, web64, code = sources["web"], sources["web64"], sources["code"]
  assert ckpt.data_state(6)["source_positions"] == {web: 8 * 3 + 16 * 3, web64: 0}
  assert ckpt.data_state(9)["source_positions"] == {web: 72, web64: 8 * 3, code: 0}
  assert ckpt.data_state(12)["source_positions"] == {web: 72, web64: 24, code: 16 * 3}
  lrs = {r["step"]: r["learning_rate"] for r in tt.metrics_rows(w) if r["split"] == "train"}
  assert lrs[1] < lrs[2] == lrs[6] == pytest.approx(2e-3) and lrs[7] == lrs[9] == pytest.approx(3e-4)
  assert lrs[10] == pytest.approx(3e-4) and lrs[12] == pytest.approx(3e-4 * (1 - math.sqrt(2 / 3)))
  assert np.isfinite(s["eval"]["mlm_loss"])
  state = s["state"]  # the moving average lives beside the params, laid out as they are
  for e, p in zip(jax.tree_util.tree_leaves(state.ema), jax.tree_util.tree_leaves(state.params)):
    assert e.sharding == p.sharding and e.shape == p.shape


def mmbert_tiny(sources):
  arg = (f"variant=tiny,sources=en:{sources['web']};code:{sources['code']},late=few:{sources['few']},seq=32,"
         f"batch=16,tokens={16 * 32 * 3},mid_tokens={16 * 32 * 2},decay_tokens={16 * 32 * 3},warmup_tokens=512,"
         f"vocab={sources['vocab_size']},shard=dp")
  c = tiny(mmbert.get_config(arg), sources["vocab_size"])
  c.unlock()
  c.data.eval_dir = sources["web"]
  c.lock()
  return c


@pytest.mark.slow
def test_mmbert_recipe_resumes_mid_phase_and_at_a_boundary_exactly(sources, tmp_path):
  """mmBERT's masking 30/15/5% and temperatures 0.7/0.5/0.3 with a language joining in the decay (and running out
  there: read again in a new order): a run stopped at step 2 (mid-phase) and at step 3 (the boundary) and
  resumed twice ends byte-identical to one uninterrupted run, and every source's position is saved."""
  whole = train.train_and_evaluate(mmbert_tiny(sources), str(tmp_path / "whole"))
  parts = tmp_path / "parts"
  for stop in (2, 1, 0):
    c = mmbert_tiny(sources)
    c.unlock()
    c.train.stop_after_steps = stop
    c.lock()
    summary = train.train_and_evaluate(c, str(parts))
  assert summary["final_step"] == whole["final_step"] == 8
  a = [(r["step"], r["loss"]) for r in tt.metrics_rows(tmp_path / "whole") if r["split"] == "train"]
  b = [(r["step"], r["loss"]) for r in tt.metrics_rows(parts) if r["split"] == "train"]
  assert a == b
  for x, y in zip(jax.tree_util.tree_leaves(whole["state"].params), jax.tree_util.tree_leaves(summary["state"].params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  ckpt = checkpoint_lib.Checkpointer(str(parts), read_only=True)
  saved = ckpt.data_state(ckpt.latest_step())
  assert saved["phase"] == "decay" and set(saved["source_positions"]) == {sources["web"], sources["code"],
                                                                           sources["few"]}


def test_annealing_from_the_pre_decay_checkpoint_keeps_its_optimizer_and_rate(modernbert_run, sources, tmp_path):
  """A decay phase on other data started from the stable phase's end (step 6) of another workdir: with
  init_optimizer=keep Adam's count goes on from 6 and the rate starts where the checkpoint stood (the stable peak);
  with reset the count starts at 0."""
  w, _ = modernbert_run
  for keep in (True, False):
    c = tiny(modernbert_phases.get_config(f"variant=tiny,data={sources['code']},long_data={sources['code']},seq=32,"
                                          "long_seq=32,batch=16,lr=2e-3,shard=dp"), sources["vocab_size"])
    c.unlock()
    c.init_checkpoint, c.init_step, c.init_optimizer = str(w), 6, "keep" if keep else "reset"
    c.phases = ml_collections.ConfigDict({"anneal": common.phase(steps=3, mixture="decay", learning_rate=-1.0,
                                                                 schedule="wsd", decay_fraction=1.0)})
    c.phase_order = "anneal"
    c.lock()
    out = tmp_path / f"anneal_{keep}"
    s = train.train_and_evaluate(c, str(out))
    rate = [r["learning_rate"] for r in tt.metrics_rows(out) if r["split"] == "train"][0]
    assert abs(rate - 2e-3) < 1e-9
    assert _adam_count(s["state"].opt_state) == (6 + 3 if keep else 3)


def _adam_count(opt_state) -> int:
  for leaf in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)):
    if isinstance(leaf, optax.ScaleByAdamState):
      return int(leaf.count)
  raise AssertionError("no Adam state")


def test_phase_mistakes_are_one_line_each_before_anything_compiles(sources, tmp_path):
  def attempt(**over):
    c = modernbert_tiny(sources, **over)
    with pytest.raises(errors.ConfigError) as e:
      train.train_and_evaluate(c, str(tmp_path / "w"))
    assert "\n" not in str(e.value)
    return str(e.value)
  assert "the phases add up to 12 steps but train.num_steps is 5" in attempt(**{"train.num_steps": 5})
  assert "weight must be a number > 0" in attempt(**{"phases.stable.mixture": "short=0"})
  assert "weight must be a number > 0" in attempt(**{"phases.stable.mixture": "short=-1"})
  assert "weight must be a number > 0" in attempt(**{"phases.stable.mixture": "short=nan"})
  assert "does not define" in attempt(**{"phases.stable.mixture": "missing"})
  assert "temperature must be a number > 0" in attempt(**{"phases.decay.temperature": 0.0})
  assert "made at max_seq_length 32, the phase runs at 64" in attempt(**{"phases.context.mixture": "short"})
  assert "give its length as steps or as tokens" in attempt(**{"phases.decay.steps": 3})
  assert "does not define" in attempt(**{"phase_order": "stable,nope"})
  c = modernbert_tiny(sources)
  c.unlock()
  c.data.sources.short = str(tmp_path / "nowhere")
  c.lock()
  with pytest.raises(errors.ConfigError, match="data.sources.short: .*no creation.json"):
    train.train_and_evaluate(c, str(tmp_path / "w2"))
  c = modernbert_tiny(sources)
  c.unlock()
  c.model.vocab_size = 256
  c.lock()
  with pytest.raises(errors.ConfigError, match="a phase cannot change the vocabulary"):
    train.train_and_evaluate(c, str(tmp_path / "w3"))
  c = modernbert_tiny(sources)
  c.unlock()
  c.model.position_embedding, c.model.rope_theta, c.model.rope_theta_local = "learned", 10_000.0, 0.0
  c.lock()
  with pytest.raises(errors.ConfigError, match="a phase cannot change the architecture"):
    train.train_and_evaluate(c, str(tmp_path / "w4"))


# ----------------------------------------------------------------------------- averaging and merging
def merged_params(out):
  return checkpoint_lib.Checkpointer(str(out), read_only=True).restore_params()


def flat(tree):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_averaging_checkpoints_and_reading_the_moving_average(modernbert_run, tmp_path):
  """--last 3 is the mean of the three checkpoints (NumPy, float64); merging copies of one checkpoint gives it
  back bit for bit; W@ema is the run's moving average; each output is a workdir a run starts from and an HF folder
  holding the same tensors."""
  from bertjax.cli import merge as merge_cli
  from bertjax.convert import weights
  w, _ = modernbert_run
  reader = checkpoint_lib.Checkpointer(str(w), read_only=True)
  steps = [flat(reader.restore_params(s)) for s in (6, 9, 12)]
  assert merge_cli.main([str(w), "--last", "3", "--out", str(tmp_path / "avg")]) == 0
  got = flat(merged_params(tmp_path / "avg"))
  for k, v in got.items():
    np.testing.assert_allclose(v, np.mean([s[k].astype(np.float64) for s in steps], axis=0), rtol=1e-6, atol=1e-7)
  assert merge_cli.main([f"{w}@6", f"{w}@6", f"{w}@6", "--out", str(tmp_path / "same")]) == 0
  for k, v in flat(merged_params(tmp_path / "same")).items():
    np.testing.assert_array_equal(v, steps[0][k])
  assert merge_cli.main([f"{w}@ema", "--out", str(tmp_path / "ema")]) == 0
  ema = flat(reader.restore_params(12, item="ema"))
  for k, v in flat(merged_params(tmp_path / "ema")).items():
    np.testing.assert_array_equal(v, ema[k])
  assert any(not np.array_equal(ema[k], steps[2][k]) for k in ema)
  hf = weights.load(str(tmp_path / "avg" / "hf"), overrides={"scan_layers": False}, head="all")
  mine = weights.load(str(tmp_path / "avg"), overrides={"scan_layers": False}, head="all")
  for k, v in flat(hf.params).items():
    np.testing.assert_array_equal(v, flat(mine.params)[k])


def ties_transcribed(base, tasks, density, lam):
  """TIES-merging as the authors' code computes it (TIES-merging repo: `ties_merging` = `topk_values_mask`,
  `resolve_sign`, `disjoint_merge` with "mean"), in NumPy, on one flat vector per model (the authors flatten every
  parameter of a model into one vector: the trim is global, not per tensor). τ_t = θ_t − θ_init; trim: k = d −
  int(d·K), keep |τ| >= the k-th smallest |τ| of its row (density 1: no trim); γ = sgn(Σ_t τ̂_t), a 0 replaced by
  sgn(Σ γ) ("majority"); keep τ̂ > 0 where γ > 0 else τ̂ < 0; the sum of the kept over their count (at least 1);
  θ = θ_init + λ·τ_m."""
  tv = np.stack([np.asarray(t, np.float64) - np.asarray(base, np.float64) for t in tasks])
  n, d = tv.shape
  if density < 1:
    k = d - int(d * density)
    kth = np.sort(np.abs(tv), axis=1)[:, k - 1:k]  # torch's M.abs().kthvalue(k, dim=1, keepdim=True)
    tv = tv * (np.abs(tv) >= kth)
  sign = np.sign(tv.sum(axis=0))
  sign[sign == 0] = np.sign(sign.sum())
  rows_to_keep = np.where(sign[None] > 0, tv > 0, tv < 0)
  selected = tv * rows_to_keep
  count = (selected != 0).sum(axis=0)
  return np.asarray(base, np.float64) + lam * selected.sum(axis=0) / np.maximum(count, 1)


def test_ties_merging_matches_the_papers_algorithm(modernbert_run, tmp_path):
  from bertjax.convert import merge as merge_lib

  def whole(tree, keys):  # a model as the authors hold it: every parameter in one vector
    return np.concatenate([np.asarray(tree[k], np.float64).ravel() for k in keys])

  def check(got, base, tasks, density, lam, rtol):
    keys = sorted(base)
    want = ties_transcribed(whole(base, keys), [whole(t, keys) for t in tasks], density, lam)
    np.testing.assert_allclose(whole(got, keys), want, rtol=rtol, atol=1e-6)
  rng = np.random.default_rng(0)
  base = {"a": rng.normal(size=(6, 5)).astype(np.float32), "b": rng.normal(size=7).astype(np.float32)}
  tasks = [{k: (v + rng.normal(size=v.shape) * (1 + 3 * (k == "b"))).astype(np.float32) for k, v in base.items()}
           for _ in range(3)]
  # Entries where the trimmed task vectors cancel exactly: their elected sign is the majority's, not 0.
  base["a"][0] = 0.0
  tasks[1]["a"][0], tasks[2]["a"][0] = -tasks[0]["a"][0], 0.0
  for density, lam in ((0.2, 1.0), (0.5, 0.7), (1.0, 1.0)):
    check(merge_lib.ties(tasks, base, density, lam), base, tasks, density, lam, 1e-6)
  w, _ = modernbert_run
  merge_lib.merge([f"{w}@9", f"{w}@12"], str(tmp_path / "ties"), "ties", base=f"{w}@6", density=0.3)
  reader = checkpoint_lib.Checkpointer(str(w), read_only=True)
  b, t9, t12 = (flat(reader.restore_params(s)) for s in (6, 9, 12))
  got = flat(merged_params(tmp_path / "ties"))
  assert any("['layers']" in k for k in got) and set(got) == set(b)  # the run's scanned layout, trimmed as a whole
  # The whole is the model HF holds: layer 0's attention norm (an Identity there, read by no computation) keeps the
  # base's values and counts in neither the trim nor the election.
  norm = "['bert']['encoder']['layers']['layer']['attention_ln']['scale']"
  np.testing.assert_array_equal(got[norm][0], b[norm][0])
  held = lambda tree: {**tree, norm: tree[norm][1:]}  # noqa: E731
  check(held(got), held(b), [held(t9), held(t12)], 0.3, 1.0, 1e-5)


def test_merging_unlike_checkpoints_is_refused_in_one_line(modernbert_run, tmp_path, capsys):
  import transformers

  from bertjax.cli import merge as merge_cli
  w, _ = modernbert_run
  other = tmp_path / "bert"
  hf = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=37)
  transformers.BertForMaskedLM(hf).save_pretrained(other)
  capsys.readouterr()
  cases = [([str(w), str(other), "--out", str(tmp_path / "o1")], "different architectures"),
           ([str(w), f"{w}@6", "--out", str(w)], "is one of the inputs"),
           ([f"{w}@7", str(w), "--out", str(tmp_path / "o2")], "no checkpoint at step 7"),
           ([f"{w}@9", f"{w}@12", "--method", "ties", "--out", str(tmp_path / "o3")], "give --base"),
           ([str(w), str(w), "--weights", "1,0", "--out", str(tmp_path / "o4")], "one number > 0 per input")]
  (tmp_path / "theirs").mkdir()
  (tmp_path / "theirs" / "notes.txt").write_text("mine")
  cases.append(([str(w), f"{w}@6", "--out", str(tmp_path / "theirs")], "holds files a merge did not write"))
  for argv, pattern in cases:
    with pytest.raises(SystemExit) as e:
      merge_cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == errors.EXIT_CODE and pattern in err and err.count("\n") == 1, (argv, err)
  assert (tmp_path / "theirs" / "notes.txt").read_text() == "mine"
  proc = tt.run_cmd([sys.executable, "-m", "bertjax", "merge", str(w), str(other), "--out", str(tmp_path / "o5")])
  tt.assert_one_line_error(proc, "different architectures")
