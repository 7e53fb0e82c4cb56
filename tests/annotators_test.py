"""Tests for the rule-based hindsight annotator."""

import re

import pytest

from seed_jax import annotators
from seed_jax import envs
from seed_jax.envs import gym_sokoban
from seed_jax.envs import household
from seed_jax.envs import household_world as hw
from seed_jax.episodes import Episode
from seed_jax.episodes import Step


def _episode(env, seed, actions, *, reset=True, obs=None):
  """Plays `actions` (until done) and records the episode; without `reset`,
  from the env's state, whose observation is `obs` (default: the grid)."""
  if reset:
    obs = env.reset(seed)[0]
  elif obs is None:
    obs = env.render_text()
  ep = Episode(env_name=env.name, task=env.task, family=env.family, seed=seed)
  for action in actions:
    new_obs, reward, done, info = env.step(action)
    ep.steps.append(Step(observation=obs, prompt="", response="",
                         action=action, action_valid=info["action_valid"],
                         reward=reward, done=done))
    ep.episode_return += reward
    obs = new_obs
    if done:
      break
  ep.success = info["won"]
  ep.ground_truth = env.ground_truth()
  return ep


def _household(family, max_steps=30):
  return household.HouseholdEnv(families=(family,), max_steps=max_steps)


def _seed_where(family, test):
  """First train seed whose generated world passes `test`."""
  return next(s for s in range(500)
              if test(hw.generate(s, families=(family,))))


def _start(world):
  return world.where(world.instances(world.obj_type)[0])


def _fetch_prefix(env):
  plan = household.expert_actions(env)
  n = next(i for i, a in enumerate(plan) if a.startswith("take "))
  return plan[:n + 1]


@pytest.mark.parametrize("family", hw.FAMILIES)
def test_success_gives_a_workflow(family):
  env = _household(family)
  env.reset(1)
  ep = _episode(env, 1, household.expert_actions(env))
  out = annotators.annotate(ep)
  assert set(out) == {"episode_summary", "episode_skill"}
  assert out["episode_summary"].startswith("Success in")
  skill = out["episode_skill"]
  assert 0 < len(skill) <= annotators.MAX_SKILL_CHARS
  assert ep.ground_truth["object_type"] in skill
  appliance = {"clean": "sinkbasin 1", "heat": "microwave 1",
               "cool": "fridge 1", "look_at_in_light": "desklamp"}
  assert appliance.get(family, "move it") in skill


def test_object_never_checked():
  env = _household("clean", max_steps=3)
  ep = _episode(env, 0, ["look"] * 3)
  truth = ep.ground_truth
  where = next(iter(truth["start_locations"].values()))
  out = annotators.annotate(ep)
  assert out["episode_summary"].startswith("Failure after 3 steps")
  assert out["episode_skill"].startswith(
      f"The {truth['object_type']} was in {where}")
  assert "which you never checked" in out["episode_skill"]


def test_closed_receptacle_never_opened():
  seed = _seed_where("pick", lambda w: _start(w) in w.closed)
  where = _start(hw.generate(seed, families=("pick",)))
  ep = _episode(_household("pick", max_steps=3), seed,
                [f"go to {where}", "look", "look"])
  skill = annotators.annotate(ep)["episode_skill"]
  assert f"was in {where}, which you reached but never opened" in skill


def test_seen_but_not_taken():
  seed = _seed_where("pick", lambda w: _start(w) not in w.closed)
  where = _start(hw.generate(seed, families=("pick",)))
  ep = _episode(_household("pick", max_steps=2), seed, [f"go to {where}",
                                                         "look"])
  assert "but never took it" in annotators.annotate(ep)["episode_skill"]


def test_of_several_goal_objects_the_one_seen_is_the_missed_fact():
  """Two objects of the goal type in two open places: the agent sees the
  one that does not sort first and leaves it. The decisive fact is that
  sighting, not the other object's place it never checked."""
  def two_open_places(w):
    places = {w.where(o) for o in w.instances(w.obj_type)}
    return len(places) == 2 and not places & set(w.closed)
  seed = _seed_where("pick", two_open_places)
  world = hw.generate(seed, families=("pick",))
  last = sorted(world.instances(world.obj_type))[-1]
  where = world.where(last)
  ep = _episode(_household("pick", max_steps=3), seed,
                [f"go to {where}", "look", "look"])
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith("was seen but never taken.")
  assert f"You saw the {world.obj_type} in {where}" in out["episode_skill"]


