r"""Ahead-of-time fit check: does the train step (and the sampler) fit a pod?

Lowers and compiles `train_step.train_step` for a target mesh built from fake
CPU devices, one per chip of the topology, and `sampler.sample` as the
trainer runs it: on one chip per host, with a full copy of the parameters
(`RLTrainer.local_params`) beside that chip's shard of the training state:
the rollouts' sampler and, where the policy analyzes its own episodes, the
analyses' (the largest analysis prompt bucket, `analysis_max_new_tokens`).
It also compiles `scorer.score_dual` as the trainer scores each mini-batch
after the rollouts (old and skill log-probs in one call, the larger of its
scoring calls), beside the resident training state. It reports XLA's
per-device memory (arguments, outputs, temporaries, generated code) against
the chip's HBM, and adds the KL reference's shard to all three peaks:
`train.py` keeps a copy of the Stage-1 parameters on the mesh, sharded like
the state's, for the whole run (placed, restored and checkpointed whether or
not `kl_coef` reads it). No weights are allocated: parameters, optimizer
state and batches are `ShapeDtypeStruct`s with shardings. The KV cache is
counted in the model's compute dtype, as on an accelerator (on CPU the
sampler keeps it in float32).

  python -m seed_jax.aot --model=qwen2_5_3b --topology=v5p-8
  python -m seed_jax.aot --model=qwen2_5_7b --topology=v4-16 --mesh=1,4,2 \
      --batch=32 --micro_batches=8 --prompt_len=1024 --response_len=256

The sizes the trainer sets come from the run's `trainer.RLConfig`, read from
its gin files (`--gin_file`, default the model's experiment in `EXPERIMENTS`,
and `--gin.NAME=VALUE` bindings, as `seed_jax.train` takes them): the
mini-batch, micro-batches, response budget, remat and the analyses' budget;
`--batch`, `--micro_batches`, `--response_len`, `--max_new_tokens` and
`--no_remat` override them. So do the prompt length (the largest prompt
bucket that leaves room for the responses) and the rows of one host's
sampler call (a rollout chunk's episodes, `train.train.rollout_chunks`
chunks, default one per host of the topology; `sampler_sizes`), which
`--prompt_len` and `--sample_batch` override; the CLI prints where they
come from.

The CLI creates the fake devices itself (`jax_num_cpu_devices`, before JAX
starts). It exits 0 when the peak fits, 1 when it does not, and 2 on bad
input, which it names before compiling anything. The numbers come from the
CPU compiler's buffer assignment: close to a TPU's for arguments and outputs
(the sharded state), an estimate for temporaries (the TPU compiler fuses and
lays out differently).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import math
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from seed_jax import checkpoints
from seed_jax import gin_flags
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import rl_checks
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import scorer as scorer_lib
from seed_jax import train_step as ts
from seed_jax import trainer as trainer_lib

GIB = 1 << 30

# Hyper-parameters of the published checkpoints' config.json files.
_QWEN = dict(rms_norm_eps=1e-6, rope_theta=1_000_000.0, head_dim=128,
             bos_token_id=151643, eos_token_ids=(151645, 151643),
             pad_token_id=151643)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2_5_1_5b": dict(  # Qwen2.5-1.5B-Instruct
        _QWEN, family="qwen2", vocab_size=151936, hidden_size=1536,
        intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
        tie_embeddings=True, attention_bias=True,
        max_position_embeddings=32768),
    "qwen2_5_3b": dict(  # Qwen2.5-3B-Instruct
        _QWEN, family="qwen2", vocab_size=151936, hidden_size=2048,
        intermediate_size=11008, num_layers=36, num_heads=16, num_kv_heads=2,
        tie_embeddings=True, attention_bias=True,
        max_position_embeddings=32768),
    "qwen2_5_7b": dict(  # Qwen2.5-7B-Instruct
        _QWEN, family="qwen2", vocab_size=152064, hidden_size=3584,
        intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
        tie_embeddings=False, attention_bias=True,
        max_position_embeddings=32768),
    "qwen3_1_7b": dict(  # Qwen3-1.7B
        _QWEN, family="qwen3", vocab_size=151936, hidden_size=2048,
        intermediate_size=6144, num_layers=28, num_heads=16, num_kv_heads=8,
        tie_embeddings=True, qk_norm=True, max_position_embeddings=40960),
}


@dataclasses.dataclass(frozen=True)
class Topology:
  chips: int  # devices JAX sees (one per chip; v4/v5p TensorCores merge)
  hbm_gib: float  # per chip
  hosts: int  # VMs of 4 chips, one process each: the default rollout chunks


TOPOLOGIES = {
    "v4-8": Topology(4, 32, 1), "v4-16": Topology(8, 32, 2),
    "v4-32": Topology(16, 32, 4),
    "v5p-8": Topology(4, 95, 1), "v5p-16": Topology(8, 95, 2),
    "v5p-32": Topology(16, 95, 4), "v5p-64": Topology(32, 95, 8),
}

# How the run's sampler calls take their rows: `trainer.RLTrainer` builds
# its `rollout.Policy`s with min_rows=8 and the default max_rows (256), and
# `evaluate.evaluate_split` plays an evaluation's tasks 16 at a time
# (batch_groups), one episode each.
POLICY_MIN_ROWS, POLICY_MAX_ROWS, EVAL_BATCH_GROUPS = 8, 256, 16


# The experiment whose RL settings size each model's check by default.
EXPERIMENTS = {"tiny": "configs/experiments/tiny.gin",
               **{name: f"configs/experiments/{name}_alfworld_style.gin"
                  for name in SHAPES}}


def model_config(name: str, **overrides) -> model_lib.ModelConfig:
  """A built-in shape (`SHAPES`), or "tiny" (`testing.tiny_config` with the
  context of `testing.tiny_policy`, which configs/experiments/tiny.gin
  trains)."""
  if name == "tiny":
    from seed_jax import testing  # pylint: disable=g-import-not-at-top
    return testing.tiny_config(**{"max_position_embeddings": 2048,
                                  **overrides})
  if name not in SHAPES:
    raise ValueError(f"unknown model {name!r}; known: tiny, {sorted(SHAPES)}")
  return model_lib.ModelConfig(**{**SHAPES[name], **overrides})


def run_bindings(gin_files: Sequence[str], bindings: Sequence[str] = ()
                 ) -> dict[str, Any]:
  """The arguments `seed_jax.train` with these gin files and bindings calls
  `train.train` with (its defaults where they bind none); gin is cleared
  after.

  Raises:
    FileNotFoundError: a gin file that does not exist.
    ValueError: files or bindings that do not parse (`train.parse_gin`), or
      that bind no `train.train.rl`.
  """
  # Imported here: gin is the entry point's business, not the library's.
  import gin  # pylint: disable=g-import-not-at-top
  from seed_jax import train  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    train.parse_gin(gin_files, bindings)
    bound = gin.get_bindings(train.train)
  finally:
    gin.clear_config()
  if not isinstance(bound.get("rl"), trainer_lib.RLConfig):
    raise ValueError(f"{', '.join(gin_files)} bind no train.train.rl "
                     "(a trainer.RLConfig): not a training run's gin files")
  defaults = {name: p.default for name, p in
              inspect.signature(train.train).parameters.items()
              if p.default is not inspect.Parameter.empty}
  return {**defaults, **bound}


def run_config(gin_files: Sequence[str], bindings: Sequence[str] = ()
               ) -> trainer_lib.RLConfig:
  """The `train.train.rl` that `seed_jax.train` with these gin files and
  bindings trains with (see `run_bindings`)."""
  return run_bindings(gin_files, bindings)["rl"]


def run_shapes(rl: trainer_lib.RLConfig, context: int) -> dict[str, Any]:
  """`fit_report`'s sizes that the trainer takes from `rl`, for a model of
  `context` positions.

  Returns:
    {"batch": rl.mini_batch_size, "micro_batches", "response_len" and
     "max_new_tokens" (the rollouts' budget), "remat", "analysis": (prompt
     bucket, rl.analysis_max_new_tokens) of the self-analyses' sampler call,
     the largest bucket the analysis prompt budget fills, or None where the
     policy does not analyze itself}.

  Raises:
    ValueError: budgets that do not fit `context`
      (`rl_checks.check_prompt_budgets`).
  """
  budget = rl_checks.check_prompt_budgets(rl, context)
  analysis = None
  if rl.analyzes and rl.analyzer == "self":
    fits = rollout_lib.fitting_buckets(rl.prompt_buckets, context,
                                       rl.analysis_max_new_tokens)
    analysis = (min(b for b in fits if b >= budget),
                rl.analysis_max_new_tokens)
  return {"batch": rl.mini_batch_size, "micro_batches": rl.micro_batches,
          "response_len": rl.max_new_tokens,
          "max_new_tokens": rl.max_new_tokens, "remat": rl.remat,
          "analysis": analysis}


def _call_rows(prompts: int) -> int:
  """Rows of the largest sampler call the trainer's `rollout.Policy` makes
  for `prompts` prompts (`rollout.call_rows`)."""
  return rollout_lib.call_rows(prompts, min_rows=POLICY_MIN_ROWS,
                               max_rows=POLICY_MAX_ROWS)


def sampler_sizes(rl: trainer_lib.RLConfig, context: int, *, hosts: int = 1,
                  rollout_chunks: int | None = None, eval_tasks: int = 0
                  ) -> dict[str, Any]:
  """`fit_report`'s prompt_len and sample_batch as the run takes them.

  prompt_len: the largest of `rl.prompt_buckets` that leaves room for
  `rl.max_new_tokens` in `context` positions, which the trainer pads the
  rollouts' prompts, the train batch and the scored contexts to (the
  longest prompt picks the bucket).

  sample_batch: the rows of the largest sampler call one host makes. Each
  host plays its rollout chunks one after another (`RLTrainer.collect`): a
  chunk's first step samples all of its rl.num_groups / chunks groups x
  rl.group_size episodes (chunks: `rollout_chunks`, default one per host),
  and its analyses as many or fewer; an evaluation, min(16, eval_tasks)
  tasks at once. The rows are padded as `rollout.Policy` pads them
  (`_call_rows`).

  Example: rl.gin's 16 groups x 8 on v5p-32 (4 hosts): 4 chunks of 32
  episodes, sample_batch 32.

  Args:
    rl: the run's config; context: the model's positions.
    hosts: the topology's processes.
    rollout_chunks: `train.train`'s (None: one chunk per host).
    eval_tasks: tasks per evaluation split, 0 when the run does not
      evaluate.

  Returns:
    {"prompt_len", "sample_batch", "sources": {"prompt_len": ...,
     "sample_batch": ...}, each saying where the number comes from}.

  Raises:
    ValueError: chunks that do not split the groups over the hosts (as the
      trainer refuses them), or no bucket that leaves room for
      `rl.max_new_tokens`.
  """
  buckets = rollout_lib.fitting_buckets(rl.prompt_buckets, context,
                                        rl.max_new_tokens)
  chunks = rollout_chunks or hosts
  if rl.num_groups % chunks or chunks % hosts:
    raise ValueError(
        f"rollout_chunks={chunks} must divide num_groups={rl.num_groups} "
        f"and be a multiple of the {hosts} hosts (processes), as the "
        "trainer requires (train.train.rollout_chunks, "
        "trainer.RLConfig.num_groups)")
  episodes = rl.num_groups // chunks * rl.group_size
  evals = min(EVAL_BATCH_GROUPS, eval_tasks)
  rows = _call_rows(max(episodes, evals))
  why = (f"a rollout chunk's {episodes} episodes ({rl.num_groups} groups x "
         f"{rl.group_size} in {chunks} chunk(s) over {hosts} host(s))")
  if evals > episodes:
    why = f"an evaluation's {evals} tasks (more than {why})"
  return {"prompt_len": max(buckets), "sample_batch": rows, "sources": {
      "prompt_len": (f"the largest of RLConfig.prompt_buckets="
                     f"{tuple(rl.prompt_buckets)} that leaves room for "
                     f"max_new_tokens={rl.max_new_tokens} in {context} "
                     "positions"),
      "sample_batch": (f"{why}, in calls of {POLICY_MIN_ROWS} x a power of "
                       f"two rows, at most {POLICY_MAX_ROWS}")}}


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-device bytes of one compiled program."""
  argument: int
  output: int
  alias: int  # outputs that reuse donated arguments
  temp: int
  code: int

  @property
  def peak(self) -> int:
    return self.argument + self.output - self.alias + self.temp + self.code

  @classmethod
  def of(cls, compiled) -> "Memory":
    m = compiled.memory_analysis()
    return cls(m.argument_size_in_bytes, m.output_size_in_bytes,
               m.alias_size_in_bytes, m.temp_size_in_bytes,
               m.generated_code_size_in_bytes)


