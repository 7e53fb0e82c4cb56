"""Tests for the learning phase's options in seed_jax.trainer: GiGPO step
advantages and critical-step skills."""

import functools
import json
import logging
import re

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seed_jax import annotators
from seed_jax import episodes
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import policies
from seed_jax import rollout
from seed_jax import skills
from seed_jax import teacher as teacher_lib
from seed_jax import testing
from seed_jax import trainer as trainer_lib
from seed_jax.envs import base
from seed_jax.envs import household


def _sample(uid, traj, step, obs, reward=0.0, valid=True):
  return rollout.Sample(prompt="p", prompt_ids=[5], response_ids=[6],
                        old_logp=[-1.0], uid=uid, traj_uid=traj, step=step,
                        observation=obs, action_valid=valid, reward=reward,
                        done=False)


def test_step_advantage_groups_equal_observations_of_one_task():
  # Task group 7: trajectories 0 and 1 both start at "A"; 0 then reaches "B"
  # and wins, 1 reaches "C" and acts invalidly. Task group 8 also shows "A",
  # but it is another task: its step stays alone.
  samples = [_sample(7, 0, 0, "A"), _sample(7, 1, 0, "A"),
             _sample(8, 2, 0, "A", reward=0.3),
             _sample(7, 0, 1, "B", reward=1.0),
             _sample(7, 1, 1, "C", valid=False)]
  rl = trainer_lib.RLConfig(step_advantage_weight=0.5, step_gamma=0.5,
                            adv_norm="mean_norm", invalid_penalty=0.1)
  adv, metrics = trainer_lib._add_step_advantage(
      np.asarray([1.0, 1.0, 0.0, 1.0, 1.0], np.float32), samples, rl)
  # Returns-to-go: trajectory 0 [0.5, 1.0], 1 [-0.05, -0.1], 2 [0.3].
  # Step group (7, "A") = {0.5, -0.05}: mean 0.225 -> +-0.275. Singletons
  # keep their return (mean 0), as in grpo.
  step = np.asarray([0.275, -0.275, 0.3, 1.0, -0.1])
  np.testing.assert_allclose(adv, np.asarray([1, 1, 0, 1, 1]) + 0.5 * step,
                             rtol=1e-5)
  assert metrics["step_groups_shared"] == pytest.approx(2 / 5)


def test_step_knobs_are_checked():
  with pytest.raises(ValueError, match="analysis_mode"):
    trainer_lib.RLConfig(analysis_mode="steps")
  with pytest.raises(ValueError, match="step_gamma"):
    trainer_lib.RLConfig(step_advantage_weight=1.0, step_gamma=1.5)
  with pytest.raises(ValueError, match="max_critical_steps"):
    trainer_lib.RLConfig(max_critical_steps=0)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    trainer_lib.RLConfig(temperature=0.0)
  assert trainer_lib.RLConfig(analysis_mode="episode_step").step_skills == 3
  assert trainer_lib.RLConfig().step_skills == 0


@pytest.fixture(scope="module")
def policy():
  return testing.tiny_policy(vocab_size=400)


def _trainer(policy, **kw):
  kw = dict(dict(prompt_buckets=(512, 1024)), **kw)
  rl = trainer_lib.RLConfig(num_groups=2, group_size=2, max_steps=3,
                            max_new_tokens=8, analysis_max_new_tokens=16,
                            mini_batch_size=8, analysis_mode="episode_step",
                            max_critical_steps=2, **kw)
  teacher = None
  if rl.analyzer == "external":
    teacher = teacher_lib.OpenAITeacher("http://127.0.0.1:9/v1", "m",
                                        mode="episode_step",
                                        max_critical_steps=2)
  return trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                               env_name="household", tx=optax.sgd(0.0),
                               teacher=teacher)


def _played(trainer):
  """Three steps of two groups x 2, every reply the same `look` (its ids cut
  at max_new_tokens, as the sampler would)."""
  reply = "<think>x</think><action>look</action>"
  ids = trainer.tokenizer.encode(reply, add_special_tokens=False)
  cut = len(ids) > trainer.rl.max_new_tokens
  ids = ids[:trainer.rl.max_new_tokens]

  def generate(prompts, rng):
    del rng
    return [rollout.Generation(reply, trainer.policy.encode(p), ids,
                               [-1.0] * len(ids), truncated=cut)
            for p in prompts]

  pool = base.EnvPool("household", num_groups=2, group_size=2, max_steps=3)
  return rollout.rollout(generate, pool, jax.random.key(0),
                         env_name="household", max_steps=3,
                         group_seeds=[1, 2])


