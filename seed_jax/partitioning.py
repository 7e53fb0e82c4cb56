"""The one place that knows the device mesh: axes, logical rules, shardings.

Model code names logical axes only (`embed`, `mlp`, `heads`, `kv_heads`,
`vocab`, `batch`, ...). This module maps them onto a mesh with axes
(data, fsdp, tensor) through a rule table, builds shardings from shapes, and
initializes or places parameters directly into their shards.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Callable, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from seed_jax import model as model_lib

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or tuple of axes, or None for replicated).
# A dimension whose size the mesh axes do not divide is replicated instead
# (SmolLM2's 9 heads on a 2-way tensor axis, say): correct everywhere, and
# the table stays one table for every model.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("length", None),
)


def parse_mesh(text: str) -> tuple[int, int, int]:
  """"1,-1,1" -> (1, -1, 1).

  Raises:
    ValueError: naming --mesh, unless three integers (positive, or -1).
  """
  try:
    sizes = tuple(int(s) for s in text.split(","))
  except ValueError:
    sizes = ()
  if len(sizes) != 3 or any(s < 1 and s != -1 for s in sizes):
    raise ValueError(f"--mesh={text}: want three sizes data,fsdp,tensor, "
                     "each a positive integer or -1, e.g. --mesh=1,-1,1")
  return sizes


def make_mesh(shape: Sequence[int] = (-1, 1, 1),
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 (the rest of devices).

  Axes are `Auto`: shardings are given on jit inputs and outputs and XLA
  propagates them inside, which is what every function here expects.

  Raises:
    ValueError: when the sizes do not multiply to the device count.
  """
  devices = list(devices if devices is not None else jax.devices())
  shape = list(shape)
  if len(shape) != 3:
    raise ValueError(f"mesh shape needs 3 sizes for {MESH_AXES}, got {shape}")
  for axis, size in zip(MESH_AXES, shape):
    if size != -1 and (not isinstance(size, (int, np.integer)) or size < 1):
      raise ValueError(f"mesh size of axis {axis!r} must be a positive "
                       f"integer or -1, got {size!r} in {shape}")
  if shape.count(-1) > 1:
    raise ValueError(f"at most one mesh size may be -1, got {shape}")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices do not divide into mesh "
                       f"{dict(zip(MESH_AXES, shape))}")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs "
                     f"{math.prod(shape)} devices, {len(devices)} available")
  dev = np.asarray(devices).reshape(shape)
  return Mesh(dev, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _mesh_axes_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return math.prod(mesh.shape[a] for a in axes)


@functools.lru_cache(maxsize=None)
def _log_replicated(name: str, dim: int, axes: tuple[str, ...],
                    size: int) -> None:
  logging.warning("%s dimension %d does not divide over mesh axes %s (%d "
                  "ways): replicated there", name, dim, "x".join(axes), size)


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int] | None,
                    mesh: Mesh, rules=DEFAULT_RULES) -> P:
  """PartitionSpec for an array with the given logical axis names.

  A mesh axis is used at most once; a dimension the mesh axes do not divide
  is replicated (logged once per kind of dimension: it costs memory).
  """
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for i, name in enumerate(names):
    axes = table.get(name) if name is not None else None
    flat = (axes,) if isinstance(axes, str) else tuple(axes or ())
    flat = tuple(a for a in flat if a not in used and mesh.shape.get(a, 1) > 1)
    size = _mesh_axes_size(mesh, flat)
    if flat and shape is not None and shape[i] % size:
      _log_replicated(name, shape[i], flat, size)
    if not flat or (shape is not None and shape[i] % size):
      spec.append(None)
      continue
    used.update(flat)
    spec.append(flat[0] if len(flat) == 1 else flat)
  return P(*spec)


def param_shardings(config: model_lib.ModelConfig, mesh: Mesh,
                    rules=DEFAULT_RULES) -> Any:
  """NamedSharding for every parameter, from shapes only."""
  shapes = model_lib.param_shapes(config)
  axes = model_lib.logical_axes(config)
  return jax.tree.map(
      lambda s, a: NamedSharding(mesh, logical_to_spec(a, s.shape, mesh, rules)),
      shapes, axes, is_leaf=lambda x: isinstance(x, tuple))


def sharded_init(config: model_lib.ModelConfig, rng: jax.Array, mesh: Mesh,
                 rules=DEFAULT_RULES) -> Any:
  """Random parameters created directly in their shards (never whole first)."""
  shardings = param_shardings(config, mesh, rules)
  init = jax.jit(functools.partial(model_lib.init_params, config),
                 out_shardings=shardings)
  return init(rng)


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=DEFAULT_RULES) -> NamedSharding:
  """Sharding of a [batch, ...] array: batch over the data-parallel axes."""
  spec = logical_to_spec(("batch",) + (None,) * (ndim - 1), None, mesh, rules)
  return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh, rules=DEFAULT_RULES) -> int:
  """How many ways the batch axis is split; batch sizes must divide it."""
  return _mesh_axes_size(mesh, dict(rules).get("batch"))


def check_batch_split(mesh: Mesh, batch: int, micro_batches: int,
                      rules=DEFAULT_RULES) -> None:
  """Raises ValueError unless `batch` rows split into `micro_batches` equal
  micro-batches that each split over the data-parallel devices."""
  dp = data_parallel_size(mesh, rules)
  if micro_batches < 1 or batch % (dp * micro_batches):
    raise ValueError(
        f"a batch of {batch} rows does not split into {micro_batches} "
        f"micro-batches over the {dp}-way data-parallel mesh "
        f"{dict(mesh.shape)}: batch / micro_batches must be a multiple of "
        f"{dp} (fewer micro-batches, or a mesh with fewer data x fsdp ways)")


def shard_batch(tree: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
  """Places host arrays [batch, ...] on the mesh, batch split across devices.

  Raises:
    ValueError: when a batch size does not divide the data-parallel size.
  """
  n = data_parallel_size(mesh, rules)

  def put(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.device_put(x, replicated(mesh))
    if x.shape[0] % n:
      raise ValueError(f"batch of {x.shape[0]} rows does not divide the "
                       f"{n}-way data-parallel mesh {dict(mesh.shape)}")
    return jax.device_put(x, batch_sharding(mesh, x.ndim, rules))

  return jax.tree.map(put, tree)


def host_to_global(tree: Any, shardings: Any) -> Any:
  """Host arrays, the same on every process -> global arrays, by callback.

  Each device takes its own slice; nothing is gathered on one device.
  """
  def put(x, sh):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])
  return jax.tree.map(put, tree, shardings)


def pjit(fn: Callable, *, in_shardings=None, out_shardings=None,
         donate_argnums=(), static_argnames=()) -> Callable:
  """`jax.jit` with explicit shardings and donation (today's pjit)."""
  kw: dict[str, Any] = dict(donate_argnums=donate_argnums,
                            static_argnames=static_argnames)
  if in_shardings is not None:
    kw["in_shardings"] = in_shardings
  if out_shardings is not None:
    kw["out_shardings"] = out_shardings
  return jax.jit(fn, **kw)
