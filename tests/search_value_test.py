"""Tests for seed_jax.search_value: experts that differ in search knowledge."""

import json

import pytest

from seed_jax import search_value
from seed_jax.envs import base as envs_base


def test_the_peeking_expert_wins_every_task_without_noise():
  row = search_value.play("peek", split="eval_unseen", num_tasks=32)
  assert row["success"] == 100.0
  assert row["outcomes"] == [1] * 32
  assert 1 <= row["steps_won"] <= 20


def test_search_knowledge_orders_the_experts():
  rows = {e: search_value.play(e, split="eval_seen", num_tasks=64)
          for e in search_value.EXPERTS}
  # Knowing more about the search never takes more steps to the goal, and
  # without noise the random search already fails some tasks in 20 steps.
  assert rows["peek"]["steps_won"] < rows["likely"]["steps_won"]
  assert rows["likely"]["steps_won"] < rows["shuffled"]["steps_won"]
  assert rows["shuffled"]["success"] < rows["likely"]["success"]


def test_noise_costs_success_and_plays_are_repeatable():
  calm = search_value.play("likely", num_tasks=48, noise=0.0)
  noisy = search_value.play("likely", num_tasks=48, noise=0.7)
  assert noisy["success"] < calm["success"]
  assert search_value.play("likely", num_tasks=48, noise=0.7) == noisy


def test_tasks_are_the_evaluations_tasks(monkeypatch):
  seen = []
  real = envs_base.split_seeds
  monkeypatch.setattr(envs_base, "split_seeds",
                      lambda split, num, **kw: seen.append((split, num))
                      or real(split, num, **kw))
  search_value.play("peek", split="eval_seen", num_tasks=3)
  assert seen == [("eval_seen", 3)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(expert="oracle"), "unknown expert 'oracle'"),
    (dict(expert="peek", noise=1.5), "noise must be in"),
    (dict(expert="peek", num_tasks=0), "num_tasks must be at least 1"),
    (dict(expert="peek", split="test"), "unknown split 'test'"),
    (dict(expert="peek", max_steps=0), "max_steps must be at least 1"),
    (dict(expert="likely", memory=0), "memory must be at least 1 place"),
])
def test_bad_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    search_value.play(**kwargs)


