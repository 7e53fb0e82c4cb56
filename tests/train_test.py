"""End to end: `python -m seed_jax.train` on the tiny config, SEED and GRPO."""

import errno
import json
import os
import re

from etils import epath
import gin
import pytest

from seed_jax import metrics
from seed_jax import testing
from seed_jax import train

TINY = "configs/experiments/tiny.gin"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(workdir, *bindings):
  gin.clear_config()
  train.main(["--gin_file", os.path.join(ROOT, TINY),
              f"--gin.WORKDIR='{workdir}'", *bindings])
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


PROGRESS = ("success_rate", "valid_action_ratio", "kl", "entropy",
            "logp_agreement", "time/rollout", "time/analysis", "time/scoring",
            "time/train", "eval/seen/success", "eval/unseen/success")
SEED_ONLY = ("analyses_parsed", "opd_gate_mean", "opd_active_ratio")


@pytest.mark.parametrize("variant", ["seed", "grpo"])
def test_two_updates(variant, tmp_path, capfd):
  workdir = str(tmp_path / variant)
  history = _run(workdir, f"--gin.VARIANT='{variant}'")
  console = capfd.readouterr().err  # train.main logs to the console
  assert [h["update"] for h in history] == [0, 1, 2]
  last = history[-1]
  for key in PROGRESS + (SEED_ONLY if variant == "seed" else ()):
    assert key in last, key
  if variant == "grpo":
    assert "opd_gate_mean" not in last
  # Each phase of an update says when it is done (long updates at scale).
  assert "update 2, chunk 1/1: 4 episodes" in console
  assert ("of 4 analyses parsed in" in console) == (variant == "seed")
  assert re.search(r"update 2: \d+ samples scored in", console)
  files = os.listdir(workdir)
  assert "config.gin" in files and "learning_curve.png" in files
  assert any(f.startswith("events.out.tfevents") for f in files)
  assert "trainer.RLConfig.variant" in open(
      os.path.join(workdir, "config.gin")).read()


def test_resume_gives_the_same_metrics(tmp_path):
  full = _run(str(tmp_path / "full"), "--gin.VARIANT='grpo'")
  part = str(tmp_path / "part")
  _run(part, "--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=1")
  resumed = _run(part, "--gin.VARIANT='grpo'")
  assert [h["update"] for h in resumed] == [0, 1, 2]
  for a, b in zip(full, resumed):
    # The interrupted run also evaluated at its last update; compare every
    # metric of the uninterrupted run except timings.
    for k, v in a.items():
      if not k.startswith("time/"):
        assert b[k] == v, (a["update"], k)
  # TensorBoard: the workdir's own events are metrics.jsonl's, each once;
  # the first start's files are kept in earlier_events/1.
  points = testing.read_scalar_events(part)
  assert len({(tag, step) for tag, step, _ in points}) == len(points)
  expected = {(k, h["update"]): v for h in resumed for k, v in h.items()
              if k != "update" and isinstance(v, (int, float))}
  assert {(tag, step): value for tag, step, value in points} == pytest.approx(
      expected, rel=1e-6)
  assert testing.read_scalar_events(
      os.path.join(part, metrics.EARLIER_EVENTS, "1"))


def test_unknown_binding_is_named(tmp_path):
  with pytest.raises(SystemExit, match="error: .*opd_coeff"):
    _run(str(tmp_path / "x"), "--gin.trainer.RLConfig.opd_coeff=0.0")


@pytest.mark.parametrize("binding,message", [
    ("--gin.VARIANT=grpo", "gin cannot parse 'VARIANT=grpo'.*own quotes"),
    ("--gin.SEED=(", "gin cannot parse the gin files or bindings: a bracket"),
    ("--gin.train.train.max_to_keep=0",
     r"train\.max_to_keep=0 must be at least 1"),
    ("--gin.train.train.keep_every=-1",
     r"train\.keep_every=-1 must be at least 0"),
    ("--gin.train.train.checkpoint_every=0",
     r"train\.checkpoint_every=0 must be at least 1"),
    ("--gin.NUM_UPDATES=-3", r"train\.num_updates=-3 must be at least 0"),
    ("--gin.NUM_UPDATES=2.5", r"train\.num_updates=2.5 must be an integer"),
])
def test_bad_values_are_plain_errors_before_any_work(tmp_path, binding,
                                                    message):
  workdir = tmp_path / "x"
  with pytest.raises(SystemExit, match="error: " + message):
    _run(str(workdir), binding)
  assert not workdir.exists()  # refused before the workdir was made


