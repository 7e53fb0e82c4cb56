"""Averager, TensorBoard writer, progress line, history and plot."""

import glob
import json

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from seed_jax import metrics
from seed_jax import testing


def test_averager_means_over_updates_on_device():
  step = jax.jit(lambda x: {"loss": x, "kl": 2 * x})
  avg = metrics.Averager()
  for x in (1.0, 2.0, 6.0):
    avg.update(step(jnp.float32(x)))
  avg.update({"loss": np.float32(3.0)})  # a name may be missing from one
  out = avg.compute()
  assert out == pytest.approx({"loss": 3.0, "kl": 6.0})
  assert avg.compute() == {}  # reset at compute


def test_averager_weighs_token_means_by_their_tokens():
  avg = metrics.Averager()
  avg.update({"gate": 0.9, "weight/gate": 30.0, "loss": 1.0})
  avg.update({"gate": 0.0, "weight/gate": 0.0, "loss": 3.0})  # no tokens
  avg.update({"gate": 0.6, "weight/gate": 10.0, "loss": 2.0})
  out = avg.compute()
  assert out == pytest.approx({"gate": (0.9 * 30 + 0.6 * 10) / 40,
                               "loss": 2.0})
  avg.update({"gate": 0.0, "weight/gate": 0.0})
  assert avg.compute() == {"gate": 0.0}  # never a token: 0, not NaN



def test_averager_leaves_skipped_steps_out_of_the_other_metrics():
  avg = metrics.Averager()
  for bad in (False, False, True, False):  # train_step's NaN on a skip
    x = np.nan if bad else 0.5
    avg.update({"loss": x, "weight/loss": 100.0, "grad_norm": 2 * x,
                "skipped": float(bad)})
  assert avg.compute() == pytest.approx(
      {"loss": 0.5, "grad_norm": 1.0, "skipped": 0.25})
  for _ in range(2):  # every step skipped: nothing to average
    avg.update({"loss": np.nan, "weight/loss": 100.0, "grad_norm": np.inf,
                "skipped": 1.0})
  out = avg.compute()
  assert out["skipped"] == 1.0
  assert np.isnan(out["loss"]) and np.isnan(out["grad_norm"])


def test_averager_keeps_fractional_weights():
  avg = metrics.Averager()
  avg.update({"x": 1.0, "weight/x": 1.5})
  avg.update({"x": 3.0, "weight/x": 0.5})
  avg.update({"y": 2.0, "weight/y": 0.25})
  assert avg.compute() == pytest.approx({"x": 1.5, "y": 2.0})

def _read_scalars(workdir):
  return {(tag, step): value
          for tag, step, value in testing.read_scalar_events(workdir)}


def test_writer_writes_tensorboard_events(tmp_path):
  writer = metrics.make_writer(tmp_path, process_index=0)
  writer.write_scalars(1, {"success_rate": 0.25, "kl": 0.5})
  writer.write_scalars(2, {"success_rate": 0.75})
  writer.close()
  found = _read_scalars(str(tmp_path))
  assert found[("success_rate", 1)] == pytest.approx(0.25)
  assert found[("kl", 1)] == pytest.approx(0.5)
  assert found[("success_rate", 2)] == pytest.approx(0.75)


def test_writer_of_other_processes_only_logs(tmp_path):
  writer = metrics.make_writer(tmp_path, process_index=1)
  writer.write_scalars(1, {"kl": 0.5})
  writer.close()
  assert not glob.glob(str(tmp_path / "events.out.tfevents.*"))


def test_a_restart_sets_earlier_events_aside_and_replays_its_history(
    tmp_path):
  assert metrics.set_aside_events(tmp_path / "new") is None  # no workdir yet
  assert metrics.set_aside_events(tmp_path) is None  # nothing to move
  # A killed start wrote updates 0 to 2; its checkpoint holds only 0 and 1.
  writer = metrics.make_writer(tmp_path, process_index=0)
  for step in range(3):
    writer.write_scalars(step, {"success_rate": 0.1 * step})
  writer.close()
  history = metrics.MetricHistory()
  history.append(0, {"success_rate": 0.0, "note": "text is not a scalar"})
  history.append(1, {"success_rate": 0.1, "kl": float("nan")})  # kl: None
  moved = metrics.set_aside_events(tmp_path)
  assert moved == tmp_path / metrics.EARLIER_EVENTS / "1"
  assert not glob.glob(str(tmp_path / "events.out.tfevents.*"))
  metrics.write_events(tmp_path, history)
  writer = metrics.make_writer(tmp_path, process_index=0)
  writer.write_scalars(2, {"success_rate": 0.5})  # the resumed update 2
  writer.close()
  points = testing.read_scalar_events(tmp_path)
  assert sorted((tag, step) for tag, step, _ in points) == [
      ("success_rate", 0), ("success_rate", 1), ("success_rate", 2)]
  assert _read_scalars(str(tmp_path))[("success_rate", 2)] == pytest.approx(
      0.5)
  # Nothing is lost: the killed start's points are kept, as their own run.
  earlier = _read_scalars(str(moved))
  assert earlier[("success_rate", 2)] == pytest.approx(0.2)
  assert len(earlier) == 3
  # The next restart takes the next folder.
  assert metrics.set_aside_events(tmp_path) == moved.parent / "2"


