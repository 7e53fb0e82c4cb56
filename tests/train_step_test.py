"""Train step: accumulation, non-finite skipping, donation, learning."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seed_jax import metrics as metrics_lib
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import scorer
from seed_jax import testing
from seed_jax import train_step as ts


def _rl_batch(cfg, params, seed=0, B=4, P=6, R=5):
  rng = np.random.default_rng(seed)
  prompts = rng.integers(3, cfg.vocab_size, (B, P)).astype(np.int32)
  pmask = np.ones((B, P), np.int32)
  pmask[0, :2] = 0
  resp = rng.integers(3, cfg.vocab_size, (B, R)).astype(np.int32)
  rmask = np.ones((B, R), np.int32)
  rmask[1, 3:] = 0
  old = np.asarray(scorer.score(params, prompts, pmask, resp, rmask,
                                config=cfg))
  return {
      "prompts": prompts, "prompt_mask": pmask, "responses": resp,
      "response_mask": rmask, "old_logp": old, "ref_logp": old,
      "skill_logp": old + 0.5, "advantages": np.asarray(
          [[1.0], [-1.0], [0.5], [-0.5]], np.float32) * np.ones((1, R)),
      "analyzed": np.asarray([True, False, True, False]),
  }


def test_micro_batches_average_gradients():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  batch = _rl_batch(cfg, params)
  tx = optax.sgd(1.0)
  loss_fn = functools.partial(ts.rl_loss, config=cfg)
  step2 = jax.jit(functools.partial(ts.train_step, tx=tx, loss_fn=loss_fn,
                                    num_micro_batches=2))
  new, metrics = step2(ts.TrainState.create(params, tx), batch)
  # Micro-batch i holds rows i, i + 2, ... (strided).
  halves = [jax.tree.map(lambda x: x[i::2], batch) for i in range(2)]
  grads = [jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0]))(params, h)
           for h in halves]
  expect = jax.tree.map(lambda p, a, b: p - (a + b) / 2, params, *grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               new.params, expect)
  assert int(new.step) == 1 and float(metrics["skipped"]) == 0
  # Before the update, the trainer's log-probs are the rollout's.
  assert float(metrics["logp_diff_vs_old"]) < 1e-5


def test_a_micro_batch_of_padding_rows_does_not_shrink_the_step():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  real = jax.tree.map(lambda x: x[:2], _rl_batch(cfg, params))
  # Padding rows (all zero, masked out) at 1 and 3: micro-batch 1 of 2
  # (rows 1, 3) holds no token.
  padded = jax.tree.map(
      lambda x: np.stack([x[0], np.zeros_like(x[0]), x[1],
                          np.zeros_like(x[0])]), real)
  tx = optax.sgd(1.0)
  loss_fn = functools.partial(ts.rl_loss, config=cfg)
  out = {}
  for n, batch in ((1, real), (2, padded)):
    step = jax.jit(functools.partial(ts.train_step, tx=tx, loss_fn=loss_fn,
                                     num_micro_batches=n))
    out[n] = step(ts.TrainState.create(params, tx), batch)
  (new1, m1), (new2, m2) = out[1], out[2]
  np.testing.assert_allclose(m2["grad_norm"], m1["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               new2.params, new1.params)


def test_a_micro_batch_without_analyzed_rows_does_not_dilute_the_gate():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  batch = _rl_batch(cfg, params)  # rows 0 and 2 analyzed: micro-batch 0
  loss_fn = functools.partial(ts.rl_loss, config=cfg, opd_coef=0.01)
  tx = optax.sgd(0.0)
  _, two = jax.jit(functools.partial(
      ts.train_step, tx=tx, loss_fn=loss_fn, num_micro_batches=2))(
          ts.TrainState.create(params, tx), batch)
  _, alone = jax.jit(loss_fn)(params, jax.tree.map(lambda x: x[0::2], batch))
  np.testing.assert_allclose(two["opd_gate_mean"], alone["opd_gate_mean"],
                             rtol=1e-6)
  assert float(alone["opd_gate_mean"]) > 0.5  # skill_logp is old + 0.5
  assert float(two["weight/opd_gate_mean"]) == 10.0  # 2 rows x 5 tokens


def test_micro_batches_stay_on_their_devices():
  # The batch is sharded over 8 data-parallel devices in contiguous blocks;
  # each micro-batch takes rows from every block, so the compiled step moves
  # no rows between devices (no all-gather; gradients are all-reduced).
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  batch = jax.tree.map(lambda x: np.concatenate([x] * 8),
                       _rl_batch(cfg, params))  # 32 rows
  mesh = partitioning.make_mesh((8, 1, 1))
  tx = ts.make_optimizer(1e-3)
  step = ts.jit_train_step(
      tx, functools.partial(ts.rl_loss, config=cfg), num_micro_batches=4,
      state_shardings=ts.state_shardings(
          tx, partitioning.param_shardings(cfg, mesh), mesh),
      batch_shardings={k: partitioning.batch_sharding(mesh, np.ndim(v))
                       for k, v in batch.items()},
      metrics_sharding=partitioning.replicated(mesh))
  state = jax.eval_shape(lambda p: ts.TrainState.create(p, tx), params)
  shapes = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype)
            for k, v in batch.items()}
  hlo = step.lower(state, shapes).compile().as_text()
  assert "all-reduce" in hlo and "all-gather" not in hlo


def test_non_finite_update_is_skipped():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  batch = _rl_batch(cfg, params)
  batch["advantages"] = batch["advantages"] * np.nan
  tx = ts.make_optimizer(1e-3)
  step = ts.jit_train_step(tx, functools.partial(ts.rl_loss, config=cfg))
  state = ts.TrainState.create(params, tx)
  before = jax.tree.map(np.asarray, state.params)
  new, metrics = step(state, batch)
  assert float(metrics["skipped"]) == 1.0 and int(new.step) == 0
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray,
                                                           new.params), before)



def test_a_skipped_step_leaves_the_averages_to_the_other_steps():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  good = _rl_batch(cfg, params)
  bad = dict(good, advantages=good["advantages"] * np.nan)
  tx = ts.make_optimizer(1e-3)
  step = ts.jit_train_step(tx, functools.partial(ts.rl_loss, config=cfg))
  state, m_good = step(ts.TrainState.create(params, tx), good)
  m_good = jax.device_get(m_good)
  _, m_bad = step(state, bad)
  assert float(m_bad["skipped"]) == 1.0 and np.isnan(m_bad["loss"])
  avg = metrics_lib.Averager()
  avg.update(m_good)
  avg.update(m_bad)
  out = avg.compute()
  assert out.pop("skipped") == 0.5
  assert out == pytest.approx({k: float(v) for k, v in m_good.items()
                               if k != "skipped" and not k.startswith(
                                   "weight/")})

def test_bfloat16_state_keeps_its_dtypes():
  cfg = testing.tiny_config()
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                        model_lib.init_params(cfg, jax.random.key(0)))
  batch = _rl_batch(cfg, params)
  tx = ts.make_optimizer(1e-3)
  step = ts.jit_train_step(tx, functools.partial(ts.sft_loss, config=cfg))
  state = ts.TrainState.create(params, tx)
  dtypes = jax.tree.map(lambda x: x.dtype, state)
  state, _ = step(state, batch)
  assert jax.tree.map(lambda x: x.dtype, state) == dtypes
  step(state, batch)
  assert step._cache_size() == 1  # pylint: disable=protected-access


def test_state_is_donated_and_sft_learns():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(0))
  batch = _rl_batch(cfg, params)
  tx = ts.make_optimizer(3e-3, warmup_steps=2, total_steps=30,
                         schedule="cosine")
  step = ts.jit_train_step(tx, functools.partial(ts.sft_loss, config=cfg),
                           num_micro_batches=2)
  state = ts.TrainState.create(params, tx)
  old_leaf = state.params["layers"]["q_kernel"]
  losses = []
  for _ in range(30):
    state, m = step(state, batch)
    losses.append(float(m["loss"]))
  assert old_leaf.is_deleted()
  assert losses[-1] < 0.5 * losses[0], losses


def _learning_rates(tx, n):
  """The learning rate of each of n updates: with a constant gradient of 1
  (no clip, no decay) AdamW moves a parameter by the learning rate."""
  params = {"w": np.zeros(())}
  state = tx.init(params)
  out = []
  for _ in range(n):
    updates, state = tx.update({"w": np.ones(())}, state, params)
    out.append(-float(updates["w"]))
  return np.asarray(out)


def test_cosine_schedule_starts_at_the_peak_without_warmup():
  make = functools.partial(ts.make_optimizer, 1e-3, weight_decay=0.0,
                           grad_clip=0, total_steps=8, schedule="cosine")
  cosine = 0.5 * (1 + np.cos(np.pi * np.arange(8) / 8))
  np.testing.assert_allclose(_learning_rates(make(warmup_steps=0), 8),
                             1e-3 * cosine, rtol=1e-4)
  # With warm-up: from 0 up to the peak, then cosine over the rest.
  warm = np.concatenate([[0.0, 0.5], 0.5 * (1 + np.cos(np.pi * np.arange(6)
                                                       / 6))])
  np.testing.assert_allclose(_learning_rates(make(warmup_steps=2), 8),
                             1e-3 * warm, rtol=1e-4, atol=1e-12)
