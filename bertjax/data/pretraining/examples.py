"""Pre-training examples made as google-research/bert `create_pretraining_data.py` makes them.

The algorithm (document chunking, the NSP pairing, `truncate_seq_pair`, 80/10/10 masking with optional whole
words) makes the same `random.Random` calls in the same order as the original, over token ids instead of token
strings: one buffer holding the whole corpus with seed s gives the original's output for `random_seed=s`.

`example_mode` picks how text becomes examples: "nsp_pairs" (the original: segment pairs A/B with the NSP label),
or, for MLM-only recipes, RoBERTa's "full_sentences" (contiguous sentences packed up to the sequence length,
crossing document boundaries with an extra [SEP] between documents) and "doc_sentences" (the same within one
document: an example never spans two).

At scale the corpus streams through buffers of `buffer_documents` documents (memory bounded; the random-next
document is drawn from the same buffer), processed in parallel worker processes, in order, so the output does
not depend on the number of workers.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Sequence

import numpy as np

from bertjax import errors
from bertjax.data import tokenizer as tokenizer_lib

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")


EXAMPLE_MODES = ("nsp_pairs", "full_sentences", "doc_sentences")


def max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
  """The masked positions an example may hold at a masking rate: ceil(length · rate) (20 at 128 x 15%, as the
  original's recipe; 39 at 128 x 30%)."""
  return max(1, math.ceil(max_seq_length * masked_lm_prob - 1e-9))


@dataclasses.dataclass(frozen=True)
class CreationOptions:
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20  # 0 = max_predictions(max_seq_length, masked_lm_prob)
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  dupe_factor: int = 10
  whole_word_mask: bool = False
  random_seed: int = 12345
  # Documents held at once, and one shard of the dataset: the random-next document comes from this buffer. 10,000
  # Wikipedia articles at dupe 10 make a shard of about 300 MB, which a host downloads and caches whole.
  buffer_documents: int = 10_000
  example_mode: str = "nsp_pairs"  # nsp_pairs (the original) | full_sentences | doc_sentences (RoBERTa's, no NSP)

  def __post_init__(self):
    if self.example_mode not in EXAMPLE_MODES:
      raise errors.ConfigError(f"example_mode {self.example_mode!r}; choose one of {list(EXAMPLE_MODES)}")
    if 0 < self.masked_lm_prob < 1 and self.max_predictions_per_seq == 0:
      object.__setattr__(self, "max_predictions_per_seq", max_predictions(self.max_seq_length, self.masked_lm_prob))
    if self.max_seq_length < 5:
      raise errors.ConfigError(f"max_seq_length {self.max_seq_length} is too short: [CLS] A [SEP] B [SEP] needs >= 5")
    if not 0 < self.masked_lm_prob < 1:
      raise errors.ConfigError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
    if not 0 <= self.short_seq_prob <= 1:
      raise errors.ConfigError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
    for name in ("max_predictions_per_seq", "dupe_factor", "buffer_documents"):
      if getattr(self, name) < 1:
        raise errors.ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclasses.dataclass
class Instance:
  tokens: list[int]
  segment_ids: list[int]
  is_random_next: bool
  masked_lm_positions: list[int]
  masked_lm_labels: list[int]


@dataclasses.dataclass(frozen=True)
class Vocab:
  """What masking needs of a tokenizer, picklable for worker processes."""
  size: int
  cls_id: int
  sep_id: int
  mask_id: int
  continues_word: np.ndarray

  @classmethod
  def of(cls, tok: tokenizer_lib.Tokenizer) -> "Vocab":
    return cls(tok.vocab_size, tok.cls_id, tok.sep_id, tok.mask_id, tok.continues_word)


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
  """Trim the longer list, from the front or the back at random, until the pair fits (in place).

  The same random draws and result as removing one token at a time (the original's loop), but each list is cut
  once at the end: removing from the front of a Python list one token at a time is quadratic in its length.
  """
  spans = [[0, len(tokens_a)], [0, len(tokens_b)]]
  size = lambda i: spans[i][1] - spans[i][0]  # noqa: E731
  while size(0) + size(1) > max_num_tokens:
    i = 0 if size(0) > size(1) else 1
    assert size(i) >= 1
    if rng.random() < 0.5:
      spans[i][0] += 1
    else:
      spans[i][1] -= 1
  for tokens, (start, end) in ((tokens_a, spans[0]), (tokens_b, spans[1])):
    del tokens[end:]
    del tokens[:start]


def create_masked_lm_predictions(tokens: Sequence[int], masked_lm_prob: float, max_predictions_per_seq: int,
                                 vocab: Vocab, rng: random.Random, whole_word_mask: bool = False):
  """(output tokens, sorted positions, labels): 80% [MASK], 10% kept, 10% a random vocabulary token."""
  cand_indexes: list[list[int]] = []
  for i, token in enumerate(tokens):
    if token == vocab.cls_id or token == vocab.sep_id:
      continue
    if whole_word_mask and cand_indexes and vocab.continues_word[token]:
      cand_indexes[-1].append(i)
    else:
      cand_indexes.append([i])
  rng.shuffle(cand_indexes)
  output = list(tokens)
  num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
  masked: list[tuple[int, int]] = []
  covered: set[int] = set()
  for index_set in cand_indexes:
    if len(masked) >= num_to_predict:
      break
    if len(masked) + len(index_set) > num_to_predict:
      continue  # a whole word that would exceed the cap is skipped
    if any(i in covered for i in index_set):
      continue
    for index in index_set:
      covered.add(index)
      if rng.random() < 0.8:
        new = vocab.mask_id
      elif rng.random() < 0.5:
        new = tokens[index]
      else:
        new = rng.randint(0, vocab.size - 1)
      output[index] = new
      masked.append((index, tokens[index]))
  masked.sort()
  return output, [i for i, _ in masked], [t for _, t in masked]


def create_instances_from_document(all_documents, document_index: int, opts: CreationOptions, vocab: Vocab,
                                   rng: random.Random) -> list[Instance]:
  document = all_documents[document_index]
  max_num_tokens = opts.max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < opts.short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  instances = []
  current_chunk: list[list[int]] = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = [t for seg in current_chunk[:a_end] for t in seg]
        tokens_b: list[int] = []
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          i -= len(current_chunk) - a_end  # put the unused segments back
        else:
          is_random_next = False
          tokens_b = [t for seg in current_chunk[a_end:] for t in seg]
        truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        tokens = [vocab.cls_id] + tokens_a + [vocab.sep_id] + tokens_b + [vocab.sep_id]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
        tokens, positions, labels = create_masked_lm_predictions(
            tokens, opts.masked_lm_prob, opts.max_predictions_per_seq, vocab, rng, opts.whole_word_mask)
        instances.append(Instance(tokens, segment_ids, is_random_next, positions, labels))
      current_chunk = []
      current_length = 0
    i += 1
  return instances


def create_packed_instances(documents: list[list[list[int]]], opts: CreationOptions, vocab: Vocab,
                            rng: random.Random) -> list[Instance]:
  """RoBERTa's FULL-SENTENCES (or, `doc_sentences`, DOC-SENTENCES) examples of one pass over `documents`:
  [CLS] s1 s2 ... [SEP] with whole sentences in corpus order, as many as fit in max_seq_length; a sentence longer
  than an example is cut to fit. Across a document boundary (full_sentences) an extra [SEP] separates the
  documents; with doc_sentences each document ends its example. One segment, no NSP label."""
  room = opts.max_seq_length - 2
  instances: list[Instance] = []
  chunk: list[int] = []

  def emit():
    while chunk and chunk[-1] == vocab.sep_id:  # an example never ends on a document separator
      chunk.pop()
    if chunk:
      tokens = [vocab.cls_id] + chunk + [vocab.sep_id]
      tokens, positions, labels = create_masked_lm_predictions(
          tokens, opts.masked_lm_prob, opts.max_predictions_per_seq, vocab, rng, opts.whole_word_mask)
      instances.append(Instance(tokens, [0] * len(tokens), False, positions, labels))
    chunk.clear()

  for document in documents:
    for sentence in document:
      sentence = sentence[:room]
      if len(chunk) + len(sentence) > room:
        emit()
      chunk.extend(sentence)
    if opts.example_mode == "doc_sentences":
      emit()
    elif chunk:  # the document separator, when it fits
      if len(chunk) + 1 >= room:
        emit()
      else:
        chunk.append(vocab.sep_id)
  emit()
  return instances


def create_instances(documents: list[list[list[int]]], opts: CreationOptions, vocab: Vocab,
                     rng: random.Random) -> list[Instance]:
  """The original's `create_training_instances` after tokenization: shuffle, dupe_factor passes, shuffle.
  In the packed modes each pass walks the documents in a fresh order (a different packing per pass)."""
  documents = [d for d in documents if d]
  rng.shuffle(documents)
  instances = []
  for _ in range(opts.dupe_factor):
    if opts.example_mode == "nsp_pairs":
      for index in range(len(documents)):
        instances.extend(create_instances_from_document(documents, index, opts, vocab, rng))
    else:
      instances.extend(create_packed_instances(documents, opts, vocab, rng))
      rng.shuffle(documents)
  rng.shuffle(instances)
  return instances


def to_features(inst: Instance, max_seq_length: int, max_predictions_per_seq: int) -> dict[str, np.ndarray]:
  n, p = len(inst.tokens), len(inst.masked_lm_positions)
  assert n <= max_seq_length and p <= max_predictions_per_seq
  f = {k: np.zeros(max_seq_length, np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  f["input_ids"][:n] = inst.tokens
  f["input_mask"][:n] = 1
  f["segment_ids"][:n] = inst.segment_ids
  for k in ("masked_lm_positions", "masked_lm_ids"):
    f[k] = np.zeros(max_predictions_per_seq, np.int32)
  f["masked_lm_positions"][:p] = inst.masked_lm_positions
  f["masked_lm_ids"][:p] = inst.masked_lm_labels
  f["masked_lm_weights"] = np.zeros(max_predictions_per_seq, np.float32)
  f["masked_lm_weights"][:p] = 1.0
  f["next_sentence_labels"] = np.int32(1 if inst.is_random_next else 0)
  return f


def buffer_rng(seed: int, buffer_index: int) -> random.Random:
  """Buffer 0 uses the seed itself (the original's `random.Random(random_seed)`); others derive from it."""
  return random.Random(seed if buffer_index == 0 else f"{seed}/{buffer_index}")


# ----------------------------------------------------------------------------- dynamic masking
def unmask(example: dict) -> np.ndarray:
  """The original tokens of a statically masked example (the labels put back at their positions)."""
  ids = np.array(example["input_ids"], copy=True)
  w = np.asarray(example["masked_lm_weights"]) > 0
  ids[np.asarray(example["masked_lm_positions"])[w]] = np.asarray(example["masked_lm_ids"])[w]
  return ids


def remask(example: dict, vocab: Vocab, opts: CreationOptions, rng: random.Random) -> dict:
  """A fresh mask for an example (dynamic masking); same rules and caps as the static masking."""
  n = int(np.sum(example["input_mask"]))
  tokens = unmask(example)[:n].tolist()
  out, positions, labels = create_masked_lm_predictions(tokens, opts.masked_lm_prob, opts.max_predictions_per_seq,
                                                        vocab, rng, opts.whole_word_mask)
  p = len(positions)
  new = dict(example)
  ids = np.array(example["input_ids"], copy=True)
  ids[:n] = out
  new["input_ids"] = ids
  for k, v in (("masked_lm_positions", positions), ("masked_lm_ids", labels)):
    arr = np.zeros_like(np.asarray(example[k]))
    arr[:p] = v
    new[k] = arr
  w = np.zeros_like(np.asarray(example["masked_lm_weights"]))
  w[:p] = 1.0
  new["masked_lm_weights"] = w
  return new
