"""household: an ALFWorld-style text game, generated from a seed, with an expert.

Observations and actions use ALFWorld's wording:

  You are in the middle of a room. Looking quickly around you, you see a
  cabinet 1, a countertop 1, a fridge 1, and a sinkbasin 1.

  Your task is to: put a clean mug in coffeemachine.

Actions: "go to X", "open X", "close X", "take O from R", "move O to R" (also
"put O in/on R"), "clean O with sinkbasin 1", "heat O with microwave 1",
"cool O with fridge 1", "use desklamp 1", "examine X", "look", "inventory".
Reward 10 on success; the episode ends on success or after max_steps steps.
Task generation and the seen/unseen rule live in household_world.
"""

from __future__ import annotations

import collections
import random
import re
from typing import Any, Callable, Sequence

from seed_jax import prompts
from seed_jax.envs import base
from seed_jax.envs import household_world as hw

LAMP = "desklamp 1"
_PUT = re.compile(r"^put (.+?) (?:in/on|in|on) (.+)$")


def _listing(things: list[str]) -> str:
  """ALFWorld's list wording: "a apple 1, and a mug 2" (articles as ALFWorld)."""
  if not things:
    return "nothing"
  items = [f"a {t}" for t in things]
  if len(items) == 1:
    return items[0]
  return ", ".join(items[:-1]) + ", and " + items[-1]


