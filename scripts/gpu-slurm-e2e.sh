#!/bin/bash
# Slurm end to end on the GPU machine: a one-node Slurm cluster with nvshare's Prolog, Epilog and
# TaskProlog and an nvshare-scheduler on NVML (scripts/demo.sh), two `sbatch --gres=nvshare:1`
# PyTorch trainings and one `srun --gres=nvshare:1` step sharing the GPU, then a check of each job.
#
#   . scripts/gpu-setup.sh && bash scripts/gpu-slurm-e2e.sh OUTDIR
#
# Nothing is installed: Slurm comes unpacked from the carried .slurmdeb/ (its gpu-machine-slurm.sh,
# unless /opt/slurmroot is there already) and nvshare-slurm runs from this checkout through
# `python3 -m nvshare_slurm.<module>` with gpu-setup.sh's PYTHONPATH. Every wait is bounded; the
# cluster and its jobs get E2E_TIMEOUT seconds (default 200), each training at most
# E2E_TRAIN_SECONDS (default 20). Writes into OUTDIR: e2e.log (this console), result.json (every
# check), timeline.txt (who held the GPU when, from the scheduler's log) and demo/ (slurm.conf,
# nvshare.yaml, the logs of munged, slurmctld, slurmd and nvshare-scheduler, each job's output and
# training JSON). Exit status 0 when every check passed.
# E2E_CONSTRAIN=1: the cluster confines devices as most GPU sites do (task/cgroup, proctrack/cgroup,
# ConstrainDevices=yes, the GPU as a `gpu` GRES beside nvshare): the nvshare jobs reach the GPU only
# through nvshare-scheduler, and nvidia-smi in each job must list it.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${1:?usage: gpu-slurm-e2e.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/e2e.log") 2>&1
TEE_PID=$!
SLURM_ROOT=/opt/slurmroot
DEMO=/tmp/nvshare-e2e            # short: munged's socket path must fit a sockaddr_un
TIMEOUT=${E2E_TIMEOUT:-200}
TRAIN_SECONDS=${E2E_TRAIN_SECONDS:-20}
say() { echo "gpu-slurm-e2e: $*"; }
fail() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (slurmctld, slurmd and munged are started)"
GPU_UUID=$(timeout 30 nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null | head -1)
GPU_NAME=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
[ -n "$GPU_UUID" ] || fail "no NVIDIA GPU (nvidia-smi)"
PY=$(command -v python3) || fail "no python3"
timeout 60 "$PY" -c 'import nvshare_slurm.proto, torch, yaml, pynvml' \
  || fail "python3 cannot import nvshare_slurm, torch, yaml, pynvml: run '. scripts/gpu-setup.sh' first"
[ -f nvshare_slurm/libnvshare.so ] || fail "nvshare_slurm/libnvshare.so not built: run '. scripts/gpu-setup.sh' first"
say "GPU $GPU_NAME $GPU_UUID; python $PY; PYTHONPATH=${PYTHONPATH:-}"

MUNGED_STARTED=
if [ ! -x "$SLURM_ROOT/usr/sbin/slurmd" ]; then
  [ -f .slurmdeb/gpu-machine-slurm.sh ] || fail "no $SLURM_ROOT and no .slurmdeb/ to unpack it from"
  pgrep -x munged >/dev/null || MUNGED_STARTED=1
  say "unpacking Slurm: .slurmdeb/gpu-machine-slurm.sh install .slurmdeb"
  timeout 180 bash .slurmdeb/gpu-machine-slurm.sh install .slurmdeb || fail "unpacking Slurm failed"
fi
[ -x "$SLURM_ROOT/usr/sbin/slurmd" ] || fail "Slurm is not in $SLURM_ROOT"

# The job, for both sbatch jobs and the srun step: what it was given, then a short training that
# writes its losses to train-<job id>.json in the submit directory.
JOB_SCRIPT=$(mktemp /tmp/nvshare-e2e-job.XXXXXX)
cat > "$JOB_SCRIPT" <<JOB
#!/bin/sh
echo "e2e-env SLURM_JOB_ID=\$SLURM_JOB_ID SLURM_STEP_ID=\${SLURM_STEP_ID:-} host=\$(hostname)"
echo "e2e-env LD_PRELOAD=\${LD_PRELOAD:-}"
echo "e2e-env CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES:-}"
echo "e2e-env NVSHARE_SOCKET=\${NVSHARE_SOCKET:-} NVSHARE_JOB_ID=\${NVSHARE_JOB_ID:-}"
echo "e2e-smi \$(timeout 30 nvidia-smi -L 2>&1 | head -1)"
$PY $REPO/tests/gpu/train.py --model transformer --width 1024 --heads 16 --seq 256 --depth 6 \\
  --batch 16 --steps 2000 --max-seconds $TRAIN_SECONDS --out train-\$SLURM_JOB_ID.json