def test_critical_step_skill_is_in_that_step_prompt_only(policy):
  trainer = _trainer(policy, step_advantage_weight=1.0)
  res = _played(trainer)
  analysis = skills.Analysis("s", "open it first", {2: "take the mug now"})
  c = trainer_lib.Collected(res.samples, res.episodes, {0: analysis}, {})
  state = trainer.create_state(policy.params)
  batch, metrics = trainer.build_batch(
      state, trainer.place_params(policy.params), c)
  assert metrics["step_skill_rows"] == 1
  assert metrics["skill_logp_gap"] != 0  # over the analyzed rows
  # Every member of a group answers `look` and so sees the same rooms.
  assert metrics["step_groups_shared"] == 1.0
  for i, s in enumerate(res.samples):
    row = batch["skill_prompts"][i][batch["skill_mask"][i].astype(bool)]
    if s.traj_uid != 0:
      expected = s.prompt_ids
    else:
      step_skill = "take the mug now" if s.step == 1 else None
      expected = trainer.policy.encode(skills.build_skill_prompt(
          s.prompt, "open it first", step_skill=step_skill))
    assert row.tolist() == list(expected), (s.traj_uid, s.step)
    # Only the analyzed trajectory's rows take part in distillation.
    assert bool(batch["analyzed"][i]) == (s.traj_uid == 0), (s.traj_uid, s.step)
    rm = batch["response_mask"][i].astype(bool)
    gap = np.abs(batch["skill_logp"][i] - batch["old_logp"][i])[rm]
    # Another prompt moves the random model's log-probs; the same one not.
    assert (gap.max() > 1e-4) == (s.traj_uid == 0), (s.traj_uid, s.step)


