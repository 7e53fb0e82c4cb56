"""Tests for the ALFWorld-style household environment and its expert."""

import dataclasses
import itertools
import re

import pytest

from seed_jax import envs
from seed_jax import episodes
from seed_jax import prompts
from seed_jax.envs import household
from seed_jax.envs import household_world as hw


def _world(**overrides):
  spec = dict(
      seed=0, room="kitchen", layout="test", family="clean", obj_type="mug",
      target_type="coffeemachine",
      receptacles=["cabinet 1", "coffeemachine 1", "countertop 1", "fridge 1",
                   "microwave 1", "sinkbasin 1"],
      contents={"cabinet 1": ["mug 1"], "coffeemachine 1": [],
                "countertop 1": ["apple 1", "mug 2"], "fridge 1": [],
                "microwave 1": [], "sinkbasin 1": []},
      closed={"cabinet 1", "fridge 1", "microwave 1"})
  spec.update(overrides)
  return hw.World(**spec)


def _play(env, actions):
  return [env.step(a) for a in actions]


def test_wording_of_a_clean_task():
  env = household.HouseholdEnv()
  obs, info = env.reset_to(_world())
  assert obs == (
      "You are in the middle of a room. Looking quickly around you, you see a "
      "cabinet 1, a coffeemachine 1, a countertop 1, a fridge 1, a microwave "
      "1, and a sinkbasin 1.\n\nYour task is to: put a clean mug in "
      "coffeemachine.")
  assert env.task == "put a clean mug in coffeemachine"
  assert info["admissible_actions"] == [
      "go to cabinet 1", "go to coffeemachine 1", "go to countertop 1",
      "go to fridge 1", "go to microwave 1", "go to sinkbasin 1", "inventory",
      "look"]
  script = [
      ("inventory", "You are not carrying anything.", True),
      ("go to countertop 1", "You arrive at countertop 1. On the countertop "
       "1, you see a apple 1, and a mug 2.", True),
      ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed.",
       True),
      ("take mug 1 from cabinet 1", "Nothing happens.", False),
      ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In "
       "it, you see a mug 1.", True),
      ("take mug 1 from cabinet 1", "You pick up the mug 1 from the cabinet "
       "1.", True),
      ("inventory", "You are carrying: a mug 1.", True),
      ("examine mug 1", "There's nothing special about mug 1.", True),
      ("examine cabinet 1", "The cabinet 1 is open. In it, you see nothing.",
       True),
      ("close cabinet 1", "You close the cabinet 1.", True),
      ("look", "You are facing the cabinet 1. Next to it, you see nothing.",
       True),
      ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.",
       True),
      ("cool mug 1 with fridge 1", "You cool the mug 1 using the fridge 1.",
       True),
      ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is "
       "closed.", True),
      ("heat mug 1 with microwave 1", "You heat the mug 1 using the microwave "
       "1.", True),
      ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, "
       "you see nothing.", True),
      ("clean mug 1 with sinkbasin 1", "You clean the mug 1 using the "
       "sinkbasin 1.", True),
      ("go to coffeemachine 1", "You arrive at coffeemachine 1. On the "
       "coffeemachine 1, you see nothing.", True),
  ]
  for action, expected, valid in script:
    obs, reward, done, info = env.step(action)
    assert (obs, info["action_valid"]) == (expected, valid), action
    assert (reward, done, info["won"]) == (0.0, False, False)
  assert "move mug 1 to coffeemachine 1" in info["admissible_actions"]
  obs, reward, done, info = env.step("Move  MUG 1 to coffeemachine 1")
  assert obs == "You move the mug 1 to the coffeemachine 1."
  assert (reward, done, info["won"], info["admissible_actions"]) == (
      10.0, True, True, [])
  truth = env.ground_truth()
  assert truth["start_locations"] == {"mug 1": "cabinet 1",
                                      "mug 2": "countertop 1"}
  assert truth["closed_at_start"] == ["cabinet 1", "fridge 1", "microwave 1"]
  assert truth["expert_length"] == 7  # open cabinet 1, take, clean, move
  assert truth["opened"] == ["cabinet 1"] and truth["taken"] == ["mug 1"]
  assert truth["used"] == ["cool fridge 1", "heat microwave 1",
                           "clean sinkbasin 1"]
  assert truth["processed"] == [["cool", "mug 1", "fridge 1"],
                                ["heat", "mug 1", "microwave 1"],
                                ["clean", "mug 1", "sinkbasin 1"]]
  assert truth["moved"] == [["mug 1", "coffeemachine 1"]]


