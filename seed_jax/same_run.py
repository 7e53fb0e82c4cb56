"""Whether two runs would train the same thing: the configuration a run
trains with, as gin resolves it for `train.train`, and the check that
`experiments` makes before it starts a set of runs.

Only what `train.train` reaches can change a run: a library function takes
bindings only where a gin reference calls it, so `policies.prepare.stage1`
under another `policy_fn` is no part of the run.
"""

from __future__ import annotations

from typing import Any, Sequence

from seed_jax import runner


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
