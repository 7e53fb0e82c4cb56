r"""Sweeps: a file of gin binding sets, expanded into runs, and their summary.

A sweep file (configs/sweeps/*.py) defines `sweep()`, which yields one dict
of gin bindings per run (big_vision's style):

  def sweep():
    for opd_coef in (0.0, 0.01):
      yield {"trainer.RLConfig.opd_coef": opd_coef}

Run i of sweep file `name.py` trains in `WORKDIR/name/i`. `--local` runs
them here one after another (`seed_jax.train.main`, gin cleared between
runs), `--emit_commands` prints one command per run instead (`--launcher`:
local, tpu or slurm) and stops there. After `--local`, or with
`--summarize` once the emitted runs are done, the summary table of each
run's final metrics (from its metrics.jsonl) is printed and written to
`WORKDIR/name/summary.{md,csv}`. `--local` records each run's bindings in
its folder (`sweep_run.json`); a sweep file changed since, so that run i
would mean other settings than the ones trained in `WORKDIR/name/i`, is
refused before anything runs, is printed or is summarized. A relative
`--sweep`, like a `--gin_file`, is looked for in the current directory, then
in the source checkout.

  python -m seed_jax.sweep --sweep=configs/sweeps/opd_lambda_beta.py \
      --gin_file=configs/experiments/tiny.gin --workdir=runs/sweeps --local
"""

from __future__ import annotations

import argparse
import collections.abc
import csv
import importlib.util
import io
import json
import os
import shlex
import sys
import traceback
from typing import Any, Mapping, Sequence

from seed_jax import atomic
from seed_jax import results

DEFAULT_METRICS = ("eval/seen/success", "eval/unseen/success", "success_rate",
                   "kl", "update")
LAUNCHERS = ("local", "tpu", "slurm")


def find_file(path: str) -> str:
  """`path` as given, else under the source checkout, as gin files are
  found (`train.find_gin_file`): configs/sweeps/... from any directory.

  Raises:
    FileNotFoundError: naming the paths tried.
  """
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  try:
    return train.find_gin_file(path)
  except FileNotFoundError:
    tried = dict.fromkeys(os.path.abspath(p)
                          for p in (path, os.path.join(train.ROOT, path)))
    raise FileNotFoundError(f"no sweep file {path!r} (looked for "
                            f"{' and '.join(tried)})") from None


def load(path: str) -> list[dict[str, Any]]:
  """The binding sets of a sweep file (found as `find_file` does), in order.

  Raises:
    FileNotFoundError: no such file, naming the paths tried.
    ValueError: when the file does not run (a syntax error, an exception:
      named with its line), has no `sweep()` or yields something else than
      non-empty dicts.
  """
  path = find_file(path)
  spec = importlib.util.spec_from_file_location("_seed_sweep", path)
  if spec is None or spec.loader is None:
    raise ValueError(f"cannot load sweep file {path!r}")
  module = importlib.util.module_from_spec(spec)
  _call(path, spec.loader.exec_module, module)
  if not callable(getattr(module, "sweep", None)):
    raise ValueError(f"sweep file {path!r} defines no sweep() function")
  runs = _call(path, lambda: list(module.sweep()))
  bad = next((b for b in runs if not isinstance(b, collections.abc.Mapping)),
             None)
  if bad is not None:
    raise ValueError(f"sweep file {path!r} yields {bad!r}; each binding set "
                     "must be a dict of gin names to values")
  runs = [dict(b) for b in runs]
  if not runs or not all(runs):
    raise ValueError(f"sweep file {path!r} yields no (or an empty) binding set")
  if any(str(k).strip() == "WORKDIR" for b in runs for k in b):
    raise ValueError(f"sweep file {path!r} binds WORKDIR; each run's WORKDIR "
                     "is --workdir/<sweep>/<index>")
  return runs


def _call(path: str, fn, *args):
  """fn(*args) for sweep file `path`; its errors become a ValueError that
  names the file and the line."""
  try:
    return fn(*args)
  except SyntaxError as e:
    where = ("" if os.path.abspath(e.filename or "") == os.path.abspath(path)
             else f" in {e.filename}")
    raise ValueError(f"sweep file {path!r}: syntax error{where} line "
                     f"{e.lineno}: {e.msg}") from None
  except Exception as e:  # pylint: disable=broad-except
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if os.path.abspath(f.filename) == os.path.abspath(path)]
    line = f" line {frames[-1].lineno}" if frames else ""
    raise ValueError(f"sweep file {path!r}{line}: {type(e).__name__}: "
                     f"{e}") from e