def test_put_wording_is_accepted():
  env = household.HouseholdEnv()
  env.reset_to(_world(family="pick"))
  _play(env, ["go to countertop 1", "take mug 2 from countertop 1",
              "go to coffeemachine 1"])
  obs, reward, done, info = env.step("put mug 2 in/on coffeemachine 1")
  assert obs == "You put the mug 2 in/on the coffeemachine 1."
  assert info["action_valid"] and info["won"] and reward == 10.0


def test_look_at_in_light():
  world = _world(room="bedroom", family="look_at_in_light", obj_type="book",
                 target_type="desklamp", receptacles=["desk 1", "sidetable 1"],
                 contents={"desk 1": ["book 1"], "sidetable 1": []},
                 closed=set(), lamp_at="sidetable 1")
  env = household.HouseholdEnv()
  env.reset_to(world)
  assert env.task == "look at book under the desklamp"
  obs, _, _, info = env.step("go to sidetable 1")
  assert obs == ("You arrive at sidetable 1. On the sidetable 1, you see a "
                 "desklamp 1.")
  assert "use desklamp 1" in info["admissible_actions"]
  obs, reward, done, info = env.step("use desklamp 1")
  assert obs == "You turn on the desklamp 1." and not done
  steps = _play(env, ["go to desk 1", "take book 1 from desk 1",
                      "go to sidetable 1"])
  assert steps[-1][1:3] == (10.0, True) and steps[-1][3]["won"]


def test_max_steps_ends_the_episode():
  env = household.HouseholdEnv(max_steps=4)
  env.reset(0)
  dones = [env.step("look")[2] for _ in range(4)]
  assert dones == [False, False, False, True]
  obs, reward, done, info = env.step("look")
  assert done and reward == 0.0 and not info["action_valid"]


@pytest.mark.parametrize("max_steps", [0, -5])
def test_max_steps_below_one_is_refused_when_built(max_steps):
  with pytest.raises(ValueError, match=f"max_steps .* got {max_steps}"):
    household.HouseholdEnv(max_steps=max_steps)
  household.HouseholdEnv(max_steps=1)


def test_an_unknown_family_is_refused_by_generate():
  with pytest.raises(ValueError, match=r"unknown family 'cook'.*'pick'"):
    hw.generate(0, families=("pick", "cook"))


def test_a_world_can_be_replayed():
  """reset_to plays a copy: the caller's world is left as it was, so the
  same world starts the same episode again, and a fair expert serving the
  env treats the replay as a new episode."""
  world = _world(family="pick")
  env = household.HouseholdEnv()
  expert = household.ExpertPlanner(env, peek=False)
  runs = []
  for _ in range(2):
    first_obs, _ = env.reset_to(world)
    actions, done = [], False
    while not done:
      actions.append(expert.act())
      *_, done, info = env.step(actions[-1])
    runs.append((first_obs, actions, info["won"]))
  assert runs[0] == runs[1] and runs[0][2]
  assert world == _world(family="pick")  # untouched


def test_a_repeated_demonstration_reply_keeps_its_reasoning():
  """A repeat slip (`demonstrations._scripted`) repeats the whole reply:
  its <think> is the step's it repeats, not one written for the world
  after that step (here "Find a ..." before taking it, not "Heat ...")."""
  from seed_jax import demonstrations  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  pool = envs.EnvPool("household", num_groups=1, group_size=1,
                      families=("heat",))
  pool.reset([0])
  env = pool.members[0]
  plan = household.expert_actions(env)
  take = next(i for i, a in enumerate(plan) if a.startswith("take "))
  _play(env, plan[:take])  # up to the take
  generate = demonstrations._scripted(
      pool, lambda i, e: household.ExpertPlanner(e), repeat=1.0)
  first = generate([""], jax.random.key(0))[0].text
  assert first.endswith(f"</think><action>{plan[take]}</action>")
  assert ". Find a " in first
  pool.step([plan[take]])
  again = generate([""], jax.random.key(0))[0].text
  assert again == first


