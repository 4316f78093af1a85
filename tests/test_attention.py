"""The fused Pallas attention (run in Pallas' interpreter here) against plain softmax attention and its autodiff."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import model
from bertjax.kernels import attention


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


def textbook(q, k, v, mask, bias, keep, rate):
  """softmax(QKᵀ/√d + bias) with masked keys at float32's minimum, dropout on the probabilities, then ·V."""
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]) + bias
  p = jax.nn.softmax(jnp.where(mask, s, jnp.finfo(jnp.float32).min), axis=-1)
  if keep is not None:
    p = jnp.where(keep, p / (1.0 - rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("kind", ["padded", "packed"])
@pytest.mark.parametrize("dropout", ["none", "rng", "hash"])
def test_xla_attention_and_its_backward_equal_the_textbook_formula(kind, dropout):
  """The XLA path's fused softmax and hand-written backward against autodiff of softmax-then-product: outputs and
  the gradients of q, k, v and of a score bias (DeBERTa's terms take it), with either dropout's mask, on rows
  with a fully padded example (uniform over its keys) and for a few query rows (a pruned last layer)."""
  from bertjax.kernels import dropout as dropout_lib
  q, k, v = qkv(b=3)
  mask = jnp.concatenate([masks()[kind], jnp.zeros((1,) + masks()[kind].shape[1:], bool)])
  bias = jnp.asarray(np.random.default_rng(2).normal(size=(3, 2, 32, 32)), jnp.float32)
  w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  rate, rng = (0.0, None) if dropout == "none" else (0.2, jax.random.PRNGKey(7))
  keep = None
  if dropout == "rng":
    keep = jax.random.bernoulli(rng, 1.0 - rate, (3, 2, 32, 32))
  elif dropout == "hash":
    keep = dropout_lib.keep_mask(jax.random.bits(rng, (), jnp.uint32), (3, 2, 32, 32), rate)
  for rows in (None, jnp.asarray([[0, 5, 31]] * 3)):
    m, b, pick = mask, bias, (lambda x: x)
    if rows is not None:
      m, b = model.mask_rows(mask, rows), jnp.take_along_axis(bias, rows[:, None, :, None], axis=2)
      pick = lambda x: jnp.take_along_axis(x, rows[:, :, None, None], axis=1)  # noqa: E731
    kp = None if keep is None else (keep if rows is None else jnp.take_along_axis(keep, rows[:, None, :, None], 2))
    if kp is not None and rows is not None:
      continue  # the dropout mask is drawn over the rows attended, so a few rows draw another
    ours = lambda q, k, v, b: model.dot_product_attention(  # noqa: E731
        pick(q), k, v, m, bias=b, dropout_rate=rate, dropout_rng=rng, deterministic=rng is None,
        dropout_impl=dropout if dropout != "none" else "rng")
    ref = lambda q, k, v, b: textbook(pick(q), k, v, m, b, kp, rate)  # noqa: E731
    np.testing.assert_allclose(np.asarray(ours(q, k, v, b)), np.asarray(ref(q, k, v, b)), atol=2e-6)
    grads = [jax.grad(lambda *a: jnp.sum(f(*a) * pick(w)), argnums=(0, 1, 2, 3))(q, k, v, b) for f in (ours, ref)]
    for a, want in zip(*grads):
      assert np.all(np.isfinite(np.asarray(a)))
      np.testing.assert_allclose(np.asarray(a), np.asarray(want), atol=2e-5)
  padded_row = np.asarray(model.dot_product_attention(q, k, v, mask))[2]
  np.testing.assert_allclose(padded_row, np.broadcast_to(np.asarray(v)[2].mean(0), padded_row.shape), atol=1e-6)


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


# --- splash attention (the TPU kernel, in Pallas' interpreter here) ----------------------------------------------

def splash_segments(b=2, length=32):
  lengths = np.array([length, 20])[:b]
  real = np.arange(length)[None] < lengths[:, None]
  return {"padded": jnp.asarray(real.astype(np.int32)),
          "packed": jnp.asarray(np.where(np.arange(length)[None] < 12, 1, 2) * real)}


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_splash_equals_softmax_attention_and_its_gradients(kind):
  """softmax(QKᵀ/√d_k)·V with each token seeing its own example's tokens: outputs and gradients at real tokens."""
  q, k, v = qkv()
  seg = splash_segments()[kind]
  mask = masks()[kind]
  real = np.asarray(seg > 0)
  proj = jnp.asarray(np.random.default_rng(3).normal(size=q.shape), jnp.float32) * real[:, :, None, None]
  ref = model.dot_product_attention(q, k, v, mask)
  out = attention.splash_attention(q, k, v, seg)
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], atol=1e-5)
  g_ref = jax.grad(lambda *a: jnp.sum(model.dot_product_attention(*a, mask) * proj), argnums=(0, 1, 2))(q, k, v)
  g = jax.grad(lambda *a: jnp.sum(attention.splash_attention(*a, seg) * proj), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_splash_with_a_sliding_window_equals_banded_softmax_attention(kind):
  """A local layer's kernel (splash's LocalMask, |i - j| <= window / 2): outputs and gradients equal dense
  attention under the banded mask at real tokens, for a length that is not a multiple of the kernel's block."""
  length, window = 200, 64
  q, k, v = qkv(length=length)
  real = np.arange(length)[None] < np.array([length, 150])[:, None]
  seg = (np.where(np.arange(length)[None] < 90, 1, 2) if kind == "packed" else 1) * real
  seg = jnp.asarray(seg.astype(np.int32))
  mask = model.attention_mask(seg > 0, seg) & model.band_mask(length, window)
  proj = jnp.asarray(np.random.default_rng(3).normal(size=q.shape), jnp.float32) * real[:, :, None, None]
  ref = lambda *a: model.dot_product_attention(*a, mask)  # noqa: E731
  ours = lambda *a: attention.splash_attention(*a, seg, window=window)  # noqa: E731
  np.testing.assert_allclose(np.asarray(ours(q, k, v))[real], np.asarray(ref(q, k, v))[real], atol=1e-5)
  assert not np.allclose(np.asarray(ours(q, k, v))[real], np.asarray(attention.splash_attention(q, k, v, seg))[real],
                         atol=1e-3)  # the window matters at this length
  g = jax.grad(lambda *a: jnp.sum(ours(*a) * proj), argnums=(0, 1, 2))(q, k, v)
  g_ref = jax.grad(lambda *a: jnp.sum(ref(*a) * proj), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_sliding_window_model_with_splash_equals_xla(scan):
  """A ModernBERT-style stack (a global layer, then a local one) on packed rows: splash's loss and gradients
  equal the xla path's, layer by layer (Python indices) and scanned (the layer's kernel picked by lax.cond); with
  attention dropout, through the xla fallback with the band."""
  for attention_dropout in (0.0, 0.1):
    cfg = model.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=64, local_attention=8,
                                        global_every=2, num_layers=2, attention_dropout_rate=attention_dropout,
                                        scan_layers=scan, scan_unroll=1)
    assert_splash_trains_like_xla(cfg, packed_batch(cfg))


def assert_splash_trains_like_xla(cfg, batch):
  """Pre-training loss and gradients of the model under attention_impl splash and xla (dropout on, one rng)."""
  params = model.BertForPreTraining(cfg).init(jax.random.key(0), batch)["params"]
  out = {}
  for impl in ("xla", "splash"):
    mi = model.BertForPreTraining(dataclasses.replace(cfg, attention_impl=impl))

    def loss(p, mi=mi):
      o = mi.apply({"params": p}, batch, deterministic=False, rngs={"dropout": jax.random.key(7)})
      return jnp.sum(o["mlm_logits"] ** 2) * 1e-3 + jnp.sum(o["nsp_logits"] ** 2)

    out[impl] = jax.value_and_grad(loss)(params)
  np.testing.assert_allclose(out["splash"][0], out["xla"][0], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(out["xla"][1]), jax.tree_util.tree_leaves(out["splash"][1])):
    assert np.linalg.norm(np.asarray(a) - np.asarray(b)) <= 1e-4 * np.linalg.norm(np.asarray(a)) + 1e-5


def packed_batch(cfg, n=2, length=32):
  rng = np.random.default_rng(0)
  seg = np.asarray(splash_segments(n, length)["packed"])
  pos = np.where(seg == 2, np.arange(length) - 12, np.arange(length)) * (seg > 0)
  return {"input_ids": rng.integers(5, cfg.vocab_size, (n, length)).astype(np.int32),
          "input_mask": (seg > 0).astype(np.int32), "segment_ids": np.zeros((n, length), np.int32),
          "attention_segment_ids": seg.astype(np.int32), "position_ids": pos.astype(np.int32),
          "cls_positions": np.array([[0, 12]] * n, np.int32),
          "masked_lm_positions": np.array([[1, 5, 14]] * n, np.int32)}


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True])
def test_model_with_splash_attention_trains_like_xla(packed):
  """Pre-training loss and gradients equal the xla path's: without attention dropout through the kernel, with it
  through the xla fallback (the same dropout bits: hidden and attention dropout on, one rng)."""
  for attention_dropout in (0.0, 0.1):
    cfg = model.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=64,
                                        attention_dropout_rate=attention_dropout)
    batch = packed_batch(cfg)
    if not packed:
      for key in ("attention_segment_ids", "position_ids", "cls_positions"):
        del batch[key]
      batch["input_mask"] = np.ones_like(batch["input_mask"])
      batch["input_mask"][1, 20:] = 0
    assert_splash_trains_like_xla(cfg, batch)


def test_splash_rows_of_uneven_length_are_padded_to_the_kernel_blocks():
  """600 tokens (past one 512 block): padded to 1024 inside, the padding invisible to real tokens and cut off."""
  q, k, v = qkv(b=2, length=600, h=1)
  seg = jnp.asarray(np.stack([np.ones(600), np.arange(600) < 590]).astype(np.int32))
  out = attention.splash_attention(q, k, v, seg)
  assert out.shape == q.shape
  ref = np.asarray(model.dot_product_attention(q, k, v, model.attention_mask(seg)))
  real = np.asarray(seg) > 0
  np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=1e-5)


def test_an_unknown_attention_impl_is_refused():
  with pytest.raises(ValueError, match="attention_impl"):
    model.BertConfig.from_variant("tiny", attention_impl="splosh")