rc=\$?
echo "e2e-exit \$rc"
exit \$rc
JOB
chmod 755 "$JOB_SCRIPT"

say "running scripts/demo.sh on the unpacked Slurm (at most $TIMEOUT s)"
NVSHARE_DEMO_CONSTRAIN=${E2E_CONSTRAIN:-} NVSHARE_SLURM_ROOT=$SLURM_ROOT NVSHARE_PYTHON=$PY NVSHARE_DEMO_DIR=$DEMO NVSHARE_DEMO_JOB=$JOB_SCRIPT \
  NVSHARE_DEMO_SRUN=$JOB_SCRIPT NVSHARE_DEMO_TIMEOUT=$((TIMEOUT - 60)) \
  timeout -k 15 "$TIMEOUT" bash scripts/demo.sh
DEMO_RC=$?
say "demo.sh exited $DEMO_RC"
# demo.sh stops what it started on exit; had it been killed, its daemons would still run.
for pidfile in "$DEMO"/slurmctld.pid "$DEMO"/slurmd.pid "$DEMO"/munge/munged.pid; do
  [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null && say "stopped a leftover $(basename "$pidfile" .pid)"
done
rm -f "$JOB_SCRIPT"

# Everything the run left, less munge's key and the sockets.
mkdir -p "$OUT/demo"
tar -C "$DEMO" -cf - --exclude=munge.key --exclude='*.sock' --exclude='*.socket' . 2>/dev/null \
  | tar -C "$OUT/demo" -xf -
if [ -n "$MUNGED_STARTED" ] && [ -f /run/munge/munged.pid ]; then
  kill "$(cat /run/munge/munged.pid)" 2>/dev/null   # the munged that the unpacking started
fi

"$PY" - "$OUT" "$GPU_UUID" "$GPU_NAME" "$DEMO_RC" "${E2E_CONSTRAIN:-}" <<'PY'
"""Check each job's output and the scheduler's log; write result.json and timeline.txt."""
import json
import re
import sys
from datetime import datetime
from pathlib import Path

out, uuid, gpu_name, demo_rc = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
constrained = sys.argv[5] == "1"
jobs_dir = out / "demo" / "jobs"
checks = []


def check(name, ok, detail=""):
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"  {'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}")


print("== checks")
check("demo.sh ran to the end", demo_rc == 0, f"exit {demo_rc}")
states = {}
states_file = jobs_dir / "states.txt"
for line in states_file.read_text().splitlines() if states_file.exists() else []:
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    if "JobId" in fields:
        states[fields["JobId"]] = fields
outputs = {f"sbatch job {j}": jobs_dir / f"slurm-{j}.out" for j in states}
outputs["srun step"] = jobs_dir / "srun.out"
check("two sbatch jobs were submitted", len(states) == 2, ", ".join(states) or "none")
for j, fields in states.items():
    check(f"sbatch job {j} completed with exit 0",
          fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0",
          f"{fields.get('JobState')} {fields.get('ExitCode')}")
srun_rc = (jobs_dir / "srun.rc").read_text().strip() if (jobs_dir / "srun.rc").exists() else "missing"
check("srun step exited 0", srun_rc == "0", f"exit {srun_rc}")
job_ids = []
all_losses = {}
for what, path in outputs.items():
    text = path.read_text(errors="replace") if path.exists() else ""
    env = dict(re.findall(r"\b(\w+)=(\S*)", "\n".join(line for line in text.splitlines()
                                                    if line.startswith("e2e-env "))))
    job = re.search(r"SLURM_JOB_ID=(\d+)", text)
    job_ids.append(job[1] if job else "?")
    check(f"{what}: LD_PRELOAD has libnvshare.so", "libnvshare.so" in env.get("LD_PRELOAD", ""),
          env.get("LD_PRELOAD", "unset"))
    check(f"{what}: CUDA_VISIBLE_DEVICES is the GPU's UUID", env.get("CUDA_VISIBLE_DEVICES") == uuid,
          env.get("CUDA_VISIBLE_DEVICES", "unset"))
    check(f"{what}: training exited 0", "e2e-exit 0" in text,
          (re.findall(r"e2e-exit \d+", text) or ["no e2e-exit line"])[-1])
    train = jobs_dir / f"train-{job[1]}.json" if job else None
    losses, device, steps_s = [], "", 0.0
    if train and train.exists():
        res = json.loads(train.read_text())
        losses, device = res.get("losses", []), res.get("device", "")
        if res.get("times"):
            steps_s = res["times"][-1] - res["step_starts"][0]
    on_gpu = bool(device) and (device in gpu_name or gpu_name in device)
    check(f"{what}: losses present, trained on the GPU", len(losses) >= 5 and on_gpu,
          f"{len(losses)} steps in {steps_s:.1f} s on {device or '?'}")
    all_losses[what] = losses
    smi = next((line[len("e2e-smi "):] for line in text.splitlines() if line.startswith("e2e-smi ")), "")
    check(f"{what}: nvidia-smi in the job lists the GPU", uuid in smi, smi or "no e2e-smi line")
