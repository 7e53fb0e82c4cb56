"""One process of tests/multihost_faults_test.py: faults that hit one process
of a multi-host run, which every process must learn of and handle alike.

  SEED_COORDINATOR=127.0.0.1:PORT SEED_NUM_PROCESSES=2 SEED_PROCESS_ID=i \\
      SEED_LOCAL_DEVICES=1 python tests/multihost_faults_worker.py OUT_DIR \\
      [SCENARIO ...]

Scenarios (default: all, in this order):

  restore     process 1 alone fails to restore the latest step (a transient
              read error): every process must resume from the step before.
  quarantine  the latest step is corrupt and process 0 cannot move it aside
              (`corrupt_checkpoints` is a file): every process must raise.
  stage1      Stage 1's dataset is written by process 0 alone and read by
              every process; then process 0's write fails.

Writes OUT_DIR/<scenario>_<process>.json as each scenario ends, then
OUT_DIR/done_<process>.
"""

import glob
import json
import os
import sys
import warnings

from seed_jax import distributed

SCENARIOS = ("restore", "quarantine", "stage1")


def _error(e: BaseException) -> list[str]:
  return [type(e).__name__, str(e)]


def _state():
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from seed_jax import partitioning  # pylint: disable=g-import-not-at-top
  sharding = NamedSharding(partitioning.make_mesh((1, -1, 1)), P("fsdp"))
  state = {"w": jax.make_array_from_callback(
      (8,), sharding, lambda i: np.arange(8.0, dtype=np.float32)[i])}
  return state, {"w": sharding}


def _save_two_steps(workdir, checksums):
  from seed_jax import checkpoints  # pylint: disable=g-import-not-at-top
  state, shardings = _state()
  with checkpoints.Checkpointer(workdir, checksums=checksums) as ckpt:
    ckpt.save(1, state, force=True)
    ckpt.save(2, state, force=True)
  distributed.sync(f"saved {workdir}")
  return checkpoints.abstract_tree(state, shardings)


def restore(out_dir, me):
  """Process 1 alone cannot read step 2 (checksums=False: a restore error is
  taken for damage)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from seed_jax import checkpoints  # pylint: disable=g-import-not-at-top
  workdir = os.path.join(out_dir, "restore")
  abstract = _save_two_steps(workdir, checksums=False)
  real = checkpoints.Checkpointer._restore  # pylint: disable=protected-access

  def flaky(self, step, *args):
    if me == 1 and step == 2:
      raise OSError("transient read error on this host (injected)")
    return real(self, step, *args)

  checkpoints.Checkpointer._restore = flaky  # pylint: disable=protected-access
  out = {}
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      with checkpoints.Checkpointer(workdir) as ckpt:
        restored = ckpt.restore_latest(abstract)
        out["steps_left"] = ckpt.all_steps()
    out["step"] = restored.step
    out["values"] = [np.asarray(s.data).tolist()
                     for s in restored.state["w"].addressable_shards]
    out["warnings"] = [str(w.message) for w in caught
                       if issubclass(w.category,
                                     checkpoints.CorruptCheckpointWarning)]
  except Exception as e:  # pylint: disable=broad-except
    out["error"] = _error(e)
  finally:
    checkpoints.Checkpointer._restore = real  # pylint: disable=protected-access
  # The first collective after the restore (the first update's, in train).
  distributed.sync("after restore")
  out["in_step"] = True
  return out


def quarantine(out_dir, me):
  """Step 2 is damaged (checksums=True: its manifest check fails on every
  process); moving it aside fails on process 0."""
  from seed_jax import checkpoints  # pylint: disable=g-import-not-at-top
  workdir = os.path.join(out_dir, "quarantine")
  abstract = _save_two_steps(workdir, checksums=True)
  if me == 0:
    files = [p for p in glob.glob(f"{workdir}/checkpoints/2/state/**",
                                  recursive=True)
             if os.path.isfile(p) and checkpoints.MANIFEST not in p]
    path = max(files, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with open(os.path.join(workdir, "corrupt_checkpoints"), "w") as f:
      f.write("a file where the folder goes")
  distributed.sync("damaged")
  out = {}
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      with checkpoints.Checkpointer(workdir) as ckpt:
        out["step"] = ckpt.restore_latest(abstract).step
  except Exception as e:  # pylint: disable=broad-except
    out["error"] = _error(e)
  distributed.sync("after quarantine")
  out["in_step"] = True
  return out


def stage1(out_dir, me):
  """run_stage1 with its rollouts and SFT stubbed: the dataset part."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  from seed_jax import sft  # pylint: disable=g-import-not-at-top
  from seed_jax import stage1 as stage1_lib  # pylint: disable=g-import-not-at-top
  from seed_jax import testing  # pylint: disable=g-import-not-at-top
  workdir = epath.Path(out_dir) / "stage1"
  records = [dict(prompt=f"Analyze episode {t}.{m}\n\nStep 1",
                  response=json.dumps({"episode_summary": f"s{t}",
                                       "episode_skill": f"k{t} {m}"}),
                  task=f"task {t}", family="clean", success=bool(t % 2))
             for t in range(10) for m in range(2)]
  stage1_lib.collect_records = lambda *a, **k: (list(records), {"records": 20})
  sft.sft = lambda params, *a, **k: (params, {"loss": 0.0})
  real_write, writes, fail = stage1_lib.write_dataset, [], [False]

  def write_dataset(*args, **kwargs):
    writes.append(jax.process_index())
    if fail[0]:
      raise OSError("no space left on the shared disk (injected)")
    return real_write(*args, **kwargs)

  stage1_lib.write_dataset = write_dataset
  tiny = testing.tiny_policy(seed=0)
  policy = policies.Policy(tiny.config, tiny.params, tiny.tokenizer, {})
  cfg = policies.Stage1Config(num_tasks=2, group_size=2, max_steps=2,
                              buckets=(256, 512, 1024, 1536))
  run = lambda: policies.run_stage1(policy, cfg, workdir,
                                    env_name="household", max_new_tokens=8)
  out = {}
  try:
    run()
    train = stage1_lib.read_dataset(os.path.join(workdir, "stage1_data"),
                                    "train")
    out["train"] = sorted(train[i]["prompt"] for i in range(len(train)))
  except Exception as e:  # pylint: disable=broad-except
    out["error"] = _error(e)
  out["writes"] = list(writes)
  distributed.sync("after stage1")
  if me == 0:
    fail[0] = True
  try:
    run()
  except Exception as e:  # pylint: disable=broad-except
    out["failed"] = _error(e)
  distributed.sync("after the failed write")
  out["in_step"] = True
  return out


def main(out_dir, scenarios):
  distributed.initialize()  # from the SEED_* environment
  import jax  # pylint: disable=g-import-not-at-top
  me = jax.process_index()
  for name in scenarios or SCENARIOS:
    out = globals()[name](out_dir, me)
    with open(os.path.join(out_dir, f"{name}_{me}.json"), "w") as f:
      json.dump(out, f)
  open(os.path.join(out_dir, f"done_{me}"), "w").close()


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
