"""Experiment summaries: final success, learning curves, sample efficiency.

Everything here is a pure function of the runs' metric histories,
`histories[method][seed] = [record, ...]`, each record one line of a run's
metrics.jsonl: `{"update": 10, "env_steps": 412.0, "eval/seen/success": 0.5,
"eval/seen/success/heat": 0.25, ...}` ("env_steps" counts that update's
rollout only; evaluations are logged at the updates they ran), or of their
evaluation reports (`rescored`). Only `read_metrics` touches files. The
Markdown, CSV rows and figures are made in `seed_jax.results_tables`, whose
names are reachable here too (`results.markdown`, `results.pct`, ...).

Conventions, stated again in the Markdown they produce:
  * success is a rate in [0, 1]; tables print it in percent;
  * "mean ± std" is over seeds, std the sample standard deviation (ddof 1;
    0 for a single seed, whose tables show the value alone);
  * a run's final success is that of its last evaluated update;
  * the sample-efficiency view (the paper's Table 6) reads, for each fraction
    f of a method's updates N (its runs' planned updates when known, else
    their largest update), the success at the last update evaluated by every
    seed at or before f * N;
  * a run known to be unfinished (fewer updates logged than planned, or none
    logged yet) is left out of both, of the diagnostics and of the curves
    (which show a method's unfinished runs only while it has no finished
    one, and say so in the legend), and named; so is a finished run never
    evaluated, left out of that split's tables;
  * runs evaluated on different numbers of tasks are pooled as they are,
    and the Markdown names the counts.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from seed_jax import episodes
from seed_jax.results_tables import SPLITS
from seed_jax.results_tables import csv_text
from seed_jax.results_tables import efficiency_rows
from seed_jax.results_tables import final_rows
from seed_jax.results_tables import markdown
from seed_jax.results_tables import pct
from seed_jax.results_tables import plot_curves
from seed_jax.results_tables import rescored_markdown
from seed_jax.results_tables import table_lines

__all__ = [  # `results_tables`'s too: callers use `results.markdown`, ...
    "SPLITS", "FRACTIONS", "EPISODE", "DIAGNOSTICS", "SKILL_DIAGNOSTICS",
    "REPORT_KEYS", "report_problem", "read_metrics", "mean_std",
    "cumulative_env_steps", "evaluations", "summarize", "check_outcomes",
    "by_task", "rescored", "csv_text", "efficiency_rows", "final_rows",
    "markdown", "pct", "plot_curves", "rescored_markdown", "table_lines"]

FRACTIONS = (0.2, 0.4, 0.6, 0.8, 1.0)
# An evaluation report's environment and episode settings: `rescored` pairs
# only reports that agree on them.
EPISODE = ("env_name", "max_steps", "history_length", "invalid_action")
# What a report written before a setting was recorded played: every such
# report sent the no-op for an inadmissible action.
EPISODE_DEFAULTS = {"invalid_action": "no_op"}
# Training scalars averaged over each run's updates: SEED's signal health.
DIAGNOSTICS = ("success_rate", "valid_action_ratio", "analyses_parsed",
               "opd_gate_mean", "opd_active_ratio", "skill_logp_gap",
               "skill_logp_gap_success", "skill_logp_gap_failure", "kl",
               "entropy")
# Diagnostics of the rows with a parsed analysis (see `_diagnostic`).
SKILL_DIAGNOSTICS = ("skill_logp_gap", "skill_logp_gap_success",
                     "skill_logp_gap_failure")

Histories = Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]]


class _NonFinite(ValueError):
  """NaN or Infinity in a metrics.jsonl line (not strict JSON)."""


def _refuse_constant(name: str):
  raise _NonFinite(f"{name} is not strict JSON")


def _read_key(key: str) -> bool:
  """Whether the summaries here read `key` of a record as a number."""
  return key.startswith("eval/") or key == "env_steps" or key in DIAGNOSTICS


def _non_numeric(record: Mapping[str, Any]) -> str | None:
  """The first key read here (`_read_key`) whose value is no number or null
  (a bool, a string, a list...), else None."""
  for key, value in record.items():
    if (value is not None and _read_key(key)
        and (isinstance(value, bool)
             or not isinstance(value, (int, float)))):
      return key
  return None


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The records of a run's metrics.jsonl, in order.

  Training writes each update once, in increasing order: it rewrites the
  file whole from its history after each update, and on a resume from the
  history its checkpoint keeps (`seed_jax.train`). A repeated update (two
  files joined, lines pasted by hand) would count that update's environment
  steps and diagnostics twice, and one out of order would end the file on
  an update that is not its last (`runner.is_done`, `sweep.final_metrics`
  read the last line), so both are refused.

  Raises:
    ValueError: naming the file and line of a line that is not a JSON object
      with an integer "update", that holds NaN or Infinity, whose
      "env_steps", "eval/..." or `DIAGNOSTICS` value is not a number or
      null, or whose update is not above the previous line's (naming the
      line that has it or the larger one): the file was damaged or edited.
  """
  records, lines = [], {}  # lines: {update: its line}
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line, parse_constant=_refuse_constant)
      except _NonFinite as e:
        problem = f"{e} (training writes null for a non-finite value)."
      except ValueError as e:
        problem = f"not JSON ({e}); a truncated file?"
      else:
        # bool is an int to isinstance; 2.0, "2" and null are no update.
        if isinstance(record, dict) and type(record.get("update")) is int:
          problem = _misplaced(record["update"], lines)
          bad = _non_numeric(record)
          if problem is None and bad is None:
            lines[record["update"]] = n
            records.append(record)
            continue
          problem = problem or (f"{bad!r} is {record[bad]!r:.100}, not a "
                                "number (or null).")
        else:
          problem = (f"{record!r:.200} is not a JSON object with an integer "
                     "\"update\".")
      raise ValueError(
          f"{path} line {n}: {problem} Delete the file and resume the run: "
          "training writes it again from the history its checkpoint keeps")
  return records


