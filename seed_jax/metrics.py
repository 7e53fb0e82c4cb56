"""Metrics: device-side averages (clu), writers, progress line, history, plot.

The train step returns a flat dict of scalars whose names vary by stage (OPD
metrics exist only when a teacher signal does), so `Averager` keeps one clu
`metrics.Average` per name instead of a fixed `clu.metrics.Collection` class,
whose fields must be declared up front (and be Python identifiers, which
`time/rollout` is not). Averages merge on device in a jitted update and
reach the host only in `compute`, at log time.
"""

from __future__ import annotations

import io
import json
import math
import os
from typing import (Any, Iterable, Iterator, Mapping, Sequence,
                    TYPE_CHECKING)

from clu import metrics as clu_metrics
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import atomic
from seed_jax import losses

if TYPE_CHECKING:
  from clu import metric_writers

# (label, metric name) of the progress line, in order. Phase timings
# (`time/<phase>`, seconds) follow them.
PROGRESS_KEYS: tuple[tuple[str, str], ...] = (
    ("success", "success_rate"),
    ("valid", "valid_action_ratio"),
    ("parsed", "analyses_parsed"),
    ("gate", "opd_gate_mean"),
    ("active", "opd_active_ratio"),
    ("kl", "kl"),
    ("ent", "entropy"),
    ("logp", "logp_agreement"),
)
TIME_PREFIX = "time/"


SKIPPED = "skipped"  # `train_step`'s 1 for a step skipped as non-finite


def _average(value, weight, keep) -> clu_metrics.Average:
  """One step's clu Average of `value`: each element counted once, or by
  `weight` (a token count) when given; empty where `keep` is False. Counts
  are float32, as weights may be fractional."""
  value = jnp.asarray(value, jnp.float32)
  weight = jnp.ones_like(value) if weight is None else weight
  value, weight = jnp.broadcast_arrays(value, jnp.asarray(weight, jnp.float32))
  weight = jnp.where(keep, weight, 0.0)
  # `where`, not a product: a NaN that counts for nothing adds nothing.
  total = jnp.where(weight != 0, value * weight, 0.0)
  return clu_metrics.Average(total=jnp.sum(total), count=jnp.sum(weight))


@jax.jit
def _merge(acc: dict[str, clu_metrics.Average],
           new: dict[str, jax.Array]) -> dict[str, clu_metrics.Average]:
  out = dict(acc)
  skipped = new.get(SKIPPED)
  keep = True if skipped is None else jnp.asarray(skipped) == 0
  for name, value in new.items():
    if name.startswith(losses.WEIGHT_PREFIX):
      continue
    m = _average(value, new.get(losses.weight_key(name)),
                 True if name == SKIPPED else keep)
    out[name] = acc[name].merge(m) if name in acc else m
  return out


@jax.jit
def _compute(acc: dict[str, clu_metrics.Average]) -> dict[str, jax.Array]:
  # 0, not NaN, for a weighted metric that never had a token; NaN (None in
  # the history) for every metric but `skipped` when every step was skipped.
  skipped = acc.get(SKIPPED)
  all_skipped = (False if skipped is None else
                 (skipped.count > 0) & (skipped.total >= skipped.count))
  out = {}
  for name, m in acc.items():
    mean = jnp.where(m.count > 0,
                     m.total / jnp.where(m.count > 0, m.count, 1.0), 0.0)
    out[name] = mean if name == SKIPPED else jnp.where(all_skipped, jnp.nan,
                                                       mean)
  return out


class Averager:
  """Averages per-step metric dicts over mini-batches, on device.

  Example:

    avg = Averager()
    for batch in mini_batches:
      state, m = step(state, batch)  # m: {"loss": [], "kl": [], ...}
      avg.update(m)                  # no host sync
    scalars = avg.compute()          # {"loss": 0.12, "kl": 0.003}; resets

  A name missing from some updates is averaged over the updates that had it.
  A metric sent with a weight (`losses.weight_key(name)`, a token count) is
  averaged by it; the weights themselves are not reported. A step sent with
  `skipped` set (`train_step.train_step` skipped it as non-finite, its
  loss and gradient norm NaN or inf) counts only towards `skipped`, the
  fraction of steps skipped; when all were, the other metrics are NaN.
  """

  def __init__(self):
    self._acc: dict[str, clu_metrics.Average] = {}

  def update(self, metrics: Mapping[str, Any]) -> None:
    """Adds one step's metrics (scalars; an array adds each element)."""
    self._acc = _merge(self._acc, dict(metrics))

  def compute(self, *, reset: bool = True) -> dict[str, float]:
    """Host floats of the averages so far; empty before any update."""
    out = jax.device_get(_compute(self._acc)) if self._acc else {}
    if reset:
      self._acc = {}
    return {k: float(v) for k, v in out.items()}


