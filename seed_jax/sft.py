"""Supervised fine-tuning on (prompt -> response) records, and its evaluation.

`sft` trains the policy on records with "prompt" and "response" fields
(Stage 1's analysis records, `stage1.read_dataset`, or the demo's warm-start
records), the loss on response tokens only; `evaluate` scores analyses on
validation records (loss, parse rate, agreement with the annotator);
`restore_params` reads back the checkpoint `sft` writes. Given a mesh of
one process's devices, `sft` shards its train state as the RL trainer's and
splits each batch over data x fsdp.

Each record is encoded once: the prompt as one user turn through the chat
template, the response plus EOS. Batches stay inside one prompt bucket P and
every batch has B rows (a short one repeats a row under an all-zero response
mask), so the step compiles once per bucket. A packed batch:

  prompts        int32 [B, P]  left-padded to the bucket
  prompt_mask    int32 [B, P]  1 on prompt tokens
  responses      int32 [B, R]  right-padded to R = response_len_max
  response_mask  int32 [B, R]  1 on response tokens (EOS included) of real rows
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import Any, Sequence

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from seed_jax import partitioning
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import skills
from seed_jax import stage1
from seed_jax import train_step as train_step_lib

# Prompt ids, response ids (EOS included), the record.
Example = tuple[list[int], list[int], stage1.Record]


def _policy(config, tokenizer, buckets, response_len_max, batch_size):
  return rollout_lib.Policy(config, tokenizer, max_new_tokens=response_len_max,
                            buckets=buckets, stop_strings=(),
                            min_rows=batch_size)


def _encode(records: Sequence[stage1.Record], policy: rollout_lib.Policy,
            response_len_max: int, counts: collections.Counter
            ) -> list[Example]:
  """The prompt as a user turn (as in RL), the response plus EOS; records
  that do not fit are counted in `counts` and left out."""
  eos = policy.tokenizer.eos_token_id
  eos = policy.eos_ids[0] if eos is None else eos
  out = []
  for r in records:
    p = policy.encode(r["prompt"])
    y = policy.tokenizer.encode(r["response"], add_special_tokens=False)
    if len(p) > max(policy.buckets):
      counts["skipped/prompt_too_long"] += 1
    elif len(y) + 1 > response_len_max:
      counts["skipped/response_too_long"] += 1
    else:
      out.append((p, y + [eos], r))
  return out


def _batches(examples: Sequence[Example], batch_size: int, buckets,
             rng: np.random.Generator | None = None) -> list[list[int]]:
  """Row indices per batch, each batch inside one prompt bucket (so jit
  compiles once per bucket); rows and batches shuffled when `rng` is given."""
  by_bucket = collections.defaultdict(list)
  for i, (p, _, _) in enumerate(examples):
    by_bucket[min(b for b in buckets if b >= len(p))].append(i)
  batches = []
  for _, rows in sorted(by_bucket.items()):
    if rng is not None:
      rows = rng.permutation(rows).tolist()
    batches += [rows[k:k + batch_size] for k in range(0, len(rows), batch_size)]
  if rng is not None:
    batches = [batches[j] for j in rng.permutation(len(batches))]
  return batches


def _pack(examples: Sequence[Example], rows: Sequence[int], *, batch_size: int,
          buckets, pad_id: int, response_len: int) -> dict[str, np.ndarray]:
  """One batch's arrays; a short batch repeats a row with an empty response
  mask, so every batch has the same shape."""
  full = list(rows) + [rows[0]] * (batch_size - len(rows))
  p = sampler_lib.pad_left([examples[i][0] for i in full], buckets=buckets,
                           pad_id=pad_id)
  resp = np.full((batch_size, response_len), pad_id, np.int32)  # [B, R]
  mask = np.zeros((batch_size, response_len), np.int32)  # [B, R]
  for j, i in enumerate(full):
    y = examples[i][1]
    resp[j, :len(y)] = y
    mask[j, :len(y)] = j < len(rows)
  return dict(prompts=p.tokens, prompt_mask=p.mask, responses=resp,
              response_mask=mask)


@functools.partial(jax.jit, static_argnames="config")
def _nll(params, batch, *, config):
  """Summed response-token negative log-likelihood and token count."""
  logp, _ = train_step_lib.policy_logp(params, batch, config=config,
                                       with_entropy=False)
  mask = batch["response_mask"].astype(jnp.float32)
  return -jnp.sum(logp * mask), jnp.sum(mask)


def evaluate(params, config, tokenizer, records: Sequence[stage1.Record], *,
             response_len_max: int, rng: jax.Array, batch_size: int = 8,
             buckets=sampler_lib.DEFAULT_BUCKETS) -> dict[str, Any]:
  """Validation loss, parse rate and agreement with the annotator.

  Each prompt is answered greedily and parsed (`skills.parse_analysis`; an
  answer cut at `response_len_max` that does not parse counts as
  "truncated").
  Agreement compares the parsed skill with the record's (the annotator's):
  `skill_exact` is the fraction of records where they are equal (stripped),
  `skill_f1` the mean `stage1.skill_f1`; an unparsed analysis scores 0 on both.

  Args:
    params, config, tokenizer: the policy.
    records: validation records (`stage1.FIELDS`).
    response_len_max, rng, batch_size, buckets: as in `sft`.

  Returns:
    {"val_loss" (token mean), "parse_rate", "skill_exact", "skill_f1",
    "val_examples", "val_parse/<...>" counts, "val_sample" (one analysis)}.
  """
  _check("batch_size", batch_size, batch_size >= 1, "at least 1")
  policy = _policy(config, tokenizer, buckets, response_len_max, batch_size)
  examples, counts = _encode_validation(records, policy, response_len_max)
  return _evaluate(params, config, policy, examples, counts,
                   response_len_max=response_len_max, rng=rng,
                   batch_size=batch_size)


def _encode_validation(records: Sequence[stage1.Record],
                       policy: rollout_lib.Policy, response_len_max: int
                       ) -> tuple[list[Example], collections.Counter]:
  """The validation examples and the skipped counts; ValueError when none
  fits."""
  counts = collections.Counter()
  examples = _encode(records, policy, response_len_max, counts)
  if not examples:
    raise ValueError("no validation record fits the buckets and "
                     f"response_len_max ({dict(counts)})")
  return examples, counts


def _evaluate(params, config, policy: rollout_lib.Policy,
              examples: Sequence[Example], counts: collections.Counter, *,
              response_len_max: int, rng: jax.Array,
              batch_size: int) -> dict[str, Any]:
  """`evaluate` on examples already encoded for `policy`."""
  nll = tokens = exact = f1 = 0.0
  parse, sample = skills.ParseStats(), ""
  for rows in _batches(examples, batch_size, policy.buckets):
    batch = _pack(examples, rows, batch_size=batch_size,
                  buckets=policy.buckets, pad_id=policy.pad_id,
                  response_len=response_len_max)
    s, c = jax.device_get(_nll(params, batch, config=config))
    nll, tokens = nll + float(s), tokens + float(c)
    rng, sub = jax.random.split(rng)
    gens = policy.generate(params, [examples[i][2]["prompt"] for i in rows],
                           sub, sampler_lib.Greedy())
    for i, gen in zip(rows, gens):
      sample = sample or gen.text
      ref = skills.parse_analysis(examples[i][2]["response"])
      got = parse.record(skills.parse_analysis(gen.text,
                                               truncated=gen.truncated))
      if isinstance(got, skills.Analysis) and isinstance(ref, skills.Analysis):
        exact += float(got.skill == ref.skill)
        f1 += stage1.skill_f1(got.skill, ref.skill)
  n = len(examples)
  out = dict(val_loss=nll / max(tokens, 1.0), parse_rate=parse.rate,
             skill_exact=exact / n, skill_f1=f1 / n, val_examples=n,
             val_sample=sample)
  out.update({f"val_parse/{k}": v for k, v in parse.as_dict().items()
              if k != "parse_rate"})
  out.update({f"val_{k}": v for k, v in counts.items()})
  return out


def _check(knob: str, value: Any, ok: bool, need: str) -> None:
  if not ok:
    raise ValueError(f"sft: {knob} must be {need}, got {value!r}")


def check_mesh_batch(mesh, batch_size: int) -> None:
  """Raises ValueError, naming Stage1Config.batch_size, unless `batch_size`
  rows split over `mesh`'s data-parallel (data x fsdp) devices."""
  try:
    partitioning.check_batch_split(mesh, batch_size, 1)
  except ValueError as e:
    raise ValueError(f"sft: batch_size (Stage1Config.batch_size) must split "
                     f"over the mesh, got {batch_size}: {e}") from None


