"""Device mesh from the config, logical-axis rules -> NamedShardings, batch sharding.

Mesh axes are (data, fsdp, tensor); a -1 in `mesh_shape` takes the remaining devices. Axis types are Auto, so
linen's logical partitioning (and `nn.Embed` on a sharded batch) works; trace under `use_mesh(mesh, rules)`.
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax import errors


class ShardingConfigError(errors.ConfigError):
  """A mesh that cannot be built on these devices, or a batch it cannot split."""


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  shape = [int(s) for s in shape]
  if any(s == 0 or s < -1 for s in shape):
    raise ShardingConfigError(f"mesh_shape {tuple(shape)}: sizes must be positive or -1")
  if shape.count(-1) > 1:
    raise ShardingConfigError(f"mesh_shape {tuple(shape)}: at most one -1 ('the remaining devices')")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ShardingConfigError(f"mesh_shape {tuple(shape)}: {num_devices} devices are not divisible by {known}")
    shape[shape.index(-1)] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ShardingConfigError(f"mesh_shape {tuple(shape)} has {math.prod(shape)} devices but there are "
                              f"{num_devices}")
  return tuple(shape)


def make_mesh(cfg, devices=None) -> jax.sharding.Mesh:
  """The mesh of `cfg.sharding` over `devices` (default: all), Auto axis types."""
  devices = list(jax.devices() if devices is None else devices)
  axes = tuple(cfg.sharding.mesh_axes)
  shape = mesh_shape(cfg.sharding.mesh_shape, len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(axes)
  if getattr(cfg.sharding, "num_slices", 1) > 1:
    from jax.experimental import mesh_utils
    slices = cfg.sharding.num_slices
    if shape[0] % slices:
      raise ShardingConfigError(f"the data axis {shape[0]} must be divisible by num_slices {slices}")
    dcn = (slices,) + (1,) * (len(axes) - 1)
    ici = (shape[0] // slices,) + shape[1:]
    arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
    return jax.sharding.Mesh(arr, axes, axis_types=auto)
  try:
    return jax.make_mesh(shape, axes, axis_types=auto, devices=devices)
  except TypeError:  # older signature without `devices`
    return jax.sharding.Mesh(np.array(devices).reshape(shape), axes, axis_types=auto)


def rules(cfg) -> tuple:
  return tuple((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes) for name, axes in cfg.sharding.rules)


@contextlib.contextmanager
def use_mesh(mesh, logical_rules):
  """Trace and run under the mesh and the logical-axis rules."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(logical_rules):
    yield


def batch_sharding(mesh) -> NamedSharding:
  """Rows of every batch array split over the data-parallel axes (data, fsdp)."""
  axes = tuple(a for a in ("data", "fsdp") if a in mesh.axis_names)
  return NamedSharding(mesh, P(axes))


def data_parallel_size(mesh) -> int:
  return math.prod(mesh.shape[a] for a in ("data", "fsdp") if a in mesh.axis_names)


def logical_to_shardings(boxed_tree, mesh, logical_rules):
  """NamedShardings for a (possibly abstract) tree of LogicallyPartitioned boxes; plain leaves replicated."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, logical_rules)
