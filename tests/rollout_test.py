"""Rollout: a scripted policy yields exactly the expected samples; the real
sampler's log-probs agree with the scorer."""

import logging
import pickle
import re
import types

import jax
import numpy as np
import pytest

from seed_jax import envs
from seed_jax import model as model_lib
from seed_jax import rollout
from seed_jax import sampler
from seed_jax import scorer
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib
from seed_jax.envs import base


def _scripted(pool, bad_members=()):
  """Experts for every member but `bad_members`, which answer without tags."""
  experts = {}
  calls = []

  def generate(prompts, rng):
    del rng
    active = pool.active()
    assert len(active) == len(prompts)
    out = []
    for i in active:
      if i not in experts:
        experts[i] = envs.make_expert(pool.members[i])
      if i in bad_members:
        text = "I will just look around"
      else:
        text = f"<think>plan</think><action>{experts[i].act()}</action>"
      out.append(rollout.Generation(text, [7, i], [9, i, 1], [-0.5, -0.25,
                                                             -0.125]))
    calls.append(len(prompts))
    return out

  return generate, calls


def test_scripted_rollout_samples():
  pool = base.EnvPool("household", num_groups=2, group_size=2, max_steps=12)
  generate, calls = _scripted(pool, bad_members=(3,))
  res = rollout.rollout(generate, pool, jax.random.key(0),
                        env_name="household", max_steps=12, group_seeds=[3, 8],
                        uid_offset=10)
  eps = res.episodes
  assert [e.uid for e in eps] == [10, 10, 11, 11]
  assert [e.traj_uid for e in eps] == [0, 1, 2, 3]
  assert [e.success for e in eps] == [True, True, True, False]
  assert eps[0].length == eps[1].length  # same task, same expert
  assert eps[3].length == 12 and not any(s.action_valid for s in eps[3].steps)
  assert all(s.action == "look" for s in eps[3].steps)
  # Finished episodes stop costing compute: fewer prompts as they end.
  assert calls[0] == 4 and calls[-1] == 1 and sorted(calls, reverse=True) == calls
  assert len(res.samples) == sum(e.length for e in eps) == sum(calls)
  assert res.env_steps == len(res.samples)
  by_traj = {}
  for s in res.samples:
    by_traj.setdefault(s.traj_uid, []).append(s)
  for i, e in enumerate(eps):
    got = by_traj[i]
    assert [s.step for s in got] == list(range(e.length))
    assert [s.done for s in got] == [False] * (e.length - 1) + [True]
    assert all(s.uid == e.uid and s.response_ids == [9, i, 1] for s in got)
    assert [s.observation for s in got] == [st.observation for st in e.steps]
    assert sum(s.reward for s in got) == e.episode_return
  assert eps[0].episode_return == 10.0 and eps[0].ground_truth
  # The pad helper keeps responses aligned and masks.
  arrays = rollout.pad_samples(res.samples, pad_id=0, prompt_buckets=(4,))
  assert arrays["prompts"].shape == (len(res.samples), 4)
  assert (arrays["response_mask"].sum(1) == 3).all()
  np.testing.assert_allclose(arrays["old_logp"][0], [-0.5, -0.25, -0.125])


def test_a_generate_that_drops_responses_is_an_error():
  pool = base.EnvPool("household", num_groups=1, group_size=2, max_steps=3)
  generate, _ = _scripted(pool)
  short = lambda prompts, rng: generate(prompts, rng)[:-1]
  with pytest.raises(ValueError, match="1 responses for 2 prompts"):
    rollout.rollout(short, pool, jax.random.key(0), env_name="household",
                    max_steps=3, group_seeds=[0])


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_steps=0), "max_steps >= 1, got 0"),
    (dict(max_steps=-2), "max_steps >= 1, got -2"),
    (dict(max_steps=3, history_length=-1), "history_length >= 0, got -1"),
    (dict(max_steps=3, invalid_action="skip"),
     "invalid_action must be one of .*got 'skip'"),
])
def test_rollout_refuses_a_bad_max_steps_or_history_length(kwargs, match,
                                                           monkeypatch):
  pool = base.EnvPool("household", num_groups=1, group_size=2, max_steps=3)
  generate, calls = _scripted(pool)
  resets = []
  monkeypatch.setattr(pool, "reset", lambda *a: resets.append(a))
  with pytest.raises(ValueError, match=match):
    rollout.rollout(generate, pool, jax.random.key(0), env_name="household",
                    group_seeds=[0], **kwargs)
  assert not calls and not resets  # refused before any work


