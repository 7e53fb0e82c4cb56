"""Where the RL policy comes from: demo warm start, a Hugging Face folder or
the SmolLM2 GGUF, optionally followed by Stage 1 (hindsight-skill SFT).

The prepared policy is written once to `workdir/policy` (a Hugging Face
folder with its tokenizer) and reloaded from there when the run resumes, so
warm start and Stage 1 never run twice; its report.json records what it was
prepared from and how it was computed, and a resume asking for another policy
is refused. It initializes the RL policy and is the KL reference.

Given the training mesh (one process only), the policy's params are placed
on it as the RL trainer shards them, and Stage 1's rollouts and SFT run
there; the folder written is the same (the weights are gathered to the host
to save). With several processes, each runs Stage 1 on its own first device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any

from etils import epath
import jax

from seed_jax import annotators
from seed_jax import distributed
from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import prompts
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import sft as sft_lib
from seed_jax import skills
from seed_jax import stage1 as stage1_lib

SOURCES = ("demo", "hf", "gguf")
STAGE1_ANNOTATORS = ("rule", "teacher")


@dataclasses.dataclass
class Policy:
  config: model_lib.ModelConfig
  params: Any
  tokenizer: Any
  report: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Stage1Config:
  """Stage 1: roll out, annotate, fine-tune on (analysis prompt -> JSON).

  Raises ValueError when built with an unknown annotator or analysis_mode,
  a rule_detail other than "place" or rule_repeats for a teacher,
  a size or count below 1, a learning_rate not positive and finite, or a
  max_prompt_tokens over the largest bucket: before the warm start trains.
  """
  num_tasks: int = 180
  group_size: int = 8
  max_steps: int = 30
  history_length: int = 2
  # What the rollouts send for an action that parsed but is not admissible
  # (`prompts.INVALID_ACTIONS`); RLConfig.invalid_action should match it.
  invalid_action: str = "no_op"
  annotator: str = "rule"  # "rule" (ground truth) or "teacher"
  # How the rule annotator's skills say where things were (household: a
  # place, or only its kind; `annotators.DETAILS`).
  rule_detail: str = "place"
  # The rule annotator ends a skill with a rule against repeated tries when
  # its episode has one (`annotators.annotate(repeats=True)`).
  rule_repeats: bool = False
  epochs: int = 3
  batch_size: int = 8
  learning_rate: float = 1e-5
  response_len_max: int = 256
  max_prompt_chars: int | None = None
  # The longest analysis prompt in tokens (None: the largest of `buckets`
  # that leaves room for response_len_max); longer ones are cut further.
  max_prompt_tokens: int | None = None
  # The analysis prompt must match RL's (trainer.RLConfig's analysis_mode,
  # max_critical_steps, analysis_max_chars and analysis_max_prompt_tokens).
  # The rule annotator writes no critical-step skills; a teacher can.
  analysis_mode: str = "episode_only"
  max_critical_steps: int = 3
  buckets: tuple[int, ...] = sampler_lib.DEFAULT_BUCKETS
  # Task groups rolled out and annotated at once (None: all). Each finished
  # batch is kept in `workdir/stage1_records`, and a rerun goes on from the
  # first batch not kept: with a teacher, a smaller batch loses less when it
  # goes down. Whatever the batch, the sampler takes at most
  # `rollout.Policy`'s max_rows (256) episodes per call; configs/runs/rl.gin
  # binds 16 (x 8 = 128 episodes, one RL update's).
  tasks_per_batch: int | None = None

  def __post_init__(self):
    if self.annotator not in STAGE1_ANNOTATORS:
      raise ValueError(f"Stage1Config.annotator must be one of "
                       f"{STAGE1_ANNOTATORS}, got {self.annotator!r}")
    annotators.check_detail(self.rule_detail, name="Stage1Config.rule_detail")
    prompts.check_invalid_action(self.invalid_action,
                                 name="Stage1Config.invalid_action")
    if self.rule_detail != "place" and self.annotator != "rule":
      raise ValueError(f"Stage1Config.rule_detail={self.rule_detail!r} is "
                       f"for annotator='rule', not {self.annotator!r}")
    if self.rule_repeats and self.annotator != "rule":
      raise ValueError(f"Stage1Config.rule_repeats is for annotator='rule', "
                       f"not {self.annotator!r}")
    if self.analysis_mode not in skills.MODES:
      raise ValueError(f"Stage1Config.analysis_mode must be one of "
                       f"{skills.MODES}, got {self.analysis_mode!r}")
    for name in ("num_tasks", "group_size", "max_steps", "epochs",
                 "batch_size", "response_len_max"):
      if getattr(self, name) < 1:
        raise ValueError(f"Stage1Config.{name} must be >= 1, got "
                         f"{getattr(self, name)}")
    if not 0 < self.learning_rate < float("inf"):
      raise ValueError("Stage1Config.learning_rate must be positive and "
                       f"finite, got {self.learning_rate}")
    if self.tasks_per_batch is not None and self.tasks_per_batch < 1:
      raise ValueError("Stage1Config.tasks_per_batch must be >= 1 or None "
                       f"(all at once), got {self.tasks_per_batch}")
    # run_stage1 also checks the room the model's context leaves beside
    # response_len_max.
    if (self.max_prompt_tokens is not None
        and self.max_prompt_tokens > max(self.buckets)):
      raise ValueError(
          f"Stage1Config.max_prompt_tokens={self.max_prompt_tokens} exceeds "
          f"the largest bucket ({max(self.buckets)} of buckets="
          f"{tuple(self.buckets)})")


def _shardings(mesh):
  """config -> the RL trainer's param shardings on `mesh` (None: no mesh)."""
  if mesh is None:
    return None
  return lambda config: partitioning.param_shardings(config, mesh)


