"""Demonstrations for the demo warm start (`seed_jax.demo`).

Records of household train-split tasks, in Stage 1's record format, that
teach what an instruct model brings to SEED:

  * acting (no skill): an imperfect expert — it searches without peeking and
    sometimes takes a random admissible action — answers "<think>Task: put a
    mug in fridge. Find a mug.</think><action>go to cabinet 1</action>";
  * following a skill in context: the rule-based annotator's hindsight skill
    for the task (it names where things are) sits in the prompt
    (`skills.build_skill_prompt`), and a better expert, one that goes where
    the skill says, answers; so a skill changes, and improves, the action;
  * analysis: the analysis prompt of an imperfect episode answered with the
    annotator's JSON.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Callable, Sequence

import jax
import numpy as np

from seed_jax import annotators
from seed_jax import envs
from seed_jax import prompts as prompts_lib
from seed_jax import rollout as rollout_lib
from seed_jax import skills
from seed_jax.envs import base as envs_base
from seed_jax.envs import household
from seed_jax.envs import household_world as hw
from seed_jax.episodes import Episode

ENV = "household"
KINDS = ("act", "skill", "analysis")
Record = dict[str, Any]  # stage1.FIELDS plus "kind" (one of KINDS)


def reason(world: hw.World) -> str:
  """The demonstrator's short reason: the current sub-goal.

  Example: a heat task holding a cold mug 1 -> "Heat the mug 1 with the
  microwave 1."; holding nothing -> "Find a mug.".
  """
  t, fam, held = world.obj_type, world.family, world.holding
  if held is None or hw.kind(held) != t:
    placed = fam == "pick_two" and any(
        hw.kind(o) == t and hw.kind(r) == world.target_type
        for o, r in world.moved)
    return f"Find a {'second ' if placed else ''}{t}."
  need = hw.PROCESSED.get(fam)
  if need and held not in world.states[need]:
    return f"{fam.capitalize()} the {held} with the {hw.APPLIANCE[fam]} 1."
  if fam == "look_at_in_light":
    return f"Look at the {held} under the desklamp."
  prep = world.task.split(f" {t} ", 1)[1].split(" ", 1)[0]  # "in" / "on"
  return f"Put the {held} {prep} the {world.target_type}."


def reply(world: hw.World, action: str, *, hint: bool = False) -> str:
  """A demonstrated response: the task restated, the sub-goal, the action.

  Example: "<think>Task: put a mug in fridge. Find a mug.</think><action>go
  to cabinet 1</action>". Restating the task is copying the prompt's task
  line token for token, the pattern a small model learns first (induction);
  it puts the object and the target right before the decision. With `hint`,
  a search step names the place it tries ("Find a mug. Try cabinet 1."), so
  that where to look is decided in the reasoning, where a skill in the
  prompt can change it, and the action copies it.
  """
  return _reply_text(world.task, reason(world), action, hint=hint)


def _reply_text(task: str, why: str, action: str, *, hint: bool) -> str:
  if hint and why.startswith("Find ") and action.startswith("go to "):
    why += f" Try {action[len('go to '):]}."
  return f"<think>Task: {task}. {why}</think><action>{action}</action>"


def _scripted(pool: envs_base.EnvPool, make_expert: Callable[[int, Any], Any],
              *, repeat: float = 0.0, repeat_run: int = 1, seed: int = 0,
              hint: bool = False) -> rollout_lib.GenerateFn:
  """A GenerateFn whose replies come from one expert per pool member.

  With probability `repeat` a member repeats its previous reply instead
  (action and reasoning; usually invalid: "go to" where it stands, "open"
  what is open), the slip a small policy makes; the expert acts on from
  wherever that leaves it. A slip starts a run of 1 to `repeat_run` slips
  (uniform): the run goes on while the repeated action is not admissible,
  so that recovering from a try repeated several times is demonstrated, and
  a valid action is never repeated on purpose. `repeat_run` 1 draws nothing
  more (single slips, as before the option).
  `rollout` asks for the members in `pool.active()` order; the experts are
  built lazily, after the pool's reset. `hint`: see `reply`.
  """
  experts: dict[int, Any] = {}
  last: dict[int, tuple[str, str]] = {}  # member -> (reply, action)
  more: dict[int, int] = {}  # member -> slips left in its run
  rng = random.Random(seed)

  def respond(i: int) -> str:
    if i not in experts:
      experts[i] = make_expert(i, pool.members[i])
    if more.get(i) and last[i][1] not in pool.members[i].admissible_actions:
      more[i] -= 1
      return last[i][0]
    more[i] = 0  # the run is over, or the try became valid
    if i in last and rng.random() < repeat:
      if repeat_run > 1:
        more[i] = rng.randint(1, repeat_run) - 1
      return last[i][0]  # the world moved on; the reasoning did not
    action = experts[i].act()
    last[i] = (reply(pool.members[i].world, action, hint=hint), action)
    return last[i][0]

  return scripted_generate(pool, respond)


def scripted_generate(pool: envs_base.EnvPool,
                      respond: Callable[[int], str]) -> rollout_lib.GenerateFn:
  """A GenerateFn that answers each active pool member with `respond(i)`.

  `rollout` asks for the members in `pool.active()` order, one prompt each;
  the prompts themselves are not read (the experts see the envs).
  """

  def generate(prompts: Sequence[str], key: jax.Array):
    del key
    active = pool.active()
    if len(active) != len(prompts):
      raise RuntimeError("prompts do not match the pool's active members")
    return [rollout_lib.Generation(respond(i), [], [], []) for i in active]

  return generate


def _play(seeds: Sequence[int], make_expert: Callable[[int, Any], Any], *,
          max_steps: int, history_length: int, repeat: float = 0.0,
          repeat_run: int = 1, seed: int = 0, hint: bool = False,
          invalid_action: str = "no_op") -> list[Episode]:
  """One expert episode per train-split seed (household, groups of one);
  `invalid_action` as in `rollout.rollout`."""
  pool = envs_base.EnvPool(ENV, num_groups=len(seeds), group_size=1,
                           split="train", max_steps=max_steps)
  result = rollout_lib.rollout(
      _scripted(pool, make_expert, repeat=repeat, repeat_run=repeat_run,
                seed=seed, hint=hint), pool,
      jax.random.key(0), env_name=ENV, max_steps=max_steps,
      history_length=history_length, group_seeds=seeds,
      invalid_action=invalid_action)
  return result.episodes


def _names_start(skill: str, episode: Episode, detail: str) -> bool:
  """Whether `skill` names where the episode's first taken goal object was."""
  gt = episode.ground_truth
  taken = [o for o in gt.get("taken", []) if hw.kind(o) == gt["object_type"]]
  if not taken:
    return False
  where = gt["start_locations"].get(taken[0])
  return bool(where) and _names(skill, where, detail)