def test_env_error_mid_episode_fails_only_that_episode():
  pool = base.EnvPool("household", num_groups=1, group_size=2, max_steps=10)
  generate, _ = _scripted(pool)
  original = pool.members[1].step
  count = {"n": 0}

  def flaky(action):
    count["n"] += 1
    if count["n"] == 2:
      raise RuntimeError("engine crashed")
    return original(action)

  pool.members[1].step = flaky
  res = rollout.rollout(generate, pool, jax.random.key(0),
                        env_name="household", max_steps=10, group_seeds=[5])
  assert res.episodes[0].success and res.episodes[0].error is None
  assert not res.episodes[1].success
  assert "engine crashed" in res.episodes[1].error
  assert pool.num_errors == 1
  # The expert's action the engine crashed on is not an invalid action.
  crashed = [s for s in res.samples if s.traj_uid == 1]
  assert len(crashed) == 2 and crashed[-1].done
  assert all(s.action_valid for s in crashed)


def test_a_failed_reset_keeps_no_task_of_the_episode_before():
  pool = base.EnvPool("household", num_groups=1, group_size=2, max_steps=3)
  generate, _ = _scripted(pool)
  first = rollout.rollout(generate, pool, jax.random.key(0),
                          env_name="household", max_steps=3, group_seeds=[5])
  assert first.episodes[1].task and first.episodes[1].family

  def broken(seed):
    raise RuntimeError(f"no task for seed {seed}")

  pool.members[1].reset = broken
  res = rollout.rollout(generate, pool, jax.random.key(1),
                        env_name="household", max_steps=3, group_seeds=[6])
  ok, failed = res.episodes
  assert ok.task and ok.error is None
  assert failed.task == "" and failed.family == rollout.RESET_FAILED
  assert "no task for seed 6" in failed.error and not failed.success


def test_an_unparsable_reply_falls_back_to_the_envs_own_no_op():
  pool = base.EnvPool("household", num_groups=1, group_size=2, max_steps=2)
  pool.members[1].no_op = "inventory"  # as a user's environment might
  generate, _ = _scripted(pool, bad_members=(0, 1))
  res = rollout.rollout(generate, pool, jax.random.key(0),
                        env_name="household", max_steps=2, group_seeds=[5])
  acts = {e.traj_uid: {s.action for s in e.steps} for e in res.episodes}
  assert acts == {0: {"look"}, 1: {"inventory"}}


@pytest.mark.parametrize("invalid_action", ["no_op", "as_written"])
def test_an_inadmissible_action_is_sent_as_the_run_says(invalid_action):
  """A parsed but inadmissible action: the no-op, or itself, which the game
  answers "Nothing happens." and the next prompt's history shows."""
  pool = base.EnvPool("household", num_groups=1, group_size=1, max_steps=3)
  prompts = []

  def generate(batch, rng):
    del rng
    prompts.extend(batch)
    return [rollout.Generation(
        "<think>x</think><action>go to the moon</action>", [7], [9], [-0.5])
            for _ in batch]

  res = rollout.rollout(generate, pool, jax.random.key(0),
                        env_name="household", max_steps=3, group_seeds=[5],
                        invalid_action=invalid_action)
  ep, = res.episodes
  sent = "look" if invalid_action == "no_op" else "go to the moon"
  assert [s.action for s in ep.steps] == [sent] * 3
  assert not any(s.action_valid for s in ep.steps)
  assert not any(s.action_valid for s in res.samples)
  told = [s.observation for s in ep.steps[1:]]
  if invalid_action == "as_written":
    assert told == ["Nothing happens."] * 2
    assert "go to the moon" in prompts[-1]
  else:
    assert "Nothing happens." not in told
    assert "go to the moon" not in prompts[-1]


