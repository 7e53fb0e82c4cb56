"""The experiment summary against hand-computed means, stds and Table 6."""

import math
import re

import PIL.Image
import pytest

from seed_jax import episodes
from seed_jax import results


def _history(rate, *, env_steps, updates=10, every=3, unseen_factor=0.5,
             extra=None):
  """A metrics.jsonl of `updates` updates evaluated at 0, 3, 6, 9 and 10
  (every `every` and at the end, as the trainer does), seen success
  `rate(u)` (family pick: the same, heat: 0), unseen half of it."""
  records = []
  for u in range(updates + 1):
    r = {"update": u}
    if u:
      r.update(env_steps=float(env_steps), success_rate=rate(u) / 2)
      r.update(extra or {})
    if u % every == 0 or u == updates:
      s = rate(u)
      r.update({"eval/seen/success": s, "eval/seen/success/pick": s,
                "eval/seen/success/heat": 0.0,
                "eval/unseen/success": unseen_factor * s,
                "eval/unseen/success/cool": unseen_factor * s})
    records.append(r)
  return records


HISTORIES = {
    "grpo": {0: _history(lambda u: u / 20, env_steps=4),
             1: _history(lambda u: u / 10, env_steps=6)},
    "seed": {0: _history(lambda u: u / 10, env_steps=5,
                         extra={"opd_gate_mean": 0.25}),
             1: _history(lambda u: u / 10, env_steps=5,
                         extra={"opd_gate_mean": 0.75}),
             2: _history(lambda u: 0.1 + u / 20, env_steps=5,
                         extra={"opd_gate_mean": 0.5})},
}


@pytest.fixture(scope="module")
def summary():
  return results.summarize(HISTORIES)


def test_mean_std():
  s = results.mean_std([0.5, 1.0])
  assert s["mean"] == 0.75 and s["n"] == 2
  assert s["std"] == pytest.approx(0.5 / math.sqrt(2))  # ddof 1
  assert results.mean_std([0.3])["std"] == 0.0
  assert results.mean_std([])["mean"] is None


def test_cumulative_env_steps():
  assert results.cumulative_env_steps(
      [{"update": 0}, {"update": 1, "env_steps": 8.0},
       {"update": 2, "env_steps": 6.0}]) == {0: 0.0, 1: 8.0, 2: 14.0}


def test_final_success_per_family(summary):
  assert summary["methods"] == ["grpo", "seed"]
  assert summary["num_updates"] == {"grpo": 10, "seed": 10}
  grpo = summary["final"]["grpo"]
  # Update 10: seed 0 at 10/20 = 0.5, seed 1 at 10/10 = 1.0.
  assert grpo["seen"]["all"]["values"] == [0.5, 1.0]
  assert grpo["seen"]["all"]["mean"] == 0.75
  assert grpo["seen"]["all"]["std"] == pytest.approx(0.3535533906)
  assert grpo["seen"]["pick"]["mean"] == 0.75
  assert grpo["seen"]["heat"] == {"mean": 0.0, "std": 0.0, "n": 2,
                                  "values": [0.0, 0.0]}
  assert list(grpo["seen"]) == ["all", "heat", "pick"]
  assert list(grpo["unseen"]) == ["all", "cool"]
  assert grpo["unseen"]["all"]["mean"] == 0.375
  seed = summary["final"]["seed"]["unseen"]["all"]
  # 0.5 * (1.0, 1.0, 0.6): mean 0.4333, std 0.5 * 0.2309.
  assert seed["mean"] == pytest.approx(1.3 / 3)
  assert seed["std"] == pytest.approx(0.5 * 0.2309401077)
  assert summary["final_updates"]["seed"] == {"seen": [10], "unseen": [10]}


def test_sample_efficiency_reads_the_last_eval_at_or_before(summary):
  rows = summary["sample_efficiency"]["grpo"]["seen"]
  # Targets 2, 4, 6, 8, 10 of 10 updates; evaluations at 0, 3, 6, 9, 10.
  assert [r["target"] for r in rows] == pytest.approx([2, 4, 6, 8, 10])
  assert [r["update"] for r in rows] == [0, 3, 6, 6, 10]
  # Update 3: seeds at 3/20 and 3/10.
  assert rows[1]["mean"] == pytest.approx(0.225)
  assert rows[1]["std"] == pytest.approx(0.15 / math.sqrt(2))
  # Cumulative env steps at update 6: 6 * 4 and 6 * 6.
  assert rows[2]["env_steps"] == 30.0
  seed = summary["sample_efficiency"]["seed"]["seen"]
  assert seed[2]["mean"] == pytest.approx((0.6 + 0.6 + 0.4) / 3)


def test_curves_and_diagnostics(summary):
  curve = summary["curves"]["grpo"]["unseen"]
  assert [p["update"] for p in curve] == [0, 3, 6, 9, 10]
  assert [p["env_steps"] for p in curve] == [0.0, 15.0, 30.0, 45.0, 50.0]
  assert curve[-1]["mean"] == 0.375 and curve[-1]["n"] == 2
  diag = summary["diagnostics"]
  assert "opd_gate_mean" not in diag["grpo"]
  assert diag["seed"]["opd_gate_mean"]["mean"] == pytest.approx(0.5)
  assert diag["seed"]["opd_gate_mean"]["std"] == pytest.approx(0.25)
  # grpo seed 0: mean of u / 40 over updates 1..10 = 55 / 400.
  assert diag["grpo"]["success_rate"]["values"][0] == pytest.approx(55 / 400)
  assert summary["runs"]["grpo"]["1"] == {
      "last_update": 10, "last_eval_update": 10, "env_steps": 60.0,
      "planned": None, "finished": True}



def test_skill_logp_gap_counts_only_updates_with_analyses():
  # Files written before the trainer left the gap out hold 0.0 where no
  # analysis was parsed: always for GRPO, at update 2 for SEED here.
  grpo = _history(lambda u: u / 10, env_steps=4,
                  extra={"skill_logp_gap": 0.0})
  seed = _history(lambda u: u / 10, env_steps=4, updates=3)
  for r, (parsed, gap) in zip(seed[1:], [(0.5, -0.1), (0.0, 0.0),
                                         (1.0, -0.2)]):
    r.update(analyses_parsed=parsed, skill_logp_gap=gap)
  s = results.summarize({"grpo": {0: grpo}, "seed": {0: seed}})
  assert "skill_logp_gap" not in s["diagnostics"]["grpo"]
  assert s["diagnostics"]["seed"]["skill_logp_gap"]["mean"] == (
      pytest.approx(-0.15))
  assert "| skill_logp_gap | - | -0.15 |" in results.markdown(s)


