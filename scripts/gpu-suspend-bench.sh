#!/bin/bash
# Issue 28's benchmark on the GPU machine: Slurm's suspend of a job that holds most of the GPU's
# memory, with nvshare and without. A one-node Slurm cluster (proctrack/cgroup and task/cgroup: the
# suspend is a cgroup freeze, and only the batch script gets SIGTSTP) with nvshare's Prolog, Epilog,
# TaskProlog and an nvshare-scheduler; then scripts/gpu_suspend_bench.py runs, one job at a time
# except where said:
#   solo     the low job alone, then the high job alone (sbatch --gres=nvshare:1): each a
#            tests/gpu/train.py transformer with a ballast of BENCH_HOLD_GIB GiB (default 60)
#            rewritten every step, fixed seed, losses to JSON;
#   nvshare  the low job; after BENCH_SUSPEND_AFTER steps `scontrol suspend` it and at once submit
#            the high job (both --gres=nvshare:1); nvshare-status while the low job is suspended;
#            `scontrol resume` it when the high job has ended;
#   plain    the same without nvshare (no nvshare GRES: no hook, the GPU as it is, not
#            ConstrainDevices): the high job is expected to run out of memory;
#   checkpoint the plain sequence with NVIDIA's checkpoint API (scripts/cuda_checkpoint.py): the
#            low job's process locked and checkpointed before the suspend, restored and unlocked
#            after the resume (not in the default arms; not on the fake driver).
# Measured: suspend -> the high job's first kernel and -> its ballast allocated and filled (and the
# same from submit in its solo run), its steps/s against solo, the low job's total time against
# solo plus its suspension, its losses bit for bit against solo.
#
#   . scripts/gpu-setup.sh && bash scripts/gpu-suspend-bench.sh OUTDIR
#
# Slurm comes unpacked from the carried .slurmdeb/ (as scripts/gpu-slurm-e2e.sh does), or is the
# one installed. Every wait is bounded: each wait BENCH_WAIT seconds (default 120), the whole
# sequence BENCH_TIMEOUT (default 420; past it the waits fail and result.json is still written).
# Knobs: BENCH_HOLD_GIB, BENCH_LOW_STEPS (300), BENCH_HIGH_STEPS (150), BENCH_SUSPEND_AFTER (50 steps), BENCH_MODE (concurrent | auto),
# BENCH_POLL_SEC (suspend_slurm_poll_sec, 0.25: Slurm 22.05 freezes the job 2 s after the suspend,
# and the memory must be out by then), BENCH_ARMS (solo,nvshare,plain; also checkpoint).
# BENCH_FAKE_GPU=1 (a test of the script without a GPU): the fake CUDA driver (tests/c/build) with
# a 1 GiB device, nvtest in place of the training (an allocation of BENCH_HOLD_GIB, default 0.6,
# filled, 20 ms kernels, then checked).
# Writes into OUTDIR: bench.log (this console), result.json (checks, numbers, targets, events),
# table.txt, and cluster/ (slurm.conf, nvshare.yaml, the daemons' logs, every job's output and JSON).
# Exit status 0 when every check passed (the speed targets are in result.json's "targets").
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${1:?usage: gpu-suspend-bench.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/bench.log") 2>&1
TEE_PID=$!
say() { echo "gpu-suspend-bench: $*"; }
fail() { say "$*"; exit 1; }
FAKE=${BENCH_FAKE_GPU:-}
SLURM_ROOT=${BENCH_SLURM_ROOT:-/opt/slurmroot}
DIR=/tmp/nvshare-susb            # short: munged's socket path must fit a sockaddr_un
WAIT=${BENCH_WAIT:-120}
TOTAL=${BENCH_TIMEOUT:-420}
MODE=${BENCH_MODE:-concurrent}
POLL=${BENCH_POLL_SEC:-0.25}
ARMS=${BENCH_ARMS:-solo,nvshare,plain}
FAKE_UUID=GPU-fa4e0000-0000-0000-0000-000000000000
[ "$(id -u)" = 0 ] || fail "run as root (slurmctld, slurmd and munged are started)"
PY=${BENCH_PYTHON:-$(command -v python3)} || fail "no python3"
PY=$(command -v "$PY")
if [ -n "$FAKE" ]; then
  HOLD=${BENCH_HOLD_GIB:-0.6} LOW_STEPS=${BENCH_LOW_STEPS:-250} HIGH_STEPS=${BENCH_HIGH_STEPS:-150}
  AFTER=${BENCH_SUSPEND_AFTER:-40}
  timeout 60 "$PY" -c 'import nvshare_slurm.wire.proto, yaml' || fail "$PY cannot import nvshare_slurm, yaml"
  make -s -C tests/c >/dev/null || fail "cannot build the fake driver (tests/c)"
  GPUS_YAML="gpus: [{uuid: $FAKE_UUID, memory: 1G}]"
else
  HOLD=${BENCH_HOLD_GIB:-60} LOW_STEPS=${BENCH_LOW_STEPS:-300} HIGH_STEPS=${BENCH_HIGH_STEPS:-150}
  AFTER=${BENCH_SUSPEND_AFTER:-50}
  say "GPU: $(timeout 30 nvidia-smi --query-gpu=name,uuid,memory.total,memory.used --format=csv,noheader 2>&1 | head -1)"
  timeout 60 "$PY" -c 'import nvshare_slurm.wire.proto, torch, yaml, pynvml' \
    || fail "$PY cannot import nvshare_slurm, torch, yaml, pynvml: run '. scripts/gpu-setup.sh' first"
  GPUS_YAML=
fi
[ -f nvshare_slurm/libnvshare.so ] || fail "nvshare_slurm/libnvshare.so not built: run '. scripts/gpu-setup.sh' first"
say "python $PY; PYTHONPATH=${PYTHONPATH:-}; hold $HOLD GiB; steps low $LOW_STEPS high $HIGH_STEPS"

MUNGED_STARTED=
if [ -x "$SLURM_ROOT/usr/sbin/slurmd" ]; then
  :
elif command -v slurmd >/dev/null && command -v slurmctld >/dev/null; then
  SLURM_ROOT=    # installed
elif [ -f .slurmdeb/gpu-machine-slurm.sh ]; then
  pgrep -x munged >/dev/null || MUNGED_STARTED=1
  say "unpacking Slurm: .slurmdeb/gpu-machine-slurm.sh install .slurmdeb"
  timeout 180 bash .slurmdeb/gpu-machine-slurm.sh install .slurmdeb || fail "unpacking Slurm failed"
  SLURM_ROOT=/opt/slurmroot
else
  fail "no Slurm: not in $SLURM_ROOT, no .slurmdeb/ to unpack, none installed"
fi
if [ -n "$SLURM_ROOT" ]; then
  # shellcheck disable=SC1091
  . "$SLURM_ROOT/env.sh"
  SBIN=$SLURM_ROOT/usr/sbin
else
  SBIN=$(dirname "$(command -v slurmd)")
fi
[ -f /etc/munge/munge.key ] || fail "no /etc/munge/munge.key"
say "Slurm $("$SBIN/slurmd" -V 2>&1) from ${SLURM_ROOT:-the system}"

pids=()
SLURMD_PID=
cleanup() {
  set +e
  [ -n "${SLURM_CONF:-}" ] && [ -e "$SLURM_CONF" ] && timeout 10 scancel --full -u root >/dev/null 2>&1
  # a job still suspended would keep its frozen processes: let them go before the daemons stop
  for j in $(timeout 5 squeue -h -t S -o %i 2>/dev/null); do timeout 5 scontrol resume "$j"; done
  for _ in $(seq 40); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  # slurmd first (its job steps report to slurmctld), then the rest; what will not stop is killed
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; [ "$pid" = "$SLURMD_PID" ] && sleep 2; done
  for _ in $(seq 20); do
    alive=; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break; sleep 0.5
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -f "$DIR/munge/munge.key"
  mkdir -p "$OUT/cluster"
  tar -C "$DIR" -cf - --exclude=munge.key --exclude='*.sock' --exclude='*.socket' \
    --exclude='device-memory-*' . 2>/dev/null | tar -C "$OUT/cluster" -xf -
  if [ -n "$MUNGED_STARTED" ] && [ -f /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null   # the munged that the unpacking started
  fi
}
trap cleanup EXIT

for pidfile in "$DIR"/*.pid "$DIR"/munge/munged.pid; do   # a run killed hard before this one
  [ -e "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
done
rm -rf "$DIR"
mkdir -p "$DIR"/{state,spool,jobs,munge,nvshare}
chmod 755 "$DIR"; chmod 1777 "$DIR/jobs"
export SLURM_CONF=$DIR/slurm.conf
cat > "$DIR/nvshare/nvshare.yaml" <<YAML
socket: $DIR/nvshare/scheduler.sock
state_dir: $DIR/nvshare/state
slurm_bin_dir: $(dirname "$(command -v scontrol)")
log_level: debug
scheduling_mode: $MODE
# Slurm 22.05 freezes a suspended job 2 s after slurmctld marks it SUSPENDED: ask often.
suspend_slurm_poll_sec: $POLL
suspend_check_sec: 0.1
$GPUS_YAML
YAML
HOST=$(hostname -s)
CLUSTER=(--name nvssusb --host "$HOST" --partition bench --cpus 4 --gres nvshare:gpu0:4
  --gres-conf "NodeName=$HOST Name=nvshare Type=gpu0 Count=4" --gres-types nvshare
  --proctrack proctrack/cgroup --task-plugin task/cgroup --nvshare-config "$DIR/nvshare/nvshare.yaml"
  --python "$PY" --wrapper-env "PYTHONPATH=${PYTHONPATH:-$REPO}")
[ -n "$SLURM_ROOT" ] && CLUSTER+=(--slurm-root "$SLURM_ROOT" --wrapper-env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
PYTHONPATH=${PYTHONPATH:-$REPO} "$PY" -m nvshare_slurm.node.localcluster "$DIR" "${CLUSTER[@]}" \
  || fail "nvshare_slurm.node.localcluster failed"
export PYTHONPATH=${PYTHONPATH:-$REPO}
# proctrack/cgroup on a cgroup v1 host (localcluster writes a cgroup.conf only for v2 or devices):
# Slurm's autodetection would pick v2 from a hybrid mount and find no freezer.
if [ ! -f "$DIR/cgroup.conf" ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n' > "$DIR/cgroup.conf"
fi

say "starting munged, nvshare-scheduler, slurmctld, slurmd (in $DIR)"
# shellcheck source=scripts/munged-start.sh
. "$REPO/scripts/munged-start.sh"
start_munged "$DIR" "$SBIN"
NVSHARE_CONFIG=$DIR/nvshare/nvshare.yaml "$PY" -m nvshare_slurm.daemon \
  > "$DIR/nvshare/scheduler.log" 2>&1 & pids+=($!)
"$SBIN/slurmctld" -D -i -f "$SLURM_CONF" > "$DIR/slurmctld.out" 2>&1 & pids+=($!)
for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
STEPD=()
[ -n "$SLURM_ROOT" ] && STEPD=(-d "$SBIN/slurmstepd")
"$SBIN/slurmd" -D -N "$HOST" -f "$SLURM_CONF" "${STEPD[@]}" > "$DIR/slurmd.out" 2>&1 &
SLURMD_PID=$!; pids=("$SLURMD_PID" "${pids[@]}")
for _ in $(seq 150); do timeout 5 sinfo -h -o %t 2>/dev/null | grep -qx idle && break; sleep 0.2; done
timeout 5 sinfo -h -o %t | grep -qx idle \
  || { tail "$DIR"/slurm*.log "$DIR"/*.out "$DIR/nvshare/scheduler.log"; fail "the node did not come up"; }
[ -S "$DIR/nvshare/scheduler.sock" ] || { sleep 3; [ -S "$DIR/nvshare/scheduler.sock" ] \
  || { tail "$DIR/nvshare/scheduler.log"; fail "nvshare-scheduler did not start"; }; }

FAKE_ARG=(); [ -n "$FAKE" ] && FAKE_ARG=(--fake)
say "the sequence: $ARMS (at most $TOTAL s; each wait at most $WAIT s)"
timeout -k 10 $((TOTAL + 60)) "$PY" scripts/gpu_suspend_bench.py --deadline "$TOTAL" --out "$OUT" --jobs "$DIR/jobs" \
  --nvshare-config "$DIR/nvshare/nvshare.yaml" --python "$PY" --hold-gib "$HOLD" \
  --low-steps "$LOW_STEPS" --high-steps "$HIGH_STEPS" --suspend-after "$AFTER" --wait "$WAIT" \
  --arms "$ARMS" "${FAKE_ARG[@]}"
RC=$?
[ $RC = 124 ] && say "the sequence ran past $((TOTAL + 60)) s: killed (result.json is missing)"
say "suspend lines of the scheduler's log:"
grep -E 'suspended \(|to host memory|runs again after|stays on the GPU|suspend' "$DIR/nvshare/scheduler.log" \
  | head -20 | sed 's/^/  /'
cleanup; trap - EXIT
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
