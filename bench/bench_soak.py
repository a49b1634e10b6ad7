"""Issue 39's soak: random mixes of 2 to 8 jobs whose memory sums to 0.5-2.0x the GPU's usable memory,
of random lengths, some under other uids. Nothing may be lost.

Every job is tests/gpu/burst.c (bench_family.py's program): compute-bound steps (20 ms bursts back to
back, so every job takes turns) with --mem-mib of device memory, whose samples it writes at start and
checks after its last step (mem_check). Each mix is drawn from --seed and its number: the job count,
the memory factor, each job's share of it (at most 85 % of the usable memory: each job fits alone) and
its length (--min-seconds to --max-seconds alone), and when it starts (the first at once, each other
within half of --max-seconds: some allocate while others end). Arms per mix: nvshare (libnvshare.so and a real
nvshare-scheduler, defaults), and those --arms adds: serial (each job alone: its solo time) and
colocate (no hook: the driver decides, and out-of-memory ends a job).

Per mix and arm: jobs lost (did not finish: out of memory, crash, time-out), jobs whose memory came
back different (mem_check), overlapping kernels of two jobs (--smoke-cpu: the fake driver's kernel
trace; on a GPU with --gpu-times: burst's %globaltimer kernel times), and each job's slowdown over
its solo time, and over its slowdown co-located where co-location finished it (target <= 1.05).

--smoke-cpu: the fake driver of tests/c: one 4 GiB GPU whose memory the jobs' processes share
(FAKE_CUDA_SHARED_MEMORY), each process's memory released FAKE_CUDA_EXIT_RELEASE_MS (0-2000, drawn
per process) after it ends, as the real driver frees an ended process's memory some time after; the
daemon reads the GPU's memory through the fake NVML (FAKE_NVML_FROM_CUDA), as it reads NVML on a
GPU (the serial arm, the solo reference, waits for nothing: its delay is 0). Its speeds mean nothing
(the fake's kernels do not slow each other); what is lost does.
Overlapping kernels count every pair of jobs' kernels that ran at once; under the default
auto_share (adaptive) a job the daemon finds bursty co-runs beside the turns by design, so the
count that must be 0 is with --auto-share turns (every job takes turns).
--host-budget-gib caps what the mix's memory may exceed the usable memory by (it is swapped to
pinned host memory: the GPU machine has 128 GiB).

  python3 bench/bench_soak.py --out DIR [--mixes 200] [--seed 1] [--arms serial,colocate]
                              [--min-seconds 2] [--max-seconds 8] [--uids] [--smoke-cpu]
                              [--memory-reserve-percent P] [--host-budget-gib G] [--gpu-times]

DIR/results.json has every mix's jobs and arms; DIR/table.md one row per mix and the totals.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_family import BURST, SMOKE_UUID, build_burst, burst_env  # noqa: E402
from gpu_bench import REPO, Job, Scheduler, gpu_info, run_jobs, sigterm_interrupts  # noqa: E402

GPU_MS = 20.0
MiB = 1 << 20
SMOKE_MEMORY = 4 << 30    # the fake copies at about 1 GB/s: a small GPU keeps swaps short
MAX_SHARE = 0.85          # of the usable memory, for one job: each job fits alone
OVERLAP_TOLERANCE_NS = 200_000   # the fake's trace stamps a kernel from its launch: 0.2 ms of slack


def log(msg: str) -> None:
    print(f"bench_soak: {msg}", flush=True)


def draw_mix(rng: random.Random, usable: int, host_budget: int, min_s: float, max_s: float,
             max_jobs: int) -> dict:
    """One mix: jobs (memory bytes, seconds alone) and the memory factor it was drawn with."""
    n = rng.randint(2, max_jobs)
    factor = rng.uniform(0.5, 2.0)
    total = min(int(factor * usable), usable + host_budget)
    weights = [rng.uniform(0.2, 1.0) for _ in range(n)]
    scale = total / sum(weights)
    mems = [max(256 * MiB, min(int(w * scale), int(MAX_SHARE * usable))) for w in weights]
    seconds = [round(rng.uniform(min_s, max_s), 2) for _ in range(n)]
    # Jobs start at random times (the first at once), so that some allocate while others end.
    delays = [0.0] + [round(rng.uniform(0, max_s / 2), 2) for _ in range(n - 1)]
    return {"factor": round(sum(mems) / usable, 3),
            "jobs": [{"mem": m, "seconds": s, "delay": d}
                     for m, s, d in zip(mems, seconds, delays, strict=True)]}


def overlaps(trace: Path) -> int:
    """Kernels of two processes that ran at the same time (the fake driver's trace)."""
    rows = []
    for line in trace.read_text().splitlines() if trace.exists() else []:
        parts = line.split()
        if len(parts) >= 4:
            rows.append((int(parts[2]), int(parts[3]), int(parts[0])))
    rows.sort()
    count, live = 0, []     # (end, pid) of kernels still running
    for start, end, pid in rows:
        live = [(e, p) for e, p in live if e > start + OVERLAP_TOLERANCE_NS]
        count += sum(1 for _, p in live if p != pid)
        live.append((end, pid))
    return count


def gpu_overlaps(results: list[dict]) -> int | None:
    """The same from burst --gpu-times (a GPU's %globaltimer), None when no job recorded any."""
    rows = [(k[0], k[1], i) for i, r in enumerate(results) for k in r.get("gpu_kernels") or []]
    if not rows:
        return None
    rows.sort()
    count, live = 0, []
    for start, end, who in rows:
        live = [(e, w) for e, w in live if e > start]
        count += sum(1 for _, w in live if w != who)
        live.append((end, who))
    return count


class Soak:
    def __init__(self, args: argparse.Namespace, out: Path):
        self.args, self.out, self.smoke = args, out, args.smoke_cpu
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="nvsoak-"))
        os.chmod(self.work, 0o755)
        self.gpu = gpu_info(self.smoke)
        if self.smoke:
            self.gpu["memory"] = SMOKE_MEMORY
        self.results: dict = {"gpu": self.gpu, "args": vars(args), "mixes": []}

    def usable(self) -> int:
        reserve = self.args.memory_reserve_percent
        return self.gpu["memory"] * (100 - (5 if reserve is None else reserve)) // 100

    def calibrate(self) -> float:
        res = run_jobs([Job("calibration", [str(BURST), "--calibrate"], burst_env(self.smoke, self.gpu),
                            self.logs)], together=False, timeout=120)[0]
        if res["status"] != "ok":
            raise RuntimeError(f"calibration failed: {res.get('error', '')[-800:]}")
        return float(res["ipm"])

    def cmd(self, job: dict, i: int, ipm: float, delayed: bool) -> list[str]:
        out = [str(BURST), "--ipm", f"{ipm:.3f}", "--gpu-ms", str(GPU_MS), "--host-ms", "0",
               "--steps", str(max(5, round(job["seconds"] * 1000 / GPU_MS))),
               "--mem-mib", str(job["mem"] // MiB), "--seed", str(i + 1)]
        if self.args.gpu_times:
            out.append("--gpu-times")
        if self.args.uids and i % 2:     # every other job as a user of its own
            uid = self.args.uid_base + i
            out = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *out]
        if delayed and job.get("delay"):
            out = ["sh", "-c", f'sleep {job["delay"]}; exec "$@"', "sh", *out]
        return out

    def shared_files(self, tag: str, arm: str) -> dict:
        """The fake driver's shared memory and trace for one arm, writable by every uid."""
        env = {}
        if self.smoke:
            for name, var in (("mem", "FAKE_CUDA_SHARED_MEMORY"), ("trace", "FAKE_CUDA_TRACE")):
                path = self.work / f"{tag}-{name}"
                path.touch()
                os.chmod(path, 0o666)
                env[var] = str(path)
            env["FAKE_CUDA_EXIT_RELEASE_MS"] = "0" if arm == "serial" else self.args.exit_release_ms
            env["FAKE_CUDA_DEVICES"] = f"{SMOKE_UUID}:{SMOKE_MEMORY >> 30}G"
        return env

    def run_arm(self, n: int, mix: dict, arm: str, ipm: float) -> dict:
        tag = f"m{n}-{arm}"
        fake = self.shared_files(tag, arm)
        base = dict(burst_env(self.smoke, self.gpu), **fake)
        cmds = [self.cmd(j, i, ipm, delayed=arm != "serial") for i, j in enumerate(mix["jobs"])]
        alone = sum(j["seconds"] for j in mix["jobs"])
        timeout = 60 + 4 * alone + 3 * len(cmds) + max(j.get("delay", 0) for j in mix["jobs"])
        sched = None
        try:
            if arm == "serial":
                jobs = [Job(f"{tag}-{i}", c, base, self.logs) for i, c in enumerate(cmds)]
                results = run_jobs(jobs, together=False, timeout=timeout)
            else:
                envs = [base] * len(cmds)
                if arm == "nvshare":
                    gpus = [] if self.smoke else None
                    daemon_env = {"LD_LIBRARY_PATH": str(REPO / "tests" / "c" / "build"),
                                  "FAKE_NVML_FROM_CUDA": "1", **fake} if self.smoke else None
                    reserve = self.args.memory_reserve_percent
                    settings = {"auto_share": self.args.auto_share}
                    if reserve is not None:
                        settings["memory_reserve_percent"] = reserve
                    sched = Scheduler("auto", self.work / tag, self.logs / f"{tag}-scheduler.log", gpus,
                                      settings, daemon_env=daemon_env)
                    os.chmod(self.work / tag, 0o755)
                    envs = self.nvshare_envs(sched, base, len(cmds))
                jobs = [Job(f"{tag}-{i}", c, e, self.logs)
                        for i, (c, e) in enumerate(zip(cmds, envs, strict=True))]
                results = run_jobs(jobs, together=True, timeout=timeout)
        finally:
            if sched is not None:
                sched.stop()
        trace = Path(fake["FAKE_CUDA_TRACE"]) if self.smoke else None
        return summarize(results, trace)

    def nvshare_envs(self, sched: Scheduler, base: dict, n: int) -> list[dict]:
        return [sched.job_env(base, uid=self.args.uid_base + i if self.args.uids and i % 2 else None,
                              name="soak")[1] for i in range(n)]

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def summarize(results: list[dict], trace: Path | None) -> dict:
    jobs = []
    for r in results:
        e: dict = {"status": r["status"]}
        if r["status"] == "ok" and r.get("times"):
            e["train_s"] = r["times"][-1] - r["step_starts"][0]
            e["mem_check"] = r.get("mem_check", "none")
        else:
            e["error"] = r.get("error", "")[-300:]
        jobs.append(e)
    ok = [r for r in results if r["status"] == "ok" and r.get("times")]
    t0 = min(r["proc_start"] for r in results)
    return {"jobs": jobs, "lost": sum(1 for j in jobs if j["status"] != "ok"),
            "mem_bad": sum(1 for j in jobs if j.get("mem_check", "ok") != "ok"),
            "overlaps": overlaps(trace) if trace is not None else gpu_overlaps(ok),
            "done_s": max(r["times"][-1] for r in ok) - t0 if ok else None}


def slowdowns(mix: dict) -> None:
    """Each nvshare job's time over its solo time and over co-location's slowdown (where it ran)."""
    arms = mix["arms"]
    solo = arms.get("serial", {}).get("jobs", [])
    co = arms.get("colocate", {}).get("jobs", [])
    nv = arms.get("nvshare", {}).get("jobs", [])
    worst = None
    for i, e in enumerate(nv):
        if e["status"] != "ok" or i >= len(solo) or solo[i]["status"] != "ok":
            continue
        e["x_solo"] = e["train_s"] / solo[i]["train_s"]
        if i < len(co) and co[i]["status"] == "ok":
            e["x_colocate"] = e["x_solo"] / (co[i]["train_s"] / solo[i]["train_s"])
            worst = max(worst or 0.0, e["x_colocate"])
    mix["worst_x_colocate"] = worst


def table(res: dict) -> str:
    lines = ["| mix | jobs | memory / usable | nvshare lost | mem bad | overlaps | colocate lost "
             "| worst job vs co-located |", "|---|---|---|---|---|---|---|---|"]
    totals = {"jobs": 0, "lost": 0, "mem_bad": 0, "overlaps": 0, "co_lost": 0, "missed": 0}
    for n, mix in enumerate(res["mixes"]):
        nv, co = mix["arms"].get("nvshare", {}), mix["arms"].get("colocate")
        worst = mix.get("worst_x_colocate")
        lines.append(f"| {n} | {len(mix['jobs'])} | {mix['factor']:.2f} | {nv.get('lost', '–')} | "
                     f"{nv.get('mem_bad', '–')} | {nv.get('overlaps', '–')} | "
                     f"{'–' if co is None else co['lost']} | "
                     f"{'–' if worst is None else f'{worst:.3f}'} |")
        totals["jobs"] += len(mix["jobs"])
        totals["lost"] += nv.get("lost", 0)
        totals["mem_bad"] += nv.get("mem_bad", 0)
        totals["overlaps"] += nv.get("overlaps") or 0
        totals["co_lost"] += co["lost"] if co else 0
        totals["missed"] += int(worst is not None and worst > 1.05)
    lines.append(f"\nauto_share {res['args']['auto_share']}. "
                 f"{len(res['mixes'])} mixes, {totals['jobs']} jobs: nvshare lost {totals['lost']}, "
                 f"memory not intact {totals['mem_bad']}, overlapping kernels {totals['overlaps']}; "
                 f"co-location lost {totals['co_lost']}; mixes whose worst job was slowed more than "
                 f"1.05x its co-located slowdown: {totals['missed']}.")
    res["totals"] = totals
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mixes", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arms", default="", help="more arms beside nvshare: serial,colocate")
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--max-seconds", type=float, default=8.0)
    ap.add_argument("--max-jobs", type=int, default=8)
    ap.add_argument("--memory-reserve-percent", type=int, metavar="PERCENT")
    ap.add_argument("--host-budget-gib", type=float, default=64.0,
                    help="at most this much of a mix's memory beyond the usable memory (host memory)")
    ap.add_argument("--exit-release-ms", default="0-2000", help="--smoke-cpu: the fake driver's delay")
    ap.add_argument("--uids", action="store_true", help="every other job as a uid of its own (root)")
    ap.add_argument("--uid-base", type=int, default=62000)
    ap.add_argument("--gpu-times", action="store_true", help="kernel times for the overlap count (GPU)")
    ap.add_argument("--auto-share", default="adaptive", choices=["adaptive", "turns"],
                    help="the nvshare arm's auto_share (turns: every job takes turns, no overlap allowed)")
    ap.add_argument("--smoke-cpu", action="store_true")
    args = ap.parse_args()
    extra = [a for a in args.arms.split(",") if a]
    if any(a not in ("serial", "colocate") for a in extra) or (args.uids and os.geteuid() != 0):
        ap.error("--arms takes serial and colocate; --uids needs root")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_burst()
    os.chmod(BURST, 0o755)
    soak = Soak(args, out)
    sigterm_interrupts()
    usable = soak.usable()
    try:
        ipm = soak.calibrate()
        for n in range(args.mixes):
            mix = draw_mix(random.Random(args.seed * 100003 + n), usable, int(args.host_budget_gib * 2**30),
                           args.min_seconds, args.max_seconds, args.max_jobs)
            mix["arms"] = {}
            for arm in [a for a in ("serial", "colocate") if a in extra] + ["nvshare"]:
                t = time.time()
                mix["arms"][arm] = soak.run_arm(n, mix, arm, ipm)
                r = mix["arms"][arm]
                log(f"mix {n} ({len(mix['jobs'])} jobs, {mix['factor']:.2f}x) {arm}: lost {r['lost']}, "
                    f"mem bad {r['mem_bad']}, overlaps {r['overlaps']} in {time.time() - t:.1f} s")
            slowdowns(mix)
            soak.results["mixes"].append(mix)
            (out / "results.json").write_text(json.dumps(soak.results, indent=1))
    except KeyboardInterrupt:
        log("interrupted: the table has what was measured")
    finally:
        text = table(soak.results)
        (out / "results.json").write_text(json.dumps(soak.results, indent=1))
        (out / "table.md").write_text(text)
        print(text)
        soak.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
