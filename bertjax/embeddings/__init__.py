"""Embedding models, whole: the pooling model (`model`), contrastive losses (`losses`), the task kind that trains
them through the one loop (`task`), encoding raw text (`encoder`), exact search and BEIR evaluation
(`retrieval`), and sentence-transformers folders in and out (`folders`).

    from bertjax import embeddings
    enc = embeddings.Encoder.load("all-MiniLM-L6-v2")      # a sentence-transformers folder, HF folder or workdir
    vectors = enc.encode(["a sentence", "another one"])   # [2, D] float32
"""
from bertjax.embeddings.encoder import Encoder, beir_scores, embed_corpus, sts_scores

__all__ = ["Encoder", "beir_scores", "embed_corpus", "sts_scores"]
