"""Quantized embeddings as sentence-transformers makes them (`quantize_embeddings`), and exact search over a
quantized corpus with rescoring by the float query (`semantic_search_faiss` / `semantic_search_usearch`).

    codes = quantize(vectors, "int8")                  # [n, d] int8: 255 steps between each feature's min and max
    codes = quantize(vectors, "binary")                # [n, ceil(d / 8)] int8: packbits(x > 0) - 128
    scores, rows = search(queries, [(codes, ranges)], k=10, precision="int8")

The search scores every document by its quantized form (int8 / uint8: the inner product of the quantized query
and document; binary / ubinary: the Hamming distance of their bits), keeps the best k x `rescore_multiplier`
candidates (ties: the lower row first), then ranks those by the float query's inner product with each candidate
as sentence-transformers reconstructs it (int8 / uint8: dequantized with its ranges; binary: its bits as 0 / 1)
and keeps k. The corpus arrives in blocks, each with its own ranges; memory holds one block and the running
candidates.
"""
from __future__ import annotations

import functools
import hashlib
import io
from typing import Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax.core import files
from bertjax.embeddings import blocks

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
SCALAR = ("int8", "uint8")


class QuantizeError(errors.ConfigError):
  """A precision, ranges or calibration file that cannot quantize these embeddings."""


def check_precision(precision: str) -> None:
  if precision not in PRECISIONS:
    raise QuantizeError(f"--precision {precision!r}: one of {', '.join(PRECISIONS)}")


def ranges_of(embeddings: np.ndarray, calibration: np.ndarray | None = None, precision: str = "int8") -> np.ndarray:
  """[2, d]: each feature's minimum and maximum over `calibration`, else over `embeddings` themselves (which then
  need more than one row, as sentence-transformers requires)."""
  if calibration is None:
    embeddings = np.asarray(embeddings)
    if embeddings.ndim == 1 or embeddings.shape[0] == 1:
      raise QuantizeError(f"cannot compute {precision} quantization ranges from a single embedding: give ranges or "
                          "calibration embeddings")
    calibration = embeddings
  calibration = np.asarray(calibration)
  return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def quantize(embeddings, precision: str, ranges: np.ndarray | None = None,
             calibration: np.ndarray | None = None) -> np.ndarray:
  """`embeddings` [n, d] (float) at `precision`: float32; int8 / uint8 (255 equal steps from each feature's
  minimum to its maximum, `ranges` [2, d] given, else from `calibration`, else from the embeddings; int8 is uint8
  - 128); binary (packbits(x > 0) - 128, int8) or ubinary (packbits(x > 0), uint8), ceil(d / 8) bytes a row."""
  check_precision(precision)
  if isinstance(embeddings, dict) or hasattr(embeddings, "tocsr"):
    raise QuantizeError("a sparse model's term vectors cannot be quantized (--precision is for dense embeddings)")
  embeddings = np.asarray(embeddings)
  if embeddings.dtype in (np.uint8, np.int8):
    raise QuantizeError("embeddings to quantize must be float, not int8 or uint8")
  if embeddings.ndim == 2 and embeddings.shape[0] == 0:
    d = embeddings.shape[1]
    width = d if precision in SCALAR else (d + 7) // 8
    return embeddings.astype(np.float32) if precision == "float32" else np.zeros(
        (0, width), np.int8 if precision in ("int8", "binary") else np.uint8)
  if precision == "float32":
    return embeddings.astype(np.float32)
  if precision in SCALAR:
    ranges = ranges_of(embeddings, calibration, precision) if ranges is None else ranges
    ranges = np.asarray(ranges).astype(np.float32, copy=False)
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    q = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
    return q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)
  bits = np.packbits(embeddings > 0, axis=-1)
  return (bits - 128).astype(np.int8) if precision == "binary" else bits


