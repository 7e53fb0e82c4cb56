"""Two local processes x 4 fake CPU devices (jax.distributed, gloo) run two
SEED updates of the tiny config exactly as one process x 8 devices does."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "multihost_worker.py")
EXACT = ("num_samples", "env_steps", "success_rate", "valid_action_ratio",
         "episode_length", "analyses_parsed", "skipped", "env_errors")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_envs(n: int, local_devices: int = 1) -> list[dict[str, str]]:
  """The environments of `n` local processes of one jax.distributed job
  (gloo on CPU): the checkout under test first on PYTHONPATH, not whichever
  seed_jax is installed, and no fake-device XLA_FLAGS."""
  address = f"127.0.0.1:{_free_port()}"
  env = {k: v for k, v in os.environ.items()
         if k != "XLA_FLAGS" and not k.startswith("SEED_")}
  env["PYTHONPATH"] = os.pathsep.join(
      [ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  return [dict(env, JAX_PLATFORMS="cpu", SEED_COORDINATOR=address,
               SEED_NUM_PROCESSES=str(n), SEED_PROCESS_ID=str(i),
               SEED_LOCAL_DEVICES=str(local_devices)) for i in range(n)]


def _start(out_dir, **env):
  os.makedirs(out_dir, exist_ok=True)
  base = {k: v for k, v in os.environ.items()
          if k != "XLA_FLAGS" and not k.startswith("SEED_")}
  base.update(JAX_PLATFORMS="cpu", **{k: str(v) for k, v in env.items()})
  log = open(os.path.join(out_dir, f"log_{env.get('SEED_PROCESS_ID', 0)}"),
             "w")
  return subprocess.Popen([sys.executable, WORKER, out_dir], env=base,
                          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _wait(procs, out_dir):
  for p in procs:
    try:
      p.wait(timeout=600)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for p in procs:
    if p.returncode:
      logs = [open(os.path.join(out_dir, f)).read()[-3000:]
              for f in sorted(os.listdir(out_dir)) if f.startswith("log_")]
      pytest.fail(f"worker exited with {p.returncode}:\n" + "\n".join(logs))


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  address = f"127.0.0.1:{_free_port()}"
  procs = [_start(one, SEED_LOCAL_DEVICES=8)]
  multi = [_start(two, SEED_LOCAL_DEVICES=4, SEED_COORDINATOR=address,
                  SEED_NUM_PROCESSES=2, SEED_PROCESS_ID=i) for i in range(2)]
  _wait(procs, one)
  _wait(multi, two)

  ref = json.load(open(os.path.join(one, "metrics_0.json")))
  outs = [json.load(open(os.path.join(two, f"metrics_{i}.json")))
          for i in range(2)]
  assert (ref["processes"], ref["devices"]) == (1, 8)
  assert [(o["processes"], o["devices"]) for o in outs] == [(2, 8)] * 2
  # Only process 0 writes the parameters.
  assert sorted(f for f in os.listdir(two) if f.endswith(".npz")) == [
      "init.npz", "params.npz"]
  for out in [ref] + outs:
    assert out["restored_step"] == 2 and out["restored_same"]
  for out in outs:
    assert len(out["history"]) == 2
    for want, got in zip(ref["history"], out["history"]):
      assert set(want) == set(got)
      for k in EXACT:
        assert got[k] == want[k], k
      for k, v in want.items():
        # Cross-process sums reduce in another order: float32 rounding.
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-6,
                                   err_msg=k)
  p1 = np.load(os.path.join(one, "params.npz"))
  p2 = np.load(os.path.join(two, "params.npz"))
  init = np.load(os.path.join(one, "init.npz"))
  assert sorted(p1) == sorted(p2) == sorted(init)
  for k in p1:
    np.testing.assert_allclose(p2[k], p1[k], rtol=1e-4, atol=1e-5,
                               err_msg=k)
  # The two updates moved the parameters, and both runs moved them alike:
  # float32 rounding, not other rows or another gradient (measured ~4e-5).
  delta = lambda p: np.concatenate(
      [(p[k].astype(np.float64) - init[k]).ravel() for k in sorted(p)])
  d1, d2 = delta(p1), delta(p2)
  assert np.linalg.norm(d1) > 1e-3
  assert np.linalg.norm(d2 - d1) <= 1e-3 * np.linalg.norm(d1)