def test_a_gin_file_gin_cannot_parse_is_named(tmp_path):
  bad = tmp_path / "bad.gin"
  bad.write_text(f"include '{os.path.join(ROOT, TINY)}'\nSEED = two\n")
  gin.clear_config()
  with pytest.raises(ValueError, match=r"gin cannot parse 'SEED = two' in "
                     rf"{bad}: .*'two'") as e:
    train.parse_gin([str(bad)], [])
  assert "--gin." not in str(e.value)  # the quoting hint is for bindings
  gin.clear_config()
  # The planners refuse what train would, rather than truncate it.
  with pytest.raises(ValueError, match=r"num_updates=2.5 must be an integer"):
    train.planned_updates(["--gin_file", os.path.join(ROOT, TINY),
                           "--gin.WORKDIR='x'", "--gin.NUM_UPDATES=2.5"])


def test_non_finite_updates_stop_the_run_and_keep_the_last_checkpoint(
    tmp_path, monkeypatch):
  from seed_jax import checkpoints
  from seed_jax import train_step
  workdir = str(tmp_path / "nan")
  _run(workdir, "--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=1")
  real = train_step.rl_loss

  def poisoned(*args, **kwargs):
    loss, metrics = real(*args, **kwargs)
    return loss * float("nan"), metrics

  monkeypatch.setattr(train_step, "rl_loss", poisoned)
  with pytest.raises(train.NonFiniteError, match="2 consecutive"):
    _run(workdir, "--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=5",
         "--gin.train.train.max_consecutive_nonfinite=2")
  ckpt = checkpoints.Checkpointer(workdir)
  assert ckpt.all_steps() == [1]
  ckpt.close()
  # Every finished update reached metrics.jsonl before the run stopped: the
  # first skipped one (2) too, not the one that stopped it.
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert [h["update"] for h in history] == [0, 1, 2]
  assert history[-1]["skipped"] >= 1


def test_a_final_update_with_skipped_steps_is_saved_and_counted(
    tmp_path, monkeypatch):
  from seed_jax import checkpoints
  from seed_jax import train_step
  workdir = str(tmp_path / "nan_last")
  args = ("--gin.VARIANT='grpo'",
          "--gin.train.train.max_consecutive_nonfinite=2")
  _run(workdir, *args, "--gin.NUM_UPDATES=1")
  real = train_step.rl_loss
  monkeypatch.setattr(train_step, "rl_loss", lambda *a, **kw: (
      lambda loss, metrics: (loss * float("nan"), metrics))(*real(*a, **kw)))
  _run(workdir, *args, "--gin.NUM_UPDATES=2")
  ckpt = checkpoints.Checkpointer(workdir)
  # The evaluation reported for update 2 is of a checkpointed state.
  assert ckpt.all_steps() == [1, 2]
  ckpt.close()
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    last = [json.loads(line) for line in f][-1]
  assert last["update"] == 2 and last["skipped"] >= 1
  assert "eval/unseen/success" in last
  # The run extended from there counts that skipped update: it stops at
  # update 3, as an uninterrupted run from update 1 does (the test above),
  # instead of starting its count again.
  with pytest.raises(train.NonFiniteError,
                     match="^2 consecutive .* stopped at update 3 "):
    _run(workdir, *args, "--gin.NUM_UPDATES=3",
         "--gin.train.train.eval_every=0")
  ckpt = checkpoints.Checkpointer(workdir)
  assert ckpt.all_steps() == [1, 2]
  ckpt.close()


def test_config_changes_on_resume_are_named(tmp_path, caplog):
  path = epath.Path(tmp_path) / "config.gin"
  train.write_config(path, "SEED = 0\nNUM_UPDATES = 2\n")
  with caplog.at_level("WARNING"):
    train.write_config(path, "SEED = 0\nNUM_UPDATES = 2\n")
  assert not caplog.records  # the same settings: nothing to say
  with caplog.at_level("WARNING"):
    train.write_config(path, "SEED = 1\nNUM_UPDATES = 2\n")
  assert "-SEED = 0\n+SEED = 1" in caplog.text
  assert "NUM_UPDATES" not in caplog.text
  assert path.read_text() == "SEED = 1\nNUM_UPDATES = 2\n"
  assert sorted(p.name for p in epath.Path(tmp_path).iterdir()) == [
      "config.gin"]


