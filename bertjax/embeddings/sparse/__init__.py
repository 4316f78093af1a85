"""Sparse (SPLADE) embedding models, one vocabulary-sized term vector a text: `encoder` (SparseEncoder: load,
encode, search, the SPLADE losses), `folders` (sentence-transformers SparseEncoder folders in and out) and `task`
(the fine-tuning kind, `task=sparse`). Imports the shared modules and `dense`, never another kind."""
