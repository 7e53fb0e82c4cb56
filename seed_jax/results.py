"""Experiment summaries: final success, learning curves, sample efficiency.

Everything here is a pure function of the runs' metric histories,
`histories[method][seed] = [record, ...]`, each record one line of a run's
metrics.jsonl: `{"update": 10, "env_steps": 412.0, "eval/seen/success": 0.5,
"eval/seen/success/heat": 0.25, ...}` ("env_steps" counts that update's
rollout only; evaluations are logged at the updates they ran). Only
`read_metrics` and the writers at the end touch files.

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

import csv
import io
import json
from typing import Any, Mapping, Sequence

import numpy as np

from seed_jax import atomic

SPLITS = ("seen", "unseen")
FRACTIONS = (0.2, 0.4, 0.6, 0.8, 1.0)
# An evaluation report's environment and episode settings: `rescored` pairs
# only reports that agree on them.
EPISODE = ("env_name", "max_steps", "history_length")
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

  Raises:
    ValueError: naming the file and line of a line that is not a JSON object
      with an integer "update", that holds NaN or Infinity, or whose
      "env_steps", "eval/..." or `DIAGNOSTICS` value is not a number or null
      (training writes the file whole, numbers with None for non-finite
      values, so it was damaged or edited by hand).
  """
  records = []
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
          bad = _non_numeric(record)
          if bad is None:
            records.append(record)
            continue
          problem = (f"{bad!r} is {record[bad]!r:.100}, not a number (or "
                     "null).")
        else:
          problem = (f"{record!r:.200} is not a JSON object with an integer "
                     "\"update\".")
      raise ValueError(
          f"{path} line {n}: {problem} Delete the file and resume the run: "
          "training writes it again from the history its checkpoint keeps")
  return records


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

  Raises:
    ValueError: when the reports do not share the tasks, evaluation seed
      and temperature, or the environment and episode settings (`EPISODE`;
      a report without one, written before it was recorded, is taken to
      share it).
  """
  def each(pair):  # every report of one run
    yield from (r for k, r in pair.items() if k != "efficiency")
    yield from pair.get("efficiency", {}).values()

  every = [r for by_seed in reports.values() for pair in by_seed.values()
           for r in each(pair)]
  settings = {(r["num_tasks"], r["seed"], r["temperature"]) for r in every}
  if len(settings) > 1:
    raise ValueError(f"the reports were scored with different (num_tasks, "
                     f"seed, temperature): {sorted(settings)}")
  episode = {k: sorted({r[k] for r in every if k in r}, key=repr)
             for k in EPISODE}
  differ = {k: v for k, v in episode.items() if len(v) > 1}
  if differ:
    raise ValueError(
        "the reports were scored on different environments or episodes, so "
        f"not on the same tasks: {differ}; score every run with the same "
        "env_name, max_steps and history_length")
  (num_tasks, seed, temperature), = settings or {(None, None, None)}
  if baseline is None and "grpo" in reports:
    baseline = "grpo"
  out = dict(methods=list(reports), num_tasks=num_tasks, seed=seed,
             temperature=temperature, baseline=baseline, steps={},
             success={}, paired={}, unpaired={}, no_baseline={},
             efficiency={}, by_task={})

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
  return out


def rescored_markdown(summary: Mapping[str, Any]) -> str:
  """`rescored`'s tables as Markdown: overall, then per family (final)."""
  methods = summary["methods"]
  base = summary["baseline"]
  succ = summary["success"]
  lines = [f"Success in percent on {summary['num_tasks']} tasks per split, "
           "the same tasks for every run, and the same sampling keys for "
           "checkpoints of the same update (evaluation "
           f"seed {summary['seed']}, temperature {summary['temperature']}), "
           "mean ± sample std over seeds (the value alone for one seed). "
           "Start: the policy the run began "
           "RL from (after Stage 1 where the method has one); final: its "
           "last checkpoint.", ""]
  header = ["method", "seeds", "start seen", "final seen", "start unseen",
            "final unseen"]
  if summary["paired"]:
    header += [f"final − {base}, seen", f"final − {base}, unseen"]
  rows = []
  for m in methods:
    row = [m, str(len(summary["steps"][m]))]
    for split in SPLITS:
      row += [pct(succ[m][w][split]["all"]) for w in ("start", "final")]
    if summary["paired"]:
      row += [_points(summary["paired"].get(m, {}).get(split))
              for split in SPLITS]
    rows.append(row)
  lines += table_lines(header, rows)
  if summary["paired"]:
    lines += ["", f"The differences to {base} are paired by seed (the same "
              "seed starts from the same warm start) and given in points."]
    for m, seeds in summary.get("unpaired", {}).items():
      lines += [f"Left out of {m}'s differences, its final update not "
                f"{base}'s: seed{'s' * (len(seeds) != 1)} "
                f"{', '.join(map(str, seeds))}."]
    for m, seeds in summary.get("no_baseline", {}).items():
      lines += [f"Left out of {m}'s differences, no {base} run of the same "
                f"seed: seed{'s' * (len(seeds) != 1)} "
                f"{', '.join(map(str, seeds))}."]
  tasks = summary.get("by_task") or {}
  if tasks:
    cols = [("gain", "final − start")] + (
        [("vs_baseline", f"final − {base}")] if summary["paired"] else [])
    lines += ["", "**Task by task**: differences in points, paired on the "
              "same tasks, and in brackets their standard error over the "
              "tasks (the evaluation's own noise, each seed's warm start "
              "held fixed; averaged over the seeds whose reports list "
              "every task's outcome).", ""]
    lines += table_lines(
        ["method", *(f"{label}, {split}" for _, label in cols
                     for split in SPLITS)],
        [[m, *(_task_points(tasks[m].get(key, {}).get(split))
               for key, _ in cols for split in SPLITS)] for m in tasks])
  eff = summary.get("efficiency") or {}
  if eff:
    fr = list(dict.fromkeys(p["fraction"] for m in eff
                            for p in eff[m][SPLITS[0]]))
    lines += ["", "**Sample efficiency** (the paper's Table 6) on the same "
              "tasks: overall success at a fraction of each run's final "
              "update, read at the last checkpoint kept at or before it "
              "(the updates scored in brackets).", ""]
    rows = []
    for split in SPLITS:
      for m in eff:
        at = {p["fraction"]: p for p in eff[m][split]}
        rows.append([split, m, *(
            f"{pct(at[f])} [{', '.join(map(str, at[f]['updates']))}]"
            if f in at else "-" for f in fr)])
    lines += table_lines(["split", "method", *(f"{100 * f:.0f}%" for f in fr)],
                         rows)
    rows = []
    for split in SPLITS:
      for m in eff:
        at = {p["fraction"]: p.get("vs_baseline_final")
              for p in eff[m][split]}
        if any(at.values()):
          rows.append([split, m, *(_task_points(at.get(f)) for f in fr)])
    if rows:
      lines += ["", f"The same checkpoints against {base}'s final, task by "
                "task: differences in points, standard error over the tasks "
                "in brackets (the paper's claim is that SEED at 60% is not "
                f"below {base} at 100%).", ""]
      lines += table_lines(
          ["split", "method", *(f"{100 * f:.0f}%" for f in fr)], rows)
  for split in SPLITS:
    fams = list(dict.fromkeys(f for m in methods
                              for f in succ[m]["final"][split]))
    lines += ["", f"**Final, {split} tasks, per family**", ""]
    lines += table_lines(["family", *methods],
                    [[f, *(pct(succ[m]["final"][split].get(f))
                           for m in methods)] for f in fams])
  return "\n".join(lines) + "\n"


