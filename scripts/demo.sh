#!/bin/bash
# nvshare-slurm demo, as root on a fresh Debian/Ubuntu machine: installs everything, starts a
# one-node Slurm cluster with the nvshare GRES in a temp dir, runs two `sbatch --gres=nvshare:1`
# jobs that share one GPU, shows nvshare-status while they run, then who held the GPU when.
# Everything it starts is stopped on exit; running it again starts from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (it starts slurmctld, slurmd, munged)"; exit 1; }
PREFIX=${NVSHARE_PREFIX:-/opt/nvshare}
DEMO=${NVSHARE_DEMO_DIR:-/tmp/nvshare-demo}

echo "== installing (scripts/install.sh)"
bash scripts/install.sh

pids=()
cleanup() {
  set +e
  [ -n "${SLURM_CONF:-}" ] && [ -e "$SLURM_CONF" ] && scancel --full -u root >/dev/null 2>&1
  sleep 1
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
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
  GPUS_YAML=""
else
  GPU=fake
  echo "== no NVIDIA GPU: using the fake CUDA driver (tests/c/build/libcuda.so.1)"
  make -s -C tests/c >/dev/null
  GPUS_YAML="gpus: [{uuid: GPU-fa4e0000-0000-0000-0000-000000000000, memory: 16G}]"
fi

HOST=$(hostname -s)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CTLD_PORT=$(port); SLURMD_PORT=$(port)
export SLURM_CONF=$DEMO/slurm.conf

cat > "$DEMO/nvshare/nvshare.yaml" <<YAML
socket: $DEMO/nvshare/scheduler.sock
state_dir: $DEMO/nvshare/state
slurm_bin_dir: $(dirname "$(command -v scontrol)")
# Exclusive turns of one second, so the two jobs visibly take turns.
scheduling_mode: concurrent
switch_time_mode: fixed
switch_time_fixed: 1.0
$GPUS_YAML
YAML
for kind in prolog epilog taskprolog; do
  # slurmd passes no environment: the wrapper names the config files.
  printf '#!/bin/sh\nexport NVSHARE_CONFIG=%s\nexport SLURM_CONF=%s\nexec %s\n' \
    "$DEMO/nvshare/nvshare.yaml" "$SLURM_CONF" "$PREFIX/bin/nvshare-$kind" > "$DEMO/$kind.sh"
  chmod 755 "$DEMO/$kind.sh"
done

cat > "$SLURM_CONF" <<CONF
ClusterName=nvsdemo
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DEMO/munge/munge.sock
StateSaveLocation=$DEMO/state
SlurmdSpoolDir=$DEMO/spool
SlurmctldPidFile=$DEMO/slurmctld.pid
SlurmdPidFile=$DEMO/slurmd.pid
SlurmctldLogFile=$DEMO/slurmctld.log
SlurmdLogFile=$DEMO/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=2
GresTypes=nvshare
PrologFlags=Alloc
Prolog=$DEMO/prolog.sh
Epilog=$DEMO/epilog.sh
TaskProlog=$DEMO/taskprolog.sh
NodeName=$HOST NodeAddr=127.0.0.1 Port=$SLURMD_PORT CPUs=4 RealMemory=1000 Gres=nvshare:gpu0:4 State=UNKNOWN
PartitionName=demo Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
echo "NodeName=$HOST Name=nvshare Type=gpu0 Count=4" > "$DEMO/gres.conf"

echo "== starting munged, nvshare-scheduler, slurmctld, slurmd (logs in $DEMO)"
install -m 600 /etc/munge/munge.key "$DEMO/munge/munge.key"
chmod 700 "$DEMO/munge"
/usr/sbin/munged -F --force --socket="$DEMO/munge/munge.sock" --key-file="$DEMO/munge/munge.key" \
  --log-file="$DEMO/munge/munged.log" --pid-file="$DEMO/munge/munged.pid" \
  --seed-file="$DEMO/munge/munged.seed" & pids+=($!)
for _ in $(seq 50); do [ -S "$DEMO/munge/munge.sock" ] && break; sleep 0.1; done
chmod 755 "$DEMO/munge"
NVSHARE_CONFIG=$DEMO/nvshare/nvshare.yaml "$PREFIX/bin/nvshare-scheduler" \
  > "$DEMO/nvshare/scheduler.log" 2>&1 & pids+=($!)
/usr/sbin/slurmctld -D -i -f "$SLURM_CONF" > "$DEMO/slurmctld.out" 2>&1 & pids+=($!)
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
/usr/sbin/slurmd -D -N "$HOST" -f "$SLURM_CONF" > "$DEMO/slurmd.out" 2>&1 & pids+=($!)
for _ in $(seq 150); do sinfo -h -o %t 2>/dev/null | grep -qx idle && break; sleep 0.2; done
sinfo -h -o %t | grep -qx idle || { echo "demo.sh: the node did not come up:"; tail "$DEMO"/slurm*.log; exit 1; }

# The job: about 4 s of GPU work in small pieces.
if [ $GPU = fake ]; then
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
J1=$(sbatch --parsable --gres=nvshare:1 -J alice work.sh)
J2=$(sbatch --parsable --gres=nvshare:1 -J bob work.sh)
echo "jobs $J1 and $J2"
for _ in $(seq 100); do
  [ "$(squeue -h -t R -o %i | wc -l)" -ge 2 ] && break; sleep 0.2
done
sleep 1
echo "== nvshare-status while they run"
NVSHARE_CONFIG=$DEMO/nvshare/nvshare.yaml "$PREFIX/bin/nvshare-status" || true
NVSHARE_CONFIG=$DEMO/nvshare/nvshare.yaml "$PREFIX/bin/nvshare-status" show jobs || true
for _ in $(seq 300); do [ -z "$(squeue -h -o %i)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -o %i)" ] || { echo "demo.sh: jobs still running after 60 s"; squeue; exit 1; }

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
  grep -E "job ($J1|$J2)" "$DEMO/nvshare/scheduler.log" | sed 's/^/  /' | tail -20
fi
echo "== job output"
for j in $J1 $J2; do echo "-- job $j"; tail -3 "$DEMO/jobs/slurm-$j.out"; done
echo "== done; logs are in $DEMO"
