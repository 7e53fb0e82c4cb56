r"""Training runs in the background: one process each, resumable, watched.

A `Run` is one `python -m seed_jax.train ARGS` with its own workdir.
`execute` starts those not done yet, `parallel` at a time, each writing its
output to `WORKDIR/log.txt`, and keeps `OUT/status.json` up to date: every
run's state ("pending", "running", "done", "failed", "interrupted"), exit
status, command and log, and the runner's host and pid. A run is done when
its `metrics.jsonl` lists its last planned update, so after an interruption
the same runs are given again and `seed_jax.train` resumes each from its
last checkpoint. Two runners on one OUT, or a runner beside a run an earlier
runner left training, are refused (`BusyError`). `status_report` prints the
table `python -m seed_jax.experiments status` shows.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from seed_jax import atomic
from seed_jax import results
from seed_jax import sweep

STATUS = "status.json"
LOG = "log.txt"


class BusyError(RuntimeError):
  """Someone else already works on an experiment's directory."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One (method, seed) training run."""
  method: str
  seed: int
  workdir: str
  args: tuple[str, ...]  # seed_jax.train's command-line arguments

  @property
  def name(self) -> str:
    return f"{self.method}/seed{self.seed}"

  @property
  def log(self) -> str:
    return os.path.join(self.workdir, LOG)

  def command(self) -> str:
    """The shell command line, e.g. python -m seed_jax.train
    --gin_file=configs/experiments/demo.gin --gin.WORKDIR='out/grpo/seed0'
    --gin.SEED=0 "--gin.VARIANT='grpo'"."""
    return sweep.shell_command(("python", "-m", "seed_jax.train", *self.args))


def read_history(workdir: str) -> list[dict[str, Any]]:
  """The records of `workdir/metrics.jsonl`; [] when there is none.

  Raises:
    ValueError: a damaged line, named (`results.read_metrics`).
  """
  path = os.path.join(workdir, "metrics.jsonl")
  return results.read_metrics(path) if os.path.exists(path) else []


def is_done(workdir: str, num_updates: int) -> bool:
  """Whether the run's metrics.jsonl lists update `num_updates` (or later)."""
  history = read_history(workdir)
  return bool(history) and history[-1]["update"] >= num_updates


def last_logged_update(log: str) -> int | None:
  """The N of the log's last progress line ("update N | ..."), if any."""
  if not os.path.exists(log):
    return None
  with open(log, "rb") as f:
    f.seek(max(0, os.path.getsize(log) - (256 << 10)))
    lines = f.read().decode("utf-8", "replace").splitlines()
  for line in reversed(lines):
    words = line.split(" | ", 1)[0].split()
    if len(words) == 2 and words[0] == "update" and words[1].isdigit():
      return int(words[1])
  return None


def _now() -> str:
  return datetime.datetime.now().isoformat(timespec="seconds")


def _write_json(path: str, data: Any) -> None:
  atomic.write_text(path, json.dumps(data, indent=1))


