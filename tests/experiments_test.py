"""`python -m seed_jax.experiments`: commands, runs on the tiny config, resume,
status and summary."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from seed_jax import episodes
from seed_jax import experiments
from seed_jax import results
from seed_jax import runner
from seed_jax import same_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs/experiments/tiny.gin")
DEMO = os.path.join(ROOT, "configs/experiments/demo.gin")


def _status(out):
  with open(os.path.join(out, runner.STATUS)) as f:
    return json.load(f)


def test_plan_gives_each_method_its_bindings():
  runs = experiments.plan("out", methods=list(experiments.DEFAULT_METHODS),
                          seeds=[0, 1], gin_files=["a.gin"],
                          bindings=["NUM_UPDATES=50"])
  assert [r.name for r in runs] == [
      "grpo/seed0", "seed/seed0", "seed_no_stage1/seed0", "opid/seed0",
      "grpo/seed1", "seed/seed1", "seed_no_stage1/seed1", "opid/seed1"]
  by_name = {r.name: r for r in runs}
  assert by_name["seed_no_stage1/seed1"].args == (
      "--gin_file=a.gin", "--gin.WORKDIR='out/seed_no_stage1/seed1'",
      "--gin.SEED=1", "--gin.VARIANT='seed'",
      "--gin.policies.prepare.stage1=None", "--gin.NUM_UPDATES=50")
  assert by_name["opid/seed0"].args[3] == "--gin.VARIANT='opid'"
  control, = experiments.plan("out", methods=["grpo_no_stage1"], seeds=[2],
                              gin_files=["a.gin"])
  assert control.args[3:] == ("--gin.VARIANT='grpo'",
                              "--gin.policies.prepare.stage1=None")
  assert by_name["grpo/seed0"].command() == (
      "python -m seed_jax.train --gin_file=a.gin "
      "\"--gin.WORKDIR='out/grpo/seed0'\" --gin.SEED=0 "
      "\"--gin.VARIANT='grpo'\" --gin.NUM_UPDATES=50")
  # Everything but the method's bindings, the workdir and the seed is shared.
  common = {a for a in runs[0].args if "WORKDIR" not in a and "SEED" not in a
            and "VARIANT" not in a}
  assert all(common <= set(r.args) for r in runs)
  with pytest.raises(ValueError, match=r"unknown method\(s\) \['sed'\]"):
    experiments.plan("out", methods=["sed"], seeds=[0], gin_files=["a.gin"])
  with pytest.raises(ValueError, match="repeated"):
    experiments.plan("out", methods=["grpo"], seeds=[0, 0],
                     gin_files=["a.gin"])


def test_dry_run_prints_the_commands(tmp_path, capsys):
  out = str(tmp_path / "exp")
  # demo.gin: under tiny.gin, seed_no_stage1 would be seed (see below).
  assert experiments.main(["run", "--out", out, "--gin_file", DEMO,
                           "--seeds", "3", "--dry_run",
                           "--gin.NUM_UPDATES=4"]) == 0
  text = capsys.readouterr().out
  assert "# seed_no_stage1/seed3: to run, 4 updates" in text
  assert "--gin.policies.prepare.stage1=None --gin.NUM_UPDATES=4" in text
  assert text.count("python -m seed_jax.train") == 4
  assert not os.path.exists(out)
  with pytest.raises(SystemExit, match="opd_coeff"):
    experiments.main(["run", "--out", out, "--gin_file", TINY, "--dry_run",
                      "--gin", "trainer.RLConfig.opd_coeff=0.0"])
  # The controls not run by default parse too.
  assert experiments.main(["run", "--out", out, "--gin_file", TINY,
                           "--methods", "grpo_no_stage1,seed_oracle",
                           "--dry_run"]) == 0
  assert "\"--gin.trainer.RLConfig.analyzer='rules'\"" in (
      capsys.readouterr().out)


@pytest.mark.parametrize("gin_file,methods,same", [
    # tiny.gin's policy_fn is not policies.prepare: no Stage 1 to skip.
    ("tiny.gin", None, ("seed", "seed_no_stage1")),
    ("tiny.gin", "grpo,opid,grpo_no_stage1", ("grpo", "grpo_no_stage1")),
    # smollm2.gin skips Stage 1 itself.
    ("smollm2.gin", None, ("seed", "seed_no_stage1")),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_methods_that_would_train_the_same_run_are_refused(
    tmp_path, monkeypatch, gin_file, methods, same, dry_run):
  """Each would be trained and summarized as an ablation it is not."""
  monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail(
      "a run started"))
  out = tmp_path / "exp"
  path = os.path.join(ROOT, "configs/experiments", gin_file)
  with pytest.raises(SystemExit, match=(
      rf"^error: methods '{same[0]}' and '{same[1]}' would train the same "
      rf"run on seed 0: with {re.escape(path)}, their bindings "
      r"--gin.policies.prepare.stage1=None change nothing there .*leave "
      r"one of them out of --methods")):
    experiments.main(["run", "--out", str(out), "--gin_file", path,
                      "--seeds", "0,1", "--gin.NUM_UPDATES=1",
                      *(["--methods", methods] if methods else []),
                      *(["--dry_run"] if dry_run else [])])
  assert not out.exists()
  # A --gin binding can make two methods one run too.
  with pytest.raises(SystemExit, match="'seed' and 'seed_oracle' would "
                     "train the same run.*--gin bindings make them the same"):
    experiments.main(["run", "--out", str(out), "--gin_file", DEMO,
                      "--methods", "seed,seed_oracle", "--dry_run", "--gin",
                      "trainer.RLConfig.analyzer='rules'"])


@pytest.mark.parametrize("gin_file", ["demo.gin", "demo_follow.gin",
                                      "demo_kind.gin", "demo_kind_recover.gin",
                                      "demo_kind_repeats.gin",
                                      "demo_kind_repeats_more.gin",
                                      "demo_sokoban.gin"])
def test_every_method_is_its_own_run_with_the_demo_configs(tmp_path, capsys,
                                                           gin_file):
  # As docs/results.md and docs/results_follow.md run them.
  assert experiments.main([
      "run", "--out", str(tmp_path / "exp"), "--seeds", "0,1", "--dry_run",
      "--gin_file", os.path.join(ROOT, "configs/experiments", gin_file),
      "--methods", ",".join(experiments.METHODS),
      "--gin", "policies.prepare.cache_dir='runs/evidence/cache'"]) == 0
  assert capsys.readouterr().out.count("python -m seed_jax.train") == 12


def test_trained_config_sets_only_the_workdir_aside():
  def config(method, *bindings, workdir="a", gin_file=DEMO):
    run, = experiments.plan(workdir, methods=[method], seeds=[0],
                            gin_files=[gin_file], bindings=bindings)
    return same_run.trained_config(run)

  seed = config("seed")
  assert seed == config("seed", workdir="b")
  assert seed != config("grpo") and seed != config("seed_no_stage1")
  # A binding to the default, or through a macro, is the same run.
  assert seed == config("seed", "trainer.RLConfig.remat=False")
  assert seed == config("seed", "trainer.RLConfig.opd_coef=0.01")
  assert seed != config("seed", "trainer.RLConfig.opd_coef=0.02")
  assert seed["rl"]["@trainer.RLConfig()"]["variant"] == "seed"
  # What train.train does not reach cannot change the run.
  tiny = config("seed", gin_file=TINY)
  assert tiny == config("seed_no_stage1", gin_file=TINY)
  assert tiny != config("seed", "testing.tiny_policy.vocab_size=500",
                        gin_file=TINY)


@pytest.mark.parametrize("flags,name,use", [
    (["--gin", "SEED=7"], "SEED", "--seeds"),
    (["--gin.SEED=7"], "SEED", "--seeds"),
    (["--gin", " SEED = 7"], "SEED", "--seeds"),
    (["--gin=--gin.SEED=7"], "SEED", "--seeds"),
    (["--gin", "%SEED=7"], "SEED", "--seeds"),
    (["--gin", "NUM_UPDATES=4\nSEED=7"], "SEED", "--seeds"),
    (["--gin", "train.train.seed=7"], "train.train.seed", "--seeds"),
    (["--gin", "seed_jax.train.train.seed = 7"], "seed_jax.train.train.seed",
     "--seeds"),
    (["--gin", "WORKDIR='/x'"], "WORKDIR", "--out"),
    (["--gin.train.train.workdir='/x'"], "train.train.workdir", "--out"),
    (["--gin", "VARIANT='seed'"], "VARIANT", "--methods"),
    (["--gin", "trainer.RLConfig.variant='grpo'"], "trainer.RLConfig.variant",
     "--methods"),
])
def test_bindings_the_runner_makes_itself_are_refused(tmp_path, flags, name,
                                                      use):
  """gin keeps the last binding: one of these would give every run the same
  seed, workdir or variant."""
  out = tmp_path / "exp"
  with pytest.raises(SystemExit, match=rf"^error: --gin .* sets "
                     rf"{re.escape(name)}, which `run` sets for each "
                     rf"(run|method) itself .*: use {use}"):
    experiments.main(["run", "--out", str(out), "--methods", "grpo,seed",
                      "--seeds", "0,1", "--gin_file", TINY, "--dry_run",
                      *flags])
  assert not out.exists()


@pytest.mark.parametrize("binding,use", [
    ("SEED/gin.macro.value=7", "--seeds"),
    ("SEED/macro.value=7", "--seeds"),
    ("SEED/gin.macro:\n  value = 7", "--seeds"),
    ("train.train:\n  seed = 7", "--seeds"),
    ("WORKDIR/gin.macro.value='/x'", "--out"),
    ("VARIANT/macro.value='opid'", "--methods"),
])
def test_the_runners_macros_bound_as_gin_keeps_them_are_refused(
    tmp_path, binding, use):
  """gin keeps `SEED = 7` as the binding SEED/gin.macro.value: bound so, or
  in a block, after the runner's --gin.SEED=<s>, it made every run train
  seed 7 (check_seed saw %SEED, as each run does), write one folder, or be
  one method. A block binding train.train.seed is named here too (before,
  only check_seed refused it)."""
  out = tmp_path / "exp"
  with pytest.raises(SystemExit, match=(
      rf"^error: --gin {re.escape(repr(binding))} sets .*, which `run` sets "
      rf"for each (run|method) itself .*: use {use}")):
    experiments.main(["run", "--out", str(out), "--methods", "grpo,seed",
                      "--seeds", "0,1", "--gin_file", TINY, "--dry_run",
                      "--gin", binding])
  assert not out.exists()


@pytest.mark.parametrize("lines,binding", [
    # SEED then unused: refused before too, but as an unused macro.
    (["train.train.seed = 3"], "train.train.seed = 3"),
    # SEED used elsewhere: every seed trained seed 3, silently.
    (["train.train.seed = 3", "policies.prepare.seed = %SEED"],
     "train.train.seed = 3"),
    (["RUN_SEED = 3", "train.train.seed = %RUN_SEED",
      "policies.prepare.seed = %SEED"], "train.train.seed = %RUN_SEED = 3"),
])
def test_a_gin_file_that_binds_the_seed_itself_is_refused(tmp_path, lines,
                                                          binding):
  """Its train.train.seed, not the runner's SEED, would seed every run."""
  path = tmp_path / "fixed.gin"
  path.write_text("include 'configs/experiments/tiny.gin'\n"
                  "from __gin__ import dynamic_registration\n"
                  "from seed_jax import policies\n"
                  "from seed_jax import train\n" + "\n".join(lines) + "\n")
  out = tmp_path / "exp"
  with pytest.raises(SystemExit, match=(
      rf"^error: with {re.escape(str(path))}, {re.escape(binding)}, not "
      r"%SEED: every run would train that seed, whatever --seeds says")):
    experiments.main(["run", "--out", str(out), "--gin_file", str(path),
                      "--methods", "grpo,seed", "--seeds", "0,1",
                      "--dry_run"])
  assert not out.exists()


