"""Tests for the optional adapters: TextWorldExpress, gym-sokoban, ALFWorld.

Each adapter's tests skip, with the install hint as the reason, when its
package (or Java, for TextWorldExpress) is missing. ALFWorld plays a tiny game
written here from ALFWorld's own PDDL domain and grammar (nothing downloaded).
"""

import json
import os
import random
import re

import numpy as np
import pytest

from seed_jax import envs
from seed_jax.envs import alfworld_env
from seed_jax.envs import gym_sokoban
from seed_jax.envs import sokoban
from seed_jax.envs import textworld_express as twx

PROTOCOL_KEYS = {"won", "admissible_actions", "action_valid"}


def _require(module):
  error = module.requirement_error()
  if error:
    pytest.skip(error)


def _play(env, expert, limit=60):
  """Steps the expert's actions until done; returns (rewards, last info)."""
  rewards, done, info = [], False, None
  while not done and len(rewards) < limit:
    _, reward, done, info = env.step(expert.act())
    assert PROTOCOL_KEYS <= set(info) and info["action_valid"]
    rewards.append(reward)
  return rewards, info


# -- TextWorldExpress ----------------------------------------------------------


@pytest.fixture(scope="module")
def coin():
  _require(twx)
  env = twx.TextWorldExpressEnv(
      game="coin", params={"numLocations": 3, "numDistractorItems": 0,
                           "includeDoors": 0, "limitInventorySize": 0})
  yield env
  env.close()


@pytest.mark.integration
def test_twx_gold_path_wins_and_protocol(coin):
  assert isinstance(coin, envs.Env)
  obs, info = coin.reset(seed=5)
  assert PROTOCOL_KEYS <= set(info) and info["action_valid"]
  assert coin.task.startswith("search the environment and find the coin")
  assert coin.family == "coin" and coin.no_op in info["admissible_actions"]
  rewards, info = _play(coin, twx.GoldPathExpert(coin))
  assert info["won"] and coin.done and sum(rewards) == pytest.approx(1.0)
  truth = coin.ground_truth()
  assert truth["won"] and truth["actions"] == truth["gold_actions"]
  assert truth["properties"]["numLocations"] == 3


@pytest.mark.integration
def test_twx_invalid_action_and_off_path_expert(coin):
  coin.reset(seed=5)
  obs, reward, done, info = coin.step("fly to the moon")
  assert obs == twx.UNKNOWN_ACTION and reward == 0.0 and not done
  assert not info["action_valid"]
  expert = twx.GoldPathExpert(coin)
  assert expert.remaining() == coin.gold  # invalid steps change nothing
  coin.step("inventory")  # looking keeps the path
  assert expert.remaining() == coin.gold


@pytest.mark.integration
def test_twx_seeds_are_deterministic_and_folds_follow_splits(coin):
  def replay(actions):
    obs, info = coin.reset(seed=7)
    seen = [(obs, info["admissible_actions"])]
    for action in actions:
      obs, _, _, info = coin.step(action)
      seen.append((obs, info["admissible_actions"]))
    return seen

  coin.reset(seed=7)
  gold = list(coin.gold)  # coin's gold path is one of several: TWX redraws it
  first = replay(gold)
  coin.reset(seed=8)
  assert replay(gold) == first and coin.won
  test_env = twx.TextWorldExpressEnv(split="eval_unseen", game="twc",
                                     params={"numLocations": 1,
                                             "numItemsToPutAway": 2})
  try:
    _, info = test_env.reset(seed=envs.SPLITS["eval_unseen"].start)
    truth = test_env.ground_truth()
    assert truth["fold"] == "test" and truth["twx_seed"] == 20000
    # TWX spells it "take used Q-tip"; actions are matched lower-cased.
    assert "take used q-tip" in info["admissible_actions"]
    _, info = _play(test_env, twx.GoldPathExpert(test_env))
    assert info["won"] and "take used q-tip" in test_env.actions
  finally:
    test_env.close()


# -- gym-sokoban ---------------------------------------------------------------


@pytest.fixture(scope="module")
def boxes():
  _require(gym_sokoban)
  return gym_sokoban.GymSokobanEnv(dim=(7, 7), num_boxes=2, max_steps=60)


