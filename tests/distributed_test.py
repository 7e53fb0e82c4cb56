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
