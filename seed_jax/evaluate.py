r"""Scores a training run's checkpoint on the seen and unseen splits, no skills.

  python -m seed_jax.evaluate --workdir=RUN                # latest checkpoint
  python -m seed_jax.evaluate --workdir=RUN --step=0       # starting policy
  python -m seed_jax.evaluate --workdir=RUN --step=40 --num_tasks=128 \
      --out_json=eval40.json --out_csv=eval40.csv
  python -m seed_jax.evaluate --workdir=RUN --transcripts=episodes.jsonl

The run's own settings (policy, environment, rollout length, history, what
an inadmissible action sends) come from the `config.gin` its training wrote
(`--max_steps`, `--history_length` and `--invalid_action` override them);
the policy's config and tokenizer from `RUN/policy` (or, for a policy that
is not cached there, from the configured policy function), the weights from
the checkpoint. Checkpoints are opened read-only, so a run that is still
training can be evaluated. With `--seed` equal to the run's seed and its
`eval_tasks` and `eval_temperature`, the numbers are those of the run's own
evaluation at that update (same tasks, same sampling keys). Update 0, the
policy the run started from, is never saved as a checkpoint of its own:
every checkpoint keeps it as the KL reference, and `--step=0` scores that.

Writes JSON (every metric, named as in the run's metrics.jsonl:
"eval/seen/success", "eval/unseen/success/<family>", ..., on the household
game "eval/<split>/search_usual", "search_usual_chance" and
"search_usual_over_chance" (where the searches went), "reached_goal_place",
"took_after_reach", "took_goal", "won_after_take" and "steps_to_take" (how
far the episodes got), "look_*" (where the steps before the goal place went),
"invalid_steps", "invalid_repeat", "invalid_repeat_failed" and
"invalid_go_here" (invalid steps, and those that tried the step before's
action again, again after it failed, or to go where the agent stood), each
with its standard error as "<ratio>_se", under "per_task" each task's outcome
as a string of 0s and 1s in task order, and on the household game under
"per_task_stats" each task's counts of those statistics, for comparisons task
by task) and CSV (split, family, success, tasks,
responses_truncated: the share of replies cut at max_new_tokens), by default
to `RUN/eval/step_<N>_tasks<K>_seed<S>_temp<T>.{json,csv}` (see
`report_path`), so evaluations with other settings never overwrite each
other. Each file is written whole or not at all, and the JSON, the file
readers trust, always matches the CSV beside it (see `write_report`).
With `--transcripts=PATH`, every episode played is also written to PATH, one
JSON line per task (`transcript`: the task, its outcome, and each step's
observation, reply, attempted and sent action), to read what a policy does.

Each report records the `fingerprint` of what it depends on (params, model,
tokenizer, rollout knobs, settings, the package's sources). With `--same_as=OTHER.json`, another
run's report, an evaluation whose fingerprint is that report's copies it
instead of playing the episodes again: the start of runs that share a warm
start, say (`python -m seed_jax.experiments evaluate` does this).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import functools
import hashlib
import inspect
import io
import json
import logging
import os
import pathlib
import sys
from typing import Any, Callable, Sequence

from etils import epath
import jax
import numpy as np
import optax

from seed_jax import atomic
from seed_jax import checkpoints
from seed_jax import envs
from seed_jax import episodes
from seed_jax import hf
from seed_jax import prompts
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import trainer as trainer_lib
from seed_jax.envs import base as envs_base

SPLITS = ("eval_seen", "eval_unseen")
# The trainer's evaluation at update u samples with fold_in(key(seed),
# EVAL_RNG_OFFSET + u) (seed_jax/train.py); the same keys here.
EVAL_RNG_OFFSET = 10_000_000


def checkpoint_steps(workdir: epath.PathLike) -> list[int]:
  """The saved steps of a run, oldest first.

  Raises:
    FileNotFoundError: when the workdir does not exist or holds no
      checkpoint.
  """
  workdir = epath.Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"workdir {workdir} does not exist")
  with checkpoints.Checkpointer(workdir, read_only=True) as ckpt:
    steps = sorted(ckpt.all_steps())
  if not steps:
    raise FileNotFoundError(
        f"no checkpoint in {workdir / 'checkpoints'}: the run has not saved "
        "one yet (or this is not a training workdir)")
  return steps


def pick_step(steps: Sequence[int], step: int | None) -> int:
  """`step`, or the latest of `steps` when None; 0 (the start) is always there.

  Raises:
    ValueError: when `step` is not among `steps` (the message lists them).
  """
  if step is None:
    return max(steps)
  if step != 0 and step not in steps:
    raise ValueError(f"no checkpoint of update {step}; the saved updates are "
                     f"{sorted(steps)}")
  return step


def load_policy(workdir: epath.PathLike, policy_fn: Callable[..., Any] | None,
                *, seed: int = 0):
  """The model config and tokenizer a run trained with.

  Args:
    workdir: the run's directory.
    policy_fn: the run's `policy_fn(workdir, seed=)`, used when
      `workdir/policy` has no config.json (a policy read from its own source
      each time, such as a Hugging Face folder without Stage 1).
    seed: the run's seed, passed to `policy_fn`.

  Returns:
    (model config, tokenizer).
  """
  folder = epath.Path(workdir) / "policy"
  if (folder / "config.json").exists():
    return hf.load_config(os.fspath(folder)), hf.load_tokenizer(
        os.fspath(folder))
  if policy_fn is None:
    raise FileNotFoundError(f"{folder} holds no policy and no policy_fn was "
                            "given to rebuild it")
  policy = policy_fn(epath.Path(workdir), seed=seed)
  return policy.config, policy.tokenizer


def evaluate_split(policy: rollout_lib.Policy, params, *, env_name: str,
                   split: str, num_tasks: int, max_steps: int,
                   history_length: int = 2, temperature: float = 0.4,
                   rng: jax.Array | None = None, batch_groups: int = 16,
                   env_kwargs=None,
                   per_task: list[int] | None = None,
                   per_task_stats: list[episodes.Stats] | None = None,
                   per_task_episodes: list[episodes.Episode] | None = None,
                   invalid_action: str = "no_op") -> dict[str, float]:
  """Success rate on `num_tasks` tasks of a split, no skills in the prompt
  (sampled at `temperature`; 0 is greedy).

  Args:
    invalid_action: what an action that parsed but is not admissible sends
      (`rollout.rollout`'s): the run's `RLConfig.invalid_action`.
    per_task: when given, each task's outcome (1 success, 0 not) is
      appended to it, in task order (the split's seeds from the first), so
      that two policies scored on the same tasks can be compared task by
      task.
    per_task_stats: when given and the environment has episode statistics
      (`envs.episode_stats_fn`), each task's statistics are appended to it,
      in task order, for comparisons task by task
      (`episodes.paired_ratio_diffs`).
    per_task_episodes: when given, each task's episode (every step's
      observation, reply and action) is appended to it, in task order
      (`transcript` makes it JSON).

  Returns:
    {"success": overall rate, "success/<family>": per family, "tasks": n,
     "tasks/<family>": tasks of that family, "env_errors": episodes ended
     by an environment error (counted as failures), "responses_truncated"
     and "responses_truncated/<family>": the share of replies cut at the
     policy's max_new_tokens (no EOS or stop string: a reply that fails its
     step for want of tokens), left out where there were no replies (every
     episode's reset failed), and the ratios of the environment's
     `episode_stats` summed over the episodes (`episodes.sum_ratios`;
     household: "search_usual", the share of the searches in vain that went
     where the goal object can start, "search_usual_chance", that share
     for a search blind to object types, and "search_usual_over_chance", the
     first less the second (`household.search_stats`);
     "reached_goal_place", the share of episodes that went to a place
     holding a goal object, "took_after_reach", the share of those that
     took one, "took_goal", the share of all that took one,
     "won_after_take", the share of those that won, and "steps_to_take",
     their mean step of that take (`household.take_stats`);
     "look_steps", the mean steps before the first visit to such a place,
     and "look_new_place", "look_revisit", "look_other" and
     "look_invalid", the shares of those steps that went to a new place,
     back to one, to another valid action or to an invalid one, and
     "look_invalid_take", the share that tried to take an object where it
     was not (`household.look_stats`); "invalid_steps", the share of all
     steps that were invalid, "invalid_repeat", the share of those that
     tried the previous step's action again, "invalid_repeat_failed", the
     share that tried again a try that had just failed, and
     "invalid_go_here", the share that tried to go where the agent stood
     (`household.invalid_stats`); a ratio is left out where its denominator
     is 0),
     each with its standard error over the episodes as "<ratio>_se"
     (`episodes.ratio_errors`)}.

  Raises:
    NonFiniteLogitsError: a reply sampled with NaN or infinite log-probs
      (the params hold NaN or diverged); no result is returned.
  """
  if num_tasks < 1:
    raise ValueError(f"evaluate_split needs num_tasks >= 1, got {num_tasks}")
  rng = rng if rng is not None else jax.random.key(0)
  sampling = sampler_lib.at_temperature(temperature)
  wins: dict[str, list[bool]] = collections.defaultdict(list)
  cut: dict[str, list[bool]] = collections.defaultdict(list)  # per reply
  errors = 0
  done = 0
  outcomes = []  # per task, in task order
  stats_fn = envs.episode_stats_fn(env_name)
  stats = []  # per episode, `stats_fn`'s
  played = []  # per task, in task order
  while done < num_tasks:
    groups = min(batch_groups, num_tasks - done)
    pool = envs_base.EnvPool(env_name, num_groups=groups, group_size=1,
                             split=split, max_steps=max_steps,
                             **dict(env_kwargs or {}))
    seeds = envs_base.split_seeds(split, groups, start=done)
    rng, sub = jax.random.split(rng)
    gen = lambda prompts, r: _finite(
        policy.generate(params, prompts, r, sampling), f"evaluate {split}")
    res = rollout_lib.rollout(gen, pool, sub, env_name=env_name,
                              max_steps=max_steps,
                              history_length=history_length,
                              group_seeds=seeds,
                              invalid_action=invalid_action)
    for ep in res.episodes:  # one per task (group_size 1), in seed order
      wins[ep.family].append(ep.success)
      cut[ep.family] += [st.truncated for st in ep.steps]
      errors += ep.error is not None
      outcomes.append(int(ep.success))
      played.append(ep)
      if stats_fn:
        stats.append(stats_fn(ep))
    done += groups
    if done < num_tasks:  # progress on long evaluations
      logging.info("evaluate %s: %d/%d tasks, success so far %.3f", split,
                   done, num_tasks,
                   np.mean([w for v in wins.values() for w in v]))
  if errors:
    logging.warning("evaluate %s: %d of %d episodes ended because the "
                    "environment raised; they count as failures", split,
                    errors, done)
  if per_task is not None:
    per_task.extend(outcomes)
  if per_task_stats is not None:
    per_task_stats.extend(stats)
  if per_task_episodes is not None:
    per_task_episodes.extend(played)
  replies = [c for v in cut.values() for c in v]
  if any(replies):
    logging.warning("evaluate %s: %d of %d replies cut at max_new_tokens "
                    "(neither EOS nor a stop string)", split, sum(replies),
                    len(replies))
  out = {"success": float(np.mean([w for v in wins.values() for w in v])),
         "tasks": float(done), "env_errors": float(errors)}
  if replies:
    out["responses_truncated"] = float(np.mean(replies))
  out.update(episodes.sum_ratios(stats))
  out.update(episodes.ratio_errors(stats))
  for fam, v in sorted(wins.items()):
    out[f"success/{fam}"] = float(np.mean(v))
    out[f"tasks/{fam}"] = float(len(v))
    if cut[fam]:
      out[f"responses_truncated/{fam}"] = float(np.mean(cut[fam]))
  return out


def _finite(gens: list[rollout_lib.Generation], what: str
            ) -> list[rollout_lib.Generation]:
  """`gens`, after `sampler.check_finite` on their log-probs."""
  sampler_lib.check_finite([g.logprobs for g in gens], what)
  return gens


def score(policy: rollout_lib.Policy, params, *, env_name: str,
          num_tasks: int, max_steps: int, history_length: int,
          temperature: float, rng: jax.Array,
          env_kwargs: dict[str, Any] | None = None,
          per_task: dict[str, list[int]] | None = None,
          per_task_stats: dict[str, list[episodes.Stats]] | None = None,
          per_task_episodes: dict[str, list[episodes.Episode]] | None = None,
          invalid_action: str = "no_op") -> dict[str, float]:
  """Success on both evaluation splits, no skills in the prompt.

  Args:
    invalid_action: see `evaluate_split`.
    per_task: when given, filled with {"seen": outcomes, "unseen": ...},
      each task's 1 or 0 in task order (see `evaluate_split`).
    per_task_stats: when given, filled the same way with each task's
      episode statistics (none for an environment without them).
    per_task_episodes: when given, filled the same way with each task's
      episode.

  Returns:
    {"eval/seen/success": 0.5, "eval/seen/success/<family>": ...,
     "eval/seen/tasks": 64.0, "eval/seen/tasks/<family>": ...,
     "eval/seen/responses_truncated": 0.02, ... (every key of
     `evaluate_split`), and the same for "eval/unseen/..."}; both splits
     sample with `rng`, as the trainer's evaluations do.
  """
  out = {}
  for split in SPLITS:
    outcomes = None if per_task is None else per_task.setdefault(split[5:], [])
    stats = (None if per_task_stats is None
             else per_task_stats.setdefault(split[5:], []))
    played = (None if per_task_episodes is None
              else per_task_episodes.setdefault(split[5:], []))
    res = evaluate_split(
        policy, params, env_name=env_name, split=split, num_tasks=num_tasks,
        max_steps=max_steps, history_length=history_length,
        temperature=temperature, rng=rng, env_kwargs=env_kwargs,
        per_task=outcomes, per_task_stats=stats, per_task_episodes=played,
        invalid_action=invalid_action)
    out.update({f"eval/{split[5:]}/{k}": v for k, v in res.items()})
  return out


def restore_params(workdir: epath.PathLike, rl_trainer, step: int):
  """The policy params of update `step` of a run, on one local device.

  Update 0, the policy the run started from, is read from the reference
  params of the latest checkpoint when no checkpoint of update 0 was saved.

  Args:
    workdir: the run's directory.
    rl_trainer: an `RLTrainer` for the run's model and optimizer (its state
      is the restore target).
    step: a saved update, or 0.

  Raises:
    FileNotFoundError: no checkpoint; ValueError: a step that was not saved,
      a checkpoint of another model, a start asked of checkpoints that keep
      no reference.
  """
  saved = checkpoint_steps(workdir)
  step = pick_step(saved, step)
  from_reference = step not in saved  # the start, kept as the reference
  ckpt_step = max(saved) if from_reference else step
  with checkpoints.Checkpointer(workdir, model_config=rl_trainer.config,
                                read_only=True) as ckpt:
    restored = ckpt.restore(
        ckpt_step, rl_trainer.abstract_state(),
        rl_trainer.abstract_params() if from_reference else None)
  if from_reference and restored.reference is None:
    raise ValueError(f"the checkpoint of update {ckpt_step} keeps no reference "
                     "params, so the starting policy cannot be read from it")
  return rl_trainer.local_params(
      restored.reference if from_reference else restored.state.params)


# RLConfig fields only training reads: two runs that differ in nothing but
# these score the same params alike. Any other field (max_new_tokens,
# prompt_buckets, ...) is part of an evaluation's `fingerprint`.
TRAINING_ONLY = frozenset({
    "variant", "analyzer", "rule_detail", "rule_repeats", "num_groups",
    "group_size",
    "analysis_max_new_tokens", "analysis_mode", "analysis_max_chars",
    "analysis_max_prompt_tokens", "max_critical_steps", "mini_batch_size",
    "micro_batches", "ppo_epochs", "adv_norm", "adv_stats_over",
    "invalid_penalty", "opid_weight", "opid_center",
    "step_advantage_weight", "step_gamma",
    "opd_coef", "opd_beta", "kl_coef", "entropy_coef", "clip_low",
    "clip_high", "dual_clip", "remat"})


@functools.cache
def code_digest(root: str | None = None) -> str:
  """A SHA-256 of the package's Python sources (`root`: its folder).

  Part of an evaluation's `fingerprint`: a report made by other code (a
  changed game, rollout or sampler) is never taken for this code's. Any
  edit counts, a comment too: the cost of a false mismatch is one more
  evaluation, that of a false match a wrong number.
  """
  root = pathlib.Path(root or os.path.dirname(os.path.abspath(__file__)))
  h = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    h.update(f"{path.relative_to(root).as_posix()}\0".encode())
    h.update(path.read_bytes() + b"\0")
  return h.hexdigest()


def fingerprint(config, tokenizer, params, rl: trainer_lib.RLConfig,
                **settings) -> str:
  """A SHA-256 of everything an evaluation's report depends on.

  Two evaluations with the same fingerprint play the same episodes with
  the same sampling keys, so one report serves both (the start of two runs
  that share a warm start, say). The package's sources count
  (`code_digest`), so a report made by another commit is not copied.

  Args:
    config: the model config.
    tokenizer: a transformers tokenizer (its serialized vocabulary and
      rules, and its chat template, count; not the folder it came from).
    params: the scored params (their names, shapes, dtypes and values).
    rl: the run's RL config; the fields of `TRAINING_ONLY` do not count.
    **settings: the evaluation's (step, env_name, env_kwargs, num_tasks,
      temperature, max_steps, history_length, invalid_action, seed),
      JSON-able.
  """
  h = hashlib.sha256()
  backend = getattr(tokenizer, "backend_tokenizer", None)
  rollout = {f.name: getattr(rl, f.name) for f in dataclasses.fields(rl)
             if f.name not in TRAINING_ONLY}
  h.update(json.dumps(dict(
      code=code_digest(), config=repr(config), rollout=rollout,
      settings=settings,
      tokenizer=backend.to_str() if backend is not None else repr(tokenizer),
      chat_template=getattr(tokenizer, "chat_template", None)),
      sort_keys=True, default=repr).encode())
  host = jax.device_get(params)  # one transfer, not one per leaf
  for path, leaf in jax.tree_util.tree_flatten_with_path(host)[0]:
    a = np.ascontiguousarray(leaf)
    h.update(f"{jax.tree_util.keystr(path)} {a.dtype} {a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def evaluate_run(workdir: epath.PathLike, *,
                 policy_fn: Callable[..., Any] | None,
                 rl: trainer_lib.RLConfig,
                 tx: optax.GradientTransformation,
                 env_name: str = "household",
                 env_kwargs: dict[str, Any] | None = None,
                 run_seed: int = 0, mesh=None, step: int | None = None,
                 num_tasks: int = 64, temperature: float = 0.4,
                 max_steps: int | None = None,
                 history_length: int | None = None,
                 invalid_action: str | None = None,
                 seed: int = 0,
                 same_as: dict[str, Any] | None = None,
                 per_task_episodes: (dict[str, list[episodes.Episode]]
                                     | None) = None) -> dict[str, Any]:
  """Restores a run's checkpoint and scores it on the evaluation splits.

  Args:
    workdir: the run's directory.
    policy_fn, run_seed: the run's policy function and seed (see
      `load_policy`).
    rl, tx, env_name, env_kwargs, mesh: the run's RL config, optimizer (its
      state's structure is the restore target), environment and mesh
      (None: one device).
    step: the update to evaluate; None for the latest checkpoint; 0 for the
      starting policy (the reference params of the latest checkpoint, when
      no checkpoint of update 0 was saved).
    num_tasks: tasks per split.
    temperature: sampling temperature.
    invalid_action: what an action that parsed but is not admissible sends
      (`prompts.INVALID_ACTIONS`); None for the run's.
    max_steps, history_length: episode length and history turns in the
      prompt; None for the run's.
    seed: seeds the sampling keys (with the update, as the trainer does).
    same_as: another run's report; when it has this evaluation's
      `fingerprint`, it is returned for this run (its "workdir" this one's,
      "copied_from" its own) instead of scoring again.
    per_task_episodes: when given, filled with {"seen": episodes, "unseen":
      ...}, each task's episode in task order (left empty when the report is
      copied from `same_as`: no episode is played then).

  Returns:
    {"workdir", "step", "env_name", "num_tasks", "temperature", "max_steps",
     "history_length", "invalid_action", "seed", "fingerprint"
     (`fingerprint`), "metrics": the `score` dict, "per_task": {"seen": "0110...", "unseen": ...}, each
     task's outcome in task order, and, for an environment with episode
     statistics, "per_task_stats": {"seen": `episodes.stats_text` of each
     task's, "unseen": ...}}.

  Raises:
    FileNotFoundError: no workdir, no checkpoint; ValueError: a step that
      was not saved, a checkpoint of another model, a start asked of
      checkpoints that keep no reference.
  """
  workdir = epath.Path(os.path.abspath(os.fspath(workdir)))
  step = pick_step(checkpoint_steps(workdir), step)
  config, tokenizer = load_policy(workdir, policy_fn, seed=run_seed)
  # Evaluation never analyzes: the policy's own analyzer needs no teacher
  # (an "external" run's) and no rules, and changes nothing scored here.
  rl = dataclasses.replace(rl, analyzer="self")
  rl_trainer = trainer_lib.RLTrainer(config, tokenizer, rl, env_name=env_name,
                                     tx=tx, mesh=mesh, env_kwargs=env_kwargs)
  params = restore_params(workdir, rl_trainer, step)
  settings = dict(
      env_name=env_name, num_tasks=int(num_tasks),
      temperature=float(temperature),
      max_steps=int(rl.max_steps if max_steps is None else max_steps),
      history_length=int(rl.history_length if history_length is None
                         else history_length),
      invalid_action=str(rl.invalid_action if invalid_action is None
                         else invalid_action),
      seed=int(seed))
  digest = fingerprint(config, tokenizer, params, rl, step=step,
                       env_kwargs=dict(env_kwargs or {}), **settings)
  if same_as is not None and same_as.get("fingerprint") == digest:
    logging.info("update %d of %s is scored as %s's was (the same params "
                 "and settings): its report is copied", step, workdir,
                 same_as.get("workdir"))
    return dict(same_as, workdir=os.fspath(workdir),
                copied_from=same_as.get("workdir"))
  rng = jax.random.fold_in(jax.random.key(seed), EVAL_RNG_OFFSET + step)
  per_task, per_task_stats = {}, {}
  metrics = score(rl_trainer.policy, params, rng=rng, env_kwargs=env_kwargs,
                  per_task=per_task, per_task_stats=per_task_stats,
                  per_task_episodes=per_task_episodes,
                  **{k: v for k, v in settings.items() if k != "seed"})
  report = dict(
      workdir=os.fspath(workdir), step=step, **settings, fingerprint=digest,
      metrics=metrics,
      per_task={k: "".join(map(str, v)) for k, v in per_task.items()})
  if any(per_task_stats.values()):
    report["per_task_stats"] = {k: episodes.stats_text(v)
                                for k, v in per_task_stats.items()}
  return report


def rows(metrics: dict[str, float]) -> list[dict[str, Any]]:
  """CSV rows of a `score` dict: the overall row ("all"), then each family.

  Example:
    rows({"eval/seen/success": 0.5, "eval/seen/tasks": 4.0,
          "eval/seen/responses_truncated": 0.25,
          "eval/seen/success/heat": 1.0, "eval/seen/tasks/heat": 2.0, ...})
    -> [{"split": "seen", "family": "all", "success": 0.5, "tasks": 4,
         "responses_truncated": 0.25},
        {"split": "seen", "family": "heat", "success": 1.0, "tasks": 2,
         "responses_truncated": None}, ...]
    (None: not in the dict, as where a family had no replies or in reports
    written before it was counted).
  """
  out = []
  for split in (s[5:] for s in SPLITS):
    prefix = f"eval/{split}/success/"
    families = sorted(k[len(prefix):] for k in metrics if k.startswith(prefix))
    for fam in ["all"] + families:
      suffix = "" if fam == "all" else f"/{fam}"
      tasks = metrics.get(f"eval/{split}/tasks{suffix}")
      out.append(dict(split=split, family=fam,
                      success=metrics[f"eval/{split}/success{suffix}"],
                      tasks=None if tasks is None else int(tasks),
                      responses_truncated=metrics.get(
                          f"eval/{split}/responses_truncated{suffix}")))
  return out


def csv_text(table: Sequence[dict[str, Any]]) -> str:
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=["split", "family", "success",
                                           "tasks", "responses_truncated"],
                          lineterminator="\n")
  writer.writeheader()
  writer.writerows(table)
  return buf.getvalue()


def write_report(report: dict[str, Any], *, out_json: epath.PathLike,
                 out_csv: epath.PathLike) -> None:
  """Writes a report's JSON and CSV so that no JSON contradicts its CSV.

  The JSON is the file readers trust: on disk, it means the evaluation is
  complete (the experiments' rescoring reuses it instead of scoring again).
  So both files are first written whole beside their names (a failed write,
  such as a full disk, leaves the previous pair as it was); then the
  previous pair is set aside, the JSON first, and the new CSV renamed into
  place, then the JSON. A rename that fails, or an interrupt, puts the
  previous pair back (should that fail too, it stays beside its names as
  <name>.old<pid>, with no JSON). A crash (no code runs) leaves the
  previous pair, the new one, or a CSV with no JSON (an evaluation not
  done): two files cannot change at once, and a JSON never stands beside
  another report's CSV.

  Args:
    report: what `evaluate_run` returned.
    out_json, out_csv: the two files (local, or any path etils.epath
      handles).

  Raises:
    OSError: a write or rename failed (with the outcomes above).
  """
  csv_path, json_path = epath.Path(out_csv), epath.Path(out_json)
  texts = {csv_path: csv_text(rows(report["metrics"])),
           json_path: json.dumps(report, indent=1) + "\n"}
  staged = {p: p.parent / f"{p.name}.new{os.getpid()}" for p in texts}
  kept = {p: p.parent / f"{p.name}.old{os.getpid()}" for p in texts}
  aside = []  # the previous files set aside, the JSON first
  try:
    for path, text in texts.items():
      atomic.write_text(staged[path], text)
    for path in (json_path, csv_path):  # no JSON until the new pair is in
      if path.exists():
        path.replace(kept[path])
        aside.append(path)
    for path in (csv_path, json_path):
      atomic.sync(path.parent)
      staged[path].replace(path)
  except BaseException:
    for tmp in staged.values():
      tmp.unlink(missing_ok=True)
    for path in reversed(aside):  # the CSV first: no JSON beside a new CSV
      kept[path].replace(path)
    raise
  atomic.sync(json_path.parent)
  for path in aside:  # the new pair is in: a file left over misleads no one
    try:
      kept[path].unlink()
    except OSError as e:
      logging.warning("%s could not be removed: %s", kept[path], e)


def transcript(ep: episodes.Episode, *, split: str, task: int
               ) -> dict[str, Any]:
  """One evaluated episode, JSON-ready: what the policy saw and did.

  Args:
    ep: the episode.
    split: "seen" or "unseen".
    task: its index in the split's task order (as in the report's
      "per_task").

  Returns:
    {"split", "task", "seed" (the task seed), "family", "goal" (the task
     text), "success", "error" (the environment's, or None), "steps": [
     {"observation": what the step answered, "reply": the policy's text,
      "attempted": the action the reply asked for (`prompts.
      attempted_action`; "" when it names none), "action": the one sent to
      the environment (its no-op for an invalid reply), "valid", "reward",
      "cut": the reply hit max_new_tokens}, ...]}.
  """
  return {
      "split": split, "task": task, "seed": int(ep.seed), "family": ep.family,
      "goal": ep.task, "success": bool(ep.success), "error": ep.error,
      "steps": [{"observation": st.observation, "reply": st.response,
                 "attempted": prompts.attempted_action(st.response),
                 "action": st.action, "valid": bool(st.action_valid),
                 "reward": float(st.reward), "cut": bool(st.truncated)}
                for st in ep.steps]}


def write_transcripts(path: epath.PathLike,
                      played: dict[str, list[episodes.Episode]]) -> int:
  """Writes every episode of `played` ({"seen": [...], ...}, task order) as
  one JSON line (`transcript`), whole or not at all; returns how many."""
  lines = [json.dumps(transcript(ep, split=split, task=i)) + "\n"
           for split, eps in played.items() for i, ep in enumerate(eps)]
  atomic.write_text(path, "".join(lines))
  return len(lines)


def format_table(table: Sequence[dict[str, Any]]) -> str:
  """The rows as aligned text: family, then success (tasks) per split."""
  by = {(r["split"], r["family"]): r for r in table}
  families = ["all"] + sorted({r["family"] for r in table} - {"all"})
  lines = [f"{'family':20s}{'seen':>16s}{'unseen':>16s}"]
  for fam in families:
    cells = []
    for split in ("seen", "unseen"):
      r = by.get((split, fam))
      cells.append(f"{r['success']:.3f} ({r['tasks']})" if r else "-")
    lines.append(f"{fam:20s}" + "".join(f"{c:>16s}" for c in cells))
  return "\n".join(lines)


# -- entry point --------------------------------------------------------------


def run_settings(workdir: str) -> dict[str, Any]:
  """The run's `train.train` arguments, from the config.gin it wrote.

  Evaluation, `experiments` (planned updates) and `gaps` read runs with it.

  Raises:
    FileNotFoundError: no config.gin in `workdir`.
    ValueError: a config.gin that does not parse, or not a training run's.
  """
  # Imported here: gin is the entry point's business, not the library's.
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.gin")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing: the run's settings are read "
                            "from the config.gin its training wrote")
  gin.clear_config()
  try:
    gin.parse_config_file(path)
  except Exception as e:  # gin raises TokenError, SyntaxError, ImportError...
    gin.clear_config()  # no half-parsed run left bound
    raise ValueError(f"{path} does not parse as the run's gin config "
                     f"({type(e).__name__}: {e})") from e
  params = inspect.signature(train_lib.train).parameters
  bindings = gin.get_bindings(train_lib.train)
  missing = [k for k, p in params.items() if p.kind == p.KEYWORD_ONLY
             and p.default is p.empty and k not in bindings]
  if missing:
    raise ValueError(f"{path} binds no train.{', train.'.join(missing)}: it "
                     "is not the config.gin of a training run")
  defaults = {k: p.default for k, p in params.items()
              if p.default is not p.empty}
  return {**defaults, **bindings}


def policy_seed(run: dict[str, Any]) -> int:
  """The seed a run's `policy_fn` was given, from its `run_settings`."""
  return run["seed"] if run["policy_seed"] is None else run["policy_seed"]


def check_writable(path: str, *, what: str) -> None:
  """Raises ValueError unless `path` can be written, creating nothing.

  Called before any work, so that a bad output path does not cost the
  results. Its folder must be writable or creatable (the nearest existing
  folder above it writable); remote paths (gs://...) are not checked.

  Args:
    path: the file to be written.
    what: what it is, for the message (e.g. "--out_json").
  """
  if "://" in path:
    return
  path = os.path.abspath(path)
  if os.path.isdir(path):
    raise ValueError(f"cannot write {what} {path}: it is a folder")
  folder = os.path.dirname(path)
  while not os.path.exists(folder):
    folder = os.path.dirname(folder)
  if not os.path.isdir(folder):
    raise ValueError(f"cannot write {what} {path}: {folder} is a file, not "
                     "a folder")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise ValueError(f"cannot write {what} {path}: {folder} is not writable")


def run_optimizer(run: dict[str, Any]) -> optax.GradientTransformation:
  """The optimizer of a run's `run_settings` (its state is restored too)."""
  from seed_jax import train_step  # pylint: disable=g-import-not-at-top
  return train_step.make_optimizer(
      run["learning_rate"], weight_decay=run["weight_decay"],
      grad_clip=run["grad_clip"], warmup_steps=run["warmup_steps"])


def report_path(workdir: str, step: int, *, num_tasks: int, seed: int,
                temperature: float, max_steps: int | None = None,
                history_length: int | None = None,
                invalid_action: str | None = None) -> str:
  """Where an evaluation's report goes, without the extension.

  `WORKDIR/eval/step_<N>_tasks<K>_seed<S>_temp<T>`, with `_steps<M>` and
  `_history<H>` and `_<invalid action>` (`_as_written`) appended when the
  rollout length, history or invalid action is given (not None), even if it
  equals the run's. T is the temperature as `:g` writes it (0.4, 1) when
  that reads back as the same float, else its repr (0.4000001), so that two
  temperatures never share a name.
  """
  temp = f"{float(temperature):g}"  # 0.4 -> "0.4", 1.0 -> "1"
  if float(temp) != float(temperature):  # :g would round, e.g. 0.4000001
    temp = repr(float(temperature))
  name = f"step_{step}_tasks{num_tasks}_seed{seed}_temp{temp}"
  if max_steps is not None:
    name += f"_steps{max_steps}"
  if history_length is not None:
    name += f"_history{history_length}"
  if invalid_action is not None:
    name += f"_{invalid_action}"
  return os.path.join(workdir, "eval", name)


def parse_flags(argv):
  parser = argparse.ArgumentParser(
      description="Score a training run's checkpoint on the seen and unseen "
      "splits, per task family, with no skills in the prompt.")
  parser.add_argument("--workdir", required=True, help="the run's workdir")
  parser.add_argument("--step", type=int, default=None,
                      help="the update to evaluate (default: the latest; "
                      "0: the policy the run started from)")
  parser.add_argument("--num_tasks", type=int, default=64,
                      help="tasks per split")
  parser.add_argument("--temperature", type=float, default=0.4)
  parser.add_argument("--max_steps", type=int, default=None,
                      help="episode length (default: the run's)")
  parser.add_argument("--history_length", type=int, default=None,
                      help="history turns in the prompt (default: the run's)")
  parser.add_argument("--invalid_action", default=None,
                      choices=prompts.INVALID_ACTIONS,
                      help="what an action that parsed but is not admissible "
                      "sends: the no-op, or the action as written (default: "
                      "the run's RLConfig.invalid_action)")
  parser.add_argument("--seed", type=int, default=0,
                      help="seeds the sampling keys")
  parser.add_argument("--out_json", default=None,
                      help="default WORKDIR/eval/step_<N>_tasks<K>_seed<S>_"
                      "temp<T>.json")
  parser.add_argument("--out_csv", default=None,
                      help="default: the JSON's name, .csv")
  parser.add_argument("--same_as", default=None,
                      help="another run's report JSON: copied instead of "
                      "scoring when it has this evaluation's fingerprint "
                      "(the same params, model, tokenizer and settings)")
  parser.add_argument("--transcripts", default=None,
                      help="also write every episode played (each step's "
                      "observation, reply and action) to this file as JSON "
                      "lines, one per task, to read what the policy does")
  args = parser.parse_args(argv)
  if args.num_tasks < 1:
    parser.error(f"--num_tasks must be at least 1, got {args.num_tasks}")
  if not 0 <= args.temperature < float("inf"):  # nan fails both
    parser.error(f"--temperature must be a finite number >= 0 (0: greedy), "
                 f"got {args.temperature}")
  if args.max_steps is not None and args.max_steps < 1:
    parser.error(f"--max_steps must be at least 1, got {args.max_steps}")
  if args.history_length is not None and args.history_length < 0:
    parser.error(f"--history_length must be >= 0, got {args.history_length}")
  if args.transcripts is not None and args.same_as is not None:
    parser.error("--transcripts needs the episodes played, and --same_as may "
                 "copy a report instead of playing them: give one of the two")
  return args


def main(argv=None) -> dict[str, Any]:
  args = parse_flags(sys.argv[1:] if argv is None else argv)
  from seed_jax import partitioning  # pylint: disable=g-import-not-at-top
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  train_lib.console_logging()
  workdir = os.path.abspath(args.workdir)
  try:
    step = pick_step(checkpoint_steps(workdir), args.step)
    out_json, out_csv = _outputs(args, workdir, step)
    if args.transcripts is not None:
      _check_transcripts(args.transcripts, out_json, out_csv)
    run = run_settings(workdir)
    same_as = _same_as(args.same_as)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"error: {e}") from e
  tx = run_optimizer(run)
  played = {} if args.transcripts is not None else None
  try:
    mesh = (partitioning.make_mesh(run["mesh_shape"]) if run["mesh_shape"]
            else None)
  except ValueError as e:  # the run's mesh does not fit this machine
    raise SystemExit(f"error: the run's train.train.mesh_shape "
                     f"{run['mesh_shape']} cannot be laid out on this "
                     f"machine: {e}") from None
  try:
    report = evaluate_run(
        workdir, policy_fn=run["policy_fn"], rl=run["rl"], tx=tx,
        env_name=run["env_name"], env_kwargs=run["env_kwargs"],
        run_seed=policy_seed(run), mesh=mesh, step=step,
        num_tasks=args.num_tasks,
        temperature=args.temperature, max_steps=args.max_steps,
        history_length=args.history_length,
        invalid_action=args.invalid_action, seed=args.seed,
        same_as=same_as, per_task_episodes=played)
  except (checkpoints.CorruptCheckpointError, checkpoints.RestoreError,
          FileNotFoundError, ValueError) as e:
    # ModelMismatchError is a ValueError; so is a step a still-running
    # training deleted (max_to_keep) after it was picked, and one it deletes
    # while it is read is a CorruptCheckpointError saying so.
    raise SystemExit(f"error: {e}") from None
  table = rows(report["metrics"])
  # The table first: it stays on screen if a write fails after all.
  copied = (f" (copied from {report['copied_from']}'s: the same params and "
            "settings)" if "copied_from" in report else "")
  print(f"update {step} of {workdir}, {args.num_tasks} tasks per split, "
        f"temperature {args.temperature}{copied}:\n{format_table(table)}",
        flush=True)
  cut = [f"{r['split']} {r['responses_truncated']:.3f}" for r in table
         if r["family"] == "all" and r["responses_truncated"] is not None]
  if cut:
    print(f"share of replies cut at max_new_tokens: {', '.join(cut)}",
          flush=True)
  if played is not None:  # before the report: a JSON on disk means done
    try:
      n = write_transcripts(args.transcripts, played)
    except OSError as e:
      raise SystemExit(f"error: could not write the transcripts: {e}") from e
    print(f"wrote {n} episodes to {args.transcripts}", flush=True)
  try:
    write_report(report, out_json=out_json, out_csv=out_csv)
  except OSError as e:
    raise SystemExit(f"error: could not write the report: {e}") from e
  print(f"wrote {out_json} and {out_csv}", flush=True)
  return report


def _same_as(path: str | None) -> dict[str, Any] | None:
  """The report at `path` (None: None).

  Raises:
    FileNotFoundError, ValueError: no such file; one that is not a report.
  """
  if path is None:
    return None
  with open(path) as f:
    try:
      report = json.load(f)
    except ValueError as e:
      raise ValueError(f"--same_as {path} does not parse: {e}") from None
  if not isinstance(report, dict) or "metrics" not in report:
    raise ValueError(f"--same_as {path} is not an evaluation report")
  return report


def _check_transcripts(path: str, out_json: str, out_csv: str) -> None:
  """Raises ValueError for a --transcripts path that cannot be written or
  that is one of the report's two files."""
  if os.path.abspath(path) in (os.path.abspath(out_json),
                               os.path.abspath(out_csv)):
    raise ValueError(f"--transcripts {path} is also the report's JSON or "
                     "CSV; give it another name")
  check_writable(path, what="the transcripts")


def _outputs(args, workdir: str, step: int) -> tuple[str, str]:
  """The JSON and CSV paths of `main`, checked writable.

  Raises:
    ValueError: a path that cannot be written, or both paths the same.
  """
  base = report_path(workdir, step, num_tasks=args.num_tasks, seed=args.seed,
                     temperature=args.temperature, max_steps=args.max_steps,
                     history_length=args.history_length,
                     invalid_action=args.invalid_action)
  out_json = args.out_json or base + ".json"
  out_csv = args.out_csv or os.path.splitext(out_json)[0] + ".csv"
  if os.path.abspath(out_json) == os.path.abspath(out_csv):
    raise ValueError(f"the JSON and the CSV would both be {out_json}; give "
                     "--out_csv another name")
  check_writable(out_json, what="the JSON report")
  check_writable(out_csv, what="the CSV")
  return out_json, out_csv


if __name__ == "__main__":
  main()
