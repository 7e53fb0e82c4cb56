"""Stage 1 (docs/algorithm.md §2): hindsight-analysis records and dataset.

collect_records (rollouts + annotator) -> write_dataset (TFDS, array_record,
train/validation) -> read_dataset (random access, a grain source), which
`sft.sft` fine-tunes on (analysis prompt -> analysis JSON); skill_f1 scores a
skill against the annotator's.
"""

from __future__ import annotations

import collections
import collections.abc
import functools
import hashlib
import json
import logging
import os
import re
import tempfile
from typing import Any, Callable, Mapping, Sequence

from etils import epath
import jax
import numpy as np
import tensorflow_datasets as tfds

from seed_jax import atomic
from seed_jax import distributed
from seed_jax import rollout as rollout_lib
from seed_jax import skills
from seed_jax import teacher as teacher_lib
from seed_jax.envs import base as envs_base
from seed_jax.episodes import Episode

DATASET_NAME = "seed_stage1"
FIELDS = ("prompt", "response", "task", "family", "success")
# The episode's task seed (int), which identifies its task (`split_records`):
# in records of `collect_records`, not in those of older journals and
# datasets, nor in the demo's.
SEED = "seed"
Record = dict[str, Any]  # FIELDS: four str and success (bool); SEED if known
Reply = Mapping[str, Any] | str | skills.Analysis | skills.ParseError | None
_COUNTS = ("tasks", "episodes", "successes", "env_steps", "env_errors",
           "steps_cut", "prompt_too_long")

# -- records ------------------------------------------------------------------


class CollectionInterrupted(teacher_lib.TeacherUnavailableError):
  """The teacher went down during `collect_records`.

  Attributes (besides TeacherUnavailableError's): `records` of the task
  groups fully annotated, for `write_dataset`; `tasks_done`, how many groups
  that is (resume with `task_offset=task_offset + tasks_done`, which redoes
  the interrupted batch, or rerun with the same `journal`); `partial_records`,
  that batch's answered episodes (the resume writes them again: keep them
  only when not resuming); `stats` so far; `journal`, the folder holding the
  fully annotated batches, or None.
  """

  def __init__(self, cause: teacher_lib.TeacherUnavailableError,
               records: list[Record], stats: dict[str, Any], tasks_done: int,
               partial_records: list[Record],
               journal: epath.PathLike | None = None):
    super().__init__(cause.url, cause.attempts, cause.reason, cause.status,
                     cause.partial, cause.completed)
    self.records, self.stats, self.tasks_done = records, stats, tasks_done
    self.partial_records, self.journal = partial_records, journal
    kept = (f"{cause}; kept {len(records)} record(s) of {tasks_done} fully "
            f"annotated task group(s)")
    if journal is not None:
      self.args = (f"{kept} in {os.fspath(journal)}: run again with the same "
                   "settings to go on from there",)
    else:
      self.args = (f"{kept} ({len(partial_records)} more of the interrupted "
                   "batch in `.partial_records`): write `.records` with "
                   "write_dataset and resume from `.tasks_done`",)


