"""The README demo, end to end and offline: corpus -> tokenizer -> pre-training data -> pre-training -> predictions
-> fine-tuning on a real task, from the pre-trained model and from random weights.

  python launch/demo.py [--workdir runs/demo] [--steps N]

Each stage is skipped when its output exists, so a rerun resumes (training continues from its checkpoint).
"""
from __future__ import annotations

import sys
import time

from absl import logging as absl_logging

from bertjax.cli import common
from bertjax.cli import train as train_cli
from bertjax.core import files, hostmem


@common.guard
def main(argv=None) -> int:
  p = common.ArgumentParser(description="bertjax demo: pre-train a tiny BERT on Python's own documentation.")
  p.add_argument("--workdir", default="runs/demo")
  p.add_argument("--steps", type=int, default=0, help="override the demo config's number of steps")
  args = p.parse_args(argv)
  absl_logging.set_verbosity(absl_logging.WARNING)
  import jax

  from bertjax import predict
  from bertjax import pretrain as train
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import dataset, demo_corpus
  from bertjax.data.pretraining import examples as pretraining
  from configs import demo

  w = files.absolute(args.workdir)
  files.reach(w)
  files.makedirs(w)
  t0 = time.time()
  text = files.join(w, "corpus.txt")
  if not files.exists(text):
    s = demo_corpus.build_demo_corpus(text)
    print(f"[1/6] corpus: {s.documents} documents, {s.sentences} sentences from Python's docstrings and pydoc "
          f"topics -> {text}", flush=True)
  else:
    print(f"[1/6] corpus: {text} (exists)", flush=True)
  config = demo.get_config()
  if args.steps:
    config.train.num_steps = args.steps
  tok_dir = files.join(w, "tokenizer")
  vocab = files.join(tok_dir, "vocab.txt")
  if not files.exists(vocab):
    tokenizer.train([text], tok_dir, kind="wordpiece", vocab_size=config.model.vocab_size)
  tok = tokenizer.load(vocab)
  print(f"[2/6] tokenizer: WordPiece, {tok.vocab_size} pieces -> {vocab}", flush=True)
  data_dir = files.join(w, "data")
  if not files.exists(files.join(data_dir, "creation.json")):
    import tensorflow_datasets as tfds
    tfds.disable_progress_bar()  # plain progress lines (dataset.PROGRESS) instead of terminal escape codes
    dataset.PROGRESS["print"] = True
    opts = pretraining.CreationOptions(max_seq_length=config.data.max_seq_length,
                                       max_predictions_per_seq=config.data.max_predictions_per_seq,
                                       masked_lm_prob=config.data.masked_lm_prob, dupe_factor=5,
                                       whole_word_mask=config.data.whole_word_mask)
    rec = dataset.create([text], vocab, data_dir, opts, workers=1, overwrite=True)
    print(f"[3/6] pre-training data: {rec['report']['train']['examples']} train / "
          f"{rec['report']['validation']['examples']} held-out examples ({rec['examples_per_s']:.0f} examples/s) "
          f"-> {data_dir}", flush=True)
  else:
    print(f"[3/6] pre-training data: {data_dir} (exists)", flush=True)
  config.data.data_dir = data_dir
  config.model.vocab_size = tok.vocab_size
  run_dir = files.join(w, "train")
  print(f"[4/6] pre-training a tiny BERT ({config.train.num_steps} steps, batch {config.train.global_batch_size} x "
        f"{config.data.max_seq_length}) on {jax.device_count()} {jax.devices()[0].platform} device(s)", flush=True)
  summary = train.train_and_evaluate(config, run_dir)
  first, last = summary.get("initial_eval", {}), summary.get("eval", {})
  if first and last:
    base = dataset.unigram_baseline(data_dir)
    print(f"held-out MLM accuracy {first['mlm_accuracy']:.3f} -> {last['mlm_accuracy']:.3f}, MLM loss "
          f"{first['mlm_loss']:.3f} -> {last['mlm_loss']:.3f}; NSP accuracy {first['nsp_accuracy']:.3f} -> "
          f"{last['nsp_accuracy']:.3f}\n  beside a model that ignores the context (each token's training "
          f"frequency): accuracy {base['mlm_accuracy']:.3f}, loss {base['mlm_loss']:.3f}; NSP by chance 0.500",
          flush=True)
  print("[5/6] fill in the blank:", flush=True)
  module, params, tok = predict.load(run_dir)
  for sentence in config.predict_examples:
    for _, cands in predict.fill_mask(module, params, tok, sentence, 5, config.model.max_position_embeddings):
      print(f"  {sentence}\n     [MASK] -> " + ", ".join(f"{t} ({p:.3f})" for t, p in cands), flush=True)
  finetune_both(w, tok.vocab_size)
  print(f"\ndone in {time.time() - t0:.0f}s. Outputs in {w}:\n"
        f"  TensorBoard logs  {run_dir}/tensorboard   (tensorboard --logdir {run_dir}/tensorboard)\n"
        f"  checkpoints       {run_dir}/checkpoints\n"
        f"  curves (PNG)      {run_dir}/loss.png, mlm_accuracy.png, nsp_accuracy.png"
        f"   (redraw: python -m bertjax plot {run_dir})\n"
        f"  predict           python -m bertjax predict --workdir {run_dir} \"text with a [MASK] .\"\n"
        f"  fine-tuned        python -m bertjax predict --workdir {w}/finetune/pretrained \"a docstring paragraph\"",
        flush=True)
  return 0


def finetune_both(w: str, vocab_size: int) -> None:
  """Step 6: the topic task fine-tuned from the pre-trained model and from random weights, same seed; a finished
  run (its report.json) is read back, a stopped one resumes."""
  from bertjax import finetune
  from bertjax.data.pretraining import demo_corpus
  from configs import demo
  task_dir = files.join(w, "topic")
  task = demo_corpus.write_topic_task(task_dir)
  labels = task["labels"]
  print(f"[6/6] fine-tuning on a real task: which of {len(labels)} standard-library packages ({', '.join(labels)}) "
        f"a documentation paragraph describes; {task['train']} training / {task['dev']} held-out paragraphs, "
        "3 epochs, from the pre-trained model and from random weights (the same seed)", flush=True)
  accuracy = {}
  for name, pretrained in (("pre-trained", True), ("random weights", False)):
    report = finetune.report_of(demo.finetune_config(w, labels, vocab_size, pretrained),
                                files.join(w, "finetune", "pretrained" if pretrained else "random"))
    accuracy[name] = [e["validation"]["accuracy"] for e in report["epochs"]]
  print("held-out accuracy by epoch:", flush=True)
  for name, acc in accuracy.items():
    print(f"  {name:15s} " + "  ".join(f"{a:.3f}" for a in acc), flush=True)
  print(f"  always the most frequent package: {task['majority']:.3f}\n  (one seed; ten paired seeds: python "
        "benchmarks/demo_transfer.py, docs/training.md#what-the-demos-model-is-worth-downstream)", flush=True)


if __name__ == "__main__":
  from configs import demo as _demo
  hostmem.tune_for_cpu(train_cli.step_values(_demo.get_config()))  # before JAX's backend starts its threads
  sys.exit(main())
