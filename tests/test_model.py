"""The model against the seeds' equations, a NumPy reference and its own invariants."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import model
from bertjax.core import accounting
from bertjax.objectives import mlm as mlm_objective


def tiny(**kw):
  """The tiny model these tests were written for: every position in the last layer (so "hidden" is [B, L, d]),
  flax's rng dropout and a loop over scanned layers, unless a test asks otherwise."""
  kw = dict(dict(prune_final_layer=False, dropout_impl="rng", scan_unroll=1), **kw)
  return model.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=40, **kw)


def random_batch(cfg, b=3, length=24, p=5, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, cfg.vocab_size, (b, length)).astype(np.int32)
  mask = np.ones((b, length), np.int32)
  lengths = [length, length - 7, 9][:b]
  for i, n in enumerate(lengths):
    mask[i, n:] = 0
  seg = np.zeros_like(ids)
  seg[:, length // 2:] = 1
  pos = np.sort(rng.choice(np.arange(1, 9), (b, p)), axis=1).astype(np.int32)
  return {"input_ids": ids, "input_mask": mask, "segment_ids": seg * mask, "masked_lm_positions": pos,
          "masked_lm_ids": rng.integers(0, cfg.vocab_size, (b, p)).astype(np.int32),
          "masked_lm_weights": np.ones((b, p), np.float32),
          "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32)}


def init(module, cfg, seed=0):
  return nn.meta.unbox(module.init(jax.random.key(seed), model.dummy_batch(cfg))["params"])


def test_seed_worked_example_mlm_loss():
  """Seed 001, 4.3: logits [0.2, 2.1, 0.5, 0.3, 0.1], target "mat" (index 1) -> loss ≈ 0.502."""
  logits = np.array([[[0.2, 2.1, 0.5, 0.3, 0.1]]], np.float32)
  loss = mlm_objective.mlm_loss(logits, np.array([[1]]), np.array([[1.0]]))
  assert abs(float(loss) - 0.502) < 1e-3
  probs = np.asarray(jax.nn.softmax(logits[0, 0]))
  np.testing.assert_allclose(probs, [0.090, 0.605, 0.122, 0.100, 0.082], atol=1e-3)
  uniform = mlm_objective.mlm_loss(np.zeros((1, 1, 5), np.float32), np.array([[1]]), np.array([[1.0]]))
  assert abs(float(uniform) - 1.609) < 1e-3


def test_mlm_loss_counts_only_weighted_positions():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
  ids = rng.integers(0, 7, (2, 3))
  w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, ids[..., None], -1)[..., 0]
  expected = (ce * w).sum() / (w.sum() + 1e-5)
  np.testing.assert_allclose(float(mlm_objective.mlm_loss(logits, ids, w)), expected, rtol=1e-6)


def numpy_attention(x, mask, p, cfg):
  """Seeds' formula, head by head: concat_h softmax(Q_h K_hᵀ/√d_k) V_h, then W_O. Keys masked by padding."""
  out = []
  d_k = cfg.head_dim
  for h in range(cfg.num_heads):
    q = x @ p["query"]["kernel"][:, h] + p["query"]["bias"][h]
    k = x @ p["key"]["kernel"][:, h] + p["key"]["bias"][h]
    v = x @ p["value"]["kernel"][:, h] + p["value"]["bias"][h]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)
    s = np.where(mask[:, None, :] > 0, s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    out.append(a @ v)
  z = np.concatenate(out, axis=-1)
  w_o = p["out"]["kernel"].reshape(cfg.hidden_size, cfg.hidden_size)
  return z @ w_o + p["out"]["bias"]


@pytest.mark.parametrize("impl", ["xla", "auto"])
def test_attention_matches_numpy_with_padding(impl):
  cfg = tiny(attention_impl=impl)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 10, cfg.hidden_size)).astype(np.float32)
  input_mask = np.ones((2, 10), np.int32)
  input_mask[1, 6:] = 0
  att = model.SelfAttention(cfg)
  ctx = {"mask": model.attention_mask(input_mask)}
  params = nn.meta.unbox(att.init(jax.random.key(1), x, ctx, True)["params"])
  got = np.asarray(att.apply({"params": params}, x, ctx, True))
  p = jax.tree_util.tree_map(np.asarray, params)
  want = numpy_attention(x.astype(np.float64), input_mask, p, cfg)
  np.testing.assert_allclose(got, want, atol=2e-5)


