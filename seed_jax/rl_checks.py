"""Checks of an RLConfig against what it runs with: the mesh, the model's
context, the environment and the teacher.

`RLTrainer` makes them when it is built; `train` makes them before any work,
so that a start the trainer would refuse stops before the warm start and
Stage 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import jax

from seed_jax import annotators
from seed_jax import partitioning
from seed_jax import rollout as rollout_lib

if TYPE_CHECKING:
  from seed_jax.trainer import RLConfig


def check_layout(rl: RLConfig, mesh: jax.sharding.Mesh | None,
                 rollout_chunks: int | None = None,
                 rules: Sequence[tuple[str, Any]] | None = None
                 ) -> tuple[jax.sharding.Mesh, int]:
  """The mesh (one device when None) and rollout chunks an RLTrainer uses.

  `train` calls it before any work too, so that a layout the trainer would
  refuse stops the start before the warm start and Stage 1.

  Raises:
    ValueError: several processes without a mesh, rollout chunks that do not
      split the groups over the processes, or a mini-batch the mesh does not
      split into micro-batches.
  """
  processes = jax.process_count()
  if mesh is None and processes > 1:
    raise ValueError(
        f"{processes} processes need a training mesh over all of their "
        "devices: set train.train.mesh_shape, e.g. (1, -1, 1)")
  mesh = mesh or partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
  chunks = rollout_chunks or processes
  if rl.num_groups % chunks or chunks % processes:
    raise ValueError(
        f"rollout_chunks={chunks} must divide num_groups={rl.num_groups} "
        f"and be a multiple of the {processes} processes")
  try:
    partitioning.check_batch_split(mesh, rl.mini_batch_size,
                                   rl.micro_batches,
                                   rules or partitioning.DEFAULT_RULES)
  except ValueError as e:
    raise ValueError(f"RLConfig.mini_batch_size={rl.mini_batch_size}, "
                     f"micro_batches={rl.micro_batches}: {e}") from None
  return mesh, chunks


def check_prompt_budgets(rl: RLConfig, context: int) -> int:
  """The analysis prompt budget in tokens, for a model of `context` positions:
  `rl.analysis_max_prompt_tokens`, or else the largest prompt bucket that
  leaves room for `rl.analysis_max_new_tokens`.

  RLTrainer calls it with its model's context; `train` also before any work,
  when the context is known before the model is built (a demo warm start, a
  Hugging Face folder), so that budgets the trainer would refuse stop the
  start before the warm start and Stage 1.

  Raises:
    ValueError: no prompt bucket leaves room for `rl.max_new_tokens` or
      `rl.analysis_max_new_tokens` in `context` (as `rollout.Policy` says
      it), or an analysis prompt budget past the largest bucket that does.
  """
  rollout_lib.fitting_buckets(rl.prompt_buckets, context, rl.max_new_tokens)
  largest = max(rollout_lib.fitting_buckets(rl.prompt_buckets, context,
                                            rl.analysis_max_new_tokens))
  budget = rl.analysis_max_prompt_tokens or largest
  if budget > largest:
    raise ValueError(
        f"analysis_max_prompt_tokens={rl.analysis_max_prompt_tokens} "
        f"exceeds the largest prompt bucket that leaves room for "
        f"analysis_max_new_tokens={rl.analysis_max_new_tokens} ({largest})")
  return budget


def check_analyzer(rl: RLConfig, env_name: str, teacher=None):
  """The teacher that writes RL's analyses (None: the policy itself).

  `train` calls it before any work too, so that an analyzer the trainer
  would refuse stops the start before the warm start and Stage 1.

  Raises:
    ValueError: analyzer="external" without a teacher or with one bound
      unlike the RL config, or analyzer="rules" with a teacher, on a game
      without annotation rules, or with a `rule_detail` that game lacks.
  """
  if rl.analyzes and rl.analyzer == "rules":
    if teacher is not None:
      raise ValueError("analyzer='rules' writes its own analyses: pass no "
                       "teacher (or use analyzer='external')")
    annotators.check_env(env_name, "analyzer='rules'")
    annotators.check_detail(rl.rule_detail, env_name, name="rule_detail")
    return annotators.RuleTeacher(rl.analysis_mode, rl.max_critical_steps,
                                  rl.rule_detail, repeats=rl.rule_repeats)
  if rl.analyzes and rl.analyzer == "external":
    if teacher is None:
      raise ValueError("analyzer='external' needs a teacher (an "
                       "OpenAI-compatible endpoint): add "
                       "--gin_file=configs/runs/external_teacher.gin")
    # K matters only when critical steps are asked for.
    if teacher.mode != rl.analysis_mode or (
        rl.step_skills and teacher.max_critical_steps != rl.max_critical_steps):
      raise ValueError(
          f"the teacher asks for analyses in mode {teacher.mode!r} with "
          f"max_critical_steps={teacher.max_critical_steps}, the RL config "
          f"in mode {rl.analysis_mode!r} with "
          f"max_critical_steps={rl.max_critical_steps}; bind them alike")
  return teacher