def test_wrong_appliance_and_missing_processing():
  env = _household("cool", max_steps=8)
  env.reset(2)
  fetch = _fetch_prefix(env)
  obj = " ".join(fetch[-1].split()[1:3])  # "take egg 1 from ..."
  ep = _episode(env, 2, fetch + ["go to microwave 1",
                                 f"heat {obj} with microwave 1"] + ["look"] * 8)
  skill = annotators.annotate(ep)["episode_skill"]
  assert skill.startswith("A cool task needs fridge 1, not the microwave")
  env = _household("clean", max_steps=6)
  env.reset(2)
  ep = _episode(env, 2, _fetch_prefix(env) + ["look"] * 6)
  assert "never cleaned it; go to sinkbasin 1" in annotators.annotate(ep)[
      "episode_skill"]


def test_lamp_and_placement_failures():
  env = _household("look_at_in_light", max_steps=5)
  env.reset(3)
  ep = _episode(env, 3, _fetch_prefix(env) + ["look"] * 5)
  lamp = ep.ground_truth["lamp_location"]
  assert (f"The desklamp 1 is on {lamp}; carry the" in
          annotators.annotate(ep)["episode_skill"])
  env = _household("pick", max_steps=5)
  env.reset(3)
  ep = _episode(env, 3, _fetch_prefix(env) + ["look"] * 5)
  assert "but never moved it to a" in annotators.annotate(ep)["episode_skill"]


def test_pick_two_workflow_names_both_places():
  env = _household("pick_two", max_steps=40)
  env.reset(4)
  ep = _episode(env, 4, household.expert_actions(env))
  assert ep.success
  gt = ep.ground_truth
  taken = [o for o in gt["taken"] if hw.kind(o) == gt["object_type"]]
  first, second = (gt["start_locations"][o] for o in taken[:2])
  skill = annotators.annotate(ep)["episode_skill"]
  assert f"here it was in {first})" in skill
  assert f"a second {gt['object_type']} (here it was in {second})" in skill
  # Putting the first object back and taking it again names no new place.
  env.reset(4)
  plan = household.expert_actions(env)
  i = next(i for i, a in enumerate(plan) if a.startswith("take "))
  obj, where = plan[i][len("take "):].split(" from ")
  again = _episode(env, 4, plan[:i + 1] + [f"move {obj} to {where}", plan[i]]
                   + plan[i + 1:])
  assert again.success and again.ground_truth["taken"][:2] == [obj, obj]
  assert annotators.annotate(again)["episode_skill"] == skill


def test_pick_two_with_one_placed():
  env = _household("pick_two", max_steps=30)
  env.reset(4)
  plan = household.expert_actions(env)
  first_move = next(i for i, a in enumerate(plan) if a.startswith("move "))
  ep = _episode(env, 4, plan[:first_move + 1] + ["look"] * 30)
  out = annotators.annotate(ep)
  assert "only one" in out["episode_summary"]
  assert out["episode_skill"].startswith("You placed one")


def test_invalid_actions_are_called_out():
  ep = _episode(_household("pick", max_steps=4), 0, ["dance"] * 4)
  assert "4 of your 4 actions were invalid" in annotators.annotate(ep)[
      "episode_skill"]


def _tried(ep):
  """`ep` with replies that ask for its actions, as a policy's would."""
  for s in ep.steps:
    s.response = f"<think>x</think><action>{s.action}</action>"
  return ep


