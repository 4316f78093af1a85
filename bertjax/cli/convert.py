"""python -m bertjax convert --workdir W --out DIR: a bertjax workdir as an HF transformers folder.

A pre-training workdir becomes its family's MLM model (its latest checkpoint): `BertForPreTraining`,
`RobertaForMaskedLM`, `ModernBertForMaskedLM`, or ELECTRA's discriminator and generator; a fine-tuning workdir its
best parameters as its family's task model (`...ForSequenceClassification`, `...ForTokenClassification`,
`...ForQuestionAnswering`) with the labels in config.json, or, for an embedding model, a sentence-transformers
folder. The tokenizer is copied beside it (a WordPiece vocabulary with its casing; a byte-level BPE's vocab.json +
merges.txt or tokenizer.json; a sentencepiece model with a tokenizer.json made from it), so that
`AutoTokenizer.from_pretrained(DIR)` reads the same ids. W and DIR may be local or in an object store (gs://,
s3://): a remote DIR is written in a local staging folder, then uploaded.
"""
from __future__ import annotations

from bertjax import errors, predict, tasks
from bertjax.cli import common
from bertjax.convert import export as export_lib
from bertjax.convert import weights
from bertjax.core import files


def export(workdir: str, out: str) -> str:
  """Writes the HF folder; returns the architecture written."""
  if not files.exists(files.join(workdir, "finetune.json")):
    return export_lib.pretraining(workdir, out)
  meta, task, module, params, _ = predict.load_finetuned(workdir)
  kind = tasks.kind(task)
  arch = kind.export(task, module, params, out, meta)
  for sub in kind.tokenizer_folders(task):  # where the written folder's loaders look for it
    export_lib.copy_tokenizer(weights.finetuned_tokenizer(workdir, meta), meta["do_lower_case"],
                              files.join(out, sub) if sub else out)
  return arch


def write(workdir: str, out: str, overwrite: bool = False) -> str:
  """`export` written whole (`convert.export.into_place`): a failed or killed conversion leaves `out` as it was."""
  files.reach(workdir)
  files.reach(out)
  if not files.isdir(workdir):
    raise FileNotFoundError(f"{workdir}: no such workdir")
  if weights.source_of(workdir) == "hf":
    raise errors.ConfigError(f"{workdir} is an HF or sentence-transformers folder, not a bertjax workdir: it needs no "
                             "conversion (init= and every bertjax tool read it as it is)")
  export_lib.check_out(workdir, out, overwrite)
  return export_lib.into_place(out, lambda tmp: export(workdir, tmp))


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Write a bertjax workdir (pre-trained or fine-tuned) as an HF folder.")
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True, help="a new or empty folder (or any HF folder, with --overwrite)")
  p.add_argument("--overwrite", action="store_true", help="replace what --out holds")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  arch = write(args.workdir, args.out, args.overwrite)
  print(f"wrote {args.out} ({arch})")
  return 0

