"""Issue 42's interactive srun step, end to end through Slurm: a user's small GPU command every second
from an `srun --gres=nvshare:1` step, beside another user's `sbatch --gres=nvshare:1` training.

  python3 bench/interactive_step.py OUT [--fake] [--seconds 40] [--every 1.0] [--slurm-root DIR]
          [--step-user nobody] [--train-user daemon] [--probe-size 4096] [--train-precision fp32]

Brings up munged, an nvshare-scheduler, slurmctld and slurmd in /tmp/nvshare-step (bench/slurm_node.py)
and runs, all through Slurm, each job as a user who is not root:
  (a) the step alone: `srun --gres=nvshare:1` as --step-user runs the probe for --seconds, one small
      GPU command every --every seconds (the first --every after the step's first GPU work, its
      warm-up: a user types the next command), each command's latency from issue to result (tests/gpu/
      probe.py: a --probe-size matmul and its .item(), as typed at a Python prompt; --fake: bench/
      build/burst's 1 ms bursts on the fake driver);
  (b) the training alone: `sbatch --gres=nvshare:1` as --train-user, --seconds + 10 s (tests/gpu/
      train.py with gpu_bench's W1, a compute-bound transformer, in --train-precision: fp32, its GEMMs
      1.0-1.4 ms on an H200, or tf32 or bf16, shorter ones; --fake: burst's 20 ms bursts back to
      back), its steps/s after its first 3 steps;
  (c) together: the training submitted again and, once it is stepping, the same srun step beside it;
      the training's steps/s in the step's window (its first command to its last);
  (d) with --variant NAME=VALUE: (c) again with that hook setting in both jobs, side by side.
With --duty RUN:IDLE the training of (c) and (d) steps RUN s, then idles IDLE s, in turn (train.py's and
burst's --duty): the step's commands or requests beside it stepping and beside it idle, in one run and
one process (a phase's first 0.25 s left out), and the one p99 against the other besides against (a):
a slow stretch of the host falls on both alike; the training's steps/s is then over its stepping phases.
With --server MODEL the srun step is a server instead of the probe (issue 42: each real inference
workload as a Slurm job beside another user's training): bench/serve_torch.py's gen (model.generate),
gengraph (the same by CUDA-graph replays) or cnn (a batch-1 CNN), requests arriving at random as in
bench_mixes (mean 150, 50, 30 ms), for --seconds after its warm-up; on the fake driver (--fake) serve,
burst's 3 ms requests 30 ms apart (bench_mixes' serve member). Its target: p99 at most 1.2 x alone.
Reported: the step's p50 / p90 / p99 / max and the training's steps/s, alone and together (for a
PyTorch server also its service told from its wait behind the request before, as bench_mixes'). The
issue's target, reported met or missed (a figure, not a check: on the fake driver it says nothing
about a GPU): the step's p99 within 1 ms of its p99 alone. Checks (the exit status): every job and
step completed, under the hook, as its user; the scheduler registered the training and the step;
the step made its commands; the training stepped through the step's whole window.

On the GPU machine (Slurm unpacked from the carried .slurmdeb/, nvshare-slurm from this checkout):
  . scripts/gpu-setup.sh && bash .slurmdeb/gpu-machine-slurm.sh install .slurmdeb \
      && . /opt/slurmroot/env.sh && python3 bench/interactive_step.py OUT --slurm-root /opt/slurmroot
  ... python3 bench/interactive_step.py OUT --slurm-root /opt/slurmroot --server gen --seconds 30
On a machine without a GPU (Slurm and munge installed; CI: tests/slurm/test_interactive_step.py):
  python3 bench/interactive_step.py OUT --fake --seconds 6 --every 0.5
  python3 bench/interactive_step.py OUT --fake --server serve --seconds 6
Writes OUT/result.json (every number and check, date, device), OUT/results.md and OUT/logs.tar.gz
(slurm.conf, nvshare.yaml, the daemons' logs, each job's output). Exit status 0 when every check
passed.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import pwd
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mixes import (DUTY_MARGIN_S, P99_TARGET_BESIDE_ONE, SERVE_MEAN_MS, SERVE_TORCH,  # noqa: E402
                         TORCH_MEAN_MS, TORCH_MODELS, busy_rate, duty_phases, duty_split, service_cell,
                         service_split, steps_per_s, warm_steps_per_s)
from gpu_bench import PROBE_SLACK_MS, WORKLOADS, percentile  # noqa: E402
from slurm_node import Checks, OneNodeSlurm, tail, write_logs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASE = Path("/tmp/nvshare-step")    # short: munged's socket path must fit a sockaddr_un
BURST = REPO / "bench" / "build" / "burst"
FAKE_UUID = "GPU-fa4e0000-0000-0000-0000-000000000000"
TRAIN_SLACK_S = 10.0    # the training runs this much longer than the step's window
# A server's srun step starts (torch's import, the model, its warm-up) this long at most before its
# window: the training runs that much longer too. On the H200 gen took 18 s to its window.
SERVER_STARTUP_S = {"serve": 2.0, "gen": 45.0, "gengraph": 60.0, "cnn": 45.0}
SERVERS = ("serve", *TORCH_MODELS)   # serve: burst's requests (the fake driver); the rest serve_torch's
# What each job says first, parsed by given(): who ran it, its job and what the hook gave it.
SAY_ENV = ('echo "step-env user=$(id -un) job=${SLURM_JOB_ID:-} LD_PRELOAD=${LD_PRELOAD:-} '
           'CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} '
           '$(env | grep -E "^(NVSHARE_[A-Z_]*|HF_HUB_OFFLINE)=[^ ]*$" | tr "\\n" " ")"')


def say(text: str) -> None:
    print(f"interactive-step: {text}", flush=True)


def user_env(user: str) -> dict:
    """What a job of this user is given beside Slurm's: a home and caches of its own under the jobs'
    folder (nobody's home is not writable, and torch writes caches there)."""
    home = BASE / "jobs" / f"home-{user}"
    home.mkdir(exist_ok=True)
    ent = pwd.getpwnam(user)
    os.chown(home, ent.pw_uid, ent.pw_gid)
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "USER": user, "LOGNAME": user}


