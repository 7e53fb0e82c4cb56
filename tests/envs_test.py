"""Tests for the environment registry, protocol and the grouped pool."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from seed_jax import envs
from seed_jax import episodes
from seed_jax import prompts
from seed_jax.envs import base


class _CountingEnv:
  """A tiny env: done after `length` steps; raises at step `raise_at`."""

  name = "counting"
  no_op = "wait"

  def __init__(self, *, split="train", length=3, raise_at=None):
    self.split = split
    self.length = length
    self.raise_at = raise_at
    self.calls = 0

  task = property(lambda self: "count")
  family = property(lambda self: "counting")

  def reset(self, seed):
    self.seed, self.t = seed, 0
    return f"seed {seed}", self._info(True)

  def step(self, action):
    self.calls += 1
    self.t += 1
    if self.raise_at is not None and self.t == self.raise_at:
      raise RuntimeError("boom")
    won = self.t >= self.length
    return f"t={self.t}", float(won), won, self._info(action == "tick")

  def _info(self, valid):
    return {"won": self.t >= self.length, "admissible_actions": ["tick"],
            "action_valid": valid}

  def ground_truth(self):
    return {}


def test_registry_names_and_make():
  assert {"household", "sokoban"} <= set(envs.names())
  for name in ("household", "sokoban"):
    env = envs.make(name)
    assert isinstance(env, envs.Env)
    assert env.name == name
    assert env.no_op == prompts.NO_OPS[name]


def test_unknown_name_lists_known_ones():
  with pytest.raises(ValueError) as e:
    envs.make("webshop")
  assert "webshop" in str(e.value)
  for name in envs.names():
    assert name in str(e.value)


def test_register_new_and_duplicate(monkeypatch):
  monkeypatch.setattr(envs, "_REGISTRY", dict(envs._REGISTRY))
  envs.register("counting", _CountingEnv)
  assert "counting" in envs.names()
  assert envs.make("counting", length=5).length == 5
  with pytest.raises(ValueError, match="already registered"):
    envs.register("counting", _CountingEnv)
  with pytest.raises(ValueError, match="no expert"):
    envs.make_expert(envs.make("counting"))


def test_episode_stats_are_registered_and_summed(monkeypatch):
  monkeypatch.setattr(envs, "_REGISTRY", dict(envs._REGISTRY))
  monkeypatch.setattr(envs, "_EPISODE_STATS", dict(envs._EPISODE_STATS))
  length = lambda ep: {"long": (float(len(ep.steps) > 2), 1.0)}
  envs.register("counting", _CountingEnv, episode_stats=length)
  assert envs.episode_stats_fn("counting") is length
  assert envs.episode_stats_fn("sokoban") is None
  # A ratio of sums, not a mean of ratios; no denominator, no ratio.
  assert episodes.sum_ratios([{"hit": (1, 3), "miss": (0, 0)},
                              {"hit": (0, 1), "miss": (0, 0)}]) == {
                                  "hit": 0.25}
  assert episodes.sum_ratios([]) == {}


def test_ratio_errors_match_the_delta_method_and_a_resampling():
  # Two episodes: hits 1 of 1 and 0 of 1; R = 1/2, residuals +1/2 and -1/2,
  # se = sqrt(2 * (1/4 + 1/4)) / 2 = 1/2 (the binomial se with k/(k-1)).
  assert episodes.ratio_errors([{"hit": (1, 1)}, {"hit": (0, 1)}]) == {
      "hit_se": 0.5}
  # No denominator, or a single episode: no error.
  assert episodes.ratio_errors([{"hit": (0, 0)}, {"hit": (0, 0)}]) == {}
  assert episodes.ratio_errors([{"hit": (1, 3)}]) == {}
  # Unequal denominators: close to the spread of the ratio of sums over
  # bootstrap resamples of the episodes.
  rng = np.random.default_rng(0)
  dens = rng.integers(0, 8, size=400).astype(float)
  nums = rng.binomial(dens.astype(int), 0.3).astype(float)
  se = episodes.ratio_errors(
      [{"hit": (n, d)} for n, d in zip(nums, dens)])["hit_se"]
  boot = []
  for _ in range(2000):
    i = rng.integers(0, len(dens), size=len(dens))
    boot.append(nums[i].sum() / dens[i].sum())
  assert se == pytest.approx(np.std(boot), rel=0.1)


def test_paired_ratio_diffs_take_out_what_the_tasks_share():
  # Two tasks: a hits 1 of 1 on both, b 0 of 1 then 1 of 1. R_a - R_b = 1/2;
  # u = (0 - (-1/2)) / 2 and (0 - 1/2) / 2, se = sqrt(2 * 2 / 16) = 1/2.
  assert episodes.paired_ratio_diffs(
      [{"hit": (1, 1)}, {"hit": (1, 1)}],
      [{"hit": (0, 1)}, {"hit": (1, 1)}]) == {"hit": 0.5, "hit_se": 0.5}
  # Against itself: no difference and no error.
  same = [{"hit": (1, 3)}, {"hit": (2, 2)}, None]
  assert episodes.paired_ratio_diffs(same, same) == {"hit": 0.0,
                                                     "hit_se": 0.0}
  # A ratio one side never reports, or a single task: no difference, or
  # no error.
  assert episodes.paired_ratio_diffs([{"hit": (1, 1)}, {}],
                                     [{"miss": (1, 1)}, {}]) == {}
  assert episodes.paired_ratio_diffs([{"hit": (1, 2)}],
                                     [{"hit": (1, 1)}]) == {"hit": -0.5}
  with pytest.raises(ValueError, match="same tasks, got 2 and 1"):
    episodes.paired_ratio_diffs(same[:2], same[:1])
  # Tasks that set both policies' searches (correlated counts): close to
  # the spread of the difference over bootstrap resamples of the tasks,
  # and well below the two errors combined as if independent.
  rng = np.random.default_rng(1)
  dens = rng.integers(0, 8, size=400)
  p = rng.uniform(0.05, 0.95, size=400)
  nums_a = rng.binomial(dens, np.clip(p + 0.1, 0, 1)).astype(float)
  nums_b = rng.binomial(dens, p).astype(float)
  dens_b = np.maximum(dens - rng.integers(0, 2, size=400), 0)
  nums_b = np.minimum(nums_b, dens_b)
  a = [{"hit": (n, float(d))} for n, d in zip(nums_a, dens)]
  b = [{"hit": (n, float(d))} for n, d in zip(nums_b, dens_b)]
  got = episodes.paired_ratio_diffs(a, b)
  assert got["hit"] == pytest.approx(nums_a.sum() / dens.sum()
                                     - nums_b.sum() / dens_b.sum())
  boot = []
  for _ in range(2000):
    i = rng.integers(0, 400, size=400)
    boot.append(nums_a[i].sum() / dens[i].sum()
                - nums_b[i].sum() / dens_b[i].sum())
  assert got["hit_se"] == pytest.approx(np.std(boot), rel=0.1)
  apart = np.hypot(episodes.ratio_errors(a)["hit_se"],
                   episodes.ratio_errors(b)["hit_se"])
  assert got["hit_se"] < 0.8 * apart


def test_stats_text_round_trips_and_names_damage():
  stats = [{"hit": (1.0, 3.0), "near": (0.857142857, 3.0)}, None,
           {"hit": (0.0, 0.0)}]
  text = episodes.stats_text(stats)
  assert text == {"hit": "1:3 - 0:0", "near": "0.857143:3 - -"}
  assert episodes.stats_from_text(text) == [
      {"hit": (1.0, 3.0), "near": (0.857143, 3.0)}, {}, {"hit": (0.0, 0.0)}]
  assert episodes.stats_text([]) == {} and episodes.stats_from_text({}) == []
  for bad in ("1:3 x", "1", "1:2:3", 5):
    with pytest.raises(ValueError, match="statistic 'hit' is not"):
      episodes.stats_from_text({"hit": bad})
  with pytest.raises(ValueError, match="different numbers of tasks"):
    episodes.stats_from_text({"hit": "1:2", "near": "1:2 -"})


def test_splits_are_disjoint_and_seeds_checked():
  ranges = list(base.SPLITS.values())
  for i, a in enumerate(ranges):
    for b in ranges[i + 1:]:
      assert a.stop <= b.start or b.stop <= a.start
  assert envs.split_seeds("eval_seen", 2) == [1_000_000, 1_000_001]
  with pytest.raises(ValueError, match="unknown split"):
    envs.split_seeds("test", 1)
  pool = envs.EnvPool("sokoban", num_groups=1, group_size=2, split="eval_seen")
  with pytest.raises(ValueError, match="outside split"):
    pool.reset([5])  # a training seed
  with pytest.raises(ValueError, match="expected 1 group seeds"):
    pool.reset([1_000_000, 1_000_001])


def test_split_seeds_refuses_a_negative_count():
  # range slicing made -1 into 999,999 seeds, and -3 at start 10 into [].
  with pytest.raises(ValueError, match="num must be >= 0, got -1"):
    envs.split_seeds("train", -1)
  with pytest.raises(ValueError, match="num must be >= 0, got -3"):
    envs.split_seeds("train", -3, start=10)
  assert envs.split_seeds("train", 0) == []


@pytest.mark.parametrize("name", ["household", "sokoban", "gym_sokoban"])
@pytest.mark.parametrize("split", ["eval-unseen", "unseen", "test"])
def test_an_unknown_split_is_refused_when_the_env_is_built(name, split):
  # Checked before gym_sokoban's package is imported: no skip needed.
  with pytest.raises(ValueError, match=f"unknown split '{split}'.*eval_unseen"):
    envs.make(name, split=split)


@pytest.mark.parametrize("name", ["household", "sokoban"])
def test_a_negative_seed_is_refused(name):
  # random.Random drops the sign: -3 used to replay the task of 3.
  env = envs.make(name)
  with pytest.raises(ValueError, match="seeds are >= 0, got -3"):
    env.reset(-3)
  env.reset(3)


def test_pool_groups_share_a_task():
  pool = envs.EnvPool("household", num_groups=3, group_size=4)
  obs, infos = pool.reset([0, 1, 2])
  assert len(obs) == len(infos) == 12
  for g in range(3):
    members = range(4 * g, 4 * g + 4)
    assert {obs[i] for i in members} == {obs[4 * g]}
    assert {pool.members[i].task for i in members} == {pool.members[4 * g].task}
    assert all(pool.group_of(i) == g and pool.seeds[i] == g for i in members)
  assert len({obs[0], obs[4], obs[8]}) == 3


def test_pool_default_seeds_advance_through_the_split():
  pool = envs.EnvPool("sokoban", num_groups=2, group_size=1,
                      split="eval_unseen")
  pool.reset()
  assert pool.seeds == [2_000_000, 2_000_001]
  pool.reset()
  assert pool.seeds == [2_000_002, 2_000_003]


def test_pool_steps_only_members_not_done():
  lengths = iter([1, 3])
  pool = envs.EnvPool(lambda **kw: _CountingEnv(length=next(lengths), **kw),
                      num_groups=1, group_size=2)
  pool.reset([0])
  _, rewards, dones, _ = pool.step(["tick", "tick"])
  assert dones == [True, False] and rewards == [1.0, 0.0]
  assert pool.active() == [1]
  obs, rewards, dones, infos = pool.step([None, "tick"])
  assert pool.members[0].calls == 1 and pool.members[1].calls == 2
  assert obs[0] == "t=1" and rewards[0] == 0.0 and infos[0]["won"]
  pool.step([None, "tock"])
  assert pool.dones == [True, True] and pool.won == [True, True]
  assert pool.returns == [1.0, 1.0]


def test_env_raising_mid_episode_ends_only_that_episode(caplog):
  flags = iter([None, 2, None])
  pool = envs.EnvPool(
      lambda **kw: _CountingEnv(length=3, raise_at=next(flags), **kw),
      num_groups=1, group_size=3)
  pool.reset([7])
  pool.step(["tick"] * 3)
  with caplog.at_level(logging.WARNING):
    obs, rewards, dones, infos = pool.step(["tick"] * 3)
  assert dones == [False, True, False]
  assert "RuntimeError: boom" in infos[1]["error"]
  assert infos[1]["won"] is False and infos[1]["action_valid"] is False
  assert pool.num_errors == 1 and pool.errors[1] == infos[1]["error"]
  assert "boom" in caplog.text
  _, _, dones, _ = pool.step(["tick"] * 3)
  assert dones == [True, True, True]
  assert pool.won == [True, False, True]


@pytest.mark.parametrize("name,kwargs", [
    ("household", dict(max_steps=0)), ("sokoban", dict(max_steps=1)),
    ("sokoban", dict(num_boxes=0)), ("sokoban", dict(dim=(2, 2)))])
def test_a_pool_of_unplayable_settings_is_refused_when_built(name, kwargs):
  # Every member used to fail at reset, each failure only logged.
  (arg,) = kwargs
  with pytest.raises(ValueError, match=arg):
    envs.EnvPool(name, num_groups=1, group_size=2, **kwargs)


@pytest.mark.parametrize("name,penalty", [("household", 0.0),
                                          ("sokoban", -0.1)])
def test_invalid_action_is_an_invalid_step(name, penalty):
  env = envs.make(name, max_steps=5)
  obs, info = env.reset(3)
  assert set(info) >= {"won", "admissible_actions", "action_valid"}
  for bad in ("fly to the moon", "", "take everything", "UP UP"):
    obs, reward, done, info = env.step(bad)
    assert info["action_valid"] is False
    assert reward == pytest.approx(penalty)
    assert not info["won"]
  obs, reward, done, info = env.step(env.no_op)
  assert done  # the fifth step hits max_steps


@pytest.mark.parametrize("name", ["household", "sokoban"])
def test_same_seed_same_episode(name):
  runs = []
  for _ in range(2):
    env = envs.make(name)
    obs, _ = env.reset(11)
    expert = envs.make_expert(env, noise=0.3, seed=4)
    trace, done = [obs], False
    while not done:
      obs, reward, done, info = env.step(expert.act())
      trace.append((obs, reward, info["admissible_actions"]))
    runs.append((trace, env.ground_truth()))
  assert runs[0] == runs[1]
  env = envs.make(name)
  assert len({env.reset(seed)[0] for seed in range(10)}) >= 8


_DIGEST = """
import hashlib
from seed_jax import envs
trace = []
for name in ("household", "sokoban"):
  env = envs.make(name)
  for seed in range(20):
    trace.append(env.reset(seed)[0])
    expert = envs.make_expert(env, noise=0.2, seed=seed)
    done = False
    while not done:
      obs, reward, done, info = env.step(expert.act())
      trace.append(f"{obs}|{reward}|{info['admissible_actions']}")
    trace.append(repr(sorted(env.ground_truth().items())))
