"""`python -m seed_jax.evaluate` on a tiny training run, and its bad inputs."""

import csv
import dataclasses
import json
import os
import re
import shutil

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from seed_jax import checkpoints
from seed_jax import episodes
from seed_jax import evaluate
from seed_jax import hf
from seed_jax import manifests
from seed_jax import prompts
from seed_jax import testing
from seed_jax import trainer as trainer_lib
from seed_jax.envs import base as envs_base

def _history(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["update"]: r for r in map(json.loads, f)}


def test_reproduces_the_runs_own_evaluation(tiny_run, tmp_path, monkeypatch):
  scored, settings = [], []
  real_score = evaluate.score
  monkeypatch.setattr(evaluate, "score", lambda policy, params, **kw: (
      scored.append(params) or settings.append(kw) or
      real_score(policy, params, **kw)))
  out_json, out_csv = tmp_path / "e.json", tmp_path / "e.csv"
  # The run's eval_tasks (2), eval_temperature (0.4) and seed (0).
  report = evaluate.main(["--workdir", tiny_run, "--num_tasks", "2",
                          "--out_json", str(out_json),
                          "--out_csv", str(out_csv)])
  assert report["step"] == 2 and report["max_steps"] == 2
  assert report["history_length"] == 1
  want = {k: v for k, v in _history(tiny_run)[2].items()
          if k.startswith("eval/")}
  assert report["metrics"] == want
  assert "eval/unseen/tasks/heat" in want  # per-family task counts
  # The share of replies cut at max_new_tokens, per split and family.
  assert 0 <= want["eval/unseen/responses_truncated/heat"] <= 1
  # The tiny run's success rates are 0, so the equality above cannot tell
  # the sampling apart: the key and settings are the trainer's at update 2
  # (train.py: fold_in(key(seed), EVAL_RNG_OFFSET + update)).
  [kw] = settings
  want_rng = jax.random.fold_in(jax.random.key(0),
                                evaluate.EVAL_RNG_OFFSET + 2)
  np.testing.assert_array_equal(jax.random.key_data(kw["rng"]),
                                jax.random.key_data(want_rng))
  assert (kw["temperature"], kw["max_steps"], kw["history_length"],
          kw["num_tasks"], kw["invalid_action"]) == (0.4, 2, 1, 2, "no_op")
  assert report["invalid_action"] == "no_op"  # the run's

  # The weights scored are the checkpoint's (read here without a target),
  # not the initial policy's.
  saved = ocp.StandardCheckpointer().restore(
      os.path.join(tiny_run, "checkpoints", "2", "state"))["params"]
  testing.assert_trees_equal(scored[0], saved)
  initial = testing.tiny_policy(seed=0).params
  assert any(not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(saved), jax.tree.leaves(initial)))

  assert json.loads(out_json.read_text()) == json.loads(json.dumps(report))
  # Each task's outcome, in task order, agrees with the rates.
  assert report["per_task"] == {"seen": "00", "unseen": "00"}
  # And its search counts (the household game's episode statistics), whose
  # sums are the report's ratios.
  for split in ("seen", "unseen"):
    stats = episodes.stats_from_text(report["per_task_stats"][split])
    assert len(stats) == 2
    ratios = episodes.sum_ratios(stats)
    assert ratios == pytest.approx(
        {k: want[f"eval/{split}/{k}"] for k in ratios}, abs=1e-6)
    assert all(f"eval/{split}/{k}" not in want
               for k in ("search_usual", "search_usual_chance",
                         "search_usual_over_chance") if k not in ratios)
    # Every episode says whether it took a goal object.
    assert stats and all(s["took_goal"][1] == 1 for s in stats)
  with open(out_csv) as f:
    table = list(csv.DictReader(f))
  assert table[0] == {"split": "seen", "family": "all",
                      "success": str(want["eval/seen/success"]),
                      "tasks": "2", "responses_truncated": str(
                          want["eval/seen/responses_truncated"])}
  families = [r["family"] for r in table if r["split"] == "unseen"]
  assert families == ["all", "cool", "heat"]
  assert sum(int(r["tasks"]) for r in table
             if r["split"] == "unseen" and r["family"] != "all") == 2


def test_step_zero_is_the_starting_policy(tiny_run, tmp_path, monkeypatch):
  """No checkpoint of update 0 exists; the reference every one keeps is it."""
  scored = []
  real_score = evaluate.score
  monkeypatch.setattr(evaluate, "score", lambda policy, params, **kw: (
      scored.append(params) or real_score(policy, params, **kw)))
  report = evaluate.main(["--workdir", tiny_run, "--step", "0",
                          "--num_tasks", "2",
                          "--out_json", str(tmp_path / "e.json"),
                          "--out_csv", str(tmp_path / "e.csv")])
  assert report["step"] == 0
  testing.assert_trees_equal(scored[0], testing.tiny_policy(seed=0).params)
  want = {k: v for k, v in _history(tiny_run)[0].items()
          if k.startswith("eval/")}
  assert want and report["metrics"] == want

  # A checkpoint saved without reference params cannot give the start.
  real_restore = checkpoints.Checkpointer.restore
  monkeypatch.setattr(
      checkpoints.Checkpointer, "restore", lambda self, *a, **kw:
      dataclasses.replace(real_restore(self, *a, **kw), reference=None))
  with pytest.raises(SystemExit,
                     match="error: .*update 2 keeps no reference params"):
    evaluate.main(["--workdir", tiny_run, "--step", "0", "--num_tasks", "2"])


