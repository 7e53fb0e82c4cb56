"""Advantage estimators against hand-computed arrays."""

import functools

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from seed_jax import advantages

EPS = 1e-6


@functools.lru_cache(maxsize=None)
def _jit_grpo(**static):
  return jax.jit(functools.partial(advantages.grpo, **static))


def grpo(scores, groups, trajs, **kw):
  n_g, n_t = int(max(groups)) + 1, int(max(trajs)) + 1
  mask = kw.pop("sample_mask", None)
  fn = _jit_grpo(num_groups=n_g, num_trajs=n_t, **kw)
  return np.asarray(fn(np.asarray(scores, np.float32), np.asarray(groups),
                       np.asarray(trajs), sample_mask=mask))


def test_sample_scores():
  fn = jax.jit(advantages.sample_scores)
  got = fn(np.array([1.0, 1.0, 0.0, 0.0]), np.array([True, False, True, False]))
  np.testing.assert_allclose(got, [1.0, 0.9, 0.0, -0.1], rtol=1e-6)
  got = jax.jit(functools.partial(advantages.sample_scores, invalid_penalty=0.5))(
      np.array([2.0]), np.array([False]))
  np.testing.assert_allclose(got, [1.5])


def test_grpo_mean_std_norm_over_samples():
  # One group of four one-step trajectories, scores [1, 0, 0, 1]: mean 0.5,
  # unbiased std sqrt(1/3); a fifth sample alone in group 1.
  got = grpo([1, 0, 0, 1, 0.7], [0, 0, 0, 0, 1], [0, 1, 2, 3, 4])
  a = 0.8660239  # 0.5 / (sqrt(1/3) + 1e-6)
  np.testing.assert_allclose(got, [a, -a, -a, a, 0.7 / (1 + EPS)], rtol=1e-5)


def test_grpo_mean_norm_over_samples():
  got = grpo([1, 0, 0, 1, 0.7], [0, 0, 0, 0, 1], [0, 1, 2, 3, 4],
             norm="mean_norm")
  np.testing.assert_allclose(got, [0.5, -0.5, -0.5, 0.5, 0.7], rtol=1e-6)


# Group 0: trajectory 0 has two steps (scores 1.0, 0.9: the second action was
# invalid), trajectory 1 one step (0.0), trajectory 2 two steps (0.0, -0.2).
# Group 1: trajectory 3 alone, two steps (0.5, 0.4).
SCORES = [1.0, 0.9, 0.0, 0.0, -0.2, 0.5, 0.4]
GROUPS = [0, 0, 0, 0, 0, 1, 1]
TRAJS = [0, 0, 1, 2, 2, 3, 3]


def test_grpo_over_trajectories():
  # Trajectory means [0.95, 0, -0.1]: mean 0.283333, std (ddof 1) 0.579511.
  # Trajectory 3 is a singleton group: mean 0, std 1.
  got = grpo(SCORES, GROUPS, TRAJS, stats_over="trajectories")
  want = [1.2366721, 1.0641132, -0.4889169, -0.4889169, -0.8340347,
          0.5 / (1 + EPS), 0.4 / (1 + EPS)]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  got = grpo(SCORES, GROUPS, TRAJS, stats_over="trajectories", norm="mean_norm")
  m = 0.85 / 3
  np.testing.assert_allclose(
      got, [1.0 - m, 0.9 - m, -m, -m, -0.2 - m, 0.5, 0.4], rtol=1e-5, atol=1e-6)


def test_grpo_over_samples_same_batch_differs():
  # The five samples of group 0 each count: mean 0.34, std 0.563915; group 1
  # has two samples, so it is no singleton here: mean 0.45, std 0.0707107.
  got = grpo(SCORES, GROUPS, TRAJS, stats_over="samples")
  want = [1.1703873, 0.9930559, -0.6029268, -0.6029268, -0.9575896,
          0.7070968, -0.7070968]
  np.testing.assert_allclose(got, want, rtol=1e-4)


def test_grpo_sample_mask_ignores_padding():
  base = grpo([1, 0, 0, 1], [0, 0, 0, 0], [0, 1, 2, 3])
  padded = grpo([1, 0, 0, 1, 9.0, -9.0], [0, 0, 0, 0, 0, 0],
                [0, 1, 2, 3, 4, 5],
                sample_mask=np.array([True] * 4 + [False] * 2))
  np.testing.assert_allclose(padded[:4], base, rtol=1e-6)
  np.testing.assert_array_equal(padded[4:], [0.0, 0.0])


