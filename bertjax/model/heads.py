"""The heads: pre-training (MLM at the masked positions, NSP) and fine-tuning (sequence classification or
regression, token classification, span QA), each over `BertModel`."""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from bertjax import errors
from bertjax.model.config import ACTIVATIONS, BertConfig
from bertjax.model.encoder import ENCODER_KEYS, BertModel, check_batch
from bertjax.model.layers import Dense, dropout, layer_norm, take_rows


class BertForPreTraining(nn.Module):
  """Encoder + MLM head (only at `masked_lm_positions`: [B, P, V] logits) + NSP head on the pooled output
  (`cfg.nsp_head`; without it, MLM alone as RoBERTa and ModernBERT pre-train, and no pooler). The MLM transform
  maps to the embedding width, where the tied decoder works (ELECTRA's generator: hidden -> embedding_size)."""
  cfg: BertConfig
  shared_embeddings: nn.Module | None = None

  def setup(self):
    cfg = self.cfg
    self.bert = BertModel(cfg, self.shared_embeddings)
    self.mlm_transform = Dense((cfg.embed_dim,), ("embed", "mlp"), cfg, use_bias=cfg.use_bias)
    self.mlm_ln = layer_norm(cfg)
    self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                               (cfg.vocab_size,), cfg.params_dtype)
    if cfg.nsp_head:
      self.nsp = Dense((2,), ("mlp", "classes"), cfg)

  def __call__(self, batch, deterministic: bool = True):
    cfg = self.cfg
    check_batch(cfg, batch, ENCODER_KEYS + ("masked_lm_positions",))
    positions = batch["masked_lm_positions"]
    if cfg.prune_final_layer:
      out = self.bert(batch, deterministic, positions, pool=cfg.nsp_head)
      x = out["hidden"]  # [B, P, d]
    else:
      out = self.bert(batch, deterministic, pool=cfg.nsp_head)
      x = take_rows(out["hidden"], positions)  # [B, P, d]
    x = ACTIVATIONS[cfg.hidden_act](self.mlm_transform(x))
    x = self.mlm_ln(x).astype(cfg.compute_dtype)
    out["mlm_logits"] = self.bert.attend(x) + self.mlm_bias.astype(jnp.float32)
    if cfg.nsp_head:
      out["nsp_logits"] = self.nsp(out["pooled"]).astype(jnp.float32)
    return out


def for_pretraining(cfg: BertConfig) -> BertForPreTraining:
  """The pre-training module of any family the config describes (BERT, RoBERTa, ModernBERT, ...): one module,
  the family being a matter of the config's switches."""
  return BertForPreTraining(cfg)


class ClassifierHead(nn.Module):
  """The family's transform between the encoder and a fine-tuning classifier (`cfg.classifier_head`) with the
  dropout before the classifier, as HF's models of each family build it: RoBERTa and ELECTRA a dense layer with
  tanh or GELU at [CLS], dropout on both sides; ModernBERT dense, activation and norm (on every token for the token
  and span heads). BERT's tanh pooler is `BertModel`'s, and BERT's, RoBERTa's and ELECTRA's token heads are a
  dropout alone: those stay in the task module (no parameters here). `sequence`: the sequence-level use."""
  cfg: BertConfig
  sequence: bool = True

  @nn.compact
  def __call__(self, x, deterministic: bool):
    cfg = self.cfg
    drop = dropout(cfg.replace(dropout_rate=cfg.head_dropout_rate))
    if cfg.classifier_head in ("dense_tanh", "dense_gelu") and self.sequence:
      act = jnp.tanh if cfg.classifier_head == "dense_tanh" else ACTIVATIONS["gelu"]
      x = drop(x, deterministic=deterministic)
      x = act(Dense((cfg.hidden_size,), ("embed", "mlp"), cfg, name="dense")(x))
    elif cfg.classifier_head == "prediction":
      x = ACTIVATIONS[cfg.hidden_act](Dense((cfg.hidden_size,), ("embed", "mlp"), cfg, use_bias=cfg.use_bias,
                                            name="dense")(x))
      x = layer_norm(cfg, name="norm")(x).astype(cfg.compute_dtype)
    return drop(x, deterministic=deterministic)


