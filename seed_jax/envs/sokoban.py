"""sokoban: procedural levels, a BFS solver, text and RGB observations.

Levels are made as gym-sokoban makes them: carve a room by a random walk, put
the boxes on their targets, then play backwards (the player walks and pulls
boxes) from the solved state, so every level is solvable by construction; the
BFS solver then gives the optimal solution. Rewards follow gym-sokoban: -0.1 a
step, +1 for a box pushed onto a target, -1 for a box pushed off one, +10 when
every box is on a target.

Text symbols (verl-agent): # wall, _ floor, O target, X box, √ box on target,
P player, S player on target; one row per line.
"""

from __future__ import annotations

import collections
import random
from typing import Any
import zlib

import numpy as np

from seed_jax.envs import base

ACTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
SOLVED = 10.0

Pos = tuple[int, int]
State = tuple[Pos, frozenset]  # (player, boxes)


class Level:
  """Static part of a level: walls and targets on a dim[0] x dim[1] grid."""

  def __init__(self, walls: set[Pos], targets: frozenset, shape: Pos) -> None:
    self.walls = walls
    self.targets = targets
    self.shape = shape

  def free(self, p: Pos) -> bool:
    return p not in self.walls and 0 <= p[0] < self.shape[0] and (
        0 <= p[1] < self.shape[1])

  def move(self, state: State, action: str) -> tuple[State, bool]:
    """One player move; returns (new state, whether a box was pushed)."""
    (r, c), boxes = state
    dr, dc = ACTIONS[action]
    nxt = (r + dr, c + dc)
    if not self.free(nxt):
      return state, False
    if nxt in boxes:
      beyond = (nxt[0] + dr, nxt[1] + dc)
      if not self.free(beyond) or beyond in boxes:
        return state, False
      return (nxt, boxes - {nxt} | {beyond}), True
    return (nxt, boxes), False

  def solve(self, state: State, *, max_states: int = 200_000
            ) -> list[str] | None:
    """Shortest action sequence to the solved state (BFS), or None.

    Args:
      state: (player, boxes) to start from.
      max_states: search cap; None is also returned when it is hit.

    Returns:
      Actions, e.g. ["left", "up"]; [] when already solved.
    """
    if state[1] <= self.targets:
      return []
    parent: dict[State, tuple[State, str] | None] = {state: None}
    queue = collections.deque([state])
    while queue:
      s = queue.popleft()
      for a in ACTIONS:
        t, _ = self.move(s, a)
        if t in parent:
          continue
        parent[t] = (s, a)
        if t[1] <= self.targets:
          path = []
          while parent[t] is not None:
            t, a = parent[t]
            path.append(a)
          return path[::-1]
        if len(parent) > max_states:
          return None
        if not self._dead(t[1]):
          queue.append(t)
    return None

  def _dead(self, boxes: frozenset) -> bool:
    return any(self.deadlock_kind(b) == "corner" for b in boxes)

  def deadlock_kind(self, box: Pos) -> str | None:
    """How a box off target is stuck: "corner" (two perpendicular walls; it
    can never move again), "wall" (against one wall), or None."""
    if box in self.targets:
      return None
    r, c = box
    vertical = not self.free((r - 1, c)) or not self.free((r + 1, c))
    horizontal = not self.free((r, c - 1)) or not self.free((r, c + 1))
    if vertical and horizontal:
      return "corner"
    return "wall" if vertical or horizontal else None


# Small grids hold few distinct levels, so disjoint seed ranges alone would
# still repeat training levels at evaluation (about one in eight at 6x6 with
# one box). Levels are therefore split by a hash of the room (its floor and
# targets): one class in HELD_OUT_CLASSES is kept for unseen evaluation, the
# others for training (and seen evaluation).
#
# The rule: the hash is of the room's canonical form, the floor and targets
# translated so that the floor's smallest row and column are 0, taking the
# smallest of the 8 rotations and reflections. The start (player and boxes)
# is left out. So a room and its targets, wherever they sit in the grid, on
# any grid size and in any orientation, are in one split only, and so is
# every puzzle on them (an unseen puzzle is never a training one moved,
# turned or mirrored, nor one with the player or the boxes a few squares
# away). Hashing the exact wall set let about one unseen level in ten be a
# training level moved by one cell.
HELD_OUT_CLASSES = 4

