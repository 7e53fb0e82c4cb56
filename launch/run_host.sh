#!/usr/bin/env bash
# Runs seed_jax training on this host; every host of a pod or cluster runs
# the same command. Extra arguments are passed on (gin bindings).
#
#   GIN_FILE=configs/experiments/qwen2_5_3b_alfworld_style.gin \
#   WORKDIR=/mnt/shared/runs/seed_3b launch/run_host.sh --gin.MODEL_DIR="'/mnt/models/qwen'" \
#   --gin.train.train.mesh_shape="(1, -1, 1)"   # every device of every host
#
# Multi-host: set SEED_COORDINATOR=host:port, SEED_NUM_PROCESSES and
# SEED_PROCESS_ID (Slurm: SLURM_PROCID is used when SEED_PROCESS_ID is
# unset), or SEED_DISTRIBUTED=1 to let JAX find them (TPU VMs).
# PYTHON: the interpreter (default python3). DRY_RUN=1 prints the command.
# A relative WORKDIR is under the current folder, as is a relative GIN_FILE
# found there (else it is looked for in the checkout, configs/...).
set -euo pipefail
caller="${PWD}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/lib.sh

: "${GIN_FILE:?set GIN_FILE, e.g. configs/experiments/tiny.gin}"
: "${WORKDIR:?set WORKDIR, a directory every host can write}"
if [[ "${WORKDIR}" != /* && "${WORKDIR}" != *://* ]]; then
  WORKDIR="${caller}/${WORKDIR}"
fi
if [[ "${GIN_FILE}" != /* && -f "${caller}/${GIN_FILE}" ]]; then
  GIN_FILE="${caller}/${GIN_FILE}"
fi
if [[ "${WORKDIR}" == *[\'\\]* ]]; then  # it becomes a quoted gin string
  echo "WORKDIR may not contain a quote or a backslash: ${WORKDIR}" >&2
  exit 2
fi
if [[ -n "${SEED_COORDINATOR:-}" ]]; then
  : "${SEED_NUM_PROCESSES:?set SEED_NUM_PROCESSES with SEED_COORDINATOR}"
  export SEED_PROCESS_ID="${SEED_PROCESS_ID:-${SLURM_PROCID:?set SEED_PROCESS_ID with SEED_COORDINATOR}}"
fi

run "${PYTHON:-python3}" -m seed_jax.train --gin_file="${GIN_FILE}" \
  --gin.WORKDIR="'${WORKDIR}'" "$@"