def place(policy: Policy, mesh) -> Policy:
  """`policy` with its params on `mesh` as the RL trainer shards them
  (already so placed: as they are; None: unchanged)."""
  if mesh is None:
    return policy
  return dataclasses.replace(policy, params=jax.device_put(
      policy.params, _shardings(mesh)(policy.config)))


def _load_folder(folder: epath.Path, mesh=None, **overrides) -> Policy:
  """The policy saved in `folder` (its params on `mesh`, when given);
  `overrides` are ModelConfig fields (the compute dtype) that config.json
  does not keep."""
  tokenizer = hf.load_tokenizer(str(folder))  # first: it fails fast
  config, params = hf.load_pretrained(str(folder), shardings=_shardings(mesh),
                                      **overrides)
  return Policy(config, params, tokenizer)


def _save_folder(policy: Policy, folder: epath.Path) -> None:
  """Writes the policy folder atomically (a temporary folder, then rename).

  The warm-start report goes along as report.json. When another process
  wrote the folder first, its copy is kept.
  """
  tmp = folder.parent / f"{folder.name}.tmp{os.getpid()}"
  if tmp.exists():
    shutil.rmtree(tmp)
  hf.save_pretrained(str(tmp), policy.config, policy.params,
                     tokenizer=policy.tokenizer)
  (tmp / "report.json").write_text(json.dumps(policy.report, default=float))
  try:
    tmp.rename(folder)
  except OSError:
    if not (folder / "config.json").exists():
      raise
    shutil.rmtree(tmp)


def _load_report(folder: epath.Path) -> dict[str, Any]:
  path = folder / "report.json"
  return json.loads(path.read_text()) if path.exists() else {}


# Stage1Config fields that decide how Stage 1 runs, not what it trains:
# a reload does not compare them.
_STAGE1_HOW = ("tasks_per_batch", "buckets")


def _asked(*, source: str, model_dir: str | None, seed: int, env_name: str,
           demo_kwargs: dict[str, Any], stage1: Stage1Config | None
           ) -> dict[str, Any]:
  """What `prepare` is asked to build, as report.json keeps it ("prepared"):
  plain JSON, so that a reload compares it with what is on disk."""
  if source == "hf" and model_dir and "://" not in model_dir:
    model_dir = os.path.abspath(model_dir)
  asked = dict(
      source=source, model_dir=model_dir if source == "hf" else None,
      seed=int(seed), env_name=env_name,
      demo_kwargs=demo_kwargs if source == "demo" else None,
      stage1=None if stage1 is None else {
          k: v for k, v in dataclasses.asdict(stage1).items()
          if k not in _STAGE1_HOW})
  return json.loads(json.dumps(asked, sort_keys=True, default=repr))