# (r, c) -> the 8 rotations and reflections of the square's symmetry group.
_SYMMETRIES = (
    lambda r, c: (r, c), lambda r, c: (r, -c), lambda r, c: (-r, c),
    lambda r, c: (-r, -c), lambda r, c: (c, r), lambda r, c: (c, -r),
    lambda r, c: (-c, r), lambda r, c: (-c, -r))


def canonical_room(level: Level) -> tuple[tuple[Pos, ...], tuple[Pos, ...]]:
  """The room of `level` up to translation, rotation and reflection.

  Returns:
    (floor, targets), sorted cells of the orientation whose pair is smallest,
    translated so that the floor's smallest row and column are 0; the same
    for any level that is one of the other's 8 orientations moved anywhere.
  """
  rows, cols = level.shape
  floor = [(r, c) for r in range(rows) for c in range(cols)
           if (r, c) not in level.walls]
  best = None
  for f in _SYMMETRIES:
    moved = [f(r, c) for r, c in floor]
    origin = (min((r for r, _ in moved), default=0),
              min((c for _, c in moved), default=0))
    key = (_placed(moved, origin),
           _placed([f(r, c) for r, c in level.targets], origin))
    if best is None or key < best:
      best = key
  return best


def _placed(cells: list[Pos], origin: Pos) -> tuple[Pos, ...]:
  return tuple(sorted((r - origin[0], c - origin[1]) for r, c in cells))


def held_out(level: Level, state: State) -> bool:
  """Whether a level's room belongs to the unseen evaluation levels (by
  `canonical_room`; the start position `state` does not matter)."""
  del state
  key = repr(canonical_room(level)).encode()
  return zlib.crc32(key) % HELD_OUT_CLASSES == 0


def generate(seed: int, *, dim: Pos = (6, 6), num_boxes: int = 1,
             max_solution: int = 20, evaluation: bool | None = None
             ) -> tuple[Level, State, list[str]]:
  """Generates a level by reverse play from a solved state.

  Args:
    seed: task seed.
    dim: (rows, cols) including the outer wall.
    num_boxes: boxes (= targets).
    max_solution: reject levels whose optimal solution is longer (the
      environment passes its max_steps, so every level is solvable in time).
    evaluation: True keeps only evaluation levels (`held_out`), False only
      training levels, None any level.

  Returns:
    (level, start state, optimal solution).

  Raises:
    ValueError: a negative seed.
    RuntimeError: no level found in 1000 tries.
  """
  rng = random.Random(base.check_seed(seed))
  for _ in range(1000):
    made = _try_generate(rng, dim, num_boxes, max_solution)
    if made is not None and (evaluation is None or
                             held_out(made[0], made[1]) == evaluation):
      return made
  raise RuntimeError(f"no sokoban level for seed {seed}")