# Same script, seed and arguments: the same losses bit for bit, step by step, however the jobs shared.
common = min((len(v) for v in all_losses.values()), default=0)
same = common >= 5 and all(v[:common] == next(iter(all_losses.values()))[:common] for v in all_losses.values())
check("losses are bit-identical across the jobs", same, f"first {common} steps of {len(all_losses)} runs")
if constrained:
    slurmd_log = (out / "demo" / "slurmd.log")
    text = slurmd_log.read_text(errors="replace") if slurmd_log.exists() else ""
    sched_text = (out / "demo" / "nvshare" / "scheduler.log").read_text(errors="replace") \
        if (out / "demo" / "nvshare" / "scheduler.log").exists() else ""
    opened = sorted(set(re.findall(r"job (\d+): (\S+) opened for its processes", sched_text)))
    check("ConstrainDevices: the jobs' GPU device file came from nvshare-scheduler", len(opened) >= 3,
          "; ".join(f"job {j} {p}" for j, p in opened) or "no 'opened for its processes' line")

# Who held the GPU when: the scheduler logs every grant and release at debug level.
log = out / "demo" / "nvshare" / "scheduler.log"
line_re = re.compile(r"^(\S+ \S+) nvshare-scheduler: (?:gpu \S+: )?job (\d+) step (\S+) pid (\d+): "
                     r"(lock granted|lock released|client disconnected)")
holding, turns = {}, []
for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
    m = line_re.match(line)
    if not m:
        continue
    t = datetime.strptime(m[1].replace(",", "."), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    who = (m[2], m[4])
    if m[5] == "lock granted":
        holding.setdefault(who, t)
    elif who in holding:
        turns.append((holding.pop(who), t, who[0]))
turns.sort()
lines = []
if turns:
    t0 = turns[0][0]
    lines = [f"job {job}: {s - t0:7.3f} s .. {e - t0:7.3f} s ({(e - s) * 1000:7.1f} ms)" for s, e, job in turns]
(out / "timeline.txt").write_text("\n".join(lines) + "\n")
held = sorted({job for _, _, job in turns})
check("every job held the GPU's lock", all(j in held for j in job_ids if j != "?") and len(held) >= 3,
      f"jobs {', '.join(held) or 'none'} in {len(turns)} turns")
# A holder that exits is logged as gone just after its successor's grant: allow that much.
overlaps = sum(1 for a, b in zip(turns, turns[1:]) if a[2] != b[2] and b[0] < a[1] - 0.02)
check("exclusive turns never overlapped (concurrent mode)", turns and overlaps == 0, f"{overlaps} overlaps")
switches = sum(1 for a, b in zip(turns, turns[1:]) if a[2] != b[2])
check("the jobs took turns", switches >= 3, f"{switches} hand-overs between jobs")
print(f"== timeline ({len(turns)} turns; all in {out / 'timeline.txt'})")
for line in lines[:25]:
    print("  " + line)
if len(lines) > 25:
    print(f"  ... {len(lines) - 25} more")
passed = all(c["ok"] for c in checks)
(out / "result.json").write_text(json.dumps({"passed": passed, "gpu": gpu_name, "uuid": uuid,
                                             "checks": checks, "turns": len(turns)}, indent=1))
print(f"== {'PASSED' if passed else 'FAILED'}: {sum(c['ok'] for c in checks)} of {len(checks)} checks")
sys.exit(0 if passed else 1)
PY
RC=$?
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null   # e2e.log complete before the caller collects it
exit $RC