def _mean_pool(hidden, batch):
  """The mean of each sequence's real tokens' states: [B, d], or [B, K, d] for packed rows (one per example)."""
  h = hidden.astype(jnp.float32)
  if "cls_positions" in batch:
    k = batch["cls_positions"].shape[1]
    member = (batch["attention_segment_ids"][..., None] == jnp.arange(1, k + 1)).astype(jnp.float32)  # [B, L, K]
    sums = jnp.einsum("blk,bld->bkd", member, h)
    return (sums / jnp.maximum(member.sum(1)[..., None], 1.0)).astype(hidden.dtype)
  mask = batch["input_mask"].astype(jnp.float32)[..., None]
  return (jnp.sum(h * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)).astype(hidden.dtype)


class BertForSequenceClassification(nn.Module):
  """softmax(W·head(h_[CLS])) over `num_labels` classes, the head the family's (`ClassifierHead`); `num_labels=1`
  is regression (e.g. STS-B)."""
  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    cfg = self.cfg
    mean = cfg.classifier_pooling == "mean"
    none = jnp.zeros((batch["input_ids"].shape[0], 0), jnp.int32)  # pruned: the last layer at [CLS] only
    out = BertModel(cfg, name="bert")(batch, deterministic, none if cfg.prune_final_layer and not mean else None,
                                      pool=True if cfg.classifier_head == "pooler" else "cls")
    if cfg.classifier_head == "pooler":
      x = dropout(cfg.replace(dropout_rate=cfg.head_dropout_rate))(out["pooled"], deterministic=deterministic)
    else:
      x = _mean_pool(out["hidden"], batch) if mean else out["cls_hidden"]
      x = ClassifierHead(cfg, name="head")(x, deterministic)
    out["logits"] = Dense((self.num_labels,), ("mlp", "classes"), cfg, name="classifier")(x).astype(jnp.float32)
    return out


class BertForTokenClassification(nn.Module):
  """softmax(W·h_i) per token (e.g. NER tags), through the family's token-level head."""
  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    cfg = self.cfg
    out = BertModel(cfg, name="bert")(batch, deterministic, pool=cfg.classifier_head == "pooler")
    if cfg.classifier_head == "prediction":
      x = ClassifierHead(cfg, sequence=False, name="head")(out["hidden"], deterministic)
    else:
      x = dropout(cfg.replace(dropout_rate=cfg.head_dropout_rate))(out["hidden"], deterministic=deterministic)
    out["logits"] = Dense((self.num_labels,), ("embed", "classes"), self.cfg, name="classifier")(x).astype(
        jnp.float32)
    return out


class BertForQuestionAnswering(nn.Module):
  """Span QA: start score s·h_i and end score e·h_i; padding positions get -inf-like logits. ModernBERT's
  prediction head (with its dropout) comes first; the other families read the states as they are."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    out = BertModel(self.cfg, name="bert")(batch, deterministic, pool=self.cfg.classifier_head == "pooler")
    x = out["hidden"]
    if self.cfg.classifier_head == "prediction":
      x = ClassifierHead(self.cfg, sequence=False, name="head")(x, deterministic)
    logits = Dense((2,), ("embed", "classes"), self.cfg, name="qa_outputs")(x).astype(jnp.float32)
    valid = batch["input_mask"].astype(bool)
    neg = jnp.finfo(jnp.float32).min
    out["start_logits"] = jnp.where(valid, logits[..., 0], neg)
    out["end_logits"] = jnp.where(valid, logits[..., 1], neg)
    return out


TASK_MODULES = {"sequence_classification": BertForSequenceClassification,
                "token_classification": BertForTokenClassification,
                "question_answering": BertForQuestionAnswering}


def for_task(cfg: BertConfig, head: str, num_labels: int = 2) -> nn.Module:
  """The fine-tuning module of a task head (sequence_classification, token_classification, question_answering)
  for any family: the family's own head follows from the config."""
  if head not in TASK_MODULES:
    raise errors.ConfigError(f"unknown head {head!r}; one of {sorted(TASK_MODULES)}")
  return BertForQuestionAnswering(cfg) if head == "question_answering" else TASK_MODULES[head](cfg, num_labels)