def test_no_causal_mask_every_token_sees_the_future():
  cfg = tiny(dropout_rate=0.0, attention_dropout_rate=0.0)
  m = model.BertModel(cfg)
  params = init(m, cfg)
  b = random_batch(cfg, b=1, length=12)
  b["input_mask"][:] = 1
  h1 = np.asarray(m.apply({"params": params}, b)["hidden"])
  b2 = dict(b, input_ids=b["input_ids"].copy())
  b2["input_ids"][0, -1] = (b2["input_ids"][0, -1] + 1) % cfg.vocab_size
  h2 = np.asarray(m.apply({"params": params}, b2)["hidden"])
  assert np.abs(h1[0, 0] - h2[0, 0]).max() > 1e-4  # position 0 depends on the last token


def test_padding_invariance():
  cfg = tiny()
  m = model.BertForPreTraining(cfg)
  params = init(m, cfg)
  b = random_batch(cfg, b=2, length=16)
  b["input_mask"][:] = 1
  b["input_mask"][1, 10:] = 0
  out = m.apply({"params": params}, b)
  longer = {k: v for k, v in b.items()}
  pad = 8
  rng = np.random.default_rng(3)
  longer["input_ids"] = np.concatenate([b["input_ids"], rng.integers(5, 90, (2, pad))], 1).astype(np.int32)
  for k in ("input_mask", "segment_ids"):
    longer[k] = np.concatenate([b[k], np.zeros((2, pad), np.int32)], 1)
  out2 = m.apply({"params": params}, longer)
  np.testing.assert_allclose(out2["hidden"][0, :16], out["hidden"][0], atol=1e-5)
  np.testing.assert_allclose(out2["hidden"][1, :10], out["hidden"][1, :10], atol=1e-5)
  for k in ("pooled", "mlm_logits", "nsp_logits"):
    np.testing.assert_allclose(out2[k], out[k], atol=1e-5)


