"""Stage 2: one SEED / GRPO update, and evaluation without skills.

An update (DESIGN.md section 1.3): roll out B groups x N with theta_old ->
sample scores and GRPO advantages -> self-analysis with the same weights
(greedy) -> skill-augmented prompts -> ordinary and augmented contexts scored
in one dual call (old and skill log-probs) and the reference log-probs ->
mini-batched train steps on the combined loss.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
import optax

from seed_jax import advantages as adv_lib
from seed_jax import metrics as metrics_lib
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import scorer
from seed_jax import skills
from seed_jax import train_step as ts
from seed_jax.envs import base as envs_base

VARIANTS = ("grpo", "seed", "opid")
ANALYZERS = ("self", "external")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Knobs of one RL update (defaults: DESIGN.md section 1.3).

  variant: "grpo" (no analysis, no distillation), "seed" (gated OPD loss) or
    "opid" (skill log-prob shift added to the advantage, no OPD loss).
  analyzer: "self" (the policy analyzes, greedily) or "external" (a teacher).
  """
  variant: str = "seed"
  analyzer: str = "self"
  num_groups: int = 16  # B
  group_size: int = 8  # N
  max_steps: int = 30
  history_length: int = 2
  temperature: float = 1.0
  max_new_tokens: int = 64  # response budget per turn
  analysis_max_new_tokens: int = 160
  analysis_mode: str = "episode_only"
  analysis_max_chars: int | None = None
  prompt_buckets: tuple[int, ...] = (128, 256, 384, 512, 768, 1024, 2048)
  mini_batch_size: int = 32  # rows per optimizer step
  micro_batches: int = 1
  ppo_epochs: int = 1
  adv_norm: str = "mean_std_norm"
  adv_stats_over: str = "samples"
  invalid_penalty: float = 0.1
  opid_weight: float = 0.001
  opd_coef: float = 0.01
  opd_beta: float = 5.0
  kl_coef: float = 0.01
  entropy_coef: float = 0.001
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float = 3.0
  remat: bool = False

  def __post_init__(self):
    if self.variant not in VARIANTS:
      raise ValueError(f"unknown variant {self.variant!r}; known: {VARIANTS}")
    if self.analyzer not in ANALYZERS:
      raise ValueError(f"unknown analyzer {self.analyzer!r}; known: "
                       f"{ANALYZERS}")

  @property
  def analyzes(self) -> bool:
    return self.variant in ("seed", "opid")

  def loss_kwargs(self) -> dict[str, Any]:
    return dict(opd_coef=self.opd_coef if self.variant == "seed" else 0,
                opd_beta=self.opd_beta, kl_coef=self.kl_coef,
                entropy_coef=self.entropy_coef, clip_low=self.clip_low,
                clip_high=self.clip_high, dual_clip=self.dual_clip)