def _slip_runs(episodes_played):
  """Per episode, the lengths of runs of two or more identical replies in a
  row, and whether every repeat in such a run past the first slip was
  invalid."""
  lengths, only_invalid = [], True
  for ep in episodes_played:
    n = 1
    for a, b in zip(ep.steps, ep.steps[1:]):
      if b.response == a.response:
        n += 1
        if n > 2 and b.action_valid:
          only_invalid = False
      else:
        lengths += [n] if n > 1 else []
        n = 1
    lengths += [n] if n > 1 else []
  return lengths, only_invalid


def test_slip_runs_repeat_an_invalid_try_and_then_recover():
  """`repeat_run` makes a slip a run of the same try; with runs of up to 3
  the demonstrations hold states where a try was repeated, invalid, two or
  three times, each followed by the expert's own action."""
  from seed_jax import demonstrations  # pylint: disable=g-import-not-at-top
  seeds = envs.split_seeds("train", 24)
  expert = lambda i, e: household.ExpertPlanner(e)
  kw = dict(max_steps=30, history_length=2, repeat=0.2, seed=3)
  single = demonstrations._play(seeds, expert, repeat_run=1, **kw)
  runs = demonstrations._play(seeds, expert, repeat_run=3, **kw)
  single_lengths, _ = _slip_runs(single)
  lengths, only_invalid = _slip_runs(runs)
  long_single = sum(n >= 3 for n in single_lengths)
  assert sum(n >= 3 for n in lengths) >= max(3, 2 * long_single), (
      lengths, single_lengths)
  assert only_invalid  # a run goes on only while the try is invalid
  recovered = sum(
      ep.steps[j + 1].action_valid
      for ep in runs for j in range(2, len(ep.steps) - 1)
      if ep.steps[j].response == ep.steps[j - 1].response
      == ep.steps[j - 2].response != ep.steps[j + 1].response)
  assert recovered >= 3
  assert sum(ep.success for ep in runs) >= 0.8 * len(runs)
  with pytest.raises(ValueError, match="repeat_run must be an int >= 1"):
    demonstrations.demonstrations(num_tasks=1, repeat_run=0)


def _invalid_record(record):
  """Whether a record's reply asks for an action its prompt does not list
  as admissible (a demonstrated slip)."""
  listed = record["prompt"].rsplit("admissible actions", 1)[-1]
  return f"'{prompts.attempted_action(record['response'])}'" not in listed


def test_rule_repeats_makes_the_rule_what_a_skill_changes():
  """With `rule_repeats`, demonstrations without the repeat rule in the
  prompt keep their slips as replies to learn, and those with it none; sent
  as written, a failed try shows in the prompts after it."""
  from seed_jax import annotators  # pylint: disable=g-import-not-at-top
  from seed_jax import demonstrations  # pylint: disable=g-import-not-at-top
  kw = dict(num_tasks=40, repeat=0.2, repeat_run=3, skill_fraction=1.0,
            rule_detail="kind", shuffle_search=True, seed=1,
            invalid_action="as_written")
  before = demonstrations.demonstrations(**kw)
  records = demonstrations.demonstrations(**kw, rule_repeats=True)
  rule = annotators.REPEAT_RULE
  assert not any(_invalid_record(r) for r in before if r["kind"] != "analysis")
  assert not any(rule in r["prompt"] + r["response"] for r in before)
  act = [r for r in records if r["kind"] == "act"]
  ruled = [r for r in records if r["kind"] == "skill" and rule in r["prompt"]]
  unruled = [r for r in records
             if r["kind"] == "skill" and rule not in r["prompt"]]
  # The same valid acting steps, and the slips besides.
  assert [r for r in act if not _invalid_record(r)] == [
      r for r in before if r["kind"] == "act"]
  assert sum(map(_invalid_record, act)) >= 0.05 * len(act)
  assert len(ruled) >= 50 and not any(map(_invalid_record, ruled))
  # With the rule, replies to a prompt whose last step did nothing.
  after = [r for r in ruled
           if "current observation is: Nothing happens." in r["prompt"]]
  assert after, "no ruled record follows a failed try"
  assert unruled and any(map(_invalid_record, unruled))
  analyses = [r["response"] for r in records if r["kind"] == "analysis"]
  assert any(rule in a for a in analyses)
  with pytest.raises(ValueError, match="invalid_action must be one of"):
    demonstrations.demonstrations(num_tasks=1, invalid_action="skip")