class HouseholdEnv:
  """An ALFWorld-style household task; see the module docstring.

  Args:
    split: "train"/"eval_seen" draw seen tasks, "eval_unseen" unseen ones.
    max_steps: steps before the episode is cut (the paper uses 30).
    families: task families to draw from (default: all six).

  Raises:
    ValueError: an unknown split or family, no family, or max_steps < 1.
  """

  name = "household"
  no_op = "look"

  def __init__(self, *, split: str = "train", max_steps: int = 30,
               families: tuple[str, ...] = hw.FAMILIES) -> None:
    base.check_split(split)
    if max_steps < 1:
      raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    if not families:
      raise ValueError(f"families is empty; give some of {hw.FAMILIES}")
    for f in families:
      if f not in hw.FAMILIES:
        raise ValueError(f"unknown family {f!r}; known: {hw.FAMILIES}")
    self.unseen = split == "eval_unseen"
    self.max_steps = max_steps
    self.families = tuple(families)
    self.world: hw.World | None = None
    self.steps = 0
    self.done = False
    self._admissible: list[str] = []

  # -- protocol ---------------------------------------------------------------

  @property
  def task(self) -> str:
    """The task, e.g. "put a clean mug in coffeemachine"; "" before reset."""
    return self.world.task if self.world else ""

  @property
  def family(self) -> str:
    return self.world.family if self.world else ""

  @property
  def admissible_actions(self) -> list[str]:
    """The actions the env accepts now (as in the last info)."""
    return list(self._admissible)

  @property
  def _w(self) -> hw.World:
    if self.world is None:
      raise RuntimeError("call reset(seed) first")
    return self.world

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates the task of `seed`; returns (observation, info)."""
    return self.reset_to(
        hw.generate(seed, unseen=self.unseen, families=self.families))

  def reset_to(self, world: hw.World) -> tuple[str, dict[str, Any]]:
    """Starts from a copy of a given (e.g. hand-built) world, which is left
    as it is (so it can be replayed); returns (obs, info)."""
    self.world = world.copy()
    self._start = world.copy()  # for ground_truth()
    self.steps = 0
    self.done = False
    obs = f"{self._room_view()}\n\nYour task is to: {world.task}."
    return obs, self._info(valid=True)

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Applies one text action; invalid ones answer "Nothing happens."."""
    w = self._w
    if self.done:
      return "Nothing happens.", 0.0, True, self._info(valid=False)
    action = " ".join(str(action).lower().split())
    self.steps += 1
    obs, valid = self._apply(action)
    won = w.goal_met()
    self.done = won or self.steps >= self.max_steps
    return obs, 10.0 if won else 0.0, self.done, self._info(valid=valid)

  def ground_truth(self) -> dict[str, Any]:
    """Hidden facts: where the goal objects started, what the agent did.

    Returns:
      dict with family, object_type, target_type, room, start_locations
      (goal object -> receptacle at reset), closed_at_start, appliance,
      lamp_location, expert_length (expert steps from the start), and the
      agent's visited / opened / taken / used ("heat microwave 1") /
      processed ([verb, object, appliance], e.g. ["heat", "mug 1",
      "microwave 1"]) / moved ([object, receptacle]) lists and final holding.
    """
    w, start = self._w, self._start
    goal = start.instances(start.obj_type)
    return {
        "family": w.family, "object_type": w.obj_type,
        "target_type": w.target_type, "room": w.room, "layout": w.layout,
        "start_locations": {o: start.where(o) for o in goal},
        "closed_at_start": sorted(start.closed, key=hw.name_key),
        "appliance": (f"{hw.APPLIANCE[w.family]} 1"
                      if w.family in hw.APPLIANCE else None),
        "lamp_location": w.lamp_at,
        "target_receptacles": [r for r in w.receptacles
                               if hw.kind(r) == w.target_type],
        "expert_length": len(_plan(start, None)),
        "visited": list(w.visited), "opened": list(w.opened),
        "taken": list(w.taken), "used": list(w.used),
        "processed": [list(p) for p in w.processed],
        "moved": [list(m) for m in w.moved], "holding": w.holding,
        "won": w.goal_met(),
    }

  # -- observations -----------------------------------------------------------

  def _room_view(self) -> str:
    return ("You are in the middle of a room. Looking quickly around you, you "
            f"see {_listing(self._w.receptacles)}.")

  def _visible(self, r: str) -> list[str]:
    w = self._w
    return ([LAMP] if w.lamp_at == r else []) + w.contents[r]

  def _describe(self, r: str) -> str:
    """What is seen at a receptacle: "On the desk 1, you see ..."."""
    if r in self._w.closed:
      return f"The {r} is closed."
    seen = _listing(self._visible(r))
    if hw.kind(r) in hw.OPENABLE:
      return f"The {r} is open. In it, you see {seen}."
    return f"On the {r}, you see {seen}."

  def _info(self, *, valid: bool) -> dict[str, Any]:
    self._admissible = [] if self.done else self._admissible_actions()
    return {"won": self._w.goal_met(), "admissible_actions": self._admissible,
            "action_valid": valid, "task": self.task, "family": self.family}

  def _admissible_actions(self) -> list[str]:
    w = self._w
    acts = [f"go to {r}" for r in w.receptacles if r != w.location]
    acts += ["inventory", "look"]
    here, held = w.location, w.holding
    if held:
      acts.append(f"examine {held}")
    if here:
      acts.append(f"examine {here}")
      if hw.kind(here) in hw.OPENABLE:
        acts.append(f"close {here}" if here not in w.closed else f"open {here}")
      if here not in w.closed:
        if held:
          acts.append(f"move {held} to {here}")
        else:
          acts += [f"take {o} from {here}" for o in w.contents[here]]
      if held:
        for family, appliance in hw.APPLIANCE.items():
          if hw.kind(here) == appliance:
            acts.append(f"{family} {held} with {here}")
      if w.lamp_at == here:
        acts.append(f"use {LAMP}")
    return sorted(acts)

  # -- dynamics ---------------------------------------------------------------

  def _apply(self, action: str) -> tuple[str, bool]:
    """Executes an action; returns (observation, valid)."""
    w = self._w
    put = _PUT.match(action)
    if action not in self._admissible and put:
      alias = f"move {put.group(1)} to {put.group(2)}"
      if alias in self._admissible:
        self._apply(alias)
        return f"You put the {put.group(1)} in/on the {put.group(2)}.", True
    if action not in self._admissible:
      return "Nothing happens.", False
    verb, _, rest = action.partition(" ")
    if verb == "go":
      r = rest[len("to "):]
      w.location = r
      w.visited.append(r)
      return f"You arrive at {r}. {self._describe(r)}", True
    if verb == "open":
      w.closed.discard(rest)
      w.opened.append(rest)
      seen = _listing(self._visible(rest))
      return f"You open the {rest}. The {rest} is open. In it, you see {seen}.", True
    if verb == "close":
      w.closed.add(rest)
      return f"You close the {rest}.", True
    if verb == "take":
      obj, _, r = rest.partition(" from ")
      w.contents[r].remove(obj)
      w.holding = obj
      w.taken.append(obj)
      return f"You pick up the {obj} from the {r}.", True
    if verb == "move":
      obj, _, r = rest.partition(" to ")
      w.contents[r].append(obj)
      w.holding = None
      w.moved.append((obj, r))
      return f"You move the {obj} to the {r}.", True
    if verb in hw.APPLIANCE:
      obj, _, r = rest.partition(" with ")
      w.states[hw.PROCESSED[verb]].add(obj)
      w.used.append(f"{verb} {r}")
      w.processed.append((verb, obj, r))
      return f"You {verb} the {obj} using the {r}.", True
    if verb == "use":
      w.lamp_on = True
      w.used.append(f"use {rest}")
      return f"You turn on the {rest}.", True
    if verb == "examine":
      if rest == w.holding:
        return f"There's nothing special about {rest}.", True
      return self._describe(rest), True
    if action == "inventory":
      if w.holding:
        return f"You are carrying: a {w.holding}.", True
      return "You are not carrying anything.", True
    if w.location is None:  # look
      return self._room_view(), True
    return (f"You are facing the {w.location}. Next to it, you see "
            "nothing."), True


