"""Checkpoint averaging and merging (`python -m bertjax merge`): several checkpoints of one architecture into one.

Inputs are bertjax pre-training workdirs (their newest checkpoint; `W@STEP` a given step, `W@ema` the moving
average of the weights a run with train.ema_decay keeps) and HF folders. Methods:

  linear   Σ w_i θ_i / Σ w_i (model soups; averaging the last k checkpoints of one run, `last`).
  ties     TIES-merging (Yadav et al. 2023) of task vectors τ_i = θ_i − θ_base, as the authors' code does it
           (`topk_values_mask`, `resolve_sign`, `disjoint_merge` over each model flattened into one vector):
           trim each τ_i over the whole model, keeping |τ| >= its k-th smallest magnitude, k = d − int(d·density)
           (d: the parameter count of the model as HF holds it, entries no computation reads left out; density
           1 keeps all); elect each entry's sign as the sign of Σ_i τ̂_i, an entry whose sum is 0 taking the
           majority sign (that of the sum of all elected signs); take the mean of the nonzero τ̂_i that agree
           with it (the disjoint mean), θ = θ_base + λ·τ_m. mmBERT merges its decay-phase variants this way, with
           the pre-decay checkpoint as the base.

Each input is merged in the form it holds (an HF BertForPreTraining, BertForMaskedLM or BertModel folder, a
workdir's MLM model, ...) and written in that form; inputs of different forms or families are refused.

The result is written as a workdir (a params-only checkpoint with the first input's run config, tokenizer
copied: `init_checkpoint=OUT` continues from it and every bertjax tool reads it) and, beside it, OUT/hf, the HF
folder of the family. Merging copies of one checkpoint gives it back unchanged (linear; ties with density 1).
Inputs and OUT may be local or in an object store (gs://, s3://; `bertjax.core.files`).
"""
from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.convert import export, weights
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib

METHODS = ("linear", "ties")
# The fields that decide what the weights compute with; training-time settings (dropout, kernels, dtypes, layout)
# and fields an HF round trip may spell otherwise are not compared (parameter shapes are, separately).
ARCH_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "type_vocab_size",
               "hidden_act", "ffn", "position_embedding", "layer_norm", "norm", "norm_bias", "use_bias",
               "embedding_norm", "first_attention_norm", "embedding_size")


@dataclasses.dataclass
class Input:
  label: str
  path: str
  cfg: model_lib.BertConfig
  params: dict  # unscanned layout, host arrays
  run: dict  # the workdir's run config, or a minimal one for an HF folder
  tokenizer: tuple[str, bool]
  family: str = ""  # the HF model type of its architecture ("" where none has it)


def form(inp: Input) -> str:
  """What an input's parameters hold beside the encoder, in words: inputs are merged only with their like."""
  objective = inp.run.get("objective", "mlm")
  if objective != "mlm":
    return f"a {objective} run's model"
  p = inp.params
  if "head_dense" in p:
    return "a replaced-token discriminator"
  if "mlm_bias" in p:
    return "MLM + NSP heads" if "nsp" in p else "an MLM head"
  return "an encoder without heads" if set(p) <= {"bert"} else "heads " + ", ".join(sorted(set(p) - {"bert"}))


def split_spec(spec: str) -> tuple[str, str]:
  """'W', 'W@1200', 'W@ema' -> (path, selector); a path that exists as written has no selector."""
  if "@" not in spec or files.exists(spec):
    return spec, ""
  path, _, sel = spec.rpartition("@")
  return path, sel


def read(spec: str) -> Input:
  path, sel = split_spec(spec)
  files.reach(path)
  if not files.isdir(path):
    raise FileNotFoundError(f"{path}: no such workdir or HF folder")
  kind = weights.source_of(path)
  if kind == "finetuned":
    raise errors.ConfigError(f"{path} is a fine-tuned workdir: merge reads pre-training workdirs and HF folders")
  if kind == "hf":
    if sel:
      raise errors.ConfigError(f"{spec}: an HF folder holds one checkpoint; @{sel} selects a workdir's step or its ema")
    _check_hf_form(path)
    w = weights.load(path, overrides={"scan_layers": False}, head="all")
    cfg = w.cfg
    if cfg.nsp_head and "nsp" not in w.params:  # an MLM model without NSP (BertForMaskedLM): exported as one
      cfg = cfg.replace(nsp_head=False)
    run = {"mode": "pretrain", "objective": "mlm", "model": dataclasses.asdict(cfg),
           "train": {"use_nsp": "nsp" in w.params}, "data": {"data_dir": "", "do_lower_case": w.do_lower_case}}
    tok = w.tokenizer if w.tokenizer and files.exists(w.tokenizer) else ""  # a folder may hold no tokenizer
    return Input(spec, path, cfg, _host(w.params), run, (tok, w.do_lower_case),
                 str(w.meta.get("model_type", "bert")))
  run = files.read_json(files.join(path, "config.json"))
  step, item = None, "params"
  if sel == "ema":
    item = "ema"
  elif sel:
    try:
      step = int(sel)
    except ValueError:
      raise errors.ConfigError(f"{spec}: @{sel} is neither a step nor 'ema'") from None
  ckpt = checkpoint_lib.Checkpointer(path, read_only=True)
  if step is not None and step not in ckpt.steps():
    raise checkpoint_lib.CheckpointError(f"{spec}: {path} has no checkpoint at step {step} (it has {ckpt.steps()})")
  params = ckpt.restore_params(step, item=item)
  cfg = model_lib.BertConfig.from_dict({**run["model"], "scan_layers": False})  # compared and merged unstacked
  if "bert" in params:
    params = {**params, "bert": weights.to_layout(params["bert"], cfg)}
  return Input(spec, path, cfg, _host(params), run, weights.run_tokenizer(path, ml_collections.ConfigDict(run)),
               _family(cfg, params))