def test_bindings_near_the_runners_own_are_taken():
  runs = experiments.plan(
      "out", methods=["grpo"], seeds=[0], gin_files=["a.gin"],
      bindings=["NUM_UPDATES=5", "SEEDS=1", "train.train.eval_every=2",
                "policies.prepare.seed=1", "VARIANT_NOTE='x=SEED'"])
  assert runs[0].args[-1] == "--gin.VARIANT_NOTE='x=SEED'"
  # The variant is the runner's own only where a method binds it.
  run, = experiments.plan("out", methods=["plain"], seeds=[0],
                          gin_files=["a.gin"], bindings=["VARIANT='opid'"],
                          method_bindings={"plain": ()})
  assert run.args[-1] == "--gin.VARIANT='opid'"
  with pytest.raises(ValueError, match="sets SEED"):
    experiments.plan("out", methods=["plain"], seeds=[0], gin_files=["a.gin"],
                     bindings=["SEED=1"], method_bindings={"plain": ()})


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_rerun_with_another_budget_is_refused(tmp_path, monkeypatch,
                                                capsys, dry_run):
  """grpo trained for 10 updates, then seed asked for 20 on the same OUT:
  the summary would compare them. Refused before any run starts."""
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail(
      "a run started"))
  out = tmp_path / "exp"
  train.parse_gin([TINY], ["NUM_UPDATES=10"])
  (out / "grpo" / "seed0").mkdir(parents=True)
  (out / "grpo" / "seed0" / "config.gin").write_text(gin.config_str())
  gin.clear_config()
  argv = ["run", "--out", str(out), "--methods", "seed", "--seeds", "0",
          "--gin_file", TINY, *(["--dry_run"] if dry_run else [])]
  with pytest.raises(SystemExit, match=(
      r"^error: runs already in OUT differ in budget from the runs to "
      r"start: grpo/seed0 was trained with num_updates=10, not 20\.")):
    experiments.main(argv + ["--gin", "NUM_UPDATES=20"])
  if dry_run:  # the budget grpo had is taken
    assert experiments.main(argv + ["--gin", "NUM_UPDATES=10"]) == 0
    assert "# seed/seed0: to run, 10 updates" in capsys.readouterr().out


