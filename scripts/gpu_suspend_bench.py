"""The sequence and the numbers of scripts/gpu-suspend-bench.sh (issue 28's benchmark); that script
starts the cluster and runs this with SLURM_CONF set. Every wait is bounded.

  python3 scripts/gpu_suspend_bench.py --out OUTDIR --jobs DIR --nvshare-config YAML --python PY
         --hold-gib G --low-steps N --high-steps M --suspend-after K [--fake] [--wait S]

1. solo: the low job alone, then the high job alone (`sbatch --gres=nvshare:1`);
2. nvshare: the low job; once it has trained K steps, `scontrol suspend` it and at once submit the
   high job (both `--gres=nvshare:1`); nvshare-status while the low job is suspended; when the high
   job ends, `scontrol resume` the low job and wait for it;
3. plain: the same sequence without nvshare (no nvshare GRES: no hook, the GPU as it is), where the
   high job is expected to run out of memory;
4. checkpoint: the same without nvshare, but NVIDIA's checkpoint API (scripts/cuda_checkpoint.py:
   lock and checkpoint the training's process just before `scontrol suspend`, restore and unlock it
   just after `scontrol resume`): the other way to free the GPU, measured in the same run.
Each job runs tests/gpu/train.py (a transformer plus a ballast of G GiB rewritten every step,
fixed seed) or, with --fake, tests/c/build/nvtest on the fake driver (an allocation filled, kernels,
then the allocation checked). Writes OUTDIR/result.json and OUTDIR/table.txt; exit 0 when every
check passed (the issue's speed targets are recorded apart, in "targets").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "tests" / "c" / "build"
FAKE_GPU = "GPU-fa4e0000-0000-0000-0000-000000000000"
MiB = 1 << 20


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.out = Path(args.out)
        self.jobs = Path(args.jobs)
        self.events: list[str] = []
        self.partial: dict = {}
        self.deadline = time.monotonic() + args.deadline
        self.checks: list[dict] = []
        self.script = self.jobs / "bench-job.sh"
        self.write_script()

    # --- the job -----------------------------------------------------------------------------

    def write_script(self) -> None:
        """One batch script for every job: `bench-job.sh ROLE low|high`. The payload is the
        script's child, not exec'd: under proctrack/cgroup only the script gets SIGTSTP and the
        training goes on until the freeze, as with any training a batch script starts."""
        a, q = self.a, shlex.quote
        if a.fake:
            hold = int(a.hold_gib * 1024) * MiB
            payload = (f'export LD_LIBRARY_PATH={q(str(BUILD))} FAKE_CUDA_DEVICES={FAKE_GPU}:'
                       f'{a.fake_gpu_mib}M\n'
                       # one device memory per arm (a solo run: per job)
                       f'case $ARM in solo) M=$1 ;; *) M=$ARM ;; esac\n'
                       f'export FAKE_CUDA_SHARED_MEMORY="$PWD/device-memory-$M"\n'
                       f'export FAKE_CUDA_TRACE="$PWD/trace-$1"\n'
                       f'case $2 in low) N={a.low_steps}; B=a5 ;; *) N={a.high_steps}; B=5a ;; esac\n'
                       f'{q(str(BUILD / "nvtest"))} init ctx:0 alloc:{hold} fill:0:$B '
                       # free:0: the fake driver's shared count forgets nothing at exit
                       f'burst:20000:$N:0 check:0:$B free:0 > "out-$1" 2>&1\n')
        else:
            payload = (f'case $2 in low) N={a.low_steps} ;; *) N={a.high_steps} ;; esac\n'
                       f'{q(a.python)} {q(str(REPO / "tests/gpu/train.py"))} --model transformer '
                       f'--width 1024 --heads 16 --seq 256 --depth 6 --batch 16 --seed 1234 '
                       f'--steps $N --mem-gb {a.hold_gib} --progress "progress-$1" '
                       f'--out "train-$1.json" > "out-$1" 2>&1\n')
        self.script.write_text(
            "#!/bin/sh\n"
            f"cd {q(str(self.jobs))} || exit 1\n"
            'ARM=${1#*-}\n'
            'echo "bench-env job=$SLURM_JOB_ID role=$1 LD_PRELOAD=${LD_PRELOAD:-} '
            'CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"\n'
            f"{payload}"
            "rc=$?\n"
            'echo "bench-exit $rc"\n'
            "exit $rc\n")
        self.script.chmod(0o755)

    # --- Slurm ---------------------------------------------------------------------------------

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")

    def note(self, text: str) -> None:
        line = f"{time.time():.3f} {text}"
        self.events.append(line)
        print(f"gpu-suspend-bench: {text}", flush=True)

    def submit(self, role: str, nvshare: bool) -> int:
        gres = ["--gres=nvshare:1"] if nvshare else []
        done = self.run("sbatch", "--parsable", "-J", role, "-o", str(self.jobs / f"slurm-{role}.out"),
                        *gres, str(self.script), role, role.split("-")[0])
        if done.returncode != 0:
            raise BenchError(f"sbatch {role}: {done.stderr.strip()}")
        job = int(done.stdout.strip().split(";")[0])
        self.note(f"submitted {role} as job {job}")
        return job

    def state(self, job: int) -> tuple[str, str]:
        done = self.run("scontrol", "show", "job", "-o", str(job), timeout=10)
        fields = dict(w.split("=", 1) for w in done.stdout.split() if "=" in w)
        return fields.get("JobState", "?"), fields.get("ExitCode", "?")

    def wait(self, what: str, test, seconds: float, every: float = 0.1):
        """test() until true, at most `seconds` and never past the whole run's deadline."""
        end = min(time.monotonic() + seconds, self.deadline)
        while time.monotonic() < end:
            value = test()
            if value:
                return value
            time.sleep(every)
        if time.monotonic() >= self.deadline:
            raise BenchError(f"{what}: not before the run's deadline (--deadline)")
        raise BenchError(f"{what}: not within {seconds:.0f} s")

    def wait_end(self, job: int, seconds: float) -> tuple[str, str]:
        ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
        return self.wait(f"job {job} ends", lambda: (s := self.state(job))[0] in ended and s,
                         seconds, 0.5)

    def progress(self, role: str) -> int:
        """Steps the role's job has done (kernels on the fake driver)."""
        if self.a.fake:
            return len(self.trace(role))
        path = self.jobs / f"progress-{role}"
        try:
            return int(path.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return 0

    def scontrol(self, *args: str) -> None:
        done = self.run("scontrol", *args, timeout=15)
        if done.returncode != 0:
            raise BenchError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")

    def status(self, *args: str) -> str:
        env = {**os.environ, "NVSHARE_CONFIG": self.a.nvshare_config}
        try:
            done = subprocess.run([self.a.python, "-m", "nvshare_slurm.status", *args], env=env,
                                  capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return "(nvshare-status timed out)"
        return done.stdout + done.stderr

    # --- what a run left -------------------------------------------------------------------------

    def trace(self, role: str) -> list[tuple[float, float]]:
        """(start, end) of each kernel of the role's fake job, seconds of CLOCK_MONOTONIC."""
        path = self.jobs / f"trace-{role}"
        rows = []
        for line in path.read_text().splitlines() if path.exists() else []:
            w = line.split()
            if len(w) == 4:
                rows.append((int(w[2]) / 1e9, int(w[3]) / 1e9))
        return sorted(rows)

    def result(self, role: str) -> dict:
        """What one job measured of itself, in the clock of the events (time.time() for torch,
        CLOCK_MONOTONIC for the fake driver's trace)."""
        out = self.jobs / f"out-{role}"
        text = out.read_text(errors="replace") if out.exists() else ""
        r: dict = {"role": role, "output_tail": text[-600:]}
        if self.a.fake:
            rows = self.trace(role)
            r["steps"] = len(rows)
            if rows:
                r.update(first_kernel=rows[0][0], ready=rows[0][0], end=rows[-1][1],
                         train_start=rows[0][0], train_end=rows[-1][1])
            r["data"] = re.findall(r"check 0 rc=\d+ bytes=\d+ bad=\d+", text)
            r["oom"] = bool(re.search(r"alloc \d+ rc=2\b", text))
            r["intact"] = bool(r["data"]) and r["data"][0].startswith("check 0 rc=0") \
                and r["data"][0].endswith(" bad=0") and "burst ok" in text
            return r
        js = self.jobs / f"train-{role}.json"
        r["oom"] = "OutOfMemoryError" in text or "out of memory" in text
        if not js.exists():
            r["steps"] = 0
            return r
        res = json.loads(js.read_text())
        r.update(steps=len(res["losses"]), losses=res["losses"], first_kernel=res["t_cuda"],
                 ready=res["t_ballast"] or res["t_cuda"], launch=res["t_launch"], end=res["end"],
                 train_start=res["step_starts"][0], train_end=res["times"][-1],
                 step_ms_median=res["step_ms_median"], ballast_ok=res["ballast_ok"],
                 device=res["device"])
        r["intact"] = bool(res["ballast_ok"])
        return r

    def clock(self) -> float:
        return time.monotonic() if self.a.fake else time.time()

    # --- the sequence ------------------------------------------------------------------------------

    def solo(self, kind: str) -> dict:
        role = f"{kind}-solo"
        t_submit = self.clock()
        job = self.submit(role, nvshare=True)
        state = self.wait_end(job, self.a.wait)
        self.note(f"{role} ended {state[0]} {state[1]}")
        r = self.result(role)
        r.update(job=job, state=state[0], exit=state[1], submitted=t_submit)
        return r

    def arm(self, arm: str) -> dict:
        nvshare = arm == "nvshare"
        res: dict = {"arm": arm}
        self.partial = res
        low_role, high_role = f"low-{arm}", f"high-{arm}"
        low = self.submit(low_role, nvshare)
        res["low_job"] = low
        self.wait(f"{low_role} trains {self.a.suspend_after} steps",
                  lambda: self.progress(low_role) >= self.a.suspend_after, self.a.wait, 0.1)
        t_suspend = self.clock()
        if arm == "checkpoint":   # before the freeze: the driver's lock hangs on a frozen process
            res["checkpoint_pid"] = pid = self.payload_pid(low)
            res["checkpoint_gpu_mib"] = self.gpu_mib(pid)
            res["checkpoint_suspend"] = self.cuda_checkpoint("suspend", pid)
        self.scontrol("suspend", str(low))
        high = self.submit(high_role, nvshare)
        res.update(high_job=high, suspended_at=t_suspend,
                   suspended_at_step=self.progress(low_role))
        self.note(f"scontrol suspend {low} at step {res['suspended_at_step']}; {high_role} submitted")
        if nvshare:
            shown = ""
            try:
                shown = self.wait("nvshare-status shows the low job suspended",
                                  lambda: (t := self.status("show", "job", str(low)))
                                  and "State=suspended" in t and t, 15, 0.2)
            except BenchError as exc:
                self.note(str(exc))
                shown = self.status("show", "job", str(low))
            res["status_low_suspended"] = shown
            res["status_gpu"] = self.status()
        try:
            hstate = self.wait_end(high, self.a.wait)
        except BenchError as exc:
            self.note(f"{exc}: cancelling it")
            self.run("scancel", str(high))
            hstate = ("NOT_DONE", "?")
        self.note(f"{high_role} ended {hstate[0]} {hstate[1]}")
        res["low_state_while_high_ran"] = self.state(low)[0]
        if not nvshare:
            res["status_low_plain"] = self.status("show", "job", str(low))
        t_resume = self.clock()
        self.scontrol("resume", str(low))
        self.note(f"scontrol resume {low}")
        if arm == "checkpoint":   # after the thaw: the restore runs on a thread of the process
            res["checkpoint_resume"] = self.cuda_checkpoint("resume", res["checkpoint_pid"])
        lstate = self.wait_end(low, self.a.wait)
        self.note(f"{low_role} ended {lstate[0]} {lstate[1]}")
        res.update(resumed_at=t_resume, suspended_sec=t_resume - t_suspend,
                   high_state=hstate[0], high_exit=hstate[1], low_state=lstate[0],
                   low_exit=lstate[1], low=self.result(low_role), high=self.result(high_role))
        for role in (low_role, high_role):
            slurm_out = self.jobs / f"slurm-{role}.out"
            env = slurm_out.read_text(errors="replace") if slurm_out.exists() else ""
            res[f"{role.split('-')[0]}_hooked"] = bool(re.search(r"LD_PRELOAD=\S*libnvshare", env))
        return res

    def payload_pid(self, job: int) -> int:
        """The pid of the job's training (train.py), from `scontrol listpids`."""
        def find() -> int:
            done = self.run("scontrol", "listpids", str(job), timeout=10)
            for line in done.stdout.splitlines()[1:]:
                pid = line.split()[0]
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"train.py" in cmd:
                    return int(pid)
            return 0
        return self.wait(f"job {job}'s training process", find, 10, 0.2)

    def gpu_mib(self, pid: int) -> int:
        """The process's GPU memory as nvidia-smi shows it (MiB; 0 when it does not)."""
        done = self.run("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        for line in done.stdout.splitlines():
            w = [x.strip() for x in line.split(",")]
            if len(w) == 2 and w[0] == str(pid) and w[1].isdigit():
                return int(w[1])
        return 0

    def cuda_checkpoint(self, action: str, pid: int) -> dict:
        """scripts/cuda_checkpoint.py ACTION PID: NVIDIA's checkpoint API, from outside the job."""
        done = self.run(self.a.python, str(REPO / "scripts" / "cuda_checkpoint.py"), action, str(pid),
                        timeout=120)
        try:
            out = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            out = {"ok": False, "error": (done.stdout + done.stderr)[-400:]}
        self.note(f"cuda-checkpoint {action} {pid}: {json.dumps(out)}")
        if not out.get("ok"):
            raise BenchError(f"cuda-checkpoint {action} {pid} failed: {out}")
        return out

    def cancel_all(self) -> None:
        """After a failed arm: resume what is suspended (a frozen job cannot end), cancel all."""
        done = self.run("squeue", "-h", "-t", "S", "-o", "%i", timeout=10)
        for job in done.stdout.split():
            self.run("scontrol", "resume", job, timeout=10)
        self.run("scancel", "-u", "root", timeout=10)
        self.deadline = max(self.deadline, time.monotonic() + 30)   # time to clean up
        self.wait("the queue empties", lambda: not self.run("squeue", "-h", "-o", "%i").stdout.strip()
                  and "empty", 30, 0.5)

    def check(self, name: str, ok, detail: str = "") -> None:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"  {'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)


class BenchError(Exception):
    pass


def rate(r: dict) -> float:
    """Steps per second of training, first step to last."""
    span = r.get("train_end", 0) - r.get("train_start", 0)
    return r.get("steps", 0) / span if span > 0 else 0.0


def same_losses(a: dict, b: dict, fake: bool) -> tuple[bool, str]:
    if fake:   # no losses: the low job's data came back intact, every kernel ran
        ok = a.get("intact") and b.get("intact") and a.get("steps") == b.get("steps")
        return bool(ok), f"{a.get('data')} vs {b.get('data')}; {a.get('steps')} and {b.get('steps')} kernels"
    la, lb = a.get("losses", []), b.get("losses", [])
    first = next((i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y), None)
    differs = f"; first difference at step {first}" if first is not None else ""
    return bool(la) and la == lb, f"{len(la)} and {len(lb)} steps{differs}"


def analyse(b: Bench, solo_low: dict, solo_high: dict, arms: dict) -> dict:
    a, fake = b.a, b.a.fake
    copy_s = a.hold_gib * (1 << 30) / 50e9
    num: dict = {"hold_gib": a.hold_gib, "copy_at_50GBps_s": round(copy_s, 3)}
    b.check("solo low job completed", solo_low["state"] == "COMPLETED" and solo_low.get("intact"),
            f"{solo_low['state']} {solo_low['exit']}, {solo_low.get('steps')} steps")
    b.check("solo high job completed", solo_high["state"] == "COMPLETED" and solo_high.get("intact"),
            f"{solo_high['state']} {solo_high['exit']}, {solo_high.get('steps')} steps")
    solo_low_total = solo_low.get("end", 0) - solo_low.get("launch", solo_low.get("first_kernel", 0))
    solo_high_ready = solo_high.get("ready", 0) - solo_high["submitted"]
    num.update(solo_low_total_s=solo_low_total, solo_low_steps_per_s=rate(solo_low),
               solo_high_steps_per_s=rate(solo_high), solo_high_submit_to_ready_s=solo_high_ready)
    for name, arm in arms.items():
        if "error" in arm:
            b.check(f"{name}: the arm ran to the end", False, arm["error"])
    n = arms.get("nvshare")
    n = None if n is None or "error" in n else n
    if n:
        b.check("nvshare: both jobs ran with the hook", n["low_hooked"] and n["high_hooked"])
        b.check("nvshare: nvshare-status showed the low job suspended",
                "State=suspended" in n.get("status_low_suspended", ""),
                " ".join(n.get("status_low_suspended", "").split())[:200])
        num.update(arm_numbers(b, "nvshare", n, solo_low, solo_high, num))
    c = arms.get("checkpoint")
    c = None if c is None or "error" in c else c
    if c:
        b.check("checkpoint: no job had the hook", not c["low_hooked"] and not c["high_hooked"])
        calls = {x["call"]: x for x in c["checkpoint_suspend"]["calls"] + c["checkpoint_resume"]["calls"]}
        gib = (c.get("checkpoint_gpu_mib") or a.hold_gib * 1024) / 1024
        num["checkpoint_gpu_gib"] = gib
        for name, key in (("Lock", "lock"), ("Checkpoint", "checkpoint"), ("Restore", "restore"),
                          ("Unlock", "unlock")):
            num[f"checkpoint_{key}_s"] = calls[f"cuCheckpointProcess{name}"]["seconds"]
        num["checkpoint_out_GBps"] = gib * (1 << 30) / 1e9 / max(num["checkpoint_checkpoint_s"], 1e-6)
        num["checkpoint_in_GBps"] = gib * (1 << 30) / 1e9 / max(num["checkpoint_restore_s"], 1e-6)
        num.update({f"checkpoint_{k}": v for k, v in
                    arm_numbers(b, "checkpoint", c, solo_low, solo_high, num).items()})
    p = arms.get("plain")
    if p and "error" not in p:
        b.check("plain: no job had the hook", not p["low_hooked"] and not p["high_hooked"])
        b.check("plain: the high job ran out of GPU memory", p["high"].get("oom")
                and p["high_state"] != "COMPLETED" if not fake else p["high"].get("oom"),
                f"{p['high_state']} {p['high_exit']}: {p['high'].get('output_tail', '')[-200:]!r}")
        b.check("plain: the low job completed after resume",
                p["low_state"] == "COMPLETED" and p["low"].get("intact"),
                f"{p['low_state']} {p['low_exit']}")
        num["plain_high_state"] = f"{p['high_state']} {p['high_exit']}"
        num["plain_high_oom"] = p["high"].get("oom")
    targets = {}
    for arm, pre in (("nvshare", ""), ("checkpoint", "checkpoint_")):
        if not arms.get(arm) or "error" in arms[arm]:
            continue
        limit = 2.0 + copy_s
        raw = num[f"{pre}suspend_to_high_ready_s"]
        beyond = num[f"{pre}suspend_delay_beyond_solo_start_s"]
        speed = num[f"{pre}high_speed_vs_solo"]
        name = f"{arm}: high ready within 2 s + copy after the suspend (raw: Slurm's start, torch's import)"
        targets[name] = {
            "ok": raw is not None and raw <= limit, "value": raw, "limit": limit}
        targets[f"{arm}: high ready within 2 s + copy beyond its solo submit-to-ready time"] = {
            "ok": beyond is not None and beyond <= limit, "value": beyond, "limit": limit}
        targets[f"{arm}: high job at solo speed (>= 0.95)"] = {"ok": speed >= 0.95, "value": speed,
                                                               "limit": 0.95}
    return {"numbers": {k: round(v, 4) if isinstance(v, float) else v for k, v in num.items()},
            "targets": targets}


def arm_numbers(b: Bench, name: str, arm: dict, solo_low: dict, solo_high: dict, solo: dict) -> dict:
    """The checks and numbers an arm where the high job should get the memory shares (nvshare,
    and cuda-checkpoint's)."""
    lo, hi, fake = arm["low"], arm["high"], b.a.fake
    b.check(f"{name}: Slurm kept the low job SUSPENDED while the high job ran",
            arm["low_state_while_high_ran"] == "SUSPENDED", arm["low_state_while_high_ran"])
    b.check(f"{name}: the high job completed (it got the memory)",
            arm["high_state"] == "COMPLETED" and hi.get("intact"),
            f"{arm['high_state']} {arm['high_exit']}, {hi.get('steps')} steps, oom={hi.get('oom')}")
    b.check(f"{name}: the low job completed after resume",
            arm["low_state"] == "COMPLETED" and lo.get("intact"),
            f"{arm['low_state']} {arm['low_exit']}, {lo.get('steps')} steps")
    ok, detail = same_losses(lo, solo_low, fake)
    b.check(f"{name}: the low job's losses are bit-identical to its solo run" if not fake
            else f"{name}: the low job's data intact, all its kernels ran", ok, detail)
    ok, detail = same_losses(hi, solo_high, fake)
    b.check(f"{name}: the high job's losses are bit-identical to its solo run" if not fake
            else f"{name}: the high job's data intact", ok, detail)
    low_total = lo.get("end", 0) - lo.get("launch", lo.get("first_kernel", 0))
    # A high job that never reached its first kernel (or its memory) has no such time: None, and
    # the targets count it as missed, never as a (negative) time.
    first, ready = hi.get("first_kernel"), hi.get("ready")
    to_ready = ready - arm["suspended_at"] if ready else None
    return dict(
        suspend_to_high_first_kernel_s=first - arm["suspended_at"] if first else None,
        suspend_to_high_ready_s=to_ready, high_steps_per_s=rate(hi),
        high_speed_vs_solo=rate(hi) / solo["solo_high_steps_per_s"] if solo["solo_high_steps_per_s"] else 0,
        suspended_s=arm["suspended_sec"], suspended_at_step=arm["suspended_at_step"], low_total_s=low_total,
        low_total_minus_solo_minus_suspended_s=low_total - solo["solo_low_total_s"] - arm["suspended_sec"],
        suspend_delay_beyond_solo_start_s=None if to_ready is None
        else to_ready - solo["solo_high_submit_to_ready_s"])


def table(summary: dict, fake: bool) -> str:
    n = summary["numbers"]
    unit = "kernels" if fake else "steps"
    rows = [("hold per job (GiB)", n["hold_gib"]),
            ("copy at 50 GB/s (s)", n["copy_at_50GBps_s"]),
            ("solo low: total (s)", n.get("solo_low_total_s")),
            (f"solo high: {unit}/s", n.get("solo_high_steps_per_s")),
            ("solo high: submit -> ready (s)", n.get("solo_high_submit_to_ready_s")),
            ("suspend -> high first kernel (s)", n.get("suspend_to_high_first_kernel_s")),
            ("suspend -> high ready, memory filled (s)", n.get("suspend_to_high_ready_s")),
            ("  of which beyond solo submit -> ready (s)", n.get("suspend_delay_beyond_solo_start_s")),
            (f"high {unit}/s (vs solo)", f"{n['high_steps_per_s']:.3f} ({n['high_speed_vs_solo']:.3f})"
             if "high_steps_per_s" in n else None),
            ("low suspended (s)", n.get("suspended_s")),
            ("low total (s)", n.get("low_total_s")),
            ("low total - solo - suspended (s)", n.get("low_total_minus_solo_minus_suspended_s")),
            ("cuda-checkpoint: GPU memory of the low job (GiB)", n.get("checkpoint_gpu_gib")),
            ("cuda-checkpoint: lock / checkpoint (s)", f"{n['checkpoint_lock_s']:.3f} / "
             f"{n['checkpoint_checkpoint_s']:.3f} ({n['checkpoint_out_GBps']:.1f} GB/s)"
             if "checkpoint_lock_s" in n else None),
            ("cuda-checkpoint: restore / unlock (s)", f"{n['checkpoint_restore_s']:.3f} / "
             f"{n['checkpoint_unlock_s']:.3f} ({n['checkpoint_in_GBps']:.1f} GB/s)"
             if "checkpoint_restore_s" in n else None),
            ("cuda-checkpoint: suspend -> high first kernel (s)",
             n.get("checkpoint_suspend_to_high_first_kernel_s")),
            ("cuda-checkpoint: suspend -> high ready (s)", n.get("checkpoint_suspend_to_high_ready_s")),
            ("cuda-checkpoint: high speed vs solo", n.get("checkpoint_high_speed_vs_solo")),
            ("cuda-checkpoint: low total - solo - suspended (s)",
             n.get("checkpoint_low_total_minus_solo_minus_suspended_s")),
            ("plain (no nvshare): high job", n.get("plain_high_state")),
            ("plain: high ran out of memory", n.get("plain_high_oom"))]
    lines = [f"{k:<45} {v:.3f}" if isinstance(v, float) else f"{k:<45} {v}" for k, v in rows if v is not None]
    for name, t in summary["targets"].items():
        met = "MET " if t["ok"] else "MISS"
        value = "none (never reached)" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"target {met} {name}: {value} (limit {t['limit']:.3f})")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--nvshare-config", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--hold-gib", type=float, required=True)
    ap.add_argument("--low-steps", type=int, required=True)
    ap.add_argument("--high-steps", type=int, required=True)
    ap.add_argument("--suspend-after", type=int, required=True)
    ap.add_argument("--wait", type=float, default=150, help="seconds any one wait may take")
    ap.add_argument("--deadline", type=float, default=450,
                    help="seconds for everything: later waits fail, result.json is still written")
    ap.add_argument("--arms", default="solo,nvshare,plain")
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--fake-gpu-mib", type=int, default=1024)
    args = ap.parse_args()
    if args.fake and "checkpoint" in args.arms.split(","):
        ap.error("the checkpoint arm needs NVIDIA's driver: the fake driver has no checkpoint API")
    b = Bench(args)
    arms: dict = {}
    solo_low = solo_high = None
    error = ""
    try:
        solo_low = b.solo("low")
        solo_high = b.solo("high")
    except BenchError as exc:
        error = str(exc)
        b.note(f"stopped: {error}")
    solo_failed = bool(error)
    for arm in ("nvshare", "plain", "checkpoint"):
        if solo_failed or arm not in args.arms.split(","):
            continue
        try:
            arms[arm] = b.arm(arm)
        except BenchError as exc:   # this arm's jobs go; the next arm still runs
            arms[arm] = {**b.partial, "error": str(exc)}
            b.note(f"{arm}: stopped: {exc}; cancelling its jobs")
            b.cancel_all()
            error = "; ".join(filter(None, (error, f"{arm}: {exc}")))
    summary: dict = {"numbers": {}, "targets": {}}
    if solo_low and solo_high:
        summary = analyse(b, solo_low, solo_high, arms)
    b.check("the sequence ran to the end", not error, error)
    passed = all(c["ok"] for c in b.checks)
    for r in (solo_low, solo_high, *[arm.get(x) for arm in arms.values() for x in ("low", "high")]):
        if r:
            r.pop("losses", None)   # bit-exact comparison done; the JSON files keep them
    result = {"passed": passed, "fake_gpu": args.fake, "checks": b.checks, **summary,
              "solo": {"low": solo_low, "high": solo_high}, "arms": arms, "events": b.events,
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "jobs")}}
    (b.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    text = table(summary, args.fake) if summary["numbers"] else "(no numbers: the solo runs failed)\n"
    (b.out / "table.txt").write_text(text)
    print("== table\n" + text + f"== {'PASSED' if passed else 'FAILED'}: "
          f"{sum(c['ok'] for c in b.checks)} of {len(b.checks)} checks", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