def _count_closes(monkeypatch) -> list:
  """Records each Checkpointer the run closes (its workdir)."""
  from seed_jax import checkpoints  # pylint: disable=g-import-not-at-top
  closed, real = [], checkpoints.Checkpointer.close

  def close(self):
    if not self._closed:  # pylint: disable=protected-access
      closed.append(str(self.workdir))
    real(self)

  monkeypatch.setattr(checkpoints.Checkpointer, "close", close)
  return closed


def test_a_resume_with_another_model_is_refused_and_keeps_config_gin(
    tmp_path, monkeypatch):
  workdir = tmp_path / "other"
  fast = ("--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=1",
          "--gin.train.train.eval_every=0")
  _run(str(workdir), *fast)
  before = (workdir / "config.gin").read_bytes()
  closed = _count_closes(monkeypatch)
  with pytest.raises(SystemExit) as e:
    _run(str(workdir), *fast, "--gin.testing.tiny_policy.hidden_size=32")
  assert closed == [str(workdir)]  # the refused start released its checkpoints
  message = str(e.value)
  assert re.fullmatch(rf"error: workdir {workdir} holds a checkpoint of a "
                      r"different model: .*hidden_size \d+ != 32.*", message)
  assert "In call to configurable" not in message
  # The settings `evaluate` reads are still the checkpoints' own, and the
  # TensorBoard events were not set aside for a run that did not start.
  assert (workdir / "config.gin").read_bytes() == before
  assert not (workdir / metrics.EARLIER_EVENTS).exists()
  gin.clear_config()


def _refused(workdir, *args, gin_file=TINY):
  """train.main with `gin_file` (None: the default main job) and `args`:
  its SystemExit message."""
  files = [] if gin_file is None else ["--gin_file", os.path.join(ROOT,
                                                                  gin_file)]
  gin.clear_config()
  try:
    with pytest.raises(SystemExit) as e:
      train.main([*files, f"--gin.WORKDIR='{workdir}'", *args])
  finally:
    gin.clear_config()
  assert "In call to configurable" not in str(e.value)  # gin's addition
  return str(e.value)


def test_a_bad_rl_setting_is_one_line(tmp_path):
  message = _refused(tmp_path / "run", "--gin.VARIANT='foo'")
  assert message == ("error: unknown variant 'foo'; known: ('grpo', 'seed', "
                     "'opid')")
  assert not (tmp_path / "run").exists()


def test_not_enough_disk_is_one_line(tmp_path):
  message = _refused(tmp_path / "run",
                     "--gin.train.train.min_free_bytes=1000000000000000000")
  assert re.fullmatch(r"error: \[Errno 28\] only .* free in "
                      rf"{tmp_path / 'run'}; the run needs at least .* for its "
                      "checkpoints; free some space or use another workdir",
                      message), message
  assert not (tmp_path / "run" / "config.gin").exists()


def test_a_check_refused_on_any_process_is_raised_on_every_one(
    monkeypatch):
  def check_with(errors):  # process i's check raises errors[i], if any
    def process(index):
      def check():
        if index in errors:
          raise errors[index]
      return train.check_on_every_process(check)
    return process

  assert testing.as_processes(monkeypatch, 3, check_with({})) == [None] * 3
  full = OSError(errno.ENOSPC, "only 5.0 MiB free in /w")
  outcomes = testing.as_processes(monkeypatch, 3,
                                  check_with({1: full, 2: full}))
  for e in outcomes:
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC, e
    assert str(e) == "[Errno 28] processes 1, 2: only 5.0 MiB free in /w"
  unwritable = PermissionError("checkpoint directory /w is not writable")
  for e in testing.as_processes(monkeypatch, 2, check_with({0: unwritable})):
    assert isinstance(e, OSError), e
    assert str(e) == "process 0: checkpoint directory /w is not writable"


