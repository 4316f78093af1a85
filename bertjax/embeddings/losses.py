"""Contrastive losses for embedding models, over the whole global batch, and gradient caching.

`ranking_loss` is sentence-transformers' MultipleNegativesRankingLoss (InfoNCE with in-batch negatives): each
query's cosine similarities (times `scale`) to every document of the batch, its own positive the target; hard
negatives are extra documents; `symmetric` adds the documents -> queries direction (averaged). Under `jit` with
the batch sharded over a mesh, the similarity matrix spans the global batch: every shard's queries score against
every shard's documents (XLA gathers the embeddings), so the loss and gradients are those of one device holding the
whole batch. `cosent_loss` is CoSENT for scored pairs. `cached_value_and_grad` computes the loss of a batch too
large for memory in chunks (GradCache): embeddings without gradients, the loss and its gradient with respect to
the embeddings on the whole batch, then each chunk's backward pass with those gradients.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from bertjax.embeddings.model import matryoshka, normalize


def cosine_scores(a, b):
  """[A, B] cosine similarities."""
  return normalize(a) @ normalize(b).T


def candidates(row_keys, col_keys, row_partners, col_partners, col_weights):
  """[R, C] True where column c is a candidate of row r (R <= C; row r's own target is column r): its own column,
  and every other text once (the first real column of each text), except copies of its own target's text and
  the targets of other rows whose partner text is its own (rows with the same query: their positives are right
  answers too). `*_keys` hash each text, `*_partners` each row's other side, `col_weights` mark real columns. A
  batch without repeated texts keeps every real column: InfoNCE as sentence-transformers computes it; one with
  repeats scores each row as that loss would on the batch with the repeats taken out (its no-duplicates
  sampler's batch)."""
  r, c = row_keys.shape[0], col_keys.shape[0]
  cols = jnp.arange(c)
  own = cols[None, :] == jnp.arange(r)[:, None]
  real = col_weights > 0
  # A column repeats an earlier real column of the same text: only the first of each text is a candidate.
  earlier = (col_keys[:, None] == col_keys[None, :]) & (cols[:, None] < cols[None, :]) & real[:, None]
  first = ~jnp.any(earlier, axis=0)
  copy_of_own = col_keys[None, :] == row_keys[:, None]
  partner = jnp.zeros((r, c), bool).at[:, :r].set(row_partners[:, None] == col_partners[None, :])
  return own | (first[None, :] & ~copy_of_own & ~partner)


def ranking_loss(queries, documents, scale: float = 20.0, symmetric: bool = False, weights=None, doc_keys=None,
                 query_keys=None, per_row: bool = False, similarity: str = "cosine"):
  """InfoNCE over the batch: `queries` [B, d]; `documents` [B·(1+n), d], the B positives first and then n blocks
  of B hard negatives (row i's negatives at i + B, i + 2B, ...). `weights` [B] (0 for padding rows) leave rows out
  as queries and as documents. The mean over the weighted queries (`per_row`: each row's loss, [B]); `symmetric`
  averages it with positives -> queries (over the queries only, as sentence-transformers' per-direction form).

  Repeated texts: with `doc_keys` [B·(1+n)] and `query_keys` [B] (a hash of each text), each row's candidates are
  every distinct text once, less the false negatives (`candidates`); sentence-transformers keeps such rows out of
  a batch instead (its no-duplicates sampler). `similarity` "dot" scores raw dot products (sparse encoders)."""
  score = cosine_scores if similarity == "cosine" else (lambda a, b: a @ b.T)
  b = queries.shape[0]
  w = jnp.ones((b,), jnp.float32) if weights is None else weights.astype(jnp.float32)
  doc_w = jnp.tile(w, documents.shape[0] // b)
  keep = doc_w[None, :] > 0
  if doc_keys is not None:
    qk = query_keys if query_keys is not None else jnp.arange(b, dtype=doc_keys.dtype) - b  # no query repeats
    keep = keep & candidates(doc_keys[:b], doc_keys, qk, qk, doc_w)
  forward = _info_nce(scale * score(queries, documents), keep, w)
  if symmetric:
    back_keep = w[None, :] > 0
    if doc_keys is not None:
      back_keep = back_keep & candidates(qk, qk, doc_keys[:b], doc_keys[:b], w)
    forward = (forward + _info_nce(scale * score(documents[:b], queries), back_keep, w)) / 2
  return forward if per_row else jnp.sum(forward * w) / jnp.maximum(jnp.sum(w), 1.0)


def _info_nce(scores, keep, w):
  """Each row's -log softmax(scores over its kept columns)[its own column]; 0 for a padding row (weight 0), whose
  -inf - -inf is kept out of the value and the gradient."""
  b = scores.shape[0]
  scores = jnp.where(keep, scores, -jnp.inf)
  target = jnp.arange(b)
  return jnp.where(w > 0, jax.nn.logsumexp(jnp.where(w[:, None] > 0, scores, 0.0), axis=1)
                   - jnp.where(w > 0, scores[target, target], 0.0), 0.0)


def cosent_loss(a, b, labels, scale: float = 20.0, weights=None):
  """CoSENT: log(1 + Σ_{s_i > s_j} exp(scale·(cos_j − cos_i))) over every ordered pair of scored pairs whose gold
  scores differ (Su 2022; sentence-transformers' CoSENTLoss)."""
  cos = scale * jnp.sum(normalize(a) * normalize(b), axis=-1)
  w = jnp.ones_like(cos) if weights is None else weights.astype(jnp.float32)
  higher = (labels[:, None] > labels[None, :]) & (w[:, None] > 0) & (w[None, :] > 0)  # i better than j
  diff = jnp.where(higher, cos[None, :] - cos[:, None], -jnp.inf)
  return jax.nn.logsumexp(jnp.concatenate([jnp.zeros((1,)), diff.reshape(-1)]))


def matryoshka_loss(loss_fn: Callable, embeddings: Sequence, dims: Sequence[int], dim_weights=None):
  """Σ_k w_k · loss_fn(*(e[..., :k] for e in embeddings)): the loss at every truncated width (weights 1 by
  default), as sentence-transformers' MatryoshkaLoss wraps a loss."""
  dim_weights = dim_weights or [1.0] * len(dims)
  return sum(w * loss_fn(*(matryoshka(e, k) for e in embeddings)) for k, w in zip(dims, dim_weights))


def cached_value_and_grad(embed_fn: Callable, loss_fn: Callable, params, inputs: Sequence, chunk: int):
  """(loss, gradient w.r.t. params) of loss_fn(*[embed_fn(params, x) for x in inputs]) computed chunk by chunk.

  `inputs`: pytrees of arrays with a leading batch axis (e.g. the query and document batches); each is embedded in
  chunks of `chunk` rows without keeping activations, the loss and d loss / d embeddings are taken on the whole
  batch, and each chunk's vector-Jacobian product with its slice of those gradients is summed. Equal to
  `jax.value_and_grad` of the whole computation; peak memory is one chunk's activations (Gao et al. 2021)."""
  def chunks(x):
    n = jax.tree_util.tree_leaves(x)[0].shape[0]
    return [jax.tree_util.tree_map(lambda a, s=s: a[s:s + chunk], x) for s in range(0, n, chunk)]
  parts = [chunks(x) for x in inputs]
  # One compiled program per chunk shape (inside an outer jit these are inlined).
  embed = jax.jit(lambda p, c: jax.lax.stop_gradient(embed_fn(p, c)))
  chunk_grad = jax.jit(lambda p, c, g: jax.vjp(lambda q: embed_fn(q, c), p)[1](g)[0])
  embeddings = [jnp.concatenate([embed(params, c) for c in cs]) for cs in parts]
  loss, emb_grads = jax.value_and_grad(lambda es: loss_fn(*es))(embeddings)
  grads = jax.tree_util.tree_map(jnp.zeros_like, params)
  for cs, g in zip(parts, emb_grads):
    start = 0
    for c in cs:
      n = jax.tree_util.tree_leaves(c)[0].shape[0]
      grads = jax.tree_util.tree_map(jnp.add, grads, chunk_grad(params, c, g[start:start + n]))
      start += n
  return loss, grads
