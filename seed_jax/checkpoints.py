"""Checkpoints through the orbax `CheckpointManager`: save, verify, resume.

A step directory `workdir/checkpoints/<step>/` holds four items:

  state      the TrainState (step, params, opt_state), sharded arrays
  reference  the reference-policy params (optional; see `Checkpointer.save`)
  rng        the host rng's key data, a uint32 array
  host       JSON: the caller's host-side data (data-iterator position, seed
             counters, metric history, ...) beside the model config and the
             rng implementation

Orbax writes each step into a temporary directory and renames it when every
item is written, so a step directory that exists is complete. Once a save has
finished, a manifest of the step's files (see `manifests`: size and CRC-32
of each, or the size alone with `checksums=False`, which spares process 0
reading every file back: at 7B on network storage that is tens of GB per
save) is added (to a step whose process stopped before that, or whose
manifest could not be written, which is logged, once it restores);
`restore_latest` checks it, and a step whose files no longer match, or that
fails to restore, is reported and skipped in favour of the step before it
(then moved to `workdir/corrupt_checkpoints/`). A file that cannot be read
for the check (an I/O error other than a missing file), even when tried
again, is raised instead: no verdict on the step, which stays in place.

On several processes, each reads its own shards without orbax's barriers and
the processes then compare outcomes: a step that fails on any process is
skipped (or raised) by all of them, so they always resume from the same step.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import time
from typing import Any, Mapping
import uuid
import warnings

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from seed_jax import distributed
from seed_jax import manifests
from seed_jax import model as model_lib

ITEMS = ("state", "reference", "rng", "host")
MANIFEST = manifests.MANIFEST  # the file name, in each step directory


class CorruptCheckpointError(RuntimeError):
  """No checkpoint restores, or the one asked for does not match its
  manifest, fails to restore or was deleted while it was read."""


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint step failed its file check or its restore and was skipped."""


class RestoreError(RuntimeError):
  """A step failed to restore in a way that is not corruption: a file that
  could not be read twice (an I/O error, on any process: the step is left in
  place), or another process's restore error (raised on the processes that
  restored it themselves)."""


@dataclasses.dataclass
class _Attempt:
  """One process's try at restoring one step.

  kind: "ok"; "corrupt" (its files do not match the manifest); "unreadable"
  (a file could not be read for the check, twice: an I/O error, no verdict
  on the files); "mismatch" (another model's checkpoint); "failed" (the
  restore raised; the step has no checksums, so it may be damaged);
  "failed_verified" (the restore raised although the files match their
  checksums: the caller's target is wrong).
  vanished: the step failed (check or restore) and an item that was there
  when the attempt started is gone (a run still training deleted the step:
  its max_to_keep).
  """
  kind: str
  message: str = ""
  restored: Any = None
  error: BaseException | None = None
  vanished: bool = False


def _is_collective_error(e: BaseException) -> bool:
  """Whether `e` comes from a cross-process barrier or collective (processes
  out of step, a peer gone), not from the checkpoint's files."""
  text = str(e)
  if isinstance(e, AssertionError) and "sync_global_devices" in text:
    return True
  runtime = getattr(jax.errors, "JaxRuntimeError", None)
  return bool(runtime and isinstance(e, runtime) and any(
      w in text for w in ("DEADLINE_EXCEEDED", "Barrier", "barrier",
                          "coordination service", "collective")))


@dataclasses.dataclass
class Restored:
  """What `Checkpointer.restore_latest` returns."""
  step: int
  state: Any  # the TrainState, in the requested shardings
  reference: Any  # reference params, or None when the step has none
  rng: jax.Array | None  # a typed key if a typed key was saved
  host: dict[str, Any]