def _sds(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def compile_train_step(config, mesh, *, batch: int, prompt_len: int,
                       response_len: int, micro_batches: int = 1,
                       remat: bool = True):
  """The SEED train step (`trainer.RLConfig` loss defaults), compiled.

  Raises:
    ValueError: a batch the trainer would refuse on this mesh.
  """
  partitioning.check_batch_split(mesh, batch, micro_batches)
  tx = ts.make_optimizer(1e-6)
  psh = partitioning.param_shardings(config, mesh)
  ssh = ts.state_shardings(tx, psh, mesh)
  state = ts.abstract_state(tx, config, ssh)
  rows = partitioning.batch_sharding(mesh, 1)
  B, P, R = batch, prompt_len, response_len
  f32, i32 = jnp.float32, jnp.int32
  mb = {"prompts": _sds((B, P), i32, rows),
        "prompt_mask": _sds((B, P), i32, rows),
        "responses": _sds((B, R), i32, rows),
        "response_mask": _sds((B, R), i32, rows),
        "analyzed": _sds((B,), jnp.bool_, rows)}
  for k in ("old_logp", "ref_logp", "skill_logp", "advantages"):
    mb[k] = _sds((B, R), f32, rows)
  loss_fn = functools.partial(ts.rl_loss, config=config, remat=remat,
                              **trainer_lib.RLConfig().loss_kwargs())
  step = ts.jit_train_step(tx, loss_fn, num_micro_batches=micro_batches,
                           state_shardings=ssh, batch_shardings=rows,
                           metrics_sharding=partitioning.replicated(mesh))
  return step.lower(state, mb).compile()


def compile_scorer(config, mesh, *, batch: int, prompt_len: int,
                   response_len: int):
  """`scorer.score_dual` as `RLTrainer.build_batch` runs it: parameters
  sharded like the state's, `batch` rows (a mini-batch) over the data axes,
  both contexts padded to `prompt_len`; compiled."""
  psh = partitioning.param_shardings(config, mesh)
  params = checkpoints.abstract_tree(model_lib.param_shapes(config), psh)
  rows = partitioning.batch_sharding(mesh, 2)
  rep = partitioning.replicated(mesh)
  at = dict(config=config, temperature=trainer_lib.RLConfig().temperature)
  dual = jax.jit(lambda p, *a: scorer_lib.score_dual(p, *a, **at),
                 in_shardings=(psh,) + (rows,) * 6, out_shardings=(rep, rep))
  i32 = jnp.int32
  prompt = _sds((batch, prompt_len), i32, rows)
  response = _sds((batch, response_len), i32, rows)
  return dual.lower(params, prompt, prompt, prompt, prompt, response,
                    response).compile()


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded `ShapeDtypeStruct`s."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def compile_sampler(config, device: jax.Device, *, batch: int,
                    prompt_len: int, max_new_tokens: int):
  """`sampler.sample` (temperature 1) as the trainer calls it: every
  parameter on one `device`, a host's `batch` rows; compiled."""
  one = jax.sharding.SingleDeviceSharding(device)
  shapes = model_lib.param_shapes(config)
  params = checkpoints.abstract_tree(shapes,
                                     jax.tree.map(lambda _: one, shapes))
  key = jax.eval_shape(lambda: jax.random.key(0))
  return sampler_lib.sample.lower(
      params, _sds((batch, prompt_len), jnp.int32, one),
      _sds((batch, prompt_len), jnp.int32, one),
      _sds(key.shape, key.dtype, one), config=config,
      max_new_tokens=max_new_tokens, sampling=sampler_lib.Temperature(1.0),
      eos_ids=tuple(config.eos_token_ids), pad_id=config.pad_token_id or 0,
      live=_sds((batch,), jnp.bool_, one),
      cache_dtype=jnp.dtype(config.dtype).name).compile()


