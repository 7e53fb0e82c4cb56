r"""Hugging Face folder <-> sharded orbax checkpoint of the parameters.

  python -m seed_jax.convert hf_to_orbax --src=/models/Qwen2.5-3B-Instruct \
      --dst=/ckpt/qwen2_5_3b --mesh=1,-1,1
  python -m seed_jax.convert orbax_to_hf --src=/ckpt/qwen2_5_3b \
      --dst=/models/qwen2_5_3b_back --dtype=bfloat16

The orbax side is a folder with `config.json` (Hugging Face keys), the
parameters under `params/` (an orbax PyTree checkpoint: every process writes
and reads only its shards) and the folder's other small files (tokenizer,
generation config) copied as they are. Each tensor is placed with its
sharding as it is read, so no device ever holds more than its shards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Sequence

from etils import epath
import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp

from seed_jax import checkpoints
from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import partitioning

PARAMS = "params"
# Weights in any format, their indexes and leftovers: copied along, a
# loader could read them instead of the converted weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5",
                    ".msgpack", ".ckpt", ".index.json", ".tmp")


def _side_files(folder: str) -> list[str]:
  """Tokenizer and other small files: everything but weights and config."""
  return sorted(
      n for n in os.listdir(folder)
      if os.path.isfile(os.path.join(folder, n)) and n != "config.json"
      and not n.endswith(_WEIGHT_SUFFIXES))


def _copy_side_files(src: str, dst: str) -> None:
  if jax.process_index() != 0:
    return
  os.makedirs(dst, exist_ok=True)
  for name in _side_files(src):
    shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


def hf_to_orbax(src: str, dst: str, *, mesh_shape: Sequence[int] = (1, -1, 1)
                ) -> model_lib.ModelConfig:
  """Reads a Hugging Face folder onto a mesh and saves it with orbax.

  Raises:
    FileExistsError: when `dst/params` already exists.
  """
  target = epath.Path(dst).absolute() / PARAMS  # orbax wants absolute paths
  if target.exists():
    raise FileExistsError(f"{target} exists; choose another destination")
  config = hf.load_config(src)
  mesh = partitioning.make_mesh(mesh_shape)
  shardings = partitioning.param_shardings(config, mesh)
  config, params = hf.load_pretrained(src, shardings=shardings)
  # The small files first and the parameters last: an interrupted run leaves
  # no `params`, so the same command can run again.
  _copy_side_files(src, dst)
  if jax.process_index() == 0:
    with open(os.path.join(dst, "config.json"), "w") as f:
      json.dump(config.to_hf(), f, indent=1)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(target, params)
  return config


def restore_params(src: str, *, mesh_shape: Sequence[int] = (1, -1, 1),
                   **overrides):
  """(config, params) of an orbax parameter folder, sharded on a new mesh."""
  config = hf.load_config(src, **overrides)
  mesh = partitioning.make_mesh(mesh_shape)
  abstract = checkpoints.abstract_tree(
      model_lib.param_shapes(config),
      partitioning.param_shardings(config, mesh))
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(epath.Path(src).absolute() / PARAMS, abstract)
  return config, params


def orbax_to_hf(src: str, dst: str, *, mesh_shape: Sequence[int] = (1, -1, 1),
                dtype: str | None = None) -> model_lib.ModelConfig:
  """Restores an orbax parameter folder and writes a Hugging Face folder.

  Args:
    src: a folder written by `hf_to_orbax`.
    dst: the Hugging Face folder to write (safetensors shards, config.json,
      the side files).
    mesh_shape: the mesh to restore onto.
    dtype: the safetensors dtype (default the parameters').
  """
  config, params = restore_params(src, mesh_shape=mesh_shape)
  if jax.process_count() > 1:  # a collective: whole tensors on every host
    params = multihost_utils.process_allgather(params, tiled=True)
  if jax.process_index() == 0:  # the only writer
    hf.save_pretrained(dst, config, params, dtype=dtype)
  _copy_side_files(src, dst)
  return config


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("direction", choices=("hf_to_orbax", "orbax_to_hf"))
  p.add_argument("--src", required=True)
  p.add_argument("--dst", required=True)
  p.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor")
  p.add_argument("--dtype", default=None,
                 help="orbax_to_hf: safetensors dtype, e.g. bfloat16")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  from seed_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize()
  mesh = tuple(int(s) for s in args.mesh.split(","))
  if args.direction == "hf_to_orbax":
    config = hf_to_orbax(args.src, args.dst, mesh_shape=mesh)
  else:
    config = orbax_to_hf(args.src, args.dst, mesh_shape=mesh, dtype=args.dtype)
  print(f"{args.direction}: {config.family}, {config.num_layers} layers, "
        f"hidden {config.hidden_size} -> {args.dst}")


if __name__ == "__main__":
  main()
