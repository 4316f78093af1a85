"""BERT in Flax linen: `config` (sizes, switches), `layers`, `encoder` (the layer stack, `BertModel`), `heads`.

Maths follows the original BERT (post-LayerNorm, exact-erf GELU, learned positions, eps 1e-12); ablations
(sinusoidal positions, pre-LN, ReLU) and performance switches are fields of `BertConfig`.
"""
from bertjax.model.config import ACTIVATIONS, DTYPES, VARIANTS, BertConfig, gelu
from bertjax.model.encoder import ENCODER_KEYS, BertModel, Encoder, check_batch, dummy_batch
from bertjax.model.heads import (BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                                 BertForTokenClassification)
from bertjax.model.layers import (Dense, Embeddings, HashDropout, Layer, Mlp, SelfAttention, attention_mask,
                                  dot_product_attention, dropout, layer_norm, mask_rows, sinusoidal_positions,
                                  take_rows)

__all__ = ["ACTIVATIONS", "DTYPES", "VARIANTS", "BertConfig", "gelu", "ENCODER_KEYS", "BertModel", "Encoder",
           "check_batch", "dummy_batch", "BertForPreTraining", "BertForQuestionAnswering",
           "BertForSequenceClassification", "BertForTokenClassification", "Dense", "Embeddings", "HashDropout",
           "Layer", "Mlp", "SelfAttention", "attention_mask", "dot_product_attention", "dropout", "layer_norm",
           "mask_rows", "sinusoidal_positions", "take_rows"]
