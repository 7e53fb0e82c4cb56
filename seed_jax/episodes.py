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