def test_policy_rollout_logprobs_match_scorer():
  pool = base.EnvPool("sokoban", num_groups=1, group_size=2, max_steps=3)
  obs, infos = pool.reset([1])
  first = rollout.prompts_lib.build_prompt(
      "sokoban", pool.members[0].task, [], obs[0],
      infos[0]["admissible_actions"])
  corpus = [first, "<think>push</think><action>up</action>"] * 5
  tok = tokenizer_lib.train_tokenizer(corpus, vocab_size=400)
  cfg = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=1024,
                            eos_token_ids=(tok.eos_token_id,))
  params = model_lib.init_params(cfg, jax.random.key(0))
  policy = rollout.Policy(cfg, tok, max_new_tokens=8, buckets=(256, 512),
                          min_rows=2)
  gen = lambda p, r: policy.generate(params, p, r, sampler.Temperature(1.0))
  res = rollout.rollout(gen, pool, jax.random.key(1), env_name="sokoban",
                        max_steps=2, group_seeds=[1])
  assert len(res.samples) == 4
  assert all(not s.action_valid for s in res.samples)  # random model
  arrays = rollout.pad_samples(res.samples, pad_id=tok.pad_token_id,
                               prompt_buckets=(256, 512), response_len=8)
  lp = scorer.score(params, arrays["prompts"], arrays["prompt_mask"],
                    arrays["responses"], arrays["response_mask"], config=cfg)
  diff = np.abs(np.asarray(lp) - arrays["old_logp"]).max()
  assert diff < 1e-4, diff


def test_a_per_call_token_budget_picks_the_buckets_that_fit_it():
  tok = tokenizer_lib.train_tokenizer(["a b c d e f g h"] * 5, vocab_size=300)
  cfg = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=64,
                            eos_token_ids=(tok.eos_token_id,))
  params = model_lib.init_params(cfg, jax.random.key(0))
  # 40 new tokens leave room for the 16 bucket only; 8 for the 48 one too.
  policy = rollout.Policy(cfg, tok, max_new_tokens=40, buckets=(16, 48))
  assert policy.buckets == (16,)
  prompt = list(range(5, 35))  # 30 tokens: only the 48 bucket holds them
  [(kept, response, _)] = policy.generate_ids(
      params, [prompt], jax.random.key(1), sampler.Greedy(), max_new_tokens=8)
  assert kept == prompt and 1 <= len(response) <= 8
  with pytest.raises(ValueError, match=r"prompt of 30 tokens exceeds the largest "
                     r"bucket \(16\)"):
    policy.generate_ids(params, [prompt], jax.random.key(1), sampler.Greedy())
  with pytest.raises(ValueError, match="no prompt bucket fits"):
    policy.generate_ids(params, [prompt], jax.random.key(1), sampler.Greedy(),
                        max_new_tokens=60)


@pytest.mark.parametrize("budget", [0, -3])
def test_a_token_budget_below_one_is_refused_not_replaced(budget):
  policy, params = _tiny_sampler()
  with pytest.raises(ValueError, match=rf"max_new_tokens must be >= 1 "
                     rf"\(None: the policy's 6\), got {budget}"):
    policy.generate_ids(params, [[5, 6, 7]], jax.random.key(1),
                        sampler.Greedy(), max_new_tokens=budget)