def _misplaced(update: int, lines: Mapping[int, int]) -> str | None:
  """Why `update` cannot follow the updates of `lines` ({update: line},
  increasing), else None.

  Example: update 5 after updates 4, 5, 6 on lines 5, 6, 7 -> "update 5
  again, already on line 6 (training writes each update once, in order)."
  """
  why = "(training writes each update once, in order)."
  if update in lines:
    return f"update {update} again, already on line {lines[update]} {why}"
  last = next(reversed(lines), None)  # the largest: `lines` increase
  if last is not None and update < last:
    return (f"update {update} after update {last} on line {lines[last]} "
            f"{why}")
  return None


def mean_std(values: Sequence[float]) -> dict[str, Any]:
  """{"mean", "std" (ddof 1; 0 for one value), "n", "values"}; None if empty."""
  values = [float(v) for v in values]
  if not values:
    return {"mean": None, "std": None, "n": 0, "values": []}
  std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
  return {"mean": float(np.mean(values)), "std": std, "n": len(values),
          "values": values}


def cumulative_env_steps(records: Sequence[Mapping[str, Any]]
                         ) -> dict[int, float]:
  """{update: environment steps of the rollouts up to and including it}.

  Example: records with updates 0, 1, 2 and env_steps -, 8, 6 ->
  {0: 0.0, 1: 8.0, 2: 14.0}.
  """
  total, out = 0.0, {}
  for r in sorted(records, key=lambda r: r["update"]):
    total += float(r.get("env_steps") or 0.0)
    out[int(r["update"])] = total
  return out


def evaluations(records: Sequence[Mapping[str, Any]], split: str
                ) -> dict[int, dict[str, float]]:
  """{update: {"all": success, family: success, ...}} of a split's evals."""
  prefix = f"eval/{split}/success"
  out = {}
  for r in records:
    if r.get(prefix) is None:
      continue
    row = {"all": float(r[prefix])}
    row.update({k[len(prefix) + 1:]: float(v) for k, v in r.items()
                if k.startswith(prefix + "/") and v is not None})
    out[int(r["update"])] = row
  return out


