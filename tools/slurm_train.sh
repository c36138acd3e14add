#!/usr/bin/env bash
# Usage: tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
# As mmdet's: srun with GPUS tasks (default 8), GPUS_PER_NODE per node
# (default 8), CPUS_PER_TASK (default 5) and SRUN_ARGS, through mmengine's
# Slurm launcher. GRES (default gpu:$GPUS_PER_NODE; empty: none, for nodes
# without GPUs) is the generic resource each node asks for. PYTHON picks the
# interpreter (as tools/dist_train.sh). On nodes without CUDA the tasks train
# on the CPU over gloo, --fast and --no-fast alike.
set -x

PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
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
    "$PYTHON" -u "$(dirname "$0")/train.py" "${CONFIG}" --work-dir="${WORK_DIR}" --launcher="slurm" "${@:5}"
