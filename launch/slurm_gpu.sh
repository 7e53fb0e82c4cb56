#!/usr/bin/env bash
# seed_jax on a Slurm GPU cluster: one process per node, all GPUs of a node
# in that process, process 0 on the allocation's first node coordinating.
# Run it inside an allocation (sbatch or salloc), from a checkout every node
# sees, with the environment already installed:
#
#   salloc --nodes=2 --gpus-per-node=8 --exclusive
#   GIN_FILE=configs/experiments/qwen2_5_7b_alfworld_style.gin \
#   WORKDIR=/shared/runs/seed_7b launch/slurm_gpu.sh --gin.MODEL_DIR="'/shared/qwen7b'"
#
# Required: GIN_FILE, WORKDIR, SLURM_JOB_NODELIST (set by Slurm).
# Optional: NODES (default SLURM_JOB_NUM_NODES), GPUS_PER_NODE (default 8),
# PORT (default 8476), PYTHON (default python3). DRY_RUN=1 prints commands.
# A relative WORKDIR is under the current folder, as is a relative GIN_FILE
# found there (else it is looked for in the checkout, configs/...), as with
# launch/run_host.sh: the nodes get them as absolute paths.
set -euo pipefail
caller="${PWD}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/lib.sh

: "${GIN_FILE:?set GIN_FILE, e.g. configs/experiments/tiny.gin}"
: "${WORKDIR:?set WORKDIR, a directory every node can write}"
: "${SLURM_JOB_NODELIST:?run inside a Slurm allocation (sbatch or salloc)}"
# srun starts run_host.sh in this checkout (the folder srun runs in), where
# the caller's relative paths would mean something else: resolved here.
if [[ "${WORKDIR}" != /* && "${WORKDIR}" != *://* ]]; then
  WORKDIR="${caller}/${WORKDIR}"
fi
if [[ "${GIN_FILE}" != /* && -f "${caller}/${GIN_FILE}" ]]; then
  GIN_FILE="${caller}/${GIN_FILE}"
fi
NODES="${NODES:-${SLURM_JOB_NUM_NODES:?set NODES}}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
PORT="${PORT:-8476}"
for name in NODES GPUS_PER_NODE PORT; do
  if [[ ! "${!name}" =~ ^[1-9][0-9]*$ ]]; then
    echo "${name} must be a positive integer, got '${!name}'" >&2
    exit 2
  fi
done

# Process 0 runs on the first node of the allocation: it is the coordinator.
# (No `| head`: under pipefail its early exit would fail the pipe.)
nodes="$(scontrol show hostnames "${SLURM_JOB_NODELIST}")"
first_node="${nodes%%$'\n'*}"
: "${first_node:?scontrol listed no node for SLURM_JOB_NODELIST}"
# One process drives every GPU of its node (JAX's Slurm detection alone would
# give it only the GPU of its task id).
gpu_ids="$(seq -s, 0 $((GPUS_PER_NODE - 1)))"
# The per-run variables go through `env` on each node, not srun's --export,
# which splits values at commas (the device ids). A SEED_PROCESS_ID left in
# the caller's shell is dropped: each node takes its SLURM_PROCID.
run srun --nodes="${NODES}" --ntasks-per-node=1 \
  --gpus-per-node="${GPUS_PER_NODE}" --kill-on-bad-exit=1 --export=ALL \
  env -u SEED_PROCESS_ID GIN_FILE="${GIN_FILE}" WORKDIR="${WORKDIR}" \
  SEED_COORDINATOR="${first_node}:${PORT}" \
  SEED_NUM_PROCESSES="${NODES}" SEED_LOCAL_DEVICE_IDS="${gpu_ids}" \
  launch/run_host.sh "$@"
