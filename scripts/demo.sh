#!/bin/bash
# nvshare-slurm demo, as root on a fresh Debian/Ubuntu machine: installs what is missing (Debian's
# Slurm and munge through scripts/install-demo-slurm.sh, nvshare-slurm into $NVSHARE_PREFIX), starts a
# one-node Slurm cluster with the nvshare GRES in a temp dir, runs two `sbatch --gres=nvshare:1`
# jobs that share one GPU, shows nvshare-status while they run, then who held the GPU when.
# Everything it starts is stopped on exit; running it again starts from scratch.
#
# The environment can change how (scripts/gpu-slurm-e2e.sh uses these on the GPU machine):
#   NVSHARE_SLURM_ROOT    Slurm and munge are unpacked under this root (Debian's packages, extracted:
#                         usr/sbin/slurmd, usr/sbin/munged, and an env.sh that sets PATH and
#                         LD_LIBRARY_PATH for them): use them and install nothing (no apt-get, no pip)
#   NVSHARE_PYTHON        run nvshare-slurm as `$NVSHARE_PYTHON -m nvshare_slurm.<module>` with the
#                         caller's PYTHONPATH, instead of installing it into $NVSHARE_PREFIX; every
#                         user must be able to run it (jobs' TaskProlog runs it), or the demo stops
#   NVSHARE_DEMO_JOB      the batch script the two jobs run (default: a few seconds of GPU work)
#   NVSHARE_DEMO_SRUN     a command to run as an `srun --gres=nvshare:1` step while the jobs run
#   NVSHARE_DEMO_TIMEOUT  seconds the jobs may take (default 60)
#   NVSHARE_DEMO_CONSTRAIN=1  a site's device confinement: task/cgroup, proctrack/cgroup and
#                         ConstrainDevices=yes, the GPU's device file as a `gpu` GRES beside nvshare
#                         (NVSHARE_DEMO_GPU_DEVICE, default /dev/nvidia0), as nvshare-node-config prints
#   NVSHARE_DEMO_OCI_CONF  an oci.conf to put beside slurm.conf, for `srun --container` steps
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (it starts slurmctld, slurmd, munged)"; exit 1; }
PREFIX=${NVSHARE_PREFIX:-/opt/nvshare}
DEMO=${NVSHARE_DEMO_DIR:-/tmp/nvshare-demo}
TIMEOUT=${NVSHARE_DEMO_TIMEOUT:-60}
SLURM_ROOT=${NVSHARE_SLURM_ROOT:-}
CONSTRAIN=${NVSHARE_DEMO_CONSTRAIN:-}
GPU_DEVICE=${NVSHARE_DEMO_GPU_DEVICE:-/dev/nvidia0}
PROCTRACK=proctrack/linuxproc; TASK_PLUGIN=task/none; GRES_TYPES=nvshare; NODE_GRES=nvshare:gpu0:4
if [ -n "$CONSTRAIN" ]; then
  PROCTRACK=proctrack/cgroup; TASK_PLUGIN=task/cgroup; GRES_TYPES=gpu,nvshare; NODE_GRES=gpu:1,nvshare:gpu0:4
fi

if [ -n "$SLURM_ROOT" ]; then
  echo "== using Slurm unpacked in $SLURM_ROOT (nothing installed)"
  [ -x "$SLURM_ROOT/usr/sbin/slurmd" ] && [ -f "$SLURM_ROOT/env.sh" ] \
    || { echo "demo.sh: no unpacked Slurm in $SLURM_ROOT (usr/sbin/slurmd and env.sh)"; exit 1; }
  # shellcheck disable=SC1091
  . "$SLURM_ROOT/env.sh"
  SBIN=$SLURM_ROOT/usr/sbin
