"""Hard-negative mining as sentence-transformers' `util.mine_hard_negatives` does it: each distinct anchor is
scored against a corpus (the positives, or a corpus given beside them: both deduplicated), its best
`range_max + max_positives` documents kept, optionally re-scored by a cross-encoder, the positives, the margins
and the score bounds struck out, ranks `range_min`..`range_max` kept, and `num_negatives` of them taken (the top
ones, or a random sample), written as triplets, n-tuples, labelled pairs or labelled lists.

    enc = Encoder.load("all-MiniLM-L6-v2")
    rows = mine_hard_negatives(enc, anchors, positives, num_negatives=3, relative_margin=0.05)

The corpus is embedded `block` documents at a time, each block's rows split over this host's devices, with a
running top-k; with `out` (a local or gs:// folder) each finished block is kept there (`blocks.BlockStore`), so a
killed run resumes at its first missing block.
"""
from __future__ import annotations

import collections
import random
from typing import Callable, Sequence

import jax
import numpy as np

from bertjax import errors
from bertjax.core import scores as scores_lib
from bertjax.embeddings import blocks as blocks_lib
from bertjax.embeddings import retrieval

FORMATS = ("triplet", "n-tuple", "n-tuple-scores", "labeled-pair", "labeled-list")
STRATEGIES = ("top", "random")


class MiningError(errors.ConfigError):
  """Mining options that cannot work together, or data mining cannot use."""


def check_options(num_negatives: int = 3, range_min: int = 0, range_max: int | None = None,
                  sampling_strategy: str = "top", output_format: str = "triplet", batch_size: int = 32,
                  block: int = 65536) -> None:
  """What can be said of the options before anything is read (each error names its option)."""
  if sampling_strategy not in STRATEGIES:
    raise MiningError(f"--sampling_strategy {sampling_strategy!r}: one of {', '.join(STRATEGIES)}")
  if output_format not in FORMATS:
    raise MiningError(f"--output_format {output_format!r}: one of {', '.join(FORMATS)}")
  for name, value, low in (("num_negatives", num_negatives, 1), ("range_min", range_min, 0),
                           ("batch_size", batch_size, 1), ("block", block, 1)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise MiningError(f"--{name} must be an integer >= {low}, got {value!r}")
  if range_max is not None and (isinstance(range_max, bool) or not isinstance(range_max, int)):
    raise MiningError(f"--range_max must be an integer, got {range_max!r}")
  if range_max is not None and range_min >= range_max:
    raise MiningError(f"--range_min {range_min} must be smaller than --range_max {range_max}")
  if range_max is not None and num_negatives > range_max - range_min:
    raise MiningError(f"--num_negatives {num_negatives}: only {range_max - range_min} candidates remain after "
                      f"skipping the first --range_min {range_min} of --range_max {range_max}")


def resolve_prompt(prompts: dict, name: str | None, text: str | None, flag: str) -> str | None:
  """A raw prompt wins; a prompt name is looked up in the model's prompts; None: the encoder's own."""
  if text is not None:
    return text
  if name is None:
    return None
  if name not in prompts:
    raise MiningError(f"--{flag} {name!r}: the model has no such prompt (it has {sorted(prompts) or 'none'})")
  return prompts[name]


def top_candidates(encoder, queries: Sequence[str], corpus: Sequence[str], k: int, wanted: Sequence[int],
                   query_prompt=None, corpus_prompt=None, batch_size: int = 32, block: int = 65536, out: str = "",
                   overwrite: bool = False, log: Callable = print):
  """(scores [Q, k], corpus rows [Q, k] (-1 where the corpus is short), the embeddings of the corpus rows
  `wanted`, the query embeddings): cosine similarity top-k over the corpus in blocks, sharded over this host's
  devices."""
  q = scores_lib.unit_rows(encoder.encode_query(list(queries), batch_size, prompt=query_prompt))
  store = None
  if out:
    prompt = encoder.prompts.document if corpus_prompt is None else corpus_prompt
    store = blocks_lib.BlockStore(out, blocks_lib.corpus_key(f"{encoder.fingerprint}|{prompt}|mine", corpus, block),
                                  "--cache_dir", overwrite)
    log(f"corpus embeddings in {out}: {len(store.done_blocks(-(-len(corpus) // block)))} blocks done before",
        flush=True)
  wanted = np.asarray(sorted(set(wanted)), np.int64)
  kept = {}

  def embed(texts):
    encoder.lengths.reset()  # each block padded as a fresh run pads it: a resumed run mines the same
    return scores_lib.unit_rows(encoder.encode_document(list(texts), batch_size, prompt=corpus_prompt))

  def blocks():
    for b, vectors in enumerate(retrieval.corpus_blocks(embed, corpus, block, store)):
      lo = b * block
      for r in wanted[(wanted >= lo) & (wanted < lo + len(vectors))]:
        kept[int(r)] = vectors[r - lo]
      yield vectors
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), ("docs",))
  s, rows = retrieval.search(q, blocks(), k, mesh=mesh)
  if s.shape[1] < k:  # fewer documents than k: pad as sentence-transformers does, score -inf and row -1
    pad = k - s.shape[1]
    s = np.concatenate([s, np.full((len(q), pad), -np.inf, np.float32)], 1)
    rows = np.concatenate([rows, np.full((len(q), pad), -1, np.int64)], 1)
  return s.astype(np.float32), rows, kept, q


