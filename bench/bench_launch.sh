#!/bin/bash
# Launch overhead of libnvshare.so: empty-kernel launches without and with the hook, ROUNDS rounds
# of LAUNCHES each (default 5 x 200,000), interleaved in one run, while the hook holds the GPU's lock
# (a real nvshare-scheduler on a private socket grants it). Prints each round, the medians and their
# ratio, and a last line `result {json}`.
#
#   bench/bench_launch.sh [--fake] [--rounds N] [LAUNCHES]
#
# --fake uses the fake driver of tests/c (no GPU needed); default is the real libcuda.so.1 and GPU 0.
# The hook is NVSHARE_TEST_LIB if set, else the one inside the nvshare_slurm package that $PYTHON
# (default python3) imports. The whole run is bounded by BENCH_TIMEOUT seconds (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
FAKE=0
ROUNDS=5
while [[ $# -gt 0 ]]; do
  case $1 in
    --fake) FAKE=1; shift ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) break ;;
  esac
done
LAUNCHES=${1:-200000}
PY=${PYTHON:-python3}

mkdir -p bench/build
cc -O2 -std=gnu11 -Wall -o bench/build/bench_launch bench/bench_launch.c -ldl
LIB=${NVSHARE_TEST_LIB:-$("$PY" -c 'import nvshare_slurm; print(nvshare_slurm.libnvshare_path())')}
[[ -f "$LIB" ]] || { echo "bench_launch.sh: $LIB not built (python3 setup.py build_ext --inplace)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/nvs-bench-XXXXXX)
DAEMON_PID=
cleanup() { [[ -n "$DAEMON_PID" ]] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

if [[ $FAKE == 1 ]]; then
    make -s -C tests/c
    export LD_LIBRARY_PATH="$PWD/tests/c/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    GPUS='gpus: [{uuid: GPU-fa4e0000-0000-0000-0000-000000000000, memory: 16G}]'
    DRIVER="fake driver (tests/c)"
else
    GPUS=""
    DRIVER="real driver"
fi
cat > "$WORK/nvshare.yaml" <<YAML
socket: $WORK/s.sock
state_dir: $WORK/state
log_level: warning
$GPUS
YAML

if [[ $(id -u) == 0 ]]; then
    NVSHARE_CONFIG="$WORK/nvshare.yaml" "$PY" -m nvshare_slurm.daemon >"$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 200); do [[ -S "$WORK/s.sock" ]] && break; sleep 0.05; done
    [[ -S "$WORK/s.sock" ]] || { echo "bench_launch.sh: nvshare-scheduler did not start:" >&2; cat "$WORK/daemon.log" >&2; exit 1; }
    UUID=$("$PY" -c "
from nvshare_slurm.wire.client import Client
print(Client('$WORK/s.sock').register_job(4242, uid=0, gid=0, gpu_index=[0])['gpu_uuid'][0])")
    export NVSHARE_SOCKET="$WORK/s.sock" NVSHARE_JOB_ID=4242 SLURM_STEP_ID=0 NVSHARE_MANAGED_GPUS="$UUID"
    echo "bench_launch: $DRIVER, hook $LIB, lock of $UUID held through nvshare-scheduler"
else
    echo "bench_launch: not root, so no job can be registered: the hook runs outside a job (pass-through)"
fi
# A hook that cannot reach the daemon waits for it (on_daemon_loss: wait): bound the run.
timeout --kill-after=5 "${BENCH_TIMEOUT:-300}" bench/build/bench_launch "$LAUNCHES" "$LIB" "$ROUNDS"
