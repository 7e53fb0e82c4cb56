"""Demonstrations for the demo warm start on text Sokoban (`seed_jax.demo`).

The Sokoban counterpart of `seed_jax.demonstrations`, in the same record
format and kinds:

  * acting (no skill): an imperfect expert (the BFS solver, with a random
    move at probability `noise`) answers "<think>Step 3: left.</think>
    <action>left</action>", the step number of the prompt ("You are now at
    step 3") and the move;
  * following a skill in context: the rule-based annotator's hindsight skill
    names the level's shortest plan from the start, numbered by step ("The
    shortest plan here, move by move: 1 left, 2 left, 3 up."); with it in the
    prompt, the optimal expert plays that plan, so that every step's move is
    the one the skill numbers with that step;
  * analysis: the analysis prompt of an imperfect episode answered with the
    annotator's JSON.

Where in the household game a skill changes a few search steps, here it
decides every move, which is the case SEED's token-level signal is made for.
"""

from __future__ import annotations

import json
import random
from typing import Sequence

import jax
import numpy as np

from seed_jax import annotators
from seed_jax import rollout as rollout_lib
from seed_jax import skills
from seed_jax.demonstrations import Record, make_record, scripted_generate
from seed_jax.envs import base as envs_base
from seed_jax.envs import sokoban
from seed_jax.episodes import Episode

ENV = "sokoban"


def reply(step: int, action: str) -> str:
  """A demonstrated response at 1-based `step`: the step and the move.

  Example: reply(3, "left") -> "<think>Step 3: left.</think><action>left
  </action>" (no space before "</action>"). The step number is the one a
  numbered plan in the prompt (`annotators.plan_text`) gives the move.
  """
  return f"<think>Step {step}: {action}.</think><action>{action}</action>"


def skill_plan(skill: str) -> bool:
  """Whether an annotator's skill names the level's shortest plan."""
  return annotators.PLAN in skill


def _scripted(pool: envs_base.EnvPool, *, noise: float, seed: int,
              fixed: bool = False) -> rollout_lib.GenerateFn:
  """A GenerateFn whose replies come from the BFS solver with noise.

  `fixed`: play the level's shortest plan from the start (the one the
  annotator's skill names) instead of solving again at every step, which
  may pick another plan of the same length.
  """
  rng = random.Random(seed)

  def respond(i: int) -> str:
    env = pool.members[i]
    plan = (env.solution[len(env.actions):] if fixed
            else sokoban.expert_actions(env))
    if not plan or rng.random() < noise:
      action = rng.choice(list(sokoban.ACTIONS))
    else:
      action = plan[0]
    return reply(len(env.actions) + 1, action)

  return scripted_generate(pool, respond)


def _play(seeds: Sequence[int], *, noise: float, max_steps: int,
          history_length: int, seed: int,
          fixed: bool = False) -> list[Episode]:
  """One episode per train-split seed (groups of one)."""
  pool = envs_base.EnvPool(ENV, num_groups=len(seeds), group_size=1,
                           split="train", max_steps=max_steps)
  result = rollout_lib.rollout(
      _scripted(pool, noise=noise, seed=seed, fixed=fixed), pool, jax.random.key(0),
      env_name=ENV, max_steps=max_steps, history_length=history_length,
      group_seeds=seeds)
  return result.episodes


def demonstrations(*, num_tasks: int, seed: int = 0, max_steps: int = 15,
                   history_length: int = 2, noise: float = 0.2,
                   skill_fraction: float = 0.5, analysis_fraction: float = 0.5,
                   analysis_noise: Sequence[float] = (0.2, 0.5, 0.8),
                   analysis_max_chars: int | None = 3000,
                   task_offset: int = 0) -> list[Record]:
  """Warm-start records from Sokoban train-split levels.

  Per level (seed s of the train split):
    * "act": every step of the imperfect expert (`noise`);
    * "skill" (the first `skill_fraction` of levels, in a seeded order):
      the steps of the optimal expert from the start, the hindsight skill in
      the prompt: the imperfect episode's skill when it names the shortest
      plan (a success or a timeout), else the optimal episode's own; the
      optimal expert plays the plan that skill names;
    * "analysis" (`analysis_fraction` of levels): the analysis prompt of an
      imperfect episode (noise cycling over `analysis_noise`, so deadlocks
      and timeouts appear) -> json.dumps(annotators.annotate_strict(episode)).

  Args:
    num_tasks: train-split levels.
    seed: seeds the experts' noise and the level subsets.
    max_steps: turn limit of the demonstrated episodes (the RL run's: it
      also bounds the levels' solution length).
    history_length: k in the rollout prompts (use the RL run's).
    noise: the imperfect expert's random-move probability.
    skill_fraction: share of levels with a skill-following episode.
    analysis_fraction: share of levels with an analysis example.
    analysis_noise: noise levels of the analyzed episodes, cycled.
    analysis_max_chars: length budget of analysis prompts (RL's must match).
    task_offset: first train-split seed index.

  Returns:
    Records (stage1.FIELDS plus "kind"), acting ones first, in level order.
  """
  seeds = envs_base.split_seeds("train", num_tasks, start=task_offset)
  rng = np.random.default_rng(seed)
  with_skill = sorted(rng.permutation(num_tasks)[
      :round(skill_fraction * num_tasks)].tolist())
  analyzed = sorted(rng.permutation(num_tasks)[
      :round(analysis_fraction * num_tasks)].tolist())
  kw = dict(max_steps=max_steps, history_length=history_length)
  plain = _play(seeds, noise=noise, seed=seed, **kw)
  records = [make_record(s.prompt, s.response, ep, "act")
             for ep in plain for s in ep.steps]
  if with_skill:
    best = _play([seeds[i] for i in with_skill], noise=0.0, seed=seed + 1,
                 fixed=True, **kw)
    for i, ep in zip(with_skill, best):
      skill = annotators.annotate_strict(plain[i])["episode_skill"]
      if not skill_plan(skill):
        skill = annotators.annotate_strict(ep)["episode_skill"]
      records += [make_record(skills.build_skill_prompt(s.prompt, skill),
                          s.response, ep, "skill") for s in ep.steps]
  for j, level in enumerate(analysis_noise):
    chunk = analyzed[j::len(analysis_noise)]
    if not chunk:
      continue
    for ep in _play([seeds[i] for i in chunk], noise=level,
                    seed=seed + 2 + j, **kw):
      prompt = skills.build_analysis_prompt(ep, max_chars=analysis_max_chars)
      records.append(make_record(
          prompt.text, json.dumps(annotators.annotate_strict(ep)), ep,
          "analysis"))
  return records


def first_move_follows(episodes: Sequence[Episode],
                       member_skills: Sequence[str]) -> tuple[float, int]:
  """How often the first move is the first of the plan the skill names.

  Counts the episodes whose skill names the level's shortest plan; a first
  reply that is not a move (invalid, or "still") counts as not following.
  Returns (share, count).
  """
  hits = total = 0
  for ep, skill in zip(episodes, member_skills):
    plan = ep.ground_truth.get("solution") or []
    if skill_plan(skill) and plan and ep.steps:
      total += 1
      hits += ep.steps[0].action == plan[0]
  return (hits / total if total else 0.0), total