class _Journal:
  """The fully annotated batches of one collection, kept on disk.

  `meta.json` holds the settings that decide which episodes and prompts a
  batch has; `batch-<first task index>.json` holds one batch's records and
  counts. Each file is written whole (a temporary file, then a rename), by
  the writing process only. A collection with other settings is refused
  once a batch is kept (before, its settings replace the old ones); the
  starting weights and the teacher's endpoint are not part of them.
  """

  def __init__(self, folder: epath.PathLike, meta: Mapping[str, Any],
               writer: bool):
    self.folder, self.writer = epath.Path(folder), writer
    meta = json.loads(json.dumps(dict(meta)))  # tuples as lists, like disk
    path = self.folder / "meta.json"
    batches = (sorted(p.name for p in self.folder.glob("batch-*.json"))
               if self.folder.exists() else [])
    if path.exists():
      old = self._read(path, "move the folder away to collect afresh")
      diff = [f"{k}: {old.get(k)!r} there, {meta.get(k)!r} now"
              for k in sorted(set(old) | set(meta)) if old.get(k) != meta.get(k)]
      if diff and not batches:  # nothing kept to mix with
        if writer:
          self._write(path, meta)
      elif diff:
        raise ValueError(
            f"{os.fspath(self.folder)} holds Stage-1 records collected with "
            f"other settings ({'; '.join(diff)}); use the same settings, or "
            "move that folder away to collect afresh")
    elif batches:
      raise ValueError(
          f"{os.fspath(self.folder)} holds Stage-1 batches but no meta.json "
          "to tell their settings; move that folder away to collect afresh")
    elif writer:
      self.folder.mkdir(parents=True, exist_ok=True)
      self._write(path, meta)
    # The batches kept when the collection starts: what every process of a
    # multi-host run reads back alike, whatever process 0 writes meanwhile.
    self.kept = set(batches)

  @staticmethod
  def _read(path: epath.Path, remedy: str) -> dict[str, Any]:
    try:
      return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"unreadable Stage-1 journal file {os.fspath(path)} "
                       f"({e}); {remedy}") from None

  @staticmethod
  def _write(path: epath.Path, value: Any) -> None:
    atomic.write_text(path, json.dumps(value, ensure_ascii=False))

  def _path(self, start: int) -> epath.Path:
    return self.folder / f"batch-{start:06d}.json"

  def load(self, start: int) -> dict[str, Any] | None:
    """The batch starting at task index `start`, or None if not kept."""
    path = self._path(start)
    if path.name not in self.kept:
      return None
    return self._read(path, "move it away to collect that batch again")

  def save(self, start: int, records: list[Record],
           counts: Mapping[str, int]) -> None:
    if self.writer:
      self._write(self._path(start), dict(records=records, counts=dict(counts)))


def _annotate(annotator, episodes: Sequence[Episode],
              prompts: Sequence[str]) -> list[Reply]:
  """Replies of a batch (`annotate_many`, sent the records' `prompts`) or
  per-episode annotator; raises TeacherUnavailableError with
  `.partial`/`.completed` over `episodes`, and ValueError when
  `annotate_many` answers another number of replies."""
  if hasattr(annotator, "annotate_many"):
    replies = list(annotator.annotate_many(episodes, prompts))
    if len(replies) != len(episodes):
      raise ValueError(f"the annotator gave {len(replies)} replies for "
                       f"{len(episodes)} episodes")
    return replies
  replies: list[Reply] = []
  for ep in episodes:
    try:
      replies.append(annotator(ep))
    except teacher_lib.TeacherUnavailableError as e:
      rest = len(episodes) - len(replies)
      raise e.with_partial(replies + [None] * rest,
                           [True] * len(replies) + [False] * rest) from e
  return replies


def _refused(annotator, replies: Sequence[Reply]
             ) -> teacher_lib.TeacherUnavailableError:
  """The outage of a teacher that refused every request of a batch (e.g. a
  max_tokens beyond its context): kept as a batch of no records, it would
  never be asked again."""
  said = next((r.detail for r in replies
               if isinstance(r, skills.ParseError) and r.detail), "")
  return teacher_lib.TeacherUnavailableError(
      getattr(annotator, "url", type(annotator).__name__), 1,
      f"it refused all {len(replies)} request(s) of a batch"
      + (f" ({said})" if said else "") + "; check the teacher's model, "
      "max_tokens and context length against the prompts")


def _check_same_batch(prompts: Sequence[str]) -> None:
  """Raises RuntimeError, on every process alike, unless every process holds
  the same analysis prompts: process 0's replies are paired with each
  process's episodes by position. A collective (`allgather_objects`).

  Example of the error's end: "process 0: 8 episode(s) to annotate (prompts
  3f2a9c01d4e5); process 1: 7 episode(s) to annotate (prompts 91bd07aa2c3e)".
  """
  digest = hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()
  keys = distributed.allgather_objects((len(prompts), digest))
  if len(set(keys)) > 1:
    held = distributed.by_process(
        [f"{n} episode(s) to annotate (prompts {d[:12]})" for n, d in keys])
    raise RuntimeError(
        "Stage 1's processes rolled out different batches, so process 0's "
        f"replies would be paired with other episodes: {held}; every process "
        "must roll out alike (same params, rng and environments): look for "
        "environment errors in each process's log")


