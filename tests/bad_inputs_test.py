"""Bad inputs and configs: each a clear early error or a documented, counted
behaviour (docs/reliability.md lists them with the tests elsewhere)."""

import errno
import logging
import os
import shutil

import gin
import jax
import numpy as np
import pytest

from seed_jax import advantages
from seed_jax import checkpoints
from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import prompts
from seed_jax import rollout
from seed_jax import sft
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib
from seed_jax import train
from seed_jax import train_step as ts
from seed_jax import trainer as trainer_lib
from seed_jax.envs import base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "configs/experiments/tiny.gin"


@pytest.fixture(scope="module")
def tiny():
  """(config, params, tokenizer): a 1-layer decoder with random weights.

  The weights are filled on the host: compiling the real init costs seconds
  and nothing here depends on how they were drawn.
  """
  pool = base.EnvPool("household", num_groups=2, group_size=1)
  obs, infos = pool.reset([0, 1])
  corpus = [prompts.build_prompt("household", env.task, [], o,
                                 i["admissible_actions"])
            for env, o, i in zip(pool.members, obs, infos)]
  tok = tokenizer_lib.train_tokenizer(corpus * 3, vocab_size=600)
  config = testing.tiny_config(
      vocab_size=len(tok), num_layers=1, max_position_embeddings=1040,
      eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype),
      model_lib.param_shapes(config))
  return config, params, tok


# -- prompts longer than the context ------------------------------------------

LONG = "go to the desk and look around " * 40  # about 100 tokens


def test_long_prompt_is_cut_and_counted_when_asked(tiny):
  config, params, tok = tiny
  policy = rollout.Policy(config, tok, max_new_tokens=2, buckets=(32,),
                          truncate_prompts=True)
  gens = policy.generate(params, [LONG, "look"], jax.random.key(0))
  assert policy.prompts_truncated == 1  # counted, and logged
  assert len(gens[0].prompt_ids) == 32  # the oldest tokens went
  assert gens[0].prompt_ids == policy.encode(LONG)[-32:]
  assert gens[1].prompt_ids == policy.encode("look")


def test_long_prompt_is_a_clear_error_by_default(tiny):
  config, params, tok = tiny
  policy = rollout.Policy(config, tok, max_new_tokens=2, buckets=(32,))
  with pytest.raises(ValueError, match="exceeds the largest bucket .32.; "
                     "raise the buckets or ask for left truncation"):
    policy.generate(params, [LONG], jax.random.key(0))
  assert policy.prompts_truncated == 0


def _own_tokenizer():
  """A small tokenizer of this test's own, to change freely."""
  return tokenizer_lib.train_tokenizer(["go to desk 1 and look around"] * 3,
                                       vocab_size=300)


def test_no_eos_anywhere_is_a_clear_error():
  tok = _own_tokenizer()
  tok.eos_token = None
  config = testing.tiny_config(vocab_size=len(tok), eos_token_ids=())
  with pytest.raises(ValueError, match="no EOS token"):
    rollout.Policy(config, tok, max_new_tokens=8)


def test_no_chat_template_is_said(caplog):
  tok = _own_tokenizer()
  tok.chat_template = None
  config = testing.tiny_config(vocab_size=len(tok),
                               eos_token_ids=(tok.eos_token_id,))
  with caplog.at_level(logging.WARNING):
    policy = rollout.Policy(config, tok, max_new_tokens=8)
  assert "no chat template" in caplog.text
  assert policy.encode("go to desk 1") == tok.encode(
      "go to desk 1", add_special_tokens=False)


def test_no_bucket_fits_the_context(tiny):
  config, _, tok = tiny
  with pytest.raises(ValueError, match="no prompt bucket fits the model's "
                     "context .1040. with max_new_tokens=1024"):
    rollout.Policy(config, tok, max_new_tokens=1024, buckets=(32, 64))