def test_run_skips_finished_runs_status_and_summary(tmp_path, capsys,
                                                   monkeypatch):
  out = str(tmp_path / "exp")
  argv = ["run", "--out", out, "--methods", "grpo,seed", "--seeds", "0",
          "--gin_file", TINY, "--parallel", "2"]
  assert experiments.main(argv) == 0
  status = _status(out)
  assert status["finished"] and list(status["runs"]) == ["grpo/seed0",
                                                          "seed/seed0"]
  logs = {}
  for name, r in status["runs"].items():
    assert (r["state"], r["returncode"], r["num_updates"]) == ("done", 0, 2)
    assert runner.read_history(r["workdir"])[-1]["update"] == 2
    logs[name] = open(r["log"]).read()
    assert logs[name].startswith("--- ") and "update 2 |" in logs[name]
    assert runner.last_logged_update(r["log"]) == 2
  assert "\"--gin.VARIANT='seed'\"" in status["runs"]["seed/seed0"]["command"]
  capsys.readouterr()

  # Rerun: both are done, nothing is started again.
  assert experiments.main(argv) == 0
  assert capsys.readouterr().out.count("done, skipped") == 2
  for name, r in _status(out)["runs"].items():
    assert r["state"] == "done" and open(r["log"]).read() == logs[name]

  assert experiments.main(["status", "--out", out]) == 0
  text = capsys.readouterr().out
  assert "stopped" in text and "grpo/seed0" in text
  assert [line.split()[1:3] for line in text.splitlines()[2:]] == [
      ["done", "2/2"], ["done", "2/2"]]

  md = tmp_path / "docs" / "results.md"
  md.parent.mkdir()
  md.write_text("# Results\n\nWritten by hand.\n")
  assert experiments.main(["summarize", "--out", out, "--md", str(md)]) == 0
  summary = json.load(open(os.path.join(out, "summary.json")))
  final = runner.read_history(os.path.join(out, "seed", "seed0"))[-1]
  assert summary["final"]["seed"]["unseen"]["all"]["values"] == [
      final["eval/unseen/success"]]
  assert summary["runs"]["grpo"]["0"]["env_steps"] == sum(
      r.get("env_steps", 0) for r in runner.read_history(
          os.path.join(out, "grpo", "seed0")))
  for name in ("summary.csv", "summary.md", "sample_efficiency.csv",
               "success_vs_updates.png", "success_vs_env_steps.png"):
    assert os.path.exists(os.path.join(out, name)), name
  text = md.read_text()
  assert text.startswith("# Results\n\nWritten by hand.\n")
  assert "(results/success_vs_env_steps.png)" in text
  assert "(results/metrics/seed_seed0.jsonl)" in text
  for name in ("success_vs_updates.png", "metrics/grpo_seed0.jsonl"):
    assert (tmp_path / "docs" / "results" / name).exists(), name
  # A second summary replaces its section and keeps the rest.
  experiments.main(["summarize", "--out", out, "--md", str(md)])
  assert md.read_text() == text

  # A later invocation on the same OUT (one method): the provenance keeps
  # both commands and every run's command.
  assert experiments.main(argv[:4] + ["grpo"] + argv[5:]) == 0
  status = _status(out)
  assert list(status["runs"]) == ["grpo/seed0"]
  assert list(status["other_runs"]) == ["seed/seed0"]
  assert len(status["commands"]) == 2
  experiments.main(["summarize", "--out", out, "--md", str(md)])
  text = md.read_text()
  for command in status["commands"]:
    assert command in text
  assert text.index("WORKDIR='" + os.path.join(out, "grpo", "seed0")) < (
      text.index("WORKDIR='" + os.path.join(out, "seed", "seed0")))

  # Every run's start and last checkpoint scored again. With the runs' own
  # seed, task count and temperature, the numbers are their evaluations at
  # updates 0 and 2.
  argv = ["evaluate", "--out", out, "--num_tasks", "2", "--seed", "0",
          "--md", str(md)]
  assert experiments.main(argv) == 0
  rescored = json.load(open(os.path.join(out, "rescored.json")))
  assert rescored["methods"] == ["grpo", "seed"]
  assert rescored["baseline"] == "grpo" and rescored["num_tasks"] == 2
  finals = {}
  for m in ("grpo", "seed"):
    assert rescored["steps"][m] == {"0": {"start": 0, "final": 2}}
    history = {r["update"]: r for r in runner.read_history(
        os.path.join(out, m, "seed0"))}
    for which, update in (("start", 0), ("final", 2)):
      for split in ("seen", "unseen"):
        assert rescored["success"][m][which][split]["all"]["values"] == [
            history[update][f"eval/{split}/success"]], (m, which, split)
    finals[m] = history[2]["eval/unseen/success"]
    assert os.path.exists(os.path.join(
        out, m, "seed0", "eval", "step_2_tasks2_seed0_temp0.4.csv"))
  assert rescored["paired"]["seed"]["unseen"]["values"] == [
      finals["seed"] - finals["grpo"]]
  # The reports list each task's outcome: task-by-task differences too.
  vs = rescored["by_task"]["seed"]["vs_baseline"]["unseen"]
  assert (vs["n_tasks"], vs["seeds"]) == (2, 1)
  assert vs["mean"] == pytest.approx(finals["seed"] - finals["grpo"])
  assert rescored["by_task"]["grpo"]["gain"]["seen"]["n_tasks"] == 2
  text = md.read_text()
  assert experiments.RESCORED_BEGIN in text and experiments.BEGIN in text
  assert "final − grpo, unseen" in text and " ".join(
      ["python", "-m", "seed_jax.experiments", *argv]) in text
  # Again: the kept reports are reused, nothing is scored a second time.
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(evaluate, "main", lambda argv: pytest.fail("scored"))
  assert experiments.main(argv) == 0
  assert md.read_text() == text
  assert experiments.main(argv[:-2] + ["--methods", "seed"]) == 0
  rescored = json.load(open(os.path.join(out, "rescored.json")))
  assert rescored["methods"] == ["seed"] and rescored["paired"] == {}
  # The tiny runs' rates are all 0: with distinct rates per run and update
  # (another evaluation seed, so no kept report is reused), start and final
  # and the sign of the paired difference are checked.
  def fake(argv):
    flags = dict(zip(argv[::2], argv[1::2]))
    workdir, step = flags["--workdir"], int(flags["--step"])
    rate = {"grpo": 0.25, "seed": 0.5}[os.path.basename(
        os.path.dirname(workdir))] + 0.0625 * step
    metrics = {f"eval/{split}/success": rate + (0.0625 if split == "unseen"
                                                else 0.0)
               for split in ("seen", "unseen")}
    path = evaluate.report_path(workdir, step, num_tasks=2, seed=7,
                                temperature=0.4) + ".json"
    with open(path, "w") as f:
      json.dump(dict(workdir=workdir, step=step, num_tasks=2, seed=7,
                     temperature=0.4, metrics=metrics), f)

  monkeypatch.setattr(evaluate, "main", fake)
  assert experiments.main(["evaluate", "--out", out, "--num_tasks", "2",
                           "--seed", "7"]) == 0
  rescored = json.load(open(os.path.join(out, "rescored.json")))
  got = {(m, which, split): rescored["success"][m][which][split]["all"][
      "values"] for m in ("grpo", "seed") for which in ("start", "final")
         for split in ("seen", "unseen")}
  assert got[("grpo", "start", "seen")] == [0.25]
  assert got[("grpo", "final", "unseen")] == [0.4375]
  assert got[("seed", "start", "unseen")] == [0.5625]
  assert got[("seed", "final", "seen")] == [0.625]
  assert rescored["paired"]["seed"]["unseen"]["values"] == [0.25]
  assert rescored["efficiency"] == {}
  # The sample-efficiency view on the same tasks: the last kept checkpoint
  # at or before each fraction of the last update (2).
  assert experiments.main(["evaluate", "--out", out, "--num_tasks", "2",
                           "--seed", "7", "--fractions", "0.5,0.9"]) == 0
  rescored = json.load(open(os.path.join(out, "rescored.json")))
  eff = rescored["efficiency"]["seed"]["unseen"]
  assert [(p["fraction"], p["updates"], p["values"]) for p in eff] == [
      (0.5, [1], [0.625]), (0.9, [1], [0.625]), (1.0, [2], [0.6875])]
  assert rescored["efficiency"]["grpo"]["seen"][0]["values"] == [0.3125]
  text = open(os.path.join(out, "rescored.md")).read()
  # The final is the 100% column, without a flag for it.
  assert "| unseen | seed | 62.5 [1] | 62.5 [1] | 68.8 [2] |" in text

  # A run that cannot be scored is named and left out; the others go on.
  os.remove(os.path.join(out, "grpo", "seed0", "eval",
                         "step_2_tasks2_seed0_temp0.4.json"))

  def corrupt(argv):
    raise SystemExit("error: checkpoint 2 is corrupt")

  monkeypatch.setattr(evaluate, "main", corrupt)
  capsys.readouterr()
  assert experiments.main(argv[:-2]) == 1
  why = "update 2 cannot be scored: error: checkpoint 2 is corrupt"
  assert f"grpo/seed0: left out, {why}" in capsys.readouterr().out
  rescored = json.load(open(os.path.join(out, "rescored.json")))
  assert rescored["methods"] == ["seed"]
  assert rescored["left_out"] == {"grpo/seed0": why}
  assert f"Left out: grpo/seed0 ({why})." in open(
      os.path.join(out, "rescored.md")).read()
  # A damaged report is named, not read as a result or scored over.
  report = os.path.join(out, "seed", "seed0", "eval",
                        "step_2_tasks2_seed0_temp0.4.json")
  with open(report, "w") as f:
    f.write('{"metrics": {')
  with pytest.raises(SystemExit, match=f"{report} does not parse"):
    experiments.main(argv[:-2] + ["--methods", "seed"])
  with pytest.raises(SystemExit, match="--num_tasks must be at least 1"):
    experiments.main(["evaluate", "--out", out, "--num_tasks", "0"])
  with pytest.raises(SystemExit, match="has a checkpoint that could be"):
    experiments.main(["evaluate", "--out", str(tmp_path / "empty")])