def as_user(user: str, cmd: list[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd]


def payloads(args) -> tuple[str, str]:
    """The training's and the probe's commands (shell words; the training's in its job's folder)."""
    py = sys.executable
    duty = f"--duty {args.duty}" if args.duty else ""
    if args.fake:
        train = (f"{BURST} --ipm 1000 --gpu-ms 20 --host-ms 0 --seconds {args.train_seconds:.1f} "
                 f"{duty} > train-$SLURM_JOB_ID.json")
        if args.server:
            probe = (f"{BURST} --ipm 1000 --gpu-ms 3 --host-ms 0 --seconds {args.seconds:.1f} "
                     f"--start-delay 0.5 --poisson-ms {SERVE_MEAN_MS:g} --seed 2")
        else:
            probe = (f"{BURST} --ipm 1000 --gpu-ms 1 --host-ms {args.every * 1000:.0f} "
                     f"--seconds {args.seconds:.1f} --start-delay {args.every}")
    else:
        w1 = " ".join(WORKLOADS["W1"].args)
        train = (f"{py} {REPO}/tests/gpu/train.py {w1} --precision {args.train_precision} "
                 f"--steps 1000000 --seed 1 "
                 f"--max-seconds {args.train_seconds:.1f} --progress progress-$SLURM_JOB_ID "
                 f"--out train-$SLURM_JOB_ID.json {duty}")
        if args.server:
            probe = (f"{py} {SERVE_TORCH} --model {TORCH_MODELS[args.server]} --seed 2 "
                     f"--mean-ms {TORCH_MEAN_MS[args.server]:g} --seconds {args.seconds:.1f}")
        else:
            probe = (f"{py} {REPO}/tests/gpu/probe.py --seconds {args.seconds:.1f} --every {args.every} "
                     f"--size {args.probe_size} --start-delay {args.every}")
    return train, probe


def job_script(train: str) -> Path:
    path = BASE / "jobs" / "train.sh"
    path.write_text(f"""#!/bin/sh
{SAY_ENV}
{train}
rc=$?
echo "step-exit $rc"
exit $rc
""")
    path.chmod(0o755)
    return path


def step_script(probe: str) -> Path:
    """The srun step: says who and what it was given on stderr, then the probe's JSON on stdout."""
    path = BASE / "jobs" / "step.sh"
    path.write_text(f"""#!/bin/sh
{SAY_ENV} >&2
exec {probe}
""")
    path.chmod(0o755)
    return path


class Runner:
    def __init__(self, args, cluster: OneNodeSlurm, parts: dict):
        self.args, self.c, self.parts = args, cluster, parts
        train, probe = payloads(args)
        self.train_sh, self.step_sh = job_script(train), step_script(probe)
        self.env = dict(cluster.env, PYTHONUNBUFFERED="1")
        if args.server:   # the GPU machine has no network: transformers must not look for the hub
            self.env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if args.fake:
            self.env.update(LD_LIBRARY_PATH=f"{REPO}/tests/c/build", FAKE_CUDA_DEVICES=f"{FAKE_UUID}:16G")

    def slurm(self, user: str, cmd: str, *argv: str, timeout: float,
              extra: dict | None = None) -> subprocess.CompletedProcess:
        env = dict(self.env, **user_env(user), **(extra or {}))   # sbatch and srun pass it to the job
        try:
            return subprocess.run(as_user(user, [str(self.c.bin_dir / cmd), *argv]), env=env, text=True,
                                  capture_output=True, timeout=timeout, cwd=self.c.jobs)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, str(exc.stdout or ""), f"{cmd} timed out")

    def submit(self, name: str, extra: dict | None = None) -> str:
        res = self.slurm(self.args.train_user, "sbatch", "--parsable", "--gres=nvshare:1", "-J", name,
                         "-o", "slurm-%j.out", str(self.train_sh), timeout=30, extra=extra)
        if res.returncode != 0:
            raise RuntimeError(f"sbatch {name} as {self.args.train_user} failed: {res.stderr.strip()}")
        job = res.stdout.strip().split(";")[0]
        say(f"submitted {name} as {self.args.train_user}: job {job}")
        return job

    def wait_stepping(self, job: str) -> None:
        """Until the training has made steps (train.py's progress file; burst: a second running)."""
        deadline = time.monotonic() + self.args.job_timeout
        progress = self.c.jobs / f"progress-{job}"
        running_since = None
        while time.monotonic() < deadline:
            st = self.c.job_state(job).get("JobState")
            if st not in ("PENDING", "RUNNING", "CONFIGURING"):
                raise RuntimeError(f"the training (job {job}) ended before the step: {st}\n"
                                   f"{tail(self.c.jobs / f'slurm-{job}.out')}")
            if st == "RUNNING":
                running_since = running_since or time.monotonic()
                if self.args.fake and time.monotonic() - running_since >= 1.0:
                    return
                if progress.exists() and int(progress.read_text().split()[0] or 0) >= 10:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the training (job {job}) made no steps in {self.args.job_timeout:.0f} s")

    def finish(self, job: str) -> dict:
        deadline = time.monotonic() + self.args.job_timeout
        st: dict = {}
        while time.monotonic() < deadline:
            st = self.c.job_state(job)
            if st.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                break
            time.sleep(0.5)
        else:
            say(f"job {job} still running after {self.args.job_timeout:.0f} s: cancelled")
            self.c.run("scancel", job)
        text = tail(self.c.jobs / f"slurm-{job}.out", 10**7)
        out = self.c.jobs / f"train-{job}.json"
        try:
            result = json.loads(out.read_text().strip().splitlines()[-1]) if out.exists() else None
        except (ValueError, IndexError):
            result = None
        return {"job": job, "state": st.get("JobState", "?"), "exit": st.get("ExitCode", "?"),
                "env": given(text), "output_tail": text[-1500:], "result": result}

    def step(self, name: str, extra: dict | None = None) -> dict:
        """The srun step, run to its end: its latencies and the host times of its window."""
        t0 = time.time()
        res = self.slurm(self.args.step_user, "srun", "--gres=nvshare:1", "-J", name, str(self.step_sh),
                         timeout=self.args.seconds + self.args.job_timeout, extra=extra)
        rec: dict = {"name": name, "exit": res.returncode, "env": given(res.stderr),
                     "stderr_tail": res.stderr[-1500:], "srun_start": t0, "srun_end": time.time()}
        try:
            out = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out = {}
        lat = out.get("latencies_ms") or []
        starts = out.get("starts") or out.get("step_starts") or []
        rec["latencies_ms"] = lat
        ends = out.get("times") or []
        if len(ends) == len(lat):   # each one's issue (burst's requests: their end less their latency)
            rec["times"] = ends
            rec["arrivals"] = out.get("arrivals") or [e - x / 1000 for e, x in zip(ends, lat, strict=True)]
        if starts:
            rec["window"] = [starts[0], starts[-1] + (lat[-1] / 1000 if lat else 0.0)]
        if lat:
            rec.update(commands=len(lat), p50_ms=percentile(lat, 50), p90_ms=percentile(lat, 90),
                       p99_ms=percentile(lat, 99), max_ms=max(lat))
        split = service_split(out.get("arrivals") or [], starts, out.get("times") or [])
        if split:   # a PyTorch server's (serve_torch.py): its service told from its wait
            rec["service"] = split
        return rec


