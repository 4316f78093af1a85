"""Contrastive fine-tuning of an embedding model from any family's checkpoint (bertjax workdir, HF folder or
sentence-transformers folder): task=pairs with MultipleNegativesRankingLoss over the whole global batch, mean
pooling and unit-length embeddings unless the init is a sentence-transformers folder with its own. Usage:

  python -m bertjax train --config=configs/embedding.py:init=MODEL --workdir=E \\
      --config.data.train_file=pairs.csv --config.data.eval_file=dev.csv

Argument keys: as configs/finetune.py (init, lr, batch, epochs, seq, seed, shard). Columns: anchor, positive
(--config.embedding.negative_columns="('negative',)" for hard negatives). Large batches give more negatives: the
batch is global over the mesh.
"""
from configs import finetune


def get_config(arg=None):
  a = dict(task="pairs", lr=2e-5, batch=64, epochs=1, seq=128)
  a.update(dict(item.split("=", 1) for item in (arg or "").split(",") if "=" in item))
  c = finetune.get_config(",".join(f"{k}={v}" for k, v in a.items()))
  c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
  return c
