"""alfworld: ALFWorld's text engine (TextWorld on PDDL) on game files you give.

Optional: needs `pip install alfworld==0.4.2` (TextWorld with fast-downward;
it builds from source, which takes minutes). Nothing here imports it until an
environment is built, and nothing is ever downloaded: the games are ALFWorld
game files (game.tw-pddl, usually beside a traj_data.json) that you point to,

  * games=: a game file, a directory searched for *.tw-pddl, or a list of
    them (every split plays these), or
  * data_dir= (default $ALFWORLD_DATA): ALFWorld's layout, the split's games
    under json_2.1.1/{train,valid_seen,valid_unseen} (or directly under
    {train,valid_seen,valid_unseen}) for "train", "eval_seen", "eval_unseen".

As ALFWorld does, games under "movable"/"Sliced" paths and games marked
unsolvable are skipped. Seed s plays game (s - split start) % number of games,
in sorted path order. Observations and actions are ALFWorld's (the welcome
banner dropped, as household's); the reward is `win_reward` on the winning
step. The expert is ALFWorld's: its planner (fast-downward, re-planned every
step from the true state) or its hand-coded expert (needs traj_data.json).

Example:
  env = AlfWorldEnv(games="/data/alfworld/json_2.1.1/valid_seen")
  obs, info = env.reset(seed=0)
"""

from __future__ import annotations

import functools
import json
import os
import random
from typing import Any, Sequence

from seed_jax.envs.base import SPLITS

INSTALL_HINT = ("the alfworld environment needs ALFWorld's text engine: "
                "pip install alfworld==0.4.2 (builds fast-downward and jericho "
                "from source)")
SPLIT_DIRS = {"train": "train", "eval_seen": "valid_seen",
              "eval_unseen": "valid_unseen"}
# ALFWorld task types -> the household families.
FAMILIES = {"pick_and_place_simple": "pick",
            "look_at_obj_in_light": "look_at_in_light",
            "pick_clean_then_place_in_recep": "clean",
            "pick_heat_then_place_in_recep": "heat",
            "pick_cool_then_place_in_recep": "cool",
            "pick_two_obj_and_place": "pick_two"}
EXPERTS = ("planner", "handcoded", None)
NOTHING = "Nothing happens."  # ALFWorld's reply to a command it cannot do
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
_TASK = "Your task is to: "


def requirement_error() -> str | None:
  """Why the environment cannot run here (a message), or None if it can."""
  try:
    import fast_downward  # pylint: disable=g-import-not-at-top,unused-import
    import textworld  # pylint: disable=g-import-not-at-top,unused-import
    from alfworld.agents.environment import alfred_tw_env  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"{INSTALL_HINT} ({e})"
  return None


def _no_games(where: str) -> FileNotFoundError:
  return FileNotFoundError(
      f"no ALFWorld game files (*.tw-pddl) {where}. Pass games= (a "
      "game.tw-pddl, a directory of them, or a list), or data_dir= / set "
      "ALFWORLD_DATA to a directory holding json_2.1.1/{train,valid_seen,"
      "valid_unseen}/<task>/<trial>/game.tw-pddl (ALFWorld's alfworld-download "
      "makes it; seed_jax never downloads)")


@functools.lru_cache(maxsize=32)
def _games_under(path: str) -> tuple[str, ...]:
  """Playable game files at a path (a file or a directory tree), sorted;
  read once per path and process (each file is parsed for its solvable flag)."""
  if os.path.isfile(path):
    found = [path]
  else:
    found = [os.path.join(root, f) for root, _, files in os.walk(path)
             for f in files if f.endswith(".tw-pddl")]
  keep = []
  for f in sorted(found):
    if "movable" in f or "Sliced" in f:
      continue
    with open(f) as fh:
      if json.load(fh).get("solvable", True) is False:
        continue
    keep.append(f)
  return tuple(keep)