def _rl(**kw):
  base_kw = dict(variant="grpo", num_groups=2, group_size=2, max_steps=2,
                 history_length=1, max_new_tokens=4, prompt_buckets=(512,),
                 mini_batch_size=4, kl_coef=0.0)
  return trainer_lib.RLConfig(**{**base_kw, **kw})


def _trainer(tiny, rl, env_name="household"):
  config, _, tok = tiny
  return trainer_lib.RLTrainer(config, tok, rl, env_name=env_name,
                               tx=ts.make_optimizer(1e-3))


def test_rl_prompt_over_the_buckets_stops_the_update_before_sampling(tiny):
  # RL does not cut prompts (a cut prompt would train on another context):
  # the first rollout step raises, before anything is compiled or trained.
  trainer = _trainer(tiny, _rl(prompt_buckets=(64,)))
  state = ts.TrainState.create(tiny[1], ts.make_optimizer(1e-3))
  with pytest.raises(ValueError, match="exceeds the largest bucket .64."):
    trainer.update(state, None, jax.random.key(0), update_index=0)


def test_a_failed_chunk_on_another_process_is_named(tiny, monkeypatch):
  # Every process reaches the gather, whatever failed; the others raise,
  # naming the process and its error (here a peer's, simulated).
  trainer = _trainer(tiny, _rl())
  monkeypatch.setattr(trainer, "_play_chunk",
                      lambda *a: {"rollout_time": 0.0, "analysis_time": 0.0})
  monkeypatch.setattr(trainer_lib.distributed, "allgather_objects",
                      lambda obj: [obj, ([], "ValueError: prompt too long")])
  with pytest.raises(RuntimeError, match="process 1 failed in its rollout "
                     "chunks: ValueError: prompt too long"):
    trainer.collect(tiny[1], jax.random.key(0), update_index=0)
  sent = []

  def boom(*args):
    raise ValueError("exceeds the largest bucket")

  monkeypatch.setattr(trainer, "_play_chunk", boom)
  monkeypatch.setattr(trainer_lib.distributed, "allgather_objects",
                      lambda obj: sent.append(obj) or [obj])
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    trainer.collect(tiny[1], jax.random.key(0), update_index=0)
  assert sent == [([], "ValueError: exceeds the largest bucket")]


# -- empty datasets -----------------------------------------------------------
# write_dataset([]) is tests/stage1_test.py::test_write_dataset_errors.


def test_sft_on_no_records_is_a_clear_error(tiny):
  config, params, tok = tiny
  with pytest.raises(ValueError, match="no training record fits"):
    sft.sft(params, config, tok, [], [], learning_rate=1e-3,
            rng=jax.random.key(0), buckets=(512,), response_len_max=16)


# -- group size 1 -------------------------------------------------------------


@pytest.mark.parametrize("norm", ["mean_std_norm", "mean_norm"])
@pytest.mark.parametrize("stats_over", ["samples", "trajectories"])
def test_grpo_singleton_groups_are_finite(norm, stats_over):
  scores = np.asarray([0.5, -1.0, 2.0, 0.0], np.float32)
  adv = np.asarray(advantages.grpo(scores, np.arange(4), np.arange(4),
                                   norm=norm, stats_over=stats_over))
  assert np.isfinite(adv).all()
  # A lone member is measured against mean 0 and std 1, as documented.
  np.testing.assert_allclose(adv, scores, rtol=1e-5)


@pytest.mark.slow  # about 20 s: compiles the sampler, scorer and train step
def test_update_with_group_size_one_runs(tiny):
  config, params, _ = tiny
  tx = ts.make_optimizer(1e-3)
  trainer = _trainer(tiny, _rl(group_size=1))
  state = ts.TrainState.create(params, tx)
  state, metrics = trainer.update(state, None, jax.random.key(0),
                                  update_index=0)
  assert metrics["skipped"] == 0 and np.isfinite(metrics["loss"])
  assert metrics["num_samples"] == metrics["env_steps"] == 4
  assert int(state.step) == 1


