"""Multi-vector (ColBERT-style, late interaction) embedding models, one vector a token: `encoder`
(MultiVectorEncoder: load, encode, MaxSim scoring and exact search, folders in and out) and `task` (the fine-tuning
kind, `task=multivector`). Imports the shared modules and `dense`, never another kind."""