def test_grpo_unjitted_host_ids_and_errors():
  got = advantages.grpo(np.array([1.0, 0.0]), np.array([0, 0]), np.array([0, 1]),
                        norm="mean_norm")
  np.testing.assert_allclose(got, [0.5, -0.5])
  with pytest.raises(ValueError, match="mean_std_norm"):
    advantages.grpo(np.zeros(2), np.zeros(2, int), np.zeros(2, int), norm="z")
  with pytest.raises(ValueError, match="trajectories"):
    advantages.grpo(np.zeros(2), np.zeros(2, int), np.zeros(2, int),
                    stats_over="z")


def test_grpo_rejects_concrete_ids_out_of_range():
  # Too few groups used to drop group 2 from the statistics (its gathers
  # clamped to group 1) without a word.
  scores = np.array([1.0, 0.0, 1.0, 0.0, 5.0, 3.0], np.float32)
  groups, trajs = np.array([0, 0, 1, 1, 2, 2]), np.arange(6)
  with pytest.raises(ValueError, match=r"group_ids must lie in \[0, "
                     r"num_groups=2\), got ids in \[0, 2\]"):
    advantages.grpo(scores, groups, trajs, num_groups=2, num_trajs=6)
  with pytest.raises(ValueError, match=r"num_trajs=4\)"):
    advantages.grpo(scores, groups, trajs, num_groups=3, num_trajs=4,
                    stats_over="trajectories")
  with pytest.raises(ValueError, match=r"got ids in \[-1, 1\]"):
    advantages.grpo(scores, np.array([0, 0, 1, 1, -1, -1]), trajs,
                    num_groups=2, num_trajs=6)
  # Concrete device arrays are checked too; padding rows are not.
  with pytest.raises(ValueError, match="num_groups=2"):
    advantages.grpo(jax.numpy.asarray(scores), jax.numpy.asarray(groups),
                    trajs, num_groups=2, num_trajs=6)
  got = advantages.grpo(scores, groups, trajs, num_groups=2, num_trajs=6,
                        sample_mask=np.array([True] * 4 + [False] * 2))
  np.testing.assert_array_equal(np.asarray(got)[4:], [0.0, 0.0])
  # Under jit the ids are traced: no check, and it still compiles.
  fn = jax.jit(functools.partial(advantages.grpo, num_groups=3, num_trajs=6))
  np.testing.assert_allclose(fn(scores, groups, trajs)[4:],
                             advantages.grpo(scores, groups, trajs)[4:])


def test_dense_ids():
  ids, n = advantages.dense_ids(["b", "a", "b", "c"])
  np.testing.assert_array_equal(ids, [0, 1, 0, 2])
  assert n == 3


def _reference(scores, groups, trajs, norm, stats_over):
  """A loop in the shape of the PyTorch reference, trajectory value = mean."""
  per_group = {}
  for g in set(groups):
    if stats_over == "samples":
      vals = [s for s, gi in zip(scores, groups) if gi == g]
    else:
      ts = sorted({t for t, gi in zip(trajs, groups) if gi == g})
      vals = [np.mean([s for s, ti in zip(scores, trajs) if ti == t]) for t in ts]
    std = np.std(vals, ddof=1) if len(vals) > 1 else 0.0
    per_group[g] = (0.0, 1.0) if len(vals) == 1 else (
        np.mean(vals), std if std > advantages.EQUAL_STD else 1.0)
  out = []
  for s, g in zip(scores, groups):
    mean, std = per_group[g]
    out.append((s - mean) / (std + EPS) if norm == "mean_std_norm" else s - mean)
  return np.array(out)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    scores=st.lists(st.sampled_from([0.0, 1.0, -0.1, 0.9, 0.5]), min_size=12,
                    max_size=12),
    trajs=st.lists(st.integers(0, 5), min_size=12, max_size=12),
    norm=st.sampled_from(advantages.NORMS),
    stats_over=st.sampled_from(advantages.STATS_OVER))
def test_grpo_matches_reference_loop(scores, trajs, norm, stats_over):
  trajs[:6] = range(6)  # every trajectory present, ids stay dense
  groups = [t % 3 for t in trajs]  # a trajectory lies in one group
  fn = _jit_grpo(num_groups=3, num_trajs=6, norm=norm, stats_over=stats_over)
  got = fn(np.array(scores, np.float32), np.array(groups), np.array(trajs))
  want = _reference(scores, groups, trajs, norm, stats_over)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("stats_over", advantages.STATS_OVER)
def test_grpo_equal_scores_give_exact_zero(stats_over):
  # Three-step trajectories that all score 0.9: float32 rounding must not be
  # blown up by 1 / eps.
  scores = [0.9] * 9
  trajs = [0, 0, 0, 1, 1, 1, 2, 2, 2]
  got = grpo(scores, [0] * 9, trajs, stats_over=stats_over)
  np.testing.assert_array_equal(got, np.zeros(9))


