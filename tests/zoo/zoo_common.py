"""What every era's writer shares: the word list (from Python's own standard-library docstrings), the fixed texts,
the tiny model sizes, tokenizer files built from the words, and the record beside each folder (zoo.json +
expected.npz). Imported by the writers, which run under each era's own Python environment (no bertjax)."""
from __future__ import annotations

import io
import json
import os
import random
import re
import shutil

import numpy as np

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
# Every model's initial weights (HF's config.initializer_range, so the heads the libraries add on load too: a
# cross-encoder's classifier, a classification or NSP head): at the libraries' default 0.02 a tiny model's head
# output barely depends on its input (a cross-encoder's scores varied by 6e-6 over the fixed texts), and a reader
# returning a constant would pass the tests' 1e-5; at 0.3 every stored output varies by far more than that.
INIT = 0.3
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def stdlib_words(n: int = 60) -> list[str]:
  """The `n` most frequent lower-case words of a few standard-library modules' docstrings (ties by word)."""
  import collections
  import functools
  import json as j  # noqa: E401
  import random as r
  import string
  import textwrap
  text = " ".join(m.__doc__ or "" for m in (j, string, textwrap, r, collections, functools, os, re))
  counts: dict[str, int] = {}
  for w in re.findall(r"[a-z]{2,}", text.lower()):
    counts[w] = counts.get(w, 0) + 1
  return sorted(counts, key=lambda w: (-counts[w], w))[:n]


WORDS = stdlib_words()
TEXTS = ["the module provides a function for every string",
         "Return a new list of the items, in order.",
         "random numbers; with zero or more arguments?",
         "this is a rather long text that keeps going with the words of the module and the functions it returns "
         "until it passes the maximum sequence length of the small models in the zoo",
         "xylophone quartz"]
PAIRS = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3]), (TEXTS[4], TEXTS[0])]
PROMPTS = {"query": "query: ", "document": "passage: ", "classification": "classify this: "}


def corpus_lines(k: int = 2000, seed: int = 0) -> list[str]:
  rng = random.Random(seed)
  extra = ["Return", "The", "items", ",", ".", ";", "?", "new", "list", "zero", "numbers", "order"]
  return [" ".join(rng.choice(WORDS + extra) for _ in range(12)) for _ in range(k)]


def wordpiece_vocab(out: str) -> str:
  pieces = ["##s", "##e", "##ed", "##ing", "##ly", "##er"] + list("abcdefghijklmnopqrstuvwxyz")
  pieces += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"] + list(".,;?!:'\"()-")
  vocab = list(dict.fromkeys(SPECIALS + WORDS + pieces))
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, "vocab.txt")
  with open(path, "w") as f:
    f.write("\n".join(vocab) + "\n")
  return path


def train_byte_bpe(specials: list[str], vocab_size: int = 280):
  """A byte-level BPE (`tokenizers`) trained on the corpus lines."""
  import tokenizers
  tk = tokenizers.Tokenizer(tokenizers.models.BPE())
  tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                           initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tk.train_from_iterator(corpus_lines(), trainer)
  return tk


def roberta_files(out: str) -> tuple[str, str]:
  """vocab.json + merges.txt of a byte-level BPE with RoBERTa's special tokens."""
  tk = train_byte_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  os.makedirs(out, exist_ok=True)
  tk.model.save(out)
  return os.path.join(out, "vocab.json"), os.path.join(out, "merges.txt")


def train_spm(path: str, **ids) -> None:
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.Train(sentence_iterator=iter(corpus_lines()), model_writer=model, vocab_size=200,
                                 model_type="unigram", hard_vocab_limit=False, minloglevel=2, num_threads=1,
                                 normalization_rule_name="identity", **ids)  # no 200 KB charsmap
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(model.getvalue())


def perturb(m, seed: int = 0) -> None:
  """Biases and norms moved off their init, so that every mapped tensor matters."""
  import torch
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for n, p in m.named_parameters():
      if n.endswith("bias") or "norm" in n.lower():
        p.add_(torch.randn(p.shape, generator=g) * 0.1)


def widen(module, seed: int, std: float = INIT) -> None:
  """Every torch Linear inside `module` (a sentence-transformers or PyLate Dense) re-drawn from a seeded normal of
  `std` (bias 0.1): torch's default init leaves a pooled vector's projection nearly the same for every text."""
  import torch
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for lin in [x for x in module.modules() if isinstance(x, torch.nn.Linear)]:
      lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * std)
      if lin.bias is not None:
        lin.bias.copy_(torch.randn(lin.bias.shape, generator=g) * 0.1)


KEY_PACKAGES = ("torch", "transformers", "sentence-transformers", "tokenizers", "huggingface_hub", "safetensors",
                "sentencepiece", "numpy", "pylate")


def versions() -> dict:
  """The writing environment's exact versions of the packages that decide a folder and its outputs."""
  import importlib.metadata as md
  out = {}
  for name in KEY_PACKAGES:
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  return out


def record(folder: str, kind: str, family: str, tools: dict, arrays: dict, **extra) -> None:
  """zoo.json (kind, family, writer versions, what each bertjax tool should do) and expected.npz beside `folder`
  (in its parent, named after it: the folder itself stays as the library wrote it)."""
  base = folder.rstrip("/")
  np.savez_compressed(base + ".expected.npz", **{k: np.asarray(v) for k, v in arrays.items()})
  with open(base + ".zoo.json", "w") as f:
    json.dump({"kind": kind, "family": family, "writer": versions(), "tools": tools, **extra}, f, indent=1,
              sort_keys=True)


def fresh(path: str) -> str:
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return path