def _on_mesh(params, config, tx, loss_fn, mesh):
  """The SFT step jitted over `mesh`, with the state sharded as the RL
  trainer's (params by `partitioning.param_shardings`, Adam moments like
  their params) and each batch [B, ...] split over data x fsdp.

  Returns:
    (step_fn, state, put): `state` a fresh sharded TrainState holding a copy
    of `params` (host arrays, or arrays on any devices), `put` a packed host
    batch -> arrays on the mesh.
  """
  param_sh = partitioning.param_shardings(config, mesh)
  state_sh = train_step_lib.state_shardings(tx, param_sh, mesh)
  step_fn = train_step_lib.jit_train_step(
      tx, loss_fn, state_shardings=state_sh,
      batch_shardings=partitioning.batch_sharding(mesh, 2),
      metrics_sharding=partitioning.replicated(mesh))
  # A copy inside the jit: the step donates its state, and the caller still
  # owns `params` (already placed like this, device_put returns them as is).
  create = jax.jit(
      lambda p: train_step_lib.TrainState.create(jax.tree.map(jnp.copy, p),
                                                 tx),
      in_shardings=(param_sh,), out_shardings=state_sh)
  state = create(jax.device_put(params, param_sh))
  return step_fn, state, lambda batch: partitioning.shard_batch(batch, mesh)