def test_the_repeat_rule_follows_a_repeated_try_only():
  env = _household("pick", max_steps=5)
  env.reset(0)
  there, elsewhere = [a for a in env.admissible_actions
                      if a.startswith("go to ")][:2]
  again = _tried(_episode(env, 0, [there, there, elsewhere]))
  assert [s.action_valid for s in again.steps] == [True, False, True]
  moved = _tried(_episode(env, 0, [there, elsewhere]))
  assert annotators.has_repeated_try(again)
  assert not annotators.has_repeated_try(moved)
  plain = annotators.annotate(again)["episode_skill"]
  ruled = annotators.annotate(again, repeats=True)["episode_skill"]
  assert annotators.REPEAT_RULE not in plain
  assert ruled == plain + " " + annotators.REPEAT_RULE
  assert annotators.REPEAT_RULE not in annotators.annotate(
      moved, repeats=True)["episode_skill"]
  teacher = annotators.RuleTeacher(detail="kind", repeats=True)
  assert teacher.annotate_many([again])[0]["episode_skill"].endswith(
      annotators.REPEAT_RULE)
  # A long skill is cut to leave the rule whole.
  long = annotators.with_repeat_rule("word " * 100)
  assert long.endswith("... " + annotators.REPEAT_RULE)
  assert len(long) <= annotators.MAX_SKILL_CHARS


def test_sokoban_fatal_push():
  env = envs.make("sokoban")
  env.load_text("######\n#_XPO#\n#____#\n######")
  ep = _episode(env, 0, ["down", "up", "left"] + ["right"] * 27, reset=False)
  out = annotators.annotate(ep)
  assert out["episode_summary"] == (
      "Failure after 30 steps on 'push every box (X) onto a target (O)': step "
      "3 (left) made the level unsolvable.")
  assert out["episode_skill"] == (
      "Step 3 (left) pushed the box into a corner at row 2, column 2, off any "
      "target, and the level became unsolvable. Never push a box into a "
      "corner that is not a target.")


def test_sokoban_solver_cap_is_not_told_as_a_fatal_push(monkeypatch):
  """When the solver gives up on a state reached by a walk (its state cap),
  no push is blamed: the skill is the plan, not a made-up deadlock."""
  env = envs.make("sokoban", max_steps=3)
  env.load_text("#######\n#P_X_O#\n#_____#\n#######")
  start = env.history[0]
  real_solve = type(env.level).solve
  monkeypatch.setattr(env.level, "solve", lambda state, **kw: (
      real_solve(env.level, state, **kw) if state == start else None))
  ep = _episode(env, 0, ["down", "up", "down"], reset=False)
  assert ep.ground_truth["first_unsolvable_step"] == 2
  assert ep.ground_truth["box"] is None
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith("the level was not solved.")
  assert out["episode_skill"].endswith(
      "The shortest plan here, move by move: 1 right, 2 right, 3 right.")


def test_sokoban_success_and_timeout():
  env = envs.make("sokoban")
  env.reset(0)
  ep = _episode(env, 0, list(env.solution))
  out = annotators.annotate(ep)
  assert out["episode_summary"].startswith("Success in")
  assert annotators.PLAN in out["episode_skill"]
  env = envs.make("sokoban", max_steps=4)
  env.load_text("#######\n#P_X_O#\n#_____#\n#######")
  ep = _episode(env, 0, ["down", "up", "down", "up"], reset=False)
  out = annotators.annotate(ep)
  assert "stayed solvable" in out["episode_summary"]
  assert out["episode_skill"].endswith(
      "The shortest plan here, move by move: 1 right, 2 right, 3 right.")
  env.load_text("#######\n#P_X_O#\n#_____#\n#######")
  ep = _episode(env, 0, ["jump"] * 4, reset=False)
  assert "exactly one of up, down, left, right" in annotators.annotate(ep)[
      "episode_skill"]


def test_deterministic_and_bad_input():
  env = _household("heat", max_steps=6)
  first = annotators.annotate(_episode(env, 5, ["look"] * 6))
  again = annotators.annotate(_episode(env, 5, ["look"] * 6))
  assert first == again
  with pytest.raises(ValueError, match="household"):
    annotators.annotate(Episode(env_name="webshop", task="t", family="f",
                                seed=0))
  # No facts to ground an analysis in: no reply (never a generic one).
  assert annotators.annotate(Episode(env_name="household", task="t",
                                     family="pick", seed=0)) is None
  ep = _episode(env, 5, ["look"] * 6)
  ep.error = "boom"  # the environment raised
  assert annotators.annotate(ep) is None
  assert annotators.RuleTeacher().annotate_many([ep]) == [None]
  # Scripted demonstrations must not lose an episode quietly.
  with pytest.raises(RuntimeError, match="household seed 5: .*boom"):
    annotators.annotate_strict(ep)
  assert annotators.annotate_strict(ep.__class__(**{
      **ep.__dict__, "error": None})) == first


