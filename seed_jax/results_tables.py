"""Experiment summaries as Markdown, CSV rows and curve figures.

Renders what `seed_jax.results` computes (`summarize`, `rescored`), and
needs nothing of it; the names here are reachable there too
(`results.markdown`, `results.pct`, ...). The tables print success in
percent, "mean ± std" over seeds (the value alone for one seed), and
differences in points.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Mapping, Sequence

import numpy as np

from seed_jax import atomic

# The evaluation splits, in the tables' order (`results.SPLITS`).
SPLITS = ("seen", "unseen")


# -- cells --------------------------------------------------------------------


def pct(stats: Mapping[str, Any] | None) -> str:
  """{"mean": 0.75, "std": 0.032} -> "75.0 ± 3.2"; "-" when missing.

  With "n": 1 (one seed) the std is left out: "75.0".
  """
  if not stats or stats.get("mean") is None:
    return "-"
  return f"{100 * stats['mean']:.1f}" + _spread(stats, 100)


def _spread(stats: Mapping[str, Any], scale: float = 1.0,
            fmt: str = ".1f") -> str:
  """The " ± std" part (std times `scale`); "" for one seed, which has none."""
  return "" if stats.get("n") == 1 else f" ± {scale * stats['std']:{fmt}}"


def _points(stats):
  """A difference of rates in points: "+6.2 ± 3.1"; "-" when missing."""
  if not stats or stats.get("mean") is None:
    return "-"
  return f"{100 * stats['mean']:+.1f}" + _spread(stats, 100)


def _task_points(stats, seeds: int):
  """A `by_task` difference in points: "+6.2 (se 3.1)", or over fewer than
  the method's `seeds`, "+6.2 (se 3.1; 1 of 2 seeds)"; "-" when missing."""
  if not stats:
    return "-"
  part = ("" if stats["seeds"] >= seeds
          else f"; {stats['seeds']} of {seeds} seeds")
  return f"{100 * stats['mean']:+.1f} (se {100 * stats['se']:.1f}{part})"


def _num(stats):
  """A diagnostic's mean and std, 3 and 2 significant digits: "0.5 ± 0.25"."""
  if not stats or stats.get("mean") is None:
    return "-"
  return f"{stats['mean']:.3g}" + _spread(stats, fmt=".2g")


# -- tables -------------------------------------------------------------------


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]
                ) -> list[str]:
  """The lines of a Markdown table."""
  return (["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)] +
          ["| " + " | ".join(r) + " |" for r in rows])


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
  """CSV with a header of the first row's keys; "" for no rows."""
  buf = io.StringIO()
  if rows:
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]),
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
  return buf.getvalue()


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


# -- Markdown -----------------------------------------------------------------


def markdown(summary: Mapping[str, Any], *, image_dir: str | None = None,
             title: str = "Results") -> str:
  """Tables (and image links, relative to the Markdown file) as Markdown.

  Args:
    summary: what `results.summarize` returns.
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
  lines += table_lines(["split", "method", *(f"{100 * f:.0f}%" for f in fr)],
                       rows)
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


def _start_final_table(by_method, cell) -> list[str]:
  """Table lines of `cell(method, by_method[method][which][split])` (None
  where missing), a column per split and start / final, a row per method."""
  return table_lines(
      ["method", *(f"{w} {split}" for split in SPLITS
                   for w in ("start", "final"))],
      [[m, *(cell(m, by_method[m].get(w, {}).get(split)) for split in SPLITS
             for w in ("start", "final"))] for m in by_method])


def _shares(got: Mapping[str, Any], keys: Sequence[str]) -> str:
  """got[key] of each key in percent, "; "-separated ("-" where no seed has
  it)."""
  return "; ".join(pct(got[k]) if got[k]["n"] else "-" for k in keys)


def _fewer(stats: Mapping[str, Any], n_seeds: int) -> str:
  """", k of N seeds" where `stats` is over fewer than the method's seeds."""
  return (f", {stats['n']} of {n_seeds} seeds" if stats["n"] < n_seeds
          else "")