@pytest.mark.integration
def test_gym_sokoban_builtin_expert_wins(boxes):
  assert isinstance(boxes, envs.Env)
  for seed in range(3):
    obs, info = boxes.reset(seed)
    rows = obs.split("\n")
    assert len(rows) == 7 and {len(r) for r in rows} == {7}
    assert set(obs) <= set("#_OX√PS\n")
    assert obs.count("P") + obs.count("S") == 1
    assert info["admissible_actions"] == ["up", "down", "left", "right"]
    solution = list(boxes.solution)
    rewards, info = _play(boxes, sokoban.ExpertPlanner(boxes))
    assert info["won"] and boxes.done and len(rewards) == len(solution)
    assert rewards[-1] > 9.0 and all(r < 1.0 for r in rewards[:-1])
    truth = boxes.ground_truth()
    assert truth["won"] and truth["solution"] == solution
    assert truth["first_unsolvable_step"] is None


@pytest.mark.integration
def test_gym_sokoban_invalid_step_and_rewards(boxes):
  obs, _ = boxes.reset(1)
  obs2, reward, done, info = boxes.step("jump")
  assert obs2 == obs and reward == pytest.approx(-0.1) and not done
  assert not info["action_valid"]
  # The level reads back into the built-in sokoban with the same symbols.
  twin = sokoban.SokobanEnv()
  assert twin.load_text(obs)[0] == obs
  assert twin.solution == boxes.level.solve(boxes.state)


@pytest.mark.integration
def test_gym_sokoban_seeds_deterministic_and_global_rngs_untouched(boxes):
  random.seed(123)
  np.random.seed(123)
  expected = random.random(), np.random.rand()
  random.seed(123)
  np.random.seed(123)
  first = boxes.reset(11)[0]
  assert (random.random(), np.random.rand()) == expected
  boxes.reset(12)
  assert boxes.reset(11)[0] == first
  pool = envs.EnvPool(lambda **kw: gym_sokoban.GymSokobanEnv(**kw),
                      num_groups=2, group_size=2)
  obs, _ = pool.reset([4, 5])
  assert obs[0] == obs[1] and obs[2] == obs[3]


@pytest.mark.integration
def test_gym_sokoban_unseen_levels_are_no_training_levels():
  # Every split used one generator: about one eval_unseen level in seven
  # (7x7, one box) was a training level.
  _require(gym_sokoban)
  train = gym_sokoban.GymSokobanEnv(split="train")
  unseen = gym_sokoban.GymSokobanEnv(split="eval_unseen")
  rooms, train_classes = set(), set()
  for s in range(150):
    train.reset(s)
    train_classes.add(sokoban.held_out(train.level, train.state))
    rooms.add(sokoban.canonical_room(train.level))
  leaked, unseen_classes = [], set()
  for s in range(2_000_000, 2_000_150):
    unseen.reset(s)
    unseen_classes.add(sokoban.held_out(unseen.level, unseen.state))
    if sokoban.canonical_room(unseen.level) in rooms:
      leaked.append(s)
  assert not leaked
  assert train_classes == {False} and unseen_classes == {True}


class _StubEngine:
  """gym-sokoban's engine as the adapter uses it, with a small random room
  drawn from the global `random` (or always the same room: `fixed`)."""

  fixed = False

  def __init__(self, *, dim_room, max_steps, num_boxes, num_gen_steps,
               reset):
    del max_steps, num_boxes, num_gen_steps, reset
    self.dim = dim_room

  def reset(self, render_mode=None):
    del render_mode
    rows, cols = self.dim
    rng = random.Random(0) if self.fixed else random
    room = np.zeros((rows, cols), int)  # walls
    inner = [(r, c) for r in range(1, rows - 1) for c in range(1, cols - 1)]
    floor = [p for p in inner if rng.random() < 0.7]
    if len(floor) < 3:
      floor = inner
    for p in floor:
      room[p] = 1
    target, box, player = rng.sample(floor, 3)
    room[target] = gym_sokoban.TARGET
    self.room_fixed = room.copy()
    room[box], room[player] = gym_sokoban.BOX, gym_sokoban.PLAYER
    self.room_state = room


