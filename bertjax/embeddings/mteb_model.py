"""A bertjax embedding model as an MTEB (v2) model: `mteb.evaluate` takes it as it takes a SentenceTransformer.

    import mteb
    from bertjax.embeddings.mteb_model import MtebEncoder
    model = MtebEncoder("all-MiniLM-L6-v2/")           # a sentence-transformers folder, HF folder or workdir
    results = mteb.evaluate(model, tasks=mteb.get_tasks(tasks=["SciFact"]))

It follows MTEB's `EncoderProtocol`: `encode(inputs: DataLoader[BatchedInput], *, task_metadata, hf_split,
hf_subset, prompt_type, **kwargs)` returns one row per text as NumPy; queries and documents take the prompt MTEB
picks from `model_prompts` (by default the folder's own `query` / `document` prompts; a dict given may also key
prompts by task name or task type, as MTEB's SentenceTransformer wrapper reads them), else the folder's query /
document prompt, as sentence-transformers' encode_query / encode_document do; `similarity` and
`similarity_pairwise` are the model's score function (cosine for a dense model, dot product for a sparse one).
mteb is imported only when an MTEB object is needed, so bertjax does not depend on it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from bertjax.core import files
from bertjax.embeddings import kinds
from bertjax.embeddings.dense.encoder import Encoder
from bertjax.embeddings.model import Pooling
from bertjax.embeddings.sparse import encoder as sparse


def _texts(inputs) -> list[str]:
  """The texts of MTEB's batches (dicts with a `text` column), in order; a plain list of strings is taken as is."""
  if isinstance(inputs, (list, tuple)) and all(isinstance(t, str) for t in inputs):
    return list(inputs)
  return [t for batch in inputs for t in batch["text"]]


def _rows(x) -> np.ndarray:
  """A [N, D] float32 array of NumPy or torch embeddings (one row when given a vector)."""
  if hasattr(x, "detach"):
    x = x.detach().cpu().float().numpy()
  x = np.asarray(x, np.float32)
  return x[None, :] if x.ndim == 1 else x


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class MtebEncoder:
  """A dense (`Encoder`) or sparse (`SparseEncoder`) bertjax model in MTEB's encoder protocol."""

  def __init__(self, model_name: str, revision: str | None = None, *, device: str | None = None,
               pooling: Pooling | None = None, model_prompts: dict[str, str] | None = None, batch_size: int = 32,
               **kwargs: Any) -> None:
    self.model_name, self.batch_size = model_name, batch_size
    self.is_sparse = kinds.kind_of(model_name) == "sparse"
    self.model = sparse.SparseEncoder.load(model_name) if self.is_sparse else Encoder.load(model_name, pooling)
    self.revision = revision or self.model.fingerprint[:12]
    own = getattr(self.model, "prompts", None)
    found = {"query": own.query, "document": own.document} if own is not None else {}
    self.model_prompts = dict(model_prompts) if model_prompts is not None else {
        k: v for k, v in found.items() if v}

  @property
  def similarity_fn_name(self) -> str:
    return {"cos": "cosine", "dot": "dot"}[kinds.SCORES["sparse" if self.is_sparse else "dense"][0]]

  @property
  def mteb_model_meta(self):
    from mteb.models.model_meta import ModelMeta
    name = files.basename(self.model_name.rstrip("/")) or "model"
    return ModelMeta.create_empty(overwrites={
        "name": f"bertjax/{name}", "revision": self.revision, "similarity_fn_name": self.similarity_fn_name,
        "max_tokens": getattr(self.model, "max_seq_length", None), "framework": ["JAX"],
        "modalities": ["text"]})

  def _prompt(self, task_metadata, prompt_type) -> str | None:
    """The prompt MTEB's rules pick from `model_prompts` for this task and side, else None (the folder's own)."""
    if not self.model_prompts or task_metadata is None:
      return None
    from mteb.models.abs_encoder import get_prompt_name
    name = get_prompt_name(self.model_prompts, task_metadata, prompt_type)
    return self.model_prompts.get(name) if name else None

  def encode(self, inputs, *, task_metadata=None, hf_split: str = "", hf_subset: str = "", prompt_type=None,
             **kwargs: Any) -> np.ndarray:
    """One embedding per text of `inputs`: queries by encode_query, documents by encode_document, anything else
    (STS, classification) by encode with the folder's default prompt."""
    texts = _texts(inputs)
    batch_size = int(kwargs.get("batch_size") or self.batch_size)
    prompt = self._prompt(task_metadata, prompt_type)
    side = getattr(prompt_type, "value", prompt_type)
    if side == "query":
      return np.asarray(self.model.encode_query(texts, batch_size, prompt=prompt), np.float32)
    if side == "document":
      return np.asarray(self.model.encode_document(texts, batch_size, prompt=prompt), np.float32)
    return np.asarray(self.model.encode(texts, batch_size, prompt=prompt), np.float32)

  def similarity(self, embeddings1, embeddings2) -> np.ndarray:
    """[N1, N2] scores: cosine for a dense model, dot product for a sparse one."""
    a, b = _rows(embeddings1), _rows(embeddings2)
    if not self.is_sparse:
      a, b = _unit(a), _unit(b)
    return a @ b.T

  def similarity_pairwise(self, embeddings1, embeddings2) -> np.ndarray:
    """[N] scores of each row of `embeddings1` with the same row of `embeddings2`."""
    a, b = _rows(embeddings1), _rows(embeddings2)
    if not self.is_sparse:
      a, b = _unit(a), _unit(b)
    return np.sum(a * b, axis=1)

  def __repr__(self) -> str:
    return f"MtebEncoder({self.model_name!r})"