def mine_hard_negatives(encoder, anchors: Sequence[str], positives: Sequence[str],
                        corpus: Sequence[str] | None = None, *, cross_encoder=None, range_min: int = 0,
                        range_max: int | None = None, max_score: float | None = None, min_score: float | None = None,
                        absolute_margin: float | None = None, relative_margin: float | None = None,
                        num_negatives: int = 3, sampling_strategy: str = "top", query_prompt_name: str | None = None,
                        query_prompt: str | None = None, corpus_prompt_name: str | None = None,
                        corpus_prompt: str | None = None, prompts: dict | None = None, include_positives: bool = False,
                        output_format: str = "triplet", output_scores: bool = False, batch_size: int = 32,
                        block: int = 65536, out: str = "", overwrite: bool = False, seed: int | None = None,
                        anchor_column: str = "anchor", positive_column: str = "positive",
                        log: Callable = print) -> list[dict]:
  """The rows of sentence-transformers' mine_hard_negatives on the same pairs and options (its dataset as a list
  of dicts, columns named as it names them). `prompts`: the model's named prompts (for the *_prompt_name
  options); `out`: a folder keeping the corpus embeddings block by block; `seed`: random sampling's seed."""
  check_options(num_negatives, range_min, range_max, sampling_strategy, output_format, batch_size, block)
  if len(anchors) != len(positives) or not len(anchors):
    raise MiningError(f"mining needs (anchor, positive) pairs: {len(anchors)} anchors, {len(positives)} positives")
  if corpus is not None and not len(corpus):
    raise MiningError("--corpus holds no documents")
  if output_format == "n-tuple-scores":
    output_format, output_scores = "n-tuple", True
  if include_positives:
    output_format = "n-tuple"  # keeps the ranking order, as sentence-transformers forces it
  counts = collections.Counter(anchors)
  max_positives = max(counts.values())
  filtered = (absolute_margin is not None or relative_margin is not None or max_score is not None
              or (cross_encoder is not None and min_score is not None))
  if range_max is None:
    range_max = range_min + num_negatives * (10 if filtered else 1) + max_positives
    check_options(num_negatives, range_min, range_max)
  prompts = prompts or {}
  qp = resolve_prompt(prompts, query_prompt_name, query_prompt, "query_prompt_name")
  cp = resolve_prompt(prompts, corpus_prompt_name, corpus_prompt, "corpus_prompt_name")
  docs = list(dict.fromkeys(list(positives if corpus is None else corpus) + list(positives)))
  doc_row = {t: i for i, t in enumerate(docs)}
  queries = list(dict.fromkeys(anchors))
  query_row = {t: i for i, t in enumerate(queries)}
  pos_rows = [[] for _ in queries]
  for a, p in zip(anchors, positives):
    if doc_row[p] not in pos_rows[query_row[a]]:
      pos_rows[query_row[a]].append(doc_row[p])
  k = range_max + max_positives
  s, rows, kept, q = top_candidates(encoder, queries, docs, k, [r for p in pos_rows for r in p], qp, cp, batch_size,
                                    block, out, overwrite, log)
  pair_q = [qi for qi, p in enumerate(pos_rows) for _ in p]
  pair_d = [r for p in pos_rows for r in p]
  pos_scores = np.einsum("ij,ij->i", q[pair_q], np.stack([kept[r] for r in pair_d])).astype(np.float32)
  if cross_encoder is not None and (filtered or min_score is not None):
    s, pos_scores = _rescore(cross_encoder, queries, docs, rows, pair_q, pair_d, batch_size)
  s[rows == -1] = -np.inf
  if not include_positives:
    s[np.stack([np.isin(rows[qi], pos_rows[qi]) for qi in range(len(queries))])] = -np.inf
  n_pos = [len(p) for p in pos_rows]
  hardest = np.array([pos_scores[sum(n_pos[:qi]):sum(n_pos[:qi + 1])].min() for qi in range(len(queries))],
                     np.float32)[:, None]
  if absolute_margin is not None:
    s[s + np.float32(absolute_margin) > hardest] = -np.inf
  if relative_margin is not None:
    s[s > hardest - np.abs(hardest) * np.float32(relative_margin)] = -np.inf
  if max_score is not None:
    s[s > np.float32(max_score)] = -np.inf
  if min_score is not None:
    s[s < np.float32(min_score)] = -np.inf
  order = np.argsort(-s, axis=1, kind="stable")[:, :range_max][:, range_min:]
  neg_s, neg_i = np.take_along_axis(s, order, 1), np.take_along_axis(rows, order, 1)
  if sampling_strategy == "top":
    neg_s, neg_i = neg_s[:, :num_negatives], neg_i[:, :num_negatives]
  else:
    neg_s, neg_i = _sample(neg_s, neg_i, num_negatives, random.Random(seed))
  texts = (queries, docs, pos_rows, pos_scores, anchor_column, positive_column)
  out_rows = _format(output_format, output_scores, texts, neg_s, neg_i)
  found = int(np.isfinite(neg_s).sum())
  log(f"mined {found} negatives for {len(queries)} anchors ({len(anchors)} pairs) over {len(docs)} documents; "
      f"{len(out_rows)} rows ({output_format})", flush=True)
  return out_rows


