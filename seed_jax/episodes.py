"""Host-side records of agent episodes, shared by environments, rollout and skills."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

# An environment's statistics of one episode: {name: (numerator,
# denominator)}, summed over episodes before dividing (`sum_ratios`).
Stats = Mapping[str, tuple[float, float]]


@dataclasses.dataclass
class Step:
  """One turn of an episode, as the policy saw and answered it.

  Attributes:
    observation: the raw observation the policy answered (before this step).
    prompt: the full rollout prompt text shown to the policy.
    response: the policy's text reply (think + action).
    action: the projected action sent to the environment.
    action_valid: whether the reply projected to an admissible action.
    reward: environment reward for this step.
    done: whether the episode ended after this step.
    truncated: the reply hit the sampler's max_new_tokens before EOS or a
      stop string (kept out of analysis prompts, `skills.format_step`).
  """
  observation: str
  prompt: str
  response: str
  action: str
  action_valid: bool
  reward: float = 0.0
  done: bool = False
  truncated: bool = False


@dataclasses.dataclass
class Episode:
  """A finished (or cut-off) episode.

  Attributes:
    env_name: registry name of the environment.
    task: the task description shown to the policy (e.g. "put a clean mug in
      coffeemachine").
    family: task family (e.g. "clean", "pick_two", "sokoban").
    seed: task seed; episodes of one group share it.
    steps: the turns, in order.
    success: the environment's won flag at the end.
    episode_return: sum of rewards.
    ground_truth: hidden facts for annotators (never shown to the policy), e.g.
      where the target object was or which push made a level unsolvable.
    uid: group id (same task seed, same group).
    traj_uid: trajectory id, unique within a batch.
    error: set when the environment raised mid-episode (the episode counts as
      failed).
  """
  env_name: str
  task: str
  family: str
  seed: int
  steps: list[Step] = dataclasses.field(default_factory=list)
  success: bool = False
  episode_return: float = 0.0
  ground_truth: dict[str, Any] = dataclasses.field(default_factory=dict)
  uid: int = 0
  traj_uid: int = 0
  error: str | None = None

  @property
  def length(self) -> int:
    return len(self.steps)


def sum_ratios(stats: Iterable[Stats]) -> dict[str, float]:
  """Each statistic's numerators over its denominators, both summed over the
  episodes (a ratio of sums, not a mean of the episodes' ratios); left out
  where the summed denominator is 0.

  Example: sum_ratios([{"hit": (1, 3)}, {"hit": (0, 1)}, {"hit": (0, 0)}])
  == {"hit": 0.25}.
  """
  sums: dict[str, list[float]] = {}
  for one in stats:
    for name, (num, den) in one.items():
      total = sums.setdefault(name, [0.0, 0.0])
      total[0] += num
      total[1] += den
  return {name: num / den for name, (num, den) in sorted(sums.items())
          if den > 0}


def ratio_errors(stats: Sequence[Stats]) -> dict[str, float]:
  """The standard error over episodes of each `sum_ratios` ratio, as
  "<name>_se".

  The ratio R = sum(num) / sum(den) is linearized (the delta method, episodes
  as the sampling units): se = sqrt(k / (k - 1) * sum((num_i - R den_i)^2)) /
  sum(den), over the k episodes that report the statistic. Left out where
  `sum_ratios` leaves the ratio out or fewer than 2 episodes report it.

  Example: ratio_errors([{"hit": (1, 1)}, {"hit": (0, 1)}]) == {"hit_se": 0.5}.
  """
  out = {}
  for name, ratio in sum_ratios(stats).items():
    pairs = [one[name] for one in stats if name in one]
    if len(pairs) < 2:
      continue
    squares = sum((num - ratio * den) ** 2 for num, den in pairs)
    total = sum(den for _, den in pairs)
    out[f"{name}_se"] = (len(pairs) / (len(pairs) - 1) * squares) ** 0.5 / total
  return out


def paired_ratio_diffs(a: Sequence[Stats | None], b: Sequence[Stats | None]
                       ) -> dict[str, float]:
  """Each `sum_ratios` ratio of `a` less that of `b`, over the same tasks,
  with the standard error of the difference task by task, as "<name>_se".

  Pairing tasks takes out what two policies share on a task (the same
  layout, the same start), so the error is that of the difference, not the
  two errors combined as if they were independent. Both ratios are
  linearized as in `ratio_errors`: with R = sum(num) / sum(den),
  u_i = (num_a_i - R_a den_a_i) / sum(den_a) - (num_b_i - R_b den_b_i) /
  sum(den_b), and se = sqrt(k / (k - 1) * sum(u_i^2)) over the k tasks that
  report the statistic in either run (a task that does not report it adds
  (0, 0) to that side).

  Args:
    a, b: per task, in the same task order, an environment's statistics of
      that task's episode (None or {}: none reported).

  Returns:
    {name: R_a - R_b, "<name>_se": its standard error} for each statistic
    whose summed denominator is positive in both; the error is left out
    where fewer than 2 tasks report it.

  Raises:
    ValueError: `a` and `b` of different lengths (not the same tasks).

  Example: paired_ratio_diffs([{"hit": (1, 1)}, {"hit": (1, 1)}],
                              [{"hit": (0, 1)}, {"hit": (1, 1)}])
  == {"hit": 0.5, "hit_se": 0.5}.
  """
  if len(a) != len(b):
    raise ValueError(f"paired statistics need the same tasks, got {len(a)} "
                     f"and {len(b)}")
  a = [one or {} for one in a]
  b = [one or {} for one in b]
  ra, rb = sum_ratios(a), sum_ratios(b)
  out = {}
  for name in sorted(set(ra) & set(rb)):
    got = [(x.get(name, (0.0, 0.0)), y.get(name, (0.0, 0.0)))
           for x, y in zip(a, b) if name in x or name in y]
    da = sum(x[1] for x, _ in got)
    db = sum(y[1] for _, y in got)
    out[name] = ra[name] - rb[name]
    if len(got) < 2:
      continue
    squares = sum(((x[0] - ra[name] * x[1]) / da
                   - (y[0] - rb[name] * y[1]) / db) ** 2 for x, y in got)
    out[f"{name}_se"] = (len(got) / (len(got) - 1) * squares) ** 0.5
  return out


def stats_text(stats: Sequence[Stats | None]) -> dict[str, str]:
  """Per-task statistics as one line of text per statistic, for reports.

  Args:
    stats: per task, in task order, an environment's statistics of that
      task's episode (None or {}: none reported).

  Returns:
    {name: "num:den num:den - ..."}, a task's pair in `%g` (6 significant
    digits) or "-" where it does not report the statistic.

  Example: stats_text([{"hit": (1.0, 3.0)}, None]) == {"hit": "1:3 -"}.
  """
  names = sorted({name for one in stats if one for name in one})
  return {name: " ".join(
      f"{one[name][0]:g}:{one[name][1]:g}" if one and name in one else "-"
      for one in stats) for name in names}


def stats_from_text(texts: Mapping[str, str]) -> list[Stats]:
  """The per-task statistics `stats_text` wrote.

  Raises:
    ValueError: `texts` not a mapping, a statistic whose text is not
      "num:den" pairs and "-", or statistics of different numbers of tasks;
      the message names it.
  """
  if not isinstance(texts, Mapping):
    raise ValueError(f"per-task statistics must be {{name: text}}, got "
                     f"{texts!r:.80}")
  columns = {}
  for name, text in texts.items():
    bad = ValueError(f"per-task statistic {name!r} is not \"num:den\" pairs "
                     f"and \"-\": {text!r:.80}")
    if not isinstance(text, str):
      raise bad
    column = columns[name] = []
    for cell in text.split():
      try:
        pair = None if cell == "-" else tuple(map(float, cell.split(":")))
      except ValueError:
        raise bad from None
      if pair is not None and len(pair) != 2:
        raise bad
      column.append(pair)
  lengths = {len(c) for c in columns.values()}
  if len(lengths) > 1:
    raise ValueError(f"per-task statistics of different numbers of tasks: "
                     f"{ {k: len(c) for k, c in columns.items()} }")
  n = lengths.pop() if lengths else 0
  return [{name: c[i] for name, c in columns.items() if c[i] is not None}
          for i in range(n)]
