"""Checks of an RLConfig against what it runs with (seed_jax/rl_checks.py).

The layout and analyzer checks are exercised where the trainer and `train`
make them (tests/trainer_test.py, tests/train_test.py, tests/bad_inputs_test.py).
"""

import pytest

from seed_jax import rl_checks
from seed_jax import trainer as trainer_lib


def test_check_prompt_budgets():
  """What RLTrainer checks against its model's context, and `train` before
  the model is built."""
  rl = trainer_lib.RLConfig(prompt_buckets=(256, 512, 1024),
                            max_new_tokens=32, analysis_max_new_tokens=64)
  assert rl_checks.check_prompt_budgets(rl, 1536) == 1024
  assert rl_checks.check_prompt_budgets(rl, 1000) == 512
  with pytest.raises(ValueError, match=r"no prompt bucket fits the model's "
                     r"context \(200\) with max_new_tokens=32"):
    rl_checks.check_prompt_budgets(rl, 200)
  with pytest.raises(ValueError, match=r"no prompt bucket fits the model's "
                     r"context \(300\) with max_new_tokens=64"):
    rl_checks.check_prompt_budgets(rl, 300)
  rl = trainer_lib.RLConfig(prompt_buckets=(256, 512, 1024),
                            max_new_tokens=32, analysis_max_new_tokens=600,
                            analysis_max_prompt_tokens=1024)
  with pytest.raises(ValueError, match=r"^analysis_max_prompt_tokens=1024 "
                     r"exceeds the largest prompt bucket that leaves room "
                     r"for analysis_max_new_tokens=600 \(512\)$"):
    rl_checks.check_prompt_budgets(rl, 1536)