def _names(skill: str, place: str, detail: str = "place") -> bool:
  """Whether `skill` names `place` ("cabinet 1" but not "cabinet 10"); with
  `detail` "kind" (`annotators.DETAILS`), its kind as a search advice does:
  "cabinets" or "in a cabinet"."""
  if detail == "kind":
    k = re.escape(hw.kind(place))
    return re.search(rf"\b({k}s|in a {k})\b", skill) is not None
  return re.search(rf"\b{re.escape(place)}\b", skill) is not None


def _explained(step, skill: str, detail: str) -> bool:
  """Whether a peeking expert's step is one a reader of `skill` could take.

  A move made to find something (the task's object, a second one, or the
  desklamp to look under) goes where the peeking expert knows the thing is;
  unless the skill names that place, a skill follower could not know it, and
  such a step would teach the policy to go somewhere the skill does not say.
  Every other step is kept.
  """
  if not step.action.startswith("go to "):
    return True
  why = step.response.split("</think>", 1)[0]
  searching = re.search(r"\. (Find a |Look at the )", why)
  if searching is None:
    return True
  place = step.action[len("go to "):]
  if searching.group(1) == "Look at the " and detail == "kind":
    return _names_lamp_kind(skill, place)
  return _names(skill, place, detail)


def _names_lamp_kind(skill: str, place: str) -> bool:
  """Whether a kind-detail `skill` says the desklamp stands on a place of
  `place`'s kind ("go to a desk where desklamp 1 stands", "The desklamp 1 is
  on a desk")."""
  k = re.escape(hw.kind(place))
  return re.search(rf"\b(go to a {k} where desklamp|desklamp \d+ is on a "
                   rf"{k})\b", skill) is not None


