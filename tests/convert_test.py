"""Hugging Face folder -> sharded orbax checkpoint -> Hugging Face folder."""

import json
import os
import re
import shutil
import subprocess
import sys

from etils import epath
import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from seed_jax import convert
from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import testing
from tests import multihost_test


def test_relative_destination(tmp_path, monkeypatch):
  config = testing.tiny_config(family="llama")
  hf.save_pretrained(str(tmp_path / "hf"), config,
                     model_lib.init_params(config, jax.random.key(0)))
  monkeypatch.chdir(tmp_path)
  convert.main(["hf_to_orbax", "--src=hf", "--dst=out", "--mesh=1,-1,1"])
  assert (tmp_path / "out" / "params").is_dir()
  assert not [p for p in os.listdir(tmp_path / "out") if "tmp" in p]


def test_round_trip_keeps_every_tensor(tmp_path):
  config = testing.tiny_config(family="qwen2")
  params = model_lib.init_params(config, jax.random.key(3))
  src, ckpt, back = (str(tmp_path / n) for n in ("hf", "orbax", "back"))
  hf.save_pretrained(src, config, params)
  with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
    json.dump({"model_max_length": 256}, f)
  # Weights in other formats stay behind: a loader could prefer them.
  for name in ("pytorch_model.bin", "pytorch_model.bin.index.json"):
    with open(os.path.join(src, name), "w") as f:
      f.write("{}")

  convert.main(["hf_to_orbax", f"--src={src}", f"--dst={ckpt}",
                "--mesh=2,2,2"])
  assert sorted(os.listdir(ckpt)) == ["config.json", "params",
                                      "tokenizer_config.json"]
  restored_config, restored = convert.restore_params(ckpt,
                                                     mesh_shape=(1, 4, 2))
  assert restored_config == config
  emb = restored["embed"]["embedding"]
  assert emb.sharding.spec == P("tensor", "fsdp")  # (vocab, embed)
  assert len(emb.sharding.device_set) == 8
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(FileExistsError):
    convert.hf_to_orbax(src, ckpt)

  convert.main(["orbax_to_hf", f"--src={ckpt}", f"--dst={back}"])
  assert hf.load_config(back) == config
  want = hf.read_safetensors(os.path.join(src, "model.safetensors"))
  got = hf.read_safetensors(os.path.join(back, "model.safetensors"))
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  assert os.path.exists(os.path.join(back, "tokenizer_config.json"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """(Hugging Face folder, orbax folder) of one tiny model."""
  root = tmp_path_factory.mktemp("convert")
  config = testing.tiny_config(family="llama")
  src, ckpt = str(root / "hf"), str(root / "orbax")
  hf.save_pretrained(src, config, model_lib.init_params(config,
                                                        jax.random.key(0)))
  convert.hf_to_orbax(src, ckpt)
  return src, ckpt


def _no_reading(monkeypatch):
  """Fails a test that reads the model before refusing its flags."""
  def read(*args, **kwargs):
    raise AssertionError("the model was read before the flags were checked")
  monkeypatch.setattr(hf, "load_pretrained", read)
  monkeypatch.setattr(convert, "restore_params", read)


def _exit_message(argv) -> str:
  with pytest.raises(SystemExit) as e:
    convert.main(argv)
  message = str(e.value.code)
  assert message.startswith("error: ") and "\n" not in message, message
  return message


@pytest.mark.parametrize("direction,flags,match", [
    ("hf_to_orbax", {"src": "{tmp}/nope"}, "source '.*/nope' is not a folder"),
    ("hf_to_orbax", {"src": "{tmp}"}, "no config.json in source folder"),
    ("orbax_to_hf", {"src": "{hf}"}, "no params/ in source folder"),
    ("hf_to_orbax", {"mesh": "a,b"}, "--mesh=a,b: want three sizes"),
    ("hf_to_orbax", {"mesh": "1,2"}, "--mesh=1,2: want three sizes"),
    ("hf_to_orbax", {"mesh": "0,-1,1"}, "--mesh=0,-1,1: want three sizes"),
    ("hf_to_orbax", {"mesh": "3,1,1"}, "needs 3 devices, 8 available"),
    ("orbax_to_hf", {"dtype": "float7"}, "--dtype: dtype 'float7' cannot"),
    ("orbax_to_hf", {"dtype": "int8"}, "--dtype: dtype 'int8' cannot hold"),
    ("orbax_to_hf", {"dtype": "float64"}, "--dtype: dtype float64: JAX"),
    ("hf_to_orbax", {"dtype": "float64"}, "--dtype: dtype float64: JAX"),
    ("hf_to_orbax", {"dst": "{hf}"}, "destination .* is the source folder"),
])
def test_bad_flags_are_one_line_errors_and_write_nothing(
    folders, tmp_path, monkeypatch, direction, flags, match):
  hf_dir, orbax_dir = folders
  flags = {"src": hf_dir if direction == "hf_to_orbax" else orbax_dir,
           "dst": str(tmp_path / "out"), **flags}
  argv = [direction] + [
      f"--{k}={v.format(tmp=tmp_path, hf=hf_dir)}" for k, v in flags.items()]
  before = sorted(os.listdir(hf_dir)), sorted(os.listdir(tmp_path))
  _no_reading(monkeypatch)
  message = _exit_message(argv)
  assert re.search(match, message), message
  assert (sorted(os.listdir(hf_dir)), sorted(os.listdir(tmp_path))) == before


@pytest.mark.parametrize("direction", ["hf_to_orbax", "orbax_to_hf"])
def test_a_destination_under_a_file_is_refused_before_reading(
    folders, tmp_path, monkeypatch, direction):
  src = folders[0] if direction == "hf_to_orbax" else folders[1]
  (tmp_path / "f").write_text("keep")
  _no_reading(monkeypatch)
  assert "lies under the file" in _exit_message(
      [direction, f"--src={src}", f"--dst={tmp_path}/f/out"])
  assert "is a file, not a folder" in _exit_message(
      [direction, f"--src={src}", f"--dst={tmp_path}/f"])
  with pytest.raises(NotADirectoryError, match="lies under the file"):
    getattr(convert, direction)(src, str(tmp_path / "f" / "out"))
  assert (tmp_path / "f").read_text() == "keep"


def test_existing_params_are_refused_and_kept(folders):
  hf_dir, orbax_dir = folders
  before = sorted(os.listdir(os.path.join(orbax_dir, "params")))
  assert _exit_message(["hf_to_orbax", f"--src={hf_dir}",
                        f"--dst={orbax_dir}"]).endswith(
                            "params exists; choose another destination")
  assert sorted(os.listdir(os.path.join(orbax_dir, "params"))) == before


def test_a_bad_dtype_leaves_no_destination_folder(folders, tmp_path):
  # The library call, no flags checked first: still nothing is created.
  with pytest.raises(ValueError, match="'int8' cannot hold the weights"):
    convert.orbax_to_hf(folders[1], str(tmp_path / "back"), dtype="int8")
  assert not os.path.exists(tmp_path / "back")


def test_a_failed_config_write_keeps_the_old_config(folders, tmp_path,
                                                    monkeypatch):
  dst = tmp_path / "out"  # an interrupted earlier run: config.json, no params
  dst.mkdir()
  (dst / "config.json").write_text("old")

  def no_space(self, target):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(type(epath.Path(dst)), "replace", no_space)
  assert "No space left" in _exit_message(
      ["hf_to_orbax", f"--src={folders[0]}", f"--dst={dst}"])
  assert (dst / "config.json").read_text() == "old"
  assert sorted(os.listdir(dst)) == ["config.json"]


@pytest.mark.parametrize("says", ["torch_dtype", "dtype", "safetensors"])
def test_the_weights_keep_their_dtype_both_ways(tmp_path, says):
  # bfloat16 weights stay bfloat16 in orbax and back, not float32 (twice the
  # size); the dtype comes from config.json (transformers v5 writes "dtype",
  # earlier versions "torch_dtype") or else from the safetensors.
  config = testing.tiny_config(family="qwen2")
  src, ckpt, back = (str(tmp_path / n) for n in ("hf", "orbax", "back"))
  hf.save_pretrained(src, config, model_lib.init_params(config,
                                                        jax.random.key(1)),
                     dtype="bfloat16")
  with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
  del cfg["torch_dtype"]
  if says != "safetensors":
    cfg[says] = "bfloat16"
  with open(os.path.join(src, "config.json"), "w") as f:
    json.dump(cfg, f)
  convert.main(["hf_to_orbax", f"--src={src}", f"--dst={ckpt}"])
  restored_config, restored = convert.restore_params(ckpt)
  assert restored_config.param_dtype == "bfloat16"
  assert {str(x.dtype) for x in jax.tree.leaves(restored)} == {"bfloat16"}
  convert.main(["orbax_to_hf", f"--src={ckpt}", f"--dst={back}"])
  want = hf.read_safetensors(os.path.join(src, "model.safetensors"))
  got = hf.read_safetensors(os.path.join(back, "model.safetensors"))
  assert sorted(got) == sorted(want)
  for name in want:
    assert got[name].dtype == want[name].dtype, name
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  with open(os.path.join(back, "config.json")) as f:
    assert json.load(f)["torch_dtype"] == "bfloat16"
  # Asked otherwise: float32 parameters.
  convert.hf_to_orbax(src, str(tmp_path / "f32"), dtype="float32")
  _, restored = convert.restore_params(str(tmp_path / "f32"))
  assert {str(x.dtype) for x in jax.tree.leaves(restored)} == {"float32"}


def test_a_tied_config_with_its_own_lm_head_converts_untied(tmp_path):
  # hf.load_pretrained loads it untied (as transformers); the shardings
  # must be those of the config it loads.
  config = testing.tiny_config(family="llama")
  params = model_lib.init_params(config, jax.random.key(2))
  src, ckpt = str(tmp_path / "hf"), str(tmp_path / "orbax")
  hf.save_pretrained(src, config, params)
  with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
  cfg["tie_word_embeddings"] = True
  with open(os.path.join(src, "config.json"), "w") as f:
    json.dump(cfg, f)
  convert.hf_to_orbax(src, ckpt, mesh_shape=(1, 4, 2))
  restored_config, restored = convert.restore_params(ckpt)
  assert not restored_config.tie_embeddings
  np.testing.assert_array_equal(np.asarray(restored["lm_head"]["kernel"]),
                                np.asarray(params["lm_head"]["kernel"]))


@pytest.mark.parametrize("direction", ["hf_to_orbax", "orbax_to_hf"])
def test_a_link_to_the_source_or_a_folder_in_it_is_refused(
    folders, tmp_path, monkeypatch, direction):
  # Through the link the source's config.json would be rewritten.
  src = folders[0] if direction == "hf_to_orbax" else folders[1]
  os.symlink(src, tmp_path / "link")
  before = sorted(os.listdir(src))
  _no_reading(monkeypatch)
  message = _exit_message([direction, f"--src={src}",
                           f"--dst={tmp_path}/link"])
  assert re.search(r"destination '.*/link' is the source folder \(.* through "
                   r"a link\)", message), message
  message = _exit_message([direction, f"--src={tmp_path}/link",
                           f"--dst={src}/params"])
  assert "lies inside the source folder" in message, message
  with pytest.raises(ValueError, match="is the source folder"):
    getattr(convert, direction)(src, str(tmp_path / "link"))
  assert sorted(os.listdir(src)) == before


def test_an_index_without_a_weight_map_is_a_one_line_error(folders, tmp_path):
  src = str(tmp_path / "hf")
  shutil.copytree(folders[0], src)
  index = os.path.join(src, "model.safetensors.index.json")
  with open(index, "w") as f:
    json.dump({"metadata": {}}, f)
  message = _exit_message(["hf_to_orbax", f"--src={src}",
                           f"--dst={tmp_path}/out"])
  assert message == (f'error: {index} has no "weight_map" (tensor name -> '
                     "shard file): a damaged or incomplete index?")


@pytest.mark.parametrize("says", ["torch_dtype", "safetensors"])
def test_float64_weights_need_an_explicit_float32(tmp_path, says):
  # JAX (without x64) has no float64: the weights would be rounded to float32
  # and saved under a float64 label, both ways.
  config = testing.tiny_config(family="llama")
  src, ckpt, back = (str(tmp_path / n) for n in ("hf", "orbax", "back"))
  hf.save_pretrained(src, config, model_lib.init_params(config,
                                                        jax.random.key(0)))
  path = os.path.join(src, "model.safetensors")
  wide = {k: np.asarray(v, np.float64) + 1e-12  # not a float32 value
          for k, v in hf.read_safetensors(path).items()}
  hf.write_safetensors(path, wide)
  with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
  cfg["torch_dtype"] = "float64" if says == "torch_dtype" else "auto"
  with open(os.path.join(src, "config.json"), "w") as f:
    json.dump(cfg, f)
  message = _exit_message(["hf_to_orbax", f"--src={src}", f"--dst={ckpt}"])
  assert re.search(r"weights in '.*/hf' are float64, which JAX .* cannot "
                   "hold; convert them rounded to float32 with "
                   "--dtype=float32", message), message
  assert not os.path.exists(ckpt)
  with pytest.raises(ValueError, match="are float64"):
    convert.hf_to_orbax(src, ckpt)
  # Asked for: float32 values, and every label says so.
  convert.main(["hf_to_orbax", f"--src={src}", f"--dst={ckpt}",
                "--dtype=float32"])
  with open(os.path.join(ckpt, "config.json")) as f:
    assert json.load(f)["torch_dtype"] == "float32"
  restored_config, restored = convert.restore_params(ckpt)
  assert restored_config.param_dtype == "float32"
  assert {str(x.dtype) for x in jax.tree.leaves(restored)} == {"float32"}
  assert "--dtype: dtype float64" in _exit_message(
      ["orbax_to_hf", f"--src={ckpt}", f"--dst={back}", "--dtype=float64"])
  convert.main(["orbax_to_hf", f"--src={ckpt}", f"--dst={back}"])
  with open(os.path.join(back, "config.json")) as f:
    assert json.load(f)["torch_dtype"] == "float32"
  got = hf.read_safetensors(os.path.join(back, "model.safetensors"))
  for name, want in wide.items():
    assert got[name].dtype == np.float32, name
    np.testing.assert_array_equal(got[name], want.astype(np.float32),
                                  err_msg=name)


def test_an_orbax_folder_labelled_float64_is_refused(folders, tmp_path):
  # As an earlier hf_to_orbax wrote float64 weights: float32 values.
  ckpt = str(tmp_path / "orbax")
  shutil.copytree(folders[1], ckpt)
  with open(os.path.join(ckpt, "config.json")) as f:
    cfg = json.load(f)
  cfg["torch_dtype"] = "float64"
  with open(os.path.join(ckpt, "config.json"), "w") as f:
    json.dump(cfg, f)
  with pytest.raises(ValueError, match=r"the weights in '.*/orbax' are "
                     "float64, .* set torch_dtype to float32 in its "
                     "config.json"):
    convert.restore_params(ckpt)
  assert "set torch_dtype to float32 in its config.json" in _exit_message(
      ["orbax_to_hf", f"--src={ckpt}", f"--dst={tmp_path}/back"])
  assert not os.path.exists(tmp_path / "back")


@pytest.mark.parametrize("direction", ["hf_to_orbax", "orbax_to_hf"])
def test_float64_folders_are_refused_in_one_form(folders, tmp_path,
                                                 direction):
  # A source folder and an orbax folder labelled float64: one message that
  # names the folder and the dtype, each with its own fix.
  folder = str(tmp_path / "src")
  shutil.copytree(folders[0 if direction == "hf_to_orbax" else 1], folder)
  with open(os.path.join(folder, "config.json")) as f:
    cfg = json.load(f)
  cfg["torch_dtype"] = "float64"
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(cfg, f)
  message = _exit_message([direction, f"--src={folder}",
                           f"--dst={tmp_path}/out"])
  assert message.startswith(
      f"error: the weights in {folder!r} are float64, which JAX (without "
      "x64) cannot hold; "), message
  assert not os.path.exists(tmp_path / "out")


# One process of the test below (jax.distributed, gloo): process 0 alone
# fails each write, then both convert again.
_WORKER = """
import json, os, sys
from seed_jax import distributed
distributed.initialize()
import jax
from seed_jax import atomic, convert, hf
src, ckpt, out = sys.argv[1:]
me, results = jax.process_index(), {}

def attempt(name, fn):
  try:
    fn()
    results[name] = ["ok"]
  except Exception as e:
    results[name] = [type(e).__name__, str(e)]

def no_space(*args, **kwargs):
  raise OSError(28, "No space left on device (injected)")

write_text, save_pretrained = atomic.write_text, hf.save_pretrained
if me == 0:
  atomic.write_text = hf.save_pretrained = no_space
attempt("hf_to_orbax", lambda: convert.hf_to_orbax(src, f"{out}/orbax"))
attempt("orbax_to_hf", lambda: convert.orbax_to_hf(ckpt, f"{out}/hf"))
atomic.write_text, hf.save_pretrained = write_text, save_pretrained
attempt("again", lambda: convert.hf_to_orbax(src, f"{out}/orbax"))
print("RESULTS " + json.dumps(results), flush=True)
"""


def test_a_write_failing_on_process_0_fails_every_process(folders, tmp_path):
  # Process 0 alone writes config.json, the side files and the safetensors:
  # when it fails, the others raise a WriterError naming its error at once,
  # instead of waiting at the checkpoint's barrier (hf_to_orbax) or
  # reporting a conversion that did not happen (orbax_to_hf).
  procs = [subprocess.Popen(
      [sys.executable, "-c", _WORKER, *folders, str(tmp_path)],
      cwd=multihost_test.ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, env=env)
           for env in multihost_test.process_envs(2)]
  try:
    logs = [p.communicate(timeout=240)[0].decode() for p in procs]
  except subprocess.TimeoutExpired:
    pytest.fail("a process still waited after 240s")
  finally:
    for p in procs:
      p.kill()
  results = []
  for log in logs:
    lines = [l for l in log.splitlines() if l.startswith("RESULTS ")]
    assert lines, log[-3000:]
    results.append(json.loads(lines[-1][len("RESULTS "):]))
  first, second = results
  injected = "[Errno 28] No space left on device (injected)"
  assert first["hf_to_orbax"] == first["orbax_to_hf"] == ["OSError", injected]
  assert second["hf_to_orbax"] == [
      "WriterError", "process 0 failed to write config.json and the side "
      f"files of {tmp_path}/orbax: OSError: {injected}"]
  assert second["orbax_to_hf"] == [
      "WriterError", "process 0 failed to write the Hugging Face folder "
      f"{tmp_path}/hf: OSError: {injected}"]
  assert first["again"] == second["again"] == ["ok"]  # still in step
  assert sorted(os.listdir(tmp_path / "orbax")) == ["config.json", "params"]
