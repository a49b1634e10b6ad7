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
# E2E_CONTAINER=1 (implies E2E_CONSTRAIN=1: a container's process is known by its job's cgroup): the
# second sbatch job trains in a Slurm OCI container, `srun --container=BUNDLE --gres=nvshare:1`
# inside the job, with slurm/oci.conf.example's lines (nvshare-container from this checkout, crun
# from E2E_CRUN, /opt/crunroot/bin/crun, PATH, or the carried .crundeb/ through
# scripts/gpu-crun.sh). The bundle (scripts/gpu-crun.sh bundle) has its own PID namespace and a
# read-only rootfs of the node's /usr, /etc, /opt, Python and torch, the node's /dev and /sys, the
# jobs' directory and tests/gpu; the hook and the daemon's socket come only from nvshare-container.
# Before Slurm starts, the same bundle runs torch on the GPU outside Slurm (a preflight, 120 s at
# most). More checks: the containerised training ran in a PID namespace of its own, the scheduler
# logged its client as registered from one, and no task of the job ran without the hook.
# E2E_FAKE_GPU=1 (a test of the script on a machine without a GPU): the demo's fake CUDA driver
# (tests/c/build) and `nvtest` bursts in place of the training; the checks that need torch or a
# real GPU (losses, nvidia-smi, device opens) are left out, and result.json says "fake_gpu": true.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${1:?usage: gpu-slurm-e2e.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/e2e.log") 2>&1
TEE_PID=$!
SLURM_ROOT=${E2E_SLURM_ROOT:-/opt/slurmroot}   # E2E_SLURM_ROOT: Slurm unpacked elsewhere
DEMO=/tmp/nvshare-e2e            # short: munged's socket path must fit a sockaddr_un
TIMEOUT=${E2E_TIMEOUT:-200}
TRAIN_SECONDS=${E2E_TRAIN_SECONDS:-20}
say() { echo "gpu-slurm-e2e: $*"; }
fail() { say "$*"; exit 1; }

CONTAINER=${E2E_CONTAINER:-}
FAKE=${E2E_FAKE_GPU:-}
CONSTRAIN=${E2E_CONSTRAIN:-}
[ -n "$CONTAINER" ] && CONSTRAIN=1
BUNDLE=/tmp/nvshare-e2e-bundle
CONTAINER_CMD=/tmp/nvshare-e2e-container
OCI_CONF=/tmp/nvshare-e2e-oci.conf
[ "$(id -u)" = 0 ] || fail "run as root (slurmctld, slurmd and munged are started)"
PY=${E2E_PYTHON:-$(command -v python3)} || fail "no python3"
if [ -n "$FAKE" ]; then
  GPU_UUID=GPU-fa4e0000-0000-0000-0000-000000000000 GPU_NAME="fake GPU"   # demo.sh's fake GPU
  timeout 60 "$PY" -c 'import nvshare_slurm.wire.proto, yaml' \
    || fail "$PY cannot import nvshare_slurm, yaml"
  make -s -C tests/c >/dev/null || fail "cannot build the fake driver (tests/c)"
  # The gpu GRES's device file under ConstrainDevices: a node nothing here uses (NVIDIA's major).
  FAKE_DEV=/tmp/nvshare-e2e-fakegpu0
  [ -n "$CONSTRAIN" ] && { rm -f "$FAKE_DEV"; mknod "$FAKE_DEV" c 195 0 || fail "mknod $FAKE_DEV"; }
else
  GPU_UUID=$(timeout 30 nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null | head -1)
  GPU_NAME=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
  [ -n "$GPU_UUID" ] || fail "no NVIDIA GPU (nvidia-smi)"
  timeout 60 "$PY" -c 'import nvshare_slurm.wire.proto, torch, yaml, pynvml' \
    || fail "python3 cannot import nvshare_slurm, torch, yaml, pynvml: run '. scripts/gpu-setup.sh' first"
fi
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

