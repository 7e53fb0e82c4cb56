"""SFT: packed batches, and a tiny model that learns to write parseable
analyses from Stage-1 records."""

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from seed_jax import annotators
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import sft
from seed_jax import stage1
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib


def test_batches_stay_in_a_bucket_and_pack_to_one_shape():
  examples = [([5] * n, [7] * m + [1], {}) for n, m in
              ((2, 1), (6, 2), (3, 0), (7, 1), (4, 3))]
  batches = sft._batches(examples, 2, (4, 8))
  assert batches == [[0, 2], [4], [1, 3]]
  shuffled = sft._batches(examples, 2, (4, 8), np.random.default_rng(0))
  assert sorted(sum(shuffled, [])) == list(range(5))
  bucket = lambda i: 4 if len(examples[i][0]) <= 4 else 8
  assert all(len({bucket(i) for i in b}) == 1 for b in shuffled)
  assert sorted(map(len, shuffled)) == [1, 2, 2]
  batch = sft._pack(examples, [4], batch_size=2, buckets=(4, 8), pad_id=0,
                    response_len=5)
  np.testing.assert_array_equal(batch["prompts"], [[5] * 4] * 2)  # [B, P]
  np.testing.assert_array_equal(batch["prompt_mask"], [[1] * 4] * 2)
  np.testing.assert_array_equal(batch["responses"],  # [B, R]
                                [[7, 7, 7, 1, 0]] * 2)
  # The filler row repeats the first and carries no loss.
  np.testing.assert_array_equal(batch["response_mask"],
                                [[1, 1, 1, 1, 0], [0] * 5])
  batch = sft._pack(examples, [1, 3], batch_size=2, buckets=(4, 8), pad_id=0,
                    response_len=5)
  np.testing.assert_array_equal(batch["prompts"], [[0, 0, 5, 5, 5, 5, 5, 5],
                                                   [0, 5, 5, 5, 5, 5, 5, 5]])
  assert {k: v.shape for k, v in batch.items()} == dict(
      prompts=(2, 8), prompt_mask=(2, 8), responses=(2, 5),
      response_mask=(2, 5))


@pytest.mark.slow
def test_tiny_model_learns_to_write_parseable_analyses(tmp_path):
  # Sokoban's short grid observations keep analysis prompts near 300 tokens.
  # 12 validation records: the parse rate moves in steps of 1/12, so one
  # looping analysis of this tiny model still leaves it above 0.9.
  pool_factory, generate = testing.scripted_rollouts(bad=lambda i: i % 4 == 3)
  records, _ = stage1.collect_records(
      generate, "sokoban", num_tasks=60, group_size=2, max_steps=3,
      annotator=annotators.annotate, rng=jax.random.key(0),
      pool_factory=pool_factory)
  stage1.write_dataset(records, tmp_path / "data")
  train = list(stage1.read_dataset(tmp_path / "data", "train"))
  val = list(stage1.read_dataset(tmp_path / "data", "validation"))
  assert len(train) == 108 and len(val) == 12
  assert {r["success"] for r in val} == {True, False}
  tokenizer = tokenizer_lib.train_tokenizer(
      [r["prompt"] for r in records] + [r["response"] for r in records],
      vocab_size=1024)
  config = testing.tiny_config(vocab_size=len(tokenizer),
                               max_position_embeddings=512)
  params = model_lib.init_params(config, jax.random.key(1))
  tuned, report = sft.sft(
      params, config, tokenizer, train, val, learning_rate=1e-2,
      rng=jax.random.key(2), epochs=10, batch_size=8, buckets=(320,),
      response_len_max=96, log_every=30, checkpoint_dir=tmp_path / "ckpt")
  assert report["train_examples"] == 108 and report["val_examples"] == 12
  assert report["steps"] == 140 and report["skipped_updates"] == 0
  assert report["parse_rate"] >= 0.9, report
  assert report["skill_f1"] >= 0.5, report
  assert report["val_loss"] < 0.5
  restored = sft.restore_params(tmp_path / "ckpt", params)
  assert jax.tree.all(jax.tree.map(lambda a, b: (a == b).all(), restored,
                                   tuned))


def _tiny_tokenizer_and_config():
  tok = tokenizer_lib.train_tokenizer(["look at the mug", "go to the desk"] * 3,
                                      vocab_size=300)
  config = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=64,
                               eos_token_ids=(tok.eos_token_id,),
                               pad_token_id=tok.pad_token_id)
  return tok, config


