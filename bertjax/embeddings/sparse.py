"""Sparse lexical encoders (SPLADE): a text is a vector over the vocabulary, each term's weight
max (or sum) over the text's tokens of log(1 + ReLU(MLM logit)), so most terms are exactly 0.

    enc = sparse.SparseEncoder.load("splade-folder")     # sentence-transformers SparseEncoder folder, or an MLM
    vectors = enc.encode(["a query"], max_active_dims=64)  # [1, V] float32, at most 64 non-zero terms
    sparse.active_dims(vectors)                          # non-zero terms per vector

A sentence-transformers `SparseEncoder` folder is a fill-mask Transformer (or the older MLMTransformer) followed by
SpladePooling (`pooling_strategy` max | sum, `activation_function` relu | log1p_relu); `encode` follows its
`encode`: [CLS] text [SEP] cut at max_seq_length, the logits of padding positions zeroed before the activation,
and `max_active_dims` keeping each vector's largest terms. `splade_loss` is its SpladeLoss over
SparseMultipleNegativesRankingLoss: in-batch InfoNCE on dot products plus FLOPS regularisers (the squared mean
weight of each term, summed) on the documents and, weighted apart, the queries.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert import weights
from bertjax.convert.table import ConversionError
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import losses
from bertjax.embeddings.encoder import _max_seq_length, batch_of, token_rows
from bertjax.model.heads import BertForPreTraining

POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
_TRANSFORMERS = ("Transformer", "MLMTransformer")


def splade_pool(logits, mask, pooling: str = "max", activation: str = "relu"):
  """[B, V] term weights from MLM logits [B, L, V] and the token mask [B, L]."""
  x = jnp.log1p(jax.nn.relu(logits * mask[..., None].astype(logits.dtype)))
  if activation == "log1p_relu":
    x = jnp.log1p(x)
  return x.max(axis=1) if pooling == "max" else x.sum(axis=1)


def flops(embeddings, weights=None):
  """Σ_j (mean_i w_ij)²: the FLOPS regulariser over the batch's real rows (`weights` [N], 0 for padding)."""
  if weights is None:
    return jnp.sum(jnp.mean(embeddings, axis=0) ** 2)
  w = weights.astype(embeddings.dtype)
  mean = jnp.sum(embeddings * w[:, None], axis=0) / jnp.maximum(jnp.sum(w), 1.0)
  return jnp.sum(mean ** 2)