def sweep_name(path: str) -> str:
  return os.path.splitext(os.path.basename(path))[0]


def gin_args(bindings: Mapping[str, Any]) -> list[str]:
  """{"a.b": 0.01, "c": "x"} -> ["--gin.a.b=0.01", "--gin.c='x'"]."""
  return [f"--gin.{k}={v!r}" for k, v in bindings.items()]


def train_argv(gin_files: Sequence[str], run_dir: str,
               bindings: Mapping[str, Any],
               extra: Sequence[str] = ()) -> list[str]:
  """The arguments of `seed_jax.train.main` for one run."""
  return ([f"--gin_file={f}" for f in gin_files] +
          [f"--gin.WORKDIR={run_dir!r}", *extra, *gin_args(bindings)])


def commands(runs: Sequence[Mapping[str, Any]], *, gin_files: Sequence[str],
             root: str, launcher: str = "local",
             extra: Sequence[str] = ()) -> list[str]:
  """One shell command per run.

  local: `python -m seed_jax.train ...`; tpu: `launch/tpu_vm.sh up ...` on
  a slice of its own (TPU_NAME gets the run index appended; ZONE, the
  accelerator and runtime come from the environment); slurm: `sbatch
  --wrap` around `launch/slurm_gpu.sh` (nodes from the environment).
  """
  if launcher not in LAUNCHERS:
    raise ValueError(f"unknown launcher {launcher!r}; known: {LAUNCHERS}")
  if launcher != "local" and len(gin_files) != 1:
    raise ValueError(f"launcher {launcher!r} takes exactly one --gin_file")
  out = []
  for i, b in enumerate(runs):
    run_dir = os.path.join(root, str(i))
    if launcher == "local":
      words = ["python", "-m", "seed_jax.train",
               *train_argv(gin_files, run_dir, b, extra)]
      out.append(shell_command(words))
      continue
    # Assignments quote their value only: a quoted `'NAME=a b'` would be
    # run as a command.
    env = [f"GIN_FILE={_quote(gin_files[0])}", f"WORKDIR={_quote(run_dir)}"]
    args = [*extra, *gin_args(b)]
    if launcher == "tpu":
      env.insert(0, f"TPU_NAME=${{TPU_NAME}}-{i}")
      words = ["launch/tpu_vm.sh", "up", *args]
    else:
      inner = shell_command(["launch/slurm_gpu.sh", *args])
      words = ["sbatch", "--nodes=${NODES}",
               "--gpus-per-node=${GPUS_PER_NODE}", f"--wrap={inner}"]
    out.append(" ".join(env) + " " + shell_command(words))
  return out


def shell_command(words: Sequence[str]) -> str:
  """One shell line of `words`, quoted so that gin's single quotes stay
  readable, e.g. python -m seed_jax.train "--gin.VARIANT='grpo'"."""
  return " ".join(_quote(w) for w in words)


def _quote(word: str) -> str:
  if "${" in word and not set(word) & set("'\"`\\ "):
    return word  # a variable for the shell that runs the command
  if "'" in word and not set(word) & set('"$`\\!'):
    return f'"{word}"'
  return shlex.quote(word)


RUN_RECORD = "sweep_run.json"


def record_run(root: str, i: int, bindings: Mapping[str, Any]) -> None:
  """Writes run i's bindings to `root/i/sweep_run.json` (see `check_runs`);
  process 0 only."""
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  if not distributed.is_writer():
    return
  atomic.write_text(os.path.join(root, str(i), RUN_RECORD),
                    json.dumps({"run": i, "bindings": gin_args(bindings)},
                               indent=1) + "\n")


def check_runs(runs: Sequence[Mapping[str, Any]], root: str, *,
               only: Sequence[int] | None = None) -> None:
  """Refuses run folders that another binding set trained in.

  Run i trains in `root/i`, so a sweep file whose runs were reordered,
  inserted or changed since would resume, and summarize, a folder of other
  settings under the new ones. Folders that `run_local` recorded
  (`sweep_run.json`) must hold the same bindings; folders without a record
  (not trained yet, or trained from emitted commands) are not checked.

  Args:
    only: the indices to check (default all).

  Raises:
    ValueError: naming each folder, its bindings and the sweep's.
  """
  wrong = []
  for i in range(len(runs)) if only is None else only:
    b = runs[i]
    path = os.path.join(root, str(i), RUN_RECORD)
    if not os.path.exists(path):
      continue
    try:
      with open(path) as f:
        old = json.load(f)["bindings"]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{path}: not a sweep run record ({e}); move the "
                       "folder away or delete the file") from None
    if old != gin_args(b):
      wrong.append(f"{os.path.join(root, str(i))} was trained with "
                   f"{' '.join(old)}; the sweep's run {i} is "
                   f"{' '.join(gin_args(b))}")
  if wrong:
    raise ValueError(
        "the sweep file's runs changed since these folders were trained "
        "(run i trains in ROOT/i):\n  " + "\n  ".join(wrong)
        + "\nuse another --workdir, or move those folders away")


