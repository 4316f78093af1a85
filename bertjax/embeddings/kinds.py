"""The embedding model kinds, told apart in one place: `kind_of` reads which kind a path holds, `load` reads it
with that kind's reader, `settle` fills in what the kind decides (its block, its score) and refuses what it cannot
take, and `beir_scores` searches a BEIR folder as the kind searches. The kinds' own modules (dense/, sparse/,
multivector/) never test for one another; a model travels with its kind from `kind_of` on.

    kind = kinds.kind_of(path)                   # dense, sparse, multivector, or rerank (a cross-encoder)
    opts = kinds.settle(kind, retrieval.Options(top_k=100), path)
    model = kinds.load(path, kind, opts)
    print(kinds.beir_scores(model, kind, "scifact/", opts))
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bertjax import errors
from bertjax.core import scores
from bertjax.embeddings import blocks, quantize, retrieval
from bertjax.embeddings.dense import encoder as dense
from bertjax.embeddings.model import Pooling
from bertjax.embeddings.multivector import encoder as multivector
from bertjax.embeddings.rerank import encoder as rerank
from bertjax.embeddings.sparse import encoder as sparse

KINDS = ("dense", "sparse", "multivector")  # the kinds that embed texts; "rerank" re-scores pairs
WHAT = {"dense": "a dense embedding model", "sparse": "a sparse encoder", "multivector": "a multi-vector encoder",
        "rerank": "a cross-encoder"}
BLOCK = {"dense": dense.BLOCK, "sparse": sparse.BLOCK, "multivector": multivector.BLOCK}
# The score functions a kind searches by, its default first. A sparse encoder's term vectors score by dot product
# only, as its training scored them (cosine would rescale each vector's weights); a multi-vector encoder scores
# by its folder's MaxSim, which no option chooses.
SCORES = {"dense": ("cos", "dot"), "sparse": ("dot",), "multivector": ()}
# The options a kind has no use for, each with why: one given (not at its default) is one line naming it.
NOT_FOR = {
    "dense": {"max_active_dims": "it prunes a sparse encoder's term vectors"},
    "sparse": {"pooling": "it pools by its own SpladePooling",
               "precision": "its term vectors cannot be quantized"},
    "multivector": {"pooling": "it keeps a vector per token", "cache_dir": "its token vectors are not cached",
                    "max_active_dims": "it prunes a sparse encoder's term vectors",
                    "precision": "its token vectors cannot be quantized"},
}
_DEFAULTS = retrieval.Options()


def kind_of(path: str) -> str:
  """dense, sparse, multivector or rerank: which of bertjax's readers takes the model at `path`."""
  if sparse.SparseEncoder.is_model(path):
    return "sparse"
  if multivector.is_model(path):
    return "multivector"
  return "rerank" if rerank.CrossEncoder.is_reranker(path) else "dense"


def settle(kind: str, opts: retrieval.Options, model: str = "") -> retrieval.Options:
  """`opts` with the kind's block and score filled in (where None); an option the kind has no use for, a score
  it does not search by, or a cross-encoder (which embeds nothing) is one line, `model` named in it."""
  name = f"{WHAT[kind]} ({model})" if model else WHAT[kind]
  if kind not in KINDS:
    raise errors.ConfigError(f"{model or 'the model'} is a cross-encoder: it re-scores a run (python -m bertjax "
                             "embeddings rerank --model MODEL FOLDER RUN), it does not embed texts")
  for field, why in NOT_FOR[kind].items():
    if getattr(opts, field) != getattr(_DEFAULTS, field):
      raise errors.ConfigError(f"--{field}: not an option for {name}: {why}; leave it out")
  if opts.score is not None and opts.score not in SCORES[kind]:
    if kind == "sparse":
      raise errors.ConfigError("a sparse encoder scores by dot product: --score dot")
    if kind == "multivector":
      raise errors.ConfigError("a multi-vector encoder scores by MaxSim (its folder's similarity): leave out --score")
    raise errors.ConfigError(f"--score {opts.score!r}: {' or '.join(SCORES[kind])}")
  score = opts.score or (SCORES[kind] or (None,))[0]
  return dataclasses.replace(opts, block=BLOCK[kind] if opts.block is None else opts.block, score=score)


