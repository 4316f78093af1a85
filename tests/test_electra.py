"""ELECTRA: HF parity of both networks in both directions, the objective (masking, sampling, the stopped gradient,
λ weighting) against NumPy, and the recipe end to end."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from bertjax import convert, model  # noqa: E402
from bertjax.objectives import electra as electra  # noqa: E402

ATOL = 1e-5


def _randomise(m):
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  return m.eval()


def hf_pair(vocab=120, seed=0, embedding=32):
  """A discriminator (hidden 64, embeddings 32 projected) and a generator (hidden 32) as HF builds them."""
  torch.manual_seed(seed)
  common = dict(vocab_size=vocab, embedding_size=embedding, max_position_embeddings=64, num_hidden_layers=2)
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=64, num_attention_heads=2, intermediate_size=128, **common))
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=32, num_attention_heads=1, intermediate_size=128, **common))
  return _randomise(disc), _randomise(gen)


def batch_for(vocab, b=3, length=20, p=4, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (b, length))
  mask = np.ones((b, length), np.int64)
  mask[1, 14:], mask[2, 6:] = 0, 0
  seg = (np.arange(length)[None] >= 5).astype(np.int64) * mask
  pos = np.stack([np.sort(rng.choice(np.arange(1, 6), p, replace=False)) for _ in range(b)])
  return {"input_ids": ids * mask, "input_mask": mask, "segment_ids": seg, "masked_lm_positions": pos}


def hf_outputs(m, batch):
  with torch.no_grad():
    out = m(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
            token_type_ids=torch.tensor(batch["segment_ids"]), output_hidden_states=True)
  return out.logits.numpy(), out.hidden_states[-1].numpy()


def jbatch(batch):
  return {k: np.asarray(v, np.int32) for k, v in batch.items()}


def check_disc(cfg, params, m, batch):
  logits, hidden = hf_outputs(m, batch)
  out = electra.ElectraDiscriminator(cfg).apply({"params": params}, jbatch(batch))
  valid = batch["input_mask"].astype(bool)
  d = {"disc_logits": np.abs(np.asarray(out["disc_logits"]) - logits)[valid].max(),
       "hidden": np.abs(np.asarray(out["hidden"]) - hidden)[valid].max()}
  assert all(v <= ATOL for v in d.values()), d


def check_gen(cfg, params, m, batch):
  logits, hidden = hf_outputs(m, batch)
  out = model.for_pretraining(cfg).apply({"params": params}, jbatch(batch))
  want = np.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)
  np.testing.assert_allclose(np.asarray(out["mlm_logits"]), want, atol=ATOL)
  np.testing.assert_allclose(np.asarray(out["hidden"]),
                             np.take_along_axis(hidden, batch["masked_lm_positions"][..., None], axis=1), atol=ATOL)


@pytest.mark.parametrize("scan", [False, True])
def test_both_networks_match_hf_both_directions(tmp_path, scan):
  disc, gen = hf_pair()
  disc.save_pretrained(tmp_path / "disc")
  gen.save_pretrained(tmp_path / "gen")
  batch = batch_for(120)
  dcfg, dparams = convert.from_hf(str(tmp_path / "disc"), scan_layers=scan)
  gcfg, gparams = convert.from_hf(str(tmp_path / "gen"), scan_layers=scan)
  assert dcfg.embed_dim == 32 and dcfg.hidden_size == 64 and gcfg.hidden_size == 32
  check_disc(dcfg, dparams, disc, batch)
  check_gen(gcfg, gparams, gen, batch)
  # export: bertjax's (perturbed) parameters through the joint tree and back out as HF's two folders
  dcfg, gcfg, joint = convert.electra_from_hf(str(tmp_path / "disc"), str(tmp_path / "gen"), scan_layers=scan)
  rng = np.random.default_rng(1)
  joint = jax.tree_util.tree_map(lambda a: np.asarray(a) + rng.normal(0, 0.01, np.shape(a)).astype(np.float32), joint)
  convert.electra_to_hf(dcfg, gcfg, joint, str(tmp_path / "out"))
  back_disc = transformers.AutoModelForPreTraining.from_pretrained(str(tmp_path / "out" / "discriminator"))
  back_gen = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out" / "generator"))
  assert type(back_disc).__name__ == "ElectraForPreTraining" and type(back_gen).__name__ == "ElectraForMaskedLM"
  d, g = electra.split(joint)
  check_disc(dcfg, d, back_disc.eval(), batch_for(120, seed=2))
  check_gen(gcfg, g, back_gen.eval(), batch_for(120, seed=2))


def _tiny_joint(mask_prob=0.15, temperature=1.0, seed=0):
  disc = model.BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                          embedding_size=16, max_position_embeddings=32, nsp_head=False, dropout_rate=0.0,
                          attention_dropout_rate=0.0)
  gen = electra.generator_config(disc, 0.5)
  m = electra.ElectraForPreTraining(disc, gen, mask_prob=mask_prob, temperature=temperature, special_ids=(1, 2),
                                    mask_id=3)
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 50, (4, 24)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 15:], mask[3, 5:] = 0, 0
  ids = ids * mask
  ids[:, 0] = 1
  ids[np.arange(4), mask.sum(1) - 1] = 2
  batch = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
           "masked_lm_positions": np.zeros((4, 6), np.int32), "masked_lm_ids": np.zeros((4, 6), np.int32),
           "masked_lm_weights": np.zeros((4, 6), np.float32)}
  params = nn.meta.unbox(m.init({"params": jax.random.key(seed), "electra": jax.random.key(1)}, batch)["params"])
  return m, params, batch


@pytest.mark.slow
def test_masking_and_corruption_follow_the_original():
  m, params, batch = _tiny_joint(mask_prob=0.2)
  ids, mask = batch["input_ids"], batch["input_mask"]
  for k in range(5):
    out = jax.device_get(m.apply({"params": params}, batch, rngs={"electra": jax.random.key(k)}))
    w = out["masked_lm_weights"] > 0
    want = np.clip(np.round(mask.sum(1) * 0.2), 1, 6)  # max(1, min(P, round(n·p))), n = every real token
    np.testing.assert_array_equal(w.sum(1), want)
    for r in range(4):
      pos = out["masked_lm_positions"][r][w[r]]
      assert len(set(pos)) == len(pos) and all(mask[r, pos] == 1) and not np.isin(ids[r, pos], (1, 2)).any()
      np.testing.assert_array_equal(out["masked_lm_ids"][r][w[r]], ids[r, pos])
    expect = ids.copy()
    rows, cols = np.nonzero(w)
    expect[rows, out["masked_lm_positions"][rows, cols]] = out["sampled_ids"][rows, cols]
    np.testing.assert_array_equal(out["fake_ids"], expect)  # the samples in place, nothing else changed
    np.testing.assert_array_equal(out["disc_labels"], (expect != ids).astype(np.float32))


@pytest.mark.slow
def test_replacements_are_drawn_from_the_tempered_softmax():
  """E[onehot(sample) - softmax(logits / T)] = 0 over many draws: the sampler is softmax(logits/T), at T = 2."""
  m, params, batch = _tiny_joint(temperature=2.0)
  # A peaked generator (a spread output bias), so that the temperature changes the distribution markedly.
  params["generator"]["mlm_bias"] = np.random.default_rng(0).normal(0, 3.0, 50).astype(np.float32)
  apply = jax.jit(lambda k: m.apply({"params": params}, batch, rngs={"electra": k}))
  total, n = np.zeros(50), 0
  var = np.zeros(50)
  for k in range(600):
    out = jax.device_get(apply(jax.random.key(k)))
    w = out["masked_lm_weights"] > 0
    logits = out["mlm_logits"][w] / 2.0
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    total += (np.eye(50)[out["sampled_ids"][w]] - p).sum(0)
    var += (p * (1 - p)).sum(0)
    n += int(w.sum())
  z = total / np.sqrt(np.maximum(var, 1e-9))
  assert n > 2000 and np.abs(z).max() < 4.5, np.abs(z).max()


def test_loss_is_gen_plus_lambda_disc_and_the_sample_stops_the_gradient():
  m, params, batch = _tiny_joint()
  out = jax.device_get(m.apply({"params": params}, batch, rngs={"electra": jax.random.key(3)}))
  w = out["masked_lm_weights"]
  logits = out["mlm_logits"].astype(np.float64)
  top = logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits - top).sum(-1, keepdims=True)) - top
  ce = -np.take_along_axis(logp, out["masked_lm_ids"][..., None], -1)[..., 0]
  gen = (ce * w).sum() / (w.sum() + 1e-6)
  z, y, t = out["disc_logits"].astype(np.float64), out["disc_labels"], batch["input_mask"]
  bce = -(y * np.log(1 / (1 + np.exp(-z))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-z))))
  disc = (bce * t).sum() / (t.sum() + 1e-6)
  loss, metrics = electra.electra_loss(electra.electra_sums(out, batch), 50.0)
  np.testing.assert_allclose(float(loss), gen + 50.0 * disc, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["disc_baseline_accuracy"]), 1 - (y * t).sum() / t.sum(), rtol=1e-6)

  def disc_only(p):
    o = m.apply({"params": p}, batch, rngs={"electra": jax.random.key(3)})
    s = electra.electra_sums(o, batch)
    return s["disc_loss_sum"]
  g = jax.jit(jax.grad(disc_only))(params)
  gen_grads = jax.tree_util.tree_leaves(g["generator"])
  assert all(float(np.abs(x).max()) == 0.0 for x in gen_grads)  # no gradient through the sampled tokens
  assert float(np.abs(g["embeddings"]["word_embeddings"]["embedding"]).max()) > 0  # shared: the discriminator's


@pytest.mark.slow
def test_fine_tuning_starts_from_an_electra_discriminator(tmp_path):
  import helpers

  from bertjax.data import tokenizer
  helpers.write_sentiment(tmp_path / "corpus.txt", 300, 5)
  vocab = tokenizer.train([tmp_path / "corpus.txt"], tmp_path / "tok", vocab_size=200)
  n = tokenizer.load(vocab).vocab_size
  disc, _ = hf_pair(vocab=n)
  disc.save_pretrained(tmp_path / "hf")
  import shutil
  shutil.copy(vocab, tmp_path / "hf" / "vocab.txt")
  # A randomly initialised discriminator sits at chance until it finds the planted word, then jumps to 1.0;
  # when it jumps depends on the example order: 6 epochs leave room for every order tried (packed or not).
  out = helpers.finetune_sentiment(tmp_path, tmp_path / "hf", epochs=6)
  assert out["report"]["best"]["metrics"]["validation"]["accuracy"] > 0.9, out["report"]


def test_discriminator_auc_matches_sklearn():
  """The AUC from 200 probability bins (the original's tf.metrics.auc thresholds) against sklearn's exact one."""
  from sklearn.metrics import roc_auc_score
  rng = np.random.default_rng(0)
  y = (rng.random(5000) < 0.15).astype(np.float32)
  z = rng.normal(0, 1.5, 5000) + 1.2 * y
  bins = np.clip(np.floor(1 / (1 + np.exp(-z)) * 200), 0, 199).astype(int)
  pos, neg = np.bincount(bins, y, 200), np.bincount(bins, 1 - y, 200)
  assert float(electra.auc_from_histograms(pos, neg)) == pytest.approx(roc_auc_score(y, z), abs=3e-3)


@pytest.mark.slow
def test_accumulated_step_equals_one_step_of_the_whole_batch():
  """grad_accum_steps=4 over 16 rows gives the gradient, the loss and its metrics of one step over the 16 rows
  within 1e-6 relative: each micro-batch draws its rows' masks and samples of the whole batch's draw and divides by
  the whole batch's totals (were it to mask with its own draw or normalise by its own counts, the losses would
  differ by far more). The optimizer keeps the gradient it is given as its state, so the step hands it back."""
  import optax

  from bertjax import pretrain
  from bertjax.core import trainer
  from configs import electra as electra_config
  rng = np.random.default_rng(0)
  b, length = 16, 32
  lengths = rng.integers(12, length + 1, (b, 1))
  mask = (np.arange(length)[None] < lengths).astype(np.int32)
  ids = rng.integers(5, 128, (b, length)).astype(np.int32)
  ids[:, 0] = 2
  ids[np.arange(b), lengths[:, 0] - 1] = 3
  batch = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(mask),
           "masked_lm_positions": np.zeros((b, 5), np.int32), "masked_lm_ids": np.zeros((b, 5), np.int32),
           "masked_lm_weights": np.zeros((b, 5), np.float32), "next_sentence_weights": np.ones((b,), np.float32)}
  out = []
  for accum in (1, 4):
    c = electra_config.get_config("variant=tiny,seq=32,preds=5,batch=16,steps=6,shard=dp,vocab=128")
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    c.model.hidden_size, c.model.num_heads, c.model.intermediate_size, c.model.num_layers = 64, 2, 128, 1
    c.train.grad_accum_steps = accum
    t = pretrain.build(c, model.BertConfig.from_dict(c.model.to_dict()), jax.devices()[:1], special_ids=(2, 3, 4))
    state = trainer.init_state(t, 0)
    keep = optax.GradientTransformation(lambda params: jax.tree_util.tree_map(np.zeros_like, params),
                                        lambda grads, state, params=None: (grads, grads))
    state = state.replace(opt_state=keep.init(state.params))
    new, metrics = jax.jit(electra.train_step(t.module, keep, lambda step: 1.0, c))(state, batch)
    out.append((jax.device_get(new.opt_state), jax.device_get(metrics)))
  (g1, m1), (g4, m4) = out
  for key in ("loss", "mlm_loss", "disc_loss", "mlm_accuracy", "disc_accuracy"):
    assert float(m4[key]) == pytest.approx(float(m1[key]), rel=1e-6), key
  scale = max(float(np.abs(a).max()) for a in jax.tree_util.tree_leaves(g1))  # leaves of zero gradient hold noise
  for a, b_ in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g4)):
    np.testing.assert_allclose(b_, a, rtol=1e-6, atol=1e-6 * scale)