def test_rule_teacher_answers_like_a_teacher_in_order():
  env = _household("heat", max_steps=6)
  episodes = [_episode(env, s, ["look"] * 6) for s in (5, 6, 7)]
  teacher = annotators.RuleTeacher("episode_only", 3)
  assert teacher.mode == "episode_only" and teacher.max_critical_steps == 3
  got = teacher.annotate_many(episodes, ["unused"] * 3)
  assert got == [annotators.annotate(ep) for ep in episodes]
  assert got[0] != got[1]  # in order, not one answer for all


_WANDER = ["up", "up", "up", "left", "down", "left", "left", "down", "up",
           "down", "right", "right"]  # seed 2: step 12 pushes into a wall


@pytest.mark.parametrize("seed,moves,summary", [
    (0, None, "Success in 5 steps"),
    (2, _WANDER, "Failure after 12 steps on 'push every box (X) onto a target "
                 "(O)': step 12 (right) made the level unsolvable.")])
def test_gym_sokoban_has_the_sokobans_ground_truth(seed, moves, summary):
  """gym_sokoban's facts are the built-in sokoban's on the same level and
  moves, so the sokoban rules apply (None: the optimal solution)."""
  error = gym_sokoban.requirement_error()
  if error:
    pytest.skip(error)
  gym = gym_sokoban.GymSokobanEnv(dim=(7, 7), num_boxes=1, max_steps=20)
  start = gym.reset(seed)[0]
  moves = moves or list(gym.solution)
  builtin = envs.make("sokoban", max_steps=20)
  builtin.load_text(start)
  got = _episode(gym, seed, moves, reset=False)
  want = _episode(builtin, seed, moves, reset=False)
  assert got.env_name == "gym_sokoban" and got.ground_truth == want.ground_truth
  out = annotators.annotate(got)
  assert out == annotators.annotate(want)
  assert out["episode_summary"].startswith(summary)


def _kitchen(**overrides):
  """A small hand-built kitchen: mug 1 in the closed cabinet 1, an apple 1
  and a mug 2 on countertop 1."""
  spec = dict(
      seed=0, room="kitchen", layout="test", family="clean", obj_type="mug",
      target_type="coffeemachine",
      receptacles=["cabinet 1", "coffeemachine 1", "countertop 1",
                   "countertop 2", "sinkbasin 1"],
      contents={"cabinet 1": ["mug 1"], "coffeemachine 1": [],
                "countertop 1": ["apple 1", "mug 2"], "countertop 2": [],
                "sinkbasin 1": []},
      closed={"cabinet 1"})
  spec.update(overrides)
  return hw.World(**spec)


def _played(world, actions):
  """The episode of `actions` played from `world` (cut after the last)."""
  env = household.HouseholdEnv(max_steps=len(actions))
  obs, _ = env.reset_to(world)
  return _episode(env, 0, actions, reset=False, obs=obs)


def test_cleaning_another_object_is_not_cleaning_the_goal():
  """Cleaning the apple and placing the dirty mug: the mug was never
  cleaned (it did reach the target)."""
  ep = _played(_kitchen(), [
      "go to countertop 1", "take apple 1 from countertop 1",
      "go to sinkbasin 1", "clean apple 1 with sinkbasin 1",
      "move apple 1 to sinkbasin 1", "go to countertop 1",
      "take mug 2 from countertop 1", "go to coffeemachine 1",
      "move mug 2 to coffeemachine 1"])
  assert not ep.success
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith("the mug was never cleaned.")
  assert out["episode_skill"].startswith(
      "You took the mug but never cleaned it (you cleaned the apple 1 "
      "instead); go to sinkbasin 1")
  assert ep.ground_truth["used"] == ["clean sinkbasin 1"]  # as before
  assert ep.ground_truth["processed"] == [["clean", "apple 1", "sinkbasin 1"]]