def _taught(ep: Episode, *, slips: bool) -> list:
  """The steps of `ep` that records teach: the valid ones, and with `slips`
  also the invalid repeated tries (`household.repeated_tries`)."""
  return [s for s, again in zip(ep.steps, household.step_repeats(ep.steps))
          if s.action_valid or (slips and again)]


def make_record(prompt: str, response: str, ep: Episode,
                kind: str) -> Record:
  """One record of `kind` from a step's prompt and response in `ep`."""
  return dict(prompt=prompt, response=response, task=ep.task,
              family=ep.family, success=bool(ep.success), kind=kind)


_AFTER_FAILED = re.compile(
    r"Action \d+: '([^']*)'\]\nYou are now at step \d+ and your current "
    r"observation is: Nothing happens\.\n")
AFTER_FAILED = tuple(f"{rule}/{reply}" for rule in ("rule", "plain")
                     for reply in ("again", "other"))


def after_failed_counts(records: Sequence[Record]) -> dict[str, int]:
  """How the acting and skill records answer a failed try.

  A record counts when its prompt shows the action of the step before and
  "Nothing happens." after it (an inadmissible action sent as written).
  Keys (`AFTER_FAILED`): "rule/..." when the prompt carries
  `annotators.REPEAT_RULE`, else "plain/..."; ".../again" when the reply
  tries that action again, else ".../other". Analysis records do not count.
  Example: a run of slips "go to desk 1" where the agent stands gives
  "plain/again" for each reply inside the run and "plain/other" for the
  action after it.
  """
  counts = dict.fromkeys(AFTER_FAILED, 0)
  for r in records:
    found = r["kind"] != "analysis" and _AFTER_FAILED.search(r["prompt"])
    if found:
      again = prompts_lib.attempted_action(r["response"]) == found.group(1)
      rule = annotators.REPEAT_RULE in r["prompt"]
      counts[f"{'rule' if rule else 'plain'}/"
             f"{'again' if again else 'other'}"] += 1
  return counts


def skill_places(ep: Episode, skill: str, detail: str = "place") -> list[str]:
  """Start locations of objects of the task's type that `skill` names (by
  place, or by kind: see `_names`)."""
  gt = ep.ground_truth
  return sorted({where for obj, where in gt["start_locations"].items()
                 if hw.kind(obj) == gt["object_type"]
                 and _names(skill, where, detail)})


def _relabeled(ep: Episode, skill: str, *, hint: bool,
               detail: str = "place") -> list[Record]:
  """The search steps of `ep` answered as a skill follower would.

  With `skill` in the prompt, a step still looking for the object (reason
  "Find a <type>.") goes where the skill says an object of that type was, as
  a peeking expert would from that state; steps from the first visit there
  (or the first take) on are left out. With `detail` "kind" the skill names
  only the kind of place: a move to a place of that kind is kept, and any
  other goes to the next place of that kind the episode searches.
  """
  if detail == "kind":
    return _relabeled_by_kind(ep, skill, hint=hint)
  places = skill_places(ep, skill)
  if not places:
    return []
  t, place, out = ep.ground_truth["object_type"], places[0], []
  for s in ep.steps:
    if s.action == f"go to {place}" or s.action.startswith("take "):
      break
    admissible = s.prompt.rsplit("admissible actions", 1)[-1]
    if (not s.action_valid or f"Find a {t}." not in s.response
        or f"'go to {place}'" not in admissible):
      continue
    out.append(_skill_search(ep, s, skill, place, hint))
  return out


def _skill_search(ep: Episode, step, skill: str, place: str,
                  hint: bool) -> Record:
  """A search move to `place` from `step`'s state, `skill` in the prompt."""
  t = ep.ground_truth["object_type"]
  return make_record(skills.build_skill_prompt(step.prompt, skill),
                     _reply_text(ep.task, f"Find a {t}.", f"go to {place}",
                                 hint=hint), ep, "skill")


