"""Sweeps: expansion, commands, local runs (train stubbed) and the summary."""

import json
import os
import shlex
import subprocess

import pytest

from seed_jax import sweep
from seed_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "configs", "sweeps", "opd_lambda_beta.py")
TINY = "configs/experiments/tiny.gin"


def test_the_lambda_beta_sweep_runs_lambda_zero_once():
  """beta shapes only the distillation term, which lambda = 0 drops: one
  run per beta there would train the same run twice (a slice each)."""
  runs = sweep.load(SWEEP)
  coef, beta = "trainer.RLConfig.opd_coef", "trainer.RLConfig.opd_beta"
  assert runs[0] == {coef: 0.0}
  assert runs[1:] == [{coef: c, beta: b} for c in (0.003, 0.01, 0.03)
                      for b in (1.0, 5.0)]
  # No two runs that train alike: beta counts only where lambda is not 0.
  trained = [(b[coef], b.get(beta) if b[coef] else None) for b in runs]
  assert len(set(trained)) == len(runs) == 7
  assert sweep.sweep_name(SWEEP) == "opd_lambda_beta"


def test_a_file_without_sweep_is_an_error(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("RUNS = []\n")
  with pytest.raises(ValueError, match="no sweep"):
    sweep.load(str(bad))


@pytest.mark.parametrize("body", ["yield 3", "yield [('a.b', 1)]"])
def test_a_sweep_that_yields_no_dict_is_an_error(tmp_path, body):
  bad = tmp_path / "bad.py"
  bad.write_text(f"def sweep():\n  {body}\n")
  with pytest.raises(ValueError, match="must be a dict of gin names"):
    sweep.load(str(bad))


def test_a_missing_sweep_file_or_a_bad_binding_is_a_plain_error(tmp_path):
  with pytest.raises(SystemExit, match="error: no sweep file"):
    sweep.main([f"--sweep={tmp_path}/nope.py", f"--gin_file={TINY}",
                f"--workdir={tmp_path}", "--emit_commands"])
  # Checked before any command is printed or run.
  with pytest.raises(SystemExit, match="gin cannot parse 'VARIANT=seed'"):
    sweep.main([f"--sweep={SWEEP}", f"--gin_file={TINY}",
                f"--workdir={tmp_path}", "--emit_commands",
                "--gin.VARIANT=seed"])


def test_a_relative_sweep_file_is_found_in_the_checkout_as_gin_files_are(
    tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # not the checkout
  argv = ["--gin_file=configs/experiments/tiny.gin", "--workdir=runs",
          "--emit_commands"]
  assert sweep.main(["--sweep=configs/sweeps/opd_lambda_beta.py", *argv]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 7 and "'runs/opd_lambda_beta/6'" in lines[6]
  assert sweep.load("configs/sweeps/opd_lambda_beta.py") == sweep.load(SWEEP)
  # A file here comes first.
  (tmp_path / "configs" / "sweeps").mkdir(parents=True)
  (tmp_path / "configs" / "sweeps" / "opd_lambda_beta.py").write_text(
      "def sweep():\n  yield {'trainer.RLConfig.opd_coef': 0.5}\n")
  assert sweep.main(["--sweep=configs/sweeps/opd_lambda_beta.py", *argv]) == 0
  assert len(capsys.readouterr().out.splitlines()) == 1
  with pytest.raises(SystemExit) as e:
    sweep.main(["--sweep=configs/sweeps/nope.py", *argv])
  assert str(e.value) == (
      "error: no sweep file 'configs/sweeps/nope.py' (looked for "
      f"{tmp_path}/configs/sweeps/nope.py and "
      f"{ROOT}/configs/sweeps/nope.py)")


def test_a_workdir_binding_is_refused(tmp_path, capsys):
  # It would override every run's WORKDIR/<sweep>/<index>: one folder for all.
  with pytest.raises(SystemExit):
    sweep.main([f"--sweep={SWEEP}", f"--gin_file={TINY}",
                f"--workdir={tmp_path}", "--emit_commands",
                "--gin.WORKDIR='/shared'"])
  err = capsys.readouterr()
  assert "error: \"--gin.WORKDIR='/shared'\" would send every run" in err.err
  assert not err.out
  bad = tmp_path / "bad.py"
  bad.write_text("def sweep():\n  yield {'WORKDIR': '/shared'}\n")
  with pytest.raises(ValueError, match="binds WORKDIR"):
    sweep.load(str(bad))

def test_emitted_commands(capsys):
  argv = [f"--sweep={SWEEP}", f"--gin_file={TINY}", "--workdir=/runs",
          "--emit_commands", "--gin.VARIANT='seed'"]
  assert sweep.main(argv) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 7
  assert lines[2] == (
      f"python -m seed_jax.train --gin_file={TINY} "
      "\"--gin.WORKDIR='/runs/opd_lambda_beta/2'\" \"--gin.VARIANT='seed'\" "
      "--gin.trainer.RLConfig.opd_coef=0.003 "
      "--gin.trainer.RLConfig.opd_beta=5.0")
  assert shlex.split(lines[2])[3:] == sweep.train_argv(
      [TINY], "/runs/opd_lambda_beta/2", sweep.load(SWEEP)[2],
      ["--gin.VARIANT='seed'"])
  # Several hosts need a training mesh: refused before a slice is rented.
  for launcher in ("tpu", "slurm"):
    with pytest.raises(SystemExit, match="several hosts needs "
                       "train.train.mesh_shape"):
      sweep.main(argv + [f"--launcher={launcher}"])
  argv.append("--gin.train.train.mesh_shape=(1,-1,1)")
  assert sweep.main(argv + ["--launcher=tpu"]) == 0
  assert capsys.readouterr().out.splitlines()[1] == (
      f"TPU_NAME=${{TPU_NAME}}-1 GIN_FILE={TINY} "
      "WORKDIR=/runs/opd_lambda_beta/1 launch/tpu_vm.sh up "
      "\"--gin.VARIANT='seed'\" '--gin.train.train.mesh_shape=(1,-1,1)' "
      "--gin.trainer.RLConfig.opd_coef=0.003 "
      "--gin.trainer.RLConfig.opd_beta=1.0")
  assert sweep.main(argv + ["--launcher=slurm"]) == 0
  slurm = shlex.split(capsys.readouterr().out.splitlines()[0])
  assert slurm[2:5] == ["sbatch", "--nodes=${NODES}",
                        "--gpus-per-node=${GPUS_PER_NODE}"]
  assert shlex.split(slurm[5][len("--wrap="):]) == [
      "launch/slurm_gpu.sh", "--gin.VARIANT='seed'",
      "--gin.train.train.mesh_shape=(1,-1,1)",
      "--gin.trainer.RLConfig.opd_coef=0.0"]


@pytest.mark.parametrize("launcher", ["tpu", "slurm"])
def test_emitted_assignments_survive_a_space(capsys, launcher):
  argv = [f"--sweep={SWEEP}", f"--gin_file={TINY}", "--workdir=/my runs",
          "--emit_commands", f"--launcher={launcher}",
          "--gin.train.train.mesh_shape=(1,-1,1)"]
  assert sweep.main(argv) == 0
  line = capsys.readouterr().out.splitlines()[2]
  head = line.split(" launch/" if launcher == "tpu" else " sbatch ")[0]
  out = subprocess.run(["bash", "-c", f"{head} printenv WORKDIR GIN_FILE"],
                       env={"TPU_NAME": "t"}, capture_output=True, text=True,
                       check=True).stdout
  assert out.splitlines() == ["/my runs/opd_lambda_beta/2", TINY]


def _write_metrics(run_dir, records):
  os.makedirs(run_dir, exist_ok=True)
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def test_summary_of_finished_and_missing_runs(tmp_path):
  runs = [{"a.lr": 0.1, "b.variant": "seed"}, {"a.lr": 0.2}]
  _write_metrics(str(tmp_path / "0"), [
      {"update": 0, "eval/seen/success": 0.25},
      {"update": 1, "success_rate": 0.5, "kl": 0.00123456}])
  header, rows = sweep.summarize(runs, str(tmp_path),
                                 metrics=("eval/seen/success", "kl"))
  text = sweep.write_summary(str(tmp_path), header, rows)
  assert text == ("| run | lr | variant | status | eval/seen/success | kl |\n"
                  "|---|---|---|---|---|---|\n"
                  "| 0 | 0.1 | seed | done | 0.25 | 0.001235 |\n"
                  "| 1 | 0.2 | - | missing | - | - |\n")
  assert (tmp_path / "summary.md").read_text() == text
  assert (tmp_path / "summary.csv").read_text().splitlines() == [
      "run,lr,variant,status,eval/seen/success,kl",
      "0,0.1,seed,done,0.25,0.001235", "1,0.2,-,missing,-,-"]


def test_a_run_short_of_its_updates_is_not_done(tmp_path):
  runs = [{"a.lr": 0.1}, {"a.lr": 0.2}]
  _write_metrics(str(tmp_path / "0"), [{"update": 0}, {"update": 3}])
  _write_metrics(str(tmp_path / "1"), [{"update": 0}, {"update": 150}])
  _, rows = sweep.summarize(runs, str(tmp_path), metrics=(),
                            num_updates=[150, 150])
  assert [r[2] for r in rows] == ["update 3/150", "done"]


def test_local_runs_one_after_another(tmp_path, monkeypatch, capsys):
  calls = []

  def fake_main(argv):
    calls.append(argv)
    workdir = [a for a in argv if a.startswith("--gin.WORKDIR=")][0]
    run_dir = workdir.split("=", 1)[1].strip("'")
    if run_dir.endswith("/1"):
      raise FloatingPointError("diverged")
    if run_dir.endswith("/2"):  # train.main's one-line error, say a typo
      raise SystemExit("error: gin binding ...")
    _write_metrics(run_dir, [{"update": 1, "success_rate": 0.75}])

  monkeypatch.setattr(train, "main", fake_main)
  sweep_file = tmp_path / "two.py"
  sweep_file.write_text(
      "def sweep():\n"
      "  for lr in (0.1, 0.2, 0.3):\n"
      "    yield {'train.train.learning_rate': lr}\n")
  code = sweep.main([f"--sweep={sweep_file}", f"--gin_file={TINY}",
                     f"--workdir={tmp_path}", "--local",
                     "--gin.NUM_UPDATES=1", "--metrics=success_rate"])
  assert code == 1  # two runs failed
  root = str(tmp_path / "two")
  assert calls == [
      sweep.train_argv([TINY], os.path.join(root, str(i)),
                       {"train.train.learning_rate": lr},
                       ["--gin.NUM_UPDATES=1"])
      for i, lr in enumerate((0.1, 0.2, 0.3))]
  out = capsys.readouterr().out
  assert "| 0 | 0.1 | done | 0.75 |" in out
  assert "| 1 | 0.2 | failed | - |" in out
  assert "| 2 | 0.3 | failed | - |" in out
  assert os.path.exists(os.path.join(root, "summary.csv"))


@pytest.mark.parametrize("body,match", [
    ("def sweep():\n  yield {'a.b': 1\n", r"two.py': syntax error line 2: "),
    ("import nope_no_such_module\n", "two.py' line 1: ModuleNotFoundError: "
     "No module named 'nope_no_such_module'"),
    ("def sweep():\n  yield {'a.b': 1}\n  yield {'a.b': 1 / 0}\n",
     "two.py' line 3: ZeroDivisionError: division by zero"),
    ("def sweep():\n  raise ValueError('no lr given')\n",
     "two.py' line 2: ValueError: no lr given"),
])
def test_a_sweep_file_that_does_not_run_is_an_error_naming_it(
    tmp_path, body, match):
  sweep_file = tmp_path / "two.py"
  sweep_file.write_text(body)
  with pytest.raises(SystemExit, match=f"^error: sweep file '{tmp_path}/"
                     f"{match}"):
    sweep.main([f"--sweep={sweep_file}", f"--gin_file={TINY}",
                f"--workdir={tmp_path}", "--emit_commands"])


def test_a_pod_launcher_with_two_gin_files_is_an_error(tmp_path):
  with pytest.raises(SystemExit,
                     match="^error: launcher 'tpu' takes exactly one"):
    # Two files that parse together (tiny.gin includes rl.gin, so rl.gin
    # after it would bind the paper's 2048-token prompts to tiny's buckets).
    sweep.main([f"--sweep={SWEEP}", "--gin_file=configs/runs/rl.gin",
                f"--gin_file={TINY}", f"--workdir={tmp_path}",
                "--emit_commands", "--launcher=tpu",
                "--gin.train.train.mesh_shape=(1,-1,1)"])


@pytest.mark.parametrize("mode", [[], ["--local"]])
def test_a_pod_launcher_without_emit_commands_is_an_error(
    tmp_path, monkeypatch, capsys, mode):
  monkeypatch.setattr(train, "main", pytest.fail)  # nothing may train
  with pytest.raises(SystemExit) as e:
    sweep.main([f"--sweep={SWEEP}", f"--gin_file={TINY}",
                f"--workdir={tmp_path}", "--launcher=tpu", *mode])
  assert e.value.code == 2
  assert "--launcher=tpu needs --emit_commands" in capsys.readouterr().err
  assert not os.listdir(tmp_path)


def test_run_local_trains_only_the_given_runs_in_their_own_folders(
    tmp_path, monkeypatch):
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  seen = []

  def fake_main(argv):
    seen.append(next(a for a in argv if "WORKDIR" in a))
    if "2'" in seen[-1]:
      raise ValueError("diverged")

  monkeypatch.setattr(train, "main", fake_main)
  runs = [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}]
  failed = sweep.run_local(runs, gin_files=[TINY], root=str(tmp_path),
                           only=[2, 3])
  assert [w.rsplit(os.sep, 1)[-1] for w in seen] == ["2'", "3'"]
  assert failed == [2]


def _summarize(tmp_path, metrics):
  sweep_file = tmp_path / "s.py"
  sweep_file.write_text("def sweep():\n  for lr in (0.1, 0.2, 0.3):\n"
                        "    yield {'train.train.learning_rate': lr}\n")
  return sweep.main([f"--sweep={sweep_file}", f"--gin_file={TINY}",
                     f"--workdir={tmp_path}", "--summarize",
                     "--gin.NUM_UPDATES=2", f"--metrics={metrics}"])


def test_a_metric_no_done_run_logged_is_warned_about(tmp_path, capsys):
  # Run 0 is done, run 1 still going (it may log eval later), 2 missing.
  _write_metrics(str(tmp_path / "s" / "0"),
                 [{"update": 2, "kl": 0.5, "success_rate": 0.25}])
  _write_metrics(str(tmp_path / "s" / "1"),
                 [{"update": 1, "eval/seen/success": 0.5}])
  assert _summarize(tmp_path, "kl,succes_rate,eval/seen/success") == 0
  out, err = capsys.readouterr()
  assert err == ("warning: no done run logged --metrics succes_rate, "
                 "eval/seen/success; they log: kl, success_rate, update\n")
  assert "| 0 | 0.1 | done | 0.5 | - | - |" in out  # the table still comes
  assert _summarize(tmp_path, "kl,success_rate") == 0
  assert capsys.readouterr().err == ""


def test_metrics_with_spaces_are_the_same_columns(tmp_path, capsys):
  _write_metrics(str(tmp_path / "s" / "0"),
                 [{"update": 2, "kl": 0.5, "success_rate": 0.25}])
  assert _summarize(tmp_path, " kl, success_rate ,") == 0
  out, err = capsys.readouterr()
  assert err == ""
  assert "| 0 | 0.1 | done | 0.5 | 0.25 |" in out


def test_no_warning_while_no_run_is_done(tmp_path, capsys):
  _write_metrics(str(tmp_path / "s" / "0"), [{"update": 1, "kl": 0.5}])
  assert _summarize(tmp_path, "eval/seen/success") == 0
  assert capsys.readouterr().err == ""


@pytest.mark.parametrize("tail,match", [
    ('{"update": 2, "kl": 0.', r"line 2: not JSON \(.*\); a truncated file"),
    ("[1, 2]", r"line 2: \[1, 2\] is not a JSON object"),
])
def test_a_broken_metrics_file_is_an_error_naming_file_and_line(
    tmp_path, tail, match):
  run_dir = tmp_path / "s" / "1"
  _write_metrics(str(run_dir), [{"update": 1, "kl": 0.5}])
  with open(run_dir / "metrics.jsonl", "a") as f:
    f.write(tail)
  path = run_dir / "metrics.jsonl"
  with pytest.raises(ValueError, match=f"^{path} {match}"):
    sweep.final_metrics(str(run_dir))
  with pytest.raises(SystemExit, match=f"^error: summary of {tmp_path}/s: "
                     f"{path} {match}"):
    _summarize(tmp_path, "kl")
  assert not (tmp_path / "s" / "summary.md").exists()


def test_run_status_is_the_summary_status(tmp_path):
  root = str(tmp_path)
  _write_metrics(str(tmp_path / "0"), [{"update": 0}, {"update": 150}])
  _write_metrics(str(tmp_path / "1"), [{"update": 0}, {"update": 3}])
  _write_metrics(str(tmp_path / "3"), [{"kl": 0.1}])  # damaged
  assert sweep.run_status(root, 0, 150) == "done"
  assert sweep.run_status(root, 0, 100) == "done"  # more than planned
  assert sweep.run_status(root, 1, 150) == "update 3/150"
  assert sweep.run_status(root, 2, 150) == "missing"
  with pytest.raises(ValueError, match="3/metrics.jsonl line 1"):
    sweep.run_status(root, 3, 150)
  assert sweep.run_status(root, 0, 150, failed=[0]) == "failed"
  assert sweep.run_status(root, 2, failed=(2,)) == "failed"
  # Without a plan, a run with metrics is done.
  assert sweep.run_status(root, 1) == "done"
  assert sweep.run_status(root, 2) == "missing"
  runs = [{"a.lr": 0.1}] * 3
  _, rows = sweep.summarize(runs, root, metrics=(), failed=[0],
                            num_updates=[150] * 3)
  assert [r[2] for r in rows] == ["failed", "update 3/150", "missing"] == [
      sweep.run_status(root, i, 150, failed=[0]) for i in range(3)]


def test_a_sweep_changed_since_its_folders_trained_is_refused(
    tmp_path, monkeypatch, capsys):
  trained = []

  def fake_main(argv):
    run_dir = next(a for a in argv if a.startswith("--gin.WORKDIR="))
    trained.append(run_dir)
    _write_metrics(run_dir.split("=", 1)[1].strip("'"),
                   [{"update": 1, "success_rate": 0.5}])

  monkeypatch.setattr(train, "main", fake_main)
  sweep_file = tmp_path / "s.py"

  def run(values, *mode):
    sweep_file.write_text("def sweep():\n"
                          f"  for lr in {values!r}:\n"
                          "    yield {'train.train.learning_rate': lr}\n")
    return sweep.main([f"--sweep={sweep_file}", f"--gin_file={TINY}",
                       f"--workdir={tmp_path}", *mode,
                       "--gin.NUM_UPDATES=1", "--metrics=success_rate"])

  assert run((0.1, 0.3), "--local") == 0
  root = tmp_path / "s"
  record = json.loads((root / "1" / sweep.RUN_RECORD).read_text())
  assert record == {"run": 1,
                    "bindings": ["--gin.train.train.learning_rate=0.3"]}
  # The same sweep again, or with a run appended, goes on.
  assert run((0.1, 0.3, 0.5), "--local") == 0
  assert len(trained) == 5
  # A value inserted before run 1: folder 1 holds lr 0.3, the sweep says 0.2.
  for mode in (["--local"], ["--summarize"], ["--emit_commands"]):
    with pytest.raises(SystemExit, match=(
        r"(?s)runs changed since.*s/1 was trained with "
        r"--gin.train.train.learning_rate=0.3; the sweep's run 1 is "
        r"--gin.train.train.learning_rate=0.2")) as e:
      run((0.1, 0.2, 0.3, 0.5), *mode)
    assert "s/2 was trained with" in str(e.value)
    assert "s/0 " not in str(e.value)
  assert len(trained) == 5  # nothing trained
  assert "| 0.2 |" not in capsys.readouterr().out  # nor summarized
  # run_local (the notebook's) checks the folders it trains in, and only those.
  runs = [{"train.train.learning_rate": v} for v in (0.1, 0.2)]
  with pytest.raises(ValueError, match="s/1 was trained with"):
    sweep.run_local(runs, gin_files=[TINY], root=str(root), only=[1])
  assert sweep.run_local(runs, gin_files=[TINY], root=str(root),
                         only=[0]) == []
  # summarize (the notebook's table) checks every folder too.
  with pytest.raises(ValueError, match="s/1 was trained with"):
    sweep.summarize(runs, str(root))
  # A damaged record is named.
  (root / "0" / sweep.RUN_RECORD).write_text("{")
  with pytest.raises(ValueError, match=r"s/0/sweep_run.json: not a sweep run"):
    sweep.check_runs(runs, str(root))
