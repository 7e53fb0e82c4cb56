"""Bad Hugging Face folders for seed_jax.hf and policies.prepare: each is an
error naming the file, found before any weights load."""

import json
import os
import re

import jax
import numpy as np
import pytest

from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import policies
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib


def _tokenizer(vocab_size=300):
  return tokenizer_lib.train_tokenizer(
      ["<think>go to cabinet 1</think><action>look</action>"] * 5,
      vocab_size=vocab_size)


def _folder(path, *, tokenizer=None, vocab_size=512):
  """A model folder with config.json (and tokenizer files), no weights."""
  os.makedirs(path)
  config = testing.tiny_config(vocab_size=vocab_size)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config.to_hf(), f)
  if tokenizer is not None:
    tokenizer.save_pretrained(path)
  return str(path)


def test_a_truncated_config_is_named(tmp_path):
  folder = _folder(tmp_path / "m")
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text[:len(text) // 2])
  with pytest.raises(ValueError, match=f"{re.escape(path)} does not parse as "
                     "JSON .*truncated or damaged"):
    hf.load_config(folder)
  with open(path, "w") as f:
    f.write("[1, 2]")
  with pytest.raises(ValueError, match="holds a JSON list, not the object"):
    hf.load_config(folder)
  with open(path, "w") as f:
    f.write(text)
  gen = os.path.join(folder, "generation_config.json")
  with open(gen, "w") as f:
    f.write('{"eos_token_id": [1,')
  with pytest.raises(ValueError, match=f"{re.escape(gen)} does not parse"):
    hf.load_config(folder)
  os.remove(gen)
  assert hf.load_config(folder).vocab_size == 512


def test_a_folder_without_tokenizer_files_is_named(tmp_path):
  folder = _folder(tmp_path / "m")
  with pytest.raises(FileNotFoundError, match=f"no tokenizer in "
                     f"'{re.escape(folder)}': it holds none of tokenizer.json"):
    hf.load_tokenizer(folder)


def _without_added_tokens(tokenizer_json):
  return {k: v for k, v in tokenizer_json.items() if k != "added_tokens"}


@pytest.mark.parametrize("damage,message", [
    (_without_added_tokens, "KeyError: 'added_tokens'"),
    (lambda j: dict(j, model={"type": "Nope"}), "Exception: data did not"),
])
def test_a_malformed_tokenizer_json_is_named(damage, message, tmp_path):
  folder = _folder(tmp_path / "m", tokenizer=_tokenizer())
  path = os.path.join(folder, "tokenizer.json")
  with open(path) as f:
    good = json.load(f)
  with open(path, "w") as f:
    json.dump(damage(good), f)
  with pytest.raises(ValueError, match=f"the tokenizer files in "
                     f"'{re.escape(folder)}' do not load.*{message}"):
    hf.load_tokenizer(folder)
  with open(path, "w") as f:
    json.dump(good, f)
  assert len(hf.load_tokenizer(folder)) == len(_tokenizer())


def test_prepare_reads_the_tokenizer_before_the_weights(tmp_path,
                                                        monkeypatch):
  loads = []

  def load_pretrained(path, **kwargs):
    loads.append(path)
    raise RuntimeError("the weights")

  monkeypatch.setattr(hf, "load_pretrained", load_pretrained)
  no_tok = _folder(tmp_path / "no_tok")
  with pytest.raises(FileNotFoundError, match="no tokenizer in .*no_tok"):
    policies.prepare(tmp_path / "w1", source="hf", model_dir=no_tok)
  big = _folder(tmp_path / "big", tokenizer=_tokenizer(), vocab_size=64)
  with pytest.raises(ValueError, match="the tokenizer has .* tokens but the "
                     "model's embedding has only 64 rows"):
    policies.prepare(tmp_path / "w2", source="hf", model_dir=big)
  # A run's cached policy folder is read in the same order.
  _folder(tmp_path / "w3" / "policy")
  with pytest.raises(FileNotFoundError, match="no tokenizer in .*w3/policy"):
    policies.prepare(tmp_path / "w3", source="hf", model_dir=no_tok)
  assert not loads
  good = _folder(tmp_path / "good", tokenizer=_tokenizer())
  with pytest.raises(RuntimeError, match="the weights"):
    policies.prepare(tmp_path / "w4", source="hf", model_dir=good)
  assert loads == [good]


def _model_folder(path, vocab_size=300):
  """A tiny Hugging Face folder with weights and a tokenizer."""
  config = testing.tiny_config(vocab_size=vocab_size)
  hf.save_pretrained(str(path), config,
                     model_lib.init_params(config, jax.random.key(0)),
                     tokenizer=_tokenizer(vocab_size))
  return str(path)


def test_a_reloaded_policy_keeps_the_dtype_override(tmp_path):
  model_dir = _model_folder(tmp_path / "m")
  work = tmp_path / "w"
  first = policies.prepare(work, source="hf", model_dir=model_dir,
                           dtype="bfloat16")
  assert first.config.dtype == "bfloat16"
  # After Stage 1 the policy is kept in workdir/policy; a resumed run with
  # the same arguments reloads it, and must compute alike.
  policies._save_folder(first, work / "policy")
  again = policies.prepare(work, source="hf", model_dir=model_dir,
                           dtype="bfloat16")
  assert again.config == first.config
  assert policies.prepare(work, source="hf",
                          model_dir=model_dir).config.dtype == "float32"


def test_a_demo_warm_start_keeps_the_compute_overrides(tmp_path, monkeypatch):
  from seed_jax import demo  # pylint: disable=g-import-not-at-top
  config = testing.tiny_config(vocab_size=300)
  params = model_lib.init_params(config, jax.random.key(0))
  runs = []

  def warm_start(**kwargs):
    runs.append(kwargs)
    return config, params, _tokenizer(), {"loss": 1.0}

  monkeypatch.setattr(demo, "warm_start", warm_start)
  cache = str(tmp_path / "cache")
  kw = dict(dtype="bfloat16", attention_block=128, cache_dir=cache)
  fresh = policies.prepare(tmp_path / "w1", **kw)
  reloaded = policies.prepare(tmp_path / "w1", **kw)  # from w1/policy
  cached = policies.prepare(tmp_path / "w2", **kw)  # from the cache
  assert len(runs) == 1
  for policy in (fresh, reloaded, cached):
    assert policy.config.dtype == "bfloat16"
    assert policy.config.param_dtype == "float32"
    assert policy.config.attention_block == 128
  plain = policies.prepare(tmp_path / "w3", cache_dir=cache).config
  assert plain.dtype == "float32" and plain.attention_block is None


@pytest.mark.parametrize("index,match", [
    ({"metadata": {}}, 'has no "weight_map"'),
    ({"weight_map": ["model.safetensors"]}, '"weight_map" is not an object'),
    ({"weight_map": {"model.norm.weight": 3}},
     '"weight_map" is not an object'),
    ([1, 2], 'has no "weight_map"'),
])
def test_an_index_without_a_weight_map_is_named(tmp_path, index, match):
  folder = _model_folder(tmp_path / "m")
  path = os.path.join(folder, "model.safetensors.index.json")
  with open(path, "w") as f:
    json.dump(index, f)
  with pytest.raises(ValueError, match=f"{re.escape(path)}:? {match}"):
    hf.load_pretrained(folder)


def test_float64_parameters_are_refused_not_rounded(tmp_path):
  # JAX without x64 would hold float32 values under a float64 label.
  folder = _model_folder(tmp_path / "m")
  with pytest.raises(ValueError, match="parameter dtype float64: JAX"):
    hf.load_pretrained(folder, param_dtype="float64")
  config, params = hf.load_pretrained(folder)
  with pytest.raises(ValueError, match="safetensors dtype float64: JAX"):
    hf.save_pretrained(str(tmp_path / "out"), config, params, dtype="float64")
  assert not os.path.exists(tmp_path / "out")
  # Float64 weights load into float32 when asked to (the default).
  path = os.path.join(folder, "model.safetensors")
  tensors = {k: np.asarray(v, np.float64)
             for k, v in hf.read_safetensors(path).items()}
  hf.write_safetensors(path, tensors)
  config, params = hf.load_pretrained(folder)
  assert config.param_dtype == "float32"
  assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"float32"}


