#!/usr/bin/env bash
# A Cloud TPU VM (single host or pod slice) for seed_jax, step by step:
#
#   launch/tpu_vm.sh create     # gcloud compute tpus tpu-vm create
#   launch/tpu_vm.sh copy       # this checkout -> every worker
#   launch/tpu_vm.sh install    # venv + requirements + jax[tpu] on every worker
#   launch/tpu_vm.sh run [--gin.NAME=VALUE ...]  # every worker, in background
#   launch/tpu_vm.sh logs       # stream worker ${LOG_WORKER:-0}'s log
#   launch/tpu_vm.sh delete
#   launch/tpu_vm.sh up [...]   # create, copy, install, run (then: logs)
#
# Required: TPU_NAME, ZONE; ACCELERATOR_TYPE (e.g. v5p-32) and
# RUNTIME_VERSION (e.g. v2-alpha-tpuv5) to create; GIN_FILE and WORKDIR (a
# directory all workers share, e.g. a gcsfuse mount) to run.
# Optional: PROJECT, JAX_TPU (pip spec), TMPDIR, PYTHON (the workers'
# interpreter the venv is made with, default python3; the pinned packages
# need Python >= 3.11, and install stops on a worker whose PYTHON is older,
# before making the venv: e.g. PYTHON=python3.11), LOCAL_PYTHON (this
# machine's interpreter, default python3: run and up first parse GIN_FILE and
# the gin args here as seed_jax.train does, and on a slice of several hosts,
# an ACCELERATOR_TYPE past -8, ask for train.train.mesh_shape; an interpreter
# without seed_jax's requirements skips that, with a note). DRY_RUN=1 prints
# every command instead of running it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/lib.sh

USAGE="usage: launch/tpu_vm.sh create|copy|install|run|logs|delete|up [gin args]"
case "${1:-}" in
  -h|--help) echo "${USAGE}"; exit 0 ;;
  "") echo "${USAGE}" >&2; exit 2 ;;
esac

: "${TPU_NAME:?set TPU_NAME, the TPU VM name}"
: "${ZONE:?set ZONE, e.g. us-east5-a}"
JAX_TPU="${JAX_TPU:-jax[tpu]==0.10.2}"
TARBALL="${TMPDIR:-/tmp}/seed_jax_code_${TPU_NAME}.tgz"  # one per slice
REMOTE_DIR="seed_jax"  # under each worker's home directory
LOG="seed_jax.log"

tpu() {
  run gcloud compute tpus tpu-vm "$@" --zone="${ZONE}" \
    ${PROJECT:+--project="${PROJECT}"}
}

on_workers() {  # on_workers WORKER COMMAND
  tpu ssh "${TPU_NAME}" --worker="$1" --command="$2"
}

create() {
  : "${ACCELERATOR_TYPE:?set ACCELERATOR_TYPE, e.g. v5p-32}"
  : "${RUNTIME_VERSION:?set RUNTIME_VERSION, e.g. v2-alpha-tpuv5}"
  tpu create "${TPU_NAME}" --accelerator-type="${ACCELERATOR_TYPE}" \
    --version="${RUNTIME_VERSION}"
}

copy() {
  # Tracked and new files of this checkout, without what git ignores (as git
  # reads .gitignore: tar's own --exclude-vcs-ignores misses anchored and
  # directory patterns such as /runs/). Deleted tracked files are skipped.
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    echo "git ls-files -z --cached --others --exclude-standard |" \
      "tar --null -T - --ignore-failed-read -czf $(show "${TARBALL}")"
  else
    git ls-files -z --cached --others --exclude-standard |
      tar --null -T - --ignore-failed-read -czf "${TARBALL}"
  fi
  tpu scp "${TARBALL}" "${TPU_NAME}:~/seed_jax_code.tgz" --worker=all
  on_workers all "mkdir -p ~/${REMOTE_DIR} && tar -xzf ~/seed_jax_code.tgz -C ~/${REMOTE_DIR}"
}

install() {
  # The pins (numpy, jax, flax, transformers) need Python >= 3.11; TPU VM
  # images may ship 3.10, where pip would fail half way through.
  local py
  py="$(show "${PYTHON:-python3}")"
  on_workers all "cd ~/${REMOTE_DIR} && if ! ${py} -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then echo \"${py} on \$(hostname) is \$(${py} --version 2>&1): seed_jax needs Python >= 3.11; install one and set PYTHON (e.g. PYTHON=python3.11)\" >&2; exit 1; fi && ${py} -m venv .venv && .venv/bin/pip install -q -r requirements.txt $(show "${JAX_TPU}") && .venv/bin/pip install -q --no-deps -e ."
}