def test_cleaning_one_mug_and_placing_another():
  ep = _played(_kitchen(), [
      "go to countertop 1", "take mug 2 from countertop 1",
      "go to sinkbasin 1", "clean mug 2 with sinkbasin 1",
      "move mug 2 to sinkbasin 1", "go to cabinet 1", "open cabinet 1",
      "take mug 1 from cabinet 1", "go to coffeemachine 1",
      "move mug 1 to coffeemachine 1"])
  assert not ep.success
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith(
      "the mug placed in the coffeemachine was never cleaned.")
  assert out["episode_skill"].startswith(
      "You cleaned mug 2 but put mug 1, never cleaned, in coffeemachine 1;")


def test_pick_two_in_two_different_targets():
  ep = _played(_kitchen(family="pick_two", target_type="countertop",
                        contents={"cabinet 1": ["mug 1"],
                                  "coffeemachine 1": [],
                                  "countertop 1": [], "countertop 2": [],
                                  "sinkbasin 1": ["mug 2"]}), [
      "go to sinkbasin 1", "take mug 2 from sinkbasin 1",
      "go to countertop 1", "move mug 2 to countertop 1", "go to cabinet 1",
      "open cabinet 1", "take mug 1 from cabinet 1", "go to countertop 2",
      "move mug 1 to countertop 2"])
  assert not ep.success
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith(
      "the two mugs went to different countertops.")
  assert out["episode_skill"].startswith(
      "You put mug 2 in countertop 1 and mug 1 in countertop 2; both mugs "
      "must end in the same countertop")


# Two boxes; pushing the left one onto its target (row 3, column 2) jams it
# in a corner where it blocks the way of the other box to the other target.
JAMMING_PUSH = "#######\n#_____#\n#OXP_##\n##X__##\n##_O_##\n##____#\n#######"


def test_sokoban_fatal_push_onto_a_target():
  env = envs.make("sokoban", max_steps=2)
  env.load_text(JAMMING_PUSH)
  ep = _episode(env, 0, ["left", "right"], reset=False)
  assert ep.ground_truth["deadlock_kind"] == "on_target"
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith(
      "step 1 (left) made the level unsolvable.")
  assert out["episode_skill"].startswith(
      "Step 1 (left) pushed a box onto the target at row 3, column 2, where "
      "it blocks the other boxes")
  assert "off any target" not in out["episode_skill"]


def test_sokoban_most_replies_invalid_means_more_than_half():
  level = "#######\n#P_X_O#\n#_____#\n#######"
  env = envs.make("sokoban", max_steps=6)
  env.load_text(level)  # a third invalid: not "most"
  ep = _episode(env, 0, ["jump", "down", "up", "jump", "down", "up"],
                reset=False)
  assert "stayed solvable" in annotators.annotate(ep)["episode_summary"]
  env = envs.make("sokoban", max_steps=5)
  env.load_text(level)  # three of five
  ep = _episode(env, 0, ["jump", "down", "jump", "up", "jump"], reset=False)
  assert annotators.annotate(ep)["episode_summary"].endswith(
      "most replies had no valid action.")