def _final(runs, split):
  """{family: mean_std over seeds of the last evaluation} and its updates."""
  finals = {}
  for seed, records in runs.items():
    ev = evaluations(records, split)
    if ev:
      finals[seed] = ev[max(ev)] | {"update": max(ev)}
  families = sorted({f for v in finals.values() for f in v} - {"update", "all"})
  out = {fam: mean_std([v[fam] for v in finals.values() if fam in v])
         for fam in ["all"] + families}
  return out, sorted({v["update"] for v in finals.values()})


def _curve(runs, split):
  """Mean and std over seeds of the overall success, per evaluated update."""
  per_seed = {s: evaluations(r, split) for s, r in runs.items()}
  steps = {s: cumulative_env_steps(r) for s, r in runs.items()}
  points = []
  for u in sorted({u for ev in per_seed.values() for u in ev}):
    have = [s for s, ev in per_seed.items() if u in ev]
    stats = mean_std([per_seed[s][u]["all"] for s in have])
    points.append(dict(update=u, env_steps=float(np.mean(
        [steps[s].get(u, 0.0) for s in have])), mean=stats["mean"],
                       std=stats["std"], n=stats["n"]))
  return points


def _sample_efficiency(runs, split, num_updates, fractions):
  """Table 6's rows over `runs`, each evaluated on `split` at least once."""
  per_seed = {s: evaluations(r, split) for s, r in runs.items()}
  steps = {s: cumulative_env_steps(r) for s, r in runs.items()}
  common = sorted(set.intersection(*(set(ev) for ev in per_seed.values()))
                  if per_seed else ())
  out = []
  for f in fractions:
    target = None if num_updates is None else f * num_updates
    at = [u for u in common if target is not None and u <= target + 1e-9]
    if not at:
      out.append(dict(fraction=f, target=target, update=None, mean=None,
                      std=None, n=0, env_steps=None))
      continue
    u = at[-1]
    stats = mean_std([ev[u]["all"] for ev in per_seed.values()])
    out.append(dict(fraction=f, target=target, update=u,
                    mean=stats["mean"], std=stats["std"], n=stats["n"],
                    env_steps=float(np.mean([s[u] for s in steps.values()]))))
  return out


def _task_counts(records, split):
  """The numbers of tasks (`eval/<split>/tasks`) a run's evaluations of
  `split` record, sorted (none in files written before they were)."""
  return sorted({int(r[f"eval/{split}/tasks"]) for r in records
                 if r.get(f"eval/{split}/success") is not None
                 and r.get(f"eval/{split}/tasks") is not None})