def given(text: str) -> dict:
    line = next((ln for ln in text.splitlines() if ln.startswith("step-env ")), "")
    return dict(re.findall(r"\b(\w+)=(\S*)", line))


def train_rate(result: dict | None, window: list[float] | None) -> tuple[float | None, int]:
    """Steps/s: in the window (steps that ended inside it), or alone after its first 3 (bench_mixes'
    rule)."""
    ends = (result or {}).get("times") or []
    return warm_steps_per_s(ends) if window is None else steps_per_s(ends, *window)


def check_given(check: Checks, part: str, what: str, env: dict, user: str) -> None:
    """What a job said first (SAY_ENV): it ran as `user`, under the hook."""
    check(part, f"{what} ran as {user}", env.get("user") == user, env.get("user", "?"))
    check(part, f"{what} ran under the hook", "libnvshare.so" in env.get("LD_PRELOAD", ""),
          env.get("LD_PRELOAD") or "LD_PRELOAD unset")


def check_job(check: Checks, part: str, what: str, rec: dict, user: str) -> None:
    ok = rec["state"] == "COMPLETED" and rec["exit"] == "0:0"
    check(part, f"{what} (job {rec['job']}) completed with exit 0", ok,
          f"{rec['state']} {rec['exit']}" + ("" if ok else "\n" + rec["output_tail"][-600:]))
    check_given(check, part, what, rec["env"], user)