@pytest.mark.parametrize("bad", [
    '{"update": null}', '{"update": "2"}', '{"update": 2.7}',
    '{"update": true}', '{"env_steps": 3.0}', '[2]', '{"update": 2',
    '{"update": 2, "kl": NaN}', '{"update": 2, "loss": -Infinity}'])
def test_read_metrics_names_the_line_of_a_bad_record(tmp_path, bad):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"update": 1, "kl": 0.5}\n\n' + bad + "\n")
  with pytest.raises(ValueError, match=f"^{path} line 3: "):
    results.read_metrics(str(path))
  path.write_text('{"update": 1, "kl": 0.5}\n\n{"update": 2, "kl": null}\n')
  assert results.read_metrics(str(path)) == [{"update": 1, "kl": 0.5},
                                             {"update": 2, "kl": None}]

@pytest.mark.parametrize("updates,line,match", [
    ((0, 1, 2, 1), 5, "update 1 again, already on line 3"),
    ((0, 1, 1, 2), 4, "update 1 again, already on line 3"),
    ((0, 2, 1), 4, "update 1 after update 2 on line 3"),
    ((1, 2, 3, 0, 1, 2), 5, "update 0 after update 3 on line 4")])
def test_read_metrics_refuses_a_repeated_or_earlier_update(
    tmp_path, updates, line, match):
  """Training writes each update once, in order (it rewrites the file from
  the checkpoint's history on resume): a repeat, which would count its
  env_steps and diagnostics twice, or one out of order (joined files, an
  edit) names both lines."""
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n" + "".join(
      f'{{"update": {u}, "env_steps": 4.0, "kl": 0.5}}\n' for u in updates))
  with pytest.raises(ValueError, match=(
      f"^{re.escape(str(path))} line {line}: {match} \\(training writes "
      "each update once, in order\\)\\. Delete the file and resume")):
    results.read_metrics(str(path))
  path.write_text("".join(f'{{"update": {u}}}\n' for u in (0, 1, 3, 7)))
  assert [r["update"] for r in results.read_metrics(str(path))] == [0, 1, 3, 7]


@pytest.mark.parametrize("key,value", [
    ("eval/seen/success", '"0.5"'), ("eval/unseen/success/heat", '"1"'),
    ("eval/seen/tasks", "[4.0]"), ("env_steps", '"12"'), ("kl", "true"),
    ("skill_logp_gap", '{"mean": 0.1}'), ("analyses_parsed", "false")])
def test_read_metrics_refuses_a_value_it_reads_that_is_not_a_number(
    tmp_path, key, value):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"update": 0, "kl": 0.5}\n'
                  f'{{"update": 1, "{key}": {value}}}\n')
  with pytest.raises(ValueError, match=(
      f"^{re.escape(str(path))} line 2: '{re.escape(key)}' is .*, not a "
      "number")):
    results.read_metrics(str(path))
  # Null (a non-finite value, as training writes it), ints and keys read
  # nowhere here pass.
  path.write_text(f'{{"update": 1, "{key}": null, "eval/unseen/tasks/x": 4, '
                  '"note": "text"}\n')
  assert results.read_metrics(str(path))[0][key] is None


def test_unequal_runs_are_reported_as_they_are():
  partial = {"grpo": {0: _history(lambda u: u / 10, env_steps=4),
                      1: _history(lambda u: u / 10, env_steps=4,
                                  updates=5)},
             "empty": {0: []}}
  s = results.summarize(partial)
  assert s["methods"] == ["grpo"]
  assert s["final_updates"]["grpo"]["seen"] == [5, 10]
  assert s["runs"]["grpo"]["1"]["last_update"] == 5
  # Only updates both seeds evaluated count: 0, 3, 5 (seed 1), 0, 3, 6, 9,
  # 10 (seed 0) -> 0 and 3.
  rows = s["sample_efficiency"]["grpo"]["seen"]
  assert [r["update"] for r in rows] == [0, 3, 3, 3, 3]


def test_unfinished_runs_are_left_out_and_named():
  # Seed 1 stopped at update 4 of 10 (evaluated at 0 and 3 only).
  histories = {"grpo": {0: _history(lambda u: u / 10, env_steps=4),
                        1: _history(lambda u: 0.9, env_steps=4, updates=4),
                        2: _history(lambda u: u / 20, env_steps=4)}}
  planned = {"grpo": {0: 10, 1: 10, 2: 10}}
  s = results.summarize(histories, planned=planned)
  assert s["unfinished"] == ["grpo/seed1"]
  assert s["runs"]["grpo"]["1"] == dict(
      last_update=4, last_eval_update=4, env_steps=16.0, planned=10,
      finished=False)
  assert s["final"]["grpo"]["seen"]["all"]["values"] == [1.0, 0.5]
  assert s["num_updates"]["grpo"] == 10
  rows = s["sample_efficiency"]["grpo"]["seen"]
  assert [r["update"] for r in rows] == [0, 3, 6, 6, 10]
  assert rows[-1]["mean"] == 0.75 and rows[-1]["n"] == 2
  # The curves, like the tables, are over the finished runs.
  assert s["curves"]["grpo"]["seen"][1]["n"] == 2
  md = results.markdown(s)
  assert ("Left out of the success, sample-efficiency and diagnostics "
          "tables, and of the curves of a method with a finished run, not "
          "finished: grpo/seed1 (update 4 of 10).") in md
  assert "| grpo | 1 | 4 of 10 | 4 | 16 |" in md
  # Unknown plans: every run counts, as before.
  assert results.summarize(histories)["unfinished"] == []
  assert results.summarize(histories)["final"]["grpo"]["seen"]["all"][
      "values"] == [1.0, 0.9, 0.5]
  # A method with only unfinished runs has no final numbers.
  alone = results.summarize({"grpo": {1: histories["grpo"][1]}},
                            planned=planned)
  assert alone["final"]["grpo"]["seen"]["all"]["mean"] is None
  assert "| all | - |" in results.markdown(alone)


