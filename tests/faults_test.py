"""Fault injection: points parse strictly and kill only where they name."""

import os
import signal
import subprocess
import sys

import pytest

from seed_jax import faults


def test_parse():
  assert faults.parse("analysis:1") == ("analysis", 1)
  for bad in ("analysis", "analyze:1", "rollout:x", "rollout:-1", ":1"):
    with pytest.raises(ValueError, match="SEED_FAULT_POINT"):
      faults.parse(bad)


def test_maybe_crash_does_nothing_elsewhere(monkeypatch):
  monkeypatch.delenv(faults.ENV_VAR, raising=False)
  faults.maybe_crash("rollout", 1)
  monkeypatch.setenv(faults.ENV_VAR, "rollout:1")
  faults.maybe_crash("rollout", 0)
  faults.maybe_crash("analysis", 1)
  monkeypatch.setenv(faults.ENV_VAR, "rollout:one")
  with pytest.raises(ValueError, match="rollout:one"):
    faults.maybe_crash("rollout", 1)


def test_maybe_crash_is_a_sigkill():
  code = ("from seed_jax import faults\n"
          "faults.maybe_crash('train_step', 0)\n"
          "faults.maybe_crash('train_step', 1)\n"
          "print('survived')\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=60,
                        env=dict(os.environ, SEED_FAULT_POINT="train_step:1"))
  assert proc.returncode == -signal.SIGKILL
  assert "survived" not in proc.stdout
  assert "killing the run at train_step:1" in proc.stderr
