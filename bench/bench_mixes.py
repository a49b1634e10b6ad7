"""Issue 27's mixed nodes: 3, 4 and 8 different jobs on one GPU, each job's slowdown per arm in one table.

Every job is tests/gpu/burst.c (bench_family.py's program, built into bench/build/burst), one of:
  compute   20 ms bursts back to back (a compute-bound training), --steps
  bursty    28 ms bursts, 43 ms host pauses (busy ~35 %: issue 27's bursty job), --steps
  mem       compute with --mem-gib GiB more device memory (two of them do not fit beside the others)
  probe     a 1 ms burst every 100 ms (an interactive srun at a prompt), a time window
  serve     requests arriving open-loop at exponential intervals (mean 30 ms, seeded), 3 ms of GPU
            work each, latency from arrival to result (burst --poisson-ms), a time window
PyTorch members (issue 42; tests/gpu/train.py and bench/serve_torch.py, run with --torch-python):
  train     gpu_bench's W1 training (a transformer, width 1024, depth 8, batch 32 x 256 tokens: compute-
            bound steps), for a time (--max-seconds), its throughput in steps/s; in fp32 (its GEMMs
            1.0-1.4 ms on an H200), or --train-precision tf32 or bf16 (mixed precision: shorter GEMMs)
  gen       serve_torch.py --model gen: a random-weight Llama decoder (4 layers, hidden 768, fp16),
            batch 1, model.generate of 8 tokens from a 32-token prompt per request
  gengraph  serve_torch.py --model gen-graphs: the same requests, each token after the prefill one
            replay of a CUDA graph of a one-token decode step into a StaticCache (as vLLM decodes)
  cnn       serve_torch.py --model cnn: a ResNet-18-like network, fp16, batch 1, one 224x224 picture
            per request
  A server's requests arrive open-loop at exponential intervals (seeded; mean: TORCH_MEAN_MS, gen
  150 ms, gengraph 50 ms, cnn 30 ms); latency from arrival to result on the host.
Mixes:
  serve2    compute, serve (serving beside a training: serve p99 <= 1.2 x alone (issue 42; issue 27
            asked 1.5), the training >= 0.95 of what it gets co-located)
  mix3      compute, bursty, probe
  mix4      compute, compute, bursty, serve
  mix4-mem  compute, bursty, mem, mem, probe (issue 27's node: co-location and MPS run out of memory)
  mix8      3 compute, 2 bursty, serve, 2 probes
  serve-gen, serve-gengraph, serve-cnn
            train and gen, gengraph or cnn (issue 42: a server beside a training started by another
            user, with --uids: server p99 <= 1.2 x its p99 alone, the training >= 0.95 of its
            throughput under co-location)
  swap2     two mem jobs that do not fit together (issue 27's swap pair: --mem-gib 45 on an 80 GB GPU,
            76 on an H200, or 45 there with --memory-reserve-percent 46: an H100's usable memory);
            its completion (the arm's start to the last step of either) over the serial arm's is the
            swap-overlap figure (target <= 1.03). Measured from the start, not from the first step:
            a swap before any job's first step is part of what sharing costs
Arms: serial (each job alone, one after the other: every job's solo reference, and its completion
from the arm's start), colocate (no hook), mps (a private MPS control daemon), nvshare (libnvshare.so
and a real nvshare-scheduler, every setting default). Per job and arm: slowdown = its time from first
step to last over its solo time (compute, bursty, mem), or p50/p90/p99/p99.9 latency and p99 over
solo p99 (probe, serve); nvshare's target is slowdown <= 1.05 x colocate's, for a probe p99 within
1 ms of its p99 alone, for serve p99 <= 1.5 x solo in the mixes of 3 and more, 1.2 x beside one job
(issue 42). Each variant arm's targets are given too. A job that did not finish (oom, timeout) stays in
the table.

A PyTorch mix runs its jobs differently. Shared arms: the server starts first and serves its
warm-up (not counted: autotuning, the CUDA graph's capture); then the training starts, and the
server's window of --seconds starts once the training has made 10 steps (its --progress file; at
most 20 s waited); the training runs --seconds plus 4 s from its first step, so
it steps through the whole window. Serial: the training runs --seconds alone while the server starts
beside it (imports, CUDA context, weights: no kernels but their initialisation) and then holds
(serve_torch --hold-file); once the training has ended, the server's warm-up and window run alone.
The training's throughput is its steps that ended in the server's window over the window (alone: its
steps after the first 3 over their time). The server's cell has p50 / p90 / p99 / p99.9, n requests
(p99.9 is the slowest one for n < 1000) and p99 over its p99 alone; the training's, its steps/s and
over alone. Targets (nvshare arm): server p99 <= 1.2 x alone; training steps/s >= 0.95 x co-location's.
Below the table, each PyTorch server's service (start to result, without its wait behind the request
before: requests come one at a time, and a server's p99 is mostly requests that queued), how many of its
requests queued, the median service of those and of the others, and the host's pace in that arm (the
server's service in its warm-up, alone before the training began, and the machine's stolen CPU time in
the window: model.generate is bound by its host, so an arm on a slow host reads slow). Each PyTorch mix
(and every mix with a latency member) also gets DIR/latency_<mix>.svg: per arm the latency distribution
(the share of requests slower than x, log-log: p50, p90, p99, p99.9 are where it crosses 0.5, 0.1, 0.01,
0.001), and the batch member's steps/s per arm. --smoke-cpu skips the PyTorch mixes ("not run: needs
torch" in the table) unless --torch-cpu runs them on the CPU with tiny models (numbers meaningless: a
check of the plumbing where torch and transformers are installed; --torch-python names that Python).

--duty RUN:IDLE (PyTorch mixes): in the shared arms the training steps RUN seconds, then idles IDLE
seconds, in turn through the window (train.py --duty). A server's requests are then told apart: those
beside the training stepping and those beside it idle (inside one phase, less its first quarter second),
in the same run and the same server process, so that a slow stretch of the host (model.generate's
requests ran at 40 or at 55 ms for seconds at a time, alone or not, on the H200) falls on both alike. A
section below the table has each one's p50 / p99 and the one p99 over the other (nvshare's target
1.2x); the training's steps/s is then over its stepping phases.

--variant NAME=VALUE adds an arm "nvshare NAME=VALUE": the nvshare arm with that setting too, in the
same table beside the default (an A/B measured side by side in one run); several settings in one arm
are joined by commas (--variant A=1,B=2).

--uids runs job i as uid BASE+i (setpriv; the daemon registers each job with its uid). Not in the MPS
arm: MPS serves one uid at a time (a job of another uid waits until the first one's jobs have ended,
as at a site), so there every job runs as uid BASE, and the arm shows what MPS does for the jobs of one
user. Needs root; the scratch directory is made world-readable.

  python3 bench/bench_mixes.py --out DIR [--mixes mix3,mix4,...] [--arms serial,colocate,mps,nvshare]
                               [--seconds 4] [--mem-gib 40] [--uids [--uid-base 61000]] [--gpu-times]
                               [--smoke-cpu [--torch-cpu]] [--torch-python PYTHON]
                               [--hook-env NAME=VALUE ...] [--variant NAME=VALUE ...]
                               [--memory-reserve-percent PERCENT] [--duty RUN:IDLE]

DIR/results.json has every job's numbers (a latency member's every latency, sorted, in lat_ms);
DIR/table.md the table; DIR/timeline_<mix>.svg which job ran its steps when, one band per arm
(bench_family's drawing); DIR/latency_<mix>.svg the latency figure (no matplotlib needed).
--smoke-cpu runs it on the fake driver of tests/c (16 GiB; MPS skipped; --mem-gib 8 there); its
numbers mean nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_family import BURST, SMOKE_UUID, build_burst, burst_env, svg  # noqa: E402
import kernel_overlap  # noqa: E402
from gpu_bench import (CPU_TRAIN_ARGS, PROBE_SLACK_MS, TRAIN, WORKLOADS, Job, Mps, Scheduler, gpu_info,  # noqa: E402
                       kill_running, percentile, run_jobs, sigterm_interrupts)

KINDS = {   # kind: (gpu ms per step, host ms, timed: a window of seconds rather than steps)
    "compute": (20.0, 0.0, False), "bursty": (28.0, 43.0, False), "mem": (20.0, 0.0, False),
    "probe": (1.0, 100.0, True), "serve": (3.0, 0.0, True)}
SERVE_MEAN_MS = 30.0
SERVE_TORCH = Path(__file__).resolve().parent / "serve_torch.py"
TORCH_MODELS = {"gen": "gen", "gengraph": "gen-graphs", "cnn": "cnn"}   # member: serve_torch --model
# Mean intervals of arrivals: each server busy about 20-30 % of the time alone on an H200 (a request of
# gen took 42 ms there, gengraph's 9 ms, cnn's 1.5 ms; cnn keeps the serve member's 30 ms)
TORCH_MEAN_MS = {"gen": 150.0, "gengraph": 50.0, "cnn": 30.0}
TORCH_KINDS = {"train", *TORCH_MODELS}
LATENCY_KINDS = {"probe", "serve", *TORCH_MODELS}
TRAIN_ARGS = WORKLOADS["W1"].args   # gpu_bench's compute-bound transformer training
TRAIN_SLACK_S = 4.0                 # the training runs the window and this much more, from its first step
WAIT_TIMEOUT_S = 20.0               # the server waits at most this long for the training's 10 steps
P99_TARGET = {"serve": 1.5, "gen": 1.2, "gengraph": 1.2, "cnn": 1.2}   # nvshare p99 over alone, at most
P99_TARGET_BESIDE_ONE = 1.2   # issue 42: a server beside one training (serve2's too), at most
TRAIN_KEEP = 0.95                   # nvshare training steps/s over co-location's, at least
DUTY_MARGIN_S = 0.25   # --duty: each phase's first quarter second is left out (the GPU changes hands)
STEAL_SHOWN_S = 0.1   # the service table names the machine's CPU time stolen in a window from this much
NEEDS_TORCH = "not run: needs torch"
DIR_TAG_MAX = 48   # /tmp/nvmixes-XXXXXXXX/<tag>/s.sock within AF_UNIX's 108 bytes
MIXES = {"serve2": ["compute", "serve"],
         "mix3": ["compute", "bursty", "probe"],
         "mix4": ["compute", "compute", "bursty", "serve"],
         "mix4-mem": ["compute", "bursty", "mem", "mem", "probe"],
         "mix8": ["compute", "compute", "compute", "bursty", "bursty", "serve", "probe", "probe"],
         "swap2": ["mem", "mem"],
         "serve-gen": ["train", "gen"],
         "serve-gengraph": ["train", "gengraph"],
         "serve-cnn": ["train", "cnn"]}
ARMS = ["serial", "colocate", "mps", "nvshare"]


def log(msg: str) -> None:
    print(f"bench_mixes: {msg}", flush=True)


def file_tag(mix: str, arm: str) -> str:
    """A mix's arm as a file name's part: a variant's value may be a path (LD_PRELOAD=/x/libnvshare.so)."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", f"{mix}-{arm}")