def test_a_prompt_past_the_largest_bucket_names_its_size_and_the_knobs(
    monkeypatch):
  sampled = []
  monkeypatch.setattr(rollout.sampler_lib, "sample",
                      lambda *a, **kw: sampled.append(1))
  # 40 new tokens leave room in the 64-position context for the 16 bucket
  # only: raising the buckets would not help, and the message says so.
  policy, params = _tiny_sampler(max_new_tokens=40, buckets=(16, 48))
  prompts = [[5, 6, 7], list(range(5, 35)), list(range(5, 25))]
  with pytest.raises(rollout.PromptTooLongError) as info:
    policy.generate_ids(params, prompts, jax.random.key(1), sampler.Greedy())
  assert str(info.value) == (
      "prompt of 30 tokens exceeds the largest bucket (16); the larger "
      "buckets of (16, 48) leave no room for max_new_tokens=40 in the model's "
      "context of 64 positions; raise the buckets or ask for left truncation "
      "(truncate_prompts=True)")
  e = info.value
  assert isinstance(e, ValueError) and (e.index, e.tokens, e.largest) == (
      1, 30, 16)
  again = pickle.loads(pickle.dumps(e))
  assert (str(again), again.detail, again.index, again.tokens) == (
      str(e), e.detail, 1, 30)
  assert not sampled and policy.prompts_truncated == 0  # refused up front


def test_a_rollout_prompt_past_the_buckets_names_its_episode(monkeypatch):
  monkeypatch.setattr(rollout.sampler_lib, "sample",
                      lambda *a, **kw: pytest.fail("sampled a long prompt"))
  policy, params = _tiny_sampler()  # one bucket of 16 tokens
  pool = base.EnvPool("household", num_groups=2, group_size=2, max_steps=3)

  def broken(seed):
    raise RuntimeError(f"no task for seed {seed}")

  pool.members[0].reset = broken  # not active: the first prompt is member 1's
  gen = lambda prompts, rng: policy.generate(params, prompts, rng)
  with pytest.raises(rollout.PromptTooLongError) as info:
    rollout.rollout(gen, pool, jax.random.key(0), env_name="household",
                    max_steps=3, group_seeds=[4, 9], uid_offset=10)
  e, member = info.value, pool.members[1]
  assert e.index == 1 and e.largest == 16 and e.tokens > 16
  assert str(e) == (
      f"rollout step 1/3, episode 1 (group 10, seed 4, task "
      f"{member.task!r}): prompt of {e.tokens} tokens exceeds the largest "
      "bucket (16); raise the buckets or ask for left truncation "
      "(truncate_prompts=True)")


def _tiny_sampler(**policy_kw):
  """(policy, params) of a random tiny model over a small BPE."""
  tok = tokenizer_lib.train_tokenizer(["a b c d e f g h"] * 5, vocab_size=300)
  cfg = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=64,
                            eos_token_ids=(tok.eos_token_id,))
  params = model_lib.init_params(cfg, jax.random.key(0))
  kw = dict(max_new_tokens=6, buckets=(16,))
  kw.update(policy_kw)
  return rollout.Policy(cfg, tok, **kw), params


def test_many_prompts_are_sampled_in_slices_of_at_most_max_rows(monkeypatch):
  calls = []
  real = sampler.sample

  def spy(params, prompts, mask, rng, **kw):
    calls.append((prompts.shape[0], jax.random.key_data(rng).tolist()))
    return real(params, prompts, mask, rng, **kw)

  monkeypatch.setattr(rollout.sampler_lib, "sample", spy)
  prompts = [[5 + i, 6, 7 + i % 3] for i in range(10)]
  rng, hot = jax.random.key(3), sampler.Temperature(1.0)
  capped, params = _tiny_sampler(max_rows=4)
  assert capped.rows_per_call() == 4
  out = capped.generate_ids(params, prompts, rng, hot)
  # Three calls of 4, 4 and 2 rows, each with its own key; prompt order kept.
  assert [rows for rows, _ in calls] == [4, 4, 2]
  assert len({str(key) for _, key in calls}) == 3
  assert [kept for kept, _, _ in out] == prompts
  # Each slice is what one call of its prompts with its key samples.
  calls.clear()
  again = capped.generate_ids(params, prompts[4:8], jax.random.fold_in(rng, 1),
                              hot)
  assert [tuple(map(tuple, o)) for o in again] == [
      tuple(map(tuple, o)) for o in out[4:8]]
  # Within the cap: one call, exactly what a policy without a cap samples.
  calls.clear()
  default, _ = _tiny_sampler()
  assert default.max_rows == 256
  within = default.generate_ids(params, prompts, rng, hot)
  uncapped, _ = _tiny_sampler(max_rows=None)
  assert [rows for rows, _ in calls] == [16]
  assert within == uncapped.generate_ids(params, prompts, rng, hot)
  # A min_rows above the cap wins; a cap below 1 is an error.
  assert _tiny_sampler(min_rows=8, max_rows=4)[0].rows_per_call() == 8
  assert _tiny_sampler(min_rows=3, max_rows=16)[0].rows_per_call() == 12
  with pytest.raises(ValueError, match="max_rows must be >= 1"):
    _tiny_sampler(max_rows=0)