def test_every_rl_field_is_either_training_only_or_fingerprinted():
  """A new RLConfig field must be classified here on purpose: put in
  TRAINING_ONLY by mistake, a field that changes what evaluation plays would
  let one run's report be copied for another's (a wrong number)."""
  fields = {f.name for f in dataclasses.fields(trainer_lib.RLConfig)}
  # What the evaluation's rollout reads: episode length, history, the
  # rollout policy's reply budget, prompt buckets, log-prob temperature and
  # what an inadmissible action sends.
  played = {"max_steps", "history_length", "max_new_tokens",
            "prompt_buckets", "temperature", "invalid_action"}
  assert evaluate.TRAINING_ONLY <= fields, (
      f"TRAINING_ONLY names no field {sorted(evaluate.TRAINING_ONLY - fields)}")
  assert not evaluate.TRAINING_ONLY & played
  assert fields - evaluate.TRAINING_ONLY == played, (
      f"classify {sorted(fields - evaluate.TRAINING_ONLY - played)}: "
      "training only (evaluate.TRAINING_ONLY) or read by evaluation")


def test_code_digest_follows_every_source_file(tmp_path):
  pkg = tmp_path / "pkg"
  (pkg / "envs").mkdir(parents=True)
  (pkg / "a.py").write_text("x = 1\n")
  (pkg / "envs" / "game.py").write_text("y = 2\n")
  (pkg / "notes.txt").write_text("not code")
  digests = [evaluate.code_digest.__wrapped__(str(pkg))]
  (pkg / "notes.txt").write_text("still not code")
  digests.append(evaluate.code_digest.__wrapped__(str(pkg)))
  (pkg / "envs" / "game.py").write_text("y = 3\n")
  digests.append(evaluate.code_digest.__wrapped__(str(pkg)))
  (pkg / "envs" / "game.py").rename(pkg / "envs" / "other.py")
  digests.append(evaluate.code_digest.__wrapped__(str(pkg)))
  assert digests[0] == digests[1]
  assert len(set(digests[1:])) == 3
  assert evaluate.code_digest() == evaluate.code_digest.__wrapped__(
      os.path.dirname(evaluate.__file__))


def test_a_start_shared_with_another_run_is_copied_not_scored(
    tiny_run, tmp_path, monkeypatch):
  """Two runs that differ only in training knobs start from the same params:
  given the first's report (--same_as), the second's start is copied, and
  it is what scoring it would give. Another update, or a rollout knob that
  differs, is scored."""
  scored = []
  real_score = evaluate.score
  monkeypatch.setattr(evaluate, "score", lambda policy, params, **kw: (
      scored.append(kw) or real_score(policy, params, **kw)))

  def run(gin_lines):
    workdir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    shutil.copytree(tiny_run, workdir, ignore=shutil.ignore_patterns("eval"))
    with open(workdir / "config.gin", "a") as f:
      f.write("".join(f"{line}\n" for line in gin_lines))
    return str(workdir)

  def main(workdir, step=0, *more):
    return evaluate.main(["--workdir", workdir, "--step", str(step),
                          "--num_tasks", "2", *more])

  seed = run([])
  first = main(seed)
  first_json = evaluate.report_path(seed, 0, num_tasks=2, seed=0,
                                    temperature=0.4) + ".json"
  assert len(scored) == 1 and len(first["fingerprint"]) == 64
  grpo = run(["trainer.RLConfig.variant = 'grpo'",
              "trainer.RLConfig.kl_coef = 0.5"])
  copied = main(grpo, 0, "--same_as", first_json)
  assert len(scored) == 1  # not scored
  assert copied == dict(first, workdir=grpo, copied_from=seed)
  with open(evaluate.report_path(grpo, 0, num_tasks=2, seed=0,
                                 temperature=0.4) + ".json") as f:
    assert json.load(f) == json.loads(json.dumps(copied))
  # What scoring it gives: the same.
  again = main(grpo, 0, "--out_json", str(tmp_path / "again.json"))
  assert len(scored) == 2
  assert again == dict(first, workdir=grpo)
  # Another update; a longer reply budget: scored.
  main(grpo, 2, "--same_as", first_json)
  longer = run(["trainer.RLConfig.max_new_tokens = 9"])
  other = main(longer, 0, "--same_as", first_json)
  assert len(scored) == 4 and "copied_from" not in other
  assert other["fingerprint"] != first["fingerprint"]
  # The same run, scored by other code: scored, never copied.
  monkeypatch.setattr(evaluate, "code_digest", lambda: "other code")
  main(grpo, 0, "--same_as", first_json)
  assert len(scored) == 5
  for bad, message in (("missing.json", "No such file"),
                       ("e.csv", "does not parse")):
    (tmp_path / "e.csv").write_text("split,family\n")
    with pytest.raises(SystemExit, match=message):
      main(grpo, 0, "--same_as", str(tmp_path / bad))


