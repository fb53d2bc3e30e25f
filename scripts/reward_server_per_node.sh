#!/usr/bin/env bash
# Start one sirius reward server on this node, supervised (restarted when it dies), and wait until it is healthy.
# The recommended layout: one per node on 127.0.0.1, so every verl reward worker on the node scores through
# reward.url=http://127.0.0.1:$SIRIUS_REWARD_PORT (the same URL on every node; nothing crosses the network).
#
#   SIRIUS_DB_ROOT=/shared/sirius/databases scripts/reward_server_per_node.sh
#   kill "$(cat /tmp/sirius-$USER/reward_server_8000.pid)"     # stop: the supervisor stops its server
#
# The port must be free or already hold *our* server for the same SIRIUS_DB_ROOT (its /health names both):
# anything else there -- vLLM's OpenAI server also answers /health on 8000 -- is an error, exit 2.
# Environment: SIRIUS_DB_ROOT (required), SIRIUS_REWARD_PORT (8000), SIRIUS_REWARD_WORKERS (half the cores),
# SIRIUS_REWARD_TIMEOUT (5 s per query), SIRIUS_REWARD_TOKEN (optional; clients read the same variable),
# SIRIUS (the sirius command, default: sirius), PYTHON (python3: runs the identity check),
# SIRIUS_LOG_DIR (/tmp/sirius-$USER).
set -euo pipefail

: "${SIRIUS_DB_ROOT:?set SIRIUS_DB_ROOT to the folder with <db_id>/<db_id>.sqlite}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port="${SIRIUS_REWARD_PORT:-8000}"
cores="$(nproc)"
workers="${SIRIUS_REWARD_WORKERS:-$(( cores > 2 ? cores / 2 : 1 ))}"
timeout_s="${SIRIUS_REWARD_TIMEOUT:-5}"
sirius="${SIRIUS:-sirius}"
python="${PYTHON:-python3}"
log_dir="${SIRIUS_LOG_DIR:-/tmp/sirius-${USER:-$(id -u)}}"
mkdir -p "$log_dir"
log="$log_dir/reward_server_${port}.log"
pid_file="$log_dir/reward_server_${port}.pid"
url="http://127.0.0.1:${port}"

identity() {  # exit 0: ours for SIRIUS_DB_ROOT; 1: nothing listening; 3: anything else (message on stderr)
    PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python" -m rewards.identity "$url" --db-root "$SIRIUS_DB_ROOT"
}

if [[ ! -d "$SIRIUS_DB_ROOT" ]]; then
    echo "error: SIRIUS_DB_ROOT=$SIRIUS_DB_ROOT is not a directory on $(hostname)" >&2
    exit 2
fi
set +e
identity >/dev/null 2>"$log_dir/identity_${port}.err"
state=$?
set -e
if [[ $state -eq 0 ]]; then
    echo "reward server already serving $SIRIUS_DB_ROOT at $url"
    exit 0
elif [[ $state -ne 1 ]]; then
    echo "error: port $port on $(hostname): $(cat "$log_dir/identity_${port}.err")" >&2
    exit 2
fi

supervise() {  # run the server, start it again when it dies; TERM stops both
    local child="" started code fast=0
    trap '' HUP  # like nohup: a closed terminal does not stop it (the server inherits the ignored HUP)
    trap 'if [[ -n "$child" ]]; then kill "$child" 2>/dev/null; wait "$child"; fi; exit 0' TERM INT
    while true; do
        started=$(date +%s)
        # shellcheck disable=SC2086  # $sirius may be "python -m sirius_train.cli"
        $sirius reward-server --db-root "$SIRIUS_DB_ROOT" --host 127.0.0.1 --port "$port" \
            --workers "$workers" --timeout "$timeout_s" &
        child=$!
        set +e
        wait "$child"
        code=$?
        set -e
        if (( $(date +%s) - started < 10 )); then fast=$((fast + 1)); else fast=0; fi
        if (( fast >= 5 )); then
            echo "supervisor: the reward server died within 10 s five times in a row (code $code); giving up" >&2
            exit 1
        fi
        echo "supervisor: reward server exited with code $code at $(date -u +%FT%TZ); restarting in 2 s" >&2
        sleep 2
    done
}

supervise </dev/null >>"$log" 2>&1 &
echo $! >"$pid_file"
disown

for _ in $(seq 1 120); do
    if identity >/dev/null 2>&1; then
        echo "reward server on $(hostname): $url ($workers workers, supervisor pid $(cat "$pid_file"), log $log)"
        exit 0
    fi
    if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        echo "error: reward server supervisor exited; last lines of $log:" >&2
        tail -20 "$log" >&2
        exit 1
    fi
    sleep 0.5
done
echo "error: reward server not healthy at $url after 60 s (log: $log)" >&2
kill "$(cat "$pid_file")" 2>/dev/null || true
exit 1
