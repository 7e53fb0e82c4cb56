"""Tests for seed_jax.gaps: token kinds, the gap table and the CLI."""

import json
import os
import re
import shutil
import types

import numpy as np
import orbax.checkpoint as ocp
import pytest

from seed_jax import annotators
from seed_jax import gaps
from seed_jax import testing
from seed_jax import trainer as trainer_lib


def test_token_kinds_of_a_demo_reply():
  pieces = ["<think>", "Find", " a", " mug", ".", " Try", " cabinet", " 3",
            ".", "</think>", "<action>", "go", " to", " cabinet", " 3",
            "</action>"]
  assert gaps.token_kinds(pieces) == (
      ["other"] * 6 + ["reasoning place"] * 2 + ["other"] * 3
      + ["other action"] * 2 + ["action place"] * 2 + ["other"])


def test_token_kinds_outside_search_steps():
  pieces = ["<think>", "Take", " it", ".", "</think>", "<action>", "take",
            " mug", " 1", "</action>", "<action>", "go", " to", " x"]
  # Only the first action counts for the env, but every action's tokens are
  # action tokens; a "go to" place is a place wherever it is.
  assert gaps.token_kinds(pieces) == (
      ["other"] * 6 + ["other action"] * 3 + ["other"] * 2
      + ["other action"] * 2 + ["action place"])


def test_token_kinds_of_tags_split_into_pieces():
  # SmolLM2's tokenizer splits the tags: "<", "think", ">" ... "</", "action",
  # ">". Their pieces are tag text, never a place or an action word.
  pieces = ["<", "think", ">", "Try", " cabinet", " 3", "</", "think", "><",
            "action", ">", "go", " to", " cabinet", " 3", "</", "action", ">"]
  assert gaps.token_kinds(pieces) == (
      ["other"] * 4 + ["reasoning place"] * 2 + ["other"] * 5
      + ["other action"] * 2 + ["action place"] * 2 + ["other"] * 3)


def test_step_phases_split_at_the_first_valid_take():
  step = lambda action, valid=True: types.SimpleNamespace(
      action=action, action_valid=valid)
  steps = [step("go to cabinet 1"), step("take mug 1 from cabinet 1", False),
           step("take mug 1 from cabinet 2"), step("go to sinkbasin 1"),
           step("take apple 1 from sinkbasin 1")]
  assert gaps.step_phases(steps) == ["before take"] * 2 + ["from take"] * 3
  # Nothing taken (or an invalid take only): every step is before it.
  assert gaps.step_phases(steps[:2]) == ["before take"] * 2
  assert gaps.step_phases([]) == []


def test_step_validity_tells_a_repeated_invalid_try():
  step = lambda action, valid, response="": types.SimpleNamespace(
      action=action, action_valid=valid, response=response)
  tried = lambda a: f"<think>x</think><action>{a}</action>"
  steps = [step("go to cabinet 1", True),
           step("look", False, tried("go to cabinet 1")),   # stands there
           step("look", False, tried("go to cabinet 1")),
           step("look", False, "no tags"),                  # tried nothing
           step("look", False, "no tags"),
           step("look", False, tried("open cabinet 9")),
           step("open cabinet 1", True),
           step("open cabinet 1", True)]                    # valid again
  assert gaps.step_validity(steps) == [
      "valid", "invalid repeat", "invalid repeat", "invalid", "invalid",
      "invalid", "valid", "valid"]
  assert gaps.step_validity([]) == []


def test_gap_table_counts_cells_and_gates():
  rows = [(["other", "action place"], np.asarray([-1.0, 1.0]), True),
          (["action place"], np.asarray([0.0]), False)]
  table = gaps.gap_table(rows, beta=5.0)
  assert set(table) == {"other/success", "action place/success",
                        "action place/failure"}
  cell = table["action place/success"]
  assert cell["tokens"] == 1 and cell["mean_gap"] == 1.0
  assert cell["above_0.5"] == 1.0 and cell["below_-0.5"] == 0.0
  assert cell["mean_gate"] == pytest.approx(1 / (1 + np.exp(-5.0)))
  assert table["action place/failure"]["mean_gate"] == pytest.approx(0.5)


