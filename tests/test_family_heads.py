"""Every family's fine-tuning heads against HF transformers' own (`{Bert,Roberta,ModernBert,Electra}For
{SequenceClassification,TokenClassification,QuestionAnswering}`): forward parity on padded batches from an HF
model imported with its head, and the export loading in `AutoModelFor*` with equal outputs and equal tensors."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402

from bertjax import convert, model  # noqa: E402

ATOL = 1e-5
HEADS = {"sequence_classification": "ForSequenceClassification", "token_classification": "ForTokenClassification",
         "question_answering": "ForQuestionAnswering"}
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)


def _hf_config(family: str, pooling: str = "cls"):
  if family == "bert":
    return transformers.BertConfig(**SIZES, max_position_embeddings=64)
  if family == "roberta":
    return transformers.RobertaConfig(**SIZES, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1)
  if family == "electra":
    return transformers.ElectraConfig(**SIZES, embedding_size=16, max_position_embeddings=64)
  if family == "deberta":  # DeBERTa-v3's layout, buckets small enough for the log branch
    return transformers.DebertaV2Config(**SIZES, max_position_embeddings=64, relative_attention=True,
                                        pos_att_type=["p2c", "c2p"], position_buckets=4, max_relative_positions=64,
                                        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
                                        type_vocab_size=0, pooler_hidden_size=SIZES["hidden_size"])
  return transformers.ModernBertConfig(**SIZES, max_position_embeddings=64, local_attention=8,
                                       global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2,
                                       eos_token_id=3, cls_token_id=2, sep_token_id=3, classifier_pooling=pooling,
                                       classifier_dropout=0.1, embedding_dropout=0.1, mlp_dropout=0.1)


def _hf_model(family: str, head: str, pooling: str = "cls", seed: int = 0):
  torch.manual_seed(seed)
  cfg = _hf_config(family, pooling)
  cfg.num_labels = 2 if head == "question_answering" else 3
  name = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra", "modernbert": "ModernBert",
          "deberta": "DebertaV2"}[family]
  m = getattr(transformers, name + HEADS[head])(cfg).eval()
  with torch.no_grad():  # non-trivial biases and norms, so that every mapped tensor matters
    for n, p in m.named_parameters():
      if n.endswith("bias") or "norm" in n.lower():
        p.add_(torch.randn_like(p) * 0.1)
  return m


def _batch(pad_id: int, seed: int = 0):
  """Right-padded rows of lengths 20, 13, 6; real tokens never the pad id."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SIZES["vocab_size"], (3, 20))
  mask = np.ones((3, 20), np.int64)
  mask[1, 13:] = 0
  mask[2, 6:] = 0
  return {"input_ids": np.where(mask > 0, ids, pad_id), "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def _hf_outputs(m, batch, head):
  with torch.no_grad():
    out = m(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]))
  if head == "question_answering":
    return out.start_logits.numpy(), out.end_logits.numpy()
  return (out.logits.numpy(),)


def _ours(cfg, params, batch, head):
  module = model.for_task(cfg, head, 3)
  if cfg.classifier_head == "pooler" and "pooler" not in params["bert"]:  # HF's token and span BERTs have none:
    fresh = module.init(jax.random.key(0), batch)["params"]                # bertjax's reads none either
    params = {**params, "bert": {**params["bert"], "pooler": fresh["bert"]["pooler"]}}
  out = module.apply({"params": params}, jax.tree_util.tree_map(np.asarray, batch))
  if head == "question_answering":
    return np.asarray(out["start_logits"]), np.asarray(out["end_logits"])
  return (np.asarray(out["logits"]),)


def _compare(ours, theirs, batch, head):
  mask = batch["input_mask"].astype(bool)
  for a, b in zip(ours, theirs):
    if head == "sequence_classification":
      np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
    elif head == "token_classification":
      np.testing.assert_allclose(a[mask], b[mask], atol=ATOL, rtol=0)  # padding rows are nobody's prediction
    else:
      np.testing.assert_allclose(a[mask], b[mask], atol=ATOL, rtol=0)


CASES = [(f, h, "cls") for f in ("bert", "roberta", "electra", "modernbert", "deberta") for h in HEADS] + [
    ("modernbert", "sequence_classification", "mean")]


