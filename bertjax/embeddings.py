"""Embedding sentences with a bertjax encoder: load a sentence-transformers folder (or an HF folder with a
pooling choice), tokenise texts as sentence-transformers does ([CLS] text [SEP], cut at `max_seq_length`), and
embed them in batches.

    enc = embeddings.Encoder.load("all-MiniLM-L6-v2")        # a sentence-transformers folder
    vectors = enc.encode(["a sentence", "another one"])     # [2, 384] float32, unit length

  python -m bertjax.embeddings --model MODEL --sts pairs.csv --columns sentence1,sentence2,score   # STS
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import jax
import numpy as np

from bertjax import convert, errors, scores, weights
from bertjax.convert import sentence_transformers as st_lib
from bertjax.data import task_data
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.tasks import contrastive as contrastive_task
from bertjax.model.embedding import EmbeddingModel, Pooling


def batch_of(tok, texts: Sequence[str], max_len: int) -> dict:
  """[CLS] text [SEP] rows (cut to `max_len` tokens), padded to the longest row, as the encoder's batch."""
  rows = [[tok.cls_id] + tok.encode(t)[:max_len - 2] + [tok.sep_id] for t in texts]
  n = max(len(r) for r in rows)
  ids = np.full((len(rows), n), tok.pad_id, np.int32)
  mask = np.zeros((len(rows), n), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def _max_seq_length(path: str, folder: str) -> int:
  """sentence_bert_config.json's max_seq_length, else (sentence-transformers >= 6 keeps it with the tokenizer)
  tokenizer_config.json's model_max_length; 0 when neither says."""
  for name, key in ((os.path.join(path, "sentence_bert_config.json"), "max_seq_length"),
                    (os.path.join(folder, "tokenizer_config.json"), "model_max_length")):
    if os.path.isfile(name):
      with open(name, encoding="utf-8") as f:
        value = json.load(f).get(key)
      if isinstance(value, int) and 0 < value < 10 ** 6:
        return value
  return 0


@dataclasses.dataclass
class Encoder:
  module: EmbeddingModel
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_seq_length: int

  @classmethod
  def load(cls, path: str, pooling: Pooling | None = None, max_seq_length: int = 0, **overrides) -> "Encoder":
    """A sentence-transformers folder (its pooling, dense layer, normalisation and max_seq_length), or any model
    `weights.load` reads (an HF folder, a bertjax workdir) with `pooling` (default mean + normalize)."""
    if st_lib.is_folder(path):
      cfg, params, found, folder = st_lib.read(path, **overrides)
      tok_path, lower = weights.hf_tokenizer(folder)
      pooling = pooling or found
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
    else:
      w = weights.load(path, overrides=overrides, head="encoder")
      cfg, params, tok_path, lower = w.cfg, w.params, w.tokenizer, w.do_lower_case
      pooling = pooling or Pooling()
    if not tok_path:
      raise convert.ConversionError(f"{path}: no tokenizer files (vocab.txt, vocab.json + merges.txt, or a "
                                    "sentencepiece model)")
    tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
    limit = cfg.max_length
    return cls(EmbeddingModel(cfg, pooling), params, tok, min(max_seq_length or limit, limit))

  def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    apply = jax.jit(self.module.apply)
    out = [np.asarray(apply({"params": self.params}, batch_of(self.tok, texts[i:i + batch_size],
                                                               self.max_seq_length))["embedding"])
           for i in range(0, len(texts), batch_size)]
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def sts_scores(encoder: Encoder, pairs: Sequence[tuple[str, str, float]], batch_size: int = 32) -> dict[str, float]:
  """Spearman and Pearson correlation of the cosine similarity of each pair's embeddings with its gold score."""
  if len(pairs) < 2:
    raise task_data.TaskDataError(f"STS needs at least two scored pairs, got {len(pairs)}")
  a = encoder.encode([p[0] for p in pairs], batch_size)
  b = encoder.encode([p[1] for p in pairs], batch_size)
  cos = np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
  gold = np.array([p[2] for p in pairs], np.float64)
  return {"spearman": scores.spearman(cos, gold), "pearson": scores.pearson(cos, gold), "pairs": len(pairs)}


@errors.guard
def main(argv=None) -> int:
  p = errors.ArgumentParser(description="Evaluate an embedding model (a sentence-transformers folder, an HF folder "
                                        "or a bertjax workdir) on scored sentence pairs (STS).")
  p.add_argument("--model", required=True)
  p.add_argument("--sts", required=True, help=".csv / .tsv / .jsonl with two text columns and a score column")
  p.add_argument("--columns", default="sentence1,sentence2,score", help="the text, text and score column names")
  p.add_argument("--pooling", default="", help="cls | mean | max (default: the folder's, else mean)")
  p.add_argument("--batch_size", type=int, default=32)
  args = p.parse_args(argv)
  names = [c.strip() for c in args.columns.split(",")]
  if len(names) != 3:
    raise errors.ConfigError(f"--columns {args.columns!r}: give three names (text, text, score)")
  rows = contrastive_task.read_pairs(args.sts, names[0], names[1], score=names[2])
  enc = Encoder.load(args.model, Pooling(mode=args.pooling) if args.pooling else None)
  result = sts_scores(enc, [(r["anchor"], r["docs"][0], r["score"]) for r in rows], args.batch_size)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