def _annotate_once(annotator, episodes: Sequence[Episode],
                   prompts: Sequence[str]) -> list[Reply]:
  """`_annotate` on process 0 only, its replies (or its outage) shared with
  every process: a multi-host run asks the teacher once, and every process
  trains on the same annotations. RuntimeError (`_check_same_batch`), before
  the teacher is asked, when the processes' batches differ."""
  if jax.process_count() == 1:
    return _annotate(annotator, episodes, prompts)
  _check_same_batch(prompts)
  out, error = None, None
  if distributed.is_writer():
    try:
      out = ("ok", _annotate(annotator, episodes, prompts))
    except teacher_lib.TeacherUnavailableError as e:
      # Sent field by field: the exception's own pickling loses them.
      error, out = e, ("down", (e.url, e.attempts, e.reason, e.status,
                                e.partial, e.completed))
    except BaseException as e:  # the others must not wait for replies
      error, out = e, ("error", f"{type(e).__name__}: {e}")
  kind, value = distributed.broadcast_object(out)
  if error is not None:
    raise error
  if kind == "down":
    raise teacher_lib.TeacherUnavailableError(*value)
  if kind == "error":
    raise RuntimeError(f"Stage 1's annotator failed on process 0: {value}")
  return value


def _analysis(reply: Reply, *, num_steps: int,
              max_step_skills: int) -> skills.Analysis | skills.ParseError:
  """An annotator reply (dict, text, Analysis, ParseError or None) through
  the parser."""
  if isinstance(reply, (skills.Analysis, skills.ParseError)):
    return reply
  if reply is None:
    return skills.ParseError("no_reply", "the annotator gave no analysis")
  if isinstance(reply, Mapping):
    reply = json.dumps(dict(reply), ensure_ascii=False, default=str)
  return skills.parse_analysis(reply, num_steps=num_steps,
                               max_step_skills=max_step_skills)


