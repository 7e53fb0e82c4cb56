"""Manifests of checkpoint steps: the size and CRC-32 of each of a step's files.

`write_manifest` records them in `<step>/seed_manifest.json` once a save has
finished (sizes alone with `checksums=False`); `check_manifest` compares the
files with it before a restore, so a truncated, missing or flipped file is
found before orbax reads it. A file that cannot be read (an I/O error other
than a missing file) is tried once more, then raised: no verdict on the step.

A manifest maps each file to its [size, CRC-32] (the CRC null when written
with `checksums=False`):

    {"host/metadata": [58, 584212923], "state/_sharding": [83, 349560858], ...}
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, TypeVar
import zlib

from etils import epath

from seed_jax import atomic

MANIFEST = "seed_manifest.json"
_CHUNK = 8 << 20
T = TypeVar("T")


def _walk(directory: epath.Path):
  # iterdir, not rglob: epath refuses `**` (it would be slow on GCS).
  for p in sorted(directory.iterdir()):
    if p.is_dir():
      yield from _walk(p)
    elif p.name != MANIFEST:
      yield p


def _crc32(path: epath.Path) -> int:
  crc = 0
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return crc


def _read_twice(read: Callable[[epath.Path], T], path: epath.Path,
                name: str) -> T:
  """`read(path)`, tried once more after an I/O error other than a missing
  file (a flaky disk or network mount is no evidence of corruption).

  Raises:
    FileNotFoundError: the file is gone.
    OSError: the second try failed too; the message names `name`.
  """
  try:
    return read(path)
  except FileNotFoundError:
    raise
  except OSError as e:
    logging.warning("reading %s failed (%s: %s); trying again", path,
                    type(e).__name__, e)
  try:
    return read(path)
  except FileNotFoundError:
    raise
  except OSError as e:
    raise OSError(f"{name} could not be read, twice ({type(e).__name__}: "
                  f"{e})") from e


def write_manifest(step_dir: epath.PathLike, *, checksums: bool = True
                   ) -> None:
  """Records the size and CRC-32 (None when not `checksums`) of every file of
  a finished step directory."""
  step_dir = epath.Path(step_dir)
  files = {os.fspath(p.relative_to(step_dir)):
           [p.stat().length, _crc32(p) if checksums else None]
           for p in _walk(step_dir)}
  atomic.write_text(step_dir / MANIFEST, json.dumps(files))


def _read_manifest(path: epath.Path) -> dict[str, list]:
  """A manifest's {file: [size, crc or None]}.

  Raises:
    OSError: the file cannot be read.
    ValueError: it is not JSON, or JSON of another shape (naming what).
  """
  files = json.loads(path.read_text())
  if not isinstance(files, dict):
    raise ValueError(f"{MANIFEST} holds {_clip(files)}, not a "
                     "{file: [size, crc]} object")
  for name, entry in files.items():
    if not (isinstance(entry, list) and len(entry) == 2
            and _is_count(entry[0])
            and (entry[1] is None or _is_count(entry[1]))):
      raise ValueError(f"{MANIFEST} records {name!r} as {_clip(entry)}, "
                       "not [size, crc]")
  return files


def _is_count(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _clip(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 60 else text[:57] + "..."


def check_manifest(step_dir: epath.PathLike) -> str | None:
  """Why a step directory does not match its manifest; None when it does.

  A step without a manifest (the process stopped between the save and the
  manifest) passes; its restore is the check.

  Raises:
    OSError: a file (or the manifest) that is there could not be read, twice
      (an I/O error, not a verdict on the step), naming it;
      FileNotFoundError when one went while it was checked.
  """
  step_dir = epath.Path(step_dir)
  path = step_dir / MANIFEST
  if not path.exists():
    return None
  try:
    files = _read_twice(_read_manifest, path, MANIFEST)
  except ValueError as e:
    return f"unreadable manifest: {e}"
  for name, (size, crc) in files.items():
    p = step_dir / name
    if not p.exists():
      return f"{name} is missing"
    length = _read_twice(lambda f: f.stat().length, p, name)
    if length != size:
      return f"{name} has {length} bytes, {size} were written"
    if crc is not None and _read_twice(_crc32, p, name) != crc:
      return f"{name} does not match its checksum"
  return None


def checksummed(step_dir: epath.PathLike) -> bool:
  """Whether the step's manifest holds a checksum of every file (False when
  it has none or it cannot be read)."""
  try:
    files = _read_manifest(epath.Path(step_dir) / MANIFEST)
  except (OSError, ValueError):
    return False
  return bool(files) and all(crc is not None for _, crc in files.values())
