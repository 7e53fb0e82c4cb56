"""gym_sokoban: gym-sokoban's own levels and dynamics behind the Env protocol.

Optional: needs `pip install gym-sokoban==0.0.6 gym==0.26.2` and a setuptools
that still ships pkg_resources (< 81), which gym-sokoban imports. Nothing here
imports it until an environment is built. The class is constructed directly:
gym.make would wrap it in gym's environment checker, which fails on NumPy 2.

gym-sokoban generates levels with the global `random` and `np.random`
generators; reset(seed) seeds both and restores their previous states, so a
seed always gives the same level and no one else's random stream moves.

Splits follow the built-in sokoban's rule (`sokoban.held_out`, on the room up
to translation, rotation and reflection): a level whose class is not the
split's ("eval_unseen" keeps the held-out class, the others the rest) is
drawn again from a seed derived from (seed, attempt), up to MAX_ATTEMPTS
times, so eval_unseen never replays a training level.

Observations, actions and rewards are as in the built-in `sokoban` (its text
symbols, "up"/"down"/"left"/"right", gym-sokoban's rewards), and the state is
exposed as a `sokoban.Level` and (player, boxes), so the built-in BFS solver,
expert and hindsight facts apply unchanged.

Example:
  env = GymSokobanEnv(dim=(7, 7), num_boxes=1)
  obs, info = env.reset(seed=0)   # "...\\n#O__###\\n#__XP##\\n#____##\\n#######"
"""

from __future__ import annotations

import hashlib
import random
import warnings
from typing import Any

import numpy as np

from seed_jax.envs import base
from seed_jax.envs import sokoban

INSTALL_HINT = ("the gym_sokoban environment needs gym-sokoban "
                "(pip install gym-sokoban==0.0.6 gym==0.26.2) and a setuptools "
                "that still has pkg_resources (pip install 'setuptools<81')")
# gym-sokoban's push actions (a push moves the player when there is no box).
PUSH = {"up": 1, "down": 2, "left": 3, "right": 4}
NO_OPERATION = 0
# room_fixed / room_state codes.
WALL, TARGET, BOX_ON_TARGET, BOX, PLAYER = 0, 2, 3, 4, 5
# Levels drawn per reset at most until one is of the split's class (a quarter
# of the levels are held out: 0.75**100 ~ 3e-13 for eval_unseen).
MAX_ATTEMPTS = 100


def requirement_error() -> str | None:
  """Why the environment cannot run here (a message), or None if it can."""
  try:
    _engine_class()
  except ImportError as e:
    return f"{INSTALL_HINT} ({type(e).__name__}: {e})"
  return None


def _engine_class() -> type:
  with warnings.catch_warnings():  # gym-sokoban's own pkg_resources import
    warnings.filterwarnings("ignore", "pkg_resources is deprecated")
    from gym_sokoban.envs.sokoban_env import SokobanEnv  # pylint: disable=g-import-not-at-top
  return SokobanEnv


def attempt_seed(seed: int, attempt: int) -> int:
  """The generator seed of a reset's `attempt`-th draw: `seed` itself first,
  then a 32-bit hash of (seed, attempt)."""
  if attempt == 0:
    return seed
  digest = hashlib.sha256(f"gym_sokoban/{seed}/{attempt}".encode()).digest()
  return int.from_bytes(digest[:4], "big")


def _cells(mask: np.ndarray) -> set[sokoban.Pos]:
  """(row, col) of the True cells of a [rows, cols] mask."""
  return {(int(r), int(c)) for r, c in np.argwhere(mask)}