def summarize(histories: Histories, *,
              fractions: Sequence[float] = FRACTIONS,
              diagnostics: Sequence[str] = DIAGNOSTICS,
              planned: Mapping[str, Mapping[int, int]] | None = None,
              no_metrics: Mapping[str, Sequence[int]] | None = None
              ) -> dict[str, Any]:
  """Final success, curves, sample efficiency and diagnostics per method.

  Args:
    histories: {method: {seed: metrics.jsonl records}}; methods keep their
      order, runs without records are left out (but see `no_metrics`).
    fractions: fractions of the updates for the sample-efficiency view.
    diagnostics: training scalars to average over each run's updates.
    planned: {method: {seed: the updates the run was started for}}, where
      known: a run that logged fewer is unfinished and left out of "final",
      "sample_efficiency", "diagnostics" and "curves" (a method with only
      unfinished runs has none, but its curves, over those runs), and a
      method's N is its largest planned number of updates.
    no_metrics: {method: [seeds]} of runs known to exist (a folder, a
      status.json entry) that logged nothing yet: unfinished, listed in
      "runs" and "unfinished" (their methods after those of `histories`).

  Returns:
    A JSON-serializable dict:
      "methods": [method, ...]
      "runs": {method: {seed: {"last_update", "last_eval_update",
               "env_steps" (all three None: no metrics yet), "planned"
               (None: not known), "finished"}}}
      "num_updates": {method: N, see `planned` (None: not known)}
      "unfinished": ["method/seedS", ...], left out as above
      "unevaluated": {"method/seedS": [splits]}: finished runs without an
                     evaluation of those splits, so in none of their tables
      "eval_tasks": {split: {"method/seedS": [numbers of tasks]}} of the
                    runs in that split's tables (`_task_counts`)
      "final": {method: {split: {"all" | family: mean_std dict}}}
      "final_updates": {method: {split: [the seeds' last evaluated updates]}}
      "curves": {method: {split: [{"update", "env_steps", "mean", "std",
                "n"}, ...]}}  (env_steps: cumulative, mean over seeds)
      "sample_efficiency": {method: {split: [{"fraction", "target",
                            "update", "mean", "std", "n", "env_steps"}]}}
      "diagnostics": {method: {name: mean_std of the finished runs' averages
                      over the updates that measured it (`_diagnostic`)}}
  """
  out = {k: {} for k in ("runs", "num_updates", "final", "final_updates",
                         "curves", "sample_efficiency", "diagnostics",
                         "unevaluated")}
  out["methods"], out["unfinished"] = [], []
  out["eval_tasks"] = {split: {} for split in SPLITS}
  waiting = {m: sorted({int(s) for s in seeds})
             for m, seeds in (no_metrics or {}).items()}
  for method in [*histories, *(m for m in waiting if m not in histories)]:
    runs = {int(s): list(r) for s, r in sorted(histories.get(
        method, {}).items()) if r}
    empty = [s for s in waiting.get(method, ()) if s not in runs]
    if not runs and not empty:
      continue
    out["methods"].append(method)
    steps = {s: cumulative_env_steps(r) for s, r in runs.items()}
    plan = {s: (planned or {}).get(method, {}).get(s) for s in [*runs, *empty]}
    finished = {s: plan[s] is None or max(steps[s]) >= plan[s] for s in runs}
    entries = {s: dict(last_update=max(steps[s]),
                       last_eval_update=max(evaluations(r, "seen"),
                                            default=None),
                       env_steps=steps[s][max(steps[s])], planned=plan[s],
                       finished=finished[s]) for s, r in runs.items()}
    entries |= {s: dict(last_update=None, last_eval_update=None,
                        env_steps=None, planned=plan[s], finished=False)
                for s in empty}
    out["runs"][method] = {str(s): entries[s] for s in sorted(entries)}
    done = {s: r for s, r in runs.items() if finished[s]}
    out["unfinished"] += [f"{method}/seed{s}" for s in sorted(entries)
                          if s not in done]
    n = max([plan[s] if plan[s] is not None else max(steps[s]) for s in runs]
            + [plan[s] for s in empty if plan[s] is not None], default=None)
    out["num_updates"][method] = n
    for key in ("final", "final_updates", "curves", "sample_efficiency"):
      out[key][method] = {}
    for split in SPLITS:
      rated = {s: r for s, r in done.items() if evaluations(r, split)}
      for s in sorted(done.keys() - rated.keys()):
        out["unevaluated"].setdefault(f"{method}/seed{s}", []).append(split)
      out["eval_tasks"][split].update(
          {f"{method}/seed{s}": _task_counts(r, split)
           for s, r in rated.items()})
      (out["final"][method][split],
       out["final_updates"][method][split]) = _final(rated, split)
      out["curves"][method][split] = _curve(done or runs, split)
      out["sample_efficiency"][method][split] = _sample_efficiency(
          rated, split, n, fractions)
    diag = {}
    for name in diagnostics:
      per_run = [np.mean(vals) for vals in (
          _diagnostic(r, name) for r in done.values()) if vals]
      if per_run:
        diag[name] = mean_std(per_run)
    out["diagnostics"][method] = diag
  return out


