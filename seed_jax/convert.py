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

The parameters keep the weights' dtype unless --dtype says otherwise. JAX
(without x64) has no float64: float64 weights are refused unless --dtype
names another dtype (e.g. `hf_to_orbax --dtype=float32`, which rounds them
and records float32 in the orbax config.json), and float64 is never written.

On several processes (`seed_jax.distributed`) every process reads and writes
its shards; process 0 alone writes the small files and the Hugging Face
safetensors, and tells the others how that went: when it fails, every
process raises (the others a `WriterError`), none waits for it.
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

from seed_jax import atomic
from seed_jax import checkpoints
from seed_jax import distributed
from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import partitioning

PARAMS = "params"
# Weights in any format, their indexes and leftovers: copied along, a
# loader could read them instead of the converted weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5",
                    ".msgpack", ".ckpt", ".index.json", ".tmp")
# The dtypes parameters are converted to and orbax_to_hf writes: the floats
# safetensors stores but float64, which JAX (without x64) cannot hold.
DTYPES = hf.PARAM_DTYPES


class WriterError(RuntimeError):
  """Process 0 failed to write the files of a conversion (on the others)."""


def _on_writer(fn, what: str) -> None:
  """Runs `fn()` on process 0 alone, every process told how it went.

  A collective: every process calls it.

  Raises:
    what `fn` raised, on process 0; on the others a `WriterError` naming
    `what` and that error.
  """
  error, failure = distributed.on_writer(fn)
  if error is not None:
    raise error
  if failure is not None:
    raise WriterError(f"process 0 failed to write {what}: {failure[1]}")


def _side_files(folder: str) -> list[str]:
  """Tokenizer and other small files: everything but weights and config."""
  return sorted(
      n for n in os.listdir(folder)
      if os.path.isfile(os.path.join(folder, n)) and n != "config.json"
      and not n.endswith(_WEIGHT_SUFFIXES))


def _copy_side_files(src: str, dst: str) -> None:
  os.makedirs(dst, exist_ok=True)
  for name in _side_files(src):
    shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


def check_source(src: str, *, orbax: bool = False) -> None:
  """Raises unless `src` is a model folder (an orbax one when `orbax`).

  Raises:
    FileNotFoundError: naming the folder and what it lacks.
  """
  if not os.path.isdir(src):
    raise FileNotFoundError(f"source {src!r} is not a folder")
  if not os.path.isfile(os.path.join(src, "config.json")):
    raise FileNotFoundError(f"no config.json in source folder {src!r}")
  if orbax and not os.path.isdir(os.path.join(src, PARAMS)):
    raise FileNotFoundError(f"no {PARAMS}/ in source folder {src!r}; is it "
                            "a folder written by hf_to_orbax?")


def check_destination(dst: str, *, src: str | None = None) -> None:
  """Raises before any work when `dst` cannot become the output folder.

  Paths are compared with links resolved: a link to the source is the source.

  Raises:
    NotADirectoryError: when `dst`, or a folder above it, is a file.
    PermissionError: when the folder that would hold `dst` is read-only.
    ValueError: when `dst` is `src` or lies inside it.
  """
  path = os.path.abspath(dst)
  if src is not None:
    real, real_src = os.path.realpath(dst), os.path.realpath(src)
    if real == real_src:
      raise ValueError(f"destination {dst!r} is the source folder"
                       + ("" if path == os.path.abspath(src)
                          else f" ({real} through a link)"))
    if os.path.commonpath([real, real_src]) == real_src:
      raise ValueError(f"destination {dst!r} lies inside the source folder "
                       f"{src!r}")
  if os.path.exists(path) and not os.path.isdir(path):
    raise NotADirectoryError(f"destination {dst!r} is a file, not a folder")
  parent = path
  while not os.path.exists(parent):  # the nearest existing folder above
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise NotADirectoryError(f"destination {dst!r} lies under the file "
                             f"{parent!r}")
  if not os.access(parent, os.W_OK):
    raise PermissionError(f"destination {dst!r}: folder {parent!r} is not "
                          "writable")


def check_weights_dtype(dtype: str, folder: str, fix: str) -> None:
  """Raises ValueError unless the weights of `folder`, `dtype`, can be held
  (one of `DTYPES`), naming the folder, the dtype and `fix`."""
  if dtype not in DTYPES:
    raise ValueError(f"the weights in {folder!r} are {dtype}, which JAX "
                     f"(without x64) cannot hold; {fix}")


def check_dtype(dtype: str | None) -> None:
  """Raises ValueError unless `dtype` is None or one of `DTYPES` (float64:
  saying why, `hf.check_param_dtype`)."""
  if dtype == "float64":
    hf.check_param_dtype(dtype, "dtype")
  if dtype is not None and dtype not in DTYPES:
    raise ValueError(f"dtype {dtype!r} cannot hold the weights; choose one "
                     f"of {', '.join(DTYPES)}")


def source_dtype(src: str, dtype: str | None = None) -> str:
  """The dtype `hf_to_orbax` converts the weights of `src` to.

  `dtype` when given, else the weights' (`hf.weights_dtype`; float32 when
  the folder does not tell).

  Raises:
    ValueError: the weights are float64 and no `dtype` is given: JAX cannot
      hold them; the message says to pass float32.
  """
  if dtype is not None:
    return dtype
  found = hf.weights_dtype(src) or "float32"
  check_weights_dtype(
      found, src, "convert them rounded to float32 with --dtype=float32 "
      "(dtype='float32'): the orbax config.json then says float32")
  return found