def fit_report(config: model_lib.ModelConfig, *, topology: str,
               batch: int, micro_batches: int, response_len: int,
               max_new_tokens: int, remat: bool,
               analysis: tuple[int, int] | None = None,
               mesh_shape: Sequence[int] = (1, -1, 1),
               prompt_len: int = 1024, sample_batch: int = 128,
               hbm_gib: float | None = None,
               devices: Sequence[jax.Device] | None = None,
               reference: bool = True) -> dict[str, Any]:
  """Compiles the programs for `topology` and compares memory with HBM.

  The sizes the trainer takes from its `RLConfig` (batch, micro_batches,
  response_len, max_new_tokens, remat, analysis) are `run_shapes(rl, ...)`.

  Args:
    config: the model.
    topology: a `TOPOLOGIES` name; its chip count sets the mesh size.
    batch: rows per optimizer step (the mini-batch), micro_batches of it
      at a time; prompt_len/response_len: the padded lengths.
    max_new_tokens: the rollouts' decode budget.
    remat: rematerialize decoder blocks in the backward pass.
    analysis: (prompt length, decode budget) of the self-analyses' sampler
      call, or None (no self-analysis).
    mesh_shape: (data, fsdp, tensor), one size may be -1.
    sample_batch: rows of one host's sampler call (its share of a rollout's
      rows, padded to a power of two), the analyses' as the rollouts'.
    hbm_gib: per-chip memory (default the topology's).
    devices: the devices to use (default the first `chips` of this host).
    reference: count the KL reference's parameter shard, which `train.py`
      keeps on the mesh for the whole run, in every peak.

  Returns:
    {"topology", "mesh", "hbm_bytes", "train_step": Memory,
     "reference": per-device bytes of the reference parameters (0 without),
     "train_peak" (the train step's peak plus the reference),
     "sampler": Memory (on one chip, the full parameters among its
     arguments), "analyst": the analyses' sampler Memory, or None,
     "rollout_peak" (that chip's training-state shard, which stays
     resident, plus the reference's shard and the larger sampler peak),
     "scorer": Memory (`score_dual` over the mesh on a mini-batch),
     "scoring_peak" (the optimizer state and reference shards beside it;
     its arguments hold the parameters), "fits": bool (all three peaks fit)}.

  Raises:
    ValueError: fewer devices than the topology's chips; a mesh that
      cannot shard the parameters (`partitioning.param_shardings`).
  """
  topo = TOPOLOGIES[topology]
  devices = list(devices if devices is not None else jax.devices())
  if len(devices) < topo.chips:
    raise ValueError(
        f"{topology} needs {topo.chips} devices, {len(devices)} available: "
        "run `python -m seed_jax.aot` (it creates them) or set "
        f"jax_num_cpu_devices={topo.chips} before JAX starts")
  mesh = partitioning.make_mesh(mesh_shape, devices[:topo.chips])
  train = Memory.of(compile_train_step(
      config, mesh, batch=batch, prompt_len=prompt_len,
      response_len=response_len, micro_batches=micro_batches, remat=remat))
  sample = Memory.of(compile_sampler(
      config, devices[0], batch=sample_batch, prompt_len=prompt_len,
      max_new_tokens=max_new_tokens))
  analyst = None if analysis is None else Memory.of(compile_sampler(
      config, devices[0], batch=sample_batch, prompt_len=analysis[0],
      max_new_tokens=analysis[1]))
  score = Memory.of(compile_scorer(
      config, mesh, batch=batch, prompt_len=prompt_len,
      response_len=response_len))
  tx = ts.make_optimizer(1e-6)
  psh = partitioning.param_shardings(config, mesh)
  params = per_device_bytes(checkpoints.abstract_tree(
      model_lib.param_shapes(config), psh))
  state = per_device_bytes(ts.abstract_state(
      tx, config, ts.state_shardings(tx, psh, mesh)))
  # The reference: a second copy of the parameters, sharded like the
  # state's, resident on every chip from the start of the run to its end.
  ref = params if reference else 0
  # The train step's arguments are the state shard (and one micro-batch):
  # the state stays on the chip while it samples and while it scores.
  rollout = train.argument + ref + max(
      sample.peak, analyst.peak if analyst else 0)
  scoring = state - params + ref + score.peak
  train_peak = train.peak + ref
  hbm = int((topo.hbm_gib if hbm_gib is None else hbm_gib) * GIB)
  return {"topology": topology, "mesh": dict(mesh.shape), "hbm_bytes": hbm,
          "train_step": train, "reference": ref, "train_peak": train_peak,
          "sampler": sample, "analyst": analyst, "rollout_peak": rollout,
          "scorer": score, "scoring_peak": scoring,
          "fits": max(train_peak, rollout, scoring) <= hbm}


