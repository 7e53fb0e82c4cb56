"""Policy losses (PPO clip, gated OPD, k3 KL, entropy), registered by name.

Per-token arrays are `[B, L]` over response tokens, float32; `mask` is the
response mask (1 on response tokens, 0 on padding). `sg` is stop-gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from seed_jax import registry as registry_lib

_REGISTRY = registry_lib.Registry("loss")
register = _REGISTRY.register
get = _REGISTRY.get

Metrics = dict[str, jax.Array]

# exp() of a log-ratio beyond this overflows float32 gradients; verl clamps alike.
_MAX_LOG_RATIO = 20.0


def _f32(x: jax.Array) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


@register("token_mean")
def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(x * mask) / max(sum(mask), 1): every response token weighs the same.

  Masked positions are dropped with a select, so a non-finite value there does
  not leak into the mean. An empty mask gives 0.

  Args:
    x: [B, L] per-token values.
    mask: [B, L] 0/1 or bool.

  Returns:
    Scalar float32.
  """
  m = _f32(mask)
  total = jnp.sum(jnp.where(m > 0, _f32(x), 0.0) * m)
  return total / jnp.maximum(jnp.sum(m), 1.0)


def row_token_means(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Each row's mean over its masked tokens ([B, L] -> [B]; 0 for an empty
  row). Masked positions are dropped with a select, as in `token_mean`."""
  m = _f32(mask)
  return (jnp.sum(jnp.where(m > 0, _f32(x), 0.0) * m, axis=-1)
          / jnp.maximum(jnp.sum(m, axis=-1), 1.0))


@register("seq_mean_token_mean")
def seq_mean_token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean over non-empty rows of each row's token mean: rows weigh the same.

  Args:
    x: [B, L] per-token values.
    mask: [B, L] 0/1 or bool.

  Returns:
    Scalar float32 (0 when every row is empty).
  """
  rows = row_token_means(x, mask)  # [B]
  has = (jnp.sum(_f32(mask), axis=-1) > 0).astype(jnp.float32)
  return jnp.sum(rows * has) / jnp.maximum(jnp.sum(has), 1.0)


