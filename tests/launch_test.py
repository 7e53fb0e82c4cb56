"""launch/ scripts in dry-run mode: exact commands, missing variables."""

import json
import os
import shlex
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TPU = dict(TPU_NAME="seed-pod", ZONE="us-east5-a", ACCELERATOR_TYPE="v5p-32",
           RUNTIME_VERSION="v2-alpha-tpuv5", TMPDIR="/scratch",
           GIN_FILE="configs/experiments/tiny.gin", WORKDIR="/mnt/runs/a")
GIN_ARGS = ("--gin.VARIANT='grpo'", "--gin.NUM_UPDATES=3")


@pytest.fixture(name="fake_bin")
def _fake_bin(tmp_path):
  """gcloud and srun that fail if ever run; an scontrol that lists 2 nodes;
  a python3 (tpu_vm.sh's local gin check) that logs its arguments to
  python3.calls, one JSON list a call, and passes."""
  for name in ("gcloud", "srun"):
    (tmp_path / name).write_text("#!/bin/sh\necho ran >&2\nexit 99\n")
  (tmp_path / "scontrol").write_text("#!/bin/sh\necho gpu-a1\necho gpu-a2\n")
  (tmp_path / "python3").write_text(
      f"#!{sys.executable}\nimport json, sys\n"
      f"with open({str(tmp_path / 'python3.calls')!r}, 'a') as f:\n"
      "  f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
  for p in tmp_path.iterdir():
    p.chmod(0o755)
  return str(tmp_path)


def _run(fake_bin, script, *args, cwd=None, **env):
  full = {"PATH": fake_bin + os.pathsep + os.environ["PATH"],
          "HOME": os.environ.get("HOME", "/"), "DRY_RUN": "1"}
  full.update(env)
  return subprocess.run([os.path.join(ROOT, "launch", script), *args],
                        env=full, capture_output=True, text=True, check=False,
                        timeout=30, cwd=cwd or fake_bin)


def _lines(res):
  assert res.returncode == 0, res.stderr
  return res.stdout.splitlines()


def test_tpu_vm_up_prints_every_command(fake_bin):
  ssh = "gcloud compute tpus tpu-vm ssh seed-pod"
  lines = _lines(_run(fake_bin, "tpu_vm.sh", "up", *GIN_ARGS, **TPU))
  assert lines == [
      "gcloud compute tpus tpu-vm create seed-pod --accelerator-type=v5p-32 "
      "--version=v2-alpha-tpuv5 --zone=us-east5-a",
      "git ls-files -z --cached --others --exclude-standard | "
      "tar --null -T - --ignore-failed-read -czf "
      "/scratch/seed_jax_code_seed-pod.tgz",
      "gcloud compute tpus tpu-vm scp /scratch/seed_jax_code_seed-pod.tgz "
      "seed-pod:~/seed_jax_code.tgz --worker=all --zone=us-east5-a",
      f"{ssh} --worker=all '--command=mkdir -p ~/seed_jax && tar -xzf "
      "~/seed_jax_code.tgz -C ~/seed_jax' --zone=us-east5-a",
      f"{ssh} --worker=all '--command=cd ~/seed_jax && if ! python3 -c "
      "'\\''import sys; sys.exit(sys.version_info < (3, 11))'\\''; then echo "
      "\"python3 on $(hostname) is $(python3 --version 2>&1): seed_jax needs "
      "Python >= 3.11; install one and set PYTHON (e.g. PYTHON=python3.11)\" "
      ">&2; exit 1; fi && python3 -m venv .venv && .venv/bin/pip install -q "
      "-r requirements.txt '\\''jax[tpu]==0.10.2'\\'' && .venv/bin/pip "
      "install -q --no-deps -e .' --zone=us-east5-a",
      f"{ssh} --worker=all '--command=cd ~/seed_jax || exit 1; if pgrep -f "
      "seed_jax[.]train > /dev/null; then echo a seed_jax trainer already "
      "runs on $(hostname), see ~/seed_jax.log >&2; exit 1; fi; "
      "GIN_FILE=configs/experiments/tiny.gin WORKDIR=/mnt/runs/a "
      "SEED_DISTRIBUTED=1 PYTHON=.venv/bin/python setsid nohup "
      "launch/run_host.sh \"--gin.VARIANT='\\''grpo'\\''\" "
      "--gin.NUM_UPDATES=3 >> ~/seed_jax.log 2>&1 < /dev/null &' "
      "--zone=us-east5-a",
  ]
  # The printed lines are shell words: the remote command keeps the binding.
  remote = shlex.split(lines[5])[7][len("--command="):]
  words = shlex.split(remote)
  start = words.index("launch/run_host.sh")
  assert words[start:start + 3] == ["launch/run_host.sh", *GIN_ARGS]
  # The gin settings were parsed here once, as on a slice of several hosts.
  assert [c[2:] for c in _python3_calls(fake_bin)] == [[
      "True", "--gin_file=configs/experiments/tiny.gin",
      "--gin.WORKDIR='/mnt/runs/a'", *GIN_ARGS]]


def _python3_calls(fake_bin):
  path = os.path.join(fake_bin, "python3.calls")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("action", ["run", "up"])
def test_tpu_vm_refuses_a_gin_file_not_in_the_checkout(fake_bin, action):
  env = dict(TPU, GIN_FILE="configs/experiments/typo.gin")
  res = _run(fake_bin, "tpu_vm.sh", action, **env)
  assert res.returncode == 2
  assert ("GIN_FILE=configs/experiments/typo.gin not found in this checkout "
          f"({ROOT})") in res.stderr
  assert res.stdout == ""  # not even the create line
  assert not _python3_calls(fake_bin)


def test_tpu_vm_checks_the_gin_settings_here_before_creating(fake_bin,
                                                            tmp_path):
  """With this machine's Python: a slice of several hosts needs
  train.train.mesh_shape, and a binding gin refuses stops the launch; one
  host needs no mesh."""
  env = dict(TPU, LOCAL_PYTHON=sys.executable)
  mesh = "--gin.train.train.mesh_shape=(1, -1, 1)"
  res = _run(fake_bin, "tpu_vm.sh", "up", **env)
  assert res.returncode == 2 and res.stdout == ""
  assert ("error: a run on several hosts needs train.train.mesh_shape"
          in res.stderr)
  res = _run(fake_bin, "tpu_vm.sh", "up", mesh, "--gin.VARIENT='grpo'", **env)
  assert res.returncode == 2 and res.stdout == ""
  assert "sets macro VARIENT, which no configuration uses" in res.stderr
  lines = _lines(_run(fake_bin, "tpu_vm.sh", "up", mesh, **env))
  assert lines[0].startswith("gcloud compute tpus tpu-vm create ")
  res = _run(fake_bin, "tpu_vm.sh", "run",
             **dict(env, ACCELERATOR_TYPE="v5p-8"))
  assert res.returncode == 0, res.stderr
  # A Python without seed_jax's requirements (no site-packages), or none:
  # not checked, and said so.
  bare = tmp_path / "bare_python"
  bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
  bare.chmod(0o755)
  for python in (str(bare), "no-such-python"):
    res = _run(fake_bin, "tpu_vm.sh", "up", **dict(TPU, LOCAL_PYTHON=python))
    assert res.returncode == 0, res.stderr
    assert "note: the gin settings are not checked here" in res.stderr
    assert "LOCAL_PYTHON" in res.stderr


def test_tpu_vm_local_check_stops_on_a_broken_checkout(fake_bin, tmp_path):
  """A checkout whose seed_jax does not import is not a missing requirement:
  every worker would fail the same way, so nothing is created."""
  site = tmp_path / "site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(
      "import sys\n"
      "class _Broken:\n"
      "  def find_spec(self, name, path=None, target=None):\n"
      "    if name == 'seed_jax.train':\n"
      "      raise SyntaxError(\"'(' was never closed\")\n"
      "sys.meta_path.insert(0, _Broken())\n")
  python = tmp_path / "python"
  python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} '
                    '"$@"\n')
  python.chmod(0o755)
  mesh = "--gin.train.train.mesh_shape=(1, -1, 1)"
  res = _run(fake_bin, "tpu_vm.sh", "up", mesh,
             **dict(TPU, LOCAL_PYTHON=str(python)))
  assert res.returncode == 2 and res.stdout == ""
  assert "was never closed" in res.stderr
  assert "not checked here" not in res.stderr


