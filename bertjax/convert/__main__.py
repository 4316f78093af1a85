"""python -m bertjax.convert --workdir W --out DIR: a bertjax workdir as an HF transformers folder.

A pre-training workdir becomes its family's MLM model (its latest checkpoint): `BertForPreTraining`,
`RobertaForMaskedLM` or `ModernBertForMaskedLM`; a fine-tuning workdir of a BERT its best parameters as
`BertForSequenceClassification`, `BertForTokenClassification` or `BertForQuestionAnswering`, with the labels in
config.json. The tokenizer is copied beside it (a WordPiece vocabulary with its casing; a byte-level BPE's
vocab.json + merges.txt or tokenizer.json), so that `AutoTokenizer.from_pretrained(DIR)` reads the same ids.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

from bertjax import errors


def export(workdir: str, out: str) -> str:
  """Writes the HF folder; returns the architecture written."""
  from bertjax import convert, finetune, predict  # pylint: disable=import-outside-toplevel
  if os.path.exists(os.path.join(workdir, "finetune.json")):
    meta, task, module, params, _ = finetune.load_finetuned(workdir)
    head = finetune.HF_HEADS[task.kind]
    convert.to_hf(module.cfg, params, out, head=head, labels=task.labels)
    tok_path, lower = meta["tokenizer"], meta["do_lower_case"]
    arch = convert.TASK_HEADS[head][0]
  else:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      run = json.load(f)
    from bertjax.data import dataset  # pylint: disable=import-outside-toplevel
    creation = dataset.read_creation(run["data"]["data_dir"])
    tok_path, lower = creation["tokenizer"], creation.get("do_lower_case", True)
    if run.get("objective", "mlm") == "electra":  # OUT/discriminator and OUT/generator, as HF publishes ELECTRA
      from bertjax import checkpoint as checkpoint_lib, model as model_lib  # pylint: disable=import-outside-toplevel
      from bertjax.model import electra  # pylint: disable=import-outside-toplevel
      disc_cfg = model_lib.BertConfig.from_dict(run["model"])
      gen_cfg = electra.generator_config(disc_cfg, run["electra"]["generator_hidden"],
                                         run["electra"]["generator_layers"])
      convert.electra_to_hf(disc_cfg, gen_cfg, checkpoint_lib.Checkpointer(workdir).restore_params(), out)
      for sub in ("discriminator", "generator"):
        _copy_tokenizer(tok_path, lower, os.path.join(out, sub))
      return "ElectraForPreTraining + ElectraForMaskedLM"
    module, params, _ = predict.load(workdir)
    convert.to_hf(module.cfg, params, out)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
      arch = json.load(f)["architectures"][0]
  _copy_tokenizer(tok_path, lower, out)
  return arch


def _copy_tokenizer(tok_path: str, lower: bool, out: str) -> None:
  if os.path.basename(tok_path) == "vocab.txt":
    shutil.copyfile(tok_path, os.path.join(out, "vocab.txt"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": bool(lower)}, f, indent=2)
  elif tok_path.endswith(".json"):  # byte-level BPE: the files HF's tokenizers read
    folder = os.path.dirname(tok_path)
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
      if os.path.isfile(os.path.join(folder, name)):
        shutil.copyfile(os.path.join(folder, name), os.path.join(out, name))


@errors.guard
def main(argv=None) -> int:
  p = argparse.ArgumentParser(description="Write a bertjax workdir (pre-trained or fine-tuned) as an HF folder.")
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  arch = export(args.workdir, args.out)
  print(f"wrote {args.out} ({arch})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
