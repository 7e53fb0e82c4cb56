r"""Experiments: GRPO, SEED and its ablations over seeds, resumable, summarized.

  # every (method, seed) run in the background; the same command resumes
  mkdir -p runs/evidence
  nohup python -m seed_jax.experiments run --out=runs/evidence \
      --gin_file=configs/experiments/demo.gin --seeds=0,1,2 \
      > runs/evidence/runner.log 2>&1 &
  python -m seed_jax.experiments status --out=runs/evidence
  python -m seed_jax.experiments summarize --out=runs/evidence \
      --md=docs/results.md

Run (method, seed) trains in `OUT/<method>/seed<S>` as its own process,
`python -m seed_jax.train --gin_file=... --gin.WORKDIR=... --gin.SEED=S`
plus the method's bindings (`plans.METHODS`) and then the `--gin` bindings given
here (which may override them; but a binding of WORKDIR, SEED or VARIANT,
or of the parameters they set, would do so for every run and is refused:
use --out, --seeds and --methods; so is a gin file whose train.train.seed is
not %SEED); its output goes to `log.txt` there. Every method gets the same
gin file, hence the same number of updates and samples; runs already in OUT
with another budget (`same_run.BUDGET`: a rerun with another NUM_UPDATES,
say) are refused (a run planned again may go on to more updates).
`--methods` defaults to GRPO, SEED and the two ablations; `grpo_no_stage1`,
GRPO from the start of `seed_no_stage1`, is a control to ask for, and so is
`seed_oracle`, SEED with the rule-based annotator's skills.
`--parallel` runs that many at once.

Resuming: a run whose metrics.jsonl lists its final update is done and
skipped; any other is started again and `seed_jax.train` resumes it from
its last checkpoint. So after an interruption (a reboot, `kill` of the
runner, which stops its runs), rerunning the same command continues. The
runner (`seed_jax.runner`) keeps `OUT/status.json` up to date (each run's
state, return code, command and log); `status` prints it with each run's
last logged update.
`--dry_run` prints the commands without running them. Both refuse, before
anything runs, two methods that would train the same run: equal parsed
configurations but for the workdir (`same_run.trained_config`), as
`seed_no_stage1` and `seed` are with a gin file that skips Stage 1 itself
(smollm2.gin) or whose `policy_fn` is not `policies.prepare` (tiny.gin).

`summarize` reads every `OUT/<method>/seed<S>/metrics.jsonl` and writes
`OUT/summary.{json,csv,md}`, `OUT/sample_efficiency.csv` and the learning
curves `OUT/success_vs_{updates,env_steps}.png` (see `seed_jax.results`;
a run that logged fewer updates than planned, as OUT/status.json records,
else its config.gin, is left out of the tables and named);
with `--md=PATH` also a Markdown section in PATH (between markers, so the
rest of the file is kept) with its images, and the raw metrics when small,
in the folder PATH without its suffix (docs/results.md -> docs/results/), so
PATH needs a suffix. A file with the markers out of order, or one without
the other, is refused (nothing written there): fix it by hand.

`evaluate` scores every finished run again, its start (update 0) and its
final checkpoint, on `--num_tasks` tasks per split with one evaluation seed,
so that every run meets the same tasks and sampling keys (the runs' own
evaluations are small and differ by seed). A run is finished when it has a
checkpoint of its planned last update (from OUT/status.json, else its
config.gin); the others, still training or stopped early, are left out and
named. Each report is kept in
`RUN/eval/step_<N>_tasks<K>_seed<S>_temp<T>.json` (where
`python -m seed_jax.evaluate` writes it too) and reused, so an
interrupted rescoring resumes; the start of a seed's later runs is scored
with `--same_as` its first run's report, which is copied when the runs
start from the same params (a shared warm start), so a start is played
once per seed (with `--transcripts`, every checkpoint scored also writes
the episodes it played beside its report, `RUN/eval/<report>.jsonl`, and
every start is played); the table goes to `OUT/rescored.{json,md}`
and, with `--md=PATH`, to its own section of PATH. Reports that list each
task's outcome (all written since `per_task` was added) also give
differences task by task (final − start, final − the baseline's final),
with their standard error over the tasks; on the household game, reports
that list each task's search counts (`per_task_stats`) also compare the
final lead of the searches over chance with the baseline's, task by task
(`--rescore_without_counts` scores again the start and final checkpoints
whose household report was made before evaluation recorded the counts or
one of the statistics the tables read):

  python -m seed_jax.experiments evaluate --out=runs/evidence \
      --num_tasks=256 --md=docs/results.md

With `--fractions=0.2,0.4,0.6,0.8` it also scores, per run, the last kept
checkpoint at or before each fraction of its planned updates: the paper's
Table 6 on common tasks. Training keeps only the latest `max_to_keep`
checkpoints unless `train.train.keep_every` keeps more (e.g. every
evaluated update); a fraction with none kept falls back to an earlier one,
the start at worst, and the table shows which update was scored; each of
those checkpoints is also compared with the baseline's final, task by task.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
from typing import Any, Mapping, Sequence

from etils import epath

from seed_jax import atomic
from seed_jax import episodes
from seed_jax import gin_flags
from seed_jax import results
from seed_jax import runner
from seed_jax import same_run
from seed_jax import sweep
# The experiment's plan (`seed_jax.plans`); its names are also this module's
# (`experiments.plan`, `experiments.METHODS`), as tests and docs call them.
from seed_jax.plans import DEFAULT_GIN, DEFAULT_METHODS, METHODS
from seed_jax.plans import plan, planned_updates

BEGIN = "<!-- seed_jax.experiments summarize: begin -->"
END = "<!-- seed_jax.experiments summarize: end -->"
RESCORED_BEGIN = "<!-- seed_jax.experiments evaluate: begin -->"
RESCORED_END = "<!-- seed_jax.experiments evaluate: end -->"
NO_CHECKPOINT = "no checkpoint yet"  # why `evaluate` leaves a run out
UNFINISHED = "unfinished"  # why, too: the start of the reason
RAW_LIMIT = 2 << 20  # copy the runs' metrics.jsonl next to the md below this


def run_dirs(out: str) -> dict[str, dict[int, str]]:
  """{method: {seed: workdir}} of every OUT/<method>/seed<S> folder.

  Methods come in `METHODS` order, then any others by name; seeds ascending.
  """
  found = {}
  names = sorted(os.listdir(out)) if os.path.isdir(out) else []
  order = [m for m in METHODS if m in names] + [m for m in names
                                                if m not in METHODS]
  for m in order:
    folder = os.path.join(out, m)
    if not os.path.isdir(folder):
      continue
    seeds = sorted(int(d[4:]) for d in os.listdir(folder)
                   if d.startswith("seed") and d[4:].isdigit())
    if seeds:
      found[m] = {s: os.path.join(folder, f"seed{s}") for s in seeds}
  return found


def load_histories(out: str) -> dict[str, dict[int, list[dict[str, Any]]]]:
  """{method: {seed: records}} of every OUT/<method>/seed<S>/metrics.jsonl
  (in `run_dirs` order; runs without records are left out)."""
  found = {}
  for m, by_seed in run_dirs(out).items():
    runs = {s: h for s, h in ((s, runner.read_history(w)) for s, w in
                              by_seed.items()) if h}
    if runs:
      found[m] = runs
  return found


def replace_section(text: str, section: str, *, begin: str = BEGIN,
                    end: str = END) -> str:
  """`text` with the part between `begin` and `end` replaced by `section`
  (appended, with the markers, when there is none); one blank line
  separates the end marker from any text after it.

  Raises:
    ValueError: unless `text` holds either no marker or one `begin` followed
      by one `end` (so that no text of the user's is taken for the section).
  """
  block = f"{begin}\n{section.rstrip()}\n{end}\n"
  counts = (text.count(begin), text.count(end))
  if counts == (0, 0):
    return (text.rstrip() + "\n\n" if text.strip() else "") + block
  if counts != (1, 1) or text.index(end) < text.index(begin):
    problem = ("its end marker comes before its begin marker"
               if counts == (1, 1) else
               f"it has {counts[0]} begin and {counts[1]} end markers")
    raise ValueError(f"{problem} ({begin} ... {end}); it needs one begin "
                     "marker followed by one end marker, or neither")
  head, rest = text.split(begin, 1)
  tail = rest.split(end, 1)[1].lstrip("\n")
  return head + block + ("\n" + tail if tail else "")


def _recorded(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
  """{run: its entry} of every run status.json records, those of earlier
  invocations too."""
  return {**status.get("other_runs", {}), **status.get("runs", {})}


def _planned(runs: Mapping[str, Any]) -> dict[str, dict[int, int]]:
  """{method: {seed: planned updates}} of `_recorded` runs."""
  planned = {}
  for run in runs.values():
    if run.get("num_updates") is not None:
      planned.setdefault(run["method"], {})[int(run["seed"])] = int(
          run["num_updates"])
  return planned


def _planned_updates(workdir: str, recorded: Mapping[str, Mapping[int, int]],
                     method: str, seed: int) -> int:
  """The updates run (method, seed) was started for: as status.json records
  it (`recorded`, from `_planned`), else as the config.gin in `workdir`
  (written as its training started) says, for a run `run` did not start
  or whose status.json is lost.

  Raises:
    FileNotFoundError, ValueError: neither knows (no config.gin, or one
      that does not parse; see `evaluate.run_settings`).
  """
  planned = recorded.get(method, {}).get(seed)
  if planned is None:
    from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
    planned = evaluate.run_settings(workdir)["num_updates"]
  return int(planned)


def _without_metrics(out: str, runs: Mapping[str, Mapping[str, Any]],
                     histories: Mapping[str, Mapping[int, Any]]
                     ) -> dict[str, list[int]]:
  """{method: [seeds]} of the runs of OUT without records in `histories`:
  those with a folder (`run_dirs`) or a status.json entry (`_recorded`
  `runs`), methods and seeds in that order."""
  found = {m: list(by_seed) for m, by_seed in run_dirs(out).items()}
  for run in runs.values():
    if run.get("method") is not None and run.get("seed") is not None:
      seeds = found.setdefault(run["method"], [])
      if int(run["seed"]) not in seeds:
        seeds.append(int(run["seed"]))
  waiting = {m: sorted(s for s in seeds if s not in histories.get(m, {}))
             for m, seeds in found.items()}
  return {m: seeds for m, seeds in waiting.items() if seeds}


def image_folder(md: str) -> str:
  """Where `write_summary` puts the images of the Markdown file `md`: its
  path without the suffix (docs/results.md -> docs/results).

  Raises:
    ValueError: `md` has no suffix (the folder would be `md` itself), is a
      folder, or that path is a file.
  """
  folder, suffix = os.path.splitext(md)
  if not suffix:
    raise ValueError(f"{md} has no suffix (such as .md): its images go in "
                     "the folder of its path without the suffix")
  if os.path.isdir(md):
    raise ValueError(f"{md} is a folder, not a Markdown file")
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise ValueError(f"{md} puts its images in the folder {folder}, but that "
                     "is a file")
  return folder


def write_summary(out: str, md: str | None = None) -> dict[str, Any]:
  """Writes the summary files of OUT (and the section in `md`).

  A run is unfinished when it logged fewer updates than planned, as
  OUT/status.json records, else as its config.gin says (a run with neither
  counts as finished). A run with a folder in OUT or an entry in status.json
  but no metrics yet (failed early, still in its first update) is unfinished
  too, and named (`_without_metrics`).

  Raises:
    FileNotFoundError: when no run of OUT has a metrics.jsonl yet.
    ValueError: a bad `md` (see `image_folder`, `replace_section`), before
      anything is written.
  """
  folder = image_folder(md) if md else None
  if md:
    _replaced(md, "", begin=BEGIN, end=END)  # refused before any work
  histories = load_histories(out)
  if not histories:
    raise FileNotFoundError(f"no OUT/<method>/seed<S>/metrics.jsonl under "
                            f"{out}: no run has finished yet")
  status = runner.read_status(os.path.join(out, runner.STATUS))
  runs = _recorded(status)
  recorded, planned = _planned(runs), {}
  waiting = _without_metrics(out, runs, histories)
  for m, seeds in [*histories.items(), *waiting.items()]:
    for s in seeds:
      try:
        planned.setdefault(m, {})[s] = _planned_updates(
            os.path.join(out, m, f"seed{s}"), recorded, m, s)
      except (FileNotFoundError, ValueError):
        pass  # unknown: `results.summarize` counts the run as finished
  summary = results.summarize(histories, planned=planned, no_metrics=waiting)
  if status:
    summary["commands"] = status.get("commands", [])
    # The runs with numbers, in the tables' order.
    names = [f"{m}/seed{s}" for m, by_seed in histories.items()
             for s in by_seed]
    summary["run_commands"] = {k: runs[k]["command"] for k in names
                               if k in runs}
  atomic.write_text(os.path.join(out, "summary.json"),
                    json.dumps(summary, indent=1))
  for name, rows in (("summary.csv", results.final_rows(summary)),
                     ("sample_efficiency.csv",
                      results.efficiency_rows(summary))):
    atomic.write_text(os.path.join(out, name), results.csv_text(rows))
  targets = [(out, ".")]
  if md:
    targets.append((folder, os.path.basename(folder)))
  for folder, _ in targets:
    results.plot_curves(summary, os.path.join(folder,
                                              "success_vs_updates.png"))
    results.plot_curves(summary, os.path.join(
        folder, "success_vs_env_steps.png"), x="env_steps")
  atomic.write_text(os.path.join(out, "summary.md"),
                    results.markdown(summary, image_dir=".") + "\n")
  if md:
    section = results.markdown(summary, image_dir=targets[1][1])
    section += _provenance(summary, histories, out, md, targets[1])
    _update_section(md, section, begin=BEGIN, end=END)
  return summary


def rescore(out: str, *, num_tasks: int = 256, seed: int = 12345,
            temperature: float = 0.4, methods: Sequence[str] | None = None,
            fractions: Sequence[float] = (), md: str | None = None,
            command: str = "", without_counts: bool = False,
            transcripts: bool = False) -> dict[str, Any]:
  """Scores every finished run's start and final checkpoint on common tasks.

  A run is finished when its last checkpoint is of its planned last update
  (as OUT/status.json records it, else as its config.gin says).

  Args:
    out: the experiment folder (OUT/<method>/seed<S> runs with checkpoints).
    num_tasks, seed, temperature: the evaluation, the same for every run.
    methods: only these methods (default: every method of OUT).
    fractions: also score, for each fraction f, the last checkpoint kept at
      or before f times the run's planned updates (the start when none is):
      the sample-efficiency view on common tasks, with the final as 100%.
      Checkpoints past the latest few are kept only with
      `train.train.keep_every`.
    md: also write the table as a section of this Markdown file.
    command: the command line, recorded with the table.
    without_counts: score again the start and final checkpoints whose kept
      household report lacks what evaluation records now (`_lacks`: a
      final's per-task search counts, a statistic of `results.STATISTICS`;
      made by older code), replacing the report; otherwise such reports
      are used as they are, and their runs are left out of the paired
      search lead or of the missing statistics' tables.
    transcripts: each checkpoint scored here also writes every episode it
      played beside its report (the report's name, `.jsonl`; see
      `evaluate --transcripts`), and a seed's later starts are played too,
      not copied from its first. Reports already kept are reused as they
      are, with or without transcripts.

  Returns:
    `results.rescored` of the reports, plus "left_out": {run: why} for the
    runs of OUT that are not in it (no checkpoint yet, `UNFINISHED`, or one
    that cannot be scored; the Markdown names them too).

  Raises:
    FileNotFoundError: when OUT holds no finished run with a checkpoint.
    ValueError: a method in `methods` that OUT holds no run of; an `md`
      whose markers `replace_section` refuses (before any scoring).
  """
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  found = run_dirs(out)
  unknown = sorted(set(methods or ()) - set(found))
  if unknown:
    raise ValueError(f"no runs of method(s) {unknown} under {out}; it holds "
                     f"{sorted(found)}")
  if md:
    _replaced(md, "", begin=RESCORED_BEGIN, end=RESCORED_END)  # before work
  if fractions and 1 not in fractions:  # the final, as Table 6's last column
    fractions = [*fractions, 1.0]
  recorded = _planned(_recorded(
      runner.read_status(os.path.join(out, runner.STATUS))))
  reports, left_out, countless = {}, {}, set()
  starts = {}  # seed -> the first start report of that seed, for --same_as
  for m, by_seed in found.items():
    if methods is not None and m not in methods:
      continue
    for s, workdir in by_seed.items():
      try:
        kept = sorted({0, *evaluate.checkpoint_steps(workdir)})
      except FileNotFoundError:
        left_out[f"{m}/seed{s}"] = NO_CHECKPOINT
        continue
      last = kept[-1]
      try:
        planned = _planned_updates(workdir, recorded, m, s)
      except (FileNotFoundError, ValueError) as e:
        left_out[f"{m}/seed{s}"] = f"its planned updates are unknown: {e}"
      else:
        if last < planned:  # still training, or stopped early
          left_out[f"{m}/seed{s}"] = (f"{UNFINISHED}: its last checkpoint is "
                                      f"update {last} of {planned} planned")
      if f"{m}/seed{s}" in left_out:
        print(f"{m}/seed{s}: left out, {left_out[f'{m}/seed{s}']}",
              flush=True)
        continue
      wanted = [("start", 0), ("final", last)] + [
          (f, max(k for k in kept if k <= f * planned + 1e-9))
          for f in fractions]
      pair = reports.setdefault(m, {}).setdefault(s, {})
      for which, step in wanted:
        path = evaluate.report_path(
            workdir, step, num_tasks=num_tasks, seed=seed,
            temperature=temperature) + ".json"
        report = _read_report(path) if os.path.exists(path) else None
        # Only the start and the final feed the search, take and look tables.
        lacks = (_lacks(report, final=which == "final")
                 if report and isinstance(which, str) else "")
        if lacks and not without_counts:
          countless.add(path)
        if report is None or (lacks and without_counts):
          label = (which if isinstance(which, str)
                   else f"{100 * which:g}% of {planned}")
          print(f"{m}/seed{s}: scoring update {step} ({label}) on "
                f"{num_tasks} tasks per split"
                + (f", again: its report has no {lacks}" if lacks else ""),
                flush=True)
          # Runs that share a warm start share their start's report.
          same = (["--same_as", starts[s]]
                  if which == "start" and s in starts and not transcripts
                  else [])
          if transcripts:
            same = ["--transcripts", path[:-len(".json")] + ".jsonl"]
          try:
            evaluate.main(["--workdir", workdir, "--step", str(step),
                           "--num_tasks", str(num_tasks), "--seed", str(seed),
                           "--temperature", str(temperature), *same])
          except SystemExit as e:  # the run's own problem: say, go on
            if not isinstance(e.code, str):
              raise  # a flag evaluate refused: ours, not the run's
            left_out[f"{m}/seed{s}"] = (f"update {step} cannot be scored: "
                                        f"{e.code}")
            print(f"{m}/seed{s}: left out, {left_out[f'{m}/seed{s}']}",
                  flush=True)
            reports[m].pop(s)
            break
          report = _read_report(path)
        asked = dict(step=step, num_tasks=num_tasks, seed=seed,
                     temperature=temperature)
        differ = {k: report[k] for k, v in asked.items() if report[k] != v}
        if differ:  # a report under this name made with other settings
          raise ValueError(f"{path} was made with {differ}, not "
                           f"{ {k: asked[k] for k in differ} }: delete it "
                           "and rerun to score that checkpoint again")
        if which == "start":
          starts.setdefault(s, path)
        if isinstance(which, str):
          pair[which] = report
        else:
          pair.setdefault("efficiency", {})[f"{which:g}"] = report
    if m in reports and not reports[m]:
      reports.pop(m)
  if countless:
    print(f"{len(countless)} report(s) of household runs lack per-task "
          "search counts or statistics that evaluation records now (made "
          "by older code), so their runs are left out of the paired search "
          "lead or of those statistics' tables; --rescore_without_counts "
          "scores those checkpoints again", flush=True)
  if not reports:
    raise FileNotFoundError(f"no finished OUT/<method>/seed<S> run under "
                            f"{out} has a checkpoint that could be scored; "
                            f"left out: {left_out}")
  summary = results.rescored(reports)
  summary["command"] = command
  summary["left_out"] = left_out
  atomic.write_text(os.path.join(out, "rescored.json"),
                    json.dumps(summary, indent=1))
  text = results.rescored_markdown(summary)
  if left_out:
    text += "\nLeft out: " + "; ".join(
        f"{k} ({why})" for k, why in left_out.items()) + ".\n"
  if command:
    text += f"\nProduced by:\n\n```bash\n{command}\n```\n"
  atomic.write_text(os.path.join(out, "rescored.md"), text)
  if md:
    _update_section(md, text, begin=RESCORED_BEGIN, end=RESCORED_END)
  return summary


def _lacks(report: Mapping[str, Any], *, final: bool) -> str:
  """What a household report (one with search statistics) lacks of what
  evaluation records now, "" when nothing or another game's: "per-task
  search counts" (only a final's: the paired search lead reads them) and
  the `results.STATISTICS` it has no record of, in its "per_task_stats"
  when it has them, else in its metrics."""
  metrics = report.get("metrics", {})
  splits = sorted({k.split("/")[1] for k in metrics
                   if k.endswith("/search_usual")})
  if not splits:
    return ""
  counts = report.get("per_task_stats")
  missing = sorted({name for split in splits for name in results.STATISTICS
                    if (name not in counts.get(split, {}) if counts
                        else f"eval/{split}/{name}" not in metrics)},
                   key=results.STATISTICS.index)
  return " and ".join(
      ([] if counts or not final else ["per-task search counts"])
      + ([", ".join(missing)] if missing else []))


def _read_report(path: str) -> dict[str, Any]:
  """An evaluation report; a damaged one (it does not parse, lacks a field
  the table reads (`results.report_problem`), its per-task outcomes are
  not strings of 0s and 1s or its per-task statistics not what
  `episodes.stats_text` writes) is an error that names it."""
  recover = ("evaluate writes reports whole, so it was damaged: delete it and "
             "rerun to score that checkpoint again")
  try:
    with open(path) as f:
      report = json.load(f)
  except ValueError as e:
    raise ValueError(f"{path} does not parse ({e}); {recover}") from None
  problem = results.report_problem(report)
  if problem:
    raise ValueError(f"{path} {problem}; {recover}")
  per_task = report.get("per_task", {})
  for split, outcomes in per_task.items():
    try:
      results.check_outcomes(outcomes)
    except ValueError as e:
      raise ValueError(f"{path} has bad per_task[{split!r}] ({e}); "
                       f"{recover}") from None
  for split, texts in report.get("per_task_stats", {}).items():
    try:
      episodes.stats_from_text(texts)
    except ValueError as e:
      raise ValueError(f"{path} has bad per_task_stats[{split!r}] ({e}); "
                       f"{recover}") from None
  return report


def _update_section(md: str, text: str, *, begin: str, end: str) -> None:
  """Puts `text` between the markers in the Markdown file `md` (created if
  absent), rewriting the file whole or not at all.

  Raises:
    ValueError: markers `replace_section` refuses, named with `md`; the file
      is left as it is.
  """
  atomic.write_text(md, _replaced(md, text, begin=begin, end=end))


def _replaced(md: str, text: str, *, begin: str, end: str) -> str:
  """The Markdown file `md` (empty if absent) with `text` between the
  markers; called with "" before any work, to refuse bad markers early.

  Raises:
    ValueError: `md` is a folder, or has markers `replace_section` refuses,
      named with `md`.
  """
  if os.path.isdir(md):
    raise ValueError(f"--md={md} is a folder; give a Markdown file")
  old = epath.Path(md).read_text() if os.path.exists(md) else ""
  try:
    return replace_section(old, text, begin=begin, end=end)
  except ValueError as e:
    raise ValueError(f"{md}: {e}; fix it by hand (nothing was written "
                     "there), then rerun") from None


def _provenance(summary, histories, out, md, target) -> str:
  """How the numbers were made: commands, and the raw metrics when small."""
  folder, rel = target
  lines = []
  if summary.get("commands"):
    lines += ["", "Produced by:", "", "```bash", *summary["commands"],
              f"python -m seed_jax.experiments summarize --out={out} "
              f"--md={md}",
              "```", "", "Each run's command:", "", "```bash",
              *summary["run_commands"].values(), "```"]
  sizes = sum(os.path.getsize(os.path.join(out, m, f"seed{s}",
                                            "metrics.jsonl"))
              for m, runs in histories.items() for s in runs)
  if sizes <= RAW_LIMIT:
    links = []
    for m, runs in histories.items():
      for s in runs:
        dest = os.path.join(folder, "metrics", f"{m}_seed{s}.jsonl")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(out, m, f"seed{s}", "metrics.jsonl"),
                        dest)
        links.append(f"[{m} seed {s}]({rel}/metrics/{m}_seed{s}.jsonl)")
    lines += ["", "Raw metrics (metrics.jsonl of each run): " +
              ", ".join(links) + "."]
  return "\n".join(lines) + "\n"


# -- entry point --------------------------------------------------------------


def _ints(text: str) -> list[int]:
  """"0,1,2" -> [0, 1, 2]; at least one, none negative."""
  try:
    out = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected comma-separated integers, got {text!r}") from None
  if not out:
    raise argparse.ArgumentTypeError(f"no seed in {text!r}")
  if any(x < 0 for x in out):
    raise argparse.ArgumentTypeError(
        f"seeds must be >= 0 (runs go in OUT/<method>/seed<S>), got {text!r}")
  return out


def _md(text: str) -> str:
  """A Markdown path with a suffix (see `image_folder`)."""
  try:
    image_folder(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None
  return text


def _names(text: str) -> list[str]:
  """"grpo,seed" -> ["grpo", "seed"]; at least one."""
  out = [x.strip() for x in text.split(",") if x.strip()]
  if not out:
    raise argparse.ArgumentTypeError(f"no name in {text!r}")
  return out


def _temperature(text: str) -> float:
  t = float(text)
  if not (math.isfinite(t) and t >= 0):
    raise argparse.ArgumentTypeError(
        f"must be a finite number >= 0 (0: greedy), got {text}")
  return t


def _floats(text: str) -> list[float]:
  """"0.2,0.6" -> [0.2, 0.6]; each fraction in (0, 1]."""
  out = [float(x) for x in text.split(",") if x.strip()]
  bad = [f for f in out if not 0 < f <= 1]
  if bad:
    raise argparse.ArgumentTypeError(f"fractions must be in (0, 1], got {bad}")
  return out


def parse_flags(argv):
  parser = argparse.ArgumentParser(
      description="GRPO, SEED and ablations over seeds: run (resumable), "
      "status, summarize, evaluate (every run again on common tasks).")
  sub = parser.add_subparsers(dest="command", required=True)
  run = sub.add_parser("run", help="start or resume every run")
  run.add_argument("--out", required=True)
  run.add_argument("--methods", type=_names,
                   default=list(DEFAULT_METHODS),
                   help=f"comma-separated, of {list(METHODS)} (default "
                   f"{','.join(DEFAULT_METHODS)})")
  run.add_argument("--seeds", type=_ints, default=[0, 1, 2])
  run.add_argument("--gin_file", action="append", default=None,
                   help=f"default {DEFAULT_GIN}")
  run.add_argument("--gin", action="append", default=[], metavar="BINDING",
                   help="a gin binding for every run, e.g. NUM_UPDATES=50 "
                   "(--gin.NAME=VALUE works too)")
  run.add_argument("--parallel", type=int, default=1)
  run.add_argument("--dry_run", action="store_true",
                   help="print each run's command and state; run nothing")
  status = sub.add_parser("status", help="the runs' states and progress")
  status.add_argument("--out", required=True)
  summ = sub.add_parser("summarize", help="tables, curves, sample efficiency")
  summ.add_argument("--out", required=True)
  summ.add_argument("--md", type=_md, default=None,
                    help="also write a Markdown section here (e.g. "
                    "docs/results.md), images in its folder docs/results/ "
                    "(the path without its suffix; so a path without a "
                    "suffix is refused)")
  ev = sub.add_parser("evaluate", help="score every finished run's start "
                      "and final checkpoint on the same tasks (resumable)")
  ev.add_argument("--out", required=True)
  ev.add_argument("--num_tasks", type=int, default=256,
                  help="tasks per split")
  ev.add_argument("--seed", type=int, default=12345,
                  help="seeds the sampling keys (the tasks are always the "
                  "first --num_tasks of each split)")
  ev.add_argument("--temperature", type=_temperature, default=0.4)
  ev.add_argument("--methods", type=_names, default=None,
                  help="comma-separated (default: every method of OUT)")
  ev.add_argument("--fractions", type=_floats, default=(),
                  help="also score the last kept checkpoint at or before "
                  "these fractions of each run's planned updates, e.g. "
                  "0.2,0.4,0.6,0.8; the final is the 100%% column (keep "
                  "them with train.train.keep_every)")
  ev.add_argument("--md", default=None,
                  help="also write the table as a section of this file")
  ev.add_argument("--rescore_without_counts", action="store_true",
                  help="score again the start and final checkpoints whose "
                  "kept household report lacks the per-task search counts "
                  "or a statistic evaluation records now (made by older "
                  "code), so that every run is in every table")
  ev.add_argument("--transcripts", action="store_true",
                  help="write every episode a scoring plays beside its "
                  "report (RUN/eval/<report>.jsonl); each run's start is "
                  "then played, not copied from its seed's first")
  # run's --gin.NAME=VALUE and --gin NAME=VALUE, in their order.
  known, rest = parser.parse_known_args(gin_flags.in_order(argv))
  for arg in rest:
    parser.error(f"unrecognized argument "
               f"{gin_flags.as_written(arg, argv)!r}")
  return known


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_flags(argv)
  try:
    if args.command == "status":
      print(runner.status_report(args.out))
      return 0
    if args.command == "summarize":
      summary = write_summary(args.out, args.md)
      print(results.markdown(summary, image_dir=None))
      return 0
    if args.command == "evaluate":
      if args.num_tasks < 1:
        raise ValueError(f"--num_tasks must be at least 1, got "
                         f"{args.num_tasks}")
      command = sweep.shell_command(
          ["python", "-m", "seed_jax.experiments", *argv])
      summary = rescore(args.out, num_tasks=args.num_tasks, seed=args.seed,
                        temperature=args.temperature, md=args.md,
                        methods=args.methods, fractions=args.fractions,
                        command=command,
                        without_counts=args.rescore_without_counts,
                        transcripts=args.transcripts)
      print(results.rescored_markdown(summary))
      failed = {k: v for k, v in summary["left_out"].items()
                if not v.startswith((NO_CHECKPOINT, UNFINISHED))}
      if failed:
        print(f"left out, their checkpoints cannot be scored: {failed}",
              flush=True)
      return 1 if failed else 0
    gin_files = args.gin_file or [DEFAULT_GIN]
    runs = plan(args.out, methods=args.methods, seeds=args.seeds,
                gin_files=gin_files, bindings=args.gin)
    if args.parallel < 1:
      raise ValueError(f"--parallel must be at least 1, got {args.parallel}")
    same_run.check_seed(gin_files, args.gin)  # a seed bound past SEED
    # A typo in a binding fails here, before any run starts.
    num_updates = {run.name: planned_updates(run) for run in runs}
    same_run.check_distinct(runs)  # an ablation that is its baseline again
    same_run.check_budget(runs, {f"{m}/seed{s}": w for m, by_seed in
                                 run_dirs(args.out).items()
                                 for s, w in by_seed.items()})
    done = {run.name: runner.is_done(run.workdir, num_updates[run.name])
            for run in runs}
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"error: {e}") from e
  if args.dry_run:
    for run in runs:
      print(f"# {run.name}: {'done' if done[run.name] else 'to run'}, "
            f"{num_updates[run.name]} updates\n{run.command()}")
    return 0
  command = sweep.shell_command(
      ["python", "-m", "seed_jax.experiments", *argv])
  # `kill PID` of the runner stops its runs too, as Ctrl-C does.
  signal.signal(signal.SIGTERM, _interrupt)
  try:
    status = runner.execute(runs, num_updates, out=args.out,
                     parallel=args.parallel, command=command)
  except runner.BusyError as e:
    raise SystemExit(f"error: {e}") from None
  except (OSError, ValueError) as e:  # the runner's own, its runs stopped
    raise SystemExit(f"error: {e}; the runner stopped, and with it the runs "
                     "it had started: rerun the same command to resume"
                     ) from e
  except KeyboardInterrupt:
    print("interrupted; rerun the same command to resume", flush=True)
    return 130
  failed = [k for k, r in status["runs"].items() if r["state"] != "done"]
  if failed:
    print(f"failed: {failed}; see their log.txt", flush=True)
  return 1 if failed else 0


def _interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


if __name__ == "__main__":
  sys.exit(main())
