"""Sparse lexical encoders (SPLADE) against sentence-transformers 6's SparseEncoder: encoding of folders built by
its own modules, max_active_dims, and SpladeLoss (ranking loss + FLOPS regularisers) on the same embeddings."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import jax.numpy as jnp  # noqa: E402

from bertjax.convert.table import ConversionError  # noqa: E402
from bertjax.data import tokenizer as tokenizer_lib  # noqa: E402
from bertjax.embeddings import sparse  # noqa: E402

WORDS = ("the river runs past a city where model reads text and predicts words for every query about mountains "
         "islands bridges trains music").split()
TEXTS = ["the river runs past the city", "a model reads text", "query about mountains and islands " * 12,
         "music", "bridges trains words predicts every model"]


@pytest.fixture(scope="module")
def splade_folder(make_vocab, tmp_path_factory):
  """An HF BertForMaskedLM (random weights, biases moved off zero) and the SparseEncoder sentence-transformers
  builds on it (fill-mask Transformer at max_seq_length 24, SpladePooling max / relu), saved by its own classes."""
  vocab = make_vocab(WORDS, 90)
  d = tmp_path_factory.mktemp("splade")
  tok = tokenizer_lib.load(vocab)
  torch.manual_seed(0)
  m = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=64, pad_token_id=tok.pad_id))
  with torch.no_grad():
    m.cls.predictions.bias.normal_(0, 1.0)  # many terms above 0, so max pooling and pruning both matter
  m.save_pretrained(d / "mlm")
  (d / "mlm" / "vocab.txt").write_text(open(vocab, encoding="utf-8").read(), encoding="utf-8")
  (d / "mlm" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                               "do_lower_case": True}))
  from sentence_transformers.base.modules import Transformer
  from sentence_transformers.sparse_encoder import SparseEncoder
  from sentence_transformers.sparse_encoder.modules import SpladePooling
  model = SparseEncoder(modules=[Transformer(str(d / "mlm"), transformer_task="fill-mask", max_seq_length=24),
                                 SpladePooling(pooling_strategy="max", activation_function="relu")], device="cpu")
  model.save(str(d / "st"))
  return str(d / "st"), SparseEncoder(str(d / "st"), device="cpu")


def test_sparse_encoding_equals_sentence_transformers(splade_folder):
  path, theirs = splade_folder
  enc = sparse.SparseEncoder.load(path)
  assert (enc.pooling, enc.activation, enc.max_seq_length) == ("max", "relu", 24)
  ours = enc.encode(TEXTS, batch_size=2)
  ref = theirs.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
  assert ours.shape == ref.shape == (len(TEXTS), enc.tok.vocab_size)
  np.testing.assert_allclose(ours, ref, atol=1e-5)
  active = sparse.active_dims(ours)
  assert (active > 5).all() and (active < ours.shape[1]).all()  # sparse, not empty: the check is not vacuous
  # max_active_dims keeps each vector's largest terms, as sentence-transformers' does
  pruned = enc.encode(TEXTS, max_active_dims=4)
  ref4 = theirs.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False, max_active_dims=4).numpy()
  assert (sparse.active_dims(pruned) == 4).all()
  np.testing.assert_allclose(pruned, ref4, atol=1e-5)


def test_sum_pooling_and_log1p_relu_equal_their_definitions():
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 2, (3, 7, 11)).astype(np.float32)
  mask = (np.arange(7)[None] < np.array([[7], [4], [1]])).astype(np.int32)
  for pooling, activation in (("max", "relu"), ("sum", "relu"), ("max", "log1p_relu"), ("sum", "log1p_relu")):
    x = np.log1p(np.maximum(logits * mask[..., None], 0))
    x = np.log1p(x) if activation == "log1p_relu" else x
    want = x.max(1) if pooling == "max" else x.sum(1)
    np.testing.assert_allclose(np.asarray(sparse.splade_pool(jnp.asarray(logits), jnp.asarray(mask), pooling,
                                                             activation)), want, rtol=1e-6)


@pytest.mark.parametrize("negatives,query_weight", [(0, 5e-5), (1, None)])
def test_splade_loss_equals_sentence_transformers(splade_folder, negatives, query_weight):
  """SpladeLoss(SparseMultipleNegativesRankingLoss) on the same non-negative embeddings: each part equal."""
  from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
  _, model = splade_folder
  rng = np.random.default_rng(1)
  b, v = 6, 40
  emb = [np.maximum(rng.normal(0, 1, (b, v)), 0).astype(np.float32) for _ in range(2 + negatives)]
  loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model, scale=1.0), document_regularizer_weight=3e-5,
                    query_regularizer_weight=query_weight)
  theirs = loss.loss.compute_loss_from_embeddings([torch.tensor(e) for e in emb], None)
  doc = loss.document_regularizer.compute_loss_from_embeddings(torch.cat([torch.tensor(e) for e in emb[1:]]))
  ours = sparse.splade_loss(jnp.asarray(emb[0]), jnp.concatenate([jnp.asarray(e) for e in emb[1:]]),
                            document_weight=3e-5, query_weight=query_weight)
  np.testing.assert_allclose(float(ours["base_loss"]), float(theirs), rtol=1e-5)
  np.testing.assert_allclose(float(ours["document_regularizer_loss"]), 3e-5 * float(doc), rtol=1e-5)
  if query_weight is None:
    assert "query_regularizer_loss" not in ours
  else:
    q = loss.query_regularizer.compute_loss_from_embeddings(torch.tensor(emb[0]))
    np.testing.assert_allclose(float(ours["query_regularizer_loss"]), query_weight * float(q), rtol=1e-5)
  # padding rows (weight 0) count for nothing
  w = jnp.asarray([1, 1, 1, 1, 1, 0], jnp.float32)
  padded = sparse.splade_loss(jnp.asarray(emb[0]), jnp.concatenate([jnp.asarray(e) for e in emb[1:]]), 3e-5,
                              query_weight, weights=w)
  cut = sparse.splade_loss(jnp.asarray(emb[0][:5]), jnp.concatenate([jnp.asarray(e[:5]) for e in emb[1:]]), 3e-5,
                           query_weight)
  np.testing.assert_allclose(float(padded["loss"]), float(cut["loss"]), rtol=1e-5)


def test_a_folder_that_is_not_a_sparse_encoder_is_one_line(splade_folder, tmp_path):
  path, _ = splade_folder
  (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "path": "", "type": "x.Transformer"},
                                                     {"idx": 1, "path": "1_Pooling", "type": "x.Pooling"}]))
  with pytest.raises(ConversionError, match=r"modules \['Transformer', 'Pooling'\] are not a sparse encoder's"):
    sparse.SparseEncoder.load(str(tmp_path))
  encoder_only = tmp_path / "encoder"
  transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32)).save_pretrained(
      encoder_only)
  with pytest.raises(ConversionError, match="MLM head"):
    sparse.SparseEncoder.load(str(encoder_only))
