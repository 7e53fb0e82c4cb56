"""Policy and analyzer outputs fuzzed: random bytes, unicode, endless text,
nested and repeated tags. Each is a counted invalid step or an unparsed
analysis, never an exception (docs/reliability.md)."""

import functools
import json
import time

from hypothesis import given, settings, strategies as st
import jax
import optax
import pytest

from seed_jax import envs
from seed_jax import prompts
from seed_jax import rollout
from seed_jax import skills
from seed_jax import teacher as teacher_lib
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib
from seed_jax import trainer as trainer_lib
from seed_jax.envs import base

# Pieces a broken policy strings together: tags (cased, spaced, nested),
# actions, whitespace, control and bidi characters, a lone surrogate.
_PIECES = ["<think>", "</think>", "<action>", "</action>", "<ACTION>",
           "</ action>", "<action ", "<", ">", "/", "look", "go to desk 1",
           "take mug 1 from desk 1", "put mug 1 in/on sink 1", "up", "left",
           " ", "\n", "\t", "\x00", "\r\n", "é", "😀", "\u202e", "\ufffd",
           "\ud800", "{", "}", '"']
_SOUP = st.lists(st.sampled_from(_PIECES), max_size=80).map("".join)
_NESTED = st.recursive(
    st.sampled_from(["look", "up", "", "go to desk 1"]),
    lambda inner: st.builds(lambda a, tag: f"<{tag}>{a}</{tag}>", inner,
                            st.sampled_from(["think", "action"])),
    max_leaves=8)
_REPEATED = st.builds(lambda piece, n: piece * n, st.sampled_from(_PIECES[:6]),
                      st.integers(1, 200))
# Random bytes as the tokenizer would decode them, lone surrogates included.
_BYTES = st.binary(max_size=400).map(
    lambda b: b.decode("utf-8", "surrogateescape"))
REPLIES = st.one_of(st.text(), _BYTES, _SOUP, _NESTED, _REPEATED)

ENVS = ("household", "sokoban")
# Replies that are valid in one of the two environments, mixed in.
WELL_FORMED = ("<think>x</think><action>look</action>",
               "<think>x</think><action>up</action>")


@functools.lru_cache()
def _admissible(env_name):
  _, info = envs.make(env_name).reset(3)
  return tuple(info["admissible_actions"])


def _check_projection(env_name, text):
  admissible = _admissible(env_name)
  action, valid = prompts.project(env_name, text, admissible)
  assert isinstance(action, str) and isinstance(valid, bool)
  if valid:
    assert action in admissible
  else:
    assert action == prompts.NO_OPS[env_name]
  return valid


@settings(max_examples=300, deadline=None)
@given(env_name=st.sampled_from(ENVS), text=REPLIES)
def test_projection_never_raises(env_name, text):
  _check_projection(env_name, text)


@pytest.mark.parametrize("text,valid", [
    ("<think>a</think><action><action>look</action></action>", False),
    ("<think>a</think><action>look</action><action>examine desk 1</action>",
     True),  # the first action counts
    ("<think><think>a</think><action>look</action>", True),
    ("<action>look</action>", False),  # no think
    ("<think>a</think><action>look", False),  # no closing tag: cut reply
    ("<THINK>a</THINK><Action> LOOK </Action>", True),
    ("<think>a</think><action>" + "look " * 100 + "</action>", False),
    ("<think>a</think><action>lo\u200bok</action>", False),
])
def test_nested_repeated_and_cut_tags(text, valid):
  assert _check_projection("household", text) == valid


@pytest.mark.parametrize("text", [
    "a" * 1_000_000,  # endless text, no tag, no stop
    "<think>" * 100_000,
    "<think>x</think>" * 50_000,
    "<think>x</think><action>" + "look " * 200_000,  # never closed
    # Repeated open tags cost quadratic time in the regex; a policy reply is
    # bounded by max_new_tokens, so this size is past any real one.
    "<action>" * 500,
])
def test_huge_replies_are_invalid_and_quick(text):
  start = time.perf_counter()
  assert not _check_projection("household", text)
  assert time.perf_counter() - start < 2.0


def _fuzzing_generate(texts):
  """A GenerateFn answering with `texts` in turn, whatever the prompt."""
  it = iter(range(10**9))

  def generate(prompt_batch, rng):
    del rng
    return [rollout.Generation(texts[next(it) % len(texts)], [5, 6], [7, 8],
                               [-1.0, -2.0]) for _ in prompt_batch]

  return generate


@settings(max_examples=40, deadline=None)
@given(env_name=st.sampled_from(ENVS),
       texts=st.lists(st.one_of(REPLIES, st.sampled_from(WELL_FORMED)),
                      min_size=1, max_size=12))
def test_rollout_with_fuzzed_replies_counts_invalid_steps(env_name, texts):
  pool = base.EnvPool(env_name, num_groups=2, group_size=2, max_steps=4)
  res = rollout.rollout(_fuzzing_generate(texts), pool, jax.random.key(0),
                        env_name=env_name, max_steps=4, group_seeds=[1, 2])
  steps = {(ep.traj_uid, t): s for ep in res.episodes
           for t, s in enumerate(ep.steps)}
  assert len(steps) == len(res.samples) == res.env_steps > 0
  assert all(ep.error is None for ep in res.episodes)
  for sample in res.samples:
    step = steps[sample.traj_uid, sample.step]
    assert sample.action_valid is step.action_valid
    if step.action_valid:  # a well-formed reply naming this very action
      assert prompts.project(env_name, step.response, [step.action]) == (
          step.action, True)
    elif not prompts.project(env_name, step.response, [])[1]:
      assert step.action == prompts.NO_OPS[env_name]  # the counted no-op


