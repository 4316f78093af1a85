"""Blockwise attention against the dense path it replaces (`kernels.xla.dot_product_attention` under the banded,
padding and block-diagonal masks): forward and gradients for sliding windows, global layers, packed rows,
padding, a few query rows and lengths that are not a multiple of the block; then whole packed pre-training
models (ModernBERT's switches, scanned and unrolled stacks, the pruned last layer) and their gradients."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import errors
from bertjax import model as model_lib
from bertjax.kernels import blockwise
from bertjax.kernels.xla import attention_mask, band_mask, dot_product_attention
from bertjax.objectives import mlm as mlm_objective


def _inputs(length=45, b=2, h=2, d=8, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)), jnp.float32) for _ in range(3))
  valid = np.ones((b, length), bool)
  valid[1, length - 9:] = False  # padding
  seg = np.zeros((b, length), np.int32)
  seg[0, :17], seg[0, 17:38] = 1, 2  # two packed examples, then padding
  seg[1, :length - 9] = 1
  valid[0, 38:] = False
  return q, k, v, jnp.asarray(valid), jnp.asarray(seg)


def _dense(q, k, v, valid, seg, window, queries=None):
  mask = attention_mask(valid, seg)
  if window:
    mask = mask & band_mask(k.shape[1], window)
  if queries is not None:
    mask = jnp.take_along_axis(mask, queries[:, None, :, None], axis=2)
  return dot_product_attention(q, k, v, mask)


def _check(ours, ref, q, k, v, rows_valid):
  """Forward and gradients (of a random projection of the real rows) within 1e-5."""
  ours, ref = jax.jit(ours), jax.jit(ref)
  out, ref_out = ours(q, k, v), ref(q, k, v)
  w = rows_valid[..., None, None]
  np.testing.assert_allclose(np.where(w, out, 0), np.where(w, ref_out, 0), atol=1e-5)
  cot = jnp.asarray(np.random.default_rng(1).normal(size=out.shape), jnp.float32) * w
  g = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * cot), argnums=(0, 1, 2)))(q, k, v)
  g_ref = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=(0, 1, 2)))(q, k, v)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("window,chunk", [(10, 4), (6, 16), (16, 8)])
def test_local_chunks_equal_the_banded_dense_path(window, chunk):
  q, k, v, valid, seg = _inputs()
  rows = np.asarray(seg) > 0
  _check(lambda *a: blockwise.local_attention(*a, valid, seg, window, chunk),
         lambda *a: _dense(*a, valid, seg, window), q, k, v, rows)


@pytest.mark.parametrize("window", [0, 10])
@pytest.mark.parametrize("few_rows,query_block", [(False, 0), (True, 0), (False, 16), (True, 3)])
def test_key_blocks_with_an_online_softmax_equal_the_dense_path(window, few_rows, query_block):
  q, k, v, valid, seg = _inputs()
  queries = jnp.asarray([[0, 3, 20, 37], [1, 5, 30, 35]], jnp.int32) if few_rows else None
  rows = np.take_along_axis(np.asarray(seg) > 0, np.asarray(queries), 1) if few_rows else np.asarray(seg) > 0
  pick = (lambda x: jnp.take_along_axis(x, queries[:, :, None, None], axis=1)) if few_rows else (lambda x: x)
  _check(lambda q, k, v: blockwise.blocked_attention(pick(q), k, v, valid, seg, block=16, window=window,
                                                     queries=queries, query_block=query_block),
         lambda q, k, v: _dense(pick(q), k, v, valid, seg, window, queries), q, k, v, rows)


@pytest.mark.parametrize("window", [0, 10])
def test_one_head_at_a_time_equals_the_dense_path(window):
  """The CPU's loop over heads (`per_head`): global layers tiled over queries and keys, local ones in chunks."""
  q, k, v, valid, seg = _inputs(h=3)
  _check(lambda *a: blockwise.attention(*a, valid, seg, local=bool(window), window=window, block=16, per_head=True),
         lambda *a: _dense(*a, valid, seg, window), q, k, v, np.asarray(seg) > 0)


@pytest.mark.slow
def test_attention_dropout_keeps_the_expectation():
  """Dropping the unnormalised probabilities per block is dropout on the normalised ones: over many keys the
  mean output is the output without dropout, and each draw differs from it."""
  q, k, v, valid, _ = _inputs(length=24)
  ref = blockwise.blocked_attention(q, k, v, valid, None, block=8)
  draws = jax.vmap(lambda key: blockwise.blocked_attention(q, k, v, valid, None, block=8, dropout_rate=0.3,
                                                           dropout_rng=key))(jax.random.split(jax.random.key(0), 2000))
  assert float(jnp.min(jnp.abs(draws[0] - ref).max())) > 1e-2
  np.testing.assert_allclose(np.mean(np.asarray(draws), 0), ref, atol=0.05)
  local = jax.vmap(lambda key: blockwise.local_attention(q, k, v, valid, None, 8, 4, dropout_rate=0.3,
                                                         dropout_rng=key))(jax.random.split(jax.random.key(1), 2000))
  np.testing.assert_allclose(np.mean(np.asarray(local), 0), blockwise.local_attention(q, k, v, valid, None, 8, 4),
                             atol=0.05)


