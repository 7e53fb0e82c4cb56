"""The commands the docs tell users to run are accepted by the code as written.

Each `python -m seed_jax.<module> ...` in README.md, docs/, the launch/
scripts' and configs/' comments (code blocks and inline code) goes through
its module's own flag parser, and its gin files and bindings through
`train.planned_updates`, as the module would read them; a
`GIN_FILE=... WORKDIR=... launch/<script>.sh ...` line as the seed_jax.train
arguments the script builds; an inline `--gin...` fragment as a binding of
the default experiment. Nothing trains. Flags a command leaves out (prose
names one flag at a time) are not required here; placeholders (`...`,
`FILE`, `$s`) are skipped, `RUN`, `DIR` and `N` get values.
"""

import argparse
import glob
import os
import re
import shlex

import gin
import pytest

from seed_jax import aot
from seed_jax import chat
from seed_jax import convert
from seed_jax import evaluate
from seed_jax import experiments
from seed_jax import gaps
from seed_jax import search_value
from seed_jax import sweep
from seed_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = re.compile(r"python3? -m seed_jax\.(\w+)")
LAUNCH = re.compile(r"launch/(\w+)\.sh\b")
# A line that runs a launch script: `[VAR=value ...] launch/x.sh ...`.
LAUNCH_LINE = re.compile(r"(?:[A-Z_]+=\S+\s+)*launch/\w+\.sh(?:\s|$)")
# Shell around a command: operators, redirections, comments, quotes closing.
SHELL_END = re.compile(r"\s(?:&&|\|\|?|;|&|>>?|2>|#)(?:\s|$)|`|'$")
PLACEHOLDER = re.compile(r"\.\.\.|\bFILE\b|NAME=VALUE|\$|<\w+>")
# Shown in the docs as what is refused: they must stay errors.
REFUSED = ("--gin.VARIANT=grpo", "--gin.VARIENT='grpo'")


def _sources():
  """(path, text, markdown) of every file whose examples users copy; of the
  scripts and gin files, their comments only, as plain text."""
  for pattern in ("README.md", "docs/**/*.md", "launch/*.sh",
                  "configs/**/*.gin", "configs/sweeps/*.py"):
    for path in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
      with open(path) as f:
        text = f.read()
      if path.endswith((".sh", ".gin")):
        text = "\n".join(line.strip().lstrip("#").strip()
                         if line.strip().startswith("#") else ""
                         for line in text.splitlines())
      yield os.path.relpath(path, ROOT), text, path.endswith(".md")


def _code_lines(text, markdown):
  """(line number, line) of shell lines, continuations joined: in Markdown
  those of fenced and indented blocks, elsewhere every line."""
  lines, fenced = [], False
  for line in text.split("\n"):
    if line.strip().startswith("```"):
      fenced = not fenced
      lines.append("")
    else:
      code = not markdown or fenced or line.startswith("    ")
      lines.append(line if code else "")
  i = 0
  while i < len(lines):
    start, line = i, lines[i]
    while line.rstrip().endswith("\\") and i + 1 < len(lines):
      i += 1
      line = line.rstrip()[:-1] + " " + lines[i].strip()
    i += 1
    yield start + 1, line.strip()


def _snippets():
  """(where, text, inline) of each shell line that runs a module or starts
  with a launch script, and each inline code span."""
  for path, text, markdown in _sources():
    if markdown:
      prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"),
                     text, flags=re.S)
      for m in re.finditer(r"`([^`]+)`", prose):
        where = f"{path}:{prose.count(chr(10), 0, m.start()) + 1}"
        yield where, " ".join(m.group(1).split()), True
    for number, line in _code_lines(text, markdown):
      if MODULE.search(line) or LAUNCH_LINE.match(line):
        yield f"{path}:{number}", line, False


def _commands():
  """pytest params: (kind, words), kind a module, `launch/<x>.sh`, "gin" for
  an inline fragment of train flags, or "refused" for one shown as an
  error."""
  params, seen = [], set()
  for where, text, inline in _snippets():
    found = [(m.group(1), text[m.end():]) for m in MODULE.finditer(text)]
    if not found and LAUNCH_LINE.match(text):
      found.append((LAUNCH.search(text).group(0), text))
    if not found and inline and text.startswith("--gin") and "=" in text:
      found.append(("refused" if text in REFUSED else "gin", text))
    for kind, rest in found:
      rest = rest if kind in ("gin", "refused") else SHELL_END.split(rest)[0]
      if PLACEHOLDER.search(rest) or (kind, rest) in seen:
        continue
      seen.add((kind, rest))
      rest = re.sub(r"\[(--\w+=\w+)\]", r"\1", rest)  # [--step=N]
      rest = re.sub(r"=N\b", "=3", rest)
      rest = re.sub(r"\b(RUN|DIR)\b", "/unused/run", rest)
      params.append(pytest.param(kind, shlex.split(rest), id=where))
  return params


class _Parsed(Exception):
  pass


@pytest.fixture(name="parsers")
def _parsers(monkeypatch):
  """Flags a command leaves out are not required; `stop()` makes
  parse_args end the call after a successful parse (for a main that goes
  on to work)."""
  known = argparse.ArgumentParser.parse_known_args

  def relaxed(self, args=None, namespace=None):
    for action in self._actions:  # pylint: disable=protected-access
      if action.option_strings:
        action.required = False
    return known(self, args, namespace)

  monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", relaxed)

  def stop():
    full = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
      raise _Parsed(full(self, args, namespace))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
  return stop