@pytest.mark.parametrize("knob, value", [
    ("epochs", 0), ("batch_size", 0), ("learning_rate", -1e-3),
    ("learning_rate", float("nan")), ("warmup_fraction", 1.5),
    ("warmup_fraction", 1.0), ("warmup_fraction", -0.1),
    ("weight_decay", -0.1), ("grad_clip", -1.0), ("response_len_max", 0),
    ("log_every", -1)])
def test_bad_knobs_are_clear_errors(knob, value):
  tok, config = _tiny_tokenizer_and_config()
  kw = dict(learning_rate=1e-3, rng=jax.random.key(0), buckets=(16,),
            response_len_max=8)
  kw[knob] = value
  with pytest.raises(ValueError, match=f"sft: {knob} must be"):
    sft.sft({}, config, tok, [dict(prompt="look", response="go")], [], **kw)


def test_train_loss_is_the_mean_of_the_applied_updates(monkeypatch):
  tok, config = _tiny_tokenizer_and_config()
  # (loss, skipped) of each update, scripted: no model is compiled.
  script = iter([(9.0, 0.0)] * 3 + [(1.0, 0.0), (np.nan, 1.0), (3.0, 0.0)])

  def jit_train_step(tx, loss_fn):
    del tx, loss_fn
    def step(state, batch):
      del batch
      loss, skipped = next(script)
      return state, dict(loss=np.float32(loss), skipped=np.float32(skipped),
                         grad_norm=np.float32(1.0))
    return step

  monkeypatch.setattr(sft.train_step_lib, "jit_train_step", jit_train_step)
  records = [dict(prompt="look", response="go")] * 6
  _, report = sft.sft(
      {"w": np.zeros(2, np.float32)}, config, tok, records, [],
      learning_rate=1e-3, rng=jax.random.key(0), epochs=2, batch_size=2,
      buckets=(16,), response_len_max=8, log_every=0)
  assert (report["steps"], report["skipped_updates"]) == (6, 1)
  assert report["train_loss"] == 2.0  # the last epoch's applied updates


@pytest.mark.parametrize("records, epochs, fraction, warmup", [
    (1, 1, 0.9, 0),  # 1 step: no warm-up, the step at the peak
    (2, 1, 0.75, 1),  # round(1.5) = 2 of 2 steps, capped
    (2, 5, 0.95, 9),  # round(9.5) = 10 of 10 steps, capped
    (2, 5, 0.3, 3)])
def test_warmup_leaves_the_cosine_a_step(monkeypatch, records, epochs,
                                         fraction, warmup):
  tok, config = _tiny_tokenizer_and_config()
  calls = []
  make_optimizer = sft.train_step_lib.make_optimizer

  def spy(*args, **kw):
    calls.append(kw)
    return make_optimizer(*args, **kw)  # optax checks the decay steps

  def jit_train_step(tx, loss_fn):  # scripted: no model is compiled
    del tx, loss_fn
    return lambda state, batch: (state, dict(
        loss=np.float32(1.0), skipped=np.float32(0.0),
        grad_norm=np.float32(1.0)))

  monkeypatch.setattr(sft.train_step_lib, "make_optimizer", spy)
  monkeypatch.setattr(sft.train_step_lib, "jit_train_step", jit_train_step)
  _, report = sft.sft(
      {"w": np.zeros(2, np.float32)}, config, tok,
      [dict(prompt="look", response="go")] * records, [],
      learning_rate=1e-3, rng=jax.random.key(0), epochs=epochs, batch_size=1,
      warmup_fraction=fraction, buckets=(16,), response_len_max=8,
      log_every=0)
  assert report["steps"] == records * epochs
  assert [(c["warmup_steps"], c["total_steps"]) for c in calls] == [
      (warmup, records * epochs)]


def test_validation_that_cannot_fit_fails_before_training(monkeypatch):
  # Before, the error came after every epoch, and the trained params were
  # lost with it.
  tok, config = _tiny_tokenizer_and_config()
  steps = []

  def jit_train_step(tx, loss_fn):  # scripted: no model is compiled
    del tx, loss_fn
    def step(state, batch):
      steps.append(batch)
      return state, dict(loss=np.float32(1.0), skipped=np.float32(0.0),
                         grad_norm=np.float32(1.0))
    return step

  monkeypatch.setattr(sft.train_step_lib, "jit_train_step", jit_train_step)
  long = dict(prompt="look", response="go to the desk " * 8)
  with pytest.raises(ValueError, match=r"no validation record fits the "
                     r"buckets and response_len_max \(\{'skipped/response_"
                     r"too_long': 2\}\)"):
    sft.sft({"w": np.zeros(2, np.float32)}, config, tok,
            [dict(prompt="look", response="go")] * 4, [long, long],
            learning_rate=1e-3, rng=jax.random.key(0), epochs=2,
            batch_size=2, buckets=(16,), response_len_max=8, log_every=0)
  assert not steps