def _rescore(ce, queries, docs, rows, pair_q, pair_d, batch_size):
  """The candidates' and the positives' scores by the cross-encoder (every candidate, as sentence-transformers
  scores them: a padding row -1 reads the last document and is struck out afterwards)."""
  pairs = [(queries[qi], docs[r]) for qi in range(len(queries)) for r in rows[qi]]
  s = np.asarray(ce.predict(pairs, batch_size=batch_size), np.float32).reshape(rows.shape)
  pos = np.asarray(ce.predict([(queries[qi], docs[r]) for qi, r in zip(pair_q, pair_d)], batch_size=batch_size),
                   np.float32).reshape(-1)
  return s, pos


def _sample(neg_s, neg_i, n, rng):
  """`n` of each row's finite candidates at random (all the row has, padded with struck-out ones, when fewer),
  then sorted by score, best first."""
  out_s, out_i = [], []
  for sr, ir in zip(neg_s, neg_i):
    options = max(len(sr) - int(np.isinf(sr).sum()), n)
    pick = np.array(rng.sample(range(options), k=n))
    order = np.argsort(-sr[pick], kind="stable")
    out_s.append(sr[pick][order])
    out_i.append(ir[pick][order])
  return np.stack(out_s), np.stack(out_i)


def _format(output_format, output_scores, texts, neg_s, neg_i) -> list[dict]:
  """sentence-transformers' output rows for the format (see its mine_hard_negatives)."""
  queries, docs, pos_rows, pos_scores, a_col, p_col = texts
  out, pi = [], 0
  for qi, q in enumerate(queries):
    keep = [(docs[r], float(v)) for r, v in zip(neg_i[qi], neg_s[qi]) if np.isfinite(v)]
    if output_format == "labeled-pair":
      for r in pos_rows[qi]:
        out.append({a_col: q, p_col: docs[r], **({"score": float(pos_scores[pi])} if output_scores else {"label": 1})})
        pi += 1
      out += [{a_col: q, p_col: d, **({"score": v} if output_scores else {"label": 0})} for d, v in keep]
      continue
    for r in pos_rows[qi]:
      ps = float(pos_scores[pi])
      pi += 1
      if output_format == "triplet":
        out += [{a_col: q, p_col: docs[r], "negative": d, **({"scores": [ps, v]} if output_scores else {})}
                for d, v in keep]
      elif output_format == "n-tuple" and len(keep) == len(neg_s[qi]):
        row = {a_col: q, p_col: docs[r], **{f"negative_{j}": d for j, (d, _) in enumerate(keep, 1)}}
        out.append({**row, "scores": [ps] + [v for _, v in keep]} if output_scores else row)
      elif output_format == "labeled-list" and keep:
        extra = {"scores": [ps] + [v for _, v in keep]} if output_scores else {"labels": [1] + [0] * len(keep)}
        out.append({a_col: q, p_col: [docs[r]] + [d for d, _ in keep], **extra})
  return out
