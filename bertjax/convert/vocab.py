"""Vocabulary extension before continued pre-training on a domain: new whole-word tokens appended to a WordPiece
vocabulary, each new embedding row (and MLM output bias) initialised as the mean of the rows of the pieces the
old vocabulary splits the word into, the tied decoder growing with the table. The result is an HF folder (model
and tokenizer) that `AutoModelForMaskedLM` / `AutoTokenizer` load, and bertjax takes as `init_checkpoint`.

  python -m bertjax extend_vocab --model HF_DIR_OR_WORKDIR --tokens new_words.txt --out EXTENDED/
  python -m bertjax dataset --input domain.txt --tokenizer EXTENDED/vocab.txt --out DATA/ ...
  python -m bertjax train --config=configs/pretrain.py:... --workdir W --config.init_checkpoint=EXTENDED/ \
      --config.data.data_dir=DATA/

`--tokens`: a file with one token per line, or tokens separated by commas. A token already in the vocabulary, a
token the tokenizer's pre-tokenizer splits (whitespace, punctuation: it could never be produced), a repeated one
or an empty one is a one-line error naming it. `--model`, `--tokens` and `--out` may be local or in an object store
(gs://, s3://; `bertjax.core.files`).
"""
from __future__ import annotations

import json
import os
import tempfile

import flax
import numpy as np

from bertjax import convert, errors
from bertjax.convert import export as export_lib
from bertjax.convert import table as table_lib
from bertjax.convert import weights
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib


def read_tokens(arg: str) -> list[str]:
  """The tokens of `--tokens`: a file with one token per line, or comma-separated tokens. An argument that names
  a path (a folder separator or a .txt ending) but no file is that missing file, not a token."""
  is_file = files.isfile(arg)
  if not is_file and (os.sep in arg or arg.endswith(".txt")):
    raise FileNotFoundError(f"--tokens {arg}: no such file")
  if is_file:
    try:
      with files.open(arg, encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip()]
    except UnicodeDecodeError as e:
      raise errors.DataError(f"{arg}: not UTF-8 ({e.reason} at byte {e.start})") from None
  return [t.strip() for t in arg.split(",") if t.strip()]


def plan(tok: tokenizer_lib.Tokenizer, tokens: list[str], do_lower_case: bool) -> list[tuple[str, list[int]]]:
  """(token as the vocabulary will hold it, ids of the pieces the current vocabulary splits it into)."""
  from tokenizers import normalizers, pre_tokenizers
  norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                    lowercase=do_lower_case)
  split = pre_tokenizers.BertPreTokenizer()
  if not tokens:
    raise errors.ConfigError("--tokens: no tokens given")
  out, seen = [], set()
  for raw in tokens:
    t = norm.normalize_str(raw).strip()
    words = [w for w, _ in split.pre_tokenize_str(t)]
    if len(words) != 1:
      raise errors.ConfigError(f"token {raw!r}: the tokenizer splits it into {words} before looking words up, so "
                               "it could never be produced; add the parts, or a token without spaces or punctuation")
    if t in tok._index:
      raise errors.ConfigError(f"token {raw!r} is already in the vocabulary (id {tok.token_to_id(t)})")
    if t in seen:
      raise errors.ConfigError(f"token {raw!r} is given twice")
    seen.add(t)
    out.append((t, tok.encode(t)))
  return out


