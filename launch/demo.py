"""The README demo, end to end and offline: corpus -> tokenizer -> pre-training data -> pre-training -> predictions.

  python launch/demo.py [--workdir runs/demo] [--steps N]

Each stage is skipped when its output exists, so a rerun resumes (training continues from its checkpoint).
"""
from __future__ import annotations

import os
import sys
import time

from absl import logging as absl_logging

from bertjax import errors, hostmem


@errors.guard
def main(argv=None) -> int:
  p = errors.ArgumentParser(description="bertjax demo: pre-train a tiny BERT on Python's own documentation.")
  p.add_argument("--workdir", default="runs/demo")
  p.add_argument("--steps", type=int, default=0, help="override the demo config's number of steps")
  args = p.parse_args(argv)
  absl_logging.set_verbosity(absl_logging.WARNING)
  import jax
  from bertjax import predict, train
  from bertjax.data import dataset, demo_corpus, pretraining, tokenizer
  from configs import demo

  w = os.path.abspath(args.workdir)
  os.makedirs(w, exist_ok=True)
  t0 = time.time()
  text = os.path.join(w, "corpus.txt")
  if not os.path.exists(text):
    s = demo_corpus.build_demo_corpus(text)
    print(f"[1/5] corpus: {s.documents} documents, {s.sentences} sentences from Python's docstrings and pydoc "
          f"topics -> {text}", flush=True)
  else:
    print(f"[1/5] corpus: {text} (exists)", flush=True)
  config = demo.get_config()
  if args.steps:
    config.train.num_steps = args.steps
  tok_dir = os.path.join(w, "tokenizer")
  vocab = os.path.join(tok_dir, "vocab.txt")
  if not os.path.exists(vocab):
    tokenizer.train([text], tok_dir, kind="wordpiece", vocab_size=config.model.vocab_size)
  tok = tokenizer.load(vocab)
  print(f"[2/5] tokenizer: WordPiece, {tok.vocab_size} pieces -> {vocab}", flush=True)
  data_dir = os.path.join(w, "data")
  if not os.path.exists(os.path.join(data_dir, "creation.json")):
    import tensorflow_datasets as tfds
    tfds.disable_progress_bar()  # plain progress lines (dataset.PROGRESS) instead of terminal escape codes
    dataset.PROGRESS["print"] = True
    opts = pretraining.CreationOptions(max_seq_length=config.data.max_seq_length,
                                       max_predictions_per_seq=config.data.max_predictions_per_seq,
                                       masked_lm_prob=config.data.masked_lm_prob, dupe_factor=5,
                                       whole_word_mask=config.data.whole_word_mask)
    rec = dataset.create([text], vocab, data_dir, opts, workers=1, overwrite=True)
    print(f"[3/5] pre-training data: {rec['report']['train']['examples']} train / "
          f"{rec['report']['validation']['examples']} held-out examples ({rec['examples_per_s']:.0f} examples/s) "
          f"-> {data_dir}", flush=True)
  else:
    print(f"[3/5] pre-training data: {data_dir} (exists)", flush=True)
  config.data.data_dir = data_dir
  config.model.vocab_size = tok.vocab_size
  run_dir = os.path.join(w, "train")
  print(f"[4/5] pre-training a tiny BERT ({config.train.num_steps} steps, batch {config.train.global_batch_size} x "
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
  print("[5/5] fill in the blank:", flush=True)
  module, params, tok = predict.load(run_dir)
  for sentence in config.predict_examples:
    for _, cands in predict.fill_mask(module, params, tok, sentence, 5, config.model.max_position_embeddings):
      print(f"  {sentence}\n     [MASK] -> " + ", ".join(f"{t} ({p:.3f})" for t, p in cands), flush=True)
  print(f"\ndone in {time.time() - t0:.0f}s. Outputs in {w}:\n"
        f"  TensorBoard logs  {run_dir}/tensorboard   (tensorboard --logdir {run_dir}/tensorboard)\n"
        f"  checkpoints       {run_dir}/checkpoints\n"
        f"  curves (PNG)      {run_dir}/loss.png, mlm_accuracy.png, nsp_accuracy.png"
        f"   (redraw: python -m bertjax.metrics {run_dir})\n"
        f"  predict           python -m bertjax.predict --workdir {run_dir} \"text with a [MASK] .\"", flush=True)
  return 0


if __name__ == "__main__":
  from configs import demo as _demo
  hostmem.tune_for_cpu(hostmem.config_step_values(_demo.get_config()))  # before JAX's backend starts its threads
  sys.exit(main())
