"""Ahead-of-time fit check on one small case: the tiny model on v4-16's 8
chips (the 8 fake CPU devices)."""

import dataclasses
import inspect
import math

import jax
import optax
import pytest

from seed_jax import aot
from seed_jax import evaluate
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import rollout
from seed_jax import sampler
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib
from seed_jax import trainer


def test_built_in_shapes_match_the_published_sizes():
  sizes = {name: sum(math.prod(s.shape) for s in jax.tree.leaves(
      model_lib.param_shapes(aot.model_config(name))))
           for name in aot.SHAPES}
  # Parameter counts of the released checkpoints, in billions.
  want = {"qwen2_5_1_5b": 1.54, "qwen2_5_3b": 3.09, "qwen2_5_7b": 7.62,
          "qwen3_1_7b": 1.72}
  for name, billions in want.items():
    assert sizes[name] / 1e9 == pytest.approx(billions, abs=0.01), name


def test_tiny_train_step_and_sampler_fit_v4_16():
  config = testing.tiny_config(family="qwen3")
  report = aot.fit_report(config, topology="v4-16", mesh_shape=(2, 2, 2),
                          batch=8, micro_batches=2, prompt_len=32,
                          response_len=16, sample_batch=8, max_new_tokens=8,
                          remat=True)
  assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
  assert report["analyst"] is None  # no self-analysis asked
  assert report["hbm_bytes"] == 32 << 30
  train = report["train_step"]
  # The state (params + two Adam moments, float32) is split over the
  # devices: each holds well under a half of it.
  params = sum(math.prod(s.shape) * 4 for s in jax.tree.leaves(
      model_lib.param_shapes(config)))
  assert 0 < train.argument < 3 * params / 2
  assert train.alias > 0  # the state is donated
  assert train.peak > 0 and report["sampler"].peak > 0
  # The sampler runs on one chip with every parameter, beside that chip's
  # state shard (as `RLTrainer.local_params` places them).
  assert report["sampler"].argument >= params
  ref = report["reference"]
  assert report["rollout_peak"] == (train.argument + ref
                                    + report["sampler"].peak)
  assert report["fits"]
  # A chip that holds the state shard and the sampler apart but not together
  # does not fit.
  need = max(report["train_peak"], report["sampler"].peak,
             report["scoring_peak"])
  assert report["rollout_peak"] > need
  tight = aot.fit_report(config, topology="v4-16", mesh_shape=(2, 2, 2),
                         batch=8, micro_batches=2, prompt_len=32,
                         response_len=16, sample_batch=8, max_new_tokens=8,
                         remat=True,
                         hbm_gib=(need + report["rollout_peak"]) / 2 / 2**30)
  assert not tight["fits"]
  text = aot.format_report(report)
  assert "train_step" in text and "sampler" in text and text.endswith("fits")
  assert aot.format_report(dict(report, fits=False)).endswith("does NOT fit")