def test_a_process_short_of_space_stops_every_process_before_the_policy(
    tmp_path, monkeypatch):
  """Process 1's disk lacks room (a host's own disk, or space that went
  between the checks): every process refuses the start, naming it; none goes
  on to build the policy, where the others would wait for it."""
  import shutil  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  built = []

  class Built(Exception):
    pass

  def policy_fn(workdir, seed):
    built.append(workdir)
    raise Built

  def disk_usage(path):  # 5 MiB free as process 1 sees it, 100 GiB else
    free = 5 << 20 if jax.process_index() == 1 else 100 << 30
    return shutil._ntuple_diskusage(100 << 30, (100 << 30) - free, free)  # pylint: disable=protected-access

  monkeypatch.setattr(shutil, "disk_usage", disk_usage)
  outcomes = testing.as_processes(
      monkeypatch, 2, lambda index: train.train(
          str(workdir), policy_fn=policy_fn, mesh_shape=(1, -1, 1),
          rl=trainer.RLConfig(num_groups=2, group_size=4, mini_batch_size=8,
                              micro_batches=1)))
  assert not built
  for e in outcomes:
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC, outcomes
    assert str(e) == (f"[Errno 28] process 1: only 5.0 MiB free in {workdir}; "
                      "the run needs at least 1.00 GiB for its checkpoints; "
                      "free some space or use another workdir")


def test_a_workdir_that_cannot_be_written_is_one_line(tmp_path):
  (tmp_path / "file").write_text("not a folder")
  workdir = tmp_path / "file" / "run"
  message = _refused(workdir)
  assert message.startswith(f"error: checkpoint directory {workdir} is not "
                            "writable: ")


def test_a_model_folder_without_config_json_is_one_line(tmp_path):
  from seed_jax import tokenizer  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "model"  # a tokenizer, but no config.json
  tokenizer.train_tokenizer(["go look"] * 3, vocab_size=300).save_pretrained(
      str(model_dir))
  gin.clear_config()
  with pytest.raises(SystemExit) as e:
    train.main(["--gin_file", os.path.join(
        ROOT, "configs/experiments/qwen2_5_1_5b_alfworld_style.gin"),
                f"--gin.WORKDIR='{tmp_path / 'run'}'",
                f"--gin.MODEL_DIR='{model_dir}'",
                "--gin.train.train.min_free_bytes=0"])
  gin.clear_config()
  assert str(e.value) == f"error: no config.json in model folder '{model_dir}'"
  assert not (tmp_path / "run" / "config.gin").exists()


def test_an_error_once_training_started_keeps_its_traceback(tmp_path,
                                                            monkeypatch):
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top

  def broken(*args, **kwargs):
    raise ValueError("a bug in the update")

  monkeypatch.setattr(trainer.RLTrainer, "update", broken)
  closed = _count_closes(monkeypatch)
  gin.clear_config()
  with pytest.raises(ValueError, match="a bug in the update"):
    train.main(["--gin_file", os.path.join(ROOT, TINY),
                f"--gin.WORKDIR='{tmp_path / 'run'}'",
                "--gin.train.train.eval_every=0"])
  gin.clear_config()
  assert closed == [str(tmp_path / "run")]
  assert (tmp_path / "run" / "config.gin").exists()  # the start was sound


def _updates(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["update"] for line in f]


def test_a_restart_rewrites_metrics_jsonl_from_its_checkpoint(tmp_path,
                                                              monkeypatch):
  from seed_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  real, fail_at = trainer.RLTrainer.update, [4]

  def faulty(self, *args, update_index, **kwargs):
    if update_index + 1 == fail_at[0]:
      raise RuntimeError(f"a fault in update {fail_at[0]}")
    return real(self, *args, update_index=update_index, **kwargs)

  monkeypatch.setattr(trainer.RLTrainer, "update", faulty)
  workdir = str(tmp_path / "run")
  args = ("--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=4",
          "--gin.train.train.eval_every=0",
          "--gin.train.train.checkpoint_every=2")
  # A checkpoint every 2 updates; metrics.jsonl lists every finished one.
  with pytest.raises(RuntimeError, match="a fault in update 4"):
    _run(workdir, *args)
  assert _updates(workdir) == [1, 2, 3]
  ckpt = checkpoints.Checkpointer(workdir)
  assert ckpt.all_steps() == [2]
  ckpt.close()
  # The restart resumes from update 2 and fails in update 3: metrics.jsonl
  # lists only what the checkpoint holds; the earlier file is kept beside
  # the earlier events.
  fail_at[0] = 3
  with pytest.raises(RuntimeError, match="a fault in update 3"):
    _run(workdir, *args)
  assert _updates(workdir) == [1, 2]
  assert _updates(os.path.join(workdir, metrics.EARLIER_EVENTS, "1")) == [
      1, 2, 3]
  gin.clear_config()