def test_a_policy_folder_and_an_earlier_step(tiny_run, tmp_path):
  """A run whose policy is cached in `policy/` (as policies.prepare does)."""
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  policy = testing.tiny_policy(seed=0)
  hf.save_pretrained(os.path.join(workdir, "policy"), policy.config,
                     policy.params, tokenizer=policy.tokenizer)
  # tiny_policy would give another config: the folder is what is read.
  with open(os.path.join(workdir, "config.gin"), "a") as f:
    f.write("testing.tiny_policy.hidden_size = 32\n")
  report = evaluate.main(["--workdir", workdir, "--step", "1",
                          "--num_tasks", "3", "--max_steps", "1",
                          "--history_length", "2", "--seed", "7",
                          "--invalid_action", "as_written"])
  assert (report["step"], report["num_tasks"], report["max_steps"],
          report["history_length"], report["seed"],
          report["invalid_action"]) == (1, 3, 1, 2, 7, "as_written")
  assert report["metrics"]["eval/seen/tasks"] == 3.0
  base = os.path.join(workdir, "eval", "step_1_tasks3_seed7_temp0.4_steps1_"
                      "history2_as_written")
  with open(base + ".json") as f:
    assert json.load(f)["metrics"] == report["metrics"]
  assert os.path.exists(base + ".csv")
  assert evaluate.report_path(workdir, 1, num_tasks=3, seed=7,
                              temperature=0.4, max_steps=1,
                              history_length=2,
                              invalid_action="as_written") == base
  assert not [n for n in os.listdir(os.path.dirname(base))
              if ".tmp" in n]


def test_transcripts_hold_every_episode_played(tiny_run, tmp_path):
  """--transcripts: one JSON line per task, in the report's task order,
  with each step's observation, reply and action; the report is unchanged."""
  path = tmp_path / "t" / "episodes.jsonl"
  report = evaluate.main(["--workdir", tiny_run, "--num_tasks", "2",
                          "--out_json", str(tmp_path / "e.json"),
                          "--transcripts", str(path)])
  want = {k: v for k, v in _history(tiny_run)[2].items()
          if k.startswith("eval/")}
  assert report["metrics"] == want  # playing is not changed by keeping it
  lines = [json.loads(line) for line in path.read_text().splitlines()]
  assert [(t["split"], t["task"]) for t in lines] == [
      ("seen", 0), ("seen", 1), ("unseen", 0), ("unseen", 1)]
  for split in ("seen", "unseen"):
    mine = [t for t in lines if t["split"] == split]
    assert [t["seed"] for t in mine] == envs_base.split_seeds(
        f"eval_{split}", 2)
    assert "".join(str(int(t["success"])) for t in mine) == (
        report["per_task"][split])
    families = sorted(t["family"] for t in mine)
    assert families == sorted(
        k.rsplit("/", 1)[1] for k, v in want.items()
        if k.startswith(f"eval/{split}/tasks/") for _ in range(int(v)))
  steps = [st for t in lines for st in t["steps"]]
  assert all(1 <= len(t["steps"]) <= report["max_steps"] for t in lines)
  assert all(t["goal"] and t["error"] is None for t in lines)
  for st in steps:
    assert st["observation"] and isinstance(st["reply"], str)
    assert st["attempted"] == prompts.attempted_action(st["reply"])
    assert st["valid"] == (st["action"] == st["attempted"]) or (
        st["valid"] and st["attempted"].startswith("put "))
  # The share of cut replies agrees with the report's.
  cut = [st["cut"] for t in lines if t["split"] == "unseen"
         for st in t["steps"]]
  assert np.mean(cut) == pytest.approx(want["eval/unseen/responses_truncated"])


def test_transcripts_bad_inputs_stop_before_anything_loads(
    tiny_run, tmp_path, monkeypatch, capsys):
  _no_loading(monkeypatch)
  run = ["--workdir", tiny_run, "--num_tasks", "1",
         "--out_json", str(tmp_path / "e.json")]
  with pytest.raises(SystemExit, match="--transcripts .*e.json is also the "
                     "report's JSON or CSV"):
    evaluate.main(run + ["--transcripts", str(tmp_path / "e.json")])
  with pytest.raises(SystemExit, match="--transcripts .*e.csv is also"):
    evaluate.main(run + ["--transcripts", str(tmp_path / "e.csv")])
  (tmp_path / "file").write_text("not a folder")
  with pytest.raises(SystemExit, match="cannot write the transcripts .*"
                     "file is a file, not a folder"):
    evaluate.main(run + ["--transcripts", str(tmp_path / "file" / "t.jsonl")])
  with pytest.raises(SystemExit):
    evaluate.parse_flags(run + ["--transcripts", "t.jsonl",
                                "--same_as", "other.json"])
  assert "--transcripts needs the episodes played" in capsys.readouterr().err
  assert os.listdir(tmp_path) == ["file"]