def _stub_env(monkeypatch, split, fixed=False):
  monkeypatch.setattr(gym_sokoban, "_engine_class", lambda: type(
      "Stub", (_StubEngine,), {"fixed": fixed}))
  return gym_sokoban.GymSokobanEnv(split=split, dim=(6, 6))


def test_gym_sokoban_draws_again_until_a_level_of_the_splits_class(
    monkeypatch):
  # Needs no gym-sokoban: a stub engine stands in.
  for split in ("train", "eval_seen", "eval_unseen"):
    env = _stub_env(monkeypatch, split)
    for seed in envs.split_seeds(split, 30):
      first = env.reset(seed)[0]
      assert sokoban.held_out(env.level, env.state) == (split == "eval_unseen")
      assert env.reset(seed)[0] == first
  assert gym_sokoban.attempt_seed(5, 0) == 5
  assert len({gym_sokoban.attempt_seed(5, a) for a in range(100)}) == 100
  with pytest.raises(ValueError, match="seeds are >= 0"):
    env.reset(-1)


def test_gym_sokoban_gives_up_with_a_clear_error(monkeypatch):
  monkeypatch.setattr(gym_sokoban, "MAX_ATTEMPTS", 5, raising=False)
  classes = set()
  for split in ("train", "eval_unseen"):
    env = _stub_env(monkeypatch, split, fixed=True)  # always the same room
    try:
      env.reset(0)
      classes.add(sokoban.held_out(env.level, env.state))
    except RuntimeError as e:
      assert re.search(r"no (held-out|training)-class gym-sokoban level for "
                       r"seed 0 in 5 draws", str(e)), e
      assert env.level is None
      with pytest.raises(RuntimeError, match="reset"):
        env.step("up")
      classes.add("error")
  assert "error" in classes and len(classes) == 2


# -- ALFWorld ------------------------------------------------------------------

_PROBLEM = """
(define (problem tiny) (:domain alfred)
 (:objects agent1 - agent
  AppleType MugType - otype
  FridgeType CounterTopType SinkBasinType MicrowaveType - rtype
  Apple_bar__plus_00_dot_10 Mug_bar__plus_00_dot_20 - object
  Fridge_bar__plus_01_dot_00 CounterTop_bar__plus_02_dot_00 - receptacle
  loc_bar_0 loc_bar_1 loc_bar_2 - location)
 (:init (atLocation agent1 loc_bar_0)
  (receptacleType Fridge_bar__plus_01_dot_00 FridgeType)
  (receptacleType CounterTop_bar__plus_02_dot_00 CounterTopType)
  (objectType Apple_bar__plus_00_dot_10 AppleType)
  (objectType Mug_bar__plus_00_dot_20 MugType)
  (canContain FridgeType AppleType) (canContain FridgeType MugType)
  (canContain CounterTopType AppleType) (canContain CounterTopType MugType)
  (openable Fridge_bar__plus_01_dot_00)
  (pickupable Apple_bar__plus_00_dot_10) (pickupable Mug_bar__plus_00_dot_20)
  (receptacleAtLocation Fridge_bar__plus_01_dot_00 loc_bar_1)
  (receptacleAtLocation CounterTop_bar__plus_02_dot_00 loc_bar_2)
  (inReceptacle Apple_bar__plus_00_dot_10 CounterTop_bar__plus_02_dot_00)
  (inReceptacle Mug_bar__plus_00_dot_20 CounterTop_bar__plus_02_dot_00)
  (objectAtLocation Apple_bar__plus_00_dot_10 loc_bar_2)
  (objectAtLocation Mug_bar__plus_00_dot_20 loc_bar_2))
 (:goal (exists (?o - object ?r - receptacle) (and (objectType ?o AppleType)
  (receptacleType ?r FridgeType) (inReceptacle ?o ?r)))))
"""
_TRAJ = {"task_type": "pick_and_place_simple",
         "pddl_params": {"object_target": "Apple", "parent_target": "Fridge",
                         "toggle_target": "", "mrecep_target": "",
                         "object_sliced": False}}


