"""One loader for every source of weights: a bertjax pre-training workdir (its latest checkpoint), a fine-tuned
bertjax workdir (its best parameters), or an HF transformers folder (safetensors), each with its architecture,
its tokenizer and the parameters in the layer layout (scanned or not) that the model to be built wants.

    w = weights.load("W_or_F_or_HF_DIR", overrides={"scan_layers": True}, head="encoder")
    w.cfg, w.params, w.tokenizer, w.do_lower_case

Every path may be local or in an object store (gs://, s3://): the config files and tokenizers go through
`bertjax.core.files` (a remote tokenizer is read from a local copy), orbax reads the checkpoints itself.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import ml_collections

from bertjax import convert, errors, objectives
from bertjax import model as model_lib
from bertjax.convert import files as convert_files
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files

SOURCES = ("pretraining", "finetuned", "hf")


@dataclasses.dataclass
class Weights:
  source: str  # one of SOURCES
  cfg: model_lib.BertConfig  # the saved architecture with the overrides applied
  params: dict  # a partial tree in cfg's layer layout: `bert` (the encoder) and whatever heads were asked for
  tokenizer: str  # local path of a vocab.txt or sentencepiece .model ("" if the source names none)
  do_lower_case: bool
  meta: dict = dataclasses.field(default_factory=dict)  # finetune.json, HF config.json or the run's config


def source_of(path: str) -> str:
  files.reach(path)
  if files.isfile(files.join(path, "finetune.json")):
    return "finetuned"
  config = files.join(path, "config.json")
  if files.isdir(files.join(path, "checkpoints")):
    return "pretraining"
  if files.isfile(files.join(path, "modules.json")):
    return "hf"  # a sentence-transformers folder: its Transformer module is an HF folder (`hf_folder`)
  if files.isfile(config):
    try:
      is_run = "train" in files.read_json(config)  # a bertjax run's config, not an HF model's
    except (OSError, ValueError):
      is_run = False
    return "pretraining" if is_run else "hf"
  raise errors.CheckpointError(f"{path}: neither a bertjax workdir (checkpoints/ or finetune.json) nor an HF model "
                               "folder (config.json + model.safetensors)")


def hf_folder(path: str) -> str:
  """The HF model folder at `path`: `path` itself, or for a sentence-transformers folder the folder of its
  Transformer module (the root or a sub-folder, as modules.json says)."""
  modules = files.join(path, "modules.json")
  if not files.isfile(modules):
    return path
  try:
    stack = files.read_json(modules)
  except (OSError, ValueError) as e:
    raise errors.ConversionError(f"{modules}: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  first = stack[0] if isinstance(stack, list) and stack and isinstance(stack[0], dict) else {}
  if not str(first.get("type", "")).endswith(".Transformer"):
    raise errors.ConversionError(f"{modules}: the first module is {first.get('type') or 'missing'}, not a "
                                 "sentence-transformers Transformer")
  return files.join(path, first.get("path") or "")


FINETUNE_KEYS = ("task", "kind", "labels", "tokenizer", "do_lower_case", "model", "max_seq_length")


def finetune_meta(path: str) -> dict:
  """A fine-tuned workdir's finetune.json, checked to hold what every reader takes from it."""
  name = files.join(path, "finetune.json")
  try:
    meta = files.read_json(name)
  except (OSError, ValueError) as e:
    raise errors.CheckpointError(f"{name}: unreadable ({errors.one_line(e)})") from None
  missing = [k for k in FINETUNE_KEYS if not isinstance(meta, dict) or k not in meta]
  if missing:
    raise errors.CheckpointError(f"{name}: lacks {missing}; not the finetune.json a fine-tuning run writes")
  return meta


def finetuned_tokenizer(path: str, meta: dict) -> str:
  """A local path of a fine-tuned workdir's tokenizer (finetune.json names it relative to the workdir: its copy;
  absolute in older workdirs)."""
  name = meta["tokenizer"]
  if not files.is_remote(name) and not os.path.isabs(name):
    name = files.join(path, name)
  return convert_files.local_tokenizer(name)


