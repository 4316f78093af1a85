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
import json
import os
from typing import Sequence

import numpy as np

from bertjax import errors
from bertjax.core import files as store  # (named so: `train` takes a parameter called files)
from bertjax.data import vocab_files
from bertjax.data.tokenizer_training import OUTPUTS, SPECIAL_TOKENS, train  # noqa: F401  (tokenizer.train)
from bertjax.data.vocab_files import MAIN_FILES, copy_into, find_in, fingerprint  # noqa: F401

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
  spm_ids: tuple | None = None  # sentencepiece: each id's piece id in the .model, -1 for a token added beyond it

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


FAIRSEQ_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # XLM-R's ids 0-3 (fairseq's dictionary), before its pieces
# The order in which HF's tokenizers append special tokens their vocabulary lacks (SPECIAL_TOKENS_ATTRIBUTES).
HF_SPECIAL_ORDER = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def hf_tokenizer_config(path: str) -> dict:
  """The tokenizer_config.json beside a tokenizer file (special_tokens_map.json's entries under it), with each
  special token as its text (a saved AddedToken is a {"content": ...} object); {} where there is none."""
  folder = os.path.dirname(path)
  out = {}
  for name in ("special_tokens_map.json", "tokenizer_config.json"):
    f = os.path.join(folder, name)
    if store.isfile(f):
      try:
        got = store.read_json(f)
      except (OSError, ValueError) as e:
        raise TokenizerError(f"{f}: not readable JSON ({str(e).splitlines()[0][:200]})") from None
      out.update(got if isinstance(got, dict) else {})
  for k in HF_SPECIAL_ORDER:
    if isinstance(out.get(k), dict):
      out[k] = out[k].get("content")
  return out


def _sentencepiece_ids(path: str, own: list[str], config: dict) -> tuple[list[str], tuple, tuple]:
  """(our pieces, the model's id of each of ours or -1 for a token the model lacks, the special tokens in
  SPECIAL_TOKENS' roles) of a sentencepiece model whose pieces are `own`, by its form (`_load_sentencepiece`)."""
  n = len(own)
  fairseq = os.path.basename(path) == "sentencepiece.bpe.model" or (
      own[:3] == ["<unk>", "<s>", "</s>"] and config.get("tokenizer_class", "").startswith("XLMRoberta"))
  if fairseq:
    if own[:3] != ["<unk>", "<s>", "</s>"]:
      raise TokenizerError(f"{path}: an XLM-R sentencepiece model starts <unk> <s> </s>, this one "
                           f"{own[:3]}")
    mask = config.get("mask_token") or "<mask>"
    pieces = list(FAIRSEQ_TOKENS) + own[3:] + [mask]
    spm_ids = (1, -1, 2, 0, *range(3, n), -1)
    specials = ("<pad>", "<unk>", "<s>", "</s>", mask)
  else:
    names = {**dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS)),
             **{k: v for k, v in config.items() if k in HF_SPECIAL_ORDER and isinstance(v, str)}}
    names.setdefault("bos_token", names["cls_token"])
    names.setdefault("eos_token", names["sep_token"])
    specials = tuple(names[k] for k in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"))
    index = set(own)
    deberta = all(t in index for t in specials[:4]) and specials[4] not in index
    added = []
    if config or deberta:  # as HF's tokenizer does: the special tokens the model lacks, after its pieces
      added = list(dict.fromkeys(names[k] for k in HF_SPECIAL_ORDER if names[k] not in index))
    pieces = own + added
    spm_ids = (*range(n), *[-1] * len(added))
  return pieces, tuple(spm_ids), specials


def _load_sentencepiece(path: str) -> Tokenizer:
  """A sentencepiece model in one of three forms. bertjax's own (and any model holding [PAD] [UNK] [CLS] [SEP]
  [MASK]): the model's ids. DeBERTa-v2/v3 as published (`spm.model`: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, no
  [MASK]): HF's DebertaV2Tokenizer's ids, the model's own and the special tokens it lacks appended after them
  ([MASK] = the piece count, 128000 for DeBERTa-v3); the names and `do_lower_case` from a tokenizer_config.json
  beside it. XLM-R's `sentencepiece.bpe.model` (<unk>=0 <s>=1 </s>=2): HF's XLMRobertaTokenizer's ids, fairseq's
  <s>=0 <pad>=1 </s>=2 <unk>=3, each other piece one above its id in the model, <mask> last."""
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
  n = sp.GetPieceSize()
  own = [sp.IdToPiece(i) for i in range(n)]
  config = hf_tokenizer_config(path)
  lower = bool(config.get("do_lower_case", False))
  if config.get("split_by_punct"):
    raise TokenizerError(f"{path}: its tokenizer_config.json sets split_by_punct, which bertjax does not "
                         "implement; use a model without it")
  pieces, spm_ids, specials = _sentencepiece_ids(path, own, config)
  ours = {s: i for i, s in enumerate(spm_ids) if s >= 0}  # piece id in the model -> ours
  identity = all(i == s for i, s in enumerate(spm_ids) if s >= 0)
  unk = pieces.index(specials[1]) if specials[1] in pieces else ours.get(sp.unk_id(), 0)

  def to_ours(ids):
    return list(ids) if identity else [ours.get(i, unk) for i in ids]

  def prepare(s):
    return s.lower() if lower else s

  def decode(ids):
    out, run = [], []
    for i in ids:
      if 0 <= i < len(spm_ids) and spm_ids[i] >= 0:
        run.append(spm_ids[i])
        continue
      if run:
        out.append(sp.DecodeIds(run))
        run = []
      out.append(pieces[i] if 0 <= i < len(pieces) else "")
    if run:
      out.append(sp.DecodeIds(run))
    return " ".join(x for x in out if x)
  special = set(specials)
  # A piece continues a word unless it starts one ("▁...") or stands alone (special, control, byte, added).
  continues = np.array([not (p.startswith("\u2581") or p in special or s < 0 or sp.IsControl(s) or sp.IsUnknown(s))
                        for p, s in zip(pieces, spm_ids)], bool)

  def offsets(s):
    proto = sp.encode(prepare(s), return_type="proto")
    char_of_byte = []  # byte offset in UTF-8 -> character offset
    for i, ch in enumerate(prepare(s)):
      char_of_byte += [i] * len(ch.encode("utf-8"))
    char_of_byte.append(len(s))
    return (to_ours(p.id for p in proto.pieces),
            [(char_of_byte[p.begin], char_of_byte[p.end]) for p in proto.pieces])
  return Tokenizer("sentencepiece", path, lambda s: to_ours(sp.EncodeAsIds(prepare(s))), decode, offsets, pieces,
                   continues, specials, tuple(spm_ids))


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
