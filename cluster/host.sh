#!/usr/bin/env bash
# Start one host of a dvml cluster: one vineyardd joined to etcd, then N Dask workers.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: cluster/host.sh --etcd URL --scheduler ADDR [--workers N] [--gpus-per-worker G]
                       [--vineyard-memory SIZE] [--host-name NAME] [--listen ADDR]
                       [--socket-dir DIR] [--etcd-prefix PREFIX] [--nthreads T]
                       [--memory-limit LIMIT] [--timeout SECONDS] [--workers-only]
                       [--tls-ca-file CA --tls-cert CERT --tls-key KEY]

Start, each in a new session and detached:
  1. one vineyardd (`python -m vineyard`) joined to etcd, its IPC socket in a private (0700)
     directory, RPC off (`--rpc=false`), its --size checked against free /dev/shm;
  2. N `dask worker` processes (with a Nanny each) that reach that vineyardd through
     VINEYARD_IPC_SOCKET, report their host as DVML_HOST and declare --resources GPU=G.
Waits until the daemon answers and every worker registered with the scheduler, then prints
one line per process:
  pid=<pid> name=vineyardd socket=<path> instance_id=<id>
  pid=<pid> name=<host-name>-worker-<i>
Stop them with `kill <pid>` (workers first, then vineyardd). If anything fails to start, what
this script started is stopped again.

  --etcd URL             etcd endpoint, e.g. http://10.0.0.5:2379 (required)
  --scheduler ADDR       Dask scheduler, e.g. tcp://10.0.0.5:8786 (required)
  --workers N            Dask workers on this host (default 1)
  --gpus-per-worker G    GPUs per worker: resources GPU=G and CUDA_VISIBLE_DEVICES of each
                         worker (worker i gets devices i*G .. i*G+G-1); default 0
  --vineyard-memory SIZE shared memory of the vineyardd, e.g. 512MiB (default 512MiB)
  --host-name NAME       the host name dvml reports (default: hostname)
  --listen ADDR          this host's address: the workers (and their Nannies) listen on it
                         and vineyardd advertises it (MY_HOST_NAME); default 127.0.0.1, use
                         this host's cluster-network address when the scheduler is elsewhere
  --socket-dir DIR       private directory for the socket, logs and worker scratch
                         (default: a new 0700 directory under /tmp)
  --etcd-prefix PREFIX   vineyard's key prefix in etcd; every host of one cluster must use
                         the same one (default /dvml/default)
  --nthreads T           threads per worker (default 1)
  --memory-limit LIMIT   Dask memory limit per worker (default auto)
  --timeout SECONDS      how long to wait for the daemon and each worker (default 60)
  --tls-ca-file/--tls-cert/--tls-key PATH
                         Dask TLS for the workers (with a tls:// --scheduler)
  --workers-only         start only the workers, on the vineyardd already running with its
                         socket in --socket-dir (after the workers died; its data stays)

Environment: PYTHON (default python3; its vineyard, dask and dvml run the host).
USAGE
}

ETCD=""
SCHEDULER=""
WORKERS=1
GPUS=0
MEMORY=512MiB
HOST_NAME="$(hostname)"
LISTEN=127.0.0.1
SOCKET_DIR=""
PREFIX=/dvml/default
NTHREADS=1
MEMORY_LIMIT=auto
TIMEOUT=60
WORKERS_ONLY=0
TLS=()
PYTHON="${PYTHON:-python3}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --etcd) ETCD="$2"; shift 2 ;;
        --scheduler) SCHEDULER="$2"; shift 2 ;;
        --workers) WORKERS="$2"; shift 2 ;;
        --gpus-per-worker) GPUS="$2"; shift 2 ;;
        --vineyard-memory) MEMORY="$2"; shift 2 ;;
        --host-name) HOST_NAME="$2"; shift 2 ;;
        --listen) LISTEN="$2"; shift 2 ;;
        --socket-dir) SOCKET_DIR="$2"; shift 2 ;;
        --etcd-prefix) PREFIX="$2"; shift 2 ;;
        --nthreads) NTHREADS="$2"; shift 2 ;;
        --memory-limit) MEMORY_LIMIT="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --workers-only) WORKERS_ONLY=1; shift ;;
        --tls-ca-file|--tls-cert|--tls-key) TLS+=("$1" "$2"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "host.sh: error: unknown argument '$1'. See cluster/host.sh --help." >&2; exit 2 ;;
    esac
done

if [[ -z "$ETCD" || -z "$SCHEDULER" ]]; then
    echo "host.sh: error: --etcd and --scheduler are required. Received: --etcd='$ETCD' --scheduler='$SCHEDULER'. See cluster/host.sh --help." >&2
    exit 2
fi
if ! [[ "$WORKERS" =~ ^[1-9][0-9]*$ && "$GPUS" =~ ^[0-9]+$ ]]; then
    echo "host.sh: error: --workers must be at least 1 and --gpus-per-worker at least 0. Received: --workers=$WORKERS --gpus-per-worker=$GPUS." >&2
    exit 2
fi

# vineyardd with --size larger than free /dev/shm dies with SIGBUS on first use: check first.
SIZE="$("$PYTHON" - "$MEMORY" <<'PY'
import shutil, sys
from dask.utils import parse_bytes
try:
    size = parse_bytes(sys.argv[1]) if sys.argv[1].strip() else 0
except ValueError:
    size = 0
if size <= 0:
    sys.exit(f"host.sh: error: --vineyard-memory must be a size such as 512MiB. Received: {sys.argv[1]!r}.")
free = shutil.disk_usage("/dev/shm").free
if size > free:
    sys.exit(f"host.sh: error: --vineyard-memory={sys.argv[1]} ({size} bytes) does not fit in free /dev/shm ({free} bytes). Lower it or enlarge /dev/shm.")
print(size)
PY
)"