def execute(runs: Sequence[Run], num_updates: Mapping[str, int], *,
            out: str, parallel: int = 1, command: str = "",
            poll_s: float = 2.0,
            python: str = sys.executable) -> dict[str, Any]:
  """Runs what is not done yet, `parallel` at a time; keeps status.json.

  A failed run does not stop the others (one whose metrics.jsonl is
  damaged fails, its "error" naming the file); a KeyboardInterrupt (or
  SIGTERM, see `experiments.main`) or any error of the runner's own (say,
  status.json cannot be written) stops the runs started here, marks them
  "interrupted" (the error in status.json's "error") and is raised again.

  Args:
    runs: from `experiments.plan`.
    num_updates: {run name: its planned updates} (see
      `experiments.planned_updates`).
    out: the experiment's directory (status.json goes there).
    parallel: runs at once.
    command: the command line to record.
    poll_s: seconds between checks of the running processes.
    python: the interpreter of the runs.

  Returns:
    The final status: {"runs": {name: {"state": "done" | "failed" |
    "interrupted", "returncode", ...}}, ...}.

  Raises:
    BusyError: another runner still works on `out`, or a run an earlier
      runner started still trains (two trainers would share a workdir).
    ValueError: a damaged metrics.jsonl of a run to start (named), before
      any starts.
  """
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, STATUS)
  earlier = read_status(path)
  _check_nobody_running(earlier, out)
  # Provenance across invocations on one OUT (say, methods added later):
  # every command so far, and the runs of earlier ones not planned here.
  commands = [c for c in earlier.get("commands", []) if c != command]
  planned = {run.name for run in runs}
  other_runs = {k: r for k, r in {**earlier.get("other_runs", {}),
                                  **earlier.get("runs", {})}.items()
                if k not in planned}
  status = dict(command=command, commands=commands + [command],
                host=socket.gethostname(), pid=os.getpid(), started=_now(),
                updated=_now(), finished=False, runs={},
                other_runs=other_runs)
  queue = []
  for run in runs:
    n = num_updates[run.name]
    done = is_done(run.workdir, n)
    status["runs"][run.name] = dict(
        method=run.method, seed=run.seed, workdir=run.workdir, log=run.log,
        command=run.command(), num_updates=n,
        state="done" if done else "pending", returncode=None)
    if done:
      print(f"{run.name}: done, skipped", flush=True)
    else:
      queue.append(run)
  _write_json(path, status)
  active: dict[str, tuple[Run, subprocess.Popen, Any]] = {}
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  try:
    while queue or active:
      while queue and len(active) < parallel:
        run = queue.pop(0)
        os.makedirs(run.workdir, exist_ok=True)
        log = open(run.log, "a")  # pylint: disable=consider-using-with
        log.write(f"--- {_now()} {run.command()}\n")
        log.flush()
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [python, "-m", "seed_jax.train", *run.args], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        active[run.name] = (run, proc, log)
        status["runs"][run.name].update(state="running", started=_now(),
                                        pid=proc.pid)
        print(f"{run.name}: started (log {run.log})", flush=True)
        _write_json(path, dict(status, updated=_now()))
      time.sleep(poll_s)
      for name, (run, proc, log) in list(active.items()):
        rc = proc.poll()
        if rc is None:
          continue
        log.close()
        del active[name]
        entry = status["runs"][name]
        try:
          ok = rc == 0 and is_done(run.workdir, entry["num_updates"])
        except ValueError as e:  # a damaged metrics.jsonl: this run's own
          ok = False
          entry["error"] = str(e)
        entry.update(state="done" if ok else "failed", returncode=rc,
                     ended=_now())
        print(f"{name}: {entry['state']} (exit status {rc})"
              + (f": {entry['error']}" if "error" in entry else ""),
              flush=True)
        _write_json(path, dict(status, updated=_now()))
  except BaseException as e:  # Ctrl-C, SIGTERM, or the runner's own error
    _stop(active, status)
    if not isinstance(e, KeyboardInterrupt):
      status["error"] = f"{type(e).__name__}: {e}"
    try:
      _write_json(path, dict(status, updated=_now()))
    except OSError as write_error:  # say so, and raise the first error
      print(f"cannot record the stopped runs in {path}: {write_error}",
            file=sys.stderr, flush=True)
    raise
  status.update(finished=True, updated=_now())
  _write_json(path, status)
  return status


def _stop(active: Mapping[str, tuple[Run, subprocess.Popen, Any]],
          status: dict[str, Any]) -> None:
  """Stops the `active` runs (SIGTERM, SIGKILL after 60 s) and marks them
  "interrupted" in `status`."""
  for _, proc, _ in active.values():
    proc.terminate()
  for name, (_, proc, log) in active.items():
    try:
      proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()
    status["runs"][name].update(state="interrupted",
                                returncode=proc.returncode, ended=_now())