# Demonstrations with the repeat rule and slips sent as written.
_RULED_DEMOS = dict(num_tasks=40, repeat=0.1, repeat_run=3, skill_fraction=1.0,
                    rule_detail="kind", shuffle_search=True, seed=1,
                    invalid_action="as_written", rule_repeats=True)


def test_ruled_repeat_adds_demonstrations_of_the_rule_followed():
  """`ruled_repeat` raises the slip rate of the skill followers with the
  repeat rule only: more of their prompts show a failed try, none of their
  replies repeats one, and the acting records stay as they were."""
  from seed_jax import annotators  # pylint: disable=g-import-not-at-top
  from seed_jax import demonstrations  # pylint: disable=g-import-not-at-top
  rule = annotators.REPEAT_RULE

  def followed(records):
    return [r for r in records if r["kind"] == "skill" and rule in r["prompt"]
            and "current observation is: Nothing happens." in r["prompt"]]

  base = demonstrations.demonstrations(**_RULED_DEMOS)
  same = demonstrations.demonstrations(**_RULED_DEMOS, ruled_repeat=0.1)
  more = demonstrations.demonstrations(**_RULED_DEMOS, ruled_repeat=0.5)
  assert same == base  # the default is the demonstrators' own rate
  assert [r for r in more if r["kind"] == "act"] == [
      r for r in base if r["kind"] == "act"]
  assert len(followed(more)) >= 2 * len(followed(base)) > 0
  assert not any(map(_invalid_record, followed(more)))
  with pytest.raises(ValueError, match="set rule_repeats=True"):
    demonstrations.demonstrations(num_tasks=1, ruled_repeat=0.5)
  with pytest.raises(ValueError, match=r"ruled_repeat must be in \[0, 1\)"):
    demonstrations.demonstrations(num_tasks=1, rule_repeats=True,
                                  ruled_repeat=1.0)
  with pytest.raises(ValueError, match="ruled_repeat must be in"):
    demonstrations.demonstrations(num_tasks=1, rule_repeats=True,
                                  ruled_repeat="0.5")


def test_after_failed_counts_reads_the_try_shown_before_nothing_happens():
  """A record counts when its prompt shows an action and "Nothing happens."
  after it; its reply tries that action again or another one, with or
  without the repeat rule in the prompt."""
  from seed_jax import annotators  # pylint: disable=g-import-not-at-top
  from seed_jax import demonstrations  # pylint: disable=g-import-not-at-top
  from seed_jax import skills  # pylint: disable=g-import-not-at-top
  history = [("You arrive at desk 1. On the desk 1, you see a pen 1.",
              "go to desk 1")]
  failed = prompts.household_prompt("put a pen in drawer", history,
                                    "Nothing happens.",
                                    ["take pen 1 from desk 1", "look"])
  valid = prompts.household_prompt("put a pen in drawer", history,
                                   "You see a pen 1.", ["look"])
  ruled = skills.build_skill_prompt(
      failed, annotators.with_repeat_rule("The pen was on the desk."))

  def record(prompt, action, kind="act"):
    return dict(prompt=prompt, kind=kind,
                response=f"<think>Find a pen.</think><action>{action}"
                         "</action>")

  counts = demonstrations.after_failed_counts([
      record(failed, "go to desk 1"), record(failed, "Go  to desk 1"),
      record(failed, "take pen 1 from desk 1"),
      record(ruled, "go to desk 1", "skill"),
      record(ruled, "look", "skill"), record(ruled, "look", "skill"),
      record(valid, "go to desk 1"),
      record(failed, "go to desk 1", "analysis")])
  assert counts == {"rule/again": 1, "rule/other": 2, "plain/again": 2,
                    "plain/other": 1}
  assert tuple(counts) == demonstrations.AFTER_FAILED

  base = demonstrations.after_failed_counts(
      demonstrations.demonstrations(**_RULED_DEMOS))
  more = demonstrations.after_failed_counts(
      demonstrations.demonstrations(**_RULED_DEMOS, ruled_repeat=0.5))
  # Only the acting records and the followers without the rule repeat a
  # failed try; `ruled_repeat` adds demonstrations of the rule followed.
  assert base["rule/again"] == more["rule/again"] == 0
  assert base["plain/again"] > 0 and base["plain/other"] > 0
  assert more["rule/other"] >= 2 * base["rule/other"] > 0
  assert (more["plain/again"], more["plain/other"]) == (
      base["plain/again"], base["plain/other"])
  for other in (dict(invalid_action="no_op"), dict(history_length=0)):
    # The no-op shows "look" in the history, and no history shows no try.
    assert not any(demonstrations.after_failed_counts(
        demonstrations.demonstrations(**{**_RULED_DEMOS, **other})).values())


