"""Fine-tuning side by side with HF transformers' PyTorch loop: the same start, examples and order, step by step.

  python -m bertjax parity --config=configs/finetune.py:task=ner,init=HF_DIR,batch=16,seq=128 \\
      --config.data.train_file=train.conll --config.data.labels="('O','B-PER','I-PER')" --steps=50 --out=DIR

Both loops start from one HF folder (the init's encoder and a task head drawn by HF's own initialiser), see the
same examples in the same order, with dropout off and the optimizer and schedule the config names. A remote
--out (gs://, s3://) is worked in a local folder and uploaded at the end (the torch side reads local files). The bertjax
side is the real fine-tuning loop (`bertjax.finetune`); the HF side featurises the raw examples with HF's
tokenizer (pairs as `tokenizer(a, b)`, tags through `word_ids()`), pads each batch to its longest row as HF's
collators do, and steps `torch.optim.AdamW` (LayerNorm and biases without weight decay) under a LambdaLR.
Reported: the loss of every step on both sides and, after the last step, how far apart the two parameter
updates are. SQuAD windows are not re-derived on the HF side: it takes bertjax's windows and masks padding out of
the start/end softmax as bertjax does (HF's own QA loss includes the padding positions of each batch).
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import sys
import tempfile

import jax
import numpy as np

from bertjax import convert, errors, finetune, tasks
from bertjax.cli import common
from bertjax.convert import export as export_lib
from bertjax.core import files, optim
from bertjax.data.tasks import conll
from bertjax.data.tasks import rows as task_rows


@dataclasses.dataclass
class Report:
  bertjax_losses: list
  hf_losses: list
  max_loss_rel_diff: float
  update_rel_diff: float  # ||Δθ_bertjax − Δθ_hf|| / ||Δθ_hf|| over every parameter
  update_norm: float  # ||Δθ_hf||: how far the run moved the parameters
  bertjax_update_norm: float  # ||Δθ_bertjax||
  worst_params: list  # (name, relative update difference) of the five parameters that differ most

  def to_dict(self):
    return dataclasses.asdict(self)


def _torch():
  import torch
  import transformers
  return torch, transformers


def hf_class(kind: str, family: str = "bert"):
  """HF's model class of a task kind for the family (e.g. RobertaForTokenClassification)."""
  _, transformers = _torch()
  return getattr(transformers, convert.FAMILIES[family].architectures[tasks.kinds()[kind].hf_head])


def make_start(config, task: tasks.Task, out_dir: str, seed: int = 0) -> str:
  """An HF folder of the task's model: the init's encoder and a head drawn by HF (torch seed `seed`), with the
  init's tokenizer files. Both loops start from it."""
  if not config.init:
    raise tasks.TaskDataError("parity needs config.init (an HF folder or a bertjax workdir)")
  torch, _ = _torch()
  _, mcfg, params, tok_path, lower = finetune.load_init(config, None)
  enc_dir = out_dir + ".encoder"
  family = convert.family_of(mcfg)
  convert.to_hf(mcfg.replace(scan_layers=False), _unstacked(mcfg, params["bert"]), enc_dir, head="encoder")
  torch.manual_seed(seed)
  kw = {} if task.kind == "qa" else {"num_labels": task.num_labels}
  model = hf_class(task.kind, family).from_pretrained(enc_dir, **kw)
  model.save_pretrained(out_dir, safe_serialization=True)
  files.rmtree(enc_dir)
  export_lib.copy_tokenizer(tok_path, lower, out_dir)
  return out_dir


def _unstacked(mcfg, bert):
  enc = bert["encoder"]
  return convert.unstack_layers(bert, mcfg.num_layers) if "layers" in enc else bert


