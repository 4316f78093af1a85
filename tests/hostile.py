"""The hostile-input table: every command-line tool on bad input, each case expecting exit code 2, exactly one
`error:` line matching a pattern, and no traceback.

    python tests/hostile.py --group train|aot|parity --json OUT   # a group's cases in this process (tests use it)
    python tests/hostile.py --markdown                            # the table as docs/robustness.md shows it

Cases run in-process, one process per group (each tool runs as `python -m bertjax TOOL ARGS` would, through the
dispatcher; a tool that ends the process raises SystemExit, caught here), so the whole table takes seconds rather
than a process start per case.
`aot` and `parity` have a group each: they define absl flags of the same names as `train`.

A case is (id, tool, argv, pattern, what): argv items may name fixtures as {tmp}, {corpus}, {vocab}, {data},
{spm_cut}, {binary}, {blank}, {pre}, {fine}, {csv_*}, {conll_*}, built by `fixtures` before the cases run.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRE = ["--config={root}/configs/pretrain.py:variant=tiny,seq=32,preds=5,batch=16,steps=4,shard=dp,vocab={vocab_n}",
       "--workdir={tmp}/w_pre", "--config.data.data_dir={data}"]
FINE = ["--config={root}/configs/finetune.py:task=local,seq=32,batch=8,epochs=1,vocab={vocab_n}",
        "--workdir={tmp}/w_fine",
        "--config.data.train_file={csv_ok}", "--config.data.eval_file={csv_ok}",
        "--config.data.text_a_column=sentence", "--config.data.label_column=label",
        "--config.data.labels=('neg','pos')", "--config.data.tokenizer={vocab}"]

MBP = ["--config={root}/configs/modernbert_phases.py:variant=tiny,data={data},long_data={data},seq=32,long_seq=32,"
       "batch=16,batch_from=8,tokens=2048,long_tokens=1024,decay_tokens=1024,batch_warmup_tokens=512,"
       "warmup_tokens=256,shard=dp", "--workdir={tmp}/w_mbp", "--config.model.vocab_size={vocab_n}",
       "--config.model.vocab_multiple=1", "--config.data.example_mode=nsp_pairs",
       "--config.data.max_predictions_per_seq=5", "--config.data.masked_lm_prob=0.15"]

MINE = ["--model", "{pre}", "--pairs", "{pairs_ok}", "--out", "{tmp}/mined.jsonl"]
TEACHER = ["--model", "{pre}", "--pairs", "{pairs_ok}", "--out", "{tmp}/teacher_scores", "--columns", "anchor,positive"]

CASES = [
    # ---------------------------------------------------------------- phases (configs/modernbert_phases.py)
    ("ph_weight_zero", "train", MBP + ["--config.phases.stable.mixture=short=0"], r"weight must be a number > 0",
     "a mixture weight of 0"),
    ("ph_weight_neg", "train", MBP + ["--config.phases.stable.mixture=short=-1"], r"weight must be a number > 0",
     "a negative mixture weight"),
    ("ph_weight_nan", "train", MBP + ["--config.phases.stable.mixture=short=nan"], r"weight must be a number > 0",
     "a mixture weight that is not a number"),
    ("ph_source_unknown", "train", MBP + ["--config.phases.stable.mixture=web"],
     r"names the source 'web', which data.sources does not define", "a mixture naming no source"),
    ("ph_source_missing", "train", [MBP[0].replace("data={data},", "data={tmp}/nowhere,")] + MBP[1:],
     r"data.sources.short: .*no creation.json", "a source folder that does not exist"),
    ("ph_temperature", "train", MBP + ["--config.phases.decay.temperature=0"], r"temperature must be a number > 0",
     "a sampling temperature <= 0"),
    ("ph_steps_sum", "train", MBP + ["--config.train.num_steps=5"], r"the phases add up to \d+ steps but "
     r"train.num_steps is 5", "phases whose lengths do not fit the run"),
    ("ph_length", "train", MBP + ["--config.phases.decay.steps=3"], r"give its length as steps or as tokens",
     "a phase with both steps and tokens"),
    ("ph_order", "train", MBP + ["--config.phase_order=stable,nope"], r"names 'nope', which config.phases does not",
     "a phase order naming no phase"),
    ("ph_vocab", "train", MBP + ["--config.model.vocab_size=300"], r"a phase cannot change the vocabulary",
     "a source made with another vocabulary"),
    ("ph_arch", "train", MBP + ["--config.model.position_embedding=learned", "--config.model.rope_theta_local=0"],
     r"a phase cannot change the architecture", "a phase setting rotary θ on a model with learned positions"),
    ("ph_exhausted", "train", MBP + ["--config.data.when_exhausted=skip"], r"data.when_exhausted 'skip'",
     "an unknown answer to a source running out"),
    ("ph_optimizer", "train", MBP + ["--config.phases.decay.optimizer=fresh"], r"optimizer must be keep or reset",
     "an unknown optimizer switch"),
    ("ph_batch", "train", MBP + ["--config.phases.context.global_batch_size=12"], r"must be a positive multiple of 8",
     "a phase batch the devices cannot split"),
    ("ph_mask", "train", MBP + ["--config.phases.decay.masked_lm_prob=1.5"], r"masked_lm_prob must be in \(0, 1\)",
     "a phase masking rate above 1"),
    ("ph_static_mask", "train",
     MBP + ["--config.data.dynamic_masking=False", "--config.phases.decay.masked_lm_prob=0.1"],
     r"set data.dynamic_masking=True to mask in the pipeline", "a falling masking rate on statically masked data"),
    ("ph_lr_previous", "train", MBP + ["--config.phases.stable.learning_rate=-1"], r"starts from the previous "
     r"phase's learning rate, and there is none", "the first phase starting from a rate nothing ran at"),
    ("pre_ema", "train", PRE + ["--config.train.ema_decay=1.5"], r"ema_decay must be in \(0, 1\)",
     "a moving-average decay above 1"),
    ("pre_init_optimizer", "train", PRE + ["--config.init_optimizer=maybe"], r"init_optimizer must be one of",
     "an unknown init_optimizer"),
    ("pre_init_keep_hf", "train", PRE + ["--config.init_checkpoint={hf}", "--config.init_optimizer=keep"],
     r"is an HF folder, which has none: use init_optimizer=reset", "keeping the optimizer of an HF folder"),
    ("pre_init_step", "train", PRE + ["--config.init_step=-2"], r"init_step must be an integer >= 0",
     "a negative init_step"),
    # ---------------------------------------------------------------- pre-training (python -m bertjax train)
    ("pre_keep0", "train", PRE + ["--config.keep_checkpoints=0"], r"keep_checkpoints must be an integer >= 1",
     "keep_checkpoints=0 (would delete every checkpoint)"),
    ("pre_keep_neg", "train", PRE + ["--config.keep_checkpoints=-1"], r"keep_checkpoints must be an integer >= 1",
     "keep_checkpoints=-1"),
    ("pre_lr_nan", "train", PRE + ["--config.train.learning_rate=nan"], r"learning_rate must be a finite number >= 0",
     "learning rate nan"),
    ("pre_lr_inf", "train", PRE + ["--config.train.learning_rate=inf"], r"learning_rate must be a finite number >= 0",
     "learning rate inf"),
    ("pre_lr_neg", "train", PRE + ["--config.train.learning_rate=-0.001"], r"learning_rate must be a finite number",
     "negative learning rate"),
    ("pre_warmup_neg", "train", PRE + ["--config.train.warmup_steps=-5"], r"warmup_steps must be an integer >= 0",
     "negative warmup"),
    ("pre_steps0", "train", PRE + ["--config.train.num_steps=0"], r"train.num_steps must be positive", "zero steps"),
    ("pre_arg_type", "train", [PRE[0].replace("batch=16", "batch=abc")] + PRE[1:],
     r"config argument batch='abc' is not of type int", "a config argument of the wrong type"),
    ("pre_arg_unknown", "train", [PRE[0] + ",varient=base"] + PRE[1:], r"unknown config argument 'varient'",
     "a misspelt config argument"),
    ("pre_shard_unknown", "train", [PRE[0].replace("shard=dp", "shard=zero3")] + PRE[1:],
     r"unknown sharding preset 'zero3'", "an unknown sharding preset"),
    ("pre_field_unknown", "train", PRE + ["--config.train.batch_size=abc"],
     r"no such config field 'batch_size' in train; did you mean 'train.global_batch_size'",
     "a field that does not exist"),
    ("pre_section_unknown", "train", PRE + ["--config.trian.num_steps=3"], r"no such config field 'trian'.*'train'",
     "a section that does not exist"),
    ("pre_field_type", "train", PRE + ["--config.train.global_batch_size=abc"], r"global_batch_size=abc",
     "a field value of the wrong type"),
    ("pre_flag_unknown", "train", PRE + ["--bogus=1"], r"Unknown command line flag 'bogus'", "an unknown flag"),
    ("pre_config_missing", "train", ["--config=configs/no_such_config.py", "--workdir={tmp}/w"], r"no_such_config.py",
     "a config file that does not exist"),
    ("pre_no_data_dir", "train", PRE[:2], r"data.data_dir is empty", "no data_dir"),
    ("pre_data_missing", "train", PRE[:2] + ["--config.data.data_dir={tmp}/nowhere"], r"no creation.json",
     "a data_dir that does not exist"),
    ("pre_vocab_mismatch", "train", [PRE[0].replace("vocab={vocab_n}", "vocab=30522")] + PRE[1:],
     r"does not match the data's tokenizer vocabulary \d+ .*: pass vocab=\d+", "model vocabulary not the tokenizer's"),
    ("pre_seq_mismatch", "train", [PRE[0].replace("seq=32", "seq=64")] + PRE[1:],
     r"data.max_seq_length is 64 but the data .* was made with 32", "sequence length not the data's"),
    ("pre_batch_indivisible", "train", [PRE[0].replace("batch=16", "batch=12")] + PRE[1:],
     r"micro-batch 12 .* not divisible by the data-parallel size 8", "batch not divisible by the devices"),
    ("pre_schedule", "train", PRE + ["--config.train.schedule=cosine_typo"], r"train.schedule 'cosine_typo'",
     "an unknown schedule"),
    ("pre_optimizer", "train", PRE + ["--config.train.optimizer=sgd"], r"train.optimizer 'sgd'",
     "an unknown optimizer"),
    ("pre_prng", "train", PRE + ["--config.train.prng_impl=mt"], r"train.prng_impl 'mt'", "an unknown PRNG"),
    ("pre_into_finetune_workdir", "train", PRE[:1] + ["--workdir={fine}"] + PRE[2:],
     r"holds a fine-tuning run, not a pre-training one", "pre-training into a fine-tuning workdir"),
    ("pre_locked", "train", PRE[:1] + ["--workdir={locked}"] + PRE[2:], r"is in use by another run",
     "a workdir another run holds"),
    # ---------------------------------------------------------------- fine-tuning (python -m bertjax train)
    ("ft_into_pretrain_workdir", "train", FINE[:1] + ["--workdir={pre}"] + FINE[2:],
     r"holds a pre-training run, not a fine-tuning one; to fine-tune from it pass init=", "fine-tuning into a "
     "pre-training workdir"),
    ("ft_pairs_same_positive", "train",
     [FINE[0].replace("task=local", "task=pairs"), "--workdir={tmp}/w_pairs", "--config.data.train_file={pairs_same}",
      "--config.data.text_a_column=anchor", "--config.data.text_b_column=positive", "--config.data.tokenizer={vocab}"],
     r"pairs_same.csv: every row has the same positive", "embedding pairs whose positives are all one text"),
    ("ft_sparse_no_mlm", "train",
     [FINE[0].replace("task=local", "task=sparse,init={hf_encoder}"), "--workdir={tmp}/w_sparse1",
      "--config.data.train_file={pairs_ok}", "--config.data.text_a_column=anchor",
      "--config.data.text_b_column=positive"],
     r"no MLM head; a sparse encoder scores the vocabulary with one", "a sparse encoder from a model without MLM head"),
    ("ft_sparse_regression", "train",
     [FINE[0].replace("task=local", "task=sparse"), "--workdir={tmp}/w_sparse2", "--config.data.regression=True",
      "--config.data.train_file={pairs_ok}", "--config.data.tokenizer={vocab}"],
     r"data.regression=True \(scored pairs\) is task pairs'", "a sparse encoder on scored pairs"),
    ("ft_sparse_weight", "train",
     [FINE[0].replace("task=local", "task=sparse"), "--workdir={tmp}/w_sparse3",
      "--config.sparse.document_regularizer_weight=-0.5", "--config.data.train_file={pairs_ok}",
      "--config.data.tokenizer={vocab}"],
     r"sparse.document_regularizer_weight -0.5 and query_regularizer_weight 5e-05 must be >= 0",
     "a negative FLOPS weight"),
    ("ft_rerank_no_pair", "train",
     [FINE[0].replace("task=local", "task=rerank"), "--workdir={tmp}/w_rerank1", "--config.data.train_file={csv_ok}",
      "--config.data.text_a_column=sentence", "--config.data.tokenizer={vocab}"],
     r"task rerank reads \(query, document, label\) rows: set data.text_b_column", "a reranker without documents"),
    ("ft_rerank_label", "train",
     [FINE[0].replace("task=local", "task=rerank"), "--workdir={tmp}/w_rerank2",
      "--config.data.train_file={rerank_bad}", "--config.data.text_a_column=query",
      "--config.data.text_b_column=document", "--config.data.tokenizer={vocab}"],
     r"rerank_bad.csv: row 2 has label 2.0; task rerank takes relevance in \[0, 1\]", "a relevance label above 1"),
    ("ft_rerank_loss", "train",
     [FINE[0].replace("task=local", "task=rerank"), "--workdir={tmp}/w_rerank3", "--config.rerank.loss=lambda",
      "--config.data.train_file={rerank_bad}", "--config.data.tokenizer={vocab}"],
     r"rerank.loss 'lambda' is not one of \['bce', 'listnet'\]", "an unknown reranking loss"),
    ("ft_multivector_length", "train",
     [FINE[0].replace("task=local", "task=multivector"), "--workdir={tmp}/w_mv1",
      "--config.multivector.query_length=0", "--config.data.train_file={pairs_ok}",
      "--config.data.text_a_column=anchor", "--config.data.text_b_column=positive", "--config.data.tokenizer={vocab}"],
     r"multivector.query_expansion pads queries to multivector.query_length: set it",
     "query expansion without a query length"),
    ("ft_pairs_batch1", "train",
     [FINE[0].replace("task=local", "task=pairs").replace("batch=8", "batch=1"), "--workdir={tmp}/w_pairs3",
      "--config.data.train_file={pairs_ok}", "--config.data.text_a_column=anchor",
      "--config.data.text_b_column=positive", "--config.data.tokenizer={vocab}"],
     r"global_batch_size 1 and no hard negatives has no negative", "embedding pairs in batches of one, no negatives"),
    ("ft_cosent_equal", "train",
     [FINE[0].replace("task=local", "task=pairs"), "--workdir={tmp}/w_pairs4",
      "--config.data.train_file={scored_equal}",
      "--config.data.text_a_column=a", "--config.data.text_b_column=b", "--config.data.label_column=score",
      "--config.data.regression=True", "--config.data.tokenizer={vocab}"],
     r"scored_equal.csv: every row has the same score", "scored pairs (CoSENT) whose scores are all equal"),
    ("ft_score_nan", "train",
     [FINE[0].replace("task=local", "task=pairs"), "--workdir={tmp}/w_pairs5",
      "--config.data.train_file={scored_nan}",
      "--config.data.text_a_column=a", "--config.data.text_b_column=b", "--config.data.label_column=score",
      "--config.data.regression=True", "--config.data.tokenizer={vocab}"],
     r"scored_nan.csv:3: score 'nan' is not a finite number", "a pair's score that is nan"),
    ("ft_one_label", "train", FINE + ["--config.data.train_file={csv_one_label}"],
     r"csv_one_label.csv: every row has the label", "classification rows that all have one label"),
    ("ft_label_inf", "train", FINE + ["--config.data.train_file={csv_inf}", "--config.data.regression=True"],
     r"csv_inf.csv:3: label 'inf' is not a finite number", "a regression label that is inf"),
    ("ft_tags_one", "train", [FINE[0].replace("task=local", "task=ner"), FINE[1],
                             "--config.data.train_file={conll_all_o}", "--config.data.labels=('O','B-PER','I-PER')",
                             "--config.data.tokenizer={vocab}"], r"conll_all_o.txt: every word is tagged 'O'",
     "a tagging file whose every word is O"),
    ("ft_matryoshka_bad", "train",
     [FINE[0].replace("task=local", "task=pairs"), "--workdir={tmp}/w_pairs2", "--config.data.train_file={pairs_same}",
      "--config.data.tokenizer={vocab}", "--config.embedding.matryoshka_dims=256,half"],
     r"embedding.matryoshka_dims '256,half'", "Matryoshka widths that are not numbers"),
    ("ft_lr_neg", "train", FINE + ["--config.train.learning_rate=-1e-5"], r"learning_rate must be a finite number",
     "negative learning rate"),
    ("ft_lr_nan", "train", FINE + ["--config.train.learning_rate=nan"], r"learning_rate must be a finite number",
     "learning rate nan"),
    ("ft_keep0", "train", FINE + ["--config.keep_checkpoints=0"], r"keep_checkpoints must be an integer >= 1",
     "keep_checkpoints=0"),
    ("ft_no_labels", "train", [a for a in FINE if "labels" not in a], r"task local needs its label set declared",
     "no labels declared"),
    ("ft_dup_labels", "train", FINE + ["--config.data.labels=('neg','neg')"], r"names a label twice",
     "a label declared twice"),
    ("ft_unknown_task", "train", [FINE[0].replace("task=local", "task=glue/nope")] + FINE[1:], r"unknown task",
     "an unknown task"),
    ("ft_missing_column", "train", FINE + ["--config.data.text_a_column=text"], r"missing column\(s\) \['text'\]",
     "a column the file does not have"),
    ("ft_empty_text", "train", FINE + ["--config.data.train_file={csv_empty}"], r"csv_empty.csv:3: empty text",
     "an empty text field"),
    ("ft_all_empty", "train", FINE + ["--config.data.train_file={csv_all_empty}"], r"csv_all_empty.csv:2: empty text",
     "every text field empty"),
    ("ft_unknown_label", "train", FINE + ["--config.data.train_file={csv_bad_label}"],
     r"csv_bad_label.csv:3: label 'maybe' is not in the declared set", "a label outside the declared set"),
    ("ft_label_not_number", "train", FINE + ["--config.data.regression=True"], r"csv_ok.csv:2: label 'pos' is not a "
     "number", "a regression label that is not a number"),
    ("ft_train_missing", "train", FINE + ["--config.data.train_file={tmp}/none.csv"], r"none.csv: file not found",
     "a training file that does not exist"),
    ("ft_init_missing", "train", FINE + ["--config.init={tmp}/no_such_model"], r"no_such_model",
     "an init path that does not exist"),
    ("ft_jsonl_bad", "train", FINE + ["--config.data.train_file={jsonl_bad}"], r"jsonl_bad.jsonl:2: not a JSON object",
     "a JSONL line that is not JSON"),
    ("ft_csv_utf8", "train", FINE + ["--config.data.train_file={csv_utf8}"], r"csv_utf8.csv:3: not UTF-8",
     "a training file with bytes that are not UTF-8"),
    ("ft_ner_no_tag", "train", [FINE[0].replace("task=local", "task=ner"), FINE[1],
                               "--config.data.train_file={conll_no_tag}", "--config.data.eval_file={conll_no_tag}",
                               "--config.data.labels=('O','B-PER','I-PER')", "--config.data.tokenizer={vocab}"],
     r"conll_no_tag.txt:2: 'Smith' has no tag", "a CoNLL line without a tag"),
    ("ft_ner_bad_scheme", "train", [FINE[0].replace("task=local", "task=ner"), FINE[1],
                                   "--config.data.train_file={conll_no_tag}", "--config.data.labels=('O','U-PER')",
                                   "--config.data.tokenizer={vocab}"], r"config.data.labels: tag 'U-PER'",
     "a tag scheme the scorer does not read"),
    # ---------------------------------------------------------------- python -m bertjax dataset
    ("ds_binary", "dataset", ["--input", "{binary}", "--tokenizer", "{vocab}", "--out", "{tmp}/d1"],
     r"looks like a binary file", "a binary corpus"),
    ("ds_missing", "dataset", ["--input", "{tmp}/nope.txt", "--tokenizer", "{vocab}", "--out", "{tmp}/d2"],
     r"nope.txt: corpus file not found", "a corpus file that does not exist"),
    ("ds_folder", "dataset", ["--input", "{tmp}", "--tokenizer", "{vocab}", "--out", "{tmp}/d3"], r"is a folder",
     "a folder as --input"),
    ("ds_glob_none", "dataset", ["--input", "{tmp}/*.nothing", "--tokenizer", "{vocab}", "--out", "{tmp}/d4"],
     r"no file matches this pattern", "a glob that matches nothing"),
    ("ds_heldout_1", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d5",
                                 "--heldout_every", "1"], r"heldout_every 1: .*N >= 2", "--heldout_every 1"),
    ("ds_heldout_neg", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d6",
                                   "--heldout_every", "-3"], r"heldout_every -3", "--heldout_every -3"),
    ("ds_workers0", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d7", "--workers",
                                "0"], r"workers must be >= 1", "--workers 0"),
    ("ds_tok_missing", "dataset", ["--input", "{corpus}", "--tokenizer", "{tmp}/none.txt", "--out", "{tmp}/d8"],
     r"none.txt: tokenizer file not found", "a tokenizer that does not exist"),
    ("ds_tok_binary", "dataset", ["--input", "{corpus}", "--tokenizer", "{binary_model}", "--out", "{tmp}/d9"],
     r"not a sentencepiece model", "a file that is not a sentencepiece model"),
    ("ds_spm_cut", "dataset", ["--input", "{corpus}", "--tokenizer", "{spm_cut}", "--out", "{tmp}/d10"],
     r"truncated sentencepiece model", "a sentencepiece model cut at a record boundary"),
    ("ds_vocab_no_mask", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab_no_mask}", "--out", "{tmp}/d11"],
     r"lacks the special token\(s\) \['\[MASK\]'\]", "a vocabulary without [MASK]"),
    ("ds_exists", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{data}"],
     r"exists; pass --overwrite", "an existing dataset without --overwrite"),
    ("ds_locked", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{locked}"],
     r"is in use by another run", "a creation into a folder another creation holds"),
    ("ds_empty", "dataset", ["--input", "{blank}", "--tokenizer", "{vocab}", "--out", "{tmp}/d12"],
     r"no training examples came out", "a corpus of blank lines"),
    ("ds_jsonl_field", "dataset", ["--input", "{jsonl_body}", "--tokenizer", "{vocab}", "--out", "{tmp}/d13"],
     r"no field 'text'", "a JSONL record without the text field"),
    ("ds_bad_choice", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d14", "--format",
                                  "xml"], r"bad command line: argument --format: invalid choice", "an unknown format"),
    ("ds_bad_int", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d15",
                               "--max_seq_length", "long"], r"argument --max_seq_length: invalid int value",
     "a number that is not one"),
    ("ds_no_args", "dataset", [], r"the following arguments are required", "no arguments"),
    # ---------------------------------------------------------------- python -m bertjax tokenizer
    ("tok_missing", "tokenizer", ["--input", "{tmp}/nope.txt", "--out", "{tmp}/t1", "--vocab_size", "64"],
     r"nope.txt", "a corpus that does not exist"),
    ("tok_folder", "tokenizer", ["--input", "{tmp}", "--out", "{tmp}/t2", "--vocab_size", "64"], r"is a folder",
     "a folder as --input"),
    ("tok_empty", "tokenizer", ["--input", "{empty}", "--out", "{tmp}/t3", "--vocab_size", "64"],
     r"cannot train a tokenizer on empty input", "an empty corpus"),
    ("tok_blank", "tokenizer", ["--input", "{blank}", "--out", "{tmp}/t4", "--vocab_size", "64"],
     r"no text in .*every line is blank", "a corpus of blank lines"),
    ("tok_small", "tokenizer", ["--input", "{corpus}", "--out", "{tmp}/t5", "--vocab_size", "8"],
     r"vocab_size 8 is too small", "a vocabulary too small for the special tokens"),
    ("tok_exists", "tokenizer", ["--input", "{corpus}", "--out", "{tokdir}", "--vocab_size", "128"],
     r"already holds \['vocab.txt'\]; pass --overwrite", "a tokenizer folder without --overwrite"),
    ("tok_kind", "tokenizer", ["--input", "{corpus}", "--out", "{tmp}/t6", "--kind", "wordpeice"],
     r"argument --kind: invalid choice: 'wordpeice'", "an unknown kind"),
    # ---------------------------------------------------------------- python -m bertjax predict
    # ---------------------------------------------------------------- embeddings (python -m bertjax embeddings)
    ("emb_beir_dup", "embeddings", ["--model", "{pre}", "--beir", "{beir_dup}"],
     r"corpus.jsonl:2: document id 'a' repeats line 1", "a BEIR corpus with a repeated document id"),
    ("emb_beir_utf8", "embeddings", ["--model", "{pre}", "--beir", "{beir_utf8}"], r"corpus.jsonl:2: not UTF-8",
     "a BEIR corpus record that is not UTF-8"),
    ("emb_beir_unknown", "embeddings", ["--model", "{pre}", "--beir", "{beir_unknown}"],
     r"test.tsv: query '1' judges document id 'z', which is not in", "qrels naming a document the corpus lacks"),
    ("emb_beir_missing", "embeddings", ["--model", "{pre}", "--beir", "{tmp}/none"], r"corpus.jsonl: no such file",
     "a BEIR folder that does not exist"),
    ("emb_corpus_no_out", "embeddings", ["--model", "{pre}", "--corpus", "{corpus_dup}"],
     r"the following arguments are required: --out", "a corpus to embed without an output folder"),
    ("emb_corpus_no_out_new", "embeddings", ["corpus", "{corpus_dup}", "--model", "{pre}"],
     r"the following arguments are required: --out", "`embeddings corpus` without an output folder"),
    ("emb_corpus_dup", "embeddings", ["--model", "{pre}", "--corpus", "{corpus_dup}", "--out", "{tmp}/e1"],
     r"corpus_dup.jsonl:2: document id 'a' repeats .*corpus_dup.jsonl:1",
     "a corpus to embed with a repeated id"),
    ("emb_corpus_field", "embeddings", ["--model", "{pre}", "--corpus", "{corpus_no_text}", "--out", "{tmp}/e2"],
     r"corpus_no_text.jsonl:1: a record needs '_id' and 'text'", "a corpus record without its text field"),
    ("emb_corpus_json", "embeddings", ["--model", "{pre}", "--corpus", "{corpus_bad_json}", "--out", "{tmp}/e3"],
     r"corpus_bad_json.jsonl:2: ", "a corpus line that is not JSON"),
    ("emb_corpus_utf8", "embeddings", ["--model", "{pre}", "--corpus", "{corpus_utf8}", "--out", "{tmp}/e4"],
     r"corpus_utf8.txt:2: not UTF-8", "a plain-text corpus line that is not UTF-8"),
    ("emb_corpus_none", "embeddings", ["--model", "{pre}", "--corpus", "{tmp}/nothing*.jsonl", "--out", "{tmp}/e5"],
     r"nothing\*.jsonl: no file matches this pattern", "corpus globs that match nothing"),
    ("emb_sts_column", "embeddings", ["--model", "{pre}", "--sts", "{sts_no_score}"],
     r"missing column\(s\) \['score'\]", "an STS file without its score column"),
    ("emb_two_tasks", "embeddings", ["--model", "{pre}", "--sts", "{sts_no_score}", "--beir", "{beir_dup}"],
     r"--sts and --beir: one mode at a time", "both --sts and --beir"),
    ("emb_no_mode", "embeddings", ["--model", "{pre}"], r"name a mode first: python -m bertjax embeddings sts\|beir",
     "no mode (neither a subcommand nor a mode flag)"),
    ("emb_mode_unknown", "embeddings", ["search", "{beir_ok}", "--model", "{pre}"],
     r"argument MODE: invalid choice: 'search'", "an unknown subcommand"),
    ("emb_two_modes_new", "embeddings", ["beir", "{beir_ok}", "--model", "{pre}", "--corpus", "{corpus_dup}"],
     r"--corpus: names the mode `corpus`, and this line runs `beir`", "a mode flag after a subcommand"),
    ("emb_other_modes_option", "embeddings", ["sts", "{sts_no_score}", "--model", "{pre}", "--run", "{tmp}/r.trec"],
     r"--run: not an option for `embeddings sts`; leave it out \(it is for beir, rerank\)",
     "an option of another mode (the mode's parser refuses it before the model loads)"),
    ("emb_unknown_option", "embeddings", ["beir", "{beir_ok}", "--model", "{pre}", "--bogus"],
     r"unrecognized arguments: --bogus", "an option no mode takes"),
    # ---------------------------------------------------------------- teacher scores (python -m bertjax teacher)
    ("teacher_model", "teacher", TEACHER[:1] + ["{tmp}/none"] + TEACHER[2:],
     r"--model .*none: no such model folder", "a teacher --model that does not exist"),
    ("teacher_pairs", "teacher", TEACHER[:3] + ["{tmp}/none.csv"] + TEACHER[4:], r"--pairs .*none.csv: no such file",
     "a --pairs file that does not exist"),
    ("teacher_columns", "teacher", TEACHER + ["--columns", "anchor"], r"--columns 'anchor': give the query, positive",
     "one column, no document to score"),
    ("teacher_out", "teacher", TEACHER[:5] + ["{tmp}"] + TEACHER[6:],
     r"--out .*: exists and the teacher command did not write it", "an --out folder the command did not write"),
    ("teacher_block", "teacher", TEACHER + ["--block", "0"], r"--block 0 must be >= 1", "a block of no rows"),
    ("teacher_batch_size", "teacher", TEACHER + ["--batch_size", "0"], r"--batch_size 0 must be >= 1",
     "a batch of no rows"),
    # ---------------------------------------------------------------- hard negatives (python -m bertjax mine)
    ("mine_model", "mine", ["--model", "{tmp}/none", "--pairs", "{pairs_ok}", "--out", "{tmp}/m.jsonl"],
     r"--model .*none: no such model folder", "a --model that does not exist"),
    ("mine_pairs", "mine", ["--model", "{pre}", "--pairs", "{tmp}/none.csv", "--out", "{tmp}/m.jsonl"],
     r"none.csv", "a --pairs file that does not exist"),
    ("mine_kind", "mine", ["--model", "{root}/tests/data/zoo/st6/multivector-colbert", "--pairs", "{pairs_ok}",
                           "--out", "{tmp}/m_kind.jsonl"], r"a multi-vector encoder; mining ranks the corpus with a "
     r"dense embedding model", "--model naming a multi-vector encoder"),
    ("mine_columns", "mine", MINE + ["--columns", "anchor"], r"--columns 'anchor': give two names",
     "one pairs column named"),
    ("mine_corpus_empty", "mine", MINE + ["--corpus", "{blank}"], r"--corpus .*blank.txt: an empty corpus",
     "an empty corpus"),
    ("mine_corpus_missing", "mine", MINE + ["--corpus", "{corpus}"],
     r"--pairs .*: 2 positive\(s\) missing from --corpus", "a pairs file whose positives the corpus lacks"),
    ("mine_out_kind", "mine", MINE[:4] + ["--out", "{tmp}/m.txt"], r"--out .*m.txt: a .jsonl or .csv file",
     "an output file neither JSONL nor CSV"),
    ("mine_out_theirs", "mine", MINE[:4] + ["--out", "{csv_ok}"],
     r"--out .*csv_ok.csv: exists and this command did not write it; pass --overwrite",
     "an --out file the command did not write"),
    ("mine_overwrite", "mine", MINE + ["--overwrite=yes"], r"argument --overwrite: ignored explicit argument",
     "a value given to the --overwrite switch"),
    ("mine_num_negatives", "mine", MINE + ["--num_negatives", "-1"], r"--num_negatives must be an integer >= 1",
     "a negative num_negatives"),
    ("mine_range", "mine", MINE + ["--range_min", "5", "--range_max", "5"],
     r"--range_min 5 must be smaller than --range_max 5", "range_min >= range_max"),
    ("mine_max_score", "mine", MINE + ["--max_score", "nan"], r"--max_score nan: a finite number",
     "a max_score that is not a number"),
    ("mine_min_score", "mine", MINE + ["--min_score", "x"], r"argument --min_score: invalid float value",
     "a min_score that is not a number"),
    ("mine_absolute_margin", "mine", MINE + ["--absolute_margin", "inf"], r"--absolute_margin inf: a finite number",
     "an infinite absolute_margin"),
    ("mine_relative_margin", "mine", MINE + ["--relative_margin", "nan"], r"--relative_margin nan: a finite number",
     "a relative_margin that is not a number"),
    ("mine_strategy", "mine", MINE + ["--sampling_strategy", "best"],
     r"--sampling_strategy 'best': one of top, random", "an unknown sampling strategy"),
    ("mine_seed", "mine", MINE + ["--seed", "1"], r"--seed is for --sampling_strategy random",
     "a seed for top sampling"),
    ("mine_format", "mine", MINE + ["--output_format", "quadruplet"], r"--output_format 'quadruplet': one of",
     "an unknown output format"),
    ("mine_output_scores", "mine", MINE + ["--output_scores=no"], r"argument --output_scores: ignored explicit",
     "a value given to the --output_scores switch"),
    ("mine_include_positives", "mine", MINE + ["--include_positives", "--output_format", "labeled-pair"],
     r"--include_positives keeps the ranking order in n-tuple rows", "positives kept in labelled pairs"),
    ("mine_cross_encoder", "mine", MINE + ["--cross_encoder", "{pre}"], r"--cross_encoder .*: not a cross-encoder",
     "a cross-encoder path that is not a cross-encoder"),
    ("mine_query_prompt", "mine", MINE + ["--query_prompt", "q: ", "--query_prompt_name", "query"],
     r"--query_prompt and --query_prompt_name: give one", "both a query prompt and a query prompt name"),
    ("mine_corpus_prompt", "mine", MINE + ["--corpus_prompt", "d: ", "--corpus_prompt_name", "document"],
     r"--corpus_prompt and --corpus_prompt_name: give one", "both a corpus prompt and a corpus prompt name"),
    ("mine_prompt_name", "mine", MINE + ["--query_prompt_name", "query"],
     r"--query_prompt_name 'query': the model has no such prompt", "a prompt name the model lacks"),
    ("mine_cache_dir", "mine", MINE + ["--cache_dir", "{pre}"], r"--cache_dir .*: holds a model or workdir",
     "an embeddings folder that is a workdir"),
    ("mine_block", "mine", MINE + ["--block", "0"], r"--block must be an integer >= 1", "a block of 0 documents"),
    ("mine_batch_size", "mine", MINE + ["--batch_size", "0"], r"--batch_size must be an integer >= 1",
     "a batch of 0 texts"),
    ("pr_missing", "predict", ["--workdir", "{tmp}/none", "a [MASK] b"], r"no config.json|none",
     "a workdir that does not exist"),
    ("pr_no_mlm", "predict", ["--workdir", "{root}/tests/data/zoo/st6/bert-model", "a [MASK] b"],
     r"bert-model: no MLM head", "an HF folder without an MLM head"),
    ("pr_no_text", "predict", ["--workdir", "{pre}"], r"the following arguments are required: text", "no text"),
    ("pr_no_checkpoint", "predict", ["--workdir", "{pre_empty}", "a [MASK] b"], r"no checkpoint",
     "a workdir without a checkpoint"),
    ("pr_top_k", "predict", ["--workdir", "{pre}", "--top_k", "x", "a [MASK] b"], r"argument --top_k: invalid int",
     "a non-integer --top_k"),
    # ---------------------------------------------------------------- python -m bertjax convert
    ("cv_missing", "convert", ["--workdir", "{tmp}/none", "--out", "{tmp}/hf1"], r"no such workdir",
     "a workdir that does not exist"),
    ("cv_into_workdir", "convert", ["--workdir", "{pre}", "--out", "{fine}"], r"holds a bertjax workdir",
     "--out naming a workdir (its config.json would be replaced)"),
    ("cv_into_itself", "convert", ["--workdir", "{pre}", "--out", "{pre}"], r"is the workdir being converted",
     "--out naming the workdir itself"),
    ("cv_into_data", "convert", ["--workdir", "{pre}", "--out", "{data}"], r"holds a bertjax workdir or data dir",
     "--out naming a data dir"),
    ("cv_not_empty", "convert", ["--workdir", "{pre}", "--out", "{full}"], r"exists and is not empty; pass --overwrite",
     "--out naming a folder with files"),
    ("cv_is_file", "convert", ["--workdir", "{pre}", "--out", "{corpus}"], r"exists and is not a folder",
     "--out naming a file"),
    ("cv_no_checkpoint", "convert", ["--workdir", "{pre_empty}", "--out", "{tmp}/hf2"], r"no checkpoint",
     "a workdir without a checkpoint"),
    # ---------------------------------------------------------------- python -m bertjax aot
    ("aot_topology", "aot", ["--config=configs/pretrain.py:variant=tiny", "--topology=v9z:9x9"], r"v9z",
     "an unknown TPU topology"),
    ("aot_config_arg", "aot", ["--config=configs/pretrain.py:varient=tiny"], r"unknown config argument 'varient'",
     "a misspelt config argument"),
    ("aot_field", "aot", ["--config=configs/pretrain.py:variant=tiny", "--config.train.batch_size=8"],
     r"no such config field 'batch_size'", "a field that does not exist"),
    # ---------------------------------------------------------------- every other flag of train, aot, parity
    ("tr_multihost", "train", PRE + ["--multihost=maybe"], r"multihost", "--multihost not on/off/auto"),
    ("tr_address_alone", "train", PRE + ["--coordinator_address=127.0.0.1:1"],
     r"explicit multi-process run takes --coordinator_address.*--num_processes.*--process_id.* together",
     "--coordinator_address without --num_processes and --process_id"),
    ("tr_processes0", "train", PRE + ["--coordinator_address=127.0.0.1:1", "--num_processes=0", "--process_id=0"],
     r"--num_processes=N \(>= 1\)", "--num_processes 0"),
    ("tr_process_id", "train", PRE + ["--coordinator_address=127.0.0.1:1", "--num_processes=2", "--process_id=5"],
     r"0 <= I < N", "--process_id outside the processes"),
    ("tr_no_workdir", "train", PRE[:1] + PRE[2:], r"--workdir", "no --workdir"),
    ("aot_per_chip0", "aot", ["--config=configs/pretrain.py:variant=tiny", "--per_chip_batch=0"],
     r"--per_chip_batch must be >= 1", "--per_chip_batch 0"),
    ("aot_slices0", "aot", ["--config=configs/pretrain.py:variant=tiny", "--num_slices=0"],
     r"--num_slices must be >= 1", "--num_slices 0"),
    ("aot_search", "aot", ["--config=configs/pretrain.py:variant=tiny", "--search", "--topology=v9z:9x9",
                           "--out={tmp}/aot.json"], r"v9z", "--search (and --out) on an unknown topology"),
    ("pa_steps", "parity", ["--config={root}/configs/finetune.py:task=local", "--out={tmp}/p1", "--steps=-1"],
     r"--steps must be >= 0", "--steps -1"),
    ("pa_no_out", "parity", ["--config={root}/configs/finetune.py:task=local", "--dropout"], r"--out",
     "no --out (with --dropout)"),
    ("pa_no_init", "parity", ["--config={root}/configs/finetune.py:task=local", "--out={tmp}/p2",
                              "--config.data.labels=('a','b')"], r"parity needs config.init",
     "a config without an init to start both loops from"),
    # ---------------------------------------------------------------- every other flag of dataset
    ("ds_beam_quote", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d16",
                                  "--beam_runner", "DirectRunner", "--beam_options=--project='x"],
     r"--beam_options .*No closing quotation", "--beam_options with an unclosed quote"),
    ("ds_wwm_flase", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d17",
                                 "--whole_word_mask=flase"], r"--whole_word_mask: 'flase' is not a boolean",
     "--whole_word_mask=flase (not read as False)"),
    ("ds_text_field", "dataset", ["--input", "{jsonl_body}", "--tokenizer", "{vocab}", "--out", "{tmp}/d18",
                                  "--text_field", "content", "--skip_bad_records"], r"no field 'content'|no training",
     "--text_field naming no field (with --skip_bad_records)"),
    ("ds_splitter", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d19",
                                "--splitter", "nltk"], r"argument --splitter: invalid choice", "an unknown splitter"),
    ("ds_language", "dataset", ["--input", "{tmp}/nope.txt", "--tokenizer", "{vocab}", "--out", "{tmp}/d20",
                                "--language", "de", "--cased"], r"nope.txt: corpus file not found",
     "--language and --cased with a corpus that does not exist"),
    ("ds_tfds", "dataset", ["--input", "tfds:no_such_dataset", "--tokenizer", "{vocab}", "--out", "{tmp}/d21",
                            "--tfds_data_dir", "{tmp}"], r"no_such_dataset", "a tfds input that does not exist"),
    ("ds_tfds_dir", "dataset", ["--input", "tfds:no_such_dataset", "--tokenizer", "{vocab}", "--out", "{tmp}/d21b",
                                "--tfds_data_dir", "{corpus}"], r"--tfds_data_dir .*is a file, not a folder",
     "a --tfds_data_dir that is a file"),
    ("ds_beam_runner", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d21c",
                                   "--beam_runner", "NoSuchRunner"], r"--beam_runner 'NoSuchRunner'",
     "an unknown --beam_runner"),
    ("ds_mask_prob", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d22",
                                 "--masked_lm_prob", "1.5"], r"masked_lm_prob must be in \(0, 1\)",
     "--masked_lm_prob 1.5"),
    ("ds_short", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d23",
                             "--short_seq_prob", "2"], r"short_seq_prob must be in \[0, 1\]", "--short_seq_prob 2"),
    ("ds_dupe0", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d24",
                             "--dupe_factor", "0"], r"dupe_factor must be >= 1", "--dupe_factor 0"),
    ("ds_buffer0", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d25",
                               "--buffer_documents", "0"], r"buffer_documents must be >= 1", "--buffer_documents 0"),
    ("ds_preds", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d26",
                             "--max_predictions_per_seq", "-1"], r"max_predictions_per_seq must be >= 1",
     "--max_predictions_per_seq -1"),
    ("ds_mode", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d27",
                            "--example_mode", "pairs"], r"example_mode 'pairs'", "an unknown example mode"),
    ("ds_seed", "dataset", ["--input", "{corpus}", "--tokenizer", "{vocab}", "--out", "{tmp}/d28",
                            "--random_seed", "x"], r"argument --random_seed: invalid int",
     "a seed that is not a number"),
    ("ds_overwrite", "dataset", ["--input", "{tmp}/nope.txt", "--tokenizer", "{vocab}", "--out", "{data}",
                                 "--overwrite"], r"nope.txt: corpus file not found",
     "--overwrite with a corpus that does not exist (the data dir stays)"),
    # ---------------------------------------------------------------- every other flag of tokenizer
    ("tok_vocab0", "tokenizer", ["--input", "{corpus}", "--out", "{tmp}/t7", "--vocab_size", "0"],
     r"vocab_size 0 is too small", "--vocab_size 0"),
    ("tok_field", "tokenizer", ["--input", "{jsonl_body}", "--out", "{tmp}/t8", "--vocab_size", "64", "--text_field",
                                "content", "--skip_bad_records"], r"no field 'content'|no text",
     "--text_field naming no field (with --skip_bad_records)"),
    ("tok_cased", "tokenizer", ["--input", "{tmp}/nope.txt", "--out", "{tmp}/t9", "--cased", "--overwrite"],
     r"nope.txt", "--cased and --overwrite with a corpus that does not exist"),
    # ---------------------------------------------------------------- every other flag of predict, convert, plot
    ("pr_top_k0", "predict", ["--workdir", "{pre}", "--top_k", "0", "a [MASK] b"], r"--top_k must be >= 1",
     "--top_k 0"),
    ("pr_pair", "predict", ["--workdir", "{fine}", "--pair", "b", "--question", "q", "a"], r"w_fine_done",
     "--pair and --question with a fine-tuned workdir that holds no model"),
    ("cv_hf_folder", "convert", ["--workdir", "{hf}", "--out", "{tmp}/hf3"], r"needs no conversion",
     "an HF folder given as the workdir to convert"),
    ("cv_overwrite_workdir", "convert", ["--workdir", "{pre}", "--out", "{fine}", "--overwrite"],
     r"holds a bertjax workdir", "--overwrite naming a workdir as --out (never replaced)"),
    # ---------------------------------------------------------------- python -m bertjax merge
    ("mg_missing", "merge", ["{tmp}/nowhere", "{hf}", "--out", "{tmp}/m1"], r"nowhere: no such workdir or HF folder",
     "an input that does not exist"),
    ("mg_fine", "merge", ["{fine}", "{hf}", "--out", "{tmp}/m2"], r"is a fine-tuned workdir",
     "a fine-tuned workdir as input"),
    ("mg_shapes", "merge", ["{hf}", "{hf_wide}", "--out", "{tmp}/m3"], r"different architectures \(hidden_size 16 "
     r"vs 32", "checkpoints of different shapes"),
    ("mg_families", "merge", ["{hf}", "{hf_rotary}", "--out", "{tmp}/m3b"], r"different architectures",
     "checkpoints of different families"),
    ("mg_into_input", "merge", ["{hf}", "{hf}", "--out", "{hf}"], r"is one of the inputs", "writing over an input"),
    ("mg_out_full", "merge", ["{hf}", "{hf}", "--out", "{full}", "--overwrite"], r"holds files a merge did not write",
     "an --out holding other files, even with --overwrite"),
    ("mg_method", "merge", ["{hf}", "{hf}", "--method", "soup", "--out", "{tmp}/m4"], r"invalid choice: 'soup'",
     "an unknown method"),
    ("mg_no_base", "merge", ["{hf}", "{hf}", "--method", "ties", "--out", "{tmp}/m5"], r"give --base",
     "TIES without a base"),
    ("mg_base_missing", "merge", ["{hf}", "--method", "ties", "--base", "{tmp}/no_base", "--out", "{tmp}/m5b"],
     r"no_base", "a --base that does not exist"),
    ("mg_density", "merge", ["{hf}", "--method", "ties", "--base", "{hf}", "--density", "0", "--out", "{tmp}/m6"],
     r"--density must be in \(0, 1\]", "a TIES density of 0"),
    ("mg_lam", "merge", ["{hf}", "--method", "ties", "--base", "{hf}", "--lam", "nan", "--out", "{tmp}/m6b"],
     r"--lam a number", "a TIES scale that is not a number"),
    ("mg_weights_text", "merge", ["{hf}", "{hf}", "--weights", "1,x", "--out", "{tmp}/m7"], r"give numbers",
     "weights that are not numbers"),
    ("mg_weights_zero", "merge", ["{hf}", "{hf}", "--weights", "1,0", "--out", "{tmp}/m8"],
     r"one number > 0 per input", "a weight of 0"),
    ("mg_last", "merge", ["{pre}", "--last", "3", "--out", "{tmp}/m9"], r"holds 0 checkpoint\(s\)",
     "--last beyond the checkpoints kept"),
    ("mg_last_two", "merge", ["{hf}", "{hf}", "--last", "2", "--out", "{tmp}/m10"], r"averages the checkpoints of one",
     "--last with two inputs"),
    ("mg_selector", "merge", ["{hf}@3", "{hf}", "--out", "{tmp}/m11"], r"an HF folder holds one checkpoint",
     "a step of an HF folder"),
    ("mg_no_out", "merge", ["{hf}", "{hf}"], r"the following arguments are required: --out", "no --out"),
    ("pl_missing", "plot", ["{tmp}/none"], r"none: no metrics.jsonl", "a workdir without metrics"),
    ("pl_no_args", "plot", [], r"the following arguments are required: workdir", "no workdir"),
    # ---------------------------------------------------------------- python -m bertjax extend_vocab
    ("ev_model_missing", "extend_vocab", ["--model", "{tmp}/none", "--tokens", "alpha", "--out", "{tmp}/x1"],
     r"none: neither a bertjax workdir", "a model that does not exist"),
    ("ev_tokens_file", "extend_vocab", ["--model", "{hf}", "--tokens", "{tmp}/words.txt", "--out", "{tmp}/x2"],
     r"--tokens .*words.txt: no such file", "--tokens naming a file that does not exist"),
    ("ev_tokens_empty", "extend_vocab", ["--model", "{hf}", "--tokens", ",", "--out", "{tmp}/x3"],
     r"--tokens: no tokens given", "no tokens"),
    ("ev_token_known", "extend_vocab", ["--model", "{hf}", "--tokens", "model", "--out", "{tmp}/x4"],
     r"token 'model' is already in the vocabulary", "a token the vocabulary has"),
    ("ev_out_full", "extend_vocab", ["--model", "{hf}", "--tokens", "zebra", "--out", "{full}"],
     r"exists and is not empty; pass --overwrite", "--out naming a folder with files"),
    ("ev_out_workdir", "extend_vocab", ["--model", "{hf}", "--tokens", "zebra", "--out", "{pre}", "--overwrite"],
     r"holds a bertjax workdir", "--overwrite naming a workdir as --out (never replaced)"),
    # ---------------------------------------------------------------- every other flag of embeddings
    ("emb_batch0", "embeddings", ["beir", "{beir_dup}", "--model", "{hf}", "--batch_size", "0"],
     r"--batch_size must be an integer >= 1, got 0", "--batch_size 0"),
    ("emb_batch_neg", "embeddings", ["--model", "{hf}", "--sts", "{sts_no_score}", "--batch_size", "-3"],
     r"--batch_size must be an integer >= 1, got -3", "--batch_size -3"),
    ("emb_top_k0", "embeddings", ["--model", "{hf}", "--beir", "{beir_dup}", "--top_k", "0"],
     r"--top_k must be an integer >= 1", "--top_k 0"),
    ("emb_block0", "embeddings", ["corpus", "{corpus_dup}", "--model", "{hf}", "--out", "{tmp}/e6", "--block", "0"],
     r"--block must be an integer >= 1", "--block 0"),
    ("emb_active_dims", "embeddings", ["--model", "{sparse}", "--beir", "{beir_ok}", "--max_active_dims", "-1"],
     r"--max_active_dims -1: a count of terms >= 0", "a negative --max_active_dims"),
    ("emb_sparse_sts", "embeddings", ["--model", "{sparse}", "--sts", "{sts_no_score}"],
     r"is a sparse encoder: it takes `embeddings beir` or `embeddings suite`", "a sparse encoder on STS"),
    ("emb_cross_beir", "embeddings", ["--model", "{root}/tests/data/zoo/st5/cross-1label-tanh", "--beir",
                                      "{beir_ok}"], r"cross-1label-tanh is a cross-encoder: it re-scores a run",
     "a sentence-transformers 5 cross-encoder given to --beir without --rerank"),
    ("emb_sparse_cos", "embeddings", ["--model", "{sparse}", "--beir", "{beir_ok}", "--score", "cos"],
     r"a sparse encoder scores by dot product: --score dot", "a sparse encoder with cosine scores"),
    ("emb_rerank_sts", "embeddings", ["--model", "{hf}", "--sts", "{sts_no_score}", "--rerank", "{run_ok}"],
     r"--rerank needs --beir", "--rerank without a BEIR folder"),
    ("emb_rerank_depth0", "embeddings", ["rerank", "{beir_ok}", "{run_ok}", "--model", "{hf}", "--depth", "0"],
     r"--depth must be an integer >= 1", "--depth 0"),
    ("emb_rerank_unknown", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--rerank", "{run_unknown}"],
     r"run_unknown.trec:2: document 'zz' is not in the corpus", "a run naming a document the corpus lacks"),
    ("emb_rerank_twice", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--rerank", "{run_twice}"],
     r"run_twice.trec:2: document 'a' is listed twice for query '1'", "a run listing a document twice"),
    ("emb_rerank_mlm", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--rerank", "{run_ok}"],
     r"not a cross-encoder", "reranking with a model that is not a cross-encoder"),
    ("emb_multi_score", "embeddings", ["--model", "{mve}", "--beir", "{beir_ok}", "--score", "dot"],
     r"a multi-vector encoder scores by MaxSim", "--score with a multi-vector encoder"),
    ("emb_multi_corpus", "embeddings", ["--model", "{mve}", "--corpus", "{corpus_dup}", "--out", "{tmp}/e_mv"],
     r"is a multi-vector encoder: it takes `embeddings beir`", "a multi-vector encoder on --corpus"),
    ("emb_score", "embeddings", ["--model", "{hf}", "--beir", "{beir_dup}", "--score", "cosine"],
     r"argument --score: invalid choice", "an unknown --score"),
    ("emb_pooling", "embeddings", ["--model", "{hf}", "--beir", "{beir_dup}", "--pooling", "avg"],
     r"argument --pooling: invalid choice", "an unknown --pooling"),
    ("emb_split", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--split", "dev"], r"qrels/dev.tsv: no such",
     "--split naming qrels the folder lacks"),
    ("emb_run_exists", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--run", "{hf}/config.json"],
     r"--run .*config.json: exists and is not a run this command wrote; pass --overwrite",
     "--run naming a file that is not a run (a model's config.json)"),
    ("emb_cache_model", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--cache_dir", "{hf}"],
     r"--cache_dir .*: holds a model or workdir", "--cache_dir naming a model folder"),
    ("emb_out_foreign", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{foreign_blocks}"],
     r"--out .*foreign: holds files it did not write \(block-00000.npy, ids.json\)",
     "--out holding an ids.json and a block file the command did not write"),
    ("emb_out_model", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{hf}", "--overwrite"],
     r"--out .*: holds a model or workdir", "--out naming the model folder (even with --overwrite)"),
    ("emb_id_field", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{tmp}/e7", "--id_field",
                                    "docid", "--doc_prefix", "passage: "], r"a record needs 'docid' and 'text'",
     "--id_field naming no field (with --doc_prefix)"),
    ("emb_text_field", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{tmp}/e8",
                                      "--text_field", "body"], r"a record needs '_id' and 'body'",
     "--text_field naming no field"),
    ("emb_query_prefix", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--query_prefix"],
     r"argument --query_prefix: expected one argument", "--query_prefix without its text"),
    ("emb_columns", "embeddings", ["sts", "{sts_no_score}", "--model", "{hf}", "--columns", "a,b"],
     r"--columns 'a,b': give three names", "--columns with two names"),
    ("emb_suite_not_beir", "embeddings", ["--model", "{hf}", "--beir_suite", "{beir_ok}", "{hf}"],
     r"embeddings suite: .* is not a BEIR folder \(no corpus.jsonl", "--beir_suite given a folder that is not a "
     "BEIR folder"),
    ("emb_suite_out", "embeddings", ["suite", "{beir_ok}", "--model", "{hf}", "--out", "{hf}/config.json"],
     r"--out .*config.json: exists and is not a report this command wrote", "--beir_suite with an --out file that "
     "is not its report"),
    ("emb_qid_dup", "embeddings", ["--model", "{hf}", "--beir", "{beir_qdup}"],
     r"queries.jsonl:2: query id '1' repeats line 1", "a BEIR query id given twice"),
    ("emb_id_null", "embeddings", ["--model", "{hf}", "--beir", "{beir_null}"], r"corpus.jsonl:1: _id None is not",
     "a BEIR record whose _id is null"),
    ("emb_text_number", "embeddings", ["--model", "{hf}", "--beir", "{beir_number}"],
     r"queries.jsonl:1: text is a int, not text", "a BEIR query whose text is a number"),
    ("emb_corpus_empty", "embeddings", ["--model", "{hf}", "--corpus", "{empty_jsonl}", "--out", "{tmp}/e9"],
     r"no documents", "an empty corpus"),
    ("emb_model_missing", "embeddings", ["--model", "{tmp}/none", "--beir", "{beir_ok}"],
     r"none: neither a bertjax workdir", "a model that does not exist"),
    ("emb_precision", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--precision", "int4"],
     r"argument --precision: invalid choice", "an unknown --precision"),
    ("emb_precision_sparse", "embeddings", ["--model", "{sparse}", "--beir", "{beir_ok}", "--precision", "int8"],
     r"--precision: not an option for a sparse encoder .*: its term vectors cannot be quantized",
     "--precision with a sparse encoder"),
    ("emb_precision_resume", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{int8_blocks}",
                                            "--precision", "binary"],
     r"int8_blocks: holds int8 embeddings, and this run asks for binary", "a resume at another --precision"),
    ("emb_out_others", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{user_folder}"],
     r"user_folder: a folder with other files \(notes.txt\)", "an --out folder holding a user's own files"),
    ("emb_out_manifest", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{user_manifest}"],
     r"user_manifest: its manifest.json is not a block folder's", "an --out whose manifest.json a user wrote"),
    ("emb_calibration", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{tmp}/e10",
                                       "--precision", "int8", "--calibration", "{tmp}/none.npy"],
     r"--calibration .*none.npy: no such file", "a --calibration file that does not exist"),
    ("emb_calibration_width", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{tmp}/e11",
                                             "--precision", "int8", "--calibration", "{calib_narrow}"],
     r"--calibration: embeddings 10 wide, and this model's are 16 wide", "a --calibration file of another width"),
    ("emb_calibration_binary", "embeddings", ["--model", "{hf}", "--corpus", "{corpus_ok}", "--out", "{tmp}/e12",
                                              "--precision", "binary", "--calibration", "{calib_narrow}"],
     r"--calibration: only --precision int8 or uint8", "--calibration for binary embeddings (no ranges)"),
    ("emb_rescore_neg", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--precision", "binary",
                                       "--rescore_multiplier", "-1"],
     r"--rescore_multiplier -1: an integer >= 1", "a negative --rescore_multiplier"),
    ("emb_rescore_float", "embeddings", ["--model", "{hf}", "--beir", "{beir_ok}", "--rescore_multiplier", "4"],
     r"--rescore_multiplier is for `embeddings beir` with a quantized --precision",
     "--rescore_multiplier on a float32 corpus"),
    # ---------------------------------------------------------------- launch/suite.py and launch/sweep.py
    ("su_lrs", "suite", ["run", "--tasks", "local", "--lrs", "abc", "--root", "{tmp}/s1"],
     r"--lrs 'abc': 'abc' is not a positive number", "--lrs that are not numbers"),
    ("su_lrs_neg", "suite", ["run", "--tasks", "local", "--lrs", "-1", "--root", "{tmp}/s2"],
     r"'-1' is not a positive number", "a negative learning rate"),
    ("su_seeds", "suite", ["run", "--tasks", "local", "--seeds", "0,x", "--root", "{tmp}/s3"],
     r"--seeds '0,x': 'x' is not an integer", "--seeds that are not integers"),
    ("su_task", "suite", ["run", "--tasks", "glue/nope", "--root", "{tmp}/s4"], r"unknown task 'glue/nope'",
     "--tasks naming an unknown task"),
    ("su_suite_json", "suite", ["run", "--suite", "{jsonl_bad}", "--root", "{tmp}/s5", "--print"],
     r"--suite .*jsonl_bad.jsonl", "a --suite file that is not JSON (with --print)"),
    ("su_init", "suite", ["run", "--tasks", "local", "--init", "{tmp}/none", "--root", "{tmp}/s6"],
     r"--init .*none: no such workdir or folder", "an --init that does not exist"),
    ("su_nothing", "suite", ["run", "--root", "{tmp}/s7"], r"give --tasks and/or --suite", "no tasks"),
    ("su_table", "suite", ["table", "--root", "{tmp}/none"], r"--root .*none: no suite.json.runs",
     "a table of a root that holds no suite"),
    ("sw_config", "sweep", ["run", "--config", "configs/no_such.py", "--root", "{tmp}/w1"],
     r"config file .*no_such.py not found", "a config file that does not exist"),
    ("sw_grid", "sweep", ["run", "--config", "configs/finetune.py:task=local", "--grid", "lr", "--root",
                          "{tmp}/w2", "--print"], r"--grid 'lr': expected key=v1,v2", "a grid without values"),
    ("sw_print", "sweep", ["run", "--config", "configs/finetune.py:task=local", "--grid", "lr=1e-5", "--root",
                           "{tmp}/w3", "--print=yes"], r"--print: ignored explicit argument 'yes'",
     "--print given a value"),
    ("sw_table", "sweep", ["table", "--root", "{tmp}/none"], r"no sweep_runs.json",
     "a table of a root that holds no sweep"),
]


def fixtures(tmp: str) -> dict:
  """The files the cases name, made in `tmp` (a tiny corpus, tokenizers, a data dir, workdirs)."""
  import random

  from bertjax.core import checkpoint as checkpoint_lib
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset
  from bertjax.data.pretraining import examples as pretraining
  f = {"tmp": tmp, "root": ROOT}

  def write(name, text, mode="w"):
    path = os.path.join(tmp, name)
    with open(path, mode) as fh:
      fh.write(text)
    return path
  rng = random.Random(0)
  words = "the model reads text and predicts masked words from both sides of each sentence".split()
  docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + "." for _ in range(4))
          for _ in range(60)]
  f["corpus"] = write("corpus.txt", "\n\n".join(docs))
  f["binary"] = write("corpus.bin", bytes(range(256)) * 8, "wb")
  f["binary_model"] = write("garbage.model", bytes(range(256)) * 8, "wb")
  f["blank"] = write("blank.txt", "\n   \n\t\n\n")
  f["empty"] = write("empty.txt", "")
  f["tokdir"] = os.path.join(tmp, "tok")
  f["vocab"] = tokenizer.train([f["corpus"]], f["tokdir"], vocab_size=128)
  f["vocab_n"] = tokenizer.load(f["vocab"]).vocab_size
  with open(f["vocab"], encoding="utf-8") as fh:
    f["vocab_no_mask"] = write("no_mask.txt", fh.read().replace("[MASK]\n", ""))
  spm = tokenizer.train([f["corpus"]], os.path.join(tmp, "spm"), kind="unigram", vocab_size=60)
  with open(spm, "rb") as fh:
    raw = fh.read()
  f["spm_cut"] = write("cut.model", raw[:_record_boundary(raw)], "wb")
  f["data"] = os.path.join(tmp, "data")
  dataset.create([f["corpus"]], f["vocab"], f["data"],
                 pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1),
                 heldout_every=6)
  f["jsonl_body"] = write("body.jsonl", '{"body": "a b c"}\n')
  f["csv_ok"] = write("csv_ok.csv", "sentence,label\nthe model reads,pos\nthe text,neg\n")
  f["csv_empty"] = write("csv_empty.csv", "sentence,label\nthe model reads,pos\n  ,neg\n")
  f["csv_all_empty"] = write("csv_all_empty.csv", "sentence,label\n,pos\n,neg\n")
  f["csv_bad_label"] = write("csv_bad_label.csv", "sentence,label\nthe model,pos\nthe text,maybe\n")
  f["csv_utf8"] = write("csv_utf8.csv", b"sentence,label\nthe model reads,pos\ncaf\xe9 au lait,neg\n", "wb")
  f["jsonl_bad"] = write("jsonl_bad.jsonl", '{"sentence": "a", "label": "pos"}\n{not json\n')
  f["conll_no_tag"] = write("conll_no_tag.txt", "John B-PER\nSmith\n")
  f["pairs_ok"] = write("pairs_ok.csv", "anchor,positive\nthe model,reads text\nthe text,predicts words\n")
  f["scored_equal"] = write("scored_equal.csv", "a,b,score\nthe model,reads text,0.5\nthe text,predicts,0.5\n")
  f["scored_nan"] = write("scored_nan.csv", "a,b,score\nthe model,reads text,0.5\nthe text,predicts,nan\n")
  f["csv_one_label"] = write("csv_one_label.csv", "sentence,label\nthe model reads,pos\nthe text,pos\n")
  f["csv_inf"] = write("csv_inf.csv", "sentence,label\nthe model reads,1.5\nthe text,inf\n")
  f["conll_all_o"] = write("conll_all_o.txt", "the O\nmodel O\n\nreads O\n")
  f["pairs_same"] = write("pairs_same.csv", "anchor,positive\nthe model,reads text\nthe text,reads text\n")
  f["sts_no_score"] = write("sts_no_score.csv", "sentence1,sentence2\nthe model,reads text\n")
  f["corpus_dup"] = write("corpus_dup.jsonl", '{"_id": "a", "text": "one"}\n{"_id": "a", "text": "two"}\n')
  f["corpus_no_text"] = write("corpus_no_text.jsonl", '{"_id": "a", "body": "one"}\n')
  f["corpus_bad_json"] = write("corpus_bad_json.jsonl", '{"_id": "a", "text": "one"}\n{"_id": "b", "text"\n')
  f["corpus_utf8"] = write("corpus_utf8.txt", b"first document\ncaf\xe9 au lait\n", "wb")
  for name, corpus, qrels in (
      ("beir_dup", b'{"_id": "a", "text": "one"}\n{"_id": "a", "text": "two"}\n', b"1\ta\t1\n"),
      ("beir_utf8", b'{"_id": "a", "text": "one"}\n{"_id": "b", "text": "caf\xe9"}\n', b"1\ta\t1\n"),
      ("beir_unknown", b'{"_id": "a", "text": "one"}\n', b"query-id\tcorpus-id\tscore\n1\tz\t1\n")):
    f[name] = os.path.join(tmp, name)
    os.makedirs(os.path.join(f[name], "qrels"))
    write(f"{name}/corpus.jsonl", corpus, "wb")
    write(f"{name}/queries.jsonl", b'{"_id": "1", "text": "first"}\n', "wb")
    write(f"{name}/qrels/test.tsv", qrels, "wb")
  f["rerank_bad"] = write("rerank_bad.csv", "query,document,label\nfirst,one,1\nfirst,two,2\n")
  os.makedirs(os.path.join(tmp, "mve"))  # what marks a MultiVectorEncoder folder; the checks stop before weights
  f["mve"] = os.path.dirname(write("mve/config_sentence_transformers.json", '{"model_type": "MultiVectorEncoder"}'))
  f["run_ok"] = write("run_ok.trec", "1 Q0 a 1 2.5 bm25\n")
  f["run_unknown"] = write("run_unknown.trec", "1 Q0 a 1 2.5 bm25\n1 Q0 zz 2 1.5 bm25\n")
  f["run_twice"] = write("run_twice.trec", "1 Q0 a 1 2.5 bm25\n1 Q0 a 2 1.5 bm25\n")
  for name, corpus, queries in (
      ("beir_ok", b'{"_id": "a", "text": "one"}\n', b'{"_id": "1", "text": "first"}\n'),
      ("beir_qdup", b'{"_id": "a", "text": "one"}\n', b'{"_id": "1", "text": "first"}\n{"_id": "1", "text": "2"}\n'),
      ("beir_null", b'{"_id": null, "text": "one"}\n', b'{"_id": "1", "text": "first"}\n'),
      ("beir_number", b'{"_id": "a", "text": "one"}\n', b'{"_id": "1", "text": 5}\n')):
    f[name] = os.path.join(tmp, name)
    os.makedirs(os.path.join(f[name], "qrels"))
    write(f"{name}/corpus.jsonl", corpus, "wb")
    write(f"{name}/queries.jsonl", queries, "wb")
    write(f"{name}/qrels/test.tsv", b"1\ta\t1\n", "wb")
  f["corpus_ok"] = write("corpus_ok.jsonl", '{"_id": "a", "text": "one"}\n{"_id": "b", "text": "two"}\n')
  f["empty_jsonl"] = write("empty.jsonl", "")
  f["foreign_blocks"] = os.path.join(tmp, "foreign")
  os.makedirs(f["foreign_blocks"])
  write("foreign/ids.json", '["not", "ours"]')
  write("foreign/block-00000.npy", "not an array")
  f["int8_blocks"] = os.path.join(tmp, "int8_blocks")  # a quantized --out an earlier run left
  os.makedirs(f["int8_blocks"])
  write("int8_blocks/manifest.json", '{"fingerprint": "0", "documents": 2, "block": 65536, "precision": "int8"}')
  f["user_folder"] = os.path.join(tmp, "user_folder")  # a folder of the user's own
  os.makedirs(f["user_folder"])
  write("user_folder/notes.txt", "keep me")
  f["user_manifest"] = os.path.join(tmp, "user_manifest")
  os.makedirs(f["user_manifest"])
  write("user_manifest/manifest.json", '{"title": "my notes"}')
  f["calib_narrow"] = os.path.join(tmp, "calib_narrow.npy")  # calibration embeddings 10 wide
  import numpy as np
  np.save(f["calib_narrow"], np.zeros((3, 10), np.float32))
  f["hf"] = _tiny_hf_folder(os.path.join(tmp, "hf"), f["vocab"])
  f["hf_encoder"] = _tiny_hf_folder(os.path.join(tmp, "hf_encoder"), f["vocab"], head="encoder")
  f["sparse"] = _tiny_hf_folder(os.path.join(tmp, "sparse"), f["vocab"], head="sparse")
  f["hf_wide"] = _tiny_hf_folder(os.path.join(tmp, "hf_wide"), f["vocab"], hidden=32)
  f["hf_rotary"] = _tiny_hf_folder(os.path.join(tmp, "hf_rotary"), f["vocab"], position_embedding="rotary",
                                   layer_norm="pre", type_vocab_size=0, ffn="glu", use_bias=False, norm_bias=False,
                                   first_attention_norm=False, nsp_head=False)
  f["full"] = os.path.join(tmp, "full")
  os.makedirs(f["full"])
  write("full/notes.txt", "keep me")
  # A pre-training workdir (its config, no checkpoint yet), one with a checkpoint-less config, a fine-tuning one.
  f["pre"] = os.path.join(tmp, "w_pre_done")
  f["pre_empty"] = os.path.join(tmp, "w_pre_empty")
  f["fine"] = os.path.join(tmp, "w_fine_done")
  for name, mode in (("pre", "pretrain"), ("pre_empty", "pretrain"), ("fine", "finetune")):
    os.makedirs(f[name])
    with open(os.path.join(f[name], "config.json"), "w") as fh:
      json.dump({"mode": mode, "model": {}, "data": {"data_dir": f["data"]}, "train": {}}, fh)
  os.makedirs(os.path.join(f["pre"], "checkpoints"))
  with open(os.path.join(f["fine"], "finetune.json"), "w") as fh:
    json.dump({"task": "local"}, fh)
  f["locked"] = os.path.join(tmp, "locked")
  f["_lock"] = checkpoint_lib.WorkdirLock(f["locked"]).__enter__()  # held by this process for every case
  return f


def _tiny_hf_folder(out: str, vocab: str, hidden: int = 16, head: str | None = None, **switches) -> str:
  """A 1-layer BERT (or, with `switches`, another family's layout) with random weights as an HF folder with the
  vocabulary (MLM model, or the encoder alone with head="encoder", or a SparseEncoder folder with head="sparse",
  and tokenizer files)."""
  import jax

  from bertjax import convert, model
  from bertjax.convert import export
  from bertjax.data import tokenizer
  cfg = model.BertConfig(vocab_size=tokenizer.load(vocab).vocab_size, hidden_size=hidden, num_layers=1, num_heads=2,
                         intermediate_size=32, max_position_embeddings=32, **switches)
  ids = jax.numpy.zeros((1, 8), jax.numpy.int32)
  batch = {"input_ids": ids, "input_mask": ids + 1, "segment_ids": ids, "masked_lm_positions": ids[:, :2]}
  params = model.BertForPreTraining(cfg).init(jax.random.key(0), batch)["params"]
  params = jax.device_get(model_unbox(params))
  if head == "sparse":
    from bertjax.embeddings.sparse import encoder as sparse
    sparse.write_folder(cfg, params, out, 32)
  else:
    convert.to_hf(cfg, params["bert"] if head == "encoder" else params, out, head=head)
  export.copy_tokenizer(vocab, True, out)
  return out


def model_unbox(params):
  import flax.linen as nn
  return nn.meta.unbox(params)


def _record_boundary(raw: bytes) -> int:
  """The offset of the top-level protobuf record nearest the middle of `raw`."""
  def varint(i):
    shift = value = 0
    while True:
      b = raw[i]
      value |= (b & 0x7F) << shift
      i, shift = i + 1, shift + 7
      if not b & 0x80:
        return value, i
  i, cuts = 0, []
  while i < len(raw):
    cuts.append(i)
    _, j = varint(i)
    n, j = varint(j)
    i = j + n
  return cuts[len(cuts) // 2]


def _reset_flags(values) -> None:
  """Flags as before any parse: ml_collections defines a `config.x` flag per override it parses."""
  for name in list(values):
    if name.startswith("config."):
      delattr(values, name)
  values.unparse_flags()


LAUNCH = ("suite", "sweep")  # launch/*.py, beside the package's own commands
GROUPS = ("train", "aot", "parity")  # one process each: aot and parity define absl flags of train's names


def group_of(tool: str) -> str:
  return tool if tool in ("aot", "parity") else "train"


def _tool(name: str):
  """The tool as `python -m bertjax NAME` (or launch/NAME.py) runs it, in this process."""
  from absl import flags

  from bertjax import __main__ as dispatcher
  if name in LAUNCH:
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"launch_{name}", os.path.join(ROOT, "launch", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main

  def run(argv):
    if name in ("train", "aot", "parity"):  # absl tools: flags as before any parse
      _reset_flags(flags.FLAGS)
    return dispatcher.main([name, *argv])
  return run


def run_case(tool, argv) -> dict:
  out, err = io.StringIO(), io.StringIO()
  code = 0
  start = time.time()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      r = tool(argv)
      code = r if isinstance(r, int) else 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
      traceback.print_exc()
      code = 1
  return {"code": code, "stderr": err.getvalue(), "stdout": out.getvalue(), "seconds": time.time() - start}


def check(result: dict, pattern: str) -> str | None:
  """None when the result is one matching `error:` line with exit code 2 and no traceback, else what is wrong."""
  lines = [line for line in result["stderr"].splitlines() if line.startswith("error: ")]
  if result["code"] != 2:
    return f"exit code {result['code']}: {result['stderr'][-800:]}"
  if "Traceback" in result["stderr"]:
    return f"a traceback: {result['stderr'][-800:]}"
  if len(lines) != 1:
    return f"{len(lines)} error lines: {result['stderr'][-800:]}"
  if not re.search(pattern, lines[0]):
    return f"{lines[0]!r} does not match {pattern!r}"
  return None


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--group", choices=GROUPS)
  p.add_argument("--json")
  p.add_argument("--markdown", action="store_true")
  p.add_argument("--only", default="", help="comma-separated case ids (default: every case of the group)")
  args = p.parse_args()
  if args.markdown:
    print(markdown())
    return
  group = [c for c in CASES if group_of(c[1]) == args.group and (not args.only or c[0] in args.only.split(","))]
  results = {}
  with tempfile.TemporaryDirectory(prefix="bertjax-hostile-") as tmp:
    f = fixtures(tmp) if args.group == "train" else {"tmp": tmp, "root": ROOT}
    tools = {}
    for case_id, tool, argv, pattern, _ in group:
      if tool not in tools:
        tools[tool] = _tool(tool)
      filled = [a.format(**f) for a in argv]
      r = run_case(tools[tool], filled)
      r["problem"] = check(r, pattern)
      results[case_id] = r
  with open(args.json, "w", encoding="utf-8") as fh:
    json.dump(results, fh, indent=1)


def markdown() -> str:
  rows = ["| command | bad input | the one line matches |", "|---|---|---|"]
  for _, tool, _, pattern, what in CASES:
    rows.append(f"| `{tool}` | {what} | `{pattern.replace('|', chr(92) + '|')}` |")
  return "\n".join(rows)


if __name__ == "__main__":
  main()
