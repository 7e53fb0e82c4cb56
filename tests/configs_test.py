"""Every experiment config parses, and its bindings reach real parameters."""

import glob
import inspect
import os
import subprocess
import sys

import gin
import pytest

from seed_jax import demo
from seed_jax import policies
from seed_jax import train
from seed_jax import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = sorted(glob.glob(os.path.join(ROOT, "configs/experiments/*.gin")))


@pytest.fixture(autouse=True)
def _fresh_gin():
  gin.clear_config()
  gin.add_config_file_search_path(ROOT)
  yield
  gin.clear_config()


def _resolve(value):
  """A macro inside a container is resolved only at call time: do it here."""
  if isinstance(value, gin.config.ConfigurableReference):
    return value.scoped_configurable_fn()
  return value


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_experiment_config_parses(path):
  bindings = ["WORKDIR = '/unused'"]
  if "qwen" in os.path.basename(path):
    bindings.append("MODEL_DIR = '/unused/model'")
  train.parse_gin([path], bindings, finalize=True)  # every binding is used
  rl = gin.get_configurable(trainer.RLConfig)()  # validates its own knobs
  assert rl.variant in trainer.VARIANTS
  assert gin.query_parameter("%WORKDIR") == "/unused"


def test_the_external_teacher_file_binds_a_teacher_like_the_rl_config(
    monkeypatch):
  monkeypatch.setenv("SEED_TEACHER_BASE_URL", "http://teacher:8000/v1")
  monkeypatch.setenv("SEED_TEACHER_MODEL", "judge")
  train.parse_gin(["configs/experiments/tiny.gin",
                   "configs/runs/external_teacher.gin"],
                  ["ANALYSIS_MODE = 'episode_step'",
                   "teacher.OpenAITeacher.max_concurrency = 2"],
                  finalize=True)
  rl = gin.get_configurable(trainer.RLConfig)()
  t = _resolve(gin.query_parameter("train.train.teacher"))
  assert rl.analyzer == "external"
  assert (t.mode, t.max_critical_steps) == (rl.analysis_mode,
                                           rl.max_critical_steps)
  assert t.mode == "episode_step"
  assert t.max_concurrency == 2


def test_the_kind_demo_says_kinds_everywhere_the_rules_write_skills():
  # The warm start, Stage 1 and RL's oracle analyzer (the seed_oracle method).
  train.parse_gin(["configs/experiments/demo_kind.gin"],
                  ["WORKDIR = '/unused'"], finalize=True)
  assert gin.get_configurable(trainer.RLConfig)().rule_detail == "kind"
  assert gin.get_configurable(policies.Stage1Config)().rule_detail == "kind"
  assert gin.query_parameter("policies.prepare.demo_kwargs")[
      "rule_detail"] == "kind"


def test_the_recover_demo_is_the_kind_demo_with_slip_runs():
  def demo_kwargs(path):
    train.parse_gin([path], ["WORKDIR = '/unused'"], finalize=True)
    kwargs = {k: _resolve(v) for k, v in
              gin.query_parameter("policies.prepare.demo_kwargs").items()}
    gin.clear_config()
    return kwargs
  kind = demo_kwargs("configs/experiments/demo_kind.gin")
  recover = demo_kwargs("configs/experiments/demo_kind_recover.gin")
  assert recover.pop("repeat_run") == 3
  assert recover == kind
  assert set(kind) <= set(inspect.signature(demo.warm_start).parameters)


def test_the_repeats_demo_is_the_recover_demo_with_the_repeat_rule():
  def parsed(path):
    train.parse_gin([path], ["WORKDIR = '/unused'"], finalize=True)
    kwargs = {k: _resolve(v) for k, v in
              gin.query_parameter("policies.prepare.demo_kwargs").items()}
    stage1 = gin.get_configurable(policies.Stage1Config)()
    rl = gin.get_configurable(trainer.RLConfig)()
    rules = (stage1.rule_repeats, rl.rule_repeats,
             stage1.invalid_action, rl.invalid_action)
    gin.clear_config()
    return kwargs, rules
  recover, recover_rules = parsed("configs/experiments/demo_kind_recover.gin")
  repeats, rules = parsed("configs/experiments/demo_kind_repeats.gin")
  assert recover_rules == (False, False, "no_op", "no_op")
  # Every writer of rule skills adds the rule (warm start, Stage 1, oracle),
  # and every rollout sends a failed try as written, the demonstrations too.
  assert rules == (True, True, "as_written", "as_written")
  assert repeats.pop("rule_repeats") is True
  assert repeats.pop("invalid_action") == "as_written"
  assert repeats == recover
  assert {"rule_repeats", "invalid_action"} <= set(
      inspect.signature(demo.warm_start).parameters)
  more, more_rules = parsed("configs/experiments/demo_kind_repeats_more.gin")
  # The "more" demo changes only the rule followers' slip rate.
  assert more_rules == rules
  assert more.pop("ruled_repeat") == 0.5
  assert more == {**repeats, "rule_repeats": True,
                  "invalid_action": "as_written"}
  assert "ruled_repeat" in inspect.signature(demo.warm_start).parameters


def test_default_main_job_is_the_demo():
  assert train.DEFAULT_GIN == "configs/experiments/demo.gin"
  gin.parse_config_files_and_bindings([train.DEFAULT_GIN], [],
                                      finalize_config=True)
  assert gin.query_parameter("policies.prepare.source") == "demo"
  kwargs = {k: _resolve(v) for k, v in
            gin.query_parameter("policies.prepare.demo_kwargs").items()}
  unknown = set(kwargs) - set(inspect.signature(demo.warm_start).parameters)
  assert not unknown, f"demo_kwargs not taken by demo.warm_start: {unknown}"
  # The warm start, Stage 1 and RL share the turn limit, history and
  # prompt budgets, or the policy meets prompts it was not trained on.
  rl = gin.get_configurable(trainer.RLConfig)()
  stage1 = gin.get_configurable(policies.Stage1Config)()
  assert kwargs["max_steps"] == rl.max_steps == stage1.max_steps
  assert kwargs["history_length"] == rl.history_length == stage1.history_length
  assert (kwargs["analysis_max_chars"] == rl.analysis_max_chars
          == stage1.max_prompt_chars)
  assert tuple(kwargs["buckets"]) == tuple(rl.prompt_buckets)


def test_a_misspelled_macro_is_an_error_with_the_close_name():
  with pytest.raises(ValueError, match="VARIENT.*did you mean VARIANT"):
    train.parse_gin(["configs/experiments/tiny.gin"], ["VARIENT = 'grpo'"])
  gin.clear_config()
  train.parse_gin(["configs/experiments/tiny.gin"],
                  ["VARIANT = 'grpo'", "trainer.RLConfig.opd_coef = 0.1"])
  assert gin.query_parameter("%VARIANT") == "grpo"


def test_a_missing_gin_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.gin"):
    train.parse_gin(["configs/experiments/nope.gin"], [])
  with pytest.raises(SystemExit, match="error: gin file .*nope.gin"):
    train.main(["--gin_file=configs/experiments/nope.gin"])
  # Outside the checkout, configs/... (and its includes) are found under it,
  # without gin's notes on the places it tried first.
  code = ("import logging; logging.basicConfig(level=logging.INFO); "
          "from seed_jax import train; train.parse_gin("
          "['configs/experiments/tiny.gin'], [\"WORKDIR = '/unused'\"])")
  for path in ("", ROOT):  # with the checkout on sys.path too
    env = dict(os.environ, PYTHONPATH=path)
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert "Path not found" not in res.stderr
    assert "system_path_file_exists" not in res.stderr
