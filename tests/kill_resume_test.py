"""kill -9 a tiny run at four points, run the same command again: the run
resumes from the last complete checkpoint and ends with the metrics of an
uninterrupted run (rng and task order included).

The points are hit deterministically through seed_jax/faults.py
(SEED_FAULT_POINT="<phase>:<update>"). The crashes are chained in one
workdir, each restart being the next crash's run:

  rollout:1     fresh start; killed in update 1 -> restart from step 1
  checkpoint:1  killed while step 2 is written   -> restart from step 1 or 2
  analysis:2    killed in update 2's analysis    -> restart from step 2
  train_step:2  killed in update 2's first step  -> restart from step 2
  (no fault)    finishes update 2; metrics.jsonl == the uninterrupted run's

Every run is a subprocess sharing one persistent compilation cache, so only
the first compiles (about 40 s, then about 15 s per run on 2 CPU cores).
"""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from seed_jax import checkpoints
from seed_jax import faults
from seed_jax import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "configs/experiments/tiny.gin"
NUM_UPDATES = 3
# `python -m seed_jax.train` runs the module as __main__, whose `train` is not
# the seed_jax.train.train that tiny.gin registers; -c imports the real one.
COMMAND = (sys.executable, "-c", "from seed_jax import train; train.main()")


def _run(workdir, cache, fault=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  env.pop(faults.ENV_VAR, None)
  if fault:
    env[faults.ENV_VAR] = fault
  return subprocess.run(
      [*COMMAND, f"--gin_file={TINY}", f"--gin.WORKDIR='{workdir}'",
       f"--gin.NUM_UPDATES={NUM_UPDATES}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items()
             if not k.startswith("time/")} for line in f]


def _resumed_from(proc):
  m = re.search(r"resumed from update (\d+)", proc.stdout)
  return int(m.group(1)) if m else None


def _explain(proc):
  return f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.slow
def test_killed_runs_resume_to_the_uninterrupted_metrics(tmp_path):
  cache = tmp_path / "jax_cache"
  full = _run(tmp_path / "full", cache)
  assert full.returncode == 0, _explain(full)

  workdir = tmp_path / "killed"
  steps_dir = workdir / "checkpoints"
  # (fault point, the steps the restart may resume from). Step 1 is saved
  # asynchronously while update 1 starts: a kill during update 1's rollout
  # may land before those files are complete, and then the next run rightly
  # starts again from scratch (None) instead of from step 1.
  chain = [("rollout:1", (None,)), ("checkpoint:1", (None, 1)),
           ("analysis:2", (1, 2)), ("train_step:2", (2,))]
  for fault, resume_from in chain:
    proc = _run(workdir, cache, fault)
    assert proc.returncode == -signal.SIGKILL, (fault, _explain(proc))
    assert f"killing the run at {fault}" in proc.stderr
    assert _resumed_from(proc) in resume_from, (fault, _explain(proc))
    # Updates finished before the kill are logged; the final one never is,
    # so a killed run never reads as done.
    if (workdir / "metrics.jsonl").exists():
      assert max(m["update"] for m in _metrics(workdir)) < 3
    if fault == "checkpoint:1":
      # Killed mid-write: step 2 is a temporary folder orbax drops, or a
      # complete step that never got its manifest; nothing restores half.
      assert not (steps_dir / "2" / checkpoints.MANIFEST).exists()
  last = _run(workdir, cache)
  assert last.returncode == 0, _explain(last)
  assert _resumed_from(last) == 2
  assert _metrics(workdir) == _metrics(tmp_path / "full")
  assert [m["update"] for m in _metrics(workdir)] == [0, 1, 2, 3]
  # TensorBoard shows the same: every point once, as metrics.jsonl has it
  # (the killed starts' event files are set aside in earlier_events/).
  points = testing.read_scalar_events(workdir)
  assert len({(tag, step) for tag, step, _ in points}) == len(points)
  with open(workdir / "metrics.jsonl") as f:
    expected = {(k, h["update"]): v for h in map(json.loads, f)
                for k, v in h.items()
                if k != "update" and isinstance(v, (int, float))}
  assert {(tag, step): value for tag, step, value in points} == pytest.approx(
      expected, rel=1e-6)