def wordpiece_json(path: str) -> tuple[list[str], bool] | None:
  """(pieces in id order, lower-cases) of a tokenizer.json whose model is WordPiece (as transformers 5 writes
  BERT's tokenizer), or None for another model; ids that are not 0..n-1, or added tokens beyond the WordPiece
  vocabulary, are a one-line error."""
  try:
    spec = json.loads(files.read_text(path))
  except (OSError, ValueError) as e:
    raise errors.ConfigError(f"{path}: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  model = spec.get("model") or {}
  if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
    return None
  pieces = sorted(model["vocab"], key=model["vocab"].get)
  if [model["vocab"][p] for p in pieces] != list(range(len(pieces))):
    raise errors.ConfigError(f"{path}: the WordPiece vocabulary's ids are not 0..{len(pieces) - 1}")
  beyond = [a.get("content") for a in spec.get("added_tokens") or () if a.get("id", 0) >= len(pieces)]
  if beyond:
    raise errors.ConfigError(f"{path}: added tokens {beyond[:5]} beyond the WordPiece vocabulary are not extended "
                             "here")
  norm = spec.get("normalizer") or {}
  parts = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
  lower = any(n.get("type") == "Lowercase" or n.get("type") == "BertNormalizer" and n.get("lowercase")
              for n in parts if isinstance(n, dict))
  return pieces, lower


def _wordpiece(model: str, path: str | None, lower: bool) -> tuple[tokenizer_lib.Tokenizer, bool]:
  """(WordPiece tokenizer, lower-cases) of the model: its vocab.txt, or the vocabulary of its WordPiece
  tokenizer.json (read as a vocab.txt would be, with the file's lower-casing)."""
  found = path and files.isfile(path) and os.path.basename(path)
  pieces = wordpiece_json(path) if found == "tokenizer.json" else None
  if found != "vocab.txt" and pieces is None:
    raise errors.ConfigError(f"{model}: vocabulary extension needs a WordPiece vocab.txt (or a WordPiece "
                             f"tokenizer.json); this model's tokenizer is {path or 'missing'}")
  if pieces is None:
    return tokenizer_lib.load(path, do_lower_case=lower), lower
  pieces, lower = pieces
  with tempfile.TemporaryDirectory() as side:
    vocab = os.path.join(side, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
      f.write("".join(p + "\n" for p in pieces))
    return tokenizer_lib.load(vocab, do_lower_case=lower), lower


def extend(model: str, tokens: list[str], out: str, overwrite: bool = False) -> dict:
  """Writes the extended HF folder `out`; returns a report (new ids, the pieces each replaces)."""
  export_lib.check_out(model, out, overwrite)
  if weights.source_of(model) == "hf":
    from bertjax.convert import merge as merge_lib
    merge_lib._check_hf_form(model, "extend_vocab")
  w = weights.load(model, head="pretraining")
  if w.cfg.embedding_size:
    raise errors.ConfigError(f"{model}: a factorised embedding (ELECTRA) is not extended here; extend the "
                             "generator and discriminator folders' shared vocabulary with their own tools")
  tok, lower = _wordpiece(model, w.tokenizer, w.do_lower_case)
  st_stack = export_lib.st_modules(model) if weights.source_of(model) == "hf" else None
  todo = plan(tok, tokens, lower)
  old = tok.vocab_size
  params = flax.core.unfreeze(table_lib.host_params(w.params))  # a mutable copy on the host
  emb = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  rows = max(emb.shape[0], old + len(todo))
  if w.cfg.vocab_multiple > 1:
    rows = -(-rows // w.cfg.vocab_multiple) * w.cfg.vocab_multiple
  grown = {}
  for name, table in (("embedding", emb), ("mlm_bias", params.get("mlm_bias"))):
    if table is None:
      continue
    new = np.zeros((rows, *table.shape[1:]), table.dtype)
    new[:table.shape[0]] = table
    for i, (_, pieces) in enumerate(todo):
      new[old + i] = table[pieces].mean(0)
    grown[name] = new
  params["bert"]["embeddings"]["word_embeddings"]["embedding"] = grown["embedding"]
  if "mlm_bias" in grown:
    params["mlm_bias"] = grown["mlm_bias"]
  cfg = w.cfg.replace(vocab_size=old + len(todo) if w.cfg.vocab_multiple > 1 else rows,
                      nsp_head=w.cfg.nsp_head and "nsp" in params)  # BertForMaskedLM has none
  report = {"model": model, "vocab_size": old + len(todo), "embedding_rows": rows,
            "added": [{"token": t, "id": old + i, "from": [tok.id_to_token(p) for p in pieces]}
                      for i, (t, pieces) in enumerate(todo)]}

  def make(tmp: str) -> None:
    if set(params) == {"bert"}:  # an encoder without heads (an HF *Model folder): written as one
      export_lib.encoder_to_hf(cfg, params["bert"], tmp)
    else:
      convert.to_hf(cfg, params, tmp)
    with tempfile.TemporaryDirectory() as side:
      vocab = os.path.join(side, "vocab.txt")
      files.write_whole(vocab, "".join(p + "\n" for p in [*tok.pieces, *(t for t, _ in todo)]))
      export_lib.copy_tokenizer(vocab, lower, tmp)
    files.write_whole(files.join(tmp, "extend_vocab.json"), json.dumps(report, indent=1))
    export_lib.carry_st_modules(st_stack, tmp)  # a sentence-transformers folder stays one

  if files.is_remote(out):  # written in a local staging folder, then uploaded (`export.into_place`)
    export_lib.into_place(out, make)
    return report
  tmp = tempfile.mkdtemp(prefix=".extend-", dir=os.path.dirname(os.path.abspath(out)) or ".")
  try:
    make(tmp)
    if files.isdir(out):
      files.rmtree(out)  # empty, or an earlier output that --overwrite replaces
    files.rename(tmp, out)
  except BaseException:
    files.rmtree(tmp)
    raise
  return report
