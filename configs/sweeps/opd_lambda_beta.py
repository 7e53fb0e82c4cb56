"""SEED's distillation weight lambda x gate sharpness beta.

The loss they enter: docs/algorithm.md §3.7.

lambda = 0 is GRPO with analyses still written (same compute as SEED). It is
one run, not one per beta: beta only shapes the gated distillation term,
which lambda = 0 drops (losses.seed_loss adds it only for a non-zero
opd_coef), so it binds no beta (the gin file's applies, unused). Seven runs:

  0: lambda 0;  1, 2: lambda 0.003, beta 1, 5;  3, 4: 0.01;  5, 6: 0.03.

  python -m seed_jax.sweep --sweep=configs/sweeps/opd_lambda_beta.py \
      --gin_file=configs/experiments/tiny.gin --workdir=runs/sweeps --local
"""


def sweep():
  yield {"trainer.RLConfig.opd_coef": 0.0}
  for opd_coef in (0.003, 0.01, 0.03):
    for opd_beta in (1.0, 5.0):
      yield {"trainer.RLConfig.opd_coef": opd_coef,
             "trainer.RLConfig.opd_beta": opd_beta}
