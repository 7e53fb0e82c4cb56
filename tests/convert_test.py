"""Hugging Face folder -> sharded orbax checkpoint -> Hugging Face folder."""

import json
import os

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from seed_jax import convert
from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import testing


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
