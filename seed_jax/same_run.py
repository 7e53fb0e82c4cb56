"""Whether two runs would train the same thing: the configuration a run
trains with, as gin resolves it for `train.train`, and the checks that
`experiments` makes before it starts a set of runs (no two methods the same
run, every seed its own, every run the same budget of updates and samples).

Only what `train.train` reaches can change a run: a library function takes
bindings only where a gin reference calls it, so `policies.prepare.stage1`
under another `policy_fn` is no part of the run.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from seed_jax import runner

_UNBOUND = object()  # a parameter or macro without a binding
# What makes two runs' budgets of updates and samples the same: keys of
# `trained_config` ("rl.group_size": the group size of its `rl`).
BUDGET = ("num_updates", "rl.num_groups", "rl.group_size", "rl.max_steps")


def trained_config(run: runner.Run) -> dict[str, Any]:
  """What `run` trains with, its workdir aside: `train.train`'s parameters
  as its gin files and bindings set them, references followed (a reference
  is {"@name": its parameters}), macros resolved but WORKDIR, unbound
  parameters at their defaults. Only what `train.train` reaches can change
  a run (a library function takes bindings only where a gin reference calls
  it): `policies.prepare.stage1` under another `policy_fn` is not there.

  Raises:
    FileNotFoundError, ValueError: as `train.parse_gin`.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  args = train_lib.parse_flags(list(run.args))
  gin.clear_config()
  try:
    train_lib.parse_gin(args.gin_file, args.gin)
    return _configured(train_lib.train, train_lib.train, ())
  finally:
    gin.clear_config()


def _configured(fn, selector, stack: tuple[str, ...]) -> dict[str, Any]:
  """{param: resolved value} of configurable `fn` (gin's `selector`): its
  defaults, then its bindings; `stack`, the selectors it is reached by."""
  import gin  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  params = {name: p.default
            for name, p in inspect.signature(fn).parameters.items()
            if p.default is not p.empty}
  params.update(gin.get_bindings(selector, resolve_references=False))
  return {k: _resolved(v, stack) for k, v in params.items()}


def _resolved(value: Any, stack: tuple[str, ...]) -> Any:
  """A bound value with gin's references and macros resolved."""
  import gin  # pylint: disable=g-import-not-at-top
  if isinstance(value, gin.config.ConfigurableReference):
    selector = value.scoped_selector
    if value.selector == "gin.macro":  # %NAME
      if selector == "WORKDIR/gin.macro":
        return "%WORKDIR"
      return _resolved(gin.get_bindings(selector, resolve_references=False)
                       ["value"], stack)
    key = "@" + selector + ("()" if value.evaluate else "")
    if selector in stack:  # a cycle, which gin refuses itself
      return key
    return {key: _configured(value.configurable.wrapped, selector,
                             (*stack, selector))}
  if type(value) in (list, tuple):
    return type(value)(_resolved(v, stack) for v in value)
  if type(value) is dict:
    return {k: _resolved(v, stack) for k, v in value.items()}
  return value


def check_distinct(runs: Sequence[runner.Run]) -> None:
  """Refuses two methods that would train the same run on one seed: equal
  `trained_config` (the variant counts, the workdir not). A gin file that
  skips Stage 1 itself (smollm2.gin), or whose `policy_fn` is not
  `policies.prepare` (tiny.gin), makes `seed_no_stage1` the run `seed` is,
  and `grpo_no_stage1` `grpo`'s: each would be summarized as an ablation.

  Raises:
    ValueError: naming the methods, the seed, the gin files and the
      bindings that change nothing; as `trained_config`.
  """
  seen = {}
  for run in runs:
    config = trained_config(run)
    for first, other in seen.get(run.seed, ()):
      if other == config:
        differ = [a for a in (*first.args, *run.args) if "WORKDIR" not in a
                  and (a in first.args) != (a in run.args)]
        files = [a.split("=", 1)[1] for a in run.args
                 if a.startswith("--gin_file=")]
        why = (f"their bindings {' '.join(differ)} change nothing there"
               if differ else "the --gin bindings make them the same")
        raise ValueError(
            f"methods {first.method!r} and {run.method!r} would train the "
            f"same run on seed {run.seed}: with {', '.join(files)}, {why} "
            "(a gin file that skips Stage 1 itself, or whose policy_fn is "
            "not policies.prepare, makes a *_no_stage1 method its plain "
            "one); leave one of them out of --methods")
    seen.setdefault(run.seed, []).append((run, config))


