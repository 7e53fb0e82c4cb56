"""Two local processes (jax.distributed, gloo): a fault on one process of a
multi-host run reaches every process, which handle it alike and stay in step
(tests/multihost_faults_worker.py runs the scenarios)."""

import json
import os
import subprocess
import sys

import pytest

from tests import multihost_test

WORKER = os.path.join(multihost_test.ROOT, "tests", "multihost_faults_worker.py")
TIMEOUT = 240  # a hung process fails the test instead of the suite


def run_worker(out_dir, *scenarios):
  """Both processes' results, {scenario: [process 0's, process 1's]}."""
  os.makedirs(out_dir, exist_ok=True)
  procs = [subprocess.Popen(
      [sys.executable, WORKER, str(out_dir), *scenarios],
      cwd=multihost_test.ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for env in multihost_test.process_envs(2)]
  logs = []
  try:
    for p in procs:
      try:
        logs.append(p.communicate(timeout=TIMEOUT)[0].decode()[-3000:])
      except subprocess.TimeoutExpired:
        pytest.fail(f"a worker hung for {TIMEOUT}s")
  finally:
    for p in procs:
      p.kill()
  for p, log in zip(procs, logs):
    assert p.returncode == 0, "\n".join(logs)
  results = {}
  for name in os.listdir(out_dir):
    if name.endswith(".json"):
      scenario, me = name[:-len(".json")].rsplit("_", 1)
      results.setdefault(scenario, [None, None])[int(me)] = json.load(
          open(os.path.join(out_dir, name)))
  return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  return run_worker(tmp_path_factory.mktemp("faults"))


def test_processes_fall_back_together_when_one_fails_to_restore(results):
  # Process 1 alone cannot read step 2: both resume from step 1, each with
  # its own shard, and meet at the next collective.
  first, second = results["restore"]
  assert "error" not in first and "error" not in second, (first, second)
  assert first["step"] == second["step"] == 1
  assert first["values"] == [[0.0, 1.0, 2.0, 3.0]]
  assert second["values"] == [[4.0, 5.0, 6.0, 7.0]]
  for out in (first, second):
    assert len(out["warnings"]) == 1
    assert "step 2" in out["warnings"][0]
    assert ("process 1: OSError: transient read error on this host "
            "(injected)") in out["warnings"][0]
    assert out["steps_left"] == [1]  # step 2 moved aside
    assert out["in_step"]


def test_a_step_that_cannot_be_moved_aside_fails_on_every_process(results):
  # Process 0 cannot move the corrupt step 2 aside: every process raises the
  # same error (none waits for process 0 at a barrier).
  first, second = results["quarantine"]
  assert first["error"] == second["error"], (first, second)
  kind, message = first["error"]
  assert kind == "CorruptCheckpointError"
  assert "checkpoint step 2" in message and "could not be moved to" in message
  assert "FileExistsError" in message
  assert first["in_step"] and second["in_step"]


def test_only_process_0_writes_stage1s_dataset(results):
  first, second = results["stage1"]
  assert "error" not in first and "error" not in second, (first, second)
  assert first["writes"] == [0] and second["writes"] == []
  assert first["train"] == second["train"] and first["train"]
  # Its failed write reaches the other process, named, as the same kind.
  assert first["failed"] == [
      "OSError", "no space left on the shared disk (injected)"]
  kind, message = second["failed"]
  assert kind == "OSError"
  assert message.endswith("was not written on process 0: OSError: no space "
                          "left on the shared disk (injected)")
  assert first["in_step"] and second["in_step"]
