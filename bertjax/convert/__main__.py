"""python -m bertjax.convert --workdir W --out DIR: a bertjax workdir as an HF transformers folder.

A pre-training workdir becomes its family's MLM model (its latest checkpoint): `BertForPreTraining`,
`RobertaForMaskedLM` or `ModernBertForMaskedLM`; a fine-tuning workdir of a BERT its best parameters as
`BertForSequenceClassification`, `BertForTokenClassification` or `BertForQuestionAnswering`, with the labels in
config.json. The tokenizer is copied beside it (a WordPiece vocabulary with its casing; a byte-level BPE's
vocab.json + merges.txt or tokenizer.json; a sentencepiece model with a tokenizer.json made from it), so that
`AutoTokenizer.from_pretrained(DIR)` reads the same ids.
"""
from __future__ import annotations

import json
import os
import shutil

import ml_collections
from safetensors import SafetensorError

from bertjax import checkpoint as checkpoint_lib
from bertjax import convert, errors, finetune, objectives, predict, weights
from bertjax.convert import sentence_transformers as st_lib
from bertjax.data import tokenizer as tokenizer_lib


def export(workdir: str, out: str) -> str:
  """Writes the HF folder; returns the architecture written."""
  if os.path.exists(os.path.join(workdir, "finetune.json")):
    meta, task, module, params, _ = predict.load_finetuned(workdir)
    tok_path, lower = os.path.join(workdir, meta["tokenizer"]), meta["do_lower_case"]
    if task.kind == "contrastive":  # an embedding model: a sentence-transformers folder
      st_lib.write(module.cfg, params, module.pooling, out, max_seq_length=meta["max_seq_length"])
      copy_tokenizer(tok_path, lower, out)
      return "SentenceTransformer"
    convert.to_hf(module.cfg, params, out, head=finetune.HF_HEADS[task.kind], labels=task.labels)
  else:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      run = json.load(f)
    tok_path, lower = weights.run_tokenizer(workdir, ml_collections.ConfigDict(run))
    if not tok_path:
      raise errors.TokenizerError(f"{workdir}: no tokenizer (neither WORKDIR/tokenizer/ nor its data dir "
                                  f"{run['data']['data_dir']} can be read)")
    objective = objectives.get(run)
    if objective.export is not None:  # an objective whose checkpoints export as their own models (ELECTRA)
      arch, folders = objective.export(run, checkpoint_lib.Checkpointer(workdir).restore_params(), out)
      for sub in folders:
        copy_tokenizer(tok_path, lower, os.path.join(out, sub))
      return arch
    module, params, _ = predict.load(workdir)
    convert.to_hf(module.cfg, params, out)
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    arch = json.load(f)["architectures"][0]
  copy_tokenizer(tok_path, lower, out)
  return arch


def copy_tokenizer(tok_path: str, lower: bool, out: str) -> None:
  """The run's tokenizer as files HF's AutoTokenizer reads, in the HF folder `out`, and its special ids in
  config.json (HF's embeddings keep the pad id's row out of training: it must be the tokenizer's)."""
  _write_special_ids(tokenizer_lib.load(tok_path, do_lower_case=lower), out)
  if os.path.basename(tok_path) == "vocab.txt":
    shutil.copyfile(tok_path, os.path.join(out, "vocab.txt"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": bool(lower)}, f, indent=2)
  elif tok_path.endswith(".json"):  # byte-level BPE: the files HF's tokenizers read
    folder = os.path.dirname(tok_path)
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
      if os.path.isfile(os.path.join(folder, name)):
        shutil.copyfile(os.path.join(folder, name), os.path.join(out, name))
    try:  # an optional dependency: with it, tokenizer.json, which AutoTokenizer reads for every family
      import transformers
    except ImportError:
      transformers = None
    if transformers is not None and not os.path.isfile(os.path.join(folder, "tokenizer.json")):
      # RoBERTa's byte-level BPE over these files, special tokens and all, whatever the model's family (without
      # tokenizer.json, ModernBERT's AutoTokenizer has no reader for vocab.json + merges.txt).
      transformers.RobertaTokenizer.from_pretrained(out).save_pretrained(out)
    elif not os.path.isfile(os.path.join(out, "tokenizer_config.json")):
      with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "RobertaTokenizer"}, f, indent=2)
  else:  # a sentencepiece model: the model file, and tokenizer.json with bertjax's ids for AutoTokenizer
    shutil.copyfile(tok_path, os.path.join(out, "spiece.model"))
    tokenizer_lib.sentencepiece_as_hf(tok_path).save(os.path.join(out, "tokenizer.json"))
    names = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), tokenizer_lib.SPECIAL_TOKENS))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **names,
                 "model_input_names": _input_names(out)}, f, indent=2)


