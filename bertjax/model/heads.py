"""The heads: pre-training (MLM at the masked positions, NSP) and fine-tuning (sequence classification or
regression, token classification, span QA), each over `BertModel`."""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

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


class BertForSequenceClassification(nn.Module):
  """softmax(W·pooled) over `num_labels` classes; `num_labels=1` is regression (e.g. STS-B)."""
  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    none = jnp.zeros((batch["input_ids"].shape[0], 0), jnp.int32)  # pruned: the last layer at [CLS] only
    out = BertModel(self.cfg, name="bert")(batch, deterministic, none if self.cfg.prune_final_layer else None)
    x = dropout(self.cfg)(out["pooled"], deterministic=deterministic)
    out["logits"] = Dense((self.num_labels,), ("mlp", "classes"), self.cfg, name="classifier")(x).astype(
        jnp.float32)
    return out


class BertForTokenClassification(nn.Module):
  """softmax(W·h_i) per token (e.g. NER tags)."""
  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    out = BertModel(self.cfg, name="bert")(batch, deterministic)
    x = dropout(self.cfg)(out["hidden"], deterministic=deterministic)
    out["logits"] = Dense((self.num_labels,), ("embed", "classes"), self.cfg, name="classifier")(x).astype(
        jnp.float32)
    return out


class BertForQuestionAnswering(nn.Module):
  """Span QA: start score s·h_i and end score e·h_i; padding positions get -inf-like logits."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    out = BertModel(self.cfg, name="bert")(batch, deterministic)
    logits = Dense((2,), ("embed", "classes"), self.cfg, name="qa_outputs")(out["hidden"]).astype(jnp.float32)
    valid = batch["input_mask"].astype(bool)
    neg = jnp.finfo(jnp.float32).min
    out["start_logits"] = jnp.where(valid, logits[..., 0], neg)
    out["end_logits"] = jnp.where(valid, logits[..., 1], neg)
    return out