@pytest.mark.parametrize("field,value,named", [
    ("per_task", {"seen": "01-1", "unseen": "0011"},
     r"bad per_task\['seen'\] \(.*'01-1'"),
    ("per_task", {"seen": "0110", "unseen": [0, 1]},
     r"bad per_task\['unseen'\]"),
    ("per_task", "0110", r"per_task '0110', not outcomes by split"),
    ("per_task_stats", {"seen": {"search_usual": "1:2 x"}},
     r"bad per_task_stats\['seen'\] \(per-task statistic 'search_usual'"),
    ("per_task_stats", {"unseen": "1:2"},
     r"bad per_task_stats\['unseen'\] \(per-task statistics must be"),
    ("per_task_stats", "1:2", r"per_task_stats '1:2', not statistics by split"),
])
def test_a_report_with_damaged_per_task_records_is_named(tmp_path, field,
                                                         value, named):
  """Damaged per-task outcomes or search counts are refused, naming the
  file, the field and the split."""
  read = experiments._read_report  # pylint: disable=protected-access
  path = tmp_path / "step_2_tasks4_seed0_temp0.4.json"
  report = dict(step=2, num_tasks=4, seed=0, temperature=0.4,
                metrics={"eval/seen/success": 0.5, "eval/unseen/success": 0.5},
                per_task={"seen": "0110", "unseen": "0011"},
                per_task_stats={"seen": {"search_usual": "1:2 - 0:0 0:1"}})
  path.write_text(json.dumps(report))
  assert read(str(path)) == report
  report[field] = value
  path.write_text(json.dumps(report))
  with pytest.raises(ValueError) as e:
    read(str(path))
  assert re.match(rf"{re.escape(str(path))} has {named}", str(e.value))
  assert str(e.value).endswith("delete it and rerun to score that checkpoint "
                               "again")


