r"""Entry point: SEED / GRPO training configured with gin.

  python -m seed_jax.train                       # configs/experiments/demo.gin
  python -m seed_jax.train --gin_file=configs/experiments/smollm2.gin \
      --gin.WORKDIR="'runs/grpo'" --gin.trainer.RLConfig.variant="'grpo'"

`main` parses flags, reads gin and calls `train`; everything else is library
code. The run is resumable: started again with the same workdir, it continues
from the last complete checkpoint.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import functools
import inspect
import logging
import numbers
import os
import sys
import time
import tokenize
from typing import Any, Callable, Sequence

from etils import epath
import gin
import jax

from seed_jax import atomic
from seed_jax import checkpoints
from seed_jax import distributed
from seed_jax import evaluate as evaluate_lib
from seed_jax import faults
from seed_jax import gin_flags
from seed_jax import hf
from seed_jax import metrics as metrics_lib
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import policies
from seed_jax import rl_checks
from seed_jax import teacher as teacher_lib
from seed_jax import train_step as ts
from seed_jax import trainer as trainer_lib

DEFAULT_GIN = "configs/experiments/demo.gin"


class KnobError(ValueError):
  """A `train` argument out of its range (the command line says it plainly)."""


class NonFiniteError(RuntimeError):
  """Too many consecutive updates with a non-finite loss or gradient."""


# What a refused start raises (bad settings, a workdir that cannot be written
# or lacks room, a model folder without config.json, checkpoints of another
# model or none that restores): `main` says it in one line, unless it was
# raised by work under way (`policies.working`: the warm start, Stage 1, RL).
START_ERRORS = (ValueError, OSError, checkpoints.CorruptCheckpointError,
                checkpoints.RestoreError)


def _check_knobs(**knobs: int) -> None:
  """Counts `train` needs before any work: a KnobError naming the bad one."""
  least = dict(num_updates=0, checkpoint_every=1, max_to_keep=1, keep_every=0,
               eval_every=0, eval_tasks=1, max_consecutive_nonfinite=1)
  if not knobs.get("eval_every"):  # no evaluation: eval_tasks is unused
    knobs.pop("eval_tasks", None)
  for name, value in knobs.items():
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise KnobError(f"train.{name}={value!r} must be an integer")
    if value < least[name]:
      raise KnobError(f"train.{name}={value} must be at least {least[name]}")


def _mesh_kwargs(policy_fn: Callable[..., Any], mesh) -> dict[str, Any]:
  """{"mesh": mesh} for a `policy_fn` that takes a `mesh` parameter (gin's
  configurable keeps the signature), when there is a mesh and one process;
  else {} (several processes run Stage 1 each on one device, as before).

  Only a parameter named `mesh` opts in: a `**kwargs` may pass it on to what
  does not take it (`testing.tiny_policy`'s go to the model config).
  """
  if mesh is None or jax.process_count() > 1:
    return {}
  try:
    param = inspect.signature(policy_fn).parameters.get("mesh")
  except (TypeError, ValueError):  # no signature to read
    return {}
  keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)
  return {"mesh": mesh} if param is not None and param.kind in keyword else {}


def _prepare_kwargs(policy_fn: Callable[..., Any]) -> dict[str, Any] | None:
  """The arguments `policies.prepare` runs with as `policy_fn`: itself, a
  `functools.partial` of it, or gin's configurable of it unscoped (as
  configs/runs/rl.gin binds it); only `source`, `model_dir` and
  `demo_kwargs`, defaults filled in. None for any other `policy_fn`."""
  keywords = {}
  fn = policy_fn
  while isinstance(fn, functools.partial):
    keywords = {**fn.keywords, **keywords}
    fn = fn.func
  names = ("source", "model_dir", "demo_kwargs")
  if fn is policies.prepare:
    bound = {}
  else:
    try:
      configurable = gin.get_configurable(policies.prepare)
    except ValueError:  # not registered with gin
      return None
    if fn is not configurable:
      return None
    # Only these references are resolved (a deep copy evaluates them), not
    # `stage1` or `teacher` ones, which would construct objects.
    raw = gin.get_bindings(policies.prepare, resolve_references=False)
    bound = copy.deepcopy({k: v for k, v in raw.items() if k in names})
  params = inspect.signature(policies.prepare).parameters
  out = {k: params[k].default for k in names}
  out.update({k: v for k, v in {**bound, **keywords}.items() if k in names})
  return out


def _model_folder(kwargs: dict[str, Any], workdir) -> str | None:
  """The folder whose config.json describes the model `policies.prepare`
  with `kwargs` will build: the policy already prepared in `workdir/policy`
  (a restart), else the Hugging Face `model_dir`; None for the others."""
  prepared = epath.Path(workdir) / "policy"
  if (prepared / "config.json").exists():
    return str(prepared)
  return kwargs["model_dir"] if kwargs["source"] == "hf" else None


def known_config(policy_fn: Callable[..., Any],
                 workdir) -> model_lib.ModelConfig | None:
  """The `ModelConfig` of the model `policy_fn` will build, where a folder's
  config.json holds it before it is built (see `_model_folder`). None for
  any other `policy_fn` or source (the demo's vocabulary is learned by its
  warm start; a gguf file is downloaded by the `policy_fn`), or a
  config.json that does not read (`policy_fn` then says why)."""
  kwargs = _prepare_kwargs(policy_fn)
  folder = None if kwargs is None else _model_folder(kwargs, workdir)
  if not folder:
    return None
  try:
    return hf.load_config(folder)
  except (OSError, ValueError):
    return None


def known_context(policy_fn: Callable[..., Any], workdir) -> int | None:
  """The context (positions) of the model `policy_fn` will build, where it is
  known before it is built: `known_config`'s, else `policies.prepare`'s
  demo model's (`demo_kwargs["model"]`). None for any other `policy_fn` or
  source, or a folder whose config.json does not read (`policy_fn` then
  says why)."""
  kwargs = _prepare_kwargs(policy_fn)
  if kwargs is None:
    return None
  if _model_folder(kwargs, workdir):
    config = known_config(policy_fn, workdir)
    return None if config is None else config.max_position_embeddings
  if kwargs["source"] != "demo":
    return None  # gguf: in the file, downloaded by the policy_fn
  from seed_jax import demo  # pylint: disable=g-import-not-at-top
  model = dict((kwargs["demo_kwargs"] or {}).get("model") or {})
  default = inspect.signature(demo.demo_model_config).parameters[
      "max_position_embeddings"].default
  return model.get("max_position_embeddings", default)


def train(workdir: str, *,
          policy_fn: Callable[..., policies.Policy],
          rl: trainer_lib.RLConfig,
          env_name: str = "household",
          env_kwargs: dict[str, Any] | None = None,
          num_updates: int = 10,
          learning_rate: float = 1e-6,
          weight_decay: float = 0.01,
          grad_clip: float = 1.0,
          warmup_steps: int = 0,
          seed: int = 0,
          policy_seed: int | None = None,
          eval_every: int = 5,
          eval_tasks: int = 32,
          eval_temperature: float = 0.4,
          checkpoint_every: int = 1,
          max_to_keep: int = 2,
          keep_every: int = 0,
          checkpoint_checksums: bool = True,
          max_consecutive_nonfinite: int = 3,
          min_free_bytes: int = 1 << 30,
          mesh_shape: tuple[int, int, int] | None = None,
          rollout_chunks: int | None = None,
          teacher=None) -> dict[str, float]:
  """Prepares the policy (warm start, Stage 1 as configured), then runs RL.

  Args:
    workdir: where config.gin, the policy folder, checkpoints, metrics,
      TensorBoard events and the learning curve go.
    policy_fn: `policy_fn(workdir, seed=) -> policies.Policy`; builds (or
      reloads from `workdir/policy`) the Stage-1 policy, which is also the
      KL reference. One with a `mesh` parameter (`policies.prepare`) is
      also given the training mesh, when there is one and one process, and
      runs Stage 1 sharded on it.
    rl: the update's knobs.
    env_name, env_kwargs: the training environment.
    num_updates: RL updates to run in total (resumed runs count from the
      checkpoint).
    learning_rate, weight_decay, grad_clip, warmup_steps: AdamW.
    seed: the run's seed (rollout tasks and sampling derive from it).
    policy_seed: the seed given to `policy_fn` (the warm start and Stage 1);
      None: `seed`. Runs that differ in `seed` alone and share a
      `policy_seed` train RL with other tasks and samples from the same
      policy, which tells RL's own spread from the warm starts'.
    eval_every: evaluate every this many updates (and at the end).
    eval_tasks: tasks per split per evaluation.
    eval_temperature: sampling temperature of evaluations (no skills).
    checkpoint_every: save every this many updates (and at the end).
    max_to_keep: checkpoints kept.
    keep_every: also keep every saved update that is a multiple of this
      (e.g. `eval_every`, so that `seed_jax.evaluate` can score the evaluated
      updates again on more tasks); 0: only the latest `max_to_keep`.
    checkpoint_checksums: each checkpoint's manifest records a CRC-32 of
      every file (process 0 reads the files back after a save); False:
      sizes only, for large models on slow storage.
    max_consecutive_nonfinite: stop after this many skipped updates in a row.
    min_free_bytes: refuse to start with less free space in the workdir
      (as any process sees it: then every process refuses, naming it).
      Once the model is known (before the first update), the run also
      checks for room for the checkpoints it will write: `max_to_keep` + 1
      copies (one is written before the oldest goes) of the train state and
      the reference, plus those `keep_every` keeps, less the checkpoints
      already there.
    mesh_shape: (data, fsdp, tensor) sizes of the training mesh over every
      process's devices (one size may be -1); None: one device. With one
      process, Stage 1 shards over it too (see `policy_fn`); with several,
      each runs Stage 1 on its own first device.
    rollout_chunks: independent rollout chunks per update, split across
      processes (default: the process count).
    teacher: an OpenAI-compatible teacher for analyzer="external".

  Returns:
    The final evaluation metrics.

  Raises:
    KnobError: a count above out of its range (before any work).
    ValueError: a mesh that does not fit the devices or the batch, several
      processes without one, an analyzer the trainer refuses (an
      external one without a teacher, say), or prompt budgets that do not
      fit the model's context, or parameters the mesh cannot shard
      (`partitioning.param_shardings`), where the model is known before it
      is built (`known_context`, `known_config`), before any work.
    ValueError, OSError, checkpoints.CorruptCheckpointError: a refused start
      (see START_ERRORS; a checkpoint past `num_updates`, or written with
      another `seed`, too), before
      config.gin is written, so that a resume refused leaves the run's
      settings as they were.
    NonFiniteError: `max_consecutive_nonfinite` skipped updates in a row.
  """
  _check_knobs(num_updates=num_updates, checkpoint_every=checkpoint_every,
               max_to_keep=max_to_keep, keep_every=keep_every,
               eval_every=eval_every, eval_tasks=eval_tasks,
               max_consecutive_nonfinite=max_consecutive_nonfinite)
  # The layout, prompt budgets and parameter shardings RLTrainer will use,
  # checked before the minutes of the warm start and Stage 1.
  mesh = partitioning.make_mesh(mesh_shape) if mesh_shape else None
  rl_checks.check_layout(rl, mesh, rollout_chunks)
  rl_checks.check_analyzer(rl, env_name, teacher)
  context = known_context(policy_fn, workdir)
  if context is not None:  # else RLTrainer checks, once the model is built
    rl_checks.check_prompt_budgets(rl, context)
  model_config = known_config(policy_fn, workdir)
  if mesh is not None and model_config is not None:  # else RLTrainer checks
    partitioning.param_shardings(model_config, mesh)  # shapes only
  if mesh is None and jax.device_count() > 1:
    logging.warning("%d devices and no train.train.mesh_shape: training uses "
                    "one of them; set mesh_shape, e.g. (1, -1, 1), to use "
                    "them all", jax.device_count())
  if "://" not in str(workdir):  # orbax needs absolute local paths
    workdir = os.path.abspath(workdir)
  workdir = epath.Path(workdir)
  # Before any expensive work; every process refuses the start together.
  check_on_every_process(lambda: (
      checkpoints.check_writable(workdir),
      checkpoints.check_free_space(workdir, min_free_bytes)))
  is_writer = jax.process_index() == 0
  if policy_seed is None:
    policy_seed = seed
  policy = policy_fn(workdir, seed=policy_seed,
                     **_mesh_kwargs(policy_fn, mesh))
  config, tokenizer = policy.config, policy.tokenizer
  ckpt = checkpoints.Checkpointer(workdir, model_config=config,
                                  max_to_keep=max_to_keep,
                                  keep_every=keep_every,
                                  save_interval=checkpoint_every,
                                  checksums=checkpoint_checksums)
  # Closed however the start or the run ends: pending saves finish and the
  # manager is released, a refused start's too.
  with ckpt:
    tx = ts.make_optimizer(learning_rate, weight_decay=weight_decay,
                           grad_clip=grad_clip, warmup_steps=warmup_steps)
    rl_trainer = trainer_lib.RLTrainer(
        config, tokenizer, rl, env_name=env_name, tx=tx, mesh=mesh,
        rollout_chunks=rollout_chunks, env_kwargs=env_kwargs, teacher=teacher)
    rl_trainer.check_stage1((getattr(policy, "report", None) or {}).get(
        "stage1"))
    history = metrics_lib.MetricHistory()
    base_rng = jax.random.key(seed)
    abstract_state = rl_trainer.abstract_state()
    abstract_params = rl_trainer.abstract_params()
    restored = ckpt.restore_latest(abstract_state, abstract_params)
    if restored is None:
      # Both are copies on the mesh: the state's buffers are donated each step.
      reference = rl_trainer.place_params(policy.params)
      state = rl_trainer.create_state(policy.params)
      start = nonfinite_run = 0
    else:
      state, reference = restored.state, restored.reference
      history = metrics_lib.MetricHistory.from_json(
          restored.host.get("history"))
      start = restored.step
      # Updates skipped in a row up to it (the final update is saved even
      # when skipped): a run extended from there stops where an
      # uninterrupted one would. Older checkpoints have none: 0.
      nonfinite_run = int(restored.host.get("nonfinite_run", 0))
      if start > num_updates:  # else nothing runs, and `start`'s is returned
        raise ValueError(
            f"workdir {workdir} holds a checkpoint of update {start}, past "
            f"train.num_updates={num_updates}; ask for at least {start} "
            "updates, or start in another workdir")
      _check_seed(restored.rng, base_rng, start, seed, workdir)
      logging.info("resumed from update %d in %s", start, workdir)
      print(f"resumed from update {start}", flush=True)
    # Its params are now copied into the state and the reference, or not
    # needed (restored): not a third copy held on the devices for the run.
    del policy
    one_checkpoint = (checkpoints.tree_bytes(abstract_state)
                      + checkpoints.tree_bytes(abstract_params))
    kept = num_updates // keep_every if keep_every else 0
    to_write = max(1, max_to_keep + 1 + kept - len(ckpt.all_steps()))
    check_on_every_process(lambda: checkpoints.check_free_space(
        workdir, one_checkpoint * to_write))
    # The start is sound: only now are these the run's settings (`evaluate`
    # reads them) and its TensorBoard events and metrics.jsonl rewritten.
    if is_writer:
      write_config(workdir / "config.gin", gin.config_str())
      moved = metrics_lib.set_aside_events(workdir)
      if moved is not None:
        logging.info("earlier TensorBoard events moved to %s; the %d restored "
                     "updates are written again", moved, len(history))
      metrics_lib.write_events(workdir, history)
      _restart_jsonl(workdir / "metrics.jsonl", history, aside=moved)
    writer = metrics_lib.make_writer(workdir)
    with policies.working():
      eval_policy = rl_trainer.policy

      def run_eval(update):
        return evaluate_lib.score(
            eval_policy, rl_trainer.local_params(state.params),
            env_name=env_name, num_tasks=eval_tasks, max_steps=rl.max_steps,
            history_length=rl.history_length, temperature=eval_temperature,
            invalid_action=rl.invalid_action,
            rng=jax.random.fold_in(base_rng,
                                   evaluate_lib.EVAL_RNG_OFFSET + update),
            env_kwargs=env_kwargs)

      if start == 0 and eval_every:
        first = run_eval(0)
        history.append(0, first)
        writer.write_scalars(0, first)
        print(f"update 0 | eval seen {first['eval/seen/success']:.3f} | "
              f"unseen {first['eval/unseen/success']:.3f}", flush=True)

      for update in range(start, num_updates):
        rng = jax.random.fold_in(base_rng, update)
        t = time.time()
        state, scalars = rl_trainer.update(state, reference, rng,
                                           update_index=update)
        scalars["time/update"] = time.time() - t
        done = update + 1
        if scalars.get("skipped", 0) > 0:
          nonfinite_run += 1
          logging.warning("update %d: %d non-finite step(s) skipped", done,
                          int(scalars["skipped"]))
          if nonfinite_run >= max_consecutive_nonfinite:
            raise NonFiniteError(
                f"{nonfinite_run} consecutive updates had non-finite losses "
                f"or gradients; stopped at update {done} without saving it. "
                f"The last good checkpoint in {workdir} is intact.")
        else:
          nonfinite_run = 0
        if eval_every and (done % eval_every == 0 or done == num_updates):
          scalars.update(run_eval(done))
        history.append(done, scalars)
        writer.write_scalars(done, scalars)
        print(metrics_lib.format_progress(done, scalars), flush=True)
        # After skipped (non-finite) steps no checkpoint is taken, so that a
        # resume retries from the last clean update; except the final one, whose
        # state (skipped steps leave it as it was) is the one just reported.
        if nonfinite_run == 0 or done == num_updates:
          ckpt.save(done, state, reference=reference, rng=rng,
                    host={"history": history.to_json(),
                          "nonfinite_run": nonfinite_run},
                    force=done == num_updates)
          faults.maybe_crash("checkpoint", update)
        if is_writer and done < num_updates:
          # Progress survives a crash; the final update is written after the
          # last checkpoint is complete (`experiments` reads it as "done").
          history.write_jsonl(workdir / "metrics.jsonl")
      ckpt.close()
      writer.flush()
      final = history.to_json()[-1] if len(history) else {}
      if is_writer:
        history.write_jsonl(workdir / "metrics.jsonl")
        metrics_lib.plot_learning_curve(history, workdir / "learning_curve.png")
        first = history.to_json()[0] if len(history) else {}
        print("\n" + metrics_lib.success_table(first, final), flush=True)
      return {k: v for k, v in final.items() if k.startswith("eval/")}


def check_on_every_process(check: Callable[[], Any]) -> None:
  """Runs a start-up `check` of the workdir on every process; when it raised
  OSError on any of them, every process raises one, naming those processes.

  A collective: every process calls it, in the same order. A process that
  refused the start alone would leave the others waiting for it in their
  next collective. Each process checks for itself, since each writes its
  own shards of every checkpoint into the workdir (one folder that all
  hosts must see): a host short of room, or that sees another disk, is
  named. On one process, `check`'s own error is raised as it is.

  Raises:
    OSError: with the errno of the first process that refused (ENOSPC for
      too little room), "process 1: why; processes 2, 3: why".
  """
  try:
    check()
    mine = None
  except OSError as e:
    mine = e
  if jax.process_count() == 1:
    if mine is not None:
      raise mine
    return
  verdicts = distributed.allgather_objects(
      None if mine is None else (mine.errno, mine.strerror or str(mine)))
  refused = [v for v in verdicts if v is not None]
  if not refused:
    return
  text = distributed.by_process([v and v[1] for v in verdicts])
  code = refused[0][0]
  raise (OSError(code, text) if code is not None else OSError(text)) from mine


def _check_seed(saved_rng: jax.Array | None, base_rng: jax.Array, step: int,
                seed: int, workdir: epath.Path) -> None:
  """Checks that the checkpoint of update `step` was written with this
  run's `seed`: its rng is `fold_in(key(seed), step - 1)`, the last update's.
  A checkpoint without an rng (an older one) passes.

  Each process reads the same checkpoint and seed, so all refuse together.

  Raises:
    ValueError: the rng differs, naming the workdir and the update.
  """
  if saved_rng is None:
    return
  want = jax.random.key_data(jax.random.fold_in(base_rng, step - 1))
  got = (jax.random.key_data(saved_rng)
         if jax.dtypes.issubdtype(saved_rng.dtype, jax.dtypes.prng_key)
         else saved_rng)
  if not bool(jax.numpy.array_equal(got, want)):
    raise ValueError(
        f"workdir {workdir} holds a checkpoint of update {step} written with "
        f"another train.train.seed than this run's {seed}; resume with the "
        "run's seed (see its config.gin), or start in another workdir")


def _restart_jsonl(path: epath.Path, history: metrics_lib.MetricHistory, *,
                  aside: epath.Path | None) -> None:
  """Rewrites a (re)start's metrics.jsonl from its restored `history`.

  An earlier start lists every update it finished, also those after its
  last checkpoint (`checkpoint_every` > 1, skipped non-finite steps, a
  checkpoint that failed its check), which this start runs again; its file
  is kept in `aside` (where its TensorBoard events went), when there is one.
  A restored history ends at a complete checkpoint, so its last line may be
  the final update's (which `experiments` reads as "done").
  """
  if aside is not None and path.exists():
    atomic.write_text(aside / path.name, path.read_text())
  history.write_jsonl(path)


def write_config(path: epath.Path, text: str) -> None:
  """Writes the run's config.gin whole (a temporary file, then a rename);
  a resume with other settings than the run's last start is warned about,
  line by line, since `evaluate` reads the settings from this file."""
  if path.exists():
    old = path.read_text()
    if old != text:
      diff = [line for line in difflib.unified_diff(
          old.splitlines(), text.splitlines(), lineterm="", n=0)
              if line[:1] in "+-" and line[:3] not in ("+++", "---")]
      logging.warning("%s: this start's settings differ from the last "
                      "one's:\n%s", path, "\n".join(diff[:40]))
  atomic.write_text(path, text)


def parse_flags(argv):
  parser = argparse.ArgumentParser(description="SEED / GRPO training.")
  parser.add_argument("--gin_file", action="append", default=None,
                      help=f"gin config file(s); default {DEFAULT_GIN}")
  parser.add_argument("--gin", action="append", default=[],
                      metavar="BINDING", help="a gin binding, e.g. "
                      "--gin.trainer.RLConfig.variant=\"'grpo'\"")
  # Both spellings, --gin.NAME=VALUE and --gin NAME=VALUE, in their order.
  known, rest = parser.parse_known_args(gin_flags.in_order(argv))
  for arg in rest:
    parser.error(f"unrecognized argument "
               f"{gin_flags.as_written(arg, argv)!r}")
  return known


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Macros the code reads itself (train.main), not through a `%NAME` in a file.
CODE_MACROS = ("WORKDIR",)


def find_gin_file(path: str) -> str:
  """`path` as given, else under the source checkout (configs/...).

  Raises:
    FileNotFoundError: naming the file and where it was looked for.
  """
  for candidate in (path, os.path.join(ROOT, path)):
    if os.path.isfile(candidate):
      return os.path.abspath(candidate)
  raise FileNotFoundError(f"gin file {path!r} not found (looked in the "
                          f"current directory and in {ROOT})")


class _GinPathProbes(logging.Filter):
  """Drops gin's notes on the places it tries an include in before the one
  that holds it (one a 'Path not found' error)."""

  def filter(self, record):
    return not str(record.msg).startswith(("Path not found",
                                           "system_path_file_exists"))


def _guard_gin_readers() -> None:
  """Makes gin's file-existence checks return False instead of raising.

  Besides plain files, gin asks a package-resource reader about every place
  it tries for an include. With this checkout on sys.path and another working
  directory, `configs` is a namespace package without a file, and that reader
  raises TypeError before gin gets to the search path that holds the file.
  """
  readers = gin.config._FILE_READERS  # pylint: disable=protected-access
  for i, (reader, exists) in enumerate(readers):
    if getattr(exists, "guarded", False):
      continue

    def guarded(path, exists=exists):
      try:
        return exists(path)
      except TypeError:
        return False

    guarded.guarded = True
    readers[i] = (reader, guarded)


def parse_gin(files: Sequence[str] | None, bindings: Sequence[str], *,
              finalize: bool = False) -> None:
  """Parses gin files (default DEFAULT_GIN) and bindings, strictly.

  Raises:
    FileNotFoundError: a gin file that does not exist.
    ValueError: a binding of a macro that nothing uses (a misspelled
      `--gin.VARIENT='grpo'` would otherwise be ignored), with close names;
      a value gin cannot parse (most often a string without its quotes).
  """
  files = [find_gin_file(f) for f in files or [DEFAULT_GIN]]
  gin.add_config_file_search_path(ROOT)  # includes: configs/runs/...
  _guard_gin_readers()
  probes = _GinPathProbes()
  logging.getLogger().addFilter(probes)
  try:
    gin.parse_config_files_and_bindings(files, bindings,
                                        finalize_config=finalize)
  except (SyntaxError, tokenize.TokenError) as e:
    raise ValueError(_unparsable(e)) from None
  finally:
    logging.getLogger().removeFilter(probes)
  _check_macros(bindings)


def _unparsable(e: Exception) -> str:
  """A plain message for gin's SyntaxError or TokenError."""
  if isinstance(e, tokenize.TokenError):  # gin does not say where
    return ("gin cannot parse the gin files or bindings: a bracket or quote "
            f"is not closed ({e.args[0]})")
  text = (getattr(e, "text", None) or "").strip()
  why = str(e).strip().splitlines()[-1].strip() if str(e).strip() else ""
  if getattr(e, "filename", None):
    return f"gin cannot parse {text!r} in {e.filename}: {why}"
  return (f"gin cannot parse {text!r}: {why}; values are Python literals or "
          "gin references, so a string needs its own quotes, e.g. "
          "--gin.VARIANT=\"'grpo'\"")


