"""Hash dropout (`model.dropout_impl="hash"`) against the definition of inverted dropout: each element dropped
independently with probability `rate`, the rest scaled by 1/(1 - rate), the gradient through the forward's mask."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bertjax import model
from bertjax.kernels import dropout


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_drop_fraction_and_scale(rate):
  x = jnp.full((32, 128, 96), 2.0)
  y = np.asarray(dropout.hash_dropout(x, jnp.uint32(11), rate))
  dropped = int((y == 0).sum())
  assert stats.binomtest(dropped, y.size, rate).pvalue > 1e-6, dropped / y.size
  np.testing.assert_allclose(y[y != 0], 2.0 / (1.0 - rate), rtol=1e-6)


def _independence_pvalue(a, b):
  table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
  return stats.chi2_contingency(np.asarray(table)).pvalue


def test_masks_are_independent_across_neighbours_and_seeds():
  """Adjacent elements (along the last and the first axis) and the same element under consecutive seeds: the
  2x2 table of (kept, kept) must not reject independence."""
  shape, rate = (64, 128, 64), 0.3
  keep = np.asarray(dropout.keep_mask(jnp.uint32(5), shape, rate))
  assert _independence_pvalue(keep[..., :-1], keep[..., 1:]) > 1e-6
  assert _independence_pvalue(keep[:-1], keep[1:]) > 1e-6
  other = np.asarray(dropout.keep_mask(jnp.uint32(6), shape, rate))
  assert _independence_pvalue(keep, other) > 1e-6
  assert (keep != other).mean() > 0.3  # 2·0.3·0.7 = 0.42 expected


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradient_goes_through_the_forward_mask(dtype):
  """d/dx Σ w·dropout(x) = w·[kept]/(1 - rate), with the kept set read off the forward output; eager and with
  forward and backward compiled into one program (where the backward recomputes the mask)."""
  rate = 0.25
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(1.0, 2.0, (16, 40, 24)), dtype)  # no zeros: a zero output means dropped
  w = jnp.asarray(rng.normal(size=x.shape), dtype)
  seed = jnp.uint32(123)

  def f(x):
    return jnp.sum(w.astype(jnp.float32) * dropout.hash_dropout(x, seed, rate).astype(jnp.float32))

  y = np.asarray(dropout.hash_dropout(x, seed, rate).astype(jnp.float32))
  want = np.where(y != 0, np.asarray(w.astype(jnp.float32)) / (1.0 - rate), 0.0)
  for grad_fn in (jax.grad(f), jax.jit(jax.grad(f))):
    np.testing.assert_allclose(np.asarray(grad_fn(x).astype(jnp.float32)), want, rtol=1e-2 if dtype == jnp.bfloat16
                               else 1e-6)
  value, g = jax.jit(jax.value_and_grad(f))(x)
  np.testing.assert_allclose(float(value), float(np.sum(np.asarray(w, np.float32) * y)), rtol=1e-3)
  assert np.array_equal(np.asarray(g) != 0, y != 0)


def test_sharded_mask_equals_the_unsharded_one():
  """The mask is a function of the global element index: splitting the batch over 8 devices changes nothing."""
  x = jnp.ones((16, 32, 48))
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  f = jax.jit(lambda x: dropout.hash_dropout(x, jnp.uint32(9), 0.1), out_shardings=sharding)
  sharded = f(jax.device_put(x, sharding))
  assert len(sharded.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(sharded), np.asarray(dropout.hash_dropout(x, jnp.uint32(9), 0.1)))


@pytest.mark.slow
def test_model_with_hash_dropout():
  """Evaluation is unchanged (same parameters, same outputs as the default); training draws a different mask
  per dropout key, and the gradient of the scanned model equals the gradient of the same model unrolled."""
  cfg = model.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=40)
  hcfg = cfg.replace(dropout_impl="hash")
  batch = model.dummy_batch(cfg, batch_size=3, seq_len=24)
  batch["input_ids"] = np.random.default_rng(0).integers(5, 97, (3, 24)).astype(np.int32)
  m, hm = model.BertForPreTraining(cfg), model.BertForPreTraining(hcfg)
  params = nn.meta.unbox(m.init(jax.random.key(0), batch)["params"])
  np.testing.assert_array_equal(np.asarray(hm.apply({"params": params}, batch)["mlm_logits"]),
                                np.asarray(m.apply({"params": params}, batch)["mlm_logits"]))
  det = np.asarray(hm.apply({"params": params}, batch)["mlm_logits"])
  r1, r2 = (np.asarray(hm.apply({"params": params}, batch, deterministic=False,
                                rngs={"dropout": jax.random.key(k)})["mlm_logits"]) for k in (1, 2))
  assert np.abs(r1 - det).max() > 1e-4 and np.abs(r1 - r2).max() > 1e-4

  def loss(p, mod):
    out = mod.apply({"params": p}, batch, deterministic=False, rngs={"dropout": jax.random.key(3)})
    return jnp.sum(out["mlm_logits"] ** 2) * 1e-3 + jnp.sum(out["nsp_logits"] ** 2)

  scfg = hcfg.replace(scan_layers=True)
  sm, um = model.BertForPreTraining(scfg), model.BertForPreTraining(scfg.replace(scan_unroll=2))
  sparams = nn.meta.unbox(sm.init(jax.random.key(0), batch)["params"])
  (ls, gs), (lu, gu) = (jax.jit(jax.value_and_grad(loss), static_argnums=1)(sparams, mod) for mod in (sm, um))
  np.testing.assert_allclose(lu, ls, rtol=1e-6)
  for a, c in zip(jax.tree_util.tree_leaves(gs), jax.tree_util.tree_leaves(gu)):
    np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_tensors_past_the_counter_range_seed_each_leading_slice(monkeypatch):
  """Past 2³² elements a flat uint32 counter would repeat; there each leading-axis slice takes a seed of its own.
  Checked with the limit lowered to this tensor's size: slices differ, and the drop rate and independence of
  neighbours hold."""
  shape, rate = (64, 32, 32), 0.3
  monkeypatch.setattr(dropout, "COUNTER_LIMIT", 64 * 32 * 32)
  keep = np.asarray(dropout.keep_mask(jnp.uint32(5), shape, rate))
  assert all((keep[i] != keep[i + 1]).mean() > 0.3 for i in range(63))
  assert stats.binomtest(int((~keep).sum()), keep.size, rate).pvalue > 1e-6
  assert _independence_pvalue(keep[:-1], keep[1:]) > 1e-6
  monkeypatch.setattr(dropout, "COUNTER_LIMIT", 32 * 32)
  with pytest.raises(ValueError, match="2\\^32 or more elements"):
    dropout.keep_mask(jnp.uint32(5), shape, rate)