def test_bad_inputs_are_clear_errors(tiny_run, tmp_path):
  with pytest.raises(SystemExit, match="workdir .*nowhere does not exist"):
    evaluate.main(["--workdir", str(tmp_path / "nowhere")])
  with pytest.raises(SystemExit, match="no checkpoint in"):
    evaluate.main(["--workdir", str(tmp_path)])
  assert os.listdir(tmp_path) == []  # nothing created
  with pytest.raises(SystemExit, match=r"no checkpoint of update 5; the "
                     r"saved updates are \[1, 2\]"):
    evaluate.main(["--workdir", tiny_run, "--step", "5"])
  workdir = str(tmp_path / "no_config")
  shutil.copytree(tiny_run, workdir)
  os.remove(os.path.join(workdir, "config.gin"))
  with pytest.raises(SystemExit, match="config.gin is missing"):
    evaluate.main(["--workdir", workdir])
  workdir = str(tmp_path / "corrupt")
  shutil.copytree(tiny_run, workdir)
  step_dir = os.path.join(workdir, "checkpoints", "2")
  files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs]
  os.truncate(max(files, key=os.path.getsize), 1)
  with pytest.raises(SystemExit, match="error: checkpoint step 2 .* corrupt"):
    evaluate.main(["--workdir", workdir, "--step", "2", "--num_tasks", "1"])
  with pytest.raises(ValueError, match="temperature must be > 0"):
    evaluate.evaluate_split(None, None, env_name="household",
                            split="eval_seen", num_tasks=1, max_steps=3,
                            temperature=-1.0)
  with pytest.raises(ValueError, match="num_tasks >= 1, got 0"):
    evaluate.evaluate_split(None, None, env_name="household",
                            split="eval_seen", num_tasks=0, max_steps=3)


@pytest.mark.parametrize("flag,value,message", [
    ("--num_tasks", "0", "--num_tasks must be at least 1"),
    ("--temperature", "-1", "--temperature must be a finite number >= 0"),
    ("--temperature", "nan", "--temperature must be a finite number >= 0"),
    ("--temperature", "inf", "--temperature must be a finite number >= 0"),
    ("--max_steps", "0", "--max_steps must be at least 1"),
    ("--history_length", "-1", "--history_length must be >= 0"),
    ("--invalid_action", "skip", "invalid choice: 'skip'"),
])
def test_bad_flags_stop_before_anything_loads(flag, value, message, capsys):
  with pytest.raises(SystemExit):
    evaluate.parse_flags(["--workdir", "/nowhere", flag, value])
  assert message in capsys.readouterr().err


def _no_loading(monkeypatch):
  """Makes loading a policy or a checkpoint fail the test."""
  def fail(*args, **kwargs):
    raise AssertionError("loaded before the bad input was found")
  monkeypatch.setattr(evaluate, "load_policy", fail)
  monkeypatch.setattr(evaluate, "restore_params", fail)


def test_a_bad_output_path_stops_before_anything_loads(tiny_run, tmp_path,
                                                       monkeypatch):
  _no_loading(monkeypatch)
  (tmp_path / "file").write_text("not a folder")
  run = ["--workdir", tiny_run, "--num_tasks", "1"]
  bad = str(tmp_path / "file" / "sub" / "e.json")
  with pytest.raises(SystemExit, match=f"error: cannot write the JSON report "
                     f"{re.escape(bad)}: .*file is a file, not a folder"):
    evaluate.main(run + ["--out_json", bad])
  # A bad JSON beside a good CSV: neither is written.
  with pytest.raises(SystemExit, match="cannot write the JSON report"):
    evaluate.main(run + ["--out_json", bad,
                         "--out_csv", str(tmp_path / "e.csv")])
  with pytest.raises(SystemExit, match="cannot write the CSV .*e.csv: .*"
                     "not a folder"):
    evaluate.main(run + ["--out_json", str(tmp_path / "e.json"),
                         "--out_csv", str(tmp_path / "file" / "e.csv")])
  with pytest.raises(SystemExit, match="it is a folder"):
    evaluate.main(run + ["--out_json", str(tmp_path)])
  # A JSON named .csv would be written over the CSV beside it.
  with pytest.raises(SystemExit, match="the JSON and the CSV would both be "
                     ".*e.csv"):
    evaluate.main(run + ["--out_json", str(tmp_path / "e.csv")])
  assert os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("text,message", [
    ("train.train.num_updates = [1, 2\n", r"\(TokenError: .*EOF"),
    ("nowhere.fn.x = 3\n", "No configurable matching 'nowhere.fn'"),
    ("train.train.num_updates = = 3\n", r"\(SyntaxError: "),
    ("train.train.num_updates = 3\n",
     "binds no train.policy_fn, train.rl: it is not the config.gin of a "
     "training run"),
])
def test_a_corrupt_or_foreign_config_gin_is_named(text, message, tiny_run,
                                                  tmp_path, monkeypatch):
  _no_loading(monkeypatch)
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  path = os.path.join(workdir, "config.gin")
  with open(path, "w") as f:
    f.write(text)
  with pytest.raises(SystemExit, match="error: " + re.escape(path) + ".*" + message):
    evaluate.main(["--workdir", workdir, "--num_tasks", "1"])


def test_a_damaged_policy_config_is_named(tiny_run, tmp_path, monkeypatch):
  monkeypatch.setattr(evaluate, "restore_params", lambda *a: pytest.fail(
      "the checkpoint was read before the policy's config"))
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  os.makedirs(os.path.join(workdir, "policy"))
  path = os.path.join(workdir, "policy", "config.json")
  with open(path, "w") as f:
    f.write('{"vocab_size": 12')  # truncated
  with pytest.raises(SystemExit, match=f"error: {re.escape(path)} does not parse as "
                     "JSON"):
    evaluate.main(["--workdir", workdir, "--num_tasks", "1"])
  assert not os.path.exists(os.path.join(workdir, "eval"))


