"""`seed_jax.same_run`: the checks `experiments run` makes before any run:
every seed its own, every run the same budget."""

import os
import re

import pytest

from seed_jax import experiments
from seed_jax import same_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs/experiments/tiny.gin")
HEAD = ("include 'configs/experiments/tiny.gin'\n"
        "from __gin__ import dynamic_registration\n"
        "from seed_jax import policies\n"
        "from seed_jax import train\n")


@pytest.mark.parametrize("text,binding", [
    (HEAD + "train.train.seed = 3\npolicies.prepare.seed = %SEED\n",
     "train.train.seed = 3"),
    (HEAD + "A = %B\nB = 3\ntrain.train.seed = %A\n",
     "train.train.seed = %A = %B = 3"),
    # No rl.gin: nothing binds the seed, which is train's default.
    ("from __gin__ import dynamic_registration\nfrom seed_jax import train\n"
     "train.train.num_updates = 1\n", "train.train.seed is unbound"),
    (HEAD + "train.train.seed = %NOWHERE\n",
     "train.train.seed = %NOWHERE is unbound"),
])
def test_a_seed_bound_past_the_seed_macro_is_refused(tmp_path, text,
                                                     binding):
  """`experiments_test` checks that `run` refuses these; here, the message
  names the binding, through the macros it goes by."""
  path = tmp_path / "fixed.gin"
  path.write_text(text)
  with pytest.raises(ValueError, match=(
      f"^with {re.escape(str(path))}, {re.escape(binding)}, not %SEED: "
      "every run would train that seed")):
    same_run.check_seed([str(path)], [])


def test_a_seed_through_the_seed_macro_is_taken(tmp_path):
  same_run.check_seed([TINY], ["NUM_UPDATES=3"])
  path = tmp_path / "through.gin"
  path.write_text(HEAD + "RUN_SEED = %SEED\ntrain.train.seed = %RUN_SEED\n")
  same_run.check_seed([str(path)], [])
  runs = experiments.plan(str(tmp_path), methods=["grpo"], seeds=[4, 5],
                          gin_files=[str(path)])
  assert [same_run.trained_config(r)["seed"] for r in runs] == [4, 5]


def _trained(out, name, *bindings):
  """A fake run folder OUT/<name> with the config.gin tiny.gin and
  `bindings` would have written (no training)."""
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  train.parse_gin([TINY], list(bindings))
  config = gin.config_str()
  gin.clear_config()
  workdir = out / name
  workdir.mkdir(parents=True)
  (workdir / "config.gin").write_text(config)
  return str(workdir)


def test_runs_in_out_with_another_budget_are_refused(tmp_path):
  """An invocation on an OUT whose runs had another NUM_UPDATES, group size
  (...) would have the summary compare methods on different budgets."""
  out = tmp_path / "exp"
  existing = {"grpo/seed0": _trained(out, "grpo/seed0", "NUM_UPDATES=10"),
              "grpo/seed1": _trained(
                  out, "grpo/seed1", "NUM_UPDATES=10",
                  "trainer.RLConfig.group_size=4")}

  def check(methods, *bindings, existing=existing):
    runs = experiments.plan(str(out), methods=methods, seeds=[0, 1],
                            gin_files=[TINY], bindings=bindings)
    same_run.check_budget(runs, existing)

  with pytest.raises(ValueError, match=(
      r"^runs already in OUT differ in budget from the runs to start: "
      r"grpo/seed0 was trained with num_updates=10, not 20; grpo/seed1 was "
      r"trained with num_updates=10, not 20, rl.group_size=4, not 2\. ")):
    check(["seed"], "NUM_UPDATES=20")
  with pytest.raises(ValueError, match=r": grpo/seed1 was trained with "
                     r"rl.group_size=4, not 2\. Methods compare only"):
    check(["seed"], "NUM_UPDATES=10")
  ok = dict(existing, **{"grpo/seed1": _trained(out, "grpo/seed1b",
                                                "NUM_UPDATES=10")})
  check(["seed"], "NUM_UPDATES=10", existing=ok)
  # Runs planned again may be trained further; not to fewer updates, which
  # the runner would skip as done.
  check(["grpo", "seed"], "NUM_UPDATES=20", existing=ok)
  with pytest.raises(ValueError, match="grpo/seed0 was trained with "
                     "num_updates=10, not 5"):
    check(["grpo", "seed"], "NUM_UPDATES=5", existing=ok)
  # Never started (no config.gin): nothing to compare.
  (out / "opid" / "seed0").mkdir(parents=True)
  check(["seed"], "NUM_UPDATES=10", existing=dict(
      ok, **{"opid/seed0": str(out / "opid" / "seed0")}))


def test_a_run_in_out_whose_config_gin_does_not_parse_is_refused(tmp_path):
  """Its budget is unknown: it was trained for 10 updates, and a rerun for
  20 would have slipped through (training writes config.gin whole, so
  only damage or an edit makes one that does not parse)."""
  out = tmp_path / "exp"
  damaged = _trained(out, "grpo/seed0", "NUM_UPDATES=10")
  with open(os.path.join(damaged, "config.gin"), "a") as f:
    f.write("train.train.seed = (\n")
  runs = experiments.plan(str(out), methods=["seed"], seeds=[0],
                          gin_files=[TINY], bindings=["NUM_UPDATES=20"])
  with pytest.raises(ValueError, match=(
      rf"^grpo/seed0 is already in OUT, but {re.escape(damaged)}/config.gin "
      r"does not parse \(TokenError: .*\), so its budget cannot be compared "
      r"with the runs to start: delete that run folder "
      rf"\({re.escape(damaged)}\) if it is not wanted, or use another --out$")):
    same_run.check_budget(runs, {"grpo/seed0": damaged})