def test_a_checkpoint_past_num_updates_is_refused(tmp_path):
  workdir = tmp_path / "run"
  args = ("--gin.VARIANT='grpo'", "--gin.train.train.eval_every=0")
  _run(str(workdir), *args, "--gin.NUM_UPDATES=2")
  before = (workdir / "config.gin").read_bytes()
  message = _refused(workdir, *args, "--gin.NUM_UPDATES=1")
  assert message == (f"error: workdir {workdir} holds a checkpoint of update "
                     "2, past train.num_updates=1; ask for at least 2 "
                     "updates, or start in another workdir")
  assert (workdir / "config.gin").read_bytes() == before
  assert _updates(workdir) == [1, 2]


def test_a_resume_with_another_seed_is_refused(tmp_path):
  # The checkpoint's rng is fold_in(key(seed), update - 1): a resume with
  # another seed would go on with another random stream, silently.
  workdir = tmp_path / "run"
  args = ("--gin.VARIANT='grpo'", "--gin.train.train.eval_every=0",
          "--gin.NUM_UPDATES=2")
  _run(str(workdir), *args[:2], "--gin.NUM_UPDATES=1")
  before = (workdir / "config.gin").read_bytes()
  message = _refused(workdir, *args, "--gin.SEED=7")
  assert message == (f"error: workdir {workdir} holds a checkpoint of update "
                     "1 written with another train.train.seed than this "
                     "run's 7; resume with the run's seed (see its "
                     "config.gin), or start in another workdir")
  assert (workdir / "config.gin").read_bytes() == before
  assert _updates(workdir) == [1]


def test_check_seed_accepts_the_runs_rng_and_none():
  import jax  # pylint: disable=g-import-not-at-top
  base = jax.random.key(3)
  saved = jax.random.fold_in(base, 4)  # what update 5 saved
  for rng in (saved, jax.random.key_data(saved), None):  # None: older ones
    train._check_seed(rng, base, 5, 3, "w")  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="update 6 written with another "
                     r"train\.train\.seed than this run's 3"):
    train._check_seed(saved, base, 6, 3, "w")  # pylint: disable=protected-access


@pytest.mark.parametrize("binding,message", [
    ("--gin.train.train.mesh_shape=(3, 1, 1)", r"error: mesh .*3 devices"),
    ("--gin.train.train.mesh_shape=(8, 1, 1)",
     r"error: RLConfig\.mini_batch_size=4, micro_batches=2: a batch of 4 "
     "rows does not split"),
])
def test_a_mesh_that_does_not_fit_is_one_line_before_any_work(
    tmp_path, binding, message):
  workdir = tmp_path / "run"
  refused = _refused(workdir, binding)
  assert re.match(message, refused) and "\n" not in refused, refused
  assert not workdir.exists()  # nor the policy built: that comes later


@pytest.mark.parametrize("mesh_shape,processes,message", [
    ((3, 1, 1), 1, "needs 3 devices"),
    ((8, 1, 1), 1, "a batch of 4 rows does not split"),
    (None, 2, "2 processes need a training mesh"),
])
def test_the_mesh_is_checked_before_the_policy_is_built(
    tmp_path, monkeypatch, mesh_shape, processes, message):
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  built = []

  def policy_fn(workdir, seed):
    built.append((workdir, seed))
    raise AssertionError("the warm start ran")

  monkeypatch.setattr(jax, "process_count", lambda: processes)
  with pytest.raises(ValueError, match=message):
    train.train(str(tmp_path / "run"), policy_fn=policy_fn,
                rl=trainer.RLConfig(num_groups=2, group_size=2,
                                    mini_batch_size=4, micro_batches=2),
                mesh_shape=mesh_shape)
  assert not built