def find_games(split: str, *, games: str | Sequence[str] | None = None,
               data_dir: str | None = None) -> list[str]:
  """The game files a split plays (see the module docstring).

  Args:
    split: "train", "eval_seen" or "eval_unseen".
    games: game files for every split: a game.tw-pddl, a directory searched
      recursively for *.tw-pddl, or a list of either.
    data_dir: ALFWorld's data directory (default $ALFWORLD_DATA), e.g. with
      json_2.1.1/valid_seen/<task>/<trial>/game.tw-pddl for "eval_seen".

  Returns:
    Sorted paths, e.g. [".../valid_seen/pick_and_place_simple-.../trial_1/
    game.tw-pddl", ...].

  Raises:
    FileNotFoundError: none found; the message says where to put them.
  """
  if games is not None:
    paths = [games] if isinstance(games, (str, os.PathLike)) else list(games)
    where = f"at {[str(p) for p in paths]}"
  else:
    root = data_dir or os.environ.get("ALFWORLD_DATA")
    if not root:
      raise _no_games("given (games=None, data_dir=None, ALFWORLD_DATA unset)")
    sub = SPLIT_DIRS[split]
    paths = [os.path.join(root, "json_2.1.1", sub), os.path.join(root, sub)]
    paths = [p for p in paths if os.path.isdir(p)][:1]
    where = f"for split {split!r} under {root}"
  found = sorted({f for p in paths for f in _games_under(os.fspath(p))})
  if not found:
    raise _no_games(where)
  return found


def _task_type(gamefile: str) -> str:
  """ALFWorld's task type, from traj_data.json or the directory names."""
  traj = os.path.join(os.path.dirname(gamefile), "traj_data.json")
  if os.path.isfile(traj):
    with open(traj) as f:
      return json.load(f).get("task_type", "")
  for part in reversed(gamefile.split(os.sep)):
    for task_type in FAMILIES:
      if part.startswith(task_type):
        return task_type
  return ""