def test_task_wording_per_family():
  patterns = {
      "pick": r"put a \w+ (in|on) \w+",
      "clean": r"put a clean \w+ (in|on) \w+",
      "heat": r"put a hot \w+ (in|on) \w+",
      "cool": r"put a cool \w+ (in|on) \w+",
      "look_at_in_light": r"look at \w+ under the desklamp",
      "pick_two": r"put two \w+ (in|on) \w+",
  }
  env = household.HouseholdEnv()
  for seed in range(60):
    obs, info = env.reset(seed)
    assert re.fullmatch(patterns[env.family], env.task), env.task
    assert obs.endswith(f"\n\nYour task is to: {env.task}.")
    assert obs.startswith("You are in the middle of a room. Looking quickly "
                          "around you, you see a ")
    assert len(obs) < 700
    assert info["task"] == env.task and info["family"] == env.family
  assert env.families == hw.FAMILIES


@pytest.mark.parametrize("split", ["train", "eval_unseen"])
@pytest.mark.parametrize("family", hw.FAMILIES)
def test_expert_solves_every_task(family, split):
  env = household.HouseholdEnv(split=split, families=(family,))
  for seed in envs.split_seeds(split, 200):
    env.reset(seed)
    assert env.family == family
    plan = household.expert_actions(env)
    for action in plan:
      obs, reward, done, info = env.step(action)
      assert info["action_valid"], (seed, action, obs)
      assert len(obs) < 700
    assert info["won"] and reward == 10.0, (seed, env.task, plan)


def test_fair_and_noisy_experts():
  env = household.HouseholdEnv()
  wins = 0
  for seed in range(120):
    env.reset(seed)
    expert = household.ExpertPlanner(env, peek=False)
    done = False
    while not done:
      _, _, done, info = env.step(expert.act())
    wins += info["won"]
  assert wins >= 114  # searching without peeking still almost always wins
  env = household.HouseholdEnv(max_steps=60)
  wins = 0
  for seed in range(40):
    env.reset(seed)
    expert = household.ExpertPlanner(env, peek=False, shuffle_search=True,
                                     seed=seed)
    done = False
    while not done:
      _, _, done, info = env.step(expert.act())
    wins += info["won"]
  assert wins >= 36
  env.reset(3)
  peeking = household.expert_actions(env)
  noisy = household.ExpertPlanner(env, noise=1.0, seed=1)
  actions = []
  for _ in range(6):
    actions.append(noisy.act())
    _, _, _, info = env.step(actions[-1])
    assert info["action_valid"]
  assert actions != peeking[:6]


def test_unseen_split_rule():
  train = household.HouseholdEnv(split="train")
  for seed in range(1500):
    w = hw.generate(seed)
    assert not hw.combo_is_unseen(w.obj_type, w.target_type)
    assert not hw.layout_is_unseen(w.layout)
    assert not w.goal_met()
  assert train.unseen is False
  families = set()
  for seed in envs.split_seeds("eval_unseen", 300):
    w = hw.generate(seed, unseen=True)
    assert (w.obj_type, w.target_type) in hw.UNSEEN_COMBOS
    assert hw.layout_is_unseen(w.layout)
    families.add(w.family)
  assert families == set(hw.FAMILIES)


def test_no_families_is_refused_when_built():
  # It used to fail at reset, dividing by zero.
  with pytest.raises(ValueError, match="families is empty"):
    household.HouseholdEnv(families=())
  with pytest.raises(ValueError, match="families is empty"):
    hw.generate(0, families=())
  with pytest.raises(ValueError, match="seeds are >= 0"):
    hw.generate(-1)


def test_every_room_has_seen_and_unseen_layouts():
  for room, (spec, _) in hw.ROOMS.items():
    flags = set()
    for counts in itertools.product(*(range(lo, hi + 1)
                                      for lo, hi in spec.values())):
      layout = room + ":" + ",".join(
          f"{t}={n}" for t, n in zip(spec, counts) if n)
      flags.add(hw.layout_is_unseen(layout))
    assert flags == {True, False}, room


