"""A PyLate ColBERT folder written by PyLate itself (its sentence-transformers 5.3 layout: Transformer, a Dense
projection without bias, PyLate's query / document prefixes and [MASK] query expansion), beside its own token
vectors for queries and documents and their MaxSim scores."""
from __future__ import annotations

import os

import numpy as np
import torch
import write_st
import zoo_common as zc


def write_all(root: str, tmp: str) -> None:
  from pylate import models
  base = write_st.hf_base(tmp)
  out = zc.fresh(os.path.join(root, "pylate-colbert"))
  torch.manual_seed(4)
  model = models.ColBERT(model_name_or_path=base, embedding_size=16, query_length=12, document_length=20,
                         device="cpu")
  model.save(out)
  model = models.ColBERT(model_name_or_path=out, device="cpu")
  q = {f"q_{i}": np.asarray(v, np.float32) for i, v in enumerate(model.encode(zc.TEXTS, is_query=True))}
  d = {f"d_{i}": np.asarray(v, np.float32) for i, v in enumerate(model.encode(zc.TEXTS, is_query=False))}
  zc.record(out, "pylate-colbert", "bert", {"embeddings": "equal"},
            {**q, **d, "maxsim": write_st._maxsim(q, d)})