def test_table_has_the_gains_and_their_standard_errors():
  row = lambda expert, outcomes: {
      "noise": 0.5, "expert": expert, "outcomes": outcomes,
      "success": 100.0 * sum(outcomes) / len(outcomes)}
  rows = [row("peek", [1, 1, 0, 0]), row("likely", [1, 0, 0, 0]),
          row("shuffled", [0, 1, 0, 0])]
  # likely - shuffled per task: +100, -100, 0, 0 (mean 0, sample std
  # sqrt(20000 / 3), se that over 2); peek - shuffled: +100, 0, 0, 0.
  assert search_value.gain(rows[1], rows[2]) == pytest.approx(
      (0.0, (20000 / 3) ** 0.5 / 2))
  assert search_value.table(rows).splitlines()[-1] == (
      "| 0.5 | 50.0 | 25.0 | 25.0 | +0.0 (40.8) | +25.0 (25.0) |")


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
  out = tmp_path / "value.json"
  assert search_value.main(["--num_tasks", "8", "--noise", "0,0.5",
                            "--out_json", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "success in % on 8 eval_unseen tasks, at most 20 steps" in printed
  assert "\n| 0 |" in printed and "\n| 0.5 |" in printed
  report = json.loads(out.read_text())
  assert report["num_tasks"] == 8 and len(report["rows"]) == 6
  assert all(len(r["outcomes"]) == 8 for r in report["rows"])


def test_cli_bad_input_is_one_error_line(capsys):
  assert search_value.main(["--split", "test"]) == 2
  assert capsys.readouterr().err.startswith("error: unknown split 'test'")
  with pytest.raises(SystemExit) as e:
    search_value.main(["--noise", "0,x"])
  assert e.value.code == 2
  assert "--noise takes numbers separated by commas" in capsys.readouterr().err


def test_searches_of_the_experts_against_chance():
  rows = {e: search_value.play(e, num_tasks=256) for e in search_value.EXPERTS}
  # Without noise the peeking expert never searches in vain, and the likely
  # one only where the object can start.
  assert rows["peek"]["search_usual"] is None
  assert rows["likely"]["search_usual"] == 1.0
  assert rows["likely"]["search_usual_chance"] < 0.6
  # A type-blind search scores its chance: the finds, which always go where
  # the object can start, are not counted.
  assert rows["shuffled"]["search_usual"] == pytest.approx(
      rows["shuffled"]["search_usual_chance"], abs=0.03)
  lines = search_value.search_table(list(rows.values())).splitlines()
  assert lines[-1] == (f"| 0 | - | 1.00 "
                       f"({rows['likely']['search_usual_chance']:.2f}) | "
                       f"{rows['shuffled']['search_usual']:.2f} "
                       f"({rows['shuffled']['search_usual_chance']:.2f}) |")


def test_how_far_the_experts_got():
  """Success is the share that took a goal object times the share of those
  won; noise loses tasks both before and after the take."""
  rows = [search_value.play(e, num_tasks=128, noise=n)
          for n in (0.0, 0.7) for e in search_value.EXPERTS]
  for r in rows:
    assert r["success"] == pytest.approx(
        100 * r["took_goal"] * r["won_after_take"])
    assert r["took_goal"] == pytest.approx(
        r["reached_goal_place"] * r["took_after_reach"])
  clean, noisy = rows[0], rows[3]  # peek
  assert clean["took_goal"] == clean["won_after_take"] == 1.0
  assert noisy["took_goal"] < 1.0 and noisy["won_after_take"] < 1.0
  lines = search_value.take_table(rows).splitlines()
  cell = lambda r: (f"{100 * r['reached_goal_place']:.1f}; "
                    f"{100 * r['took_after_reach']:.1f}; "
                    f"{100 * r['won_after_take']:.1f}")
  assert lines[3] == "| 0.7 | " + " | ".join(map(cell, rows[3:])) + " |"


def test_where_the_experts_looked():
  """The peeking expert goes straight to the goal place; a searching one
  looks at new places first, and noise adds revisits and other steps."""
  rows = {(r["expert"], r["noise"]): r for r in (
      search_value.play(e, num_tasks=64, noise=n)
      for n in (0.0, 0.7) for e in search_value.EXPERTS)}
  assert rows[("peek", 0.0)]["look_steps"] == 0.0
  assert rows[("peek", 0.0)]["look_new_place"] is None
  clean, noisy = rows[("shuffled", 0.0)], rows[("shuffled", 0.7)]
  assert clean["look_steps"] > 1 and clean["look_revisit"] == 0.0
  assert clean["look_new_place"] > 0.5
  assert noisy["look_revisit"] > 0 and noisy["look_new_place"] < (
      clean["look_new_place"])
  for r in rows.values():
    if r["look_new_place"] is not None:
      assert sum(r[k] for k in search_value.LOOK[1:]) == pytest.approx(1.0)
  lines = search_value.look_table(list(rows.values())).splitlines()
  r = rows[("likely", 0.7)]
  assert f"| {r['look_steps']:.1f}: {100 * r['look_new_place']:.1f}; " in (
      lines[3])


def test_a_searcher_that_forgets_goes_round_in_circles():
  """Remembering only its last places, a searcher with a fixed order goes
  back to places it has already searched; one that remembers them all never
  does, and a memory longer than the episode changes nothing."""
  full = search_value.play("likely", num_tasks=64)
  short = search_value.play("likely", num_tasks=64, memory=1)
  long = search_value.play("likely", num_tasks=64, memory=100)
  assert full["look_revisit"] == 0.0 and short["look_revisit"] > 0.3
  assert short["reached_goal_place"] < full["reached_goal_place"] == 1.0
  assert short["success"] < full["success"]
  assert {k: v for k, v in long.items() if k != "memory"} == {
      k: v for k, v in full.items() if k != "memory"}
  # peek reads hidden state: no memory to lose.
  assert (search_value.play("peek", num_tasks=16, memory=1)["outcomes"]
          == search_value.play("peek", num_tasks=16)["outcomes"])