def test_distillation_and_opid_shaping_reach_analyzed_rows_only(policy):
  res = _played(_trainer(policy))
  c = trainer_lib.Collected(res.samples, res.episodes,
                            {0: skills.Analysis("s", "open it first", {})}, {})
  trainers, batches = {}, {}
  for name, kw in (("seed", dict(variant="seed")),
                   ("opid", dict(variant="opid")),
                   ("centred", dict(variant="opid", opid_center=True))):
    trainers[name] = t = _trainer(policy, opid_weight=0.5, **kw)
    batches[name], _ = t.build_batch(
        t.create_state(policy.params), t.place_params(policy.params), c)
  seed, opid = batches["seed"], batches["opid"]
  analyzed = seed["analyzed"]
  assert analyzed.any() and not analyzed.all()
  # OPID: A += w * (skill_logp - old_logp) on analyzed rows, nothing else.
  np.testing.assert_array_equal(opid["analyzed"], analyzed)
  want = seed["advantages"] + 0.5 * (seed["skill_logp"] - seed["old_logp"])
  np.testing.assert_allclose(opid["advantages"][analyzed], want[analyzed],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(opid["advantages"][~analyzed],
                                seed["advantages"][~analyzed])
  assert np.abs(opid["advantages"] - seed["advantages"]).max() > 1e-4
  # Centred: each analyzed row's bonus sums to 0 over its response tokens.
  bonus = batches["centred"]["advantages"] - seed["advantages"]
  rmask = seed["response_mask"] > 0
  np.testing.assert_allclose((bonus * rmask).sum(-1), 0.0, atol=1e-4)
  np.testing.assert_array_equal(bonus[~rmask], 0.0)
  assert np.abs(bonus[analyzed]).max() > 1e-4
  # SEED: the steps distill on the analyzed rows' tokens, with weight λ.
  t = trainers["seed"]
  _, m = t._learn(t.create_state(policy.params), seed, jax.random.key(3),
                  update_index=0)
  mask = seed["response_mask"] > 0
  np.testing.assert_allclose(m["opd_active_ratio"],
                             mask[analyzed].sum() / mask.sum(), rtol=1e-6)
  assert abs(m["opd_loss"]) > 0 and 0 < m["opd_gate_mean"] < 1
  rl = t.rl
  rest = m["pg_loss"] + rl.kl_coef * m["kl"] - rl.entropy_coef * m["entropy"]
  np.testing.assert_allclose(m["loss"] - rest, rl.opd_coef * m["opd_loss"],
                             rtol=1e-3, atol=1e-7)



def test_skill_logp_gap_is_split_by_the_episode_outcome(policy):
  trainer = _trainer(policy)
  res = _played(trainer)
  res.episodes[0].success = True  # trajectory 0 won, 1 lost, 2 not analyzed
  analyses = {u: skills.Analysis("s", f"skill {u}", {}) for u in (0, 1)}
  c = trainer_lib.Collected(res.samples, res.episodes, analyses, {})
  batch, metrics = trainer.build_batch(
      trainer.create_state(policy.params),
      trainer.place_params(policy.params), c)
  n = len(res.samples)
  shift = (batch["skill_logp"] - batch["old_logp"])[:n]
  rm = batch["response_mask"][:n].astype(bool)
  uid = np.asarray([s.traj_uid for s in res.samples])[:, None]
  for key, rows in (("skill_logp_gap", (uid == 0) | (uid == 1)),
                    ("skill_logp_gap_success", uid == 0),
                    ("skill_logp_gap_failure", uid == 1)):
    np.testing.assert_allclose(metrics[key], shift[rm & rows].mean(),
                               rtol=1e-5, err_msg=key)
  assert metrics["skill_logp_gap_success"] != metrics["skill_logp_gap_failure"]
  # Without a won analyzed episode there is no success part, not a 0.
  res.episodes[0].success = False
  _, metrics = trainer.build_batch(trainer.create_state(policy.params),
                                   trainer.place_params(policy.params), c)
  assert "skill_logp_gap_success" not in metrics
  assert "skill_logp_gap_failure" in metrics


def test_without_an_analyzed_row_the_skill_logp_gap_is_left_out(policy):
  for variant in ("grpo", "seed"):  # GRPO never analyzes; SEED found none
    trainer = _trainer(policy, variant=variant, kl_coef=0.0)
    res = _played(trainer)
    c = trainer_lib.Collected(res.samples, res.episodes, {}, {})
    _, metrics = trainer.build_batch(trainer.create_state(policy.params),
                                     None, c)
    for key in ("skill_logp_gap", "skill_logp_gap_success",
                "skill_logp_gap_failure"):
      assert key not in metrics, (variant, key, metrics)
    assert metrics["logp_agreement"] > 0  # the rollout's log-probs are -1

def test_rollouts_at_a_temperature_are_scored_and_trained_at_it(policy):
  T = 0.5
  t = _trainer(policy, temperature=T)
  params = t.place_params(policy.params)
  c = t.collect(params, jax.random.key(4), update_index=0)
  batch, metrics = t.build_batch(t.create_state(policy.params), params, c)
  # The sampler's log-probs are the scorer's: both at T.
  assert metrics["logp_agreement"] < 1e-4, metrics["logp_agreement"]
  rows = np.flatnonzero(batch["response_mask"].sum(1))[:3]
  assert len(rows) == 3
  # The rows' prompt + response without padding, left-padded into one batch.
  seqs = [np.concatenate([
      batch["prompts"][i][batch["prompt_mask"][i].astype(bool)],
      batch["responses"][i, :int(batch["response_mask"][i].sum())]])
          for i in rows]
  width = max(len(q) for q in seqs)
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(ids)
  for j, q in enumerate(seqs):
    ids[j, width - len(q):], mask[j, width - len(q):] = q, 1
  logits = jax.jit(functools.partial(model_lib.apply, config=policy.config))(
      policy.params, ids, mask)
  for j, i in enumerate(rows):
    n = int(batch["response_mask"][i].sum())
    lg = logits[j, width - n - 1:width - 1]
    naive = {temp: np.take_along_axis(
        np.asarray(jax.nn.log_softmax(lg / temp, axis=-1)),
        batch["responses"][i, :n, None], axis=-1)[:, 0] for temp in (T, 1.0)}
    np.testing.assert_allclose(batch["old_logp"][i, :n], naive[T], atol=1e-4)
    np.testing.assert_allclose(batch["ref_logp"][i, :n], naive[T], atol=1e-4)
    assert np.abs(naive[T] - naive[1.0]).max() > 1e-2
  # The train step scores the unchanged policy (learning rate 0) at T too:
  # no ratio away from 1 and no KL to the identical reference.
  _, m = t._learn(t.create_state(policy.params), batch, jax.random.key(5),
                  update_index=0)
  assert m["logp_diff_vs_old"] < 1e-4 and abs(m["kl"]) < 1e-6, m
  assert m["pg_clipfrac"] == 0


def _collect_and_spy(t, policy):
  """One update's collect by trainer `t`, and the episodes it analyzed."""
  analyzed, real = [], t._analyze

  def spy(params, episodes, rng):
    analyzed.extend(episodes)
    return real(params, episodes, rng)

  t._analyze = spy
  c = t.collect(t.place_params(policy.params), jax.random.key(0),
                update_index=0)
  return c, analyzed


def test_an_episode_whose_reset_failed_is_not_analyzed(policy):
  t = _trainer(policy)

  def broken(seed):
    raise RuntimeError(f"no task for seed {seed}")

  t.pool.members[1].reset = broken
  c, analyzed = _collect_and_spy(t, policy)
  failed = [e for e in c.episodes if e.family == rollout.RESET_FAILED]
  assert len(failed) == 1 and failed[0].length == 0
  assert len(analyzed) == len(c.episodes) - 1
  assert all(e.length for e in analyzed)


def test_a_skill_prompt_past_the_models_context_is_left_out(policy):
  # A 4096 bucket plus the response does not fit the 2048-position model, so
  # the policy drops it; a skill prompt longer than 1024 must not use it.
  trainer = _trainer(policy, prompt_buckets=(512, 1024, 4096))
  assert trainer.policy.buckets == (512, 1024)
  res = _played(trainer)
  skill = "open the drawer first " * 200
  n = len(trainer.policy.encode(skills.build_skill_prompt(
      res.samples[0].prompt, skill)))
  assert 1024 < n < 4096
  c = trainer_lib.Collected(res.samples, res.episodes,
                            {0: skills.Analysis("s", skill, {})}, {})
  batch, metrics = trainer.build_batch(
      trainer.create_state(policy.params),
      trainer.place_params(policy.params), c)
  rows = [i for i, s in enumerate(res.samples) if s.traj_uid == 0]
  assert metrics["skill_prompts_too_long"] == len(rows) > 0
  assert batch["skill_prompts"].shape[1] <= 1024
  assert not batch["analyzed"].any()
  for i in rows:  # the plain prompt stands in, as for an unparsed analysis
    row = batch["skill_prompts"][i][batch["skill_mask"][i].astype(bool)]
    assert row.tolist() == list(res.samples[i].prompt_ids)


def test_external_step_skills_are_limited_to_the_run(policy):
  trainer = _trainer(policy, analyzer="external")
  res = _played(trainer)
  reply = {"episode_summary": "s", "episode_skill": "k",
           "step_skills": {"1": "a", "3": "b", "2": "c", "9": "too late"}}
  trainer.teacher.complete_many = lambda prompts: [json.dumps(reply)] * len(
      prompts)
  found, _ = trainer._analyze(None, res.episodes, jax.random.key(0))
  assert len(found) == len(res.episodes)
  # At most max_critical_steps=2, in the reply's order, within the episode.
  assert all(a.step_skills == {1: "a", 3: "b"} for a in found.values())


def test_rules_analyzer_writes_the_annotators_skills(policy):
  trainer = _trainer(policy, analyzer="rules")
  res = _played(trainer)
  found, stats = trainer._analyze(None, res.episodes, jax.random.key(0))
  assert stats["analyses_parsed"] == 1.0
  for ep in res.episodes:
    want = annotators.annotate(ep)
    assert found[ep.traj_uid].skill == want["episode_skill"].strip()
    assert found[ep.traj_uid].step_skills == {}
  teacher = teacher_lib.OpenAITeacher("http://127.0.0.1:9/v1", "m")
  rl = trainer_lib.RLConfig(analyzer="rules")
  with pytest.raises(ValueError, match="pass no teacher"):
    trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                          env_name="household", tx=optax.sgd(0.0),
                          teacher=teacher)
  with pytest.raises(ValueError, match=r"annotation rules \['household', "
                     r"'sokoban', 'gym_sokoban'\], got 'twx'"):
    trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                          env_name="twx", tx=optax.sgd(0.0))


