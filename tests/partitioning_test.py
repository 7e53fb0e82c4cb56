"""Sharding on 8 fake CPU devices: outputs equal the 1-device outputs."""

import math

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from seed_jax import aot
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import sampler
from seed_jax import scorer
from seed_jax import testing


def test_make_mesh_sizes():
  assert jax.device_count() == 8
  mesh = partitioning.make_mesh((2, -1, 2))
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert partitioning.make_mesh((1, 1, 1), jax.devices()[:1]).size == 1
  with pytest.raises(ValueError, match="needs 6 devices"):
    partitioning.make_mesh((2, 3, 1))
  with pytest.raises(ValueError, match="at most one"):
    partitioning.make_mesh((-1, -1, 1))
  with pytest.raises(ValueError, match="axis 'data' must be a positive"):
    partitioning.make_mesh((0, -1, 1))
  with pytest.raises(ValueError, match="axis 'data' must be a positive"):
    partitioning.make_mesh((-2, -1, 1))


def test_make_mesh_places_devices_by_topology(monkeypatch, caplog):
  devices = jax.devices()
  calls = []

  def by_topology(shape, devs, **kw):
    calls.append(tuple(shape))
    return np.asarray(devs[::-1]).reshape(shape)  # a "topology" order

  monkeypatch.setattr(partitioning.mesh_utils, "create_device_mesh",
                      by_topology)
  mesh = partitioning.make_mesh((2, -1, 2))
  assert calls == [(2, 2, 2)]
  assert list(mesh.devices.flat) == devices[::-1]

  def cannot(shape, devs, **kw):
    raise ValueError("no torus for this shape")

  monkeypatch.setattr(partitioning.mesh_utils, "create_device_mesh", cannot)
  with caplog.at_level("WARNING"):
    mesh = partitioning.make_mesh((2, -1, 2))
  assert list(mesh.devices.flat) == devices  # plain order
  assert "no torus for this shape" in caplog.text


class _SliceDevice:
  """A stand-in device of a multislice job: 2 slices of 4."""
  platform = device_kind = "cpu"

  def __init__(self, i):
    self.id, self.slice_index, self.process_index = i, i // 4, i // 4

  def __repr__(self):
    return f"{self.id}@s{self.slice_index}"


@pytest.mark.parametrize("shape,across", [((4, 2, 1), 0), ((2, 2, 2), 0),
                                          ((1, 8, 1), 1), ((1, 4, 2), 1)])
def test_several_slices_keep_tensor_and_fsdp_inside_a_slice(shape, across):
  devs = [_SliceDevice(i) for i in (0, 4, 1, 5, 2, 6, 3, 7)]  # interleaved
  grid = partitioning._device_grid(shape, devs)  # the real hybrid mesh
  slice_of = np.vectorize(lambda d: d.slice_index)(grid)
  assert grid.shape == shape
  # The axis across slices splits into one block per slice; along every
  # other axis a row stays within its slice.
  half = shape[across] // 2
  lo = np.take(slice_of, range(half), axis=across)
  hi = np.take(slice_of, range(half, shape[across]), axis=across)
  assert (lo == lo.flat[0]).all() and (hi == hi.flat[0]).all()
  assert lo.flat[0] != hi.flat[0]


def test_several_slices_that_tensor_would_cross_are_plain_with_a_warning(
    caplog):
  devs = [_SliceDevice(i) for i in (0, 4, 1, 5, 2, 6, 3, 7)]  # interleaved
  with caplog.at_level("WARNING"):
    grid = partitioning._device_grid((1, 1, 8), devs)
  assert [d.id for d in grid.flat] == list(range(8))  # slice by slice
  assert "tensor would cross them" in caplog.text


def test_batch_split_into_micro_batches_over_the_mesh():
  mesh = partitioning.make_mesh((1, -1, 1))  # batch over data x fsdp: 8 ways
  partitioning.check_batch_split(mesh, 32, 4)  # 8 rows per micro-batch
  with pytest.raises(ValueError, match="multiple of 8"):
    partitioning.check_batch_split(mesh, 32, 8)  # 4 rows over 8 devices


def test_rules_replicate_what_does_not_divide(caplog):
  partitioning._log_replicated.cache_clear()  # pylint: disable=protected-access
  mesh = partitioning.make_mesh((2, 2, 2))
  spec = partitioning.logical_to_spec(("embed", "heads", "head_dim"),
                                      (64, 9, 16), mesh)
  assert spec == P("fsdp", None, None)  # 9 heads do not split 2 ways
  assert "heads dimension 9 does not divide over mesh axes tensor" in (
      caplog.text)
  spec = partitioning.logical_to_spec(("batch", None), (8, 3), mesh)
  assert spec == P(("data", "fsdp"), None)
  custom = (("embed", None), ("mlp", ("fsdp", "tensor")))
  spec = partitioning.logical_to_spec(("embed", "mlp"), (64, 96), mesh, custom)
  assert spec == P(None, ("fsdp", "tensor"))