@pytest.mark.parametrize("impl", [pytest.param("rng", marks=pytest.mark.slow), "hash"])
def test_the_flash_backward_equals_the_derivative_of_the_forward_with_dropout(impl):
  """FlashAttention-2's backward (probabilities recomputed from the log-sum-exp, the same dropout masks drawn
  again) against JAX's derivative of the online-softmax scan itself, with attention dropout on, packed rows, a
  window and a few query rows."""
  q, k, v, valid, seg = _inputs()
  queries = jnp.asarray([[0, 3, 20, 37], [1, 5, 30, 35]], jnp.int32)
  qr = jnp.take_along_axis(q, queries[:, :, None, None], axis=1)
  cot = jnp.asarray(np.random.default_rng(2).normal(size=qr.shape), jnp.float32)
  for kw in (dict(window=10, queries=queries), dict()):
    x = qr if "queries" in kw else q
    c = cot if "queries" in kw else jnp.asarray(np.random.default_rng(3).normal(size=q.shape), jnp.float32)

    def f(q, k, v, flash):
      return jnp.sum(c * blockwise.blocked_attention(q, k, v, valid, seg, block=16, dropout_rate=0.3,
                                                     dropout_rng=jax.random.key(5), dropout_impl=impl,
                                                     flash_backward=flash, **kw))
    ours = jax.jit(jax.grad(lambda *a: f(*a, True), argnums=(0, 1, 2)))(x, k, v)
    ref = jax.jit(jax.grad(lambda *a: f(*a, False), argnums=(0, 1, 2)))(x, k, v)
    for a, b in zip(ours, ref):
      np.testing.assert_allclose(a, b, atol=1e-5)


MODERN = dict(position_embedding="rotary", rope_theta_local=500.0, local_attention=6, global_every=3, ffn="glu",
              layer_norm="pre", use_bias=False, norm_bias=False, num_layers=4)


@pytest.mark.parametrize("scan_unroll,prune", [pytest.param(1, True, marks=pytest.mark.slow), (0, False)])
def test_a_packed_pre_training_model_and_its_gradients_equal_the_dense_path(scan_unroll, prune):
  from test_packing import examples

  from bertjax.data import packing
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=64, scan_unroll=scan_unroll,
                                          prune_final_layer=prune, **MODERN)
  exs = examples()
  lengths = [int(e["input_mask"].sum()) for e in exs]
  rows = packing.plan(lengths, [int(e["masked_lm_weights"].sum()) for e in exs], 45, 12, 4)
  packed = [packing.pack_row([exs[i] for i in r], 45, 12, 4) for r in rows]
  batch = {k: np.stack([p[k] for p in packed]) for k in packed[0]}
  dense = model_lib.BertForPreTraining(cfg)
  ours = model_lib.BertForPreTraining(cfg.replace(attention_impl="blockwise", attention_block=8))
  params = nn.meta.unbox(dense.init(jax.random.key(0), batch)["params"])

  def loss(m, p):
    s = mlm_objective.pretraining_sums(m.apply({"params": p}, batch), batch)
    return s["mlm_loss_sum"] / s["mlm_weight"] + s["nsp_loss_sum"] / s["nsp_weight"]
  (l_ref, g_ref), (l_ours, g_ours) = (jax.jit(jax.value_and_grad(lambda p, m=m: loss(m, p)))(params)
                                      for m in (dense, ours))
  np.testing.assert_allclose(l_ours, l_ref, rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(g_ours), jax.tree_util.tree_leaves(g_ref)):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_blockwise_takes_windows_and_deberta_but_not_alibi():
  with pytest.raises(errors.ConfigError, match="alibi' runs on attention_impl='xla' .*not 'blockwise'"):
    model_lib.BertConfig.from_variant("tiny", position_embedding="alibi", attention_impl="blockwise")
  with pytest.raises(errors.ConfigError, match="attention_block"):
    model_lib.BertConfig.from_variant("tiny", attention_impl="blockwise", attention_block=0)
  model_lib.BertConfig.from_variant("tiny", attention_impl="blockwise", local_attention=8, position_embedding="rotary")
  deberta = dict(position_embedding="disentangled", position_buckets=8, max_relative_positions=64)
  model_lib.BertConfig.from_variant("tiny", attention_impl="blockwise", **deberta)
  with pytest.raises(errors.ConfigError, match="disentangled' with local_attention runs on attention_impl='xla' "):
    model_lib.BertConfig.from_variant("tiny", attention_impl="blockwise", local_attention=8, **deberta)
  from configs import deberta_v3
  assert deberta_v3.get_config("variant=tiny").model.attention_impl == "by_length"
  with pytest.raises(ValueError, match="DeBERTa-v3 attention 'flash': by_length, xla or blockwise"):
    deberta_v3.get_config("variant=tiny,attention=flash")