# -- expert ---------------------------------------------------------------------


class _Plan:
  """A simulated agent state the expert extends with actions."""

  def __init__(self, w: hw.World) -> None:
    self.w = w
    self.at = w.location
    self.held = w.holding
    self.closed = set(w.closed)
    self.moved: dict[str, str] = {}  # object -> receptacle, planned moves
    self.actions: list[str] = []

  def go(self, r: str) -> None:
    if self.at != r:
      self.actions.append(f"go to {r}")
      self.at = r

  def open_here(self) -> None:
    if self.at in self.closed:
      self.actions.append(f"open {self.at}")
      self.closed.discard(self.at)

  def take(self, obj: str, r: str) -> None:
    self.go(r)
    self.open_here()
    self.actions.append(f"take {obj} from {r}")
    self.held = obj

  def put(self, r: str) -> None:
    self.go(r)
    self.open_here()
    self.actions.append(f"move {self.held} to {r}")
    self.moved[self.held] = r
    self.held = None


def _search_order(w: hw.World, *, skip_target: bool = False) -> list[str]:
  """Where to look for the goal object: its usual places first (without the
  target's type with `skip_target`), open surfaces before containers, then
  everywhere else."""
  places = [t for t in hw.PLACES[w.obj_type]
            if not (skip_target and t == w.target_type)]

  def rank(r: str) -> tuple[bool, bool, int, tuple[str, int]]:
    t = hw.kind(r)
    return (t not in places, t in hw.OPENABLE,
            places.index(t) if t in places else 0, hw.name_key(r))

  return sorted(w.receptacles, key=rank)


def start_places_first(w: hw.World) -> list[str]:
  """The search order of the places the goal object can start in first:
  `_search_order` without the target's type, where the object never starts
  (the demonstrations' expert tries it among the usual places)."""
  return _search_order(w, skip_target=True)