def _check_macros(bindings: Sequence[str]) -> None:
  # gin keeps macros as bindings of NAME/gin.macro and each `%NAME` as a
  # reference to that selector; there is no public listing of either.
  config = gin.config._CONFIG  # pylint: disable=protected-access
  defined = {scope for scope, selector in config if selector == "gin.macro"}
  used = set(CODE_MACROS)

  def walk(value):
    if isinstance(value, gin.config.ConfigurableReference):
      name, _, selector = value.scoped_selector.rpartition("/")
      if selector == "gin.macro":
        used.add(name)
    elif isinstance(value, (list, tuple, set)):
      for v in value:
        walk(v)
    elif isinstance(value, dict):
      for v in value.values():
        walk(v)

  for params in config.values():
    walk(params)
  for binding in bindings:
    name = binding.split("=", 1)[0].strip()
    if "." in name or "/" in name or name in used:
      continue
    close = difflib.get_close_matches(name, sorted(defined & used), n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ValueError(f"gin binding {binding!r} sets macro {name}, which no "
                     f"configuration uses{hint}")


def planned_updates(argv, *, multi_host: bool = False) -> int:
  """The number of updates a run with these `main` arguments asks for.

  Parses its gin files and bindings (then clears them); no run starts.

  Raises:
    ValueError: as `parse_gin`, a bad `num_updates`, or, for a run on
      several hosts (`multi_host`), no `train.train.mesh_shape`, which
      several processes need (it would fail only once the hosts are up).
  """
  args = parse_flags(list(argv))
  gin.clear_config()
  try:
    parse_gin(args.gin_file, args.gin)
    bindings = gin.get_bindings(train)
    num_updates = bindings.get(
        "num_updates",
        inspect.signature(train).parameters["num_updates"].default)
    _check_knobs(num_updates=num_updates)  # as train itself would
    if multi_host and bindings.get("mesh_shape") is None:
      raise ValueError(
          "a run on several hosts needs train.train.mesh_shape, e.g. "
          "--gin.train.train.mesh_shape=\"(1, -1, 1)\"")
    return int(num_updates)
  finally:
    gin.clear_config()


def console_logging() -> None:
  """Progress lines of seed_jax (logging.info) on the console; the
  libraries' own chatter stays at warnings. For command-line entry points."""
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                      datefmt="%H:%M:%S", force=True)
  for name in ("absl", "jax", "orbax", "tensorflow", "etils", "urllib3",
               "matplotlib", "PIL", "httpx"):
    logging.getLogger(name).setLevel(logging.WARNING)