@pytest.mark.parametrize("field", ["step", "metrics", "temperature",
                                   "eval/unseen/success"])
def test_a_report_without_a_field_is_named(tmp_path, field):
  """A report without a split's success was read here and refused only
  later, by the rescored table."""
  path = tmp_path / "step_2_tasks4_seed0_temp0.4.json"
  report = dict(step=2, num_tasks=4, seed=0, temperature=0.4,
                metrics={"eval/seen/success": 0.5, "eval/unseen/success": 0.5})
  named = field
  if field.startswith("eval/"):
    del report["metrics"][field]
    named = f"metrics['{field}']"
  else:
    del report[field]
  path.write_text(json.dumps(report))
  with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} has no "
                     rf"{re.escape(named)}; .*delete it and rerun"):
    experiments._read_report(str(path))  # pylint: disable=protected-access


def _fake_scoring(monkeypatch, last):
  """Stand-ins for `evaluate`: run (method, seed) keeps the checkpoints of
  updates `last[(method, seed)]` and 40 (when not past it), and a report's
  success is its update / 125. Returns the (workdir, update)s scored."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  scored = []

  def steps(workdir):
    seed = os.path.basename(workdir)
    key = (os.path.basename(os.path.dirname(workdir)), int(seed[4:]))
    return sorted({40, last[key]} if last[key] >= 40 else {last[key]})

  def fake_main(argv):
    flags = dict(zip(argv[::2], argv[1::2]))
    workdir, step = flags["--workdir"], int(flags["--step"])
    scored.append((workdir, step))
    path = evaluate.report_path(workdir, step, num_tasks=256, seed=12345,
                                temperature=0.4) + ".json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      json.dump(dict(step=step, num_tasks=256, seed=12345, temperature=0.4,
                     metrics={f"eval/{split}/success": step / 125
                              for split in ("seen", "unseen")}), f)

  monkeypatch.setattr(evaluate, "checkpoint_steps", steps)
  monkeypatch.setattr(evaluate, "main", fake_main)
  return scored


def test_evaluate_leaves_unfinished_runs_out(tmp_path, monkeypatch, capsys):
  out = tmp_path / "exp"
  # 100 updates planned for each; seed/seed1 (status.json) and seed/seed2
  # (its config.gin, not run by `run`) are still training.
  last = {("grpo", 0): 100, ("grpo", 1): 100, ("seed", 0): 100,
          ("seed", 1): 20, ("seed", 2): 30}
  for m, s in last:
    (out / m / f"seed{s}").mkdir(parents=True)

  def entry(m, s):
    return dict(method=m, seed=s, num_updates=100, state="running")

  (out / runner.STATUS).write_text(json.dumps(dict(
      runs={f"{m}/seed{s}": entry(m, s) for m, s in last if (m, s) not in (
          ("grpo", 1), ("seed", 2))},
      other_runs={"grpo/seed1": entry("grpo", 1)})))
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  train.parse_gin([TINY], ["NUM_UPDATES=100"])
  (out / "seed" / "seed2" / "config.gin").write_text(gin.config_str())
  gin.clear_config()
  scored = _fake_scoring(monkeypatch, last)
  assert experiments.main(["evaluate", "--out", str(out), "--fractions",
                           "0.4"]) == 0  # unfinished is no failure
  unfinished = {str(out / "seed" / "seed1"), str(out / "seed" / "seed2")}
  assert not unfinished & {w for w, _ in scored}  # never scored
  rescored = json.load(open(out / "rescored.json"))
  assert rescored["steps"]["seed"] == {"0": {"start": 0, "final": 100}}
  assert rescored["success"]["seed"]["final"]["seen"]["all"]["values"] == [
      0.8]
  assert rescored["unpaired"] == {}
  assert rescored["left_out"] == {
      "seed/seed1": "unfinished: its last checkpoint is update 20 of 100 "
                    "planned",
      "seed/seed2": "unfinished: its last checkpoint is update 30 of 100 "
                    "planned"}
  # Table 6's fractions are of the planned updates, the finished runs'.
  assert [(p["fraction"], p["updates"], p["values"]) for p in
          rescored["efficiency"]["seed"]["unseen"]] == [
              (0.4, [40], [0.32]), (1.0, [100], [0.8])]
  text = open(out / "rescored.md").read()
  assert "seed/seed1 (unfinished: its last checkpoint is update 20" in text
  assert "seed/seed2: left out, unfinished" in capsys.readouterr().out
  # Only unfinished runs: nothing to table, said so.
  for m, s in list(last):
    last[(m, s)] = 10
  with pytest.raises(SystemExit, match="no finished OUT/<method>/seed<S> "
                     "run .* has a checkpoint"):
    experiments.main(["evaluate", "--out", str(out)])


def _done_runs(out, last, monkeypatch):
  """Finished runs `last` ({(method, seed): last update}, 100 planned) in
  the experiment folder `out`, with faked scoring; returns `_fake_scoring`'s
  list of what was scored."""
  for m, s in last:
    (out / m / f"seed{s}").mkdir(parents=True)
  (out / runner.STATUS).write_text(json.dumps(dict(runs={
      f"{m}/seed{s}": dict(method=m, seed=s, num_updates=100, state="done")
      for m, s in last})))
  return _fake_scoring(monkeypatch, last)


def _done_grpo_run(tmp_path, monkeypatch):
  """`(out, workdir, scored)`: an experiment folder with one finished run,
  grpo/seed0 of 100 updates, and faked scoring (`_done_runs`)."""
  out = tmp_path / "exp"
  scored = _done_runs(out, {("grpo", 0): 100}, monkeypatch)
  return out, out / "grpo" / "seed0", scored


def _done_runs_scored(out, last, monkeypatch) -> list[dict[str, str]]:
  """`_done_runs`, with `evaluate.main` wrapped to record each scoring's
  flags; returns the list they ({flag: value}) are appended to."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  _done_runs(out, last, monkeypatch)
  fake, flags = evaluate.main, []
  monkeypatch.setattr(evaluate, "main", lambda argv: (
      flags.append(dict(zip(argv[::2], argv[1::2]))) or fake(argv)))
  return flags


