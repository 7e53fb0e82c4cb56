"""Multi-host start-up and the split of host-side work across processes.

Every host runs the same program. `initialize` starts `jax.distributed` when
the launch asks for it and does nothing on a single host; the helpers below
then split tasks by process and gather host-side results back.

The launch asks through the environment (launch/*.sh set these):

  SEED_COORDINATOR=10.0.0.2:8476  # process 0's address; implies multi-process
  SEED_NUM_PROCESSES=4            # with SEED_COORDINATOR
  SEED_PROCESS_ID=1               # with SEED_COORDINATOR
  SEED_DISTRIBUTED=1              # no address: JAX detects it (TPU VM, Slurm)
  SEED_LOCAL_DEVICE_IDS=0,1,2,3   # the accelerators this process drives
  SEED_LOCAL_DEVICES=4            # fake CPU devices per process (tests)

Without SEED_LOCAL_DEVICE_IDS, JAX's cluster detection gives a process
under Slurm only the GPU of its local task id: one GPU per node when one
process drives the node (launch/slurm_gpu.sh sets every GPU of the node).
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any, Callable, Mapping, Sequence, TypeVar

import jax
from jax.experimental import multihost_utils
import numpy as np

T = TypeVar("T")


def _platforms() -> str:
  return (jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or "")


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None, *,
               env: Mapping[str, str] | None = None) -> bool:
  """Starts `jax.distributed` when asked to; call before any JAX computation.

  Arguments win over the environment variables of the module docstring.
  With neither an address nor SEED_DISTRIBUTED=1 this is a no-op (a single
  host, CPU or one accelerator VM). On CPU, cross-process collectives go
  through gloo.

  Args:
    coordinator_address: "host:port" of process 0.
    num_processes: how many processes take part.
    process_id: this process's index in [0, num_processes).
    env: the environment to read (default `os.environ`).

  Returns:
    Whether `jax.distributed` is (now) initialized.

  Raises:
    ValueError: an address without the process count and id, more than one
      process without an address (or SEED_DISTRIBUTED=1), a
      SEED_DISTRIBUTED that is neither true nor false, a process count, id,
      device ids or SEED_LOCAL_DEVICES that are not integers (the last
      below 1, too), or an id outside [0, count).
  """
  env = os.environ if env is None else env
  address = coordinator_address or env.get("SEED_COORDINATOR") or None
  flag = env.get("SEED_DISTRIBUTED", "").strip().lower()
  if flag not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
    raise ValueError(f"SEED_DISTRIBUTED={env['SEED_DISTRIBUTED']!r}: use 1 "
                     "(true, yes, on) or 0 (false, no, off)")
  auto = flag in ("1", "true", "yes", "on")
  if jax.distributed.is_initialized():
    return True
  local = env.get("SEED_LOCAL_DEVICES")
  if local:
    try:
      count = int(local)
    except ValueError:
      raise ValueError(f"SEED_LOCAL_DEVICES={local!r}: use a count of fake "
                       "CPU devices per process, e.g. 4") from None
    if count < 1:
      raise ValueError(f"SEED_LOCAL_DEVICES={local!r}: use a count of fake "
                       "CPU devices per process, 1 or more, e.g. 4")
    try:
      jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backends already up: a second call in-process
      logging.warning("SEED_LOCAL_DEVICES=%s ignored: JAX already started",
                      local)
  if num_processes is None and env.get("SEED_NUM_PROCESSES"):
    try:
      num_processes = int(env["SEED_NUM_PROCESSES"])
    except ValueError:
      raise ValueError(f"SEED_NUM_PROCESSES={env['SEED_NUM_PROCESSES']!r}: "
                       "use a process count, e.g. 2") from None
  if address is None and not auto:
    if num_processes is not None and num_processes > 1:
      # Each host would train alone, all of them in one workdir.
      raise ValueError(
          f"{num_processes} processes but no coordinator: set "
          "SEED_COORDINATOR=host:port (or SEED_DISTRIBUTED=1 where JAX finds "
          "it, TPU VMs and Slurm)")
    return False
  if process_id is None and env.get("SEED_PROCESS_ID"):
    try:
      process_id = int(env["SEED_PROCESS_ID"])
    except ValueError:
      raise ValueError(f"SEED_PROCESS_ID={env['SEED_PROCESS_ID']!r}: use "
                       "this process's index, 0 to SEED_NUM_PROCESSES - 1"
                       ) from None
  if (process_id is not None and num_processes is not None
      and not 0 <= process_id < num_processes):
    raise ValueError(f"process id {process_id} (SEED_PROCESS_ID) is not in "
                     f"[0, {num_processes}) for {num_processes} processes "
                     "(SEED_NUM_PROCESSES)")
  if address is not None and (num_processes is None or process_id is None):
    raise ValueError(
        f"coordinator {address} given without the process count and id: set "
        "SEED_NUM_PROCESSES and SEED_PROCESS_ID (or pass them)")
  ids = env.get("SEED_LOCAL_DEVICE_IDS", "").strip()
  try:
    local_ids = [int(i) for i in ids.split(",")] if ids else None
  except ValueError:
    raise ValueError(f"SEED_LOCAL_DEVICE_IDS={ids!r}: use comma-separated "
                     "device ids, e.g. 0,1,2,3") from None
  if _platforms().startswith("cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(address, num_processes, process_id,
                             local_device_ids=local_ids)
  logging.info("jax.distributed: process %d of %d, %d local / %d devices",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())
  return True


def is_writer() -> bool:
  """Whether this process writes files and summaries (process 0)."""
  return jax.process_index() == 0


def process_slice(items: Sequence[T], *, index: int | None = None,
                  count: int | None = None) -> list[T]:
  """This process's contiguous share of `items`, as even as possible.

  Example: 5 items over 2 processes -> [0, 1, 2] and [3, 4].

  Args:
    items: what to split (tasks, environment seeds, rollout chunks).
    index, count: process index and count (default: this run's).

  Returns:
    The items of process `index`; the shares concatenate to `items`.
  """
  index = jax.process_index() if index is None else index
  count = jax.process_count() if count is None else count
  share, extra = divmod(len(items), count)  # the first `extra` get one more
  start = index * share + min(index, extra)
  return list(items[start:start + share + (index < extra)])


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's `obj` (picklable), in process order, on every process.

  A collective: every process must call it, in the same order.
  """
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(pickle.dumps(obj), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int32))
  sizes = np.asarray(sizes).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  rows = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(rows[i, :n].tobytes()) for i, n in enumerate(sizes)]


