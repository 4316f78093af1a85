"""python -m bertjax extend_vocab --model HF_DIR_OR_WORKDIR --tokens new_words.txt --out EXTENDED/

New whole-word tokens appended to a WordPiece model's vocabulary, each new row initialised from the pieces it
replaces (`bertjax.convert.vocab`); the result is an HF folder that continued pre-training takes as its init.
"""
from __future__ import annotations

from bertjax.cli import common
from bertjax.convert import vocab
from bertjax.core import files


def parser() -> common.ArgumentParser:
  p = common.ArgumentParser(description=vocab.__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, help="an HF folder or a bertjax pre-training workdir (WordPiece)")
  p.add_argument("--tokens", required=True, help="a file with one new token per line, or comma-separated tokens")
  p.add_argument("--out", required=True, help="the extended HF folder (model and tokenizer)")
  p.add_argument("--overwrite", action="store_true", help="replace --out when it holds files")
  return p


@common.guard
def main(argv=None) -> int:
  args = parser().parse_args(argv)
  for path in (args.model, args.tokens, args.out):  # a wrong endpoint or a missing bucket: one line, before any work
    files.reach(path)
  report = vocab.extend(args.model, vocab.read_tokens(args.tokens), args.out, args.overwrite)
  print(f"{len(report['added'])} tokens added (ids {report['added'][0]['id']}-{report['added'][-1]['id']}); "
        f"vocabulary {report['vocab_size']} -> {args.out}", flush=True)
  return 0