def test_format_progress():
  line = metrics.format_progress(
      12, {"success_rate": 0.4375, "valid_action_ratio": 1.0,
           "analyses_parsed": 7, "kl": 0.00123, "entropy": float("nan"),
           "time/rollout": 31.44, "time/train": 8.021})
  assert line == ("update 12 | success 0.438 | valid 1 | parsed 7 | gate - | "
                  "active - | kl 0.00123 | ent nan | logp - | "
                  "time rollout 31.4s train 8.02s")
  assert metrics.format_progress(3, {}, keys=["loss"]) == (
      "update 3 | loss - | time -")


def test_history_json_and_jsonl(tmp_path):
  history = metrics.MetricHistory()
  history.append(1, {"success_rate": jnp.float32(0.5), "loss": np.nan,
                     "stage": "rl"})
  history.append(2, {"success_rate": 0.75, "analyses_parsed": np.int32(3)})
  restored = metrics.MetricHistory.from_json(
      json.loads(json.dumps(history.to_json())))
  assert restored.records == [
      {"update": 1, "success_rate": 0.5, "loss": None, "stage": "rl"},
      {"update": 2, "success_rate": 0.75, "analyses_parsed": 3}]
  assert restored.series("success_rate") == ([1, 2], [0.5, 0.75])
  path = tmp_path / "metrics.jsonl"
  restored.write_jsonl(path)
  lines = path.read_text().splitlines()
  assert [json.loads(l)["update"] for l in lines] == [1, 2]
  with pytest.raises(ValueError, match="scalars"):
    history.append(3, {"loss": np.zeros(2)})


def test_plot_learning_curve(tmp_path):
  history = metrics.MetricHistory()
  for u in range(5):
    history.append(u, {"success_rate": u / 5})
  history.append(4, {"eval/seen/success": 0.6})
  path = tmp_path / "curve.png"
  drawn = metrics.plot_learning_curve(history, path)
  assert drawn == ["success_rate", "eval/seen/success"]
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with PIL.Image.open(path) as image:
    image.verify()  # a whole PNG, not just its signature


def test_a_plot_that_fails_mid_write_keeps_the_last_one(
    tmp_path, savefig_fails_midway):
  history = metrics.MetricHistory()
  history.append(1, {"success_rate": 0.5})
  path = tmp_path / "curve.png"
  metrics.plot_learning_curve(history, path)
  before = path.read_bytes()
  savefig_fails_midway(before[:20])  # half a PNG, then a full disk
  history.append(2, {"success_rate": 0.75})
  with pytest.raises(OSError, match="No space left"):
    metrics.plot_learning_curve(history, path)
  assert path.read_bytes() == before
  assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def test_success_table_rows_and_columns():
  first = {"eval/seen/success": 0.125, "eval/unseen/success": 0.0625,
           "eval/seen/success/pick": 0.5, "eval/seen/tasks": 8.0}
  final = {"eval/seen/success": 0.375, "eval/unseen/success": 0.25,
           "eval/seen/success/pick": 0.75, "eval/unseen/success/heat": 1.0,
           "loss": 0.3}
  lines = metrics.success_table(first, final).splitlines()
  assert lines[0].split() == ["success", "seen", "start", "seen", "final",
                              "unseen", "start", "unseen", "final"]
  assert [l.split()[0] for l in lines[1:]] == ["all", "heat", "pick"]
  assert lines[1].split()[1:] == ["0.125", "0.375", "0.062", "0.250"]
  assert lines[2].split()[1:] == ["-", "-", "-", "1.000"]
  assert lines[3].split()[1:] == ["0.500", "0.750", "-", "-"]
  # Without a starting evaluation: one column per split.
  lines = metrics.success_table({}, final).splitlines()
  assert lines[0].split() == ["success", "seen", "unseen"]
  assert lines[1].split()[1:] == ["0.375", "0.250"]
