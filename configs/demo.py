"""The README demo: a tiny BERT on the offline corpus (Python's own docs), about 5 minutes on 2 CPU cores."""
from configs import pretrain


def get_config(arg=None):
  c = pretrain.get_config("variant=tiny,seq=128,preds=20,batch=32,shard=dp,vocab=8000,scan=True" +
                          ("," + arg if arg else ""))
  c.train.num_steps = 1500
  c.train.warmup_steps = 150
  c.train.learning_rate = 1e-3
  c.train.weight_decay = 0.01
  c.model.max_position_embeddings = 128
  c.log_every = 50
  c.eval_every = 500
  c.eval_batches = 20
  c.checkpoint_every = 500
  c.predict_examples = ("return the [MASK] of the list .", "if the file does not [MASK] , an error is raised .",
                        "this module provides [MASK] for working with strings .")
  return c