def _size(n: int) -> str:
  return f"{n / GIB:.2f} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.1f} MiB"


def format_report(report: dict[str, Any]) -> str:
  """A table of per-device memory and the verdict."""
  lines = [f"{report['topology']}: mesh {report['mesh']}, "
           f"{report['hbm_bytes'] / GIB:.0f} GiB per chip",
           f"{'per device':11s}" + "".join(
               f"{h:>12s}" for h in ("arguments", "outputs", "aliased",
                                     "temp", "code", "peak"))]
  for name in ("train_step", "sampler", "analyst", "scorer"):
    m = report[name]
    if m is None:  # no self-analysis
      continue
    vals = (m.argument, m.output, m.alias, m.temp, m.code, m.peak)
    lines.append(f"{name:11s}" + "".join(f"{_size(v):>12s}" for v in vals))
  ref = report["reference"]
  plus = f" + the KL reference's shard ({_size(ref)})" if ref else ""
  lines.append(f"train step: its peak{plus} = {_size(report['train_peak'])}")
  which = "the larger sampler's" if report["analyst"] else "the sampler's"
  lines.append(f"rollout, on the chip that samples: its state shard{plus} + "
               f"{which} peak (full parameters) = "
               f"{_size(report['rollout_peak'])}")
  lines.append(f"scoring: the optimizer state's shard{plus} + the scorer's "
               f"peak (the parameters' shard) = "
               f"{_size(report['scoring_peak'])}")
  lines.append("fits" if report["fits"] else "does NOT fit")
  return "\n".join(lines)