class GymSokobanEnv:
  """A gym-sokoban level; see the module docstring.

  Args:
    split: "train" and "eval_seen" play training-class levels,
      "eval_unseen" held-out ones (`sokoban.held_out`; see the module
      docstring).
    dim: (rows, cols) of the room, walls included.
    num_boxes: boxes per level.
    max_steps: steps before the episode is cut.
    num_gen_steps: gym-sokoban's random-walk length (None: its default).

  Raises:
    ValueError: an unknown split.
    ImportError: gym-sokoban (or pkg_resources) is missing.
  """

  name = "gym_sokoban"
  no_op = "still"  # not an action: an invalid step, as in `sokoban`

  def __init__(self, *, split: str = "train", dim: tuple[int, int] = (7, 7),
               num_boxes: int = 1, max_steps: int = 30,
               num_gen_steps: int | None = None) -> None:
    self.evaluation = base.check_split(split) == "eval_unseen"
    try:
      engine_class = _engine_class()
    except ImportError as e:
      raise ImportError(f"{INSTALL_HINT} ({e})") from e
    self.dim = tuple(dim)
    self.num_boxes = num_boxes
    self.max_steps = max_steps
    self._engine = engine_class(dim_room=self.dim, max_steps=max_steps,
                                num_boxes=num_boxes,
                                num_gen_steps=num_gen_steps, reset=False)
    self.level: sokoban.Level | None = None
    self.done = False

  @property
  def task(self) -> str:
    return "push every box (X) onto a target (O)"

  @property
  def family(self) -> str:
    return "sokoban"

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates gym-sokoban's level for `seed` (the first of the split's
    class, see the module docstring); returns (text grid, info).

    Raises:
      ValueError: a negative seed.
      RuntimeError: no level of the split's class in MAX_ATTEMPTS draws.
    """
    base.check_seed(seed)
    for attempt in range(MAX_ATTEMPTS):
      self._generate(attempt_seed(seed, attempt))
      if sokoban.held_out(self.level, self.state) == self.evaluation:
        break
    else:
      self.level = None
      raise RuntimeError(
          f"no {'held-out' if self.evaluation else 'training'}-class "
          f"gym-sokoban level for seed {seed} in {MAX_ATTEMPTS} draws")
    self.history = [self.state]
    self.actions: list[str] = []
    self.solution = self.level.solve(self.state) or []
    self.done = False
    return self.render_text(), self._info(valid=True)

  def _generate(self, seed: int) -> None:
    """Has gym-sokoban make the level of `seed`; sets self.level."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
      random.seed(seed)
      np.random.seed(seed % 2**32)
      self._engine.reset(render_mode="tiny_rgb_array")
    finally:
      random.setstate(py_state)
      np.random.set_state(np_state)
    fixed = self._engine.room_fixed  # [rows, cols]
    self.level = sokoban.Level(_cells(fixed == WALL),
                               frozenset(_cells(fixed == TARGET)), self.dim)

  @property
  def state(self) -> sokoban.State:
    """(player, boxes) as `sokoban.Level` uses it, read from gym-sokoban."""
    room = self._engine.room_state  # [rows, cols]
    (player,) = _cells(room == PLAYER)
    return player, frozenset(_cells((room == BOX) | (room == BOX_ON_TARGET)))

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Pushes/moves the player; an unknown action is an invalid no-op step
    (gym-sokoban's "no operation": it still costs the step penalty)."""
    if self.level is None:
      raise RuntimeError("call reset(seed) first")
    if self.done:
      return self.render_text(), 0.0, True, self._info(valid=False)
    action = str(action).strip().lower()
    valid = action in PUSH
    _, reward, done, _ = self._engine.step(
        PUSH.get(action, NO_OPERATION), observation_mode="tiny_rgb_array")
    self.history.append(self.state)
    self.actions.append(action)
    self.done = bool(done) or self.won or len(self.actions) >= self.max_steps
    return self.render_text(), float(reward), self.done, self._info(valid)

  @property
  def won(self) -> bool:
    return self.state[1] <= self.level.targets

  def _info(self, valid: bool) -> dict[str, Any]:
    return {"won": self.won, "admissible_actions": list(PUSH),
            "action_valid": valid, "task": self.task, "family": self.family,
            "boxes_on_target": len(self.state[1] & self.level.targets)}

  def render_text(self) -> str:
    """The room in the built-in sokoban's symbols, one row per line."""
    return self._as_builtin().render_text()

  def ground_truth(self) -> dict[str, Any]:
    """The built-in sokoban's hindsight facts (see sokoban.SokobanEnv)."""
    if self.level is None:
      raise RuntimeError("call reset(seed) first")
    return self._as_builtin().ground_truth()

  def _as_builtin(self) -> sokoban.SokobanEnv:
    """A built-in SokobanEnv holding this episode (for rendering and facts)."""
    # The twin generates no level, so the generator's floor of two steps
    # does not apply to the gym episode it holds.
    twin = sokoban.SokobanEnv(dim=self.dim, num_boxes=self.num_boxes,
                              max_steps=max(2, self.max_steps))
    twin.level, twin.state = self.level, self.state
    twin.history, twin.actions = list(self.history), list(self.actions)
    twin.solution = self.solution
    return twin