# Parses the run's gin files and bindings as seed_jax.train would
# (`train.planned_updates`); argv: True|False (several hosts), then the
# trainer's arguments.
GIN_CHECK='
import sys
try:
  from seed_jax import train
except ModuleNotFoundError as e:  # no jax, gin, ... on this machine
  if (e.name or "").split(".")[0] == "seed_jax":
    raise  # the checkout itself is broken: so would every worker be
  print(f"note: the gin settings are not checked here: {sys.executable} "
        f"cannot import seed_jax.train ({e}); set LOCAL_PYTHON to one with "
        "the requirements to check them before the slice is paid for",
        file=sys.stderr)
  sys.exit(0)
try:
  train.planned_updates(sys.argv[2:], multi_host=sys.argv[1] == "True")
except (FileNotFoundError, ValueError) as e:
  sys.exit(f"error: {e}")
'

check_run() {  # check_run [gin args]: before anything is created or paid for
  : "${GIN_FILE:?set GIN_FILE, e.g. configs/experiments/qwen2_5_3b_alfworld_style.gin}"
  : "${WORKDIR:?set WORKDIR, a directory all workers share}"
  case "${WORKDIR}" in
    /*|gs://*) ;;
    *) echo "WORKDIR=${WORKDIR} is relative: each worker would resolve it on" \
         "its own disk, under ~/${REMOTE_DIR}; give a shared gs:// or absolute" \
         "path (e.g. a gcsfuse mount)" >&2
       exit 2 ;;
  esac
  # The workers run in their copy of this checkout: a relative GIN_FILE is
  # this checkout's; an absolute one may be on the workers only.
  if [[ "${GIN_FILE}" != /* && ! -f "${GIN_FILE}" ]]; then
    echo "GIN_FILE=${GIN_FILE} not found in this checkout ($(pwd))" >&2
    exit 2
  fi
  if [[ ! -f "${GIN_FILE}" ]]; then
    echo "note: GIN_FILE=${GIN_FILE} is not on this machine; its settings" \
      "are checked on the workers only" >&2
    return
  fi
  local py="${LOCAL_PYTHON:-python3}" several=False
  if [[ "${ACCELERATOR_TYPE:-}" =~ -([0-9]+)$ ]] && (( BASH_REMATCH[1] > 8 )); then
    several=True  # v5p-16, v4-32, v5litepod-16, ...: more than one host
  fi
  if ! command -v "${py}" > /dev/null; then
    echo "note: the gin settings are not checked here: no ${py}; set" \
      "LOCAL_PYTHON to check them before the slice is paid for" >&2
    return
  fi
  if ! "${py}" -c "${GIN_CHECK}" "${several}" --gin_file="${GIN_FILE}" \
      --gin.WORKDIR="'${WORKDIR}'" "$@"; then
    exit 2
  fi
}

start() {
  [[ -n "${run_checked:-}" ]] || check_run "$@"  # up checked it already
  local env_words  # assignments quote their value only
  env_words="GIN_FILE=$(show "${GIN_FILE}") WORKDIR=$(show "${WORKDIR}")"
  # A worker where a trainer still runs refuses (two on one workdir would
  # delete each other's checkpoints); the log is appended to, not truncated.
  # ([.] keeps pgrep from matching this command's own shell.)
  on_workers all "cd ~/${REMOTE_DIR} || exit 1; if pgrep -f seed_jax[.]train > /dev/null; then echo a seed_jax trainer already runs on \$(hostname), see ~/${LOG} >&2; exit 1; fi; ${env_words} SEED_DISTRIBUTED=1 PYTHON=.venv/bin/python setsid nohup launch/run_host.sh $(show "$@") >> ~/${LOG} 2>&1 < /dev/null &"
}

logs() {
  on_workers "${LOG_WORKER:-0}" "tail -n +1 -F ~/${LOG}"
}

delete() {
  tpu delete "${TPU_NAME}" --quiet
}

action="$1"
shift
if [[ "${action}" != run && "${action}" != up && $# -gt 0 ]]; then
  echo "${action} takes no arguments, got: $*" >&2
  exit 2
fi
case "${action}" in
  create) create ;;
  copy) copy ;;
  install) install ;;
  run) start "$@" ;;
  logs) logs ;;
  delete) delete ;;
  up) check_run "$@"; run_checked=1; create; copy; install; start "$@" ;;
  *) echo "unknown action '${action}': create|copy|install|run|logs|delete|up" >&2
     exit 2 ;;
esac