def test_the_header_counts_the_seeds_the_cells_are_over():
  histories = {"grpo": {0: _history(lambda u: u / 10, env_steps=4),
                        1: _history(lambda u: 0.9, env_steps=4, updates=4),
                        2: _history(lambda u: u / 20, env_steps=4)},
               "seed": {0: _history(lambda u: u / 10, env_steps=4,
                                    updates=4)}}
  s = results.summarize(histories, planned={"grpo": {0: 10, 1: 10, 2: 10},
                                            "seed": {0: 10}})
  assert s["final"]["grpo"]["seen"]["all"]["n"] == 2
  md = results.markdown(s)
  assert "| family | grpo (2 seeds) | seed (0 seeds) |" in md
  assert "| all | 75.0 ± 35.4 | - |" in md
  # Every run in the runs table still.
  assert "| grpo | 1 | 4 of 10 | 4 | 16 |" in md


def test_runs_without_metrics_are_named_as_unfinished():
  """A run known to exist that logged nothing yet (failed early, still in
  its first update) is listed, not dropped without a word."""
  histories = {"grpo": {0: _history(lambda u: u / 10, env_steps=4)}}
  s = results.summarize(histories, planned={"grpo": {0: 10, 2: 10}},
                        no_metrics={"grpo": [2, 0], "seed": [0]})
  assert s["methods"] == ["grpo", "seed"]
  assert s["unfinished"] == ["grpo/seed2", "seed/seed0"]
  assert list(s["runs"]["grpo"]) == ["0", "2"]
  assert s["runs"]["grpo"]["2"] == dict(
      last_update=None, last_eval_update=None, env_steps=None, planned=10,
      finished=False)
  assert s["final"]["grpo"]["seen"]["all"]["n"] == 1
  assert s["final"]["seed"]["seen"]["all"]["n"] == 0
  assert s["num_updates"] == {"grpo": 10, "seed": None}
  assert [r["update"] for r in s["sample_efficiency"]["seed"]["seen"]] == [
      None] * 5
  md = results.markdown(s)
  assert ("not finished: grpo/seed2 (no metrics yet), seed/seed0 (no "
          "metrics yet).") in md
  assert "| family | grpo (1 seed) | seed (0 seeds) |" in md
  assert "| grpo | 2 | no metrics yet | - | - |" in md
  assert "| seed | 0 | no metrics yet | - | - |" in md


def test_diagnostics_leave_unfinished_runs_out():
  """As the success tables do: an unfinished run's first few updates are
  not averaged in."""
  histories = {"grpo": {0: _history(lambda u: u / 10, env_steps=4),
                        1: _history(lambda u: u / 10, env_steps=4,
                                    updates=2)}}
  s = results.summarize(histories, planned={"grpo": {0: 10, 1: 10}})
  # Seed 0: mean of u / 20 over updates 1..10 = 55 / 200.
  assert s["diagnostics"]["grpo"]["success_rate"]["values"] == [
      pytest.approx(55 / 200)]
  assert "| success_rate | 0.275 |" in results.markdown(s)
  # Unknown plans: both runs count.
  assert results.summarize(histories)["diagnostics"]["grpo"][
      "success_rate"]["n"] == 2


def test_a_finished_run_never_evaluated_is_named_not_counted():
  """The header counts the runs the cells are over, and Table 6 reads the
  updates every evaluated run evaluated."""
  histories = {"grpo": {0: _history(lambda u: u / 10, env_steps=4),
                        1: _history(lambda u: u / 20, env_steps=4),
                        2: _history(lambda u: 0.9, env_steps=4,
                                    every=100, updates=10)}}
  for r in histories["grpo"][2]:  # eval_every=0: no evaluation at all
    for k in [k for k in r if k.startswith("eval/")]:
      del r[k]
  s = results.summarize(histories, planned={"grpo": {0: 10, 1: 10, 2: 10}})
  assert s["unfinished"] == []
  assert s["final"]["grpo"]["seen"]["all"]["values"] == [1.0, 0.5]
  rows = s["sample_efficiency"]["grpo"]["seen"]
  assert [r["update"] for r in rows] == [0, 3, 6, 6, 10]
  assert rows[-1]["n"] == 2
  md = results.markdown(s)
  assert "| family | grpo (2 seeds) |" in md
  assert s["unevaluated"] == {"grpo/seed2": ["seen", "unseen"]}
  assert ("Finished but never evaluated, so left out of those tasks' "
          "success and sample-efficiency tables: grpo/seed2 (seen and "
          "unseen tasks).") in md
  assert "| seen | grpo | 0.0 ± 0.0 [0] |" in md


def test_evaluations_on_different_task_counts_are_named():
  """Pooled as they are (old runs must still read), but said."""
  def tasks(history, n):
    for r in history:
      for split in results.SPLITS:
        if f"eval/{split}/success" in r:
          r[f"eval/{split}/tasks"] = float(n)
    return history

  histories = {"grpo": {0: tasks(_history(lambda u: 0.5, env_steps=4), 32),
                        1: tasks(_history(lambda u: 0.25, env_steps=4), 256)},
               "seed": {0: tasks(_history(lambda u: 0.5, env_steps=4), 32)}}
  s = results.summarize(histories)
  assert s["final"]["grpo"]["seen"]["all"]["values"] == [0.5, 0.25]
  md = results.markdown(s)
  for split in results.SPLITS:
    assert (f"Evaluated on different numbers of {split} tasks, pooled as "
            "they are here and in the sample-efficiency table: 32 tasks: "
            "grpo/seed0, seed/seed0; 256 tasks: grpo/seed1.") in md
  assert s["eval_tasks"]["seen"] == {"grpo/seed0": [32], "grpo/seed1": [256],
                                     "seed/seed0": [32]}
  # The same count everywhere, or none recorded (older files): no note.
  histories["grpo"][1] = tasks(histories["grpo"][1], 32)
  assert "different numbers" not in results.markdown(
      results.summarize(histories))
  assert "different numbers" not in results.markdown(
      results.summarize(HISTORIES))


