r"""What knowing where to search is worth in the household game.

  python -m seed_jax.search_value [--split=eval_unseen] [--num_tasks=1024] \
      [--max_steps=20] [--noise=0,0.2,0.4,0.6,0.65,0.7,0.8] [--memory=K] \
      [--out_json=PATH]

A household task is mostly a search: the goal object starts in one of the
receptacles of its type's usual places other than the task's target
(`household_world.PLACES`), chosen at random. Three experts that differ only
in what they know about that search play the same tasks (the evaluation's,
`envs.base.split_seeds`):
  "peek": knows where each object is, as a correct hindsight skill says for
    the task it was written on;
  "likely": searches the places the object type can start in first
    (`household.start_places_first`), the knowledge a skill could carry from
    one task to another ("bread is kept in cabinets");
  "shuffled": searches every receptacle in a random order, as the imperfect
    expert of the demo's demonstrations does (`shuffle_search`).
Each takes a random admissible action with probability `noise` instead of
its plan, which stands in for a policy's lower competence. Over shuffled,
likely gains what transferable search knowledge is worth, and peek what
perfect, task-specific search knowledge is worth, at that competence; the
table gives each gain with its standard error over the tasks (paired: the
experts play the same tasks). A second table gives each expert's
`household.search_stats` against its chance, to read a policy's own
(`evaluate`'s `search_usual`) against.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import numpy as np

from seed_jax import atomic
from seed_jax import episodes
from seed_jax.envs import base as envs_base
from seed_jax.envs import household

# name -> household.ExpertPlanner's keyword arguments.
EXPERTS = {
    "peek": dict(peek=True),
    "likely": dict(peek=False, search_order=household.start_places_first),
    "shuffled": dict(peek=False, shuffle_search=True),
}


# `household.look_stats`'s ratios, in the order the look table prints them.
LOOK = ("look_steps", "look_new_place", "look_revisit", "look_other",
        "look_invalid")


def play(expert: str, *, split: str = "eval_unseen", num_tasks: int = 1024,
         max_steps: int = 20, noise: float = 0.0,
         memory: int | None = None) -> dict:
  """Plays the first `num_tasks` tasks of `split` with one expert.

  Args:
    expert: a key of EXPERTS.
    split: "train", "eval_seen" or "eval_unseen".
    num_tasks: how many tasks, from the start of the split.
    max_steps: steps before an episode is cut.
    noise: probability of a random admissible action instead of the plan.
    memory: the searching experts (not peek, which reads hidden state)
      remember only their last `memory` places (`household.ExpertPlanner`),
      as a policy that sees its last few steps; None: every place.

  Returns:
    {"expert", "noise", "memory", "success" (percent), "steps_won" (mean
    steps of the won episodes, None if none), "search_usual" and
    "search_usual_chance" (`household.search_stats` over all tasks: the
    share of the searches in vain that went where the object can start, and
    that of a type-blind search; None without such searches),
    "reached_goal_place" (the share of the tasks where the expert went to a
    place holding a goal object),
    "took_after_reach" (the share of those where it took one), "took_goal"
    (the share of all tasks where it took one) and "won_after_take" (the
    share of those won; `household.take_stats`; a share of none is None),
    "look_steps" (the mean steps before the first visit to a goal place)
    and "look_new_place", "look_revisit", "look_other", "look_invalid"
    (the shares of those steps of each kind; `household.look_stats`; None
    without such steps), "outcomes" (0/1 per task, in task order)}.

  Raises:
    ValueError: an unknown expert or split, num_tasks < 1, max_steps < 1,
      or a noise outside [0, 1], or a memory below 1.
  """
  if expert not in EXPERTS:
    raise ValueError(f"unknown expert {expert!r}; known: {sorted(EXPERTS)}")
  if num_tasks < 1:
    raise ValueError(f"num_tasks must be at least 1, got {num_tasks}")
  if not 0.0 <= noise <= 1.0:
    raise ValueError(f"noise must be in [0, 1], got {noise}")
  if memory is not None and memory < 1:
    raise ValueError(f"memory must be at least 1 place, got {memory}")
  env = household.HouseholdEnv(split=split, max_steps=max_steps)
  outcomes, steps_won, stats = [], [], []
  for i, seed in enumerate(envs_base.split_seeds(split, num_tasks)):
    env.reset(seed)
    kwargs = dict(EXPERTS[expert])
    if not kwargs["peek"]:
      kwargs["memory"] = memory
    planner = household.ExpertPlanner(env, noise=noise, seed=i, **kwargs)
    done, reward, steps = False, 0.0, []
    while not done:
      action = planner.act()
      _, reward, done, info = env.step(action)
      steps.append((action, info["action_valid"]))
    outcomes.append(int(reward > 0))
    if reward > 0:
      steps_won.append(env.steps)
    stats.append(household.played_stats(env.ground_truth(), steps,
                                        reward > 0))
  ratios = episodes.sum_ratios(stats)
  return {"expert": expert, "noise": noise, "memory": memory,
          "success": 100.0 * sum(outcomes) / num_tasks,
          "steps_won": (sum(steps_won) / len(steps_won)) if steps_won
                       else None,
          "search_usual": ratios.get("search_usual"),
          "search_usual_chance": ratios.get("search_usual_chance"),
          "reached_goal_place": ratios["reached_goal_place"],
          "took_after_reach": ratios.get("took_after_reach"),
          "took_goal": ratios["took_goal"],
          "won_after_take": ratios.get("won_after_take"),
          **{k: ratios.get(k) for k in LOOK},
          "outcomes": outcomes}


def gain(a: dict, b: dict) -> tuple[float, float]:
  """Success of row `a` minus row `b` in points, and its standard error over
  the tasks (paired: both rows played the same tasks)."""
  diff = 100.0 * (np.asarray(a["outcomes"]) - np.asarray(b["outcomes"]))
  return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def table(rows: Sequence[dict]) -> str:
  """A Markdown table: one line per noise level, success of each expert and
  its gain over shuffled (points, standard error in brackets)."""
  by = {(r["noise"], r["expert"]): r for r in rows}
  lines = ["| noise | peek | likely | shuffled | likely − shuffled | "
           "peek − shuffled |", "|---|---|---|---|---|---|"]
  for noise in sorted({r["noise"] for r in rows}):
    p, l, s = (by[(noise, e)] for e in ("peek", "likely", "shuffled"))
    cells = [f"{r['success']:.1f}" for r in (p, l, s)]
    cells += ["{:+.1f} ({:.1f})".format(*gain(r, s)) for r in (l, p)]
    lines.append(f"| {noise:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def search_table(rows: Sequence[dict]) -> str:
  """A Markdown table: one line per noise level, each expert's share of
  searches that went where the object can start (its type-blind chance in
  brackets)."""
  return _by_expert(rows, lambda r: (
      "-" if r["search_usual"] is None else
      f"{r['search_usual']:.2f} ({r['search_usual_chance']:.2f})"))


def take_table(rows: Sequence[dict]) -> str:
  """A Markdown table: one line per noise level, each expert's share of
  tasks where it went to a place holding a goal object, the share of those
  where it took one, and the share of those it won (in %; success is their
  product), to read a policy's own (`evaluate`'s `reached_goal_place`,
  `took_after_reach` and `won_after_take`) against."""
  share = lambda x: "-" if x is None else f"{100 * x:.1f}"
  return _by_expert(rows, lambda r: "; ".join(share(r[k]) for k in (
      "reached_goal_place", "took_after_reach", "won_after_take")))


def look_table(rows: Sequence[dict]) -> str:
  """A Markdown table: one line per noise level, each expert's mean steps
  before its first visit to a goal place, then the shares in % of those
  steps that went to a new place, back to one, to another valid action and
  to an invalid one, to read a policy's own (`evaluate`'s `look_steps`,
  ...) against."""
  share = lambda x: "-" if x is None else f"{100 * x:.1f}"
  return _by_expert(rows, lambda r: f"{r['look_steps']:.1f}: " + "; ".join(
      share(r[k]) for k in LOOK[1:]))


def _by_expert(rows: Sequence[dict], cell) -> str:
  """A Markdown table of `cell(row)`: one line per noise level, one column
  per expert."""
  by = {(r["noise"], r["expert"]): r for r in rows}
  lines = ["| noise | peek | likely | shuffled |", "|---|---|---|---|"]
  for noise in sorted({r["noise"] for r in rows}):
    lines.append(f"| {noise:g} | " + " | ".join(
        cell(by[(noise, e)]) for e in ("peek", "likely", "shuffled")) + " |")
  return "\n".join(lines)


def _noises(text: str) -> list[float]:
  try:
    values = [float(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"--noise takes numbers separated by commas, got {text!r}") from None
  if not values:
    raise argparse.ArgumentTypeError("--noise is empty")
  return values


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m seed_jax.search_value",
      description=__doc__.split("\n\n")[0].strip())
  parser.add_argument("--split", default="eval_unseen")
  parser.add_argument("--num_tasks", type=int, default=1024)
  parser.add_argument("--max_steps", type=int, default=20)
  parser.add_argument("--noise", type=_noises, default=_noises(
      "0,0.2,0.4,0.6,0.65,0.7,0.8"))
  parser.add_argument("--memory", type=int, default=None,
                      help="the searching experts remember only their last "
                      "MEMORY places, as a policy whose prompt shows its "
                      "last few steps (default: every place)")
  parser.add_argument("--out_json", default=None,
                      help="also write every row (with per-task outcomes)")
  args = parser.parse_args(argv)
  try:
    rows = [play(e, split=args.split, num_tasks=args.num_tasks,
                 max_steps=args.max_steps, noise=n, memory=args.memory)
            for n in args.noise for e in EXPERTS]
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"success in % on {args.num_tasks} {args.split} tasks, at most "
        f"{args.max_steps} steps"
        + (f", the searching experts remembering their last {args.memory} "
           "places" if args.memory else ""))
  print(table(rows))
  print("\nshare of the searches in vain (valid \"go to\" before the first "
        "take, to a place without the object) that went where the object "
        "can start, type-blind chance in brackets")
  print(search_table(rows))
  print("\ntasks where the expert went to a place holding a goal object, "
        "in %; then the share of those where it took one; then the share "
        "of those won")
  print(take_table(rows))
  print("\nmean steps before the first visit to a place holding a goal "
        "object; then the shares in % of those steps that went to a new "
        "place, back to one, to another valid action, and to an invalid one")
  print(look_table(rows))
  if args.out_json:
    atomic.write_text(args.out_json, json.dumps(
        {"split": args.split, "num_tasks": args.num_tasks,
         "max_steps": args.max_steps, "memory": args.memory,
         "rows": rows}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