def test_sharded_sampler_and_scorer_equal_one_device():
  cfg = testing.tiny_config(family="qwen3")
  params1 = model_lib.init_params(cfg, jax.random.key(0))
  mesh = partitioning.make_mesh((2, 2, 2))
  shardings = partitioning.param_shardings(cfg, mesh)
  params8 = jax.device_put(params1, shardings)
  q = params8["layers"]["q_kernel"]
  assert q.sharding.spec == P(None, "fsdp", "tensor", None)
  assert len({s.device for s in q.addressable_shards}) == 8
  assert q.addressable_shards[0].data.shape == (2, 32, 2, 16)
  # Sharded init from shapes lands in the same layout.
  init8 = partitioning.sharded_init(cfg, jax.random.key(0), mesh)
  assert init8["layers"]["q_kernel"].sharding == q.sharding
  np.testing.assert_array_equal(init8["layers"]["q_kernel"], q)

  rng = np.random.default_rng(0)
  b = sampler.pad_left([list(rng.integers(3, 128, n)) for n in (3, 7, 5, 8)],
                       buckets=(8,))
  kw = dict(config=cfg, max_new_tokens=10, sampling=sampler.Temperature(1.0))
  out1 = sampler.sample(params1, b.tokens, b.mask, jax.random.key(1), **kw)
  toks, mask = partitioning.shard_batch((b.tokens, b.mask), mesh)
  assert toks.sharding.spec == P(("data", "fsdp"), None)
  out8 = sampler.sample(params8, toks, mask, jax.random.key(1), **kw)
  np.testing.assert_array_equal(out1.tokens, out8.tokens)
  np.testing.assert_allclose(out1.logprobs, out8.logprobs, atol=1e-5)

  rmask = np.ones((4, 10), np.int32)
  s1 = scorer.score_dual(params1, b.tokens, b.mask, b.tokens[:, ::-1],
                         b.mask[:, ::-1], out1.tokens, rmask, config=cfg)
  r8 = partitioning.shard_batch((b.tokens, b.mask, b.tokens[:, ::-1].copy(),
                                 b.mask[:, ::-1].copy(),
                                 np.asarray(out1.tokens), rmask), mesh)
  s8 = scorer.score_dual(params8, *r8, config=cfg)
  for x, y in zip(s1, s8):
    np.testing.assert_allclose(x, y, atol=1e-5)


def test_batch_must_divide_mesh():
  mesh = partitioning.make_mesh((2, 2, 2))
  with pytest.raises(ValueError, match="does not divide"):
    partitioning.shard_batch(np.zeros((6, 3)), mesh)


def _per_device_bytes(shapes, shardings):
  return sum(math.prod(sh.shard_shape(s.shape)) * s.dtype.itemsize
             for s, sh in zip(jax.tree.leaves(shapes),
                              jax.tree.leaves(shardings)))


