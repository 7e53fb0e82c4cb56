"""Token ids from callers, checked on the host before a jitted call.

The embedding lookup takes no check of its own (an id past the vocabulary
reads as NaN), so the sampler and scorer run `check_token_ids` on their
callers' arrays through `host_checked`.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import numpy as np


def _readable(x: Any) -> bool:
  """Whether this process can read x's values: not a tracer (inside a
  caller's jit), nor a `jax.ShapeDtypeStruct` (a shape, no values: jit
  names it in its own error), nor an array with shards on other processes."""
  if isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)):
    return False
  return not isinstance(x, jax.Array) or x.is_fully_addressable


def check_token_ids(vocab_size: int, ids: Mapping[str, Any],
                    masks: Mapping[str, Any] | None = None) -> None:
  """Raises ValueError for a token id outside [0, vocab_size).

  The embedding lookup takes no check: an id >= vocab_size reads as NaN,
  which reaches every logit of its row (from a padding position too, through
  attention's zero weights), and a negative id reads another token's row.
  Padding positions are checked like the rest. Arrays this process cannot
  read (tracers, arrays spread over other processes) are let through; the
  others are read once, together.

  Args:
    vocab_size: the model's.
    ids: argument name -> token ids (any shape).
    masks: argument name -> its mask, read only to say when every bad id
      sits at a padding position.
  """
  arrays = jax.device_get({k: v for k, v in ids.items() if _readable(v)})
  for name, a in arrays.items():
    a = np.asarray(a)
    if not a.size or (a.min() >= 0 and a.max() < vocab_size):
      continue
    bad = (a < 0) | (a >= vocab_size)
    values = [int(v) for v in np.unique(a[bad])]
    shown = ", ".join(map(str, values[:5]))
    if len(values) > 5:
      shown += f" and {len(values) - 5} more"
    where = ""
    mask = (masks or {}).get(name)
    if mask is not None and _readable(mask):
      mask = np.asarray(jax.device_get(mask)).astype(bool)
      if mask.shape == a.shape and not (bad & mask).any():
        where = (" at padding positions (mask 0), which need ids in range "
                 "too: an id >= vocab_size there makes its row's logits NaN")
    raise ValueError(
        f"{name}: token id(s) {shown} outside the model's vocabulary "
        f"(vocab_size={vocab_size}: ids 0 to {vocab_size - 1}){where}")


def host_checked(check):
  """Decorates a jitted function with `check(*args, **kwargs)`, run on the
  host before each call (e.g. `check_token_ids` on the caller's arrays).

  The jitted function's `lower`, `trace`, `eval_shape`, `clear_cache` and
  `_cache_size` are kept, unchecked. Inside a caller's own jit the check sees
  tracers, which `check_token_ids` lets through.
  """

  def decorate(jitted):

    @functools.wraps(jitted)
    def call(*args, **kwargs):
      check(*args, **kwargs)
      return jitted(*args, **kwargs)

    for name in ("lower", "trace", "eval_shape", "clear_cache",
                 "_cache_size"):
      setattr(call, name, getattr(jitted, name))
    return call

  return decorate