def _write_game(directory, *, solvable=True):
  """An ALFWorld game dir (game.tw-pddl + traj_data.json) in ALFWorld's form."""
  from alfworld import info  # pylint: disable=g-import-not-at-top
  with open(info.ALFRED_PDDL_PATH) as f:
    domain = f.read()
  with open(info.ALFRED_TWL2_PATH) as f:
    grammar = f.read().replace("UNKNOWN GOAL", "put some apple in fridge")
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "traj_data.json"), "w") as f:
    json.dump(_TRAJ, f)
  with open(os.path.join(directory, "game.tw-pddl"), "w") as f:
    json.dump({"pddl_domain": domain, "grammar": grammar,
               "pddl_problem": _PROBLEM, "solvable": solvable}, f)


@pytest.fixture(scope="module")
def alfworld_data(tmp_path_factory):
  _require(alfworld_env)
  root = tmp_path_factory.mktemp("alfworld")
  for split in ("train", "valid_seen"):
    _write_game(str(root / "json_2.1.1" / split /
                    "pick_and_place_simple-Apple-None-Fridge-1" / "trial_1"))
  _write_game(str(root / "json_2.1.1" / "train" / "unsolvable" / "trial_1"),
              solvable=False)
  return str(root)


@pytest.mark.integration
@pytest.mark.parametrize("expert", ["planner", "handcoded"])
def test_alfworld_expert_wins_and_protocol(alfworld_data, expert):
  random.seed(0)  # the hand-coded expert draws from `random` when stuck
  env = alfworld_env.AlfWorldEnv(split="eval_seen", data_dir=alfworld_data,
                                 expert=expert)
  assert isinstance(env, envs.Env) and len(env.games) == 1
  obs, info = env.reset(seed=envs.SPLITS["eval_seen"].start)
  assert obs.startswith("You are in the middle of a room.")
  assert "countertop 1" in obs and "Welcome" not in obs
  assert env.task == "put some apple in fridge" and env.family == "pick"
  assert "go to fridge 1" in info["admissible_actions"]
  assert "help" not in info["admissible_actions"]
  rewards, info = _play(env, alfworld_env.AlfWorldExpert(env), limit=20)
  assert info["won"] and env.done and rewards[-1] == 10.0
  assert "move apple 1 to fridge 1" in env.actions
  truth = env.ground_truth()
  assert truth["won"] and truth["task_type"] == "pick_and_place_simple"
  if expert == "planner":
    assert env.actions == truth["walkthrough"]


@pytest.mark.integration
def test_alfworld_invalid_action_and_determinism(alfworld_data):
  env = alfworld_env.AlfWorldEnv(data_dir=alfworld_data)
  assert len(env.games) == 1  # the unsolvable game is skipped
  first = env.reset(seed=3)
  obs, reward, done, info = env.step("fly to the moon")
  assert obs == alfworld_env.NOTHING and reward == 0.0 and not done
  assert not info["action_valid"]
  assert env.expert_plan[0] == "go to countertop 1"
  assert env.reset(seed=3) == first


def test_alfworld_game_files_without_the_package(tmp_path, monkeypatch):
  monkeypatch.delenv("ALFWORLD_DATA", raising=False)
  with pytest.raises(FileNotFoundError, match="never downloads"):
    alfworld_env.find_games("train")
  with pytest.raises(FileNotFoundError, match="valid_unseen"):
    alfworld_env.find_games("eval_unseen", data_dir=str(tmp_path))
  game = tmp_path / "valid_unseen" / "a" / "game.tw-pddl"
  game.parent.mkdir(parents=True)
  game.write_text(json.dumps({"solvable": True}))
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
  assert alfworld_env.find_games("eval_unseen") == [str(game)]
  assert alfworld_env.find_games("train", games=str(game)) == [str(game)]


def test_twx_train_seeds_skip_the_dev_and_test_games():
  # Works without the package: the seed mapping is pure.
  dev, test = range(10_000, 10_005), [20_000, 20_001, 20_003]
  kw = dict(dev_seeds=dev, test_seeds=test)
  train = [twx.twx_seed(s, fold="train", split="train", **kw)
           for s in range(20_005)]
  assert train[:3] == [0, 1, 2] and len(set(train)) == len(train)
  assert not set(train) & (set(dev) | set(test))
  assert train[9_999] == 9_999 and train[10_000] == 10_005
  assert twx.twx_seed(2_000_001, fold="test",
                                    split="eval_unseen", **kw) == 20_001