def final_metrics(run_dir: str) -> dict[str, Any] | None:
  """Each metric's last value in `run_dir/metrics.jsonl`; None if absent.

  Raises:
    ValueError: a damaged line, named (`results.read_metrics`).
  """
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  final: dict[str, Any] = {}
  for record in results.read_metrics(path):
    final.update(record)
  return final


def _status(i: int, final: Mapping[str, Any] | None, failed: Sequence[int],
            planned: int | None) -> str:
  last = final.get("update") if final else None
  return ("failed" if i in failed else "missing" if final is None
          else f"update {last}/{planned}"
          if planned is not None and (last is None or last < planned)
          else "done")


def run_status(root: str, i: int, planned: int | None = None, *,
               failed: Sequence[int] = ()) -> str:
  """Run i's status in `root`, as `summarize` shows it.

  failed (i in `failed`), missing (no `root/i/metrics.jsonl`), "update k/N"
  (its last logged update k is short of `planned`), or done.

  Raises:
    ValueError: a damaged metrics line, named (`final_metrics`).
  """
  return _status(i, final_metrics(os.path.join(root, str(i))), failed,
                 planned)


def summarize(runs: Sequence[Mapping[str, Any]], root: str, *,
              metrics: Sequence[str] = DEFAULT_METRICS,
              failed: Sequence[int] = (),
              num_updates: Sequence[int | None] | None = None
              ) -> tuple[list[str], list[list[str]]]:
  """Header and rows: index, each binding (short name), status, metrics.

  Status: failed (in `failed`), missing (no metrics.jsonl), done, or
  "update k/N" for a run whose last logged update k is short of its
  `num_updates[i]` (still running, or stopped); without `num_updates` every
  run with metrics counts as done.

  Raises:
    ValueError: a folder that other bindings trained in (`check_runs`), or
      a damaged metrics line.
  """
  check_runs(runs, root)
  keys = list(dict.fromkeys(k for b in runs for k in b))
  header = ["run", *(k.rsplit(".", 1)[-1] for k in keys), "status",
            *metrics]
  rows = []
  for i, b in enumerate(runs):
    final = final_metrics(os.path.join(root, str(i)))
    planned = num_updates[i] if num_updates is not None else None
    status = _status(i, final, failed, planned)
    vals = [_fmt(final.get(m)) if final else "-" for m in metrics]
    rows.append([str(i), *(_fmt(b.get(k)) for k in keys), status, *vals])
  return header, rows


def unlogged_metrics(runs: Sequence[Mapping[str, Any]], root: str, *,
                     metrics: Sequence[str], failed: Sequence[int] = (),
                     num_updates: Sequence[int | None] | None = None
                     ) -> tuple[list[str], list[str]]:
  """The `metrics` that no done run logged, and the names done runs log.

  Both lists are empty while no run is done (as `summarize` counts them):
  a run still going may log a metric later.
  """
  logged: set[str] = set()
  for i in range(len(runs)):
    final = final_metrics(os.path.join(root, str(i)))
    planned = num_updates[i] if num_updates is not None else None
    if _status(i, final, failed, planned) == "done":
      logged.update(final)
  if not logged:
    return [], []
  return [m for m in metrics if m not in logged], sorted(logged)


def _fmt(v) -> str:
  if v is None:
    return "-"
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  return "\n".join(results.table_lines(header, rows)) + "\n"


def write_summary(root: str, header, rows) -> str:
  """Writes summary.md and summary.csv under `root`; returns the markdown."""
  text = markdown(header, rows)
  atomic.write_text(os.path.join(root, "summary.md"), text)
  buf = io.StringIO()
  csv.writer(buf).writerows([header, *rows])
  atomic.write_text(os.path.join(root, "summary.csv"), buf.getvalue())
  return text


