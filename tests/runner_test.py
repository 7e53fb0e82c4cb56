"""seed_jax.runner: the status file, and refusing a second runner."""

import json
import os
import socket
import subprocess
import sys

import pytest

from seed_jax import runner


def test_a_second_runner_on_one_folder_is_refused(tmp_path):
  out = str(tmp_path / "exp")
  os.makedirs(out)
  host = socket.gethostname()
  # Stand-ins for seed_jax processes (their command line names seed_jax) and
  # for another program that took a recycled pid.
  ours = subprocess.Popen([sys.executable, "-c", "import time, sys; "
                           "time.sleep(120)", "seed_jax.train"])
  other = subprocess.Popen([sys.executable, "-c", "import time; "
                            "time.sleep(120)"])
  try:
    def status(**kw):
      base = dict(host=host, pid=other.pid, finished=False, runs={})
      (tmp_path / "exp" / "status.json").write_text(json.dumps(
          dict(base, **kw)))

    status(pid=ours.pid, started="t0")
    with pytest.raises(runner.BusyError,
                       match=f"another runner \\(pid {ours.pid}"):
      runner.execute([], {}, out=out, poll_s=0)
    # The runner died (SIGKILL) but left a run training.
    status(runs={"grpo/seed0": {"state": "running", "pid": ours.pid}})
    with pytest.raises(runner.BusyError,
                       match=f"run grpo/seed0 .* still trains \\(pid {ours.pid}"):
      runner.execute([], {}, out=out, poll_s=0)
    # Pids of programs that are not seed_jax, or finished runners, are no
    # obstacle.
    status(runs={"grpo/seed0": {"state": "running", "pid": other.pid}})
    assert runner.execute([], {}, out=out, poll_s=0)["finished"]
    status(pid=ours.pid, finished=True)
    assert runner.execute([], {}, out=out, poll_s=0)["finished"]
  finally:
    ours.kill()
    other.kill()
    ours.wait()
    other.wait()


def _fake_python(tmp_path):
  """An interpreter stand-in for `FAKE -m seed_jax.train ARGS`: it logs one
  progress line, then fails (exit status 3) for --gin.SEED=1, trains until
  stopped for --gin.SEED=8, writes a damaged metrics.jsonl for --gin.SEED=9
  (a cut line) and --gin.SEED=7 (an update null), and otherwise writes
  metrics.jsonl with updates 1 and 2 into the run's --gin.WORKDIR."""
  path = tmp_path / "fake_python"
  path.write_text(
      f"#!{sys.executable}\n"
      "import ast, json, os, sys, time\n"
      "args = dict(a[len('--gin.'):].split('=', 1) for a in sys.argv[3:]\n"
      "            if a.startswith('--gin.'))\n"
      "workdir = ast.literal_eval(args['WORKDIR'])\n"
      "print('update 1 | loss 0.5')\n"
      "if args['SEED'] == '1':\n"
      "  sys.exit(3)\n"
      "if args['SEED'] == '8':\n"
      "  time.sleep(60)\n"
      "if args['SEED'] == '9':\n"
      "  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:\n"
      "    f.write('{\"update\": 1}\\n{\"upd')\n"
      "  sys.exit(0)\n"
      "if args['SEED'] == '7':\n"
      "  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:\n"
      "    f.write('{\"update\": 1}\\n{\"update\": null}\\n')\n"
      "  sys.exit(0)\n"
      "with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:\n"
      "  for u in (1, 2):\n"
      "    f.write(json.dumps({'update': u}) + '\\n')\n")
  path.chmod(0o755)
  return str(path)


def test_execute_runs_what_is_not_done_and_records_each_state(tmp_path):
  out = str(tmp_path / "exp")
  runs = [runner.Run("grpo", s, os.path.join(out, "grpo", f"seed{s}"),
                     (f"--gin.WORKDIR={os.path.join(out, 'grpo', f'seed{s}')!r}",
                      f"--gin.SEED={s}")) for s in (0, 1, 2)]
  # Seed 2 is done already: its metrics list the last planned update.
  os.makedirs(runs[2].workdir)
  with open(os.path.join(runs[2].workdir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"update": 2}) + "\n")
  # Seed 0 plans 3 updates but writes 2: exit status 0 is not enough.
  planned = {"grpo/seed0": 3, "grpo/seed1": 2, "grpo/seed2": 2}
  status = runner.execute(runs, planned, out=out, parallel=2, poll_s=0.05,
                          command="cmd", python=_fake_python(tmp_path))
  states = {k: (r["state"], r["returncode"]) for k, r in status["runs"].items()}
  assert states == {"grpo/seed0": ("failed", 0), "grpo/seed1": ("failed", 3),
                    "grpo/seed2": ("done", None)}
  with open(os.path.join(out, runner.STATUS)) as f:
    assert json.load(f) == status
  assert status["finished"] and status["commands"] == ["cmd"]
  assert runner.last_logged_update(runs[1].log) == 1
  assert not os.path.exists(runs[2].log)  # skipped, never started
  # Planned as 2 updates, seed 0 is now done; the report says so.
  assert runner.is_done(runs[0].workdir, 2)
  table = runner.status_report(out).splitlines()
  assert "stopped" in table[0]
  assert [line.split()[:-1] for line in table[2:]] == [
      ["grpo/seed0", "failed", "(0)", "1/3"],
      ["grpo/seed1", "failed", "(3)", "1/2"],
      ["grpo/seed2", "done", "-/2"]]