# ----------------------------------------------------------------------------- HF side
def hf_features(task: tasks.Task, config, tok) -> list[dict]:
  """Training features from the raw examples with HF's tokenizer, as HF's example scripts make them."""
  d, seq = config.data, config.data.max_seq_length
  if task.kind in ("classification", "regression"):
    read = lambda p: task_rows.local_examples(p, task, d.text_a_column, d.text_b_column, d.label_column)  # noqa: E731
    examples = read(d.train_file) if not task.name.startswith("glue/") else \
        task_rows.glue_examples(task, task.train_split, d.tfds_data_dir or None)
    out = []
    for ex in examples:
      enc = tok(ex["text_a"], ex["text_b"] or None, truncation=True, max_length=seq)
      types = enc.get("token_type_ids") or [0] * len(enc["input_ids"])
      out.append({"input_ids": enc["input_ids"], "token_type_ids": types, "labels": ex["label"]})
    return out
  if task.kind == "tagging":
    sentences = conll.read(d.train_file)
    index = {t: i for i, t in enumerate(task.labels)}
    enc = tok([w for w, _ in sentences], is_split_into_words=True, truncation=True, max_length=seq)
    out = []
    for i, (_, tags) in enumerate(sentences):
      labels, prev = [], None
      for w in enc.word_ids(i):
        labels.append(-100 if w is None or w == prev else index[tags[w]])
        prev = w
      out.append({"input_ids": enc["input_ids"][i], "token_type_ids": [0] * len(labels), "labels": labels})
    return out
  raise errors.ConfigError("QA features come from bertjax's windows (see the module docstring)")


def _qa_features(feats: dict) -> list[dict]:
  out = []
  for i in range(len(feats["input_ids"])):
    n = int(feats["input_mask"][i].sum())
    out.append({"input_ids": feats["input_ids"][i, :n].tolist(), "token_type_ids": feats["segment_ids"][i, :n].tolist(),
                "start_positions": int(feats["start_positions"][i]), "end_positions": int(feats["end_positions"][i])})
  return out


def _pad(rows: list[dict]):
  """A batch padded to its longest row (HF's DataCollatorWithPadding / ForTokenClassification)."""
  torch, _ = _torch()
  n = max(len(r["input_ids"]) for r in rows)
  ids = torch.zeros((len(rows), n), dtype=torch.long)
  seg = torch.zeros_like(ids)
  mask = torch.zeros_like(ids)
  batch = {}
  for i, r in enumerate(rows):
    k = len(r["input_ids"])
    ids[i, :k] = torch.tensor(r["input_ids"])
    seg[i, :k] = torch.tensor(r["token_type_ids"])
    mask[i, :k] = 1
  batch.update(input_ids=ids, token_type_ids=seg, attention_mask=mask)
  if "start_positions" in rows[0]:
    batch["start_positions"] = torch.tensor([r["start_positions"] for r in rows])
    batch["end_positions"] = torch.tensor([r["end_positions"] for r in rows])
  elif isinstance(rows[0]["labels"], list):
    lab = torch.full((len(rows), n), -100, dtype=torch.long)
    for i, r in enumerate(rows):
      lab[i, :len(r["labels"])] = torch.tensor(r["labels"])
    batch["labels"] = lab
  else:
    dtype = torch.float32 if isinstance(rows[0]["labels"], float) else torch.long
    batch["labels"] = torch.tensor([r["labels"] for r in rows], dtype=dtype)
  return batch


def hf_lr_lambda(schedule: str, warmup: int, total: int):
  """The learning-rate multiplier of `train.schedule`, written from its definition (not bertjax.optim)."""
  if schedule == "linear_from_warmup":
    _, transformers = _torch()
    return transformers.get_linear_schedule_with_warmup, None
  def fn(step):  # the original: lr·t/w in warmup, then lr·(1 − t/T)
    return step / max(warmup, 1) if step < warmup else max(0.0, 1.0 - step / max(total, 1))
  return None, fn