def test_validation_analyses_cut_at_response_len_max_fail_as_truncated():
  tok, config = _tiny_tokenizer_and_config()
  params = model_lib.init_params(config, jax.random.key(0))
  records = [dict(prompt="look at the mug", response="go", task=f"t{i}",
                  family="f", success=True) for i in range(3)]
  # A random model writes no EOS in 4 tokens: every reply is cut there.
  out = sft.evaluate(params, config, tok, records, response_len_max=4,
                     rng=jax.random.key(1), batch_size=2, buckets=(16,))
  assert out["val_parse/failed"] == 3
  assert out["val_parse/failed/truncated"] == 3


def _mesh_records():
  pairs = [("look at the mug", "go to the desk"),
           ("go to the desk", "look at the mug"), ("look", "go to the mug"),
           ("the desk", "look at the desk")]
  return [dict(prompt=p, response=r, task=f"t{i}", family="f", success=True)
          for i, (p, r) in enumerate(pairs * 2)]


def test_sft_on_a_mesh_matches_one_device_with_sharded_state():
  tok, config = _tiny_tokenizer_and_config()
  params = model_lib.init_params(config, jax.random.key(0))
  records = _mesh_records()
  kw = dict(learning_rate=1e-2, rng=jax.random.key(1), epochs=1, batch_size=4,
            buckets=(16,), response_len_max=8, log_every=0)
  want, want_report = sft.sft(params, config, tok, records, records[:2], **kw)
  mesh = partitioning.make_mesh((2, 2, 2))
  placed = jax.device_put(params, partitioning.param_shardings(config, mesh))
  got, report = sft.sft(placed, config, tok, records, records[:2], mesh=mesh,
                        **kw)
  assert report["steps"] == want_report["steps"] == 2
  # Sharded like the RL trainer's state; the caller's params not donated.
  assert got["layers"]["q_kernel"].sharding.spec == P(None, "fsdp", "tensor",
                                                      None)
  assert got["layers"]["q_kernel"].sharding.mesh == mesh
  assert not any(x.is_deleted() for x in jax.tree.leaves(placed))
  # Two AdamW steps at 1e-2 move the weights by up to 1.5e-2. The mesh sums
  # in another order, and AdamW divides each gradient by its own size, so a
  # gradient that cancels to a small value can move its weight's update by a
  # fraction of that update: measured, at most 3.7e-6 absolute on one CPU
  # and, on another, 3.6e-5 on one gate_kernel element of 12,288 (0.4% of the
  # 9.5e-3 it moved), every other leaf within 4.2e-6. So each weight must
  # match to 1% of its own update (plus 1e-6 for those decay alone moves); a
  # mesh that dropped or doubled part of the batch changes most updates by
  # far more.
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params)))
  assert moved > 1e-3

  def close(path, g, w, p):
    g, w, p = (np.asarray(x, np.float64) for x in (g, w, p))
    excess = np.abs(g - w) - (1e-6 + 1e-2 * np.abs(w - p))
    assert excess.max() <= 0, (jax.tree_util.keystr(path), float(
        np.abs(g - w).max()), np.unravel_index(excess.argmax(), w.shape))
  jax.tree_util.tree_map_with_path(close, got, want, params)
  np.testing.assert_allclose(report["train_loss"], want_report["train_loss"],
                             rtol=1e-6)
  np.testing.assert_allclose(report["val_loss"], want_report["val_loss"],
                             rtol=1e-6)


def test_a_batch_that_does_not_split_over_the_mesh_is_named_before_compiling(
    monkeypatch):
  tok, config = _tiny_tokenizer_and_config()

  def jit_train_step(*args, **kwargs):
    raise AssertionError("the step was built")

  monkeypatch.setattr(sft.train_step_lib, "jit_train_step", jit_train_step)
  with pytest.raises(ValueError, match=r"sft: batch_size \(Stage1Config\."
                     r"batch_size\) must split over the mesh, got 4: .* "
                     r"multiple of 8"):
    sft.sft({}, config, tok, _mesh_records(), [], learning_rate=1e-3,
            rng=jax.random.key(0), batch_size=4, buckets=(16,),
            response_len_max=8, mesh=partitioning.make_mesh((1, -1, 1)))