def _host_rng(rng: jax.Array) -> np.random.Generator:
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  return np.random.default_rng(np.asarray(rng, np.uint32).ravel().tolist())


def sft(params, config, tokenizer, train_records: Sequence[stage1.Record],
        val_records: Sequence[stage1.Record], *, learning_rate: float,
        rng: jax.Array, epochs: int = 3, batch_size: int = 8,
        warmup_fraction: float = 0.1, weight_decay: float = 0.01,
        grad_clip: float = 1.0, buckets=sampler_lib.DEFAULT_BUCKETS,
        response_len_max: int = 256, log_every: int = 50,
        checkpoint_dir: epath.PathLike | None = None, name: str = "stage1 sft",
        mesh: jax.sharding.Mesh | None = None) -> tuple[Any, dict[str, Any]]:
  """Fine-tunes the policy on (analysis prompt -> analysis JSON).

  The prompt is one user turn through the chat template (`Policy.encode`, as
  RL's self-analysis sees it); the target is the tokenized response plus EOS;
  the loss is the token mean over response tokens only. AdamW with a cosine
  schedule and linear warm-up over `warmup_fraction` of the steps (rounded,
  and capped at all steps but the last, so a 1-step run has none). Batches
  stay inside one prompt bucket and short ones are padded with masked rows,
  so the step compiles once per bucket. Records whose prompt exceeds the
  largest usable bucket or whose response exceeds `response_len_max` are
  counted (`skipped/...`) and left out.

  Args:
    params, config, tokenizer: the policy (params are copied, not donated).
    train_records, val_records: records with `stage1.FIELDS` (e.g.
      `stage1.read_dataset`).
    learning_rate: peak learning rate.
    rng: PRNG key; the data order derives from it.
    epochs, batch_size: passes over the data, rows per update.
    warmup_fraction, weight_decay, grad_clip: of the optimizer;
      warmup_fraction in [0, 1).
    buckets: prompt-length buckets (those that fit the context with
      `response_len_max` are used).
    response_len_max: response length in tokens, EOS included.
    log_every: log a progress line every this many steps (0: never).
    name: what the progress lines call this run.
    checkpoint_dir: a new directory for an orbax checkpoint of the result
      (`restore_params`), or None.
    mesh: a (data, fsdp, tensor) mesh of this process's devices (one
      process): the train state is sharded as the RL trainer's (float32
      params, gradients and Adam moments split over fsdp and tensor) and
      each batch over data x fsdp, and the returned params stay sharded.
      None: one device, as the caller's params are.

  Returns:
    (params, report): report with steps, train_loss (last epoch's mean over
    the updates applied; NaN when all were skipped), skipped_updates
    (non-finite), the `evaluate` metrics on `val_records` (when any) and
    seconds.

  Raises:
    FileExistsError: `checkpoint_dir` exists (checked before training).
    ValueError: no training record fits, or `val_records` are given and
      none fits (both before training), or a knob is out of range (epochs,
      batch_size, learning_rate, warmup_fraction, weight_decay, grad_clip,
      response_len_max, log_every), or `batch_size` does not split over
      `mesh`'s data x fsdp devices (before anything compiles).
  """
  start = time.time()
  _check("epochs", epochs, epochs >= 1, "at least 1")
  _check("batch_size", batch_size, batch_size >= 1, "at least 1")
  _check("learning_rate", learning_rate, 0 < learning_rate < float("inf"),
         "positive and finite")
  _check("warmup_fraction", warmup_fraction, 0 <= warmup_fraction < 1,
         "in [0, 1) (the cosine decay needs a step)")
  _check("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
  _check("grad_clip", grad_clip, not grad_clip or grad_clip > 0,
         "> 0 (0 or None: no clipping)")
  _check("response_len_max", response_len_max, response_len_max >= 1,
         "at least 1 (EOS included)")
  _check("log_every", log_every, log_every >= 0, ">= 0 (0: never)")
  if mesh is not None:
    check_mesh_batch(mesh, batch_size)
  ckpt_path = None
  if checkpoint_dir is not None:
    ckpt_path = epath.Path(checkpoint_dir).absolute()
    if ckpt_path.exists():
      raise FileExistsError(f"checkpoint directory {ckpt_path} exists")
  policy = _policy(config, tokenizer, buckets, response_len_max, batch_size)
  counts = collections.Counter()
  train = _encode(train_records, policy, response_len_max, counts)
  if not train:
    raise ValueError(f"no training record fits ({dict(counts)})")
  # Before training: a validation set that cannot be scored fails now, not
  # after the training it would have thrown away.
  val = (_encode_validation(val_records, policy, response_len_max)
         if val_records else None)
  host_rng = _host_rng(rng)
  per_epoch = len(_batches(train, batch_size, policy.buckets))
  total = epochs * per_epoch
  # Rounding may reach `total`, which leaves the cosine no step to decay in.
  warmup = min(round(warmup_fraction * total), total - 1)
  tx = train_step_lib.make_optimizer(
      learning_rate, weight_decay=weight_decay, grad_clip=grad_clip,
      warmup_steps=warmup, total_steps=total, schedule="cosine")
  loss_fn = functools.partial(train_step_lib.sft_loss, config=config)
  if mesh is None:
    step_fn = train_step_lib.jit_train_step(tx, loss_fn)
    # A copy: the step donates its state, and the caller still owns `params`.
    state = train_step_lib.TrainState.create(jax.tree.map(jnp.copy, params),
                                             tx)
    put = lambda batch: batch
  else:
    step_fn, state, put = _on_mesh(params, config, tx, loss_fn, mesh)
  history = []
  for epoch in range(epochs):
    for rows in _batches(train, batch_size, policy.buckets, host_rng):
      batch = _pack(train, rows, batch_size=batch_size, buckets=policy.buckets,
                    pad_id=policy.pad_id, response_len=response_len_max)
      state, metrics = step_fn(state, put(batch))
      history.append((metrics["loss"], metrics["skipped"]))
      if log_every and (len(history) % log_every == 0 or len(history) == total):
        logging.info("%s step %d/%d (epoch %d): loss %.4f, "
                     "grad_norm %.3f", name, len(history), total, epoch + 1,
                     float(metrics["loss"]), float(metrics["grad_norm"]))
  losses, skipped = np.asarray(jax.device_get(history)).T
  applied = losses[-per_epoch:][skipped[-per_epoch:] == 0]
  report: dict[str, Any] = dict(
      steps=total, epochs=epochs, train_examples=len(train),
      train_loss=float(applied.mean()) if applied.size else float("nan"),
      skipped_updates=int(skipped.sum()), **counts)
  if val is not None:
    report.update(_evaluate(state.params, config, policy, *val,
                            response_len_max=response_len_max, rng=rng,
                            batch_size=batch_size))
  if ckpt_path is not None:
    with ocp.StandardCheckpointer() as ckpt:  # written to a tmp dir, renamed
      ckpt.save(ckpt_path, state.params)
  report["seconds"] = time.time() - start
  logging.info("%s done: %s", name, {k: v for k, v in report.items()
                                     if k != "val_sample"})
  return state.params, report


def restore_params(checkpoint_dir: epath.PathLike, like: Any) -> Any:
  """Reads params saved by `sft` into the structure (and shardings) of
  `like`, a pytree of arrays or `jax.ShapeDtypeStruct`s."""
  with ocp.StandardCheckpointer() as ckpt:
    return ckpt.restore(epath.Path(checkpoint_dir).absolute(),
                        jax.tree.map(ocp.utils.to_shape_dtype_struct, like))