def run_local(runs: Sequence[Mapping[str, Any]], *, gin_files: Sequence[str],
              root: str, extra: Sequence[str] = (),
              only: Sequence[int] | None = None) -> list[int]:
  """Trains the runs here, one after another; returns the failed indices.

  Args:
    only: the indices to train (default all); run i trains in `root/i`
      whichever runs are left out.

  Raises:
    ValueError: a folder to train in that other bindings trained in
      (`check_runs`), before any run starts.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  failed = []
  todo = range(len(runs)) if only is None else list(only)
  check_runs(runs, root, only=todo)
  for k, i in enumerate(todo):
    b = runs[i]
    print(f"sweep run {i} ({k + 1}/{len(todo)}): {b}", flush=True)
    gin.clear_config()
    try:
      record_run(root, i, b)
      train.main(train_argv(gin_files, os.path.join(root, str(i)), b, extra))
    except (Exception, SystemExit):  # pylint: disable=broad-except
      # One failed run (a diverged learning rate, or a binding train.main
      # refuses) does not stop the sweep; it is marked in the summary and in
      # the exit status.
      traceback.print_exc()
      failed.append(i)
  gin.clear_config()
  return failed


def parse_flags(argv):
  parser = argparse.ArgumentParser(description="Expand and run a sweep.")
  parser.add_argument("--sweep", required=True,
                      help="configs/sweeps/*.py (here, else in the checkout)")
  parser.add_argument("--gin_file", action="append", required=True)
  parser.add_argument("--workdir", required=True,
                      help="runs go to WORKDIR/<sweep>/<index>")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--local", action="store_true",
                    help="run here one after another (the default)")
  mode.add_argument("--emit_commands", action="store_true",
                    help="print one command per run instead")
  mode.add_argument("--summarize", action="store_true",
                    help="only (re)write the summary of finished runs")
  parser.add_argument(
      "--launcher", choices=LAUNCHERS, default="local",
      help="with --emit_commands: what the commands run on; --local runs "
      "here only, and --summarize reads the same run folders whatever it is")
  parser.add_argument(
      "--metrics", default=",".join(DEFAULT_METRICS),
      help="comma-separated columns of the summary, each the last value a "
      "run logged; a name that no done run logged is warned about (with the "
      "names they log) and stays a column of '-'")
  known, rest = parser.parse_known_args(argv)
  for arg in rest:  # gin bindings for every run, as seed_jax.train takes them
    if not (arg.startswith("--gin.") and "=" in arg):
      parser.error(f"unrecognized argument {arg!r}")
    if arg[len("--gin."):].split("=", 1)[0].strip() == "WORKDIR":
      parser.error(f"{arg!r} would send every run to one folder; each run's "
                   "WORKDIR is --workdir/<sweep>/<index>")
  if (known.launcher != "local" and not known.emit_commands
      and not known.summarize):
    parser.error(f"--launcher={known.launcher} needs --emit_commands; "
                 "without it the runs would train here, one after another")
  known.extra = rest
  return known


def main(argv=None) -> int:
  args = parse_flags(sys.argv[1:] if argv is None else argv)
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  try:
    runs = load(args.sweep)
    root = os.path.join(args.workdir, sweep_name(args.sweep))
    # Every run's gin files and bindings parse before one starts or is
    # printed: a typo fails here, not in every run.
    pod = args.emit_commands and args.launcher != "local"
    planned = [train.planned_updates(
        train_argv(args.gin_file, os.path.join(root, str(i)), b, args.extra),
        multi_host=pod) for i, b in enumerate(runs)]
    check_runs(runs, root)
    if args.emit_commands:
      lines = commands(runs, gin_files=args.gin_file, root=root,
                       launcher=args.launcher, extra=args.extra)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"error: {e}") from None
  if args.emit_commands:
    print("\n".join(lines))
    return 0
  failed = [] if args.summarize else run_local(
      runs, gin_files=args.gin_file, root=root, extra=args.extra)
  metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
  try:
    header, rows = summarize(runs, root, metrics=metrics, failed=failed,
                             num_updates=planned)
    unknown, logged = unlogged_metrics(runs, root, metrics=metrics,
                                       failed=failed, num_updates=planned)
  except ValueError as e:
    raise SystemExit(f"error: summary of {root}: {e}") from None
  if unknown:
    print(f"warning: no done run logged --metrics {', '.join(unknown)}; "
          f"they log: {', '.join(logged)}", file=sys.stderr)
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  if distributed.is_writer():
    print(write_summary(root, header, rows), end="")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