def _plan(w: hw.World, known: set[str] | None,
          order: list[str] | None = None) -> list[str]:
  """Actions that finish the task from the current state.

  Args:
    w: the world (read, never changed).
    known: receptacles whose contents the planner may use; None reads all
      hidden state. With a set, the plan stops at the next exploration step
      when no known receptacle holds what is needed.
    order: search order of receptacles (default: _search_order).

  Returns:
    The planned actions; empty when the goal is met.
  """
  if w.goal_met():
    return []
  p = _Plan(w)
  t, fam = w.obj_type, w.family
  if p.held and hw.kind(p.held) != t:
    p.put(p.at if p.at is not None else next(
        r for r in w.receptacles if hw.kind(r) not in hw.OPENABLE))
  if fam == "pick_two":
    targets = [r for r in w.receptacles if hw.kind(r) == w.target_type]
    target = max(targets, key=lambda r: sum(hw.kind(o) == t
                                            for o in w.contents[r]))
    have = sum(hw.kind(o) == t for o in w.contents[target])
    if p.held:
      p.put(target)
      have += 1
    for _ in range(max(0, 2 - have)):
      spare = [o for o in w.instances(t)
               if w.where(o) not in (None, target) and o not in p.moved]
      if not _fetch(p, spare, known, order):
        return p.actions
      p.put(target)
    return p.actions
  need = hw.PROCESSED.get(fam)
  if p.held is None:
    pool = [o for o in w.instances(t) if w.where(o) is not None]
    pool.sort(key=lambda o: need is None or o not in w.states[need])
    if not _fetch(p, pool, known, order):
      return p.actions
  if need and p.held not in w.states[need]:
    appliance = f"{hw.APPLIANCE[fam]} 1"
    p.go(appliance)
    p.actions.append(f"{fam} {p.held} with {appliance}")
  if fam == "look_at_in_light":
    if known is not None and w.lamp_at not in known:
      # A fair planner has not seen the lamp yet: look where lamps stand.
      kinds = hw.LAMP_PLACES[w.room]
      for r in order or _search_order(w):
        if hw.kind(r) in kinds and r not in known:
          p.go(r)
          return p.actions
    p.go(w.lamp_at)
    if not w.lamp_on:
      p.actions.append(f"use {LAMP}")
    return p.actions
  p.put(next(r for r in w.receptacles if hw.kind(r) == w.target_type))
  return p.actions


def _fetch(p: _Plan, candidates: list[str], known: set[str] | None,
           order: list[str] | None) -> bool:
  """Plans taking the first candidate whose place is known (all are known
  when peeking); otherwise plans the next search step and returns False."""
  w = p.w
  usable = [o for o in candidates if known is None or w.where(o) in known]
  if usable:
    p.take(usable[0], w.where(usable[0]))
    return True
  if known is None:
    return False
  for r in order or _search_order(w):
    if r not in known:
      p.go(r)
      p.open_here()
      return False
  return False


def expert_actions(env: HouseholdEnv) -> list[str]:
  """The expert's full action sequence from the env's current state.

  Reads hidden state, so it goes straight to the goal objects.
  """
  if env.world is None:
    raise RuntimeError("call reset(seed) first")
  return _plan(env.world, None)


def search_end(steps: Sequence[tuple[str, bool]]) -> int:
  """Index of an episode's first valid "take" (len(steps) when none): the
  steps before it are the search for the goal object.

  Args:
    steps: (action, valid) of each step, in order.
  """
  return next((i for i, (action, valid) in enumerate(steps)
               if valid and action.startswith("take ")), len(steps))


def search_stats(ground_truth: dict[str, Any],
                 steps: Sequence[tuple[str, bool]]
                 ) -> dict[str, tuple[float, float]]:
  """Where an episode looked for its goal object in vain, against chance.

  The searches are the valid "go to X" steps before the first valid "take"
  (`search_end`; the "before take" phase of `gaps.step_phases`); the misses among them are those
  to a receptacle that held no goal object. A miss is usual when X's type is
  one the goal object can start in: its type's usual places
  (`household_world.PLACES`) other than the task's target. Its chance is the
  share of usual receptacles among the room's receptacles that held no goal
  object: a search blind to object types misses uniformly over those, so it
  scores its chance on average however soon it finds the object (counting
  the finds too would lift any search above chance).

  Args:
    ground_truth: the episode's `HouseholdEnv.ground_truth()`.
    steps: (action, valid) of each step, in order.

  Returns:
    {"search_usual": (usual misses, misses), "search_usual_chance": (chance
    summed over the misses, misses), "search_usual_over_chance": (usual
    misses less their chance, misses)}: numerators and denominators, to be
    summed over episodes (`episodes.sum_ratios`); the third, the lead over
    chance, is its own ratio so that it gets its own standard error
    (`episodes.ratio_errors`).
  """
  usual = set(hw.PLACES[ground_truth["object_type"]]) - {
      ground_truth["target_type"]}
  held = set(ground_truth["start_locations"].values())
  empty = [r for r in hw.layout_receptacles(ground_truth["layout"])
           if r not in held]
  chance = (sum(hw.kind(r) in usual for r in empty) / len(empty)
            if empty else 0.0)
  misses = hits = 0
  for action, valid in steps[:search_end(steps)]:
    place = action[len("go to "):]
    if valid and action.startswith("go to ") and place not in held:
      misses += 1
      hits += hw.kind(place) in usual
  return {"search_usual": (float(hits), float(misses)),
          "search_usual_chance": (chance * misses, float(misses)),
          "search_usual_over_chance": (hits - chance * misses, float(misses))}