def test_safetensors_are_synced_before_and_after_the_rename(tmp_path,
                                                            monkeypatch):
  # As atomic.py: a power cut leaves the old file or the new one, not an
  # empty one.
  events, moves = [], []
  real_fsync, real_replace = os.fsync, os.replace

  def fsync(fd):
    events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
    real_fsync(fd)

  def replace(src, dst):
    events.append(("replace", os.fspath(src)))
    moves.append((os.fspath(src), os.fspath(dst)))
    return real_replace(src, dst)

  monkeypatch.setattr(os, "fsync", fsync)
  monkeypatch.setattr(os, "replace", replace)
  path = str(tmp_path / "w.safetensors")
  hf.write_safetensors(path, {"a": np.arange(4, dtype=np.float32)})
  assert events == [("fsync", path + ".tmp"), ("replace", path + ".tmp"),
                    ("fsync", str(tmp_path))]
  np.testing.assert_array_equal(hf.read_safetensors(path)["a"], np.arange(4))
  # save_pretrained: every file synced before its rename, the folder after.
  events.clear()
  moves.clear()
  config = testing.tiny_config()
  folder = str(tmp_path / "m")
  hf.save_pretrained(folder, config,
                     model_lib.init_params(config, jax.random.key(0)))
  synced = {p for e, p in events if e == "fsync"}  # data synced under a name
  for src, dst in moves:
    assert src in synced, src
    synced.add(dst)
  assert {os.path.join(folder, n)
          for n in ("model.safetensors", "config.json")} <= synced
  assert events[-1] == ("fsync", folder)