# -- unknown model families and environments ----------------------------------
# An unsupported Hugging Face architecture is
# tests/model_test.py::test_unsupported_architecture_is_named.


def test_unknown_model_family_is_named():
  with pytest.raises(ValueError, match="unsupported model family 'mistral'; "
                     r"supported: \('llama', 'qwen2', 'qwen3'\)"):
    testing.tiny_config(family="mistral")


def test_unknown_model_family_from_gin_fails_before_training(tmp_path):
  gin.clear_config()
  with pytest.raises(SystemExit,
                     match="^error: unsupported model family 'mistral'"):
    train.main(["--gin_file", os.path.join(ROOT, TINY),
                f"--gin.WORKDIR='{tmp_path}'",
                "--gin.testing.tiny_policy.family='mistral'"])
  gin.clear_config()
  assert not (tmp_path / "checkpoints").exists()


def test_unknown_env_is_named_when_the_trainer_is_built(tiny):
  with pytest.raises(ValueError, match="webshop") as e:
    _trainer(tiny, _rl(), env_name="webshop")
  assert "household" in str(e.value) and "sokoban" in str(e.value)


def test_unknown_variant_analyzer_and_missing_teacher():
  with pytest.raises(ValueError, match="unknown variant 'ppo'"):
    trainer_lib.RLConfig(variant="ppo")
  with pytest.raises(ValueError, match="unknown analyzer 'gpt'"):
    trainer_lib.RLConfig(analyzer="gpt")
  # Refused at construction, not after the first rollout and analysis.
  with pytest.raises(ValueError, match="unknown adv_norm 'std'"):
    trainer_lib.RLConfig(adv_norm="std")
  with pytest.raises(ValueError, match="unknown adv_stats_over 'groups'"):
    trainer_lib.RLConfig(adv_stats_over="groups")
  with pytest.raises(ValueError, match=r"RLConfig.invalid_action must be "
                     r"one of \('no_op', 'as_written'\), got 'skip'"):
    trainer_lib.RLConfig(invalid_action="skip")
  with pytest.raises(ValueError, match="micro_batches must be >= 1, got 32 "
                     "and 0"):
    trainer_lib.RLConfig(micro_batches=0)


def test_external_analyzer_without_teacher(tiny):
  with pytest.raises(ValueError, match="needs a teacher"):
    _trainer(tiny, _rl(variant="seed", analyzer="external"))


# -- a full disk --------------------------------------------------------------


def _disk(free):
  return lambda path: shutil._ntuple_diskusage(100 << 30, (100 << 30) - free,
                                               free)


def test_check_free_space(tmp_path, monkeypatch):
  monkeypatch.setattr(shutil, "disk_usage", _disk(5 << 20))
  checkpoints.check_free_space(tmp_path, 1 << 20)
  with pytest.raises(OSError, match=f"only 5.0 MiB free in {tmp_path}; the "
                     "run needs at least 1.00 GiB") as e:
    checkpoints.check_free_space(tmp_path, 1 << 30)
  assert e.value.errno == errno.ENOSPC
  checkpoints.check_free_space("gs://bucket/run", 1 << 60)  # not checked


def test_tree_bytes():
  shapes = {"a": jax.ShapeDtypeStruct((3, 4), np.float32),
            "b": np.zeros((5,), np.int8)}
  assert checkpoints.tree_bytes(shapes) == 3 * 4 * 4 + 5


def test_full_disk_stops_the_run_before_the_policy_is_built(tmp_path,
                                                            monkeypatch):
  monkeypatch.setattr(shutil, "disk_usage", _disk(1 << 20))

  def policy_fn(*args, **kwargs):
    raise AssertionError("the policy was built on a full disk")

  with pytest.raises(OSError, match="MiB free in .* needs at least 1.00 GiB"):
    train.train(str(tmp_path / "run"), policy_fn=policy_fn,
                rl=trainer_lib.RLConfig())