@pytest.mark.parametrize("level,moves,skill", [
    # The box against the top wall, its target on that same wall: the player
    # can no longer reach (row 2, column 2) to push it there.
    ("######\n#__XO#\n##_P_#\n######", ["right", "up", "left"],
     "Step 3 (left) pushed the box to row 2, column 3, off any target, from "
     "where you could no longer get behind it to push it onto a target, and "
     "the level became unsolvable. Before each push, check that you can "
     "still walk to every side the box must be pushed from."),
    # Two boxes: the pushed one, clear of walls, could still reach a target.
    ("######\n###_##\n###__#\n#SX__#\n#_X_O#\n######", ["right", "left"],
     "Step 1 (right) pushed a box to row 4, column 4, off any target, from "
     "where that box alone could still reach a target but not all boxes "
     "could, and the level became unsolvable. Push in an order that keeps "
     "each box's way and your own clear."),
    # A true wall deadlock: no target along the top wall.
    ("######\n#____#\n#_X__#\n#_P_O#\n######", ["up", "left"],
     "Step 1 (up) pushed the box against a wall at row 2, column 3, off any "
     "target, and the level became unsolvable. Never push a box against a "
     "wall unless a target lies along that wall."),
])
def test_sokoban_fatal_push_blames_the_wall_only_for_a_stuck_box(
    level, moves, skill):
  """The box of a fatal push is blamed on its place (a wall, a stuck
  position) only when it alone could no longer reach a target."""
  env = envs.make("sokoban", max_steps=len(moves))
  env.load_text(level)
  ep = _episode(env, 0, moves, reset=False)
  assert ep.ground_truth["deadlock_kind"] in ("wall", "other")
  assert annotators.annotate(ep)["episode_skill"] == skill
  ep.steps[ep.ground_truth["first_unsolvable_step"]].observation = "?"
  assert annotators.annotate(ep)["episode_skill"].endswith(
      "and the level became unsolvable. Before each push, check that every "
      "box can still reach a target.")  # no level to prove a cause on


_TWO_MUGS = dict(family="pick_two", target_type="countertop", contents={
    "cabinet 1": ["mug 1"], "coffeemachine 1": [], "countertop 1": [],
    "countertop 2": [], "sinkbasin 1": ["mug 2"]})
_PUT_BACK = ["go to sinkbasin 1", "take mug 2 from sinkbasin 1",
             "go to countertop 1", "move mug 2 to countertop 1",
             "take mug 2 from countertop 1"]


@pytest.mark.parametrize("then,summary,skill", [
    (["go to cabinet 1", "open cabinet 1", "move mug 2 to cabinet 1"],
     "no mug was left in the countertop.",
     "You put mug 2 in countertop 1, then took it out again; another mug was "
     "in cabinet 1. Put two mugs in the same countertop and leave them "
     "there."),
    (["look"], "no mug was left in the countertop.",  # still held
     "You put mug 2 in countertop 1, then took it out again; another mug was "
     "in cabinet 1. Put two mugs in the same countertop and leave them "
     "there."),
    (["go to countertop 2", "move mug 2 to countertop 2"],
     "only one mug reached the countertop.",
     "You placed one mug in countertop 2; another mug was in cabinet 1. Put "
     "two mugs in the same countertop, one trip each."),
])
def test_pick_two_failure_tells_where_the_mug_was_left(then, summary, skill):
  """A mug put in countertop 1 and taken out again is not told as placed
  there."""
  ep = _played(_kitchen(**_TWO_MUGS), _PUT_BACK + then)
  assert not ep.success
  out = annotators.annotate(ep)
  assert out["episode_summary"].endswith(summary)
  assert out["episode_skill"] == skill


def test_pick_two_success_names_the_mugs_that_met_the_goal():
  """The first mug taken (from coffeemachine 1) goes to the countertop and
  back; the workflow names the two that ended there."""
  spec = dict(_TWO_MUGS, contents={**_TWO_MUGS["contents"],
                                   "coffeemachine 1": ["mug 3"]})
  ep = _played(_kitchen(**spec), [
      "go to coffeemachine 1", "take mug 3 from coffeemachine 1",
      "go to countertop 1", "move mug 3 to countertop 1",
      "take mug 3 from countertop 1", "go to coffeemachine 1",
      "move mug 3 to coffeemachine 1"] + _PUT_BACK[:4] + [
      "go to cabinet 1", "open cabinet 1", "take mug 1 from cabinet 1",
      "go to countertop 1", "move mug 1 to countertop 1"])
  assert ep.success
  assert annotators.annotate(ep)["episode_skill"] == (
      "To place two objects: find the mug (check sinkbasins first; here it "
      "was in sinkbasin 1), take it, move it to a countertop, then find a "
      "second mug (here it was in cabinet 1) and move it to the same "
      "countertop.")


