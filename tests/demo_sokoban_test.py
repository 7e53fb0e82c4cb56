"""Demo warm start on text Sokoban: records, tokenizer, a miniature run."""

import json
import re

import pytest

from seed_jax import annotators
from seed_jax import demo
from seed_jax import demonstrations_sokoban as sd
from seed_jax import policies
from seed_jax import skills
from seed_jax import stage1
from seed_jax.envs import base as envs_base
from seed_jax.episodes import Episode, Step

_REPLY = re.compile(r"^<think>Step (\d+): (up|down|left|right)\.</think>"
                    r"<action>(up|down|left|right)</action>$")


@pytest.fixture(scope="module")
def records():
  return sd.demonstrations(num_tasks=12, seed=0, max_steps=15,
                           skill_fraction=0.5, analysis_fraction=0.5)


def test_records_have_the_stage1_fields_and_every_kind(records):
  kinds = [r["kind"] for r in records]
  assert kinds == sorted(kinds, key=("act", "skill", "analysis").index)
  assert kinds.count("analysis") == 6
  for r in records:
    assert set(stage1.FIELDS) <= set(r)
    assert r["family"] == "sokoban" and r["task"] in r["prompt"]


def test_replies_name_the_prompts_step_and_the_move(records):
  for r in records:
    if r["kind"] == "analysis":
      continue
    m = _REPLY.match(r["response"])
    assert m, r["response"]
    step, move, action = int(m.group(1)), m.group(2), m.group(3)
    assert move == action
    if step == 1:
      assert "You are now at step" not in r["prompt"]
    else:
      assert f"You are now at step {step} " in r["prompt"]
  assert sd.reply(3, "left") == (
      "<think>Step 3: left.</think><action>left</action>")


def test_skill_steps_play_the_plan_the_skill_names(records):
  skill_records = [r for r in records if r["kind"] == "skill"]
  assert skill_records
  episodes: list[tuple[str, list[str]]] = []  # (plan, moves), in order
  for r in skill_records:
    skill = re.search(re.escape(annotators.PLAN) + r"([^.]+)\.", r["prompt"])
    assert skill, "a skill-following prompt without a plan"
    m = _REPLY.match(r["response"])
    # The move is the one the plan numbers with the reply's step.
    assert f"{m.group(1)} {m.group(3)}" in skill.group(1).split(", ")
    if m.group(1) == "1":  # an episode's records are consecutive
      episodes.append((skill.group(1), []))
    assert episodes[-1][0] == skill.group(1)
    episodes[-1][1].append(m.group(3))
  # The moves of each episode spell out the plan its skill names.
  assert len(episodes) == 6  # skill_fraction 0.5 of 12 levels
  for plan, actions in episodes:
    assert annotators.plan_text(actions) == plan


def test_fixed_play_follows_the_level_solution_not_a_new_search():
  [ep] = sd._play(envs_base.split_seeds("train", 1, start=5), noise=0.0,
                  max_steps=15, history_length=2, seed=0, fixed=True)
  assert ep.success
  assert [s.action for s in ep.steps] == ep.ground_truth["solution"]


def test_analysis_responses_are_the_annotators_json(records):
  analyses = [r for r in records if r["kind"] == "analysis"]
  outcomes = {r["success"] for r in analyses}
  assert outcomes == {True, False}  # noise up to 0.8 fails some levels
  for r in analyses:
    parsed = skills.parse_analysis(r["response"])
    assert isinstance(parsed, skills.Analysis), r["response"]
    assert json.loads(r["response"])["episode_skill"] == parsed.skill


def test_first_move_follows_counts_only_skills_with_a_plan():
  def ep(first, solution):
    return Episode(env_name="sokoban", task="t", family="sokoban", seed=0,
                   steps=[Step(observation="o", prompt="p", response="r",
                               action=first, action_valid=True)],
                   ground_truth={"solution": solution})
  plan = annotators.PLAN + "1 left, 2 up."
  share, n = sd.first_move_follows(
      [ep("left", ["left", "up"]), ep("up", ["left", "up"]),
       ep("up", ["up"])], [plan, plan, "Never push a box into a corner."])
  assert (share, n) == (0.5, 2)


def test_grid_squares_are_tokens_of_their_own(records):
  tok = demo.demo_tokenizer(records, 512, names=demo.SOKOBAN_NAMES,
                            cells=demo.SOKOBAN_CELLS)
  grid = "######\n#_P#O#\n#X__S#"
  pieces = [tok.decode([i]) for i in tok.encode(grid, add_special_tokens=False)]
  assert pieces == list(grid)
  assert tok.decode(tok.encode(records[0]["prompt"],
                               add_special_tokens=False)) == records[0]["prompt"]
  # Without `cells`, a punctuation run swallows the row.
  plain = demo.demo_tokenizer(records, 512, names=demo.SOKOBAN_NAMES)
  assert len(plain.encode(grid, add_special_tokens=False)) < len(grid)


def test_household_only_options_and_unknown_games_are_refused():
  with pytest.raises(ValueError, match="household-only.*search_hint"):
    demo.warm_start(env="sokoban", num_tasks=2, search_hint=True)
  with pytest.raises(ValueError, match="household-only.*repeat_run"):
    demo.warm_start(env="sokoban", num_tasks=2, repeat_run=3)
  with pytest.raises(ValueError, match="household-only.*rule_repeats"):
    demo.warm_start(env="sokoban", num_tasks=2, rule_repeats=True)
  with pytest.raises(ValueError, match="household-only.*ruled_repeat"):
    demo.warm_start(env="sokoban", num_tasks=2, ruled_repeat=0.5)
  with pytest.raises(ValueError, match="household-only.*invalid_action"):
    demo.warm_start(env="sokoban", num_tasks=2, invalid_action="as_written")
  with pytest.raises(ValueError, match="no demonstrations for env 'twx'"):
    demo.warm_start(env="twx", num_tasks=2)
  with pytest.raises(ValueError, match="is not the run's env_name"):
    policies.prepare("unused", source="demo", stage1=None,
                     env_name="household", demo_kwargs={"env": "sokoban"})


def test_miniature_sokoban_warm_start_end_to_end(tmp_path):
  kwargs = dict(num_tasks=4, max_steps=4, vocab_size=384, batch_size=4,
                analysis_fraction=0.5, lm_tokens=512, eval_tasks=1,
                skill_eval_tasks=2, buckets=(512,), analysis_max_chars=1200,
                model=dict(hidden_size=32, num_layers=1, num_heads=2,
                           num_kv_heads=1, intermediate_size=64,
                           max_position_embeddings=768))
  policy = policies.prepare(tmp_path / "run", seed=0, source="demo",
                            stage1=None, env_name="sokoban",
                            demo_kwargs=kwargs, cache_dir=str(tmp_path / "c"))
  report = policy.report["warm_start"]
  assert report["records/act"] > 0 and report["records/skill"] > 0
  assert report["records/analysis"] == 2
  assert not any(k.startswith("records/after_failed/") for k in report)
  for key in ("seen/success", "unseen/success", "skills/plain_success",
              "skills/skill_success", "skills/parse_rate",
              "skills/plain_first_search_follows",
              "skills/skill_first_search_follows"):
    assert 0.0 <= report[key] <= 1.0, key
  # The evaluation played Sokoban levels, and the tokenizer is Sokoban's.
  assert report["seen/tasks/sokoban"] == 1.0
  assert policy.tokenizer.tokenize("#_X") == ["#", "_", "X"]
  [folder] = list((tmp_path / "c").iterdir())
  assert folder.name.startswith("demo_seed0_")
