"""Checkpoint round trips on a 2x2x2 mesh, resume, mismatch and corruption."""

import dataclasses
import errno
import functools
import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from seed_jax import checkpoints
from seed_jax import manifests
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import testing
from seed_jax import train_step as train_step_lib

CONFIG = testing.tiny_config()
TX = train_step_lib.make_optimizer(1e-3)


@pytest.fixture(autouse=True, scope="module")
def _no_replica_parallel_saves():
  """Saves without replica-parallel slicing, restored afterwards.

  Replica-parallel saving compiles one slice per array and replica; on 8
  fake CPU devices that is seconds per test for nothing tested here.
  """
  default = ocp.type_handlers.get_type_handler(jax.Array)
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
      override=True)
  yield
  ocp.type_handlers.register_type_handler(jax.Array, default, override=True)


@functools.lru_cache()
def _mesh():
  return partitioning.make_mesh((2, 2, 2))


def _state_shardings(mesh):
  return train_step_lib.state_shardings(
      TX, partitioning.param_shardings(CONFIG, mesh), mesh)


def _abstract(mesh):
  ref = checkpoints.abstract_tree(
      model_lib.param_shapes(CONFIG),
      partitioning.param_shardings(CONFIG, mesh))
  state = train_step_lib.abstract_state(TX, CONFIG, _state_shardings(mesh))
  return state, ref


@functools.lru_cache()
def _shapes():
  state = jax.eval_shape(lambda p: train_step_lib.TrainState.create(p, TX),
                         model_lib.param_shapes(CONFIG))
  return state, model_lib.param_shapes(CONFIG)


