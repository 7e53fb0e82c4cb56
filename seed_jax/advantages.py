"""Advantage estimators (GRPO, OPID shaping, GiGPO steps), registered by name.

One sample is one (trajectory, step): a prompt and the policy's response to it.
Per-sample arrays are `[N]`; per-token arrays are `[B, L]` over response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import losses
from seed_jax import registry as registry_lib

_REGISTRY = registry_lib.Registry("advantage")
register = _REGISTRY.register
get = _REGISTRY.get

NORMS = ("mean_std_norm", "mean_norm")
STATS_OVER = ("samples", "trajectories")
# A group std at or below this is float32 rounding of equal values (sums of
# 0.1 penalties over trajectories of different lengths).
EQUAL_STD = 1e-5


def dense_ids(ids: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, int]:
  """Maps arbitrary hashable ids to 0..n-1 on the host, keeping first-seen order.

  Example: `dense_ids([7, 3, 7, 9])` -> `([0, 1, 0, 2], 3)`.

  Returns:
    The dense ids `[N]` int32 and the number of distinct ids.
  """
  index: dict[Any, int] = {}
  out = np.array([index.setdefault(i, len(index)) for i in list(ids)], np.int32)
  return out, len(index)


def _check_ids(name: str, ids: Any, num: int, count: str,
               mask: Any = None) -> None:
  """Raises ValueError when concrete `ids` (the rows of a concrete `mask`)
  fall outside [0, num): segment sums would drop them or clamp their
  gathers, silently. Traced ids (under jit) are not checked."""
  if isinstance(ids, jax.core.Tracer):
    return
  ids = np.asarray(ids).reshape(-1)
  if mask is not None and not isinstance(mask, jax.core.Tracer):
    ids = ids[np.asarray(mask, bool).reshape(-1)]
  if ids.size and (ids.min() < 0 or ids.max() >= num):
    raise ValueError(f"{name} must lie in [0, {count}={num}), got ids in "
                     f"[{ids.min()}, {ids.max()}]; pass dense ids (see "
                     f"`dense_ids`) and their count")


@register("sample_scores")
def sample_scores(episode_returns: jax.Array, action_valid: jax.Array, *,
                  invalid_penalty: float = 0.1) -> jax.Array:
  """Per-sample score S_i = R_tau(i) - penalty * [action of step i invalid].

  Args:
    episode_returns: [N] return of the episode each sample belongs to.
    action_valid: [N] bool, whether the sample's action was admissible.
    invalid_penalty: the penalty for an invalid action.

  Returns:
    [N] float32 scores.
  """
  r = jnp.asarray(episode_returns, jnp.float32)
  valid = jnp.asarray(action_valid, bool)
  return r - invalid_penalty * (~valid).astype(jnp.float32)


@register("grpo")
def grpo(scores: jax.Array, group_ids: jax.Array, traj_ids: jax.Array, *,
         num_groups: int | None = None, num_trajs: int | None = None,
         norm: str = "mean_std_norm",
         stats_over: str = "samples", eps: float = 1e-6,
         sample_mask: jax.Array | None = None) -> jax.Array:
  """GRPO advantage: each sample's score against its group's statistics.

    mean_std_norm:  A_i = (S_i - mean_g) / (std_g + eps)
    mean_norm:      A_i =  S_i - mean_g

  where g is the sample's group (same task seed). The statistics come from
  - `stats_over="samples"` (reference code): every step sample of the group
    counts once, so long trajectories weigh more;
  - `stats_over="trajectories"` (paper text): one value per trajectory, the mean
    of its samples' scores (R_tau minus 0.1 times its invalid-action rate;
    the PyTorch reference keeps the first sample's score instead).
  The score S_i in the numerator is always the sample's own. std is the
  unbiased (ddof=1) estimate, as `torch.std` in the reference. A group with a
  single member (one sample, or one trajectory for "trajectories") takes
  mean 0 and std 1, so A_i = S_i / (1 + eps) (or S_i for mean_norm). A group
  whose units all have the same value takes std 1: with "samples" its
  advantages are 0 anyway, and with "trajectories" its samples keep only
  their deviation from the trajectories' value (an invalid step's -0.1).
  Trajectory values that are close but not equal still divide those
  deviations by a small std (the formula's own behaviour with
  "trajectories"; gradient clipping bounds the step).
  Statistics are taken of S - max_g(S), so a group of equal scores gets
  exactly 0 rather than float32 rounding divided by eps.

  Jit-compatible when `num_groups` and `num_trajs` are given (they, `norm` and
  `stats_over` are static); ids must be dense (see `dense_ids`). Concrete
  (host or unjitted) ids are checked against those counts; traced ones are
  not, and an id out of range there is silently dropped from the statistics.

  Args:
    scores: [N] per-sample scores S_i.
    group_ids: [N] int in [0, num_groups).
    traj_ids: [N] int in [0, num_trajs); read only for "trajectories".
    num_groups: number of groups (static); None reads max(group_ids) + 1 from
      concrete (host) ids.
    num_trajs: number of trajectories (static); None likewise from traj_ids.
    norm: "mean_std_norm" or "mean_norm".
    stats_over: "samples" or "trajectories".
    eps: added to std.
    sample_mask: optional [N] bool; False rows (padding) are left out of the
      statistics and get advantage 0.

  Returns:
    [N] float32 advantages.

  Raises:
    ValueError: for an unknown `norm` or `stats_over`, or concrete ids
      outside [0, num_groups) (group_ids) or [0, num_trajs) (traj_ids, with
      "trajectories"), on the rows of `sample_mask` when it is concrete.
  """
  if norm not in NORMS:
    raise ValueError(f"unknown norm {norm!r}; known: {list(NORMS)}")
  if stats_over not in STATS_OVER:
    raise ValueError(f"unknown stats_over {stats_over!r}; known: {list(STATS_OVER)}")
  if num_groups is None:
    num_groups = int(np.max(group_ids)) + 1
  if num_trajs is None:
    num_trajs = int(np.max(traj_ids)) + 1
  _check_ids("group_ids", group_ids, num_groups, "num_groups", sample_mask)
  if stats_over == "trajectories":
    _check_ids("traj_ids", traj_ids, num_trajs, "num_trajs", sample_mask)
  g = jnp.asarray(group_ids, jnp.int32)
  m = (jnp.ones(g.shape, bool) if sample_mask is None
       else jnp.asarray(sample_mask, bool))
  s = jnp.where(m, jnp.asarray(scores, jnp.float32), 0.0)  # [N]
  # Work with d = S - pivot (pivot = group max), so that a group of equal
  # scores gets exactly zero advantage instead of float32 rounding / eps.
  pivot = jax.ops.segment_max(jnp.where(m, s, -jnp.inf), g,
                              num_segments=num_groups)
  pivot = jnp.where(jnp.isfinite(pivot), pivot, 0.0)  # [G]
  d = jnp.where(m, s - pivot[g], 0.0)  # [N]
  if stats_over == "samples":
    dev, w, seg = d, m, g  # one statistics unit per sample
  else:
    # One unit per trajectory: value = mean of its samples' d, group = its
    # samples' group.
    t = jnp.asarray(traj_ids, jnp.int32)
    n_t = jax.ops.segment_sum(m.astype(jnp.float32), t, num_segments=num_trajs)
    dev = jax.ops.segment_sum(d, t, num_segments=num_trajs) / jnp.maximum(n_t, 1.0)
    w = n_t > 0  # [T]
    seg = jax.ops.segment_max(jnp.where(m, g, -1), t, num_segments=num_trajs)
    seg = jnp.where(w, seg, 0)
  wf = w.astype(jnp.float32)
  count = jax.ops.segment_sum(wf, seg, num_segments=num_groups)  # [G]
  mean_dev = jax.ops.segment_sum(dev, seg, num_segments=num_groups)
  mean_dev = mean_dev / jnp.maximum(count, 1.0)
  sq = jax.ops.segment_sum(wf * (dev - mean_dev[seg]) ** 2, seg,
                           num_segments=num_groups)
  single = count <= 1
  std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
  # Trajectories of equal value can still hold samples that differ (an invalid
  # step's penalty): their deviations over a zero std would be ~1e5.
  std = jnp.where(single | (std <= EQUAL_STD), 1.0, std)
  adv = jnp.where(single[g], s, d - mean_dev[g])
  if norm == "mean_std_norm":
    adv = adv / (std[g] + eps)
  return jnp.where(m, adv, 0.0)


@register("opid_shaping")
def opid_shaping(advantages: jax.Array, skill_logp: jax.Array,
                 old_logp: jax.Array, analyzed: jax.Array, *,
                 weight: float = 0.001,
                 mask: jax.Array | None = None) -> jax.Array:
  """OPID-style shaping: A_ij += w * (skill_logp_ij - old_logp_ij) on analyzed rows.

  Rows not analyzed keep their advantage unchanged (whatever `skill_logp`
  holds there is ignored). With `mask`, each analyzed row's shift is centred
  first: its mean over the row's masked tokens is subtracted, so the bonus
  sums to zero over the row's tokens. On the tokens of one context the shift
  averages about -KL(plain || skill-augmented) <= 0 whatever the skill says;
  uncentred, that mean is a penalty on every analyzed token.

  Args:
    advantages: [B, L] per-token advantages.
    skill_logp: [B, L] log-probs of the response under the skill-augmented prompt.
    old_logp: [B, L] log-probs under the plain prompt (theta_old).
    analyzed: [B] bool, whether the row's trajectory has a parsed skill.
    weight: w.
    mask: [B, L] response-token mask, or None (no centring).

  Returns:
    [B, L] float32 shaped advantages.
  """
  a = jnp.asarray(advantages, jnp.float32)
  shift = (jnp.asarray(skill_logp, jnp.float32)
           - jnp.asarray(old_logp, jnp.float32))
  if mask is not None:
    m = jnp.asarray(mask, bool)
    mean = losses.row_token_means(shift, m)[:, None]
    shift = jnp.where(m, shift - mean, 0.0)
  return jnp.where(jnp.asarray(analyzed, bool)[:, None], a + weight * shift, a)


def discounted_returns(rewards: Sequence[float] | np.ndarray,
                       traj_ids: Sequence[int] | np.ndarray, *,
                       gamma: float = 0.95) -> np.ndarray:
  """Host-side return-to-go G_t = r_t + gamma * G_{t+1} within each trajectory.

  Samples of a trajectory must appear in step order (other trajectories may
  interleave). Example: rewards [0, 0, 1], one trajectory, gamma 0.5 ->
  [0.25, 0.5, 1].

  Returns:
    [N] float32 returns.
  """
  r = np.asarray(rewards, np.float32)
  out = np.zeros_like(r)
  running: dict[Any, float] = {}
  for i in reversed(range(len(r))):
    t = traj_ids[i]
    running[t] = float(r[i]) + gamma * running.get(t, 0.0)
    out[i] = running[t]
  return out


@register("gigpo_step")
def gigpo_step_advantage(step_returns: Sequence[float] | np.ndarray,
                         group_ids: Sequence[Any] | np.ndarray,
                         observations: Sequence[str], *,
                         norm: str = "mean_std_norm",
                         eps: float = 1e-6) -> np.ndarray:
  """GiGPO step-level advantage (host-side), grouping by anchor state.

  Steps of one episode group whose raw observation is identical form a step
  group; within it, with G_i the step's discounted return-to-go,
    mean_std_norm:  A^S_i = (G_i - mean) / (std + eps)   (ddof=1)
    mean_norm:      A^S_i =  G_i - mean
  and a singleton step group takes mean 0, std 1, as in `grpo`. GiGPO adds
  this to the episode advantage: A_i = A^E_i + w * A^S_i.

  Args:
    step_returns: [N] G_i (see `discounted_returns`).
    group_ids: [N] episode-group ids (any hashable values).
    observations: N raw observation strings.
    norm: "mean_std_norm" or "mean_norm".
    eps: added to std.

  Returns:
    [N] float32 step advantages.

  Raises:
    ValueError: for an unknown `norm`, or inputs of different lengths.
  """
  if norm not in NORMS:
    raise ValueError(f"unknown norm {norm!r}; known: {list(NORMS)}")
  group_ids, observations = list(group_ids), list(observations)
  g = np.asarray(step_returns, np.float64)
  if not len(g) == len(group_ids) == len(observations):
    raise ValueError(f"gigpo_step_advantage needs one group id and one "
                     f"observation per step return: got {len(g)} returns, "
                     f"{len(group_ids)} group ids, {len(observations)} "
                     "observations")
  members: dict[tuple[Any, str], list[int]] = {}
  for i, key in enumerate(zip(group_ids, observations)):
    members.setdefault(key, []).append(i)
  out = np.zeros_like(g)
  for idx in members.values():
    vals = g[idx]
    mean, std = (0.0, 1.0) if len(idx) == 1 else (vals.mean(), vals.std(ddof=1))
    adv = vals - mean
    out[idx] = adv / (std + eps) if norm == "mean_std_norm" else adv
  return out.astype(np.float32)