def config_of(path: str) -> model_lib.BertConfig:
  """The architecture at `path` from its config files alone (no weights read)."""
  kind = source_of(path)
  if kind == "hf":
    path = hf_folder(path)
  if kind == "finetuned":
    return model_lib.BertConfig.from_dict(finetune_meta(path)["model"])
  name = files.join(path, "config.json")
  try:
    meta = files.read_json(name)
  except (OSError, ValueError) as e:
    raise errors.CheckpointError(f"{name}: unreadable ({e})") from None
  if kind == "hf":
    return convert.config_from_hf(meta)
  return model_lib.BertConfig.from_dict(meta["model"])


def load(path: str, *, overrides: Mapping[str, Any] | None = None, head: str = "all", num_labels: int = 0,
         step: int | None = None) -> Weights:
  """The weights at `path`.

  step: a pre-training workdir's checkpoint to read (default: its newest); a step it does not hold, or a step
  asked of a source without steps (a fine-tuned workdir, an HF folder), is one CheckpointError line.

  head: "all" (everything the source holds), "encoder" (only `bert`), "pretraining" (the MLM/NSP heads too; an
  HF folder must hold them), or an HF task head (`convert.TASK_HEADS`): an HF folder whose architecture is that
  head with `num_labels` labels keeps it (as HF's `from_pretrained` does), any other source gives its encoder.
  """
  overrides = dict(overrides or {})
  kind = source_of(path)
  if step is not None and kind != "pretraining":
    raise errors.CheckpointError(f"{path} is {'an HF folder' if kind == 'hf' else 'a fine-tuned workdir'}: it has "
                                 f"no steps to choose from (step {step} asks for a bertjax pre-training workdir's)")
  if kind == "finetuned":
    meta = finetune_meta(path)
    cfg = model_lib.BertConfig.from_dict({**meta["model"], **overrides})
    params = checkpoint_lib.restore_best(path)
    saved_scan = "layers" in params["bert"]["encoder"]
    tok, lower = finetuned_tokenizer(path, meta), meta["do_lower_case"]  # relative: the workdir's copy
  elif kind == "pretraining":
    meta = files.read_json(files.join(path, "config.json"))
    run = ml_collections.ConfigDict(meta)
    cfg = model_lib.BertConfig.from_dict({**run.model.to_dict(), **overrides})
    ckpt = checkpoint_lib.Checkpointer(path, read_only=True)
    if step is not None and step not in ckpt.steps():
      raise errors.CheckpointError(f"{path} holds no checkpoint at step {step}; it holds steps {ckpt.steps()}")
    params = ckpt.restore_params(step)
    objective = objectives.get(run)
    if head == "pretraining" and not objective.has_mlm_head:
      raise errors.ConfigError(f"{path} is a {objective.name!r} run: its model has no MLM head to pre-train from; "
                               "load it as an encoder (fine-tuning) or continue it in its own workdir")
    params = objective.encoder(params)  # e.g. ELECTRA: the discriminator, with the shared embeddings
    saved_scan = "layers" in params["bert"]["encoder"]
    tok, lower = run_tokenizer(path, run)
  else:
    path = hf_folder(path)
    meta, state = convert.read_hf_dir(path)
    cfg = convert.config_from_hf(meta, **overrides)
    params = _hf_params(path, meta, state, cfg, head, num_labels)
    saved_scan = False
    tok, lower = hf_tokenizer(path)
  if head == "encoder" or (head in convert.TASK_HEADS and kind != "hf"):  # an HF task head was handled above
    params = {"bert": params["bert"], **_shared_head(cfg, params)}
  params["bert"] = to_layout(params["bert"], cfg, saved_scan)
  return Weights(kind, cfg, params, tok, lower, meta)


