"""Fixed-seed losses of four tiny runs (BERT MLM + NSP pre-training, ELECTRA pre-training, fine-tuning a
classifier, contrastive embedding training on pairs), to compare two versions of the code: run it in each
checkout and diff the JSON (the losses must be equal).

    python benchmarks/fixed_seed.py --out losses.json

Everything is generated here (a corpus of repeated words, a WordPiece vocabulary, a labelled CSV); on the 2-core
CPU it takes about a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import machine  # noqa: E402


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--out", required=True)
  args = p.parse_args()
  from bertjax import finetune
  from bertjax import pretrain as train
  from bertjax.core import writers as metrics
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset
  from bertjax.data.pretraining import examples as pretraining
  from configs import electra, pretrain
  from configs import finetune as finetune_config
  rng = random.Random(0)
  words = "the model reads text and predicts masked words from both sides of each sentence".split()
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + "." for _ in range(5))
            for _ in range(80)]
    with open(os.path.join(tmp, "c.txt"), "w") as f:
      f.write("\n\n".join(docs))
    vocab = tokenizer.train([os.path.join(tmp, "c.txt")], os.path.join(tmp, "tok"), vocab_size=128)
    n = tokenizer.load(vocab).vocab_size
    for mode in ("nsp_pairs", "full_sentences"):
      dataset.create([os.path.join(tmp, "c.txt")], vocab, os.path.join(tmp, mode),
                     pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2,
                                                 example_mode=mode), heldout_every=8)
    for name, c in (("bert_mlm_nsp", pretrain.get_config(f"variant=tiny,seq=32,preds=5,batch=16,steps=8,shard=dp,"
                                                         f"vocab={n}")),
                    ("electra", electra.get_config(f"variant=tiny,seq=32,preds=5,batch=16,steps=8,shard=dp,"
                                                   f"vocab={n}"))):
      c.data.data_dir = os.path.join(tmp, c.data.example_mode)
      c.train.warmup_steps, c.log_every, c.eval_every, c.eval_batches = 2, 1, 4, 2
      train.train_and_evaluate(c, os.path.join(tmp, name))
      out[name] = [(r["step"], r["split"], r["loss"]) for r in metrics.read_jsonl(os.path.join(tmp, name,
                                                                                          "metrics.jsonl"))]
    with open(os.path.join(tmp, "train.csv"), "w") as f:
      f.write("sentence,label\n" + "".join(f"{' '.join(rng.choice(words) for _ in range(6))} "
                                           f"{'good' if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}\n"
                                           for i in range(96)))
    c = finetune_config.get_config(f"task=local,seq=32,batch=16,epochs=2,lr=1e-3,vocab={n}")
    c.data.train_file = c.data.eval_file = os.path.join(tmp, "train.csv")
    c.data.text_a_column, c.data.label_column, c.data.labels = "sentence", "label", ("neg", "pos")
    c.data.tokenizer = vocab
    c.log_every = 1
    finetune.finetune(c, os.path.join(tmp, "finetune"))
    out["finetune"] = [(r["step"], r["split"], r.get("loss")) for r in
                       metrics.read_jsonl(os.path.join(tmp, "finetune", "metrics.jsonl"))]
    with open(os.path.join(tmp, "pairs.csv"), "w") as f:
      f.write("anchor,positive\n" + "".join(f"{' '.join(rng.choice(words) for _ in range(4))} {i},"
                                           f"{' '.join(rng.choice(words) for _ in range(7))} {i}\n"
                                           for i in range(64)))
    c = finetune_config.get_config(f"task=pairs,seq=32,batch=16,epochs=2,lr=1e-3,variant=tiny,vocab={n}")
    c.data.train_file = c.data.eval_file = os.path.join(tmp, "pairs.csv")
    c.data.text_a_column, c.data.text_b_column = "anchor", "positive"
    c.data.tokenizer = vocab
    c.log_every = 1
    finetune.finetune(c, os.path.join(tmp, "pairs"))
    out["pairs"] = [(r["step"], r["split"], r.get("loss", r.get("ndcg@10"))) for r in
                    metrics.read_jsonl(os.path.join(tmp, "pairs", "metrics.jsonl"))]
  with open(args.out, "w") as f:
    json.dump(machine.stamp(out), f, indent=1)
  print(f"machine: {machine.describe()}")
  for name, rows in out.items():
    print(name, [round(r[2], 6) for r in rows if r[1] == "train" and r[2] is not None])


if __name__ == "__main__":
  main()