def read_status(path: str) -> dict[str, Any]:
  """OUT/status.json, or {} when there is none or it does not parse."""
  try:
    with open(path) as f:
      status = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(status, dict):
    return {}
  if "commands" not in status and status.get("command"):
    status["commands"] = [status["command"]]  # written before "commands"
  return status


def _alive(pid: Any) -> bool:
  """Whether process `pid` of this machine runs a seed_jax module (`python
  -m seed_jax.…`; best effort: a recycled pid of another program is told
  apart where /proc exists)."""
  try:
    pid = int(pid)
    os.kill(pid, 0)
  except (TypeError, ValueError, ProcessLookupError):
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      args = f.read().split(b"\0")
  except OSError:
    return True
  return any(a.startswith(b"seed_jax.") for a in args)


def _runner_alive(status: Mapping[str, Any]) -> bool | None:
  if status.get("host") != socket.gethostname():
    return None  # another machine's runner: unknown here
  return _alive(status.get("pid")) and not status.get("finished")


def _check_nobody_running(status: Mapping[str, Any], out: str) -> None:
  """Raises BusyError while a runner or one of its runs works on `out`."""
  if not status or status.get("host") != socket.gethostname():
    return  # nothing recorded, or another machine's (unknown here)
  if (status.get("pid") != os.getpid() and not status.get("finished")
      and _alive(status.get("pid"))):
    raise BusyError(
        f"another runner (pid {status['pid']}, started {status.get('started')}"
        f") is working on {out}; wait for it, or stop it with "
        f"`kill {status['pid']}`, then rerun to resume")
  for name, run in status.get("runs", {}).items():
    if run.get("state") == "running" and _alive(run.get("pid")):
      # Its runner died without stopping it (say, SIGKILL).
      raise BusyError(
          f"run {name} of an earlier runner still trains (pid {run['pid']}); "
          f"wait for it or `kill {run['pid']}`, then rerun to resume")


def status_report(out: str) -> str:
  """A table of the runs in OUT/status.json, states refreshed from disk;
  the runs of earlier invocations on OUT that the last one did not plan
  ("other_runs") follow under their own heading.

  Raises:
    FileNotFoundError: when `run` never wrote a status there.
  """
  path = os.path.join(out, STATUS)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no {STATUS} in {out}: start the experiment "
                            "with `python -m seed_jax.experiments run`")
  try:
    with open(path) as f:
      status = json.load(f)
  except ValueError as e:
    raise ValueError(f"{path} does not parse ({e}); `run` rewrites it when "
                     "it starts again") from None
  missing = [k for k in ("pid", "host", "updated", "runs")
             if not isinstance(status, dict) or k not in status]
  if missing:
    raise ValueError(f"{path} is not a runner's status (no {missing}); "
                     "`run` rewrites it when it starts again")
  alive = _runner_alive(status)
  runner = {True: "running", False: "stopped", None: "unknown (other host)"}
  lines = [f"runner pid {status['pid']} on {status['host']}: {runner[alive]}"
           f"; status updated {status['updated']}",
           f"{'run':24s} {'state':12s} {'update':>10s}  log"]

  def row(name, r, alive):
    state = r["state"]
    if is_done(r["workdir"], r["num_updates"]):
      state = "done"
    elif state in ("running", "pending") and alive is False:
      state = "interrupted"
    last = last_logged_update(r["log"])
    update = f"{'-' if last is None else last}/{r['num_updates']}"
    if state == "failed":
      state = f"failed ({r['returncode']})"
    return f"{name:24s} {state:12s} {update:>10s}  {r['log']}"

  lines += [row(name, r, alive) for name, r in status["runs"].items()]
  if status.get("other_runs"):
    # Their runner is gone: a later one started only once none ran.
    lines += ["from an earlier invocation (not planned by the last one):"]
    lines += [row(name, r, False)
              for name, r in status["other_runs"].items()]
  return "\n".join(lines)
