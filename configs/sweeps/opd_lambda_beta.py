"""SEED's distillation weight lambda x gate sharpness beta.

The loss they enter: docs/algorithm.md §3.7.

lambda = 0 is GRPO with analyses still written (same compute as SEED).

  python -m seed_jax.sweep --sweep=configs/sweeps/opd_lambda_beta.py \
      --gin_file=configs/experiments/tiny.gin --workdir=runs/sweeps --local
"""


def sweep():
  for opd_coef in (0.0, 0.003, 0.01, 0.03):
    for opd_beta in (1.0, 5.0):
      yield {"trainer.RLConfig.opd_coef": opd_coef,
             "trainer.RLConfig.opd_beta": opd_beta}