def _points(stats):
  """A difference of rates in points: "+6.2 ± 3.1"; "-" when missing."""
  if not stats or stats.get("mean") is None:
    return "-"
  return f"{100 * stats['mean']:+.1f}" + _spread(stats, 100)


def _task_points(stats):
  """A `by_task` difference in points: "+6.2 (se 3.1)"; "-" when missing."""
  if not stats:
    return "-"
  return f"{100 * stats['mean']:+.1f} (se {100 * stats['se']:.1f})"


def _spread(stats: Mapping[str, Any], scale: float = 1.0,
            fmt: str = ".1f") -> str:
  """The " ± std" part (std times `scale`); "" for one seed, which has none."""
  return "" if stats.get("n") == 1 else f" ± {scale * stats['std']:{fmt}}"


# -- tables -------------------------------------------------------------------


def pct(stats: Mapping[str, Any] | None) -> str:
  """{"mean": 0.75, "std": 0.032} -> "75.0 ± 3.2"; "-" when missing.

  With "n": 1 (one seed) the std is left out: "75.0".
  """
  if not stats or stats.get("mean") is None:
    return "-"
  return f"{100 * stats['mean']:.1f}" + _spread(stats, 100)


def final_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
  """CSV rows: method, split, family, mean, std, n (success rates)."""
  rows = []
  for m in summary["methods"]:
    for split in SPLITS:
      for fam, s in summary["final"][m][split].items():
        rows.append(dict(method=m, split=split, family=fam, mean=s["mean"],
                         std=s["std"], n=s["n"]))
  return rows