def _reach_index(ground_truth: dict[str, Any],
                 steps: Sequence[tuple[str, bool]]) -> int:
  """Index of the first valid "go to" a receptacle that held a goal object
  at the start (len(steps) when none came)."""
  held = {f"go to {place}"
          for place in ground_truth["start_locations"].values()}
  return next((i for i, (action, valid) in enumerate(steps)
               if valid and action in held), len(steps))


def take_stats(ground_truth: dict[str, Any],
               steps: Sequence[tuple[str, bool]], won: bool
               ) -> dict[str, tuple[float, float]]:
  """How far an episode got: to a place that held a goal object, to taking
  one, to winning. A task is won only after a goal object is taken, which
  needs a visit to where it is, so over episodes with a ground truth (no
  environment error) success is `reached_goal_place` times
  `took_after_reach` times `won_after_take`: that tells a policy that does
  not find the object from one that finds it and fails to take it, and
  from one that fails to carry the task out.

  Args:
    ground_truth: the episode's `HouseholdEnv.ground_truth()`.
    steps: (action, valid) of each step, in order.
    won: whether the episode was won.

  Returns:
    {"reached_goal_place": (1 if a valid "go to" a receptacle that held a
    goal object at the start came, 1), "took_after_reach": (took, reached),
    "took_goal": (1 if a valid "take" of a goal object came, 1),
    "won_after_take": (won and took, took), "steps_to_take": (its step
    number, counted from 1, took)}: numerators and denominators, to be
    summed over episodes (`episodes.sum_ratios`).
  """
  reached = float(_reach_index(ground_truth, steps) < len(steps))
  goals = tuple(f"take {name} from "
                for name in ground_truth["start_locations"])
  first = next((i for i, (action, valid) in enumerate(steps)
                if valid and action.startswith(goals)), None)
  took = float(first is not None)
  return {"reached_goal_place": (reached, 1.0),
          "took_after_reach": (took * reached, reached),
          "took_goal": (took, 1.0),
          "won_after_take": (float(won and took), took),
          "steps_to_take": (float(first + 1) if took else 0.0, took)}


