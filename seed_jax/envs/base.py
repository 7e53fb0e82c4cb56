"""The text-environment protocol, task-seed splits, and the batched, grouped pool."""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

Info = dict[str, Any]

# Disjoint task-seed ranges, one per split. Seeds are absolute: a group reset with
# seed s generates the same task in every member and in every run. Training uses
# [0, 1e6); evaluation on training-like tasks uses [1e6, 2e6); evaluation on
# unseen tasks (household: unseen object/receptacle combinations and layouts)
# uses [2e6, 3e6). Distinct seeds can still draw the same task when the task
# space is small, so such environments split by content as well (Sokoban
# keeps a hash class of levels for unseen evaluation; household draws unseen
# tasks from their own combinations and layouts).
SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "eval_seen": range(1_000_000, 2_000_000),
    "eval_unseen": range(2_000_000, 3_000_000),
}


@runtime_checkable
class Env(Protocol):
  """A single-agent text environment.

  Every info dict (from `reset` and `step`) carries at least:
    won: bool, whether the task has been accomplished.
    admissible_actions: list[str], actions the environment accepts now.
    action_valid: bool, whether the last action was one it could take (True
      after reset).
  """

  name: str  # registry name
  no_op: str  # action that changes nothing (fallback for unparsable replies)

  @property
  def task(self) -> str:
    """Task description shown to the policy, e.g. "put a clean mug in fridge"."""

  @property
  def family(self) -> str:
    """Task family, e.g. "clean" or "sokoban"."""

  def reset(self, seed: int) -> tuple[str, Info]:
    """Starts the task generated from `seed`; returns (observation, info)."""

  def step(self, action: str) -> tuple[str, float, bool, Info]:
    """Applies a text action; returns (observation, reward, done, info).

    An action the environment cannot take is an invalid step (info
    action_valid=False, the step still counts), never an exception.
    """

  def ground_truth(self) -> dict[str, Any]:
    """Hidden facts about the task and what happened, for hindsight annotators."""


def split_seeds(split: str, num: int, *, start: int = 0) -> list[int]:
  """Returns `num` consecutive task seeds of a split.

  Args:
    split: "train", "eval_seen" or "eval_unseen".
    num: how many seeds.
    start: offset inside the split's range.

  Returns:
    Absolute seeds, e.g. split_seeds("eval_seen", 2) == [1000000, 1000001].

  Raises:
    ValueError: unknown split, a negative `num` or `start`, or a range
      overflow.
  """
  rng = _split_range(split)
  if num < 0:
    raise ValueError(f"num must be >= 0, got {num}")
  if start < 0 or start + num > len(rng):
    raise ValueError(f"split {split!r} holds {len(rng)} seeds; asked for "
                     f"[{start}, {start + num})")
  return list(rng[start:start + num])