def test_ground_truth():
  env = household.HouseholdEnv()
  env.reset(8)
  plan = household.expert_actions(env)
  _play(env, plan)
  truth = env.ground_truth()
  assert truth["won"] and truth["expert_length"] == len(plan)
  assert truth["family"] == env.family
  assert all(hw.kind(o) == truth["object_type"]
             for o in truth["start_locations"])
  assert set(truth["taken"]) <= set(truth["start_locations"])
  assert truth["visited"] == [a[len("go to "):] for a in plan
                              if a.startswith("go to ")]


def test_fair_expert_searches_for_the_lamp_it_has_not_seen():
  # peek=False uses only what it saw: it may not head for the lamp's place
  # while an earlier place in its search order could hold the lamp.
  jumps = wins = 0
  for seed in range(150):
    env = household.HouseholdEnv(families=("look_at_in_light",))
    env.reset(seed)
    expert = household.ExpertPlanner(env, peek=False, shuffle_search=True,
                                     seed=seed)
    seen, done = set(), False
    while not done:
      w = env.world
      if w.location is not None and w.location not in w.closed:
        seen.add(w.location)
      action = expert.act()
      if action == f"go to {w.lamp_at}" and w.lamp_at not in seen:
        first = next(r for r in expert.order
                     if hw.kind(r) in
                     hw.LAMP_PLACES[w.room] and r not in seen)
        jumps += first != w.lamp_at
      *_, done, info = env.step(action)
    wins += info["won"]
  assert jumps == 0 and wins == 150


def test_layout_receptacles_follow_the_layout():
  assert hw.layout_receptacles("kitchen:cabinet=2,fridge=1") == [
      "cabinet 1", "cabinet 2", "fridge 1"]
  world = hw.generate(7)
  assert hw.layout_receptacles(world.layout) == world.receptacles


def test_search_stats_count_valid_misses_before_the_first_take():
  truth = {"object_type": "mug", "target_type": "coffeemachine",
           "start_locations": {"mug 1": "cabinet 2"},
           "layout": "kitchen:cabinet=2,coffeemachine=1,drawer=1,fridge=1"}
  steps = [("go to drawer 1", True),        # not where a mug starts
           ("go to cabinet 9", False),      # invalid: not counted
           ("go to coffeemachine 1", True),  # the target: not a start place
           ("go to cabinet 1", True),        # a start place, in vain
           ("take mug 1 from drawer 1", False),  # invalid take: goes on
           ("go to cabinet 2", True),        # the find: not a miss
           ("take mug 1 from cabinet 2", True),
           ("go to cabinet 1", True)]       # after the take: not a search
  # A mug starts in a cabinet here (its other usual places are missing or
  # the target); of the 4 receptacles without the mug, 1 is a cabinet.
  stats = household.search_stats(truth, steps)
  assert stats["search_usual"] == (1.0, 3.0)
  assert stats["search_usual_chance"] == pytest.approx((3 / 4, 3.0))
  assert stats["search_usual_over_chance"] == pytest.approx((1 - 3 / 4, 3.0))
  assert household.search_stats(truth, []) == {
      "search_usual": (0.0, 0.0), "search_usual_chance": (0.0, 0.0),
      "search_usual_over_chance": (0.0, 0.0)}


