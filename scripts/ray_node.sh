#!/usr/bin/env bash
# Start this node's part of a Ray cluster for verl, and this node's reward server.
#
#   SIRIUS_DB_ROOT=/shared/sirius/databases scripts/ray_node.sh head                 # node 0; prints its address
#   SIRIUS_DB_ROOT=/shared/sirius/databases scripts/ray_node.sh worker 10.0.0.1:6379  # every other node
#   sirius train configs/sirius32b.yaml                                              # then, on node 0
#
# Environment: RAY_PORT (6379, head), RAY_DASHBOARD_PORT (8265, head), RAY_NUM_GPUS (all visible GPUs),
# SIRIUS_NO_REWARD_SERVER=1 to skip the reward server (reward.url: null scores inside verl's workers),
# RAY_BLOCK=1 to keep Ray in the foreground (under srun, whose finished step would reap the daemons).
# Export SIRIUS_REWARD_TOKEN and any NCCL_* variables *before* this script: Ray workers inherit this
# environment. The project, databases and model must be at the same paths on every node.
set -euo pipefail

role="${1:-}"
if [[ "$role" == worker && $# -ne 2 ]] || [[ "$role" != head && "$role" != worker ]]; then
    echo "usage: $0 head | $0 worker HEAD_IP:PORT" >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
# verl's workers import rewards/ and sirius_train/ (translate also puts the root on their PYTHONPATH)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
gpus="${RAY_NUM_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}"

if [[ "${SIRIUS_NO_REWARD_SERVER:-0}" != 1 ]]; then
    "$here/reward_server_per_node.sh"
fi

args=(--num-gpus="$gpus" --disable-usage-stats)
if [[ "${RAY_BLOCK:-0}" == 1 ]]; then args+=(--block); fi
if [[ "$role" == head ]]; then
    port="${RAY_PORT:-6379}"
    echo "ray head: $(hostname -I | awk '{print $1}'):$port with $gpus GPUs"
    ray start --head --port="$port" --dashboard-host=0.0.0.0 --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" "${args[@]}"
else
    echo "ray worker $(hostname) joining $2 with $gpus GPUs"
    ray start --address="$2" "${args[@]}"
fi
