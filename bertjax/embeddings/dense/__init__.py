"""Dense embedding models, one vector a text: `encoder` (load a sentence-transformers folder, HF folder or workdir,
embed texts; STS and BEIR evaluation, corpus embedding) and `task` (the contrastive fine-tuning kind, `task=pairs`).
Imports only the shared modules of `bertjax.embeddings`; the sparse, multi-vector and rerank kinds build on it."""