else
  echo "== installing (scripts/install-demo-slurm.sh: Debian's Slurm and munge where missing)"
  bash scripts/install-demo-slurm.sh
  if [ -z "${NVSHARE_PYTHON:-}" ]; then
    echo "== installing nvshare-slurm (scripts/install.sh)"
    # shellcheck source=system-python.sh
    . scripts/system-python.sh
    bash scripts/install.sh      # refuses a Python other users cannot run
  fi
  SBIN=/usr/sbin
fi
if [ -n "${NVSHARE_PYTHON:-}" ]; then
  PY_BIN=$(command -v "$NVSHARE_PYTHON")
  "$PY_BIN" -c 'import nvshare_slurm' || { echo "demo.sh: $PY_BIN cannot import nvshare_slurm (PYTHONPATH)"; exit 1; }
  # Jobs run the TaskProlog as their user: a Python only root can run (pyenv's under /root)
  # would fail every task (status 126). Tried as nobody, as install.sh does.
  if id nobody >/dev/null 2>&1 && ! runuser -u nobody -- env PYTHONPATH="${PYTHONPATH:-}" \
      "$PY_BIN" -c 'import nvshare_slurm' >/dev/null 2>&1; then
    echo "demo.sh: other users cannot run $PY_BIN with nvshare_slurm (PYTHONPATH=${PYTHONPATH:-}):"
    echo "  every job's TaskProlog would fail. Use a Python and a checkout every user can read."
    exit 1
  fi
fi
# The command line of one of nvshare-slurm's entry points (scheduler, status, prolog, epilog, taskprolog).
nvshare_cmd() {
  if [ -n "${NVSHARE_PYTHON:-}" ]; then
    case $1 in scheduler) echo "$PY_BIN -m nvshare_slurm.daemon" ;; *) echo "$PY_BIN -m nvshare_slurm.$1" ;; esac
  else
    echo "$PREFIX/bin/nvshare-$1"
  fi
}

pids=()
SRUN_PID=
cleanup() {
  set +e
  [ -n "$SRUN_PID" ] && kill "$SRUN_PID" 2>/dev/null
  [ -n "${SLURM_CONF:-}" ] && [ -e "$SLURM_CONF" ] && timeout 10 scancel --full -u root >/dev/null 2>&1
  sleep 1
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  # The logs stay for reading; the cluster's munge key does not stay behind in a temp dir.
  rm -f "$DEMO/munge/munge.key"
}
trap cleanup EXIT