def test_curves_are_over_the_finished_runs(tmp_path, monkeypatch):
  """So a curve's mean is over the same seeds from start to end; a method
  with no finished run yet shows its unfinished ones, and the legend says
  so."""
  histories = {"grpo": {0: _history(lambda u: 0.1, env_steps=4),
                        1: _history(lambda u: 0.1, env_steps=4),
                        2: _history(lambda u: 0.9, env_steps=4, updates=5)},
               "seed": {0: _history(lambda u: 0.5, env_steps=4, updates=5)}}
  s = results.summarize(histories, planned={"grpo": {0: 10, 1: 10, 2: 10},
                                            "seed": {0: 10}})
  curve = s["curves"]["grpo"]["seen"]
  assert [(p["update"], p["n"]) for p in curve] == [
      (0, 2), (3, 2), (6, 2), (9, 2), (10, 2)]
  assert [p["mean"] for p in curve] == pytest.approx([0.1] * 5)
  assert [p["n"] for p in s["curves"]["seed"]["seen"]] == [1, 1, 1]
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  legends = []
  save = figure.Figure.savefig

  def keep_legend(self, *args, **kwargs):
    legends.append([t.get_text() for t in self.axes[-1].get_legend()
                    .get_texts()])
    return save(self, *args, **kwargs)

  monkeypatch.setattr(figure.Figure, "savefig", keep_legend)
  results.plot_curves(s, str(tmp_path / "curve.png"))
  assert legends == [["grpo (2 seeds)", "seed (1 unfinished seed)"]]


def test_tables_and_markdown(summary):
  rows = results.final_rows(summary)
  assert rows[0] == {"method": "grpo", "split": "seen", "family": "all",
                     "mean": 0.75, "std": pytest.approx(0.3535533906),
                     "n": 2}
  assert results.csv_text(rows).splitlines()[0] == (
      "method,split,family,mean,std,n")
  eff = results.efficiency_rows(summary)
  assert len(eff) == 2 * 2 * 5 and eff[0]["fraction"] == 0.2
  assert results.pct({"mean": 0.75, "std": 0.3535533906}) == "75.0 ± 35.4"
  assert results.pct({"mean": 0.75, "std": 0.0, "n": 1}) == "75.0"
  md = results.markdown(summary, image_dir="results")
  assert "| family | grpo (2 seeds) | seed (3 seeds) |" in md
  assert "| all | 75.0 ± 35.4 | 86.7 ± 23.1 |" in md
  assert "| seen | grpo | 0.0 ± 0.0 [0] | 22.5 ± 10.6 [3] |" in md
  assert "| opd_gate_mean | - | 0.5 ± 0.25 |" in md
  assert "![eval success against updates](results/success_vs_updates.png)" \
      in md
  assert "](" not in results.markdown(summary, image_dir=None)


def test_plot_curves(summary, tmp_path):
  for x in ("update", "env_steps"):
    path = tmp_path / f"{x}.png"
    results.plot_curves(summary, str(path), x=x)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with PIL.Image.open(path) as image:
      image.verify()  # a whole PNG, not just its signature


def test_a_plot_that_fails_mid_write_keeps_the_last_one(
    summary, tmp_path, savefig_fails_midway):
  path = tmp_path / "figures" / "curve.png"
  results.plot_curves(summary, str(path))
  before = path.read_bytes()
  savefig_fails_midway(before[:20])  # half a PNG, then a full disk
  with pytest.raises(OSError, match="No space left"):
    results.plot_curves(summary, str(path), x="env_steps")
  assert path.read_bytes() == before
  assert [p.name for p in path.parent.iterdir()] == ["curve.png"]


def _report(step, seen, unseen, *, num_tasks=4, seed=9, per_task=None):
  out = dict(step=step, num_tasks=num_tasks, seed=seed, temperature=0.4,
             metrics={"eval/seen/success": seen,
                      "eval/unseen/success": unseen,
                      "eval/unseen/success/heat": unseen / 2})
  if per_task is not None:
    out["per_task"] = per_task
  return out


def test_by_task_differences_and_their_standard_error():
  one = results.by_task([("0110", "0100")])
  # Differences 0, 1, 0, 0: mean 1/4, sample variance 1/4, se sqrt(1/16).
  assert one == {"mean": 0.25, "se": 0.25, "n_tasks": 4, "seeds": 1}
  two = results.by_task([("0110", "0100"), ("1111", "0011")])
  # The second: differences 1, 1, 0, 0 (mean 1/2, variance 1/3).
  assert two["mean"] == pytest.approx(0.375)
  assert two["se"] == pytest.approx(math.sqrt((1 / 4 + 1 / 3) / 4) / 2)
  assert two["seeds"] == 2
  assert results.by_task([]) is None
  with pytest.raises(ValueError, match="different lengths"):
    results.by_task([("011", "0100")])
  # A damaged outcome string is named, not an int() error.
  for bad in ("01-1", "01 1", "0121", 101, None):
    with pytest.raises(ValueError, match=r"per-task outcomes must be a "
                       r"string of 0s and 1s, got " + repr(bad)[:3]):
      results.by_task([("0110", "0100"), ("0110", bad)])
  # No task at all (a damaged report): named, not a ZeroDivisionError.
  with pytest.raises(ValueError, match=r"per-task outcomes must be a "
                     r"string of 0s and 1s, got ''"):
    results.by_task([("", "")])


