#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG GPUS [train.py options]
# As mmdet's, on torchrun. NNODES, NODE_RANK, MASTER_ADDR and PORT as upstream;
# PYTHON picks the interpreter (default: the active environment's python,
# else this repository's .venv, else python). On a machine without CUDA the
# processes train on the CPU over gloo, --fast and --no-fast alike, with the
# wrapper settings of stock (fast_parallel.cli.init_cpu_distributed).
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
. "$(dirname "$0")/find_python.sh"
# The workers import the fast_parallel installed in that interpreter's
# environment, as mmdet's scripts do (pip install -e . for a clone's edits).

"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$(dirname "$0")/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
