"""Ahead-of-time fit check on one small case: the tiny model on v4-16's 8
chips (the 8 fake CPU devices)."""

import dataclasses
import math

import jax
import pytest

from seed_jax import aot
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import testing
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
  assert ("error: --prompt_len + --response_len = 2056 exceeds tiny's "
          "context of 2048 positions") in capsys.readouterr().err
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