def efficiency_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
  """CSV rows: method, split, fraction, target, update, mean, std, n,
  env_steps."""
  return [dict(method=m, split=split, **p) for m in summary["methods"]
          for split in SPLITS for p in summary["sample_efficiency"][m][split]]


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
  buf = io.StringIO()
  if rows:
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]),
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
  return buf.getvalue()


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]
                ) -> list[str]:
  """The lines of a Markdown table."""
  return (["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)] +
          ["| " + " | ".join(r) + " |" for r in rows])


def markdown(summary: Mapping[str, Any], *, image_dir: str | None = None,
             title: str = "Results") -> str:
  """Tables (and image links, relative to the Markdown file) as Markdown.

  Args:
    summary: what `summarize` returns.
    image_dir: the folder of the curve PNGs relative to the Markdown file
      (None: no image links).
    title: the section's heading.
  """
  methods = summary["methods"]
  lines = [f"## {title}", "",
           "Success in percent, mean ± sample std over seeds (the value alone "
           "for one seed), at each run's last evaluated update.", ""]
  late = [f"{m}/seed{s} (" + ("no metrics yet" if r["last_update"] is None
                              else f"update {r['last_update']} of "
                              f"{r['planned']}") + ")"
          for m in methods for s, r in summary["runs"][m].items()
          if not r.get("finished", True)]
  if late:
    lines += ["Left out of the success, sample-efficiency and diagnostics "
              "tables, and of the curves of a method with a finished run, "
              f"not finished: {', '.join(late)}.", ""]
  bare = summary.get("unevaluated", {})
  if bare:
    lines += ["Finished but never evaluated, so left out of those tasks' "
              "success and sample-efficiency tables: " + ", ".join(
                  f"{k} ({' and '.join(v)} tasks)" for k, v in bare.items())
              + ".", ""]
  for split in SPLITS:
    fams = list(dict.fromkeys(f for m in methods
                              for f in summary["final"][m][split]))
    # The runs the cells are over: the finished, evaluated ones.
    seeds = {m: summary["final"][m][split]["all"]["n"] for m in methods}
    lines += [f"**{split.capitalize()} tasks**", ""]
    lines += table_lines(
        ["family", *(f"{m} ({seeds[m]} seed{'s' * (seeds[m] != 1)})"
                     for m in methods)],
        [[f, *(pct(summary["final"][m][split].get(f)) for m in methods)]
         for f in fams])
    lines.append("")
    counts = {}  # number of tasks -> runs evaluated on it
    for run, got in summary.get("eval_tasks", {}).get(split, {}).items():
      for k in got:
        counts.setdefault(k, []).append(run)
    if len(counts) > 1:
      lines += [f"Evaluated on different numbers of {split} tasks, pooled as "
                "they are here and in the sample-efficiency table: " +
                "; ".join(f"{k} tasks: {', '.join(runs)}"
                          for k, runs in sorted(counts.items())) + ".", ""]
  fr = [p["fraction"] for p in summary["sample_efficiency"][methods[0]][
      SPLITS[0]]] if methods else []
  lines += ["**Sample efficiency** (the paper's Table 6): overall success at "
            "a fraction of the updates, read at the last update evaluated "
            "at or before it (shown in brackets).", ""]
  rows = []
  for split in SPLITS:
    for m in methods:
      cells = [f"{pct(p)} [{p['update']}]" if p["update"] is not None
               else "-" for p in summary["sample_efficiency"][m][split]]
      rows.append([split, m, *cells])
  lines += table_lines(["split", "method", *(f"{100 * f:.0f}%" for f in fr)], rows)
  lines.append("")
  names = list(dict.fromkeys(k for m in methods
                             for k in summary["diagnostics"][m]))
  if names:
    lines += ["**Training diagnostics**: each run's mean over its updates, "
              "then mean ± std over seeds.", ""]
    lines += table_lines(["metric", *methods], [
        [k, *(_num(summary["diagnostics"][m].get(k)) for m in methods)]
        for k in names])
    lines.append("")
  lines += ["**Runs**: last update (of the planned, where known), last "
            "evaluated update and cumulative environment steps of RL "
            "(Stage 1's rollouts not included) of each seed.", ""]
  lines += table_lines(["method", "seed", "last update", "last eval",
                   "env steps"],
                  [[m, s, "no metrics yet", "-", "-"]
                   if r["last_update"] is None else
                   [m, s, str(r["last_update"]) + (
                       f" of {r['planned']}" if r.get("planned") is not None
                       else ""), str(r["last_eval_update"]),
                    f"{r['env_steps']:.0f}"]
                   for m in methods for s, r in summary["runs"][m].items()])
  lines.append("")
  if image_dir is not None:
    for name, what in (("success_vs_updates", "updates"),
                       ("success_vs_env_steps", "environment steps")):
      lines += [f"![eval success against {what}]"
                f"({image_dir}/{name}.png)", ""]
  return "\n".join(lines)


def _num(stats):
  if not stats or stats.get("mean") is None:
    return "-"
  return f"{stats['mean']:.3g}" + _spread(stats, fmt=".2g")


# -- figures ------------------------------------------------------------------


def plot_curves(summary: Mapping[str, Any], path: str, *,
                x: str = "update") -> None:
  """Eval success against `x` ("update" or "env_steps"), seen and unseen.

  One line per method (the mean over seeds) with a band of ± one std, over
  its finished runs, or while it has none over its unfinished ones (see
  `summarize`); the legend gives the seeds' number and says which.
  Uses matplotlib's Agg canvas directly (no pyplot, no global backend); the
  PNG is written whole or not at all (`atomic.write_bytes`).
  """
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(10, 4), dpi=100)
  axes = fig.subplots(1, len(SPLITS), sharey=True)
  for ax, split in zip(axes, SPLITS):
    for m in summary["methods"]:
      pts = summary["curves"][m][split]
      if not pts:
        continue
      xs = np.array([p[x] for p in pts], float)
      mean = np.array([p["mean"] for p in pts], float)
      std = np.array([p["std"] for p in pts], float)
      n = max(p["n"] for p in pts)
      done = any(r.get("finished", True) and r["last_update"] is not None
                 for r in summary["runs"][m].values())
      label = f"{m} ({n}{'' if done else ' unfinished'} seed{'s' * (n != 1)})"
      line, = ax.plot(xs, mean, marker="." if len(xs) < 40 else None,
                      label=label)
      ax.fill_between(xs, mean - std, mean + std, alpha=0.2,
                      color=line.get_color(), linewidth=0)
    ax.set_title(f"{split} tasks")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("update" if x == "update" else
                  "environment steps of RL (Stage 1's not included)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("eval success (mean ± std over seeds)")
  if summary["methods"]:
    axes[-1].legend()
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png")
  atomic.write_bytes(path, png.getvalue())  # a crash keeps the last one