def test_responses_cut_at_max_new_tokens_are_flagged():
  policy, params = _tiny_sampler(max_new_tokens=4)
  [first] = policy.generate_ids(params, [[5, 6, 7]], jax.random.key(1),
                                sampler.Greedy())
  kept, response, _ = first  # unpacks as before
  assert len(response) == 4 and first.truncated  # a random model: no EOS
  assert pickle.loads(pickle.dumps(first)) == first
  assert pickle.loads(pickle.dumps(first)).truncated
  # The same greedy reply ends on EOS at its second token when that token
  # is an EOS: done, not cut.
  config = policy.config.replace(
      eos_token_ids=policy.config.eos_token_ids + (response[1],))
  stops = rollout.Policy(config, policy.tokenizer, max_new_tokens=4,
                         buckets=(16,))
  [ended] = stops.generate_ids(params, [kept], jax.random.key(1),
                               sampler.Greedy())
  assert ended[1] == response[:2] and not ended.truncated
  # Ending on EOS at the last allowed token is not a cut either.
  stops = rollout.Policy(
      policy.config.replace(
          eos_token_ids=policy.config.eos_token_ids + (response[3],)),
      policy.tokenizer, max_new_tokens=4, buckets=(16,))
  [last] = stops.generate_ids(params, [kept], jax.random.key(1),
                              sampler.Greedy())
  assert last[1] == response and not last.truncated
  gens = policy.generate(params, ["a b", "c d"], jax.random.key(1),
                         sampler.Greedy())
  assert all(g.truncated == (len(g.response_ids) == 4) for g in gens)
  assert rollout.Generation("x", [], [], []).truncated is False


def test_rollout_records_replies_cut_at_max_new_tokens():
  pool = base.EnvPool("sokoban", num_groups=1, group_size=2, max_steps=2)
  obs, infos = pool.reset([1])
  first = rollout.prompts_lib.build_prompt(
      "sokoban", pool.members[0].task, [], obs[0],
      infos[0]["admissible_actions"])
  tok = tokenizer_lib.train_tokenizer([first] * 5, vocab_size=400)
  cfg = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=1024,
                            eos_token_ids=(tok.eos_token_id,))
  params = model_lib.init_params(cfg, jax.random.key(0))

  def play(config):
    policy = rollout.Policy(config, tok, max_new_tokens=4, buckets=(512,))
    gen = lambda p, r: policy.generate(params, p, r, sampler.Greedy())
    return rollout.rollout(gen, pool, jax.random.key(1), env_name="sokoban",
                           max_steps=2, group_seeds=[1])

  # A random model meets no EOS in 4 tokens: every reply is cut.
  res = play(cfg)
  assert len(res.samples) == 4
  assert all(len(s.response_ids) == 4 and s.truncated for s in res.samples)
  assert all(st.truncated for e in res.episodes for st in e.steps)
  # Every token an EOS: each reply ends on its first, none is cut.
  res = play(cfg.replace(eos_token_ids=tuple(range(len(tok)))))
  assert all(len(s.response_ids) == 1 for s in res.samples)
  assert not any(s.truncated for s in res.samples)
  assert not any(st.truncated for e in res.episodes for st in e.steps)


