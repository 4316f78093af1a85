"""One tokenizer interface over WordPiece (BERT `vocab.txt`, via HF `tokenizers`) and sentencepiece.

    tok = tokenizer.load("vocab.txt")            # or "spm.model", or RoBERTa's "vocab.json" (+ merges.txt beside)
    ids = tok.encode("Hello world")              # no special tokens added
    tok.decode(ids); tok.vocab_size; tok.cls_id, tok.sep_id, tok.mask_id, tok.pad_id, tok.unk_id
    tok.continues_word                           # bool per id: True where the piece continues a word

The WordPiece pipeline is BERT's BasicTokenizer + WordpieceTokenizer as HF `tokenizers` implements them
(clean text, CJK spacing, lowercasing with accent stripping, punctuation splitting). `reference` picks whose
behaviour it reproduces where the two differ: "hf" (fine-tuning, prediction; HF's BertTokenizer) maps literal
special tokens in the text ("[MASK]", "[SEP]", ...) to their ids and makes a word over 100 characters one [UNK];
"original" (pre-training data creation; google-research/bert's tokenization.py) splits "[MASK]" like any text
("[", "mask", "]") and allows 200 characters a word.

RoBERTa's byte-level BPE (`vocab.json` + `merges.txt`, HF `tokenizers`' BPE over GPT-2's byte-level
pre-tokenizer) gives the ids of HF's RobertaTokenizerFast; its special tokens <pad>, <unk>, <s>, </s>, <mask> take
the roles of BERT's [PAD], [UNK], [CLS], [SEP], [MASK].

CLI: python -m bertjax tokenizer --input a.txt b.txt --kind wordpiece|unigram|bpe|byte_bpe --vocab_size 8000 \\
    --out DIR
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tempfile
from typing import Sequence

import numpy as np

from bertjax import errors
from bertjax.core import files as store  # (named so: `train` takes a parameter called files)
from bertjax.data import vocab_files
from bertjax.data.pretraining import corpus
from bertjax.data.vocab_files import MAIN_FILES, copy_into, find_in, fingerprint  # noqa: F401

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BYTE_BPE_SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")  # the same roles, RoBERTa's names
GEMMA_SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")  # Gemma's names (mmBERT's tokenizer)


class TokenizerError(errors.TokenizerError):
  """A tokenizer file that cannot be used: names the file and what is wrong."""


@dataclasses.dataclass
class Tokenizer:
  """What the data pipeline needs of a tokenizer, whatever its kind."""
  kind: str  # wordpiece | sentencepiece | byte_bpe | metaspace (a sentencepiece vocabulary in a tokenizer.json)
  path: str
  _encode: object
  _decode: object
  _offsets: object  # text -> (ids, [(char_start, char_end)] into the original text)
  pieces: list[str]
  continues_word: np.ndarray  # bool [vocab_size]
  specials: tuple = SPECIAL_TOKENS  # the tokens playing pad, unk, cls, sep, mask

  @property
  def vocab_size(self) -> int:
    return len(self.pieces)

  def token_to_id(self, token: str) -> int:
    return self._index[token]

  def __post_init__(self):
    self._index = {p: i for i, p in enumerate(self.pieces)}
    missing = [t for t in self.specials if t not in self._index]
    if missing:
      raise TokenizerError(f"{self.path}: vocabulary lacks the special token(s) {missing}; a {self.kind} "
                           f"vocabulary needs {list(self.specials)}")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (self._index[t] for t in self.specials)
    self.special_ids = frozenset((self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id))

  def encode(self, text: str) -> list[int]:
    return list(self._encode(text))

  def encode_head(self, text: str, n: int) -> list[int]:
    """`encode(text)[:n]`, tokenizing only as much of the text as that takes: a window of characters, cut at a
    whitespace, that grows until it yields n tokens. Every kind splits words at whitespace before it looks them
    up, so the window's tokens are the text's first ones; a megabyte-long line costs what its head does."""
    size = max(256, 16 * n)
    while size < len(text):
      cut = max(text.rfind(c, 0, size) for c in " \n\t")
      if cut > 0:
        ids = self._encode(text[:cut])
        if len(ids) >= n:
          return list(ids[:n])
      size *= 4
    return list(self._encode(text))[:n]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and, per id, the [start, end) character span of the original text it came from."""
    ids, offsets = self._offsets(text)
    return list(ids), [tuple(o) for o in offsets]

  def decode(self, ids: Sequence[int]) -> str:
    return self._decode([int(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    return self.pieces[int(i)]


def _read_vocab(path: str) -> list[str]:
  try:
    raw = store.read_bytes(path)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: tokenizer file not found") from None
  if b"\x00" in raw[:4096]:
    raise TokenizerError(f"{path}: looks binary (NUL bytes), not a vocab.txt with one token per line")
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise TokenizerError(f"{path}: vocab.txt is not UTF-8 ({e})") from None
  pieces = [line.rstrip("\r") for line in text.split("\n")]
  while pieces and pieces[-1] == "":
    pieces.pop()
  if not pieces:
    raise TokenizerError(f"{path}: empty vocabulary file")
  return pieces


REFERENCES = {"hf": 100, "original": 200}  # -> characters a word at most before it becomes [UNK]


def _load_wordpiece(path: str, do_lower_case: bool, reference: str = "hf") -> Tokenizer:
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import decoders, models, normalizers, pre_tokenizers
  pieces = _read_vocab(path)
  vocab = {}
  for i, p in enumerate(pieces):
    vocab.setdefault(p, i)  # first occurrence wins, as BERT's load_vocab
  if "[UNK]" not in vocab:
    raise TokenizerError(f"{path}: vocabulary lacks the special token(s) ['[UNK]']; BERT needs "
                         f"{list(SPECIAL_TOKENS)}")
  tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=REFERENCES[reference]))
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                              lowercase=do_lower_case)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##")
  if reference == "hf":
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIAL_TOKENS if t in vocab])
  continues = np.array([p.startswith("##") for p in pieces], bool)
  def offsets(s):
    enc = tok.encode(s, add_special_tokens=False)
    return enc.ids, enc.offsets
  return Tokenizer("wordpiece", path, lambda s: tok.encode(s, add_special_tokens=False).ids,
                   lambda ids: tok.decode(ids, skip_special_tokens=False), offsets, pieces, continues)