if [[ -z "$SOCKET_DIR" ]]; then
    SOCKET_DIR="$(mktemp -d /tmp/dvml-host-XXXXXX)"
fi
mkdir -p "$SOCKET_DIR"
chmod 700 "$SOCKET_DIR"  # vineyardd creates its socket 0777: the directory keeps others out
# The workers' and their trainers' temporary files (TensorFlow's autograph modules, which a
# killed process never deletes) stay in the host's directory, as a LocalCluster's do.
mkdir -p "$SOCKET_DIR/tmp"
SOCKET="$SOCKET_DIR/vineyard.sock"

STARTED=()
stop_started() {
    local code=$?
    if [[ $code -ne 0 && ${#STARTED[@]} -gt 0 ]]; then
        echo "host.sh: stopping what was started: ${STARTED[*]}" >&2
        kill "${STARTED[@]}" 2>/dev/null || true
    fi
}
trap stop_started EXIT

fail() {  # message, log
    echo "host.sh: error: $1 Its log $2 ends with:" >&2
    tail -n 15 "$2" >&2
    exit 1
}

instance_id() {
    VINEYARD_IPC_SKIP_RETRY=1 "$PYTHON" -c "import vineyard
c = vineyard.connect('$SOCKET'); print(c.instance_id); c.close()" 2>/dev/null
}

if (( WORKERS_ONLY )); then
    INSTANCE="$(instance_id)" || {
        echo "host.sh: error: --workers-only but no vineyardd answers on $SOCKET. Start the host without --workers-only." >&2
        exit 1
    }
    echo "vineyardd socket=$SOCKET instance_id=$INSTANCE (already running)"
else
    VLOG="$SOCKET_DIR/vineyardd.log"
    # gflags needs --flag=value for booleans: `--rpc false` would leave RPC on. --log_dir keeps
    # glog's files in the private directory (by default: world-readable /tmp/vineyard.*.log.*,
    # never removed). vineyardd advertises
    # MY_HOST_NAME (else the hostname, which is wrong where hosts share one, e.g. in namespaces).
    MY_HOST_NAME="$LISTEN" setsid "$PYTHON" -m vineyard \
        --socket="$SOCKET" --size="$SIZE" \
        --meta=etcd --etcd_endpoint="$ETCD" --etcd_prefix="$PREFIX" \
        --rpc=false --log_dir="$SOCKET_DIR" \
        >"$VLOG" 2>&1 </dev/null &
    VPID=$!
    STARTED+=("$VPID")

    deadline=$((SECONDS + TIMEOUT))
    INSTANCE=""
    until [[ -S "$SOCKET" ]] && INSTANCE="$(instance_id)"; do
        kill -0 "$VPID" 2>/dev/null || fail "vineyardd exited at once (is etcd at $ETCD up?)." "$VLOG"
        (( SECONDS < deadline )) || fail "vineyardd did not answer on $SOCKET within ${TIMEOUT}s." "$VLOG"
        sleep 0.2
    done
    echo "pid=$VPID name=vineyardd socket=$SOCKET instance_id=$INSTANCE"
fi

WPIDS=()
NAMES=()
for ((i = 0; i < WORKERS; i++)); do
    name="$HOST_NAME-worker-$i"
    log="$SOCKET_DIR/$name.log"
    args=(--name "$name" --host "$LISTEN" --nthreads "$NTHREADS" --memory-limit "$MEMORY_LIMIT"
          --local-directory "$SOCKET_DIR/dask" --no-dashboard
          --dashboard-address "$LISTEN:0")  # without it, /health and /metrics bind 0.0.0.0
    if (( ${#TLS[@]} )); then
        args+=(--protocol tls "${TLS[@]}")
    fi
    gpu_env=()
    if (( GPUS > 0 )); then
        args+=(--resources "GPU=$GPUS")
        devices="$(seq -s, $((i * GPUS)) $((i * GPUS + GPUS - 1)))"
        gpu_env=("CUDA_VISIBLE_DEVICES=$devices")
    fi
    # `python -m dask worker` is `dask worker` run by the chosen interpreter. The host's
    # trainer zygote (dvml.cluster.zygote) puts its socket beside vineyardd's.
    env VINEYARD_IPC_SOCKET="$SOCKET" DVML_HOST="$HOST_NAME" VINEYARD_IPC_SKIP_RETRY=1 \
        DVML_ETCD_ENDPOINT="$ETCD" DVML_ZYGOTE_DIR="$SOCKET_DIR" TMPDIR="$SOCKET_DIR/tmp" \
        "${gpu_env[@]}" \
        setsid "$PYTHON" -m dask worker "$SCHEDULER" "${args[@]}" >"$log" 2>&1 </dev/null &
    WPIDS+=("$!")
    NAMES+=("$name")
    STARTED=("$!" "${STARTED[@]}")  # workers are stopped before the daemon
done

deadline=$((SECONDS + TIMEOUT))
for ((i = 0; i < WORKERS; i++)); do
    log="$SOCKET_DIR/${NAMES[$i]}.log"
    until grep -q "Registered to:" "$log" 2>/dev/null; do
        kill -0 "${WPIDS[$i]}" 2>/dev/null || fail "worker ${NAMES[$i]} exited at once." "$log"
        (( SECONDS < deadline )) || fail "worker ${NAMES[$i]} did not register with $SCHEDULER within ${TIMEOUT}s." "$log"
        sleep 0.2
    done
    echo "pid=${WPIDS[$i]} name=${NAMES[$i]}"
done