def _check_hf_form(path: str, tool: str = "merge") -> None:
  """An HF folder whose architecture is a task head (sequence / token classification, QA) is refused in one line:
  merge and extend_vocab write pre-training, MLM and encoder forms."""
  from bertjax import convert
  name = files.join(weights.hf_folder(path), "config.json")
  try:
    meta = files.read_json(name)
  except (OSError, ValueError):
    return  # weights.load names what is wrong with it
  arch = (meta.get("architectures") or ["?"])[0]
  if convert.head_of_architecture(meta) in convert.TASK_HEADS:
    raise errors.ConfigError(f"{path}: {arch} is a fine-tuned task head; {tool} reads pre-training, MLM and "
                             "encoder forms (*ForPreTraining, *ForMaskedLM, *Model)")


def _family(cfg: model_lib.BertConfig, params: dict) -> str:
  from bertjax import convert
  try:
    return convert.family_of(cfg, params)
  except errors.ConversionError:
    return ""


def _host(tree):
  import jax
  return jax.tree_util.tree_map(lambda x: np.asarray(x), tree)


def _leaves(tree) -> dict:
  import jax
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def check_alike(inputs: list[Input]) -> None:
  """One line naming the first way the inputs differ: the family's switches, the sizes, or a parameter's shape."""
  first = inputs[0]
  base = {k: getattr(first.cfg, k) for k in ARCH_FIELDS}
  for other in inputs[1:]:
    theirs = {k: getattr(other.cfg, k) for k in ARCH_FIELDS}
    diff = sorted(k for k in base if base[k] != theirs.get(k))
    if diff:
      k = diff[0]
      raise errors.ConfigError(f"cannot merge {first.label} and {other.label}: different architectures ({k} "
                               f"{base[k]!r} vs {theirs.get(k)!r}" + (f"; {len(diff) - 1} more" if len(diff) > 1
                                                                      else "") + ")")
    if first.run.get("objective", "mlm") != other.run.get("objective", "mlm"):
      raise errors.ConfigError(f"cannot merge {first.label} and {other.label}: different objectives")
    if first.family and other.family and first.family != other.family:
      raise errors.ConfigError(f"cannot merge {first.label} and {other.label}: different model families "
                               f"({first.family} vs {other.family})")
    if form(first) != form(other):
      raise errors.ConfigError(f"cannot merge {first.label} and {other.label}: different forms ({form(first)} vs "
                               f"{form(other)}); merge checkpoints that hold the same heads")
    a, b = _leaves(first.params), _leaves(other.params)
    if set(a) != set(b):
      only = sorted(set(a) ^ set(b))[0]
      raise errors.ConfigError(f"cannot merge {first.label} and {other.label}: {only} is in one and not the other")
    for k in a:
      if a[k].shape != b[k].shape:
        raise errors.ConfigError(f"cannot merge {first.label} and {other.label}: {k} is {a[k].shape} vs {b[k].shape}")


def linear(trees: list[dict], weights_: list[float]) -> dict:
  """Σ w_i θ_i / Σ w_i, accumulated in float64, cast back to each parameter's dtype."""
  import jax
  w = np.asarray(weights_, np.float64) / np.sum(weights_)

  def mean(*xs):
    acc = np.zeros(xs[0].shape, np.float64)
    for wi, x in zip(w, xs):
      acc += wi * x.astype(np.float64)
    return acc.astype(xs[0].dtype)
  return jax.tree_util.tree_map(mean, *trees)


