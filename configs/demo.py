"""The README demo: a tiny BERT (the seeds' post-LN BERT, MLM + NSP) on an offline corpus, about 5 minutes on 2 CPU
cores. docs/training.md#the-demos-recipe has the measurements behind each setting."""
from configs import pretrain

# The text: Python's own documentation and the docstrings of the lock's most documented packages where installed
# (demo_corpus.SOURCES), each paragraph once; about 13 MB, 1,500 documents.
CORPUS = ("python", "packages")
DUPE_FACTOR = 1  # sentence-pair sets made of each document; masks are drawn afresh at each read (dynamic masking)
HELDOUT_MASK = 0.15  # the rate the data (and so the held-out split the demo reports on) is masked at: BERT's


def get_config(arg=None):
  c = pretrain.get_config("variant=tiny,seq=128,preds=40,batch=32,shard=dp,vocab=8000,scan=True,dynamic=True,"
                          "mask=0.3" + ("," + arg if arg else ""))
  c.train.num_steps = 1500
  c.train.warmup_steps = 150  # the model leaves the unigram plateau during a slow warmup, not at a faster one
  # Adam with bias correction (HF's AdamW) at 2e-3: the original's uncorrected update at 1e-3 steps at 2.7x its
  # rate at the warmup's end and 1.3x at step 1,000; corrected, the early steps are smaller and the later larger
  c.train.adam_bias_correction = True
  c.train.learning_rate = 2e-3
  c.train.weight_decay = 0.01
  c.model.max_position_embeddings = 128
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0  # 6M tokens of 13 MB: underfitting, not overfitting
  c.log_every = 50
  c.eval_every = 500
  c.eval_batches = 0  # the whole held-out split, the blanks the demo reports on
  c.checkpoint_every = 500
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