def test_rescored_by_task():
  """Reports with per-task outcomes add task-by-task differences."""
  reports = {
      "grpo": {0: {"start": _report(0, 0.25, 0.25, per_task={
                       "seen": "1000", "unseen": "0100"}),
                   "final": _report(10, 0.5, 0.25, per_task={
                       "seen": "1100", "unseen": "0010"})}},
      "seed": {0: {"start": _report(0, 0.25, 0.25, per_task={
                       "seen": "1000", "unseen": "0100"}),
                   "final": _report(10, 0.75, 0.75, per_task={
                       "seen": "1110", "unseen": "1110"})},
               # Scored before outcomes were kept: left out of by_task.
               1: {"start": _report(0, 0.5, 0.5),
                   "final": _report(10, 1.0, 1.0)}},
  }
  out = results.rescored(reports)
  assert out["by_task"]["grpo"] == {"gain": {
      "seen": results.by_task([("1100", "1000")]),
      "unseen": results.by_task([("0010", "0100")])}}
  seed = out["by_task"]["seed"]
  assert seed["gain"]["unseen"]["mean"] == 0.5
  assert seed["vs_baseline"]["unseen"] == results.by_task([("1110", "0010")])
  assert seed["vs_baseline"]["unseen"]["seeds"] == 1
  text = results.rescored_markdown(out)
  assert ("| method | final − start, seen | final − start, unseen | "
          "final − grpo, seen | final − grpo, unseen |") in text
  # seed, unseen vs grpo: differences 1, 1, 0, 0 -> +50.0, se 28.9.
  # seed's seed 1 has no outcomes: its cells say they are over one seed.
  assert "| seed | +50.0 (se 28.9; 1 of 2 seeds) | +50.0 (se 28.9; 1 of 2 " \
      "seeds) | +25.0 (se 25.0; 1 of 2 seeds) | +50.0 (se 28.9; 1 of 2 " \
      "seeds) |" in text
  assert "| grpo | +25.0 (se 25.0) | +0.0 (se 40.8) | - | - |" in text
  # Table 6's checkpoints against grpo's final on the same seed.
  reports["seed"][0]["efficiency"] = {
      "0.6": _report(6, 0.5, 0.25, per_task={"seen": "1100",
                                            "unseen": "0001"}),
      "1": reports["seed"][0]["final"]}
  reports["seed"][1]["efficiency"] = {"0.6": _report(6, 0.5, 0.25)}
  out = results.rescored(reports)
  at60, at100 = out["efficiency"]["seed"]["unseen"]
  assert at60["vs_baseline_final"] == results.by_task([("0001", "0010")])
  assert at100["vs_baseline_final"] == seed["vs_baseline"]["unseen"]
  text = results.rescored_markdown(out)
  assert ("| unseen | seed | +0.0 (se 40.8; 1 of 2 seeds) | +50.0 (se 28.9; "
          "1 of 2 seeds) |") in text
  assert ("| seen | seed | +0.0 (se 0.0; 1 of 2 seeds) | +25.0 (se 25.0; 1 "
          "of 2 seeds) |") in text
  # Without outcomes anywhere, no such table.
  for by_seed in reports.values():
    for pair in by_seed.values():
      for r in [*(r for k, r in pair.items() if k != "efficiency"),
                *pair.get("efficiency", {}).values()]:
        r.pop("per_task", None)
  out = results.rescored(reports)
  assert out["by_task"] == {}
  assert out["efficiency"]["seed"]["seen"][0]["vs_baseline_final"] is None
  text = results.rescored_markdown(out)
  assert "Task by task" not in text and "task by task" not in text


def test_task_by_task_cells_say_when_they_are_over_fewer_seeds():
  """A seed whose reports list no per-task outcomes is left out of the
  task-by-task cells; a cell says so when the headline counts more."""
  def run(final_seen, *, outcomes=True):
    tasks = {"seen": final_seen, "unseen": "0100"} if outcomes else None
    return {"start": _report(0, 0.25, 0.25, per_task=tasks and {
                "seen": "1000", "unseen": "0100"}),
            "final": _report(10, 0.5, 0.25, per_task=tasks)}

  reports = {"grpo": {0: run("1000"), 1: run("1000")},
             "seed": {0: run("1100"), 1: run("1110")}}
  text = results.rescored_markdown(results.rescored(reports))
  assert "| seed | 2 |" in text
  # Every seed: mean of 0.25 and 0.5 gains, no count.
  # se: sqrt((1/4 + 1/3) / 4) / 2 (see test_by_task_differences_...).
  assert "| seed | +37.5 (se 19.1) | +0.0 (se 0.0) | +37.5 (se 19.1) |" in text
  reports["seed"][1] = run("1110", outcomes=False)
  out = results.rescored(reports)
  assert out["by_task"]["seed"]["gain"]["seen"]["seeds"] == 1
  text = results.rescored_markdown(out)
  assert "| seed | 2 |" in text
  assert ("| seed | +25.0 (se 25.0; 1 of 2 seeds) | +0.0 (se 0.0; 1 of 2 "
          "seeds) | +25.0 (se 25.0; 1 of 2 seeds) | +0.0 (se 0.0; 1 of 2 "
          "seeds) |") in text
  assert "| grpo | +0.0 (se 0.0) | +0.0 (se 0.0) | - | - |" in text
  assert "a cell over fewer than the method's seeds says how many" in text


def _damage(report, how):
  """`report` damaged as `how` names."""
  if how == "no step":
    del report["step"]
  elif how == "no unseen success":
    del report["metrics"]["eval/unseen/success"]
  elif how == "metrics a list":
    report["metrics"] = [0.5]
  elif how == "per_task a string":
    report["per_task"] = "0101"
  return report


@pytest.mark.parametrize("how,problem", [
    ("no step", "has no step"),
    ("no unseen success", "has no metrics\\['eval/unseen/success'\\]"),
    ("metrics a list", "has metrics \\[0.5\\], not a dict"),
    ("per_task a string", "has per_task '0101', not outcomes by split")])
def test_rescored_names_a_damaged_report(how, problem):
  """A report without a field `rescored` reads is a ValueError naming the
  run, the report, its folder and the field; not a KeyError."""
  def pair(step=10):
    return {"start": _report(0, 0.25, 0.25),
            "final": _report(step, 0.5, 0.25) | {"workdir": "/out/seed/seed1"}}

  reports = {"grpo": {0: pair(), 1: pair()}, "seed": {0: pair(), 1: pair()}}
  _damage(reports["seed"][1]["final"], how)
  with pytest.raises(ValueError, match=(
      "^the final report of seed/seed1 \\(in /out/seed/seed1/eval, update "
      f"(10|None)\\) {problem}; .* delete it and rerun")):
    results.rescored(reports)
  reports["seed"][1] = pair()
  reports["seed"][0]["efficiency"] = {"0.6": _damage(_report(6, 0.5, 0.5),
                                                     how)}
  with pytest.raises(ValueError, match=(
      f"^the efficiency 0.6 report of seed/seed0 {problem}")):
    results.rescored(reports)