def load(path: str, kind: str, opts: retrieval.Options = _DEFAULTS):
  """The model at `path` read by its kind's reader, with the options that shape its vectors (a dense model's
  pooling, a sparse encoder's max_active_dims)."""
  if kind == "sparse":
    return sparse.SparseEncoder.load(path, max_active_dims=opts.max_active_dims or None)
  if kind == "multivector":
    return multivector.MultiVectorEncoder.load(path)
  return dense.Encoder.load(path, Pooling(mode=opts.pooling) if opts.pooling else None)


def beir_scores(model, kind: str, folder: str | retrieval.Beir, opts: retrieval.Options = _DEFAULTS) -> dict:
  """nDCG@10, MRR@10, Recall@100 and MAP of exact search over a BEIR folder's corpus as `kind` searches (cosine
  or dot product of vectors, MaxSim of token vectors), the run (top `opts.top_k` per query) written to
  `opts.run_file` in TREC format; `opts.cache_dir` keeps the corpus embeddings block by block so an interrupted run
  resumes (`blocks.BlockStore`). Neither is written over when it holds what this command did not write, unless
  `opts.overwrite`. Queries take `opts.query_prefix` and documents `opts.doc_prefix` before their text; None: the
  model's own prompts. A `precision` other than float32 searches the corpus quantized, with rescoring."""
  opts = settle(kind, opts)
  dense.check_sizes(top_k=opts.top_k, block=opts.block, batch_size=opts.batch_size)
  if opts.run_file:
    retrieval.check_run_file(opts.run_file, opts.overwrite)
  beir = folder if isinstance(folder, retrieval.Beir) else retrieval.read_beir(folder, opts.split)
  if kind == "multivector":
    s, rows, extra = *_maxsim_search(model, beir, opts), {}
  else:
    s, rows, extra = _vector_search(model, beir, opts, count_terms=kind == "sparse")
  run = retrieval.make_run(beir, s, rows)
  if opts.run_file:
    retrieval.write_trec(run, opts.run_file)
  return {**retrieval.evaluate_run(run, beir.qrels), "queries": len(beir.queries), "documents": len(beir.docs),
          "queries without judgements": beir.skipped_queries, "empty documents": beir.empty_docs, **extra}


def _vector_search(encoder, beir: retrieval.Beir, opts: retrieval.Options, count_terms: bool):
  """Exact top-k of one vector per text (a dense or sparse encoder's): (scores, rows, extra), where extra holds
  the mean non-zero terms per query and per document when `count_terms` (what an inverted index would hold)."""
  prep = scores.unit_rows if opts.score == "cos" else (lambda x: x)
  counts = {"query": [], "document": []}

  def counted(side, vectors):
    if count_terms:
      counts[side].append(np.count_nonzero(vectors, axis=1))
    return vectors
  doc_prompt = encoder.prompts.document if opts.doc_prefix is None else opts.doc_prefix
  store = None
  if opts.cache_dir:
    key = blocks.corpus_key(f"{encoder.fingerprint}|{doc_prompt}|{opts.score}", beir.docs, opts.block)
    store = blocks.BlockStore(opts.cache_dir, quantize.store_key(key, opts.precision, opts.calibration),
                              "--cache_dir", opts.overwrite)
  queries = counted("query", prep(encoder.encode_query(beir.queries, opts.batch_size, prompt=opts.query_prefix)))

  def embed(texts):
    if store is not None:
      encoder.lengths.reset()  # a stored block is padded as a fresh run pads it
    return prep(encoder.encode_document(texts, opts.batch_size, prompt=doc_prompt))
  if opts.precision != "float32":
    coded = quantize.corpus_blocks(embed, beir.docs, opts.block, opts.precision, opts.calibration, store)
    s, rows = quantize.search(queries, coded, opts.top_k, opts.precision, opts.rescore_multiplier)
  else:
    s, rows = retrieval.search(queries, (counted("document", b) for b in
                                         retrieval.corpus_blocks(embed, beir.docs, opts.block, store)), opts.top_k)
  extra = {f"{side} active dims": float(np.mean(np.concatenate(c))) for side, c in counts.items()} if count_terms \
      else {}
  return s, rows, extra


def _maxsim_search(model, beir: retrieval.Beir, opts: retrieval.Options):
  """Exact MaxSim top-k of a multi-vector encoder; the prefixes given replace its folder's prompts."""
  prompts = {k: v for k, v in (("query_prompt", opts.query_prefix), ("document_prompt", opts.doc_prefix))
             if v is not None}
  if prompts:
    model = dataclasses.replace(model, settings=dataclasses.replace(model.settings, **prompts))
  return multivector.search(model, beir.queries, beir.docs, opts.top_k, opts.block, opts.batch_size)