def _input_names(out: str) -> list[str]:
  """What the tokenizer hands the model: segment ids only to a model with more than one segment type (a
  ModernBERT takes none; RoBERTa's single type would make a pair's second segment out of range)."""
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    types = json.load(f).get("type_vocab_size", 0)
  return ["input_ids", *(["token_type_ids"] if types > 1 else []), "attention_mask"]


def _write_special_ids(tok, out: str) -> None:
  path = os.path.join(out, "config.json")
  with open(path, encoding="utf-8") as f:
    cfg = json.load(f)
  if cfg.get("model_type") != "roberta":  # RoBERTa's positions count from its pad id: the config already has it
    cfg["pad_token_id"] = tok.pad_id
  for key, value in (("bos_token_id", tok.cls_id), ("cls_token_id", tok.cls_id), ("eos_token_id", tok.sep_id),
                     ("sep_token_id", tok.sep_id)):
    if key in cfg:
      cfg[key] = value
  with open(path, "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=2)


def check_out(workdir: str, out: str, overwrite: bool) -> None:
  """Refuses an output folder that holds anything unless --overwrite, and a bertjax workdir or data dir always
  (an HF folder written there would replace the run's config.json)."""
  if not os.path.lexists(out):
    return
  if not os.path.isdir(out):
    raise FileExistsError(f"{out}: exists and is not a folder")
  if os.path.realpath(out) == os.path.realpath(workdir):
    raise errors.ConfigError(f"--out {out} is the workdir being converted; choose a new folder")
  if any(os.path.exists(os.path.join(out, m)) for m in ("checkpoints", "finetune.json", "creation.json", ".lock")):
    raise errors.ConfigError(f"--out {out} holds a bertjax workdir or data dir; an HF folder written there would "
                             "replace its files. Choose a new folder")
  if os.listdir(out) and not overwrite:
    raise FileExistsError(f"{out}: exists and is not empty; pass --overwrite to replace it")


def write(workdir: str, out: str, overwrite: bool = False) -> str:
  """`export` into a temporary sibling folder renamed into place at the end: a failed or killed conversion (a
  full disk, a read-only folder) leaves `out` as it was."""
  check_out(workdir, out, overwrite)
  out = os.path.abspath(out)
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{os.path.basename(out)}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    os.makedirs(tmp)
    arch = export(workdir, tmp)
  except (OSError, SafetensorError) as e:
    shutil.rmtree(tmp, ignore_errors=True)
    raise OSError(f"writing {out} failed: {errors.one_line(e)}; {out} is untouched") from None
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if os.path.lexists(out):
    old = os.path.join(parent, f".{os.path.basename(out)}.old-{os.getpid()}")
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.rename(tmp, out)
  return arch


@errors.guard
def main(argv=None) -> int:
  p = errors.ArgumentParser(description="Write a bertjax workdir (pre-trained or fine-tuned) as an HF folder.")
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True, help="a new or empty folder (or any HF folder, with --overwrite)")
  p.add_argument("--overwrite", action="store_true", help="replace what --out holds")
  args = p.parse_args(argv)
  if not os.path.isdir(args.workdir):
    raise FileNotFoundError(f"{args.workdir}: no such workdir")
  arch = write(args.workdir, args.out, args.overwrite)
  print(f"wrote {args.out} ({arch})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