def test_tpu_vm_workdir_with_a_space_stays_an_assignment(fake_bin):
  env = dict(TPU, WORKDIR="/mnt/my runs/a")
  line = _lines(_run(fake_bin, "tpu_vm.sh", "run", **env))[0]
  remote = shlex.split(line)[7][len("--command="):]
  # What the worker's shell makes of the assignments before the script.
  assignments = remote.split("; fi; ", 1)[1].split(" PYTHON=")[0]
  out = subprocess.run(["bash", "-c", f"{assignments} printenv WORKDIR"],
                       capture_output=True, text=True, check=True).stdout
  assert out == "/mnt/my runs/a\n"


@pytest.mark.parametrize("action", ["run", "up"])
def test_tpu_vm_refuses_a_relative_workdir_before_anything_runs(fake_bin,
                                                                action):
  res = _run(fake_bin, "tpu_vm.sh", action, **dict(TPU, WORKDIR="runs/a"))
  assert res.returncode == 2
  assert "WORKDIR=runs/a is relative" in res.stderr
  assert res.stdout == ""  # not even a dry-run command
  ok = _run(fake_bin, "tpu_vm.sh", "run", **dict(TPU, WORKDIR="gs://b/runs"))
  assert ok.returncode == 0, ok.stderr


def test_tpu_vm_run_refuses_beside_a_live_trainer_and_keeps_the_log(
    fake_bin, tmp_path):
  line = _lines(_run(fake_bin, "tpu_vm.sh", "run", "--gin.X=1", **TPU))[0]
  remote = shlex.split(line)[7][len("--command="):]
  # A worker's home: a checkout whose run_host.sh logs its arguments.
  home = tmp_path / "home"
  (home / "seed_jax" / "launch").mkdir(parents=True)
  host = home / "seed_jax" / "launch" / "run_host.sh"
  host.write_text("#!/bin/sh\necho started \"$@\"\n")
  host.chmod(0o755)
  (home / "seed_jax.log").write_text("earlier run\n")
  # pgrep stands in for the process table: a trainer runs while the file
  # `trainer` exists, and the pattern must not match the worker's own shell.
  (home / "bin").mkdir()
  (home / "bin" / "pgrep").write_text(
      '#!/bin/sh\n[ "$*" = "-f seed_jax[.]train" ] && [ -e "$HOME/trainer" ]\n')
  (home / "bin" / "pgrep").chmod(0o755)
  env = dict(os.environ, HOME=str(home),
             PATH=f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")

  def worker():
    res = subprocess.run(["bash", "-c", remote], env=env, cwd=home,
                         capture_output=True, text=True, timeout=30)
    time.sleep(0.5)  # the started script is in the background
    return res

  (home / "trainer").write_text("")
  res = worker()
  assert res.returncode == 1
  assert "a seed_jax trainer already runs on" in res.stderr
  assert (home / "seed_jax.log").read_text() == "earlier run\n"
  (home / "trainer").unlink()
  assert worker().returncode == 0
  assert (home / "seed_jax.log").read_text() == (
      "earlier run\nstarted --gin.X=1\n")


def _stub_python(path, version):
  """An interpreter that reports `version` and logs what else it runs; its
  `-m venv .venv` makes a .venv/bin/pip that logs too."""
  path.write_text(f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
if args == ["--version"]:
  print("Python {'.'.join(map(str, version))}")
elif args[:1] == ["-c"]:
  sys.version_info = {tuple(version) + ("final", 0)!r}
  exec(args[1])
else:
  with open(os.path.join(os.environ["HOME"], "calls"), "a") as f:
    f.write(" ".join([os.path.basename(sys.argv[0])] + args) + "\\n")
  if args == ["-m", "venv", ".venv"]:
    os.makedirs(".venv/bin")
    with open(".venv/bin/pip", "w") as f:
      f.write('#!/bin/sh\\necho pip "$@" >> "$HOME/calls"\\n')
    os.chmod(".venv/bin/pip", 0o755)
""")
  path.chmod(0o755)


@pytest.mark.parametrize("python,version,ok", [
    (None, (3, 10, 12), False), ("python3.11", (3, 11, 9), True),
    ("python3.9", (3, 9, 2), False)])
def test_tpu_vm_install_checks_the_workers_python_first(fake_bin, tmp_path,
                                                        python, version, ok):
  # The pins (numpy 2.4, jax 0.10, ...) need Python 3.11; TPU VM images may
  # ship 3.10, where pip would fail half way through the install.
  env = dict(TPU) if python is None else dict(TPU, PYTHON=python)
  line = _lines(_run(fake_bin, "tpu_vm.sh", "install", **env))[0]
  remote = shlex.split(line)[7][len("--command="):]
  home = tmp_path / "home"
  (home / "seed_jax").mkdir(parents=True)
  (home / "bin").mkdir()
  _stub_python(home / "bin" / (python or "python3"), version)
  res = subprocess.run(
      ["bash", "-c", remote], cwd=home, capture_output=True, text=True,
      timeout=30, env=dict(os.environ, HOME=str(home),
                           PATH=f"{home / 'bin'}{os.pathsep}"
                           f"{os.environ['PATH']}"))
  calls = home / "calls"
  if ok:
    assert res.returncode == 0, res.stderr
    assert calls.read_text().splitlines() == [
        f"{python} -m venv .venv",
        "pip install -q -r requirements.txt jax[tpu]==0.10.2",
        "pip install -q --no-deps -e ."]
  else:
    assert res.returncode == 1
    shown = ".".join(map(str, version))
    assert (f"{python or 'python3'} on {socket.gethostname()} is Python "
            f"{shown}: seed_jax needs Python >= 3.11") in res.stderr
    assert "PYTHON=python3.11" in res.stderr
    assert not calls.exists()  # no venv, no pip
    assert not (home / "seed_jax" / ".venv").exists()


def test_tpu_vm_copy_ships_what_git_does_not_ignore(fake_bin, tmp_path):
  # The script's own copy step, in a checkout with ignored run folders.
  repo = tmp_path / "repo"
  (repo / "launch").mkdir(parents=True)
  for name in ("tpu_vm.sh", "lib.sh"):
    (repo / "launch" / name).write_text(
        open(os.path.join(ROOT, "launch", name)).read())
  (repo / "launch" / "tpu_vm.sh").chmod(0o755)
  (repo / ".gitignore").write_text("/runs/\n/workdir*/\n*.pyc\n")
  for name in ("runs/a/ckpt", "workdir1/f", "pkg/mod.pyc", "pkg/mod.py"):
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text("x")
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
  subprocess.run(git + ["init", "-q"], check=True)
  subprocess.run(git + ["add", "-A"], check=True)
  subprocess.run(git + ["commit", "-qm", "x"], check=True)
  (repo / "new.py").write_text("x")  # new, not yet committed: shipped
  tarball = tmp_path / "seed_jax_code_seed-pod.tgz"
  full = {"PATH": fake_bin + os.pathsep + os.environ["PATH"],
          "HOME": os.environ.get("HOME", "/"), **TPU,
          "TMPDIR": str(tmp_path)}
  res = subprocess.run([str(repo / "launch" / "tpu_vm.sh"), "copy"], env=full,
                       capture_output=True, text=True, timeout=30)
  assert "ran" in res.stderr  # stopped at the fake gcloud, after the tar
  names = subprocess.run(["tar", "-tzf", str(tarball)], capture_output=True,
                         text=True, check=True).stdout.split()
  assert sorted(names) == [".gitignore", "launch/lib.sh", "launch/tpu_vm.sh",
                           "new.py", "pkg/mod.py"]


def test_tpu_vm_up_checks_the_run_before_creating(fake_bin):
  env = dict(TPU)
  del env["GIN_FILE"]
  res = _run(fake_bin, "tpu_vm.sh", "up", **env)
  assert res.returncode != 0 and "GIN_FILE" in res.stderr
  assert res.stdout == ""  # nothing created


def test_tpu_vm_usage_and_stray_arguments(fake_bin):
  # Usage needs no variables; a missing action is an error with it.
  res = _run(fake_bin, "tpu_vm.sh", "--help")
  assert res.returncode == 0 and res.stdout.startswith("usage: ")
  res = _run(fake_bin, "tpu_vm.sh")
  assert res.returncode == 2 and res.stderr.startswith("usage: ")
  # Only run and up take (gin) arguments; others refuse them, running nothing.
  res = _run(fake_bin, "tpu_vm.sh", "delete", "--force", **TPU)
  assert res.returncode == 2 and res.stdout == ""
  assert "delete takes no arguments, got: --force" in res.stderr


def test_tpu_vm_logs_and_delete(fake_bin):
  lines = _lines(_run(fake_bin, "tpu_vm.sh", "logs", LOG_WORKER="2", **TPU))
  assert lines == ["gcloud compute tpus tpu-vm ssh seed-pod --worker=2 "
                   "'--command=tail -n +1 -F ~/seed_jax.log' --zone=us-east5-a"]
  lines = _lines(_run(fake_bin, "tpu_vm.sh", "delete", PROJECT="p1", **TPU))
  assert lines == ["gcloud compute tpus tpu-vm delete seed-pod --quiet "
                   "--zone=us-east5-a --project=p1"]


def test_run_host(fake_bin):
  env = dict(GIN_FILE="configs/experiments/tiny.gin", WORKDIR="/mnt/runs/a")
  lines = _lines(_run(fake_bin, "run_host.sh", *GIN_ARGS, **env))
  assert lines == ["python3 -m seed_jax.train "
                   "--gin_file=configs/experiments/tiny.gin "
                   "\"--gin.WORKDIR='/mnt/runs/a'\" \"--gin.VARIANT='grpo'\" "
                   "--gin.NUM_UPDATES=3"]
  assert shlex.split(lines[0])[5:] == list(GIN_ARGS)
  res = _run(fake_bin, "run_host.sh", SEED_COORDINATOR="h:1", **env)
  assert res.returncode and "SEED_NUM_PROCESSES" in res.stderr
  res = _run(fake_bin, "run_host.sh", SEED_COORDINATOR="h:1",
             SEED_NUM_PROCESSES="2", **env)
  assert res.returncode and "SEED_PROCESS_ID" in res.stderr
  assert _run(fake_bin, "run_host.sh", SEED_COORDINATOR="h:1",
              SEED_NUM_PROCESSES="2", SLURM_PROCID="1", **env).returncode == 0
  res = _run(fake_bin, "run_host.sh", GIN_FILE=env["GIN_FILE"],
             WORKDIR="/mnt/bob's runs")
  assert res.returncode == 2 and "may not contain a quote" in res.stderr
  assert res.stdout == ""


def test_run_host_paths_are_the_callers(fake_bin, tmp_path):
  """The script runs in the checkout; the caller's relative paths still
  mean the caller's folder."""
  here = tmp_path / "here"
  (here / "mine").mkdir(parents=True)
  (here / "mine" / "a.gin").write_text("")
  lines = _lines(_run(fake_bin, "run_host.sh", cwd=here,
                      GIN_FILE="mine/a.gin", WORKDIR="runs/a"))
  words = shlex.split(lines[0])
  assert words[3:5] == [f"--gin_file={here}/mine/a.gin",
                        f"--gin.WORKDIR='{here}/runs/a'"]
  # A config that is not in the caller's folder is the checkout's.
  lines = _lines(_run(fake_bin, "run_host.sh", cwd=here,
                      GIN_FILE="configs/experiments/tiny.gin",
                      WORKDIR="gs://bucket/run"))
  assert shlex.split(lines[0])[3:5] == [
      "--gin_file=configs/experiments/tiny.gin",
      "--gin.WORKDIR='gs://bucket/run'"]


def test_slurm_gpu_coordinates_on_the_first_node(fake_bin):
  slurm = dict(GIN_FILE="configs/experiments/tiny.gin", WORKDIR="/shared/run",
               SLURM_JOB_NODELIST="gpu-a[1-2]", SLURM_JOB_NUM_NODES="2")
  # The device ids reach each node whole (srun's --export would split them
  # at the commas), and a stale SEED_PROCESS_ID of the caller does not.
  lines = _lines(_run(fake_bin, "slurm_gpu.sh", *GIN_ARGS, GPUS_PER_NODE="4",
                      SEED_PROCESS_ID="0", **slurm))
  assert lines == [
      "srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 "
      "--kill-on-bad-exit=1 --export=ALL env -u SEED_PROCESS_ID "
      "GIN_FILE=configs/experiments/tiny.gin WORKDIR=/shared/run "
      "SEED_COORDINATOR=gpu-a1:8476 SEED_NUM_PROCESSES=2 "
      "SEED_LOCAL_DEVICE_IDS=0,1,2,3 "
      "launch/run_host.sh \"--gin.VARIANT='grpo'\" --gin.NUM_UPDATES=3"]
  for name, value in (("GPUS_PER_NODE", "eight"), ("GPUS_PER_NODE", "0"),
                      ("PORT", "abc"), ("NODES", "-2")):
    res = _run(fake_bin, "slurm_gpu.sh", **{**slurm, name: value})
    assert res.returncode == 2 and res.stdout == ""
    assert f"{name} must be a positive integer, got '{value}'" in res.stderr


def test_slurm_gpu_paths_are_the_callers(fake_bin, tmp_path):
  """srun starts run_host.sh in the checkout; the caller's relative paths
  still mean the caller's folder on every node."""
  here = tmp_path / "here"
  (here / "mine").mkdir(parents=True)
  (here / "mine" / "a.gin").write_text("")
  slurm = dict(SLURM_JOB_NODELIST="gpu-a[1-2]", SLURM_JOB_NUM_NODES="2")
  line = _lines(_run(fake_bin, "slurm_gpu.sh", cwd=here, GIN_FILE="mine/a.gin",
                     WORKDIR="runs/a", **slurm))[0]
  words = shlex.split(line)
  assert f"GIN_FILE={here}/mine/a.gin" in words
  assert f"WORKDIR={here}/runs/a" in words
  # Through an srun that, as Slurm's, runs the task in the folder srun was
  # started in (the script's, the checkout), to the trainer's command line.
  srun_bin = tmp_path / "srun_bin"
  srun_bin.mkdir()
  (srun_bin / "srun").write_text(
      '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
      'SLURM_PROCID=0 DRY_RUN=1 exec "$@"\n')
  (srun_bin / "srun").chmod(0o755)
  path = f"{srun_bin}{os.pathsep}{fake_bin}"

  def trainer_args(gin_file, workdir):
    words = shlex.split(_lines(_run(
        path, "slurm_gpu.sh", "--gin.X=1", cwd=here, DRY_RUN="0",
        GIN_FILE=gin_file, WORKDIR=workdir, **slurm))[0])
    assert words[:3] == ["python3", "-m", "seed_jax.train"]
    return words[3:]

  assert trainer_args("mine/a.gin", "runs/a") == [
      f"--gin_file={here}/mine/a.gin", f"--gin.WORKDIR='{here}/runs/a'",
      "--gin.X=1"]
  # A config that is not in the caller's folder is the checkout's; a bucket
  # and an absolute path are left as they are.
  args = trainer_args("configs/experiments/tiny.gin", "gs://bucket/run")
  assert args[:2] == [
      f"--gin_file={ROOT}/configs/experiments/tiny.gin",
      "--gin.WORKDIR='gs://bucket/run'"]
  assert trainer_args(f"{here}/mine/a.gin", "/shared/run")[:2] == [
      f"--gin_file={here}/mine/a.gin", "--gin.WORKDIR='/shared/run'"]


@pytest.mark.parametrize("script,args,drop", [
    ("tpu_vm.sh", ("create",), "TPU_NAME"),
    ("tpu_vm.sh", ("create",), "ZONE"),
    ("tpu_vm.sh", ("create",), "ACCELERATOR_TYPE"),
    ("tpu_vm.sh", ("create",), "RUNTIME_VERSION"),
    ("tpu_vm.sh", ("run",), "GIN_FILE"),
    ("tpu_vm.sh", ("run",), "WORKDIR"),
    ("run_host.sh", (), "GIN_FILE"),
    ("run_host.sh", (), "WORKDIR"),
    ("slurm_gpu.sh", (), "SLURM_JOB_NODELIST"),
    ("slurm_gpu.sh", (), "WORKDIR"),
])
def test_a_missing_variable_is_named(fake_bin, script, args, drop):
  env = dict(TPU, SLURM_JOB_NODELIST="gpu-a[1-2]", SLURM_JOB_NUM_NODES="2")
  del env[drop]
  res = _run(fake_bin, script, *args, **env)
  assert res.returncode != 0
  assert drop in res.stderr and "ran" not in res.stderr
  assert res.stdout == ""


def test_unknown_action(fake_bin):
  res = _run(fake_bin, "tpu_vm.sh", "launch", **TPU)
  assert res.returncode == 2 and "unknown action 'launch'" in res.stderr
