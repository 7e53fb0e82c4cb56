"""Micro-batch layout of the train step: strided rows against contiguous ones.

Usage: python benchmarks/micro_batch_layout.py [--devices 8] [--mesh 8,1,1]
         [--batch 32] [--micro-batches 4] [--rounds 5] [--out PATH]

The batch is sharded over the data-parallel devices in contiguous blocks.
`train_step` splits it into n micro-batches, micro-batch j holding rows j,
j + n, j + 2n, ... (strided): each takes its rows from every block and runs on
every device where they are. The layout before (micro-batch j holding rows
j * B / n, j * B / n + 1, ..., contiguous) put each micro-batch on a fraction
of the devices, and XLA moved rows between devices to run it. For one model on a fake CPU mesh
this compiles both steps (`aot.compile_train_step`), counts their collectives
and times them, interleaved, on the same state and batch. CPU "devices" share
memory, so the time ratio understates what a row all-gather costs across
accelerators; the counts are what carries over.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

from seed_jax import atomic  # jax-free: the XLA flags are set later


def _contiguous(batch, n):
  """The former layout: micro-batch j holds rows j * B / n, ..."""
  import jax  # pylint: disable=g-import-not-at-top

  def split(x):
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(split, batch)


def _collectives(hlo: str) -> dict[str, int]:
  ops = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
         "reduce-scatter")
  return {op: len(re.findall(rf"= [^=]*? {op}(?:-start)?\(", hlo))
          for op in ops}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--mesh", default="8,1,1", help="data,fsdp,tensor")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--micro-batches", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=128)
  parser.add_argument("--response-len", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results",
      "micro_batch_layout.json"))
  args = parser.parse_args()
  for name in ('devices', 'batch', 'micro_batches', 'prompt_len',
               'response_len', 'rounds'):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be at least 1, "
                   f"got {getattr(args, name)}")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count="
                             f"{args.devices}")
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from seed_jax import aot  # pylint: disable=g-import-not-at-top
  from seed_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from seed_jax import partitioning  # pylint: disable=g-import-not-at-top
  from seed_jax import testing  # pylint: disable=g-import-not-at-top
  from seed_jax import train_step as ts  # pylint: disable=g-import-not-at-top

  config = testing.tiny_config(
      vocab_size=2048, hidden_size=256, intermediate_size=512, num_layers=4,
      num_heads=8, num_kv_heads=4, head_dim=32,
      max_position_embeddings=args.prompt_len + args.response_len)
  mesh = partitioning.make_mesh(tuple(int(s) for s in args.mesh.split(",")))
  kw = dict(batch=args.batch, prompt_len=args.prompt_len,
            response_len=args.response_len, micro_batches=args.micro_batches)
  strided_split = ts._split_micro  # pylint: disable=protected-access
  compiled = {"strided": aot.compile_train_step(config, mesh, **kw)}
  ts._split_micro = _contiguous  # pylint: disable=protected-access
  try:
    compiled["contiguous"] = aot.compile_train_step(config, mesh, **kw)
  finally:
    ts._split_micro = strided_split  # pylint: disable=protected-access

  # One state and batch, placed as the compiled steps expect.
  tx = ts.make_optimizer(1e-6)
  ssh = ts.state_shardings(tx, partitioning.param_shardings(config, mesh),
                           mesh)
  params = model_lib.init_params(config, jax.random.key(0))
  rng = np.random.default_rng(0)
  B, P, R = args.batch, args.prompt_len, args.response_len
  host = {"prompts": rng.integers(3, config.vocab_size, (B, P), np.int32),
          "prompt_mask": np.ones((B, P), np.int32),
          "responses": rng.integers(3, config.vocab_size, (B, R), np.int32),
          "response_mask": np.ones((B, R), np.int32),
          "analyzed": np.arange(B) % 2 == 0}
  for k in ("old_logp", "ref_logp", "skill_logp"):
    host[k] = np.full((B, R), -7.0, np.float32)
  host["advantages"] = rng.standard_normal((B, R)).astype(np.float32)
  batch = partitioning.shard_batch(host, mesh)

  create = jax.jit(lambda p: ts.TrainState.create(p, tx), out_shardings=ssh)
  states = {name: create(params) for name in compiled}  # one each: donated
  times = {name: [] for name in compiled}
  for name, step in compiled.items():  # warm-up
    states[name], m = step(states[name], batch)
    jax.block_until_ready(m)
  for r in range(args.rounds):
    for name, step in (compiled.items() if r % 2 == 0
                       else reversed(compiled.items())):
      t = time.perf_counter()
      states[name], m = step(states[name], batch)
      jax.block_until_ready((states[name], m))
      times[name].append(time.perf_counter() - t)
    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
        f"{n} {times[n][-1]:.3f} s" for n in compiled), file=sys.stderr)

  result = {
      "mesh": dict(mesh.shape), "devices": jax.device_count(),
      "platform": jax.devices()[0].platform,
      "config": {"hidden_size": config.hidden_size,
                 "num_layers": config.num_layers,
                 "vocab_size": config.vocab_size},
      "batch": B, "micro_batches": args.micro_batches,
      "prompt_len": P, "response_len": R, "rounds": args.rounds,
      "layouts": {
          name: {"collectives": _collectives(step.as_text()),
                 "median_step_s": statistics.median(times[name]),
                 "temp_bytes": aot.Memory.of(step).temp}
          for name, step in compiled.items()},
  }
  result["strided_over_contiguous_time"] = (
      result["layouts"]["strided"]["median_step_s"] /
      result["layouts"]["contiguous"]["median_step_s"])
  atomic.write_text(args.out, json.dumps(result, indent=1))
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