def step_noun(args) -> str:
    return f"the server's srun step ({args.server})" if args.server else "the srun step"


def server_mean_ms(server: str) -> float:
    return SERVE_MEAN_MS if server == "serve" else TORCH_MEAN_MS[server]


def check_step(check: Checks, part: str, rec: dict, user: str, args) -> None:
    noun = step_noun(args)
    check(part, f"{noun} exited 0", rec["exit"] == 0, f"exit {rec['exit']}: {rec['stderr_tail'][-400:]}"
          if rec["exit"] else "")
    check_given(check, part, noun, rec["env"], user)
    if args.server:   # Poisson arrivals: half their mean count at least
        want = max(2, int(args.seconds * 1000 / server_mean_ms(args.server) * 0.5))
        check(part, f"the server served its requests (at least {want})", rec.get("commands", 0) >= want,
              f"{rec.get('commands', 0)} requests")
        return
    want = max(2, int(args.seconds / (args.every + 0.05) * 0.7))
    check(part, f"the step made its commands (at least {want})", rec.get("commands", 0) >= want,
          f"{rec.get('commands', 0)} commands")


def run(args, cluster: OneNodeSlurm, check: Checks, parts: dict) -> dict:
    """Parts (a), (b), (c) and with --variant (d) into parts, their checks into check; the figures."""
    r = Runner(args, cluster, parts)
    say(f"(a) {step_noun(args)} alone")
    parts["a"] = alone = r.step("step-alone")
    check_step(check, "a", alone, args.step_user, args)

    say("(b) the training alone")
    job = r.submit("train-alone")
    r.wait_stepping(job)
    parts["b"] = train_alone = r.finish(job)
    check_job(check, "b", "the training alone", train_alone, args.train_user)
    train_alone["steps_per_s"], train_alone["rate_steps"] = train_rate(train_alone["result"], None)

    figures = together(r, check, "c", {}, alone, train_alone)
    if args.variant:
        name, value = args.variant.split("=", 1)
        say(f"(d) the same with {name}={value} in both jobs (a variant, side by side)")
        figures["variant"] = together(r, check, "d", {name: value}, alone, train_alone)
        figures["variant"]["env"] = args.variant
    return figures