def test_breakdown_needs_an_analyzing_trainer_without_reference():
  rl = trainer_lib.RLConfig(variant="grpo", kl_coef=0.0)
  fake = types.SimpleNamespace(rl=rl)
  with pytest.raises(ValueError, match="analyzes and has kl_coef=0"):
    gaps.breakdown(fake, None, None, batches=1)
  fake.rl = trainer_lib.RLConfig(variant="seed")  # kl_coef 0.01
  with pytest.raises(ValueError, match="kl_coef=0.01"):
    gaps.breakdown(fake, None, None, batches=1)


def test_gaps_cli_names_a_missing_run(tmp_path):
  with pytest.raises(SystemExit, match="config.gin"):
    gaps.main(["--workdir", str(tmp_path)])


def _no_loading(monkeypatch):
  """Makes loading a policy or a checkpoint fail the test."""
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  def fail(*args, **kwargs):
    raise AssertionError("loaded before the bad input was found")
  monkeypatch.setattr(evaluate, "load_policy", fail)
  monkeypatch.setattr(evaluate, "restore_params", fail)


def test_gaps_cli_checks_the_report_path_before_anything_loads(
    tiny_run, tmp_path, monkeypatch):
  _no_loading(monkeypatch)
  (tmp_path / "file").write_text("not a folder")
  bad = str(tmp_path / "file" / "g.json")
  with pytest.raises(SystemExit, match=f"error: cannot write the report "
                     f"{re.escape(bad)}: .*file is a file, not a folder"):
    gaps.main(["--workdir", tiny_run, "--step", "2", "--out_json", bad])
  assert os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("text,message", [
    ("train.train.num_updates = [1, 2\n", r"\(TokenError: "),
    ("nowhere.fn.x = 3\n",
     r"\(ValueError: No configurable matching 'nowhere.fn'"),
])
def test_gaps_cli_names_a_corrupt_config_gin(text, message, tmp_path,
                                             monkeypatch):
  _no_loading(monkeypatch)
  path = tmp_path / "config.gin"
  path.write_text(text)
  with pytest.raises(SystemExit, match=f"error: {re.escape(str(path))} does "
                     f"not parse as the run's gin config {message}"):
    gaps.main(["--workdir", str(tmp_path)])


def test_gaps_cli_names_a_damaged_policy_or_checkpoint(tiny_run, tmp_path):
  run_dir = str(tmp_path / "run")
  shutil.copytree(tiny_run, run_dir)
  step_dir = os.path.join(run_dir, "checkpoints", "2")
  files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs]
  os.truncate(max(files, key=os.path.getsize), 1)
  with pytest.raises(SystemExit, match="error: checkpoint step 2 .* corrupt"):
    gaps.main(["--workdir", run_dir, "--step", "2", "--batches", "1"])
  path = os.path.join(run_dir, "policy", "config.json")
  os.makedirs(os.path.dirname(path))
  with open(path, "w") as f:
    f.write('{"vocab_size": 12')  # truncated
  with pytest.raises(SystemExit, match=f"error: {re.escape(path)} does not "
                     "parse as JSON"):
    gaps.main(["--workdir", run_dir, "--batches", "1"])
  assert not [n for n in os.listdir(run_dir) if n.startswith("gaps")]


def test_gaps_cli_names_a_tensor_missing_from_the_policy_folder(tiny_run,
                                                               tmp_path):
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
  from seed_jax import hf  # pylint: disable=g-import-not-at-top
  run_dir = str(tmp_path / "run")
  shutil.copytree(tiny_run, run_dir)
  folder = os.path.join(run_dir, "policy")  # update 0 is read from here
  policy = testing.tiny_policy()
  hf.save_pretrained(folder, policy.config, policy.params,
                     tokenizer=policy.tokenizer)
  path = os.path.join(folder, "model.safetensors")
  tensors = dict(hf.read_safetensors(path))
  name = next(k for k in sorted(tensors) if ".layers.0." in k)
  del tensors[name]
  st.save_file({k: np.array(v) for k, v in tensors.items()}, path)
  with pytest.raises(SystemExit, match=f"^error: tensor '{re.escape(name)}' "
                     "missing from the safetensors"):
    gaps.main(["--workdir", run_dir, "--step", "0", "--batches", "1"])
  assert not [n for n in os.listdir(run_dir) if n.startswith("gaps")]