def _make(step):
  """A TrainState with adamw moments and a reference, values set by `step`.

  Filled on the host and placed shard by shard: compiling the real init for
  8 devices would take most of this file's time budget.
  """
  mesh = _mesh()
  rng = np.random.default_rng(step)

  def fill(s):
    if np.issubdtype(s.dtype, np.integer):
      return np.full(s.shape, step, s.dtype)
    return rng.standard_normal(s.shape).astype(s.dtype)

  state_shapes, ref_shapes = _shapes()
  state = jax.device_put(jax.tree.map(fill, state_shapes),
                         _state_shardings(mesh))
  ref = jax.device_put(jax.tree.map(fill, ref_shapes),
                       partitioning.param_shardings(CONFIG, mesh))
  return state, ref


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A workdir with steps 1, 2, 3 saved under max_to_keep=2 (2 and 3 kept)."""
  workdir = tmp_path_factory.mktemp("saved")
  with checkpoints.Checkpointer(workdir, model_config=CONFIG,
                                max_to_keep=2) as ckpt:
    for s in (1, 2, 3):
      state, ref = _make(s)
      ckpt.save(s, state, reference=ref if s != 3 else None,
                rng=jax.random.key(100 + s), host={"data_position": s})
  return workdir


def _copy(saved, tmp_path):
  shutil.copytree(saved, tmp_path / "run")
  return tmp_path / "run"


def test_round_trip_sharded(tmp_path):
  state, ref = _make(3)
  with checkpoints.Checkpointer(tmp_path, model_config=CONFIG) as ckpt:
    assert ckpt.restore_latest(*_abstract(_mesh())) is None
    ckpt.save(3, state, reference=ref, rng=jax.random.key(7),
              host={"data_position": 3, "history": [{"update": 3}]})
  abstract_state, abstract_ref = _abstract(_mesh())
  with checkpoints.Checkpointer(tmp_path, model_config=CONFIG) as ckpt:
    out = ckpt.restore_latest(abstract_state, abstract_ref)
  assert out.step == 3
  assert out.host == {"data_position": 3, "history": [{"update": 3}]}
  testing.assert_trees_equal(out.state, state)
  testing.assert_trees_equal(out.reference, ref)
  np.testing.assert_array_equal(jax.random.key_data(out.rng),
                                jax.random.key_data(jax.random.key(7)))
  for got, want in zip(jax.tree.leaves((out.state, out.reference)),
                       jax.tree.leaves((abstract_state, abstract_ref))):
    assert got.sharding == want.sharding
  # At least one array really is split across devices.
  assert any(not leaf.sharding.is_fully_replicated
             for leaf in jax.tree.leaves(out.state.params))


def test_max_to_keep_and_resume_latest(saved):
  with checkpoints.Checkpointer(saved, model_config=CONFIG) as ckpt:
    assert ckpt.all_steps() == [2, 3]
    out = ckpt.restore_latest(*_abstract(_mesh()))
  assert out.step == 3 and out.host == {"data_position": 3}
  assert out.reference is None  # step 3 was saved without one
  testing.assert_trees_equal(out.state, _make(3)[0])


def test_keep_every_keeps_those_steps_besides_the_latest(tmp_path):
  state, _ = _make(1)
  with checkpoints.Checkpointer(tmp_path, max_to_keep=2, keep_every=3,
                                asynchronous=False) as ckpt:
    for s in range(1, 9):
      ckpt.save(s, state)
    ckpt.wait()
    assert ckpt.all_steps() == [3, 6, 7, 8]
  kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  assert kept == ["3", "6", "7", "8"]
  with pytest.raises(ValueError, match="keep_every=-1"):
    checkpoints.Checkpointer(tmp_path / "other", keep_every=-1)


def test_half_written_step_is_never_restored(saved, tmp_path):
  workdir = _copy(saved, tmp_path)
  # What a save interrupted before orbax's final rename leaves behind.
  partial = workdir / "checkpoints" / "4.orbax-checkpoint-tmp-1234"
  partial.mkdir()
  (partial / "state").mkdir()
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    assert ckpt.restore_latest(_abstract(_mesh())[0]).step == 3


def test_close_is_once_and_an_error_leaving_the_block_is_kept(
    tmp_path, monkeypatch):
  ckpt = checkpoints.Checkpointer(tmp_path)
  ckpt.close()
  ckpt.close()  # a second close does nothing
  # A close that fails while an error leaves the block is logged; the error
  # that left the block is the one raised.
  with pytest.raises(KeyError, match="the first error"):
    with checkpoints.Checkpointer(tmp_path) as ckpt:
      monkeypatch.setattr(ckpt, "wait", lambda: 1 / 0)
      raise KeyError("the first error")
  with pytest.raises(ZeroDivisionError):  # without an error, close raises
    with checkpoints.Checkpointer(tmp_path) as ckpt:
      monkeypatch.setattr(ckpt, "wait", lambda: 1 / 0)


def test_host_data_must_be_json(tmp_path):
  with checkpoints.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(TypeError, match="JSON"):
      ckpt.save(1, _make(1)[0], host={"x": object()})


def test_save_interval(tmp_path):
  with checkpoints.Checkpointer(tmp_path, save_interval=2) as ckpt:
    state, _ = _make(1)
    assert not ckpt.save(1, state)
    assert ckpt.save(2, state)
    assert ckpt.save(3, state, force=True)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]


def test_different_model_is_a_clear_error(saved):
  other = CONFIG.replace(hidden_size=128)
  with checkpoints.Checkpointer(saved, model_config=other) as ckpt:
    with pytest.raises(ValueError,
                       match="different model: hidden_size 64 != 128"):
      ckpt.restore_latest(_abstract(_mesh())[0])
    assert ckpt.all_steps() == [2, 3]


def test_attention_block_is_not_a_different_model(saved):
  # How attention is split is arithmetic, not the model: such a checkpoint
  # restores (the compute dtype, by contrast, is still compared).
  other = CONFIG.replace(attention_block=0)
  with checkpoints.Checkpointer(saved, model_config=other) as ckpt:
    assert ckpt.restore_latest(_abstract(_mesh())[0]) is not None
    # A config written before a field existed lacks its key: None, the
    # default such fields are added with (here rope_scaling's).
    older = dataclasses.asdict(CONFIG)
    del older["attention_block"], older["rope_scaling"]
    assert CONFIG.rope_scaling is None
    ckpt._check_model(json.loads(json.dumps(older)))
    older["hidden_size"] = 128
    with pytest.raises(ValueError, match="hidden_size 128 != 64"):
      ckpt._check_model(json.loads(json.dumps(older)))


def test_intact_step_with_wrong_target_raises_and_stays(saved, tmp_path):
  workdir = _copy(saved, tmp_path)
  wrong = _abstract(_mesh())[0].params  # params alone, not a TrainState
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.raises(ValueError, match="tree structures do not match"):
      ckpt.restore_latest(wrong)
    assert ckpt.all_steps() == [2, 3]


def _largest_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir / "state")
           for f in fs]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize("damage",
                         ["truncate", "flip", "metadata_without_manifest",
                          "same_size_under_sizes_only"])
def test_corrupt_latest_falls_back(saved, tmp_path, damage):
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "3"
  path = _largest_file(step_dir)
  if damage == "flip":
    with open(path, "r+b") as f:
      f.seek(os.path.getsize(path) // 2)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0xFF]))
  elif damage == "truncate":
    os.truncate(path, os.path.getsize(path) // 2)
  elif damage == "same_size_under_sizes_only":  # checksums=False manifests
    manifest = step_dir / checkpoints.MANIFEST
    sizes = {k: [size, None] for k, (size, _) in
             json.loads(manifest.read_text()).items()}
    manifest.write_text(json.dumps(sizes))
    meta = step_dir / "state" / "_METADATA"
    meta.write_bytes(b"x" * os.path.getsize(meta))
  else:  # left to the restore to notice
    os.truncate(step_dir / "state" / "_METADATA", 10)
    os.remove(step_dir / checkpoints.MANIFEST)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.warns(checkpoints.CorruptCheckpointWarning, match="step 3"):
      out = ckpt.restore_latest(*_abstract(_mesh()))
    assert out.step == 2 and out.host == {"data_position": 2}
    testing.assert_trees_equal((out.state, out.reference), _make(2))
    # The corrupt step is moved aside, so step 3 can be saved again.
    assert ckpt.all_steps() == [2]
    assert ckpt.save(3, _make(3)[0])
  assert os.listdir(workdir / "corrupt_checkpoints")


@pytest.mark.parametrize("manifest", ["[]", "null", '{"state/x": 5}',
                                      '{"state/x": [1]}'])
def test_a_manifest_of_another_shape_is_unreadable(saved, tmp_path,
                                                   manifest):
  # Valid JSON, but not {file: [size, crc]}: skipped and moved aside as an
  # unreadable manifest is, not a raw TypeError from the resume.
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "3"
  (step_dir / checkpoints.MANIFEST).write_text(manifest)
  assert manifests.check_manifest(step_dir).startswith(
      f"unreadable manifest: {checkpoints.MANIFEST} ")
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.warns(checkpoints.CorruptCheckpointWarning,
                      match=r"step 3 .*\(unreadable manifest: "):
      assert ckpt.restore_latest(_abstract(_mesh())[0]).step == 2
    assert ckpt.all_steps() == [2]
  assert os.listdir(workdir / "corrupt_checkpoints")


def test_no_intact_step_is_an_error(saved, tmp_path):
  workdir = _copy(saved, tmp_path)
  for step in (2, 3):
    path = _largest_file(workdir / "checkpoints" / str(step))
    os.truncate(path, 1)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.warns(checkpoints.CorruptCheckpointWarning):
      with pytest.raises(RuntimeError, match=r"tried steps \[3, 2\]"):
        ckpt.restore_latest(_abstract(_mesh())[0])
    assert ckpt.all_steps() == [2, 3]  # nothing moved


def test_unwritable_workdir_under_a_file(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(PermissionError, match=str(tmp_path / "file")):
    checkpoints.Checkpointer(tmp_path / "file" / "run")


def test_a_relative_workdir_is_made_absolute(tmp_path, monkeypatch):
  """Orbax refuses a relative path only in its writer thread, at `wait`; the
  Checkpointer takes it from the current directory instead."""
  monkeypatch.chdir(tmp_path)
  value = jax.numpy.arange(4.0)
  with checkpoints.Checkpointer("run") as ckpt:
    assert ckpt.save(1, {"w": value})
    ckpt.wait()
    assert str(ckpt.workdir) == str(tmp_path / "run")
  assert (tmp_path / "run" / "checkpoints" / "1" / checkpoints.MANIFEST
          ).exists()
  target = {"w": jax.ShapeDtypeStruct(value.shape, value.dtype,
                                      sharding=value.sharding)}
  with checkpoints.Checkpointer("run", read_only=True) as ckpt:
    restored = ckpt.restore_latest(target)
  assert restored.step == 1
  np.testing.assert_array_equal(restored.state["w"], value)


@pytest.mark.skipif(os.geteuid() == 0,
                    reason="root writes through chmod; the test above "
                    "covers the error")
def test_unwritable_workdir_read_only(tmp_path):
  os.chmod(tmp_path, 0o500)
  try:
    with pytest.raises(PermissionError, match=str(tmp_path)):
      checkpoints.Checkpointer(tmp_path)
  finally:
    os.chmod(tmp_path, 0o700)


def test_restore_a_given_step(saved):
  with checkpoints.Checkpointer(saved, model_config=CONFIG) as ckpt:
    out = ckpt.restore(2, *_abstract(_mesh()))
    assert out.step == 2 and out.host == {"data_position": 2}
    testing.assert_trees_equal((out.state, out.reference), _make(2))
    with pytest.raises(ValueError, match=r"no checkpoint step 1 .*\[2, 3\]"):
      ckpt.restore(1, _abstract(_mesh())[0])


def test_restore_a_given_corrupt_step_is_an_error(saved, tmp_path):
  workdir = _copy(saved, tmp_path)
  os.truncate(_largest_file(workdir / "checkpoints" / "2"), 1)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.raises(checkpoints.CorruptCheckpointError,
                       match="step 2 .* corrupt"):
      ckpt.restore(2, _abstract(_mesh())[0])
    assert ckpt.all_steps() == [2, 3]  # nothing moved


def test_read_only_leaves_a_save_in_progress_alone(saved, tmp_path):
  workdir = _copy(saved, tmp_path)
  # What a run still training has on disk while it writes step 4.
  partial = workdir / "checkpoints" / "4.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG,
                                read_only=True) as ckpt:
    assert ckpt.all_steps() == [2, 3]
    assert ckpt.restore(3, _abstract(_mesh())[0]).step == 3
  assert partial.exists()
  assert sorted(os.listdir(workdir)) == ["checkpoints"]  # no probe left


def test_read_only_creates_nothing(tmp_path):
  with checkpoints.Checkpointer(tmp_path / "none", read_only=True) as ckpt:
    assert ckpt.all_steps() == [] and ckpt.latest_step() is None
  assert not (tmp_path / "none").exists()


def test_size_only_manifests(tmp_path, monkeypatch):
  read_back = []
  real = manifests._crc32  # pylint: disable=protected-access
  monkeypatch.setattr(manifests, "_crc32",
                      lambda p: read_back.append(p) or real(p))
  state, ref = _make(1)
  with checkpoints.Checkpointer(tmp_path, model_config=CONFIG,
                                checksums=False) as ckpt:
    ckpt.save(1, state, reference=ref)
  step_dir = tmp_path / "checkpoints" / "1"
  manifest = json.loads((step_dir / checkpoints.MANIFEST).read_text())
  assert manifest and all(crc is None for _, crc in manifest.values())
  assert not read_back  # no file was read back after the save
  assert manifests.check_manifest(step_dir) is None
  # A size still tells a truncated file.
  path = _largest_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)
  assert "bytes" in manifests.check_manifest(step_dir)


def test_a_collective_error_is_not_taken_for_corruption(saved, tmp_path,
                                                        monkeypatch):
  # A barrier that processes out of step fail says nothing about the files:
  # it is raised, not a reason to skip step 3 (whose size-only manifest
  # would let a real restore error fall back).
  workdir = _copy(saved, tmp_path)
  manifest = workdir / "checkpoints" / "3" / checkpoints.MANIFEST
  manifest.write_text(json.dumps(
      {k: [size, None] for k, (size, _) in
       json.loads(manifest.read_text()).items()}))
  real = checkpoints.Checkpointer._restore  # pylint: disable=protected-access

  def out_of_step(self, step, *args):
    if step == 3:
      raise AssertionError("sync_global_devices name mismatch ('restore')")
    return real(self, step, *args)

  monkeypatch.setattr(checkpoints.Checkpointer, "_restore", out_of_step)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.raises(AssertionError, match="name mismatch"):
      ckpt.restore_latest(_abstract(_mesh())[0])
    assert ckpt.all_steps() == [2, 3]  # nothing moved


def test_another_processs_mismatch_wins_over_a_failure_here(tmp_path,
                                                            monkeypatch):
  # Process 0 failed to read the step, process 1 found another model's
  # checkpoint: every process reports the mismatch, not process 0's error.
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(distributed, "allgather_objects", lambda mine: [
      mine, ("mismatch", "written for another model")])
  mine = checkpoints._Attempt(  # pylint: disable=protected-access
      "failed", "OSError: flaky read", error=OSError("flaky read"))
  with checkpoints.Checkpointer(tmp_path, model_config=CONFIG) as ckpt:
    with pytest.raises(checkpoints.ModelMismatchError,
                       match="another model"):
      ckpt._agree(3, mine, fall_back=True)  # pylint: disable=protected-access


def _flip(path):
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


def test_a_step_without_manifest_gets_one_once_it_restores(saved, tmp_path):
  # What a run killed between a save and its manifest leaves (the save is
  # complete, the manifest was to be written at the next save or close).
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "3"
  manifest = step_dir / checkpoints.MANIFEST
  os.remove(manifest)
  abstract_state, abstract_ref = _abstract(_mesh())
  # A read-only Checkpointer (evaluating a run still training) writes none.
  with checkpoints.Checkpointer(workdir, model_config=CONFIG,
                                read_only=True) as ckpt:
    assert ckpt.restore(3, abstract_state).step == 3
  assert not manifest.exists()
  # The restart's resume does, with checksums.
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    assert ckpt.restore_latest(abstract_state, abstract_ref).step == 3
  assert manifests.check_manifest(step_dir) is None
  assert all(crc is not None for _, crc in
             json.loads(manifest.read_text()).values())
  # From then on a flipped byte is caught by the check: the next resume
  # skips the step.
  _flip(_largest_file(step_dir))
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.warns(checkpoints.CorruptCheckpointWarning,
                      match="step 3 .*does not match its checksum"):
      assert ckpt.restore_latest(abstract_state, abstract_ref).step == 2


def test_a_missing_manifest_covers_only_what_the_restore_read(saved,
                                                              tmp_path):
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "2"  # saved with reference params
  manifest = step_dir / checkpoints.MANIFEST
  os.remove(manifest)
  abstract_state, abstract_ref = _abstract(_mesh())
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    assert ckpt.restore(2, abstract_state).step == 2
    assert not manifest.exists()  # the reference was not read
    assert ckpt.restore(2, abstract_state, abstract_ref).step == 2
  assert manifests.check_manifest(step_dir) is None
  assert any(name.startswith("reference/")
             for name in json.loads(manifest.read_text()))


@pytest.mark.parametrize("deleted,when", [
    ("state", "after the check"), ("the whole step", "after the check"),
    ("state", "before the check")])
def test_a_step_deleted_while_it_is_read_is_named(saved, tmp_path,
                                                  monkeypatch, deleted, when):
  # `evaluate --step=2` on a run still training, whose max_to_keep deletes
  # step 2 once its restore started: after its files were checked, the
  # restore fails; before, the check does.
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "2"
  real = manifests.check_manifest

  def then_deleted(path):
    problem = real(path) if when == "after the check" else None
    shutil.rmtree(step_dir / "state" if deleted == "state" else step_dir)
    return problem if when == "after the check" else real(path)

  monkeypatch.setattr(manifests, "check_manifest", then_deleted)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG,
                                read_only=True) as ckpt:
    with pytest.raises(checkpoints.CorruptCheckpointError,
                       match=r"step 2 in .*checkpoints was deleted while it "
                       r"was being read \(by the run's max_to_keep.*the "
                       r"steps there now are \[3\]"):
      ckpt.restore(2, _abstract(_mesh())[0])


def test_a_given_step_that_fails_to_restore_is_named(saved, tmp_path):
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "3"
  os.truncate(step_dir / "state" / "_METADATA", 10)
  os.remove(step_dir / checkpoints.MANIFEST)  # so only the restore tells
  abstract_state = _abstract(_mesh())[0]
  with checkpoints.Checkpointer(workdir, model_config=CONFIG,
                                read_only=True) as ckpt:
    with pytest.raises(checkpoints.CorruptCheckpointError,
                       match=r"step 3 in .*checkpoints could not be read "
                       r"\(\w+: ") as e:
      ckpt.restore(3, abstract_state)
    assert e.value.__cause__ is not None  # orbax's error, kept
    # An intact step (its checksums match) into the wrong target.
    with pytest.raises(checkpoints.CorruptCheckpointError,
                       match=r"(?s)step 2 .* could not be read \(ValueError: .*"
                       "tree structures do not match.*the restore target "
                       "may not fit it"):
      ckpt.restore(2, abstract_state.params)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "3"]


def test_a_manifest_that_cannot_be_written_is_logged_not_raised(
    tmp_path, monkeypatch, caplog):
  # The step is complete without it: the saves go on (on several processes
  # only process 0 writes manifests, so raising there would leave the
  # others waiting), and the step gets its manifest once it restores.
  def failing(step_dir, **kwargs):
    raise OSError(errno.EIO, "Input/output error (injected)")

  real = manifests.write_manifest
  state = _make(1)[0]
  ckpt = checkpoints.Checkpointer(tmp_path, model_config=CONFIG)
  assert ckpt.save(1, state)
  monkeypatch.setattr(manifests, "write_manifest", failing)
  with caplog.at_level("WARNING"):
    assert ckpt.save(2, state)  # after step 1's manifest failed
    ckpt.close()  # step 2's fails too
  for step in (1, 2):
    assert (f"could not write the manifest of checkpoint step {step} in "
            f"{tmp_path / 'checkpoints'}: [Errno 5] Input/output error "
            "(injected)") in caplog.text
  written = [tmp_path / "checkpoints" / str(s) / checkpoints.MANIFEST
             for s in (1, 2)]
  assert not any(m.exists() for m in written)
  monkeypatch.setattr(manifests, "write_manifest", real)
  abstract_state = _abstract(_mesh())[0]
  with checkpoints.Checkpointer(tmp_path, model_config=CONFIG) as ckpt:
    assert ckpt.restore_latest(abstract_state).step == 2
    assert ckpt.restore(1, abstract_state).step == 1
  assert all(m.exists() for m in written)
  assert manifests.check_manifest(written[0].parent) is None


@pytest.mark.parametrize("read", ["crc", "manifest"])
def test_a_read_error_once_is_retried_not_taken_for_corruption(
    saved, tmp_path, monkeypatch, read):
  # An EIO from a flaky disk or mount says nothing about the files: read
  # again, the intact newest step restores and nothing is moved aside.
  workdir = _copy(saved, tmp_path)
  failed = []
  name = "_crc32" if read == "crc" else "_read_manifest"
  real = getattr(manifests, name)

  def flaky(path):
    if not failed and "checkpoints/3/" in str(path):
      failed.append(path)
      raise OSError(errno.EIO, "Input/output error (injected)")
    return real(path)

  monkeypatch.setattr(manifests, name, flaky)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    out = ckpt.restore_latest(*_abstract(_mesh()))
    assert out.step == 3 and failed
    assert ckpt.all_steps() == [2, 3]
  assert not (workdir / "corrupt_checkpoints").exists()


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"),
                                   PermissionError(errno.EACCES,
                                                   "Permission denied")])
def test_a_read_error_that_persists_is_raised_and_the_step_kept(
    saved, tmp_path, monkeypatch, error):
  workdir = _copy(saved, tmp_path)
  step_dir = workdir / "checkpoints" / "3"
  victim = os.path.relpath(_largest_file(step_dir), step_dir)
  real = manifests._crc32  # pylint: disable=protected-access
  tries = []

  def failing(path):
    if str(path).endswith(victim):
      tries.append(path)
      raise error
    return real(path)

  monkeypatch.setattr(manifests, "_crc32", failing)
  with checkpoints.Checkpointer(workdir, model_config=CONFIG) as ckpt:
    with pytest.raises(checkpoints.RestoreError,
                       match=rf"step 3 in {workdir / 'checkpoints'} could not "
                       rf"be checked: {victim} could not be read, twice "
                       rf"\({type(error).__name__}: .*{error.strerror}\); "
                       "it was left in place") as e:
      ckpt.restore_latest(_abstract(_mesh())[0])
    assert e.value.__cause__ is not None
    assert len(tries) == 2  # tried once more, then raised
    assert ckpt.all_steps() == [2, 3]
    # A given step too.
    with pytest.raises(checkpoints.RestoreError, match=rf"step 3 .*{victim}"):
      ckpt.restore(3, _abstract(_mesh())[0])
  assert not (workdir / "corrupt_checkpoints").exists()


def test_a_read_error_on_another_process_is_raised_on_every_one(
    tmp_path, monkeypatch):
  # Process 1 could not read a file of the step; process 0 restored it: both
  # raise (neither skips the step, nor waits for the other).
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(distributed, "allgather_objects", lambda mine: [
      mine, ("unreadable", "state/d/x could not be read, twice (OSError: EIO)"),
      ("corrupt", "state/d/y is missing")])
  mine = checkpoints._Attempt("ok")  # pylint: disable=protected-access
  with checkpoints.Checkpointer(tmp_path, model_config=CONFIG) as ckpt:
    with pytest.raises(checkpoints.RestoreError,
                       match=r"step 3 .* could not be checked: process 1: "
                       r"state/d/x could not be read, twice"):
      ckpt._agree(3, mine, fall_back=True)  # pylint: disable=protected-access