def test_rules_analyzer_takes_the_rule_detail(policy):
  rl = trainer_lib.RLConfig(analyzer="rules", rule_detail="kind",
                            rule_repeats=True)
  trainer = trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                                  env_name="household", tx=optax.sgd(0.0))
  assert trainer.teacher.detail == "kind" and trainer.teacher.repeats
  with pytest.raises(ValueError, match="rule_detail 'kind' is for the "
                     "household game, not 'sokoban'"):
    trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                          env_name="sokoban", tx=optax.sgd(0.0))
  with pytest.raises(ValueError, match=r"rule_detail must be one of "
                     r"\('place', 'kind'\), got 'room'"):
    trainer_lib.RLConfig(analyzer="rules", rule_detail="room")


def test_teacher_and_run_must_ask_for_the_same_analyses(policy):
  teacher = teacher_lib.OpenAITeacher("http://127.0.0.1:9/v1", "m")
  rl = trainer_lib.RLConfig(analyzer="external", analysis_mode="episode_step")
  with pytest.raises(ValueError, match="teacher asks for analyses in mode"):
    trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                          env_name="household", tx=optax.sgd(0.0),
                          teacher=teacher)


def _stub_analyst(trainer, reply):
  """The analyst answers `reply` to every prompt; returns the prompts sent."""
  sent = []
  reply_ids = trainer.tokenizer.encode(reply, add_special_tokens=False)

  def generate_ids(params, prompt_ids, rng, sampling, max_new_tokens=None):
    del params, rng, sampling, max_new_tokens
    sent.extend(prompt_ids)
    return [(list(p), reply_ids, [0.0] * len(reply_ids)) for p in prompt_ids]

  trainer.analyst.generate_ids = generate_ids
  return sent


def test_analysis_is_not_cut_at_the_rollout_stop_string(policy):
  # The annotator's skill for invalid replies names the action tags; the
  # rollout stops at "</action>", which would cut the JSON unparseable.
  trainer = _trainer(policy)
  assert "</action>" in trainer.policy.stop_strings
  assert trainer.analyst.stop_strings == () and trainer.analyst.stop_table is None
  skill = "Reply with one action inside <action> </action> and nothing else."
  _stub_analyst(trainer, json.dumps({"episode_summary": "s",
                                     "episode_skill": skill}))
  res = _played(trainer)
  found, stats = trainer._analyze(None, res.episodes, jax.random.key(0))
  assert stats["analyses_parsed"] == 1.0
  assert {a.skill for a in found.values()} == {skill}


