"""A full node on the fake driver: 8 GPUs x 4 sharers (issue 27), the real daemon and hook.

Starts nvshare-scheduler with 8 configured GPUs in its default mode (auto, adaptive), registers one
job per sharer on its GPU, and runs tests/c's nvtest under the hook on the fake driver
(tests/c/build/libcuda.so.1, which records each kernel's process and times). Two mixes per GPU:

- equal: four compute-bound jobs (5 ms kernels back to back, a synchronise after each);
- mixed: two compute-bound jobs, a bursty one (8 ms kernels, 12 ms host pauses: 40 % busy alone)
  and a light one (1 ms kernels every 100 ms, as an interactive step).

Each runs --seconds, then every job is stopped. From the daemon: its CPU time over the run (share
of one core). From the kernel trace, per GPU: hand-overs between compute-bound jobs (the gap from
one's last kernel end to the next one's first start; p50, p99, max), overlapping kernels of two
compute-bound jobs (0 expected: they take turns), each job's GPU time inside the window where all
four ran, and the compute-bound jobs' fairness (min/max of their GPU time on a GPU, and Jain's
index over all of them). The bursty and light jobs report steps made against what they make
alone (their kernels and pauses are exact on the fake driver: one step takes kernel + pause).

    python bench/bench_node.py [--seconds 20] [--only equal,mixed] [--write]

--write records the table in docs/benchmarks.md ("## A node of 8 GPUs x 4 sharers, fake driver").
Needs `make -C tests/c` (the fake driver and nvtest) and the built hook.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import bench_daemon
from docsection import replace_section
from nvshare_slurm import libnvshare_path
from nvshare_slurm.wire.client import Client

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "tests" / "c" / "build"
N_GPUS, SHARERS = 8, 4
UUIDS = [f"GPU-fa4e0000-0000-0000-0000-00000000000{i}" for i in range(N_GPUS)]
# kind -> (kernel us, host pause ms); a step alone takes kernel + pause on the fake driver.
KINDS = {"compute": (5000, 0), "bursty": (8000, 12), "light": (1000, 100)}
MIXES = {"equal": ["compute"] * 4, "mixed": ["compute", "compute", "bursty", "light"]}


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run_mix(mix: str, seconds: float, workdir: Path) -> dict:
    daemon, sock = bench_daemon.start_daemon(workdir, UUIDS, scheduling_mode="auto",
                                             switch_time_mode="auto",
                                             log_level=os.environ.get("BENCH_LOG", "warning"))
    trace = workdir / "trace"
    client = Client(sock)
    procs: list[tuple[subprocess.Popen, str, int]] = []
    try:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "FAKE_CUDA"))}
        base.update(LD_LIBRARY_PATH=str(BUILD), FAKE_CUDA_TRACE=str(trace),
                    FAKE_CUDA_DEVICES=",".join(f"{u}:16G" for u in UUIDS),
                    LD_PRELOAD=str(libnvshare_path()), NVSHARE_SOCKET=sock, SLURM_STEP_ID="0")
        job = 0
        cpu_before = daemon_cpu(daemon.pid)
        started = time.monotonic()
        for gpu in range(N_GPUS):
            for kind in MIXES[mix]:
                job += 1
                place = client.register_job(job, uid=os.getuid(), gid=os.getgid(), slots=1,
                                            gpu_index=[gpu], name=f"{mix}{job}")
                us, pause = KINDS[kind]
                env = dict(base, NVSHARE_JOB_ID=str(job),
                           NVSHARE_MANAGED_GPUS=",".join(place["gpu_uuid"]),
                           CUDA_VISIBLE_DEVICES=",".join(place["gpu_uuid"]))
                # The fake driver shows every GPU (it ignores CUDA_VISIBLE_DEVICES): the job's
                # context goes on its GPU by index, as a process that Slurm gave one GPU does.
                proc = subprocess.Popen([str(BUILD / "nvtest"), "init", f"ctx:{gpu}",
                                         f"burst:{us}:1000000:{pause}"], env=env,
                                        stdout=subprocess.DEVNULL,
                                        stderr=open(workdir / f"job{job}.err", "wb"))
                procs.append((proc, kind, gpu))
        time.sleep(seconds)
        wall = time.monotonic() - started
        cpu = daemon_cpu(daemon.pid) - cpu_before
    finally:
        for proc, _, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _, _ in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        daemon.terminate()
        daemon.wait(10)
    return analyse(mix, trace, procs, cpu / wall)


def daemon_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def analyse(mix: str, trace: Path, procs: list, daemon_share: float) -> dict:
    rows: dict[int, list[tuple[int, int]]] = {}
    for line in trace.read_text().splitlines():
        pid, _, start, end = line.split()
        rows.setdefault(int(pid), []).append((int(start), int(end)))
    kind_of = {p.pid: (kind, gpu) for p, kind, gpu in procs}
    wrong = {gpu for line in trace.read_text().splitlines() for gpu in [line.split()[1]]} - set(UUIDS)
    if wrong:
        raise SystemExit(f"kernels on GPUs the bench did not configure: {sorted(wrong)}")
    gaps, overlaps, ratios, compute_times, others = [], 0, [], [], []
    for gpu in range(N_GPUS):
        pids = [pid for pid, (_, g) in kind_of.items() if g == gpu and pid in rows]
        if len(pids) < SHARERS:
            raise SystemExit(f"gpu {gpu}: only {len(pids)} of its jobs ran a kernel")
        lo = max(min(s for s, _ in rows[p]) for p in pids)
        hi = min(max(e for _, e in rows[p]) for p in pids)
        compute = [p for p in pids if kind_of[p][0] == "compute"]
        kernels = sorted((s, e, p) for p in compute for s, e in rows[p] if lo <= s and e <= hi)
        last_end, last_pid = 0, None        # the latest end so far, and whose kernel it was
        for start, end, pid in kernels:
            if last_pid is not None and pid != last_pid:
                if start < last_end:
                    overlaps += 1
                else:
                    gaps.append((start - last_end) / 1e6)
            if end > last_end:
                last_end, last_pid = end, pid
        busy = {p: sum(min(e, hi) - max(s, lo) for s, e in rows[p] if e > lo and s < hi) / 1e9
                for p in pids}
        window = (hi - lo) / 1e9
        held = [busy[p] for p in compute]
        compute_times += held
        ratios.append(min(held) / max(held))
        for p in pids:
            kind = kind_of[p][0]
            if kind != "compute":
                us, pause = KINDS[kind]
                steps = sum(1 for s, _ in rows[p] if lo <= s < hi)
                others.append((kind, steps / (window / ((us / 1e6) + pause / 1e3))))
    jain = sum(compute_times) ** 2 / (len(compute_times) * sum(t * t for t in compute_times))
    out = {"mix": mix, "daemon_cpu": daemon_share, "handovers": len(gaps),
           "gap_p50": percentile(gaps, 50), "gap_p99": percentile(gaps, 99),
           "gap_max": max(gaps, default=float("nan")), "overlaps": overlaps,
           "fair_min": min(ratios), "jain": jain}
    for kind in ("bursty", "light"):
        speeds = [s for k, s in others if k == kind]
        if speeds:
            out[f"{kind}_speed"] = (min(speeds), statistics.median(speeds))
    return out


def table(results: list[dict], seconds: float) -> str:
    lines = [f"{datetime.date.today().isoformat()}, {platform.node()} ({os.cpu_count()} CPUs), "
             f"`python bench/bench_node.py --seconds {seconds:g}`: 8 fake GPUs x 4 jobs, the daemon "
             f"in its default mode (auto, adaptive, switch time auto). Hand-overs and fairness are "
             f"between the compute-bound jobs of a GPU, inside the window where all four ran; "
             f"bursty and light: steps made against alone (min and median over the 8 GPUs).", "",
             "| mix | daemon CPU (one core) | hand-overs | gap p50 / p99 / max (ms) | overlaps | "
             "fairness min/max (worst GPU) | Jain | bursty speed | light speed |",
             "|---|---|---|---|---|---|---|---|---|"]
    def speed(r: dict, kind: str) -> str:
        v = r.get(f"{kind}_speed")
        return f"{v[0]:.2f} / {v[1]:.2f}" if v else "-"
    for r in results:
        lines.append(f"| {r['mix']} | {r['daemon_cpu']:.1%} | {r['handovers']} | "
                     f"{r['gap_p50']:.2f} / {r['gap_p99']:.2f} / {r['gap_max']:.2f} | "
                     f"{r['overlaps']} | {r['fair_min']:.3f} | {r['jain']:.4f} | "
                     f"{speed(r, 'bursty')} | {speed(r, 'light')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--only", default="equal,mixed")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if not (BUILD / "nvtest").exists():
        subprocess.run(["make", "-C", str(REPO / "tests" / "c")], check=True)
    results = []
    for mix in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix="nvs-node-") as tmp:
            results.append(run_mix(mix, args.seconds, Path(tmp)))
        print(results[-1], flush=True)
    text = table(results, args.seconds)
    print(text)
    if args.write:
        heading = "A node of 8 GPUs x 4 sharers, fake driver"
        replace_section(REPO / "docs" / "benchmarks.md", heading, f"## {heading}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
