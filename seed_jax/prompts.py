"""Rollout prompts and the text -> action projection, per environment.

Prompts follow verl-agent's shape: the task, the last k observation/action
pairs, the current observation, the admissible actions, the instruction to
reason in <think> </think> and answer in <action> </action>, and a last line
starting "Now it's your turn". The task line ("Your task is to: ..." or
"Your goal is to ...") is a line of its own, so that skills.py can insert a
skill block right after it (docs/algorithm.md §5).
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Sequence

HISTORY_LENGTH = 2  # the demo's k; the paper uses 5
MAX_ACTION_CHARS = 200  # longer "actions" are rambling, not commands
# Each environment's action that changes nothing, the fallback for replies
# that do not project (kept equal to the envs' `no_op`, checked by tests).
NO_OPS = {"household": "look", "sokoban": "still", "twx": "look around",
          "alfworld": "look", "gym_sokoban": "still"}
# What the environment is sent for a reply whose action parsed but is not
# admissible: "no_op", the environment's no-op (the history shows the
# no-op), or "as_written", the action itself (the environment judges it,
# the household game answering "Nothing happens.", and the history shows
# what was tried; verl-agent's ALFWorld does this). Replies that do not
# parse get the no-op either way.
INVALID_ACTIONS = ("no_op", "as_written")

INSTRUCTION = (
    "You should first reason step-by-step about the current situation. This "
    "reasoning process MUST be enclosed within <think> </think> tags. Once "
    "you've finished your reasoning, you should choose an admissible action "
    "for current step and present it within <action> </action> tags.")

History = Sequence[tuple[str, str]]  # (observation, action) pairs, oldest first

_SOKOBAN_INTRO = (
    "You are an expert agent operating in the Sokoban environment.\n"
    "Symbols: # wall, _ floor, O target, X box, √ box on target, P player, "
    "S player on target.")
_SOKOBAN_RULES = (
    "Rules: you can only push boxes, never pull them, and not into walls. "
    "Never push a box into a corner or against a wall where it cannot reach "
    "a target.")


def _history_lines(history: History, history_length: int,
                   fmt: Callable[[int, str, str], str]) -> list[str]:
  """verl-agent's history block; empty before the first action."""
  if not history or history_length <= 0:
    return []
  recent = list(history)[-history_length:]
  first = len(history) - len(recent) + 1
  lines = [f"Prior to this step, you have already taken {len(history)} "
           f"step(s). Below are the most recent {len(recent)} observations "
           "and the corresponding actions you took:"]
  lines += [fmt(first + i, obs, act) for i, (obs, act) in enumerate(recent)]
  return lines


def _strip_task(observation: str) -> str:
  """Drops ALFWorld's "\\n\\nYour task is to: ..." tail (the prompt has it)."""
  return observation.split("\n\nYour task is to:", 1)[0]


def household_prompt(task: str, history: History, observation: str,
                     admissible: Sequence[str], *,
                     history_length: int = HISTORY_LENGTH,
                     environment: str = "the ALFRED Embodied Environment"
                     ) -> str:
  """Rollout prompt for the household (ALFWorld-style) environment.

  Args:
    task: e.g. "put a clean mug in coffeemachine" (no final period).
    history: every (observation, action) pair so far, oldest first.
    observation: the current observation.
    admissible: the admissible actions now.
    history_length: how many recent pairs to show (k).
    environment: what the first line says the agent operates in.

  Returns:
    The prompt. Example, with history [("You arrive at fridge 1. The fridge 1
    is closed.", "go to fridge 1")] and observation "You open the fridge 1.
    ...":
      You are an expert agent operating in the ALFRED Embodied Environment.
      Your task is to: put a cool apple in countertop.
      Prior to this step, you have already taken 1 step(s). Below are the most
      recent 1 observations and the corresponding actions you took:
      [Observation 1: 'You arrive at ...', Action 1: 'go to fridge 1']
      You are now at step 2 and your current observation is: You open ...
      Your admissible actions of the current situation are: ['close fridge 1',
      ...].
      You should first reason step-by-step ... <action> </action> tags.
      Now it's your turn to take an action.
  """
  end = "" if task.endswith((".", "!", "?")) else "."
  lines = [f"You are an expert agent operating in {environment}.",
           f"Your task is to: {task}{end}"]
  lines += _history_lines(
      history, history_length,
      lambda i, o, a: f"[Observation {i}: '{_strip_task(o)}', Action {i}: "
                      f"'{a}']")
  current = _strip_task(observation)
  if history:
    lines.append(f"You are now at step {len(history) + 1} and your current "
                 f"observation is: {current}")
  else:
    lines.append(f"Your current observation is: {current}")
  listed = ", ".join(f"'{a}'" for a in admissible)
  lines.append(f"Your admissible actions of the current situation are: "
               f"[{listed}].")
  lines += [INSTRUCTION, "Now it's your turn to take an action."]
  return "\n".join(lines)


