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

BLANKS = 6  # fill-in-the-blank examples shown
NSP_GENERALISES = 0.65  # held-out NSP accuracy below which the demo says why NSP has not generalised
NSP_WHY = ("a negative pair's second segment is a sentence of another document, so NSP is learned here as 'same "
           "topic or not', and the held-out documents' topics are new to the model: about 1,500 documents, each read "
           "about twice in these steps, teach it the training documents' topics (the accuracy on the training batches "
           "above) before topics in general (docs/training.md#the-demos-recipe measures it over seeds and corpora)")


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
    s = demo_corpus.build_offline_corpus(text, demo.CORPUS, dedupe=True)
    print(f"[1/6] corpus: {s.documents} documents, {s.sentences} sentences from the docstrings of Python's standard "
          f"library, its pydoc topics and the docstrings of {', '.join(demo_corpus.PACKAGES)} where installed "
          f"-> {text}", flush=True)
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
                                       masked_lm_prob=demo.HELDOUT_MASK, dupe_factor=demo.DUPE_FACTOR,
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
  module, params, tok = predict.load(run_dir)
  if summary.get("eval"):
    report_heldout(summary, data_dir, module, params, config.train.global_batch_size)
  print("[5/6] fill in the blank: sentences drawn at random (seed 0) from the held-out documents, one word of each "
        "taken out", flush=True)
  for sentence, word in demo_corpus.heldout_blanks(data_dir, tok, BLANKS):
    (_, cands), = predict.fill_mask(module, params, tok, sentence, 5, config.model.max_position_embeddings)
    mark = "top answer" if cands[0][0] == word else "in the top five" if word in [t for t, _ in cands] else "missed"
    print(f"  {sentence}\n     true: {word} ({mark}) | model: " + ", ".join(f'"{t}" {p:.2f}' for t, p in cands),
          flush=True)
  finetune_both(w, tok.vocab_size)
  print(f"\ndone in {time.time() - t0:.0f}s. Outputs in {w}:\n"
        f"  TensorBoard logs  {run_dir}/tensorboard   (tensorboard --logdir {run_dir}/tensorboard)\n"
        f"  checkpoints       {run_dir}/checkpoints\n"
        f"  curves (PNG)      {run_dir}/loss.png, mlm_accuracy.png, nsp_accuracy.png"
        f"   (redraw: .venv/bin/python -m bertjax plot {run_dir})\n"
        f"  predict           .venv/bin/python -m bertjax predict --workdir {run_dir} \"text with a [MASK] .\"\n"
        f"  fine-tuned        .venv/bin/python -m bertjax predict --workdir {w}/finetune/pretrained "
        "\"a docstring paragraph\"",
        flush=True)
  return 0


def report_heldout(summary: dict, data_dir: str, module, params, batch_size: int) -> dict:
  """Prints what the model does on the held-out documents: MLM accuracy beside a context-blind model, the share
  of held-out blanks whose true token is the top answer and the share where it is in the top five, and NSP
  accuracy held out beside the training pairs' (with why, when it stays near chance). Returns the numbers."""
  from bertjax.data.pretraining import dataset
  first, last, trained = summary.get("initial_eval", {}), summary["eval"], summary.get("train", {})
  base = dataset.unigram_baseline(data_dir)
  top = heldout_top_k(module, params, data_dir, batch_size)
  print(f"held-out documents, never trained on: MLM accuracy {first.get('mlm_accuracy', 0):.3f} -> "
        f"{last['mlm_accuracy']:.3f}, MLM loss {first.get('mlm_loss', 0):.3f} -> {last['mlm_loss']:.3f}\n"
        f"  beside a model that ignores the context (each token's training frequency): accuracy "
        f"{base['mlm_accuracy']:.3f}, loss {base['mlm_loss']:.3f}\n"
        f"  of {top['blanks']:,} held-out blanks, the true token is the top answer for {top['top1']:.1%} and in the "
        f"top five for {top['top5']:.1%}", flush=True)
  nsp, nsp_train = last["nsp_accuracy"], trained.get("nsp_accuracy", float("nan"))
  print(f"next sentence prediction: held-out accuracy {nsp:.3f} (chance 0.500), on the last training batches "
        f"{nsp_train:.3f}", flush=True)
  if nsp < NSP_GENERALISES:
    print(f"  below {NSP_GENERALISES}: {NSP_WHY}", flush=True)
  return {**top, "mlm_accuracy": last["mlm_accuracy"], "nsp_accuracy": nsp, "nsp_train_accuracy": nsp_train}


def heldout_top_k(module, params, data_dir: str, batch_size: int, k: int = 5) -> dict:
  """Over every masked position of the held-out split (the blanks the MLM accuracy counts): how many there are,
  the share whose true token is the model's top answer and the share where it is among the top `k`."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from bertjax.data.pretraining import dataset
  from bertjax.data.pretraining import pipeline as input_pipeline

  @jax.jit
  def hits(params, batch):
    logits = module.apply({"params": params}, batch)["mlm_logits"]
    true = jnp.take_along_axis(logits, batch["masked_lm_ids"][..., None], -1)
    rank = (logits > true).sum(-1)  # answers scored above the true token
    w = batch["masked_lm_weights"] > 0
    return w.sum(), (w & (rank == 0)).sum(), (w & (rank < k)).sum()
  totals = np.zeros(3, np.int64)
  for batch in input_pipeline.eval_batches(dataset.load_source(data_dir, "validation"), batch_size):
    totals += np.asarray(jax.device_get(hits(params, batch)))
  n, top1, topk = (int(x) for x in totals)
  return {"blanks": n, "top1": top1 / max(n, 1), "top5": topk / max(n, 1)}


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
    print(f"-- from {'the pre-trained model' if pretrained else 'random weights'}:", flush=True)
    report = finetune.report_of(demo.finetune_config(w, labels, vocab_size, pretrained),
                                files.join(w, "finetune", "pretrained" if pretrained else "random"))
    accuracy[name] = [e["validation"]["accuracy"] for e in report["epochs"]]
  print("held-out accuracy by epoch:", flush=True)
  for name, acc in accuracy.items():
    print(f"  {name:16s} " + " ".join(f"{a:6.3f}" for a in acc), flush=True)
  lead = [a - b for a, b in zip(accuracy["pre-trained"], accuracy["random weights"])]
  print(f"  {'pre-trained lead':16s} " + " ".join(f"{d:+6.3f}" for d in lead), flush=True)
  if lead[-1] <= 0:
    print("  random weights caught up by the last epoch: which package a paragraph describes is told by its words,\n"
          "  which a 2-layer model also learns from the labelled paragraphs; the pre-trained start's lead is one of\n"
          "  speed (the first epoch)", flush=True)
  print(f"  always the most frequent package: {task['majority']:.3f}\n  (one seed; over paired seeds: .venv/bin/python "
        "benchmarks/demo_transfer.py, docs/training.md#what-the-demos-model-is-worth-downstream)", flush=True)


if __name__ == "__main__":
  from configs import demo as _demo
  hostmem.tune_for_cpu(train_cli.step_values(_demo.get_config()))  # before JAX's backend starts its threads
  sys.exit(main())