def make_writer(workdir: epath.PathLike, *, process_index: int | None = None,
                asynchronous: bool = True) -> metric_writers.MetricWriter:
  """clu's default writer: TensorBoard events in `workdir` and the log.

  Only process 0 writes event files; the other processes only log.

  Args:
    workdir: the run's work directory.
    process_index: this process (default `jax.process_index()`).
    asynchronous: write from a background thread (call `flush`/`close`).

  Returns:
    A `MetricWriter` (`write_scalars(step, {...})`, `flush()`, `close()`).
  """
  # Imported here: clu's writers import TensorFlow, seconds that only code
  # that writes needs to spend.
  # pylint: disable-next=g-import-not-at-top,redefined-outer-name
  from clu import metric_writers
  if process_index is None:
    process_index = jax.process_index()
  return metric_writers.create_default_writer(
      os.fspath(workdir), just_logging=process_index != 0,
      asynchronous=asynchronous)


EVENTS_PATTERN = "events.out.tfevents.*"
EARLIER_EVENTS = "earlier_events"


def set_aside_events(workdir: epath.PathLike) -> epath.Path | None:
  """Moves the event files an earlier start left in `workdir` aside.

  A run killed after writing an update's scalars and before saving its
  checkpoint has written points that the resumed run writes again, and
  TensorBoard would draw both. So a (re)start moves the workdir's event files
  into `earlier_events/<n>/` (n = 1, 2, ... per start that found some) and
  writes its restored history into a fresh file (`write_events`):
  the workdir's own TensorBoard run then holds exactly the updates of
  `metrics.jsonl`, and the earlier files stay readable as runs of their own.
  Call it on the writing process only, before `make_writer`.

  Args:
    workdir: the run's work directory.

  Returns:
    The folder the files went to, or None when there were none.
  """
  workdir = epath.Path(workdir)
  found = sorted(workdir.glob(EVENTS_PATTERN)) if workdir.exists() else []
  if not found:
    return None
  parent = workdir / EARLIER_EVENTS
  taken = {p.name for p in parent.iterdir()} if parent.exists() else set()
  n = 1
  while str(n) in taken:
    n += 1
  target = parent / str(n)
  target.mkdir(parents=True)
  for path in found:
    path.rename(target / path.name)
  return target


def write_events(workdir: epath.PathLike, history: "MetricHistory") -> None:
  """Writes `history`'s updates to TensorBoard events in `workdir`, and not to
  the log (a resumed run's console shows only its new updates). Nothing is
  written for an empty history."""
  if not len(history):
    return
  # pylint: disable-next=g-import-not-at-top,redefined-outer-name
  from clu import metric_writers
  writer = metric_writers.SummaryWriter(os.fspath(workdir))
  try:
    for record in history:
      scalars = {k: v for k, v in record.items()
                 if k != "update" and isinstance(v, (int, float))}
      if scalars:
        writer.write_scalars(record["update"], scalars)
  finally:
    writer.close()


def _fmt(value: Any) -> str:
  if value is None:
    return "-"
  value = float(value)
  if not math.isfinite(value):
    return str(value)
  if value == int(value) and abs(value) < 1e6:
    return str(int(value))
  return f"{value:.3g}"


def format_progress(step: int, metrics: Mapping[str, Any],
                    keys: Sequence[tuple[str, str] | str] = PROGRESS_KEYS
                    ) -> str:
  """A compact one-line summary of an update, "-" for missing metrics.

  Example:
    format_progress(12, {"success_rate": 0.4375, "kl": 0.0012,
                         "time/rollout": 31.4, "time/train": 8.02})
    -> "update 12 | success 0.438 | valid - | parsed - | gate - | active - |
        kl 0.0012 | ent - | logp - | time rollout 31.4s train 8.02s"
    (one line)

  Args:
    step: the update number.
    metrics: scalar metrics by name.
    keys: (label, name) pairs, or names used as their own labels.

  Returns:
    The line, without a newline.
  """
  parts = [f"update {step}"]
  for key in keys:
    label, name = (key, key) if isinstance(key, str) else key
    parts.append(f"{label} {_fmt(metrics.get(name))}")
  times = [f"{k[len(TIME_PREFIX):]} {_fmt(v)}s"
           for k, v in sorted(metrics.items()) if k.startswith(TIME_PREFIX)]
  parts.append("time " + (" ".join(times) if times else "-"))
  return " | ".join(parts)