print(hashlib.sha256("\\n".join(trace).encode()).hexdigest())
"""


def test_episodes_do_not_depend_on_hash_randomization():
  digests = set()
  for hash_seed in ("1", "2"):
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    digests.add(subprocess.run([sys.executable, "-c", _DIGEST], env=env,
                               check=True, capture_output=True,
                               text=True).stdout)
  assert len(digests) == 1


def _play(env, expert, max_steps=30):
  actions, done = [], False
  while not done and len(actions) < max_steps:
    actions.append(expert.act())
    _, _, done, _ = env.step(actions[-1])
  return actions


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_fair_expert_forgets_the_last_episode(shuffle):
  # Receptacle names repeat between tasks: an expert reused after a reset
  # must not plan with what the last world showed it.
  kw = dict(peek=False, shuffle_search=shuffle, seed=3)
  env = envs.make("household")
  env.reset(54)
  reused = envs.make_expert(env, **kw)
  _play(env, reused)
  for seed in (60, 61, 62, 63):
    env.reset(seed)
    fresh_env = envs.make("household")
    fresh = envs.make_expert(fresh_env, **kw)  # built before its reset
    fresh.rng.setstate(reused.rng.getstate())  # the same shuffle draws
    fresh_env.reset(seed)
    assert _play(env, reused) == _play(fresh_env, fresh), seed