def check_split(split: str) -> str:
  """Returns `split`; raises ValueError naming the known ones if unknown
  (environments check theirs when built: a misspelt "eval-unseen" would
  otherwise play seen tasks)."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; known: {sorted(SPLITS)}")
  return split


def check_seed(seed: int) -> int:
  """Returns `seed`; raises ValueError if it is negative (random.Random
  drops the sign, so -7 would replay the task of 7)."""
  if seed < 0:
    raise ValueError(f"task seeds are >= 0, got {seed}")
  return seed


def _split_range(split: str) -> range:
  return SPLITS[check_split(split)]


def _error_info(message: str) -> Info:
  return {"won": False, "admissible_actions": [], "action_valid": False,
          "error": message}


class EnvPool:
  """B groups x N members; the members of a group play the same task seed.

  Member i belongs to group i // group_size. Members that are done are not
  stepped again. An environment that raises ends its episode as failed: the
  member is marked done with info["error"] set, the error is logged and
  counted, and the rest of the batch goes on.

  Example:
    pool = EnvPool("household", num_groups=2, group_size=4, split="train")
    obs, infos = pool.reset([0, 1])     # 8 observations; members 0-3 on seed 0
    obs, rewards, dones, infos = pool.step(actions)   # actions: 8 strings
  """

  def __init__(self, env: str | Callable[..., Env], *, num_groups: int,
               group_size: int, split: str = "train",
               **env_kwargs: Any) -> None:
    """Builds the members.

    Args:
      env: a registry name, or a factory taking the keyword arguments
        (split=..., **env_kwargs) and returning an Env.
      num_groups: B, task groups per batch.
      group_size: N, members per group.
      split: "train", "eval_seen" or "eval_unseen"; reset seeds must lie in
        its range (see SPLITS).
      **env_kwargs: passed to every member's constructor (e.g. max_steps).
    """
    if num_groups < 1 or group_size < 1:
      raise ValueError("num_groups and group_size must be positive")
    self.split = split
    self._range = _split_range(split)
    if isinstance(env, str):
      from seed_jax import envs as registry  # pylint: disable=g-import-not-at-top
      factory = lambda **kw: registry.make(env, **kw)
    else:
      factory = env
    self.num_groups = num_groups
    self.group_size = group_size
    self.members: list[Env] = [
        factory(split=split, **env_kwargs) for _ in range(self.size)]
    self._cursor = 0
    self.num_errors = 0
    self._reset_state()

  @property
  def size(self) -> int:
    return self.num_groups * self.group_size

  def group_of(self, member: int) -> int:
    return member // self.group_size

  def active(self) -> list[int]:
    """Indices of members whose episode is still running."""
    return [i for i, d in enumerate(self.dones) if not d]

  def _reset_state(self) -> None:
    self.seeds: list[int] = [0] * self.size
    self.dones: list[bool] = [True] * self.size
    self.won: list[bool] = [False] * self.size
    self.returns: list[float] = [0.0] * self.size
    self.errors: list[str | None] = [None] * self.size
    self._last: list[tuple[str, Info]] = [("", _error_info(""))] * self.size

  def reset(self, group_seeds: Sequence[int] | None = None
            ) -> tuple[list[str], list[Info]]:
    """Starts a new batch of episodes.

    Args:
      group_seeds: B absolute task seeds inside the split's range; None takes
        the next B seeds of the split (a cursor that advances per call).

    Returns:
      (observations, infos), B*N each, member-major within a group.

    Raises:
      ValueError: wrong number of seeds or a seed outside the split's range.
    """
    if group_seeds is None:
      group_seeds = split_seeds(self.split, self.num_groups, start=self._cursor)
      self._cursor += self.num_groups
    group_seeds = list(group_seeds)
    if len(group_seeds) != self.num_groups:
      raise ValueError(f"expected {self.num_groups} group seeds, got "
                       f"{len(group_seeds)}")
    for s in group_seeds:
      if s not in self._range:
        raise ValueError(f"seed {s} is outside split {self.split!r} "
                         f"[{self._range.start}, {self._range.stop})")
    self._reset_state()
    observations, infos = [], []
    for i, env in enumerate(self.members):
      seed = group_seeds[self.group_of(i)]
      self.seeds[i] = seed
      try:
        obs, info = env.reset(seed)
        self.dones[i] = False
      except Exception as e:  # pylint: disable=broad-except
        obs, info = "", self._record_error(i, "reset", e)
      self._last[i] = (obs, info)
      observations.append(obs)
      infos.append(info)
    return observations, infos

  def step(self, actions: Sequence[str | None]
           ) -> tuple[list[str], list[float], list[bool], list[Info]]:
    """Steps every member that is not done.

    Args:
      actions: B*N action strings; entries of done members are ignored (may
        be None).

    Returns:
      (observations, rewards, dones, infos), B*N each. A done member repeats
      its last observation and info with reward 0.
    """
    if len(actions) != self.size:
      raise ValueError(f"expected {self.size} actions, got {len(actions)}")
    observations, rewards, dones, infos = [], [], [], []
    for i, env in enumerate(self.members):
      if self.dones[i]:
        obs, info = self._last[i]
        reward = 0.0
      else:
        try:
          obs, reward, done, info = env.step(actions[i] or "")
          self.dones[i] = bool(done)
          self.won[i] = bool(info.get("won", False))
        except Exception as e:  # pylint: disable=broad-except
          obs, reward, info = "", 0.0, self._record_error(i, "step", e)
        self.returns[i] += reward
        self._last[i] = (obs, info)
      observations.append(obs)
      rewards.append(float(reward))
      dones.append(self.dones[i])
      infos.append(info)
    return observations, rewards, dones, infos

  def _record_error(self, member: int, where: str, e: Exception) -> Info:
    message = f"{where} raised {type(e).__name__}: {e}"
    logging.warning("env member %d (seed %d): %s", member, self.seeds[member],
                    message)
    self.num_errors += 1
    self.errors[member] = message
    self.dones[member] = True
    self.won[member] = False
    return _error_info(message)