def dir_tag(tag: str) -> str:
    """A file tag short enough for a directory that holds the scheduler's socket (AF_UNIX: 108 bytes
    in all): a long variant's tag is cut and a digest of the whole of it added."""
    if len(tag) <= DIR_TAG_MAX:
        return tag
    return f"{tag[:DIR_TAG_MAX - 9]}-{hashlib.sha1(tag.encode()).hexdigest()[:8]}"


def variant_settings(variant: str) -> list[tuple[str, str]]:
    """A variant's settings: NAME=VALUE, several joined by commas where each next one is NAME=
    (NVSHARE_PROMPT_LEAK_MS=0.25,NVSHARE_PROMPT_LEAK_OPEN_MS=1); a value may hold commas otherwise."""
    parts = re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", variant)
    return [(name, value) for name, value in (part.split("=", 1) for part in parts)]


def mps_uid(arm: str) -> int | None:
    """Whose uid every job of an arm runs as with --uids (an index from --uid-base; None: its own):
    MPS serves one uid at a time, so its arm's jobs are one user's."""
    return 0 if arm == "mps" else None


def torch_mix(mix: str) -> bool:
    return any(k in TORCH_KINDS for k in MIXES[mix])


def latency_kind(kind: str) -> bool:
    return kind in LATENCY_KINDS