def main(argv=None) -> None:
  args = parse_flags(sys.argv[1:] if argv is None else argv)
  try:
    distributed.initialize()  # multi-host when the launch asks (SEED_* env)
  except ValueError as e:  # the SEED_* settings: named, one line
    raise SystemExit(f"error: {e}") from None
  console_logging()
  try:
    parse_gin(args.gin_file, args.gin, finalize=True)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"error: {e}") from None
  try:
    gin.get_configurable(train)(gin.query_parameter("%WORKDIR"))
  except teacher_lib.TeacherUnavailableError as e:
    # Stage 1 keeps its annotated batches (the message says where) and RL
    # its checkpoints: a rerun goes on from there.
    hint = ("" if getattr(e, "journal", None) else
            "; start the run again to go on from its last checkpoint, if "
            "any")
    raise SystemExit(f"error: {_own_message(e)}{hint}") from None
  except START_ERRORS as e:
    if getattr(e, "during_work", False):
      raise  # a bug or a fault mid-run: its traceback is what helps
    raise SystemExit(f"error: {_own_message(e)}") from None


def _own_message(e: BaseException) -> str:
  """`e`'s message without the "In call to configurable ..." lines that gin
  appends to what a configurable (`train`, `RLConfig`) raises."""
  return str(e).split("\n  In call to configurable ", 1)[0]


if __name__ == "__main__":
  # Under `python -m`, this file runs as __main__; gin knows the function as
  # seed_jax.train.train, so run the imported module's main.
  from seed_jax import train as _registered  # pylint: disable=g-import-not-at-top
  _registered.main()
