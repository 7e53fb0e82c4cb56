"""Distributed start-up on one host, and the split of work by process."""

import jax
import pytest

from seed_jax import distributed


def test_single_host_is_a_no_op():
  assert not distributed.initialize(env={})
  assert not distributed.initialize(env={"SEED_DISTRIBUTED": "0"})
  assert jax.process_count() == 1 and distributed.is_writer()


def test_distributed_flag_spellings():
  for off in ("false", "no", "OFF", ""):
    assert not distributed.initialize(env={"SEED_DISTRIBUTED": off})
  with pytest.raises(ValueError, match="SEED_DISTRIBUTED='maybe'"):
    distributed.initialize(env={"SEED_DISTRIBUTED": "maybe"})


def test_an_address_needs_the_process_count_and_id():
  with pytest.raises(ValueError, match="SEED_NUM_PROCESSES"):
    distributed.initialize(env={"SEED_COORDINATOR": "127.0.0.1:1234"})


def test_processes_without_a_coordinator_are_refused():
  # Without one, every host would train alone in the same workdir.
  with pytest.raises(ValueError, match="2 processes but no coordinator"):
    distributed.initialize(env={"SEED_NUM_PROCESSES": "2",
                                "SEED_PROCESS_ID": "1"})
  with pytest.raises(ValueError, match="SEED_NUM_PROCESSES='two'"):
    distributed.initialize(env={"SEED_NUM_PROCESSES": "two"})
  assert not distributed.initialize(env={"SEED_NUM_PROCESSES": "1"})


def test_a_bad_local_device_count_is_named(monkeypatch):
  updates = []
  monkeypatch.setattr(jax.config, "update", lambda *a: updates.append(a))
  for value in ("four", "2.5", "0", "-1"):
    with pytest.raises(ValueError, match=f"SEED_LOCAL_DEVICES={value!r}: use "
                       "a count of fake CPU devices per process"):
      distributed.initialize(env={"SEED_LOCAL_DEVICES": value})
  assert not updates
  assert not distributed.initialize(env={"SEED_LOCAL_DEVICES": "4"})
  assert updates == [("jax_num_cpu_devices", 4)]


def test_local_device_ids_reach_jax(monkeypatch):
  # Under Slurm, JAX would otherwise give a process one GPU per node.
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize",
                      lambda *a, **kw: calls.append((a, kw)))
  monkeypatch.setattr(distributed, "_platforms", lambda: "cuda")
  env = {"SEED_COORDINATOR": "10.0.0.2:8476", "SEED_NUM_PROCESSES": "2",
         "SEED_PROCESS_ID": "1"}
  assert distributed.initialize(env=dict(env, SEED_LOCAL_DEVICE_IDS="0,1,2"))
  assert distributed.initialize(env=env)
  assert calls == [
      (("10.0.0.2:8476", 2, 1), {"local_device_ids": [0, 1, 2]}),
      (("10.0.0.2:8476", 2, 1), {"local_device_ids": None})]
  with pytest.raises(ValueError, match="SEED_LOCAL_DEVICE_IDS='0;1'"):
    distributed.initialize(env=dict(env, SEED_LOCAL_DEVICE_IDS="0;1"))


def test_process_slice_is_contiguous_and_complete():
  items = list(range(5))
  shares = [distributed.process_slice(items, index=i, count=2)
            for i in range(2)]
  assert shares == [[0, 1, 2], [3, 4]]
  shares = [distributed.process_slice(range(8), index=i, count=4)
            for i in range(4)]
  assert shares == [[0, 1], [2, 3], [4, 5], [6, 7]]
  assert distributed.process_slice(items) == items  # one process here
  assert distributed.process_slice([], index=1, count=2) == []


def test_allgather_on_one_process():
  assert distributed.allgather_objects({"a": 1}) == [{"a": 1}]
  distributed.sync("noop")


def test_a_bad_process_id_is_named(monkeypatch):
  started = []
  monkeypatch.setattr(jax.distributed, "initialize",
                      lambda *a, **kw: started.append(a))
  env = {"SEED_COORDINATOR": "127.0.0.1:1234", "SEED_NUM_PROCESSES": "2"}
  with pytest.raises(ValueError, match=r"SEED_PROCESS_ID='one': use this "
                     "process's index, 0 to SEED_NUM_PROCESSES - 1"):
    distributed.initialize(env=dict(env, SEED_PROCESS_ID="one"))
  with pytest.raises(ValueError, match=r"process id 2 \(SEED_PROCESS_ID\) is "
                     r"not in \[0, 2\) for 2 processes \(SEED_NUM_PROCESSES\)"):
    distributed.initialize(env=dict(env, SEED_PROCESS_ID="2"))
  assert not started


def test_by_process_names_processes_grouped_by_message():
  assert distributed.by_process([None, "full", "full", "read-only"]) == (
      "processes 1, 2: full; process 3: read-only")
  assert distributed.by_process([None, None]) == ""