def _try_generate(rng: random.Random, dim: Pos, num_boxes: int,
                  max_solution: int
                  ) -> tuple[Level, State, list[str]] | None:
  rows, cols = dim
  moves = list(ACTIONS.values())
  floor = set()
  p = (rng.randrange(1, rows - 1), rng.randrange(1, cols - 1))
  d = rng.choice(moves)
  for _ in range(int(1.5 * (rows - 2) * (cols - 2))):
    floor.add(p)
    if rng.random() < 0.5:  # widen the corridor, as gym-sokoban's masks do
      side = rng.choice(moves)
      q = (p[0] + side[0], p[1] + side[1])
      if 0 < q[0] < rows - 1 and 0 < q[1] < cols - 1:
        floor.add(q)
    if rng.random() < 0.35:
      d = rng.choice(moves)
    q = (p[0] + d[0], p[1] + d[1])
    if 0 < q[0] < rows - 1 and 0 < q[1] < cols - 1:
      p = q
  if len(floor) < num_boxes + 3:
    return None
  walls = {(r, c) for r in range(rows) for c in range(cols)} - floor
  picks = rng.sample(sorted(floor), num_boxes + 1)
  targets = frozenset(picks[:num_boxes])
  level = Level(walls, targets, dim)
  player, boxes = picks[-1], set(targets)
  # Score states as gym-sokoban does, roughly (boxes far from targets, pulled
  # in several directions), then keep the longest optimal solution among the
  # best few.
  scores: dict[State, int] = {}
  turns, last_pull = 0, None
  for _ in range(10 * len(floor)):
    d = rng.choice(moves)
    nxt = (player[0] + d[0], player[1] + d[1])
    if not level.free(nxt) or nxt in boxes:
      continue
    behind = (player[0] - d[0], player[1] - d[1])
    if behind in boxes and rng.random() < 0.7:  # pull the box along
      boxes.remove(behind)
      boxes.add(player)
      turns += d != last_pull
      last_pull = d
    player = nxt
    if not boxes & targets:
      distance = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets)
                     for b in boxes)
      scores[(player, frozenset(boxes))] = distance * turns
  best, solution = None, None
  for state in sorted(scores, key=scores.get, reverse=True)[:4]:
    path = level.solve(state)
    if path is not None and len(path) <= max_solution and (
        solution is None or len(path) > len(solution)):
      best, solution = state, path
  if solution is None or len(solution) < 2:
    return None
  return level, best, solution