def sokoban_prompt(task: str, history: History, observation: str,
                   admissible: Sequence[str], *,
                   history_length: int = HISTORY_LENGTH) -> str:
  """Rollout prompt for Sokoban (text grid observations).

  Args:
    task: e.g. "push every box (X) onto a target (O)".
    history: every (grid, action) pair so far, oldest first.
    observation: the current grid, one row per line.
    admissible: e.g. ["up", "down", "left", "right"].
    history_length: how many recent pairs to show (k).

  Returns:
    The prompt. Example, no history, a 3x4 grid "####\\n#PXO\\n####":
      You are an expert agent operating in the Sokoban environment.
      Symbols: # wall, _ floor, O target, X box, √ box on target, P player,
      S player on target.
      Your goal is to push every box (X) onto a target (O).
      Rules: you can only push boxes, ...
      Your current observation is:
      ####
      #PXO
      ####
      Your admissible actions are ["up", "down", "left", "right"].
      You should first reason step-by-step ... <action> </action> tags.
      Now it's your turn to make a move (choose ONE action only for the
      current step).
  """
  lines = [_SOKOBAN_INTRO, f"Your goal is to {task}.", _SOKOBAN_RULES]
  lines += _history_lines(
      history, history_length,
      lambda i, o, a: f"[Observation {i}:\n{o}\nAction {i}: '{a}']")
  if history:
    lines.append(f"You are now at step {len(history) + 1} and your current "
                 "observation is:")
  else:
    lines.append("Your current observation is:")
  lines.append(observation)
  listed = ", ".join(f'"{a}"' for a in admissible)
  lines += [f"Your admissible actions are [{listed}].", INSTRUCTION,
            "Now it's your turn to make a move (choose ONE action only for "
            "the current step)."]
  return "\n".join(lines)


PROMPT_BUILDERS: dict[str, Callable[..., str]] = {
    "household": household_prompt, "sokoban": sokoban_prompt,
    "twx": functools.partial(household_prompt,
                             environment="a TextWorldExpress text game"),
    "alfworld": household_prompt, "gym_sokoban": sokoban_prompt}


def build_prompt(env_name: str, task: str, history: History, observation: str,
                 admissible: Sequence[str], *,
                 history_length: int = HISTORY_LENGTH) -> str:
  """Dispatches to the environment's prompt builder.

  Raises:
    ValueError: no builder for env_name (the message lists the known ones).
  """
  if env_name not in PROMPT_BUILDERS:
    raise ValueError(f"no prompt builder for {env_name!r}; known: "
                     f"{sorted(PROMPT_BUILDERS)}")
  return PROMPT_BUILDERS[env_name](task, history, observation, admissible,
                                   history_length=history_length)


_PUT = re.compile(r"^put (.+?) (?:in/on|in|on) (.+)$")


def attempted_action(text: str) -> str:
  """The action a reply asked for, admissible or not: the text inside its
  first <action>...</action>, lower-cased, whitespace collapsed ("" when
  there is none). `project_action` sends it to the environment only when it
  is admissible (and the reply has its <think> block); for an invalid step
  it says what the policy tried."""
  lowered = (text or "").lower()
  # str.find, not a lazy regex: linear time even on replies full of
  # unclosed <action> tags.
  start = lowered.find("<action>")
  end = lowered.find("</action>", start + 8) if start >= 0 else -1
  return " ".join(lowered[start + 8:end].split()) if end >= 0 else ""


def project_action(text: str, admissible: Sequence[str], *,
                   fallback: str | None = None,
                   as_written: bool = False) -> tuple[str, bool]:
  """Maps a policy reply to an environment action and a validity flag.

  The reply is lower-cased; it must contain <think> and </think>; the action is
  the text inside the first <action>...</action>, whitespace collapsed, and
  must be one of `admissible` when that list is non-empty ("put O in/on R" is
  accepted as the admissible "move O to R"). Anything else is invalid.

  Args:
    text: the policy's reply.
    admissible: the admissible actions (empty: accept any non-empty action).
    fallback: the action for invalid replies; default the first admissible
      one (or "" when there is none).
    as_written: an action that parsed but is not admissible is returned
      as it was written (still invalid) instead of `fallback`.

  Returns:
    (action, valid). Examples, admissible ["look", "go to desk 1"]:
      "<think>x</think><action>Go to DESK 1</action>" -> ("go to desk 1", True)
      "<action>go to desk 1</action>" (no think)      -> ("look", False)
      "<think>x</think> go to desk 1" (no tags)        -> ("look", False)
      "<think>x</think><action>go to bed 1</action>"   -> ("look", False),
        and with as_written                            -> ("go to bed 1", False)
  """
  if fallback is None:
    fallback = admissible[0] if admissible else ""
  lowered = (text or "").lower()
  if "<think>" not in lowered or "</think>" not in lowered:
    return fallback, False
  action = attempted_action(lowered)
  if not action or len(action) > MAX_ACTION_CHARS:
    return fallback, False
  if not admissible or action in admissible:
    return action, True
  put = _PUT.match(action)
  if put:
    alias = f"move {put.group(1)} to {put.group(2)}"
    if alias in admissible:
      return alias, True
  return (action if as_written else fallback), False


def project(env_name: str, text: str, admissible: Sequence[str], *,
            no_op: str | None = None,
            invalid_action: str = "no_op") -> tuple[str, bool]:
  """project_action with the environment's no-op as the fallback.

  `no_op` is the environment's own (`Env.no_op`); without it, NO_OPS names
  the built-in environments' and any other falls back to admissible[0].
  `invalid_action` (one of `INVALID_ACTIONS`) says what an action that
  parsed but is not admissible becomes: the no-op, or itself.

  Example: project("sokoban", "<action>up</action>", ["up", ...]) ->
  ("still", False) (no <think> tag); the env treats "still" as an invalid
  step that changes nothing.
  """
  check_invalid_action(invalid_action)
  if no_op is None:
    no_op = NO_OPS.get(env_name)
  return project_action(text, admissible, fallback=no_op,
                        as_written=invalid_action == "as_written")


def check_invalid_action(invalid_action: str,
                         name: str = "invalid_action") -> None:
  """Raises ValueError, naming `name`, unless one of `INVALID_ACTIONS`."""
  if invalid_action not in INVALID_ACTIONS:
    raise ValueError(f"{name} must be one of {INVALID_ACTIONS}, got "
                     f"{invalid_action!r}")