def splade_loss(queries, documents, document_weight: float, query_weight: float | None = None, scale: float = 1.0,
                weights=None) -> dict:
  """sentence-transformers' SpladeLoss(SparseMultipleNegativesRankingLoss(scale)): `queries` [B, V], `documents`
  [B·(1+n), V] (positives, then blocks of hard negatives). Returns its parts and their sum ("loss")."""
  b = queries.shape[0]
  parts = {"base_loss": losses.ranking_loss(queries, documents, scale=scale, weights=weights, similarity="dot")}
  doc_w = None if weights is None else jnp.tile(weights, documents.shape[0] // b)
  parts["document_regularizer_loss"] = document_weight * flops(documents, doc_w)
  if query_weight is not None:
    parts["query_regularizer_loss"] = query_weight * flops(queries, weights)
  parts["loss"] = sum(parts.values())
  return parts


def regularizer_ramp(step, total_steps: int, warmup_ratio: float = 1 / 3):
  """The regularisers' weight factor at `step` (0-based, a traced value inside the train step): (step / W)² below
  W = int(total_steps · warmup_ratio) (at least 1), then 1, as sentence-transformers'
  SpladeRegularizerWeightSchedulerCallback (quadratic) sets it at the start of each step."""
  warmup = max(int(total_steps * warmup_ratio), 1)
  ratio = jnp.asarray(step, jnp.float32) / warmup
  return jnp.where(ratio < 1.0, ratio * ratio, 1.0)


class SparseModel(BertForPreTraining):
  """{"embedding": [B, V]} term weights (`splade_pool` of the MLM logits at every position) of a batch of texts;
  with `doc_input_ids` / `doc_input_mask` [B, K, L] also {"doc_embedding": [B, K, V]}. The parameters are the
  pre-training module's (encoder + MLM head, no NSP), so any MLM checkpoint is a start and the result exports as
  the family's MLM model."""
  pooling: str = "max"
  activation: str = "relu"

  def terms(self, batch, deterministic: bool = True):
    n = batch["input_ids"].shape[1]
    positions = jnp.broadcast_to(jnp.arange(n), batch["input_ids"].shape)
    logits = BertForPreTraining.__call__(self, {**batch, "masked_lm_positions": positions}, deterministic)
    return splade_pool(logits["mlm_logits"].astype(jnp.float32), batch["input_mask"], self.pooling, self.activation)

  def __call__(self, batch, deterministic: bool = True):
    out = {"embedding": self.terms({k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}, deterministic)}
    if "doc_input_ids" in batch:
      b, k, length = batch["doc_input_ids"].shape
      docs = {"input_ids": batch["doc_input_ids"].reshape(b * k, length),
              "input_mask": batch["doc_input_mask"].reshape(b * k, length),
              "segment_ids": jnp.zeros((b * k, length), jnp.int32)}
      out["doc_embedding"] = self.terms(docs, deterministic).reshape(b, k, -1)
    return out


def write_folder(cfg: model_lib.BertConfig, params, out: str, max_seq_length: int, pooling: str = "max",
                 activation: str = "relu") -> None:
  """A sentence-transformers SparseEncoder folder: the family's MLM model in `out` (a fill-mask Transformer) and
  1_SpladePooling (the tokenizer files are the caller's)."""
  convert.to_hf(cfg.replace(nsp_head=False), {k: v for k, v in params.items() if k != "nsp"}, out, head="pretraining")
  os.makedirs(os.path.join(out, "1_SpladePooling"), exist_ok=True)
  documents = {
      "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer."
                        "Transformer"},
                       {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": "sentence_transformers."
                        "sparse_encoder.modules.splade_pooling.SpladePooling"}],
      "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False,
                                    "transformer_task": "fill-mask",
                                    "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                                    "module_output_name": "token_embeddings"},
      "config_sentence_transformers.json": {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
                                            "default_prompt_name": None, "similarity_fn_name": "dot"},
      "1_SpladePooling/config.json": {"pooling_strategy": pooling, "activation_function": activation,
                                      "embedding_dimension": None}}
  for name, content in documents.items():
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2)


def top_k(vectors: np.ndarray, k: int | None) -> np.ndarray:
  """Each row's k largest terms kept, the rest 0 (sentence-transformers' max_active_dims)."""
  if not k or k >= vectors.shape[1]:
    return vectors
  keep = np.argpartition(-vectors, k - 1, axis=1)[:, :k]
  out = np.zeros_like(vectors)
  np.put_along_axis(out, keep, np.take_along_axis(vectors, keep, axis=1), axis=1)
  return out


def active_dims(vectors: np.ndarray) -> np.ndarray:
  """Non-zero terms per vector."""
  return np.count_nonzero(vectors, axis=1)


def is_folder(path: str) -> bool:
  """Whether `path` is a sentence-transformers folder whose stack has a SpladePooling module."""
  try:
    with open(os.path.join(path, "modules.json"), encoding="utf-8") as f:
      return "SpladePooling" in f.read()
  except OSError:
    return False