# A result.json for a run that stops before the jobs: one failed check, and why.
early_result() {
  "$PY" -c 'import json, sys; print(json.dumps({"passed": False, "gpu": sys.argv[2], "uuid": sys.argv[3],
    "checks": [{"check": sys.argv[4], "ok": False, "detail": sys.argv[5]}], "turns": 0}, indent=1))' \
    "$OUT" "$GPU_NAME" "$GPU_UUID" "$1" "$2" > "$OUT/result.json"
  fail "$1: $2"
}
if [ -n "$CONTAINER" ]; then
  CRUN=${E2E_CRUN:-}
  [ -n "$CRUN" ] || { [ -x /opt/crunroot/bin/crun ] && CRUN=/opt/crunroot/bin/crun; }
  [ -n "$CRUN" ] || CRUN=$(command -v crun)
  if [ -z "$CRUN" ] && [ -d .crundeb ]; then
    say "unpacking crun: scripts/gpu-crun.sh install .crundeb"
    timeout 120 bash scripts/gpu-crun.sh install .crundeb && CRUN=/opt/crunroot/bin/crun
  fi
  [ -n "$CRUN" ] && "$CRUN" --version >/dev/null 2>&1 \
    || early_result "crun runs" "no crun (E2E_CRUN, /opt/crunroot/bin/crun, PATH or .crundeb/)"
  say "crun: $CRUN ($("$CRUN" --version | head -1))"
  # The bundle: the jobs' directory read-write, the training's directory (or the fake driver)
  # read-only; nothing else of this checkout.
  RO=("$REPO/tests/gpu"); [ -n "$FAKE" ] && RO=("$REPO/tests/c/build")
  CRUN=$CRUN PY=$PY timeout 60 bash scripts/gpu-crun.sh bundle "$BUNDLE" "$DEMO/jobs" -- "${RO[@]}" \
    || early_result "the bundle is made" "scripts/gpu-crun.sh bundle failed"
  cp "$BUNDLE/config.json" "$OUT/bundle-config.json"
  # Preflight, outside Slurm: the same rootfs reaches Python (torch and the GPU) in its namespaces.
  PRE=/tmp/nvshare-e2e-preflight-bundle   # not /tmp/<container>: crun --root=/tmp/ keeps its state there
  rm -rf "$PRE"; mkdir -p "$PRE"
  if [ -n "$FAKE" ]; then
    PRE_CMD="import sys; print('preflight python', sys.version.split()[0])"
  else
    PRE_CMD="import torch; x = torch.ones(1024, 1024, device='cuda'); print('preflight', torch.__version__, torch.cuda.get_device_name(0), float((x @ x).sum()))"
  fi
  "$PY" - "$BUNDLE" "$PRE" "$PY" "$PRE_CMD" <<'PYEDIT'
import json, sys
bundle, pre, py, cmd = sys.argv[1:]
c = json.load(open(f"{bundle}/config.json"))
c["root"]["path"] = f"{bundle}/rootfs"
c["process"]["args"] = ["/bin/sh", "-c", f"echo preflight pid $$; nvidia-smi -L 2>&1 | head -1; exec {py} -c \"{cmd}\""]
json.dump(c, open(f"{pre}/config.json", "w"), indent=1)
PYEDIT
  mkdir -p "$DEMO/jobs"    # the bundle binds it; demo.sh makes it afresh
  "$CRUN" --root=/tmp/ delete --force nvshare-e2e-preflight >/dev/null 2>&1
  say "preflight: torch in the bundle, outside Slurm: $CRUN run --bundle $PRE"
  timeout -k 5 120 "$CRUN" --rootless=true --root=/tmp/ --cgroup-manager=disabled run --bundle "$PRE" \
    nvshare-e2e-preflight > "$OUT/preflight.log" 2>&1
  PRE_RC=$?
  sed 's/^/  /' "$OUT/preflight.log"
  [ $PRE_RC = 0 ] || early_result "preflight: the bundle runs Python outside Slurm" \
    "exit $PRE_RC: $(tail -1 "$OUT/preflight.log")"
  # nvshare-container from this checkout, as oci.conf's RunTimeRun runs it (slurmstepd gives it
  # no PYTHONPATH), and oci.conf: slurm/oci.conf.example with these paths filled in.
  cat > "$CONTAINER_CMD" <<WRAP
#!/bin/sh
. $SLURM_ROOT/env.sh
PYTHONPATH=${PYTHONPATH:-$REPO} exec $PY -m nvshare_slurm.container "\$@"
WRAP
  chmod 755 "$CONTAINER_CMD"
  sed -e "s|/opt/nvshare/bin/nvshare-container oci|$CONTAINER_CMD oci --config $DEMO/nvshare/nvshare.yaml|" \
      -e "s|/usr/bin/crun |$CRUN |g" slurm/oci.conf.example > "$OCI_CONF"
  grep -q "^RunTimeRun=\"$CONTAINER_CMD oci " "$OCI_CONF" || early_result "oci.conf is written" \
    "slurm/oci.conf.example has no RunTimeRun through /opt/nvshare/bin/nvshare-container"
  cp "$OCI_CONF" "$OUT/oci.conf"
fi

