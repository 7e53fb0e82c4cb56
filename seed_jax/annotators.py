"""Rule-based hindsight teacher: episode summary and skill from ground truth.

For the built-in environments the teacher of Stage 1 (docs/algorithm.md §2)
can be a set of rules: the environment recorded hidden facts the agent never
saw (where the object was, which push killed the level), so a failure's
decisive observation can be named exactly. Output matches the analysis JSON:
{"episode_summary": ..., "episode_skill": ...}; a success yields a reusable
workflow, a failure avoidance rules. Deterministic; skills stay short.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from seed_jax.envs import household
from seed_jax.episodes import Episode

MAX_SKILL_CHARS = 300
# How household skills say where things were: "place" names it ("cabinet
# 3"), "kind" only its kind ("a cabinet"), so that a skill reads as advice
# for other layouts, where the numbered place means nothing.
DETAILS = ("place", "kind")
# The rule `annotate(repeats=True)` adds for an episode that tried an action
# again right after it, the second try invalid (`household.repeated_tries`).
REPEAT_RULE = ("You tried an action again after it did nothing; when nothing "
               "happens, do something else.")
_PAST = {"clean": "cleaned", "heat": "heated", "cool": "cooled"}


def _kind(name: str) -> str:
  return name.rsplit(" ", 1)[0]


def _invalid_count(ep: Episode) -> int:
  return sum(not s.action_valid for s in ep.steps)


def _invalid_note(ep: Episode) -> str:
  """A rule about invalid replies when they made up a third of the episode."""
  n = _invalid_count(ep)
  if ep.steps and 3 * n >= len(ep.steps):
    return (f" {n} of your {len(ep.steps)} actions were invalid; copy one "
            "admissible action exactly.")
  return ""


def _clip(text: str, limit: int = MAX_SKILL_CHARS) -> str:
  if len(text) <= limit:
    return text
  return text[:limit - 3].rstrip() + "..."


def has_repeated_try(episode: Episode) -> bool:
  """Whether some invalid step of `episode` tried the action of the step
  before (`household.repeated_tries`: "go to desk 1" where it stands, or a
  "take" that did nothing tried again)."""
  return any(household.step_repeats(episode.steps))


def annotate(episode: Episode, detail: str = "place", *,
             repeats: bool = False) -> dict[str, str] | None:
  """Writes the hindsight analysis of one episode.

  Args:
    episode: a finished episode with `ground_truth` from its environment.
    detail: one of `DETAILS` ("kind": household only).
    repeats: end the skill with `REPEAT_RULE` when the episode has a
      repeated try (`has_repeated_try`), success or failure; the rest of the
      skill is cut to leave it room.

  Returns:
    None when there is nothing to ground an analysis in (`episode.error` is
    set, or the episode has no `ground_truth` because the environment's
    ground_truth() raised): callers count it as no reply. Else
    {"episode_summary": str, "episode_skill": str}. Example (household clean
    task, failure): {"episode_summary": "Failure after 30 steps on 'put a
    clean mug in coffeemachine': the mug was never found.",
    "episode_skill": "The mug was in cabinet 3, which you never checked; visit
    unexplored cabinets before revisiting places."}

  Raises:
    ValueError: an environment without rules, or a `detail` it cannot give.
  """
  check_env(episode.env_name, "annotate")
  check_detail(detail, episode.env_name)
  if episode.error or not episode.ground_truth:
    return None  # the environment raised, or its ground_truth() did
  summary, skill = _RULES[episode.env_name](episode, episode.ground_truth,
                                            detail)
  skill = (with_repeat_rule(skill) if repeats and has_repeated_try(episode)
           else _clip(skill))
  return {"episode_summary": summary, "episode_skill": skill}


def with_repeat_rule(skill: str) -> str:
  """`skill` ended with `REPEAT_RULE`, cut first to leave it room."""
  rule = " " + REPEAT_RULE
  return _clip(skill, MAX_SKILL_CHARS - len(rule)) + rule


def check_env(env_name: str, who: str) -> None:
  """Raises ValueError, naming `who`, when `env_name` has no rules."""
  if env_name not in _RULES:
    raise ValueError(f"{who} needs a game with annotation rules "
                     f"{list(_RULES)}, got {env_name!r}")


def check_detail(detail: str, env_name: str | None = None,
                 name: str = "rule detail") -> None:
  """Raises ValueError when `detail` is not one of `DETAILS` or (other than
  "place") is asked of a game other than the household one (when `env_name`
  is given). `name` is what the messages call it (a config field)."""
  if detail not in DETAILS:
    raise ValueError(f"{name} must be one of {DETAILS}, got {detail!r}")
  if env_name is not None and detail != "place" and env_name != "household":
    raise ValueError(f"{name} {detail!r} is for the household game, "
                     f"not {env_name!r}")


def annotate_strict(episode: Episode, detail: str = "place", *,
                    repeats: bool = False) -> dict[str, str]:
  """`annotate` for scripted episodes, which must have ground truth.

  Raises:
    RuntimeError: naming the episode, when `annotate` returns None.
  """
  analysis = annotate(episode, detail, repeats=repeats)
  if analysis is None:
    raise RuntimeError(
        f"{episode.env_name} seed {episode.seed}: no ground truth to annotate "
        f"({episode.error or 'its ground_truth() raised'})")
  return analysis


class RuleTeacher:
  """`annotate` behind the interface of a teacher (`OpenAITeacher`), so that
  the trainer's external analyzer can use it: an oracle analyst, since the
  rules read what the agent never saw. Writes episode skills only.

  Attributes:
    mode, max_critical_steps: the analysis settings the trainer checks
      against its RL config (critical steps are never written).
    detail: how the skills say where things were (one of `DETAILS`).
    repeats: skills end with `REPEAT_RULE` after a repeated try (`annotate`).
  """

  def __init__(self, mode: str = "episode_only", max_critical_steps: int = 3,
               detail: str = "place", *, repeats: bool = False):
    check_detail(detail)  # the game is checked where it is known
    self.mode, self.max_critical_steps = mode, max_critical_steps
    self.detail, self.repeats = detail, repeats

  def annotate_many(self, episodes: Sequence[Episode],
                    prompts: Sequence[str] | None = None
                    ) -> list[dict[str, str] | None]:
    """One `annotate` per episode, in order (`prompts` are not needed); None
    for an episode without ground truth."""
    del prompts
    return [annotate(ep, self.detail, repeats=self.repeats)
            for ep in episodes]


# -- household -------------------------------------------------------------------


def _household(ep: Episode, gt: dict[str, Any],
               detail: str) -> tuple[str, str]:
  fam, t, target = gt["family"], gt["object_type"], gt["target_type"]
  at = ((lambda place: place) if detail == "place"
        else lambda place: f"a {_kind(place)}")
  start = gt["start_locations"]
  taken = [o for o in gt["taken"] if _kind(o) == t]
  # A success is told from the objects that met the goal (an object taken
  # first may have been put back); a failure from the first one taken.
  won = [o for o in _goal_met_by(gt) if o in taken] if ep.success else []
  first = (won or taken)[0] if taken else _nearest_miss(gt)
  where = start.get(first) or next(iter(start.values()))
  opened = ""
  if where in gt["closed_at_start"]:
    opened = f"open {where}, " if detail == "place" else "open it, "
  head = f"{ep.length} steps on '{ep.task}'"
  if ep.success:
    here = f"; here it was in {where}" if detail == "place" else ""
    find = f"find the {t} (check {_kind(where)}s first{here}), {opened}take it"
    if fam == "look_at_in_light":
      skill = (f"To look at an object under the lamp: {find}, go to "
               f"{at(gt['lamp_location'])} where desklamp 1 stands and use "
               "the desklamp while holding it.")
    elif fam == "pick_two":
      second = start[won[1]] if len(won) > 1 else None
      here = f" (here it was in {at(second)})" if second else ""
      skill = (f"To place two objects: {find}, move it to a {target}, then "
               f"find a second {t}{here} and move it to the same {target}.")
    else:
      process = ""
      if fam in _PAST:
        process = f", go to {gt['appliance']} and {fam} it"
      skill = (f"To {ep.task}: {find}{process}, then go to the {target} and "
               "move it there.")
    return f"Success in {head}.", skill
  rest, skill = _household_failure(ep, gt, taken, where, at)
  return f"Failure after {head}: {rest}", skill


def _nearest_miss(gt: dict[str, Any]) -> str:
  """Of the goal objects none of which was taken, the one the agent came
  nearest to: one it saw (its place visited, and opened if closed), else one
  in a closed place it reached, else the first by name; ties by name."""
  def missed_at(obj):
    where = gt["start_locations"][obj]
    if where not in gt["visited"]:
      return 2
    closed = where in gt["closed_at_start"] and where not in gt["opened"]
    return 1 if closed else 0
  return min(sorted(gt["start_locations"]), key=missed_at)


def _household_failure(ep: Episode, gt: dict[str, Any], taken: list[str],
                       where: str, at: Callable[[str], str]
                       ) -> tuple[str, str]:
  """The decisive missed fact, from the earliest stage the agent missed;
  `at` says where a thing was ("cabinet 3", or "a cabinet").

  Returns:
    (rest of the summary, skill).
  """
  fam, t, target = gt["family"], gt["object_type"], gt["target_type"]
  note = _invalid_note(ep)
  if not taken:
    if where not in gt["visited"]:
      closed = " (closed)" if where in gt["closed_at_start"] else ""
      return (f"the {t} was never found.",
              f"The {t} was in {at(where)}{closed}, which you never checked; "
              f"visit unexplored {_kind(where)}s before revisiting places."
              + note)
    if where in gt["closed_at_start"] and where not in gt["opened"]:
      return (f"the {t} was never found.",
              f"The {t} was in {at(where)}, which you reached but never "
              "opened; open closed receptacles to look inside before moving "
              "on."
              + note)
    return (f"the {t} was seen but never taken.",
            f"You saw the {t} in {at(where)} but never took it; take the "
            f"{t} as soon as you see it." + note)
  if fam in _PAST:
    found = _processing_failure(gt, note)
    if found:
      return found
  if fam == "look_at_in_light":
    return ("the object was never examined under the lamp.",
            f"The desklamp 1 is on {at(gt['lamp_location'])}; carry the {t} "
            "there and use the desklamp 1 while holding it." + note)
  placed = [(o, r) for o, r in gt["moved"]
            if _kind(o) == t and _kind(r) == target]
  left = _left_in_targets(gt)
  if fam == "pick_two" and len(left) > 1:
    (a, ra), (b, rb) = left[:2]  # one per target: two in one is a success
    return (f"the two {t}s went to different {target}s.",
            f"You put {a} in {ra} and {b} in {rb}; both {t}s must end in "
            f"the same {target}, so carry the second to the first." + note)
  if fam == "pick_two" and placed:
    others = sorted(r for o, r in gt["start_locations"].items()
                    if o not in taken)
    hint = f"; another {t} was in {at(others[0])}" if others else ""
    if not left:  # every placed one was taken out again
      obj, r = placed[0]
      return (f"no {t} was left in the {target}.",
              f"You put {obj} in {r}, then took it out again{hint}. Put two "
              f"{t}s in the same {target} and leave them there." + note)
    return (f"only one {t} reached the {target}.",
            f"You placed one {t} in {left[0][1]}{hint}. Put two {t}s in the "
            f"same {target}, one trip each." + note)
  return (f"the {t} never reached the {target}.",
          f"You had the {t} but never moved it to a {target}; go to "
          f"{gt['target_receptacles'][0]} (open it if closed) and move the "
          f"{t} there." + note)


def _processing_failure(gt: dict[str, Any],
                        note: str) -> tuple[str, str] | None:
  """The missed processing step of a clean/heat/cool task, or None when an
  object of the goal type was processed as the task asks (`processed`
  names the object, so processing another object does not count).

  Returns:
    (rest of the summary, skill), or None.
  """
  fam, t, target = gt["family"], gt["object_type"], gt["target_type"]
  appliance = gt["appliance"]
  goal = [(verb, obj, r) for verb, obj, r in gt["processed"]
          if _kind(obj) == t]
  done = {obj for verb, obj, _ in goal if verb == fam}
  if not done:
    wrong = [r for verb, _, r in goal if verb != fam]
    if wrong:
      other = _kind(wrong[0])
      return (f"the {t} was taken to the wrong appliance.",
              f"A {fam} task needs {appliance}, not the {other}; {fam} the "
              f"{t} with {appliance} before placing it." + note)
    others = [obj for verb, obj, _ in gt["processed"] if verb == fam]
    instead = f" (you {_PAST[fam]} the {others[0]} instead)" if others else ""
    return (f"the {t} was never {_PAST[fam]}.",
            f"You took the {t} but never {_PAST[fam]} it{instead}; go to "
            f"{appliance} and {fam} it there before placing it." + note)
  placed = [(o, r) for o, r in gt["moved"]
            if _kind(o) == t and _kind(r) == target and o not in done]
  if placed:
    (obj, r), good = placed[-1], sorted(done)[0]
    return (f"the {t} placed in the {target} was never {_PAST[fam]}.",
            f"You {_PAST[fam]} {good} but put {obj}, never {_PAST[fam]}, in "
            f"{r}; place the very {t} you {_PAST[fam]}." + note)
  return None


def _final_places(gt: dict[str, Any]) -> dict[str, str | None]:
  """{goal object: the receptacle it ends in, None while held}: where it
  started, then the agent's moves."""
  where = dict(gt["start_locations"])
  where.update((o, r) for o, r in gt["moved"] if o in where)
  if gt.get("holding") in where:
    where[gt["holding"]] = None
  return where


def _left_in_targets(gt: dict[str, Any]) -> list[tuple[str, str]]:
  """Goal objects the agent moved to a target receptacle and left there
  (object, receptacle), in the order first moved."""
  where = _final_places(gt)
  moved = dict.fromkeys(o for o, _ in gt["moved"] if o in where)
  return [(o, where[o]) for o in moved
          if where[o] is not None and _kind(where[o]) == gt["target_type"]]


def _goal_met_by(gt: dict[str, Any]) -> list[str]:
  """The goal objects that meet the goal at the end, in the order first
  taken: the pair in one target (pick_two), the one held (look_at_in_light),
  else one in a target (for clean/heat/cool, processed as asked); [] when
  the goal is not met."""
  fam, taken = gt["family"], gt["taken"]
  where = _final_places(gt)
  order = sorted(where, key=lambda o: (o not in taken,
                                       taken.index(o) if o in taken else 0, o))
  if fam == "look_at_in_light":
    return [o for o in order if where[o] is None]
  done = {o for verb, o, _ in gt["processed"] if verb == fam}
  for r in gt["target_receptacles"]:
    here = [o for o in order
            if where[o] == r and (fam not in _PAST or o in done)]
    if len(here) >= (2 if fam == "pick_two" else 1):
      return here
  return []


# -- sokoban -----------------------------------------------------------------------


PLAN = "The shortest plan here, move by move: "


def plan_text(actions: list[str]) -> str:
  """A move list numbered from step 1: ["up", "up", "left"] -> "1 up, 2 up,
  3 left". The numbers are the rollout prompt's step numbers ("You are now at
  step 3"; step 1's prompt has no such line), so that a reader following the
  plan finds its move by them."""
  return ", ".join(f"{i} {a}" for i, a in enumerate(actions, 1))


def _sokoban(ep: Episode, gt: dict[str, Any],
             detail: str) -> tuple[str, str]:
  del detail  # "place", its only one (`check_detail`)
  n, best = ep.length, gt["solution_length"]
  head = f"{n} steps on '{ep.task}'"
  plan = f"{PLAN}{plan_text(gt['solution'])}."
  if ep.success:
    return (f"Success in {head} (shortest solution {best}).",
            "Walk to the side of the box opposite its target, push it "
            "straight toward the target, and never push a box into a corner "
            f"that is not a target. {plan}")
  k = gt["first_unsolvable_step"]
  if k is not None and gt["box"] is None:
    # No box moved at that step: a walk cannot make a level unsolvable, so
    # the solver hit its state cap there and the verdict is not a fact.
    return (f"Failure after {head}: the level was not solved.",
            "Walk behind the box on the side opposite its target and push it "
            f"straight there. {plan}")
  if k is not None and gt["deadlock_kind"] == "on_target":
    r, c = gt["box"]
    act = gt["first_unsolvable_action"]
    return (f"Failure after {head}: step {k + 1} ({act}) made the level "
            "unsolvable.",
            f"Step {k + 1} ({act}) pushed a box onto the target at row "
            f"{r + 1}, column {c + 1}, where it blocks the other boxes, and "
            "the level became unsolvable. Fill the targets in an order that "
            "keeps the way to the others open.")
  if k is not None:
    act = gt["first_unsolvable_action"]
    return (f"Failure after {head}: step {k + 1} ({act}) made the level "
            "unsolvable.", _fatal_push(gt, ep.steps[k].observation))
  if 2 * _invalid_count(ep) > max(n, 1):
    return (f"Failure after {head}: most replies had no valid action.",
            "Answer with exactly one of up, down, left, right inside <action> "
            f"</action>; this level needs only {best} moves.")
  return (f"Failure after {head}: the level stayed solvable but time ran out.",
          "Walk behind the box on the side opposite its target and push it "
          f"straight there instead of wandering. {plan}")


_STUCK = {  # how a box off target was left, proven: (where, rule)
    "corner": ("into a corner", "Never push a box into a corner that is not a "
               "target."),
    "wall": ("against a wall", "Never push a box against a wall unless a "
             "target lies along that wall."),
    "other": ("into a stuck position", "Never push a box where it cannot "
              "reach a target."),
}


def _fatal_push(gt: dict[str, Any], grid: str) -> str:
  """The skill of the push that made the level unsolvable, the box left off
  any target. Blames the box's place (a wall, a stuck position) only when
  that box, alone, could no longer reach a target (a corner always); when it
  still could, the level died of the player's way or the other boxes.

  Args:
    gt: the sokoban ground truth, `first_unsolvable_step` set.
    grid: the observation the push was made from (its walls and targets).
  """
  k, act = gt["first_unsolvable_step"], gt["first_unsolvable_action"]
  r, c = gt["box"]
  head = f"Step {k + 1} ({act}) pushed"
  kind = gt["deadlock_kind"]
  reach = False if kind == "corner" else _box_can_reach_target(grid, gt["box"])
  if reach is False:
    spot, rule = _STUCK.get(kind, _STUCK["other"])
    return (f"{head} the box {spot} at row {r + 1}, column {c + 1}, off any "
            f"target, and the level became unsolvable. {rule}")
  at = f"to row {r + 1}, column {c + 1}, off any target"
  if reach is None:  # `grid` is not a level: no cause is known
    return (f"{head} the box {at}, and the level became unsolvable. Before "
            "each push, check that every box can still reach a target.")
  if gt["num_boxes"] == 1:
    return (f"{head} the box {at}, from where you could no longer get behind "
            "it to push it onto a target, and the level became unsolvable. "
            "Before each push, check that you can still walk to every side "
            "the box must be pushed from.")
  return (f"{head} a box {at}, from where that box alone could still reach a "
          "target but not all boxes could, and the level became unsolvable. "
          "Push in an order that keeps each box's way and your own clear.")


def _box_can_reach_target(grid: str, box: tuple[int, int]) -> bool | None:
  """Whether `box`, alone on the level drawn in `grid` (the text symbols of
  `sokoban`), could be pushed onto a target by a player free to stand on any
  floor: False proves the box stuck off target, whatever the player and the
  other boxes do. None when `grid` is not a level with floor at `box`.

  Example: grid "######\\n#_XPO#\\n#____#\\n######", box (1, 2) -> True
  (pushed right from (1, 1)); box (1, 1) -> False (a corner).
  """
  rows = grid.split("\n")
  if len({len(row) for row in rows}) != 1 or set(grid) - set("#_OX√PS\n"):
    return None
  def free(p):
    return (0 <= p[0] < len(rows) and 0 <= p[1] < len(rows[0])
            and rows[p[0]][p[1]] != "#")
  if not free(box):
    return None
  seen, todo = {tuple(box)}, [tuple(box)]
  while todo:
    r, c = todo.pop()
    if rows[r][c] in "O√S":
      return True
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
      to = (r + dr, c + dc)
      if free(to) and free((r - dr, c - dc)) and to not in seen:
        seen.add(to)
        todo.append(to)
  return False


# gym_sokoban's ground_truth() is the built-in sokoban's (its `_as_builtin`).
_RULES = {"household": _household, "sokoban": _sokoban,
          "gym_sokoban": _sokoban}
ENVS = tuple(_RULES)  # the environments with rules