def read_folder(path: str) -> tuple[str, str, str]:
  """(transformer sub-folder, pooling, activation) of a sentence-transformers SparseEncoder folder; a stack that
  is not a Transformer then SpladePooling is a one-line error naming its modules."""
  try:
    with open(os.path.join(path, "modules.json"), encoding="utf-8") as f:
      stack = json.load(f)
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
  except (OSError, ValueError, AttributeError, TypeError) as e:
    raise ConversionError(f"{path}/modules.json: not a list of modules ({str(e).splitlines()[0][:200]})") from None
  if len(kinds) != 2 or kinds[0] not in _TRANSFORMERS or kinds[1] != "SpladePooling":
    raise ConversionError(f"{path}: modules {kinds} are not a sparse encoder's Transformer, SpladePooling")
  sub = os.path.join(path, stack[1].get("path", ""))
  try:
    with open(os.path.join(sub, "config.json"), encoding="utf-8") as f:
      conf = json.load(f)
  except (OSError, ValueError) as e:
    raise ConversionError(f"{sub}/config.json: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  pooling, activation = conf.get("pooling_strategy", "max"), conf.get("activation_function", "relu")
  if pooling not in POOLINGS or activation not in ACTIVATIONS:
    raise ConversionError(f"{sub}/config.json: SpladePooling {pooling!r}, {activation!r}; bertjax computes "
                          f"pooling {POOLINGS} with activation {ACTIVATIONS}")
  return os.path.join(path, stack[0].get("path", "")), pooling, activation


@dataclasses.dataclass
class SparseEncoder:
  cfg: model_lib.BertConfig
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_seq_length: int
  pooling: str = "max"
  activation: str = "relu"
  max_active_dims: int | None = None  # keep each vector's largest terms (None: all)

  @classmethod
  def load(cls, path: str, max_seq_length: int = 0, pooling: str = "max", activation: str = "relu",
           max_active_dims: int | None = None, **overrides) -> "SparseEncoder":
    """A SparseEncoder folder (its pooling, activation and max_seq_length), a bertjax `task=sparse` workdir (its
    best parameters and settings), or any folder holding an MLM model (HF, bertjax pre-training workdir) with the
    `pooling` and `activation` given."""
    folder = path
    if os.path.isfile(os.path.join(path, "modules.json")):
      folder, pooling, activation = read_folder(path)
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
    elif weights.source_of(path) == "finetuned":
      meta = weights.finetune_meta(path)
      if meta.get("kind") != "sparse":
        raise ConversionError(f"{path}: a {meta.get('kind')!r} fine-tuning run, not a sparse encoder's (task=sparse)")
      opts = meta.get("task_options", {})
      pooling, activation = opts.get("pooling", pooling), opts.get("activation", activation)
      max_seq_length = max_seq_length or int(meta.get("max_seq_length", 0))
    w = weights.load(folder, overrides=overrides, head="pretraining")
    if "mlm_bias" not in w.params:
      raise ConversionError(f"{folder}: no MLM head; a sparse encoder scores the vocabulary with one")
    if not w.tokenizer:
      raise ConversionError(f"{folder}: no tokenizer files (vocab.txt, vocab.json + merges.txt, tokenizer.json)")
    tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
    params = {k: v for k, v in w.params.items() if k != "nsp"}
    params["bert"] = {k: v for k, v in params["bert"].items() if k != "pooler"}  # no NSP head reads it
    limit = w.cfg.max_length
    return cls(w.cfg.replace(nsp_head=False), params, tok, min(max_seq_length or limit, limit), pooling, activation,
               max_active_dims)

  @classmethod
  def is_model(cls, path: str) -> bool:
    """Whether `path` is a SparseEncoder folder or a bertjax `task=sparse` workdir."""
    if is_folder(path):
      return True
    if not os.path.isfile(os.path.join(path, "finetune.json")):
      return False
    return weights.finetune_meta(path).get("kind") == "sparse"

  @functools.cached_property
  def fingerprint(self) -> str:
    """A digest of the weights and settings: what decides the term vectors."""
    h = hashlib.sha256(repr(("sparse", self.cfg, self.max_seq_length, self.pooling, self.activation,
                             self.max_active_dims)).encode())
    for leaf in jax.tree_util.tree_leaves(self.params):
      h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()

  @property
  def dims(self) -> int:
    """Terms per vector: the MLM head's output width (sentence-transformers' embedding dimension)."""
    return self.cfg.vocab_size

  @functools.cached_property
  def _apply(self):
    module = SparseModel(self.cfg, pooling=self.pooling, activation=self.activation)
    return jax.jit(lambda params, batch: module.apply({"params": params}, batch, method=SparseModel.terms))

  def encode(self, texts: Sequence[str], batch_size: int = 32, max_active_dims: int | None = None) -> np.ndarray:
    """[len(texts), dims] term weights, longest texts batched together, in the order given; at most
    `max_active_dims` (else the encoder's own) non-zero terms each."""
    if not len(texts):
      return np.zeros((0, self.dims), np.float32)
    rows = token_rows(self.tok, texts, self.max_seq_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    out = np.zeros((len(texts), self.dims), np.float32)
    for i in range(0, len(texts), batch_size):
      idx = order[i:i + batch_size]
      batch = batch_of([rows[j] for j in idx], self.tok.pad_id, self.max_seq_length, rows=batch_size, multiple=8)
      out[idx] = np.asarray(self._apply(self.params, batch))[:len(idx)]
    return top_k(out, max_active_dims or self.max_active_dims)
