#!/usr/bin/env bash
# Start the Dask scheduler of a dvml cluster, in the background.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: cluster/scheduler.sh [--host ADDR] [--port PORT] [--dashboard-address ADDR]
                            [--log-dir DIR] [--timeout SECONDS]
                            [--tls-ca-file CA --tls-cert CERT --tls-key KEY]

Start `dask scheduler` (in a new session, detached), wait until it listens, and print
  pid=<pid> name=scheduler address=tcp://<host>:<port>
Then attach from a notebook with dvml.connect("tcp://<host>:<port>"). Stop it with `kill <pid>`.

  --host ADDR               address the scheduler listens on and advertises (default
                            127.0.0.1; on several hosts: this host's cluster-network address,
                            never 0.0.0.0)
  --port PORT               scheduler port (default 8786)
  --dashboard-address ADDR  dashboard address (default <host>:8787)
  --log-dir DIR             where scheduler.log goes (default: a new directory under /tmp)
  --timeout SECONDS         how long to wait for the scheduler (default 60)
  --tls-ca-file/--tls-cert/--tls-key PATH
                            serve Dask's TLS (tls://) with this CA and certificate: only
                            peers with a certificate signed by the CA can connect

Environment: PYTHON (default python3; the interpreter whose dask and dvml the cluster uses).
USAGE
}

HOST=127.0.0.1
PORT=8786
DASHBOARD=""
LOG_DIR=""
TIMEOUT=60
TLS=()
PYTHON="${PYTHON:-python3}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --host) HOST="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --dashboard-address) DASHBOARD="$2"; shift 2 ;;
        --log-dir) LOG_DIR="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --tls-ca-file|--tls-cert|--tls-key) TLS+=("$1" "$2"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "scheduler.sh: error: unknown argument '$1'. See cluster/scheduler.sh --help." >&2; exit 2 ;;
    esac
done

DASHBOARD="${DASHBOARD:-$HOST:8787}"  # beside the scheduler, not on every interface
PROTOCOL=tcp
if (( ${#TLS[@]} )); then
    if (( ${#TLS[@]} != 6 )); then
        echo "scheduler.sh: error: TLS needs all of --tls-ca-file, --tls-cert and --tls-key. Received: ${TLS[*]}." >&2
        exit 2
    fi
    PROTOCOL=tls
fi
LOG_DIR="${LOG_DIR:-$(mktemp -d /tmp/dvml-scheduler-XXXXXX)}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/scheduler.log"

# `python -m dask scheduler` is `dask scheduler` run by the chosen interpreter; the preload
# serves dvml's page on the dashboard (<dashboard>/dvml).
setsid "$PYTHON" -m dask scheduler \
    --host "$HOST" --port "$PORT" --dashboard-address "$DASHBOARD" --preload dvml.dashboard \
    --protocol "$PROTOCOL" ${TLS[@]+"${TLS[@]}"} \
    >"$LOG" 2>&1 </dev/null &
PID=$!

deadline=$((SECONDS + TIMEOUT))
until grep -q "Scheduler at:" "$LOG" 2>/dev/null; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "scheduler.sh: error: the scheduler exited at once (port $PORT taken?). Its log $LOG ends with:" >&2
        tail -n 15 "$LOG" >&2
        exit 1
    fi
    if (( SECONDS >= deadline )); then
        kill "$PID" 2>/dev/null || true
        echo "scheduler.sh: error: the scheduler did not start within ${TIMEOUT}s and was stopped. Its log $LOG ends with:" >&2
        tail -n 15 "$LOG" >&2
        exit 1
    fi
    sleep 0.2
done

echo "pid=$PID name=scheduler address=$PROTOCOL://$HOST:$PORT log=$LOG"
