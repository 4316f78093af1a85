"""Each architecture switch against a NumPy transcription of its published formula (float64), through the whole
encoder: rotary positions (RoFormer, rotate-half form) with a global and a local base, ALiBi (Press et al.,
symmetric as in MosaicBERT), RMSNorm, GeGLU/SwiGLU, sliding-window attention with a global layer every N,
biases and norms switched off, RoBERTa's position offset, a padded vocabulary."""
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import errors, model


def np_norm(x, p, cfg):
  if cfg.norm == "rmsnorm":
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.layer_norm_eps) * p["scale"]
  mu = x.mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + cfg.layer_norm_eps) * p["scale"]
  return y + p["bias"] if cfg.norm_bias else y


def np_act(name, x):
  erf = np.vectorize(math.erf)
  return {"gelu": lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))), "relu": lambda v: np.maximum(v, 0),
          "silu": lambda v: v / (1 + np.exp(-v)),
          "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))}[name](x)


def np_dense(x, p, in_dims=1):
  k = p["kernel"]
  y = np.tensordot(x, k, axes=(tuple(range(x.ndim - in_dims, x.ndim)), tuple(range(in_dims))))
  return y + p["bias"] if "bias" in p else y


def np_rotate(x, pos, theta):
  """RoFormer's rotation of each pair (x_k, x_{k+D/2}) of x [L, D] by angle pos·θ^(-2k/D), pair by pair."""
  d = x.shape[-1]
  out = np.empty_like(x)
  for k in range(d // 2):
    ang = pos * theta ** (-2.0 * k / d)  # [L]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[:, k], x[:, k + d // 2]
    out[:, k], out[:, k + d // 2] = a * c - b * s, a * s + b * c
  return out


def np_slopes(n):
  """ALiBi's slopes from the paper's recipe: 2^(-8/n·i), i = 1..n, for n a power of two; otherwise the closest
  lower power's slopes then every other slope of twice that power."""
  def geo(m):
    return [2 ** (-8.0 * i / m) for i in range(1, m + 1)]
  c = 2 ** math.floor(math.log2(n))
  return np.array(geo(c) + geo(2 * c)[0::2][:n - c])


def np_encoder(params, batch, cfg):
  """The encoder written out in NumPy, one example at a time."""
  p = params
  outs = []
  for b in range(batch["input_ids"].shape[0]):
    ids, mask = batch["input_ids"][b], batch["input_mask"][b]
    n = len(ids)
    pos = np.arange(n)
    x = p["embeddings"]["word_embeddings"]["embedding"][ids].astype(np.float64)
    if cfg.type_vocab_size:
      x = x + p["embeddings"]["token_type_embeddings"]["embedding"][batch["segment_ids"][b]]
    if cfg.position_embedding == "learned":
      x = x + p["embeddings"]["position_embeddings"]["embedding"][pos + cfg.position_offset]
    if cfg.embedding_norm:
      x = np_norm(x, p["embeddings"]["ln"], cfg)
    for i in range(cfg.num_layers):
      lp = p["encoder"][f"layer_{i}"]
      local = cfg.local_attention and i % cfg.global_every != 0
      reach = cfg.local_attention // 2 if local else n
      allowed = (mask[None, :] > 0) & (np.abs(pos[:, None] - pos[None, :]) <= reach)

      def attend(h):
        heads = []
        for hd in range(cfg.num_heads):
          def proj(name):
            w = lp["attention"][name]
            y = h @ w["kernel"][:, hd]
            return y + w["bias"][hd] if "bias" in w else y
          q, k, v = proj("query"), proj("key"), proj("value")
          if cfg.position_embedding == "rotary":
            theta = cfg.rope_theta_local if local and cfg.rope_theta_local else cfg.rope_theta
            q, k = np_rotate(q, pos, theta), np_rotate(k, pos, theta)
          s = q @ k.T / math.sqrt(cfg.head_dim)
          if cfg.position_embedding == "alibi":
            s = s - np_slopes(cfg.num_heads)[hd] * np.abs(pos[:, None] - pos[None, :])
          s = np.where(allowed, s, -1e30)  # a padding query with no key in its window: uniform, never NaN
          a = np.exp(s - s.max(-1, keepdims=True))
          heads.append((a / a.sum(-1, keepdims=True)) @ v)
        return np_dense(np.stack(heads, 1), lp["attention"]["out"], in_dims=2)

      def ffn(h):
        u = np_act(cfg.hidden_act, np_dense(h, lp["mlp"]["wi"]))
        if cfg.ffn == "glu":
          u = u * np_dense(h, lp["mlp"]["wg"])
        return np_dense(u, lp["mlp"]["wo"])

      if cfg.layer_norm == "post":
        x = np_norm(x + attend(x), lp["attention_ln"], cfg)
        x = np_norm(x + ffn(x), lp["mlp_ln"], cfg)
      else:
        h = x if (i == 0 and not cfg.first_attention_norm) else np_norm(x, lp["attention_ln"], cfg)
        x = x + attend(h)
        x = x + ffn(np_norm(x, lp["mlp_ln"], cfg))
    if cfg.layer_norm == "pre":
      x = np_norm(x, p["encoder"]["final_ln"], cfg)
    outs.append(x)
  return np.stack(outs)


BASE = dict(vocab_size=97, hidden_size=48, num_layers=4, num_heads=4, intermediate_size=64,
            max_position_embeddings=40, dropout_rate=0.0, attention_dropout_rate=0.0, scan_layers=False,
            prune_final_layer=False)
CASES = {
    "rotary-local-global": dict(position_embedding="rotary", rope_theta=160000.0, rope_theta_local=10000.0,
                                local_attention=6, global_every=3, layer_norm="pre", ffn="glu", use_bias=False,
                                norm_bias=False, first_attention_norm=False, type_vocab_size=0),
    "alibi-rmsnorm-swiglu": dict(position_embedding="alibi", norm="rmsnorm", norm_bias=False, ffn="glu",
                                 hidden_act="silu", layer_norm="pre", num_heads=6),
    "alibi-3-heads": dict(position_embedding="alibi", num_heads=3, hidden_size=48),
    "geglu-post-nobias": dict(ffn="glu", use_bias=False, embedding_norm=False),
    "learned-offset-1-segment": dict(position_offset=2, type_vocab_size=1, layer_norm_eps=1e-5),
    "rotary-banded-every2": dict(position_embedding="rotary", local_attention=4, global_every=2, norm="rmsnorm",
                                 norm_bias=False, layer_norm="pre"),
}


def _batch(cfg, b=3, length=20, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, cfg.vocab_size, (b, length)).astype(np.int32)
  mask = np.ones((b, length), np.int32)
  mask[1, 13:] = 0
  mask[2, 7:] = 0
  seg = np.zeros_like(ids) if cfg.type_vocab_size < 2 else (np.arange(length)[None] >= 8).astype(np.int32) * mask
  return {"input_ids": ids, "input_mask": mask, "segment_ids": seg}


def _perturbed_params(cfg, batch, seed=1):
  params = nn.meta.unbox(model.BertModel(cfg).init(jax.random.key(seed), batch)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda a: np.asarray(a) + rng.normal(0, 0.05, np.shape(a)).astype(np.float32),
                                params)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scan", [False, True])
def test_encoder_matches_numpy_formulas(case, scan):
  cfg = model.BertConfig(**{**BASE, **CASES[case]})
  batch = _batch(cfg)
  params = _perturbed_params(cfg, batch)
  want = np_encoder(params, batch, cfg)
  run_cfg, run_params = cfg, params
  if scan:
    from bertjax import convert
    run_cfg = cfg.replace(scan_layers=True)
    run_params = convert.stack_layers({"bert": params}, cfg.num_layers)["bert"]
  got = np.asarray(model.BertModel(run_cfg).apply({"params": run_params}, batch, pool=False)["hidden"])
  valid = batch["input_mask"].astype(bool)
  np.testing.assert_allclose(got[valid], want[valid], atol=2e-5, rtol=1e-4)


def test_rotary_positions_are_relative():
  """q·k after rotation depends on positions only through their difference (the property RoPE is built for)."""
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(1, 1, 1, 8)).astype(np.float32), rng.normal(size=(1, 1, 1, 8)).astype(np.float32)
  dots = []
  for i, j in ((3, 1), (10, 8), (27, 25)):
    cq, sq = model.rotary_tables(np.array([[i]]), 8, 10000.0)
    ck, sk = model.rotary_tables(np.array([[j]]), 8, 10000.0)
    dots.append(float(np.sum(np.asarray(model.apply_rotary(q, cq, sq)) * np.asarray(model.apply_rotary(k, ck, sk)))))
  np.testing.assert_allclose(dots, dots[0], rtol=1e-5)


def test_alibi_slopes_are_the_papers():
  np.testing.assert_allclose(model.alibi_slopes(8), [2 ** -(i + 1) for i in range(8)], rtol=1e-7)
  np.testing.assert_allclose(model.alibi_slopes(12), np_slopes(12), rtol=1e-7)


def test_padded_vocabulary_is_never_predicted():
  cfg = model.BertConfig(**{**BASE, "vocab_size": 97, "vocab_multiple": 64})
  batch = dict(_batch(cfg), masked_lm_positions=np.zeros((3, 2), np.int32))
  params = nn.meta.unbox(model.for_pretraining(cfg).init(jax.random.key(0), batch)["params"])
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (128, 48)
  out = model.for_pretraining(cfg).apply({"params": params}, batch)
  assert out["mlm_logits"].shape == (3, 2, 97)


def test_mlm_only_module_has_no_pooler_or_nsp():
  cfg = model.BertConfig(**{**BASE, "nsp_head": False})
  batch = dict(_batch(cfg), masked_lm_positions=np.zeros((3, 2), np.int32))
  for prune in (False, True):
    c = cfg.replace(prune_final_layer=prune)
    params = nn.meta.unbox(model.for_pretraining(c).init(jax.random.key(0), batch)["params"])
    assert "nsp" not in params and "pooler" not in params["bert"]
    out = model.for_pretraining(c).apply({"params": params}, batch)
    assert set(out) == {"hidden", "mlm_logits"}


@pytest.mark.parametrize("fields,match", [
    (dict(local_attention=64), "not shorter than max_position_embeddings"),
    (dict(local_attention=5), "even window"),
    (dict(position_embedding="rotary", position_offset=2), "offsets a learned position table"),
    (dict(rope_theta=5e5), "not 'rotary'"),
    (dict(norm="rmsnorm"), "set norm_bias=False"),
    (dict(position_embedding="alibi", attention_impl="pallas"), "runs on attention_impl='xla'"),
    (dict(first_attention_norm=False), "pre-norm stacks"),
    (dict(ffn="swiglu"), "BertConfig.ffn"),
])
def test_bad_combinations_are_named_config_errors(fields, match):
  with pytest.raises(errors.ConfigError, match=match):
    model.BertConfig(**{**BASE, **fields})


# Which backend adds which score terms, written out from the kernels' own code paths (xla adds any bias and
# banded mask; blockwise makes windows and DeBERTa's terms block by block, one of them per layer; splash takes a
# window as its kernel mask; pallas and jax.nn.dot_product_attention take a plain mask only).
RUNS = {"xla": {(), ("alibi",), ("disentangled",), ("window",), ("alibi", "window"), ("disentangled", "window")},
        "blockwise": {(), ("disentangled",), ("window",)}, "splash": {(), ("window",)}, "pallas": {()},
        "cudnn": {()}, "auto": {()}}
TERMS = {"alibi": dict(position_embedding="alibi"), "disentangled": dict(position_embedding="disentangled"),
         "window": dict(local_attention=8)}


@pytest.mark.parametrize("impl", sorted(RUNS))
def test_each_backend_takes_exactly_the_score_terms_it_runs(impl):
  """The config accepts a family's score terms on a backend exactly where that backend runs them, and "by_length"
  takes every family, running blockwise only where blockwise runs its terms."""
  for terms in [(), ("alibi",), ("disentangled",), ("window",), ("alibi", "window"), ("disentangled", "window")]:
    fields = {**BASE, "attention_impl": impl}
    for t in terms:
      fields.update(TERMS[t])
    if terms in RUNS[impl]:
      assert model.BertConfig(**fields).score_terms == frozenset(terms)
    else:
      with pytest.raises(errors.ConfigError, match=f"runs on attention_impl='xla'.*not '{impl}'"):
        model.BertConfig(**fields)
    by_length = model.BertConfig(**{**fields, "attention_impl": "by_length"}).attention_at(4096, "cpu")
    assert by_length == ("blockwise" if terms in RUNS["blockwise"] else "xla")