def rescored_markdown(summary: Mapping[str, Any]) -> str:
  """`results.rescored`'s tables as Markdown: overall, then per family
  (final)."""
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
  n_seeds = {m: len(summary["steps"][m]) for m in methods}
  rows = []
  for m in methods:
    row = [m, str(n_seeds[m])]
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
              "every task's outcome; a cell over fewer than the method's "
              "seeds says how many).", ""]
    lines += table_lines(
        ["method", *(f"{label}, {split}" for _, label in cols
                     for split in SPLITS)],
        [[m, *(_task_points(tasks[m].get(key, {}).get(split), n_seeds[m])
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
          rows.append([split, m, *(_task_points(at.get(f), n_seeds[m])
                                   for f in fr)])
    if rows:
      lines += ["", f"The same checkpoints against {base}'s final, task by "
                "task: differences in points, standard error over the tasks "
                "in brackets, and how many seeds where fewer than the "
                "method's (the paper's claim is that SEED at 60% is not "
                f"below {base} at 100%).", ""]
      lines += table_lines(
          ["split", "method", *(f"{100 * f:.0f}%" for f in fr)], rows)
  search = summary.get("search") or {}
  if search:
    def lead(got):  # the lead over chance in points, if the reports have it
      over, se = got.get("lead"), got.get("lead_se")
      if not over or not over["n"]:
        return ""
      spread = (f" (se {100 * se['mean']:.1f})" if over["n"] == 1 and se
                and se["n"] else _spread(over, 100))
      return f"; {100 * over['mean']:+.1f}{spread}"

    cell = lambda got: ("-" if not got or not got["usual"]["n"] else
                        f"{pct(got['usual'])} ({pct(got['chance'])})"
                        + lead(got))
    lines += ["", "**Where the policies searched**: the share in percent of "
              "the searches in vain (valid \"go to\" steps before the "
              "first take, to a place without the object) that went where "
              "the goal object can start, and in brackets that share for a "
              "search blind to object types (`household.search_stats`); "
              "after the semicolon, the lead over that chance in points, "
              "with its standard error over the episodes for one seed "
              "(se), else ± the std over seeds.", ""]
    lines += _start_final_table(search, lambda m, got: cell(got))
  versus = summary.get("search_vs_baseline") or {}
  if versus:
    lines += ["", f"The final lead over chance against {base}'s, task by "
              "task: differences in points, standard error over the tasks "
              "in brackets (`episodes.paired_ratio_diffs`), and how many "
              "seeds where fewer than the method's (older reports have no "
              "per-task search counts).", ""]
    lines += table_lines(
        ["method", *SPLITS],
        [[m, *(_task_points(versus[m].get(split), n_seeds[m])
               for split in SPLITS)] for m in versus])
  take = summary.get("take") or {}
  if take:
    def took(got, n_seeds):
      if not got or not got["took"]["n"]:
        return "-"
      steps = (f" (step {got['steps']['mean']:.1f})" if got["steps"]["n"]
               else "")
      return (_shares(got, ("reached", "took_after", "after")) + steps
              + _fewer(got["took"], n_seeds))

    lines += ["", "**How far the episodes got**: the share in percent of "
              "episodes that went to a place holding a goal object, of "
              "those the share that took one, and of those the share that "
              "won (per seed, success is the product of the three but for "
              "episodes the environment failed), and in brackets the mean "
              "step of that take (`household.take_stats`); ± the std over "
              "the seeds whose reports have them (older ones do not), and "
              "how many of the method's where fewer.", ""]
    lines += _start_final_table(take, lambda m, got: took(got, n_seeds[m]))
  look = summary.get("look") or {}
  if look:
    def looked(got, n_seeds):
      if not got or not got["steps"]["n"]:
        return "-"
      steps = f"{got['steps']['mean']:.1f}{_spread(got['steps'], 1)}"
      takes = got.get("invalid_take")
      takes = f" (takes {pct(takes)})" if takes and takes["n"] else ""
      return (f"{steps} steps: "
              + _shares(got, ("new", "revisit", "other", "invalid")) + takes
              + _fewer(got["steps"], n_seeds))

    lines += ["", "**Where the steps before the goal place went**: the mean "
              "number of steps an episode took before its first visit to a "
              "place holding a goal object (all its steps when none came), "
              "then the share in percent of those steps that went to a new "
              "place, back to a place already visited, to another valid "
              "action, and to an invalid one (in brackets, the share that "
              "tried to take an object where it was not; "
              "`household.look_stats`); ± "
              "the std over the seeds whose reports have them, and how many "
              "of the method's where fewer.", ""]
    lines += _start_final_table(look, lambda m, got: looked(got, n_seeds[m]))
  for split in SPLITS:
    fams = list(dict.fromkeys(f for m in methods
                              for f in succ[m]["final"][split]))
    lines += ["", f"**Final, {split} tasks, per family**", ""]
    lines += table_lines(["family", *methods],
                    [[f, *(pct(succ[m]["final"][split].get(f))
                           for m in methods)] for f in fams])
  return "\n".join(lines) + "\n"


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
