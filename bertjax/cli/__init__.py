"""The command-line tools, one module each, run as `python -m bertjax COMMAND [ARGS]` (or `bertjax COMMAND` once
the package is installed). Each module's `main(argv)` takes the arguments after the command's name."""

# command -> (module, one line of what it does); a module is imported only when its command runs.
COMMANDS = {
    "train": ("bertjax.cli.train", "pre-train or fine-tune per a config (--config=configs/...py:ARGS --workdir=W)"),
    "predict": ("bertjax.cli.predict", "fill in [MASK], or a fine-tuned workdir's label / tags / answer span"),
    "convert": ("bertjax.cli.convert", "a bertjax workdir as an HF transformers (or sentence-transformers) folder"),
    "embeddings": ("bertjax.cli.embeddings", "embed a corpus, evaluate on STS or a BEIR folder"),
    "teacher": ("bertjax.cli.teacher", "a teacher's scores of a training file's rows, for distillation"),
    "mine": ("bertjax.cli.mine", "mine hard negatives for (anchor, positive) pairs, as sentence-transformers does"),
    "dataset": ("bertjax.cli.dataset", "pre-training examples from a text corpus (local processes or Apache Beam)"),
    "tokenizer": ("bertjax.cli.tokenizer", "train a WordPiece, sentencepiece or byte-level BPE tokenizer"),
    "extend_vocab": ("bertjax.cli.extend_vocab", "add whole-word tokens to a WordPiece model and its vocabulary"),
    "parity": ("bertjax.cli.parity", "fine-tune side by side with HF transformers' PyTorch loop, step by step"),
    "aot": ("bertjax.cli.aot", "compile the train step for a TPU topology on this host; memory per chip"),
    "merge": ("bertjax.cli.merge", "average or merge checkpoints (last k, EMA, linear, TIES) into a workdir + HF"),
    "plot": ("bertjax.cli.plot", "redraw a workdir's PNG curves from its metrics.jsonl"),
}
