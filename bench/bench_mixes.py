"""Issue 27's mixed nodes: 3, 4 and 8 different jobs on one GPU, each job's slowdown per arm in one table.

Every job is tests/gpu/burst.c (bench_family.py's program, built into bench/build/burst), one of:
  compute   20 ms bursts back to back (a compute-bound training), --steps
  bursty    28 ms bursts, 43 ms host pauses (busy ~35 %: issue 27's bursty job), --steps
  mem       compute with --mem-gib GiB more device memory (two of them do not fit beside the others)
  probe     a 1 ms burst every 100 ms (an interactive srun at a prompt), a time window
  serve     requests arriving open-loop at exponential intervals (mean 30 ms, seeded), 3 ms of GPU
            work each, latency from arrival to result (burst --poisson-ms), a time window
Mixes:
  serve2    compute, serve (issue 27's serving beside a training: serve p99 <= 1.5 x alone, the
            training >= 0.95 of what it gets co-located)
  mix3      compute, bursty, probe
  mix4      compute, compute, bursty, serve
  mix4-mem  compute, bursty, mem, mem, probe (issue 27's node: co-location and MPS run out of memory)
  mix8      3 compute, 2 bursty, serve, 2 probes
  swap2     two mem jobs that do not fit together (issue 27's swap pair: --mem-gib 45 on an 80 GB GPU,
            76 on an H200, or 45 there with --memory-reserve-percent 46: an H100's usable memory);
            its completion (the arm's start to the last step of either) over the serial arm's is the
            swap-overlap figure (target <= 1.03). Measured from the start, not from the first step:
            a swap before any job's first step is part of what sharing costs
Arms: serial (each job alone, one after the other: every job's solo reference, and its completion
from the arm's start), colocate (no hook), mps (a private MPS control daemon), nvshare (libnvshare.so
and a real nvshare-scheduler, every setting default). Per job and arm: slowdown = its time from first
step to last over its solo time (compute, bursty, mem), or p50/p99 latency over solo p99 (probe,
serve); nvshare's target is slowdown <= 1.05 x colocate's, for a probe p99 within 1 ms of colocate's,
for serve p99 <= 1.5 x solo. A job that did not finish (oom, timeout) stays in the table.

--variant NAME=VALUE adds an arm "nvshare NAME=VALUE": the nvshare arm with that setting too, in the
same table beside the default (an A/B measured side by side in one run).

--uids runs job i as uid BASE+i (setpriv; the daemon registers each job with its uid): MPS then
serves one uid at a time, as at a site. Needs root; the scratch directory is made world-readable.

  python3 bench/bench_mixes.py --out DIR [--mixes mix3,mix4,...] [--arms serial,colocate,mps,nvshare]
                               [--seconds 4] [--mem-gib 40] [--uids [--uid-base 61000]] [--gpu-times]
                               [--smoke-cpu]
                               [--hook-env NAME=VALUE ...] [--variant NAME=VALUE ...]
                               [--memory-reserve-percent PERCENT]

DIR/results.json has every job's numbers; DIR/table.md the table; DIR/timeline_<mix>.svg which job ran
its steps when, one band per arm (bench_family's drawing). --smoke-cpu runs it on the fake driver of
tests/c (16 GiB; MPS skipped; --mem-gib 8 there); its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_family import BURST, SMOKE_UUID, build_burst, burst_env, svg  # noqa: E402
from gpu_bench import (Job, Mps, Scheduler, gpu_info, percentile, run_jobs,  # noqa: E402
                       sigterm_interrupts)

KINDS = {   # kind: (gpu ms per step, host ms, timed: a window of seconds rather than steps)
    "compute": (20.0, 0.0, False), "bursty": (28.0, 43.0, False), "mem": (20.0, 0.0, False),
    "probe": (1.0, 100.0, True), "serve": (3.0, 0.0, True)}
SERVE_MEAN_MS = 30.0
MIXES = {"serve2": ["compute", "serve"],
         "mix3": ["compute", "bursty", "probe"],
         "mix4": ["compute", "compute", "bursty", "serve"],
         "mix4-mem": ["compute", "bursty", "mem", "mem", "probe"],
         "mix8": ["compute", "compute", "compute", "bursty", "bursty", "serve", "probe", "probe"],
         "swap2": ["mem", "mem"]}
ARMS = ["serial", "colocate", "mps", "nvshare"]


def log(msg: str) -> None:
    print(f"bench_mixes: {msg}", flush=True)


class Mixes:
    def __init__(self, args: argparse.Namespace, out: Path):
        self.args, self.out, self.smoke = args, out, args.smoke_cpu
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="nvmixes-"))
        if args.uids:
            os.chmod(self.work, 0o755)
        self.results: dict = {"gpu": gpu_info(self.smoke), "args": vars(args), "mixes": {}}

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

    def cmd(self, kind: str, i: int) -> list[str]:
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
        if self.args.uids:
            uid = self.args.uid_base + i
            out = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *out]
        return out

    def nvshare_envs(self, sched: Scheduler, base: dict, n: int) -> list[dict]:
        if not self.args.uids:
            return [sched.job_env(base)[1] for _ in range(n)]
        return [sched.job_env(base, uid=self.args.uid_base + i, name="mix")[1] for i in range(n)]

    def run_arm(self, mix: str, arm: str) -> dict:
        kinds = MIXES[mix]
        cmds = [self.cmd(k, i) for i, k in enumerate(kinds)]
        base, tag = self.base_env(), f"{mix}-{arm}".replace(" ", "-").replace("=", "-")
        timeout = 30 + 6 * self.args.seconds * (len(kinds) if arm == "serial" else 2)
        if arm == "serial":
            jobs = [Job(f"{tag}-{i}", c, base, self.logs) for i, c in enumerate(cmds)]
            return summarize(kinds, run_jobs(jobs, together=False, timeout=timeout))
        sched = mps = None
        try:
            if arm == "colocate":
                envs = [base] * len(cmds)
            elif arm == "mps":
                if self.smoke:
                    return {"status": "skipped", "error": "no MPS without a GPU (smoke run)"}
                mps = Mps(self.work / f"mps-{mix}")
                if self.args.uids:
                    for d in ("mps-pipe", "mps-log"):
                        os.chmod(self.work / f"mps-{mix}" / d, 0o777)
                envs = [mps.client_env(base) for _ in cmds]
            else:
                gpus = [{"uuid": SMOKE_UUID, "memory": "16G"}] if self.smoke else None
                reserve = self.args.memory_reserve_percent
                sched = Scheduler("auto", self.work / tag, self.logs / f"{tag}-scheduler.log", gpus,
                                  None if reserve is None else {"memory_reserve_percent": reserve})
                if self.args.uids:
                    os.chmod(self.work / tag, 0o755)
                hook_env = dict(kv.split("=", 1) for kv in self.args.hook_env)
                if arm != "nvshare":   # a variant: "nvshare NAME=VALUE"
                    hook_env.update([arm.split(" ", 1)[1].split("=", 1)])
                envs = [dict(e, **hook_env) for e in self.nvshare_envs(sched, base, len(cmds))]
            jobs = [Job(f"{tag}-{i}", c, e, self.logs)
                    for i, (c, e) in enumerate(zip(cmds, envs, strict=True))]
            return summarize(kinds, run_jobs(jobs, together=True, timeout=timeout))
        finally:
            if sched is not None:
                sched.stop()
            if mps is not None:
                mps.stop()

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def summarize(kinds: list[str], jobs: list[dict]) -> dict:
    t0 = min(j["proc_start"] for j in jobs)
    out = []
    for kind, j in zip(kinds, jobs, strict=True):
        e: dict = {"kind": kind, "status": j["status"]}
        if j["status"] == "ok" and j.get("times"):
            lat = j["latencies_ms"]
            e.update(train_s=j["times"][-1] - j["step_starts"][0], done_s=j["times"][-1] - t0,
                     steps=len(j["times"]), p50_ms=percentile(lat, 50), p99_ms=percentile(lat, 99),
                     mean_ms=statistics.fmean(lat),
                     spans=[[round(a - t0, 4), round(b - t0, 4)]
                            for a, b in zip(j["step_starts"], j["times"], strict=True)])
        else:
            e["error"] = j.get("error", "")[-400:]
        out.append(e)
    ok = [j for j in jobs if j["status"] == "ok" and j.get("times")]
    done = max(j["times"][-1] for j in ok) - t0 if ok else None
    return {"status": "ok" if all(e["status"] == "ok" for e in out) else "incomplete", "jobs": out,
            "makespan": max(j["proc_end"] for j in jobs) - t0, "done_s": done}


def slowdowns(res: dict) -> None:
    """Each job's slowdown against its solo run (the serial arm), per arm, and the targets."""
    for arms in res["mixes"].values():
        serial = arms.get("serial", {})
        solo = serial.get("jobs", [])
        serial_done = serial.get("done_s") if serial.get("status") == "ok" else None
        for arm, r in arms.items():
            if serial_done and arm != "serial" and r.get("status") == "ok" and r.get("done_s"):
                r["done_x_serial"] = r["done_s"] / serial_done   # all done, from the start, over serial
            for i, e in enumerate(r.get("jobs", [])):
                ref = solo[i] if i < len(solo) and solo[i]["status"] == "ok" else None
                if e["status"] != "ok" or ref is None:
                    continue
                if KINDS[e["kind"]][2]:
                    e["x_solo_p99"] = e["p99_ms"] / ref["p99_ms"]
                elif arm == "serial":
                    e["x_solo"] = e["done_s"] / ref["train_s"]   # waiting for the jobs before it
                else:
                    e["x_solo"] = e["train_s"] / ref["train_s"]
        nv, co = arms.get("nvshare", {}).get("jobs", []), arms.get("colocate", {}).get("jobs", [])
        for i, e in enumerate(nv):
            c = co[i] if i < len(co) and co[i]["status"] == "ok" else None
            if e["status"] != "ok":
                e["target"] = "missed (did not finish)"
            elif e["kind"] == "serve":
                e["target"] = "– (no solo run)" if "x_solo_p99" not in e \
                    else "met" if e["x_solo_p99"] <= 1.5 else "missed"
            elif "colocate" not in arms:
                e["target"] = "– (no co-location arm)"
            elif c is None:
                e["target"] = "met (co-location did not finish)"
            elif e["kind"] == "probe":
                e["target"] = "met" if e["p99_ms"] <= c["p99_ms"] + 1.0 else "missed"
            else:
                e["target"] = "met" if e["x_solo"] <= 1.05 * c["x_solo"] else "missed"