def hf_to_orbax(src: str, dst: str, *, mesh_shape: Sequence[int] = (1, -1, 1),
                dtype: str | None = None) -> model_lib.ModelConfig:
  """Reads a Hugging Face folder onto a mesh and saves it with orbax.

  Args:
    src: a Hugging Face folder (config.json, safetensors).
    dst: the orbax folder to write (`config.json`, `params/`, side files).
    mesh_shape: the mesh to read onto.
    dtype: the parameters' dtype, one of `DTYPES` (default the weights':
      config.json's dtype or torch_dtype, else the safetensors'). Float64
      weights need one (float32): they are refused without it. The orbax
      config.json records the dtype the parameters are saved in.

  Raises:
    FileExistsError: when `dst/params` already exists.
    FileNotFoundError, NotADirectoryError, PermissionError, ValueError: as
      `check_dtype`, `check_source`, `check_destination` and
      `source_dtype`, before the model is read.
    WriterError: on the other processes, when process 0 fails to write the
      side files or config.json (it raises its own error), before `params`.
  """
  check_dtype(dtype)
  check_source(src)
  check_destination(dst, src=src)
  target = epath.Path(dst).absolute() / PARAMS  # orbax wants absolute paths
  if target.exists():
    raise FileExistsError(f"{target} exists; choose another destination")
  dtype = source_dtype(src, dtype)
  mesh = partitioning.make_mesh(mesh_shape)
  # The config as loaded (a tied config.json may load untied) is sharded.
  config, params = hf.load_pretrained(
      src, shardings=lambda c: partitioning.param_shardings(c, mesh),
      param_dtype=dtype)
  # The small files first and the parameters last: an interrupted run leaves
  # no `params`, so the same command can run again.
  def write():
    _copy_side_files(src, dst)
    atomic.write_text(os.path.join(dst, "config.json"),
                      json.dumps(config.to_hf(), indent=1))

  _on_writer(write, f"config.json and the side files of {dst}")
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(target, params)
  return config


def restore_params(src: str, *, mesh_shape: Sequence[int] = (1, -1, 1),
                   **overrides):
  """(config, params) of an orbax parameter folder, sharded on a new mesh.

  The parameters keep the dtype config.json's torch_dtype names (the one
  `hf_to_orbax` saved them in) unless `overrides` give a `param_dtype`.

  Raises:
    ValueError: the dtype is float64 (JAX cannot hold it): a folder written
      by an earlier hf_to_orbax, whose parameters are float32, says float64
      (`check_weights_dtype`).
  """
  if "param_dtype" not in overrides:
    found = hf.weights_dtype(src) or "float32"
    check_weights_dtype(
        found, src, "an earlier hf_to_orbax saved them as float32 under that "
        "label: set torch_dtype to float32 in its config.json")
    overrides["param_dtype"] = found
  hf.check_param_dtype(overrides["param_dtype"], "param_dtype")
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
    dtype: the safetensors dtype, one of `DTYPES` (default the parameters').

  Raises:
    FileNotFoundError, NotADirectoryError, PermissionError, ValueError: as
      `check_dtype`, `check_source` and `check_destination`, before anything
      is read or written.
    WriterError: on the other processes, when process 0 fails to write the
      Hugging Face folder (it raises its own error).
  """
  check_dtype(dtype)
  check_source(src, orbax=True)
  check_destination(dst, src=src)
  config, params = restore_params(src, mesh_shape=mesh_shape)
  if jax.process_count() > 1:  # a collective: whole tensors on every host
    params = multihost_utils.process_allgather(params, tiled=True)

  def write():
    hf.save_pretrained(dst, config, params, dtype=dtype)
    _copy_side_files(src, dst)

  _on_writer(write, f"the Hugging Face folder {dst}")
  return config


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
  """The flags of `main`, checked before any device starts.

  Raises:
    ValueError, FileNotFoundError, NotADirectoryError, PermissionError: a
      bad --mesh or --dtype, a --src that is no model folder, a --dst that
      cannot be written.
  """
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("direction", choices=("hf_to_orbax", "orbax_to_hf"))
  p.add_argument("--src", required=True)
  p.add_argument("--dst", required=True)
  p.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor")
  p.add_argument("--dtype", default=None,
                 help=f"the dtype written, one of {DTYPES} (default the "
                 "weights'; float64 weights need --dtype=float32)")
  args = p.parse_args(argv)
  args.mesh = partitioning.parse_mesh(args.mesh)
  try:
    check_dtype(args.dtype)
  except ValueError as e:
    raise ValueError(f"--dtype: {e}") from None
  check_source(args.src, orbax=args.direction == "orbax_to_hf")
  check_destination(args.dst, src=args.src)
  if args.direction == "hf_to_orbax":
    source_dtype(args.src, args.dtype)  # float64 weights need --dtype
  return args


def main(argv=None) -> None:
  """Converts; bad flags or folders exit with one `error: ...` line."""
  try:
    args = parse_flags(sys.argv[1:] if argv is None else argv)
    distributed.initialize()
    convert = hf_to_orbax if args.direction == "hf_to_orbax" else orbax_to_hf
    config = convert(args.src, args.dst, mesh_shape=args.mesh,
                     dtype=args.dtype)
  except KeyError as e:  # a tensor missing from the source
    raise SystemExit(f"error: {e.args[0]}") from None
  except (OSError, ValueError, WriterError) as e:
    raise SystemExit(f"error: {e}") from None
  print(f"{args.direction}: {config.family}, {config.num_layers} layers, "
        f"hidden {config.hidden_size} -> {args.dst}")


if __name__ == "__main__":
  main()