class Mixes:
    def __init__(self, args: argparse.Namespace, out: Path):
        self.args, self.out, self.smoke = args, out, args.smoke_cpu
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="nvmixes-"))
        if args.uids:
            os.chmod(self.work, 0o755)
        self.results: dict = {"gpu": gpu_info(self.smoke), "args": vars(args), "mixes": {}}
        self.torch_missing: str | None = None   # why the PyTorch mixes do not run, once known

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1))

    def base_env(self) -> dict:
        return burst_env(self.smoke, self.results["gpu"])

    def calibrate(self) -> None:
        res = run_jobs([Job("calibration", [str(BURST), "--calibrate"], self.base_env(), self.logs)],
                       together=False, timeout=120)[0]
        if res["status"] != "ok":
            raise RuntimeError(f"calibration failed: {res.get('error', '')[-800:]}")
        self.results["calibration"] = {k: res[k] for k in ("ipm", "startup_s")}

    def as_uid(self, cmd: list[str], i: int, home: bool = False, who: int | None = None) -> list[str]:
        """Job i's cmd as uid --uid-base + `who` (default i: each job its own; mps_uid) with --uids;
        home: with USER, LOGNAME and HOME of its own (the uid has no passwd entry, which
        getpass.getuser() of torch 2.11's import does not survive)."""
        if not self.args.uids:
            return cmd
        uid = self.args.uid_base + (i if who is None else who)
        out = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        if home:
            path = self.work / f"home-{uid}"
            path.mkdir(exist_ok=True)
            os.chown(path, uid, uid)
            out += ["env", f"USER=u{uid}", f"LOGNAME=u{uid}", f"HOME={path}"]
        return [*out, *cmd]

    def cmd(self, kind: str, i: int, who: int | None = None) -> list[str]:
        """Job i's command (burst.c), as uid --uid-base + `who` (default i) with --uids."""
        gpu_ms, host_ms, timed = KINDS[kind]
        s = self.args.seconds
        out = [str(BURST), "--ipm", f"{self.results['calibration']['ipm']:.3f}", "--gpu-ms", str(gpu_ms),
               "--host-ms", str(host_ms)]
        if timed:   # inside the batch jobs' steps: starts after theirs, ends before the fastest can
            out += ["--seconds", f"{0.6 * s:.2f}", "--start-delay", f"{min(1.0, 0.25 * s):.2f}"]
        else:
            out += ["--steps", str(max(10, round(s * 1000 / (gpu_ms + host_ms))))]
        if kind == "serve":
            out += ["--poisson-ms", str(SERVE_MEAN_MS), "--seed", str(i + 1)]
        if kind == "mem":
            out += ["--mem-mib", str(int(self.args.mem_gib * 1024))]
        if self.args.gpu_times:
            out.append("--gpu-times")
        return self.as_uid(out, i, who=who)

    def trace_path(self, tag: str, i: int) -> Path:
        """Where job i of an arm writes its kernel trace (--gpu-times): a folder every uid may reach and
        write (the out folder's may not be reachable: a mkdtemp's); with_overlaps keeps them in logs/."""
        where = self.work / "ktrace"
        if not where.exists():
            where.mkdir()
            os.chmod(where, 0o1777)
        return where / f"{tag}-{i}.ktrace.json"

    def torch_cmd(self, kind: str, i: int, sync: Path | None, hold: Path | None = None,
                  tag: str = "", who: int | None = None) -> list[str]:
        """A PyTorch member's command; sync: the arm's folder of the server's ready file and the
        training's progress file (None: alone, the serial arm, where the server holds until the file
        hold exists); tag: the arm's, for --gpu-times' kernel trace; who: as cmd's."""
        s, py, cpu = self.args.seconds, self.args.torch_python, self.args.torch_cpu
        if kind == "train":
            out = [py, str(TRAIN), *TRAIN_ARGS, "--precision", self.args.train_precision,
                   "--steps", "1000000", "--seed", str(i + 1),
                   "--max-seconds", f"{s if sync is None else s + TRAIN_SLACK_S:.2f}"]
            if sync is not None:
                out += ["--progress", str(sync / "progress")]
                if self.args.duty:
                    out += ["--duty", self.args.duty]
            if self.args.gpu_times and not cpu:
                out += ["--kernel-trace", str(self.trace_path(tag, i))]
            if cpu:   # later options win: a tiny model on the CPU
                out += CPU_TRAIN_ARGS
        else:
            out = [py, str(SERVE_TORCH), "--model", TORCH_MODELS[kind], "--mean-ms", str(TORCH_MEAN_MS[kind]),
                   "--seed", str(i + 1), "--seconds", f"{s:.2f}"]
            if sync is None:   # alone: built beside the training's run alone, then held until it ended
                out += ["--hold-file", str(hold)]
            else:
                out += ["--ready-file", str(sync / "ready"), "--wait-file", str(sync / "progress"),
                        "--wait-timeout", str(WAIT_TIMEOUT_S)]
            if self.args.gpu_times and not cpu:
                out += ["--kernel-trace", str(self.trace_path(tag, i))]
            if cpu:
                out += ["--device", "cpu", "--warmup", "3", "--hidden", "64", "--layers", "2", "--heads", "4",
                        "--vocab", "1000", "--tokens", "4", "--prompt", "8", "--image", "64", "--width", "16"]
        return self.as_uid(out, i, home=True, who=who)

    def torch_env(self, base: dict) -> dict:
        cache = self.work / "cache"   # caches of every uid's torch and transformers, none in $HOME
        cache.mkdir(exist_ok=True)
        os.chmod(cache, 0o1777)
        env = dict(base, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(cache / "hf"),
                   XDG_CACHE_HOME=str(cache), TRITON_CACHE_DIR=str(cache / "triton"),
                   TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"))
        if self.args.torch_cpu:
            env["OMP_NUM_THREADS"] = "1"
        return env

    def torch_ready(self) -> str | None:
        """None if --torch-python imports torch and transformers, else why not."""
        if self.torch_missing is None:
            if self.smoke and not self.args.torch_cpu:
                self.torch_missing = f"{NEEDS_TORCH} (a smoke run on the fake driver; --torch-cpu runs it)"
            else:
                run = subprocess.run([self.args.torch_python, "-c", "import torch, transformers"],
                                     capture_output=True, text=True, timeout=120)
                self.torch_missing = "" if run.returncode == 0 else \
                    f"{NEEDS_TORCH} and transformers in {self.args.torch_python}: {run.stderr[-300:]}"
        return self.torch_missing or None

    def nvshare_envs(self, sched: Scheduler, base: dict, n: int) -> list[dict]:
        if not self.args.uids:
            return [sched.job_env(base)[1] for _ in range(n)]
        return [sched.job_env(base, uid=self.args.uid_base + i, name="mix")[1] for i in range(n)]

    def arm_envs(self, mix: str, arm: str, tag: str, base: dict, n: int, stops: list) -> list[dict] | None:
        """The jobs' environments of a shared arm (None: not run here); what it starts, stops has the
        stop of."""
        if arm == "colocate":
            return [base] * n
        if arm == "mps":
            if self.smoke:
                return None
            mps = Mps(self.work / f"mps-{mix}")
            stops.append(mps.stop)
            if self.args.uids:
                for d in ("mps-pipe", "mps-log"):
                    os.chmod(self.work / f"mps-{mix}" / d, 0o777)
            return [mps.client_env(base) for _ in range(n)]
        gpus = [{"uuid": SMOKE_UUID, "memory": "16G"}] if self.smoke else None
        reserve = self.args.memory_reserve_percent
        where = self.work / dir_tag(tag)
        sched = Scheduler("auto", where, self.logs / f"{tag}-scheduler.log", gpus,
                          None if reserve is None else {"memory_reserve_percent": reserve})
        stops.append(sched.stop)
        if self.args.uids:
            os.chmod(where, 0o755)
        hook_env = dict(kv.split("=", 1) for kv in self.args.hook_env)
        if arm != "nvshare":   # a variant: "nvshare NAME=VALUE[,NAME=VALUE...]"
            hook_env.update(variant_settings(arm.split(" ", 1)[1]))
        return [dict(e, **hook_env) for e in self.nvshare_envs(sched, base, n)]

    def run_arm(self, mix: str, arm: str) -> dict:
        if torch_mix(mix):
            return self.run_torch_arm(mix, arm)
        kinds = MIXES[mix]
        cmds = [self.cmd(k, i, mps_uid(arm)) for i, k in enumerate(kinds)]
        base, tag = self.base_env(), file_tag(mix, arm)
        timeout = 30 + 6 * self.args.seconds * (len(kinds) if arm == "serial" else 2)
        if arm == "serial":
            jobs = [Job(f"{tag}-{i}", c, base, self.logs) for i, c in enumerate(cmds)]
            return summarize(kinds, run_jobs(jobs, together=False, timeout=timeout))
        stops: list = []
        try:
            envs = self.arm_envs(mix, arm, tag, base, len(cmds), stops)
            if envs is None:
                return {"status": "skipped", "error": "no MPS without a GPU (smoke run)"}
            jobs = [Job(f"{tag}-{i}", c, e, self.logs)
                    for i, (c, e) in enumerate(zip(cmds, envs, strict=True))]
            return summarize(kinds, run_jobs(jobs, together=True, timeout=timeout))
        finally:
            for stop in reversed(stops):
                stop()

    def run_torch_arm(self, mix: str, arm: str) -> dict:
        """Serial: each job alone. Shared: the server first, until its warm-up is done (its ready
        file), then the training; the server's window starts at the training's 10th step."""
        why = self.torch_ready()
        if why:
            return {"status": "skipped", "error": why}
        kinds = MIXES[mix]
        base, tag = self.torch_env(self.base_env()), file_tag(mix, arm)
        timeout = 240 + 4 * self.args.seconds
        sync = self.work / f"sync-{tag}"
        sync.mkdir()
        os.chmod(sync, 0o1777)
        if arm == "serial":   # the server starts beside the training alone, and holds once built
            hold = sync / "go"
            jobs = [Job(f"{tag}-{i}", self.torch_cmd(k, i, None, hold, tag=tag), base, self.logs)
                    for i, k in enumerate(kinds)]
            deadline = time.time() + 2 * timeout
            try:
                for job in jobs:
                    job.launch()
                for job, kind in zip(jobs, kinds, strict=True):
                    if kind == "train":
                        job.wait(deadline)
                hold.touch()
                for job in jobs:
                    job.wait(deadline)
            finally:
                kill_running(jobs)
            return with_overlaps(kinds, [job.result() for job in jobs], True, self.logs / "ktrace")
        stops: list = []
        try:
            envs = self.arm_envs(mix, arm, tag, base, len(kinds), stops)
            if envs is None:
                return {"status": "skipped", "error": "no MPS without a GPU (smoke run)"}
            jobs = [Job(f"{tag}-{i}", self.torch_cmd(k, i, sync, tag=tag, who=mps_uid(arm)), e, self.logs)
                    for i, (k, e) in enumerate(zip(kinds, envs, strict=True))]
            servers = [j for j, k in zip(jobs, kinds, strict=True) if k != "train"]
            deadline = time.time() + timeout
            try:
                for job in servers:
                    job.launch()
                while not (sync / "ready").exists() and time.time() < deadline and \
                        all(j.proc.poll() is None for j in servers):
                    time.sleep(0.05)
                for job in jobs:
                    if job not in servers:
                        job.launch()
                for job in jobs:
                    job.wait(deadline)
            finally:   # interrupted: leave no job on the GPU
                kill_running(jobs)
            return with_overlaps(kinds, [job.result() for job in jobs], False,
                                 self.logs / "ktrace")
        finally:
            for stop in reversed(stops):
                stop()

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def steps_per_s(ends: list[float], t0: float, t1: float) -> tuple[float | None, int]:
    """Steps that ended in (t0, t1] over t1 - t0, and how many."""
    n = sum(1 for t in ends if t0 < t <= t1)
    return (n / (t1 - t0) if t1 > t0 else None), n


def warm_steps_per_s(ends: list[float]) -> tuple[float | None, int]:
    """A training alone: steps/s after its first 3 (fewer when it made fewer), and how many."""
    k = min(3, len(ends) - 2)
    return steps_per_s(ends, ends[k], ends[-1]) if k >= 0 else (None, 0)


def service_split(arrivals: list[float], starts: list[float], ends: list[float]) -> dict | None:
    """A server's requests, one at a time (serve_torch.py): a request that arrived before the one before
    it had ended waited for it (queued). Each one's service, start to result, without that wait (ms):
    p50 and p99 of all, and the median of the queued ones and of the others. A request's latency is
    its wait and its service; the p99 of a server whose requests arrive at random is mostly queued ones.
    (Alone, back-to-back requests run faster than ones after an idle moment: the GPU's clocks are up.)"""
    if not arrivals or len(arrivals) != len(starts) or len(starts) != len(ends):
        return None
    service = [(b - a) * 1000 for a, b in zip(starts, ends, strict=True)]
    waited = [i > 0 and arrivals[i] < ends[i - 1] for i in range(len(arrivals))]
    queued = [s for s, w in zip(service, waited, strict=True) if w]
    rest = [s for s, w in zip(service, waited, strict=True) if not w]
    out = {"n": len(service), "queued": len(queued), "p50_ms": percentile(service, 50),
           "p99_ms": percentile(service, 99)}
    if queued:
        out["queued_p50_ms"] = percentile(queued, 50)
    if rest:
        out["unqueued_p50_ms"] = percentile(rest, 50)
    return out


def summarize(kinds: list[str], jobs: list[dict], alone: bool = False) -> dict:
    """Each job's numbers. A training (kind train) beside a server: its steps/s over the server's
    window; alone (the serial arm): over its steps after the first 3."""
    t0 = min(j["proc_start"] for j in jobs)
    window = next(((j["window_start"], j["window_end"]) for j in jobs
                   if j["status"] == "ok" and "window_start" in j), None)
    out = []
    for kind, j in zip(kinds, jobs, strict=True):
        e: dict = {"kind": kind, "status": j["status"]}
        if j["status"] == "ok" and j.get("times"):
            e.update(train_s=j["times"][-1] - j["step_starts"][0], done_s=j["times"][-1] - t0,
                     steps=len(j["times"]),
                     spans=[[round(a - t0, 4), round(b - t0, 4)]
                            for a, b in zip(j["step_starts"], j["times"], strict=True)])
            if latency_kind(kind):
                lat = j["latencies_ms"]
                e.update(p50_ms=percentile(lat, 50), p90_ms=percentile(lat, 90), p99_ms=percentile(lat, 99),
                         p999_ms=percentile(lat, 99.9), mean_ms=statistics.fmean(lat), n=len(lat),
                         lat_ms=sorted(lat))
                if kind == "probe":   # in arrival order, beside spans: probe_table
                    e["lat_seq_ms"] = [round(x, 3) for x in lat]
                e.update({k: j[k] for k in ("startup_s", "waited_s", "wait_timed_out",
                                            "graphs", "tokens_match_generate", "settings", "mean_ms")
                          if k in j})
                split = service_split(j.get("arrivals") or [], j["step_starts"], j["times"])
                if split:   # with the host's pace: the warm-up's service, the training not yet begun
                    split.update({k: j[k] for k in ("service_ms_warm", "steal_s") if j.get(k) is not None})
                    e["service"] = split
            elif kind == "train":
                ends = j["times"]
                if alone or window is None:
                    rate, n = warm_steps_per_s(ends)
                    e.update(steps_per_s=rate, rate_steps=n)
                else:   # the server's window; cut where the training ended, if it ended first
                    end = min(window[1], ends[-1])
                    rate, n = steps_per_s(ends, window[0], end)
                    e.update(steps_per_s=rate, rate_steps=n,
                             window_covered=max(0.0, end - window[0]) / (window[1] - window[0]))
                e["step_ms_median"] = j.get("step_ms_median")
        elif j["status"] == "ok":
            e.update(status="no steps", error=j.get("error", "")[-400:])
        else:
            e["error"] = j.get("error", "")[-400:]
        out.append(e)
    if not alone and window is not None:
        with_duty(jobs, out, window)
    ok = [j for j in jobs if j["status"] == "ok" and j.get("times")]
    done = max(j["times"][-1] for j in ok) - t0 if ok else None
    return {"status": "ok" if all(e["status"] == "ok" for e in out) else "incomplete", "jobs": out,
            "makespan": max(j["proc_end"] for j in jobs) - t0, "done_s": done}


def duty_phases(train: dict, window: tuple[float, float]) -> tuple[list, list]:
    """A training's phases (train.py --duty), each less its first DUTY_MARGIN_S and cut to the
    server's window: when it stepped (its first step's start to its first idle phase, between idle
    phases, its last idle phase to its last step's end) and when it was idle."""
    idle = [(a, b) for a, b in train.get("idle") or []]
    edges = [train["step_starts"][0], *(x for p in idle for x in p), train["times"][-1]]

    def cut(spans):
        return [(a, b) for a, b in ((max(a + DUTY_MARGIN_S, window[0]), min(b, window[1])) for a, b in spans)
                if b > a]
    return cut(list(zip(edges[::2], edges[1::2], strict=True))), cut(idle)


def latencies_inside(server: dict, spans: list) -> list[float]:
    """A server's latencies (ms) of the requests that arrived and ended inside one of the spans."""
    return [lat for a, e, lat in zip(server["arrivals"], server["times"], server["latencies_ms"], strict=True)
            if any(s <= a and e <= t for s, t in spans)]


def duty_split(server: dict, busy: list, idle: list) -> dict:
    """A server's requests (arrivals, times, latencies_ms) beside the training stepping and beside it
    idle (duty_phases): n, p50 and p99 of each, and the one p99 over the other (x_idle_p99)."""
    split: dict = {}
    for name, spans in (("busy", busy), ("idle", idle)):
        lat = latencies_inside(server, spans)
        split[name] = {"n": len(lat), "p50_ms": percentile(lat, 50) if lat else None,
                       "p99_ms": percentile(lat, 99) if lat else None}
    if split["busy"]["p99_ms"] and split["idle"]["p99_ms"]:
        split["x_idle_p99"] = split["busy"]["p99_ms"] / split["idle"]["p99_ms"]
    return split


def busy_rate(ends: list[float], busy: list) -> tuple[float | None, int]:
    """A --duty training's steps/s over its stepping phases (duty_phases), and how many ended in them."""
    busy_s = sum(b - a for a, b in busy)
    n = sum(1 for t in ends if any(a < t <= b for a, b in busy))
    return (n / busy_s if busy_s > 0 else None), n


def with_duty(jobs: list[dict], out: list[dict], window: tuple[float, float]) -> None:
    """--duty: the training stepped and idled in turn through the server's window. Each server's
    requests beside it stepping and beside it idle (a phase's first DUTY_MARGIN_S left out, a request
    across two phases in neither) in e["duty"] (duty_split); the training's steps/s is over its
    stepping phases."""
    train = next((j for j in jobs if j["status"] == "ok" and j.get("idle")), None)
    if train is None:
        return
    busy, idle = duty_phases(train, window)
    for j, e in zip(jobs, out, strict=True):
        if e["status"] != "ok":
            continue
        if j is train:
            rate, n = busy_rate(j["times"], busy)
            e.update(steps_per_s=rate, rate_steps=n,
                     duty={"busy_s": round(sum(b - a for a, b in busy), 3),
                           "idle_s": round(sum(b - a for a, b in idle), 3), "phases": len(idle)})
        elif latency_kind(e["kind"]) and j.get("arrivals"):
            e["duty"] = duty_split(j, busy, idle)


def with_overlaps(kinds: list[str], results: list[dict], alone: bool, keep: Path | None = None) -> dict:
    """summarize(), and with kernel traces (--gpu-times) each server's requests laid beside the
    training's GPU work (kernel_overlap.py): its "overlap", and its rows beside its trace; keep: a folder
    the traces are moved into."""
    out = summarize(kinds, results, alone)
    traces = [r.get("kernel_trace") if r.get("status") == "ok" else None for r in results]
    if not any(traces):
        return out
    loaded = [json.loads(Path(t).read_text()) if t and Path(t).exists() else None for t in traces]
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for i, t in enumerate(traces):
            if t and Path(t).exists():
                traces[i] = shutil.move(t, keep / Path(t).name)
    train = next((t for t, k in zip(loaded, kinds, strict=True) if k == "train" and t), None)
    for i, (kind, res, trace) in enumerate(zip(kinds, results, loaded, strict=True)):
        if kind == "train" or trace is None:
            continue
        rows = kernel_overlap.requests(res, trace, None if alone else train)
        out["jobs"][i]["overlap"] = kernel_overlap.summarize(rows)
        Path(traces[i]).with_suffix(".rows.json").write_text(json.dumps(rows))
    return out


def slowdowns(res: dict) -> None:
    """Each job's slowdown against its solo run (the serial arm), per arm, and the targets."""
    for mix, arms in res["mixes"].items():
        serial = arms.get("serial", {})
        solo = serial.get("jobs", [])
        timed = mix in MIXES and torch_mix(mix)   # jobs that run for a time: no completion to compare
        serial_done = serial.get("done_s") if serial.get("status") == "ok" and not timed else None
        for arm, r in arms.items():
            if serial_done and arm != "serial" and r.get("status") == "ok" and r.get("done_s"):
                r["done_x_serial"] = r["done_s"] / serial_done   # all done, from the start, over serial
            for i, e in enumerate(r.get("jobs", [])):
                ref = solo[i] if i < len(solo) and solo[i]["status"] == "ok" else None
                if e["status"] != "ok" or ref is None:
                    continue
                if latency_kind(e["kind"]):
                    e["x_solo_p99"] = e["p99_ms"] / ref["p99_ms"]
                elif e["kind"] == "train":
                    if e.get("steps_per_s") is not None and ref.get("steps_per_s"):
                        e["x_solo_tput"] = e["steps_per_s"] / ref["steps_per_s"]
                elif arm == "serial":
                    e["x_solo"] = e["done_s"] / ref["train_s"]   # waiting for the jobs before it
                else:
                    e["x_solo"] = e["train_s"] / ref["train_s"]
        co = arms.get("colocate", {}).get("jobs", [])
        for arm, r in arms.items():
            if arm != "nvshare" and not arm.startswith("nvshare "):   # nvshare and its variants
                continue
            for i, e in enumerate(r.get("jobs", [])):
                c = co[i] if i < len(co) and co[i]["status"] == "ok" else None
                ref = solo[i] if i < len(solo) and solo[i]["status"] == "ok" else None
                e["target"] = target(e, c, "colocate" in arms, ref, len(MIXES.get(mix, [])))


def target(e: dict, c: dict | None, colocated: bool, solo: dict | None = None, members: int = 2) -> str:
    """nvshare's target for job e, c its co-location arm's run (None: did not finish), solo its run
    alone, in a mix of `members` jobs."""
    if e["status"] != "ok":
        return "missed (did not finish)"
    if e["kind"] in P99_TARGET:
        limit = P99_TARGET_BESIDE_ONE if members <= 2 else P99_TARGET[e["kind"]]
        return "– (no solo run)" if "x_solo_p99" not in e else \
            f"{'met' if e['x_solo_p99'] <= limit else 'missed'} (p99 <= {limit:g} x alone)"
    if e["kind"] == "probe":
        if solo is None:
            return "– (no solo run)"
        return f"{'met' if e['p99_ms'] <= solo['p99_ms'] + PROBE_SLACK_MS else 'missed'} " \
               f"(p99 within {PROBE_SLACK_MS:g} ms of alone)"
    if not colocated:
        return "– (no co-location arm)"
    if c is None:
        return "met (co-location did not finish)"
    if e["kind"] == "train":
        if not c.get("steps_per_s"):
            return "met (no steps in co-location's window)"
        if e.get("steps_per_s") is None:
            return "missed (no window)"
        ratio = e["steps_per_s"] / c["steps_per_s"]
        return f"{'met' if ratio >= TRAIN_KEEP else 'missed'} ({ratio:.3f} x co-location's steps/s, " \
               f">= {TRAIN_KEEP:g})"
    return "met" if e["x_solo"] <= 1.05 * c["x_solo"] else "missed"


def cell(e: dict | None) -> str:
    if e is None:
        return "–"
    if e["status"] != "ok":
        return e["status"]
    if latency_kind(e["kind"]):
        ratio = f" ({e['x_solo_p99']:.2f}x)" if "x_solo_p99" in e else ""
        if "p90_ms" not in e:   # a results.json from before p90 and p99.9
            return f"p50 {e['p50_ms']:.1f} / p99 {e['p99_ms']:.1f} ms{ratio}"
        late = " (the training did not step: served alone)" if e.get("wait_timed_out") else ""
        return (f"p50 {e['p50_ms']:.1f} / p90 {e['p90_ms']:.1f} / p99 {e['p99_ms']:.1f} / "
                f"p99.9 {e['p999_ms']:.1f} ms, n {e['n']}{ratio}{late}")
    if e["kind"] == "train":
        if e.get("steps_per_s") is None:
            return "no steps/s"
        ratio = f" ({e['x_solo_tput']:.3f}x)" if "x_solo_tput" in e else ""
        cut = f", window {e['window_covered']:.0%} covered" if e.get("window_covered", 1.0) < 0.999 else ""
        return f"{e['steps_per_s']:.2f} steps/s{ratio}{cut}"
    return f"{e['x_solo']:.3f}" if "x_solo" in e else f"{e['train_s']:.2f} s"


def arm_names(arms: list[str], variants: list[str]) -> list[str]:
    """The arms in ARMS' order, then one "nvshare NAME=VALUE" per --variant."""
    return [a for a in ARMS if a in arms] + [f"nvshare {v}" for v in variants]


def service_table(res: dict, names: list[str]) -> str:
    """Per server (a job with service_split's numbers) and arm: its service p50 / p99, how many of its
    requests queued behind the one before, and the median service of those and of the others."""
    lines = []
    for mix, arms in res["mixes"].items():
        for i, kind in enumerate(MIXES[mix]):
            row = [arms.get(a, {}).get("jobs", []) for a in names]
            splits = [jobs[i].get("service") if i < len(jobs) and jobs[i]["status"] == "ok" else None
                      for jobs in row]
            if any(splits):
                lines.append(f"| {mix} | {i} | {kind} | " + " | ".join(map(service_cell, splits)) + " |")
    if not lines:
        return ""
    head = "| mix | job | kind | " + " | ".join(names) + " |\n|---|---|---|" + "---|" * len(names)
    return ("\nServers' service, start to result without the wait behind the request before (ms); how many "
            "requests arrived while the one before was served (queued); the median service of those and of "
            "the others; the host's pace in that arm: the server's service in its warm-up, before the "
            "training began (alone in every arm; model.generate is bound by its host: a slow host is "
            "slow there too), and the CPU time a hypervisor stole from the machine in the window where "
            f"{STEAL_SHOWN_S:g} s or more:\n\n" + head + "\n" + "\n".join(lines) + "\n")


def overlap_table(res: dict, names: list[str]) -> str:
    """Per server and arm with kernel traces (--gpu-times): kernel_overlap's faster and slower halves."""
    parts = []
    for mix, arms in res["mixes"].items():
        for a in names:
            for i, e in enumerate(arms.get(a, {}).get("jobs", [])):
                if e.get("overlap"):
                    parts.append(f"\n{mix}, job {i} ({e['kind']}), {a}:\n\n"
                                 + kernel_overlap.markdown(e["overlap"]))
    if not parts:
        return ""
    return ("\nWhere the servers' service went, from the kernel traces (bench/kernel_overlap.py: gpu the "
            "server's own GPU work, stall its work ready and not running, sync and launch its host in such "
            "calls, other the training's GPU work in the request; the faster and the slower half of the "
            "requests):\n"
            + "\n".join(parts) + "\n")


SPAN_ROUND_S = 1e-4   # spans are kept to 0.1 ms: an overlap shorter than that may be the rounding's


def probe_misses(jobs: list[dict], i: int, limit_ms: float) -> dict | None:
    """Probe i's requests over limit_ms in one arm (its jobs): how many, how many found a server's
    request under way (a latency member's span other than a probe's), how many another probe's, and
    its first 3 requests (before its pace is known: nobody's queue is held ahead of them)."""
    e = jobs[i]
    lat, spans = e.get("lat_seq_ms"), e.get("spans")
    if e["status"] != "ok" or not lat or not spans or len(lat) != len(spans):
        return None
    live = [o for k, o in enumerate(jobs) if k != i and o["status"] == "ok" and latency_kind(o["kind"])]
    others = {"probe": [sp for o in live if o["kind"] == "probe" for sp in o.get("spans", [])],
              "server": [sp for o in live if o["kind"] != "probe" for sp in o.get("spans", [])]}
    beside, over = {"server": 0, "probe": 0}, 0
    for ms, (_, end) in zip(lat, spans, strict=True):
        if ms <= limit_ms:
            continue
        over += 1
        start = end - ms / 1000
        for kind, sps in others.items():
            beside[kind] += any(a < end - SPAN_ROUND_S and b > start + SPAN_ROUND_S for a, b in sps)
    return {"n": len(lat), "over": over, "beside_server": beside["server"], "beside_probe": beside["probe"],
            "first": lat[:3]}


def probe_table(res: dict, names: list[str]) -> str:
    """Per probe and shared arm: its requests over alone + PROBE_SLACK_MS (the serial arm's p99), and
    what was under way beside them."""
    lines = []
    for mix, arms in res["mixes"].items():
        solo = arms.get("serial", {}).get("jobs", [])
        for i, kind in enumerate(MIXES[mix]):
            if kind != "probe" or i >= len(solo) or solo[i]["status"] != "ok":
                continue
            for a in names:
                jobs = arms.get(a, {}).get("jobs", [])
                m = probe_misses(jobs, i, solo[i]["p99_ms"] + PROBE_SLACK_MS) if a != "serial" \
                    and i < len(jobs) else None
                if m is not None:
                    lines.append(f"| {mix} | {i} | {a} | {m['over']} of {m['n']} | {m['beside_server']} | "
                                 f"{m['beside_probe']} | " + ", ".join(f"{x:.2f}" for x in m["first"]) + " |")
    if not lines:
        return ""
    head = ("| mix | job | arm | over | beside a server request | beside a probe | first 3 |\n"
            "|---|---|---|---|---|---|---|\n")
    return (f"\nProbes' requests over alone + {PROBE_SLACK_MS:g} ms (the serial arm's p99), how many of "
            "those found a server's request under way, how many another probe's, and the first 3 requests "
            "(ms), before the probe's pace is known:\n\n" + head + "\n".join(lines) + "\n")


def duty_table(res: dict, names: list[str]) -> str:
    """--duty: per server and shared arm, its requests beside the training stepping and beside it idle,
    and the one p99 over the other (the nvshare arms' target: P99_TARGET_BESIDE_ONE)."""
    lines = []
    for mix, arms in res["mixes"].items():
        for i, kind in enumerate(MIXES[mix]):
            for a in names:
                jobs = arms.get(a, {}).get("jobs", [])
                d = jobs[i].get("duty") if i < len(jobs) and jobs[i]["status"] == "ok" else None
                if not d or "busy" not in d:
                    continue
                x = d.get("x_idle_p99")
                verdict = "" if x is None or not (a == "nvshare" or a.startswith("nvshare ")) else \
                    f"{'met' if x <= P99_TARGET_BESIDE_ONE else 'missed'} (<= {P99_TARGET_BESIDE_ONE:g})"
                cells = ["–" if not d[k]["n"] else
                         f"p50 {d[k]['p50_ms']:.1f} / p99 {d[k]['p99_ms']:.1f} ms, n {d[k]['n']}"
                         for k in ("busy", "idle")]
                lines.append(f"| {mix} | {i} | {kind} | {a} | " + " | ".join(cells)
                             + f" | {'–' if x is None else f'{x:.2f}x'} | {verdict} |")
    if not lines:
        return ""
    return ("\nInterleaved (--duty RUN:IDLE: the training stepped RUN s and idled IDLE s in turn through the "
            f"window; a phase's first {DUTY_MARGIN_S:g} s left out): each server's requests beside the "
            "training stepping and beside it idle, in the same run and process, and the one p99 over the "
            "other:\n\n| mix | job | kind | arm | beside the training | beside it idle | p99 over idle "
            "| target |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def service_cell(s: dict | None) -> str:
    if s is None:
        return "–"
    medians = " / ".join("–" if k not in s else f"{s[k]:.2f}" for k in ("queued_p50_ms", "unqueued_p50_ms"))
    out = f"p50 {s['p50_ms']:.2f} / p99 {s['p99_ms']:.2f} ms; {s['queued']} of {s['n']} queued ({medians})"
    if "service_ms_warm" in s:
        out += f"; before the training {s['service_ms_warm']:.2f}"
    if s.get("steal_s", 0.0) >= STEAL_SHOWN_S:
        out += f"; {s['steal_s']:.2f} s stolen"
    return out


def table(res: dict) -> str:
    names = arm_names(ARMS, res["args"].get("variant") or [])
    lines = ["| mix | job | kind | " + " | ".join(names) + " | nvshare target |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for mix, arms in res["mixes"].items():
        for i, kind in enumerate(MIXES[mix]):
            row = [arms.get(a, {}) for a in names]
            cells = [str(r["error"]).split(" (")[0] if r.get("status") == "skipped" and not r.get("jobs")
                     and str(r.get("error", "")).startswith(NEEDS_TORCH)
                     else cell(r["jobs"][i] if i < len(r.get("jobs", [])) else None) for r in row]
            nv = arms.get("nvshare", {}).get("jobs", [])
            target = nv[i].get("target", "") if i < len(nv) else ""
            lines.append(f"| {mix} | {i} | {kind} | " + " | ".join(cells) + f" | {target} |")
        spans = [arms.get(a, {}).get("done_x_serial") for a in names]
        if any(x is not None for x in spans):
            lines.append(f"| {mix} | all | all done / serial | " + " | ".join(
                "–" if x is None else f"{x:.3f}" for x in spans) + " | |")
    return "\n".join(lines) + ("\n\nCompute, bursty, mem: time from first step to last over the job's solo "
                               "time (serial: its completion from the arm's start). Probe, serve, gen, "
                               "gengraph, cnn: latency percentiles from arrival to result, n requests, p99 "
                               "over solo p99. Train: steps/s in the server's window (serial: alone), over "
                               f"its steps/s alone ({res['args'].get('train_precision', 'fp32')}). All "
                               "done / serial: the arm's start to the last step of any job, over the same in "
                               "the serial arm (the jobs one after the other).\n") \
        + service_table(res, names) + probe_table(res, names) + duty_table(res, names) \
        + overlap_table(res, names)


def write_timelines(res: dict, out: Path, window: float) -> list[Path]:
    """timeline_<mix>.svg: each arm but serial a band, each job a lane of its steps."""
    written = []
    for mix, arms in res["mixes"].items():
        rows = [{"arm": arm, "status": r.get("status"), "lock": {},
                 "jobs": [{"spans": e.get("spans", []), "proc": f"{i} {e['kind']}", "status": e["status"]}
                          for i, e in enumerate(r["jobs"])]}
                for arm, r in arms.items() if arm != "serial" and r.get("jobs")]
        if rows:
            path = out / f"timeline_{mix}.svg"
            path.write_text(svg({"member": mix, "rows": rows}, window))
            written.append(path)
    return written


# --- the latency figure: per arm the latency distribution and the batch member's throughput ----------

ARM_COLORS = ["#444444", "#d62728", "#9467bd", "#1f77b4", "#2ca02c", "#ff7f0e", "#8c564b"]


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 5 x 10^k from below lo to above hi."""
    ticks, k = [], math.floor(math.log10(lo))
    while True:
        for m in (1, 2, 5):
            t = m * 10.0 ** k
            if t >= lo / 1.0001 and t <= hi * 1.0001:
                ticks.append(t)
            if t > hi:
                return ticks
        k += 1


def latency_svg(mix: str, arms: dict, names: list[str]) -> str | None:
    """Left: per arm the share of requests slower than x (log-log), the first latency member's;
    right: the first batch member's steps/s per arm. None if no arm has latencies."""
    kinds = MIXES.get(mix, [])
    li = next((i for i, k in enumerate(kinds) if k in P99_TARGET), None)
    li = li if li is not None else next((i for i, k in enumerate(kinds) if latency_kind(k)), None)
    bi = next((i for i, k in enumerate(kinds) if not latency_kind(k)), None)
    if li is None:
        return None
    series = []
    for n, arm in enumerate(names):
        jobs = arms.get(arm, {}).get("jobs", [])
        e = jobs[li] if li < len(jobs) else None
        if e and e.get("status") == "ok" and e.get("lat_ms"):
            series.append((arm, ARM_COLORS[n % len(ARM_COLORS)], e))
    if not series:
        return None
    top, bottom = 44 + 14 * math.ceil(len(series) / 2), 54   # the legend above the panels
    W, H = 960, top + 280 + bottom
    lx0, lx1 = 70, 560          # the latency panel
    bx0, bx1 = 650, 940         # the throughput panel
    y0, y1 = top, H - bottom
    lo = min(min(e["lat_ms"]) for _, _, e in series)
    hi = max(max(e["lat_ms"]) for _, _, e in series)
    lo, hi = max(1e-3, lo) / 1.25, max(hi * 1.25, lo * 4)
    nmax = max(len(e["lat_ms"]) for _, _, e in series)
    ymin = 10.0 ** -max(3, math.ceil(math.log10(nmax)))

    def lxp(v: float) -> float:
        span = math.log10(hi) - math.log10(lo)
        return lx0 + (math.log10(max(v, lo)) - math.log10(lo)) / span * (lx1 - lx0)

    def lyp(f: float) -> float:
        return y0 + (0 - math.log10(max(f, ymin))) / (0 - math.log10(ymin)) * (y1 - y0)

    label = {"serial": "alone"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="11">', f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="8" y="18" font-size="13">{mix}: job {li} ({kinds[li]}) latency per arm, '
           f'arrival to result'
           + (f'; job {bi} ({kinds[bi]}) steps/s per arm' if bi is not None else '') + '</text>',
           f'<rect x="{lx0}" y="{y0}" width="{lx1 - lx0}" height="{y1 - y0}" fill="none" stroke="black"/>']
    for t in log_ticks(lo, hi):
        x = lxp(t)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" stroke="#e0e0e0"/>'
                   f'<text x="{x:.1f}" y="{y1 + 14}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{(lx0 + lx1) / 2}" y="{y1 + 30}" text-anchor="middle">latency, ms (log)</text>')
    out.append(f'<text x="14" y="{(y0 + y1) / 2}" transform="rotate(-90 14 {(y0 + y1) / 2})" '
               f'text-anchor="middle">share of requests slower (log)</text>')
    for f, name in ((0.5, "p50"), (0.1, "p90"), (0.01, "p99"), (0.001, "p99.9")):
        if f >= ymin:
            y = lyp(f)
            out.append(f'<line x1="{lx0}" y1="{y:.1f}" x2="{lx1}" y2="{y:.1f}" stroke="#999" '
                       f'stroke-dasharray="4 3"/><text x="{lx0 - 4}" y="{y + 4:.1f}" '
                       f'text-anchor="end">{name}</text>')
    for k, (arm, color, e) in enumerate(series):
        lat = e["lat_ms"]
        n = len(lat)
        pts = []
        for i, v in enumerate(lat):   # steps: a share (n - i) / n of the requests took v or longer
            y_hi, y_lo = (n - i) / n, (n - i - 1) / n
            pts.append(f"{lxp(v):.1f},{lyp(y_hi):.1f}")
            if y_lo > 0:
                pts.append(f"{lxp(v):.1f},{lyp(y_lo):.1f}")
        out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        lx, ly = lx0 + (k % 2) * 245, 34 + 14 * (k // 2)
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"/><text x="{lx + 22}" y="{ly}">{label.get(arm, arm)}: p99 '
                   f'{e["p99_ms"]:.1f} ms, n {n}</text>')
    if bi is not None:
        bars = []
        for n, arm in enumerate(names):
            r = arms.get(arm, {})
            jobs = r.get("jobs", [])
            e = jobs[bi] if bi < len(jobs) else None
            if not r or (not jobs and r.get("status") != "skipped"):
                continue
            rate = None
            if e and e.get("status") == "ok":
                rate = e.get("steps_per_s")
                if rate is None and e.get("train_s"):
                    rate = (e["steps"] - 1) / e["train_s"] if e["train_s"] > 0 else None
            why = "not run" if not jobs else (e or {}).get("status", "–") if rate is None else ""
            bars.append((arm, ARM_COLORS[n % len(ARM_COLORS)], rate, why))
        top_rate = max([b[2] for b in bars if b[2]] or [1.0]) * 1.15
        step = next(m * 10.0 ** k for k in range(math.floor(math.log10(top_rate / 4)), 99)
                    for m in (1, 2, 5) if m * 10.0 ** k >= top_rate / 5)
        top_rate = step * math.ceil(top_rate / step)
        out.append(f'<line x1="{bx0}" y1="{y1}" x2="{bx1}" y2="{y1}" stroke="black"/>'
                   f'<line x1="{bx0}" y1="{y0}" x2="{bx0}" y2="{y1}" stroke="black"/>'
                   f'<text x="{bx0 - 40}" y="{(y0 + y1) / 2}" '
                   f'transform="rotate(-90 {bx0 - 40} {(y0 + y1) / 2})" text-anchor="middle">'
                   f'{kinds[bi]} steps/s</text>')
        for q in range(round(top_rate / step) + 1):
            y = y1 - (y1 - y0) * q * step / top_rate
            out.append(f'<line x1="{bx0 - 3}" y1="{y:.1f}" x2="{bx0}" y2="{y:.1f}" stroke="black"/>'
                       f'<text x="{bx0 - 5}" y="{y + 4:.1f}" text-anchor="end">{q * step:g}</text>')
        slot = (bx1 - bx0) / max(1, len(bars))
        co = next((b[2] for b in bars if b[0] == "colocate" and b[2]), None)
        for k, (arm, color, rate, why) in enumerate(bars):
            x = bx0 + slot * k + slot * 0.15
            if rate:
                h = (y1 - y0) * rate / top_rate
                out.append(f'<rect x="{x:.1f}" y="{y1 - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                           f'fill="{color}"/><text x="{x + slot * 0.35:.1f}" y="{y1 - h - 4:.1f}" '
                           f'text-anchor="middle">{rate:.2f}</text>')
            else:
                out.append(f'<text x="{x + slot * 0.35:.1f}" y="{y1 - 6}" text-anchor="middle">{why}</text>')
            # a variant's bar says its setting's value under "nvshare": the whole name overlapped
            words = label.get(arm, arm).split(" ", 1)
            out.append(f'<text x="{x + slot * 0.35:.1f}" y="{y1 + 14}" text-anchor="middle">{words[0]}</text>'
                       + (f'<text x="{x + slot * 0.35:.1f}" y="{y1 + 28}" text-anchor="middle" '
                          f'font-size="9">{words[1].split("=", 1)[-1]}</text>' if len(words) > 1 else ''))
        if co and kinds[bi] == "train":
            y = y1 - (y1 - y0) * TRAIN_KEEP * co / top_rate
            out.append(f'<line x1="{bx0}" y1="{y:.1f}" x2="{bx1}" y2="{y:.1f}" stroke="#d62728" '
                       f'stroke-dasharray="4 3"/><line x1="{bx0}" y1="30" x2="{bx0 + 18}" y2="30" '
                       f'stroke="#d62728" stroke-dasharray="4 3"/><text x="{bx0 + 22}" y="34" '
                       f'fill="#d62728">{TRAIN_KEEP:g} x co-location (the target)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_latency_figures(res: dict, out: Path) -> list[Path]:
    """latency_<mix>.svg for every mix with a latency member measured in some arm."""
    names = arm_names(ARMS, res["args"].get("variant") or [])
    written = []
    for mix, arms in res["mixes"].items():
        text = latency_svg(mix, arms, names)
        if text:
            path = out / f"latency_{mix}.svg"
            path.write_text(text)
            written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="steps of one job alone, in seconds (PyTorch mixes: the server's window)")
    ap.add_argument("--mem-gib", type=float,
                    help="the mem jobs' extra memory (default half the GPU, smoke 8)")
    ap.add_argument("--memory-reserve-percent", type=int, metavar="PERCENT",
                    help="the nvshare arm's daemon keeps this share of the GPU's memory unused (config "
                         "memory_reserve_percent, default 5): 46 on an H200 leaves an H100's 75.7 GiB")
    ap.add_argument("--uids", action="store_true", help="job i runs as uid --uid-base + i (root)")
    ap.add_argument("--uid-base", type=int, default=61000)
    ap.add_argument("--hook-env", action="append", default=[], metavar="NAME=VALUE",
                    help="for the nvshare arm's jobs (e.g. NVSHARE_LOG_LEVEL=debug, NVSHARE_SWAP_PREPIN=1)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE",
                    help="one more nvshare arm with this setting too, in the same table (an A/B in one run)")
    ap.add_argument("--gpu-times", action="store_true",
                    help="every job records its kernels' GPU start and end (burst --gpu-times) in its "
                         "logs/*.out: whose kernels ran beside a slow request; the PyTorch members a "
                         "kernel trace each (logs/ktrace/, kernel_trace.py), and the table where each "
                         "server's service went (kernel_overlap.py)")
    ap.add_argument("--smoke-cpu", action="store_true", help="fake driver, real hook and daemon, no MPS")
    ap.add_argument("--torch-cpu", action="store_true",
                    help="with --smoke-cpu: run the PyTorch mixes on the CPU, tiny models (else skipped)")
    ap.add_argument("--train-precision", choices=("fp32", "tf32", "bf16"), default="fp32",
                    help="the PyTorch training's (tests/gpu/train.py --precision)")
    ap.add_argument("--duty", default="", metavar="RUN:IDLE",
                    help="PyTorch mixes' shared arms: the training steps RUN s, idles IDLE s, in turn "
                         "(train.py --duty); each server's p99 beside it stepping over beside it idle")
    ap.add_argument("--torch-python", default=sys.executable,
                    help="the Python with torch and transformers for the PyTorch members (default this one)")
    args = ap.parse_args()
    bad = [m for m in args.mixes.split(",") if m not in MIXES] + \
          [a for a in args.arms.split(",") if a not in ARMS] + [v for v in args.variant if "=" not in v]
    if bad or args.seconds <= 0 or (args.uids and os.geteuid() != 0):
        ap.error(f"unknown mix or arm: {', '.join(bad)}" if bad else
                 "--seconds must be above 0" if args.seconds <= 0 else "--uids needs root")
    if args.duty and not re.fullmatch(r"[0-9]*\.?[0-9]+:[0-9]*\.?[0-9]+", args.duty):
        ap.error(f"--duty {args.duty!r} is not RUN:IDLE (seconds, e.g. 2:2)")
    if args.mem_gib is None:   # half the GPU: two of them do not fit beside the others (40 on an H100)
        args.mem_gib = 8.0 if args.smoke_cpu else round(gpu_info(False)["memory"] / 2**30 / 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mixes = args.mixes.split(",")
    build_burst()
    if args.uids:
        os.chmod(BURST, 0o755)
    bench = Mixes(args, out)
    sigterm_interrupts()     # `timeout`: the table of what was measured is still written
    try:
        if not all(torch_mix(m) for m in mixes):   # burst's rate: only its mixes need it
            bench.calibrate()
        for mix in mixes:
            arms = bench.results["mixes"].setdefault(mix, {})
            for arm in arm_names(args.arms.split(","), args.variant):
                t = time.time()
                arms[arm] = bench.run_arm(mix, arm)
                log(f"{mix}/{arm}: {arms[arm]['status']} in {time.time() - t:.1f} s")
                bench.save()
    except KeyboardInterrupt:
        log("interrupted: the table has what was measured")
    finally:
        slowdowns(bench.results)
        bench.save()
        write_timelines(bench.results, out, min(6.0, 2 * args.seconds))
        write_latency_figures(bench.results, out)
        text = table(bench.results)
        (out / "table.md").write_text(text)
        print(text)
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