def test_rescored_pairs_seeds_against_grpo():
  reports = {
      "grpo": {0: {"start": _report(0, 0.25, 0.25),
                   "final": _report(10, 0.5, 0.25)},
               1: {"start": _report(0, 0.0, 0.25),
                   "final": _report(10, 0.25, 0.5)}},
      "seed": {0: {"start": _report(0, 0.25, 0.0),
                   "final": _report(10, 0.75, 0.75)},
               2: {"start": _report(0, 0.5, 0.5),
                   "final": _report(10, 1.0, 1.0)}},
  }
  out = results.rescored(reports)
  assert out["baseline"] == "grpo" and out["methods"] == ["grpo", "seed"]
  assert (out["num_tasks"], out["seed"], out["temperature"]) == (4, 9, 0.4)
  assert out["steps"]["seed"] == {"0": {"start": 0, "final": 10},
                                  "2": {"start": 0, "final": 10}}
  assert out["success"]["grpo"]["final"]["seen"]["all"]["values"] == [
      0.5, 0.25]
  assert out["success"]["seed"]["start"]["unseen"]["heat"]["mean"] == 0.125
  # Only seed 0 ran under both methods.
  assert out["paired"]["seed"]["unseen"]["values"] == [0.5]
  assert out["paired"]["seed"]["seen"]["values"] == [0.25]
  assert "grpo" not in out["paired"]
  text = results.rescored_markdown(out)
  assert "| seed | 2 | 37.5 ± 17.7 | 87.5 ± 17.7 |" in text
  # One seed in common: the difference alone, no spread over one value.
  assert "| +25.0 | +50.0 |" in text and "final − grpo, unseen" in text
  assert "+50.0 ±" not in text
  assert "| heat | 18.8 ± 8.8 | 43.8 ± 8.8 |" in text
  assert out["unpaired"] == {}
  # Final checkpoints of different updates (scored with other sampling
  # keys) are not paired, and the table says so.
  reports["seed"][0]["final"] = _report(9, 0.75, 0.75)
  out = results.rescored(reports)
  assert out["unpaired"] == {"seed": [0]}
  assert out["paired"]["seed"]["unseen"]["n"] == 0
  text = results.rescored_markdown(out)
  assert "Left out of seed's differences, its final update not grpo's: " \
      "seed 0." in text
  assert "| seed | 2 | 37.5 ± 17.7 | 87.5 ± 17.7 | 25.0 ± 35.4 | 87.5 ± " \
      "17.7 | - | - |" in text
  reports["seed"][0]["final"] = _report(10, 0.75, 0.75)
  assert out["efficiency"] == {}
  # Checkpoints at fractions of the updates: one row per split and method.
  reports["seed"][0]["efficiency"] = {"0.6": _report(6, 0.5, 0.25),
                                      "1": _report(10, 0.75, 0.75)}
  reports["seed"][2]["efficiency"] = {"0.6": _report(5, 0.25, 0.75),
                                      "1": _report(10, 1.0, 1.0)}
  out = results.rescored(reports)
  assert list(out["efficiency"]) == ["seed"]
  at60, at100 = out["efficiency"]["seed"]["unseen"]
  assert (at60["fraction"], at60["updates"], at60["values"]) == (
      0.6, [5, 6], [0.25, 0.75])
  assert (at100["updates"], at100["mean"]) == ([10], 0.875)
  text = results.rescored_markdown(out)
  assert "| unseen | seed | 50.0 ± 35.4 [5, 6] | 87.5 ± 17.7 [10] |" in text
  assert "| split | method | 60% | 100% |" in text
  reports["seed"][2]["efficiency"]["1"] = _report(10, 1.0, 1.0, num_tasks=8)
  with pytest.raises(ValueError, match="different .num_tasks, seed, temp"):
    results.rescored(reports)
  for pair in reports["seed"].values():
    pair.pop("efficiency")
  # Without a baseline there are no differences.
  assert results.rescored({"seed": reports["seed"]})["paired"] == {}
  reports["seed"][2]["final"] = _report(10, 1.0, 1.0, num_tasks=8)
  with pytest.raises(ValueError, match="different .num_tasks, seed, temp"):
    results.rescored(reports)


def test_rescored_says_where_the_policies_searched():
  """Reports with household search shares get a table of them (mean ± std
  over the seeds that have them, chance in brackets); reports without them
  (older ones, other games) add nothing."""
  def searched(report, seen, unseen, chance=0.5):
    report["metrics"].update({
        "eval/seen/search_usual": seen, "eval/seen/search_usual_chance": chance,
        "eval/unseen/search_usual": unseen,
        "eval/unseen/search_usual_chance": chance})
    return report

  reports = {
      "grpo": {0: {"start": searched(_report(0, 0.25, 0.25), 0.5, 0.5),
                   "final": searched(_report(10, 0.5, 0.25), 0.5, 0.25)},
               1: {"start": _report(0, 0.0, 0.25),
                   "final": searched(_report(10, 0.25, 0.5), 0.75, 0.75,
                                     chance=0.25)}},
      "seed": {0: {"start": _report(0, 0.25, 0.0),
                   "final": _report(10, 0.75, 0.75)}},
  }
  out = results.rescored(reports)
  assert list(out["search"]) == ["grpo"]
  final = out["search"]["grpo"]["final"]
  assert final["unseen"]["usual"]["values"] == [0.25, 0.75]
  assert final["unseen"]["chance"]["mean"] == 0.375
  assert out["search"]["grpo"]["start"]["seen"]["usual"]["n"] == 1
  text = results.rescored_markdown(out)
  assert "**Where the policies searched**" in text
  assert ("| grpo | 50.0 (50.0) | 62.5 ± 17.7 (37.5 ± 17.7) | 50.0 (50.0) | "
          "50.0 ± 35.4 (37.5 ± 17.7) |") in text
  # The lead over chance: its standard error over episodes for one seed,
  # the std over seeds for several; reports without it (older) add nothing.
  reports["seed"][0]["final"]["metrics"].update({
      "eval/seen/search_usual": 0.6, "eval/seen/search_usual_chance": 0.4,
      "eval/seen/search_usual_over_chance": 0.2,
      "eval/seen/search_usual_over_chance_se": 0.05})
  for seed, value in ((0, 0.1), (1, 0.3)):
    reports["grpo"][seed]["final"]["metrics"].update({
        "eval/unseen/search_usual_over_chance": value,
        "eval/unseen/search_usual_over_chance_se": 0.02})
  text = results.rescored_markdown(results.rescored(reports))
  assert "| seed | - | 60.0 (40.0); +20.0 (se 5.0) | - | - |" in text
  assert "50.0 ± 35.4 (37.5 ± 17.7); +20.0 ± 14.1 |" in text
  assert "62.5 ± 17.7 (37.5 ± 17.7) |" in text  # seen: no lead recorded
  del reports["grpo"], reports["seed"][0]["final"]["metrics"][
      "eval/seen/search_usual"]
  out = results.rescored(reports)
  assert out["search"] == {}
  assert "Where the policies searched" not in results.rescored_markdown(out)