def test_grpo_equal_trajectories_keep_only_step_penalties():
  # Two failed trajectories of equal value whose steps differ by the invalid
  # penalty: over trajectories the group std is 0, and the samples must keep
  # their small deviations instead of being divided by eps (+-5e4).
  got = grpo([0.0, -0.1, 0.0, -0.1], [0] * 4, [0, 0, 1, 1],
             stats_over="trajectories")
  np.testing.assert_allclose(got, [0.05, -0.05, 0.05, -0.05], rtol=1e-5)
  # Equal values reached through float32 sums of different lengths.
  scores = [0.0, -0.1, 0.0] + [-0.1, 0.0, 0.0, -0.1, 0.0, 0.0]
  got = grpo(scores, [0] * 9, [0] * 3 + [1] * 6, stats_over="trajectories")
  np.testing.assert_allclose(got, np.array(scores) + 0.1 / 3, atol=1e-6)


def test_opid_shaping():
  adv = np.array([[1.0, 1.0], [-1.0, -1.0]])
  skill = np.array([[-0.5, -3.0], [np.nan, np.nan]])
  old = np.array([[-1.0, -2.0], [-1.0, -1.0]])
  fn = jax.jit(functools.partial(advantages.opid_shaping, weight=0.1))
  got = fn(adv, skill, old, np.array([True, False]))
  np.testing.assert_allclose(got, [[1.05, 0.9], [-1.0, -1.0]], rtol=1e-6)


def test_opid_shaping_centred_sums_to_zero_per_row():
  adv = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [0.5, 0.5, 0.5]])
  skill = np.array([[-0.5, -3.0, 9.0], [-2.0, -1.0, 9.0], [np.nan] * 3])
  old = np.array([[-1.0, -2.0, 0.0], [-1.0, -1.0, 0.0], [-1.0] * 3])
  mask = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 1]])
  fn = jax.jit(functools.partial(advantages.opid_shaping, weight=0.1))
  got = fn(adv, skill, old, np.array([True, True, False]), mask=mask)
  # Row 0: shifts +0.5, -1.0 (mean -0.25) -> +0.75, -0.75; padding untouched.
  # Row 1: shifts -1.0, 0.0 (mean -0.5) -> -0.5, +0.5.
  np.testing.assert_allclose(
      got, [[1.075, 0.925, 1.0], [-1.05, -0.95, 0.0], [0.5, 0.5, 0.5]],
      rtol=1e-6)
  # Uncentred, the same rows lose the mean shift on every token.
  got = fn(adv, skill, old, np.array([True, True, False]))
  np.testing.assert_allclose(got[1, :2], [-1.1, -1.0], rtol=1e-6)


def test_gigpo_step_advantage():
  # Step groups: (0, "a") -> returns [1, 0]; (0, "b") and (1, "a") singletons.
  got = advantages.gigpo_step_advantage(
      [1.0, 0.5, 0.0, 0.3], [0, 0, 0, 1], ["a", "b", "a", "a"])
  a = 0.5 / (np.std([1.0, 0.0], ddof=1) + EPS)
  np.testing.assert_allclose(got, [a, 0.5 / (1 + EPS), -a, 0.3 / (1 + EPS)],
                             rtol=1e-6)
  got = advantages.gigpo_step_advantage(
      [1.0, 0.5, 0.0, 0.3], [0, 0, 0, 1], ["a", "b", "a", "a"], norm="mean_norm")
  np.testing.assert_allclose(got, [0.5, 0.5, -0.5, 0.3], rtol=1e-6)


def test_gigpo_step_advantage_rejects_unequal_lengths():
  # A short id list used to leave the last steps out (advantage 0).
  with pytest.raises(ValueError, match="3 returns, 2 group ids, 3 obs"):
    advantages.gigpo_step_advantage([1.0, 0.0, 1.0], [0, 0], ["a", "a", "a"])
  with pytest.raises(ValueError, match="3 returns, 3 group ids, 2 obs"):
    advantages.gigpo_step_advantage([1.0, 0.0, 1.0], [0, 0, 0], ["a", "a"])


def test_discounted_returns_interleaved():
  got = advantages.discounted_returns([0.0, 2.0, 0.0, 0.0, 1.0],
                                      ["x", "y", "x", "y", "x"], gamma=0.5)
  np.testing.assert_allclose(got, [0.25, 2.0, 0.5, 0.0, 1.0])


def test_registry():
  assert advantages.get("grpo") is advantages.grpo
  assert advantages.get("opid_shaping") is advantages.opid_shaping
  with pytest.raises(ValueError, match="gigpo_step"):
    advantages.get("nope")