def test_an_external_analyzer_without_a_teacher_stops_before_the_policy(
    tmp_path):
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top

  def policy_fn(workdir, seed):
    raise AssertionError("the warm start ran")

  with pytest.raises(ValueError, match="analyzer='external' needs a teacher"
                     ".*external_teacher.gin"):
    train.train(str(tmp_path / "run"), policy_fn=policy_fn,
                rl=trainer.RLConfig(num_groups=2, group_size=2,
                                    mini_batch_size=4, analyzer="external"))
  assert not (tmp_path / "run").exists()


def test_prompt_budgets_past_the_buckets_stop_before_the_policy():
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"analysis_max_prompt_tokens=2048 "
                     r"exceeds the largest prompt bucket \(1024"):
    trainer.RLConfig(prompt_buckets=(512, 1024),
                     analysis_max_prompt_tokens=2048)
  with pytest.raises(ValueError, match=r"max_prompt_tokens=2048 exceeds the "
                     r"largest bucket \(1024"):
    policies.Stage1Config(buckets=(512, 1024), max_prompt_tokens=2048)
  policies.Stage1Config(buckets=(512, 1024), max_prompt_tokens=1024)


def _write_model_config(folder, context):
  folder.mkdir(parents=True)
  (folder / "config.json").write_text(json.dumps(
      testing.tiny_config(max_position_embeddings=context).to_hf()))


def test_analysis_budgets_past_the_demo_context_stop_before_the_warm_start(
    tmp_path, monkeypatch):
  """The demo's 1024-token analysis budget fits its largest bucket, but not
  with 600 new tokens in its 1536-token context: refused before the warm
  start, as RLTrainer would refuse it once the model is built."""
  from seed_jax import policies  # pylint: disable=g-import-not-at-top

  def warm_start(*args, **kwargs):
    raise AssertionError("the warm start ran")

  monkeypatch.setattr(policies, "_demo_policy", warm_start)
  assert _refused(tmp_path / "run", "--gin.train.train.min_free_bytes=0",
                  "--gin.trainer.RLConfig.analysis_max_new_tokens=600",
                  gin_file=None) == (
      "error: analysis_max_prompt_tokens=1024 exceeds the largest prompt "
      "bucket that leaves room for analysis_max_new_tokens=600 (512)")
  assert not (tmp_path / "run").exists()


def test_analysis_budgets_past_a_model_folder_context_stop_before_loading(
    tmp_path, monkeypatch):
  """A Hugging Face folder's config.json gives its context (2048 here):
  rl.gin's 2048-token analysis budget is refused before the tokenizer and
  the weights load."""
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "model"
  _write_model_config(model_dir, 2048)

  def load_tokenizer(*args, **kwargs):
    raise AssertionError("the model folder was loaded")

  monkeypatch.setattr(policies.hf, "load_tokenizer", load_tokenizer)
  assert _refused(tmp_path / "run", f"--gin.MODEL_DIR='{model_dir}'",
                  "--gin.train.train.min_free_bytes=0",
                  gin_file="configs/experiments/qwen2_5_1_5b_alfworld_style.gin"
                  ) == (
      "error: analysis_max_prompt_tokens=2048 exceeds the largest prompt "
      "bucket that leaves room for analysis_max_new_tokens=512 (1024)")
  assert not (tmp_path / "run").exists()


def test_known_context(tmp_path):
  import functools  # pylint: disable=g-import-not-at-top
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  prepare = functools.partial(policies.prepare, env_name="household")
  assert train.known_context(policies.prepare, workdir) == 1536  # the demo's
  assert train.known_context(functools.partial(
      prepare, demo_kwargs={"model": {"max_position_embeddings": 640}}),
                             workdir) == 640
  _write_model_config(tmp_path / "model", 4096)
  hf_prepare = functools.partial(prepare, source="hf",
                                 model_dir=str(tmp_path / "model"))
  assert train.known_context(hf_prepare, workdir) == 4096
  # No config.json, a gguf download, or another policy_fn: not known here.
  assert train.known_context(functools.partial(
      prepare, source="hf", model_dir=str(tmp_path)), workdir) is None
  assert train.known_context(functools.partial(prepare, source="gguf"),
                             workdir) is None
  assert train.known_context(testing.tiny_policy, workdir) is None
  # A restart reloads the policy it prepared: its context.
  _write_model_config(workdir / "policy", 768)
  assert train.known_context(hf_prepare, workdir) == 768
  assert train.known_context(policies.prepare, workdir) == 768


