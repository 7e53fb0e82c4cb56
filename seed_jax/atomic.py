"""Small-file writes that a crash cannot leave half done.

Every JSON, JSONL, CSV and Markdown file the library rewrites in place (run
status, metrics history, Stage-1 journal, checkpoint manifests, reports) goes
through `write_text`, and every PNG figure (learning curves, experiment
plots) through `write_bytes`, so a reader sees the old file or the new one,
never a prefix of the new one. On a local disk the new file's data is synced
before the rename and the rename after it, so a power cut leaves the old file
or the new one too, never an empty one.
"""

from __future__ import annotations

import os

from etils import epath


def write_text(path: epath.PathLike, text: str) -> None:
  """Writes `text` to `path` whole or not at all.

  The text goes to a temporary file beside `path` whose name carries the
  process id (two writers never share one), which is then renamed over `path`.
  The parent directory is created when missing; the temporary file is removed
  when the write fails. Local files are synced (`sync`).

  Args:
    path: the file to write (local, or any path etils.epath handles).
    text: its new content.
  """
  _write(path, lambda tmp: tmp.write_text(text))


def write_bytes(path: epath.PathLike, data: bytes) -> None:
  """Writes `data` to `path` whole or not at all, as `write_text` does.

  Args:
    path: the file to write (local, or any path etils.epath handles).
    data: its new content.
  """
  _write(path, lambda tmp: tmp.write_bytes(data))


def _write(path: epath.PathLike, write) -> None:
  """`write(tmp)` to a temporary file beside `path`, then renamed over it."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f"{path.name}.tmp{os.getpid()}"
  try:
    write(tmp)
    sync(tmp)
    tmp.replace(path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  sync(path.parent)


def sync(path: epath.PathLike) -> None:
  """fsync of a local file or folder; other file systems sync on close."""
  name = os.fspath(path)
  if "://" in name:
    return
  fd = os.open(name, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)