def _load_sentencepiece(path: str) -> Tokenizer:
  import sentencepiece as spm
  if not store.isfile(path):
    raise FileNotFoundError(f"{path}: tokenizer file not found")
  if store.size(path) == 0:
    raise TokenizerError(f"{path}: empty sentencepiece model file")
  sp = spm.SentencePieceProcessor()
  try:
    sp.Load(path)
  except (RuntimeError, OSError) as e:
    raise TokenizerError(f"{path}: not a sentencepiece model ({str(e).strip()})") from None
  fields = vocab_files.proto_fields(store.read_bytes(path))
  if fields is None or not {2, 3} <= fields:
    # A model cut between two records still parses, with part of its pieces and without the specs that follow
    # them (the trainer's and the normaliser's, which every trained model has).
    raise TokenizerError(f"{path}: truncated sentencepiece model (it parses but lacks its trainer and normaliser "
                         f"specs; {sp.GetPieceSize()} pieces survive); copy or train it again")
  pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
  specials = set(SPECIAL_TOKENS)
  # A piece continues a word unless it starts one ("▁...") or stands alone (special, control, byte).
  continues = np.array([not (p.startswith("\u2581") or p in specials or sp.IsControl(i) or sp.IsUnknown(i))
                        for i, p in enumerate(pieces)], bool)
  def offsets(s):
    proto = sp.encode(s, return_type="proto")
    char_of_byte = []  # byte offset in UTF-8 -> character offset
    for i, ch in enumerate(s):
      char_of_byte += [i] * len(ch.encode("utf-8"))
    char_of_byte.append(len(s))
    return [p.id for p in proto.pieces], [(char_of_byte[p.begin], char_of_byte[p.end]) for p in proto.pieces]
  return Tokenizer("sentencepiece", path, lambda s: sp.EncodeAsIds(s), lambda ids: sp.DecodeIds(ids), offsets,
                   pieces, continues)


