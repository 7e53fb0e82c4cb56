"""TrainState and the jitted, donated, micro-batched Optax train step."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import flax
import jax
import jax.numpy as jnp
import optax

from seed_jax import checkpoints
from seed_jax import losses
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import scorer

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


class TrainState(flax.struct.PyTreeNode):
  """Everything an update changes: parameters, optimizer state, step count."""
  step: jax.Array  # [] int32, updates applied
  params: model_lib.Params
  opt_state: optax.OptState

  @classmethod
  def create(cls, params, tx: optax.GradientTransformation) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params,
               opt_state=tx.init(params))


def make_optimizer(learning_rate: float = 1e-6, *, weight_decay: float = 0.01,
                   grad_clip: float = 1.0, warmup_steps: int = 0,
                   total_steps: int | None = None, schedule: str = "constant",
                   b1: float = 0.9, b2: float = 0.999) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and a constant or cosine schedule.

  Args:
    learning_rate: peak learning rate.
    weight_decay: decoupled weight decay.
    grad_clip: global gradient-norm clip (0 or None to disable).
    warmup_steps: linear warm-up from 0 (0: the first step at the peak).
    total_steps: length of the cosine schedule (required for "cosine").
    schedule: "constant" or "cosine".
  """
  if schedule == "cosine":
    if not total_steps:
      raise ValueError("a cosine schedule needs total_steps")
    if warmup_steps:
      lr = optax.warmup_cosine_decay_schedule(
          0.0, learning_rate, warmup_steps, max(total_steps, 2))
    else:  # the first step at the peak
      lr = optax.cosine_decay_schedule(learning_rate, total_steps)
  elif schedule == "constant":
    lr = (optax.linear_schedule(0.0, learning_rate, warmup_steps)
          if warmup_steps else learning_rate)
    if warmup_steps:
      lr = optax.join_schedules(
          [lr, optax.constant_schedule(learning_rate)], [warmup_steps])
  else:
    raise ValueError(f"unknown schedule {schedule!r}; known: constant, cosine")
  parts = []
  if grad_clip:
    parts.append(optax.clip_by_global_norm(grad_clip))
  parts.append(optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay))
  return optax.chain(*parts)


def policy_logp(params, batch: Batch, *, config: model_lib.ModelConfig,
                with_entropy: bool, remat: bool = False, chunk: int = 64,
                temperature: float = 1.0):
  """Current log-probs and entropies [B, R] of the batch's responses, under
  softmax(logits / temperature)."""
  return scorer.score_tokens(params, batch["prompts"], batch["prompt_mask"],
                             batch["responses"], batch["response_mask"],
                             config=config, chunk=chunk,
                             with_entropy=with_entropy, remat=remat,
                             temperature=temperature)


def rl_loss(params, batch: Batch, *, config, remat=False, chunk=64,
            temperature=1.0, **loss_kwargs) -> tuple[jax.Array, Metrics]:
  """SEED/GRPO loss: one forward feeds PPO, OPD, KL and entropy.

  `temperature` is the rollouts' sampling temperature: the current policy is
  scored at it, as the batch's old, skill and reference log-probs are.
  """
  with_entropy = loss_kwargs.get("entropy_coef", 0.001) != 0
  logp, ent = policy_logp(params, batch, config=config,
                          with_entropy=with_entropy, remat=remat, chunk=chunk,
                          temperature=temperature)
  loss, metrics = losses.seed_loss(logp, ent if with_entropy else None, batch,
                                   **loss_kwargs)
  mask = batch["response_mask"]
  # How far the trainer's log-probs of the sampled tokens have moved from
  # theta_old's (the scorer's), as the update goes on.
  metrics["logp_diff_vs_old"] = losses.token_mean(
      jnp.abs(jax.lax.stop_gradient(logp) - batch["old_logp"]), mask)
  return loss, losses.with_token_weights(metrics, mask)


def sft_loss(params, batch: Batch, *, config, remat=False,
             chunk=64) -> tuple[jax.Array, Metrics]:
  """Cross-entropy on response tokens only (token mean)."""
  logp, _ = policy_logp(params, batch, config=config, with_entropy=False,
                        remat=remat, chunk=chunk)
  loss = -losses.token_mean(logp, batch["response_mask"])
  return loss, losses.with_token_weights({"loss": loss},
                                         batch["response_mask"])


def _split_micro(batch: Batch, n: int) -> Batch:
  """[B, ...] -> [n, B / n, ...], micro-batch i holding rows i, i + n, ...

  Strided, not contiguous: the batch is sharded over the data-parallel
  devices in contiguous blocks, and a stride takes B / (n * devices) rows
  from each block, so every micro-batch runs on every device without
  moving rows between them.
  """
  def split(x):
    if x.shape[0] % n:
      raise ValueError(f"batch of {x.shape[0]} rows does not split into "
                       f"{n} micro-batches")
    return x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def _weigh(metrics: Metrics) -> Metrics:
  """Each metric with a weight (`losses.weight_key`) times that weight."""
  return {k: v * metrics[losses.weight_key(k)]
          if losses.weight_key(k) in metrics else v
          for k, v in metrics.items()}