def nbytes(precision: str, rows: int, width: int) -> int:
  """The bytes of `rows` embeddings `width` wide at `precision` (ranges not counted)."""
  per_row = 4 * width if precision == "float32" else width if precision in SCALAR else (width + 7) // 8
  return rows * per_row


# ------------------------------------------------------------------------------------------- calibration file


def load_calibration(path: str, flag: str = "--calibration") -> np.ndarray:
  """A .npy of float embeddings [n, d] (of the same model), read without pickles; a one-line error otherwise."""
  if not files.isfile(path):
    raise QuantizeError(f"{flag} {path}: no such file")
  try:
    array = np.load(io.BytesIO(files.read_bytes(path)), allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise QuantizeError(f"{flag} {path}: not a .npy array of embeddings ({str(e)[:120]})") from None
  if isinstance(array, np.lib.npyio.NpzFile) or array.ndim != 2 or not len(array) or array.dtype.kind != "f":
    raise QuantizeError(f"{flag} {path}: not a 2-D float array of embeddings [rows, width]")
  if not np.all(np.isfinite(array)):
    raise QuantizeError(f"{flag} {path}: holds values that are not finite")
  return array.astype(np.float32)


def check_width(calibration: np.ndarray | None, width: int, flag: str = "--calibration") -> None:
  if calibration is not None and calibration.shape[-1] != width:
    raise QuantizeError(f"{flag}: embeddings {calibration.shape[-1]} wide, and this model's are {width} wide")


def store_key(key: dict, precision: str, calibration: np.ndarray | None) -> dict:
  """A block folder's manifest for this precision (a float32 run's is unchanged) and calibration."""
  check_precision(precision)
  if precision == "float32":
    return key
  out = {**key, "precision": precision}
  if calibration is not None and precision in SCALAR:
    out["calibration"] = hashlib.sha256(np.ascontiguousarray(calibration, np.float32).tobytes()).hexdigest()
  return out


# ------------------------------------------------------------------------------------------------- the blocks


def corpus_blocks(embed: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str], block: int, precision: str,
                  calibration: np.ndarray | None = None, store=None, select: Callable[[int], bool] | None = None
                  ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
  """(codes, ranges) of each block: its embeddings quantized at `precision`, int8 / uint8 with the ranges of
  `calibration` (every block the same), else of the block's own embeddings. With a `store` each block is kept as
  an .npz (embeddings, precision, ranges) and a rerun reads it back."""
  fixed = ranges_of(None, calibration) if calibration is not None and precision in SCALAR else None
  if calibration is not None and len(texts):  # the width, before a whole block is embedded
    check_width(calibration, np.asarray(embed(texts[:1])).shape[1])

  def encode(chunk: Sequence[str]) -> dict:
    vectors = np.asarray(embed(chunk), np.float32)
    check_width(calibration, vectors.shape[1])
    ranges = None
    if precision in SCALAR:  # one row: min == max, every step 1 (sentence-transformers' zero-step rule)
      ranges = fixed if fixed is not None else np.vstack((vectors.min(0), vectors.max(0)))
    held = {"embeddings": quantize(vectors, precision, ranges), "precision": np.array(precision)}
    if ranges is not None:
      held["ranges"] = np.asarray(ranges, np.float32)
    return held

  for b, held in blocks.each_block(encode, texts, block, store, select):
    if not isinstance(held, dict) or str(held.get("precision")) != precision:
      raise QuantizeError(f"{store.path(b, '.npz')}: not a {precision} block; delete it to embed that block again")
    yield held["embeddings"], held.get("ranges")


# ------------------------------------------------------------------------------------------------- the search


@functools.lru_cache(maxsize=None)
def _block_fn(precision: str, k: int, rescore: bool):
  """jit(q [Q, d] float32, codes [N, c], ranges [2, d], valid [N]) -> the block's best k by the quantized score:
  (quantized score, row, rescored score), each [Q, k]. Hamming distances score as their negatives."""
  hi = jax.lax.Precision.HIGHEST

  def f(q, codes, ranges, valid):
    d = q.shape[1]
    if precision in SCALAR:
      starts = ranges[0]
      steps = (ranges[1] - starts) / 255
      steps = jnp.where(steps == 0, 1, steps)
      qq = jnp.clip(jnp.floor((q - starts) / steps), 0, 255).astype(jnp.int32)
      cq = codes.astype(jnp.int32)
      if precision == "int8":
        qq = qq - 128
      score = jax.lax.dot(qq, cq.T, preferred_element_type=jnp.int32).astype(jnp.float32)
      doc = (cq + (128 if precision == "int8" else 0)).astype(jnp.float32) * steps + starts
    else:
      raw = codes.astype(jnp.uint8) if precision == "ubinary" else (codes.astype(jnp.int32) + 128).astype(jnp.uint8)
      bits = jnp.unpackbits(raw, axis=-1).astype(jnp.float32)
      qbits = jnp.unpackbits(jnp.packbits(q > 0, axis=-1), axis=-1).astype(jnp.float32)
      common = jnp.dot(qbits, bits.T, precision=hi)
      score = -(qbits.sum(1)[:, None] + bits.sum(1)[None, :] - 2 * common)  # -Hamming
      doc = bits[:, :d]
    score = jnp.where(valid[None, :], score, -jnp.inf)
    top, rows = jax.lax.top_k(score, min(k, codes.shape[0]))
    if not rescore:
      return top, rows, top
    exact = jnp.dot(q, doc.T, precision=hi)
    return top, rows, jnp.take_along_axis(exact, rows, axis=1)

  return jax.jit(f)


def search(queries: np.ndarray, doc_blocks: Iterable[tuple[np.ndarray, np.ndarray | None]], k: int,
           precision: str, rescore_multiplier: int = 2, query_block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
  """Top-k (scores, corpus rows) [Q, <=k] of float `queries` over a corpus of (codes, ranges) blocks at
  `precision`: the best k x `rescore_multiplier` by the quantized score, ranked by the float query's score against
  each candidate (`rescore_multiplier` 0: the best k by the quantized score, which are their scores; Hamming
  distances as negatives)."""
  check_precision(precision)
  if precision == "float32":
    raise QuantizeError("search() is for a quantized corpus; a float32 one is retrieval.search's")
  if isinstance(rescore_multiplier, bool) or not isinstance(rescore_multiplier, int) or rescore_multiplier < 0:
    raise QuantizeError(f"--rescore_multiplier {rescore_multiplier!r}: an integer >= 1 (0: no rescoring)")
  rescore = rescore_multiplier > 0
  kc = k * rescore_multiplier if rescore else k
  f = _block_fn(precision, kc, rescore)
  queries = np.asarray(queries, np.float32)
  best = [np.zeros((len(queries), 0), t) for t in (np.float32, np.int64, np.float32)]
  start = 0
  for codes, ranges in doc_blocks:
    n = len(codes)
    if ranges is None and precision in SCALAR:
      raise QuantizeError(f"a {precision} block without its ranges: pass the ranges it was quantized with")
    ranges = np.zeros((2, queries.shape[1]), np.float32) if ranges is None else np.asarray(ranges, np.float32)
    parts = [f(queries[q0:q0 + query_block], codes, ranges, np.ones(n, bool))
             for q0 in range(0, len(queries), query_block)]
    new = [np.concatenate([np.asarray(p[j]) for p in parts]) for j in range(3)]
    new[1] = new[1].astype(np.int64) + start
    both = [np.concatenate([a, b], 1) for a, b in zip(best, new)]
    order = np.argsort(-both[0], axis=1, kind="stable")[:, :kc]  # ties: earlier rows first
    best = [np.take_along_axis(a, order, 1) for a in both]
    start += n
  scores, rows = best[2].astype(np.float64), best[1]
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)