def threshold(magnitudes: np.ndarray, density: float) -> float:
  """The trim threshold of one task vector's magnitudes (all of a model's parameters), as the authors'
  `topk_values_mask`: its k-th smallest magnitude, k = d − int(d·density); |τ| >= it is kept (ties with it too).
  density 1 keeps everything (-inf)."""
  d = magnitudes.size
  k = d - int(d * density)
  if density >= 1 or k < 1:
    return -np.inf
  return float(np.partition(magnitudes, k - 1)[k - 1])


def unread(cfg: model_lib.BertConfig, tree: dict) -> set[str]:
  """The leaves (`_leaves` keys) of an unscanned tree that the model holds and no computation reads, which its HF
  model does not have: the layer-0 attention norm of a stack whose first layer takes the embedding norm's output
  as it is (ModernBERT's Identity there; bertjax keeps the entry so that every layer has one shape)."""
  if cfg.first_attention_norm:
    return set()
  return {k for k in _leaves(tree) if "['encoder']['layer_0']['attention_ln']" in k}


def ties(trees: list[dict], base: dict, density: float, lam: float, weights_: list[float] | None = None,
         fixed: set[str] = frozenset()) -> dict:
  """TIES-merging of `trees` onto `base` (module docstring): one trim threshold per task over every parameter
  (the authors flatten a model into one vector), the sign election's zeros resolved to the majority sign, the
  disjoint mean. `weights_` scale each trimmed task vector before the election (1 each by default). `fixed`: the
  leaves (`_leaves` keys) that are no parameter of the model the authors' rule sees (`unread`): they keep the
  base's values and count neither in the trim nor in the election. Accumulated in float64, cast back to each
  parameter's dtype; one tensor at a time (the magnitudes of one task at once)."""
  import jax
  w = [1.0] * len(trees) if weights_ is None else list(weights_)
  paths, treedef = jax.tree_util.tree_flatten_with_path(base)
  base_leaves = [x for _, x in paths]
  task_leaves = [treedef.flatten_up_to(t) for t in trees]
  b64 = lambda j: np.asarray(base_leaves[j]).astype(np.float64)  # noqa: E731
  tau = lambda t, j: np.asarray(task_leaves[t][j]).astype(np.float64) - b64(j)  # noqa: E731
  n = len(base_leaves)
  held = [j for j, (p, _) in enumerate(paths) if jax.tree_util.keystr(p) not in fixed]
  cut = [threshold(np.concatenate([np.abs(tau(t, j)).ravel() for j in held]) if held else np.zeros(0), density)
         for t in range(len(trees))]

  def trimmed(j):
    return np.stack([w[t] * np.where(np.abs(x) >= cut[t], x, 0.0) for t, x in ((t, tau(t, j))
                                                                                 for t in range(len(trees)))])
  signs = {j: np.sign(trimmed(j).sum(axis=0)).astype(np.int8) for j in held}
  majority = np.sign(sum(int(s.sum(dtype=np.int64)) for s in signs.values()))  # resolve_zero_signs(..., "majority")
  out = []
  for j in range(n):
    if j not in signs:
      out.append(np.asarray(base_leaves[j]))
      continue
    taus = trimmed(j)
    sign = np.where(signs[j] == 0, majority, signs[j])
    keep = np.where(sign > 0, taus > 0, taus < 0)
    selected = taus * keep
    count = (selected != 0).sum(axis=0)
    merged = selected.sum(axis=0) / np.maximum(count, 1)
    out.append((b64(j) + lam * merged).astype(np.asarray(base_leaves[j]).dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def last_steps(workdir: str, k: int) -> list[str]:
  """The specs of a workdir's newest k checkpoints (`W@STEP`), oldest first."""
  if k < 1:
    raise errors.ConfigError(f"--last {k}: --last must be >= 1 (the number of newest checkpoints to average)")
  sel = split_spec(workdir)[1]
  if sel:
    raise errors.ConfigError(f"--last {k} averages a workdir's newest checkpoints; {workdir} selects one (@{sel}): "
                             f"@{sel} and --last do not combine")
  steps = checkpoint_lib.Checkpointer(workdir, read_only=True).steps()
  if len(steps) < k:
    raise errors.ConfigError(f"--last {k}: {workdir} holds {len(steps)} checkpoint(s) {steps}; raise "
                             "keep_checkpoints in the run to keep more")
  return [f"{workdir}@{s}" for s in steps[-k:]]


def write(out: str, merged: dict, first: Input, record: dict, st_stack: export.StStack | None = None) -> str:
  """OUT as a params-only workdir (checkpoints/0, config.json with the merge's record, tokenizer/) and OUT/hf,
  the HF folder (with `st_stack`, sentence-transformers' modules over it); returns the architecture written."""
  def make(tmp: str) -> str:
    run = dict(first.run)
    run["merged"] = record
    params = merged
    if "bert" in merged:  # back in the first input's layer layout (a scanned run's, stacked)
      params = {**merged, "bert": weights.to_layout(merged["bert"], model_lib.BertConfig.from_dict(run["model"]),
                                                    saved_scan=False)}
    tok_path, lower = first.tokenizer
    run.setdefault("data", {})["do_lower_case"] = lower
    ckpt = checkpoint_lib.Checkpointer(tmp, async_save=False)
    ckpt.save(0, {"params": params}, {"merged": True})
    ckpt.close()
    files.write_whole(files.join(tmp, "config.json"), json.dumps(run, indent=2))
    if tok_path:
      tokenizer_lib.copy_into(tok_path, os.path.join(tmp, "tokenizer"))  # `tmp`: a local folder (into_place)
    hf = files.join(tmp, "hf")
    files.makedirs(hf)
    arch, folders = export.pretraining_params(run, params, hf)
    if tok_path:
      for sub in folders:
        export.copy_tokenizer(tok_path, lower, os.path.join(hf, sub))
    export.carry_st_modules(st_stack, hf)
    return arch
  return export.into_place(out, make)


def st_modules(inputs: list[Input]) -> export.StStack | None:
  """The sentence-transformers stack the merged folder carries: that of the inputs that are sentence-transformers
  folders, whose modules must agree (a merge averages the encoders, not poolings or projections); the root
  settings and sequence length are the first's."""
  held = [(i, export.st_modules(i.path)) for i in inputs if weights.source_of(i.path) == "hf"]
  held = [(i, m) for i, m in held if m is not None]
  for i, m in held[1:]:
    first, this = held[0][1].modules(), m.modules()
    if this != first:
      differ = sorted(k for k in set(this) | set(first) if this.get(k) != first.get(k))
      raise errors.ConfigError(f"{i.path}: its sentence-transformers modules differ from {held[0][0].path}'s "
                               f"({', '.join(differ[:3])}); merge averages encoders under one pooling and head")
  return held[0][1] if held else None


def check_out(out: str, inputs: list[str], overwrite: bool) -> None:
  """Refuses an --out that is one of the inputs, or that holds anything a merge did not write; a previous merge's
  output is replaced only with --overwrite."""
  if not (files.exists(out) if files.is_remote(out) else os.path.lexists(out)):
    return
  for spec in inputs:
    if export.same_place(split_spec(spec)[0], out):
      raise errors.ConfigError(f"--out {out} is one of the inputs; choose a new folder")
  if not files.isdir(out):
    raise FileExistsError(f"{out}: exists and is not a folder")
  if not files.listdir(out):
    return
  merged = False
  try:
    merged = "merged" in files.read_json(files.join(out, "config.json"))
  except (OSError, ValueError):
    pass
  if not merged:
    raise errors.ConfigError(f"--out {out} holds files a merge did not write; choose a new folder")
  if not overwrite:
    raise FileExistsError(f"{out}: holds an earlier merge; pass --overwrite to replace it")


def merge(specs: list[str], out: str, method: str = "linear", weights_: list[float] | None = None, base: str = "",
          density: float = 1.0, lam: float = 1.0, overwrite: bool = False) -> dict:
  """Reads, checks, merges and writes; returns the merge's record."""
  if method not in METHODS:
    raise errors.ConfigError(f"--method {method!r} is not one of {list(METHODS)}")
  if len(specs) < (1 if method == "ties" else 2):
    raise errors.ConfigError(f"{method} merging needs at least {1 if method == 'ties' else 2} inputs, got {len(specs)}")
  if weights_ is not None and (len(weights_) != len(specs) or any(not np.isfinite(w) or w <= 0 for w in weights_)):
    raise errors.ConfigError(f"--weights {weights_}: one number > 0 per input ({len(specs)})")
  if method == "ties" and not base:
    raise errors.ConfigError("ties merges task vectors θ_i - θ_base: give --base (e.g. the pre-decay checkpoint)")
  if method == "linear" and base:
    raise errors.ConfigError("--base is for --method ties")
  if not 0 < density <= 1 or not np.isfinite(lam):
    raise errors.ConfigError(f"--density must be in (0, 1] and --lam a number; got {density}, {lam}")
  check_out(out, specs + ([base] if base else []), overwrite)
  inputs = [read(s) for s in specs]
  base_in = read(base) if base else None
  check_alike(inputs + ([base_in] if base_in else []))
  st_stack = st_modules(inputs)
  trees = [i.params for i in inputs]
  if method == "linear":
    merged = linear(trees, weights_ or [1.0] * len(trees))
  else:
    merged = ties(trees, base_in.params, density, lam, weights_, unread(base_in.cfg, base_in.params))
  record = {"method": method, "inputs": specs, "weights": weights_, "base": base or None, "density": density,
            "lam": lam}
  record["architecture"] = write(out, merged, inputs[0], record, st_stack)
  return record