def abstract_tree(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying shardings, the target of a sharded restore.

  Args:
    shapes: a pytree of arrays or ShapeDtypeStructs, e.g. from
      `jax.eval_shape(make_state)`.
    shardings: a matching pytree of `jax.sharding.Sharding`.

  Returns:
    The same tree of `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`.
  """
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      shapes, shardings)


def _config_dict(config: model_lib.ModelConfig | None) -> dict | None:
  """The model config as saved with every step and compared on restore.

  Without `attention_block`: how attention is split changes the arithmetic,
  not the model. A JSON round trip turns tuples into lists, as they will
  read back.
  """
  if config is None:
    return None
  fields = dataclasses.asdict(config)
  del fields["attention_block"]
  return json.loads(json.dumps(fields))


def check_writable(path: epath.PathLike) -> None:
  """Creates `path` if needed and checks that files can be written in it.

  Raises:
    PermissionError: naming the path, when it cannot be created or written.
  """
  path = epath.Path(path)
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write_probe_{os.getpid()}_{uuid.uuid4().hex}"
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise PermissionError(
        f"checkpoint directory {path} is not writable: {e}") from e


def check_free_space(path: epath.PathLike, min_bytes: int) -> None:
  """Checks that the filesystem holding `path` has `min_bytes` free.

  Meant for before any expensive work: a save that runs out of space fails
  late, in orbax's background thread. Paths that are not local directories
  (gs://...) are not checked.

  Args:
    path: an existing directory (e.g. after `check_writable`).
    min_bytes: the space the run needs, e.g. `tree_bytes(state) * (max_to_keep
      + 1)`.

  Raises:
    OSError: errno ENOSPC, naming the path, the free and the needed space.
  """
  local = os.fspath(path)
  if not os.path.isdir(local):
    return
  free = shutil.disk_usage(local).free
  if free < min_bytes:
    raise OSError(errno.ENOSPC,
                  f"only {_size(free)} free in {local}; the run needs at "
                  f"least {_size(min_bytes)} for its checkpoints; free some "
                  "space or use another workdir")


def _size(num_bytes: int) -> str:
  if num_bytes >= 2**30:
    return f"{num_bytes / 2**30:.2f} GiB"
  return f"{num_bytes / 2**20:.1f} MiB"


def tree_bytes(tree: Any) -> int:
  """Bytes of a pytree of arrays or ShapeDtypeStructs (one checkpoint copy)."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


class Checkpointer:
  """Saves and restores training checkpoints under `workdir/checkpoints`.

  Saves are asynchronous: `save` returns once the arrays are copied off the
  devices (so the state may be donated right after) and the files are written
  in the background. Call `wait()` before reading the files and `close()` (or
  use `with`) before the program exits.

  Example:

    with Checkpointer(workdir, model_config=config) as ckpt:
      restored = ckpt.restore_latest(abstract_state, abstract_reference)
      state = restored.state if restored else fresh_state()
      ...
      ckpt.save(step, state, rng=rng, host={"data_position": 17})
  """

  def __init__(self, workdir: epath.PathLike, *,
               model_config: model_lib.ModelConfig | None = None,
               max_to_keep: int = 3, save_interval: int = 1,
               keep_every: int = 0, asynchronous: bool = True,
               read_only: bool = False, checksums: bool = True):
    """Opens (and creates) the checkpoint directory.

    Args:
      workdir: the run's work directory; checkpoints go to its `checkpoints/`.
        A relative local path is made absolute (the current directory's).
      model_config: written with every step and compared on restore.
      max_to_keep: how many of the latest steps to keep on disk.
      keep_every: also keep, past `max_to_keep`, every step that is a
        multiple of this (e.g. the evaluated updates, to score them again
        later); 0: only the latest.
      save_interval: `save` writes only steps that are multiples of it
        (unless forced).
      asynchronous: write files in a background thread.
      read_only: only restore (`restore`; `restore_latest` may still move a
        corrupt step aside): nothing is created, and the temporary
        directories of a save in progress (a run still training) are left
        alone, where a writable Checkpointer deletes them when it opens.
      checksums: manifests record each file's CRC-32 besides its size (read
        back by process 0 after each save); False records sizes only, which
        still catches a truncated or missing file. A checksum already in a
        manifest is checked on restore either way.

    Raises:
      PermissionError: when the directory cannot be created or written
        (unless read_only).
      ValueError: max_to_keep or save_interval below 1 (0 kept would delete
        every checkpoint, the last one too), or keep_every below 0.
    """
    if not read_only and (max_to_keep < 1 or save_interval < 1):
      raise ValueError(f"max_to_keep={max_to_keep} and save_interval="
                       f"{save_interval} must both be at least 1")
    if keep_every < 0:
      raise ValueError(f"keep_every={keep_every} must be 0 (off) or more")
    if "://" not in str(workdir):
      # Orbax's writer refuses a relative path, but only in its background
      # thread, at `wait`. Made absolute against this process's working
      # directory, it names the folder that its own file operations would.
      workdir = os.path.abspath(workdir)
    self.workdir = epath.Path(workdir)
    self.directory = self.workdir / "checkpoints"
    if not read_only:
      check_writable(self.directory)
    self._model = _config_dict(model_config)
    self._read_only = read_only
    self._unverified: list[int] = []
    self._checksums = checksums
    policies = ocp.checkpoint_managers
    if read_only:
      options = ocp.CheckpointManagerOptions(
          read_only=True, create=False, save_interval_steps=0)
    else:
      keep = [policies.LatestN(max_to_keep)]
      if keep_every:
        keep.append(policies.EveryNSteps(keep_every))
      options = ocp.CheckpointManagerOptions(
          save_decision_policy=policies.FixedIntervalPolicy(save_interval),
          preservation_policy=policies.AnyPreservationPolicy(keep),
          cleanup_tmp_directories=True,
          enable_async_checkpointing=asynchronous)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=ITEMS)
    self._reader = None  # see _read_manager
    self._closed = False

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
      return
    try:  # leaving on an error: that error is the one to see
      self.close()
    except Exception:  # pylint: disable=broad-except
      logging.exception("closing the checkpoints of %s after an error failed",
                        self.directory)

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, *, reference: Any = None,
           rng: jax.Array | None = None,
           host: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Starts saving one step (if `save_interval` allows, or `force`).

    The reference params are saved with each step they are given to, so
    every kept step restores on its own whatever `max_to_keep` deleted;
    pass None when the reference is cheap to rebuild (the base weights).

    Args:
      step: the update count, the step directory's name.
      state: the TrainState (any pytree of arrays).
      reference: the reference params, or None.
      rng: a typed key (`jax.random.key`) or raw uint32 key data, or None.
      host: JSON-serializable host-side data (copied before returning).
      force: save even when `save_interval` says not to.

    Returns:
      Whether a save was started.

    Raises:
      TypeError: when `host` is not JSON-serializable.
    """
    step = int(step)
    if not (force or self._manager.should_save(step)):
      return False
    # A JSON round trip checks the host data now rather than in the writer
    # thread, and snapshots it: the caller may mutate it while it is written.
    host = json.loads(json.dumps(dict(host or {})))
    self.wait()  # orbax waits for the previous save anyway
    impl = None
    if rng is not None and jax.dtypes.issubdtype(rng.dtype,
                                                 jax.dtypes.prng_key):
      impl = str(jax.random.key_impl(rng))
      rng = jax.random.key_data(rng)
    items = dict(
        state=ocp.args.StandardSave(state),
        host=ocp.args.JsonSave(dict(model_config=self._model, rng_impl=impl,
                                    host=host)))
    if reference is not None:
      items["reference"] = ocp.args.StandardSave(reference)
    if rng is not None:
      items["rng"] = ocp.args.StandardSave(np.asarray(rng, np.uint32))
    saved = self._manager.save(step, args=ocp.args.Composite(**items),
                               force=force)
    if saved:
      self._unverified.append(step)
    return saved

  def wait(self) -> None:
    """Blocks until every started save is on disk, with its manifest (one
    that cannot be written is logged; see `_write_manifests`)."""
    self._manager.wait_until_finished()
    self._write_manifests()

  def close(self) -> None:
    """Waits for pending saves and releases the manager (once; a second call
    does nothing)."""
    if self._closed:
      return
    self.wait()
    self._manager.close()
    if self._reader is not None:
      self._reader.close()
    self._closed = True

  def _read_manager(self) -> ocp.CheckpointManager:
    """A read-only manager whose restores skip orbax's barriers.

    Orbax ends each restore with a barrier; a process whose restore raises
    skips it, and the others, waiting there, would pair it with whatever
    collective that process calls next. Restoring without barriers keeps
    every restore local; the processes then agree on the outcome
    (`_agree`), one collective that every process reaches.
    """
    if self._reader is None:
      me = jax.process_index()
      # Orbax warns that the directory is read only: only this manager is.
      absl_logger = logging.getLogger("absl")
      quiet = lambda record: not str(record.msg).startswith(
          "Given directory is read only")
      absl_logger.addFilter(quiet)
      try:
        self._reader = ocp.CheckpointManager(
            self.directory, item_names=ITEMS,
            options=ocp.CheckpointManagerOptions(
                read_only=True, create=False, save_interval_steps=0,
                multiprocessing_options=ocp.options.MultiprocessingOptions(
                    primary_host=me, active_processes={me})))
      finally:
        absl_logger.removeFilter(quiet)
    return self._reader

  def _write_manifests(self) -> None:
    """Writes the manifests of the steps saved since the last call
    (process 0).

    A failure is only logged, as `_add_missing_manifest`'s: the step itself
    is complete, is checked by its restore meanwhile and gets its manifest
    once it restores (and the other processes, which write none, would
    otherwise wait for this one at the next save).
    """
    if jax.process_index() == 0:
      for step in self._unverified:
        step_dir = self.directory / str(step)
        try:
          if step_dir.exists():  # not already removed by max_to_keep
            manifests.write_manifest(step_dir, checksums=self._checksums)
        except OSError as e:
          logging.warning("could not write the manifest of checkpoint step "
                          "%d in %s: %s; it is written once the step "
                          "restores", step, self.directory, e)
    self._unverified = []

  def restore_latest(self, abstract_state: Any,
                     abstract_reference: Any = None) -> Restored | None:
    """Restores the latest intact step, each device reading its own shards.

    Args:
      abstract_state: the TrainState as `jax.ShapeDtypeStruct`s with
        shardings (see `abstract_tree`); arrays are placed accordingly.
      abstract_reference: the same for the reference params, or None to
        skip them.

    Every step's files are first checked against its manifest (one extra
    read of the checkpoint). A step that fails that check, or has no
    checksums (no manifest, or a size-only one) and fails to restore, is
    skipped with a `CorruptCheckpointWarning`; once an earlier step
    restores, skipped steps are moved to `workdir/corrupt_checkpoints/`.
    On several processes, a step that fails so on any process is skipped by
    all of them (the warning names the process), and the list of steps is
    process 0's.

    Returns:
      The restored step, or None when the workdir holds no checkpoint.

    Raises:
      ValueError: when the checkpoint was written for a different model
        config than this Checkpointer's; orbax's errors when an intact step
        does not fit `abstract_state`.
      RestoreError: on the other processes, when one process raised such an
        error (that process raises its own); on every process, when a file
        of a step could not be read for its check, twice (an I/O error is
        no sign of corruption: the step is left in place).
      CorruptCheckpointError: when checkpoints exist but none restores, or
        a skipped step cannot be moved aside (on every process).
    """
    self.wait()
    self._manager.reload()
    self._read_manager().reload()
    # Process 0's list: each process then tries the same steps in order.
    steps = distributed.broadcast_object(
        sorted(self._manager.all_steps(), reverse=True))
    skipped = []
    for step in steps:
      mine = self._attempt(step, abstract_state, abstract_reference)
      problem = self._agree(step, mine, fall_back=True)
      if problem is None:
        # Moved aside only now that an earlier step restored into the same
        # target (so the target was not the problem), and so that the next
        # save of those steps does not collide with them.
        for bad in skipped:
          self._quarantine(bad)
        self._add_missing_manifest(step, abstract_reference)
        return mine.restored
      warnings.warn(f"checkpoint step {step} in {self.directory} is corrupt "
                    f"({problem}); falling back to an earlier step",
                    CorruptCheckpointWarning, stacklevel=2)
      skipped.append(step)
    if steps:
      raise CorruptCheckpointError(
          f"no checkpoint in {self.directory} restores (tried steps "
          f"{steps}); see the warnings above")
    return None

  def restore(self, step: int, abstract_state: Any,
              abstract_reference: Any = None) -> Restored:
    """Restores one given step (e.g. to evaluate it), with no fallback.

    Args:
      step: the step to restore; one of `all_steps()`.
      abstract_state, abstract_reference: as in `restore_latest`.

    Returns:
      The restored step.

    Raises:
      ValueError: when the step does not exist (the message lists the
        existing ones) or was written for a different model config.
      CorruptCheckpointError: when the step's files do not match its
        manifest (on any process), or its restore raised here: the message
        says whether the step was deleted meanwhile (a run still training
        drops steps past its max_to_keep) and else names orbax's error (an
        intact step that does not fit `abstract_state`, say).
      RestoreError: on the other processes, when the restore raised on one;
        on every process, when a file could not be read, twice.
    """
    self.wait()
    self._manager.reload()
    self._read_manager().reload()
    steps = distributed.broadcast_object(sorted(self._manager.all_steps()))
    if step not in steps:
      raise ValueError(f"no checkpoint step {step} in {self.directory}; the "
                       f"steps there are {steps}")
    mine = self._attempt(step, abstract_state, abstract_reference)
    try:
      problem = self._agree(step, mine, fall_back=False)
    except Exception as e:  # pylint: disable=broad-except
      if e is mine.error and mine.kind in ("failed", "failed_verified"):
        raise CorruptCheckpointError(self._failure(step, mine)) from e
      raise
    if problem is not None:
      raise CorruptCheckpointError(
          self._failure(step, mine, problem)) from mine.error
    self._add_missing_manifest(step, abstract_reference)
    return mine.restored

  def _failure(self, step: int, mine: _Attempt,
               problem: str | None = None) -> str:
    """Why `restore` failed: the step was deleted meanwhile (here), is
    corrupt (`problem`, every process's verdict), or raised here."""
    where = f"checkpoint step {step} in {self.directory}"
    if mine.vanished:
      try:
        reader = self._read_manager()
        reader.reload()
        kept = sorted(s for s in reader.all_steps() if s != step)
        left = f"; the steps there now are {kept}"
      except Exception:  # pylint: disable=broad-except
        left = ""  # the deletion is the news
      return (f"{where} was deleted while it was being read (by the run's "
              f"max_to_keep, if it is still training){left} ({mine.message})")
    if problem is not None:
      return f"{where} is corrupt ({problem})"
    hint = ("; its files match their checksums, so the restore target may "
            "not fit it" if mine.kind == "failed_verified" else "")
    return f"{where} could not be read ({mine.message}){hint}"

  def _add_missing_manifest(self, step: int, abstract_reference: Any) -> None:
    """Writes the manifest of a step just restored that has none
    (process 0; not when read-only).

    A step whose process stopped between its save and its manifest (a
    crash, a SIGTERM) would otherwise never get one, so never be checked.
    Its restore vouches for the files it read: a step holding reference
    params that were not restored gets none. A failure is only logged (the
    step stays checked by its restores, as before).
    """
    step_dir = self.directory / str(step)
    if (self._read_only or jax.process_index() != 0
        or (abstract_reference is None and (step_dir / "reference").exists())):
      return
    try:
      if not (step_dir / MANIFEST).exists():
        manifests.write_manifest(step_dir, checksums=self._checksums)
        logging.info("wrote the missing manifest of checkpoint step %d in %s",
                     step, self.directory)
    except OSError as e:
      logging.warning("could not write the missing manifest of checkpoint "
                      "step %d in %s: %s", step, self.directory, e)

  def _attempt(self, step: int, abstract_state: Any,
               abstract_reference: Any) -> _Attempt:
    """This process's restore of `step`, collective-free: its outcome."""
    step_dir = self.directory / str(step)
    # A step that fails with one of these gone was deleted meanwhile (by
    # the max_to_keep of a run still training, when read-only).
    present = [p for p in (step_dir / item for item in ITEMS) if p.exists()]
    vanished = lambda: not all(p.exists() for p in present)
    try:
      problem = manifests.check_manifest(step_dir)
    except FileNotFoundError as e:  # deleted meanwhile
      problem = f"{type(e).__name__}: {e}"
    except OSError as e:
      return _Attempt("unreadable", str(e), error=e)
    if problem is not None:
      return _Attempt("corrupt", problem, vanished=vanished())
    try:
      host = self._read_manager().restore(step, args=ocp.args.Composite(
          host=ocp.args.JsonRestore())).host
      self._check_model(host.get("model_config"))
      restored = self._restore(step, host, abstract_state, abstract_reference)
    except ModelMismatchError as e:
      return _Attempt("mismatch", str(e), error=e)
    except Exception as e:  # pylint: disable=broad-except
      if _is_collective_error(e):
        raise  # the processes are out of step: no verdict on the files
      # Files that match their checksums are intact: the failure is the
      # caller's (an abstract state of another structure, say). Sizes alone
      # do not tell, so such a step falls back like one without a manifest.
      kind = "failed_verified" if manifests.checksummed(step_dir) else "failed"
      return _Attempt(kind, f"{type(e).__name__}: {e}", error=e,
                      vanished=vanished())
    return _Attempt("ok", restored=restored)

  def _agree(self, step: int, mine: _Attempt, *, fall_back: bool
             ) -> str | None:
    """Every process's outcome of `step`, one verdict for all of them.

    A collective: every process calls it once per step tried.

    Returns:
      None when every process restored the step; else what went wrong, for
      a step to skip (`fall_back`) or report.

    Raises:
      RestoreError: a file that could not be read twice, on any process.
      ModelMismatchError: another model's checkpoint, on any process.
      Exception: a step that fails to restore although its files match
        their checksums (or any failure, unless `fall_back`): the restore's
        own error where it failed, RestoreError on the other processes.
    """
    outcomes = distributed.allgather_objects((mine.kind, mine.message))
    several = len(outcomes) > 1

    def named(kinds):  # "process 1: why", processes alike grouped
      messages = [m if k in kinds else None for k, m in outcomes]
      if not several:
        return "; ".join(m for m in messages if m is not None)
      return distributed.by_process(messages)

    kinds = {k for k, _ in outcomes}
    if kinds == {"ok"}:
      return None
    if "unreadable" in kinds:  # raised: skipping would lose an intact step
      where = f"checkpoint step {step} in {self.directory}"
      raise RestoreError(
          f"{where} could not be checked: {named({'unreadable'})}; it was "
          "left in place: fix the storage (or the files' permissions) and "
          "start again") from (mine.error if mine.kind == "unreadable"
                               else None)
    if "corrupt" in kinds:
      return named({"corrupt"})
    if "mismatch" in kinds:
      if mine.kind == "mismatch":
        raise mine.error
      raise ModelMismatchError(next(m for k, m in outcomes
                                    if k == "mismatch"))
    # Raised, not skipped: a failure that the files' checksums clear, or
    # any failure of a step asked for by number.
    fatal = {"failed_verified"} if fall_back else {"failed", "failed_verified"}
    if kinds & fatal:
      if mine.kind in fatal:
        raise mine.error
      raise RestoreError(
          f"checkpoint step {step} in {self.directory} failed to restore on "
          f"another process ({named(fatal)})")
    return named({"failed"})

  def _restore(self, step, host, abstract_state, abstract_reference):
    step_dir = self.directory / str(step)
    items = dict(state=ocp.args.StandardRestore(abstract_state))
    has_ref = (step_dir / "reference").exists()
    if abstract_reference is not None and has_ref:
      items["reference"] = ocp.args.StandardRestore(abstract_reference)
    if (step_dir / "rng").exists():
      items["rng"] = ocp.args.StandardRestore()
    out = self._read_manager().restore(step,
                                       args=ocp.args.Composite(**items))
    rng = None
    if "rng" in items:
      rng = jnp.asarray(out.rng, jnp.uint32)
      if host.get("rng_impl"):
        rng = jax.random.wrap_key_data(rng, impl=host["rng_impl"])
    reference = out.reference if "reference" in items else None
    logging.info("restored checkpoint step %d from %s", step, self.directory)
    return Restored(step=step, state=out.state, reference=reference, rng=rng,
                    host=host.get("host", {}))

  def _check_model(self, saved: dict | None) -> None:
    if self._model is None or saved is None or saved == self._model:
      return
    # A key one side lacks reads as None, the default of fields added later.
    diffs = [f"{k} {saved.get(k, '<unset>')} != {self._model.get(k, '<unset>')}"
             for k in sorted(set(saved) | set(self._model))
             if saved.get(k) != self._model.get(k)]
    if not diffs:
      return
    raise ModelMismatchError(
        f"workdir {self.workdir} holds a checkpoint of a different model: "
        f"{', '.join(diffs)} (checkpoint != this run); use another workdir "
        "or the checkpoint's model config")

  def _quarantine(self, step: int) -> None:
    """Moves a skipped step to `workdir/corrupt_checkpoints/` (process 0),
    every process told how that went.

    Raises:
      CorruptCheckpointError: on every process, when process 0 could not
        move it (left in place, the step would be tried again and collide
        with the next save of that step).
    """
    dest = self.workdir / "corrupt_checkpoints"

    def move():
      dest.mkdir(parents=True, exist_ok=True)
      (self.directory / str(step)).rename(
          dest / f"{step}.{time.strftime('%Y%m%d-%H%M%S')}")

    # Every process gets past it, whatever happened on process 0 (the
    # barrier after which the step is gone for everyone).
    error, failure = distributed.on_writer(move)
    self._manager.reload()
    if failure is not None:
      raise CorruptCheckpointError(
          f"checkpoint step {step} in {self.directory} is corrupt and could "
          f"not be moved to {dest} ({failure[1]}); move or delete it, then "
          "start again") from error


class ModelMismatchError(ValueError):
  """The checkpoint was written for another model config."""