def collect_records(
    generate: rollout_lib.GenerateFn, env_name: str, *, num_tasks: int,
    group_size: int, max_steps: int, annotator: Any, rng: jax.Array,
    history_length: int = 2, mode: str = "episode_only",
    max_critical_steps: int = 3, max_prompt_chars: int | None = None,
    encode: Callable[[str], list] | None = None,
    max_prompt_tokens: int | None = None,
    tasks_per_batch: int | None = None, task_offset: int = 0,
    pool_factory: Callable[..., envs_base.EnvPool] = envs_base.EnvPool,
    journal: epath.PathLike | None = None,
    journal_meta: Mapping[str, Any] | None = None,
    invalid_action: str = "no_op",
) -> tuple[list[Record], dict[str, Any]]:
  """Rolls out on training tasks and keeps the parseable annotated episodes.

  Each episode's prompt is `skills.build_analysis_prompt` (the one RL's
  self-analysis uses, byte for byte); its response is the annotator's reply
  parsed by `skills.parse_analysis` and re-serialized canonically
  (`Analysis.to_json`, e.g. '{"episode_summary": "...", "episode_skill":
  "..."}'). A reply that does not parse, or has an empty skill, is counted
  (`failed/<reason>` in the stats) and skipped; so is no reply (None, e.g.
  the rule annotator's on an episode whose ground_truth() raised:
  `failed/no_reply`). An episode whose environment raised (`Episode.error`,
  a failed reset included) is neither annotated nor kept: it is counted in
  `env_errors` and logged.

  Args:
    generate: `generate(prompts, rng) -> list[Generation]`, e.g.
      `lambda p, r: policy.generate(params, p, r, sampler.Temperature(1.0))`.
    env_name, num_tasks, group_size, max_steps: the environment, the task
      groups (train-split seeds), N episodes per task, the turn limit.
    annotator: `annotator(episode) -> dict | str | None` (e.g.
      `annotators.annotate`), or an object with `annotate_many(episodes,
      prompts) -> list` (e.g. an `OpenAITeacher`), sent the prompts the
      records will hold; a teacher's `annotate` goes through its
      `annotate_many` (its own prompts would not be the records').
    rng: PRNG key of the rollouts.
    history_length: k (observation, action) pairs in rollout prompts.
    mode, max_critical_steps, max_prompt_chars: of the analysis prompt (as
      `skills.build_analysis_prompt`; RL must use the same).
    encode, max_prompt_tokens: with both, prompts are cut further to fit
      `max_prompt_tokens` (`skills.fit_analysis_prompt`, RL's limit), and an
      episode whose prompt cannot fit is counted in `prompt_too_long` and not
      annotated.
    tasks_per_batch: task groups rolled out and annotated at once (None:
      all); with a teacher, a smaller batch loses less when it goes down.
    task_offset: first train-split seed index, to resume a collection.
    pool_factory: builds the EnvPool of a batch, called as
      `pool_factory(env_name, num_groups=, group_size=, split="train",
      max_steps=)`.
    journal: a folder where each fully annotated batch is kept as it
      completes; a rerun with the same settings reads those batches back
      instead of rolling out and annotating them again, and goes on from the
      first batch not kept, with the same rollout keys as an uninterrupted
      run. None: nothing is kept.
    journal_meta: more settings a rerun must share (e.g. the annotator).
    invalid_action: what the rollouts send for an action that parsed but is
      not admissible (`rollout.rollout`'s); RL's should be the same, so that
      the analysis prompts show invalid tries as RL's will.

  Returns:
    (records, stats): records (dicts with FIELDS and SEED; those read back
    from a journal kept by older code lack SEED) in episode order; stats:
    tasks, episodes, successes, env_steps, env_errors, steps_cut (in kept
    prompts), prompt_too_long, records, parsed, failed, parse_rate and
    failed/<reason>.

  Raises:
    CollectionInterrupted: when the teacher is unavailable after its
      retries, or refused every request of a batch (which is not kept);
      `.records` holds what was kept so far, for the caller to write (and
      `journal`, if given, holds its batches), `.stats` the counts so far
      (`unanswered`: the interrupted batch's episodes never answered).
    ValueError: on an unknown mode or non-positive sizes, or a `journal`
      kept with other settings.
    RuntimeError: on every process of a multi-host run whose processes
      rolled out different batches (naming each one's episode count).
  """
  if mode not in skills.MODES:
    raise ValueError(f"unknown analysis mode {mode!r}; expected {skills.MODES}")
  if num_tasks < 1 or group_size < 1 or (tasks_per_batch is not None
                                         and tasks_per_batch < 1):
    raise ValueError("num_tasks, group_size and tasks_per_batch must be >= 1")
  owner = getattr(annotator, "__self__", None)
  if (getattr(annotator, "__name__", "") == "annotate"
      and hasattr(owner, "annotate_many")):
    annotator = owner  # e.g. `teacher.annotate`
  k = max_critical_steps if mode == "episode_step" else 0
  per_batch = tasks_per_batch or num_tasks
  seeds = envs_base.split_seeds("train", num_tasks, start=task_offset)
  kept = None
  if journal is not None:
    kept = _Journal(journal, dict(
        journal_meta or {}, env_name=env_name, num_tasks=num_tasks,
        group_size=group_size, max_steps=max_steps,
        history_length=history_length, mode=mode,
        max_critical_steps=max_critical_steps,
        max_prompt_chars=max_prompt_chars,
        max_prompt_tokens=max_prompt_tokens if encode is not None else None,
        tasks_per_batch=per_batch, task_offset=task_offset,
        rng=np.asarray(jax.random.key_data(rng)).tolist(),
        # Journals written before the setting existed sent the no-op, and
        # name nothing: so does one that sends it now.
        **({} if invalid_action == "no_op"
           else dict(invalid_action=invalid_action))),
                    writer=jax.process_index() == 0)
    if kept.kept:
      logging.info("stage1: reading back %d batch(es) kept in %s",
                   len(kept.kept), os.fspath(journal))
  records: list[Record] = []
  totals = collections.Counter(dict.fromkeys(_COUNTS, 0))
  parse = skills.ParseStats()

  def prompt(ep) -> skills.AnalysisPrompt | None:
    if encode is None or max_prompt_tokens is None:
      return skills.build_analysis_prompt(
          ep, mode=mode, max_critical_steps=max_critical_steps,
          max_chars=max_prompt_chars)
    return skills.fit_analysis_prompt(
        ep, encode=encode, max_tokens=max_prompt_tokens, mode=mode,
        max_critical_steps=max_critical_steps, max_chars=max_prompt_chars)

  def batch(chunk, start, rng):
    """One batch's (records, counts, teacher error or None)."""
    pool = pool_factory(env_name, num_groups=len(chunk), group_size=group_size,
                        split="train", max_steps=max_steps)
    result = rollout_lib.rollout(
        generate, pool, rng, env_name=env_name, max_steps=max_steps,
        history_length=history_length, group_seeds=chunk,
        uid_offset=task_offset + start, invalid_action=invalid_action)
    eps = result.episodes
    counts = collections.Counter(
        tasks=len(chunk), episodes=len(eps), env_steps=result.env_steps,
        successes=sum(bool(e.success) for e in eps))
    broken = [e for e in eps if e.error is not None]
    if broken:  # nothing sound to analyze (nor the task, after a reset)
      counts["env_errors"] += len(broken)
      logging.warning("stage1: left out %d episode(s) whose environment "
                      "raised, e.g. %s", len(broken), broken[0].error)
      eps = [e for e in eps if e.error is None]
    prompts = [prompt(ep) for ep in eps]
    counts["prompt_too_long"] += sum(p is None for p in prompts)
    eps, prompts = ([e for e, p in zip(eps, prompts) if p is not None],
                    [p for p in prompts if p is not None])
    error, answered = None, [True] * len(eps)
    try:
      replies = _annotate_once(annotator, eps, [p.text for p in prompts])
    except teacher_lib.TeacherUnavailableError as e:
      error = e
      replies = list(e.partial or [None] * len(eps))
      answered = list(e.completed or [r is not None for r in replies])
    if not all(answered):
      counts["unanswered"] = answered.count(False)
    out, parsed = [], skills.ParseStats()
    for ep, built, reply, ok in zip(eps, prompts, replies, answered):
      if not ok:  # never answered: neither kept nor counted as unparsed
        continue
      analysis = parsed.record(_analysis(reply, num_steps=ep.length,
                                         max_step_skills=k))
      if not isinstance(analysis, skills.Analysis):
        continue
      counts["steps_cut"] += built.steps_cut
      out.append(dict(prompt=built.text, response=analysis.to_json(),
                      task=ep.task, family=ep.family, success=bool(ep.success),
                      seed=int(ep.seed)))
    counts.update({n: v for n, v in parsed.as_dict().items()
                   if n != "parse_rate"})
    if error is None and eps and parsed.reasons.get("rejected") == len(eps):
      error = _refused(annotator, replies)
    return out, counts, error

  def stats() -> dict[str, Any]:
    return dict({n: totals[n] for n in _COUNTS}, records=len(records),
                **parse.as_dict())

  def add(counts):
    totals.update({n: counts.get(n, 0) for n in _COUNTS})
    parse.add(counts)

  for start in range(0, num_tasks, per_batch):
    chunk = seeds[start:start + per_batch]
    rng, sub = jax.random.split(rng)  # kept batches too: same keys after
    saved = kept.load(start) if kept is not None else None
    if saved is not None:
      records.extend(saved["records"])
      add(saved["counts"])
      continue
    out, counts, error = batch(chunk, start, sub)
    add(counts)
    if error is not None:
      raise CollectionInterrupted(
          error, list(records), dict(stats(), partial_records=len(out),
                                     unanswered=counts["unanswered"]),
          start, out, journal=journal) from error
    if kept is not None:
      kept.save(start, out, counts)
    records.extend(out)
    logging.info("stage1: %d/%d task groups collected, %d records",
                 start + len(chunk), num_tasks, len(records))
  return records, stats()


