"""Shared fakes for tests and demos: tiny models built in code, scripted
rollouts, tree comparison."""

from __future__ import annotations

import jax
import numpy as np

from seed_jax import model as model_lib


def assert_trees_equal(a, b) -> None:
  """Asserts two pytrees have the same structure and equal leaves."""
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(
      np.asarray(x), np.asarray(y)), a, b)


def tiny_config(family: str = "llama", **kw) -> model_lib.ModelConfig:
  """A tiny decoder config (2 layers, hidden 64) of the given family."""
  base = dict(
      family=family, vocab_size=128, hidden_size=64, intermediate_size=96,
      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
      rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
      attention_bias=family == "qwen2", qk_norm=family == "qwen3",
      eos_token_ids=(1,), pad_token_id=0, bos_token_id=2)
  base.update(kw)
  return model_lib.ModelConfig(**base)


def tiny_policy(workdir=None, *, seed: int = 0, env_name: str = "household",
                vocab_size: int = 600, mesh=None, **config_kw):
  """A random tiny decoder with a BPE fitted to the environment's prompts.

  Shaped like `policies.prepare` so that gin can use it as a `policy_fn`;
  with a `mesh`, the params are placed on it as the RL trainer shards them.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  from seed_jax import prompts  # pylint: disable=g-import-not-at-top
  from seed_jax import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from seed_jax.envs import base  # pylint: disable=g-import-not-at-top
  del workdir
  pool = base.EnvPool(env_name, num_groups=2, group_size=1)
  obs, infos = pool.reset([0, 1])
  corpus = [prompts.build_prompt(env_name, env.task, [], o,
                                 i["admissible_actions"])
            for env, o, i in zip(pool.members, obs, infos)]
  corpus += ["<think>go</think><action>look</action>",
             '{"episode_summary": "s", "episode_skill": "k"}']
  tok = tokenizer_lib.train_tokenizer(corpus * 3, vocab_size=vocab_size)
  kw = dict(vocab_size=len(tok), max_position_embeddings=2048,
            eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
  kw.update(config_kw)
  config = tiny_config(**kw)
  params = model_lib.init_params(config, jax.random.key(seed))
  return policies.place(policies.Policy(config, params, tok), mesh)


def scripted_rollouts(bad=lambda member: False):
  """A generate function whose experts play the pool's games.

  Args:
    bad: `bad(member) -> bool`; a bad member answers without action tags.

  Returns:
    (pool_factory, generate), for `stage1.collect_records`: `generate`
    answers, for each active member of the last pool `pool_factory` built,
    "<think>plan</think><action>{its expert's action}</action>".
  """
  from seed_jax import envs  # pylint: disable=g-import-not-at-top
  from seed_jax import rollout  # pylint: disable=g-import-not-at-top
  live = {}

  def pool_factory(*args, **kwargs):
    live["pool"] = envs.EnvPool(*args, **kwargs)
    live["experts"] = {}
    return live["pool"]

  def generate(prompts, rng):
    del rng
    pool, experts = live["pool"], live["experts"]
    assert len(prompts) == len(pool.active())
    out = []
    for i in pool.active():
      if bad(i):
        text = "I will just look around"
      else:
        expert = experts.setdefault(i, envs.make_expert(pool.members[i]))
        text = f"<think>plan</think><action>{expert.act()}</action>"
      out.append(rollout.Generation(text, [7], [9, 1], [-0.5, -0.5]))
    return out

  return pool_factory, generate


def read_scalar_events(folder) -> list[tuple[str, int, float]]:
  """(tag, step, value) of every scalar in `folder`'s own event files (not
  its subfolders), in file order; a point written twice appears twice."""
  import glob  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seed_jax import metrics  # pylint: disable=g-import-not-at-top
  found = []
  for path in sorted(glob.glob(os.path.join(os.fspath(folder),
                                            metrics.EVENTS_PATTERN))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        value = (float(tf.make_ndarray(v.tensor)) if v.HasField("tensor")
                 else v.simple_value)
        found.append((v.tag, int(event.step), value))
  return found


def as_processes(monkeypatch, count: int, fn) -> list:
  """Runs `fn(index)` in `count` threads that pass for the processes of one
  run, and returns what each returned or raised, in process order.

  `monkeypatch` (pytest's) patches jax.process_index and process_count and
  distributed.allgather_objects and broadcast_object for the threads. A
  thread that skips a collective its peers reach breaks it after 60 s
  instead of hanging.
  """
  import threading  # pylint: disable=g-import-not-at-top
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  local = threading.local()
  barrier = threading.Barrier(count, timeout=60)
  slots = [None] * count

  def allgather(obj):
    slots[local.index] = obj
    barrier.wait()
    out = list(slots)
    barrier.wait()
    return out

  monkeypatch.setattr(jax, "process_count", lambda: count)
  monkeypatch.setattr(jax, "process_index", lambda: local.index)
  monkeypatch.setattr(distributed, "allgather_objects", allgather)
  monkeypatch.setattr(distributed, "broadcast_object",
                      lambda obj: allgather(obj)[0])
  outcomes = [None] * count

  def run(index):
    local.index = index
    try:
      outcomes[index] = fn(index)
    except BaseException as e:  # pylint: disable=broad-except
      outcomes[index] = e

  threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return outcomes