# The job, for both sbatch jobs and the srun step: what it was given, then a short training that
# writes its losses to train-<job id>.json in the submit directory.
JOB_SCRIPT=$(mktemp /tmp/nvshare-e2e-job.XXXXXX)
if [ -n "$FAKE" ]; then
  WORK="LD_LIBRARY_PATH=$REPO/tests/c/build FAKE_CUDA_TRACE=$DEMO/jobs/trace-\$SLURM_JOB_ID \\
  $REPO/tests/c/build/nvtest init ctx:0 burst:100000:30:1"
else
  WORK="$PY $REPO/tests/gpu/train.py --model transformer --width 1024 --heads 16 --seq 256 --depth 6 \\
  --batch 16 --steps 2000 --max-seconds $TRAIN_SECONDS --out train-\$SLURM_JOB_ID.json"
fi
OUTER=
# E2E_CONTAINER: the second job (bob) runs this script again as a container step; inside, the
# working directory is the bundle's (/), so every copy goes to the jobs' directory first.
[ -n "$CONTAINER" ] && OUTER="if [ \"\$SLURM_JOB_NAME\" = bob ] && [ -z \"\${E2E_IN_CONTAINER:-}\" ]; then
  echo \"e2e-outer pid=\$\$ pidns=\$(readlink /proc/self/ns/pid)\"
  timeout -k 5 $((TIMEOUT - 70)) srun --container=$BUNDLE --gres=nvshare:1 -n1 \\
    --export=ALL,E2E_IN_CONTAINER=1 $DEMO/jobs/work.sh
  rc=\$?
  echo \"e2e-outer-exit \$rc\"
  exit \$rc
