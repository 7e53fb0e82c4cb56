"""A jitted sampler: prefill, then a `lax.while_loop` decode over a KV cache.

`sample(params, prompts, mask, rng, ...)` is one compiled function per
(prompt bucket, max_new_tokens, sampling method); `params` is an argument,
never a closure, so the same compilation serves every update.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import model as model_lib
from seed_jax import token_ids


# ---------------------------------------------------------------------------
# Sampling methods: small frozen dataclasses, hashable (static jit args).


@dataclasses.dataclass(frozen=True)
class Greedy:
  """Takes the most likely token (a NaN counts as the most likely, as in
  jnp.argmax and the other methods: the first NaN's id, never one outside
  the vocabulary)."""

  def __call__(self, logits: jax.Array, rng: jax.Array) -> jax.Array:
    del rng
    # The first index of the maximum, as jnp.argmax, in two plain reductions:
    # argmax's (value, index) reduction took 4 ms per step over 49k logits
    # on CPU, this one a tenth of it.
    top = jnp.max(logits, axis=-1, keepdims=True)
    # A NaN makes `top` NaN, equal to nothing: the NaNs are the maximum.
    hit = (logits == top) | jnp.isnan(logits)
    iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(hit, iota, logits.shape[-1]), axis=-1)


def _check_temperature(t: float) -> None:
  if not t > 0:
    raise ValueError(f"temperature must be > 0 (use Greedy() for 0), got {t}")


@dataclasses.dataclass(frozen=True)
class Temperature:
  """Samples from softmax(logits / temperature)."""
  temperature: float = 1.0

  def __post_init__(self):
    _check_temperature(self.temperature)

  def __call__(self, logits, rng):
    return jax.random.categorical(rng, logits / self.temperature, axis=-1)


@dataclasses.dataclass(frozen=True)
class TopK:
  """Samples among the k most likely tokens (all of them for k >= vocab;
  tokens tied with the k-th are kept too, as transformers' top-k does)."""
  k: int
  temperature: float = 1.0

  def __post_init__(self):
    if self.k < 1:
      raise ValueError(f"TopK needs k >= 1, got {self.k}")
    _check_temperature(self.temperature)

  def __call__(self, logits, rng):
    kth = jax.lax.top_k(logits, min(self.k, logits.shape[-1]))[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(rng, logits / self.temperature, axis=-1)


@dataclasses.dataclass(frozen=True)
class TopP:
  """Nucleus sampling: the smallest set of tokens with probability >= p."""
  p: float
  temperature: float = 1.0

  def __post_init__(self):
    if not 0.0 < self.p <= 1.0:
      raise ValueError(f"TopP needs 0 < p <= 1, got {self.p}")
    _check_temperature(self.temperature)

  def __call__(self, logits, rng):
    logits = logits / self.temperature
    if self.p >= 1.0:  # every token; float32 sums reach 1 before the tail
      return jax.random.categorical(rng, logits, axis=-1)
    order = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(order, axis=-1)
    # Keep a token while the mass strictly before it is below p.
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff = jnp.min(jnp.where(before < self.p, order, jnp.inf), axis=-1,
                     keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1)


Sampling = Greedy | Temperature | TopK | TopP


def at_temperature(temperature: float) -> Sampling:
  """Temperature(t), or Greedy() for t == 0 (evaluations' convention)."""
  return Greedy() if temperature == 0 else Temperature(temperature)


# ---------------------------------------------------------------------------


@flax.struct.dataclass
class SampleOutput:
  tokens: jax.Array  # [B, N] int32, pad_id after a row is done
  lengths: jax.Array  # [B] int32, tokens generated (stop token included)
  done: jax.Array  # [B] bool, stopped on EOS or a stop sequence
  # [B, N] float32, log p(token) under softmax(logits / logprob_temperature):
  # temperature 1 unless asked (RL asks for its sampling temperature).
  logprobs: jax.Array


@flax.struct.dataclass
class _Loop:
  step: jax.Array  # [] int32, index of the token being produced
  tokens: jax.Array  # [B, N] int32
  logprobs: jax.Array  # [B, N] float32
  done: jax.Array  # [B] bool
  lengths: jax.Array  # [B] int32
  positions: jax.Array  # [B] int32, RoPE position of the next input token
  kv_mask: jax.Array  # [B, S] bool, valid cache slots
  cache: model_lib.Cache  # per layer: k [B, K, E, S], v [B, K, S, E]
  recent: jax.Array  # [B, W] int32, last W generated tokens (for stop seqs)
  matched: jax.Array  # [B, n] int32, chars of each stop string matched so far
  rng: jax.Array  # key


def _stop_hit(recent: jax.Array, n_generated: jax.Array,
              stop_seqs: tuple[tuple[int, ...], ...]) -> jax.Array:
  """[B] whether the generated tail equals one of the stop sequences."""
  hit = jnp.zeros(recent.shape[0], bool)
  W = recent.shape[1]
  for seq in stop_seqs:
    tail = recent[:, W - len(seq):]
    match = jnp.all(tail == jnp.asarray(seq, jnp.int32), axis=-1)
    hit = hit | (match & (n_generated >= len(seq)))
  return hit


def _match_step(table: jax.Array, matched: jax.Array, token: jax.Array
                ) -> tuple[jax.Array, jax.Array]:
  """Feeds [B] tokens to the stop-string matchers (`stop_string_table`):
  the new [B, n] matched counts and [B] whether a stop string completed."""
  n = table.shape[0]
  nxt = table[jnp.arange(n)[None, :], matched, token[:, None]].astype(jnp.int32)
  return jnp.maximum(nxt, 0), jnp.any(nxt < 0, axis=-1)


def _check_prompts(params, prompts, mask, rng, *, config, **kwargs):
  del params, rng, kwargs
  token_ids.check_token_ids(config.vocab_size, {"prompts": prompts},
                            {"prompts": mask})


@token_ids.host_checked(_check_prompts)
@functools.partial(
    jax.jit,
    static_argnames=("config", "max_new_tokens", "sampling", "eos_ids",
                     "stop_seqs", "pad_id", "cache_dtype",
                     "logprob_temperature"))
def sample(params: model_lib.Params, prompts: jax.Array, mask: jax.Array,
           rng: jax.Array, *, config: model_lib.ModelConfig,
           max_new_tokens: int, sampling: Sampling = Greedy(),
           eos_ids: tuple[int, ...] = (),
           stop_seqs: tuple[tuple[int, ...], ...] = (),
           stop_table: jax.Array | None = None,
           pad_id: int = 0, live: jax.Array | None = None,
           cache_dtype: str | None = None,
           logprob_temperature: float = 1.0) -> SampleOutput:
  """Samples up to `max_new_tokens` tokens after left-padded prompts.

  Args:
    params: decoder parameters (any sharding).
    prompts: [B, P] int32, left-padded.
    mask: [B, P] 1 on real prompt tokens. Every row needs at least one.
    rng: a PRNG key; the same key gives the same tokens.
    config: the model config.
    max_new_tokens: N, the decode budget (the cache holds P + N slots).
    sampling: Greedy(), Temperature(t), TopK(k, t) or TopP(p, t).
    eos_ids: token ids that end a row (kept in the output).
    stop_seqs: token-id sequences that end a row when generated.
    stop_table: [n, m, V] from `stop_string_table`: a row ends on the token
      that completes one of n stop strings in its generated text, however
      the tokens split it (" </action>", "</action>." ...).
    pad_id: fills a row's tokens after it is done.
    live: [B] bool, False on filler rows (e.g. padding up to a row bucket):
      they start done, so they sample nothing (length 0) and do not keep
      the loop running. None: every row is live.
    cache_dtype: of the KV cache (None: float32 on CPU, else the model's
      compute dtype).
    logprob_temperature: the returned log-probs are under
      softmax(logits / logprob_temperature), before any top-k or top-p cut.
      1.0, the model's own distribution, is what PPO's old log-prob needs at
      the paper's sampling temperature; RL at another temperature T scores
      at T (`trainer.RLConfig.temperature`) and asks for T here.

  Returns:
    SampleOutput with tokens/logprobs [B, N], lengths and done [B].

  Raises:
    ValueError: on a prompt token id outside [0, vocab_size), padding
      included (checked on the host when `prompts` can be read there, not
      inside a caller's jit), and on the bad sizes below.
  """
  c = config
  B, P = prompts.shape
  N = max_new_tokens
  S = P + N
  if B == 0:
    raise ValueError("empty batch: no prompts to sample from")
  if N < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {N}")
  if S > c.max_position_embeddings:
    raise ValueError(
        f"prompt bucket {P} + max_new_tokens {N} = {S} exceeds the model's "
        f"context of {c.max_position_embeddings} positions (the KV cache)")
  mask = mask.astype(bool)
  if not logprob_temperature > 0:
    raise ValueError(f"logprob_temperature must be > 0, got "
                     f"{logprob_temperature}")
  W = max([len(s) for s in stop_seqs] + [1])
  eos = jnp.asarray(eos_ids or (-1,), jnp.int32)

  def pick(logits, rng, state_done):
    # The log-prob under softmax(logits / logprob_temperature), whatever the
    # sampling method: what the scorer gives at that temperature.
    token = sampling(logits, rng).astype(jnp.int32)
    if logprob_temperature != 1.0:
      logits = logits / logprob_temperature
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                               token[:, None], axis=-1)[:, 0]
    token = jnp.where(state_done, pad_id, token)
    logp = jnp.where(state_done, 0.0, logp)
    return token, logp

  def record(state: _Loop, token, logp) -> _Loop:
    i = state.step
    was_done = state.done
    recent = jnp.concatenate([state.recent[:, 1:], token[:, None]], axis=1)
    lengths = jnp.where(was_done, state.lengths, i + 1)
    hit = jnp.isin(token, eos) | _stop_hit(recent, lengths, stop_seqs)
    matched = state.matched
    if stop_table is not None:
      matched, completed = _match_step(stop_table, matched, token)
      hit = hit | completed
    return state.replace(
        matched=matched,
        tokens=state.tokens.at[:, i].set(token),
        logprobs=state.logprobs.at[:, i].set(logp),
        done=was_done | hit,
        lengths=lengths,
        recent=recent,
        step=i + 1)

  # Prefill: the whole prompt in one forward, keys/values into slots [0, P).
  # Float32 keys and values on CPU: XLA:CPU updates and reads a 16-bit cache
  # with extra copies and conversions (decode steps 20% slower in bfloat16).
  if cache_dtype is None and jax.default_backend() == "cpu":
    cache_dtype = "float32"
  cache = model_lib.init_cache(c, B, S, dtype=cache_dtype)
  kv_mask = jnp.concatenate([mask, jnp.zeros((B, N), bool)], axis=1)
  positions = model_lib.positions_from_mask(mask)
  hidden, cache = model_lib.forward(params, prompts, positions, kv_mask,
                                    config=c, cache=cache, cache_index=0)
  last_logits = model_lib.logits(params, hidden[:, -1:], config=c)[:, 0]
  rng, sub = jax.random.split(rng)
  state = _Loop(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.full((B, N), pad_id, jnp.int32),
      logprobs=jnp.zeros((B, N), jnp.float32),
      done=(jnp.zeros((B,), bool) if live is None
            else ~jnp.asarray(live, bool)),
      lengths=jnp.zeros((B,), jnp.int32),
      positions=positions[:, -1] + 1,
      kv_mask=kv_mask,
      cache=cache,
      recent=jnp.full((B, W), -1, jnp.int32),
      matched=jnp.zeros((B, 0 if stop_table is None else stop_table.shape[0]),
                        jnp.int32),
      rng=rng)
  token, logp = pick(last_logits, sub, state.done)
  state = record(state, token, logp)

  def cond(s: _Loop):
    return (s.step < N) & ~jnp.all(s.done)

  # Each layer's weights sliced once, before the loop: taken inside it,
  # XLA:CPU copies every float32 layer again on each step (1.8x the decode
  # time of a 6-layer, 768-wide model).
  loop_params = dict(params,
                     layers=model_lib.unstack_layers(params["layers"]))

  def body(s: _Loop) -> _Loop:
    slot = P + s.step - 1  # cache slot of the token fed now
    prev = s.tokens[:, s.step - 1]
    kv_mask = s.kv_mask.at[:, slot].set(True)
    hidden, cache = model_lib.forward(
        loop_params, prev[:, None], s.positions[:, None], kv_mask, config=c,
        cache=s.cache, cache_index=slot)
    step_logits = model_lib.logits(loop_params, hidden, config=c)[:, 0]
    rng, sub = jax.random.split(s.rng)
    s = s.replace(kv_mask=kv_mask, cache=cache, rng=rng,
                  positions=s.positions + 1)
    token, logp = pick(step_logits, sub, s.done)
    return record(s, token, logp)

  state = jax.lax.while_loop(cond, body, state)
  return SampleOutput(tokens=state.tokens, lengths=state.lengths,
                      done=state.done, logprobs=state.logprobs)


# ---------------------------------------------------------------------------
# Host-side helpers: buckets and stop strings.

DEFAULT_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass
class Padded:
  tokens: np.ndarray  # [B, L] int32
  mask: np.ndarray  # [B, L] int32
  truncated: int  # rows cut on the left to fit


TRUNCATE_HINT = "raise the buckets or ask for left truncation"


class PromptTooLongError(ValueError):
  """A prompt longer than the largest prompt bucket, with truncation off.

  Its message is "`detail`; `remedy`". A caller that knows more (the
  episode, its own knobs) raises another with a longer `detail` or its own
  `remedy`. `index`: the prompt's position among those of the call that
  raised; `tokens`: its length; `largest`: the largest bucket.
  """

  def __init__(self, detail: str, remedy: str = TRUNCATE_HINT, *,
               index: int = -1, tokens: int = 0, largest: int = 0):
    super().__init__(f"{detail}; {remedy}")
    self.detail, self.remedy = detail, remedy
    self.index, self.tokens, self.largest = index, tokens, largest

  def __reduce__(self):  # pickling keeps every field
    return type(self), (self.detail, self.remedy), self.__dict__


class NonFiniteLogitsError(ValueError):
  """Sampled replies with NaN or infinite log-probs: the model's logits were
  not finite (params that hold NaN or diverged), so its tokens mean nothing
  (each sampling method then picks the first NaN logit's id)."""


def check_finite(logprobs: Sequence[Sequence[float]], what: str) -> None:
  """Raises NonFiniteLogitsError when a reply's log-probs are not all finite.

  Args:
    logprobs: per reply, its tokens' log-probs (as `sample` returns them, cut
      to each reply's length).
    what: who sampled, for the message (e.g. "evaluate eval_seen").
  """
  bad = [i for i, lp in enumerate(logprobs)
         if not np.isfinite(np.asarray(lp, np.float64)).all()]
  if bad:
    raise NonFiniteLogitsError(
        f"{what}: {len(bad)} of {len(logprobs)} sampled replies have NaN or "
        f"infinite log-probs (the first: reply {bad[0]}): the model's logits "
        "are not finite, so its params hold NaN or diverged, and the replies "
        "are garbage")


def check_fits(seqs: Sequence[Sequence[int]], buckets) -> None:
  """Raises PromptTooLongError for the first of `seqs` past every bucket."""
  largest = max(buckets)
  for i, s in enumerate(seqs):
    if len(s) > largest:
      raise PromptTooLongError(
          f"prompt of {len(s)} tokens exceeds the largest bucket ({largest})",
          index=i, tokens=len(s), largest=largest)


def pad_left(seqs: Sequence[Sequence[int]], *, buckets=DEFAULT_BUCKETS,
             pad_id: int = 0, truncate: bool = False) -> Padded:
  """Left-pads token lists to the smallest bucket that holds the longest.

  Example: [[5, 6], [7]] with buckets (4,) ->
    tokens [[0, 0, 5, 6], [0, 0, 0, 7]], mask [[0, 0, 1, 1], [0, 0, 0, 1]].

  Raises:
    ValueError: on an empty batch or an empty prompt.
    PromptTooLongError: a prompt longer than the largest bucket, unless
      `truncate` (then its oldest tokens are cut and counted in
      `truncated`).
  """
  if not len(seqs):
    raise ValueError("empty batch: no prompts to pad")
  longest = max(len(s) for s in seqs)
  if min(len(s) for s in seqs) == 0:
    raise ValueError("a prompt has no tokens")
  if not truncate:
    check_fits(seqs, buckets)
  length = min((b for b in buckets if b >= longest), default=max(buckets))
  toks = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), np.int32)
  cut = 0
  for i, s in enumerate(seqs):
    s = list(s)
    if len(s) > length:
      s, cut = s[-length:], cut + 1
    toks[i, length - len(s):] = s
    mask[i, length - len(s):] = 1
  return Padded(toks, mask, cut)


