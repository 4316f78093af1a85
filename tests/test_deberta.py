"""DeBERTa-v2/v3 (disentangled attention over log-bucketed relative positions, no absolute positions) against HF
transformers' PyTorch DebertaV2ForMaskedLM: forward and gradients from the same weights, both ways, with buckets
small enough that the log branch of the relative positions is exercised."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bertjax import convert  # noqa: E402
from bertjax import model as model_lib  # noqa: E402
from bertjax.convert.table import ConversionError  # noqa: E402

L = 40


def _deberta(legacy=True, seed=0, **kw):
  torch.manual_seed(seed)
  cfg = transformers.DebertaV2Config(
      vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=64, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
      max_relative_positions=64, share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
      type_vocab_size=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, legacy=legacy, **kw)
  m = transformers.DebertaV2ForMaskedLM(cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(torch.randn_like(p) * 0.3)  # off their init, so that a misplaced bias or norm shows
  return m


def _batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 120, (3, L)).astype(np.int32)
  mask = np.ones((3, L), np.int32)
  mask[1, 25:], mask[2, 9:] = 0, 0
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
          "masked_lm_positions": np.broadcast_to(np.arange(L, dtype=np.int32), (3, L)).copy()}


def _hf_logits(m, b):
  with torch.no_grad():
    return m(input_ids=torch.tensor(b["input_ids"]).long(), attention_mask=torch.tensor(b["input_mask"]).long()
             ).logits.numpy()


@pytest.mark.parametrize("legacy,impl", [(True, "xla"), (True, "blockwise"),
                                         pytest.param(False, "xla", marks=pytest.mark.slow)],
                         ids=["cls_head", "cls_head-blockwise", "lm_predictions_head"])
def test_deberta_mlm_forward_and_gradients_equal_hf_both_ways(tmp_path, legacy, impl):
  """blockwise: the disentangled terms added per key block of 16 (rows of 40 tokens: three blocks, the last
  padded)."""
  m = _deberta(legacy)
  m.save_pretrained(tmp_path / "hf")
  cfg, params = convert.from_hf(str(tmp_path / "hf"), head="pretraining", dropout_rate=0.0,
                                attention_dropout_rate=0.0, attention_impl=impl, attention_block=16)
  assert (cfg.position_embedding, cfg.position_buckets, cfg.max_relative_positions, cfg.type_vocab_size) == (
      "disentangled", 8, 64, 0)
  b = _batch()
  module = model_lib.BertForPreTraining(cfg)
  real = b["input_mask"] > 0
  ours = np.asarray(module.apply({"params": params}, b)["mlm_logits"])
  np.testing.assert_allclose(ours[real], _hf_logits(m, b)[real], atol=1e-5)
  # Gradients of the masked-LM loss over the real tokens, every parameter, against torch's autograd.
  labels = np.where(real, np.random.default_rng(1).integers(0, 120, real.shape), -100)

  def loss(p):
    logits = module.apply({"params": p}, b)["mlm_logits"]
    ll = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(ll, jnp.asarray(np.maximum(labels, 0))[..., None], axis=-1)[..., 0]
    return -jnp.sum(picked * real) / real.sum()
  grads = jax.grad(loss)(params)
  m.zero_grad()
  out = m(input_ids=torch.tensor(b["input_ids"]).long(), attention_mask=torch.tensor(b["input_mask"]).long(),
          labels=torch.tensor(labels).long())
  out.loss.backward()
  np.testing.assert_allclose(float(loss(params)), float(out.loss), rtol=1e-5)
  want = {n: p.grad.numpy() for n, p in m.named_parameters() if p.grad is not None}
  got = convert.table.dump(convert.family("deberta-v2"), cfg, jax.device_get(grads), "pretraining")
  checked = 0
  legacy_names = {f"cls.predictions.transform.{n}": f"lm_predictions.lm_head.{n}"
                  for n in ("dense.weight", "dense.bias", "LayerNorm.weight", "LayerNorm.bias")}
  legacy_names["cls.predictions.bias"] = "lm_predictions.lm_head.bias"
  for name, g in got.items():
    hf_name = name if name in want else legacy_names.get(name, name)
    if hf_name in want:
      np.testing.assert_allclose(g, want[hf_name], atol=2e-5, rtol=1e-4, err_msg=name)
      checked += 1
  assert checked >= len(want) - 1, (checked, len(want))  # every trained tensor (the tied decoder is one)
  # And back: bertjax's export is an HF folder whose model computes the same logits.
  convert.to_hf(cfg, params, str(tmp_path / "back"))
  again = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "back")).eval()
  assert type(again).__name__ == "DebertaV2ForMaskedLM"
  np.testing.assert_allclose(_hf_logits(again, b)[real], ours[real], atol=1e-5)


def test_relative_buckets_equal_hf_make_log_bucket_position():
  from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

  from bertjax.model.layers import relative_buckets
  for buckets, max_pos in ((8, 64), (256, 512), (32, 128)):
    n = max_pos + 16  # every bucket, and distances past the last
    rel = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    want = torch.clamp(make_log_bucket_position(rel, buckets, max_pos).long() + buckets, 0, 2 * buckets - 1)
    got = relative_buckets(jnp.arange(n)[None], buckets, max_pos)[0]
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_deberta_options_bertjax_does_not_compute_are_one_line(tmp_path):
  _deberta(conv_kernel_size=3).save_pretrained(tmp_path / "conv")
  with pytest.raises(ConversionError, match=r"options bertjax does not compute: conv_kernel_size 3"):
    convert.from_hf(str(tmp_path / "conv"), head="pretraining")


def test_deberta_v3_tokenizer_ids_equal_hf_on_several_scripts(tmp_path):
  """A DeBERTa-v3-style tokenizer built by HF's own DebertaV2TokenizerFast over a sentencepiece unigram vocabulary
  trained here ([PAD] [CLS] [SEP] [UNK] first, [MASK] last, as DeBERTa-v3 lays them out), saved, and read by
  bertjax from its tokenizer.json: the same ids on text in several scripts, the special ids in their roles."""
  import sentencepiece as spm
  from test_families import MULTILINGUAL

  from bertjax.data import tokenizer
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(MULTILINGUAL * 20 + [np.__doc__ or ""]), encoding="utf-8")
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=300,
                                 model_type="unigram", character_coverage=1.0, normalization_rule_name="identity",
                                 hard_vocab_limit=False, minloglevel=2)
  sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
  vocab = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0)]
  vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())] + [("[MASK]", 0.0)]
  hf = transformers.DebertaV2TokenizerFast(vocab=vocab, unk_id=3)
  hf.save_pretrained(tmp_path / "tok")
  hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
  tok = tokenizer.load(str(tmp_path / "tok" / "tokenizer.json"))
  assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.mask_id) == (
      hf.pad_token_id, hf.cls_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id) == (0, 1, 2, 3,
                                                                                                len(vocab) - 1)
  for text in MULTILINGUAL + ["Fill the [MASK] in, please."]:
    ids = hf(text, add_special_tokens=False)["input_ids"]
    assert tok.encode(text) == ids, text
    assert len(set(ids) - {hf.unk_token_id}) > len(ids) // 2, text  # real pieces, not a string of [UNK]


@pytest.mark.slow
def test_gdes_splits_the_embedding_gradient_between_the_table_and_the_delta():
  """Gradient-disentangled embedding sharing, from the same start (Δ = 0, so the same forward): the word table's
  gradient is the generator's loss alone, Δ's the discriminator's, and together they are shared ELECTRA's; the
  discriminator's exported table is E + Δ."""
  from bertjax.objectives import electra
  disc = model_lib.BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                              max_position_embeddings=32, nsp_head=False, dropout_rate=0.0,
                              attention_dropout_rate=0.0, position_embedding="disentangled", position_buckets=4,
                              max_relative_positions=32, type_vocab_size=0, attention_impl="xla")
  gen = electra.generator_config(disc, 1.0, 1.0)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 50, (4, 24)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 1, 2
  batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
           "masked_lm_positions": np.zeros((4, 6), np.int32), "masked_lm_ids": np.zeros((4, 6), np.int32),
           "masked_lm_weights": np.zeros((4, 6), np.float32)}
  models = {s: electra.ElectraForPreTraining(disc, gen, special_ids=(1, 2), mask_id=3, embedding_sharing=s)
            for s in ("shared", "gdes")}
  params = __import__("flax").linen.meta.unbox(models["gdes"].init(
      {"params": jax.random.key(0), "electra": jax.random.key(1)}, batch)["params"])
  assert float(np.abs(params["gdes"]["delta"]).max()) == 0.0
  shared_params = {k: v for k, v in params.items() if k != "gdes"}

  def grad(name, p, part):
    def f(q):
      o = models[name].apply({"params": q}, batch, rngs={"electra": jax.random.key(3)})
      s = electra.electra_sums(o, batch)
      total, m = electra.electra_loss(s, 50.0)
      return {"all": total, "gen": m["mlm_loss"]}[part]
    return jax.grad(f)(p)
  g_shared, g_gdes, g_gen = grad("shared", shared_params, "all"), grad("gdes", params, "all"), grad("gdes", params,
                                                                                                     "gen")
  word = lambda g: np.asarray(g["embeddings"]["word_embeddings"]["embedding"])  # noqa: E731
  np.testing.assert_allclose(word(g_gdes), word(g_gen), atol=1e-6)  # E: the generator's loss alone
  np.testing.assert_allclose(word(g_gdes) + np.asarray(g_gdes["gdes"]["delta"]), word(g_shared), atol=1e-5)
  assert float(np.abs(g_gdes["gdes"]["delta"]).max()) > 0
  moved = {**params, "gdes": {"delta": params["gdes"]["delta"] + 0.5}}
  d_tree, g_tree = electra.split(moved)
  np.testing.assert_allclose(d_tree["bert"]["embeddings"]["word_embeddings"]["embedding"],
                             np.asarray(params["embeddings"]["word_embeddings"]["embedding"]) + 0.5)
  np.testing.assert_array_equal(g_tree["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                params["embeddings"]["word_embeddings"]["embedding"])


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "blockwise"])
def test_pruned_last_layer_equals_the_whole_stack(impl):
  """prune_final_layer (the last layer at the masked positions only) with disentangled attention: the same MLM
  logits as computing every position."""
  cfg = model_lib.BertConfig(vocab_size=120, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                             max_position_embeddings=64, nsp_head=False, position_embedding="disentangled",
                             position_buckets=8, max_relative_positions=64, type_vocab_size=0,
                             attention_impl=impl, attention_block=16)
  b = _batch()
  b["masked_lm_positions"] = np.array([[1, 5, 30, 39], [0, 3, 12, 24], [2, 4, 6, 8]], np.int32)
  params = model_lib.BertForPreTraining(cfg).init(jax.random.key(0), b)["params"]
  whole = model_lib.BertForPreTraining(cfg.replace(prune_final_layer=False)).apply({"params": params}, b)
  pruned = model_lib.BertForPreTraining(cfg.replace(prune_final_layer=True)).apply({"params": params}, b)
  np.testing.assert_allclose(np.asarray(pruned["mlm_logits"]), np.asarray(whole["mlm_logits"]), atol=1e-5)


