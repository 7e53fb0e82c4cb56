"""An experiment's plan: the methods it compares, as gin bindings, and its
(method, seed) runs, each a `seed_jax.train` command with its own workdir.

  plan("runs/evidence", methods=["grpo", "seed"], seeds=[0, 1],
       gin_files=["configs/experiments/demo.gin"], bindings=["NUM_UPDATES=50"])
  -> [Run("grpo", 0, "runs/evidence/grpo/seed0", ("--gin_file=...",
          "--gin.WORKDIR='runs/evidence/grpo/seed0'", "--gin.SEED=0",
          "--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=50")), Run("seed", 0, ...),
      Run("grpo", 1, ...), Run("seed", 1, ...)]

Each run binds WORKDIR and SEED, and each method VARIANT (`OWN_BINDINGS`),
so a `--gin` binding of them (of VARIANT only when a planned method binds
it), or of the parameters they set, is refused: gin keeps the last binding,
so it would set one value for every run.
`seed_jax.experiments` runs, summarizes and rescores what `plan` returns.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from seed_jax import runner

# Each method's gin bindings, as seed_jax.train takes them after `--gin.`.
METHODS: dict[str, tuple[str, ...]] = {
    "grpo": ("VARIANT='grpo'",),
    "seed": ("VARIANT='seed'",),
    "seed_no_stage1": ("VARIANT='seed'", "policies.prepare.stage1=None"),
    "opid": ("VARIANT='opid'",),
    # A control, not run by default: GRPO from the same start as
    # seed_no_stage1, which tells SEED's term from skipping Stage 1.
    "grpo_no_stage1": ("VARIANT='grpo'", "policies.prepare.stage1=None"),
    # An oracle, not run by default: SEED whose skills the rule-based
    # annotator writes from what really happened (`annotators.ENVS`), which
    # tells the policy's use of a skill from the quality of its own skills.
    "seed_oracle": ("VARIANT='seed'", "trainer.RLConfig.analyzer='rules'"),
}
DEFAULT_METHODS = ("grpo", "seed", "seed_no_stage1", "opid")
DEFAULT_GIN = "configs/experiments/demo.gin"
# What `plan` binds itself, per run or per method, as (macro, the parameter
# it sets, the flag that chooses it). gin keeps the last binding of a name,
# so a `--gin` binding of one (bound after them) would set it for every run:
# every seed would train one seed, every run write one folder, or every
# method be the same method.
OWN_BINDINGS = (
    ("WORKDIR", "seed_jax.train.train.workdir",
     "--out (each run's workdir is OUT/<method>/seed<S>)"),
    ("SEED", "seed_jax.train.train.seed", "--seeds"),
    ("VARIANT", "seed_jax.trainer.RLConfig.variant", "--methods"),
)


def plan(out: str, *, methods: Sequence[str], seeds: Sequence[int],
         gin_files: Sequence[str], bindings: Sequence[str] = (),
         method_bindings: Mapping[str, Sequence[str]] | None = None
         ) -> list[runner.Run]:
  """The runs of an experiment, seed by seed (every method on seed 0 first,
  so that a partial experiment already compares the methods).

  Args:
    out: the experiment's directory.
    methods, seeds: what to run.
    gin_files: the gin files of every run.
    bindings: gin bindings ("NAME=VALUE") for every run, after the method's.
    method_bindings: {method: bindings}; default `METHODS`.

  Raises:
    ValueError: an unknown or repeated method, a repeated or negative seed;
      a binding of what `plan` binds itself (`OWN_BINDINGS`; the variant
      only when one of `methods` binds it).
  """
  known = METHODS if method_bindings is None else method_bindings
  unknown = [m for m in methods if m not in known]
  if unknown:
    raise ValueError(f"unknown method(s) {unknown}; known: {list(known)}")
  negative = [s for s in seeds if s < 0]
  if negative:
    raise ValueError(f"seeds must be >= 0, got {negative}")
  for what, items in (("method", methods), ("seed", seeds)):
    if len(set(items)) != len(items):
      raise ValueError(f"a {what} is repeated in {list(items)}")
  by_method = {_own_binding(n) for m in methods if m in known
               for b in known[m] for n in _binding_names(b)}
  for binding in bindings:
    for name in _binding_names(binding):
      own = _own_binding(name)
      if own is None or (own[0] == "VARIANT" and own not in by_method):
        continue
      by = "each method" if own[0] == "VARIANT" else "each run"
      raise ValueError(
          f"--gin {binding!r} sets {name}, which `run` sets for {by} itself "
          "(gin keeps the last binding, so every run would get this one): "
          f"use {own[2]} instead")
  runs = []
  for s in seeds:
    for m in methods:
      workdir = os.path.join(out, m, f"seed{s}")
      args = ([f"--gin_file={f}" for f in gin_files] +
              [f"--gin.WORKDIR={workdir!r}", f"--gin.SEED={int(s)}"] +
              [f"--gin.{b}" for b in (*known[m], *bindings)])
      runs.append(runner.Run(m, int(s), workdir, tuple(args)))
  return runs


def _binding_names(binding: str) -> list[str]:
  """The names a gin binding sets ("NAME" or "SELECTOR.PARAM"), one per line
  with an `=`, without spaces or a leading `--gin.` or `%`; in a block (a
  line "SELECTOR:", then indented lines "PARAM = VALUE"), "SELECTOR.PARAM".

  Examples: _binding_names(" --gin.SEED = 7") -> ["SEED"]; the block
    "SEED/gin.macro:" with "  value = 7" -> ["SEED/gin.macro.value"].
  """
  names, block = [], ""
  for line in binding.splitlines():
    if not line[:1].isspace():
      block = ""
    if "=" in line:
      name = "".join(line.split("=", 1)[0].split())
      if block:
        name = f"{block}.{name}"
      names.append(name.removeprefix("--gin.").removeprefix("%"))
    elif line.split("#", 1)[0].rstrip().endswith(":"):
      block = "".join(line.split("#", 1)[0].split())[:-1]
  return names


def _own_binding(name: str) -> tuple[str, str, str] | None:
  """The `OWN_BINDINGS` entry a binding name sets, if any: its macro, as
  NAME or as gin keeps it ("SEED/gin.macro.value", "SEED/macro.value"), or
  its parameter under any dotted tail of the full name that gin resolves
  ("train.train.seed", "seed_jax.train.train.seed")."""
  scope, _, selector = name.rpartition("/")
  if selector in ("gin.macro.value", "macro.value"):
    name = scope
  for own in OWN_BINDINGS:
    macro, param, _ = own
    if name == macro or ("." in name and
                         ("." + param).endswith("." + name)):
      return own
  return None


def planned_updates(run: runner.Run) -> int:
  """The number of updates the run's gin configuration asks for."""
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  return train_lib.planned_updates(run.args)