def stop_string_table(tokenizer, stop_strings: Sequence[str],
                      vocab_size: int) -> np.ndarray | None:
  """Token-level matchers of stop strings, for `sample(stop_table=)`.

  One Knuth-Morris-Pratt matcher per string: entry [i, q, v] is how many
  characters of string i are matched after token v's text is read with q
  already matched, or -1 when the string completes inside that text. So a
  row stops whatever tokens spell the string: "</action>" alone, after a
  space (" </", "action", ">") or merged with what follows (">.").

  Special tokens read as no text, as replies are decoded
  (`skip_special_tokens=True`): "</act", "<|im_end|>", "ion>" stops where
  the decoded "</action>" does, and a stop string inside a special token's
  own text ("im_end" in "<|im_end|>") stops nothing.

  Args:
    tokenizer: a Hugging Face tokenizer; a token's text is
      `convert_tokens_to_string([token])`, none for its special tokens
      (`all_special_ids` and added tokens marked special).
    stop_strings: the strings; None or empty gives None (no table).
    vocab_size: V, the model's (ids the tokenizer lacks read as no text,
      which leaves a match where it was).

  Returns:
    [n, m, V] int16 (m: the longest string's length), or None.
  """
  strings = [s for s in stop_strings or () if s]
  if not strings:
    return None
  m = max(len(s) for s in strings)
  if m >= 2 ** 15:
    raise ValueError(f"stop strings of {m} characters are too long")
  special = set(getattr(tokenizer, "all_special_ids", ()))
  special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder",
                                    {}).items() if getattr(t, "special", False)}
  texts = [""] * vocab_size
  for tok, i in tokenizer.get_vocab().items():
    if i < vocab_size and i not in special:
      texts[i] = tokenizer.convert_tokens_to_string([tok])
  table = np.zeros((len(strings), m, vocab_size), np.int16)
  for k, s in enumerate(strings):
    step = _kmp_steps(s)
    chars = set(s)
    for v, text in enumerate(texts):
      if not text:  # no text (or an id the tokenizer lacks): nothing read
        table[k, :len(s), v] = np.arange(len(s))
        continue
      if not chars.intersection(text):
        continue  # every state falls back to 0
      for q in range(len(s)):
        r = q
        for ch in text:
          r = step[r].get(ch, 0)
          if r == len(s):
            r = -1
            break
        table[k, q, v] = r
  return table