def look_stats(ground_truth: dict[str, Any],
               steps: Sequence[tuple[str, bool]]
               ) -> dict[str, tuple[float, float]]:
  """Where an episode's steps went before it reached a goal place.

  The looking steps are those before the first valid "go to" a receptacle
  that held a goal object at the start (all the steps when none came: the
  episodes that `take_stats` counts as not reached). Each is one of four
  kinds: a valid "go to" a place not yet visited among them (a new place),
  a valid "go to" one already visited (a revisit), another valid action
  (open, examine, take something else, ...), or an invalid action; of the
  invalid ones, those that tried a "take" (of an object that is not there).
  A policy that reaches the goal place less often either spends fewer steps
  looking (it reaches it sooner or the episode ends) or spends them on fewer
  new places.

  Args:
    ground_truth: the episode's `HouseholdEnv.ground_truth()`.
    steps: (action, valid) of each step, in order; for an invalid step, the
      action the policy tried where known (`prompts.attempted_action`).

  Returns:
    {"look_steps": (looking steps, 1), "look_new_place" | "look_revisit" |
    "look_other" | "look_invalid" | "look_invalid_take": (steps of that
    kind, looking steps)}: numerators and denominators, to be summed over
    episodes (`episodes.sum_ratios`); the first four shares sum to 1, and
    the invalid takes are part of the invalid steps.
  """
  end = _reach_index(ground_truth, steps)
  visited: set[str] = set()
  kinds = dict.fromkeys(("new_place", "revisit", "other", "invalid",
                         "invalid_take"), 0)
  for action, valid in steps[:end]:
    if not valid:
      kinds["invalid"] += 1
      kinds["invalid_take"] += action.startswith("take ")
    elif not action.startswith("go to "):
      kinds["other"] += 1
    else:
      kinds["revisit" if action in visited else "new_place"] += 1
      visited.add(action)
  return {"look_steps": (float(end), 1.0),
          **{f"look_{k}": (float(n), float(end)) for k, n in kinds.items()}}


def tried_steps(steps: Sequence[Any]) -> list[tuple[str, bool]]:
  """(action, valid) of each of an episode's `episodes.Step`s: the action sent
  when valid, else the one its reply tried (`prompts.attempted_action`; ""
  for a reply with none), not the no-op sent in its place."""
  return [(s.action, True) if s.action_valid
          else (prompts.attempted_action(s.response), False) for s in steps]


def repeated_tries(steps: Sequence[tuple[str, bool]]) -> list[bool]:
  """For each step, whether it is an invalid try of the step before's action.

  A policy that keeps trying the same invalid action is stuck: the
  environment gets the no-op instead and the prompt's history shows the
  no-op, so after history_length + 1 invalid tries in a row its prompt
  repeats but for the step count.

  Args:
    steps: (action, valid) of each step, in order (`tried_steps`): an empty
      try repeats nothing, and a valid step's action is the one sent ("move
      O to R" for a reply "put O in/on R"), so a retry written the other way
      is no repeat.

  Example: [("go to desk 1", True), ("go to desk 1", False), ("", False),
  ("", False)] -> [False, True, False, False].
  """
  out, previous = [], None
  for action, valid in steps:
    out.append(not valid and bool(action) and action == previous)
    previous = action
  return out


def step_repeats(steps: Sequence[Any]) -> list[bool]:
  """`repeated_tries` of an episode's `episodes.Step`s (`tried_steps`)."""
  return repeated_tries(tried_steps(steps))


def invalid_stats(steps: Sequence[tuple[str, bool]]
                  ) -> dict[str, tuple[float, float]]:
  """How many of an episode's steps were invalid, how many of those tried
  again the action of the step before (`repeated_tries`), how many of those
  tried again a try that had just failed (the prompt before it says "Nothing
  happens." when failed tries are sent as written), and how many tried to go
  where the agent stood.

  Args:
    steps: (action, valid) of each step, in order (`tried_steps`).

  Returns:
    {"invalid_steps": (invalid steps, steps), "invalid_repeat": (invalid
    steps that tried the previous step's action, invalid steps),
    "invalid_repeat_failed": (those of them whose step before was invalid
    too, invalid steps), "invalid_go_here": (invalid tries of "go to" the
    place of the last valid "go to", invalid steps)}: numerators and
    denominators, to be summed over episodes (`episodes.sum_ratios`).
  """
  invalid = go_here = 0
  here = None
  for action, valid in steps:
    if not valid:
      invalid += 1
      go_here += here is not None and action == f"go to {here}"
    elif action.startswith("go to "):
      here = action[len("go to "):]
  repeats = repeated_tries(steps)
  # A repeat's step before tried the same action; invalid too, it had failed.
  failed = sum(again and not valid_before
               for again, (_, valid_before) in zip(repeats[1:], steps))
  return {"invalid_steps": (float(invalid), float(len(steps))),
          "invalid_repeat": (float(sum(repeats)), float(invalid)),
          "invalid_repeat_failed": (float(failed), float(invalid)),
          "invalid_go_here": (float(go_here), float(invalid))}