def test_sinusoidal_table_is_the_seed_formula():
  d, n = 16, 7
  table = model.sinusoidal_positions(n, d)
  for i in range(n):
    for k in range(d // 2):
      assert abs(table[i, 2 * k] - np.sin(i / 10000 ** (2 * k / d))) < 1e-6
      assert abs(table[i, 2 * k + 1] - np.cos(i / 10000 ** (2 * k / d))) < 1e-6


@pytest.mark.parametrize("change", [dict(position_embedding="sinusoidal"), dict(layer_norm="pre"),
                                    dict(hidden_act="relu"), dict(hidden_act="gelu_tanh")])
def test_ablation_variants_run_and_differ(change):
  base_cfg = tiny()
  cfg = tiny(**change)
  b = random_batch(cfg)
  outs = []
  for c in (base_cfg, cfg):
    m = model.BertForPreTraining(c)
    params = init(m, c, seed=0)
    outs.append(m.apply({"params": params}, b))
  assert np.all(np.isfinite(outs[1]["mlm_logits"]))
  # tanh-GELU is within ~1e-3 of exact GELU per activation, so its effect is smaller.
  threshold = 1e-6 if change.get("hidden_act") == "gelu_tanh" else 1e-3
  assert np.abs(np.asarray(outs[0]["hidden"]) - np.asarray(outs[1]["hidden"])).max() > threshold


def test_activations_are_the_named_functions():
  from scipy.special import erf
  x = np.linspace(-5, 5, 101)
  np.testing.assert_allclose(model.ACTIVATIONS["gelu"](x), 0.5 * x * (1 + erf(x / np.sqrt(2))), atol=1e-6)
  tanh = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  np.testing.assert_allclose(model.ACTIVATIONS["gelu_tanh"](x), tanh, atol=1e-6)
  np.testing.assert_allclose(model.ACTIVATIONS["relu"](x), np.maximum(x, 0), atol=1e-7)


def test_exact_gelu_value_gradient_and_dtype():
  """GELU(x) = x·Φ(x) and GELU'(x) = Φ(x) + x·φ(x) (scipy's normal distribution, float64) over [-10, 10]; bfloat16 in
  gives bfloat16 out."""
  from scipy.stats import norm
  x = np.linspace(-10, 10, 4001)
  xf = jnp.asarray(x, jnp.float32)
  np.testing.assert_allclose(model.gelu(xf), x * norm.cdf(x), atol=2e-6, rtol=2e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(model.gelu))(xf), norm.cdf(x) + x * norm.pdf(x), atol=2e-6, rtol=2e-6)
  assert model.gelu(xf.astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_scan_equals_unrolled():
  from bertjax import convert
  cfg = tiny()
  m = model.BertForPreTraining(cfg)
  params = init(m, cfg)
  scfg = cfg.replace(scan_layers=True)
  sparams = convert.stack_layers(params, cfg.num_layers)
  b = random_batch(cfg)
  a = m.apply({"params": params}, b)
  s = model.BertForPreTraining(scfg).apply({"params": sparams}, b)
  np.testing.assert_allclose(a["mlm_logits"], s["mlm_logits"], atol=1e-5)
  rcfg = scfg.replace(remat="full")
  r = model.BertForPreTraining(rcfg).apply({"params": sparams}, b)
  np.testing.assert_allclose(a["mlm_logits"], r["mlm_logits"], atol=1e-5)


@pytest.mark.parametrize("scan,ln,layers,full_check", [pytest.param(True, "post", 3, True, marks=pytest.mark.slow),
                                                        (False, "pre", 2, False),
                                                        (True, "post", 1, False)])
def test_pruned_final_layer_is_exact(scan, ln, layers, full_check):
  """prune_final_layer (the last layer at [CLS] and the masked positions only) keeps the parameters and gives the
  whole model's head outputs; in the default layout also its loss and gradients, training (dropout on) and the
  pruned sentence classifier."""
  cfg = tiny(scan_layers=scan, layer_norm=ln, num_layers=layers)
  full, pruned = model.BertForPreTraining(cfg), model.BertForPreTraining(cfg.replace(prune_final_layer=True))
  params = init(full, cfg)
  shapes = lambda t: jax.tree_util.tree_map(jnp.shape, t)
  assert shapes(init(pruned, cfg)) == shapes(params)
  b = random_batch(cfg)  # row 2 is mostly padding
  a, p = (jax.jit(m.apply)({"params": params}, b) for m in (full, pruned))
  for k in ("mlm_logits", "nsp_logits", "pooled"):
    np.testing.assert_allclose(p[k], a[k], atol=1e-5)
  np.testing.assert_allclose(p["hidden"], np.take_along_axis(a["hidden"], b["masked_lm_positions"][..., None], 1),
                             atol=1e-5)
  if not full_check:
    return

  def loss(m):
    return jax.jit(jax.value_and_grad(
        lambda q: mlm_objective.pretraining_loss(m.apply({"params": q}, b), b)[0]))(params)
  (la, ga), (lp, gp) = loss(full), loss(pruned)
  np.testing.assert_allclose(lp, la, rtol=1e-6)
  for x, y in zip(jax.tree_util.tree_leaves(gp), jax.tree_util.tree_leaves(ga)):
    np.testing.assert_allclose(x, y, atol=1e-6 + 1e-4 * float(np.abs(y).max()))
  train = jax.jit(functools.partial(pruned.apply, deterministic=False))({"params": params}, b,
                                                                        rngs={"dropout": jax.random.key(1)})
  assert train["mlm_logits"].shape == a["mlm_logits"].shape and np.isfinite(train["mlm_logits"]).all()
  assert np.abs(train["mlm_logits"] - p["mlm_logits"]).max() > 1e-3  # dropout is on
  cls_full = model.BertForSequenceClassification(cfg, 3)
  cls_params = init(cls_full, cfg)
  cls_pruned = model.BertForSequenceClassification(cfg.replace(prune_final_layer=True), 3)
  np.testing.assert_allclose(jax.jit(cls_pruned.apply)({"params": cls_params}, b)["logits"],
                             jax.jit(cls_full.apply)({"params": cls_params}, b)["logits"], atol=1e-5)


def test_flop_formula_of_the_pruned_final_layer():
  """With the last layer at Q rows, its query/output projections, FFN and score rows shrink to Q; keys and values
  stay at every position. Hand count of the difference for a small config."""
  cfg = model.BertConfig(vocab_size=50, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=32)
  s, p, d, f, q = 6, 2, 8, 32, 3
  full_layer = 3 * 2 * s * d * d + 2 * s * s * d * 2 + 2 * s * d * d + 2 * s * d * f * 2
  pruned_layer = 2 * q * d * d + 2 * 2 * s * d * d + 2 * q * s * d * 2 + 2 * q * d * d + 2 * q * d * f * 2
  saved = 3 * (full_layer - pruned_layer)
  assert accounting.model_flops_per_sequence(cfg, s, p) - accounting.model_flops_per_sequence(
      cfg, s, p, final_layer_rows=q) == saved


def _all_eqns(jaxpr):
  """Every equation of a jaxpr, those inside sub-jaxprs (pjit, custom_vjp, remat) included."""
  for e in jaxpr.eqns:
    yield e
    for v in e.params.values():
      for sub in (v if isinstance(v, (list, tuple)) else [v]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _all_eqns(inner)


# unroll 2 and 3 (= num_layers) compile as 8 does; they run with -m slow.
@pytest.mark.parametrize("unroll", [pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow),
                                    8])
def test_scan_unroll_changes_neither_parameters_nor_results(unroll):
  """Unrolling the layer scan (3 layers; 2 leaves a remainder; 8 means all of them) keeps the stacked parameter
  layout, the per-layer dropout draws, the outputs and the gradients of the plain scan."""
  cfg = tiny(scan_layers=True).replace(num_layers=3)
  b = random_batch(cfg)
  m1, mu = model.BertForPreTraining(cfg), model.BertForPreTraining(cfg.replace(scan_unroll=unroll))
  params = init(m1, cfg)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(init(mu, cfg))

  def loss(p, m):
    out = m.apply({"params": p}, b, deterministic=False, rngs={"dropout": jax.random.key(4)})
    return jnp.sum(out["mlm_logits"] ** 2) * 1e-3 + jnp.sum(out["nsp_logits"] ** 2)

  (l1, g1), (lu, gu) = (jax.jit(jax.value_and_grad(functools.partial(loss, m=m)))(params) for m in (m1, mu))
  np.testing.assert_allclose(lu, l1, rtol=1e-6)
  for a, c in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(gu)):
    np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-5, atol=1e-6)
  # More than num_layers is one iteration of all layers (no empty loop plus a remainder).
  scans = [e for e in _all_eqns(jax.make_jaxpr(lambda p: loss(p, mu))(params).jaxpr) if e.primitive.name == "scan"]
  assert scans and all(e.params["unroll"] == min(unroll, 3) for e in scans)
  with pytest.raises(ValueError, match="scan_unroll must be a non-negative integer"):
    cfg.replace(scan_unroll=-1)


