"""twx: TextWorldExpress games (twc, cookingworld, coin, ...) as protocol envs.

Optional: needs `pip install textworld-express` and a Java runtime (8 or later,
`java` on PATH); the package starts its own JVM per environment. Nothing here
imports it until an environment is built.

Splits map to TextWorldExpress folds, which differ in their object sets:
"train" and "eval_seen" play the train fold (the seed ranges keep them
apart), skipping TWX's dev and test seeds: in games whose folds do not differ
(coin), a train seed equal to a test seed would be that very test game.
"eval_unseen" plays the test fold on its official seeds (split offset i ->
the fold's i-th seed, so eval_unseen seeds 2,000,000..2,000,999 are exactly
the published test games).

Example:
  env = TextWorldExpressEnv(game="coin", params={"numLocations": 2})
  obs, info = env.reset(seed=0)
  obs, reward, done, info = env.step(info["admissible_actions"][0])
"""

from __future__ import annotations

import random
import shutil
from typing import Any, Mapping, Sequence

from seed_jax.envs.base import SPLITS

INSTALL_HINT = ("the twx environment needs the textworld-express package "
                "(pip install textworld-express==1.1.0) and a Java runtime, "
                "version 8 or later, with `java` on PATH")
FOLDS = {"train": "train", "eval_seen": "train", "eval_unseen": "test"}
# TWX's own reply to an action it does not know.
UNKNOWN_ACTION = "Unknown action: I'm not sure what you mean."
# Commands that only show something: the gold path stays valid around them.
_LOOKS = ("look around", "inventory")


def requirement_error() -> str | None:
  """Why the environment cannot run here (a message), or None if it can."""
  try:
    import textworld_express  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"{INSTALL_HINT} ({e})"
  if shutil.which("java") is None:
    return f"{INSTALL_HINT} (no `java` on PATH)"
  return None


def _params_text(params: str | Mapping[str, Any] | None) -> str:
  """TWX's params string: {"numLocations": 2} -> "numLocations=2"."""
  if params is None:
    return ""
  if isinstance(params, str):
    return params
  return ",".join(f"{k}={int(v)}" for k, v in params.items())


def _task_text(description: str) -> str:
  """"Your task is to find the coin.  Once ..." -> "find the coin. Once ..."."""
  text = " ".join(description.split())
  prefix = "your task is to "
  if text.lower().startswith(prefix):
    text = text[len(prefix):]
  return text.rstrip(".")


def twx_seed(seed: int, *, fold: str, split: str, dev_seeds: Sequence[int],
             test_seeds: Sequence[int]) -> int:
  """The TWX seed that our task seed plays (see the module docstring).

  Train fold: the seed-th integer that is neither a dev nor a test seed.
  Dev and test folds: the fold's official seeds, by offset into the split.
  """
  if fold == "train":
    out = int(seed)
    for s in sorted(set(dev_seeds) | set(test_seeds)):
      if s > out:
        break
      out += 1
    return out
  seeds = list(dev_seeds if fold == "dev" else test_seeds)
  return seeds[(seed - SPLITS[split].start) % len(seeds)]


