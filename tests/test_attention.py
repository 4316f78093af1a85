"""The fused Pallas attention (run in Pallas' interpreter here) against plain softmax attention and its autodiff."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import attention, model


def qkv(b=2, length=32, h=2, d=16, seed=0):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.normal(size=(b, length, h, d)), jnp.float32) for _ in range(3))


def masks(b=2, length=32):
  lengths = np.array([length, 20])[:b]
  padded = (np.arange(length)[None] < lengths[:, None])[:, None, None, :]
  seg = np.where(np.arange(length)[None] < 12, 1, 2) * (np.arange(length)[None] < lengths[:, None])
  packed = model.attention_mask(jnp.asarray(seg > 0), jnp.asarray(seg))
  return {"padded": jnp.asarray(padded), "packed": packed}


@pytest.mark.parametrize("kind", ["padded", "packed"])
@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_fused_equals_softmax_attention_and_its_gradients(kind, rate):
  q, k, v = qkv()
  mask = masks()[kind]
  seed = None if rate == 0.0 else 1234
  w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

  def fused(q, k, v):
    return jnp.sum(attention.fused_attention(q, k, v, mask, dropout_rate=rate, seed=seed) * w)

  def ref(q, k, v):
    return jnp.sum(attention.reference(q, k, v, mask, seed or 0, rate) * w)

  np.testing.assert_allclose(np.asarray(attention.fused_attention(q, k, v, mask, dropout_rate=rate, seed=seed)),
                             np.asarray(attention.reference(q, k, v, mask, seed or 0, rate)), atol=1e-5)
  for a, b in zip(jax.grad(fused, (0, 1, 2))(q, k, v), jax.grad(ref, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_without_dropout_it_is_the_models_attention():
  q, k, v = qkv()
  mask = masks()["packed"]
  want = model.dot_product_attention(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(attention.fused_attention(q, k, v, mask)), np.asarray(want), atol=1e-5)


def test_dropout_mask_rate_and_independence():
  b, h, length = 4, 4, 128
  idx = [jnp.arange(n, dtype=jnp.uint32).reshape(s) for n, s in
         ((b, (b, 1, 1, 1)), (h, (1, h, 1, 1)), (length, (1, 1, length, 1)), (length, (1, 1, 1, length)))]
  m1 = np.asarray(attention.keep_mask(jnp.uint32(1), idx[0], idx[1], h, length, length, 0.1, idx[2], idx[3]))
  m2 = np.asarray(attention.keep_mask(jnp.uint32(2), idx[0], idx[1], h, length, length, 0.1, idx[2], idx[3]))
  n = m1.size
  sigma = np.sqrt(0.1 * 0.9 / n)
  assert abs(m1.mean() - 0.9) < 4 * sigma and abs(m2.mean() - 0.9) < 4 * sigma
  assert abs((m1 & m2).mean() - 0.81) < 4 * np.sqrt(0.81 * 0.19 / n)  # another seed: an independent mask
  # neighbouring positions, heads and rows are independent too
  assert abs((m1[..., 1:] & m1[..., :-1]).mean() - 0.81) < 0.01
  assert abs((m1[:, 1:] & m1[:, :-1]).mean() - 0.81) < 0.01
  assert abs((m1[1:] & m1[:-1]).mean() - 0.81) < 0.01


def test_model_with_pallas_attention_trains_like_xla_without_dropout():
  cfg = model.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=64, dropout_rate=0.0,
                                      attention_dropout_rate=0.0)
  batch = {"input_ids": np.random.default_rng(0).integers(5, 97, (2, 32)).astype(np.int32),
           "input_mask": np.ones((2, 32), np.int32), "segment_ids": np.zeros((2, 32), np.int32)}
  batch["input_mask"][1, 20:] = 0
  m = model.BertModel(cfg)
  params = m.init(jax.random.key(0), batch)["params"]
  proj = jnp.asarray(np.random.default_rng(1).normal(size=(2, 32, cfg.hidden_size)), jnp.float32)
  out = {}
  for impl in ("xla", "pallas"):
    mi = model.BertModel(dataclasses.replace(cfg, attention_impl=impl))
    out[impl] = jax.grad(lambda p, mi=mi: jnp.sum(mi.apply({"params": p}, batch)["hidden"] * proj))(params)
  for a, b in zip(jax.tree_util.tree_leaves(out["xla"]), jax.tree_util.tree_leaves(out["pallas"])):
    # (the key bias's gradient is zero in exact arithmetic: only rounding is left in it, hence the absolute term)
    assert np.linalg.norm(np.asarray(a) - np.asarray(b)) <= 1e-4 * np.linalg.norm(np.asarray(a)) + 1e-5


def test_lengths_the_kernel_cannot_take_are_refused():
  q, k, v = qkv(length=24)
  with pytest.raises(ValueError, match="powers of two, got 24; use attention_impl='xla'"):
    attention.fused_attention(q, k, v, jnp.ones((2, 1, 1, 24), bool))


def test_each_device_block_draws_its_own_dropout_mask():
  """Under a mesh the kernel runs per device block; eight identical rows on eight devices must still get eight
  different masks (each block's seed is offset by its position), and the same masks as on one device would not."""
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  q, k, v = (jnp.tile(x[:1], (8, 1, 1, 1)) for x in qkv())
  mask = jnp.ones((8, 1, 1, 32), bool)
  with jax.set_mesh(mesh):
    out = jax.jit(lambda q, k, v: attention.fused_attention(
        q, k, v, mask, dropout_rate=0.5, seed=3, partition=jax.sharding.PartitionSpec("data")))(q, k, v)
  out = np.asarray(out)
  assert all(np.abs(out[i] - out[j]).max() > 1e-3 for i in range(8) for j in range(i + 1, 8))