def test_no_room_for_the_checkpoints_stops_the_run_before_an_update(
    tmp_path, monkeypatch):
  """The second check knows the model: room for max_to_keep + 1 copies."""
  workdir = tmp_path / "run"
  policy = testing.tiny_policy(seed=0)
  rl = trainer_lib.RLConfig(num_groups=2, group_size=2, max_steps=2,
                            max_new_tokens=8)
  state = jax.eval_shape(
      lambda p: ts.TrainState.create(p, ts.make_optimizer(1e-4)),
      policy.params)
  one = checkpoints.tree_bytes(state) + checkpoints.tree_bytes(policy.params)
  # Room for two copies, short of the three that max_to_keep=2 needs.
  monkeypatch.setattr(shutil, "disk_usage", _disk(2 * one + (one >> 1)))
  with pytest.raises(OSError, match=r"MiB free in .*; the run needs at least "
                     rf"{3 * one / 2**20:.1f} MiB for its checkpoints"):
    train.train(str(workdir), policy_fn=lambda *a, **kw: policy, rl=rl,
                num_updates=1, learning_rate=1e-4, max_to_keep=2,
                min_free_bytes=0,
                eval_every=0)
  assert not (workdir / "checkpoints").exists() or not list(
      (workdir / "checkpoints").iterdir())
  # keep_every=2 over 4 updates keeps steps 2 and 4 besides the latest:
  # 1 + 1 + 2 copies.
  monkeypatch.setattr(shutil, "disk_usage", _disk(3 * one + (one >> 1)))
  with pytest.raises(OSError, match=r"needs at least "
                     rf"{4 * one / 2**20:.1f} MiB for its checkpoints"):
    train.train(str(workdir), policy_fn=lambda *a, **kw: policy, rl=rl,
                num_updates=4, learning_rate=1e-4, max_to_keep=1,
                keep_every=2, min_free_bytes=0, eval_every=0)


def test_chat_bad_flags_and_folders_are_clear_errors(tmp_path, capsys):
  from seed_jax import chat  # pylint: disable=g-import-not-at-top
  for flags, message in ((["--max_new_tokens=-1"], "--max_new_tokens must"),
                         (["--temperature=-1"], "--temperature must"),
                         (["--temperature=nan"], "--temperature must"),
                         (["--temperature=inf"], "--temperature must")):
    with pytest.raises(SystemExit):
      chat.main(flags + ["hi"])
    assert message in capsys.readouterr().err
  # The tokenizer is read first: an empty folder fails before any weights.
  with pytest.raises(SystemExit, match="error: no tokenizer in"):
    chat.main([f"--model_dir={tmp_path}", "hi"])
  # A base model's folder: its tokenizer has no chat template to send turns.
  policy = testing.tiny_policy(vocab_size=400)
  folder = str(tmp_path / "base")
  hf.save_pretrained(folder, policy.config, policy.params)
  policy.tokenizer.chat_template = None
  policy.tokenizer.save_pretrained(folder)
  with pytest.raises(SystemExit, match="error: the tokenizer of .*base has "
                     "no chat template"):
    chat.main([f"--model_dir={folder}", "hi"])
  # A tokenizer without a model beside it.
  bare = str(tmp_path / "bare")
  testing.tiny_policy(vocab_size=400).tokenizer.save_pretrained(bare)
  with pytest.raises(SystemExit, match="error: no config.json"):
    chat.main([f"--model_dir={bare}", "hi"])
  # A reply budget past the model's context is one line, not a traceback.
  chat_folder = str(tmp_path / "chat")
  hf.save_pretrained(chat_folder, policy.config, policy.params)
  testing.tiny_policy(vocab_size=400).tokenizer.save_pretrained(chat_folder)
  with pytest.raises(SystemExit, match="error: prompt bucket .* exceeds the "
                     "model's context"):
    chat.main([f"--model_dir={chat_folder}", "--max_new_tokens=5000", "hi"])
