"""Both spellings of a gin binding reach gin in the order they were written."""

import pytest

from seed_jax import aot
from seed_jax import experiments
from seed_jax import gin_flags
from seed_jax import train

MIXED = ["--gin.N=1", "--gin", "N=2", "--gin.M='a=b'", "--gin=N=3",
         "--gin.N=4"]
IN_ORDER = ["N=1", "N=2", "M='a=b'", "N=3", "N=4"]


def test_in_order_rewrites_only_the_dotted_spelling():
  assert gin_flags.in_order(["--gin.N=1", "--gin", "N=2", "--gin_file=a.gin",
                             "--gin.flag_without_value", "x"]) == [
      "--gin=N=1", "--gin", "N=2", "--gin_file=a.gin",
      "--gin.flag_without_value", "x"]


def test_every_entry_point_keeps_the_order_gin_applies():
  """gin keeps a name's last binding: the one written last must win."""
  assert train.parse_flags(MIXED).gin == IN_ORDER
  assert experiments.parse_flags(["run", "--out=o", *MIXED]).gin == IN_ORDER
  assert aot.parse_flags(["--model=tiny", "--topology=v5p-8",
                          *MIXED]).gin == IN_ORDER


def test_a_refused_dotted_binding_is_named_as_written(capsys):
  """`status` takes no binding: the error names what was typed."""
  with pytest.raises(SystemExit):
    experiments.parse_flags(["status", "--out=o", "--gin.N=1"])
  assert "unrecognized argument '--gin.N=1'" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    experiments.parse_flags(["status", "--out=o", "--gin=N=1"])
  assert "unrecognized argument '--gin=N=1'" in capsys.readouterr().err
