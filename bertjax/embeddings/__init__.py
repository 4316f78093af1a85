"""Embedding models, whole. The package is layered, bottom to top (tests/test_architecture.py holds it):

- shared modules, importing no kind: `model` (the pooling model), `folders` (sentence-transformers folders in and
  out), `losses` (contrastive losses), `blocks` (resumable block stores), `buckets` (padded lengths), `quantize`,
  `retrieval` (exact search, BEIR evaluation), `distill` (reading teacher scores, the distillation losses);
- `dense`: `dense.encoder` (the dense `Encoder`, STS scores, corpus embedding), `dense.task` (`task=pairs`);
- the other kinds, each on the shared modules and `dense` and never on one another: `sparse` (`encoder`,
  `folders`, `task`), `multivector` (`encoder`, `task`), `rerank` (`encoder`, `task`);
- tools over every kind: `kinds` (which kind a model is, read once; each kind's search and rules), `teacher`
  (scoring a training file with a teacher), `mining` (hard negatives), `suite` (NanoBEIR-style suites),
  `mteb_model` (the MTEB adapter), and this module's public names.

    from bertjax import embeddings
    enc = embeddings.Encoder.load("all-MiniLM-L6-v2")      # a sentence-transformers folder, HF folder or workdir
    vectors = enc.encode(["a sentence", "another one"])   # [2, D] float32
"""
from bertjax.embeddings.dense.encoder import Encoder, embed_corpus, sts_scores
from bertjax.embeddings.kinds import beir_scores, kind_of
from bertjax.embeddings.retrieval import Options

__all__ = ["Encoder", "Options", "beir_scores", "embed_corpus", "kind_of", "sts_scores"]
