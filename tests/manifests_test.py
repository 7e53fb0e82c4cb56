"""Manifests on a plain directory: what they record and what a check finds.

The checks through a Checkpointer (skipping, retries, quarantine) are in
checkpoints_test.py.
"""

import errno
import json
import os
import zlib

import pytest

from seed_jax import manifests


def _step(tmp_path):
  """A step directory of two files, one nested, with its manifest."""
  step_dir = tmp_path / "7"
  (step_dir / "state" / "d").mkdir(parents=True)
  (step_dir / "state" / "d" / "x").write_bytes(b"abcdefgh")
  (step_dir / "_METADATA").write_bytes(b"{}")
  return step_dir


def test_a_manifest_records_sizes_and_crcs_and_the_check_finds_damage(
    tmp_path):
  step_dir = _step(tmp_path)
  assert manifests.check_manifest(step_dir) is None  # none yet: passes
  manifests.write_manifest(step_dir)
  files = json.loads((step_dir / manifests.MANIFEST).read_text())
  assert files == {"_METADATA": [2, zlib.crc32(b"{}")],
                   "state/d/x": [8, zlib.crc32(b"abcdefgh")]}
  assert manifests.check_manifest(step_dir) is None
  assert manifests.checksummed(step_dir)
  x = step_dir / "state" / "d" / "x"
  x.write_bytes(b"abcdefgX")  # same size, another byte
  assert manifests.check_manifest(step_dir) == (
      "state/d/x does not match its checksum")
  x.write_bytes(b"abcd")
  assert manifests.check_manifest(step_dir) == (
      "state/d/x has 4 bytes, 8 were written")
  os.remove(x)
  assert manifests.check_manifest(step_dir) == "state/d/x is missing"


def test_sizes_only_catch_a_truncation_not_a_flipped_byte(tmp_path):
  step_dir = _step(tmp_path)
  manifests.write_manifest(step_dir, checksums=False)
  files = json.loads((step_dir / manifests.MANIFEST).read_text())
  assert files == {"_METADATA": [2, None], "state/d/x": [8, None]}
  assert not manifests.checksummed(step_dir)
  (step_dir / "state" / "d" / "x").write_bytes(b"abcdefgX")
  assert manifests.check_manifest(step_dir) is None
  (step_dir / "state" / "d" / "x").write_bytes(b"abc")
  assert "has 3 bytes" in manifests.check_manifest(step_dir)


@pytest.mark.parametrize("text,why", [
    ("not json", "Expecting value"),
    ('{"x": [1, -2]}', "records 'x' as [1, -2], not [size, crc]"),
    ('{"x": [true, 1]}', "records 'x' as [true, 1], not [size, crc]")])
def test_a_manifest_that_does_not_parse_is_named(tmp_path, text, why):
  step_dir = _step(tmp_path)
  (step_dir / manifests.MANIFEST).write_text(text)
  problem = manifests.check_manifest(step_dir)
  assert problem.startswith("unreadable manifest: ") and why in problem
  assert not manifests.checksummed(step_dir)


def test_a_read_error_is_tried_twice_then_raised_naming_the_file(
    tmp_path, monkeypatch):
  step_dir = _step(tmp_path)
  manifests.write_manifest(step_dir)
  real = manifests._crc32  # pylint: disable=protected-access
  tries = []

  def failing(path, times):
    if path.name == "x" and len(tries) < times:
      tries.append(path)
      raise OSError(errno.EIO, "Input/output error")
    return real(path)

  monkeypatch.setattr(manifests, "_crc32", lambda p: failing(p, 1))
  assert manifests.check_manifest(step_dir) is None  # once: tried again
  tries.clear()
  monkeypatch.setattr(manifests, "_crc32", lambda p: failing(p, 2))
  with pytest.raises(OSError, match=r"^state/d/x could not be read, twice "
                     r"\(OSError: .*Input/output error\)"):
    manifests.check_manifest(step_dir)
  assert len(tries) == 2
