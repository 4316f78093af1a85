"""Shared config pieces: the argument-string parser and the sharding presets (mesh axes + logical rules)."""
from __future__ import annotations

import dataclasses

import ml_collections

from bertjax.core import phases as phases_lib
from bertjax.model.config import BertConfig

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis -> mesh axes. Parameters: vocab, embed, heads, kv, mlp, layers, position, segment_type, classes.
# Activations: activation_batch, activation_length, activation_embed, activation_heads, activation_kv,
# activation_mlp. A name missing from a preset's rules is replicated.
_ACTIVATION_BATCH = (("activation_batch", BATCH_AXES),)
SHARDING_PRESETS = {
    # Pure data parallelism: parameters replicated, the batch split over every device.
    "dp": dict(mesh_shape=(-1, 1, 1), rules=_ACTIVATION_BATCH),
    # Fully sharded data parallelism (ZeRO-3): every weight's `embed` axis split over `fsdp`.
    "fsdp": dict(mesh_shape=(1, -1, 1), rules=_ACTIVATION_BATCH + (("embed", "fsdp"),)),
    # FSDP x tensor parallelism (Megatron-style heads and FFN split over `tensor`; the vocabulary is not split:
    # BERT's 30522 is not divisible by common tensor sizes).
    "fsdp_tp": dict(mesh_shape=(1, -1, 4), rules=_ACTIVATION_BATCH + (
        ("embed", "fsdp"), ("heads", "tensor"), ("mlp", "tensor"),
        ("activation_heads", "tensor"), ("activation_mlp", "tensor"))),
    # Data parallel x tensor parallel, parameters not sharded over the batch axes.
    "dp_tp": dict(mesh_shape=(-1, 1, 4), rules=_ACTIVATION_BATCH + (
        ("heads", "tensor"), ("mlp", "tensor"),
        ("activation_heads", "tensor"), ("activation_mlp", "tensor"))),
}


SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "intermediate_size")


def model_section(variant: str, fields=None, **deltas) -> ml_collections.ConfigDict:
  """A config's `model` section: `variant` (a row of model.VARIANTS; its size fields stay 0 = from the variant),
  then each of `model.BertConfig`'s fields (or only `fields`) at the dataclass's default, where each is documented,
  except the recipe's `deltas`. The defaults live in one place: the dataclass."""
  defaults = {f.name: f.default for f in dataclasses.fields(BertConfig)}
  names = [n for n in defaults if n not in SIZE_FIELDS and (fields is None or n in fields)]
  unknown = set(deltas) - set(defaults)
  if unknown:
    raise ValueError(f"unknown model fields {sorted(unknown)}")
  section = {"variant": variant, **{n: 0 for n in SIZE_FIELDS}, **{n: defaults[n] for n in names}}
  section.update(deltas)
  return ml_collections.ConfigDict(section)


def phase(**fields) -> ml_collections.ConfigDict:
  """A phase of a run (config.phases.NAME): every field of bertjax.core.phases.FIELDS at its default (each
  documented there) but `fields`."""
  return phases_lib.defaults(**fields)


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'variant=large,seq=512,shard=fsdp_tp' -> ConfigDict; keys must be among `defaults`, values typed like them."""
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(","):
    if not item.strip():
      continue
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is not key=value (in {arg!r})")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; known: {sorted(defaults)}")
    kind = type(defaults[key])
    if kind is bool:
      if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"config argument {key}={value!r} is not a boolean")
      out[key] = value.lower() in ("true", "1", "yes")
    else:
      try:
        out[key] = kind(value)
      except ValueError:
        raise ValueError(f"config argument {key}={value!r} is not of type {kind.__name__}") from None
  return out


def override(c: ml_collections.ConfigDict, items) -> ml_collections.ConfigDict:
  """Applies 'a.b=value' strings to `c` in place, each value typed like the field it replaces."""
  for item in items or ():
    if "=" not in item:
      raise ValueError(f"override {item!r} is not key=value")
    path, value = (s.strip() for s in item.split("=", 1))
    *parents, leaf = path.split(".")
    node = c
    for p in parents:
      node = node[p] if p in node else None
      if not isinstance(node, ml_collections.ConfigDict):
        raise ValueError(f"override {path!r}: no such config section {p!r}")
    if leaf not in node:
      raise ValueError(f"override {path!r}: no such config field")
    if isinstance(node[leaf], ml_collections.ConfigDict):
      raise ValueError(f"override {path!r} names a config section, not a field; set one of {sorted(node[leaf])}")
    try:
      node[leaf] = parse_arg(f"v={value}", v=node[leaf]).v
    except ValueError:
      raise ValueError(f"override {path}={value!r} is not of type {type(node[leaf]).__name__}") from None
  return c


def sharding(preset: str, tensor: int | None = None) -> ml_collections.ConfigDict:
  if preset not in SHARDING_PRESETS:
    raise ValueError(f"unknown sharding preset {preset!r}; choose one of {sorted(SHARDING_PRESETS)}")
  p = SHARDING_PRESETS[preset]
  shape = list(p["mesh_shape"])
  if tensor is not None and shape[2] != 1:
    shape[2] = tensor
  return ml_collections.ConfigDict({"preset": preset, "mesh_axes": MESH_AXES, "mesh_shape": tuple(shape),
                                    "rules": tuple(p["rules"]), "num_slices": 1})