def _diagnostic(records: Sequence[Mapping[str, Any]], name: str
                ) -> list[float]:
  """The values of `name` in a run's records, those an update measured.

  `SKILL_DIAGNOSTICS` are measured on rows with a parsed analysis only, so
  they count only where "analyses_parsed" is present and nonzero: files
  written before the trainer left them out of the other updates hold 0.0
  there (every update of a method that does not analyze, as GRPO).
  """
  if name in SKILL_DIAGNOSTICS:
    records = [x for x in records if x.get("analyses_parsed")]
  return [float(x[name]) for x in records if x.get(name) is not None]


def check_outcomes(outcomes: Any) -> None:
  """Raises a ValueError unless `outcomes` is a non-empty string of 0s and
  1s (one evaluation's per-task outcomes, see `seed_jax.evaluate`; every
  evaluation scores at least one task)."""
  if not isinstance(outcomes, str) or not outcomes or outcomes.strip("01"):
    raise ValueError(f"per-task outcomes must be a string of 0s and 1s, got "
                     f"{outcomes!r:.80}")


def by_task(pairs: Sequence[tuple[str, str]]) -> dict[str, Any] | None:
  """The success difference a − b of two evaluations of the same tasks,
  task by task.

  Args:
    pairs: one (a, b) per seed, each an evaluation's per-task outcomes in
      task order ("0110...", see `seed_jax.evaluate`).

  Returns:
    {"mean": the mean over seeds of the mean difference over tasks, "se":
     its standard error over the tasks, sqrt(sum_s var_s / n_s) / seeds with
     var_s the sample variance of seed s's n_s differences (the evaluation's
     own noise, the seeds' warm starts held fixed), "n_tasks": n_s,
     "seeds"}; None for no pairs.

  Raises:
    ValueError: an outcome that is not a string of 0s and 1s, or outcomes
      of different lengths.

  Example: by_task([("0110", "0100")]) -> mean 0.25, se 0.25, 4 tasks.
  """
  if not pairs:
    return None
  for pair in pairs:
    for x in pair:
      check_outcomes(x)
  if len({len(x) for pair in pairs for x in pair}) > 1:
    raise ValueError("per-task outcomes of different lengths: "
                     f"{sorted({len(x) for pair in pairs for x in pair})}")
  diffs = [np.array([int(c) for c in a]) - np.array([int(c) for c in b])
           for a, b in pairs]
  n = len(diffs[0])
  var = sum(float(np.var(d, ddof=1)) if n > 1 else 0.0 for d in diffs)
  return {"mean": float(np.mean([d.mean() for d in diffs])),
          "se": float(np.sqrt(var / n) / len(diffs)), "n_tasks": n,
          "seeds": len(diffs)}


# The household statistics `rescored` averages, {name: metric} by table;
# each table's first is in every report that has the table's statistics.
SEARCH_KEYS = {"usual": "search_usual", "chance": "search_usual_chance",
               "lead": "search_usual_over_chance",
               "lead_se": "search_usual_over_chance_se"}
TAKE_KEYS = {"took": "took_goal", "reached": "reached_goal_place",
             "took_after": "took_after_reach", "after": "won_after_take",
             "steps": "steps_to_take"}
LOOK_KEYS = {"steps": "look_steps", "new": "look_new_place",
             "revisit": "look_revisit", "other": "look_other",
             "invalid": "look_invalid", "invalid_take": "look_invalid_take"}

# The per-episode statistics those tables read, as a household report's
# "per_task_stats" names them (the "_se" errors are the report's own).
STATISTICS = tuple(key for keys in (SEARCH_KEYS, TAKE_KEYS, LOOK_KEYS)
                   for key in keys.values() if not key.endswith("_se"))

# The search statistic `search_by_task` compares (`household.search_stats`).
LEAD = "search_usual_over_chance"