def test_take_stats_split_success_into_reaching_taking_and_after():
  truth = {"start_locations": {"mug 1": "cabinet 2", "mug 2": "drawer 1"}}
  steps = [("go to cabinet 1", True),               # no goal object there
           ("take apple 1 from cabinet 1", True),  # not a goal object
           ("go to drawer 1", False),               # invalid
           ("go to drawer 1", True),                # where mug 2 is
           ("take mug 1 from drawer 1", False),     # invalid
           ("take mug 2 from drawer 1", True),      # the first goal take
           ("take mug 1 from cabinet 2", True)]
  assert household.take_stats(truth, steps, won=False) == {
      "reached_goal_place": (1.0, 1.0), "took_after_reach": (1.0, 1.0),
      "took_goal": (1.0, 1.0), "won_after_take": (0.0, 1.0),
      "steps_to_take": (6.0, 1.0)}
  assert household.take_stats(truth, steps[:5], won=False) == {
      "reached_goal_place": (1.0, 1.0), "took_after_reach": (0.0, 1.0),
      "took_goal": (0.0, 1.0), "won_after_take": (0.0, 0.0),
      "steps_to_take": (0.0, 0.0)}
  assert household.take_stats(truth, steps[:3], won=False) == {
      "reached_goal_place": (0.0, 1.0), "took_after_reach": (0.0, 0.0),
      "took_goal": (0.0, 1.0), "won_after_take": (0.0, 0.0),
      "steps_to_take": (0.0, 0.0)}
  # The expert's won episodes: each stage reached.
  env = household.HouseholdEnv(split="eval_unseen", max_steps=30)
  families = set()
  for seed in range(12):
    env.reset(seed)
    plan = household.expert_actions(env)
    valid, won = [], False
    for a in plan:
      _, reward, _, info = env.step(a)
      valid.append(info["action_valid"])
      won = reward > 0
    families.add(env.ground_truth()["family"])
    assert won and all(valid)
    stats = household.take_stats(env.ground_truth(),
                                 list(zip(plan, valid)), won=won)
    first = next(i for i, a in enumerate(plan) if a.startswith("take "))
    assert stats == {"reached_goal_place": (1.0, 1.0),
                     "took_after_reach": (1.0, 1.0),
                     "took_goal": (1.0, 1.0), "won_after_take": (1.0, 1.0),
                     "steps_to_take": (first + 1.0, 1.0)}
  assert len(families) == 6  # every family, pick_two and the lamp's too


def test_look_stats_sort_the_steps_before_the_goal_place():
  truth = {"start_locations": {"mug 1": "cabinet 2", "mug 2": "drawer 1"}}
  steps = [("go to cabinet 1", True),               # a new place
           ("open cabinet 1", True),                # another valid action
           ("go to sink 1", True),                  # a new place
           ("go to cabinet 1", True),               # a revisit
           ("go to drawer 9", False),               # invalid
           ("go to drawer 1", True),                # reached: looking ends
           ("go to cabinet 1", True)]
  want = {"look_steps": (5.0, 1.0), "look_new_place": (2.0, 5.0),
          "look_revisit": (1.0, 5.0), "look_other": (1.0, 5.0),
          "look_invalid": (1.0, 5.0), "look_invalid_take": (0.0, 5.0)}
  assert household.look_stats(truth, steps) == want
  # An invalid step that tried a take is one of the invalid takes.
  tried = steps[:4] + [("take mug 1 from cabinet 1", False)] + steps[5:]
  assert household.look_stats(truth, tried) == {
      **want, "look_invalid_take": (1.0, 5.0)}
  # Never reached: every step was looking.
  assert household.look_stats(truth, steps[:4])["look_steps"] == (4.0, 1.0)
  assert household.look_stats(truth, steps[:4])["look_revisit"] == (1.0, 4.0)
  # An invalid "go to" the goal place does not end the looking.
  got = household.look_stats(truth, [("go to drawer 1", False)] + steps[5:])
  assert got["look_steps"] == (1.0, 1.0)
  assert got["look_invalid"] == (1.0, 1.0)
  assert household.look_stats(truth, [])["look_steps"] == (0.0, 1.0)
  # The expert goes straight to the goal place: no looking at all.
  env = household.HouseholdEnv(split="eval_unseen", max_steps=30)
  env.reset(3)
  plan = household.expert_actions(env)
  played = household.played_stats(env.ground_truth(),
                                   [(a, True) for a in plan], won=True)
  assert played["look_steps"] == (0.0, 1.0)
  assert played["look_new_place"] == (0.0, 0.0)
  assert {"search_usual", "took_goal"} <= set(played)