def test_scan_unroll_auto_unrolls_except_on_tpu():
  """scan_unroll 0 (auto): all layers in one iteration on CPU and GPU, one layer per iteration on TPU; resolved from
  the mesh's devices by train.build, and from the default backend when a module is built directly."""
  cfg = tiny(scan_layers=True).replace(num_layers=3, scan_unroll=0)
  assert [cfg.for_platform(p).scan_unroll for p in ("cpu", "gpu", "tpu")] == [3, 3, 1]
  assert cfg.replace(scan_unroll=2).for_platform("cpu").scan_unroll == 2  # an explicit choice stays
  b = random_batch(cfg)
  mod = model.BertForPreTraining(cfg)
  params = init(mod, cfg)
  jaxpr = jax.make_jaxpr(lambda p: mod.apply({"params": p}, b, deterministic=True)["mlm_logits"])(params).jaxpr
  scans = [e for e in _all_eqns(jaxpr) if e.primitive.name == "scan"]
  assert jax.default_backend() == "cpu" and scans and all(e.params["unroll"] == 3 for e in scans)


def test_dropout_is_active_in_training_mode():
  cfg = tiny()
  m = model.BertForPreTraining(cfg)
  params = init(m, cfg)
  b = random_batch(cfg)
  det = m.apply({"params": params}, b)["mlm_logits"]
  r1 = m.apply({"params": params}, b, deterministic=False, rngs={"dropout": jax.random.key(1)})["mlm_logits"]
  r2 = m.apply({"params": params}, b, deterministic=False, rngs={"dropout": jax.random.key(2)})["mlm_logits"]
  assert np.abs(np.asarray(r1) - np.asarray(det)).max() > 1e-4
  assert np.abs(np.asarray(r1) - np.asarray(r2)).max() > 1e-4


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_names(scan):
  cfg = tiny(scan_layers=scan)
  for module in (model.BertForPreTraining(cfg), model.BertForSequenceClassification(cfg, 3),
                 model.BertForTokenClassification(cfg, 5), model.BertForQuestionAnswering(cfg)):
    boxed = jax.eval_shape(lambda m=module: m.init(jax.random.key(0), model.dummy_batch(cfg))["params"])
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves
    for leaf in leaves:
      assert isinstance(leaf, nn.LogicallyPartitioned), leaf
      assert len(leaf.names) == len(leaf.value.shape)
      assert all(n is not None for n in leaf.names)
      if scan and len(leaf.names) and "layers" in leaf.names:
        assert leaf.names[0] == "layers"