def together(r: Runner, check: Checks, part: str, extra: dict, alone: dict, train_alone: dict) -> dict:
    """The training submitted and, once it steps, the step beside it; r.parts[part] gets both, the
    figures against alone come back."""
    say(f"({part}) {step_noun(r.args)} beside the training")
    job = r.submit(f"train-{part}", extra)
    r.wait_stepping(job)
    shared = r.step(f"step-{part}", extra)
    train_shared = r.finish(job)
    r.parts[part] = {"step": shared, "training": train_shared}
    args = r.args
    check_step(check, part, shared, args.step_user, args)
    check_job(check, part, "the training beside the step", train_shared, args.train_user)
    window = shared.get("window")
    ends = ((train_shared["result"] or {}).get("times")) or []
    check(part, "the training stepped through the step's whole window",
          window is not None and ends and ends[0] < window[0] and ends[-1] > window[1],
          f"training {ends[0]:.1f}..{ends[-1]:.1f}, step {window[0]:.1f}..{window[1]:.1f}"
          if window and ends else "no window or no steps")
    train_shared["steps_per_s"], train_shared["rate_steps"] = train_rate(train_shared["result"], window)
    interleaved = None
    if args.duty and window and ends and shared.get("arrivals"):
        busy, idle = duty_phases(train_shared["result"], (window[0], window[1]))
        interleaved = duty_split(shared, busy, idle)
        train_shared["steps_per_s"], train_shared["rate_steps"] = busy_rate(ends, busy)
        check(part, "the step had commands beside the training stepping and beside it idle",
              interleaved["busy"]["n"] > 0 and interleaved["idle"]["n"] > 0,
              f"{interleaved['busy']['n']} and {interleaved['idle']['n']}")
    log = tail(r.c.sched_log, 10**9)
    for what, jobid in (("the training", train_shared["job"]), ("the step's job", shared["env"].get("job"))):
        check(part, f"the scheduler registered {what}", bool(jobid) and f"job {jobid}: registered" in log,
              f"job {jobid or '?'}")
    figures = {"alone_p99_ms": alone.get("p99_ms"), "shared_p99_ms": shared.get("p99_ms"),
               "train_alone_steps_per_s": train_alone.get("steps_per_s"),
               "train_shared_steps_per_s": train_shared.get("steps_per_s")}
    if figures["alone_p99_ms"] is not None and figures["shared_p99_ms"] is not None:
        figures["target"] = target_text(bool(args.server), figures["shared_p99_ms"], figures["alone_p99_ms"])
    if interleaved is not None:
        figures["duty"] = interleaved
        busy_p99, idle_p99 = interleaved["busy"]["p99_ms"], interleaved["idle"]["p99_ms"]
        figures["duty_target"] = "– (no requests in one of the phases)" if not (busy_p99 and idle_p99) else \
            target_text(bool(args.server), busy_p99, idle_p99, " beside the training stepping",
                        "beside it idle")
    if figures["train_alone_steps_per_s"] and figures["train_shared_steps_per_s"]:
        figures["train_over_alone"] = figures["train_shared_steps_per_s"] / figures["train_alone_steps_per_s"]
    return figures


def target_text(server: bool, p99: float, ref_p99: float, beside: str = "", ref: str = "alone") -> str:
    """The issue's target for the step, met or missed: a server's p99 at most P99_TARGET_BESIDE_ONE x
    its reference's (alone, or --duty's beside the training idle), a probe's within PROBE_SLACK_MS."""
    if server:
        met = p99 <= P99_TARGET_BESIDE_ONE * ref_p99
        return (f"{'met' if met else 'missed'} (the server's p99{beside} at most {P99_TARGET_BESIDE_ONE:g} x "
                f"{ref}: {p99:.2f} against {ref_p99:.2f}, {p99 / ref_p99:.2f}x)")
    met = p99 <= ref_p99 + PROBE_SLACK_MS
    return (f"{'met' if met else 'missed'} (the step's p99{beside} within {PROBE_SLACK_MS:g} ms of {ref}: "
            f"{p99:.2f} against {ref_p99:.2f})")


def row(what: str, rec: dict) -> str:
    if "p99_ms" not in rec:
        return f"| {what} | – | – | – | – | 0 |"
    return (f"| {what} | {rec['p50_ms']:.2f} | {rec['p90_ms']:.2f} | {rec['p99_ms']:.2f} | "
            f"{rec['max_ms']:.2f} | {rec['commands']} |")