def _computed(config: model_lib.ModelConfig) -> dict[str, Any]:
  """How the policy was computed when it was prepared, as report.json keeps
  it ("computed"): the compute dtype, the attention block (None: chosen by
  the backend, `model._query_blocks`) and the backend. Not compared on
  reload: these change the arithmetic, not the model."""
  return dict(dtype=config.dtype, attention_block=config.attention_block,
              backend=jax.default_backend())


def _check_reload(folder: epath.Path, done: dict[str, Any] | None,
                  asked: dict[str, Any]) -> None:
  """Refuses to reload the policy in `folder` when what prepared it (`done`,
  its report's "prepared"; None: a folder written before reports kept it,
  reloaded with a warning) is not what is `asked` now.

  Raises:
    ValueError: naming each setting that differs.
  """
  if done is None:
    logging.warning(
        "%s does not record the source, model_dir, demo_kwargs and stage1 "
        "it was prepared with (an older folder): reloading it as it is; if "
        "they changed since, use another workdir or delete that folder",
        os.fspath(folder))
    return
  diff = [f"{k}={done[k]!r} then, {asked[k]!r} now" for k in sorted(asked)
          if k != "stage1" and k in done and done[k] != asked[k]]
  if "stage1" in done:
    was, now = done["stage1"], asked["stage1"]
    if (was is None) != (now is None):
      diff.append("stage1: not run then, asked now" if was is None
                  else "stage1: run then, None now")
    elif now is not None:
      diff += [f"stage1.{k}={was[k]!r} then, {now[k]!r} now"
               for k in sorted(now) if k in was and was[k] != now[k]]
  if diff:
    raise ValueError(
        f"{os.fspath(folder)} holds a policy prepared with other settings "
        f"({'; '.join(diff)}): use another workdir, or delete "
        f"{os.fspath(folder)} to prepare it again as asked")


