"""Pre-training objectives, chosen by `config.objective` (the registry below).

An objective owns what differs between pre-training recipes: its own config checks, the module it trains, the
example batch it is traced with, its jitted step and evaluation functions, how evaluation sums become metrics, its
FLOPs per step, and what the rest of bertjax reads of its checkpoints (the encoder, the HF export). The loop
(`bertjax.pretrain`) names none of them. A new objective is one module here and one line in `REGISTRY`.
"""
from __future__ import annotations

from bertjax import errors
from bertjax.objectives import electra, mlm
from bertjax.objectives.base import Objective

REGISTRY: dict[str, Objective] = {"mlm": mlm.OBJECTIVE, "electra": electra.OBJECTIVE}


def get(config) -> Objective:
  """The objective a run's config (a ConfigDict, or a workdir's config.json as a dict) names."""
  name = config.get("objective", "mlm")  # config.json of runs from before the key existed: MLM (+ NSP)
  if name not in REGISTRY:
    raise errors.ConfigError(f"objective {name!r} is not one of {sorted(REGISTRY)}")
  return REGISTRY[name]