def test_fsdp_takes_another_dimension_where_embed_does_not_divide():
  # A hidden size of 36 does not split 8 ways; every other size does.
  cfg = testing.tiny_config(family="qwen3", hidden_size=36, num_heads=8,
                            intermediate_size=96)
  mesh = partitioning.make_mesh((1, -1, 1))
  sh = partitioning.param_shardings(cfg, mesh)
  spec = lambda *k: sh[k[0]][k[1]].spec
  assert spec("embed", "embedding") == P("fsdp", None)  # (vocab, embed)
  assert spec("layers", "gate_kernel") == P(None, None, "fsdp")  # mlp
  assert spec("layers", "down_kernel") == P(None, "fsdp", None)  # mlp
  # (layers, embed, heads 8, head_dim 16): the largest that divides.
  assert spec("layers", "q_kernel") == P(None, None, None, "fsdp")
  assert spec("layers", "attn_norm") == P(None, None)  # small: replicated
  shapes = model_lib.param_shapes(cfg)
  whole = sum(math.prod(s.shape) * s.dtype.itemsize
              for s in jax.tree.leaves(shapes))
  norms = sum(math.prod(s.shape) * s.dtype.itemsize
              for p, s in jax.tree_util.tree_leaves_with_path(shapes)
              if "norm" in jax.tree_util.keystr(p))
  assert _per_device_bytes(shapes, sh) == pytest.approx(
      (whole - norms) / 8 + norms, rel=0.05)
  # The same numbers as on one device; a sharded init lands in the layout
  # (with the one-device values, to float32 rounding, as on any mesh).
  params1 = model_lib.init_params(cfg, jax.random.key(0))
  params8 = jax.device_put(params1, sh)
  init8 = partitioning.sharded_init(cfg, jax.random.key(0), mesh)
  for a, b in zip(jax.tree.leaves(init8), jax.tree.leaves(params8)):
    assert a.sharding == b.sharding
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  rng = np.random.default_rng(0)
  b = sampler.pad_left(
      [list(rng.integers(3, 128, n)) for n in (3, 7, 5, 8)] * 2, buckets=(8,))
  kw = dict(config=cfg, max_new_tokens=6, sampling=sampler.Temperature(1.0))
  out1 = sampler.sample(params1, b.tokens, b.mask, jax.random.key(1), **kw)
  toks, mask = partitioning.shard_batch((b.tokens, b.mask), mesh)
  out8 = sampler.sample(params8, toks, mask, jax.random.key(1), **kw)
  np.testing.assert_array_equal(out1.tokens, out8.tokens)
  np.testing.assert_allclose(out1.logprobs, out8.logprobs, atol=1e-5)
  rmask = np.ones(out1.tokens.shape, np.int32)
  args = (b.tokens, b.mask, b.tokens[:, ::-1].copy(), b.mask[:, ::-1].copy(),
          np.asarray(out1.tokens), rmask)
  s1 = scorer.score_dual(params1, *args, config=cfg)
  s8 = scorer.score_dual(params8, *partitioning.shard_batch(args, mesh),
                         config=cfg)
  for x, y in zip(s1, s8):
    np.testing.assert_allclose(x, y, atol=1e-5)


def test_where_embed_divides_fsdp_the_rule_table_decides():
  cfg = aot.model_config("qwen2_5_7b")
  for shape in ((1, -1, 1), (1, 4, 2), (2, 2, 2)):
    mesh = partitioning.make_mesh(shape)
    sh = partitioning.param_shardings(cfg, mesh)
    want = jax.tree.map(
        lambda s, a: partitioning.logical_to_spec(a, s.shape, mesh),
        model_lib.param_shapes(cfg), model_lib.logical_axes(cfg),
        is_leaf=lambda x: isinstance(x, tuple))
    assert [x.spec for x in jax.tree.leaves(sh)] == jax.tree.leaves(
        want, is_leaf=lambda x: isinstance(x, P))


def test_a_large_parameter_fsdp_cannot_split_is_an_error(monkeypatch):
  # Qwen2.5-7B on 6 devices: 3,584 (hidden), 18,944 (mlp), 28 heads and
  # 128 (head_dim) do not split 6 ways; only the vocabulary does.
  cfg = aot.model_config("qwen2_5_7b")
  mesh = partitioning.make_mesh((1, -1, 1), jax.devices()[:6])
  with pytest.raises(ValueError) as info:
    partitioning.param_shardings(cfg, mesh)
  text = str(info.value)
  assert text.startswith("7 parameter(s) of the model do not split over the "
                         "6-way fsdp axis of mesh {'data': 1, 'fsdp': 6, "
                         "'tensor': 1}")
  assert ("layers/down_kernel (28, 18944, 3584) ('layers', 'mlp', 'embed') "
          "(7.08 GiB)") in text
  assert text.endswith("(data, fsdp, tensor) = (3, 2, 1)")
  # Where fsdp can be split, the vocabulary takes it.
  ok = partitioning.param_shardings(cfg, partitioning.make_mesh(
      (3, 2, 1), jax.devices()[:6]))
  assert ok["layers"]["down_kernel"].spec == P(None, None, "fsdp")
  # Small parameters are replicated (logged), up to MAX_REPLICATED_BYTES.
  tiny = testing.tiny_config()  # q_kernel (2, 64, 4, 16): nothing splits 6
  sh = partitioning.param_shardings(tiny, mesh)
  assert sh["layers"]["q_kernel"].spec == P(None, None, None, None)
  assert sh["layers"]["gate_kernel"].spec == P(None, None, "fsdp")  # 96
  monkeypatch.setattr(partitioning, "MAX_REPLICATED_BYTES", 1 << 10)
  with pytest.raises(ValueError, match=r"layers/q_kernel \(2, 64, 4, 16\)"):
    partitioning.param_shardings(tiny, mesh)