def test_invalid_stats_count_repeated_tries_and_goes_to_where_it_stands():
  steps = [("go to drawer 1", True),
           ("open drawer 1", True),
           ("go to drawer 1", False),    # where it stands; no repeat
           ("go to drawer 1", False),    # both
           ("go to drawer 1", False),    # both
           ("", False),                  # no action: repeats nothing
           ("", False),
           ("open drawer 1", False),     # invalid, after another try
           ("go to shelf 1", True),
           ("go to drawer 1", False)]    # no longer where it stands
  assert household.invalid_stats(steps) == {
      "invalid_steps": (7.0, 10.0), "invalid_repeat": (2.0, 7.0),
      "invalid_repeat_failed": (2.0, 7.0), "invalid_go_here": (3.0, 7.0)}
  # A valid step is never a repeat, even of the same action.
  assert household.invalid_stats([("look", True), ("look", True)]) == {
      "invalid_steps": (0.0, 2.0), "invalid_repeat": (0.0, 0.0),
      "invalid_repeat_failed": (0.0, 0.0), "invalid_go_here": (0.0, 0.0)}
  # An invalid try of what the valid step before did is one; before any
  # "go to" the agent stands nowhere (the middle of the room).
  assert household.invalid_stats(
      [("open drawer 1", True), ("open drawer 1", False)])[
          "invalid_repeat"] == (1.0, 1.0)
  # Only a repeat of a failed try counts as one after a failure.
  assert household.invalid_stats(
      [("open drawer 1", True), ("open drawer 1", False),
       ("open drawer 1", False), ("open drawer 1", False)])[
           "invalid_repeat_failed"] == (2.0, 3.0)
  assert household.invalid_stats([("go to drawer 1", False)])[
      "invalid_go_here"] == (0.0, 1.0)
  # An invalid "go to" moves nobody: the agent still stands where it was.
  assert household.invalid_stats(
      [("go to drawer 1", True), ("go to shelf 1", False),
       ("go to drawer 1", False)])["invalid_go_here"] == (1.0, 2.0)
  assert household.repeated_tries(
      [("go to desk 1", True), ("go to desk 1", False), ("", False),
       ("", False)]) == [False, True, False, False]
  assert household.invalid_stats([]) == {
      "invalid_steps": (0.0, 0.0), "invalid_repeat": (0.0, 0.0),
      "invalid_repeat_failed": (0.0, 0.0), "invalid_go_here": (0.0, 0.0)}


def test_episode_stats_count_what_an_invalid_reply_tried():
  """The environment gets a no-op for an invalid reply; the statistics
  count the action the reply asked for."""
  truth = {"object_type": "mug", "target_type": "coffeemachine",
           "start_locations": {"mug 1": "cabinet 2"},
           "layout": "kitchen:cabinet=2,coffeemachine=1,drawer=1,fridge=1"}
  step = lambda response, action, valid: episodes.Step(
      observation="", prompt="", response=response, action=action,
      action_valid=valid)
  episode = episodes.Episode(
      env_name="household", task="put a mug in coffeemachine",
      family="pick", seed=0, steps=[
          step("<think>x</think><action>go to cabinet 1</action>",
               "go to cabinet 1", True),
          step("<think>x</think><action>Take  mug 1 from cabinet 1</action>",
               "look", False),
          step("no tags at all", "look", False),
          step("<think>x</think><action>go to cabinet 2</action>",
               "go to cabinet 2", True)],
      success=False, ground_truth=truth)
  stats = household.episode_stats(episode)
  assert stats["look_steps"] == (3.0, 1.0)
  assert stats["look_invalid"] == (2.0, 3.0)
  assert stats["look_invalid_take"] == (1.0, 3.0)
  assert stats["reached_goal_place"] == (1.0, 1.0)
  assert stats["invalid_steps"] == (2.0, 4.0)
  assert stats["invalid_repeat"] == (0.0, 2.0)
  assert stats["invalid_repeat_failed"] == (0.0, 2.0)
  assert stats["invalid_go_here"] == (0.0, 2.0)
  assert household.episode_stats(
      dataclasses.replace(episode, ground_truth={})) == {}


def test_start_places_first_searches_only_where_the_object_can_start():
  env = household.HouseholdEnv(split="eval_unseen", max_steps=30)
  totals = [0.0, 0.0]
  for seed in range(40):
    env.reset(seed)
    world = env.world
    order = household.start_places_first(world)
    places = set(hw.PLACES[world.obj_type]) - {world.target_type}
    starts = [r for r in order if hw.kind(r) in places]
    assert order[:len(starts)] == starts  # those first, then the rest
    expert = household.ExpertPlanner(
        env, peek=False, search_order=household.start_places_first)
    steps, done = [], False
    while not done:
      action = expert.act()
      _, _, done, info = env.step(action)
      steps.append((action, info["action_valid"]))
    assert info["won"]
    usual, misses = household.search_stats(env.ground_truth(),
                                           steps)["search_usual"]
    totals = [totals[0] + usual, totals[1] + misses]
  assert totals[1] >= 20 and totals[0] == totals[1]


def test_household_registers_its_episode_stats():
  assert envs.episode_stats_fn("household") is household.episode_stats
  assert envs.episode_stats_fn("sokoban") is None
