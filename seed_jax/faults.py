"""Fault injection for reliability tests: SIGKILL at a named point of a run.

With `SEED_FAULT_POINT="<phase>:<update>"` in the environment (for example
`SEED_FAULT_POINT=analysis:1`), the process kills itself with SIGKILL, as
`kill -9` would, when the run reaches `maybe_crash(phase, update)` with that
phase and that 0-based update index. Unset (the default), `maybe_crash`
returns at once. tests/kill_resume_test.py kills a run this way and checks
that the same command, run again, resumes and ends as an uninterrupted run.

Phases and where they fire (update = the 0-based index of the update):

  rollout     trainer.RLTrainer.update, once the rollout has been played
  analysis    trainer.RLTrainer.update, once the self-analysis has run
  train_step  trainer.RLTrainer.update, after the first optimizer step
  checkpoint  train.train, right after the update's checkpoint save started
              (the files are still being written in the background)
"""

from __future__ import annotations

import os
import signal
import sys

ENV_VAR = "SEED_FAULT_POINT"
PHASES = ("rollout", "analysis", "train_step", "checkpoint")


def parse(spec: str) -> tuple[str, int]:
  """Reads a fault point: "analysis:1" -> ("analysis", 1).

  Raises:
    ValueError: for anything but "<phase>:<update>" with a known phase, so a
      misspelt point fails loudly instead of never firing.
  """
  phase, sep, update = spec.partition(":")
  if not sep or phase not in PHASES or not update.strip().isdigit():
    raise ValueError(f"{ENV_VAR}={spec!r}: expected '<phase>:<update>' with "
                     f"phase one of {PHASES}, e.g. 'analysis:1'")
  return phase, int(update)


def maybe_crash(phase: str, update: int) -> None:
  """Kills this process with SIGKILL if `SEED_FAULT_POINT` names this point.

  Args:
    phase: one of PHASES.
    update: the 0-based index of the update in progress.

  Raises:
    ValueError: when `SEED_FAULT_POINT` is set but malformed.
  """
  spec = os.environ.get(ENV_VAR)
  if not spec:
    return
  if parse(spec) == (phase, int(update)):
    print(f"{ENV_VAR}: killing the run at {phase}:{update}", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