def _load_byte_bpe(path: str) -> Tokenizer:
  """Byte-level BPE: RoBERTa's `vocab.json` with `merges.txt` beside it (built as RobertaTokenizerFast builds
  itself), or a saved HF `tokenizer.json` (given, or beside vocab.json; its own added-token rules, e.g.
  roberta-base's strip before <mask>, ModernBERT's BERT-named special tokens). A `tokenizer.json` whose model is
  WordPiece (a BERT folder's) is read the same way, its word starts by WordPiece's "##" rule."""
  from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
  from tokenizers import Tokenizer as HFTokenizer
  folder = os.path.dirname(path)
  full = path if os.path.basename(path) == "tokenizer.json" else os.path.join(folder, "tokenizer.json")
  if store.isfile(full):
    try:
      tok = HFTokenizer.from_file(full)
    except Exception as e:  # tokenizers raises its own exception type
      raise TokenizerError(f"{full}: not an HF tokenizer file ({str(e).strip()[:200]})") from None
    # A saved file may carry the saving pipeline's padding and truncation (sentence-transformers' do): bertjax
    # pads and cuts its own rows, so encode gives the text's pieces alone.
    tok.no_padding()
    tok.no_truncation()
    vocab = tok.get_vocab(with_added_tokens=True)
  else:
    merges = os.path.join(folder, "merges.txt")
    if not store.isfile(merges):
      raise FileNotFoundError(f"{merges}: byte-level BPE needs merges.txt beside {os.path.basename(path)}")
    try:
      with store.open(path, encoding="utf-8") as f:
        vocab = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise TokenizerError(f"{path}: not a JSON vocabulary ({e})") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
      raise TokenizerError(f"{path}: expected a JSON object of token -> id")
    try:
      model = models.BPE.from_file(path, merges, unk_token="<unk>" if "<unk>" in vocab else None)
    except Exception as e:  # tokenizers raises its own exception type
      raise TokenizerError(f"{merges}: cannot read BPE merges ({str(e).strip()[:200]})") from None
    tok = HFTokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in BYTE_BPE_SPECIAL_TOKENS if t in vocab])
  pieces = [""] * (max(vocab.values()) + 1)
  for piece, i in vocab.items():
    pieces[i] = piece
  roles = next((names for names in (BYTE_BPE_SPECIAL_TOKENS, GEMMA_SPECIAL_TOKENS) if all(t in vocab for t in names)),
               SPECIAL_TOKENS)
  if type(tok.model).__name__ == "WordPiece":  # a BERT tokenizer.json: "##" marks a word's later pieces
    kind = "wordpiece"
    continues = np.array([p.startswith("##") for p in pieces], bool)
  else:
    # A byte-level BPE's "Ġ" (a space byte) starts a word; a sentencepiece vocabulary's "▁" (XLM-R's tokenizer.json
    # marks words so in its pre-tokenizer or normaliser); so do special tokens and the first piece of a text.
    spec = json.loads(tok.to_str())
    marks = json.dumps([spec.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")], ensure_ascii=False)
    kind = "metaspace" if "Metaspace" in marks or "\u2581" in marks else "byte_bpe"
    start = "\u2581" if kind == "metaspace" else "\u0120"
    starts = set(roles)
    continues = np.array([not (p.startswith(start) or p in starts) for p in pieces], bool)

  def offsets(s):
    enc = tok.encode(s, add_special_tokens=False)
    return enc.ids, enc.offsets
  return Tokenizer(kind, path, lambda s: tok.encode(s, add_special_tokens=False).ids,
                   lambda ids: tok.decode(ids, skip_special_tokens=False), offsets, pieces, continues, roles)


def load(path: str, do_lower_case: bool = True, reference: str = "hf") -> Tokenizer:
  """Load a BERT `vocab.txt` (WordPiece), a sentencepiece `.model` or RoBERTa's byte-level BPE `vocab.json`
  (with `merges.txt` beside it), checked for their special tokens. `reference`: "hf" or "original" (see the
  module docstring; WordPiece only). Byte-level BPE keeps case (`do_lower_case` does not apply)."""
  if reference not in REFERENCES:
    raise errors.ConfigError(f"unknown tokenizer reference {reference!r}; choose one of {sorted(REFERENCES)}")
  path = os.fspath(path)
  store.reach(path)
  if not store.exists(path):
    raise FileNotFoundError(f"{path}: tokenizer file not found")
  if store.is_remote(path):  # sentencepiece and HF tokenizers read local files: a local copy of its files
    tok = load(local_copy(path), do_lower_case, reference)
    tok.path = path
    return tok
  if path.endswith(".model"):
    return _load_sentencepiece(path)
  if path.endswith(".json"):
    return _load_byte_bpe(path)
  return _load_wordpiece(path, do_lower_case, reference)


def local_copy(path: str) -> str:
  """A local copy of a remote tokenizer: every file `load` reads (`vocab_files.files`) in one cache folder (a
  vocab.json keeps its merges.txt beside it), copied afresh (tokenizers are small; a changed one is never stale)."""
  if not store.is_remote(path):
    return path
  folder = os.path.join(store.cache_root(), "tokenizer-" + hashlib.sha256(path.encode()).hexdigest()[:16])
  os.makedirs(folder, exist_ok=True)
  for f in vocab_files.files(path):
    store.copy(f, os.path.join(folder, store.basename(f)))
  return os.path.join(folder, store.basename(path))


# ----------------------------------------------------------------------------- training
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