@pytest.mark.parametrize("family,head,pooling", CASES)
def test_family_heads_match_hf_both_directions(tmp_path, family, head, pooling):
  m = _hf_model(family, head, pooling)
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  cfg, params = convert.from_hf(str(tmp_path / "hf"))  # the head from config.json's architectures
  expected = {"bert": "pooler", "roberta": "dense_tanh", "electra": "dense_gelu", "modernbert": "prediction",
              "deberta": "dense_gelu"}
  assert cfg.classifier_head == expected[family] and cfg.classifier_pooling == pooling
  pad = {"roberta": 1}.get(family, 0)
  batch = _batch(pad)
  _compare(_ours(cfg, params, batch, head), _hf_outputs(m, batch, head), batch, head)

  # Export: bertjax's params, perturbed, load in AutoModelFor* with their outputs equal to bertjax's.
  params = jax.tree_util.tree_map(lambda x: np.asarray(x) + 0.01 * np.cos(np.arange(np.size(x))).reshape(
      np.shape(x)).astype(np.float32), params)
  convert.to_hf(cfg, params, str(tmp_path / "out"), head=head, labels=("a", "b", "c"))
  auto = getattr(transformers, "AutoModel" + HEADS[head])
  back = auto.from_pretrained(str(tmp_path / "out")).eval()
  assert type(back).__name__ == type(m).__name__
  if head != "question_answering":
    assert back.config.id2label == {0: "a", 1: "b", 2: "c"}
  _compare(_ours(cfg, params, batch, head), _hf_outputs(back, batch, head), batch, head)
  theirs = {k: v.numpy() for k, v in back.state_dict().items()}
  ours = convert.to_state_dict(cfg, params, head=head)
  assert set(ours) <= set(theirs)
  for k, v in ours.items():
    np.testing.assert_array_equal(v, theirs[k], err_msg=k)


@pytest.mark.parametrize("family", ["roberta", "modernbert", "electra", "deberta"])
def test_family_heads_train_like_hf_with_dropout_off(tmp_path, family):
  """Three SGD steps of the sequence head from the same start with dropout off: the loss and every parameter
  follow HF's (the gradients of the family head and of the encoder under it)."""
  import optax
  m = _hf_model(family, "sequence_classification")
  for mod in m.modules():
    if isinstance(mod, torch.nn.Dropout):
      mod.p = 0.0
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  cfg, params = convert.from_hf(str(tmp_path / "hf"), dropout_rate=0.0, attention_dropout_rate=0.0,
                                classifier_dropout=0.0)
  batch = _batch({"roberta": 1}.get(family, 0))
  labels = np.array([0, 2, 1])
  module = model.for_task(cfg, "sequence_classification", 3)
  tx = optax.sgd(0.5)
  state = tx.init(params)

  def loss_fn(p):
    logits = module.apply({"params": p}, batch)["logits"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  opt = torch.optim.SGD(m.parameters(), lr=0.5)
  m.train()
  step = jax.jit(jax.value_and_grad(loss_fn))
  for _ in range(3):
    loss, grads = step(params)
    updates, state = tx.update(grads, state)
    params = optax.apply_updates(params, updates)
    out = m(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["input_mask"]),
            labels=torch.tensor(labels))
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    np.testing.assert_allclose(float(loss), float(out.loss), rtol=1e-5)
  theirs = {k: v.detach().numpy() for k, v in m.state_dict().items()}
  ours = convert.to_state_dict(cfg, params, head="sequence_classification")
  for k, v in ours.items():
    np.testing.assert_allclose(v, theirs[k], atol=2e-5, err_msg=k)


def test_unsupported_architecture_is_one_line(tmp_path):
  m = _hf_model("bert", "sequence_classification")
  m.config.architectures = ["BertForMultipleChoice"]
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  with open(os.path.join(tmp_path, "hf", "config.json")) as f:
    text = f.read()
  with open(os.path.join(tmp_path, "hf", "config.json"), "w") as f:
    f.write(text.replace("BertForSequenceClassification", "BertForMultipleChoice"))
  with pytest.raises(convert.ConversionError, match="BertForMultipleChoice is not supported; supported: .*"
                                                    "RobertaForTokenClassification"):
    convert.from_hf(str(tmp_path / "hf"))
