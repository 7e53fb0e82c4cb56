"""Environments by name: a registry of factories, and the built-in ones.

Example:
  env = envs.make("household", max_steps=30)
  obs, info = env.reset(seed=0)
"""

from __future__ import annotations

from typing import Any, Callable

from seed_jax import episodes
from seed_jax.envs import alfworld_env
from seed_jax.envs import gym_sokoban
from seed_jax.envs import household
from seed_jax.envs import sokoban
from seed_jax.envs import textworld_express
from seed_jax.envs.base import Env, EnvPool, SPLITS, split_seeds

__all__ = ["Env", "EnvPool", "SPLITS", "split_seeds", "register", "make",
           "names", "make_expert", "episode_stats_fn"]

_REGISTRY: dict[str, Callable[..., Env]] = {}
_EXPERTS: dict[str, Callable[..., Any]] = {}
StatsFn = Callable[[episodes.Episode], episodes.Stats]
_EPISODE_STATS: dict[str, StatsFn] = {}


def register(name: str, factory: Callable[..., Env], *,
             expert: Callable[..., Any] | None = None,
             episode_stats: StatsFn | None = None) -> None:
  """Registers an environment factory under a name.

  Args:
    name: registry name, e.g. "household".
    factory: called with keyword arguments (split=..., and the env's own).
    expert: optional, expert(env, **kwargs) -> an object whose act() returns
      the next action.
    episode_stats: optional, episode_stats(episode) -> {name: (numerator,
      denominator)} of one finished episode; an evaluation sums both over its
      episodes and reports each ratio (`evaluate.evaluate_split`,
      `episodes.sum_ratios`).

  Raises:
    ValueError: the name is taken.
  """
  if name in _REGISTRY:
    raise ValueError(f"environment {name!r} is already registered")
  _REGISTRY[name] = factory
  if expert is not None:
    _EXPERTS[name] = expert
  if episode_stats is not None:
    _EPISODE_STATS[name] = episode_stats


def names() -> list[str]:
  """Registered environment names, sorted."""
  return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> Env:
  """Builds a registered environment.

  Args:
    name: registry name.
    **kwargs: constructor arguments (e.g. split="eval_unseen", max_steps=30).

  Returns:
    A new environment (call reset(seed) before step).

  Raises:
    ValueError: unknown name; the message lists the known ones.
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown environment {name!r}; known: {names()}")
  return _REGISTRY[name](**kwargs)


def make_expert(env: Env, **kwargs: Any) -> Any:
  """The registered expert acting in `env` (its act() gives the next action).

  Raises:
    ValueError: no expert is registered for the env's name.
  """
  if env.name not in _EXPERTS:
    raise ValueError(f"no expert for {env.name!r}; known: {sorted(_EXPERTS)}")
  return _EXPERTS[env.name](env, **kwargs)


def episode_stats_fn(name: str) -> StatsFn | None:
  """The `episode_stats` registered with environment `name`, or None."""
  return _EPISODE_STATS.get(name)


register("household", household.HouseholdEnv, expert=household.ExpertPlanner,
         episode_stats=household.episode_stats)
register("sokoban", sokoban.SokobanEnv, expert=sokoban.ExpertPlanner)
# Optional adapters: their packages are imported only when an env is built.
register("twx", textworld_express.TextWorldExpressEnv,
         expert=textworld_express.GoldPathExpert)
register("gym_sokoban", gym_sokoban.GymSokobanEnv,
         expert=sokoban.ExpertPlanner)
register("alfworld", alfworld_env.AlfWorldEnv,
         expert=alfworld_env.AlfWorldExpert)