def test_by_length_runs_blockwise_from_its_length_and_equals_the_dense_path():
  """attention_impl="by_length" (the fine-tuning default): xla below BLOCKWISE_FROM's length, blockwise from it,
  xla for ALiBi; a padded classifier at 256 tokens on the CPU then runs blockwise, with the dense path's logits
  and gradients."""
  from bertjax.model.encoder import context
  cfg = model_lib.BertConfig(vocab_size=97, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_position_embeddings=256, attention_impl="by_length")
  assert [cfg.attention_at(n, "cpu") for n in (255, 256)] == ["xla", "blockwise"]
  assert [cfg.attention_at(n, "gpu") for n in (1023, 1024)] == ["xla", "blockwise"]
  assert cfg.replace(position_embedding="alibi").attention_at(4096, "cpu") == "xla"
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 97, (2, 256)).astype(np.int32)
  mask = (np.arange(256)[None] < np.array([[256], [131]])).astype(np.int32)
  batch = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
  assert "valid" in context(cfg, batch) and "mask" in context(cfg.replace(attention_impl="xla"), batch)
  dense, ours = (model_lib.BertForSequenceClassification(cfg.replace(attention_impl=impl), 3)
                 for impl in ("xla", "by_length"))
  params = nn.meta.unbox(jax.jit(dense.init)(jax.random.key(0), batch)["params"])
  outs = [jax.jit(jax.value_and_grad(lambda p, m=m: jnp.sum(m.apply({"params": p}, batch)["logits"] ** 2)))(params)
          for m in (dense, ours)]
  np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(outs[1][1]), jax.tree_util.tree_leaves(outs[0][1])):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_key_blocks_cover_a_length_with_the_least_padding():
  # (block, length) -> the block size: ceil(length / blocks) rounded up to 8, never above `block`.
  cases = {(256, 256): 256, (256, 384): 192, (256, 288): 144, (256, 8192): 256, (256, 100): 104, (8, 45): 8,
           (16, 45): 16, (4, 45): 4}
  assert {key: blockwise.balanced_block(*key) for key in cases} == cases


@pytest.mark.parametrize("few_rows,query_block,per_head", [(False, 16, False), (True, 0, False), (False, 0, True)])
def test_disentangled_terms_added_block_by_block_equal_the_dense_bias(few_rows, query_block, per_head):
  """DeBERTa's c2p + p2c terms gathered per (query tile, key block) against `layers.disentangled_bias` on the dense
  path: forward and the gradients of q, k, v and both relative projections, over packed rows (positions restart
  per text, so the bucket index is not a function of i - j alone) with padding."""
  from bertjax.model.layers import disentangled_bias, disentangled_terms, relative_buckets
  q, k, v, valid, seg = _inputs(h=2)
  rng = np.random.default_rng(2)
  pos_q, pos_k = (jnp.asarray(rng.normal(size=(16, 2, 8)), jnp.float32) for _ in range(2))
  starts = np.asarray(seg)[:, :, None] == np.asarray(seg)[:, None, :]
  positions = jnp.asarray(np.sum(np.tril(starts), axis=-1) - 1, jnp.int32)  # each text's own positions
  index = relative_buckets(positions, 8, 32)
  queries = jnp.asarray([[0, 3, 20, 37], [1, 5, 30, 35]], jnp.int32) if few_rows else None
  rows = np.take_along_axis(np.asarray(seg) > 0, np.asarray(queries), 1) if few_rows else np.asarray(seg) > 0
  pick = (lambda x: jnp.take_along_axis(x, queries.reshape(queries.shape + (1,) * (x.ndim - 2)), axis=1)
          ) if few_rows else (lambda x: x)

  def ours(q, k, v, pq, pk):
    rel = disentangled_terms(pick(q), k, pq, pk, pick(index))
    if per_head:
      return blockwise.attention(q / np.sqrt(3.0), k, v, valid, seg, local=False, window=0, block=16,
                                 per_head=True, rel=rel)
    return blockwise.blocked_attention(pick(q) / np.sqrt(3.0), k, v, valid, seg, block=16, queries=queries,
                                       query_block=query_block, rel=rel)

  def ref(q, k, v, pq, pk):
    bias = disentangled_bias(q, k, pq, pk, index)
    mask = attention_mask(valid, seg)
    if few_rows:
      bias = jnp.take_along_axis(bias, queries[:, None, :, None], axis=2)
      mask = jnp.take_along_axis(mask, queries[:, None, :, None], axis=2)
    return dot_product_attention(pick(q) / np.sqrt(3.0), k, v, mask, bias=bias)
  args = (q, k, v, pos_q, pos_k)
  out, ref_out = jax.jit(ours)(*args), jax.jit(ref)(*args)
  w = rows[..., None, None]
  np.testing.assert_allclose(np.where(w, out, 0), np.where(w, ref_out, 0), atol=1e-5)
  cot = jnp.asarray(rng.normal(size=out.shape), jnp.float32) * w
  grads = [jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * cot), argnums=tuple(range(5))))(*args)
           for f in (ours, ref)]
  for a, b in zip(*grads):
    np.testing.assert_allclose(a, b, atol=1e-5)
