"""Cross-encoder rerankers, one score a (query, document) pair: `encoder` (CrossEncoder: load, predict, rerank TREC
runs, folders in and out) and `task` (the fine-tuning kind, `task=rerank`). Imports the shared modules and `dense`,
never another kind."""