def search_by_task(pairs: Sequence[tuple[Mapping[str, Any], Mapping[
    str, Any]]], split: str) -> dict[str, Any] | None:
  """The lead over chance of a's searches less b's, task by task.

  Args:
    pairs: one (a, b) per seed, two `seed_jax.evaluate` reports of the same
      tasks; pairs where either lacks per-task search statistics for
      `split` (reports written before they were recorded) are left out.
    split: "seen" or "unseen".

  Returns:
    {"mean": the mean over seeds of a's lead less b's (a fraction), "se":
     its standard error over the tasks, sqrt(sum_s se_s^2) / seeds with se_s
     that of seed s's paired difference (`episodes.paired_ratio_diffs`),
     "seeds"}; None where no pair has the statistics or a side of every
     pair made no search in vain.

  Raises:
    ValueError: per-task statistics that do not parse, named by split.
  """
  diffs = []
  for a, b in pairs:
    texts = [r.get("per_task_stats", {}).get(split) for r in (a, b)]
    if None in texts:
      continue
    try:
      got = episodes.paired_ratio_diffs(
          *(episodes.stats_from_text(t) for t in texts))
    except ValueError as e:
      raise ValueError(f"per_task_stats[{split!r}]: {e}") from None
    if LEAD in got:
      diffs.append((got[LEAD], got.get(f"{LEAD}_se", 0.0)))
  if not diffs:
    return None
  return {"mean": float(np.mean([d for d, _ in diffs])),
          "se": float(np.sqrt(sum(se ** 2 for _, se in diffs)) / len(diffs)),
          "seeds": len(diffs)}


# What `rescored` reads of every evaluation report (`seed_jax.evaluate`).
REPORT_KEYS = ("step", "num_tasks", "seed", "temperature", "metrics")


def report_problem(report: Any) -> str | None:
  """What a damaged evaluation report lacks that `rescored` reads, or None.

  Example: a report whose metrics have no unseen success -> "has no
  metrics['eval/unseen/success']".
  """
  if not isinstance(report, dict):
    return f"is a {type(report).__name__}, not a report"
  missing = [k for k in REPORT_KEYS if k not in report]
  if missing:
    return f"has no {', '.join(missing)}"
  if not isinstance(report["metrics"], dict):
    return f"has metrics {report['metrics']!r:.80}, not a dict"
  read = [f"eval/{split}/success" for split in SPLITS]
  missing = [f"metrics[{k!r}]" for k in read if k not in report["metrics"]]
  if missing:
    return f"has no {', '.join(missing)}"
  if not isinstance(report.get("per_task", {}), dict):
    return f"has per_task {report['per_task']!r:.80}, not outcomes by split"
  if not isinstance(report.get("per_task_stats", {}), dict):
    return (f"has per_task_stats {report['per_task_stats']!r:.80}, not "
            "statistics by split")
  return None


def _named_reports(reports) -> Iterator[tuple[str, Any]]:
  """(name, report) of each report of `rescored`'s argument, the name as
  "the final report of seed/seed0" or "the efficiency 0.6 report of ..."."""
  for m, by_seed in reports.items():
    for s, pair in by_seed.items():
      named = [(k, r) for k, r in pair.items() if k != "efficiency"] + [
          (f"efficiency {f}", r)
          for f, r in pair.get("efficiency", {}).items()]
      for name, report in named:
        yield f"the {name} report of {m}/seed{s}", report