def test_the_kl_reference_counts_in_every_peak():
  """train.py keeps the reference parameters on the mesh all run long: its
  shard is in the train step's, the rollout's and the scoring peak."""
  config = testing.tiny_config(family="qwen3")
  kw = dict(topology="v4-16", mesh_shape=(1, 4, 2), batch=8, micro_batches=2,
            prompt_len=32, response_len=16, sample_batch=8, max_new_tokens=8,
            remat=True)
  report = aot.fit_report(config, **kw)
  mesh = partitioning.make_mesh((1, 4, 2))
  shardings = partitioning.param_shardings(config, mesh)
  shard = sum(math.prod(sh.shard_shape(s.shape)) * s.dtype.itemsize
              for s, sh in zip(jax.tree.leaves(model_lib.param_shapes(config)),
                               jax.tree.leaves(shardings)))
  whole = sum(math.prod(s.shape) * s.dtype.itemsize
              for s in jax.tree.leaves(model_lib.param_shapes(config)))
  assert report["reference"] == shard and 0 < shard < whole / 4
  train, score = report["train_step"], report["scorer"]
  assert report["train_peak"] == train.peak + shard
  assert report["rollout_peak"] == (train.argument + shard
                                    + report["sampler"].peak)
  # Scoring: the Adam moments (twice the parameters' shard, and a few
  # scalar counts) and the reference beside score_dual, whose arguments hold
  # the parameters.
  assert 0 <= report["scoring_peak"] - (2 * shard + shard + score.peak) < 64
  assert score.argument >= shard and score.peak > score.argument
  without = aot.fit_report(config, reference=False, **kw)
  assert without["reference"] == 0
  assert without["train_peak"] == train.peak
  assert without["rollout_peak"] == report["rollout_peak"] - shard
  # A chip that holds everything but the reference does not fit.
  peak = max(report["train_peak"], report["rollout_peak"],
             report["scoring_peak"])
  hbm = (peak - shard / 2) / 2**30
  assert not aot.fit_report(config, hbm_gib=hbm, **kw)["fits"]
  assert aot.fit_report(config, hbm_gib=hbm, reference=False, **kw)["fits"]
  text = aot.format_report(report)
  assert "the KL reference's shard" in text and "scorer" in text
  assert "scoring: " in text


def test_too_few_devices_is_a_clear_error():
  with pytest.raises(ValueError, match="v5p-32 needs 16 devices, 8"):
    aot.fit_report(testing.tiny_config(), topology="v5p-32", batch=8,
                   micro_batches=1, response_len=8, max_new_tokens=8,
                   remat=True)


def test_a_batch_the_trainer_would_refuse_is_an_error_before_compiling():
  mesh = partitioning.make_mesh((1, -1, 1))
  with pytest.raises(ValueError, match="8 micro-batches over the 8-way"):
    aot.compile_train_step(testing.tiny_config(), mesh, batch=32,
                           prompt_len=16, response_len=8, micro_batches=8)


def test_cli_flags():
  args = aot.parse_flags(["--model=qwen2_5_3b", "--topology=v5p-8",
                          "--mesh=1,2,2", "--batch=16"])
  assert (args.model, args.topology, args.mesh, args.batch) == (
      "qwen2_5_3b", "v5p-8", (1, 2, 2), 16)
  with pytest.raises(ValueError, match="unknown model"):
    aot.model_config("qwen9")


@pytest.mark.parametrize("flag,message", [
    ("--mesh=1,x,1", "--mesh=1,x,1: want three sizes"),
    ("--mesh=1,2", "want three sizes"),
    ("--param_dtype=foo", "invalid choice: 'foo'"),
    ("--dtype=int8", "invalid choice: 'int8'"),
    ("--model=bogus", "invalid choice: 'bogus'"),
    ("--prompt_len=-5", "must be > 0, got -5"),
    ("--batch=0", "must be > 0, got 0"),
    ("--hbm_gib=0", "must be > 0, got 0"),
    ("--hbm_gib=nan", "must be > 0, got nan"),
])
def test_bad_flags_are_named_at_parsing(flag, message, capsys):
  argv = ["--model=tiny", "--topology=v4-16", flag]
  with pytest.raises(SystemExit) as info:
    aot.parse_flags(argv[1:] if flag.startswith("--model") else argv)
  assert info.value.code == 2 and message in capsys.readouterr().err


def test_cli_refuses_what_cannot_compile_before_compiling(capsys, monkeypatch):
  monkeypatch.setattr(aot, "compile_train_step",
                      lambda *a, **kw: pytest.fail("compiled"))
  # tiny's context is 2048, and tiny.gin's responses take 8 tokens.
  assert aot.main(["--model=tiny", "--topology=v4-16",
                   "--prompt_len=2048"]) == 2
  assert ("error: --prompt_len + response_len = 2056 exceeds tiny's "
          "context of 2048 positions") in capsys.readouterr().err
  assert aot.main(["--model=tiny", "--topology=v4-16",
                   "--response_len=600"]) == 2
  assert ("error: prompt_len + --response_len = 2136 exceeds"
          in capsys.readouterr().err)
  # The analyses' budget too, from the run's config.
  assert aot.main(["--model=tiny", "--topology=v4-16",
                   "--gin.trainer.RLConfig.analysis_max_new_tokens=1000"]
                  ) == 2
  assert ("error: analysis_max_prompt_tokens=1536 exceeds the largest "
          "prompt bucket that leaves room for analysis_max_new_tokens=1000"
          ) in capsys.readouterr().err


