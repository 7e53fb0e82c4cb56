"""Log-probs of given responses: single-context and dual-context scoring.

The dual form scores the same response tokens after two different prompts
(ordinary and skill-augmented) in one forward: each row packs its two contexts
on the length axis as two segments that do not attend to each other, so that
neither is padded to the other's length. Log-softmax runs in float32 over
chunks of the response so that [B, R, V] float32 logits never exist at once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from seed_jax import model as model_lib
from seed_jax import token_ids


def _chunked_logp(params, hidden, targets, *, config, chunk: int,
                  with_entropy: bool, temperature: float = 1.0):
  """Per-token log p(target) (and entropy) from hidden states, in chunks.

  Args:
    hidden: [B, R, D] states that predict `targets`.
    targets: [B, R] int32.
    temperature: of softmax(logits / temperature), the distribution scored.

  Returns:
    logp [B, R] float32 and entropy [B, R] float32 (zeros unless asked).
  """
  B, R, D = hidden.shape
  n = -(-R // chunk)
  pad = n * chunk - R
  h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  t = jnp.pad(targets, ((0, 0), (0, pad)))
  h = h.reshape(B, n, chunk, D).swapaxes(0, 1)  # [n, B, c, D]
  t = t.reshape(B, n, chunk).swapaxes(0, 1)  # [n, B, c]

  # Rematerialized: the backward pass recomputes one chunk's logits at a time
  # instead of keeping all of them.
  @jax.checkpoint
  def one(args):
    hc, tc = args
    lg = model_lib.logits(params, hc, config=config)  # [B, c, V] float32
    if temperature != 1.0:
      lg = lg / temperature
    lsm = jax.nn.log_softmax(lg, axis=-1)
    lp = jnp.take_along_axis(lsm, tc[..., None], axis=-1)[..., 0]
    if with_entropy:
      ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
    else:
      ent = jnp.zeros_like(lp)
    return lp, ent

  lp, ent = jax.lax.map(one, (h, t))
  lp = lp.swapaxes(0, 1).reshape(B, n * chunk)[:, :R]
  ent = ent.swapaxes(0, 1).reshape(B, n * chunk)[:, :R]
  return lp, ent


def _check_ids(config, **arrays) -> None:
  """`token_ids.check_token_ids` on name=(ids, mask) pairs."""
  token_ids.check_token_ids(config.vocab_size,
                            {k: v[0] for k, v in arrays.items()},
                            {k: v[1] for k, v in arrays.items()})


def score_tokens(params, prompts, prompt_mask, responses, response_mask, *,
                 config: model_lib.ModelConfig, chunk: int = 64,
                 with_entropy: bool = False, remat: bool = False,
                 temperature: float = 1.0):
  """Log-probs of right-padded responses after left-padded prompts (traceable).

  Args:
    prompts: [B, P] int32, left-padded; prompt_mask [B, P].
    responses: [B, R] int32, right-padded; response_mask [B, R].
    temperature: log-probs (and entropies) of softmax(logits / temperature),
      the distribution RL samples its rollouts from.

  Returns:
    (logp [B, R], entropy [B, R]) float32; zero where response_mask is 0.

  Raises:
    ValueError: on a token id outside [0, vocab_size), padding included,
      when the arrays can be read on the host (not inside a caller's jit);
      `score` and `score_dual` check the same before their jit.
  """
  _check_ids(config, prompts=(prompts, prompt_mask),
             responses=(responses, response_mask))
  P = prompts.shape[1]
  R = responses.shape[1]
  tokens = jnp.concatenate([prompts, responses], axis=1)
  mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(bool)
  positions = model_lib.positions_from_mask(mask)
  hidden, _ = model_lib.forward(params, tokens, positions, mask,
                                config=config, remat=remat)
  # The state at position P-1+j predicts response token j.
  h = jax.lax.dynamic_slice_in_dim(hidden, P - 1, R, axis=1)
  lp, ent = _chunked_logp(params, h, responses, config=config, chunk=chunk,
                          with_entropy=with_entropy, temperature=temperature)
  rm = response_mask.astype(bool)
  return jnp.where(rm, lp, 0.0), jnp.where(rm, ent, 0.0)


def _check_single(params, prompts, prompt_mask, responses, response_mask, *,
                  config, **kwargs):
  del params, kwargs
  _check_ids(config, prompts=(prompts, prompt_mask),
             responses=(responses, response_mask))


def _check_dual(params, prompts_a, mask_a, prompts_b, mask_b, responses,
                response_mask, *, config, **kwargs):
  del params, kwargs
  _check_ids(config, prompts_a=(prompts_a, mask_a),
             prompts_b=(prompts_b, mask_b),
             responses=(responses, response_mask))


@token_ids.host_checked(_check_single)
@functools.partial(jax.jit, static_argnames=("config", "chunk", "temperature"))
def score(params, prompts, prompt_mask, responses, response_mask, *,
          config: model_lib.ModelConfig, chunk: int = 64,
          temperature: float = 1.0) -> jax.Array:
  """Single-context log-probs [B, R] (old and reference log-probs)."""
  return score_tokens(params, prompts, prompt_mask, responses, response_mask,
                      config=config, chunk=chunk, temperature=temperature)[0]


@token_ids.host_checked(_check_dual)
@functools.partial(jax.jit, static_argnames=("config", "chunk", "temperature"))
def score_dual(params, prompts_a, mask_a, prompts_b, mask_b, responses,
               response_mask, *, config: model_lib.ModelConfig,
               chunk: int = 64, temperature: float = 1.0
               ) -> tuple[jax.Array, jax.Array]:
  """Log-probs of the same responses under two contexts, in one forward.

  Each row packs its two sequences on the length axis, [prompt_a, response,
  prompt_b, response] ([B, Pa + Pb + 2R]), as two segments that attend only
  within themselves: every dense layer runs once over both contexts, and
  neither prompt is padded to the other's length (stacking them on the batch
  axis would pad the ordinary prompt to the augmented one's bucket).

  Args:
    prompts_a: [B, Pa] left-padded ordinary prompts; mask_a [B, Pa].
    prompts_b: [B, Pb] left-padded augmented prompts; mask_b [B, Pb].
    responses: [B, R] right-padded; response_mask [B, R].
    temperature: as in `score_tokens`.

  Returns:
    (logp_a, logp_b), each [B, R] float32; zero where response_mask is 0.
  """
  B, R = responses.shape
  Pa, Pb = prompts_a.shape[1], prompts_b.shape[1]
  La = Pa + R
  tokens = jnp.concatenate([prompts_a, responses, prompts_b, responses],
                           axis=1)
  mask = jnp.concatenate([mask_a, response_mask, mask_b, response_mask],
                         axis=1).astype(bool)
  positions = jnp.concatenate([model_lib.positions_from_mask(mask[:, :La]),
                               model_lib.positions_from_mask(mask[:, La:])],
                              axis=1)
  hidden, _ = model_lib.forward(params, tokens, positions, mask,
                                config=config, segments=(La, Pb + R))
  # The state before each response token predicts it, in either segment.
  h = jnp.concatenate([hidden[:, Pa - 1:Pa - 1 + R],
                       hidden[:, La + Pb - 1:La + Pb - 1 + R]], axis=0)
  lp, _ = _chunked_logp(params, h, jnp.concatenate([responses, responses]),
                        config=config, chunk=chunk, with_entropy=False,
                        temperature=temperature)
  lp = jnp.where(jnp.concatenate([response_mask, response_mask]).astype(bool),
                 lp, 0.0)
  return lp[:B], lp[B:]