def _kmp_steps(s: str) -> list[dict[str, int]]:
  """[q][char] -> characters of `s` matched after reading char with q
  matched (absent: 0); q runs over 0..len(s)-1."""
  fail = [0] * len(s)
  for i in range(1, len(s)):
    k = fail[i - 1]
    while k and s[i] != s[k]:
      k = fail[k - 1]
    fail[i] = k + (s[i] == s[k])
  steps = []
  for q in range(len(s)):
    nxt = dict(steps[fail[q - 1]]) if q else {}
    nxt[s[q]] = q + 1
    steps.append(nxt)
  return steps


def generate_text(params, config, tokenizer, prompts: Sequence[str], *,
                  max_new_tokens: int, sampling: Sampling = Greedy(),
                  rng: jax.Array | None = None, stop_strings=(),
                  buckets=DEFAULT_BUCKETS) -> list[str]:
  """Convenience: strings in, decoded continuations out (cut at stops).

  Raises:
    NonFiniteLogitsError: the model's logits were NaN or infinite.
  """
  ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
  pad = config.pad_token_id if config.pad_token_id is not None else 0
  batch = pad_left(ids, buckets=buckets, pad_id=pad)
  out = sample(params, batch.tokens, batch.mask,
               rng if rng is not None else jax.random.key(0), config=config,
               max_new_tokens=max_new_tokens, sampling=sampling,
               eos_ids=tuple(config.eos_token_ids),
               stop_table=stop_string_table(tokenizer, stop_strings,
                                            config.vocab_size),
               pad_id=pad)
  tokens, lengths, logprobs = jax.device_get(
      (out.tokens, out.lengths, out.logprobs))
  check_finite([lp[:n] for lp, n in zip(logprobs, lengths)], "generate_text")
  texts = []
  for row, n in zip(tokens, lengths):
    row = [t for t in row[:n] if t not in config.eos_token_ids]
    text = tokenizer.decode(row, skip_special_tokens=True)
    for s in stop_strings:
      if s in text:
        text = text[:text.index(s) + len(s)]
    texts.append(text)
  return texts