def played_stats(ground_truth: dict[str, Any],
                 steps: Sequence[tuple[str, bool]], won: bool
                 ) -> dict[str, tuple[float, float]]:
  """`search_stats`, `take_stats`, `look_stats` and `invalid_stats` of one
  played episode."""
  return {**search_stats(ground_truth, steps),
          **take_stats(ground_truth, steps, won),
          **look_stats(ground_truth, steps),
          **invalid_stats(steps)}


def episode_stats(episode: Any) -> dict[str, tuple[float, float]]:
  """`played_stats` of a rollout's `episodes.Episode` ({} without its ground
  truth, e.g. when `ground_truth()` raised); an invalid step counts as the
  action its reply tried (`prompts.attempted_action`), not the no-op sent."""
  if not episode.ground_truth:
    return {}
  return played_stats(episode.ground_truth, tried_steps(episode.steps),
                      episode.success)


class ExpertPlanner:
  """Acts in a HouseholdEnv; `act()` returns the next action.

  Args:
    env: the environment (reset already).
    peek: read hidden state (solves every task); False searches receptacles in
      a fixed order and uses only what it has seen, like a fair demonstrator.
    noise: probability of a random admissible action instead (an imperfect
      expert for warm-start demonstrations).
    shuffle_search: with peek=False, search receptacles in a random order
      instead of the likely places first (another kind of imperfection).
    seed: seed of the noise and the shuffle.
    search_order: with peek=False, search_order(world) gives the search
      order of the world's receptacles instead of the likely places first
      (`start_places_first` skips the target's type, where the object never
      starts); ignored with shuffle_search.
    memory: with peek=False, remember only the last `memory` places gone to
      (the one it stands at included): it uses only what those showed, and
      searches on in its order past them, as a policy whose prompt shows
      only its last few steps can (`rollout`'s history_length); None
      remembers every place of the episode.
  """

  def __init__(self, env: HouseholdEnv, *, peek: bool = True,
               noise: float = 0.0, shuffle_search: bool = False,
               seed: int = 0,
               search_order: Callable[[hw.World], list[str]] | None = None,
               memory: int | None = None) -> None:
    if memory is not None and memory < 1:
      raise ValueError(f"memory must be at least 1 place, got {memory}")
    self.env = env
    self.peek = peek
    self.noise = noise
    self.shuffle_search = shuffle_search
    self.search_order = search_order
    self.memory = memory
    self.rng = random.Random(seed)
    self._new_episode(env.world)

  def _new_episode(self, world: hw.World | None) -> None:
    """Forgets what the last episode showed: the expert serves every
    episode of its env, each from scratch."""
    self._world = world
    self.known: set[str] = set()
    self.recent: collections.deque[str] = collections.deque(
        maxlen=self.memory)  # the places gone to, the last one last
    self.order = None
    if self.shuffle_search and world is not None:
      self.order = list(world.receptacles)
      self.rng.shuffle(self.order)
    elif self.search_order and world is not None:
      self.order = self.search_order(world)

  def act(self) -> str:
    w = self.env.world
    if w is not self._world:  # the env was reset
      self._new_episode(w)
    order = self.order
    if self.memory is None:
      if w.location is not None and w.location not in w.closed:
        self.known.add(w.location)
    else:
      if w.location is not None and (not self.recent
                                     or self.recent[-1] != w.location):
        self.recent.append(w.location)
      self.known = {r for r in self.recent if r not in w.closed}
      # Search on past the remembered places; open the one it stands at.
      here = [w.location] if w.location in w.receptacles else []
      order = here + sorted(
          (r for r in order or _search_order(w) if r not in here),
          key=lambda r: r in self.recent)
    admissible = self.env.admissible_actions
    if self.noise and self.rng.random() < self.noise and admissible:
      return self.rng.choice(admissible)
    plan = _plan(w, None if self.peek else self.known, order)
    return plan[0] if plan else self.env.no_op