@pytest.fixture(autouse=True)
def _fresh_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _train_argv(words):
  """The seed_jax.train arguments of `[VAR=value ...] launch/x.sh ...`, or
  None where it names no GIN_FILE (a script named in prose, `logs`)."""
  words, env = list(words), {}
  while re.fullmatch(r"[A-Z_]+=.*", words[0]):
    key, _, value = words.pop(0).partition("=")
    env[key] = value
  script, args = words[0], words[1:]
  assert os.path.isfile(os.path.join(ROOT, script)), script
  if script == "launch/tpu_vm.sh" and args:
    actions = ("create", "copy", "install", "run", "logs", "delete", "up")
    assert args[0] in actions, args
    args = args[1:]
  if "GIN_FILE" not in env:
    assert not args, "gin args without GIN_FILE"
    return None
  return [f"--gin_file={env['GIN_FILE']}",
          f"--gin.WORKDIR='{env.get('WORKDIR', '/unused/run')}'", *args]


@pytest.mark.parametrize("kind,words", _commands())
def test_documented_command_parses(kind, words, parsers, tmp_path, capsys,
                                   monkeypatch):
  # The external analyzer's endpoint, set as the README says.
  monkeypatch.setenv("SEED_TEACHER_BASE_URL", "http://teacher:8000/v1")
  monkeypatch.setenv("SEED_TEACHER_MODEL", "judge")
  if kind in ("gin", "refused"):
    if not any(w.startswith("--gin_file=configs/experiments/")
               for w in words):
      words = [f"--gin_file={train.DEFAULT_GIN}", *words]
    if kind == "refused":
      with pytest.raises(ValueError):
        train.planned_updates(words)
    else:
      train.planned_updates(words)
  elif kind.startswith("launch/"):
    argv = _train_argv(words)
    if argv is not None:
      train.planned_updates(argv)
  elif kind == "train":
    train.planned_updates(words)
  elif kind == "experiments":
    args = experiments.parse_flags(words)
    if args.command == "run":
      dry = [w for w in words if not w.startswith("--out")]
      assert experiments.main([*dry, f"--out={tmp_path}", "--dry_run"]) == 0
      assert "python -m seed_jax.train" in capsys.readouterr().out
  elif kind == "evaluate":
    evaluate.parse_flags(words)
  elif kind == "aot":
    args = aot.parse_flags(words)
    if args.model:
      aot.run_config(args.gin_file or [aot.EXPERIMENTS[args.model]], args.gin)
  elif kind == "sweep":
    args = sweep.parse_flags(words)
    if args.sweep and args.gin_file:
      for i, b in enumerate(sweep.load(args.sweep)):
        train.planned_updates(sweep.train_argv(
            args.gin_file, str(tmp_path / str(i)), b, args.extra))
  else:
    main = {"convert": convert.parse_flags, "gaps": gaps.main,
            "chat": chat.main, "search_value": search_value.main}.get(kind)
    assert main is not None, f"no command seed_jax.{kind} is checked here"
    parsers()
    with pytest.raises(_Parsed):
      main(words)


def test_commands_are_found():
  kinds = {p.values[0] for p in _commands()}
  assert kinds >= {"train", "experiments", "evaluate", "aot", "sweep",
                   "convert", "gaps", "chat", "gin", "refused",
                   "launch/tpu_vm.sh", "launch/slurm_gpu.sh",
                   "launch/run_host.sh"}


def _includes(path):
  with open(os.path.join(ROOT, path)) as f:
    return re.findall(r"^include '([^']+)'", f.read(), flags=re.M)


def test_every_gin_file_is_parsed_by_a_test():
  """configs_test parses each experiment with its includes, and the
  external teacher file after each (below); any other file must be
  included by an experiment, or no test parses it."""
  reached, todo = set(), sorted(glob.glob("configs/experiments/*.gin",
                                          root_dir=ROOT))
  while todo:
    path = todo.pop()
    if path not in reached:
      reached.add(path)
      todo += _includes(path)
  reached.add("configs/runs/external_teacher.gin")
  every = set(glob.glob("configs/**/*.gin", root_dir=ROOT, recursive=True))
  assert every - reached == set()


@pytest.mark.parametrize(
    "path", sorted(glob.glob("configs/experiments/*.gin", root_dir=ROOT)),
    ids=os.path.basename)
def test_the_external_teacher_file_goes_after_every_experiment(path,
                                                              monkeypatch):
  monkeypatch.setenv("SEED_TEACHER_BASE_URL", "http://teacher:8000/v1")
  monkeypatch.setenv("SEED_TEACHER_MODEL", "judge")
  bindings = ["WORKDIR = '/unused'"]
  if "qwen" in path:  # these files take your model folder
    bindings.append("MODEL_DIR = '/unused/model'")
  train.parse_gin([path, "configs/runs/external_teacher.gin"], bindings,
                  finalize=True)
  assert gin.query_parameter("%ANALYZER") == "external"
  teacher = gin.query_parameter("train.train.teacher")
  assert teacher.scoped_configurable_fn().mode == gin.query_parameter(
      "%ANALYSIS_MODE")