DTYPES = ("float32", "bfloat16", "float16")


def _positive(kind):
  def parse(text):
    value = kind(text)
    if not (math.isfinite(value) and value > 0):
      raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
  return parse


def _mesh(text):
  try:
    return partitioning.parse_mesh(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def parse_flags(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", required=True, choices=["tiny", *sorted(SHAPES)])
  p.add_argument("--topology", required=True, choices=sorted(TOPOLOGIES))
  p.add_argument("--mesh", type=_mesh, default=(1, -1, 1),
                 help="data,fsdp,tensor (default 1,-1,1)")
  p.add_argument("--gin_file", action="append", default=None,
                 help="the run's gin file(s), whose trainer.RLConfig sizes "
                 "the check (default the model's experiment: EXPERIMENTS)")
  p.add_argument("--gin", action="append", default=[], metavar="BINDING",
                 help="a gin binding, also as --gin.NAME=VALUE")
  count = _positive(int)
  run = " (default the run's RLConfig's)"
  p.add_argument("--batch", type=count, default=None,
                 help="rows per optimizer step" + run)
  p.add_argument("--micro_batches", type=count, default=None,
                 help="micro-batches per optimizer step" + run)
  p.add_argument("--prompt_len", type=count, default=None,
                 help="the padded prompt length (default the run's largest "
                 "prompt bucket that leaves room for its responses)")
  p.add_argument("--response_len", type=count, default=None,
                 help="the train batch's response length" + run)
  p.add_argument("--sample_batch", type=count, default=None,
                 help="rows of one host's sampler call (default the run's: "
                 "a rollout chunk's episodes, padded as the sampler pads "
                 "them)")
  p.add_argument("--max_new_tokens", type=count, default=None,
                 help="the rollouts' decode budget" + run)
  p.add_argument("--param_dtype", default="float32", choices=DTYPES)
  p.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                 help="compute dtype")
  p.add_argument("--no_remat", action="store_true",
                 help="check without remat, whatever the run's RLConfig says")
  p.add_argument("--hbm_gib", type=_positive(float), default=None,
                 help="memory per chip (default the topology's)")
  # --gin.NAME=VALUE too, as seed_jax.train takes them, in their order.
  args, rest = p.parse_known_args(gin_flags.in_order(argv))
  for arg in rest:
    p.error(f"unrecognized argument "
            f"{gin_flags.as_written(arg, argv)!r}")
  return args


def cli_shapes(args: argparse.Namespace, context: int
               ) -> tuple[dict[str, Any], dict[str, str]]:
  """`fit_report`'s sizes for these flags: the run's (`run_shapes`,
  `sampler_sizes` on the topology's hosts), less those the flags set.

  Returns:
    (sizes, {"prompt_len": where it comes from, "sample_batch": ...}).

  Raises:
    FileNotFoundError, ValueError: gin files the run could not start with
      (`run_bindings`, `run_shapes`, `sampler_sizes`), or a prompt and
      response longer than `context`.
  """
  files = args.gin_file or [EXPERIMENTS[args.model]]
  run = run_bindings(files, args.gin)
  rl = run["rl"]
  shapes = run_shapes(rl, context)
  sampled = sampler_sizes(
      rl, context, hosts=TOPOLOGIES[args.topology].hosts,
      rollout_chunks=run["rollout_chunks"],
      eval_tasks=run["eval_tasks"] if run["eval_every"] else 0)
  run_of = f" (the run of {', '.join(files)}{' and --gin' if args.gin else ''})"
  sources = {k: sampled["sources"][k] + run_of
             for k in ("prompt_len", "sample_batch")}
  for flag in ("batch", "micro_batches", "response_len", "max_new_tokens",
               "prompt_len", "sample_batch"):
    if getattr(args, flag) is not None:
      shapes[flag] = getattr(args, flag)
      sources[flag] = f"--{flag}"
    elif flag in sampled:
      shapes[flag] = sampled[flag]
  if args.no_remat:
    shapes["remat"] = False
  for budget in ("response_len", "max_new_tokens"):
    n = shapes["prompt_len"] + shapes[budget]
    if n > context:
      names = " + ".join(f"--{f}" if getattr(args, f) is not None else f
                         for f in ("prompt_len", budget))
      raise ValueError(f"{names} = {n} exceeds {args.model}'s context of "
                       f"{context} positions")
  return shapes, {k: sources[k] for k in ("prompt_len", "sample_batch")}


def main(argv=None) -> int:
  """Prints the report; 0 when it fits, 1 when not, 2 on bad input."""
  args = parse_flags(sys.argv[1:] if argv is None else argv)
  chips = TOPOLOGIES[args.topology].chips
  try:  # the fake devices, before JAX starts
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", chips)
  except RuntimeError:
    pass  # already started (a test): fit_report checks the count
  config = model_config(args.model, param_dtype=args.param_dtype,
                        dtype=args.dtype)
  context = config.max_position_embeddings
  try:  # before any compilation
    shapes, sources = cli_shapes(args, context)
    for flag, source in sources.items():
      print(f"{flag} {shapes[flag]}: {source}", flush=True)
    report = fit_report(config, topology=args.topology, mesh_shape=args.mesh,
                        hbm_gib=args.hbm_gib, **shapes)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"{args.model}: {config.num_layers} layers, hidden "
        f"{config.hidden_size}, params {args.param_dtype}, compute "
        f"{args.dtype}")
  print(format_report(report))
  return 0 if report["fits"] else 1


if __name__ == "__main__":
  sys.exit(main())
