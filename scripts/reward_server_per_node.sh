#!/usr/bin/env bash
# Start one sirius reward server on this node, in the background, and wait until it is healthy.
# The recommended layout: one per node on 127.0.0.1, so every verl reward worker on the node scores through
# reward.url=http://127.0.0.1:$SIRIUS_REWARD_PORT (the same URL on every node; nothing crosses the network).
#
#   SIRIUS_DB_ROOT=/shared/sirius/databases scripts/reward_server_per_node.sh
#
# Environment: SIRIUS_DB_ROOT (required), SIRIUS_REWARD_PORT (8000), SIRIUS_REWARD_WORKERS (half the cores),
# SIRIUS_REWARD_TIMEOUT (5 s per query), SIRIUS_REWARD_TOKEN (optional; clients read the same variable),
# SIRIUS (the sirius command, default: sirius), SIRIUS_LOG_DIR (/tmp/sirius-$USER).
set -euo pipefail

: "${SIRIUS_DB_ROOT:?set SIRIUS_DB_ROOT to the folder with <db_id>/<db_id>.sqlite}"
port="${SIRIUS_REWARD_PORT:-8000}"
cores="$(nproc)"
workers="${SIRIUS_REWARD_WORKERS:-$(( cores > 2 ? cores / 2 : 1 ))}"
timeout_s="${SIRIUS_REWARD_TIMEOUT:-5}"
sirius="${SIRIUS:-sirius}"
log_dir="${SIRIUS_LOG_DIR:-/tmp/sirius-${USER:-$(id -u)}}"
mkdir -p "$log_dir"
log="$log_dir/reward_server_${port}.log"
pid_file="$log_dir/reward_server_${port}.pid"
url="http://127.0.0.1:${port}"

if curl -fsS "$url/health" >/dev/null 2>&1; then
    echo "reward server already healthy at $url"
    exit 0
fi
if [[ ! -d "$SIRIUS_DB_ROOT" ]]; then
    echo "error: SIRIUS_DB_ROOT=$SIRIUS_DB_ROOT is not a directory on $(hostname)" >&2
    exit 2
fi

# shellcheck disable=SC2086  # $sirius may be "python -m sirius_train.cli"
nohup $sirius reward-server --db-root "$SIRIUS_DB_ROOT" --host 127.0.0.1 --port "$port" \
    --workers "$workers" --timeout "$timeout_s" >"$log" 2>&1 &
echo $! >"$pid_file"

for _ in $(seq 1 120); do
    if curl -fsS "$url/health" >/dev/null 2>&1; then
        echo "reward server on $(hostname): $url ($workers workers, pid $(cat "$pid_file"), log $log)"
        exit 0
    fi
    if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        echo "error: reward server exited; last lines of $log:" >&2
        tail -20 "$log" >&2
        exit 1
    fi
    sleep 0.5
done
echo "error: reward server not healthy at $url after 60 s (log: $log)" >&2
exit 1
