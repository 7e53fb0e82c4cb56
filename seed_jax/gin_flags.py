"""The `--gin.NAME=VALUE` spelling of a gin binding on the command line.

The entry points that take `--gin NAME=VALUE` (train, experiments, aot) take
`--gin.NAME=VALUE` too. gin keeps the last binding of a name, so both
spellings must reach it in the order they were written:

  in_order(["--gin.N=1", "--gin", "N=2", "--gin.N=3"])
  -> ["--gin=N=1", "--gin", "N=2", "--gin=N=3"]   # argparse: N=1, N=2, N=3
"""

from __future__ import annotations

from typing import Sequence

PREFIX = "--gin."


def in_order(argv: Sequence[str]) -> list[str]:
  """`argv` with each `--gin.NAME=VALUE` written as `--gin=NAME=VALUE`, so
  that argparse appends every binding to `--gin` where it stands (appending
  the dotted ones after parsing put them after every `--gin NAME=VALUE`)."""
  return [f"--gin={arg[len(PREFIX):]}"
          if arg.startswith(PREFIX) and "=" in arg else arg for arg in argv]


def as_written(arg: str, argv: Sequence[str]) -> str:
  """An argument of `in_order(argv)` as the user wrote it in `argv`, for an
  error message: "--gin=N=1" -> "--gin.N=1" where that was written."""
  dotted = PREFIX + arg[len("--gin="):]
  if arg.startswith("--gin=") and arg not in argv and dotted in argv:
    return dotted
  return arg