def by_process(messages: Sequence[str | None]) -> str:
  """Process i's message (`messages[i]`, None: nothing to say) named by
  process, processes with one message grouped, in order of first process.

  Example: [None, "full", "full", "read-only"] ->
    "processes 1, 2: full; process 3: read-only".
  """
  who: dict[str, list[str]] = {}
  for i, message in enumerate(messages):
    if message is not None:
      who.setdefault(message, []).append(str(i))
  return "; ".join(f"process{'es' if len(ids) > 1 else ''} "
                   f"{', '.join(ids)}: {message}"
                   for message, ids in who.items())


def broadcast_object(obj: Any) -> Any:
  """Process 0's `obj` (picklable), on every process; the others pass
  anything (None).

  A collective: every process must call it, in the same order.
  """
  if jax.process_count() == 1:
    return obj
  data = (np.frombuffer(pickle.dumps(obj), np.uint8) if is_writer()
          else np.zeros(0, np.uint8))
  size = int(multihost_utils.broadcast_one_to_all(
      np.asarray(data.size, np.int32)))
  padded = np.zeros(size, np.uint8)
  padded[:data.size] = data
  return pickle.loads(np.asarray(
      multihost_utils.broadcast_one_to_all(padded)).tobytes())


def on_writer(fn: Callable[[], Any]
              ) -> tuple[BaseException | None, tuple[str, str] | None]:
  """Runs `fn()` on process 0 and tells every process how it went.

  A collective, and the barrier after `fn`: every process calls it, and no
  process waits on a writer that failed.

  Returns:
    (error, failure): `error` the exception `fn` raised on this process
    (None elsewhere, or when it succeeded); `failure` on every process
    (kind, "Type: message") of that exception, kind "ValueError",
    "OSError" or "RuntimeError" by its class, or None when it succeeded.
  """
  error, failure = None, None
  if is_writer():
    try:
      fn()
    except BaseException as e:  # pylint: disable=broad-except
      kind = next((k.__name__ for k in (ValueError, OSError)
                   if isinstance(e, k)), "RuntimeError")
      error, failure = e, (kind, f"{type(e).__name__}: {e}")
  return error, broadcast_object(failure)


def sync(name: str) -> None:
  """A barrier across processes (no-op on one)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)