class SokobanEnv:
  """A Sokoban level; see the module docstring.

  Args:
    split: "train" and "eval_seen" play training-class levels (eval_seen
      from its own seed range, so it may repeat a level training played);
      "eval_unseen" plays levels no training seed can produce (`held_out`).
    dim: (rows, cols) of the grid, walls included.
    num_boxes: boxes per level.
    max_steps: steps before the episode is cut; also the longest optimal
      solution a generated level may have, so the levels of a seed depend
      on it.

  Raises:
    ValueError: an unknown split, max_steps < 2 (generated levels need at
      least two moves), num_boxes < 1, or a grid smaller than 3 x 3 or with
      too few inner cells for the boxes (num_boxes + 3).
  """

  name = "sokoban"
  no_op = "still"

  def __init__(self, *, split: str = "train", dim: Pos = (6, 6),
               num_boxes: int = 1, max_steps: int = 30) -> None:
    self.evaluation = base.check_split(split) == "eval_unseen"
    _check_args(tuple(dim), num_boxes, max_steps)
    self.dim = tuple(dim)
    self.num_boxes = num_boxes
    self._generator = dict(dim=self.dim, num_boxes=num_boxes)  # not load_text's
    self.max_steps = max_steps
    self.level: Level | None = None
    self.state: State | None = None

  @property
  def task(self) -> str:
    return "push every box (X) onto a target (O)"

  @property
  def family(self) -> str:
    return "sokoban"

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates the level of `seed`; returns (text grid, info)."""
    self.level, self.state, self.solution = generate(
        seed, **self._generator, max_solution=self.max_steps,
        evaluation=self.evaluation)
    self.dim, self.num_boxes = self.level.shape, len(self.state[1])
    return self._start()

  def load_text(self, grid: str) -> tuple[str, dict[str, Any]]:
    """Starts from a hand-drawn level in the text symbols; returns (obs, info).

    Args:
      grid: rows of "#_OX√PS", e.g. "#####\n#PXO#\n#####".

    Raises:
      ValueError: unknown symbols, ragged rows, no player or more than one,
        no box, box and target counts that differ, a level already solved
        (every box on a target), or a level the solver finds no solution for
        (`Level.solve`: unsolvable, or over its search cap).
    """
    rows = grid.strip("\n").split("\n")
    if len({len(r) for r in rows}) != 1:
      raise ValueError("rows of different lengths")
    walls, targets, boxes, players = set(), set(), set(), []
    for r, row in enumerate(rows):
      for c, ch in enumerate(row):
        if ch not in "#_OX√PS":
          raise ValueError(f"unknown symbol {ch!r}")
        if ch == "#":
          walls.add((r, c))
        if ch in "O√S":
          targets.add((r, c))
        if ch in "X√":
          boxes.add((r, c))
        if ch in "PS":
          players.append((r, c))
    if len(players) != 1:
      raise ValueError(f"need one player (P or S), found {len(players)}")
    if not boxes:
      raise ValueError("need at least one box (X or √)")
    if len(boxes) != len(targets):
      raise ValueError(f"need as many boxes as targets, found {len(boxes)} "
                       f"boxes and {len(targets)} targets")
    dim = (len(rows), len(rows[0]))
    level = Level(walls, frozenset(targets), dim)
    state = (players[0], frozenset(boxes))
    if boxes <= targets:
      raise ValueError("the level is already solved: every box is on a "
                       "target")
    solution = level.solve(state)
    if solution is None:
      raise ValueError("the level has no solution (or none the BFS solver "
                       "finds within its search cap)")
    self.dim, self.num_boxes = dim, len(boxes)
    self.level, self.state, self.solution = level, state, solution
    return self._start()

  def _start(self) -> tuple[str, dict[str, Any]]:
    self.history: list[State] = [self.state]
    self.actions: list[str] = []
    self.done = False
    return self.render_text(), self._info(valid=True)

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Moves the player; an unknown action is an invalid no-op step."""
    if self.level is None:
      raise RuntimeError("call reset(seed) first")
    if self.done:
      return self.render_text(), 0.0, True, self._info(valid=False)
    action = str(action).strip().lower()
    valid = action in ACTIONS
    reward = STEP_PENALTY
    if valid:
      before = len(self.state[1] & self.level.targets)
      self.state, _ = self.level.move(self.state, action)
      after = len(self.state[1] & self.level.targets)
      reward += (BOX_ON_TARGET * max(after - before, 0)
                 + BOX_OFF_TARGET * max(before - after, 0))
    won = self.won
    if won:
      reward += SOLVED
    self.history.append(self.state)
    self.actions.append(action)
    self.done = won or len(self.actions) >= self.max_steps
    return self.render_text(), reward, self.done, self._info(valid=valid)

  @property
  def won(self) -> bool:
    return self.state[1] <= self.level.targets

  def _info(self, *, valid: bool) -> dict[str, Any]:
    return {"won": self.won, "admissible_actions": list(ACTIONS),
            "action_valid": valid, "task": self.task, "family": self.family,
            "boxes_on_target": len(self.state[1] & self.level.targets)}

  def render_text(self) -> str:
    """The grid in verl-agent's symbols, e.g. "#####\\n#P_X_O#\\n..."."""
    (pr, pc), boxes = self.state
    rows = []
    for r in range(self.dim[0]):
      row = []
      for c in range(self.dim[1]):
        p, on = (r, c), (r, c) in self.level.targets
        if p in self.level.walls:
          row.append("#")
        elif p in boxes:
          row.append("√" if on else "X")
        elif p == (pr, pc):
          row.append("S" if on else "P")
        else:
          row.append("O" if on else "_")
      rows.append("".join(row))
    return "\n".join(rows)

  def render_rgb(self, scale: int = 8) -> np.ndarray:
    """The grid as an image: uint8 [rows*scale, cols*scale, 3]."""
    codes = {"#": 0, "_": 1, "O": 2, "X": 3, "√": 4, "P": 5, "S": 6}
    grid = np.array([[codes[ch] for ch in row]
                     for row in self.render_text().split("\n")])  # [H, W]
    tiles = _tiles(scale)  # [7, k, k, 3]
    image = tiles[grid]  # [H, W, k, k, 3]
    h, w = grid.shape
    return image.transpose(0, 2, 1, 3, 4).reshape(h * scale, w * scale, 3)

  def ground_truth(self) -> dict[str, Any]:
    """Hidden facts for annotators.

    Returns:
      dict with solution_length and solution (optimal, from the start),
      unsolvable_after (per step taken: whether the level could no longer be
      solved after it), first_unsolvable_step (0-based step index or None),
      its action, box (the pushed box's new position, row/col), and
      deadlock_kind ("corner", "wall" or "other" for a box left off any
      target, "on_target" for one pushed onto a target where it blocks the
      rest), plus won.

    Raises:
      RuntimeError: before reset (or load_text).
    """
    if self.level is None:
      raise RuntimeError("call reset(seed) first")
    level = self.level
    n = len(self.actions)
    dead = [False] * n
    first = None
    # Unsolvable is absorbing, so the first dead state is found by bisection.
    if n and level.solve(self.history[-1]) is None:
      lo, hi = 1, n  # history[hi] is dead, history[0] is not
      while lo < hi:
        mid = (lo + hi) // 2
        if level.solve(self.history[mid]) is None:
          hi = mid
        else:
          lo = mid + 1
      first = lo - 1
      dead[first:] = [True] * (n - first)
    truth = {"solution_length": len(self.solution),
             "solution": list(self.solution), "unsolvable_after": dead,
             "first_unsolvable_step": first, "first_unsolvable_action": None,
             "box": None, "deadlock_kind": None, "won": self.won,
             "num_boxes": self.num_boxes}
    if first is not None:
      moved = self.history[first + 1][1] - self.history[first][1]
      box = next(iter(moved)) if moved else None
      truth["first_unsolvable_action"] = self.actions[first]
      truth["box"] = box
      if box in level.targets:
        kind = "on_target"  # several boxes: it blocks the others' way
      else:
        kind = level.deadlock_kind(box) if box else None
      truth["deadlock_kind"] = kind or "other"
    return truth