def markdown(report: dict) -> str:
    f, parts, st = report.get("figures", {}), report.get("parts", {}), report["settings"]
    where = (f"bench/interactive_step.py; {'the fake driver' if st['fake'] else 'real Slurm, real GPU'}; the "
             f"training in {st.get('train_precision', 'fp32')}")
    if st.get("server"):
        lines = [f"# A server ({st['server']}) as an srun step beside a training ({report['device']}, "
                 f"{report['date']})", "",
                 f"Requests arriving at random, mean {server_mean_ms(st['server']):g} ms apart, for "
                 f"{st['seconds']} s ({where}).",
                 "", "| the server | p50 ms | p90 ms | p99 ms | max ms | requests |",
                 "|---|---|---|---|---|---|"]
    else:
        lines = [f"# An interactive srun step beside a training ({report['device']}, {report['date']})",
                 "", f"Every {st['every']} s one small GPU command, for {st['seconds']} s ({where}).",
                 "", "| the step | p50 ms | p90 ms | p99 ms | max ms | commands |",
                 "|---|---|---|---|---|---|"]
    if "a" in parts:
        lines.append(row("alone", parts["a"]))
    if "c" in parts:
        lines.append(row("beside the training", parts["c"]["step"]))
    v = f.get("variant") or {}
    if "d" in parts:
        lines.append(row(f"beside the training, {v.get('env', '?')}", parts["d"]["step"]))
    lines.append("")
    for what, fig in (("", f), (f", {v.get('env')}", v)):
        d = fig.get("duty") if fig else None
        if d:
            cells = "; ".join(f"{name}: p50 {d[k]['p50_ms']:.2f} / p99 {d[k]['p99_ms']:.2f} ms, n {d[k]['n']}"
                              if d[k]["n"] else f"{name}: none" for k, name in
                              (("busy", "beside the training stepping"), ("idle", "beside it idle")))
            lines += [f"Interleaved{what} (--duty {st.get('duty')}: the training stepped and idled in turn; "
                      f"a phase's first {DUTY_MARGIN_S:g} s left out): {cells}. Target: "
                      f"{fig.get('duty_target', '–')}.", ""]
    served = [(what, rec["service"]) for what, rec in (
        ("alone", parts.get("a", {})), ("beside the training", parts.get("c", {}).get("step", {})),
        (f"beside the training, {v.get('env', '?')}", parts.get("d", {}).get("step", {})))
        if rec.get("service")]
    if served:
        said = "; ".join(f"{what}: {service_cell(s)}" for what, s in served)
        lines += ["The server's service, start to result without the wait behind the request before; how "
                  "many requests arrived while the one before was served (queued), and the median service "
                  f"of those and of the others: {said}.", ""]
    for what, fig in (("", f), (f" ({v.get('env')})", v)):
        if not fig:
            continue
        rate = fig.get("train_shared_steps_per_s"), fig.get("train_alone_steps_per_s")
        over = f" ({fig['train_over_alone']:.3f} of alone)." if "train_over_alone" in fig else "."
        lines += [f"Target{what}: {fig.get('target', '– (not measured)')}.",
                  f"The training{what}: {rate[0] or 0:.2f} steps/s in the step's window, {rate[1] or 0:.2f} "
                  f"alone{over}", ""]
    if st.get("server") and f:
        lines += ["(The issue's training target is against co-location, which Slurm jobs under the hook do "
                  "not have: bench_mixes measures it.)", ""]
    lines += ["| part | check | result | detail |", "|---|---|---|---|"]
    for c in report["checks"]:
        detail = c["detail"].replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {c['part']} | {c['check']} | {'PASS' if c['ok'] else 'FAIL'} | {detail} |")
    return "\n".join(lines) + "\n"