# -- dataset ------------------------------------------------------------------


def _features() -> tfds.features.FeaturesDict:
  text = tfds.features.Text
  return tfds.features.FeaturesDict(dict(
      prompt=text(), response=text(), task=text(), family=text(),
      success=tfds.features.Scalar(dtype=np.bool_),
      seed=tfds.features.Scalar(dtype=np.int64)))  # -1: not known


def _seed(record: Mapping[str, Any]) -> int | None:
  """The record's task seed, or None when it has none (older records)."""
  seed = record.get(SEED)
  return None if seed is None or int(seed) < 0 else int(seed)


class _LocalInfo(tfds.core.DatasetInfo):
  """Dataset info that never looks for a published copy.

  tfds looks up the info of a dataset not yet written in its public bucket,
  and makes an empty temporary folder for it first that it never removes (even
  with the bucket lookup off): one stray folder per `write_dataset`.
  """

  def initialize_from_bucket(self) -> None:
    pass


class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes given examples per split; nothing is downloaded."""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Stage-1 analysis records."}
  # No checksums file to look up beside the code: the data is generated here
  # (and tfds 4.9's lookup needs importlib_resources on Python >= 3.9).
  code_path = None

  def __init__(self, *, name: str, splits: Mapping[str, list[Record]],
               **kwargs):
    self.name = name
    self._splits = splits
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalInfo(
        builder=self, features=_features(), disable_shuffling=True,
        description="SEED Stage-1 records: analysis prompt -> analysis JSON.")

  def _split_generators(self, dl_manager):
    del dl_manager
    return {s: self._generate_examples(r) for s, r in self._splits.items()}

  def _generate_examples(self, records):
    for i, r in enumerate(records):
      seed = _seed(r)
      yield i, dict(
          {f: bool(r[f]) if f == "success" else str(r[f]) for f in FIELDS},
          seed=-1 if seed is None else seed)


def split_records(records: Sequence[Record], *, validation_fraction: float,
                  seed: int) -> tuple[list[Record], list[Record]]:
  """Deterministic train/validation split by task.

  A task is an environment seed (a record's SEED): both Sokoban environments
  give every level the same task text, and household gives one text to
  several seeds (mostly in other rooms), so the text does not tell tasks
  apart.
  Records without SEED (from journals kept by older code) are grouped by
  their task text instead: still never a text in both splits, but with one
  text for every Sokoban level they fall back to single records (below).

  The target is round(n * fraction) records (at least one, never all). Tasks
  (in an order drawn from the `seed` argument) are taken whole until
  validation reaches the target; a task joins only if that leaves validation
  no farther from the target than before and train keeps a record. So a task
  is never in both splits, and validation scores analyses of unseen tasks. It
  may end off the target by less than one task either way, or empty when every
  task is too large (16 records of two tasks at fraction 0.1: target 2, no
  validation, where a task would give 8). With a single task, records are
  split instead (exactly the target), and validation shares its task. Each
  split keeps the input order.

  Returns:
    (train, validation).
  """
  n = len(records)
  if validation_fraction <= 0 or n < 2:
    return list(records), []
  target = min(max(round(n * validation_fraction), 1), n - 1)
  groups: dict[tuple[str, Any], list[int]] = {}
  for i, r in enumerate(records):
    task_seed = _seed(r)
    key = ("task", r["task"]) if task_seed is None else ("seed", task_seed)
    groups.setdefault(key, []).append(i)
  order = np.random.default_rng(seed).permutation(len(groups))
  members = list(groups.values())
  if len(members) < 2:
    members = [[i] for i in range(n)]
    order = np.random.default_rng(seed).permutation(n)
  val: list[int] = []
  for g in order:
    if len(val) >= target:
      break
    size = len(val) + len(members[g])
    if size - target <= target - len(val) and size < n:
      val.extend(members[g])
  chosen = set(val)
  return ([r for i, r in enumerate(records) if i not in chosen],
          [r for i, r in enumerate(records) if i in chosen])


def write_dataset(records: Sequence[Record], data_dir: epath.PathLike, *,
                  name: str = DATASET_NAME, validation_fraction: float = 0.1,
                  seed: int = 0, overwrite: bool = False
                  ) -> tfds.core.DatasetInfo:
  """Writes records as a TFDS dataset (array_record; train/validation).

  Files go to `<data_dir>/<name>/1.0.0/` through a temporary folder renamed
  when complete; an empty validation split (one record, fraction 0, or
  tasks too large for the target, see `split_records`) is not written, and
  `read_dataset` reads it as empty. Read back with `read_dataset`,
  `tfds.data_source(name, split=..., data_dir=data_dir)` or
  `tfds.builder_from_directory(...)`.

  Args:
    records: dicts with FIELDS, and SEED where known (from
      `collect_records`); SEED is written as -1 where not.
    data_dir: the TFDS data directory.
    name: the dataset name.
    validation_fraction, seed: of `split_records` (same inputs, same split).
    overwrite: replace an existing dataset of this name and version.

  Returns:
    The dataset's DatasetInfo (`.splits["train"].num_examples`, ...).

  Raises:
    ValueError: no records ("no parseable records"), a missing field, or a
      fraction outside [0, 1).
    FileExistsError: the dataset exists and `overwrite` is False.
  """
  records = list(records)
  if not records:
    raise ValueError("no parseable records to write: every annotator reply "
                     "failed to parse or none was collected")
  for i, r in enumerate(records):
    missing = [f for f in FIELDS if f not in r]
    if missing:
      raise ValueError(f"record {i} lacks field(s) {missing}")
  if not 0 <= validation_fraction < 1:
    raise ValueError(f"validation_fraction must be in [0, 1): "
                     f"{validation_fraction}")
  train, val = split_records(records, validation_fraction=validation_fraction,
                             seed=seed)
  splits = {"train": train, "validation": val}
  make = functools.partial(
      _Builder, name=name, splits={k: v for k, v in splits.items() if v},
      data_dir=os.fspath(data_dir), file_format="array_record")
  builder = make()
  if builder.is_prepared():
    if not overwrite:
      raise FileExistsError(f"{builder.data_dir} already holds dataset "
                            f"{name!r}; pass overwrite=True to replace it")
    epath.Path(builder.data_dir).rmtree()
    builder = make()
  # No tfds progress bars (process-wide): the line below says what was
  # written. tfds wants a download folder, unused here.
  tfds.display_progress_bar(False)
  with tempfile.TemporaryDirectory() as downloads:
    builder.download_and_prepare(download_dir=downloads)
  logging.info("stage1: wrote %d train / %d validation records to %s",
               len(train), len(val), builder.data_dir)
  return builder.info


class RecordSource(collections.abc.Sequence):
  """A split as a random-access sequence of records (text fields as str;
  SEED where the dataset knows it, not in one written by older code); a
  grain RandomAccessDataSource, e.g. `grain.MapDataset.source(source)`."""

  def __init__(self, source):
    self._source = source

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> Record:
    if not -len(self) <= index < len(self):
      raise IndexError(f"record {index} of {len(self)}")
    ex = self._source[index % len(self)]
    record = {f: bool(ex[f]) if f == "success" else
              ex[f].decode("utf-8") if isinstance(ex[f], bytes) else str(ex[f])
              for f in FIELDS}
    seed = _seed(ex)
    if seed is not None:
      record[SEED] = seed
    return record


def read_dataset(data_dir: epath.PathLike, split: str, *,
                 name: str = DATASET_NAME) -> RecordSource:
  """Opens one split written by `write_dataset` (tfds data source, no TF).

  Args:
    data_dir: the TFDS data directory given to `write_dataset`.
    split: "train" or "validation" (any TFDS split expression).
    name: the dataset name.

  Returns:
    A RecordSource; an empty one for "validation" when `write_dataset` left
    that split out (it had no records).

  Raises:
    FileNotFoundError: naming the folder when no such dataset was written.
  """
  if not (epath.Path(data_dir) / name).exists():
    raise FileNotFoundError(f"no dataset {name!r} in {os.fspath(data_dir)!r}; "
                            "write it with write_dataset first")
  data_dir = os.fspath(data_dir)
  if (split == "validation" and split not in
      tfds.builder(name, data_dir=data_dir).info.splits):
    return RecordSource([])
  return RecordSource(tfds.data_source(name, split=split, data_dir=data_dir))


# -- agreement ----------------------------------------------------------------


def skill_f1(prediction: str, reference: str) -> float:
  """Token-overlap F1 of two skills over lowercased words (SQuAD style).

  Example: ("Open the fridge first.", "open the fridge") -> 6/7 (0.857).
  """
  p, r = (re.findall(r"[a-z0-9]+", t.lower()) for t in (prediction, reference))
  common = sum((collections.Counter(p) & collections.Counter(r)).values())
  if not common:
    return float(p == r)
  precision, recall = common / len(p), common / len(r)
  return 2 * precision * recall / (precision + recall)