def hf_loop(start_dir: str, task: tasks.Task, config, rows: list[dict], batches: list[np.ndarray],
            total_steps: int, warmup_steps: int, seed: int = 0, rates=(0.0, 0.0, 0.0), family: str = "bert"):
  """(losses, final HF state dict) of an HF PyTorch loop over `batches` (lists of row indices), with dropout
  `rates` (hidden, attention, classifier; 0 for a step-by-step comparison) under each family's config names.
  Weight decay skips biases and every LayerNorm's parameters, as HF's Trainer groups them."""
  torch, _ = _torch()
  t = optim.settings(config.train)
  if t.optimizer != "adamw" or not t.adam_bias_correction:
    raise errors.ConfigError("the HF loop steps torch.optim.AdamW: set train.optimizer=adamw with bias correction")
  torch.manual_seed(seed)
  hidden, attention, classifier = rates
  names = ({"embedding_dropout": hidden, "mlp_dropout": hidden, "attention_dropout": attention}
           if family == "modernbert" else {"hidden_dropout_prob": hidden, "attention_probs_dropout_prob": attention})
  model = hf_class(task.kind, family).from_pretrained(start_dir, classifier_dropout=classifier,
                                                      attn_implementation="eager", **names)
  model.train()
  norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
  skip = lambda n, p: id(p) in norms or n.endswith("bias")  # noqa: E731
  decay = [p for n, p in model.named_parameters() if not skip(n, p)]
  no_decay = [p for n, p in model.named_parameters() if skip(n, p)]
  takes_types = "token_type_ids" in inspect.signature(model.forward).parameters
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps)
  make, fn = hf_lr_lambda(t.schedule, warmup_steps, total_steps)
  sched = make(opt, warmup_steps, total_steps) if make else torch.optim.lr_scheduler.LambdaLR(opt, fn)
  losses = []
  for idx in batches:
    batch = _pad([rows[i] for i in idx])
    if not takes_types:
      del batch["token_type_ids"]
    if task.kind == "qa":
      mask = batch["attention_mask"].bool()
      out = model(**{k: v for k, v in batch.items() if k not in ("start_positions", "end_positions")})
      neg = torch.finfo(torch.float32).min
      ce = torch.nn.functional.cross_entropy
      loss = (ce(out.start_logits.masked_fill(~mask, neg), batch["start_positions"]) +
              ce(out.end_logits.masked_fill(~mask, neg), batch["end_positions"])) / 2
    else:
      if task.kind == "regression":
        model.config.problem_type = "regression"
      loss = model(**batch).loss
    loss.backward()
    if t.grad_clip_norm and t.grad_clip_norm > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip_norm)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(float(loss.detach()))
  return losses, {k: v.detach().numpy() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------- the comparison
def compare(config, workdir: str, steps: int = 0, dropout: bool = False) -> Report:
  """Runs both loops for `steps` (0 = the whole run) from a common start in WORKDIR/start and compares them.
  With `dropout` both keep the config's dropout: each draws its own masks, so the two agree in distribution
  only (loss curves and update sizes, not step by step)."""
  torch, transformers = _torch()
  torch.set_num_threads(max(1, os.cpu_count() or 1))
  config = config.copy_and_resolve_references() if hasattr(config, "copy_and_resolve_references") else config
  config.unlock()
  task = tasks.get(config.task, tuple(config.data.labels), config.data.regression)
  files.makedirs(workdir)
  start = make_start(config, task, os.path.join(workdir, "start"), seed=config.seed)
  config.init = start
  if not dropout:
    config.model.dropout_rate = config.model.attention_dropout_rate = config.model.classifier_dropout = 0.0
  config.log_every = 1
  config.data.auto_packing = False  # the HF loop takes one example per row: compare the loop on the same batches
  config.data.eval_file = ""
  if steps:
    config.train.stop_after_steps = steps
  run_dir = os.path.join(workdir, "bertjax")
  files.rmtree(run_dir)
  result = finetune.finetune(config, run_dir)
  rows = finetune.read_train_metrics(run_dir)
  bj_losses = [r["loss"] for r in rows]
  plan = result["plan"]
  batches = [b for epoch in plan.epoch_batches() for b in epoch][:len(bj_losses)]

  tok = transformers.AutoTokenizer.from_pretrained(start)
  if task.kind == "qa":
    hf_rows = _qa_features(result["train_features"])
  else:
    hf_rows = hf_features(task, config, tok)
  mcfg = result["model_config"]
  family = convert.family_of(mcfg)
  rates = (mcfg.dropout_rate, mcfg.attention_dropout_rate, mcfg.head_dropout_rate)
  hf_losses, hf_state = hf_loop(start, task, config, hf_rows, batches, plan.total_steps, plan.warmup_steps,
                                config.seed, rates, family)

  head = tasks.kind(task).hf_head
  flat = mcfg.replace(scan_layers=False)
  _, start_params = convert.from_hf(start, head=head)
  _, hf_params = convert.from_state_dict(flat, hf_state, head=head, family_name=family)
  ours = jax.tree_util.tree_map(np.asarray, jax.device_get(result["state"].params))
  ours["bert"] = _unstacked(mcfg, ours["bert"])
  diffs, num, den, ours_sq = [], 0.0, 0.0, 0.0
  for path, theirs in jax.tree_util.tree_leaves_with_path(hf_params):
    name = jax.tree_util.keystr(path)
    x0 = _at(start_params, path)
    d_ours, d_theirs = _at(ours, path) - x0, theirs - x0
    e, n = float(np.sum((d_ours - d_theirs) ** 2)), float(np.sum(d_theirs ** 2))
    num, den, ours_sq = num + e, den + n, ours_sq + float(np.sum(d_ours ** 2))
    diffs.append((name, math.sqrt(e / n) if n > 0 else math.sqrt(e)))
  diffs.sort(key=lambda x: -x[1])
  rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(bj_losses, hf_losses)]
  return Report(bj_losses, hf_losses, max(rel) if rel else 0.0, math.sqrt(num / den) if den else 0.0,
                math.sqrt(den), math.sqrt(ours_sq), diffs[:5])