def _scalar(value: Any) -> Any:
  if isinstance(value, (str, type(None))):
    return value
  value = np.asarray(value)
  if value.size != 1:
    raise ValueError(f"metric history holds scalars, got shape {value.shape}")
  value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None  # strict JSON has no NaN/inf
  return value


class MetricHistory:
  """Per-update scalar dicts on the host, JSON-serializable.

  The trainer saves `to_json()` in the checkpoint's host data and rewrites
  `metrics.jsonl` from it (`write_jsonl`), so after a resume the file holds
  exactly the updates the restored state has seen.
  """

  def __init__(self, records: Iterable[Mapping[str, Any]] = ()):
    self.records: list[dict[str, Any]] = [dict(r) for r in records]

  def __len__(self) -> int:
    return len(self.records)

  def __iter__(self) -> Iterator[dict[str, Any]]:
    return iter(self.records)

  def append(self, update: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
    """Adds one update's scalars (arrays become floats; NaN/inf become None).

    Returns:
      The stored record, `{"update": update, **scalars}`.

    Raises:
      ValueError: for a value with more than one element.
    """
    record = {"update": int(update)}
    record.update({k: _scalar(v) for k, v in scalars.items()})
    self.records.append(record)
    return record

  def to_json(self) -> list[dict[str, Any]]:
    return [dict(r) for r in self.records]

  @classmethod
  def from_json(cls, records: Iterable[Mapping[str, Any]] | None
                ) -> "MetricHistory":
    return cls(records or ())

  def series(self, key: str, x: str = "update") -> tuple[list, list]:
    """(xs, ys) of the records that have a value for `key`."""
    pairs = [(r.get(x), r[key]) for r in self.records
             if r.get(key) is not None and r.get(x) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]

  def write_jsonl(self, path: epath.PathLike) -> None:
    """Rewrites `path` with one JSON record per line (atomically)."""
    atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in self.records))


def plot_learning_curve(history: MetricHistory | Iterable[Mapping[str, Any]],
                        path: epath.PathLike, *,
                        keys: Sequence[str] = ("success_rate",
                                               "eval/seen/success",
                                               "eval/unseen/success"),
                        x: str = "update") -> list[str]:
  """Draws the learning curves of `keys` against `x` into a PNG.

  Uses matplotlib's Agg canvas directly (no pyplot, no global backend).

  Args:
    history: a MetricHistory or its records.
    path: the PNG to write (whole or not at all: `atomic.write_bytes`).
    keys: metrics to draw; those without values are left out.
    x: the record field on the horizontal axis.

  Returns:
    The keys that had values and were drawn.
  """
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  if not isinstance(history, MetricHistory):
    history = MetricHistory(history)
  fig = Figure(figsize=(6, 4), dpi=100)
  ax = fig.add_subplot()
  drawn = []
  for key in keys:
    xs, ys = history.series(key, x)
    if xs:
      ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=key)
      drawn.append(key)
  ax.set_xlabel(x)
  ax.grid(alpha=0.3)
  if drawn:
    ax.legend()
  else:
    ax.text(0.5, 0.5, "no data yet", ha="center", va="center",
            transform=ax.transAxes)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png")
  atomic.write_bytes(path, png.getvalue())  # a crash keeps the last one
  return drawn


def success_table(first: dict[str, Any], final: dict[str, Any]) -> str:
  """The seen/unseen success table: overall, then per task family.

  Args:
    first: the first evaluated update's scalars (the starting policy),
      keyed "eval/<seen|unseen>/success[/<family>]"; may be empty.
    final: the last update's scalars, keyed likewise.

  Returns:
    Text: one row per family ("all" first), columns start and final success
    for each split; "-" where a value is missing.
  """
  families = sorted({k.split("/")[3] for k in [*first, *final]
                     if k.startswith("eval/") and k.count("/") == 3
                     and k.split("/")[2] == "success"})
  splits = ("seen", "unseen")
  start_col = any(f"eval/{s}/success" in first for s in splits)
  cell = lambda v: f"{v:8.3f}" if v is not None else f"{'-':>8s}"
  head = "".join(f"{s + ' start':>14s}{s + ' final':>14s}" if start_col else
                 f"{s:>14s}" for s in splits)
  lines = [f"{'success':16s}{head}"]
  for fam in ["all"] + families:
    key = "success" if fam == "all" else f"success/{fam}"
    row = ""
    for s in splits:
      if start_col:
        row += f"{cell(first.get(f'eval/{s}/{key}')):>14s}"
      row += f"{cell(final.get(f'eval/{s}/{key}')):>14s}"
    lines.append(f"{fam:16s}{row}")
  return "\n".join(lines)