def test_rescored_says_how_far_the_episodes_got():
  """Reports with household take shares get a table of them (went where a
  goal object was; of those, took one; of those, won; mean step of the
  take); others add nothing."""
  def took(report, reached, took_after, after, steps=4.0, split="unseen"):
    report["metrics"].update({
        f"eval/{split}/reached_goal_place": reached,
        f"eval/{split}/took_after_reach": took_after,
        f"eval/{split}/took_goal": reached * took_after,
        f"eval/{split}/won_after_take": after,
        f"eval/{split}/steps_to_take": steps})
    return report

  reports = {
      "grpo": {0: {"start": took(_report(0, 0.25, 0.25), 1.0, 0.5, 0.5),
                   "final": took(_report(10, 0.5, 0.25), 1.0, 0.5, 0.5, 6.0)},
               1: {"start": took(_report(0, 0.25, 0.25), 1.0, 0.5, 0.5),
                   "final": took(_report(10, 0.5, 0.5), 1.0, 1.0, 0.5, 8.0)}},
      "seed": {0: {"start": _report(0, 0.25, 0.0),
                   "final": _report(10, 0.75, 0.75)}},
  }
  out = results.rescored(reports)
  assert list(out["take"]) == ["grpo"]
  final = out["take"]["grpo"]["final"]["unseen"]
  assert final["took"]["values"] == [0.5, 1.0]
  assert final["took_after"]["values"] == [0.5, 1.0]
  assert final["after"]["mean"] == 0.5 and final["steps"]["mean"] == 7.0
  assert out["take"]["grpo"]["final"]["seen"]["took"]["n"] == 0
  text = results.rescored_markdown(out)
  assert "**How far the episodes got**" in text
  assert ("| grpo | - | - | 100.0 ± 0.0; 50.0 ± 0.0; 50.0 ± 0.0 (step 4.0) | "
          "100.0 ± 0.0; 75.0 ± 35.4; 50.0 ± 0.0 (step 7.0) |") in text
  # A seed whose reports predate the statistics: the others, counted; a
  # report from before the place was counted: no share of it.
  for key in ("reached_goal_place", "took_after_reach", "took_goal",
              "won_after_take", "steps_to_take"):
    del reports["grpo"][1]["final"]["metrics"][f"eval/unseen/{key}"]
  for key in ("reached_goal_place", "took_after_reach"):
    del reports["grpo"][0]["final"]["metrics"][f"eval/unseen/{key}"]
  text = results.rescored_markdown(results.rescored(reports))
  assert "| -; -; 50.0 (step 6.0), 1 of 2 seeds |" in text
  del reports["grpo"]
  out = results.rescored(reports)
  assert out["take"] == {}
  assert "How far the episodes got" not in results.rescored_markdown(out)


def test_rescored_tables_where_the_steps_before_the_goal_place_went():
  """Reports with `household.look_stats` shares get a table of them: mean
  looking steps, then the shares of new places, revisits, other valid and
  invalid steps; reports without them add nothing."""
  def looked(report, steps, new, revisit, other, invalid, split="seen"):
    report["metrics"].update({
        f"eval/{split}/look_steps": steps,
        f"eval/{split}/look_new_place": new,
        f"eval/{split}/look_revisit": revisit,
        f"eval/{split}/look_other": other,
        f"eval/{split}/look_invalid": invalid})
    if invalid:  # reports before the attempted takes were counted lack it
      report["metrics"][f"eval/{split}/look_invalid_take"] = invalid / 2
    return report

  reports = {
      "grpo": {0: {"start": looked(_report(0, 0.25, 0.25),
                                   8.0, 0.5, 0.25, 0.25, 0.0),
                   "final": looked(_report(10, 0.5, 0.25),
                                   12.0, 0.25, 0.5, 0.25, 0.0)},
               1: {"start": looked(_report(0, 0.25, 0.25),
                                   8.0, 0.5, 0.25, 0.25, 0.0),
                   "final": looked(_report(10, 0.5, 0.5),
                                   14.0, 0.5, 0.25, 0.0, 0.25)}},
      "seed": {0: {"start": _report(0, 0.25, 0.0),
                   "final": _report(10, 0.75, 0.75)}},
  }
  out = results.rescored(reports)
  assert list(out["look"]) == ["grpo"]
  final = out["look"]["grpo"]["final"]["seen"]
  assert final["steps"]["values"] == [12.0, 14.0]
  assert final["new"]["mean"] == 0.375 and final["invalid"]["mean"] == 0.125
  assert out["look"]["grpo"]["final"]["unseen"]["steps"]["n"] == 0
  text = results.rescored_markdown(out)
  assert "**Where the steps before the goal place went**" in text
  assert ("| grpo | 8.0 ± 0.0 steps: 50.0 ± 0.0; 25.0 ± 0.0; 25.0 ± 0.0; "
          "0.0 ± 0.0 | 13.0 ± 1.4 steps: 37.5 ± 17.7; 37.5 ± 17.7; "
          "12.5 ± 17.7; 12.5 ± 17.7 (takes 12.5) | - | - |") in text
  # A seed whose final report predates the statistics: counted.
  for key in results.LOOK_KEYS.values():
    del reports["grpo"][1]["final"]["metrics"][f"eval/seen/{key}"]
  text = results.rescored_markdown(results.rescored(reports))
  assert "| 12.0 steps: 25.0; 50.0; 25.0; 0.0, 1 of 2 seeds |" in text
  del reports["grpo"]
  out = results.rescored(reports)
  assert out["look"] == {}
  assert "Where the steps before" not in results.rescored_markdown(out)