def _episode(step_chars: list[int]):
  from seed_jax import episodes
  steps = [episodes.Step(observation="You see " + "a mug, " * (n // 7),
                         prompt="p", response="<action>look</action>",
                         action="look", action_valid=True, reward=0.0,
                         done=False) for n in step_chars]
  return episodes.Episode(env_name="household", task="put a mug in sink",
                          family="pick", seed=0, steps=steps)


def test_long_analysis_prompts_are_cut_to_fit_or_left_out(policy):
  trainer = _trainer(policy)
  limit = trainer.analysis_max_tokens
  assert limit == trainer.analyst.buckets[-1]  # by default the largest
  encode = lambda text: trainer.analyst.encode(text)
  # Twelve steps, too long together; the instructions and a few steps fit.
  long_ep = _episode([100] * 12)
  full = skills.build_analysis_prompt(long_ep, mode="episode_step",
                                      max_critical_steps=2)
  assert len(encode(full.text)) > limit
  # One step that alone does not fit.
  huge_ep = _episode([40 * limit])
  sent = _stub_analyst(trainer, json.dumps({"episode_summary": "s",
                                            "episode_skill": "k"}))
  found, stats = trainer._analyze(None, [long_ep, huge_ep], jax.random.key(0))
  assert len(sent) == 1 and len(sent[0]) <= limit
  cut = skills.fit_analysis_prompt(long_ep, encode=encode, max_tokens=limit,
                                  mode="episode_step", max_critical_steps=2)
  assert list(sent[0]) == encode(cut.text)
  assert 0 < cut.steps_cut < 11 and cut.num_steps == 12
  # Cut in the middle only: the instructions and the last step stay.
  assert cut.text.startswith(full.text[:full.text.index("\n\nStep 1\n")])
  assert cut.text.endswith(full.text[full.text.rindex("\n\nStep 12\n"):])
  assert stats["analysis_prompts_too_long"] == 1.0
  assert stats["analysis_steps_cut"] == cut.steps_cut
  assert stats["analyses_parsed"] == 0.5 and len(found) == 1


def test_env_kwargs_may_not_set_what_the_run_sets(policy):
  with pytest.raises(ValueError, match=r"may not set \['max_steps'\]"):
    trainer_lib.RLTrainer(policy.config, policy.tokenizer,
                          trainer_lib.RLConfig(), env_name="household",
                          tx=optax.sgd(0.0), env_kwargs={"max_steps": 5})


def test_several_processes_need_a_mesh(policy, monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(ValueError, match="2 processes need a training mesh"):
    trainer_lib.RLTrainer(policy.config, policy.tokenizer,
                          trainer_lib.RLConfig(num_groups=2),
                          env_name="household", tx=optax.sgd(0.0))


def test_stage1_and_rl_budgets_are_checked(policy, tmp_path):
  from seed_jax import policies
  with pytest.raises(ValueError, match="analysis_max_prompt_tokens=4096 "
                     "exceeds the largest prompt bucket"):
    _trainer(policy, analysis_max_prompt_tokens=4096)
  assert _trainer(policy,
                  analysis_max_prompt_tokens=600).analysis_max_tokens == 600
  start = policies.Policy(policy.config, policy.params, policy.tokenizer, {})
  with pytest.raises(ValueError, match="max_prompt_tokens=4096 exceeds the "
                     "largest bucket SFT can train on"):
    policies.run_stage1(start, policies.Stage1Config(max_prompt_tokens=4096),
                        tmp_path, env_name="household", max_new_tokens=8)
  teacher = teacher_lib.OpenAITeacher("http://127.0.0.1:9/v1", "m")
  with pytest.raises(ValueError, match="bind them alike"):
    policies.run_stage1(
        start, policies.Stage1Config(annotator="teacher",
                                     analysis_mode="episode_step"),
        tmp_path, env_name="household", max_new_tokens=8, teacher=teacher)
  assert not list(tmp_path.iterdir())


def test_rl_analysis_prompts_must_match_stage1s(policy):
  trainer = _trainer(policy, analysis_max_prompt_tokens=600,
                     analysis_max_chars=3000)
  stage1 = {"analysis_prompt": dict(mode="episode_step", max_critical_steps=2,
                                    max_chars=3000, max_tokens=600)}
  trainer.check_stage1(stage1)  # the same prompts
  trainer.check_stage1(None)  # no Stage 1
  trainer.check_stage1({"val_loss": 1.0})  # a report from before the check
  for key, value in (("max_tokens", 1024), ("max_chars", None),
                     ("mode", "episode_only"), ("max_critical_steps", 3)):
    bad = {"analysis_prompt": dict(stage1["analysis_prompt"], **{key: value})}
    with pytest.raises(ValueError, match="bind them alike"):
      trainer.check_stage1(bad)
  # GRPO writes no analyses: nothing to match.
  _trainer(policy, variant="grpo").check_stage1(
      {"analysis_prompt": dict(stage1["analysis_prompt"], max_tokens=1)})


def test_rl_warns_when_stage1_sent_inadmissible_actions_otherwise(
    policy, caplog):
  caplog.set_level(logging.WARNING)
  written = _trainer(policy, invalid_action="as_written")
  for report in ({"invalid_action": "no_op"}, {"val_loss": 1.0}):
    written.check_stage1(report)  # a report that does not say: the no-op
    [warning] = [r.getMessage() for r in caplog.records]
    assert ("Stage 1's rollouts sent inadmissible actions as 'no_op', this "
            "run's as 'as_written'") in warning
    caplog.clear()
  written.check_stage1({"invalid_action": "as_written"})
  written.check_stage1(None)  # no Stage 1
  _trainer(policy).check_stage1({"val_loss": 1.0})
  _trainer(policy, variant="grpo", invalid_action="as_written").check_stage1(
      {"val_loss": 1.0})  # GRPO writes no analyses
  assert not caplog.records


def test_rl_warns_when_its_analyses_are_shorter_than_stage1s(policy, caplog):
  trainer = _trainer(policy)  # analysis_max_new_tokens=16
  caplog.set_level(logging.WARNING)
  trainer.check_stage1({"response_len_max": 256})
  [warning] = [r.getMessage() for r in caplog.records]
  assert ("RLConfig.analysis_max_new_tokens=16 is below the "
          "Stage1Config.response_len_max=256") in warning
  caplog.clear()
  trainer.check_stage1({"response_len_max": 16})  # alike
  trainer.check_stage1({"val_loss": 1.0})  # a report from before the record
  _trainer(policy, variant="grpo").check_stage1({"response_len_max": 256})
  assert not caplog.records


def test_analyses_cut_at_their_token_budget_are_counted_as_truncated(policy):
  trainer = _trainer(policy)
  res = _played(trainer)
  # The random tiny policy writes no EOS in analysis_max_new_tokens=16.
  found, stats = trainer._analyze(policy.params, res.episodes,
                                  jax.random.key(0))
  assert not found and stats["analyses_parsed"] == 0.0
  assert stats["analyses_truncated"] == 1.0
  assert stats["analyses_failed/truncated"] == 4.0
  assert stats["analyses_failed/no_json"] == 0.0
  # A reply cut at the budget that parses anyway is kept (and counted cut);
  # one that ends on EOS and does not parse fails for what it lacks.
  whole = json.dumps({"episode_summary": "s", "episode_skill": "k"})
  replies = [whole, whole[:20], "no json here", whole]
  ids = [trainer.tokenizer.encode(r, add_special_tokens=False)
         for r in replies]
  cut = [True, True, False, False]

  def generate_ids(params, prompt_ids, rng, sampling, max_new_tokens=None):
    del params, rng, sampling, max_new_tokens
    return [rollout.Sampled(list(p), r, [0.0] * len(r), truncated=c)
            for p, r, c in zip(prompt_ids, ids, cut)]

  trainer.analyst.generate_ids = generate_ids
  found, stats = trainer._analyze(None, res.episodes, jax.random.key(0))
  assert sorted(found) == [0, 3] and stats["analyses_parsed"] == 0.5
  assert stats["analyses_truncated"] == 0.5
  assert stats["analyses_failed/truncated"] == 1.0
  assert stats["analyses_failed/no_json"] == 1.0


def test_a_kl_term_without_a_reference_is_a_clear_error(policy):
  trainer = _trainer(policy)  # kl_coef 0.01
  res = _played(trainer)
  c = trainer_lib.Collected(res.samples, res.episodes, {}, {})
  state = trainer.create_state(policy.params)
  with pytest.raises(ValueError, match=r"kl_coef=0.01 needs the KL reference"
                     r".*ref_params is None"):
    trainer.build_batch(state, None, c)

  def collect(*args, **kw):
    raise AssertionError("rolled out before the check")

  trainer.collect = collect
  with pytest.raises(ValueError, match="ref_params is None"):
    trainer.update(state, None, jax.random.key(0), update_index=0)
  # Without the KL term no reference is read.
  free = _trainer(policy, kl_coef=0.0)
  batch, _ = free.build_batch(free.create_state(policy.params), None, c)
  np.testing.assert_array_equal(batch["ref_logp"], batch["old_logp"])


def _buffers(tree):
  return {s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)
          for s in x.addressable_shards}


@pytest.mark.parametrize("where", ["mesh", "replicated", "bfloat16", "host",
                                   "one_device"])
def test_params_on_the_mesh_are_copied_there_not_through_the_host(
    policy, monkeypatch, where):
  """Stage 1 on the training mesh leaves the params there: the reference and
  the state are copies made on the devices (no gather to the host), in new
  buffers that outlive the state's (donated each step); other params take
  the host path. Values, dtypes and shardings are the same either way."""
  mesh = partitioning.make_mesh((1, -1, 1))  # fsdp over 8 devices
  rl = trainer_lib.RLConfig(num_groups=2, group_size=2, max_steps=3,
                            mini_batch_size=8, prompt_buckets=(512, 1024))
  t = trainer_lib.RLTrainer(policy.config, policy.tokenizer, rl,
                            env_name="household", tx=optax.sgd(0.0),
                            mesh=mesh)
  params = {
      "mesh": lambda: policies.place(policy, mesh).params,
      "replicated": lambda: jax.device_put(policy.params,
                                           NamedSharding(mesh, P())),
      "bfloat16": lambda: jax.tree.map(
          lambda x: x.astype(jnp.bfloat16),
          policies.place(policy, mesh).params),
      "host": lambda: jax.device_get(policy.params),
      "one_device": lambda: policy.params,  # not on the mesh's 8 devices
  }[where]()
  want = jax.device_get(params)
  gets = []
  device_get = jax.device_get
  monkeypatch.setattr(jax, "device_get",
                      lambda x: gets.append(1) or device_get(x))
  reference = t.place_params(params)
  state = t.create_state(params)
  monkeypatch.undo()
  on_mesh = where in ("mesh", "replicated", "bfloat16")
  if on_mesh:
    assert not gets, "on-mesh params went through the host"
  for tree in (reference, state.params):
    for x, sh, w in zip(jax.tree.leaves(tree),
                        jax.tree.leaves(t.param_shardings),
                        jax.tree.leaves(want)):
      assert x.sharding == sh and x.dtype == w.dtype
      assert np.asarray(x).tobytes() == w.tobytes()
  assert not _buffers(reference) & _buffers(state.params)
  if on_mesh:
    assert not _buffers(params) & (_buffers(reference)
                                   | _buffers(state.params))
  # The state's buffers go (donated by the train step): the rest stay.
  jax.tree.map(lambda x: x.delete(), state.params)
  for tree in (reference, params):
    for x, w in zip(jax.tree.leaves(tree), jax.tree.leaves(want)):
      assert np.asarray(x).tobytes() == w.tobytes()


def test_chunk_shares_are_weighted_by_what_they_are_shares_of():
  # Chunk A: 64 analyses sampled, all cut; chunk B: 1 sampled (63 prompts
  # too long), none cut. 64 of 65 were cut, not a half.
  a = {"analyses_parsed": 0.0, "analyses_asked": 64.0,
       "analyses_truncated": 1.0, "analyses_sampled": 64.0,
       "analysis_prompts_too_long": 0.0}
  b = {"analyses_parsed": 1 / 64, "analyses_asked": 64.0,
       "analyses_truncated": 0.0, "analyses_sampled": 1.0,
       "analysis_prompts_too_long": 63.0}
  merged = trainer_lib.merge_chunk_metrics([a, b])
  assert merged["analyses_truncated"] == pytest.approx(64 / 65)
  assert merged["analyses_parsed"] == pytest.approx(1 / 128)
  assert merged["analyses_sampled"] == 65.0
  assert merged["analysis_prompts_too_long"] == 63.0
  assert trainer_lib.merge_chunk_metrics([]) == {}


def test_steps_of_an_episode_whose_env_raised_are_not_trained_on(policy):
  # Member 1's environment raises on its second step: its first step has
  # no outcome to be judged by, so it is neither in the batch nor analyzed.
  t = _trainer(policy)
  member = t.pool.members[1]
  real_step, calls = member.step, []

  def flaky(action):
    calls.append(action)
    if len(calls) == 2:
      raise RuntimeError("the simulator went away")
    return real_step(action)

  member.step = flaky
  c, analyzed = _collect_and_spy(t, policy)
  broken = [e for e in c.episodes if e.error is not None]
  assert len(broken) == 1 and broken[0].length >= 1
  assert broken[0].traj_uid not in {s.traj_uid for s in c.samples}
  assert c.metrics["samples_env_error"] == broken[0].length
  assert broken[0] not in analyzed and len(analyzed) == len(c.episodes) - 1
  assert {s.traj_uid for s in c.samples} == {
      e.traj_uid for e in c.episodes if e.error is None}


def test_replies_cut_at_max_new_tokens_are_counted(policy):
  t = _trainer(policy, variant="grpo")
  reply = "<think>x</think><action>look</action>"
  ids = t.tokenizer.encode(reply, add_special_tokens=False)
  cuts = []

  def generate(params, prompts, rng, sampling):  # every third reply is cut
    del params, rng, sampling
    out = []
    for p in prompts:
      cuts.append(len(cuts) % 3 == 0)
      out.append(rollout.Generation(reply, t.policy.encode(p), ids,
                                    [-1.0] * len(ids), truncated=cuts[-1]))
    return out

  t.policy.generate = generate
  c = t.collect(t.place_params(policy.params), jax.random.key(0),
                update_index=0)
  assert 0 < sum(cuts) < len(cuts) == len(c.samples)
  assert [s.truncated for s in c.samples] == cuts
  assert c.metrics["responses_truncated"] == pytest.approx(
      sum(cuts) / len(cuts))


def test_an_update_reports_where_its_rollouts_searched(policy):
  """And how far they got."""
  t = _trainer(policy, variant="grpo")

  def generate(params, prompts, rng, sampling):  # the last place listed
    del params, rng, sampling
    out = []
    for p in prompts:
      places = re.findall(r"'(go to [a-z]+ \d+)'",
                          p.rsplit("admissible actions", 1)[-1])
      reply = f"<think>x</think><action>{places[-1]}</action>"
      ids = t.tokenizer.encode(reply, add_special_tokens=False)
      out.append(rollout.Generation(reply, t.policy.encode(p), ids,
                                    [-1.0] * len(ids)))
    return out

  t.policy.generate = generate
  c = t.collect(t.place_params(policy.params), jax.random.key(0),
                update_index=0)
  want = episodes.sum_ratios(household.episode_stats(e) for e in c.episodes)
  # It never takes: won_after_take and steps_to_take have no episodes (nor
  # took_after_reach unless it went where a goal object was).
  looks = {"look_steps", "look_new_place", "look_revisit", "look_other",
           "look_invalid", "look_invalid_take"}
  # Every reply is admissible: no invalid step, none to repeat.
  assert {"search_usual", "search_usual_chance", "search_usual_over_chance",
          "reached_goal_place", "took_goal", "look_steps",
          "invalid_steps"} <= set(want) <= {
              "search_usual", "search_usual_chance",
              "search_usual_over_chance", "reached_goal_place",
              "took_after_reach", "took_goal", *looks, "invalid_steps",
              "invalid_repeat", "invalid_repeat_failed", "invalid_go_here"}
  for name, value in want.items():
    assert c.metrics[name] == pytest.approx(value)
  assert 0 <= c.metrics["search_usual"] <= 1
  assert c.metrics["took_goal"] == 0
  assert c.metrics["invalid_steps"] == 0
  assert not {"invalid_repeat", "invalid_repeat_failed",
              "invalid_go_here"} & set(want)


@pytest.mark.parametrize("invalid_action", ["no_op", "as_written"])
def test_rollouts_send_an_inadmissible_action_as_the_config_says(
    policy, invalid_action):
  t = _trainer(policy, variant="grpo", invalid_action=invalid_action)

  def generate(params, prompts, rng, sampling):  # always inadmissible
    del params, rng, sampling
    reply = "<think>x</think><action>go to the moon</action>"
    ids = t.tokenizer.encode(reply, add_special_tokens=False)
    return [rollout.Generation(reply, t.policy.encode(p), ids,
                               [-1.0] * len(ids)) for p in prompts]

  t.policy.generate = generate
  c = t.collect(t.place_params(policy.params), jax.random.key(0),
                update_index=0)
  sent = {s.action for e in c.episodes for s in e.steps}
  assert sent == {"look" if invalid_action == "no_op" else "go to the moon"}
  assert c.metrics["invalid_steps"] == 1
  # The game answered the action itself: "Nothing happens.".
  told = {s.observation for e in c.episodes for s in e.steps[1:]}
  assert (told == {"Nothing happens."}) == (invalid_action == "as_written")


def test_an_update_whose_every_env_raised_is_a_clear_error(policy):
  t = _trainer(policy)

  def broken(seed):
    raise RuntimeError(f"no task for seed {seed}")

  for member in t.pool.members:
    member.reset = broken
  with pytest.raises(RuntimeError, match="no step to train on: 4 of 4"):
    t.collect(t.place_params(policy.params), jax.random.key(0),
              update_index=0)


def test_a_rollout_prompt_past_the_buckets_names_the_rl_knobs(
    policy, monkeypatch):
  t = _trainer(policy, prompt_buckets=(64,))
  monkeypatch.setattr(rollout.sampler_lib, "sample",
                      lambda *a, **kw: pytest.fail("sampled a long prompt"))
  with pytest.raises(rollout.PromptTooLongError) as info:
    t.collect(t.place_params(policy.params), jax.random.key(0),
              update_index=2)
  e = info.value
  seed = base.split_seeds("train", 2, start=2 * 2)[0]  # update 3's first
  assert e.index == 0 and e.largest == 64 and e.tokens > 64
  assert str(e) == (
      f"update 3, chunk 1/1: rollout step 1/3, episode 0 (group 4, seed "
      f"{seed}, task {t.pool.members[0].task!r}): prompt of {e.tokens} "
      "tokens exceeds the largest bucket (64); RL never cuts prompts: raise "
      "RLConfig.prompt_buckets (now (64,)) or shorten the prompts with "
      "RLConfig.history_length (now 2)")
