"""Grouped multi-turn rollout: B task groups x N episodes played with the sampler.

`Policy` turns prompt strings into sampled responses (token ids, text and
log-probs) with one compiled sampler per (row bucket, prompt
bucket). `rollout` plays an `EnvPool` until every episode is done, sampling
only for the episodes still running, and returns one `Sample` per
(trajectory, step) plus the finished `Episode` records.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import episodes as episodes_lib
from seed_jax import model as model_lib
from seed_jax import prompts as prompts_lib
from seed_jax import sampler as sampler_lib
from seed_jax.envs import base as envs_base

STOP_STRINGS = ("</action>",)
# The family of an episode whose environment could not reset (no task).
RESET_FAILED = "reset_failed"
# The date chat templates that print one (Llama 3.x's "Today Date: ...") are
# given: without it they print the day of the call, and the same prompt would
# tokenize differently from one day to the next. It is the date Llama 3.x
# templates write when they have no clock; templates without a date ignore it.
CHAT_DATE_STRING = "26 Jul 2024"


@dataclasses.dataclass
class Generation:
  """One sampled response."""
  text: str  # decoded response, cut after the first stop string
  prompt_ids: list[int]  # the encoded prompt (after any truncation)
  response_ids: list[int]  # the sampled tokens (stop/EOS token included)
  logprobs: list[float]  # per token, at the policy's logprob_temperature
  # Cut at max_new_tokens: the response ended on neither EOS nor a stop string.
  truncated: bool = False


class Sampled(tuple):
  """`(prompt_ids, response_ids, logprobs)` of one prompt, as a plain 3-tuple
  unpacks, and `.truncated`: the response hit max_new_tokens before EOS or a
  stop string.

  Example: `kept, response, logprobs = s` and `s.truncated`.
  """
  truncated: bool

  def __new__(cls, prompt_ids: list[int], response_ids: list[int],
              logprobs: list[float], truncated: bool = False) -> "Sampled":
    out = super().__new__(cls, (prompt_ids, response_ids, logprobs))
    out.truncated = bool(truncated)
    return out

  def __getnewargs__(self):  # pickle and copy keep the flag
    return (*self, self.truncated)


GenerateFn = Callable[[Sequence[str], jax.Array], list[Generation]]


PromptTooLongError = sampler_lib.PromptTooLongError
# What `Policy` suggests for a prompt past its buckets (truncation is its knob).
TRUNCATE_HINT = f"{sampler_lib.TRUNCATE_HINT} (truncate_prompts=True)"


def fitting_buckets(buckets: Sequence[int], context: int,
                    max_new_tokens: int) -> tuple[int, ...]:
  """The prompt buckets that leave room for `max_new_tokens` in a model of
  `context` positions.

  Raises:
    ValueError: when none does.
  """
  out = tuple(b for b in buckets if b + max_new_tokens <= context)
  if not out:
    raise ValueError(f"no prompt bucket fits the model's context ({context}) "
                     f"with max_new_tokens={max_new_tokens}")
  return out


def call_rows(n: int, *, min_rows: int = 1, max_rows: int | None = None
              ) -> int:
  """The rows of the largest sampler call `Policy` makes for n prompts:
  `min_rows` times the smallest power of two that holds them, at most the
  largest such number within `max_rows` (None: no cap; more prompts go in
  several calls), and never below `min_rows`.

  Example: call_rows(20, min_rows=8) -> 32; call_rows(300, min_rows=8,
    max_rows=256) -> 256.
  """
  rows = max(min_rows, 1)
  while rows < n and (max_rows is None or rows * 2 <= max_rows):
    rows *= 2
  return rows


class Policy:
  """Host-side wrapper around the jitted sampler: strings in, responses out.

  Prompts go through the tokenizer's chat template as one user turn, are
  left-padded into length buckets, and the number of rows is padded up to
  `min_rows` times a power of two (filler rows sample nothing) so the
  sampler compiles once per (row bucket, prompt bucket).

  `max_rows` caps the rows of one sampler call, and with them its KV cache
  (rows x layers x context): more prompts are sampled in consecutive slices
  of at most that many rows (the largest `min_rows` times a power of two
  that fits; a larger `min_rows` wins), slice j with key
  `fold_in(rng, j)`, results in prompt order. Up to the cap, one call as
  without it. None: no cap.
  """

  def __init__(self, config: model_lib.ModelConfig, tokenizer, *,
               max_new_tokens: int, buckets=sampler_lib.DEFAULT_BUCKETS,
               stop_strings: Sequence[str] = STOP_STRINGS,
               truncate_prompts: bool = False, min_rows: int = 1,
               max_rows: int | None = 256,
               use_chat_template: bool = True,
               logprob_temperature: float = 1.0):
    if max_rows is not None and max_rows < 1:
      raise ValueError(f"max_rows must be >= 1 or None (no cap), got "
                       f"{max_rows}")
    self.config = config
    # The temperature of the log-probs the sampler returns (`sampler.sample`).
    self.logprob_temperature = logprob_temperature
    self.tokenizer = tokenizer
    self.max_new_tokens = max_new_tokens
    self._all_buckets = tuple(buckets)
    self.buckets = self.buckets_for(max_new_tokens)
    self.stop_strings = tuple(stop_strings)
    table = sampler_lib.stop_string_table(tokenizer, stop_strings,
                                          config.vocab_size)
    # On the device once, not copied there on every call.
    self.stop_table = None if table is None else jnp.asarray(table)
    self.truncate_prompts = truncate_prompts
    self.min_rows = min_rows
    self.max_rows = max_rows
    self.use_chat_template = use_chat_template
    self.pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                   else config.pad_token_id or 0)
    eos = set(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
      eos.add(tokenizer.eos_token_id)
    if not eos:
      raise ValueError("no EOS token: neither the model config "
                       "(eos_token_id in config.json or generation_config.json)"
                       " nor the tokenizer names one, so no reply could end")
    self.eos_ids = tuple(sorted(eos))
    if use_chat_template and not tokenizer.chat_template:
      logging.warning("the tokenizer has no chat template: prompts are encoded "
                      "as plain text (pass use_chat_template=False to say so)")
    self.prompts_truncated = 0  # counted, never silent

  def buckets_for(self, max_new_tokens: int) -> tuple[int, ...]:
    """The prompt buckets that leave room for `max_new_tokens` in the model's
    context (`buckets` is this for the policy's own budget).

    Raises:
      ValueError: when none does.
    """
    return fitting_buckets(self._all_buckets,
                           self.config.max_position_embeddings, max_new_tokens)

  def encode(self, prompt: str) -> list[int]:
    """Token ids of one prompt as a user turn (generation prompt appended).

    A chat template writes its own special tokens (Llama's BOS among them);
    a plain prompt gets those the tokenizer adds itself, as
    `tokenizer(prompt)` in transformers does (a BOS for Llama, none for Qwen).
    """
    if self.use_chat_template and self.tokenizer.chat_template:
      text = self.tokenizer.apply_chat_template(
          [{"role": "user", "content": prompt}], tokenize=False,
          add_generation_prompt=True, date_string=CHAT_DATE_STRING)
      return self.tokenizer.encode(text, add_special_tokens=False)
    return self.tokenizer.encode(prompt)

  def _rows(self, n: int) -> int:
    return call_rows(n, min_rows=self.min_rows, max_rows=None)

  def rows_per_call(self) -> int | None:
    """The most prompts one sampler call takes (None: no cap): the largest
    `min_rows` times a power of two within `max_rows`, or `min_rows`."""
    if self.max_rows is None:
      return None
    return call_rows(self.max_rows, min_rows=self.min_rows,
                     max_rows=self.max_rows)

  def generate_ids(self, params, prompt_ids: Sequence[Sequence[int]],
                   rng: jax.Array, sampling: sampler_lib.Sampling,
                   max_new_tokens: int | None = None) -> list[Sampled]:
    """Samples for already-encoded prompts -> one `Sampled` per prompt:
    (prompt, response, logprobs) with `.truncated`, in prompt order.

    More prompts than `rows_per_call()` are sampled in slices of that many.

    Raises:
      PromptTooLongError: without `truncate_prompts`, a prompt longer than
        the largest bucket that leaves room for the response (nothing is
        sampled).
      ValueError: no bucket leaves room for `max_new_tokens`, or a
        `max_new_tokens` below 1.
    """
    new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
    if new < 1:
      raise ValueError(f"max_new_tokens must be >= 1 (None: the policy's "
                       f"{self.max_new_tokens}), got {max_new_tokens}")
    n = len(prompt_ids)
    if n == 0:
      return []
    buckets = (self.buckets if new == self.max_new_tokens
               else self.buckets_for(new))
    if not self.truncate_prompts:  # before any slice is sampled
      self._check_fits(prompt_ids, buckets, new)
    per_call = self.rows_per_call()
    if per_call is None or n <= per_call:
      return self._sample(params, prompt_ids, rng, sampling, new, buckets)
    out = []
    for j, start in enumerate(range(0, n, per_call)):
      logging.debug("sampling rows %d-%d of %d", start,
                    min(start + per_call, n), n)
      out += self._sample(params, prompt_ids[start:start + per_call],
                          jax.random.fold_in(rng, j), sampling, new, buckets)
    return out

  def _check_fits(self, prompt_ids: Sequence[Sequence[int]],
                  buckets: tuple[int, ...], new: int) -> None:
    """`sampler.check_fits`, saying why larger buckets are left out."""
    try:
      sampler_lib.check_fits(prompt_ids, buckets)
    except PromptTooLongError as e:
      room = ""
      if max(self._all_buckets) > e.largest:
        room = (f"; the larger buckets of {self._all_buckets} leave no room "
                f"for max_new_tokens={new} in the model's context of "
                f"{self.config.max_position_embeddings} positions")
      raise PromptTooLongError(e.detail + room, TRUNCATE_HINT,
                               index=e.index, tokens=e.tokens,
                               largest=e.largest) from None

  def _sample(self, params, prompt_ids: Sequence[Sequence[int]],
              rng: jax.Array, sampling: sampler_lib.Sampling, new: int,
              buckets: tuple[int, ...]) -> list[Sampled]:
    """One sampler call over `prompt_ids`, padded to `_rows` rows."""
    n = len(prompt_ids)
    rows = list(prompt_ids) + [prompt_ids[0]] * (self._rows(n) - n)
    batch = sampler_lib.pad_left(rows, buckets=buckets,
                                 pad_id=self.pad_id,
                                 truncate=self.truncate_prompts)
    if batch.truncated:
      cut = sum(len(p) > batch.tokens.shape[1] for p in prompt_ids)
      self.prompts_truncated += cut
      logging.warning("%d prompt(s) cut on the left to %d tokens", cut,
                      batch.tokens.shape[1])
    out = sampler_lib.sample(
        params, batch.tokens, batch.mask, rng, config=self.config,
        max_new_tokens=new, sampling=sampling, eos_ids=self.eos_ids,
        stop_table=self.stop_table, pad_id=self.pad_id,
        live=np.arange(len(rows)) < n,
        logprob_temperature=self.logprob_temperature)
    tokens, lengths, logprobs, done = jax.device_get(
        (out.tokens, out.lengths, out.logprobs, out.done))
    results = []
    for i in range(n):
      k = int(lengths[i])
      kept = batch.tokens[i][batch.mask[i].astype(bool)].tolist()
      results.append(Sampled(kept, tokens[i, :k].tolist(),
                             logprobs[i, :k].astype(float).tolist(),
                             truncated=not done[i]))
    return results

  def decode(self, response_ids: Sequence[int]) -> str:
    """Response text without special tokens, cut after the first stop string."""
    text = self.tokenizer.decode(
        [t for t in response_ids if t not in self.eos_ids],
        skip_special_tokens=True)
    for s in self.stop_strings:
      if s in text:
        text = text[:text.index(s) + len(s)]
    return text

  def generate(self, params, prompts: Sequence[str], rng: jax.Array,
               sampling: sampler_lib.Sampling = sampler_lib.Temperature(1.0),
               max_new_tokens: int | None = None) -> list[Generation]:
    """Samples one response per prompt string."""
    ids = [self.encode(p) for p in prompts]
    outs = self.generate_ids(params, ids, rng, sampling, max_new_tokens)
    return [Generation(self.decode(o[1]), *o[:3],
                       truncated=getattr(o, "truncated", False))
            for o in outs]


@dataclasses.dataclass
class Sample:
  """One (trajectory, step) training sample."""
  prompt: str
  prompt_ids: list[int]
  response_ids: list[int]
  old_logp: list[float]  # the sampler's log-probs of response_ids
  uid: int  # group id (shared task seed)
  traj_uid: int  # trajectory id within the batch
  step: int  # step index within the trajectory
  observation: str  # raw observation the response answered
  action_valid: bool
  reward: float
  done: bool
  # The response hit max_new_tokens before EOS or a stop string.
  truncated: bool = False


@dataclasses.dataclass
class RolloutResult:
  samples: list[Sample]
  episodes: list[episodes_lib.Episode]  # traj_uid order
  env_steps: int  # environment steps taken (all episodes)


def rollout(generate: GenerateFn, pool: envs_base.EnvPool, rng: jax.Array, *,
            env_name: str, max_steps: int, history_length: int = 2,
            group_seeds: Sequence[int] | None = None,
            uid_offset: int = 0, log_every_s: float = 5.0,
            invalid_action: str = "no_op") -> RolloutResult:
  """Plays one batch of grouped episodes to the end.

  Args:
    generate: `generate(prompts, rng) -> list[Generation]` (a Policy's bound
      `generate` with params and sampling fixed, or a scripted fake).
    pool: the environments (B groups x N members).
    rng: PRNG key; split once per step.
    env_name: selects the prompt builder and projection.
    max_steps: turn limit per episode (the env may end earlier).
    history_length: k recent (observation, action) pairs in the prompt.
    group_seeds: task seeds of the B groups (None: the pool's next seeds).
    uid_offset: added to group ids, so that uids stay unique across batches.
    log_every_s: a progress line (logging.info: "rollout step 3/30: 97 of
      128 episodes still running, step 41.2 s, 130 s in all") after each step
      that ends at least this many seconds after the last line (or the
      start); 0: after every step. Steps of a large batch take longer than
      the default, so each gets its line; fast steps log about one line per
      `log_every_s`.
    invalid_action: what the environment is sent for a reply whose action
      parsed but is not admissible, one of `prompts.INVALID_ACTIONS`: its
      no-op, or the action as written (the step is invalid either way).

  Returns:
    RolloutResult with samples in (step, member) order and one Episode per
    member; an episode whose environment raised is failed, with `error` set.

  Raises:
    ValueError: `max_steps` below 1, `history_length` below 0 or an unknown
      `invalid_action` (before any reset); `generate` answering another
      number of prompts than asked.
    PromptTooLongError: `generate` found a prompt past its largest bucket;
      the message names the step and the episode (its `index` is the
      episode's member index).
  """
  if max_steps < 1:
    raise ValueError(f"rollout needs max_steps >= 1, got {max_steps}")
  if history_length < 0:
    raise ValueError(f"rollout needs history_length >= 0, got "
                     f"{history_length}")
  prompts_lib.check_invalid_action(invalid_action)
  observations, infos = pool.reset(group_seeds)
  n = pool.size
  eps = []
  for i, env in enumerate(pool.members):
    # A member whose reset raised has no task of this seed: its env may still
    # hold the previous episode's, so the episode names the failure instead.
    failed = pool.errors[i] is not None
    eps.append(episodes_lib.Episode(
        env_name=env_name, task="" if failed else getattr(env, "task", ""),
        family=RESET_FAILED if failed else getattr(env, "family", env_name),
        seed=pool.seeds[i],
        uid=uid_offset + pool.group_of(i), traj_uid=i,
        error=pool.errors[i]))
  no_ops = [getattr(env, "no_op", None) for env in pool.members]
  histories: list[list[tuple[str, str]]] = [[] for _ in range(n)]
  samples: list[Sample] = []
  env_steps = 0
  start = logged = time.monotonic()
  for t in range(max_steps):
    active = pool.active()
    if not active:
      break
    step_start = time.monotonic()
    rng, sub = jax.random.split(rng)
    prompts = [prompts_lib.build_prompt(
        env_name, eps[i].task, histories[i], observations[i],
        infos[i]["admissible_actions"], history_length=history_length)
               for i in active]
    try:
      gens = generate(prompts, sub)
    except PromptTooLongError as e:
      if not 0 <= e.index < len(active):
        raise
      ep = eps[active[e.index]]
      raise PromptTooLongError(
          f"rollout step {t + 1}/{max_steps}, episode {ep.traj_uid} (group "
          f"{ep.uid}, seed {ep.seed}, task {ep.task!r}): {e.detail}",
          e.remedy, index=active[e.index], tokens=e.tokens,
          largest=e.largest) from None
    if len(gens) != len(prompts):  # zip would drop the unanswered steps
      raise ValueError(f"generate returned {len(gens)} responses for "
                       f"{len(prompts)} prompts")
    actions: list[str | None] = [None] * n
    valid = {}
    for i, prompt, gen in zip(active, prompts, gens):
      action, ok = prompts_lib.project(
          env_name, gen.text, infos[i]["admissible_actions"],
          no_op=no_ops[i], invalid_action=invalid_action)
      actions[i] = action
      valid[i] = ok
    new_obs, rewards, dones, new_infos = pool.step(actions)
    env_steps += len(active)
    for i, prompt, gen in zip(active, prompts, gens):
      cut = bool(getattr(gen, "truncated", False))  # a fake may not say
      # A step is valid only if the reply projected and the env accepted it;
      # an env that raised on it judged nothing (the episode fails instead).
      judged = not new_infos[i].get("error")
      ok = valid[i] and (not judged
                         or bool(new_infos[i].get("action_valid", True)))
      last = dones[i] or t == max_steps - 1
      samples.append(Sample(
          prompt=prompt, prompt_ids=gen.prompt_ids,
          response_ids=gen.response_ids, old_logp=gen.logprobs,
          uid=eps[i].uid, traj_uid=i, step=t, observation=observations[i],
          action_valid=ok, reward=rewards[i], done=last, truncated=cut))
      eps[i].steps.append(episodes_lib.Step(
          observation=observations[i], prompt=prompt, response=gen.text,
          action=actions[i], action_valid=ok, reward=rewards[i], done=last,
          truncated=cut))
      histories[i].append((observations[i], actions[i]))
    observations, infos = new_obs, new_infos
    now = time.monotonic()
    if now - logged >= log_every_s:
      logged = now
      logging.info("rollout step %d/%d: %d of %d episodes still running, "
                   "step %.1f s, %.0f s in all", t + 1, max_steps,
                   len(pool.active()), n, now - step_start, now - start)
  for i, env in enumerate(pool.members):
    ep = eps[i]
    ep.success = bool(pool.won[i])
    ep.episode_return = float(pool.returns[i])
    ep.error = pool.errors[i]
    if ep.error is None:
      try:
        ep.ground_truth = dict(env.ground_truth())
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("ground_truth() of member %d raised %s", i, e)
  return RolloutResult(samples=samples, episodes=eps, env_steps=env_steps)


def pad_samples(samples: Sequence[Sample], *, pad_id: int,
                prompt_buckets=sampler_lib.DEFAULT_BUCKETS,
                response_len: int | None = None) -> dict[str, np.ndarray]:
  """Packs samples into arrays: left-padded prompts, right-padded responses.

  Returns:
    prompts/prompt_mask [S, P] int32; responses/response_mask [S, R] int32;
    old_logp [S, R] float32.

  Raises:
    ValueError: a response longer than `response_len` (its tail would be
      dropped from training), naming the sample.
  """
  p = sampler_lib.pad_left([s.prompt_ids for s in samples],
                           buckets=prompt_buckets, pad_id=pad_id)
  R = response_len or max(len(s.response_ids) for s in samples)
  resp = np.full((len(samples), R), pad_id, np.int32)
  rmask = np.zeros((len(samples), R), np.int32)
  old = np.zeros((len(samples), R), np.float32)
  for i, s in enumerate(samples):
    k = len(s.response_ids)
    if k > R:
      raise ValueError(
          f"sample {i} (traj_uid {s.traj_uid}, step {s.step}) has a response "
          f"of {k} tokens, longer than response_len={R}: its last {k - R} "
          "tokens would not be trained on; pass a response_len of at least "
          "the sampler's max_new_tokens")
    resp[i, :k] = s.response_ids
    rmask[i, :k] = 1
    old[i, :k] = s.old_logp[:k]
  return {"prompts": p.tokens, "prompt_mask": p.mask, "responses": resp,
          "response_mask": rmask, "old_logp": old}
