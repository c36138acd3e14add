#!/usr/bin/env bash
# Usage: tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]
# As mmdet's: srun with GPUS tasks (default 8), GPUS_PER_NODE per node
# (default 8), CPUS_PER_TASK (default 5) and SRUN_ARGS, through mmengine's
# Slurm launcher. GRES (default gpu:$GPUS_PER_NODE; empty: none) as in
# tools/slurm_train.sh; PYTHON picks the interpreter. On nodes without CUDA
# the tasks run on the CPU over gloo.
set -x

PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
GRES=${GRES-gpu:${GPUS_PER_NODE}}
. "$(dirname "$0")/find_python.sh"

# shellcheck disable=SC2086  # SRUN_ARGS is a word list, as upstream
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    ${GRES:+--gres=${GRES}} \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$(dirname "$0")/test.py" "${CONFIG}" "${CHECKPOINT}" --launcher="slurm" "${@:5}"