def check_seed(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
  """Refuses gin files (with `bindings`) whose `train.train.seed` is not the
  SEED macro, which `experiments` binds for each run: bound to a number, or
  to another macro, it makes every "seed" one run's seed (`check_distinct`
  compares methods on one seed, not seeds).

  Raises:
    ValueError: naming the binding (`train.train.seed = 3`) and the files;
      as `train.parse_gin`.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    train_lib.parse_gin(gin_files, bindings)
    value = gin.get_bindings(train_lib.train,
                             resolve_references=False).get("seed", _UNBOUND)
    chain = ["train.train.seed"]
    while (isinstance(value, gin.config.ConfigurableReference)
           and value.selector == "gin.macro"):  # %NAME
      if value.scoped_selector == "SEED/gin.macro":
        return
      chain.append("%" + value.scoped_selector.rpartition("/")[0])
      value = gin.get_bindings(value.scoped_selector,
                               resolve_references=False).get("value",
                                                             _UNBOUND)
  finally:
    gin.clear_config()
  if value is _UNBOUND:
    binding = " = ".join(chain) + " is unbound"
  elif isinstance(value, gin.config.ConfigurableReference):
    binding = " = ".join([*chain, f"@{value.scoped_selector}"])
  else:
    binding = " = ".join([*chain, repr(value)])
  raise ValueError(
      f"with {', '.join(gin_files)}, {binding}, not %SEED: every run would "
      "train that seed, whatever --seeds says; bind train.train.seed = %SEED "
      "there (configs/runs/rl.gin does), the runner sets SEED for each run")


def budget(config: Mapping[str, Any]) -> dict[str, Any]:
  """{key: value} of `BUDGET` in a `trained_config` (None where absent)."""
  out = {}
  for key in BUDGET:
    value = config
    for part in key.split("."):
      if (isinstance(value, dict) and len(value) == 1
          and next(iter(value)).startswith("@")):  # a reference: its params
        value = next(iter(value.values()))
      value = value.get(part) if isinstance(value, dict) else None
    out[key] = value
  return out


def recorded_config(workdir: str) -> dict[str, Any]:
  """As `trained_config`, from the config.gin the run's training wrote.

  Raises:
    FileNotFoundError: no config.gin (its training never started).
    ValueError: a config.gin that does not parse.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.gin")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing")
  gin.clear_config()
  try:
    gin.parse_config_file(path)
    return _configured(train_lib.train, train_lib.train, ())
  except Exception as e:  # gin raises TokenError, SyntaxError, ImportError...
    raise ValueError(f"{path} does not parse ({type(e).__name__}: {e})"
                     ) from None
  finally:
    gin.clear_config()


def check_budget(runs: Sequence[runner.Run],
                 existing: Mapping[str, str]) -> None:
  """Refuses runs to start whose budget (`BUDGET`) differs from that of the
  runs already trained in the experiment (`existing`, as their config.gin
  says): an invocation with `--gin NUM_UPDATES=20` after one with 10 would
  compare methods trained for different numbers of updates or samples.
  A run planned again may have been trained for fewer updates (it goes on
  to this budget now); one never started (no config.gin) is not compared.
  A config.gin that does not parse is refused: its run's budget is unknown
  (training writes the file whole, so it was damaged or edited since).

  Args:
    runs: the runs to start, from `experiments.plan`.
    existing: {run name ("grpo/seed0"): its workdir} of the runs in OUT.

  Raises:
    ValueError: naming each run whose budget differs, and the values, or
      a run whose config.gin does not parse; as `trained_config`.
  """
  if not runs:
    return
  wanted = budget(trained_config(runs[0]))
  planned = {run.name for run in runs}
  differ = []
  for name, workdir in existing.items():
    try:
      had = budget(recorded_config(workdir))
    except FileNotFoundError:
      continue
    except ValueError as e:
      raise ValueError(
          f"{name} is already in OUT, but {e}, so its budget cannot be "
          "compared with the runs to start: delete that run folder "
          f"({workdir}) if it is not wanted, or use another --out") from None
    keys = [k for k in BUDGET if had[k] != wanted[k]]
    if name in planned and keys == ["num_updates"] and None not in (
        had["num_updates"], wanted["num_updates"]) and (
            had["num_updates"] < wanted["num_updates"]):
      continue  # trained further to the budget of this invocation
    if keys:
      differ.append(f"{name} was trained with " + ", ".join(
          f"{k}={had[k]!r}, not {wanted[k]!r}" for k in keys))
  if differ:
    raise ValueError(
        "runs already in OUT differ in budget from the runs to start: "
        + "; ".join(differ) + ". Methods compare only with the same updates "
        "and samples: run with the bindings those had (OUT/status.json "
        "lists each run's command), or use another --out")