def cell(e: dict | None) -> str:
    if e is None:
        return "–"
    if e["status"] != "ok":
        return e["status"]
    if KINDS[e["kind"]][2]:
        ratio = f" ({e['x_solo_p99']:.2f}x)" if "x_solo_p99" in e else ""
        return f"p50 {e['p50_ms']:.1f} / p99 {e['p99_ms']:.1f} ms{ratio}"
    return f"{e['x_solo']:.3f}" if "x_solo" in e else f"{e['train_s']:.2f} s"


def arm_names(arms: list[str], variants: list[str]) -> list[str]:
    """The arms in ARMS' order, then one "nvshare NAME=VALUE" per --variant."""
    return [a for a in ARMS if a in arms] + [f"nvshare {v}" for v in variants]


def table(res: dict) -> str:
    names = arm_names(ARMS, res["args"].get("variant") or [])
    lines = ["| mix | job | kind | " + " | ".join(names) + " | nvshare target |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for mix, arms in res["mixes"].items():
        for i, kind in enumerate(MIXES[mix]):
            row = [arms.get(a, {}).get("jobs", []) for a in names]
            cells = [cell(r[i] if i < len(r) else None) for r in row]
            nv = arms.get("nvshare", {}).get("jobs", [])
            target = nv[i].get("target", "") if i < len(nv) else ""
            lines.append(f"| {mix} | {i} | {kind} | " + " | ".join(cells) + f" | {target} |")
        spans = [arms.get(a, {}).get("done_x_serial") for a in names]
        if any(x is not None for x in spans):
            lines.append(f"| {mix} | all | all done / serial | " + " | ".join(
                "–" if x is None else f"{x:.3f}" for x in spans) + " | |")
    return "\n".join(lines) + ("\n\nCompute, bursty, mem: time from first step to last over the job's solo "
                               "time (serial: its completion from the arm's start). Probe, serve: latency "
                               "percentiles, p99 over solo p99. All done / serial: the arm's start to "
                               "the last step of any job, over the same in the serial arm (the jobs one "
                               "after the other).\n")


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--seconds", type=float, default=4.0, help="steps of one job alone, in seconds")
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
                         "logs/*.out: whose kernels ran beside a slow request")
    ap.add_argument("--smoke-cpu", action="store_true", help="fake driver, real hook and daemon, no MPS")
    args = ap.parse_args()
    bad = [m for m in args.mixes.split(",") if m not in MIXES] + \
          [a for a in args.arms.split(",") if a not in ARMS] + [v for v in args.variant if "=" not in v]
    if bad or args.seconds <= 0 or (args.uids and os.geteuid() != 0):
        ap.error(f"unknown mix or arm: {', '.join(bad)}" if bad else
                 "--seconds must be above 0" if args.seconds <= 0 else "--uids needs root")
    if args.mem_gib is None:   # half the GPU: two of them do not fit beside the others (40 on an H100)
        args.mem_gib = 8.0 if args.smoke_cpu else round(gpu_info(False)["memory"] / 2**30 / 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_burst()
    if args.uids:
        os.chmod(BURST, 0o755)
    bench = Mixes(args, out)
    sigterm_interrupts()     # `timeout`: the table of what was measured is still written
    try:
        bench.calibrate()
        for mix in args.mixes.split(","):
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
        text = table(bench.results)
        (out / "table.md").write_text(text)
        print(text)
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