def test_gaps_cli_measures_the_policy_of_a_step(tiny_run, tmp_path,
                                                monkeypatch):
  run_dir = str(tmp_path / "run")  # gaps writes its report into the run
  shutil.copytree(tiny_run, run_dir)
  measured = []
  real = gaps.breakdown
  monkeypatch.setattr(gaps, "breakdown", lambda rl_trainer, params, rng, **kw:
                      measured.append(params) or real(rl_trainer, params,
                                                      rng, **kw))
  report = gaps.main(["--workdir", run_dir, "--step", "2", "--batches", "1"])
  saved = ocp.StandardCheckpointer().restore(
      os.path.join(run_dir, "checkpoints", "2", "state"))["params"]
  testing.assert_trees_equal(measured[0], saved)
  assert report["step"] == 2 and report["batches"] == 1
  with open(os.path.join(run_dir, "gaps_step_2.json")) as f:
    assert json.load(f)["analyzed_samples"] == report["analyzed_samples"]
  # Update 0 without a policy folder: the reference the checkpoints keep.
  gaps.main(["--workdir", run_dir, "--batches", "1"])
  testing.assert_trees_equal(measured[1], testing.tiny_policy(seed=0).params)
  assert os.path.exists(os.path.join(run_dir, "gaps.json"))
  with pytest.raises(SystemExit, match="no checkpoint of update 5"):
    gaps.main(["--workdir", run_dir, "--step", "5"])
  # A report path in folders that do not exist yet.
  out = tmp_path / "new" / "dir" / "g.json"
  gaps.main(["--workdir", run_dir, "--batches", "1", "--out_json", str(out)])
  assert json.loads(out.read_text())["batches"] == 1


def test_gaps_cli_with_the_rules_as_analyst(tiny_run, tmp_path, monkeypatch):
  run_dir = str(tmp_path / "run")
  shutil.copytree(tiny_run, run_dir)
  written, details = [], set()
  real = annotators.annotate

  def annotate(ep, detail="place", *, repeats=False):
    written.append(ep)
    details.add((detail, repeats))
    return real(ep, detail, repeats=repeats)

  monkeypatch.setattr(annotators, "annotate", annotate)
  with open(os.path.join(run_dir, "config.gin"), "a") as f:
    f.write("trainer.RLConfig.rule_detail = 'kind'\n"
            "trainer.RLConfig.rule_repeats = True\n")
  report = gaps.main(["--workdir", run_dir, "--batches", "1",
                      "--analyzer", "rules"])
  # Every episode gets the annotator's skill, so every sample is scored
  # under it (a random tiny policy's own analyses rarely parse).
  assert report["analyzer"] == "rules" and written
  # The run's trainer.RLConfig.rule_detail and rule_repeats.
  assert details == {("kind", True)}
  # tiny.gin plays 2 groups of 2 episodes per batch; the report counts them.
  assert (report["episodes"], report["groups"]) == (len(written), 2) == (4, 2)
  assert report["won_episodes"] == sum(bool(ep.success) for ep in written)
  assert report["analyses_parsed"] == 1.0
  assert report["analyzed_samples"] > 0
  # The phases and the steps' validity split the same tokens as the token
  # kinds, by outcome.
  for outcome in ("success", "failure"):
    tokens = [sum(c["tokens"] for k, c in report[table].items()
                  if k.endswith(outcome))
              for table in ("cells", "phases", "validity")]
    assert tokens[0] == tokens[1] == tokens[2]
  assert {k.split("/")[0] for k in report["phases"]} <= set(gaps.PHASES)
  assert {k.split("/")[0] for k in report["validity"]} <= set(gaps.VALIDITY)
  assert report["phases"] and report["validity"]
  with open(os.path.join(run_dir, "gaps_rules.json")) as f:
    assert json.load(f)["analyzer"] == "rules"
  assert not os.path.exists(os.path.join(run_dir, "gaps.json"))