class AlfWorldEnv:
  """ALFWorld text games; see the module docstring.

  Args:
    split: "train", "eval_seen" or "eval_unseen".
    games: game files for every split (a file, a directory or a list).
    data_dir: ALFWorld's data directory (default $ALFWORLD_DATA).
    max_steps: steps before the episode is cut.
    expert: "planner" (default), "handcoded" or None (no per-step expert
      plan; faster).
    win_reward: reward of the winning step (10, as household and verl-agent).

  Raises:
    ImportError: alfworld is missing.
    FileNotFoundError: no game files; or expert="handcoded" and a game has
      no traj_data.json beside it.
  """

  name = "alfworld"
  no_op = "look"

  def __init__(self, *, split: str = "train",
               games: str | Sequence[str] | None = None,
               data_dir: str | None = None, max_steps: int = 50,
               expert: str | None = "planner",
               win_reward: float = 10.0) -> None:
    error = requirement_error()
    if error:
      raise ImportError(error)
    if split not in SPLITS:
      raise ValueError(f"unknown split {split!r}; known: {sorted(SPLITS)}")
    if expert not in EXPERTS:
      raise ValueError(f"unknown expert {expert!r}; known: {EXPERTS}")
    self.split = split
    self.games = find_games(split, games=games, data_dir=data_dir)
    if expert == "handcoded":
      for g in self.games:
        if not os.path.isfile(os.path.join(os.path.dirname(g),
                                           "traj_data.json")):
          raise FileNotFoundError(f"the handcoded expert needs traj_data.json "
                                  f"beside {g}; use expert='planner'")
    self.max_steps = max_steps
    self.expert = expert
    self.win_reward = win_reward
    self._engine = None
    self._loaded = None
    self._state = None
    self._task = ""
    self.task_type = ""
    self.expert_plan: list[str] = []

  # -- protocol ---------------------------------------------------------------

  @property
  def task(self) -> str:
    """e.g. "put a clean mug in coffeemachine"; "" before reset."""
    return self._task

  @property
  def family(self) -> str:
    return FAMILIES.get(self.task_type, "")

  @property
  def admissible_actions(self) -> list[str]:
    if self._state is None:
      return []
    return [a for a in self._state["admissible_commands"] if a != "help"]

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Starts game (seed - split start) % len(games); returns (obs, info)."""
    self.gamefile = self.games[(seed - SPLITS[self.split].start)
                               % len(self.games)]
    self._load(self.gamefile)
    self._state = self._engine.reset()
    feedback = self._state["feedback"]
    self._task = ""
    if _TASK in feedback:
      self._task = feedback.rsplit(_TASK, 1)[1].strip().rstrip(".")
    self.task_type = _task_type(self.gamefile)
    self.walkthrough = list(self._state.get("extra.walkthrough") or [])
    self.actions: list[str] = []
    self.valid: list[bool] = []
    self.done = False
    if self.expert == "handcoded":
      from alfworld.agents.expert import HandCodedTWAgent  # pylint: disable=g-import-not-at-top
      self._handcoded = HandCodedTWAgent(max_steps=200)
      self._handcoded.reset(self.gamefile)
      self._handcoded.observe(feedback)  # the intro lists the receptacles
    self._update_plan("")
    obs = feedback.replace(_WELCOME, "", 1).strip()
    return obs, self._info(valid=True)

  def _load(self, gamefile: str) -> None:
    import textworld  # pylint: disable=g-import-not-at-top
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler  # pylint: disable=g-import-not-at-top
    if self._engine is None:
      infos = textworld.EnvInfos(
          won=True, admissible_commands=True, extras=["walkthrough"],
          facts=self.expert == "handcoded",
          policy_commands=self.expert == "planner")
      self._engine = textworld.start(
          gamefile, infos, wrappers=[AlfredDemangler(shuffle=False)])
    elif self._loaded != gamefile:
      self._engine.load(gamefile)
    self._loaded = gamefile

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Plays one action; one not among the admissible actions is an invalid
    step that the game never sees ("Nothing happens.", as ALFWorld says)."""
    if self._state is None:
      raise RuntimeError("call reset(seed) first")
    if self.done:
      return NOTHING, 0.0, True, self._info(valid=False)
    action = " ".join(str(action).lower().split())
    valid = action in self.admissible_actions
    self.actions.append(action)
    self.valid.append(valid)
    if valid:
      self._state, _, _ = self._engine.step(action)
      obs = self._state["feedback"]
      self._update_plan(action)
    else:
      obs = NOTHING
    won = self.won
    self.done = won or len(self.actions) >= self.max_steps
    reward = self.win_reward if won else 0.0
    return obs.strip(), reward, self.done, self._info(valid=valid)

  def _update_plan(self, last_action: str) -> None:
    """The expert's plan from the current state (ALFWorld's AlfredExpert)."""
    state = self._state
    if self.expert == "planner":
      self.expert_plan = list(state.get("policy_commands") or [])
    elif self.expert == "handcoded" and last_action:
      try:
        nxt = self._handcoded.act(state, 0, state["won"], last_action)
      except Exception:  # pylint: disable=broad-except
        nxt = None  # its heuristics gave up (e.g. a timeout); no plan
      self.expert_plan = [nxt] if nxt in self.admissible_actions else []
    elif self.expert == "handcoded":
      self.expert_plan = ["look"]  # ALFWorld's expert opens with "look"

  @property
  def won(self) -> bool:
    return bool(self._state and self._state["won"])

  def _info(self, valid: bool) -> dict[str, Any]:
    return {"won": self.won, "admissible_actions": self.admissible_actions,
            "action_valid": valid, "task": self.task, "family": self.family,
            "expert_plan": list(self.expert_plan)}

  def ground_truth(self) -> dict[str, Any]:
    """Hidden facts: the game, its walkthrough, what the agent did.

    Returns:
      dict with gamefile, task_type, family, task, walkthrough (the game
      file's, or the planner's from the start when it has none),
      expert_length, actions, action_valid and won.
    """
    if self._state is None:
      raise RuntimeError("call reset(seed) first")
    return {"gamefile": self.gamefile, "task_type": self.task_type,
            "family": self.family, "task": self.task,
            "walkthrough": list(self.walkthrough),
            "expert_length": len(self.walkthrough),
            "actions": list(self.actions), "action_valid": list(self.valid),
            "won": self.won}

  def close(self) -> None:
    if self._engine is not None:
      self._engine.close()
      self._engine = None


class AlfWorldExpert:
  """Plays the env's expert plan (ALFWorld's planner or hand-coded expert).

  Args:
    env: a reset AlfWorldEnv built with expert="planner" or "handcoded".
    noise: probability of a random admissible action instead.
    seed: seed of the noise.
  """

  def __init__(self, env: AlfWorldEnv, *, noise: float = 0.0,
               seed: int = 0) -> None:
    if env.expert is None:
      raise ValueError("build the env with expert='planner' or 'handcoded'")
    self.env = env
    self.noise = noise
    self.rng = random.Random(seed)

  def act(self) -> str:
    admissible = self.env.admissible_actions
    if self.noise and self.rng.random() < self.noise and admissible:
      return self.rng.choice(admissible)
    plan = self.env.expert_plan
    return plan[0] if plan else self.env.no_op