def rescored(reports: Mapping[str, Mapping[int, Mapping[str, Mapping[
    str, Any]]]], *, baseline: str | None = None) -> dict[str, Any]:
  """Start and final success of every run, scored again on common tasks.

  Args:
    reports: {method: {seed: {"start" | "final": a `seed_jax.evaluate`
      report, and optionally "efficiency": {fraction: report}}}}, every
      report on the same tasks (`evaluate` draws the sampling keys from the
      evaluation seed and the update scored). An "efficiency" report is of
      the last kept checkpoint at or before that fraction of the run's
      final update.
    baseline: the method the paired differences are taken against (default
      "grpo" when present, else none).

  Returns:
    A JSON-serializable dict:
      "methods": [method, ...], "num_tasks", "seed", "temperature"
      "steps": {method: {seed: {"start": 0, "final": update}}}
      "success": {method: {"start" | "final": {split: {"all" | family:
                  mean_std}}}}
      "paired": {method: {split: mean_std over the seeds both methods ran
                 to the same final update (so scored with the same sampling
                 keys) of final(method) - final(baseline)}} (baseline left
                 out)
      "unpaired": {method: [seeds both ran, left out of "paired" as their
                   final updates differ]}
      "no_baseline": {method: [seeds with a final report the baseline has
                      none of, so left out of "paired"]}
      "baseline": the baseline method or None
      "efficiency": {method: {split: [{"fraction", "updates" (the seeds'
                    updates scored, sorted), "mean", "std", "n", "values",
                    "vs_baseline_final": `by_task` of this checkpoint minus
                    the baseline's final on the same seed, or None}, ...]}},
                    for methods whose reports have "efficiency"
      "by_task": {method: {"gain" (final - start) | "vs_baseline" (final -
                 the baseline's final, the seeds of "paired"): {split:
                 `by_task` of the seeds whose reports both have per-task
                 outcomes}}}, for methods with such seeds
      "search": {method: {"start" | "final": {split: {"usual" |
                "chance" | "lead" | "lead_se": mean_std of
                "eval/<split>/search_usual" | "search_usual_chance" |
                "search_usual_over_chance" | its "_se"}}}}, each over the
                reports that have it (household evaluations; see
                `evaluate.evaluate_split`; older ones have no lead)
      "search_vs_baseline": {method: {split: `search_by_task` of the
                            final reports of the seeds of "paired"}}, for
                            methods with seeds whose reports both have
                            per-task search statistics
      "take": {method: {"start" | "final": {split: {"reached" |
              "took_after" | "took" | "after" | "steps": mean_std of
              "eval/<split>/reached_goal_place" | "took_after_reach" |
              "took_goal" | "won_after_take" | "steps_to_take"}}}}, each
              over the reports that have it (household evaluations since
              `household.take_stats`): how far the episodes got
      "look": {method: {"start" | "final": {split: {"steps" | "new" |
              "revisit" | "other" | "invalid" | "invalid_take": mean_std of
              "eval/<split>/look_steps" | "look_new_place" | ...}}}}, the
              same for `household.look_stats` (`LOOK_KEYS`): where the steps
              before the goal place went

  Raises:
    ValueError: a report without a field read here (`REPORT_KEYS`, each
      split's "eval/<split>/success"), named by method, seed, which report
      and its folder; reports that do not share the tasks, evaluation seed
      and temperature, or the environment and episode settings (`EPISODE`;
      a report without one, written before it was recorded, is taken to
      share it).
  """
  for name, report in _named_reports(reports):
    problem = report_problem(report)
    if problem is not None:
      if isinstance(report, dict) and "workdir" in report:
        name += f" (in {report['workdir']}/eval, update {report.get('step')})"
      raise ValueError(f"{name} {problem}; `seed_jax.evaluate` writes every "
                       "field, so it was damaged: delete it and rerun to "
                       "score that checkpoint again")
  every = [r for _, r in _named_reports(reports)]
  settings = {(r["num_tasks"], r["seed"], r["temperature"]) for r in every}
  if len(settings) > 1:
    raise ValueError(f"the reports were scored with different (num_tasks, "
                     f"seed, temperature): {sorted(settings)}")
  episode = {k: sorted({r.get(k, EPISODE_DEFAULTS.get(k)) for r in every
                       if k in r or k in EPISODE_DEFAULTS}, key=repr)
             for k in EPISODE}
  differ = {k: v for k, v in episode.items() if len(v) > 1}
  if differ:
    raise ValueError(
        "the reports were scored on different environments or episodes, so "
        f"not on the same tasks: {differ}; score every run with the same "
        "env_name, max_steps, history_length and invalid_action")
  (num_tasks, seed, temperature), = settings or {(None, None, None)}
  if baseline is None and "grpo" in reports:
    baseline = "grpo"
  out = dict(methods=list(reports), num_tasks=num_tasks, seed=seed,
             temperature=temperature, baseline=baseline, steps={},
             success={}, paired={}, unpaired={}, no_baseline={},
             efficiency={}, by_task={}, search={}, search_vs_baseline={},
             take={}, look={})

  def task_diffs(pairs, split):  # (a, b) reports -> by_task where both have
    got = [(a["per_task"][split], b["per_task"][split]) for a, b in pairs
           if split in a.get("per_task", {}) and split in b.get("per_task", {})]
    return by_task(got)

  finals = {m: {s: pair["final"] for s, pair in by_seed.items()
                if "final" in pair} for m, by_seed in reports.items()}
  base_finals = finals.get(baseline, {})
  for m, by_seed in reports.items():
    out["steps"][m] = {str(s): {k: r["step"] for k, r in pair.items()
                                if k != "efficiency"}
                       for s, pair in by_seed.items()}
    at = {}  # fraction -> [(seed, report)]
    for s, pair in by_seed.items():
      for f, r in pair.get("efficiency", {}).items():
        at.setdefault(float(f), []).append((s, r))
    if at:
      out["efficiency"][m] = {split: [dict(
          fraction=f, updates=sorted({r["step"] for _, r in got}),
          **mean_std([r["metrics"][f"eval/{split}/success"]
                      for _, r in got]),
          vs_baseline_final=task_diffs([(r, base_finals[s]) for s, r in got
                                        if s in base_finals], split))
          for f, got in sorted(at.items())] for split in SPLITS}
    out["success"][m] = {}
    for which in ("start", "final"):
      got = [pair[which]["metrics"] for pair in by_seed.values()
             if which in pair]
      out["success"][m][which] = {}
      for split in SPLITS:
        prefix = f"eval/{split}/success"
        fams = sorted({k[len(prefix) + 1:] for g in got for k in g
                       if k.startswith(prefix + "/")})
        out["success"][m][which][split] = {
            fam: mean_std([g[prefix + suffix] for g in got
                           if prefix + suffix in g])
            for fam, suffix in [("all", "")] + [(f, "/" + f) for f in fams]}
      for table, names in (("search", SEARCH_KEYS), ("take", TAKE_KEYS),
                           ("look", LOOK_KEYS)):
        got_them = {split: {name: mean_std(
            [g[f"eval/{split}/{key}"] for g in got
             if g.get(f"eval/{split}/{key}") is not None])
            for name, key in names.items()} for split in SPLITS}
        first = next(iter(names))  # the statistic every such report has
        if any(v[first]["n"] for v in got_them.values()):
          out[table].setdefault(m, {})[which] = got_them
    gains = [(pair["final"], pair["start"]) for pair in by_seed.values()
             if "final" in pair and "start" in pair]
    gain = {split: task_diffs(gains, split) for split in SPLITS}
    if any(gain.values()):
      out["by_task"][m] = {"gain": gain}
  for m in reports:
    if baseline is None or m == baseline or baseline not in finals:
      continue
    both = sorted(set(finals[m]) & set(finals[baseline]))
    same = [s for s in both
            if finals[m][s]["step"] == finals[baseline][s]["step"]]
    if len(same) < len(both):
      out["unpaired"][m] = [s for s in both if s not in same]
    alone = sorted(set(finals[m]) - set(finals[baseline]))
    if alone:
      out["no_baseline"][m] = alone
    out["paired"][m] = {split: mean_std(
        [finals[m][s]["metrics"][f"eval/{split}/success"] -
         finals[baseline][s]["metrics"][f"eval/{split}/success"]
         for s in same]) for split in SPLITS}
    vs = {split: task_diffs([(finals[m][s], finals[baseline][s])
                             for s in same], split) for split in SPLITS}
    if any(vs.values()):
      out["by_task"].setdefault(m, {})["vs_baseline"] = vs
    lead = {split: search_by_task([(finals[m][s], finals[baseline][s])
                                   for s in same], split) for split in SPLITS}
    if any(lead.values()):
      out["search_vs_baseline"][m] = lead
  return out