@pytest.fixture(scope="module")
def tiny():
  """(config, tokenizer) of a tiny policy; no weights, nothing is sampled."""
  pool = base.EnvPool("household", num_groups=2, group_size=1)
  obs, infos = pool.reset([0, 1])
  corpus = [prompts.build_prompt("household", env.task, [], o,
                                 i["admissible_actions"])
            for env, o, i in zip(pool.members, obs, infos)]
  tok = tokenizer_lib.train_tokenizer(corpus * 3, vocab_size=300)
  config = testing.tiny_config(
      vocab_size=len(tok), max_position_embeddings=2048,
      eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
  return config, tok


@pytest.fixture(scope="module")
def decoder(tiny):
  return rollout.Policy(*tiny, max_new_tokens=8)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 10**6), max_size=64))
def test_random_token_ids_decode_and_project(decoder, ids):
  ids = [i % len(decoder.tokenizer) for i in ids]
  _check_projection("household", decoder.decode(ids))


@pytest.fixture(scope="module")
def episodes():
  pool = base.EnvPool("household", num_groups=2, group_size=2, max_steps=3)
  texts = ["<think>x</think><action>look</action>", "no tags"]
  return rollout.rollout(_fuzzing_generate(texts), pool, jax.random.key(0),
                         env_name="household", max_steps=3,
                         group_seeds=[1, 2])


_GOOD = json.dumps({"episode_summary": "s", "episode_skill": "open it first"})
ANALYSES = st.one_of(REPLIES, st.just(_GOOD),
                     st.builds(lambda t: f"```json\n{{\"episode_skill\": "
                               f"{json.dumps(t)}}}\n```", st.text()))


def _trainer(tiny, analyzer):
  config = trainer_lib.RLConfig(num_groups=2, group_size=2, max_steps=3,
                                max_new_tokens=8, analysis_max_new_tokens=16,
                                prompt_buckets=(512, 1024), analyzer=analyzer)
  teacher = None
  if analyzer == "external":
    teacher = teacher_lib.OpenAITeacher("http://127.0.0.1:9/v1", "m")
  return trainer_lib.RLTrainer(*tiny, config,
                               env_name="household", tx=optax.sgd(0.0),
                               teacher=teacher)


@pytest.fixture(scope="module")
def self_trainer(tiny):
  return _trainer(tiny, "self")


@pytest.fixture(scope="module")
def external_trainer(tiny):
  return _trainer(tiny, "external")


def _check_found(trainer, res, found, parsed, replies):
  expected = {ep.traj_uid for ep, r in zip(res.episodes, replies)
              if isinstance(skills.parse_analysis(r), skills.Analysis)}
  assert set(found) == expected
  assert parsed == pytest.approx(len(expected) / len(res.episodes))
  # What the update does next with a skill: the augmented prompt, encoded.
  for s in res.samples:
    if s.traj_uid in found:
      augmented = skills.build_skill_prompt(s.prompt, found[s.traj_uid].skill)
      assert found[s.traj_uid].skill in augmented
      assert not found[s.traj_uid].step_skills  # "episode_only" mode
      assert trainer.policy.encode(augmented)


@settings(max_examples=40, deadline=None)
@given(replies=st.lists(ANALYSES, min_size=4, max_size=4))
def test_self_analysis_of_fuzzed_outputs_counts_unparsed(self_trainer,
                                                         episodes, replies):

  def generate_ids(params, prompt_ids, rng, sampling, max_new_tokens=None):
    del params, rng, sampling, max_new_tokens
    assert len(prompt_ids) == len(replies)
    return [(p, r, [-1.0]) for p, r in zip(prompt_ids, replies)]

  # The analyses' own policy; its replies here are texts, decoded as is.
  self_trainer.analyst.generate_ids = generate_ids
  self_trainer.analyst.decode = lambda text: text
  found, metrics = self_trainer._analyze(None, episodes.episodes,
                                         jax.random.key(0))
  _check_found(self_trainer, episodes, found, metrics["analyses_parsed"],
               replies)


@settings(max_examples=40, deadline=None)
@given(replies=st.lists(st.one_of(st.none(), ANALYSES), min_size=4,
                        max_size=4))
def test_external_analysis_of_fuzzed_outputs_counts_unparsed(
    external_trainer, episodes, replies):
  teacher = external_trainer.teacher
  teacher.complete_many = lambda prompts_: list(replies)
  before = teacher.stats.parsed + teacher.stats.failed
  found, metrics = external_trainer._analyze(None, episodes.episodes,
                                             jax.random.key(0))
  _check_found(external_trainer, episodes, found, metrics["analyses_parsed"],
               replies)
  assert teacher.stats.parsed + teacher.stats.failed - before == len(replies)