class TextWorldExpressEnv:
  """One TextWorldExpress game; see the module docstring.

  Args:
    split: "train", "eval_seen" or "eval_unseen" (chooses the fold).
    game: a TextWorldExpress game name ("twc", "cookingworld", "coin", ...).
    params: generation properties, a dict ({"numLocations": 1}) or TWX's own
      string ("numLocations=1,includeDoors=0"); unknown keys raise at reset.
    max_steps: steps before the episode is cut.
    fold: overrides the split's fold ("train", "dev" or "test").

  Raises:
    ImportError: textworld-express or Java is missing (the message says how
      to install them).
  """

  name = "twx"
  no_op = "look around"

  def __init__(self, *, split: str = "train", game: str = "twc",
               params: str | Mapping[str, Any] | None = None,
               max_steps: int = 50, fold: str | None = None) -> None:
    error = requirement_error()
    if error:
      raise ImportError(error)
    if split not in SPLITS:
      raise ValueError(f"unknown split {split!r}; known: {sorted(SPLITS)}")
    self.split = split
    self.game = game
    self.params = _params_text(params)
    self.max_steps = max_steps
    self.fold = fold or FOLDS[split]
    self._engine = None  # started at the first reset (a JVM)
    self._info: dict[str, Any] | None = None
    self.actions: list[str] = []
    self.valid: list[bool] = []

  # -- protocol ---------------------------------------------------------------

  @property
  def task(self) -> str:
    """e.g. "search the environment and find the coin. Once you find ..."."""
    return _task_text(self._info["taskDescription"]) if self._info else ""

  @property
  def family(self) -> str:
    return self.game

  @property
  def admissible_actions(self) -> list[str]:
    """Lower-cased, sorted (TWX has e.g. "take used Q-tip"; replies are
    lower-cased before projection)."""
    return sorted(self._commands()) if self._info else []

  def _commands(self) -> dict[str, str]:
    """Admissible action (lower-cased) -> TWX's own spelling."""
    return {" ".join(a.lower().split()): a for a in self._info["validActions"]}

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates the game of `seed` (see the module docstring for the fold)."""
    if self._engine is None:
      from textworld_express import TextWorldExpressEnv as Engine  # pylint: disable=g-import-not-at-top
      self._engine = Engine(envStepLimit=self.max_steps)
    self.twx_seed = self._twx_seed(seed)
    obs, info = self._engine.reset(
        seed=self.twx_seed, gameFold=self.fold, gameName=self.game,
        gameParams=self.params, generateGoldPath=True)
    self._info = info
    self.gold = [" ".join(a.lower().split())
                 for a in self._engine.getGoldActionSequence()]
    self.properties = self._engine.getGenerationProperties()
    self.actions, self.valid = [], []
    self.score, self.done = 0.0, False
    return obs.strip(), self._protocol_info(valid=True)

  def _twx_seed(self, seed: int) -> int:
    return twx_seed(seed, fold=self.fold, split=self.split,
                    dev_seeds=self._engine.getValidSeedsDev(),
                    test_seeds=self._engine.getValidSeedsTest())

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Plays one action; one not among the admissible actions is an invalid
    step that the game never sees (TWX's "Unknown action" reply)."""
    if self._info is None:
      raise RuntimeError("call reset(seed) first")
    if self.done:
      return UNKNOWN_ACTION, 0.0, True, self._protocol_info(valid=False)
    action = " ".join(str(action).lower().split())
    command = self._commands().get(action)
    valid = command is not None
    self.actions.append(action)
    self.valid.append(valid)
    reward, engine_done = 0.0, False
    if valid:
      obs, reward, engine_done, self._info = self._engine.step(command)
      self.score = float(self._info["score"])
    else:
      obs = UNKNOWN_ACTION
    self.done = (engine_done or self.won or self.failed
                 or len(self.actions) >= self.max_steps)
    return obs.strip(), float(reward), self.done, self._protocol_info(valid)

  @property
  def won(self) -> bool:
    return bool(self._info and self._info["tasksuccess"])

  @property
  def failed(self) -> bool:
    """The game can no longer be won (e.g. an ingredient was burned)."""
    return bool(self._info and self._info["taskfailure"])

  def _protocol_info(self, valid: bool) -> dict[str, Any]:
    return {"won": self.won, "admissible_actions": self.admissible_actions,
            "action_valid": valid, "task": self.task, "family": self.family,
            "score": self.score, "failed": self.failed}

  def ground_truth(self) -> dict[str, Any]:
    """Hidden facts: the game's generation properties and gold path.

    Returns:
      dict with game, fold, twx_seed, properties (TWX's generation
      properties), task_description, gold_actions and expert_length (the
      gold path drawn at reset, from the start), actions and action_valid
      (what the agent did), score (0..1), failed and won.
    """
    if self._info is None:
      raise RuntimeError("call reset(seed) first")
    return {"game": self.game, "fold": self.fold, "twx_seed": self.twx_seed,
            "properties": dict(self.properties),
            "task_description": self._info["taskDescription"],
            "gold_actions": list(self.gold), "expert_length": len(self.gold),
            "actions": list(self.actions), "action_valid": list(self.valid),
            "score": self.score, "failed": self.failed, "won": self.won}

  def close(self) -> None:
    """Stops the JVM (it also stops when the process exits)."""
    if self._engine is not None:
      self._engine.close()
      self._engine = None


class GoldPathExpert:
  """Follows the game's gold path (TextWorldExpress's own solution).

  The gold path is drawn at reset (for some games, e.g. coin, a new draw on
  every reset of the same seed; the game itself does not change), and this
  expert cannot re-plan: once the agent has taken a valid action off the path
  (other than "look around" or "inventory") it answers the no-op.

  Args:
    env: a reset TextWorldExpressEnv.
    noise: probability of a random admissible action instead.
    seed: seed of the noise.
  """

  def __init__(self, env: TextWorldExpressEnv, *, noise: float = 0.0,
               seed: int = 0) -> None:
    self.env = env
    self.noise = noise
    self.rng = random.Random(seed)

  def remaining(self) -> list[str] | None:
    """The rest of the gold path from the env's state, or None if off it."""
    env, cursor = self.env, 0
    for action, valid in zip(env.actions, env.valid):
      if not valid:
        continue
      if cursor < len(env.gold) and action == env.gold[cursor]:
        cursor += 1
      elif action not in _LOOKS:
        return None
    return env.gold[cursor:]

  def act(self) -> str:
    admissible = self.env.admissible_actions
    if self.noise and self.rng.random() < self.noise and admissible:
      return self.rng.choice(admissible)
    rest = self.remaining()
    return rest[0] if rest else self.env.no_op