@contextlib.contextmanager
def working():
  """Marks an exception raised inside as one of work under way (it gets
  `during_work = True`): entry points show it with its traceback, a bug or a
  fault, where bad input, found before any work starts, is one line."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    e.during_work = True
    raise


def _demo_policy(seed: int, demo_kwargs: dict[str, Any],
                 cache_dir: str | None, **overrides) -> Policy:
  """The demo warm start, or its copy in `cache_dir` made by an earlier run
  with the same seed, arguments and `demo.VERSION` (methods compared on one
  seed share it); `overrides` (ModelConfig fields, the compute dtype) apply
  to either and do not key the cache."""
  from seed_jax import demo  # pylint: disable=g-import-not-at-top
  folder = None
  if cache_dir:
    # Household keys leave `env` out, as they did before Sokoban had a demo.
    keyed = {k: v for k, v in demo_kwargs.items()
             if (k, v) != ("env", "household")}
    key = json.dumps(dict(keyed, seed=seed, version=demo.VERSION),
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    folder = epath.Path(cache_dir) / f"demo_seed{seed}_{digest}"
    if (folder / "config.json").exists():
      logging.info("reusing the warm start in %s", folder)
      policy = _load_folder(folder, **overrides)
      policy.report = _load_report(folder)
      return policy
  with working():
    config, params, tok, report = demo.warm_start(seed=seed, **demo_kwargs)
  policy = Policy(config, params, tok, {"warm_start": report})
  if folder is not None and jax.process_index() == 0:
    folder.parent.mkdir(parents=True, exist_ok=True)
    _save_folder(policy, folder)
  policy.config = policy.config.replace(**overrides)
  return policy


def _check_stage1_env(cfg: Stage1Config, env_name: str) -> None:
  """Raises ValueError when the rule annotator has no rules for `env_name`."""
  if cfg.annotator == "rule":
    annotators.check_env(env_name, "Stage 1 with annotator='rule'")
    annotators.check_detail(cfg.rule_detail, env_name,
                            name="Stage1Config.rule_detail")


def _stage1_dataset(records, data_dir: epath.Path, *, seed: int):
  """Writes Stage 1's records as a dataset (process 0 alone: the workdir is
  shared) and reads its train and validation splits on every process.

  Raises:
    what `stage1.write_dataset` raised, on process 0; on the others, an
    error of the same kind (ValueError, OSError, else RuntimeError) naming
    it: no process waits for a dataset that is not coming.
  """
  # The barrier before anyone reads, passed once the write is done or failed.
  error, failure = distributed.on_writer(lambda: stage1_lib.write_dataset(
      records, data_dir, seed=seed, overwrite=True))
  if error is not None:
    raise error
  if failure is not None:
    kind, message = failure
    raise {"ValueError": ValueError, "OSError": OSError}.get(
        kind, RuntimeError)(f"Stage 1's dataset in {data_dir} was not "
                            f"written on process 0: {message}")
  return (stage1_lib.read_dataset(data_dir, "train"),
          stage1_lib.read_dataset(data_dir, "validation"))  # may be empty


def run_stage1(policy: Policy, cfg: Stage1Config, workdir: epath.Path, *,
               env_name: str, max_new_tokens: int, seed: int = 0,
               teacher=None, mesh=None) -> Policy:
  """Stage 1 on the policy's own rollouts; returns the fine-tuned policy.

  The annotated batches are kept in `workdir/stage1_records` as they finish
  (`stage1.collect_records`' journal): a rerun after a teacher outage or a
  crash reads them back and rolls out and annotates only the rest.

  With `mesh` (a (data, fsdp, tensor) mesh of this one process's devices),
  the params are placed on it as the RL trainer shards them before the
  rollouts, SFT's train state is sharded there too (`sft.sft`), and the
  returned params stay on it. Without, everything runs on one device, as
  each process does when there are several.

  Raises:
    stage1.CollectionInterrupted: the teacher went down, or refused a
      whole batch; the batches annotated before are kept.
    ValueError: before any rollout, for annotator="rule" on a game without
      rules (see `annotators.ENVS`), a teacher missing or bound unlike
      `cfg`, a `cfg.batch_size` that does not split over `mesh`'s
      data x fsdp devices, or a `workdir/stage1_records` kept with other
      settings (the teacher's model, max_tokens and temperature among
      them); after the collection, when no record parsed (naming its
      counts).
  """
  _check_stage1_env(cfg, env_name)
  if mesh is not None:
    sft_lib.check_mesh_batch(mesh, cfg.batch_size)
    policy = place(policy, mesh)
  t0 = time.time()
  rl_policy = rollout_lib.Policy(policy.config, policy.tokenizer,
                                 max_new_tokens=max_new_tokens, min_rows=8,
                                 buckets=cfg.buckets)
  gen = lambda p, r: rl_policy.generate(policy.params, p, r,
                                        sampler_lib.Temperature(1.0))
  annotator = (functools.partial(annotators.annotate, detail=cfg.rule_detail,
                                 repeats=cfg.rule_repeats)
               if cfg.annotator == "rule" else teacher)
  if annotator is None:
    raise ValueError("Stage 1 with annotator='teacher' needs a teacher")
  if cfg.annotator != "rule" and (
      teacher.mode != cfg.analysis_mode or (
          cfg.analysis_mode == "episode_step"
          and teacher.max_critical_steps != cfg.max_critical_steps)):
    # The records' prompts ask for what Stage1Config says; the replies must
    # be parsed for the same.
    raise ValueError(
        f"the teacher analyzes in mode {teacher.mode!r} with "
        f"max_critical_steps={teacher.max_critical_steps}, Stage 1 in mode "
        f"{cfg.analysis_mode!r} with max_critical_steps="
        f"{cfg.max_critical_steps}; bind them alike")
  # The buckets SFT can train on (a clear error when none fits).
  room = rollout_lib.Policy(policy.config, policy.tokenizer,
                            max_new_tokens=cfg.response_len_max,
                            buckets=cfg.buckets, stop_strings=()).buckets
  max_tokens = cfg.max_prompt_tokens or max(room)
  if max_tokens > max(room):
    raise ValueError(f"Stage1Config.max_prompt_tokens={max_tokens} exceeds "
                     f"the largest bucket SFT can train on ({max(room)})")
  journal = workdir / "stage1_records"
  # What a rerun's teacher must share with the one that annotated the kept
  # batches; not its endpoint, which may move after an outage.
  asks = {f"teacher_{name}": None if cfg.annotator == "rule" else getattr(
      teacher, name, None) for name in ("model", "max_tokens", "temperature")}
  records, stats = stage1_lib.collect_records(
      gen, env_name, num_tasks=cfg.num_tasks, group_size=cfg.group_size,
      max_steps=cfg.max_steps, annotator=annotator,
      rng=jax.random.key(seed + 1), history_length=cfg.history_length,
      mode=cfg.analysis_mode, max_critical_steps=cfg.max_critical_steps,
      max_prompt_chars=cfg.max_prompt_chars, encode=rl_policy.encode,
      max_prompt_tokens=max_tokens, tasks_per_batch=cfg.tasks_per_batch,
      journal=journal, journal_meta=dict(
          asks, annotator=cfg.annotator, max_new_tokens=max_new_tokens),
      invalid_action=cfg.invalid_action)
  if not records:
    raise ValueError(
        f"Stage 1 collected no parseable records ({stats}); its annotated "
        f"batches are kept in {journal}: fix the annotator, then move that "
        "folder away to collect afresh")
  train, val = _stage1_dataset(records, workdir / "stage1_data", seed=seed)
  print(f"stage 1: {len(train)} train / {len(val)} validation records "
        f"({stats}) in {time.time() - t0:.0f}s", flush=True)
  with working():
    params, report = sft_lib.sft(
        policy.params, policy.config, policy.tokenizer, train, val,
        learning_rate=cfg.learning_rate, rng=jax.random.key(seed + 2),
        epochs=cfg.epochs, batch_size=cfg.batch_size, buckets=cfg.buckets,
        response_len_max=cfg.response_len_max, mesh=mesh)
  print(f"stage 1 SFT: {report} ({time.time() - t0:.0f}s)", flush=True)
  # What RL's self-analysis must ask for byte for byte, and the longest
  # analysis trained on, which RL's token budget should reach (RLTrainer
  # checks both).
  report = dict(report, collection=stats, analysis_prompt=dict(
      mode=cfg.analysis_mode, max_critical_steps=cfg.max_critical_steps,
      max_chars=cfg.max_prompt_chars, max_tokens=max_tokens),
                response_len_max=cfg.response_len_max,
                invalid_action=cfg.invalid_action)
  return Policy(policy.config, params, policy.tokenizer,
                dict(policy.report, stage1=report))


def prepare(workdir, *, seed: int = 0, source: str = "demo",
            model_dir: str | None = None, dtype: str | None = None,
            attention_block: int | None = None,
            stage1: Stage1Config | None = None, env_name: str = "household",
            max_new_tokens: int = 64, demo_kwargs: dict | None = None,
            cache_dir: str | None = None, teacher=None,
            mesh: jax.sharding.Mesh | None = None) -> Policy:
  """Builds, or reloads from `workdir/policy`, the policy RL starts from.

  Args:
    workdir: the run's directory.
    seed: seeds the warm start and Stage 1.
    source: "demo" (a small decoder trained from scratch here), "hf" (the
      Hugging Face folder `model_dir`) or "gguf" (SmolLM2-135M-Instruct).
    model_dir: the folder for source="hf".
    dtype: compute dtype override (e.g. "bfloat16"), for every source and
      for the policy reloaded from `workdir/policy` or `cache_dir`.
    attention_block: queries per attention block outside the decode loop
      (`ModelConfig.attention_block`), applied alike; None: 64 on CPU, 256
      on accelerators.
    stage1: run Stage 1 before RL (None: skip it, "SEED without Stage 1").
    env_name: the environment of Stage 1's rollouts.
    max_new_tokens: the per-turn response budget of Stage-1 rollouts.
    demo_kwargs: arguments of `demo.warm_start`; its `env` is `env_name`.
    cache_dir: a folder where demo warm starts are kept, keyed by seed,
      `demo_kwargs` and `demo.VERSION`, so that runs comparing methods on one
      seed train it once.
    teacher: an OpenAI-compatible teacher for Stage 1 with annotator="teacher".
    mesh: the training mesh, for one process only (`train` passes it then):
      the returned params are placed on it as the RL trainer shards them
      (a Hugging Face folder loads straight into its shards), and Stage 1
      runs there (`run_stage1`). None: one device; with several processes,
      each runs Stage 1 on its own first device.

  Raises:
    ValueError: an unknown source, a demo warm start for another game than
      `env_name` or for one without demonstrations, or (before the warm
      start) Stage 1 with annotator="rule" on a game without annotation
      rules or with a batch_size that does not split over `mesh`, or a mesh
      with several processes; a tokenizer that does not load or does not
      fit the model (before the weights load); a `workdir/policy` prepared
      with another source, model_dir (source="hf"), seed, env_name,
      demo_kwargs (source="demo") or Stage 1 (run or not, and its settings
      but tasks_per_batch and buckets), as its report.json records them,
      before it loads (a folder whose report records none is reloaded,
      with a warning).
    FileNotFoundError: a model folder without config.json, weights or
      tokenizer files.
  """
  if source not in SOURCES:
    raise ValueError(f"unknown policy source {source!r}; known: {SOURCES}")
  if mesh is not None and jax.process_count() > 1:
    raise ValueError("policies.prepare shards over a mesh of one process's "
                     f"devices, not {jax.process_count()} processes'; pass "
                     "no mesh (each process runs Stage 1 on one device)")
  if stage1 is not None:  # before the warm start trains
    _check_stage1_env(stage1, env_name)
  demo_kwargs = dict(demo_kwargs or {})
  if source == "demo" and demo_kwargs.setdefault("env", env_name) != env_name:
    raise ValueError(f"demo_kwargs env {demo_kwargs['env']!r} is not the "
                     f"run's env_name {env_name!r}")
  workdir = epath.Path(workdir)
  folder = workdir / "policy"
  # How to compute is no part of config.json: a reload needs it too.
  overrides = {"dtype": dtype} if dtype else {}
  if attention_block is not None:
    overrides["attention_block"] = attention_block
  asked = _asked(source=source, model_dir=model_dir, seed=seed,
                 env_name=env_name, demo_kwargs=demo_kwargs, stage1=stage1)
  if (folder / "config.json").exists():
    report = _load_report(folder)
    _check_reload(folder, report.get("prepared"), asked)  # before any load
    logging.info("reloading the prepared policy from %s", folder)
    policy = _load_folder(folder, mesh, **overrides)
    policy.report = report
    return policy
  if stage1 is not None and mesh is not None:  # a Stage 1 still to run
    sft_lib.check_mesh_batch(mesh, stage1.batch_size)
  if source == "demo":
    policy = _demo_policy(seed, demo_kwargs, cache_dir, **overrides)
  elif source == "hf":
    if not model_dir:
      raise ValueError("source='hf' needs model_dir (a Hugging Face folder)")
    # The tokenizer and the config before the weights: a bad one is found
    # without loading a big model first.
    tokenizer = hf.load_tokenizer(model_dir)
    hf.check_vocab(tokenizer, hf.load_config(model_dir, **overrides))
    config, params = hf.load_pretrained(model_dir, shardings=_shardings(mesh),
                                        **overrides)
    policy = Policy(config, params, tokenizer)
  else:
    tokenizer = hf.load_tokenizer()
    config, params = hf.load_gguf(**overrides)
    policy = Policy(config, params, tokenizer)
  hf.check_vocab(policy.tokenizer, policy.config)
  policy = place(policy, mesh)
  if stage1 is None and source != "demo":
    return policy  # nothing to cache: the source itself reloads
  if stage1 is not None:
    policy = run_stage1(policy, stage1, workdir, env_name=env_name,
                        max_new_tokens=max_new_tokens, seed=seed,
                        teacher=teacher, mesh=mesh)
  # What a resume compares with what it is asked (`_check_reload`), and how
  # it was computed (warm start, Stage 1), which a reload may change.
  policy.report = dict(policy.report, prepared=asked,
                       computed=_computed(policy.config))
  if jax.process_index() == 0:
    _save_folder(policy, folder)  # the weights gathered to the host
  return policy
