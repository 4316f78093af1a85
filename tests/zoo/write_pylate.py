"""PyLate ColBERT folders written by PyLate itself (its sentence-transformers 5.3 layout: Transformer, a Dense
projection without bias, PyLate's query / document prefix tokens and [MASK] query expansion), each beside its own
token vectors for queries and documents and their MaxSim scores: PyLate's defaults ("[Q] " / "[D] ", expansion
not attended, punctuation skiplist), a "[unused0]" query prefix with no document prefix, attended expansion and a
skiplist of words, and one without query expansion."""
from __future__ import annotations

import os

import numpy as np
import torch
import write_st
import zoo_common as zc

VARIANTS = {
    "pylate-colbert": dict(query_length=12, document_length=20),
    "pylate-colbert-unused0-attend-skipwords": dict(
        query_length=10, document_length=16, query_prefix="[unused0]", document_prefix="",
        attend_to_expansion_tokens=True, skiplist_words=["the", "of", ".", "zzzz"]),
    "pylate-colbert-no-expansion": dict(query_length=8, document_length=14, do_query_expansion=False),
}


def write_all(root: str, tmp: str) -> None:
  from pylate import models
  base = write_st.hf_base(tmp)
  for name, kw in VARIANTS.items():
    out = zc.fresh(os.path.join(root, name))
    torch.manual_seed(4)
    model = models.ColBERT(model_name_or_path=base, embedding_size=16, device="cpu", **kw)
    zc.widen(model[1], 4)  # PyLate's Dense projection
    model.save(out)
    model = models.ColBERT(model_name_or_path=out, device="cpu")
    q = {f"q_{i}": np.asarray(v, np.float32) for i, v in enumerate(model.encode(zc.TEXTS, is_query=True))}
    d = {f"d_{i}": np.asarray(v, np.float32) for i, v in enumerate(model.encode(zc.TEXTS, is_query=False))}
    zc.record(out, "pylate-colbert", "bert", {"embeddings": "equal"}, {**q, **d, "maxsim": write_st._maxsim(q, d)},
              settings=kw)