def _hf_params(path: str, meta: dict, state: dict, cfg, head: str, num_labels: int) -> dict:
  """The params of an HF folder for `head` (see `load`): its own head where it holds the one asked for (a task
  head with `num_labels` labels; HF's `from_pretrained` keeps it too), else its encoder (and the MLM head where
  the folder's model has one, for a family whose task heads start from it)."""
  flat = cfg.replace(scan_layers=False)
  family = meta.get("model_type", "bert")
  arch = convert.head_of_architecture(meta)

  def read(h):
    try:
      return convert.from_state_dict(flat, state, head=h, family_name=family)[1]
    except convert.ConversionError as e:
      raise convert.ConversionError(f"{path}: {e}") from None
  if head == "all":
    params = read(arch or "auto")
  elif head == "pretraining":  # the MLM model where the folder holds one, else its encoder (heads start fresh)
    fam = convert.family(family)
    params = read(fam.mlm[1] if fam.auto_head(state) == fam.mlm[1] else "encoder")
  elif head in convert.TASK_HEADS and arch == head:
    params = read(head)
    out = params.get("qa_outputs", params.get("classifier"))
    if head != "question_answering" and out["kernel"].shape[-1] != num_labels:
      print(f"note: {path} holds a {head} head with {out['kernel'].shape[-1]} labels; the task has {num_labels}: "
            "the head starts fresh", flush=True)
      params = {"bert": params["bert"]}
  else:
    shares = head in convert.TASK_HEADS and arch in (None, "pretraining") and cfg.classifier_head == "prediction"
    params = read("auto" if shares else "encoder")
    if head in convert.TASK_HEADS and "bert" in params:
      params = {"bert": params["bert"], **_shared_head(cfg, params)}
  return params if "bert" in params else {"bert": params}


def _shared_head(cfg, params: dict) -> dict:
  """The task head's params a pre-trained model already holds: ModernBERT's task heads and its MLM head are one
  `ModernBertPredictionHead` (HF's task models load it from an MLM checkpoint by name)."""
  if cfg.classifier_head != "prediction":
    return {}
  if "head" in params:
    return {"head": params["head"]}
  if "mlm_transform" in params:
    return {"head": {"dense": params["mlm_transform"], "norm": params["mlm_ln"]}}
  return {}


def to_layout(bert: dict, cfg: model_lib.BertConfig, saved_scan: bool | None = None) -> dict:
  """The encoder params `bert` in cfg's layer layout: stacked on a `layers` axis for scanned layers, else one
  subtree per layer."""
  scanned = "layers" in bert["encoder"] if saved_scan is None else saved_scan
  if cfg.scan_layers and not scanned:
    return convert.stack_layers(bert, cfg.num_layers)
  if not cfg.scan_layers and scanned:
    return convert.unstack_layers(bert, cfg.num_layers)
  return bert


def run_tokenizer(workdir: str, run) -> tuple[str, bool]:
  """The tokenizer of a pre-training workdir: its own copy (WORKDIR/tokenizer/), else the one its data was made
  with; ("", True) when neither is readable from here (the weights are still usable; a caller that needs the
  tokenizer says so)."""
  from bertjax.data import tokenizer as tokenizer_lib
  from bertjax.data.pretraining import dataset
  data_dir = run.data.data_dir
  creation = {}
  try:
    creation = dataset.read_creation(data_dir) if data_dir else {}
  except (OSError, errors.Error):
    pass
  lower = creation.get("do_lower_case", run.data.get("do_lower_case", True))
  if files.is_remote(workdir):
    folder = files.join(workdir, "tokenizer")
    held = tokenizer_lib.find_in(files.local_copy(folder)) if files.isdir(folder) else None
  else:
    held = tokenizer_lib.find_in(os.path.join(workdir, "tokenizer"))
  if held is not None:
    return held, lower
  if not creation:
    return "", True
  return dataset.tokenizer_of(data_dir, creation)


def hf_tokenizer(path: str) -> tuple[str, bool]:
  """(the HF folder's tokenizer file, do_lower_case): `convert.files.hf_tokenizer`."""
  return convert_files.hf_tokenizer(path)