def test_a_seeds_later_starts_are_given_its_first_start_report(
    tmp_path, monkeypatch):
  """Runs of one seed often share a warm start: each start after the first
  is scored with --same_as the first's report (copied when evaluate finds
  the same params); other seeds' starts and the finals are not."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  out = tmp_path / "exp"
  last = {("grpo", 0): 100, ("seed", 0): 100, ("seed", 1): 100}
  flags = _done_runs_scored(out, last, monkeypatch)
  assert experiments.main(["evaluate", "--out", str(out)]) == 0
  same = {(os.path.relpath(f["--workdir"], out), int(f["--step"])):
          f.get("--same_as") for f in flags}
  first = evaluate.report_path(str(out / "grpo" / "seed0"), 0, num_tasks=256,
                               seed=12345, temperature=0.4) + ".json"
  assert same == {("grpo/seed0", 0): None, ("grpo/seed0", 100): None,
                  ("seed/seed0", 0): first, ("seed/seed0", 100): None,
                  ("seed/seed1", 0): None, ("seed/seed1", 100): None}


def test_transcripts_are_written_beside_each_report_scored(
    tmp_path, monkeypatch):
  """--transcripts: every scoring writes its episodes beside its report,
  and a seed's later starts are played, not copied (a copy plays none)."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  out = tmp_path / "exp"
  last = {("grpo", 0): 100, ("seed", 0): 100}
  flags = _done_runs_scored(out, last, monkeypatch)
  assert experiments.main(["evaluate", "--out", str(out),
                           "--transcripts"]) == 0
  asked = {(os.path.relpath(f["--workdir"], out), int(f["--step"])):
           (f.get("--transcripts"), f.get("--same_as")) for f in flags}
  want = {}
  for m, s in last:
    workdir = str(out / m / f"seed{s}")
    for step in (0, 100):
      path = evaluate.report_path(workdir, step, num_tasks=256, seed=12345,
                                  temperature=0.4)
      want[(f"{m}/seed{s}", step)] = (path + ".jsonl", None)
  assert asked == want
  # Kept reports are reused: nothing is scored again.
  flags.clear()
  assert experiments.main(["evaluate", "--out", str(out),
                           "--transcripts"]) == 0
  assert not flags


def test_a_kept_report_of_other_settings_is_named(tmp_path, monkeypatch):
  """A report under the name of the settings asked for, made with others
  (an older name for 0.4000001 was temp0.4), is never reused."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  out, workdir, scored = _done_grpo_run(tmp_path, monkeypatch)
  path = evaluate.report_path(str(workdir), 0, num_tasks=256, seed=12345,
                              temperature=0.4) + ".json"
  os.makedirs(os.path.dirname(path))
  with open(path, "w") as f:
    json.dump(dict(step=0, num_tasks=256, seed=12345, temperature=0.4000001,
                   metrics={"eval/seen/success": 0.5,
                            "eval/unseen/success": 0.5}), f)
  with pytest.raises(SystemExit, match=re.escape(
      f"{path} was made with {{'temperature': 0.4000001}}, not "
      "{'temperature': 0.4}: delete it and rerun")):
    experiments.main(["evaluate", "--out", str(out)])
  assert scored == []


def test_reports_without_search_counts_are_scored_again_when_asked(
    tmp_path, monkeypatch, capsys):
  """A household report made by older code is reused and named; with
  --rescore_without_counts its checkpoint is scored again: a final without
  per-task search counts, a start or final without a statistic the tables
  read. A start without per-task counts (only the finals are compared task
  by task) and a report without search statistics (another game) are reused
  either way."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  out, workdir, scored = _done_grpo_run(tmp_path, monkeypatch)
  success = {"eval/seen/success": 0.5, "eval/unseen/success": 0.5}
  every = {n: (1, 2) for n in results.STATISTICS}
  household = dict(success, **{f"eval/seen/{n}": 0.5
                               for n in results.STATISTICS})

  def write(step, metrics, **fields):
    path = evaluate.report_path(str(workdir), step, num_tasks=256,
                                seed=12345, temperature=0.4) + ".json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      json.dump(dict(step=step, num_tasks=256, seed=12345, temperature=0.4,
                     metrics=metrics, **fields), f)

  write(0, household)
  write(100, success)
  argv = ["evaluate", "--out", str(out)]
  assert experiments.main(argv + ["--rescore_without_counts"]) == 0
  assert scored == []
  assert "report(s) of household" not in capsys.readouterr().out
  write(100, household)
  assert experiments.main(argv) == 0
  assert scored == []
  assert ("1 report(s) of household runs lack per-task search counts or "
          "statistics" in capsys.readouterr().out)
  assert experiments.main(argv + ["--rescore_without_counts"]) == 0
  assert scored == [(str(workdir), 100)]
  assert ("scoring update 100 (final) on 256 tasks per split, again: its "
          "report has no per-task search counts\n" in capsys.readouterr().out)
  # Counts for every task, but older ones: without look_invalid_take.
  older = {n: v for n, v in every.items() if n != "look_invalid_take"}
  write(100, household, per_task_stats={
      "seen": episodes.stats_text([older])})
  scored.clear()
  assert experiments.main(argv) == 0
  assert scored == []
  assert experiments.main(argv + ["--rescore_without_counts"]) == 0
  assert scored == [(str(workdir), 100)]
  assert ("update 100 (final) on 256 tasks per split, again: its report has "
          "no look_invalid_take\n" in capsys.readouterr().out)
  # A start without those statistics in its metrics, a final with them all.
  write(100, household, per_task_stats={
      "seen": episodes.stats_text([every])})
  write(0, {k: v for k, v in household.items() if "look" not in k})
  scored.clear()
  assert experiments.main(argv + ["--rescore_without_counts"]) == 0
  assert scored == [(str(workdir), 0)]
  assert ("update 0 (start) on 256 tasks per split, again: its report has no "
          "look_steps, look_new_place, look_revisit, look_other, "
          "look_invalid, look_invalid_take\n" in capsys.readouterr().out)