def _pad_rows(arrays: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends all-zero rows (masked out) up to a multiple of `multiple`."""
  n = next(iter(arrays.values())).shape[0]
  extra = -n % multiple
  if not extra:
    return arrays
  return {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)])
          for k, v in arrays.items()}


def _in_chunks(fn: Callable[..., Any], arrays: Sequence[np.ndarray],
               rows: int) -> list[np.ndarray]:
  """Applies `fn` to row chunks of equal size (one compilation) and concats."""
  n = arrays[0].shape[0]
  outs = []
  for start in range(0, n, rows):
    res = fn(*[a[start:start + rows] for a in arrays])
    outs.append(jax.device_get(res))
  if isinstance(outs[0], tuple):
    return [np.concatenate(parts) for parts in zip(*outs)]
  return [np.concatenate(outs)]


class RLTrainer:
  """Runs SEED/GRPO updates for one policy on one environment."""

  def __init__(self, model_config, tokenizer, rl: RLConfig, *, env_name: str,
               tx: optax.GradientTransformation, env_kwargs=None,
               teacher=None):
    self.config = model_config
    self.tokenizer = tokenizer
    self.rl = rl
    self.env_name = env_name
    self.env_kwargs = dict(env_kwargs or {})
    self.teacher = teacher
    if rl.analyzes and rl.analyzer == "external" and teacher is None:
      raise ValueError("analyzer='external' needs a teacher (an "
                       "OpenAI-compatible endpoint)")
    self.policy = rollout_lib.Policy(
        model_config, tokenizer, max_new_tokens=rl.max_new_tokens,
        buckets=rl.prompt_buckets, min_rows=8)
    self.pool = envs_base.EnvPool(
        env_name, num_groups=rl.num_groups, group_size=rl.group_size,
        split="train", max_steps=rl.max_steps, **self.env_kwargs)
    loss_fn = functools.partial(ts.rl_loss, config=model_config,
                                remat=rl.remat, **rl.loss_kwargs())
    self.step_fn = ts.jit_train_step(tx, loss_fn,
                                     num_micro_batches=rl.micro_batches)
    self.pad_id = self.policy.pad_id
    self._dual = functools.partial(scorer.score_dual, config=model_config)
    self._single = functools.partial(scorer.score, config=model_config)

  # -- phases ---------------------------------------------------------------

  def _analyze(self, params, episodes, rng) -> tuple[dict[int, str], dict]:
    """Self- or external analysis -> {traj_uid: skill}, stats."""
    stats = skills.ParseStats()
    found: dict[int, str] = {}
    if self.rl.analyzer == "external":
      replies = self.teacher.annotate_many(episodes)
      for ep, rep in zip(episodes, replies):
        if rep and rep.get("episode_skill"):
          found[ep.traj_uid] = rep["episode_skill"]
      return found, {"analyses_parsed": len(found) / max(len(episodes), 1)}
    built = [skills.build_analysis_prompt(ep, mode=self.rl.analysis_mode,
                                          max_chars=self.rl.analysis_max_chars)
             for ep in episodes]
    gens = self.policy.generate(params, [b.text for b in built], rng,
                                sampler_lib.Greedy(),
                                max_new_tokens=self.rl.analysis_max_new_tokens)
    for ep, gen in zip(episodes, gens):
      parsed = stats.record(skills.parse_analysis(gen.text))
      if isinstance(parsed, skills.Analysis):
        found[ep.traj_uid] = parsed.skill
    return found, {"analyses_parsed": stats.rate,
                   "analysis_steps_cut": float(sum(b.steps_cut for b in built))}

  def update(self, state: ts.TrainState, ref_params, rng: jax.Array, *,
             update_index: int) -> tuple[ts.TrainState, dict[str, float]]:
    """One RL update; returns the new state and host-side metrics."""
    rl = self.rl
    times = {}
    t = time.time()
    rng_roll, rng_an, rng_perm = jax.random.split(rng, 3)
    seeds = envs_base.split_seeds("train", rl.num_groups,
                                  start=update_index * rl.num_groups)
    gen = lambda prompts, r: self.policy.generate(
        state.params, prompts, r, sampler_lib.Temperature(rl.temperature))
    res = rollout_lib.rollout(
        gen, self.pool, rng_roll, env_name=self.env_name,
        max_steps=rl.max_steps, history_length=rl.history_length,
        group_seeds=seeds, uid_offset=update_index * rl.num_groups)
    samples, episodes = res.samples, res.episodes
    times["time/rollout"] = time.time() - t

    # Scores and GRPO advantages over step samples.
    t = time.time()
    returns = np.asarray([episodes[s.traj_uid].episode_return
                          for s in samples], np.float32)
    valid = np.asarray([s.action_valid for s in samples])
    scores = adv_lib.sample_scores(returns, valid,
                                   invalid_penalty=rl.invalid_penalty)
    gids, ng = adv_lib.dense_ids([s.uid for s in samples])
    tids, nt = adv_lib.dense_ids([s.traj_uid for s in samples])
    adv = np.asarray(adv_lib.grpo(scores, gids, tids, num_groups=ng,
                                  num_trajs=nt, norm=rl.adv_norm,
                                  stats_over=rl.adv_stats_over))

    # Self-analysis with the pre-update weights.
    metrics: dict[str, float] = {}
    found: dict[int, str] = {}
    if rl.analyzes:
      found, an_metrics = self._analyze(state.params, episodes, rng_an)
      metrics.update(an_metrics)
    times["time/analysis"] = time.time() - t

    # Dual-context scoring: plain and skill-augmented prompts, one call.
    t = time.time()
    arrays = rollout_lib.pad_samples(samples, pad_id=self.pad_id,
                                     prompt_buckets=rl.prompt_buckets,
                                     response_len=rl.max_new_tokens)
    sampler_logp = arrays["old_logp"]
    analyzed = np.asarray([s.traj_uid in found for s in samples])
    skill_ids = [
        self.policy.encode(skills.build_skill_prompt(s.prompt,
                                                     found[s.traj_uid]))
        if s.traj_uid in found else s.prompt_ids for s in samples]
    sk = sampler_lib.pad_left(skill_ids, buckets=rl.prompt_buckets,
                              pad_id=self.pad_id)
    batch = dict(arrays, skill_prompts=sk.tokens, skill_mask=sk.mask,
                 advantages=np.broadcast_to(
                     adv[:, None], arrays["responses"].shape).astype(np.float32),
                 analyzed=analyzed)
    n = len(samples)
    batch = _pad_rows(batch, rl.mini_batch_size)
    b = batch
    if rl.analyzes:
      old_logp, skill_logp = _in_chunks(
          functools.partial(self._dual, state.params), (b["prompts"], b["prompt_mask"], b["skill_prompts"],
                       b["skill_mask"], b["responses"], b["response_mask"]),
          rl.mini_batch_size)
    else:
      (old_logp,) = _in_chunks(
          functools.partial(self._single, state.params), (b["prompts"], b["prompt_mask"], b["responses"],
                         b["response_mask"]), rl.mini_batch_size)
      skill_logp = old_logp
    if rl.kl_coef:
      (ref_logp,) = _in_chunks(
          functools.partial(self._single, ref_params),
          (b["prompts"], b["prompt_mask"], b["responses"],
           b["response_mask"]), rl.mini_batch_size)
    else:
      ref_logp = old_logp
    if rl.variant == "opid":
      batch["advantages"] = np.asarray(adv_lib.opid_shaping(
          batch["advantages"], skill_logp, old_logp, batch["analyzed"],
          weight=rl.opid_weight))
    batch.update(old_logp=old_logp, skill_logp=skill_logp, ref_logp=ref_logp)
    rmask = arrays["response_mask"].astype(bool)
    gap = (skill_logp[:n] - old_logp[:n])[rmask & analyzed[:, None]]
    metrics["logp_agreement"] = float(
        np.abs(old_logp[:n] - sampler_logp)[rmask].mean()) if rmask.any() else 0.0
    metrics["skill_logp_gap"] = float(gap.mean()) if gap.size else 0.0
    times["time/scoring"] = time.time() - t

    # Mini-batched optimizer steps over a shuffled order.
    t = time.time()
    train_keys = ("prompts", "prompt_mask", "responses", "response_mask",
                  "old_logp", "ref_logp", "skill_logp", "advantages",
                  "analyzed")
    avg = metrics_lib.Averager()  # on device; one host sync per update
    num_steps = 0
    rows = batch["prompts"].shape[0]
    for epoch in range(rl.ppo_epochs):
      perm = np.asarray(jax.random.permutation(
          jax.random.fold_in(rng_perm, epoch), rows))
      for start in range(0, rows, rl.mini_batch_size):
        idx = perm[start:start + rl.mini_batch_size]
        mb = {k: batch[k][idx] for k in train_keys}
        state, m = self.step_fn(state, mb)
        avg.update(m)
        num_steps += 1
    metrics.update(avg.compute())
    metrics["skipped"] = round(metrics["skipped"] * num_steps)  # a count
    times["time/train"] = time.time() - t
    metrics.update(times)
    metrics.update({
        "success_rate": float(np.mean([e.success for e in episodes])),
        "valid_action_ratio": float(valid.mean()) if n else 0.0,
        "episode_length": float(np.mean([e.length for e in episodes])),
        "env_steps": float(res.env_steps),
        "num_samples": float(n),
        "env_errors": float(sum(e.error is not None for e in episodes)),
        "prompts_truncated": float(self.policy.prompts_truncated),
    })
    return state, metrics


def evaluate(policy: rollout_lib.Policy, params, *, env_name: str, split: str,
             num_tasks: int, max_steps: int, history_length: int = 2,
             temperature: float = 0.4, rng: jax.Array | None = None,
             batch_groups: int = 16, env_kwargs=None) -> dict[str, float]:
  """Success rate on `num_tasks` tasks of a split, no skills in the prompt.

  Returns:
    {"success": overall rate, "success/<family>": per family, "tasks": n}.
  """
  rng = rng if rng is not None else jax.random.key(0)
  wins: dict[str, list[bool]] = collections.defaultdict(list)
  done = 0
  while done < num_tasks:
    groups = min(batch_groups, num_tasks - done)
    pool = envs_base.EnvPool(env_name, num_groups=groups, group_size=1,
                             split=split, max_steps=max_steps,
                             **dict(env_kwargs or {}))
    seeds = envs_base.split_seeds(split, groups, start=done)
    rng, sub = jax.random.split(rng)
    gen = lambda prompts, r: policy.generate(
        params, prompts, r, sampler_lib.Temperature(temperature))
    res = rollout_lib.rollout(gen, pool, sub, env_name=env_name,
                              max_steps=max_steps,
                              history_length=history_length,
                              group_seeds=seeds)
    for ep in res.episodes:
      wins[ep.family].append(ep.success)
    done += groups
  out = {"success": float(np.mean([w for v in wins.values() for w in v])),
         "tasks": float(done)}
  for fam, v in sorted(wins.items()):
    out[f"success/{fam}"] = float(np.mean(v))
  return out