def _at(tree, path):
  for k in path:
    tree = tree[k.key]
  return np.asarray(tree)


def main(argv=None) -> None:
  from absl import flags
  from ml_collections import config_flags
  if "steps" not in flags.FLAGS:  # defined once per process (main may be called again, e.g. by tests)
    config_flags.DEFINE_config_file("config", None, "configs/finetune.py:task=...,init=...", lock_config=False)
    flags.DEFINE_string("out", None, "Working folder: the common start, bertjax's run and report.json.")
    flags.DEFINE_integer("steps", 50, "Steps to compare (0 = the whole run).")
    flags.DEFINE_bool("dropout", False, "Keep dropout on both sides (a comparison in distribution only).")
    flags.mark_flags_as_required(["config", "out"])

  def run(_):
    if flags.FLAGS.steps < 0:
      raise errors.ConfigError(f"--steps must be >= 0 (0: the whole run), got {flags.FLAGS.steps}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs several INFO lines per save
    cfg, out = flags.FLAGS.config, flags.FLAGS.out
    files.reach(out)
    if files.is_remote(out):  # worked locally, uploaded at the end
      with tempfile.TemporaryDirectory(prefix="bertjax-parity-") as local:
        report(compare(cfg, local, flags.FLAGS.steps, flags.FLAGS.dropout), local)
        export_lib.publish(local, out)
    else:
      report(compare(cfg, out, flags.FLAGS.steps, flags.FLAGS.dropout), out)

  def report(rep: Report, folder: str) -> None:
    print(f"{'step':>5} {'bertjax loss':>14} {'HF loss':>14} {'rel diff':>10}")
    for i, (a, b) in enumerate(zip(rep.bertjax_losses, rep.hf_losses), 1):
      print(f"{i:5d} {a:14.7f} {b:14.7f} {abs(a - b) / max(abs(b), 1e-12):10.2e}")
    print(f"max relative loss difference {rep.max_loss_rel_diff:.2e}; parameter updates differ by "
          f"{rep.update_rel_diff:.2e} (relative, all parameters); update norms: bertjax "
          f"{rep.bertjax_update_norm:.4g}, HF {rep.update_norm:.4g}")
    files.write_whole(files.join(folder, "report.json"), json.dumps(rep.to_dict(), indent=2))
  common.run_absl(run, argv=[sys.argv[0], *(sys.argv[1:] if argv is None else argv)])

