"""The one place that knows the device mesh: axes, logical rules, shardings.

Model code names logical axes only (`embed`, `mlp`, `heads`, `kv_heads`,
`vocab`, `batch`, ...). This module maps them onto a mesh with axes
(data, fsdp, tensor) through a rule table, builds shardings from shapes, and
initializes or places parameters directly into their shards.

Parameters are fully sharded (FSDP) through their `embed` dimension: every
weight matrix has one, and the hidden size is usually a power-of-two multiple
that divides the `fsdp` axis. When it does not (a hidden size of 3,584 on a
24-way or 12-way `fsdp` axis, say: 3 nodes of 8 GPUs), `param_shardings`
splits another dimension of that parameter over `fsdp` instead: the largest
one that is not sharded already (over `tensor`), is not the scanned `layers`
axis, and divides the `fsdp` size (`mlp`, `vocab`, `heads`, `head_dim`, ...).
A parameter with no such dimension is replicated over `fsdp` (logged) when it
is at most `MAX_REPLICATED_BYTES` (the norm scales); a larger one is an
error: a `ValueError` that names the parameters, their shapes and the meshes
of the same devices that would shard every parameter. Where `embed` divides
`fsdp` the layout is exactly the rule table's.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Callable, Sequence

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from seed_jax import model as model_lib

MESH_AXES = ("data", "fsdp", "tensor")

# A parameter replicated over the fsdp axis (no dimension of it divides that
# axis) may be at most this large; a larger one makes `param_shardings` raise
# rather than silently keep a whole copy on every device.
MAX_REPLICATED_BYTES = 16 << 20
# Never the fallback fsdp dimension: the decoder scans over the stacked
# layers, and a scan over a sharded axis would gather the whole stack.
_NO_FSDP_FALLBACK = frozenset({"layers"})

# Logical axis -> mesh axis (or tuple of axes, or None for replicated).
# A dimension whose size the mesh axes do not divide is replicated instead
# (SmolLM2's 9 heads on a 2-way tensor axis, say): correct everywhere, and
# the table stays one table for every model. A parameter's `fsdp` moves to
# another dimension instead (`param_shardings`, see the module doc).
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
  propagates them inside, which is what every function here expects. The
  devices are placed by topology (see `_device_grid`).

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
  return Mesh(_device_grid(shape, devices), MESH_AXES,
              axis_types=(AxisType.Auto,) * 3)


def _device_grid(shape: Sequence[int],
                 devices: Sequence[jax.Device]) -> np.ndarray:
  """Devices laid out for fast collectives (TPU torus, GPU ids), else in order.

  `mesh_utils.create_device_mesh` maps the mesh onto the physical topology,
  so the innermost axes (tensor, then fsdp) ride the fastest links. Several
  TPU slices (multislice) put the data axis, else fsdp, across the slices,
  over the slower data-centre network; tensor never crosses a slice. Shapes
  the topology cannot take fall back to plain order, slice by slice.
  """
  plain = sorted(devices, key=lambda d: (getattr(d, "slice_index", 0), d.id))
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  try:
    if slices == 1:
      return mesh_utils.create_device_mesh(shape, devices,
                                           allow_split_physical_axes=True)
    for axis in (0, 1):  # data, then fsdp, across slices
      if shape[axis] % slices == 0:
        ici, dcn = list(shape), [1, 1, 1]
        ici[axis], dcn[axis] = shape[axis] // slices, slices
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=True)
    why = (f"neither data nor fsdp is a multiple of the {slices} slices, so "
           "tensor would cross them")
  except (ValueError, NotImplementedError, AssertionError) as e:
    why = str(e)
  logging.warning("mesh %s: devices in plain order, not by topology (%s)",
                  dict(zip(MESH_AXES, shape)), why)
  return np.asarray(plain).reshape(shape)


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


def _spec(names: Sequence[str | None], shape: Sequence[int] | None,
          sizes: Any, rules) -> tuple[list[Any], list[Any]]:
  """The rule table's spec (as a list) and the dimensions it replicated
  because their mesh axes do not divide them: (dim, axes, ways) each."""
  table = dict(rules)
  used: set[str] = set()
  spec: list[Any] = []
  dropped = []
  for i, name in enumerate(names):
    axes = table.get(name) if name is not None else None
    flat = (axes,) if isinstance(axes, str) else tuple(axes or ())
    flat = tuple(a for a in flat if a not in used and sizes.get(a, 1) > 1)
    size = math.prod(sizes[a] for a in flat)
    if flat and shape is not None and shape[i] % size:
      dropped.append((i, flat, size))
    if not flat or (shape is not None and shape[i] % size):
      spec.append(None)
      continue
    used.update(flat)
    spec.append(flat[0] if len(flat) == 1 else flat)
  return spec, dropped


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int] | None,
                    mesh: Mesh, rules=DEFAULT_RULES) -> P:
  """PartitionSpec for an array with the given logical axis names.

  A mesh axis is used at most once; a dimension the mesh axes do not divide
  is replicated (logged once per kind of dimension: it costs memory).
  Parameters go through `param_shardings`, which also moves `fsdp` to
  another dimension when `embed` does not divide it.
  """
  spec, dropped = _spec(names, shape, mesh.shape, rules)
  for i, axes, size in dropped:
    _log_replicated(names[i], shape[i], axes, size)
  return P(*spec)


def _param_spec(names: Sequence[str | None], shape: Sequence[int],
                sizes: Any, rules
                ) -> tuple[list[Any], list[Any], list[int], bool]:
  """A parameter's spec, with `fsdp` moved off an `embed` (or any rule's)
  dimension it does not divide onto one it does (see the module doc).

  Returns (spec, dropped, moved, stuck): `dropped` as `_spec`'s, less what
  found a place; `moved` the dimensions whose `fsdp` went elsewhere;
  `stuck` when the rules wanted `fsdp` here and no dimension takes it.
  """
  spec, dropped = _spec(names, shape, sizes, rules)
  fsdp = sizes.get("fsdp", 1)
  wanted = [d for d in dropped if "fsdp" in d[1]]
  if fsdp == 1 or not wanted or any(
      "fsdp" in ((a,) if isinstance(a, str) else tuple(a or ()))
      for a in spec):
    return spec, dropped, [], False
  free = [i for i, name in enumerate(names)
          if spec[i] is None and name not in _NO_FSDP_FALLBACK
          and shape[i] % fsdp == 0]
  if not free:
    return spec, dropped, [], True
  best = max(free, key=lambda i: (shape[i], -i))  # the largest, then first
  spec[best] = "fsdp"
  rest = []
  for i, axes, size in dropped:
    axes = tuple(a for a in axes if a != "fsdp")
    if axes:
      rest.append((i, axes, math.prod(sizes[a] for a in axes)))
  return spec, rest, [i for i, _, _ in wanted], False


def _stuck_params(leaves, sizes, rules) -> list[tuple[str, Any, Any, int]]:
  """The parameters above `MAX_REPLICATED_BYTES` that `fsdp` cannot split."""
  out = []
  for path, s, names in leaves:
    stuck = _param_spec(names, s.shape, sizes, rules)[3]
    nbytes = math.prod(s.shape) * np.dtype(s.dtype).itemsize
    if stuck and nbytes > MAX_REPLICATED_BYTES:
      out.append((path, s.shape, names, nbytes))
  return out


def _meshes_that_shard(leaves, mesh: Mesh, rules) -> list[tuple[int, int, int]]:
  """(data, fsdp, tensor) sizes of `mesh`'s devices, its tensor size kept,
  with fsdp > 1 and every parameter sharded; the largest fsdp first."""
  n, t = mesh.size, mesh.shape.get("tensor", 1)
  found = []
  for f in range(n // t, 1, -1):
    if n % (t * f) == 0 and not _stuck_params(
        leaves, {"data": n // (t * f), "fsdp": f, "tensor": t}, rules):
      found.append((n // (t * f), f, t))
  return found


@functools.lru_cache(maxsize=None)
def _log_moved(name: str, dim: int, size: int) -> None:
  logging.info("%s dimension %d does not divide the %d-way fsdp axis: those "
               "parameters shard over fsdp on another dimension", name, dim,
               size)


def param_shardings(config: model_lib.ModelConfig, mesh: Mesh,
                    rules=DEFAULT_RULES) -> Any:
  """NamedSharding for every parameter, from shapes only.

  `fsdp` goes on each parameter's `embed` dimension, or where that does not
  divide it, on another dimension that does (see the module doc).

  Raises:
    ValueError: a parameter larger than `MAX_REPLICATED_BYTES` that no
      dimension of splits over `fsdp` (it would be whole on every device);
      the message names them and meshes that would work.
  """
  shapes = model_lib.param_shapes(config)
  axes = model_lib.logical_axes(config)
  is_names = lambda x: isinstance(x, tuple)
  flat_axes, _ = jax.tree.flatten(axes, is_leaf=is_names)
  leaves = [(jax.tree_util.keystr(path, simple=True, separator="/"), s, a)
            for (path, s), a in zip(jax.tree_util.tree_leaves_with_path(shapes),
                                    flat_axes)]
  sizes = dict(mesh.shape)
  stuck = _stuck_params(leaves, sizes, rules)
  if stuck:
    shown = "; ".join(f"{path} {tuple(shape)} {tuple(names)} "
                      f"({nbytes / 2**30:.2f} GiB)"
                      for path, shape, names, nbytes in stuck[:4])
    if len(stuck) > 4:
      shown += f"; and {len(stuck) - 4} more"
    good = _meshes_that_shard(leaves, mesh, rules)[:3]
    tensor = sizes.get("tensor", 1)
    if good:
      advice = ("a mesh of these devices that shards every parameter, "
                "(data, fsdp, tensor) = " +
                " or ".join(str(m) for m in good))
    else:
      advice = (f"another tensor size: no (data, fsdp, {tensor}) mesh of "
                f"these devices with fsdp > 1 shards every parameter (fsdp "
                f"= 1, ({mesh.size // tensor}, 1, {tensor}), keeps a whole "
                "copy on each device, on purpose)")
    raise ValueError(
        f"{len(stuck)} parameter(s) of the model do not split over the "
        f"{sizes['fsdp']}-way fsdp axis of mesh {sizes}: no dimension of "
        f"theirs divides {sizes['fsdp']} (`layers` and dimensions split over "
        "`tensor` aside), so each would be whole on every device (each is "
        f"above partitioning.MAX_REPLICATED_BYTES, {MAX_REPLICATED_BYTES} "
        "bytes): "
        f"{shown}. Use {advice}")

  def one(s, names):
    spec, dropped, moved, _ = _param_spec(names, s.shape, sizes, rules)
    for i, ax, size in dropped:
      _log_replicated(names[i], s.shape[i], ax, size)
    for i in moved:  # the rules' dimension refused fsdp: it went elsewhere
      _log_moved(names[i], s.shape[i], sizes["fsdp"])
    return NamedSharding(mesh, P(*spec))

  specs = [one(s, names) for _, s, names in leaves]
  return jax.tree.unflatten(jax.tree.structure(shapes), specs)


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
