"""python -m bertjax predict --workdir DIR "the capital of france is [MASK] ." [--top_k 5]
python -m bertjax predict --workdir FINETUNED "a sentence" [--pair "another"] [--question "..."]

Fill in the blank with a pre-training workdir, or a fine-tuned workdir's prediction by its task's kind (a label
with probabilities, a value, per-word tags, an answer span); see `bertjax.predict`.
"""
from __future__ import annotations

import json

from bertjax import errors, predict
from bertjax.cli import common
from bertjax.core import files


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description="Predict with a bertjax workdir: fill in [MASK] (pre-training), or a "
                              "label / tags / answer span (fine-tuning).")
  p.add_argument("--workdir", required=True)
  p.add_argument("--top_k", type=int, default=5)
  p.add_argument("--pair", default="", help="fine-tuned sentence-pair tasks: the second sentence")
  p.add_argument("--question", default="", help="fine-tuned QA: the question (the context is the text)")
  p.add_argument("text", nargs="+", help="text; for pre-training, sentences containing [MASK] "
                 "(or the model's own mask token, e.g. <mask>)")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  if args.top_k < 1:
    raise errors.ConfigError(f"--top_k must be >= 1, got {args.top_k}")
  files.reach(args.workdir)
  if files.exists(files.join(args.workdir, "finetune.json")):
    for text in args.text:
      if args.question:
        print(json.dumps(predict.predict_text(args.workdir, question=args.question, context=text)))
      else:
        print(json.dumps(predict.predict_text(args.workdir, text=text, pair=args.pair)))
    return 0
  module, params, tok = predict.load(args.workdir)
  for text in args.text:
    print(text)
    for _, cands in predict.fill_mask(module, params, tok, text, args.top_k, module.cfg.max_length):
      print("   [MASK] -> " + ", ".join(f"{t} ({p:.3f})" for t, p in cands))
  return 0