def _relabeled_by_kind(ep: Episode, skill: str, *,
                       hint: bool) -> list[Record]:
  """`_relabeled` for a skill that names kinds of places."""
  t = ep.ground_truth["object_type"]
  if not skill_places(ep, skill, "kind"):
    return []
  searches = []  # (step index, place) of the episode's search moves
  for i, s in enumerate(ep.steps):
    if s.action.startswith("take "):
      break
    if (s.action_valid and f"Find a {t}." in s.response
        and s.action.startswith("go to ")):
      searches.append((i, s.action[len("go to "):]))
  out = []
  for j, (i, place) in enumerate(searches):
    s = ep.steps[i]
    admissible = s.prompt.rsplit("admissible actions", 1)[-1]
    to = next((p for _, p in searches[j:] if _names(skill, p, "kind")
               and f"'go to {p}'" in admissible), None)
    if to is not None:
      out.append(_skill_search(ep, s, skill, to, hint))
  return out


def demonstrations(*, num_tasks: int, seed: int = 0, max_steps: int = 20,
                   history_length: int = 2, noise: float = 0.2,
                   shuffle_search: bool = False, skill_fraction: float = 0.5,
                   skill_noise: float = 0.0, analysis_fraction: float = 0.5,
                   analysis_noise: Sequence[float] = (0.2, 0.5, 0.8),
                   analysis_max_chars: int | None = 3000,
                   repeat: float = 0.1, repeat_run: int = 1,
                   task_offset: int = 0,
                   search_hint: bool = False, skill_relabel: bool = False,
                   rule_detail: str = "place",
                   rule_repeats: bool = False,
                   ruled_repeat: float | None = None,
                   invalid_action: str = "no_op") -> list[Record]:
  """Warm-start records from household train-split tasks.

  Per task (seed s of the train split):
    * "act": every valid step of an imperfect expert (no peeking, `noise`,
      and `repeat` slips, whose no-op and its answer the next prompts show,
      so that recovering is demonstrated) with the plain rollout prompt. A slip
      that is still a valid action (heating an object again, "look") is a
      valid step and is kept, its reasoning that of the step before;
    * "skill" (the first `skill_fraction` of tasks, in a seeded order): the
      valid steps of a better expert (peeking, `skill_noise`, slips as
      above) whose prompt carries
      the annotator's skill for the task: the hindsight skill of the imperfect
      episode when it names where the better expert finds the object, else
      that of the better expert's own episode; a search move to a place the
      skill does not name (a peeked second object or lamp) is left out;
    * "skill", with `skill_relabel` (every task): the imperfect expert's
      search steps, relabeled with its episode's hindsight skill in the
      prompt and a move to where that skill says the object was;
    * "analysis" (`analysis_fraction` of tasks): the analysis prompt of an
      imperfect episode (noise cycling over `analysis_noise`, so failures
      appear too) -> json.dumps(annotators.annotate_strict(episode)).

  With `rule_repeats` the annotator's skills end with
  `annotators.REPEAT_RULE` when their episode tried an action again right
  after it (a slip), and the rule is what a skill changes: the "act" records
  also keep the slips (the invalid repeated tries, runs of up to
  `repeat_run`), as the small policy makes them; a skill-following episode
  whose imperfect episode had a slip has the rule added to its skill and
  makes single slips only, each followed by the expert's action, and keeps
  valid steps only; one without keeps its slips like the "act" records. So
  without the rule a failed try is sometimes tried again, with it never.
  `ruled_repeat` sets the slip rate of the followers with the rule: each of
  their slips shows a failed try in a prompt with the rule, and the action
  after it is one of the demonstrations of the rule followed.

  Args:
    num_tasks: train-split tasks.
    seed: seeds the experts' noise and the task subsets.
    max_steps: turn limit of the demonstrated episodes.
    history_length: k in the rollout prompts (use the RL run's).
    noise: the imperfect expert's random-action probability.
    shuffle_search: the imperfect expert searches in a random order.
    skill_fraction: share of tasks with a skill-following episode.
    skill_noise: the skill-following expert's random-action probability.
    analysis_fraction: share of tasks with an analysis example.
    analysis_noise: noise levels of the analyzed episodes, cycled.
    analysis_max_chars: length budget of analysis prompts (RL's must match).
    repeat: probability of repeating the previous action (see `_scripted`).
    repeat_run: most slips in a row, each the same try, while it stays
      invalid (see `_scripted`).
    task_offset: first train-split seed index.
    search_hint: search steps name the place they try (see `reply`).
    skill_relabel: add the relabeled search steps described above.
    rule_detail: how the annotator's skills say where things were
      (`annotators.DETAILS`); skill following reads them the same way.
    rule_repeats: skills name repeated tries and are followed (above).
    ruled_repeat: the slip rate of the skill followers with the rule
      (None: `repeat`); only with `rule_repeats`.
    invalid_action: what a slip's inadmissible action sends
      (`prompts.INVALID_ACTIONS`; the RL run's): "no_op", and the next
      prompts show the no-op; "as_written", and they show the action tried
      and "Nothing happens.", so that a rule about it can be followed.

  Returns:
    Records (stage1.FIELDS plus "kind"), acting ones first, in task order.
  """
  annotators.check_detail(rule_detail, ENV)
  if isinstance(repeat_run, bool) or not isinstance(repeat_run, int) or (
      repeat_run < 1):
    raise ValueError(f"repeat_run must be an int >= 1, got {repeat_run!r}")
  prompts_lib.check_invalid_action(invalid_action)
  if ruled_repeat is not None:
    if not rule_repeats:
      raise ValueError("ruled_repeat is the slip rate of skill followers "
                       "with the repeat rule; set rule_repeats=True with it")
    if (isinstance(ruled_repeat, bool)
        or not isinstance(ruled_repeat, (int, float))
        or not 0.0 <= ruled_repeat < 1.0):
      raise ValueError(f"ruled_repeat must be in [0, 1), got {ruled_repeat!r}")
  annotate = lambda ep: annotators.annotate_strict(ep, rule_detail,
                                                   repeats=rule_repeats)
  seeds = envs_base.split_seeds("train", num_tasks, start=task_offset)
  rng = np.random.default_rng(seed)
  order = rng.permutation(num_tasks)
  with_skill = set(order[:round(skill_fraction * num_tasks)].tolist())
  analyzed = set(rng.permutation(num_tasks)[
      :round(analysis_fraction * num_tasks)].tolist())

  def expert(peek, p, shuffle=False, salt=0):
    return lambda i, env: envs.make_expert(
        env, peek=peek, noise=p, shuffle_search=shuffle,
        seed=seed * 1_000_003 + env.world.seed * 7 + salt)

  kw = dict(max_steps=max_steps, history_length=history_length,
            repeat=repeat, repeat_run=repeat_run, hint=search_hint,
            invalid_action=invalid_action)
  plain = _play(seeds, expert(False, noise, shuffle_search), seed=seed, **kw)
  records = [make_record(s.prompt, s.response, ep, "act")
             for ep in plain for s in _taught(ep, slips=rule_repeats)]
  ruled = {i for i in with_skill
           if rule_repeats and annotators.has_repeated_try(plain[i])}
  ruled_rate = repeat if ruled_repeat is None else ruled_repeat
  for idx, run, rate in ((sorted(with_skill - ruled), repeat_run, repeat),
                         (sorted(ruled), 1, ruled_rate)):
    if not idx:
      continue
    better = _play([seeds[i] for i in idx], expert(True, skill_noise, salt=1),
                   seed=seed + 1, **{**kw, "repeat_run": run, "repeat": rate})
    for i, ep in zip(idx, better):
      skill = annotators.annotate_strict(plain[i], rule_detail)[
          "episode_skill"]
      if not _names_start(skill, ep, rule_detail):
        skill = annotators.annotate_strict(ep, rule_detail)["episode_skill"]
      if i in ruled:
        skill = annotators.with_repeat_rule(skill)
      records += [make_record(skills.build_skill_prompt(s.prompt, skill),
                              s.response, ep, "skill")
                  for s in _taught(ep, slips=rule_repeats and i not in ruled)
                  if _explained(s, skill, rule_detail)]
  if skill_relabel:
    for ep in plain:
      records += _relabeled(ep, annotate(ep)["episode_skill"],
                            hint=search_hint, detail=rule_detail)
  idx = sorted(analyzed)
  for j, level in enumerate(analysis_noise):
    chunk = idx[j::len(analysis_noise)]
    if not chunk:
      continue
    eps = _play([seeds[i] for i in chunk],
                expert(False, level, shuffle_search, salt=2 + j),
                seed=seed + 2 + j, **kw)
    for ep in eps:
      prompt = skills.build_analysis_prompt(ep, max_chars=analysis_max_chars)
      records.append(make_record(
          prompt.text, json.dumps(annotate(ep)), ep,
          "analysis"))
  return records