def _unweigh(sums: Metrics, n: int) -> Metrics:
  """Sums over n micro-batches of `_weigh`ed metrics -> their means: weighted
  ones by their summed weight (0 where it is 0), the others by n; weights
  stay summed."""
  out = {}
  for k, v in sums.items():
    w = sums.get(losses.weight_key(k))
    if k.startswith(losses.WEIGHT_PREFIX):
      out[k] = v
    elif w is None:
      out[k] = v / n
    else:
      out[k] = jnp.where(w > 0, v / jnp.where(w > 0, w, 1.0), 0.0)
  return out


def train_step(state: TrainState, batch: Batch, *,
               tx: optax.GradientTransformation,
               loss_fn: Callable[..., tuple[jax.Array, Metrics]],
               num_micro_batches: int = 1) -> tuple[TrainState, Metrics]:
  """One optimizer update over a (mini-)batch, gradients accumulated.

  Each micro-batch contributes its token-mean loss with equal weight (the
  gradient is the mean over micro-batches), except one without a token to
  average (padding rows only, when the loss has a `losses.weight_key`
  weight): it adds nothing and is not counted, so it does not shrink the
  step. A metric with a weight (its token count) is averaged by that weight,
  so such a micro-batch leaves it alone too. A non-finite loss or gradient
  skips the update: parameters and optimizer state stay as they were and
  `metrics["skipped"]` is 1.

  Args:
    state: the TrainState (donated by `jit_train_step`).
    batch: arrays with a leading batch axis.
    tx: the optimizer.
    loss_fn: `loss_fn(params, micro_batch) -> (loss, metrics)`.
    num_micro_batches: gradient-accumulation steps.

  Returns:
    (new_state, metrics): metrics averaged over micro-batches, plus
    `grad_norm` and `skipped`.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  micro = _split_micro(batch, num_micro_batches)
  loss_weight = losses.weight_key("loss")

  def accumulate(carry, mb):
    g_sum, m_sum, live = carry
    (_, metrics), grads = grad_fn(state.params, mb)
    g_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), g_sum, grads)
    m_sum = jax.tree.map(lambda a, m: a + m, m_sum, _weigh(metrics))
    # Micro-batches with a token to average (all of them if unweighted).
    if loss_weight in metrics:
      live += (metrics[loss_weight] > 0).astype(jnp.float32)
    else:
      live += 1.0
    return (g_sum, m_sum, live), None

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
  mb0 = jax.tree.map(lambda x: x[0], micro)
  m_shape = jax.eval_shape(lambda: _weigh(grad_fn(state.params, mb0)[0][1]))
  m_zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m_shape)
  (g_sum, m_sum, live), _ = jax.lax.scan(
      accumulate, (zeros, m_zero, jnp.zeros((), jnp.float32)), micro)
  grads = jax.tree.map(lambda g: g / jnp.maximum(live, 1.0), g_sum)
  metrics = _unweigh(m_sum, num_micro_batches)

  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
  grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
  updates, new_opt = tx.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  # In the state's own dtypes: float32 gradients would promote bfloat16
  # moments, and the donated state would change type (and recompile).
  keep = lambda new, old: jax.tree.map(
      lambda n, o: jnp.where(finite, n, o).astype(o.dtype), new, old)
  new_state = state.replace(step=state.step + finite.astype(jnp.int32),
                            params=keep(new_params, state.params),
                            opt_state=keep(new_opt, state.opt_state))
  metrics = dict(metrics, grad_norm=grad_norm,
                 skipped=1.0 - finite.astype(jnp.float32))
  return new_state, metrics


def jit_train_step(tx, loss_fn, *, num_micro_batches: int = 1,
                   state_shardings: Any = None, batch_shardings: Any = None,
                   metrics_sharding: Any = None):
  """`train_step` jitted with shardings; the state is donated.

  The one definition of the compiled step: the RL trainer, Stage 1's SFT and
  `aot`'s fit check all build it here, so the check compiles what runs.
  """
  fn = functools.partial(train_step, tx=tx, loss_fn=loss_fn,
                         num_micro_batches=num_micro_batches)
  kw: dict[str, Any] = {"donate_argnums": (0,)}
  if state_shardings is not None:
    kw["in_shardings"] = (state_shardings, batch_shardings)
    kw["out_shardings"] = (state_shardings, metrics_sharding)
  return jax.jit(fn, **kw)


def state_shardings(tx: optax.GradientTransformation, param_shardings: Any,
                    mesh) -> TrainState:
  """TrainState shardings: optimizer moments like their params, the rest
  (step, counts) replicated."""
  rep = partitioning.replicated(mesh)
  shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct((), jnp.float32),
                        param_shardings)
  abstract = jax.eval_shape(lambda p: TrainState.create(p, tx), shapes)
  opt = optax.tree_map_params(tx, lambda _, sh: sh, abstract.opt_state,
                              param_shardings,
                              transform_non_params=lambda _: rep)
  return TrainState(step=rep, params=param_shardings, opt_state=opt)


def abstract_state(tx: optax.GradientTransformation,
                   config: model_lib.ModelConfig, shardings: TrainState
                   ) -> TrainState:
  """The TrainState as sharded ShapeDtypeStructs, allocating nothing: the
  target of a restore and the input of an ahead-of-time compile."""
  shapes = jax.eval_shape(lambda p: TrainState.create(p, tx),
                          model_lib.param_shapes(config))
  return checkpoints.abstract_tree(shapes, shardings)