fi
[ -n \"\${E2E_IN_CONTAINER:-}\" ] && echo \"e2e-ctr pid=\$\$ pidns=\$(readlink /proc/self/ns/pid)\""
cat > "$JOB_SCRIPT" <<JOB
#!/bin/sh
$OUTER
cd $DEMO/jobs || exit 1
echo "e2e-env SLURM_JOB_ID=\$SLURM_JOB_ID SLURM_STEP_ID=\${SLURM_STEP_ID:-} host=\$(hostname)"
echo "e2e-env LD_PRELOAD=\${LD_PRELOAD:-}"
echo "e2e-env CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES:-}"
echo "e2e-env NVSHARE_SOCKET=\${NVSHARE_SOCKET:-} NVSHARE_JOB_ID=\${NVSHARE_JOB_ID:-}"
echo "e2e-smi \$(timeout 30 nvidia-smi -L 2>&1 | head -1)"
$WORK
rc=\$?
echo "e2e-exit \$rc"
exit \$rc
JOB
chmod 755 "$JOB_SCRIPT"

say "running scripts/demo.sh on the unpacked Slurm (at most $TIMEOUT s)"
OCI_ARG=; [ -n "$CONTAINER" ] && OCI_ARG=$OCI_CONF
GPU_DEV_ARG=/dev/nvidia0; [ -n "$FAKE" ] && GPU_DEV_ARG=/tmp/nvshare-e2e-fakegpu0
NVSHARE_DEMO_OCI_CONF=$OCI_ARG NVSHARE_DEMO_GPU_DEVICE=$GPU_DEV_ARG \
NVSHARE_DEMO_CONSTRAIN=$CONSTRAIN NVSHARE_SLURM_ROOT=$SLURM_ROOT NVSHARE_PYTHON=$PY NVSHARE_DEMO_DIR=$DEMO NVSHARE_DEMO_JOB=$JOB_SCRIPT \
  NVSHARE_DEMO_SRUN=$JOB_SCRIPT NVSHARE_DEMO_TIMEOUT=$((TIMEOUT - 60)) \
  timeout -k 15 "$TIMEOUT" bash scripts/demo.sh
DEMO_RC=$?
say "demo.sh exited $DEMO_RC"
# demo.sh stops what it started on exit; had it been killed, its daemons would still run.
for pidfile in "$DEMO"/slurmctld.pid "$DEMO"/slurmd.pid "$DEMO"/munge/munged.pid; do
  [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null && say "stopped a leftover $(basename "$pidfile" .pid)"
done
rm -f "$JOB_SCRIPT"
[ -n "$FAKE" ] && rm -f /tmp/nvshare-e2e-fakegpu0
if [ -n "$CONTAINER" ]; then
  timeout 10 "$CRUN" --root=/tmp/ list 2>/dev/null | grep -q . && say "crun's containers left: $("$CRUN" --root=/tmp/ list 2>/dev/null | tail -n +2 | wc -l)"
  rm -rf "$BUNDLE" /tmp/nvshare-e2e-preflight-bundle "$CONTAINER_CMD" "$OCI_CONF"
fi

# Everything the run left, less munge's key and the sockets.
mkdir -p "$OUT/demo"
tar -C "$DEMO" -cf - --exclude=munge.key --exclude='*.sock' --exclude='*.socket' . 2>/dev/null \
  | tar -C "$OUT/demo" -xf -
if [ -n "$MUNGED_STARTED" ] && [ -f /run/munge/munged.pid ]; then
  kill "$(cat /run/munge/munged.pid)" 2>/dev/null   # the munged that the unpacking started
fi

"$PY" - "$OUT" "$GPU_UUID" "$GPU_NAME" "$DEMO_RC" "$CONSTRAIN" "$CONTAINER" "$FAKE" <<'PY'
"""Check each job's output and the scheduler's log; write result.json and timeline.txt."""
import json
import re
import sys
from datetime import datetime
from pathlib import Path

out, uuid, gpu_name, demo_rc = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
constrained, container, fake = (sys.argv[i] == "1" for i in (5, 6, 7))
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
contained = []
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
    if container and job and states.get(job[1], {}).get("JobId") and "e2e-outer " in text:
        # bob: the batch step's PID namespace is the node's; the training's must be another.
        outer = re.search(r"e2e-outer pid=\d+ pidns=(\S+)", text)
        inner = re.search(r"e2e-ctr pid=(\d+) pidns=(\S+)", text)
        contained.append(job[1])
        check(f"{what}: trained in a container with a PID namespace of its own",
              bool(outer and inner and inner[2] != outer[1]),
              f"batch step {outer[1] if outer else '?'}, container "
              f"{inner[2] + ' (pid ' + inner[1] + ' there)' if inner else 'no e2e-ctr line'}")
        bad = [line for line in text.splitlines() if "cannot be preloaded" in line
               or "nvshare-container" in line]
        check(f"{what}: the hook loaded in the container (no ld.so or nvshare-container complaint)",
              not bad, "; ".join(bad)[:300])
    if fake:
        continue    # no torch, no nvidia-smi: what follows needs the real GPU
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
if not fake:
    check("losses are bit-identical across the jobs", same, f"first {common} steps of {len(all_losses)} runs")
sched_log = out / "demo" / "nvshare" / "scheduler.log"
sched_all = sched_log.read_text(errors="replace") if sched_log.exists() else ""
if container:
    check("one sbatch job trained in a container (srun --container)", len(contained) == 1,
          f"jobs {', '.join(contained) or 'none'}")
    ns = sorted(set(re.findall(r"job (\d+) step \S+ pid (\d+): client registered from a PID namespace "
                               r"\(pid (\d+) there\)", sched_all)))
    check("the container's client registered from its PID namespace (scheduler log)",
          bool(contained) and any(j == contained[0] for j, _, _ in ns),
          "; ".join(f"job {j} pid {p} (pid {q} there)" for j, p, q in ns) or "no such line")
    unhooked = [line for line in sched_all.splitlines()
                if "without the hook" in line or "client refused" in line]
    check("no task ran without the hook, no client was refused (scheduler log)", not unhooked,
          "; ".join(unhooked)[:300])
if constrained and not fake:
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
# The three jobs run the same training: while all three run, each should hold the GPU about a
# third of the time (issue 27: 7.8 s, 2.3 s and 11.0 s of 21 s before turns given back idle were
# kept or lent). The fake driver's bursts are not equal jobs: not checked there.
if not fake and len(held) >= 3:
    lo = max(min(s for s, _, j in turns if j == job) for job in held)
    hi = min(max(e for _, e, j in turns if j == job) for job in held)
    share = {job: sum(max(0.0, min(e, hi) - max(s, lo)) for s, e, j in turns if j == job) for job in held}
    fair = hi - lo >= 5 and min(share.values()) >= 0.5 * max(share.values())
    check("equal jobs held the GPU about equally while all ran (each at least half the most)", fair,
          f"{hi - lo:.1f} s together; " + ", ".join(f"job {j} {v:.1f} s" for j, v in share.items()))
print(f"== timeline ({len(turns)} turns; all in {out / 'timeline.txt'})")
for line in lines[:25]:
    print("  " + line)
if len(lines) > 25:
    print(f"  ... {len(lines) - 25} more")
passed = all(c["ok"] for c in checks)
(out / "result.json").write_text(json.dumps({"passed": passed, "gpu": gpu_name, "uuid": uuid,
                                             "container": container, "constrained": constrained,
                                             "fake_gpu": fake, "checks": checks,
                                             "turns": len(turns)}, indent=1))
print(f"== {'PASSED' if passed else 'FAILED'}: {sum(c['ok'] for c in checks)} of {len(checks)} checks")
sys.exit(0 if passed else 1)
PY
RC=$?
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null   # e2e.log complete before the caller collects it
exit $RC