@pytest.mark.slow
def test_the_downstream_suite_runs_from_a_deberta_folder(tmp_path):
  """`launch/suite.py` with `--init` an HF DeBERTa-v3-layout folder (DebertaV2ForMaskedLM, WordPiece vocabulary):
  each grid run fine-tunes the family's encoder with a fresh ContextPooler head, and the table holds the task's
  best rate, learnt (accuracy above chance)."""
  import json
  import os
  import subprocess
  import sys

  import helpers

  ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for split, n, seed in (("train", 480, 0), ("dev", 200, 1)):
    helpers.write_sentiment(tmp_path / f"{split}.csv", n, seed)
  helpers.tiny_deberta_folder([tmp_path / "train.csv"], tmp_path / "hf", vocab_size=300)
  suite = [{"name": "sentiment", "config": "configs/finetune.py:task=local,batch=16,epochs=3,seq=32",
            "overrides": ["--config.data.train_file=train.csv", "--config.data.eval_file=dev.csv",
                          "--config.data.text_a_column=sentence", "--config.data.label_column=sentiment",
                          "--config.data.labels=('neg','pos')"]}]
  (tmp_path / "suite.json").write_text(json.dumps(suite))
  out = subprocess.run([sys.executable, os.path.join(ROOT, "launch/suite.py"), "run", "--init", "hf", "--suite",
                        "suite.json", "--lrs", "1e-3,3e-4", "--seeds", "0", "--root", "suite"],
                       capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT),
                       timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads((tmp_path / "suite" / "suite.json").read_text())["tasks"][0]
  assert row["runs"] == 2 and row["median"] > 0.9, row
  params = json.loads((tmp_path / "suite" / "sentiment" / f"lr-{row['lr']}_seed-0" / "finetune.json").read_text())
  assert params["model"]["position_embedding"] == "disentangled"