def test_a_mesh_that_does_not_fit_is_one_error_line(tiny_run, tmp_path,
                                                    monkeypatch):
  """A run trained on another machine's mesh: an error line (which
  `experiments evaluate` turns into that run being left out), not a crash."""
  _no_loading(monkeypatch)
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  with open(os.path.join(workdir, "config.gin"), "a") as f:
    f.write("train.train.mesh_shape = (3, 1, 1)\n")  # 8 devices here
  with pytest.raises(SystemExit) as e:
    evaluate.main(["--workdir", workdir, "--num_tasks", "1"])
  assert isinstance(e.value.code, str)
  assert re.match(r"error: the run's train.train.mesh_shape \(3, 1, 1\) "
                  r"cannot be laid out on this machine: .*needs 3 devices",
                  e.value.code)
  assert not os.path.exists(os.path.join(workdir, "eval"))


def test_report_names_tell_temperatures_apart():
  name = lambda t: os.path.basename(evaluate.report_path(
      "/w", 1, num_tasks=2, seed=0, temperature=t))
  # Ordinary values keep their short names (existing reports stay valid).
  assert [name(t) for t in (0.4, 1.0, 0.0, 1e-5)] == [
      f"step_1_tasks2_seed0_temp{t}" for t in ("0.4", "1", "0", "1e-05")]
  # A temperature that :g would round gets a name of its own.
  assert name(0.4000001) == "step_1_tasks2_seed0_temp0.4000001"
  temps = [0.4, 0.4000001, 0.40000000000000002, 0.4 + 2 ** -54, 1.0, 1 + 1e-9,
           0.123456789, 0.1234567891]
  assert len({name(t) for t in temps}) == len(set(temps))


def test_the_csv_goes_beside_the_chosen_json(tiny_run, tmp_path):
  out = tmp_path / "mine" / "e1.json"
  evaluate.main(["--workdir", tiny_run, "--num_tasks", "1",
                 "--out_json", str(out)])
  assert sorted(os.listdir(out.parent)) == ["e1.csv", "e1.json"]


def test_rows_and_table():
  metrics = {"eval/seen/success": 0.5, "eval/seen/tasks": 4.0,
             "eval/seen/success/pick": 1.0, "eval/seen/tasks/pick": 2.0,
             "eval/seen/success/clean": 0.0, "eval/seen/tasks/clean": 2.0,
             "eval/unseen/success": 0.25, "eval/unseen/tasks": 4.0,
             "eval/unseen/success/heat": 0.25, "eval/unseen/tasks/heat": 4.0}
  metrics.update({"eval/seen/responses_truncated": 0.5,
                  "eval/seen/responses_truncated/pick": 1.0})
  table = evaluate.rows(metrics)
  cut = lambda v: dict(responses_truncated=v)
  assert table == [
      dict(split="seen", family="all", success=0.5, tasks=4, **cut(0.5)),
      dict(split="seen", family="clean", success=0.0, tasks=2, **cut(None)),
      dict(split="seen", family="pick", success=1.0, tasks=2, **cut(1.0)),
      dict(split="unseen", family="all", success=0.25, tasks=4, **cut(None)),
      dict(split="unseen", family="heat", success=0.25, tasks=4,
           **cut(None))]
  assert evaluate.csv_text(table).splitlines()[:3] == [
      "split,family,success,tasks,responses_truncated", "seen,all,0.5,4,0.5",
      "seen,clean,0.0,2,"]
  line = lambda *cells: f"{cells[0]:20s}{cells[1]:>16s}{cells[2]:>16s}"
  assert evaluate.format_table(table).splitlines() == [
      line("family", "seen", "unseen"),
      line("all", "0.500 (4)", "0.250 (4)"),
      line("clean", "0.000 (2)", "-"),
      line("heat", "-", "0.250 (4)"),
      line("pick", "1.000 (2)", "-")]


def test_environment_errors_are_counted(monkeypatch):
  from seed_jax import rollout  # pylint: disable=g-import-not-at-top
  from seed_jax.envs import household  # pylint: disable=g-import-not-at-top
  tiny = testing.tiny_policy(seed=0)
  policy = rollout.Policy(tiny.config, tiny.tokenizer, max_new_tokens=4,
                          buckets=(1024, 1536), min_rows=2)

  def broken(self, action):
    raise RuntimeError("simulator crashed")

  monkeypatch.setattr(household.HouseholdEnv, "step", broken)
  out = evaluate.evaluate_split(policy, tiny.params, env_name="household",
                                split="eval_seen", num_tasks=2, max_steps=2,
                                rng=jax.random.key(0))
  assert out["env_errors"] == 2.0 and out["success"] == 0.0