def _check_args(dim: Pos, num_boxes: int, max_steps: int) -> None:
  """Raises ValueError, naming the argument, for settings no level fits."""
  if max_steps < 2:
    raise ValueError(f"max_steps must be at least 2 (generated levels need "
                     f"two moves or more), got {max_steps}")
  if num_boxes < 1:
    raise ValueError(f"num_boxes must be at least 1, got {num_boxes}")
  if len(dim) != 2 or min(dim) < 3:
    raise ValueError(f"dim must be (rows, cols), each at least 3, got {dim}")
  inner = (dim[0] - 2) * (dim[1] - 2)
  if inner < num_boxes + 3:
    raise ValueError(f"dim {dim} has {inner} inner cells; num_boxes="
                     f"{num_boxes} needs at least {num_boxes + 3}")


_TILE_CACHE: dict[int, np.ndarray] = {}


def _tiles(k: int) -> np.ndarray:
  """One k x k RGB tile per symbol code (wall, floor, target, box, box on
  target, player, player on target)."""
  if k not in _TILE_CACHE:
    wall, floor = (110, 70, 40), (20, 20, 20)
    tiles = np.zeros((7, k, k, 3), np.uint8)
    tiles[:] = floor
    tiles[0] = wall
    inner = slice(k // 4, k - k // 4)
    tiles[2, inner, inner] = (200, 40, 40)  # target: red square
    tiles[3, 1:-1, 1:-1] = (220, 180, 40)  # box: yellow
    tiles[4, 1:-1, 1:-1] = (60, 190, 60)  # box on target: green
    tiles[5, inner, inner] = (60, 120, 230)  # player: blue
    tiles[6] = tiles[2]
    tiles[6, k // 3:k - k // 3, k // 3:k - k // 3] = (60, 120, 230)
    _TILE_CACHE[k] = tiles
  return _TILE_CACHE[k]


class ExpertPlanner:
  """Follows the optimal solution; re-solves when the state drifts or the
  env holds another level.

  Args:
    env: a reset SokobanEnv.
    noise: probability of a random move instead.
    seed: seed of the noise.
  """

  def __init__(self, env: SokobanEnv, *, noise: float = 0.0,
               seed: int = 0) -> None:
    self.env = env
    self.noise = noise
    self.rng = random.Random(seed)
    self._plan: list[str] = []
    self._expect: State | None = None
    self._level: Level | None = None

  def act(self) -> str:
    env = self.env
    if self.noise and self.rng.random() < self.noise:
      return self.rng.choice(list(ACTIONS))
    if (env.level is not self._level or env.state != self._expect
        or not self._plan):
      self._plan = env.level.solve(env.state) or []
      self._level = env.level
    if not self._plan:
      return env.no_op
    action = self._plan.pop(0)
    self._expect, _ = env.level.move(env.state, action)
    return action


def expert_actions(env: SokobanEnv) -> list[str]:
  """Optimal actions from the env's current state ([] if none exist)."""
  return env.level.solve(env.state) or []