def _sizes(monkeypatch, argv):
  """The sizes `aot.main(argv)` asks `fit_report` for (nothing compiles)."""
  seen = {}

  def fake(config, **kw):
    seen.update(kw)
    raise ValueError("stop here")

  monkeypatch.setattr(aot, "fit_report", fake)
  assert aot.main(argv) == 2
  return seen


def test_cli_sizes_the_check_as_the_run_s_rl_config(monkeypatch, capsys):
  """The trainer samples self-analyses with analysis_max_new_tokens (512 in
  configs/runs/rl.gin) after prompts of up to ANALYSIS_PROMPT_TOKENS (2048):
  that sampler is checked too, with the run's sizes, not a second copy."""
  kw = _sizes(monkeypatch, ["--model=qwen2_5_3b", "--topology=v5p-8"])
  assert {k: kw[k] for k in ("batch", "micro_batches", "response_len",
                             "max_new_tokens", "remat", "analysis")} == dict(
      batch=32, micro_batches=4, response_len=256, max_new_tokens=256,
      remat=True, analysis=(2048, 512))
  # Bindings and other gin files reach it as they reach the trainer.
  kw = _sizes(monkeypatch, [
      "--model=qwen2_5_3b", "--topology=v5p-8",
      "--gin.trainer.RLConfig.analysis_max_new_tokens=1024",
      "--gin", "ANALYSIS_PROMPT_TOKENS=700", "--micro_batches=2"])
  assert kw["analysis"] == (768, 1024) and kw["micro_batches"] == 2
  kw = _sizes(monkeypatch, ["--model=tiny", "--topology=v4-16",
                            "--gin_file=configs/experiments/tiny.gin",
                            "--gin.VARIANT='grpo'", "--no_remat"])
  assert kw["analysis"] is None and kw["max_new_tokens"] == 8
  assert kw["batch"] == 4 and kw["remat"] is False
  assert "error: stop here" in capsys.readouterr().err
  assert aot.main(["--model=tiny", "--topology=v4-16",
                   "--gin_file=configs/nope.gin"]) == 2
  assert "gin file 'configs/nope.gin' not found" in capsys.readouterr().err


def test_every_model_s_default_experiment_sizes_its_check():
  for name, path in aot.EXPERIMENTS.items():
    rl = aot.run_config([path])
    shapes = aot.run_shapes(
        rl, aot.model_config(name).max_position_embeddings)
    assert shapes["analysis"][1] == rl.analysis_max_new_tokens, name
    assert shapes["max_new_tokens"] == rl.max_new_tokens, name


def test_run_shapes_take_the_analysis_bucket_the_trainer_pads_to():
  rl = trainer.RLConfig(prompt_buckets=(32, 64, 128), max_new_tokens=16,
                        analysis_max_new_tokens=48, mini_batch_size=8,
                        micro_batches=2, remat=True)
  # 128 + 48 positions do not fit 160: the analyses' largest bucket is 64.
  assert aot.run_shapes(rl, 160) == dict(
      batch=8, micro_batches=2, response_len=16, max_new_tokens=16,
      remat=True, analysis=(64, 48))
  budget = lambda n: dataclasses.replace(rl, analysis_max_prompt_tokens=n)
  assert aot.run_shapes(budget(40), 160)["analysis"] == (64, 48)
  assert aot.run_shapes(budget(32), 160)["analysis"] == (32, 48)
  for other in (dict(variant="grpo"), dict(analyzer="rules")):
    assert aot.run_shapes(dataclasses.replace(rl, **other),
                          160)["analysis"] is None
  with pytest.raises(ValueError, match="analysis_max_new_tokens=48"):
    aot.run_shapes(budget(128), 160)