def test_per_task_outcomes_follow_the_task_order(monkeypatch):
  """Across batches, each task's outcome lands at its task's index."""
  import types  # pylint: disable=g-import-not-at-top
  first = envs_base.split_seeds("eval_unseen", 1)[0]
  played = []

  def fake_rollout(gen, pool, rng, *, group_seeds, **kw):
    del gen, pool, rng, kw
    played.append(list(group_seeds))
    return types.SimpleNamespace(episodes=[types.SimpleNamespace(
        family="heat" if s % 2 else "cool", success=(s - first) % 3 == 0,
        error=None, steps=[], ground_truth={}) for s in group_seeds])

  monkeypatch.setattr(evaluate.rollout_lib, "rollout", fake_rollout)
  per_task, eps = [], []
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_unseen", num_tasks=7,
                                max_steps=1, batch_groups=3,
                                per_task=per_task, per_task_episodes=eps)
  assert [len(b) for b in played] == [3, 3, 1]
  assert per_task == [1, 0, 0, 1, 0, 0, 1]
  assert [e.success for e in eps] == [bool(o) for o in per_task]
  assert out["success"] == pytest.approx(3 / 7)
  assert out["tasks/heat"] + out["tasks/cool"] == 7

  # A later batch that raises (a NaN reply) leaves per_task as it was.
  def second_batch_fails(gen, pool, rng, *, group_seeds, **kw):
    if played:
      raise ValueError("evaluate eval_unseen: 1 of 3 sampled replies have "
                       "NaN or infinite log-probs")
    return fake_rollout(gen, pool, rng, group_seeds=group_seeds, **kw)

  played.clear()
  monkeypatch.setattr(evaluate.rollout_lib, "rollout", second_batch_fails)
  per_task, eps = [1], []
  with pytest.raises(ValueError, match="NaN"):
    evaluate.evaluate_split(None, None, env_name="household",
                            split="eval_unseen", num_tasks=7, max_steps=1,
                            batch_groups=3, per_task=per_task,
                            per_task_episodes=eps)
  assert played and per_task == [1] and eps == []


def test_replies_cut_at_max_new_tokens_are_reported(monkeypatch):
  """Per split and family, the share of replies (steps) cut at the budget."""
  import types  # pylint: disable=g-import-not-at-top
  cuts = {0: [True, True], 1: [False, True, False], 2: [], 3: [False]}

  def fake_rollout(gen, pool, rng, *, group_seeds, **kw):
    del gen, pool, rng, kw
    return types.SimpleNamespace(episodes=[types.SimpleNamespace(
        family="heat" if i % 2 else "cool", success=False, error=None,
        steps=[types.SimpleNamespace(truncated=c) for c in cuts[i]],
        ground_truth={}) for i in group_seeds])

  monkeypatch.setattr(evaluate.rollout_lib, "rollout", fake_rollout)
  monkeypatch.setattr(evaluate.envs_base, "split_seeds",
                      lambda split, n, start: list(range(start, start + n)))
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_seen", num_tasks=4, max_steps=3,
                                batch_groups=3)
  assert out["responses_truncated"] == 3 / 6
  assert out["responses_truncated/cool"] == 2 / 2  # tasks 0 and 2
  assert out["responses_truncated/heat"] == 1 / 4  # tasks 1 and 3
  metrics = {f"eval/{split}/{k}": v for k, v in out.items()
             for split in ("seen", "unseen")}
  [row] = [r for r in evaluate.rows(metrics)
           if (r["split"], r["family"]) == ("unseen", "heat")]
  assert row["responses_truncated"] == 0.25


def test_a_family_without_replies_has_no_truncation_share(monkeypatch):
  """Where every episode's reset failed there were no replies: no share of
  them is reported (not 0), and the CSV row leaves it empty."""
  import types  # pylint: disable=g-import-not-at-top

  def fake_rollout(gen, pool, rng, *, group_seeds, **kw):
    del gen, pool, rng, kw
    return types.SimpleNamespace(episodes=[types.SimpleNamespace(
        family="heat" if i % 2 else "cool", success=False,
        error=None if i % 2 else "reset failed",
        steps=[types.SimpleNamespace(truncated=True)] if i % 2 else [],
        ground_truth={}) for i in group_seeds])

  monkeypatch.setattr(evaluate.rollout_lib, "rollout", fake_rollout)
  monkeypatch.setattr(evaluate.envs_base, "split_seeds",
                      lambda split, n, start: list(range(start, start + n)))
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_seen", num_tasks=4, max_steps=3)
  assert out["responses_truncated/heat"] == 1.0
  assert "responses_truncated/cool" not in out and out["tasks/cool"] == 2
  assert out["responses_truncated"] == 1.0
  metrics = {f"eval/{split}/{k}": v for k, v in out.items()
             for split in ("seen", "unseen")}
  [row] = [r for r in evaluate.rows(metrics)
           if (r["split"], r["family"]) == ("seen", "cool")]
  assert row["responses_truncated"] is None
  assert "seen,cool,0.0,2,\n" in evaluate.csv_text([row])

  # No replies at all: no overall share either.
  monkeypatch.setattr(evaluate.envs_base, "split_seeds",
                      lambda split, n, start: [0, 2][start:start + n])
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_seen", num_tasks=2, max_steps=3)
  assert out["env_errors"] == 2.0 and out["success"] == 0.0
  assert not [k for k in out if k.startswith("responses_truncated")]