def test_rescored_compares_the_search_lead_task_by_task():
  """Final reports with per-task search counts give each method's lead over
  chance less the baseline's, paired by task and seed, with the standard
  error of `episodes.paired_ratio_diffs`; pairs without the counts (older
  reports) are left out and the table says over how many seeds."""
  def counts(report, **by_split):
    report["per_task_stats"] = {
        split: {results.LEAD: text} for split, text in by_split.items()}
    return report

  reports = {
      "grpo": {0: {"start": _report(0, 0.25, 0.25),
                   "final": counts(_report(10, 0.5, 0.25),
                                   seen="0:1 0:2 1:1 -",
                                   unseen="0:1 0:1 0:1 0:1")},
               1: {"start": _report(0, 0.25, 0.25),
                   "final": counts(_report(10, 0.5, 0.25),
                                   seen="0:1 0:1 0:1 0:1")}},
      "seed": {0: {"start": _report(0, 0.25, 0.25),
                   "final": counts(_report(10, 0.75, 0.75),
                                   seen="1:1 1:2 1:1 -",
                                   unseen="1:1 1:1 0:1 0:1")},
               1: {"start": _report(0, 0.25, 0.25),
                   "final": _report(10, 0.75, 0.75)}},
  }
  out = results.rescored(reports)
  versus = out["search_vs_baseline"]
  assert list(versus) == ["seed"]
  # Unseen, seed 0: leads 2/4 and 0/4; u = (1 - 1/2) / 4 on two tasks and
  # (0 - 1/2) / 4 on two: se = sqrt(4/3 * 4/64).
  assert versus["seed"]["unseen"] == pytest.approx(
      {"mean": 0.5, "se": (4 / 3 * 4 / 64) ** 0.5, "seeds": 1})
  want = episodes.paired_ratio_diffs(
      episodes.stats_from_text({"x": "1:1 1:2 1:1 -"}),
      episodes.stats_from_text({"x": "0:1 0:2 1:1 -"}))
  assert versus["seed"]["seen"] == pytest.approx(
      {"mean": want["x"], "se": want["x_se"], "seeds": 1})
  text = results.rescored_markdown(out)
  assert "The final lead over chance against grpo's, task by task" in text
  assert f"| seed | {100 * want['x']:+.1f} (se {100 * want['x_se']:.1f}; " \
      "1 of 2 seeds) | +50.0 (se 28.9; 1 of 2 seeds) |" in text
  # Two seeds: the mean of the seeds' differences, se sqrt(sum se^2) / 2.
  counts(reports["seed"][1]["final"], seen="1:1 1:1 0:1 0:1")
  seen = results.rescored(reports)["search_vs_baseline"]["seed"]["seen"]
  assert seen == pytest.approx(
      {"mean": (want["x"] + 0.5) / 2,
       "se": math.hypot(want["x_se"], (4 / 3 * 4 / 64) ** 0.5) / 2,
       "seeds": 2})
  # Counts that do not parse are named; no counts at all, no table.
  reports["seed"][1]["final"]["per_task_stats"]["seen"][results.LEAD] = "1"
  with pytest.raises(ValueError, match=r"per_task_stats\['seen'\]: per-task "
                     "statistic 'search_usual_over_chance' is not"):
    results.rescored(reports)
  for by_seed in reports.values():
    for pair in by_seed.values():
      pair["final"].pop("per_task_stats", None)
  out = results.rescored(reports)
  assert out["search_vs_baseline"] == {}
  assert "task by task: differences" not in results.rescored_markdown(out)
  reports["seed"][0]["final"]["per_task_stats"] = "1:1"
  with pytest.raises(ValueError, match="has per_task_stats '1:1', not "
                     "statistics by split"):
    results.rescored(reports)


def test_rescored_names_seeds_without_a_baseline_run():
  """The paired differences cover fewer seeds than the "seeds" column when
  the baseline lacks one: the table says which, and why."""
  reports = {
      "grpo": {s: {"start": _report(0, 0.25, 0.25),
                   "final": _report(10, 0.5, 0.25)} for s in (0, 1)},
      "seed": {s: {"start": _report(0, 0.25, 0.25),
                   "final": _report(10, 0.75, 0.5)} for s in (0, 1, 2, 3)},
  }
  out = results.rescored(reports)
  assert out["paired"]["seed"]["seen"]["n"] == 2
  text = results.rescored_markdown(out)
  assert "| seed | 4 |" in text
  assert ("Left out of seed's differences, no grpo run of the same seed: "
          "seeds 2, 3.") in text
  assert out["no_baseline"] == {"seed": [2, 3]} and out["unpaired"] == {}
  # Every seed paired: no such line.
  del reports["seed"][2], reports["seed"][3]
  out = results.rescored(reports)
  assert out["no_baseline"] == {}
  assert "Left out" not in results.rescored_markdown(out)


@pytest.mark.parametrize("key,a,b", [("env_name", "household", "sokoban"),
                                     ("max_steps", 20, 5),
                                     ("history_length", 2, 5)])
def test_rescored_refuses_reports_of_other_environments(key, a, b):
  """Reports of another game or episode length are not on the same tasks,
  whatever their task count, seed and temperature."""
  def report(step, value, *, num_tasks=4):
    return _report(step, 0.5, 0.5, num_tasks=num_tasks) | {key: value}

  reports = {"grpo": {0: {"start": report(0, a), "final": report(10, a)}},
             "seed": {0: {"start": report(0, a), "final": report(10, a)}}}
  assert results.rescored(reports)["paired"]["seed"]["seen"]["n"] == 1
  # Reports written before the setting was recorded are taken as sharing it.
  reports["seed"][1] = {"start": _report(0, 0.5, 0.5),
                        "final": _report(10, 0.5, 0.5)}
  assert results.rescored(reports)["success"]["seed"]["final"]["seen"][
      "all"]["n"] == 2
  reports["seed"][0]["final"] = report(10, b)
  with pytest.raises(ValueError, match=rf"different environments or "
                     rf"episodes.*{key}.*{a!r}.*{b!r}"):
    results.rescored(reports)
  reports["seed"][0]["final"] = report(10, a)
  reports["seed"][0]["efficiency"] = {"0.5": report(5, b)}
  with pytest.raises(ValueError, match=f"different environments.*{key}"):
    results.rescored(reports)
  # The task settings are checked first, as before.
  reports["seed"][0]["efficiency"] = {"0.5": report(5, b, num_tasks=8)}
  with pytest.raises(ValueError, match="different .num_tasks, seed, temp"):
    results.rescored(reports)


def test_rescored_takes_reports_without_invalid_action_as_the_no_op():
  """Reports written before `invalid_action` was recorded all sent the
  no-op: they pair with "no_op" reports, never with "as_written" ones."""
  def report(step, action=None):
    out = _report(step, 0.5, 0.5)
    return out if action is None else out | {"invalid_action": action}

  reports = {"grpo": {0: {"start": report(0), "final": report(10)}},
             "seed": {0: {"start": report(0, "no_op"),
                          "final": report(10, "no_op")}}}
  assert results.rescored(reports)["paired"]["seed"]["seen"]["n"] == 1
  reports["seed"][0]["final"] = report(10, "as_written")
  with pytest.raises(ValueError, match=r"invalid_action.*'as_written', "
                     r"'no_op'"):
    results.rescored(reports)