def _runs(out, seeds):
  """GRPO runs of these seeds in OUT, for `_fake_python`."""
  runs = []
  for s in seeds:
    workdir = os.path.join(out, "grpo", f"seed{s}")
    runs.append(runner.Run("grpo", s, workdir, (f"--gin.WORKDIR={workdir!r}",
                                                 f"--gin.SEED={s}")))
  return runs


@pytest.mark.parametrize("bad_seed", [9, 7])  # a cut line, an update null
def test_a_damaged_metrics_file_fails_only_its_run(tmp_path, bad_seed):
  out = str(tmp_path / "exp")
  runs = _runs(out, (0, bad_seed))
  status = runner.execute(runs, {r.name: 2 for r in runs}, out=out,
                          parallel=2, poll_s=0.05,
                          python=_fake_python(tmp_path))
  assert status["finished"]
  assert status["runs"]["grpo/seed0"]["state"] == "done"
  damaged = status["runs"][f"grpo/seed{bad_seed}"]
  assert (damaged["state"], damaged["returncode"]) == ("failed", 0)
  metrics = os.path.join(runs[1].workdir, "metrics.jsonl")
  assert damaged["error"].startswith(f"{metrics} line 2")
  with open(os.path.join(out, runner.STATUS)) as f:
    assert json.load(f) == status


def test_a_runner_error_stops_its_runs_and_records_them(tmp_path,
                                                        monkeypatch):
  out = str(tmp_path / "exp")
  runs = _runs(out, (0, 8))  # seed 0 ends at once, seed 8 trains on
  write = runner._write_json  # pylint: disable=protected-access
  failures = []

  def full_disk(path, data):  # the write once seed 0 ended fails, once
    if data["runs"]["grpo/seed0"].get("ended") and not failures:
      failures.append(path)
      raise OSError(28, "No space left on device")
    write(path, data)

  monkeypatch.setattr(runner, "_write_json", full_disk)
  with pytest.raises(OSError, match="No space left"):
    runner.execute(runs, {r.name: 2 for r in runs}, out=out, parallel=2,
                   poll_s=0.05, python=_fake_python(tmp_path))
  with open(os.path.join(out, runner.STATUS)) as f:
    status = json.load(f)
  assert not status["finished"]
  assert status["error"] == "OSError: [Errno 28] No space left on device"
  assert status["runs"]["grpo/seed0"]["state"] == "done"
  stopped = status["runs"]["grpo/seed8"]
  assert stopped["state"] == "interrupted"
  with pytest.raises(ProcessLookupError):  # stopped, not left training
    os.kill(stopped["pid"], 0)
  # Nothing left training in the way of the rerun.
  monkeypatch.setattr(runner, "_write_json", write)
  assert runner.execute([], {}, out=out, poll_s=0)["finished"]


def test_status_lists_the_runs_of_earlier_invocations(tmp_path):
  out = str(tmp_path / "exp")
  fake = _fake_python(tmp_path)
  runs = _runs(out, (0, 1, 2))
  runner.execute(runs[:2], {r.name: 2 for r in runs}, out=out, poll_s=0.05,
                 python=fake)
  # A later invocation plans seed 2 only: seeds 0 and 1 stay on record.
  status = runner.execute(runs[2:], {r.name: 2 for r in runs}, out=out,
                          poll_s=0.05, python=fake)
  assert list(status["other_runs"]) == ["grpo/seed0", "grpo/seed1"]
  table = runner.status_report(out).splitlines()
  assert [line.split()[:-1] for line in table[2:3]] == [
      ["grpo/seed2", "done", "1/2"]]
  assert table[3].startswith("from an earlier invocation")
  assert [line.split()[:-1] for line in table[4:]] == [
      ["grpo/seed0", "done", "1/2"], ["grpo/seed1", "failed", "(3)", "1/2"]]
