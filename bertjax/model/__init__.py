"""BERT in Flax linen: `config` (sizes, switches), `layers`, `encoder` (the layer stack, `BertModel`), `heads`.

Maths follows the original BERT (post-LayerNorm, exact-erf GELU, learned positions, eps 1e-12) by default; the
RoBERTa and ModernBERT families, ablations (sinusoidal, rotary or ALiBi positions, pre-norm, RMSNorm, GeGLU/SwiGLU,
no biases, sliding-window attention) and performance switches are fields of `BertConfig`.
"""
from bertjax.kernels.xla import attention_mask, band_mask, dot_product_attention, mask_rows
from bertjax.model.config import ACTIVATIONS, CLASSIFIER_HEADS, DTYPES, POSITIONS, VARIANTS, BertConfig, gelu
from bertjax.model.encoder import ENCODER_KEYS, BertModel, Encoder, check_batch, context, dummy_batch
from bertjax.model.heads import (
                                 TASK_MODULES,
                                 BertForPreTraining,
                                 BertForQuestionAnswering,
                                 BertForSequenceClassification,
                                 BertForTokenClassification,
                                 ClassifierHead,
                                 for_pretraining,
                                 for_task,
)
from bertjax.model.layers import (
                                 Dense,
                                 Embeddings,
                                 HashDropout,
                                 Layer,
                                 Mlp,
                                 SelfAttention,
                                 alibi_bias,
                                 alibi_slopes,
                                 apply_rotary,
                                 dropout,
                                 layer_norm,
                                 rotary_tables,
                                 sinusoidal_positions,
                                 take_rows,
)

__all__ = ["ACTIVATIONS", "CLASSIFIER_HEADS", "TASK_MODULES", "ClassifierHead", "for_task", "DTYPES", "POSITIONS",
           "VARIANTS", "BertConfig", "gelu", "ENCODER_KEYS", "BertModel", "Encoder", "check_batch", "context",
           "dummy_batch", "BertForPreTraining", "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertForTokenClassification", "for_pretraining", "Dense", "Embeddings", "HashDropout", "Layer", "Mlp",
           "SelfAttention", "alibi_bias", "alibi_slopes", "apply_rotary", "attention_mask", "band_mask",
           "dot_product_attention", "dropout", "layer_norm", "mask_rows", "rotary_tables", "sinusoidal_positions",
           "take_rows"]