def test_the_analyses_sampler_counts_in_the_rollout_peak():
  config = testing.tiny_config(family="qwen3")
  kw = dict(topology="v4-16", mesh_shape=(1, 4, 2), batch=8, micro_batches=2,
            prompt_len=32, response_len=16, sample_batch=8, max_new_tokens=8,
            remat=True)
  report = aot.fit_report(config, analysis=(128, 64), **kw)
  sample, analyst = report["sampler"], report["analyst"]
  # A longer prompt and budget: a larger KV cache than the rollouts'.
  assert analyst.peak > sample.peak and analyst.argument >= sample.argument
  assert report["rollout_peak"] == (report["train_step"].argument
                                    + report["reference"] + analyst.peak)
  assert "\nanalyst " in aot.format_report(report)


_BUCKETS = (128, 256, 512, 1024, 2048)


@pytest.mark.parametrize("groups,size,hosts,chunks,eval_tasks,rows", [
    (16, 8, 1, None, 0, 128),  # rl.gin on one host: one chunk of 128
    (16, 8, 4, None, 0, 32),  # four hosts: a chunk of 4 groups each
    (16, 8, 4, 8, 64, 16),  # 8 chunks: two per host, one at a time
    (16, 3, 1, None, 0, 64),  # 48 episodes, padded to 8 x a power of two
    (64, 8, 1, None, 0, 256),  # 512 episodes: calls of at most 256
    (2, 2, 1, None, 0, 8),  # 4 episodes: at least 8 rows
    (2, 2, 1, None, 12, 16),  # an evaluation's 12 tasks take more
    (2, 2, 1, None, 100, 16),  # evaluations play 16 tasks at a time
])
def test_sampler_sizes_take_the_largest_bucket_and_one_host_s_call(
    groups, size, hosts, chunks, eval_tasks, rows):
  rl = trainer.RLConfig(num_groups=groups, group_size=size,
                        prompt_buckets=_BUCKETS, max_new_tokens=256)
  sizes = aot.sampler_sizes(rl, 32768, hosts=hosts, rollout_chunks=chunks,
                            eval_tasks=eval_tasks)
  assert (sizes["prompt_len"], sizes["sample_batch"]) == (2048, rows)
  assert "prompt_buckets=(128, 256, 512, 1024, 2048)" in (
      sizes["sources"]["prompt_len"])
  said = sizes["sources"]["sample_batch"]
  assert ("an evaluation's" in said) == (eval_tasks > groups * size), said


def test_sampler_sizes_leave_room_for_the_responses_and_refuse_bad_chunks():
  rl = trainer.RLConfig(num_groups=2, group_size=2, prompt_buckets=_BUCKETS,
                        max_new_tokens=256)
  # 2048 + 256 positions do not fit 2200: the trainer pads to 1024 at most.
  assert aot.sampler_sizes(rl, 2200)["prompt_len"] == 1024
  with pytest.raises(ValueError, match="no prompt bucket fits"):
    aot.sampler_sizes(rl, 300)
  # Two groups cannot go to four hosts, nor three chunks to two hosts.
  with pytest.raises(ValueError, match="rollout_chunks=4 must divide "
                     "num_groups=2 and be a multiple of the 4 hosts"):
    aot.sampler_sizes(rl, 32768, hosts=4)
  with pytest.raises(ValueError, match="multiple of the 2 hosts"):
    aot.sampler_sizes(dataclasses.replace(rl, num_groups=6), 32768, hosts=2,
                      rollout_chunks=3)


@pytest.mark.parametrize("groups,size,chunks", [(4, 2, 2), (16, 8, 1),
                                                (40, 8, 1)])