def test_look_success_names_the_object_held_under_the_lamp():
  """The first pen taken is put back; the pen looked at came from desk 1."""
  world = _kitchen(
      room="bedroom", family="look_at_in_light", obj_type="pen",
      target_type="desklamp", receptacles=["desk 1", "drawer 1",
                                           "sidetable 1"],
      contents={"desk 1": ["pen 2"], "drawer 1": ["pen 1"],
                "sidetable 1": []}, closed=set(), lamp_at="sidetable 1")
  ep = _played(world, [
      "go to drawer 1", "take pen 1 from drawer 1", "move pen 1 to drawer 1",
      "go to desk 1", "take pen 2 from desk 1", "go to sidetable 1",
      "use desklamp 1"])
  assert ep.success
  assert annotators.annotate(ep)["episode_skill"].startswith(
      "To look at an object under the lamp: find the pen (check desks first; "
      "here it was in desk 1), take it, go to sidetable 1")


def _kind_cases():
  """Household episodes of each kind of skill that says where things were:
  a success per family, never checked, reached but never opened, seen but
  never taken, and pick_two with one placed."""
  eps = []
  for family in hw.FAMILIES:
    env = _household(family)
    env.reset(1)
    eps.append(_episode(env, 1, household.expert_actions(env)))
  eps.append(_episode(_household("clean", max_steps=3), 0, ["look"] * 3))
  seed = _seed_where("pick", lambda w: _start(w) in w.closed)
  where = _start(hw.generate(seed, families=("pick",)))
  eps.append(_episode(_household("pick", max_steps=3), seed,
                      [f"go to {where}", "look", "look"]))
  seed = _seed_where("pick", lambda w: _start(w) not in w.closed)
  where = _start(hw.generate(seed, families=("pick",)))
  eps.append(_episode(_household("pick", max_steps=2), seed,
                      [f"go to {where}", "look"]))
  return eps


def test_kind_detail_names_the_kind_of_place_never_the_place():
  cases = _kind_cases()
  told = 0
  for ep in cases:
    gt = ep.ground_truth
    place = annotators.annotate(ep)["episode_skill"]
    kind = annotators.annotate(ep, "kind")
    assert kind["episode_summary"] == annotators.annotate(ep)[
        "episode_summary"]
    skill = kind["episode_skill"]
    # The appliance (one per room, "sinkbasin 1") is no hidden fact.
    hidden = ((set(gt["start_locations"].values())
               | {gt.get("lamp_location")}) - {gt.get("appliance")})
    named = [p for p in hidden if p and re.search(rf"\b{p}\b", place)]
    told += bool(named)  # the place detail names where things were ...
    for p in named:      # ... the kind detail names only their kinds
      assert not re.search(rf"\b{p}\b", skill), (p, skill)
      k = p.rsplit(" ", 1)[0]
      assert re.search(rf"\b({k}s|a {k})\b", skill), (k, skill)
  assert told >= len(cases) - 1  # a lettuce found in the sink: no hidden fact


def test_rule_teacher_writes_the_detail_asked():
  teacher = annotators.RuleTeacher(detail="kind")
  cases = _kind_cases()
  got = teacher.annotate_many(cases)
  assert got == [annotators.annotate(ep, "kind") for ep in cases]
  assert got != annotators.RuleTeacher().annotate_many(cases)
  with pytest.raises(ValueError, match=r"must be one of \('place', 'kind'\), "
                     "got 'room'"):
    annotators.RuleTeacher(detail="room")


def test_kind_detail_is_for_the_household_game():
  env = _household("pick", max_steps=2)
  ep = _episode(env, 0, ["look"] * 2)
  with pytest.raises(ValueError, match=r"must be one of \('place', 'kind'\), "
                     "got 'room'"):
    annotators.annotate(ep, "room")
  sok = envs.make("sokoban", max_steps=2)
  ep = _episode(sok, 0, ["up", "up"])
  annotators.annotate(ep)  # the place detail: Sokoban's only one
  with pytest.raises(ValueError, match="'kind' is for the household game, "
                     "not 'sokoban'"):
    annotators.annotate(ep, "kind")