def test_a_generate_that_does_not_say_truncated_cuts_nothing():
  pool = base.EnvPool("household", num_groups=1, group_size=1, max_steps=2)

  def generate(prompts, rng):  # a stand-in with no `truncated` field
    del rng
    return [types.SimpleNamespace(text="look", prompt_ids=[1],
                                  response_ids=[2], logprobs=[-1.0])
            for _ in prompts]

  res = rollout.rollout(generate, pool, jax.random.key(0),
                        env_name="household", max_steps=2, group_seeds=[3])
  assert res.samples and not any(s.truncated for s in res.samples)
  assert not any(st.truncated for st in res.episodes[0].steps)


def test_pad_samples_refuses_a_response_longer_than_response_len():
  def sample(traj, n):
    return rollout.Sample(prompt="p", prompt_ids=[5], response_ids=[6] * n,
                          old_logp=[-1.0] * n, uid=0, traj_uid=traj, step=2,
                          observation="o", action_valid=True, reward=0.0,
                          done=False)

  arrays = rollout.pad_samples([sample(0, 3)], pad_id=0, prompt_buckets=(4,),
                               response_len=3)
  assert arrays["response_mask"].tolist() == [[1, 1, 1]]
  with pytest.raises(ValueError, match=(
      r"sample 1 \(traj_uid 7, step 2\) has a response of 5 tokens, longer "
      r"than response_len=3")):
    rollout.pad_samples([sample(0, 3), sample(7, 5)], pad_id=0,
                        prompt_buckets=(4,), response_len=3)


def test_chat_templates_that_print_a_date_get_a_fixed_one():
  policy, _ = _tiny_sampler()
  # As Llama 3.2/3.3 templates do: today's date unless date_string is given.
  policy.tokenizer.chat_template = (
      "{% if date_string is not defined %}"
      "{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
      "date: {{ date_string }}|"
      "{% for m in messages %}{{ m['content'] }}{% endfor %}")
  text = policy.tokenizer.decode(policy.encode("a b"))
  assert text == f"date: {rollout.CHAT_DATE_STRING}|a b", text


def test_plain_prompts_get_the_tokenizers_bos_and_templates_write_their_own():
  from tokenizers import processors  # pylint: disable=g-import-not-at-top
  policy, _ = _tiny_sampler(use_chat_template=False)
  tok = policy.tokenizer
  bos = tok.convert_tokens_to_ids(tok.bos_token or tok.eos_token)
  # As Llama tokenizers do: a BOS before every encoded text.
  tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
      single=f"{tok.convert_ids_to_tokens(bos)} $A",
      special_tokens=[(tok.convert_ids_to_tokens(bos), bos)])
  plain = tok.encode("a b", add_special_tokens=False)
  assert policy.encode("a b") == [bos] + plain
  # A template that writes the BOS itself gets exactly one.
  tok.chat_template = ("{{ bos_token }}{% for m in messages %}"
                       "{{ m['content'] }}{% endfor %}")
  tok.bos_token = tok.convert_ids_to_tokens(bos)
  templated = rollout.Policy(policy.config, tok, max_new_tokens=6,
                             buckets=(16,))
  assert templated.encode("a b") == [bos] + plain


def test_rollout_logs_its_progress_per_step(caplog):
  caplog.set_level(logging.INFO)
  pool = base.EnvPool("household", num_groups=1, group_size=2, max_steps=12)
  generate, calls = _scripted(pool, bad_members=(1,))
  rollout.rollout(generate, pool, jax.random.key(0), env_name="household",
                  max_steps=12, group_seeds=[3], log_every_s=0)
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("rollout step")]
  assert len(lines) == len(calls) == 12  # member 1 plays to the limit
  for t, line in enumerate(lines, 1):
    assert re.fullmatch(rf"rollout step {t}/12: [012] of 2 episodes still "
                        r"running, step \d+\.\d s, \d+ s in all", line), line
  assert lines[0].startswith("rollout step 1/12: 2 of 2")
  assert lines[-1].startswith("rollout step 12/12: 0 of 2")  # limit reached
  # Fast steps log nothing under a time interval.
  caplog.clear()
  rollout.rollout(generate, pool, jax.random.key(0), env_name="household",
                  max_steps=12, group_seeds=[3], log_every_s=60)
  assert not [r for r in caplog.records
              if r.getMessage().startswith("rollout step")]
