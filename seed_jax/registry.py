"""Name -> function tables, so that gin bindings can select functions by name."""

from __future__ import annotations

from typing import Any, Callable

Fn = Callable[..., Any]


class Registry:
  """Functions registered under unique names.

  Example:
    LOSSES = Registry("loss")

    @LOSSES.register("ppo_clip")
    def ppo_clip(...): ...

    LOSSES.get("ppo_clip")  # -> ppo_clip; an unknown name lists the known
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._fns: dict[str, Fn] = {}

  def register(self, name: str) -> Callable[[Fn], Fn]:
    """Decorator registering a function under `name` (taken names raise)."""
    def wrap(fn: Fn) -> Fn:
      if name in self._fns:
        raise ValueError(f"{self.kind} {name!r} is already registered")
      self._fns[name] = fn
      return fn
    return wrap

  def get(self, name: str) -> Fn:
    """The function registered as `name`.

    Raises:
      ValueError: no function has that name; the message lists known names.
    """
    if name not in self._fns:
      raise ValueError(f"unknown {self.kind} {name!r}; known: "
                       f"{sorted(self._fns)}")
    return self._fns[name]

  def names(self) -> list[str]:
    return sorted(self._fns)