def test_known_config(tmp_path):
  import functools  # pylint: disable=g-import-not-at-top
  from seed_jax import hf  # pylint: disable=g-import-not-at-top
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  _write_model_config(tmp_path / "model", 4096)
  hf_prepare = functools.partial(policies.prepare, source="hf",
                                 model_dir=str(tmp_path / "model"))
  assert train.known_config(hf_prepare, workdir) == hf.load_config(
      str(tmp_path / "model"))
  # The demo's vocabulary comes from its warm start: not known here.
  assert train.known_config(policies.prepare, workdir) is None
  assert train.known_config(testing.tiny_policy, workdir) is None
  # A restart reloads the policy it prepared, the demo's too.
  _write_model_config(workdir / "policy", 768)
  for policy_fn in (hf_prepare, policies.prepare):
    assert train.known_config(
        policy_fn, workdir).max_position_embeddings == 768


@pytest.mark.parametrize("processes", [1, 2])
def test_parameters_the_mesh_cannot_shard_stop_before_the_policy(
    tmp_path, monkeypatch, processes):
  """A model folder's config.json gives the parameter shapes: embeddings
  (4099 x 1028 floats, 17 MB) that no dimension of splits over the 8-way
  fsdp axis are refused before policy_fn runs (the warm start and Stage 1),
  in the words of RLTrainer's own check."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  from seed_jax import hf  # pylint: disable=g-import-not-at-top
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  (model_dir / "config.json").write_text(json.dumps(testing.tiny_config(
      vocab_size=4099, hidden_size=1028, num_heads=4, num_kv_heads=4,
      head_dim=257, num_layers=1, tie_embeddings=True,
      max_position_embeddings=4096).to_hf()))
  run = functools.partial(
      train.train, rl=trainer.RLConfig(num_groups=2, group_size=4,
                                       mini_batch_size=8, micro_batches=1),
      mesh_shape=(1, 8, 1), min_free_bytes=0)
  # The late check: a policy_fn whose model is known once it is built.
  tokenizer = testing.tiny_policy().tokenizer
  config = hf.load_config(str(model_dir))
  with pytest.raises(ValueError) as late:
    run(str(tmp_path / "late"), policy_fn=lambda workdir, seed: (
        policies.Policy(config, None, tokenizer)))
  assert "1 parameter(s) of the model do not split over the 8-way" in str(
      late.value)
  ran = []

  def load_tokenizer(*args, **kwargs):  # policies.prepare's first load
    ran.append(args)
    raise AssertionError("policy_fn ran")

  monkeypatch.setattr(policies.hf, "load_tokenizer", load_tokenizer)
  # Several processes: prepare gets no mesh, and RLTrainer checks only after
  # Stage 1. The start-up checks' verdicts, as alike processes would gather
  # them.
  monkeypatch.setattr(jax, "process_count", lambda: processes)
  monkeypatch.setattr(distributed, "allgather_objects",
                      lambda obj: [obj] * processes)
  with pytest.raises(ValueError) as early:
    run(str(tmp_path / "run"), policy_fn=functools.partial(
        policies.prepare, source="hf", model_dir=str(model_dir)))
  assert str(early.value) == str(late.value)
  assert not ran and not (tmp_path / "run").exists()


@pytest.mark.parametrize("mesh_shape,warned", [(None, True),
                                               ((1, -1, 1), False)])
def test_idle_devices_without_a_mesh_are_warned_about(tmp_path, caplog,
                                                      mesh_shape, warned):
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top

  def policy_fn(workdir, seed):
    raise KeyboardInterrupt  # stop before any work

  with caplog.at_level("WARNING"), pytest.raises(KeyboardInterrupt):
    train.train(str(tmp_path / "run"), policy_fn=policy_fn,
                rl=trainer.RLConfig(num_groups=2, group_size=4,
                                    mini_batch_size=8, micro_batches=1),
                mesh_shape=mesh_shape)
  assert ("8 devices and no train.train.mesh_shape" in caplog.text) == warned


@pytest.mark.parametrize("env,message", [
    ({"SEED_NUM_PROCESSES": "2"},
     "error: 2 processes but no coordinator: set SEED_COORDINATOR"),
    ({"SEED_COORDINATOR": "127.0.0.1:1", "SEED_NUM_PROCESSES": "2",
      "SEED_PROCESS_ID": "x"}, "error: SEED_PROCESS_ID='x': use this "),
])
def test_bad_multi_host_settings_are_one_line(tmp_path, monkeypatch, env,
                                              message):
  for name in list(os.environ):
    if name.startswith("SEED_"):
      monkeypatch.delenv(name)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  refused = _refused(tmp_path / "run")
  assert refused.startswith(message) and "\n" not in refused, refused
  assert not (tmp_path / "run").exists()


def test_policy_seed_goes_to_the_policy_fn_in_place_of_seed(tmp_path):
  """`policy_seed`, where set, goes to policy_fn (the warm start and Stage
  1) in place of `seed`."""
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  calls = []

  def policy_fn(workdir, seed):
    calls.append(seed)
    raise KeyboardInterrupt  # stop before any work

  for kwargs in ({}, dict(policy_seed=7)):
    with pytest.raises(KeyboardInterrupt):
      train.train(str(tmp_path / "run"), policy_fn=policy_fn, seed=3,
                  rl=trainer.RLConfig(num_groups=2, group_size=4,
                                      mini_batch_size=8, micro_batches=1),
                  **kwargs)
  assert calls == [3, 7]


def test_the_mesh_goes_to_a_policy_fn_that_takes_it(tmp_path, monkeypatch):
  """One process: Stage 1 may shard over the training mesh, when policy_fn
  has a `mesh` parameter (gin's wrapper keeps it); else the call is as
  before."""
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer  # pylint: disable=g-import-not-at-top
  calls = []

  def with_mesh(workdir, *, seed, mesh=None):
    calls.append(("with_mesh", seed, mesh))
    raise KeyboardInterrupt  # stop before any work

  def without(workdir, seed):
    calls.append(("without", seed))
    raise KeyboardInterrupt

  def run(policy_fn, mesh_shape=(1, -1, 1), train_fn=train.train):
    kw = {} if policy_fn is None else dict(policy_fn=policy_fn)
    with pytest.raises(KeyboardInterrupt):
      train_fn(str(tmp_path / "run"), mesh_shape=mesh_shape, seed=3,
               rl=trainer.RLConfig(num_groups=2, group_size=4,
                                   mini_batch_size=8, micro_batches=1), **kw)
    return calls.pop()

  name, seed, mesh = run(with_mesh)
  assert (name, seed) == ("with_mesh", 3)
  assert dict(mesh.shape) == dict(data=1, fsdp=8, tensor=1)
  assert run(without) == ("without", 3)
  assert run(with_mesh, mesh_shape=None) == ("with_mesh", 3, None)
  # policies.prepare through gin's configurable, as configs/runs/rl.gin
  # binds it: it checks Stage 1's batch against the mesh it is given.
  def check_mesh_batch(mesh, batch_size):
    calls.append(("prepare", batch_size, mesh))
    raise KeyboardInterrupt

  def warm_start(*args, **kwargs):
    raise AssertionError("prepare was given no mesh: the warm start ran")

  monkeypatch.setattr(policies.sft_lib, "check_mesh_batch", check_mesh_batch)
  monkeypatch.setattr(policies, "_demo_policy", warm_start)
  gin.clear_config()
  try:
    gin.parse_config("""
from __gin__ import dynamic_registration
from seed_jax import policies
from seed_jax import train
train.train.policy_fn = @policies.prepare
policies.prepare.stage1 = @policies.Stage1Config()
""")
    name, _, mesh = run(None, train_fn=gin.get_configurable(train.train))
  finally:
    gin.clear_config()
  assert name == "prepare" and dict(mesh.shape)["fsdp"] == 8
  # Several processes: each runs Stage 1 on its own device, as before.
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  # The start-up checks' verdicts, as two alike processes would gather them.
  monkeypatch.setattr(distributed, "allgather_objects", lambda obj: [obj] * 2)
  assert run(with_mesh) == ("with_mesh", 3, None)