def device_name(fake: bool) -> str:
    if fake:
        return "fake driver"
    import pynvml
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        mib = pynvml.nvmlDeviceGetMemoryInfo(h).total >> 20
        return f"{name if isinstance(name, str) else name.decode()} {mib} MiB, driver " \
               f"{pynvml.nvmlSystemGetDriverVersion()}"
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--fake", action="store_true", help="the fake CUDA driver and burst as payloads")
    ap.add_argument("--seconds", type=float, default=40.0, help="the step's window")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between the step's commands")
    ap.add_argument("--probe-size", type=int, default=4096, help="the probe's matmul size (GPU)")
    ap.add_argument("--train-precision", choices=("fp32", "tf32", "bf16"), default="fp32",
                    help="the training's (tests/gpu/train.py --precision; not with --fake)")
    ap.add_argument("--step-user", default="nobody")
    ap.add_argument("--train-user", default="daemon")
    ap.add_argument("--server", choices=SERVERS, default="",
                    help="the srun step serves requests instead of the probe (gen, gengraph, cnn: PyTorch, "
                         "a GPU; serve: burst's, with --fake)")
    ap.add_argument("--variant", default="", metavar="NAME=VALUE",
                    help="part (d): part (c) again with this in both jobs' environment (a hook setting)")
    ap.add_argument("--duty", default="", metavar="RUN:IDLE",
                    help="the training of (c) and (d) steps RUN s and idles IDLE s in turn: the step beside "
                         "it stepping against beside it idle, in one run")
    ap.add_argument("--job-timeout", type=float, default=240)
    ap.add_argument("--slurm-root", default=os.environ.get("NVSHARE_SLURM_ROOT", "/"))
    args = ap.parse_args()
    if args.variant and not re.fullmatch(r"NVSHARE_[A-Z0-9_]+=[^\s]*", args.variant):
        ap.error(f"--variant {args.variant!r}: NAME=VALUE of a hook setting (NVSHARE_...)")
    if args.duty and not re.fullmatch(r"[0-9]*\.?[0-9]+:[0-9]*\.?[0-9]+", args.duty):
        ap.error(f"--duty {args.duty!r} is not RUN:IDLE (seconds, e.g. 2:2)")
    if args.fake and args.train_precision != "fp32":
        ap.error("--train-precision is the PyTorch training's: not with --fake")
    if args.step_user == args.train_user:
        ap.error("--step-user and --train-user must differ: the step is another user's")
    for user in (args.step_user, args.train_user):
        try:
            pwd.getpwnam(user)
        except KeyError:
            ap.error(f"no user {user!r} on this machine")
    if args.server and args.fake != (args.server == "serve"):
        ap.error("--server serve is the fake driver's server (with --fake); gen, gengraph and cnn need a GPU")
    args.train_seconds = args.seconds + TRAIN_SLACK_S + (SERVER_STARTUP_S[args.server] if args.server else 0)
    lock = open(f"{BASE}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        ap.error(f"another run holds {BASE}.lock")
    if args.fake:
        subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True)
        from bench_family import build_burst
        build_burst()
    args.out.mkdir(parents=True, exist_ok=True)
    args.out = args.out.resolve()
    report: dict = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "device": device_name(args.fake),
                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    scheduler = ["log_level: debug"]
    if args.fake:
        scheduler.append(f"gpus: [{{uuid: {FAKE_UUID}, memory: 16G}}]")
        os.environ["FAKE_CUDA_DEVICES"] = f"{FAKE_UUID}:16G"
    cluster = OneNodeSlurm(BASE, args.slurm_root, 8, scheduler, {})
    check, report["parts"] = Checks(), {}
    report["checks"] = check.rows
    try:
        cluster.start()
        os.chmod(cluster.jobs, 0o1777)
        say(f"one-node Slurm up ({cluster.host}); {step_noun(args)} as {args.step_user}, the training as "
            f"{args.train_user}; {report['device']}")
        report["figures"] = run(args, cluster, check, report["parts"])
    except Exception as exc:   # noqa: BLE001  (the report says what broke; the logs are kept)
        say(f"stopped: {exc}")
        check("-", "the run went to its end", False, str(exc)[:2000])
    finally:
        cluster.stop()
        write_logs(BASE, args.out / "logs.tar.gz")
    report["passed"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"])
    (args.out / "result.json").write_text(json.dumps(report, indent=1))
    (args.out / "results.md").write_text(markdown(report))
    say(f"{'PASSED' if report['passed'] else 'FAILED'}: {sum(c['ok'] for c in report['checks'])} of "
        f"{len(report['checks'])} checks; {report.get('figures', {}).get('target', 'no target figure')}; "
        f"results in {args.out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
