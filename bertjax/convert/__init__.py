"""Interchange: HF transformers safetensors <-> bertjax params, and the original google-research/bert names.

Only safetensors and JSON are read: no pickle (`pytorch_model.bin`, `.pt`, `.ckpt`) is ever loaded.

    cfg, params = convert.from_hf("hf_dir")   # bert, roberta or modernbert (config.json's model_type):
                                              # BertForPreTraining tree (MLM head when present) or the encoder
    model.for_pretraining(cfg).apply({"params": params}, batch)  # "hidden", "mlm_logits" at masked_lm_positions
    convert.to_hf(cfg, params, "out_dir")     # the config's family; loads in AutoModelForMaskedLM (or BERT's
                                              # BertForPreTraining)
    cfg, params = convert.from_hf("hf_dir", head="token_classification")   # a fine-tuned model, head included
    convert.to_hf(cfg, params, "out_dir", labels=("O", "B-PER", ...))        # BertForTokenClassification

`NAME_TABLE(cfg)` lists, for every bertjax parameter, its HF state-dict name, its original TF checkpoint
variable name and the layout change between them; `from_tf_variables` uses it for any TF-checkpoint reader.

    python -m bertjax.convert --workdir W --out DIR     # a bertjax workdir (pre-trained or fine-tuned) as an HF folder
"""
from bertjax.convert.files import MAX_HEADER_BYTES, PICKLE_SUFFIXES, read_hf_dir, read_safetensors
from bertjax.convert import families
from bertjax.convert.families import FAMILIES, config_from_hf, electra_from_hf, electra_to_hf, family_of, from_hf
from bertjax.convert.families import to_hf_any as to_hf
from bertjax.convert.hf import (HEAD_PREFIXES, HF_ACTIVATIONS, IGNORED_BUFFERS, NAME_TABLE, TASK_HEADS,
                                ConversionError, bert_to_hf_config, from_state_dict, from_tf_variables,
                                head_of_architecture, head_rows, hf_config_to_bert, stack_layers, task_module,
                                to_state_dict, unstack_layers)

__all__ = ["families", "FAMILIES", "electra_from_hf", "electra_to_hf", "config_from_hf", "family_of",
           "MAX_HEADER_BYTES", "PICKLE_SUFFIXES", "read_hf_dir", "read_safetensors", "HEAD_PREFIXES",
           "HF_ACTIVATIONS", "IGNORED_BUFFERS", "NAME_TABLE", "TASK_HEADS", "ConversionError", "bert_to_hf_config",
           "from_hf", "from_state_dict", "from_tf_variables", "head_of_architecture", "head_rows",
           "hf_config_to_bert", "stack_layers", "task_module", "to_hf", "to_state_dict", "unstack_layers"]