@register("ppo_clip")
def ppo_clip(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
             mask: jax.Array, *, clip_low: float = 0.2, clip_high: float = 0.2,
             dual_clip: float | None = 3.0) -> tuple[jax.Array, Metrics]:
  """PPO clipped surrogate with dual clip, token mean.

    rho = exp(logp - old_logp)            (log-ratio clamped to [-20, 20])
    pg  = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
    pg  = min(pg, -A * dual_clip)         where A < 0 (dual clip, as verl)
    L   = token_mean(pg, mask)

  The dual clip bounds the loss of a negative-advantage token whose ratio has
  grown large: its gradient is zero once -A * rho would exceed -A * dual_clip.

  Args:
    logp: [B, L] log pi_theta(token), differentiated.
    old_logp: [B, L] log pi_theta_old(token).
    advantages: [B, L], or [B] broadcast over tokens.
    mask: [B, L] response mask.
    clip_low: lower clip range.
    clip_high: upper clip range.
    dual_clip: the dual-clip constant (> 1), or None to disable.

  Returns:
    (loss, metrics) with metrics `pg_loss`, `pg_clipfrac` (share of tokens where
    the clipped term is taken), `pg_clipfrac_lower` (share cut by the dual
    clip) and `ppo_kl` (token mean of old_logp - logp).
  """
  logp, old_logp = _f32(logp), jax.lax.stop_gradient(_f32(old_logp))
  adv = jax.lax.stop_gradient(_f32(advantages))
  if adv.ndim == 1:
    adv = adv[:, None]
  log_ratio = jnp.clip(logp - old_logp, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  ratio = jnp.exp(log_ratio)
  pg1 = -adv * ratio
  pg2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  pg = jnp.maximum(pg1, pg2)
  clipped = (pg2 > pg1).astype(jnp.float32)
  if dual_clip is None:
    lower = jnp.zeros_like(pg)
  else:
    pg3 = -adv * dual_clip
    lower = ((pg > pg3) & (adv < 0)).astype(jnp.float32)
    pg = jnp.where(adv < 0, jnp.minimum(pg, pg3), pg)
  loss = token_mean(pg, mask)
  metrics = {
      "pg_loss": loss,
      "pg_clipfrac": token_mean(clipped, mask),
      "pg_clipfrac_lower": token_mean(lower, mask),
      "ppo_kl": jax.lax.stop_gradient(token_mean(-log_ratio, mask)),
  }
  return loss, metrics


WEIGHT_PREFIX = "weight/"


def weight_key(name: str) -> str:
  """The metrics key of `name`'s weight: how many tokens its mean is over.

  Averages across micro-batches (`train_step.train_step`) and mini-batches
  (`metrics.Averager`) weight a metric by it, so that a batch with no token
  to average (no analyzed row, only padding rows) does not pull it to 0.
  """
  return WEIGHT_PREFIX + name


def with_token_weights(metrics: Metrics, mask: jax.Array) -> Metrics:
  """`metrics` with the response-token count as the weight of every metric
  that has none yet."""
  n = jnp.sum(_f32(mask) > 0).astype(jnp.float32)
  out = dict(metrics)
  for name in metrics:
    if not name.startswith(WEIGHT_PREFIX):
      out.setdefault(weight_key(name), n)
  return out


@register("gated_opd")
def gated_opd(logp: jax.Array, skill_logp: jax.Array, mask: jax.Array,
              analyzed: jax.Array, *,
              beta: float = 5.0) -> tuple[jax.Array, Metrics]:
  """Gated on-policy distillation toward the skill-augmented context.

  Over the active tokens (response tokens of analyzed rows), n of them:
    gap   = sg(skill_logp - logp)
    g     = sg(sigmoid(beta * gap))
    L_opd = sum(g * (sg(skill_logp) - logp)) / max(n, 1)
  so dL/dlogp = -g / n on active tokens and 0 elsewhere: every sampled token
  is raised, more where the skill context agrees with it. No active token
  gives exactly 0 with a zero gradient. `skill_logp` of inactive tokens is
  never read (it may hold anything, NaN included).

  Args:
    logp: [B, L] log pi_theta(token | plain prompt), differentiated.
    skill_logp: [B, L] log pi_theta_old(token | skill-augmented prompt).
    mask: [B, L] response mask.
    analyzed: [B] bool, whether the row's trajectory has a parsed skill.
    beta: gate sharpness.

  Returns:
    (loss, metrics) with metrics `opd_loss`, `opd_gate_mean`, `opd_gap_mean`
    (both over active tokens, which `weight_key` of each counts) and
    `opd_active_ratio` (active / response tokens).
  """
  logp = _f32(logp)
  active = (_f32(mask) > 0) & jnp.asarray(analyzed, bool)[:, None]
  # Select before any arithmetic so that garbage in inactive rows cannot
  # reach the loss or its gradient.
  skill = jax.lax.stop_gradient(
      jnp.where(active, _f32(skill_logp), logp))
  gap = jax.lax.stop_gradient(skill - logp)
  gate = jax.lax.stop_gradient(jax.nn.sigmoid(beta * gap))
  loss = token_mean(gate * (skill - logp), active)
  n_resp = jnp.sum(_f32(mask) > 0)
  n_active = jnp.sum(active).astype(jnp.float32)
  metrics = {
      "opd_loss": loss,
      "opd_gate_mean": token_mean(gate, active),
      "opd_gap_mean": token_mean(gap, active),
      "opd_active_ratio": n_active / jnp.maximum(n_resp, 1),
      weight_key("opd_gate_mean"): n_active,
      weight_key("opd_gap_mean"): n_active,
  }
  return loss, metrics


@register("kl_k3")
def kl_k3(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """k3 ("low_var_kl") estimate of KL(pi_theta || pi_ref), token mean.

    d  = clip(ref_logp - logp, -20, 20)
    kl = clip(exp(d) - d - 1, -10, 10)     (r - log r - 1 with r = exp(d))

  Args:
    logp: [B, L] log pi_theta(token), differentiated.
    ref_logp: [B, L] log pi_ref(token).
    mask: [B, L] response mask.

  Returns:
    Scalar float32.
  """
  d = jax.lax.stop_gradient(_f32(ref_logp)) - _f32(logp)
  d = jnp.clip(d, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  kl = jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)
  return token_mean(kl, mask)


def token_entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Per-token entropy H = logsumexp(z) - sum(softmax(z) * z), in float32.

  Args:
    logits: [B, L, V] (any float dtype; upcast because bfloat16 softmax sums
      lose the small probabilities).

  Returns:
    [B, L] float32.
  """
  z = _f32(logits)
  p = jax.nn.softmax(z, axis=-1)
  return jax.nn.logsumexp(z, axis=-1) - jnp.sum(p * z, axis=-1)


@register("entropy")
def entropy(token_entropy: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean policy entropy H = token_mean(entropy per token, mask).

  Args:
    token_entropy: [B, L] (see `token_entropy_from_logits`).
    mask: [B, L] response mask.

  Returns:
    Scalar float32.
  """
  return token_mean(token_entropy, mask)


def _is_zero(coef: Any) -> bool:
  return isinstance(coef, (int, float)) and coef == 0


@register("seed")
def seed_loss(logp: jax.Array, token_entropy: jax.Array | None,
              batch: Mapping[str, jax.Array], *, opd_coef: float = 0.01,
              opd_beta: float = 5.0, kl_coef: float = 0.01,
              entropy_coef: float = 0.001, clip_low: float = 0.2,
              clip_high: float = 0.2,
              dual_clip: float | None = 3.0) -> tuple[jax.Array, Metrics]:
  """The SEED objective on one micro-batch.

    L = L_ppo + opd_coef * L_opd + kl_coef * KL_k3 - entropy_coef * H

  GRPO is the same with opd_coef = 0. A term whose coefficient is the Python
  number 0 is skipped, and its inputs may be absent from `batch`; its metrics
  are then not reported. With no analyzed row L_opd is exactly 0, so the
  loss equals the GRPO loss.

  Args:
    logp: [B, L] log pi_theta(response token | plain prompt), differentiated.
    token_entropy: [B, L] per-token entropy of pi_theta, or None when
      entropy_coef is 0.
    batch: arrays, all [B, L] float32 unless noted:
      `old_logp`: log pi_theta_old(token | plain prompt);
      `ref_logp`: log pi_ref(token | plain prompt) (needed if kl_coef != 0);
      `skill_logp`: log pi_theta_old(token | skill-augmented prompt)
        (needed if opd_coef != 0; any value on rows not analyzed);
      `advantages`: per-token advantages ([B] is broadcast);
      `response_mask`: 1 on response tokens;
      `analyzed`: [B] bool, the row's trajectory has a parsed skill (needed if
        opd_coef != 0).
    opd_coef: lambda, weight of the gated OPD loss.
    opd_beta: gate sharpness beta.
    kl_coef: beta_kl, weight of the k3 KL to the reference.
    entropy_coef: c_ent, weight of the entropy bonus.
    clip_low: PPO lower clip range.
    clip_high: PPO upper clip range.
    dual_clip: dual-clip constant, or None.

  Returns:
    (loss, metrics): `loss`, the PPO metrics, and where computed `opd_*`,
    `kl`, `entropy`.
  """
  mask = batch["response_mask"]
  loss, metrics = ppo_clip(logp, batch["old_logp"], batch["advantages"], mask,
                           clip_low=clip_low, clip_high=clip_high,
                           dual_clip=dual_clip)
  if not _is_zero(opd_coef):
    opd, opd_metrics = gated_opd(logp, batch["skill_logp"], mask,
                                 batch["analyzed"], beta=opd_beta)
    loss = loss + opd_coef * opd
    metrics.update(opd_metrics)
  if not _is_zero(kl_coef):
    kl = kl_k3(logp, batch["ref_logp"], mask)
    loss = loss + kl_coef * kl
    metrics["kl"] = kl
  if not _is_zero(entropy_coef):
    ent = entropy(token_entropy, mask)
    loss = loss - entropy_coef * ent
    metrics["entropy"] = ent
  metrics["loss"] = loss
  return loss, with_token_weights(metrics, mask)