def _one_grpo_run(tmp_path, monkeypatch=None):
  """`(out, scored)`: an experiment folder under `tmp_path` with one run,
  grpo/seed0, whose metrics hold update 0.

  With `monkeypatch`, the status file plans that run for 100 updates and
  scoring is faked (`scored` lists what was scored). Without it there is no
  status file and `scored` is None."""
  out = tmp_path / "exp"
  (out / "grpo" / "seed0").mkdir(parents=True)
  (out / "grpo" / "seed0" / "metrics.jsonl").write_text(json.dumps(
      {"update": 0, "eval/seen/success": 0.5,
       "eval/unseen/success": 0.25}) + "\n")
  if monkeypatch is None:
    return out, None
  scored = _fake_scoring(monkeypatch, {("grpo", 0): 100})
  (out / runner.STATUS).write_text(json.dumps(dict(runs={"grpo/seed0": dict(
      method="grpo", seed=0, num_updates=100, command="python -m ...")})))
  return out, scored


def test_markers_out_of_order_are_refused_and_nothing_written(
    tmp_path, monkeypatch):
  out, scored = _one_grpo_run(tmp_path, monkeypatch)
  md = tmp_path / "results.md"
  for command, begin, end in (
      ("summarize", experiments.BEGIN, experiments.END),
      ("evaluate", experiments.RESCORED_BEGIN, experiments.RESCORED_END)):
    for text, why in ((f"intro\n{end}\nnotes\n{begin}\nold\n",
                       "its end marker comes before its begin marker"),
                      (f"intro\n{begin}\nold\n\n## Notes\nkeep me\n",
                       "it has 1 begin and 0 end markers"),
                      (f"{begin}\na\n{end}\n{begin}\nb\n{end}\n",
                       "it has 2 begin and 2 end markers")):
      md.write_text(text)
      with pytest.raises(SystemExit, match=f"^error: {re.escape(str(md))}: "
                         f"{why}"):
        experiments.main([command, "--out", str(out), "--md", str(md)])
      assert md.read_text() == text
  # Refused before any work: nothing scored, no summary written.
  assert not scored
  assert sorted(os.listdir(out)) == ["grpo", runner.STATUS]
  with pytest.raises(ValueError, match="end marker comes before"):
    experiments.replace_section(f"{experiments.END}\n{experiments.BEGIN}\n",
                                "x")


def test_md_without_a_suffix_is_refused(tmp_path, capsys):
  out, _ = _one_grpo_run(tmp_path)
  notes = tmp_path / "NOTES"
  notes.write_text("hand-written\n")
  (tmp_path / "docs").mkdir()
  for md in (notes, tmp_path / "docs"):
    with pytest.raises(SystemExit):
      experiments.main(["summarize", "--out", str(out), "--md", str(md)])
    assert f"argument --md: {md} " in capsys.readouterr().err
  assert notes.read_text() == "hand-written\n"
  assert os.listdir(out) == ["grpo"]  # nothing written
  with pytest.raises(ValueError, match="has no suffix"):
    experiments.write_summary(str(out), str(notes))


def test_evaluate_md_that_is_a_folder_is_refused_before_any_work(
    tmp_path, monkeypatch):
  out, scored = _one_grpo_run(tmp_path, monkeypatch)
  docs = tmp_path / "docs"
  docs.mkdir()
  with pytest.raises(SystemExit, match=f"^error: --md={re.escape(str(docs))}"
                     " is a folder; give a Markdown file"):
    experiments.main(["evaluate", "--out", str(out), "--md", str(docs)])
  assert not scored
  assert os.listdir(docs) == []


def test_negative_seeds_are_refused(tmp_path, capsys):
  with pytest.raises(SystemExit):
    experiments.main(["run", "--out", str(tmp_path), "--seeds=0,-1",
                      "--dry_run"])
  assert "argument --seeds: seeds must be >= 0" in capsys.readouterr().err
  with pytest.raises(ValueError, match=r"seeds must be >= 0, got \[-1\]"):
    experiments.plan("out", methods=["grpo"], seeds=[-1], gin_files=["a.gin"])


def test_a_runner_error_is_one_error_line(tmp_path, monkeypatch):
  def broken(*args, **kwargs):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(runner, "execute", broken)
  with pytest.raises(SystemExit, match=r"^error: \[Errno 28\] No space left "
                     "on device; the runner stopped, .* rerun the same "
                     "command to resume"):
    experiments.main(["run", "--out", str(tmp_path / "exp"), "--methods",
                      "grpo", "--seeds", "0", "--gin_file", TINY])


def test_a_failed_run_is_reported(tmp_path, capsys):
  out = str(tmp_path / "exp")
  # More free space than any disk has: the run stops before training.
  assert experiments.main(
      ["run", "--out", out, "--methods", "grpo", "--seeds", "0",
       "--gin_file", TINY, "--gin",
       "train.train.min_free_bytes=1000000000000000000"]) == 1
  run = _status(out)["runs"]["grpo/seed0"]
  assert run["state"] == "failed" and run["returncode"] == 1
  assert "GiB free" in open(run["log"]).read()
  capsys.readouterr()
  experiments.main(["status", "--out", out])
  assert "failed (1)" in capsys.readouterr().out


def test_summarize_takes_planned_updates_from_config_gin(tmp_path):
  """Without status.json, or without the run in it, a run stopped partway is
  known by its config.gin and left out of the tables."""
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  out = tmp_path / "exp"
  train.parse_gin([TINY], ["NUM_UPDATES=10"])
  config = gin.config_str()
  gin.clear_config()
  for seed, last, rate in ((0, 10, 0.5), (1, 5, 0.25)):
    workdir = out / "grpo" / f"seed{seed}"
    workdir.mkdir(parents=True)
    (workdir / "config.gin").write_text(config)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(
        {"update": u, "env_steps": 4.0, "eval/seen/success": rate,
         "eval/unseen/success": rate}) + "\n" for u in range(last + 1)))
  for status in (None, {"runs": {"grpo/seed0": dict(
      method="grpo", seed=0, num_updates=10, command="python -m ...")}}):
    if status is not None:
      (out / runner.STATUS).write_text(json.dumps(status))
    assert experiments.main(["summarize", "--out", str(out)]) == 0
    summary = json.load(open(out / "summary.json"))
    assert summary["unfinished"] == ["grpo/seed1"]
    assert summary["runs"]["grpo"]["1"]["planned"] == 10
    assert not summary["runs"]["grpo"]["1"]["finished"]
    assert summary["final"]["grpo"]["seen"]["all"]["values"] == [0.5]
    text = open(out / "summary.md").read()
    assert "| family | grpo (1 seed) |" in text
    assert "not finished: grpo/seed1 (update 5 of 10)" in text


