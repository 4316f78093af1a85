"""Training a tokenizer on a corpus: WordPiece (HF `tokenizers`, BERT's), sentencepiece unigram or BPE, and
RoBERTa's byte-level BPE, the same files byte for byte from the same input. `tokenizer.train` is this module's
`train`; `tokenizer.load` reads what it writes."""
from __future__ import annotations

import io
import os
import tempfile
from typing import Sequence

from bertjax import errors
from bertjax.core import files as store  # (named so: `train` takes a parameter called files)
from bertjax.data.pretraining import corpus

# The special tokens every trained vocabulary starts with; `tokenizer.SPECIAL_TOKENS` names them for readers.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

OUTPUTS = {"wordpiece": ("vocab.txt",), "byte_bpe": ("vocab.json", "merges.txt"), "unigram": ("spm.model", "spm.vocab"),
           "bpe": ("spm.model", "spm.vocab")}


def train(files: Sequence[str], out_dir: str, kind: str = "wordpiece", vocab_size: int = 8000,
          do_lower_case: bool = True, seed: int = 0, reader=None, overwrite: bool = True, progress=None) -> str:
  """Train a tokenizer on a corpus (files, glob patterns, JSONL / Parquet / compressed shards, tfds: specs, read
  as `bertjax.data.corpus.ReadOptions` `reader` says); returns the path to load (`vocab.txt`, `spm.model` or, for
  kind "byte_bpe", RoBERTa-style `vocab.json` with `merges.txt`).

  The same input and arguments give the same files, byte for byte. The files are written in a temporary folder and
  moved into `out_dir` at the end; with `overwrite` False, tokenizer files already there are an error.
  `progress(lines)`, when given, is called as the corpus is read."""
  if kind not in OUTPUTS:
    raise errors.ConfigError(f"unknown tokenizer kind {kind!r}; choose wordpiece, unigram, bpe or byte_bpe")
  files = corpus.expand(files)
  out_dir = os.fspath(out_dir)
  store.reach(out_dir)
  for f in files:
    if not f.startswith("tfds:") and not store.isfile(f):
      raise FileNotFoundError(f"{f}: training text not found")
  if all(not f.startswith("tfds:") and not store.size(f) for f in files):
    raise errors.DataError(f"cannot train a tokenizer on empty input {files}")
  if vocab_size < len(SPECIAL_TOKENS) + 10:
    raise errors.ConfigError(f"vocab_size {vocab_size} is too small")
  existing = [n for n in OUTPUTS[kind] if store.exists(store.join(out_dir, n))]
  if existing and not overwrite:
    raise FileExistsError(f"{out_dir}: already holds {existing}; pass --overwrite to replace them (data dirs and "
                          "workdirs made with them refuse a changed tokenizer)")
  texts = _Texts(files, reader, progress)
  if not any(True for _ in _clean_texts(files, reader)):
    raise errors.DataError(f"no text in {files}: every line is blank; a tokenizer needs text to train on")
  store.makedirs(out_dir)
  # The trainers write local files: a local temporary folder (inside out_dir when that is local, so that the
  # moves are renames), each file then moved (uploaded) into out_dir.
  tmp = tempfile.mkdtemp(prefix=".tokenizer-", dir=None if store.is_remote(out_dir) else out_dir)
  try:
    name = _train_into(texts, tmp, kind, vocab_size, do_lower_case, seed)
    for n in OUTPUTS[kind]:
      if os.path.exists(os.path.join(tmp, n)):
        store.rename(os.path.join(tmp, n), store.join(out_dir, n))
  finally:
    store.rmtree(tmp)
  return store.join(out_dir, name)


def _train_into(texts, out_dir: str, kind: str, vocab_size: int, do_lower_case: bool, seed: int) -> str:
  if kind == "wordpiece":
    from tokenizers import BertWordPieceTokenizer

    def run(size, extra=()):
      tok = BertWordPieceTokenizer(lowercase=do_lower_case, strip_accents=None, clean_text=True,
                                   handle_chinese_chars=True)
      tok.train_from_iterator(texts(), vocab_size=size, special_tokens=list(SPECIAL_TOKENS) + list(extra),
                              show_progress=False, limit_alphabet=1000, wordpieces_prefix="##")
      return tok
    # HF's trainer numbers the word-continuing pieces ("##x") in the order it meets them in a hash map, and breaks
    # ties between equally frequent merges by those numbers: the same corpus gives other vocabularies from run to
    # run. Numbering them up front, in sorted order, makes every run give the same file.
    alphabet = run(len(SPECIAL_TOKENS)).get_vocab()
    run(vocab_size, sorted(p for p in alphabet if p.startswith("##"))).save_model(out_dir)
    return "vocab.txt"
  if kind == "byte_bpe":
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    tok.train_from_iterator(texts(), vocab_size=vocab_size, min_frequency=2, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])  # RoBERTa's ids 0-4
    tok.save_model(out_dir)
    return "vocab.json"
  import sentencepiece as spm
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()  # written by us: with a model_prefix the model records the (temporary) path it was given
  spm.SentencePieceTrainer.Train(
      sentence_iterator=texts(), model_writer=model, vocab_size=vocab_size, model_type=kind,
      pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
      control_symbols="[CLS],[SEP],[MASK]", normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
      character_coverage=0.9995, input_sentence_size=2_000_000, shuffle_input_sentence=True,
      seed_sentencepiece_size=1_000_000, minloglevel=2, num_threads=1, hard_vocab_limit=False)
  with open(os.path.join(out_dir, "spm.model"), "wb") as f:
    f.write(model.getvalue())
  sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
  with open(os.path.join(out_dir, "spm.vocab"), "w", encoding="utf-8") as f:
    f.writelines(f"{sp.IdToPiece(i)}\t{sp.GetScore(i):g}\n" for i in range(sp.GetPieceSize()))
  return "spm.model"


class _Texts:
  """A re-iterable view of the corpus' sentences that reports how many lines each pass has read."""

  def __init__(self, files, reader, progress):
    self.files, self.reader, self.progress = files, reader, progress

  def __call__(self):
    n = 0
    for n, line in enumerate(_clean_texts(self.files, self.reader), 1):
      if self.progress is not None and n % 100_000 == 0:
        self.progress(n)
      yield line
    if self.progress is not None:
      self.progress(n)


def _clean_texts(files, reader=None):
  """Sentences decoded robustly (bad bytes replaced, NULs dropped), as the data pipeline reads them."""
  for line in corpus.iter_texts(files, reader):
    line = line.strip()
    if line:
      yield line
