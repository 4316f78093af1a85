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

from bertjax.model.embedding import matryoshka, normalize


def cosine_scores(a, b):
  """[A, B] cosine similarities."""
  return normalize(a) @ normalize(b).T


def ranking_loss(queries, documents, scale: float = 20.0, symmetric: bool = False, weights=None, doc_keys=None,
                 query_keys=None):
  """InfoNCE over the batch: `queries` [B, d]; `documents` [B·(1+n), d], the B positives first and then n blocks
  of B hard negatives (row i's negatives at i + B, i + 2B, ...). `weights` [B] (0 for padding rows) leave rows out
  as queries and as documents. The mean over the weighted queries; `symmetric` averages it with positives ->
  queries (over the queries only, as sentence-transformers' per-direction form).

  False negatives: with `doc_keys` [B·(1+n)] and `query_keys` [B] (a hash of each text), a document is left out of
  row i's candidates when its text is row i's positive, or it is the positive of another row with row i's query:
  sentence-transformers keeps such rows out of a batch (its no-duplicates sampler); here they are masked."""
  b = queries.shape[0]
  w = jnp.ones((b,), jnp.float32) if weights is None else weights.astype(jnp.float32)
  scores = scale * cosine_scores(queries, documents)
  doc_w = jnp.tile(w, documents.shape[0] // b)
  scores = jnp.where(doc_w[None, :] > 0, scores, -jnp.inf)
  if doc_keys is not None:
    own = jnp.arange(documents.shape[0])[None, :] == jnp.arange(b)[:, None]
    dup = doc_keys[None, :] == doc_keys[:b][:, None]
    if query_keys is not None:
      same_query = jnp.zeros((b, documents.shape[0]), bool).at[:, :b].set(query_keys[None, :] == query_keys[:, None])
      dup = dup | same_query
    scores = jnp.where(dup & ~own, -jnp.inf, scores)
  target = jnp.arange(b)
  # A padding row (weight 0) has no candidates: its -inf - -inf is kept out of the sum (and of the gradient).
  forward = jnp.where(w > 0, jax.nn.logsumexp(jnp.where(w[:, None] > 0, scores, 0.0), axis=1)
                      - jnp.where(w > 0, scores[target, target], 0.0), 0.0)
  loss = jnp.sum(forward * w) / jnp.maximum(jnp.sum(w), 1.0)
  if not symmetric:
    return loss
  back = scale * cosine_scores(documents[:b], queries)
  back = jnp.where(w[None, :] > 0, back, -jnp.inf)
  backward = jnp.where(w > 0, jax.nn.logsumexp(jnp.where(w[:, None] > 0, back, 0.0), axis=1)
                       - jnp.where(w > 0, back[target, target], 0.0), 0.0)
  return (loss + jnp.sum(backward * w) / jnp.maximum(jnp.sum(w), 1.0)) / 2


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