def test_summarize_names_runs_without_metrics(tmp_path):
  """A run that never wrote a metrics line (failed before its first update,
  or still in it) is named as unfinished, whether OUT holds its folder or
  status.json its entry."""
  out = tmp_path / "exp"
  workdir = out / "grpo" / "seed0"
  workdir.mkdir(parents=True)
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(
      {"update": u, "env_steps": 4.0, "eval/seen/success": 0.5,
       "eval/unseen/success": 0.5}) + "\n" for u in range(11)))
  (out / "grpo" / "seed1").mkdir()  # a folder, no metrics.jsonl
  (out / runner.STATUS).write_text(json.dumps({"runs": {
      f"grpo/seed{s}": dict(method="grpo", seed=s, num_updates=10,
                            state=state, command="python -m ...")
      for s, state in ((0, "done"), (2, "failed"))}}))
  assert experiments.main(["summarize", "--out", str(out)]) == 0
  summary = json.load(open(out / "summary.json"))
  assert summary["unfinished"] == ["grpo/seed1", "grpo/seed2"]
  assert list(summary["runs"]["grpo"]) == ["0", "1", "2"]
  assert summary["runs"]["grpo"]["2"]["planned"] == 10
  assert summary["final"]["grpo"]["seen"]["all"]["values"] == [0.5]
  text = open(out / "summary.md").read()
  assert ("not finished: grpo/seed1 (no metrics yet), grpo/seed2 (no "
          "metrics yet).") in text
  assert "| family | grpo (1 seed) |" in text
  for s in (1, 2):
    assert f"| grpo | {s} | no metrics yet | - | - |" in text


def test_bad_inputs(tmp_path, capsys):
  with pytest.raises(SystemExit, match="no status.json"):
    experiments.main(["status", "--out", str(tmp_path)])
  with pytest.raises(SystemExit, match="no run has finished"):
    experiments.main(["summarize", "--out", str(tmp_path)])
  with pytest.raises(SystemExit):
    experiments.main(["run", "--out", str(tmp_path), "--bogus"])
  (tmp_path / "status.json").write_text('{"pid": 1,\n')
  with pytest.raises(SystemExit, match="status.json does not parse"):
    experiments.main(["status", "--out", str(tmp_path)])
  with pytest.raises(SystemExit):  # a fraction outside (0, 1]
    experiments.main(["evaluate", "--out", str(tmp_path), "--fractions",
                      "0.5,1.5"])
  os.makedirs(tmp_path / "grpo" / "seed0")
  with pytest.raises(SystemExit, match=r"method\(s\) \['grpoo'\].*\['grpo'\]"):
    experiments.main(["evaluate", "--out", str(tmp_path), "--num_tasks", "1",
                      "--methods", "grpoo"])
  (tmp_path / "status.json").write_text("{}")
  with pytest.raises(SystemExit, match=r"not a runner's status \(no \['pid'"):
    experiments.main(["status", "--out", str(tmp_path)])
  # Flags that would plan nothing or evaluate nonsense stop at parsing.
  for flags in (["run", "--seeds", ","], ["run", "--methods", ","],
                ["evaluate", "--temperature", "nan"],
                ["evaluate", "--temperature", "-1"]):
    with pytest.raises(SystemExit):
      experiments.main([flags[0], "--out", str(tmp_path), *flags[1:]])
    assert "argument --" in capsys.readouterr().err
  # A damaged metrics.jsonl is named by path and line, in every command.
  metrics = tmp_path / "grpo" / "seed0" / "metrics.jsonl"
  metrics.write_text('{"update": 1}\n{"update": 2, "succ')
  for command in (["summarize"], ["run", "--methods", "grpo", "--seeds", "0",
                                  "--gin_file", TINY, "--dry_run"]):
    with pytest.raises(SystemExit, match=f"{metrics} line 2: not JSON"):
      experiments.main([command[0], "--out", str(tmp_path), *command[1:]])


def test_replace_section():
  section = "## Results\n| a |\n"
  once = experiments.replace_section("# Title\n\ntext\n", section)
  assert once == (f"# Title\n\ntext\n\n{experiments.BEGIN}\n## Results\n"
                  f"| a |\n{experiments.END}\n")
  twice = experiments.replace_section(once + "after\n", "new\n")
  assert twice == (f"# Title\n\ntext\n\n{experiments.BEGIN}\nnew\n"
                   f"{experiments.END}\n\nafter\n")
  assert experiments.replace_section(twice, "new\n") == twice
  assert experiments.replace_section("", "x") == (
      f"{experiments.BEGIN}\nx\n{experiments.END}\n")


@pytest.mark.slow
def test_sigterm_stops_the_runs_and_the_same_command_resumes(tmp_path):
  out = str(tmp_path / "exp")
  argv = ["run", "--out", out, "--methods", "grpo", "--seeds", "0",
          "--gin_file", TINY, "--gin", "NUM_UPDATES=20"]
  proc = subprocess.Popen([sys.executable, "-m", "seed_jax.experiments",
                           *argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  log = os.path.join(out, "grpo", "seed0", "log.txt")
  deadline = time.time() + 300
  # Once update 2 is logged, update 1's checkpoint is complete.
  while (runner.last_logged_update(log) or 0) < 2:
    assert time.time() < deadline and proc.poll() is None
    time.sleep(1)
  child = _status(out)["runs"]["grpo/seed0"]["pid"]
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == 130
  run = _status(out)["runs"]["grpo/seed0"]
  assert run["state"] == "interrupted"
  with pytest.raises(ProcessLookupError):
    os.kill(child, 0)
  assert experiments.main(argv) == 0
  assert "resumed from update" in open(log).read()
  assert runner.read_history(run["workdir"])[-1]["update"] == 20