def test_the_environments_episode_stats_are_summed_over_episodes(
    monkeypatch):
  """household registers `search_stats`: each ratio is its numerators over
  its denominators, summed over the split's episodes (not a mean of the
  episodes' ratios), and left out when no episode searched."""
  import types  # pylint: disable=g-import-not-at-top
  truth = {"object_type": "bread", "target_type": "fridge",
           "start_locations": {"bread 1": "countertop 1"},
           "layout": "kitchen:cabinet=2,countertop=1,fridge=1"}
  step = lambda action: types.SimpleNamespace(action=action, truncated=False,
                                              action_valid=True)
  plays = {0: ["go to cabinet 1", "go to fridge 1", "go to countertop 1"],
           1: ["go to cabinet 2"],
           2: ["take bread 1 from cabinet 1", "go to fridge 1"]}

  def fake_rollout(gen, pool, rng, *, group_seeds, **kw):
    del gen, pool, rng, kw
    return types.SimpleNamespace(episodes=[types.SimpleNamespace(
        family="pick", success=False, error=None, ground_truth=truth,
        steps=[step(a) for a in plays[i]]) for i in group_seeds])

  monkeypatch.setattr(evaluate.rollout_lib, "rollout", fake_rollout)
  monkeypatch.setattr(evaluate.envs_base, "split_seeds",
                      lambda split, n, start: list(range(start, start + n)))
  per_task_stats = []
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_seen", num_tasks=3, max_steps=3,
                                batch_groups=2, per_task_stats=per_task_stats)
  # Each task's counts, in task order (two batches).
  assert [s["search_usual"] for s in per_task_stats] == [(1, 2), (1, 1),
                                                         (0, 0)]
  # 2 of the 3 searches in vain went to a cabinet (the fridge is the
  # target; the countertop held the bread), as 2 of the 3 receptacles
  # without it are. The mean of the episodes' ratios would be (1/2 + 1) / 2.
  assert out["search_usual"] == pytest.approx(2 / 3)
  assert out["search_usual_chance"] == pytest.approx(2 / 3)
  assert out["search_usual_over_chance"] == pytest.approx(0.0)
  # Over the 3 episodes, (hits, misses) are (1, 2), (1, 1) and (0, 0): the
  # residuals from R = 2/3 are -1/3, +1/3 and 0.
  assert out["search_usual_se"] == pytest.approx((3 / 2 * 2 / 9) ** 0.5 / 3)
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_seen", num_tasks=1, max_steps=3)
  assert out["search_usual"] == 1 / 2
  monkeypatch.setattr(evaluate.envs_base, "split_seeds",
                      lambda split, n, start: [2])
  out = evaluate.evaluate_split(None, None, env_name="household",
                                split="eval_seen", num_tasks=1, max_steps=3)
  assert "search_usual" not in out and "search_usual_chance" not in out
  assert "search_usual_se" not in out


def test_a_policy_with_nan_logits_is_refused():
  """A diverged policy raises instead of scoring garbage replies."""
  from seed_jax import rollout  # pylint: disable=g-import-not-at-top
  tiny = testing.tiny_policy(seed=0)
  policy = rollout.Policy(tiny.config, tiny.tokenizer, max_new_tokens=2,
                          buckets=(1024,))
  params = dict(tiny.params, lm_head=jax.tree.map(
      lambda x: x.at[0, 0].set(np.nan), tiny.params["lm_head"]))
  for temperature in (0.0, 0.4):
    with pytest.raises(ValueError, match="evaluate eval_unseen: 1 of 1 "
                       "sampled replies have NaN or infinite log-probs") as e:
      evaluate.evaluate_split(policy, params, env_name="household",
                              split="eval_unseen", num_tasks=1, max_steps=1,
                              temperature=temperature, rng=jax.random.key(0))
    # A ValueError: `main` shows it as one "error: ..." line.
    assert isinstance(e.value, evaluate.sampler_lib.NonFiniteLogitsError)


def test_the_policy_seed_is_the_runs_policy_seed_else_its_seed(tiny_run,
                                                             tmp_path):
  """Evaluation and gaps rebuild a policy with the seed its run gave
  policy_fn: `train.train.policy_seed` where bound, else `seed`."""
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  run = evaluate.run_settings(workdir)
  assert run["policy_seed"] is None
  assert evaluate.policy_seed(run) == run["seed"]
  other = run["seed"] + 5
  with open(os.path.join(workdir, "config.gin"), "a") as f:
    f.write(f"train.train.policy_seed = {other}\n")
  assert evaluate.policy_seed(evaluate.run_settings(workdir)) == other


def test_a_run_with_an_external_analyzer_evaluates(tiny_run, tmp_path):
  """Evaluation never analyzes: a run whose analyses a teacher wrote needs
  no teacher to be scored, and scores as the run did."""
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  with open(os.path.join(workdir, "config.gin"), "a") as f:
    f.write("trainer.RLConfig.analyzer = 'external'\n")
  assert evaluate.run_settings(workdir)["rl"].analyzer == "external"
  report = evaluate.main(["--workdir", workdir, "--num_tasks", "2"])
  assert report["step"] == 2
  assert report["metrics"] == {k: v for k, v in _history(tiny_run)[2].items()
                               if k.startswith("eval/")}