def test_task_heads_shapes():
  cfg = tiny()
  b = random_batch(cfg)
  for module, key, shape in ((model.BertForSequenceClassification(cfg, 3), "logits", (3, 3)),
                             (model.BertForTokenClassification(cfg, 5), "logits", (3, 24, 5)),
                             (model.BertForQuestionAnswering(cfg), "start_logits", (3, 24))):
    out = module.apply({"params": init(module, cfg)}, b)
    assert out[key].shape == shape
  qa = model.BertForQuestionAnswering(cfg)
  out = qa.apply({"params": init(qa, cfg)}, b)
  assert int(np.argmax(out["end_logits"][2])) < 9  # padding positions can never win


# ------------------------------------------------------------------ bad input, before compiling
def test_bad_configs_are_clear_errors():
  with pytest.raises(ValueError, match="not divisible by num_heads"):
    model.BertConfig(hidden_size=100, num_heads=12)
  with pytest.raises(ValueError, match="unknown model variant 'huge'"):
    model.BertConfig.from_variant("huge")
  with pytest.raises(ValueError, match="num_layers must be a positive integer"):
    model.BertConfig(num_layers=0)
  with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
    model.BertConfig(hidden_size=-768)
  with pytest.raises(ValueError, match="hidden_act='swish'"):
    model.BertConfig(hidden_act="swish")
  with pytest.raises(ValueError, match="dropout_impl='philox'"):
    model.BertConfig(dropout_impl="philox")
  with pytest.raises(ValueError, match="unknown BertConfig fields"):
    model.BertConfig.from_dict({"variant": "tiny", "hiden_size": 3})


def test_bad_batches_are_clear_errors():
  cfg = tiny()
  m = model.BertForPreTraining(cfg)
  params = init(m, cfg)
  b = random_batch(cfg)
  with pytest.raises(KeyError, match="missing \\['segment_ids'\\]"):
    m.apply({"params": params}, {k: v for k, v in b.items() if k != "segment_ids"})
  with pytest.raises(KeyError, match="masked_lm_positions"):
    m.apply({"params": params}, {k: v for k, v in b.items() if k != "masked_lm_positions"})
  too_long = random_batch(cfg, b=1, length=cfg.max_position_embeddings + 1)
  with pytest.raises(ValueError, match="exceeds max_position_embeddings 40"):
    m.apply({"params": params}, too_long)
  with pytest.raises(ValueError, match="input_mask has shape"):
    m.apply({"params": params}, dict(b, input_mask=b["input_mask"][:, :5]))


def test_flop_formula_matches_a_hand_count():
  """3x forward FLOPs; forward counted matmul by matmul for a small config."""
  cfg = model.BertConfig(vocab_size=50, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=32)
  s, p, d, f, v = 6, 2, 8, 32, 50
  qkv = 3 * 2 * s * d * d
  scores = 2 * s * s * d
  context = 2 * s * s * d
  out = 2 * s * d * d
  ffn = 2 * s * d * f + 2 * s * f * d
  head = 2 * p * d * d + 2 * p * d * v
  pooler = 2 * d * d
  forward = 2 * (qkv + scores + context + out + ffn) + head + pooler
  assert accounting.model_flops_per_sequence(cfg, s, p) == 3 * forward


@pytest.mark.parametrize("packed", [False, True])
def test_one_hot_embedding_lookup_equals_gather(packed):
  """The one-hot matmul lookup (GPU/TPU) gives the gather's outputs and gradients, with and without position_ids;
  the gather's own reference is a NumPy table lookup."""
  outs = {}
  for how in ("gather", "one_hot"):
    cfg = tiny(embedding_lookup=how, dropout_rate=0.0, attention_dropout_rate=0.0)
    m = model.BertForPreTraining(cfg)
    params = init(m, cfg)
    b = random_batch(cfg)
    if packed:
      b["position_ids"] = (np.arange(24)[None] % 11).repeat(3, 0).astype(np.int32)

    def loss(p, b=b, m=m):
      out = m.apply({"params": p}, b)
      return jnp_sum(out["mlm_logits"]) * 1e-3 + jnp_sum(out["nsp_logits"])
    outs[how] = (m.apply({"params": params}, b), jax.jit(jax.grad(loss))(params))
  (o1, g1), (o2, g2) = outs["gather"], outs["one_hot"]
  np.testing.assert_allclose(np.asarray(o1["mlm_logits"]), np.asarray(o2["mlm_logits"]), atol=1e-5)
  for a, c in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=1e-5)
  emb = g1["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert np.abs(np.asarray(emb)).max() > 0  # the word table gets a gradient through either path


def jnp_sum(x):
  return jax.numpy.sum(x.astype(np.float32))
