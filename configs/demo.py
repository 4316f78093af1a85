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


def finetune_config(demo_dir, labels, vocab_size, pretrained=True, seed=0):
  """The demo's fine-tuning (launch/demo.py, step 6) on its topic task in `demo_dir` (topic/train.csv, dev.csv):
  from the demo's pre-trained model, or from random weights of the same architecture; 3 epochs at the rate a
  2-layer model takes."""
  from bertjax.core import files
  from configs import finetune
  init = files.join(demo_dir, "train") if pretrained else ""
  c = finetune.get_config(f"task=local,init={init},lr=1e-3,batch=32,epochs=3,seq=128,seed={seed},variant=tiny,"
                          f"vocab={vocab_size}")
  if not pretrained:
    pre = get_config().model
    c.model.max_position_embeddings = pre.max_position_embeddings
    c.model.dropout_rate, c.model.attention_dropout_rate = pre.dropout_rate, pre.attention_dropout_rate
    c.data.tokenizer = files.join(demo_dir, "tokenizer", "vocab.txt")
  c.data.train_file = files.join(demo_dir, "topic", "train.csv")
  c.data.eval_file = files.join(demo_dir, "topic", "dev.csv")
  c.data.text_a_column, c.data.label_column, c.data.labels = "text", "label", tuple(labels)
  c.log_every = 1000
  return c
