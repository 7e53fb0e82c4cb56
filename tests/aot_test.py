"""Ahead-of-time fit check on one small case: the tiny model on v4-16's 8
chips (the 8 fake CPU devices)."""

import math

import jax
import pytest

from seed_jax import aot
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import testing


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
                          response_len=16, sample_batch=8, max_new_tokens=8)
  assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
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
            prompt_len=32, response_len=16, sample_batch=8, max_new_tokens=8)
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
    aot.fit_report(testing.tiny_config(), topology="v5p-32")


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
  # The tiny model's context is shorter than the default prompt.
  assert aot.main(["--model=tiny", "--topology=v4-16"]) == 2
  context = testing.tiny_config().max_position_embeddings
  assert (f"error: --prompt_len + --response_len = 1280 exceeds tiny's "
          f"context of {context} positions") in capsys.readouterr().err