# A previous run that was killed hard may have left its daemons: stop those (by their pid files).
for pidfile in "$DEMO"/*.pid "$DEMO"/munge/munged.pid; do
  [ -e "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
done
rm -rf "$DEMO"
mkdir -p "$DEMO"/{state,spool,jobs,munge,nvshare}
chmod 755 "$DEMO"; chmod 1777 "$DEMO/jobs"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=real
  echo "== NVIDIA GPU found: $(nvidia-smi -L | head -1); using NVML and the real driver"
  # Debug: the scheduler logs every lock grant and release, the timeline at the end reads them.
  GPUS_YAML="log_level: debug"
else
  GPU=fake
  echo "== no NVIDIA GPU: using the fake CUDA driver (tests/c/build/libcuda.so.1)"
  make -s -C tests/c >/dev/null
  GPUS_YAML="log_level: debug
gpus: [{uuid: GPU-fa4e0000-0000-0000-0000-000000000000, memory: 16G}]"
fi

HOST=$(hostname -s)
export SLURM_CONF=$DEMO/slurm.conf

cat > "$DEMO/nvshare/nvshare.yaml" <<YAML
socket: $DEMO/nvshare/scheduler.sock
state_dir: $DEMO/nvshare/state
slurm_bin_dir: $(dirname "$(command -v scontrol)")
# Exclusive turns (concurrent mode): a holder keeps the GPU at most 1 s while the other job waits.
# The fake-GPU jobs synchronise every 0.1 s, and a holder with no GPU work in flight hands the GPU
# over within milliseconds (idle_release_ms), so the turns printed at the end last about 0.1 s.
scheduling_mode: concurrent
switch_time_mode: fixed
switch_time_fixed: 1.0
$GPUS_YAML
YAML
# slurm.conf, gres.conf, cgroup.conf where one is needed, and the Prolog, Epilog and TaskProlog
# wrappers (slurmd passes no environment: they name the config files and, when nvshare-slurm or Slurm
# are not installed, where Python and scontrol find their libraries). nvshare_slurm/node/localcluster.py
# writes them, as it does for the tests' and the benchmarks' clusters; this checkout's copy of it.
CLUSTER=(--name nvsdemo --host "$HOST" --partition demo --cpus 4 --gres "$NODE_GRES"
  --gres-conf "NodeName=$HOST Name=nvshare Type=gpu0 Count=4" --gres-types "$GRES_TYPES"
  --proctrack "$PROCTRACK" --task-plugin "$TASK_PLUGIN" --nvshare-config "$DEMO/nvshare/nvshare.yaml")
if [ -n "${NVSHARE_PYTHON:-}" ]; then
  CLUSTER+=(--python "$PY_BIN" --wrapper-env "PYTHONPATH=${PYTHONPATH:-}")
else
  CLUSTER+=(--bin-dir "$PREFIX/bin")
fi
if [ -n "$SLURM_ROOT" ]; then
  # Unpacked, not installed: PluginDir=, and on a cgroup v2 machine without systemd (a container)
  # a cgroup.conf that keeps slurmd away from systemd.
  CLUSTER+=(--slurm-root "$SLURM_ROOT" --wrapper-env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
fi
if [ -n "$CONSTRAIN" ]; then
  # Slurm denies the GPU's device file to every job that holds no `gpu` GRES; nvshare jobs get it
  # from nvshare-scheduler (docs/admin-guide.md, "Device cgroups").
  CLUSTER+=(--constrain-devices --gres-conf "NodeName=$HOST Name=gpu File=$GPU_DEVICE")
  echo "== a site's device cgroups: $TASK_PLUGIN, $PROCTRACK, ConstrainDevices=yes, gpu GRES on $GPU_DEVICE"
fi
PYTHONPATH=$REPO "${PY_BIN:-python3}" -m nvshare_slurm.node.localcluster "$DEMO" "${CLUSTER[@]}"
# Slurm OCI (`srun --container`): slurmstepd reads oci.conf from slurm.conf's directory.
[ -z "${NVSHARE_DEMO_OCI_CONF:-}" ] || install -m 644 "$NVSHARE_DEMO_OCI_CONF" "$DEMO/oci.conf"

echo "== starting munged, nvshare-scheduler, slurmctld, slurmd (logs in $DEMO)"
# shellcheck source=scripts/munged-start.sh
. "$REPO/scripts/munged-start.sh"
start_munged "$DEMO" "$SBIN"
# shellcheck disable=SC2046
NVSHARE_CONFIG=$DEMO/nvshare/nvshare.yaml $(nvshare_cmd scheduler) \
  > "$DEMO/nvshare/scheduler.log" 2>&1 & pids+=($!)
"$SBIN/slurmctld" -D -i -f "$SLURM_CONF" > "$DEMO/slurmctld.out" 2>&1 & pids+=($!)
for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
STEPD=()
[ -n "$SLURM_ROOT" ] && STEPD=(-d "$SBIN/slurmstepd")
"$SBIN/slurmd" -D -N "$HOST" -f "$SLURM_CONF" "${STEPD[@]}" > "$DEMO/slurmd.out" 2>&1 & pids+=($!)
for _ in $(seq 150); do timeout 5 sinfo -h -o %t 2>/dev/null | grep -qx idle && break; sleep 0.2; done
timeout 5 sinfo -h -o %t | grep -qx idle \
  || { echo "demo.sh: the node did not come up:"; tail "$DEMO"/slurm*.log "$DEMO"/*.out; exit 1; }

# The job: about 4 s of GPU work in small pieces.
if [ -n "${NVSHARE_DEMO_JOB:-}" ]; then
  install -m 755 "$NVSHARE_DEMO_JOB" "$DEMO/jobs/work.sh"
elif [ $GPU = fake ]; then
  cat > "$DEMO/jobs/work.sh" <<JOB
#!/bin/sh
export LD_LIBRARY_PATH=$REPO/tests/c/build FAKE_CUDA_TRACE=$DEMO/jobs/trace-\$SLURM_JOB_ID
# 40 pieces of 0.1 s, each synchronised: between pieces the hook can hand the GPU over.
exec $REPO/tests/c/build/nvtest init ctx:0 $(for _ in $(seq 40); do printf 'launch:100000 sync '; done)
JOB
elif "$PREFIX/bin/python" -c 'import torch' 2>/dev/null || python3 -c 'import torch' 2>/dev/null; then
  PY=$("$PREFIX/bin/python" -c 'import torch' 2>/dev/null && echo "$PREFIX/bin/python" || command -v python3)
  cat > "$DEMO/jobs/work.sh" <<JOB
#!/bin/sh
exec $PY -c '
import time, torch
a = torch.randn(4096, 4096, device="cuda")
t = time.time()
while time.time() - t < 4:
    b = a @ a; torch.cuda.synchronize()
print("job", __import__("os").environ["SLURM_JOB_ID"], "done on", torch.cuda.get_device_name())'
JOB
else
  echo "== no torch importable: the jobs only show their placement (pip install torch for a GPU workload)"
  printf '#!/bin/sh\necho "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES LD_PRELOAD=$LD_PRELOAD"; sleep 4\n' \
    > "$DEMO/jobs/work.sh"
fi
chmod 755 "$DEMO/jobs/work.sh"

echo "== submitting two jobs: sbatch --gres=nvshare:1 work.sh"
cd "$DEMO/jobs"
J1=$(timeout 30 sbatch --parsable --gres=nvshare:1 -J alice work.sh)
J2=$(timeout 30 sbatch --parsable --gres=nvshare:1 -J bob work.sh)
echo "jobs $J1 and $J2"
RUNNING=2
if [ -n "${NVSHARE_DEMO_SRUN:-}" ]; then
  echo "== and a job step: srun --gres=nvshare:1 -J carol $NVSHARE_DEMO_SRUN (output in srun.out)"
  # shellcheck disable=SC2086
  ( timeout -k 5 "$TIMEOUT" srun --gres=nvshare:1 -J carol $NVSHARE_DEMO_SRUN > srun.out 2>&1
    echo $? > srun.rc ) & SRUN_PID=$!
  RUNNING=3
fi
for _ in $(seq 100); do
  [ "$(timeout 5 squeue -h -t R -o %i | wc -l)" -ge $RUNNING ] && break; sleep 0.2
done
sleep 1
echo "== nvshare-status while they run (as a user: nobody)"
# shellcheck disable=SC2046
runuser -u nobody -- env NVSHARE_CONFIG="$DEMO/nvshare/nvshare.yaml" PYTHONPATH="${PYTHONPATH:-}" \
  timeout 10 $(nvshare_cmd status) \
  || { echo "demo.sh: nvshare-status failed for a user (nobody)"; exit 1; }
# shellcheck disable=SC2046
NVSHARE_CONFIG=$DEMO/nvshare/nvshare.yaml timeout 10 $(nvshare_cmd status) show jobs || true
for _ in $(seq $((TIMEOUT * 5))); do [ -z "$(timeout 5 squeue -h -o %i)" ] && break; sleep 0.2; done
[ -z "$(timeout 5 squeue -h -o %i)" ] || { echo "demo.sh: jobs still running after $TIMEOUT s"; squeue; exit 1; }
if [ -n "$SRUN_PID" ]; then
  wait "$SRUN_PID"; SRUN_PID=
fi
# Slurm's word on how each job ended, while slurmctld still remembers them.
for j in $J1 $J2; do
  timeout 5 scontrol show job -o "$j" 2>/dev/null | tr ' ' '\n' \
    | grep -E '^(JobId|JobState|ExitCode)=' | tr '\n' ' ' || true; echo
done > "$DEMO/jobs/states.txt"

echo "== who held the GPU when"
if [ $GPU = fake ]; then
  python3 - "$DEMO/jobs" "$J1" "$J2" <<'PY'
import sys
from pathlib import Path
jobs_dir, jobs = Path(sys.argv[1]), sys.argv[2:]
spans = []
for job in jobs:
    path = jobs_dir / f"trace-{job}"
    for line in path.read_text().split("\n") if path.exists() else []:
        parts = line.split()
        if len(parts) == 4:
            spans.append((int(parts[2]), int(parts[3]), job))
if not spans:
    sys.exit("no GPU work was traced (see slurm-*.out)")
spans.sort()
t0 = spans[0][0]
turns = []   # merge consecutive kernels of one job into one turn
for start, end, job in spans:
    if turns and turns[-1][2] == job and start - turns[-1][1] < 50_000_000:
        turns[-1][1] = max(turns[-1][1], end)
    else:
        turns.append([start, end, job])
for start, end, job in turns:
    print(f"  job {job}: {(start - t0) / 1e9:6.2f}s .. {(end - t0) / 1e9:6.2f}s")
overlap = any(a[2] != b[2] and b[0] < a[1] for a, b in zip(spans, spans[1:]))
print(f"  {len(turns)} turns; the two jobs' GPU work {'OVERLAPPED' if overlap else 'never overlapped'}")
PY
else
  python3 - "$DEMO/nvshare/scheduler.log" <<'PY'
import re, sys
from datetime import datetime
# The scheduler's debug log: "<time> nvshare-scheduler: gpu G: job J step S pid P: lock granted|released"
line_re = re.compile(r"^(\S+ \S+) nvshare-scheduler: (?:gpu \S+: )?job (\d+) step (\S+) pid (\d+): "
                     r"(lock granted|lock released|client disconnected)")
holding, turns = {}, []
for line in open(sys.argv[1], errors="replace"):
    m = line_re.match(line)
    if not m:
        continue
    t = datetime.strptime(m[1].replace(",", "."), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    who = (m[2], m[3], m[4])
    if m[5] == "lock granted":
        holding.setdefault(who, t)
    elif who in holding:
        turns.append([holding.pop(who), t, who])
if not turns:
    sys.exit("  no lock grants in the scheduler log")
turns.sort()
t0 = turns[0][0]
merged = []   # one job's back-to-back turns (an idle release and re-grant within 50 ms) are one
for start, end, who in turns:
    if merged and merged[-1][2][0] == who[0] and start - merged[-1][1] < 0.05:
        merged[-1][1] = max(merged[-1][1], end)
    else:
        merged.append([start, end, who])
for start, end, (job, step, pid) in merged[:60]:
    print(f"  job {job} step {step}: {start - t0:6.2f}s .. {end - t0:6.2f}s")
if len(merged) > 60:
    print(f"  ... {len(merged) - 60} more")
jobs = sorted({w[0] for _, _, w in merged})
print(f"  {len(merged)} turns of jobs {', '.join(jobs)} over {max(e for _, e, _ in merged) - t0:.1f} s")
PY
fi
echo "== job output"
for j in $J1 $J2; do
  echo "-- job $j ($(grep "^JobId=$j " "$DEMO/jobs/states.txt" | cut -d' ' -f2- | xargs))"
  tail -3 "$DEMO/jobs/slurm-$j.out"
done
if [ -f "$DEMO/jobs/srun.out" ]; then echo "-- srun step (exit $(cat "$DEMO/jobs/srun.rc" 2>/dev/null))"; tail -3 "$DEMO/jobs/srun.out"; fi
echo "== done; logs are in $DEMO"