def test_a_step_deleted_while_it_is_read_is_one_error_line(tiny_run,
                                                           tmp_path,
                                                           monkeypatch):
  """`--step` of a run still training, whose max_to_keep deletes that step
  while it is read: an error line (which `experiments evaluate` turns into
  that run being left out), not orbax's traceback."""
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run, workdir)
  real = manifests.check_manifest

  def then_deleted(step_dir):
    problem = real(step_dir)
    shutil.rmtree(os.path.join(step_dir, "state"))
    return problem

  monkeypatch.setattr(manifests, "check_manifest", then_deleted)
  with pytest.raises(SystemExit) as e:
    evaluate.main(["--workdir", workdir, "--step", "1", "--num_tasks", "1"])
  assert isinstance(e.value.code, str)
  assert re.match(r"error: checkpoint step 1 in .*checkpoints was deleted "
                  r"while it was being read \(by the run's max_to_keep, if "
                  r"it is still training\); the steps there now are \[2\]",
                  e.value.code)
  assert "\n" not in e.value.code
  assert not os.path.exists(os.path.join(workdir, "eval"))


class _Killed(BaseException):
  """The process dying: nothing `main` catches."""


def test_a_failed_or_killed_write_leaves_no_json_the_csv_contradicts(
    tiny_run, tmp_path, monkeypatch):
  """An old report pair, then a new evaluation to the same names that fails
  (a full disk) or is interrupted at each file operation of its writes in
  turn: the old pair stays until the new JSON is in place, the new pair
  after (a file set aside that cannot be removed is left, and logged)."""
  def fake_run(workdir, *, step, num_tasks, **kw):
    del kw
    metrics = {f"eval/{s}/{k}": v for s in ("seen", "unseen")
               for k, v in (("success", 0.0), ("tasks", float(num_tasks)))}
    return dict(workdir=str(workdir), step=step, num_tasks=num_tasks,
                metrics=metrics, per_task={})

  monkeypatch.setattr(evaluate, "evaluate_run", fake_run)
  out = tmp_path / "out"
  gpath = type(epath.Path(out))
  ops, crash = [], {"at": None, "error": None}

  def spied(name):
    real = getattr(gpath, name)
    def op(self, *args, **kwargs):
      if os.fspath(self).startswith(os.fspath(out)):
        ops.append(name)
        if len(ops) == crash["at"]:
          raise crash["error"]
      return real(self, *args, **kwargs)
    return op

  for name in ("write_text", "replace", "unlink"):
    monkeypatch.setattr(gpath, name, spied(name))
  run = ["--workdir", tiny_run, "--out_json", str(out / "e.json")]
  def pair():
    return {n: (out / n).read_text() for n in os.listdir(out)}

  evaluate.main(run + ["--num_tasks", "1"])
  old = pair()
  ops.clear()
  evaluate.main(run + ["--num_tasks", "2"])
  new, steps = pair(), list(ops)
  assert sorted(old) == sorted(new) == ["e.csv", "e.json"] and old != new
  done = max(i for i, op in enumerate(steps, 1) if op == "replace")
  assert steps[done:] == ["unlink", "unlink"]  # the old pair, set aside
  for error in (OSError(28, "No space left on device"), _Killed()):
    for at in range(1, len(steps) + 1):
      shutil.rmtree(out)
      out.mkdir()
      for name, text in old.items():
        (out / name).write_text(text)
      ops.clear()
      crash.update(at=at, error=error)
      if isinstance(error, OSError) and at > done:  # the new pair is in
        evaluate.main(run + ["--num_tasks", "2"])
      else:
        with pytest.raises(SystemExit if isinstance(error, OSError)
                           else _Killed):
          evaluate.main(run + ["--num_tasks", "2"])
      crash["at"] = None
      left = pair()
      where = f"{type(error).__name__} at {steps[:at]}"
      assert {n: left.pop(n, None) for n in old} == (
          new if at > done else old), where
      leftover = sorted(re.sub(r"\d+$", "", n) for n in left)
      assert leftover in ([[]] if at <= done else  # no temporary file stays
                          [["e.csv.old"], ["e.json.old"],
                           ["e.csv.old", "e.json.old"]]), where


def test_a_rename_that_fails_keeps_the_previous_report(tmp_path,
                                                       monkeypatch):
  """Each rename of `write_report` failing in turn: the previous pair, whole,
  until the new JSON is in (the old JSON was removed first, and a failed
  rename after that left a CSV and no JSON: the evaluation lost)."""
  def report(num_tasks):
    return dict(num_tasks=num_tasks, per_task={}, metrics={
        f"eval/{s}/{k}": v for s in ("seen", "unseen")
        for k, v in (("success", 0.5), ("tasks", float(num_tasks)))})

  paths = dict(out_json=tmp_path / "e.json", out_csv=tmp_path / "e.csv")
  def files():
    return {n: (tmp_path / n).read_text() for n in os.listdir(tmp_path)}

  evaluate.write_report(report(1), **paths)
  old = files()
  gpath = type(epath.Path(tmp_path))
  real, calls = gpath.replace, {"n": 0, "fail": None}
  def replace(self, target):
    calls["n"] += 1
    if calls["n"] == calls["fail"]:
      raise OSError(5, "Input/output error")
    return real(self, target)
  monkeypatch.setattr(gpath, "replace", replace)
  evaluate.write_report(report(2), **paths)
  new, renames = files(), calls["n"]
  assert sorted(old) == sorted(new) == ["e.csv", "e.json"] and old != new
  for fail in range(1, renames + 1):
    for name, text in old.items():
      (tmp_path / name).write_text(text)
    calls.update(n=0, fail=fail)
    with pytest.raises(OSError, match="Input/output error"):
      evaluate.write_report(report(2), **paths)
    assert files() == old, f"rename {fail} of {renames} failed"
