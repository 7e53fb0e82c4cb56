"""Tests for seed_jax.atomic."""

import os

from etils import epath
import pytest

from seed_jax import atomic


def test_writes_whole_file_and_creates_the_parent(tmp_path):
  path = tmp_path / "a" / "b" / "report.json"
  atomic.write_text(path, "first")
  assert path.read_text() == "first"
  atomic.write_text(str(path), "second, longer than the first")
  assert path.read_text() == "second, longer than the first"
  assert os.listdir(path.parent) == ["report.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path, monkeypatch):
  path = tmp_path / "status.json"
  atomic.write_text(path, "old")

  def broken_replace(self, target):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(type(epath.Path(path)), "replace", broken_replace)
  with pytest.raises(OSError, match="No space left"):
    atomic.write_text(path, "new")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["status.json"]


def test_temporary_name_is_per_process(tmp_path, monkeypatch):
  seen = []
  cls = type(epath.Path(tmp_path))
  real_write_text = cls.write_text

  def spy(self, text, *args, **kwargs):
    seen.append(self.name)
    return real_write_text(self, text, *args, **kwargs)

  monkeypatch.setattr(cls, "write_text", spy)
  atomic.write_text(tmp_path / "m.jsonl", "x\n")
  assert seen == [f"m.jsonl.tmp{os.getpid()}"]


def test_an_interrupted_write_leaves_no_partial_temporary(tmp_path,
                                                          monkeypatch):
  path = tmp_path / "summary.md"
  atomic.write_text(path, "old")
  cls = type(epath.Path(path))
  real_write_text = cls.write_text

  def interrupted(self, text, *args, **kwargs):
    real_write_text(self, text[:2], *args, **kwargs)
    raise KeyboardInterrupt

  monkeypatch.setattr(cls, "write_text", interrupted)
  with pytest.raises(KeyboardInterrupt):
    atomic.write_text(path, "new text")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["summary.md"]


def test_write_bytes_writes_whole_file_and_creates_the_parent(tmp_path):
  path = tmp_path / "a" / "curve.png"
  atomic.write_bytes(path, b"\x89PNG first")
  assert path.read_bytes() == b"\x89PNG first"
  atomic.write_bytes(str(path), b"\x00\xffsecond, longer")
  assert path.read_bytes() == b"\x00\xffsecond, longer"
  assert os.listdir(path.parent) == ["curve.png"]


def test_an_interrupted_write_bytes_keeps_the_old_file(tmp_path,
                                                       monkeypatch):
  path = tmp_path / "curve.png"
  atomic.write_bytes(path, b"old")
  cls = type(epath.Path(path))
  real_write_bytes = cls.write_bytes
  seen = []

  def interrupted(self, data, *args, **kwargs):
    seen.append(self.name)
    real_write_bytes(self, data[:2], *args, **kwargs)
    raise KeyboardInterrupt

  monkeypatch.setattr(cls, "write_bytes", interrupted)
  with pytest.raises(KeyboardInterrupt):
    atomic.write_bytes(path, b"new bytes")
  assert seen == [f"curve.png.tmp{os.getpid()}"]
  assert path.read_bytes() == b"old"
  assert os.listdir(tmp_path) == ["curve.png"]


def test_a_local_write_is_synced_before_and_after_the_rename(tmp_path,
                                                             monkeypatch):
  path = tmp_path / "status.json"
  events = []
  cls = type(epath.Path(path))
  real_fsync, real_replace = os.fsync, cls.replace

  def fsync(fd):
    events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
    real_fsync(fd)

  def replace(self, target):
    events.append(("replace", os.fspath(self)))
    return real_replace(self, target)

  monkeypatch.setattr(os, "fsync", fsync)
  monkeypatch.setattr(cls, "replace", replace)
  atomic.write_text(path, "new")
  tmp = f"{path}.tmp{os.getpid()}"
  assert events == [("fsync", tmp), ("replace", tmp),
                    ("fsync", str(tmp_path))]
  assert path.read_text() == "new"
