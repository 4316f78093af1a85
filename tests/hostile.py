"""The hostile-input table: every command-line tool on bad input, each case expecting exit code 2, exactly one
`error:` line matching a pattern, and no traceback.

    python tests/hostile.py --group main|aot --json OUT     # runs a group's cases in this process (tests use it)
    python tests/hostile.py --markdown                      # the table as docs/robustness.md shows it

Cases run in-process, one process per group (each tool's `main` is called with its argv; a tool that ends the
process raises SystemExit, caught here), so the whole table takes seconds rather than a process start per case.
`aot` has a group of its own: it defines absl flags of the same names as `bertjax.main`.

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
import sys
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

CASES = [
    # ---------------------------------------------------------------- pre-training (python -m bertjax.main)
    ("pre_keep0", "main", PRE + ["--config.keep_checkpoints=0"], r"keep_checkpoints must be an integer >= 1",
     "keep_checkpoints=0 (would delete every checkpoint)"),
    ("pre_keep_neg", "main", PRE + ["--config.keep_checkpoints=-1"], r"keep_checkpoints must be an integer >= 1",
     "keep_checkpoints=-1"),
    ("pre_lr_nan", "main", PRE + ["--config.train.learning_rate=nan"], r"learning_rate must be a finite number >= 0",
     "learning rate nan"),
    ("pre_lr_inf", "main", PRE + ["--config.train.learning_rate=inf"], r"learning_rate must be a finite number >= 0",
     "learning rate inf"),
    ("pre_lr_neg", "main", PRE + ["--config.train.learning_rate=-0.001"], r"learning_rate must be a finite number",
     "negative learning rate"),
    ("pre_warmup_neg", "main", PRE + ["--config.train.warmup_steps=-5"], r"warmup_steps must be an integer >= 0",
     "negative warmup"),
    ("pre_steps0", "main", PRE + ["--config.train.num_steps=0"], r"train.num_steps must be positive", "zero steps"),
    ("pre_arg_type", "main", [PRE[0].replace("batch=16", "batch=abc")] + PRE[1:],
     r"config argument batch='abc' is not of type int", "a config argument of the wrong type"),
    ("pre_arg_unknown", "main", [PRE[0] + ",varient=base"] + PRE[1:], r"unknown config argument 'varient'",
     "a misspelt config argument"),
    ("pre_shard_unknown", "main", [PRE[0].replace("shard=dp", "shard=zero3")] + PRE[1:],
     r"unknown sharding preset 'zero3'", "an unknown sharding preset"),
    ("pre_field_unknown", "main", PRE + ["--config.train.batch_size=abc"],
     r"no such config field 'batch_size' in train; did you mean 'train.global_batch_size'",
     "a field that does not exist"),
    ("pre_section_unknown", "main", PRE + ["--config.trian.num_steps=3"], r"no such config field 'trian'.*'train'",
     "a section that does not exist"),
    ("pre_field_type", "main", PRE + ["--config.train.global_batch_size=abc"], r"global_batch_size=abc",
     "a field value of the wrong type"),
    ("pre_flag_unknown", "main", PRE + ["--bogus=1"], r"Unknown command line flag 'bogus'", "an unknown flag"),
    ("pre_config_missing", "main", ["--config=configs/no_such_config.py", "--workdir={tmp}/w"], r"no_such_config.py",
     "a config file that does not exist"),
    ("pre_no_data_dir", "main", PRE[:2], r"data.data_dir is empty", "no data_dir"),
    ("pre_data_missing", "main", PRE[:2] + ["--config.data.data_dir={tmp}/nowhere"], r"no creation.json",
     "a data_dir that does not exist"),
    ("pre_vocab_mismatch", "main", [PRE[0].replace("vocab={vocab_n}", "vocab=30522")] + PRE[1:],
     r"does not match the data's tokenizer vocabulary \d+ .*: pass vocab=\d+", "model vocabulary not the tokenizer's"),
    ("pre_seq_mismatch", "main", [PRE[0].replace("seq=32", "seq=64")] + PRE[1:],
     r"data.max_seq_length is 64 but the data .* was made with 32", "sequence length not the data's"),
    ("pre_batch_indivisible", "main", [PRE[0].replace("batch=16", "batch=12")] + PRE[1:],
     r"micro-batch 12 .* not divisible by the data-parallel size 8", "batch not divisible by the devices"),
    ("pre_schedule", "main", PRE + ["--config.train.schedule=cosine_typo"], r"train.schedule 'cosine_typo'",
     "an unknown schedule"),
    ("pre_optimizer", "main", PRE + ["--config.train.optimizer=sgd"], r"train.optimizer 'sgd'", "an unknown optimizer"),
    ("pre_prng", "main", PRE + ["--config.train.prng_impl=mt"], r"train.prng_impl 'mt'", "an unknown PRNG"),
    ("pre_into_finetune_workdir", "main", PRE[:1] + ["--workdir={fine}"] + PRE[2:],
     r"holds a fine-tuning run, not a pre-training one", "pre-training into a fine-tuning workdir"),
    ("pre_locked", "main", PRE[:1] + ["--workdir={locked}"] + PRE[2:], r"is in use by another run",
     "a workdir another run holds"),
    # ---------------------------------------------------------------- fine-tuning (python -m bertjax.main)
    ("ft_into_pretrain_workdir", "main", FINE[:1] + ["--workdir={pre}"] + FINE[2:],
     r"holds a pre-training run, not a fine-tuning one; to fine-tune from it pass init=", "fine-tuning into a "
     "pre-training workdir"),
    ("ft_pairs_same_positive", "main",
     [FINE[0].replace("task=local", "task=pairs"), "--workdir={tmp}/w_pairs", "--config.data.train_file={pairs_same}",
      "--config.data.text_a_column=anchor", "--config.data.text_b_column=positive", "--config.data.tokenizer={vocab}"],
     r"pairs_same.csv: every row has the same positive", "embedding pairs whose positives are all one text"),
    ("ft_matryoshka_bad", "main",
     [FINE[0].replace("task=local", "task=pairs"), "--workdir={tmp}/w_pairs2", "--config.data.train_file={pairs_same}",
      "--config.data.tokenizer={vocab}", "--config.embedding.matryoshka_dims=256,half"],
     r"embedding.matryoshka_dims '256,half'", "Matryoshka widths that are not numbers"),
    ("ft_lr_neg", "main", FINE + ["--config.train.learning_rate=-1e-5"], r"learning_rate must be a finite number",
     "negative learning rate"),
    ("ft_lr_nan", "main", FINE + ["--config.train.learning_rate=nan"], r"learning_rate must be a finite number",
     "learning rate nan"),
    ("ft_keep0", "main", FINE + ["--config.keep_checkpoints=0"], r"keep_checkpoints must be an integer >= 1",
     "keep_checkpoints=0"),
    ("ft_no_labels", "main", [a for a in FINE if "labels" not in a], r"task local needs its label set declared",
     "no labels declared"),
    ("ft_dup_labels", "main", FINE + ["--config.data.labels=('neg','neg')"], r"names a label twice",
     "a label declared twice"),
    ("ft_unknown_task", "main", [FINE[0].replace("task=local", "task=glue/nope")] + FINE[1:], r"unknown task",
     "an unknown task"),
    ("ft_missing_column", "main", FINE + ["--config.data.text_a_column=text"], r"missing column\(s\) \['text'\]",
     "a column the file does not have"),
    ("ft_empty_text", "main", FINE + ["--config.data.train_file={csv_empty}"], r"csv_empty.csv:3: empty text",
     "an empty text field"),
    ("ft_all_empty", "main", FINE + ["--config.data.train_file={csv_all_empty}"], r"csv_all_empty.csv:2: empty text",
     "every text field empty"),
    ("ft_unknown_label", "main", FINE + ["--config.data.train_file={csv_bad_label}"],
     r"csv_bad_label.csv:3: label 'maybe' is not in the declared set", "a label outside the declared set"),
    ("ft_label_not_number", "main", FINE + ["--config.data.regression=True"], r"csv_ok.csv:2: label 'pos' is not a "
     "number", "a regression label that is not a number"),
    ("ft_train_missing", "main", FINE + ["--config.data.train_file={tmp}/none.csv"], r"none.csv: file not found",
     "a training file that does not exist"),
    ("ft_init_missing", "main", FINE + ["--config.init={tmp}/no_such_model"], r"no_such_model",
     "an init path that does not exist"),
    ("ft_jsonl_bad", "main", FINE + ["--config.data.train_file={jsonl_bad}"], r"jsonl_bad.jsonl:2: not a JSON object",
     "a JSONL line that is not JSON"),
    ("ft_csv_utf8", "main", FINE + ["--config.data.train_file={csv_utf8}"], r"csv_utf8.csv:3: not UTF-8",
     "a training file with bytes that are not UTF-8"),
    ("ft_ner_no_tag", "main", [FINE[0].replace("task=local", "task=ner"), FINE[1],
                               "--config.data.train_file={conll_no_tag}", "--config.data.eval_file={conll_no_tag}",
                               "--config.data.labels=('O','B-PER','I-PER')", "--config.data.tokenizer={vocab}"],
     r"conll_no_tag.txt:2: 'Smith' has no tag", "a CoNLL line without a tag"),
    ("ft_ner_bad_scheme", "main", [FINE[0].replace("task=local", "task=ner"), FINE[1],
                                   "--config.data.train_file={conll_no_tag}", "--config.data.labels=('O','U-PER')",
                                   "--config.data.tokenizer={vocab}"], r"config.data.labels: tag 'U-PER'",
     "a tag scheme the scorer does not read"),
    # ---------------------------------------------------------------- python -m bertjax.data.dataset
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
    # ---------------------------------------------------------------- python -m bertjax.data.tokenizer
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
    # ---------------------------------------------------------------- python -m bertjax.predict
    # ---------------------------------------------------------------- embeddings (python -m bertjax.embeddings)
    ("emb_beir_dup", "embeddings", ["--model", "{pre}", "--beir", "{beir_dup}"],
     r"corpus.jsonl:2: document id 'a' repeats line 1", "a BEIR corpus with a repeated document id"),
    ("emb_beir_utf8", "embeddings", ["--model", "{pre}", "--beir", "{beir_utf8}"], r"corpus.jsonl:2: not UTF-8",
     "a BEIR corpus record that is not UTF-8"),
    ("emb_beir_unknown", "embeddings", ["--model", "{pre}", "--beir", "{beir_unknown}"],
     r"test.tsv: query '1' judges document id 'z', which is not in", "qrels naming a document the corpus lacks"),
    ("emb_beir_missing", "embeddings", ["--model", "{pre}", "--beir", "{tmp}/none"], r"corpus.jsonl: no such file",
     "a BEIR folder that does not exist"),
    ("emb_corpus_no_out", "embeddings", ["--model", "{pre}", "--corpus", "{corpus_dup}"],
     r"--corpus needs --out", "a corpus to embed without an output folder"),
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
     r"not allowed with argument", "both --sts and --beir"),
    ("pr_missing", "predict", ["--workdir", "{tmp}/none", "a [MASK] b"], r"no config.json|none",
     "a workdir that does not exist"),
    ("pr_no_text", "predict", ["--workdir", "{pre}"], r"the following arguments are required: text", "no text"),
    ("pr_no_checkpoint", "predict", ["--workdir", "{pre_empty}", "a [MASK] b"], r"no checkpoint",
     "a workdir without a checkpoint"),
    ("pr_top_k", "predict", ["--workdir", "{pre}", "--top_k", "x", "a [MASK] b"], r"argument --top_k: invalid int",
     "a non-integer --top_k"),
    # ---------------------------------------------------------------- python -m bertjax.convert
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
    # ---------------------------------------------------------------- python -m bertjax.aot
    ("aot_topology", "aot", ["--config=configs/pretrain.py:variant=tiny", "--topology=v9z:9x9"], r"v9z",
     "an unknown TPU topology"),
    ("aot_config_arg", "aot", ["--config=configs/pretrain.py:varient=tiny"], r"unknown config argument 'varient'",
     "a misspelt config argument"),
    ("aot_field", "aot", ["--config=configs/pretrain.py:variant=tiny", "--config.train.batch_size=8"],
     r"no such config field 'batch_size'", "a field that does not exist"),
]


def fixtures(tmp: str) -> dict:
  """The files the cases name, made in `tmp` (a tiny corpus, tokenizers, a data dir, workdirs)."""
  import random
  from bertjax import checkpoint as checkpoint_lib
  from bertjax.data import dataset, pretraining, tokenizer
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


def _tool(name: str):
  if name == "main":
    from absl import flags
    from bertjax import errors, main

    def run(argv):
      _reset_flags(flags.FLAGS)
      sys.argv = ["bertjax.main"] + argv  # ml_collections finds --config.x overrides in sys.argv
      errors.run_absl(main.main, argv=sys.argv)
    return run
  if name == "aot":
    from absl import flags
    from bertjax import aot

    def run(argv):
      if "topology" in flags.FLAGS:
        _reset_flags(flags.FLAGS)
      sys.argv = ["bertjax.aot"] + argv
      return aot.main(sys.argv)
    return run
  module = {"dataset": "bertjax.data.dataset", "tokenizer": "bertjax.data.tokenizer", "predict": "bertjax.predict",
            "convert": "bertjax.convert.__main__", "embeddings": "bertjax.embeddings"}[name]
  import importlib
  return importlib.import_module(module).main


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
  p.add_argument("--group", choices=["main", "aot"])
  p.add_argument("--json")
  p.add_argument("--markdown", action="store_true")
  args = p.parse_args()
  if args.markdown:
    print(markdown())
    return
  group = [c for c in CASES if (c[1] == "aot") == (args.group == "aot")]
  results = {}
  with tempfile.TemporaryDirectory(prefix="bertjax-hostile-") as tmp:
    f = fixtures(tmp) if args.group == "main" else {"tmp": tmp, "root": ROOT}
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
  tools = {"main": "bertjax.main", "dataset": "bertjax.data.dataset", "tokenizer": "bertjax.data.tokenizer",
           "predict": "bertjax.predict", "convert": "bertjax.convert", "aot": "bertjax.aot",
           "embeddings": "bertjax.embeddings"}
  rows = ["| tool | bad input | the one line matches |", "|---|---|---|"]
  for _, tool, _, pattern, what in CASES:
    rows.append(f"| `{tools[tool]}` | {what} | `{pattern.replace('|', chr(92) + '|')}` |")
  return "\n".join(rows)


if __name__ == "__main__":
  main()