def test_sampler_sizes_are_those_the_trainer_samples_with(
    groups, size, chunks, monkeypatch):
  """A real RLTrainer's first rollout call for one chunk's episodes, each
  prompt as long as the largest bucket holds, reaches the sampler with
  `sampler_sizes`'s rows and prompt length (a spy stops it there)."""
  tok = tokenizer_lib.train_tokenizer(["a b c d e f g h"] * 5, vocab_size=300)
  config = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=600,
                               eos_token_ids=(tok.eos_token_id,))
  rl = trainer.RLConfig(num_groups=groups, group_size=size,
                        prompt_buckets=(128, 256, 512, 1024),
                        max_new_tokens=64, analysis_max_new_tokens=64)
  rl_trainer = trainer.RLTrainer(config, tok, rl, env_name="household",
                                 tx=optax.sgd(0.0), rollout_chunks=chunks)
  sizes = aot.sampler_sizes(rl, 600, rollout_chunks=chunks)
  shapes = []

  class Stop(Exception):
    pass

  def spy(params, prompts, mask, rng, **kw):
    shapes.append(prompts.shape)
    raise Stop

  monkeypatch.setattr(rollout.sampler_lib, "sample", spy)
  longest = [5] * sizes["prompt_len"]
  with pytest.raises(Stop):
    rl_trainer.policy.generate_ids(None, [longest] * rl_trainer.pool.size,
                                   jax.random.key(0), sampler.Greedy())
  assert shapes == [(sizes["sample_batch"], sizes["prompt_len"])]
  # One token more fits no bucket: the trainer pads to no longer prompts.
  with pytest.raises(rollout.PromptTooLongError):
    rl_trainer.policy.generate_ids(None, [longest + [5]], jax.random.key(0),
                                   sampler.Greedy())
  for policy in (rl_trainer.policy, rl_trainer.analyst):
    assert (policy.min_rows, policy.max_rows) == (aot.POLICY_MIN_ROWS,
                                                  aot.POLICY_MAX_ROWS)
  assert inspect.signature(evaluate.evaluate_split).parameters[
      "batch_groups"].default == aot.EVAL_BATCH_GROUPS


def test_cli_sizes_prompts_and_sampler_rows_as_the_run(monkeypatch, capsys):
  """Without --prompt_len or --sample_batch, the run's gin sizes them, on
  the topology's hosts; the CLI says where each number comes from."""
  kw = _sizes(monkeypatch, ["--model=qwen2_5_3b", "--topology=v5p-8"])
  assert (kw["prompt_len"], kw["sample_batch"]) == (2048, 128)
  out = capsys.readouterr().out
  assert ("prompt_len 2048: the largest of RLConfig.prompt_buckets=(128, "
          "256, 384, 512, 768, 1024, 2048) that leaves room for "
          "max_new_tokens=256 in 32768 positions (the run of "
          "configs/experiments/qwen2_5_3b_alfworld_style.gin)") in out
  assert ("sample_batch 128: a rollout chunk's 128 episodes (16 groups x 8 "
          "in 1 chunk(s) over 1 host(s))") in out
  # Four hosts play a chunk each; a binding of the run reaches it too.
  assert _sizes(monkeypatch, ["--model=qwen2_5_3b",
                              "--topology=v5p-32"])["sample_batch"] == 32
  kw = _sizes(monkeypatch, ["--model=qwen2_5_3b", "--topology=v5p-32",
                            "--gin.train.train.rollout_chunks=8",
                            "--gin.trainer.RLConfig.max_new_tokens=32000"])
  assert (kw["prompt_len"], kw["sample_batch"]) == (768, 16)
  assert "and --gin)" in capsys.readouterr().out
  # The flags win, and say so.
  kw = _sizes(monkeypatch, ["--model=tiny", "--topology=v4-16",
                            "--prompt_len=100", "--sample_batch=64"])
  assert (kw["prompt_len"], kw["sample_batch"]) == (100, 64)
  out = capsys.readouterr().out
  assert "prompt_len 100: --prompt_len\n" in out
  assert "sample_batch 64: --sample_batch\n" in out
  # A run the trainer would refuse on this topology is refused here.
  assert aot.main(["--model=tiny", "--topology=v4-32"]) == 2
  assert ("error: rollout_chunks=4 must divide num_groups=2 and be a "
          "multiple of the 4 hosts") in capsys.readouterr().err
