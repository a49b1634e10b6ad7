"""GPU benchmark harness (issue 5): workloads x arms, side by side in one run on the GPU machine.

Arms: serial (one job then the other, no hook), colocate (both at once, no hook), mps (both at once
under NVIDIA MPS), nvshare-auto / nvshare-concurrent / nvshare-serial (both at once under the hook and a
real nvshare-scheduler with NVML inventory). Workloads: W1 compute-bound, W2 bursty (GPU busy ~30 %),
W3 two jobs of ~60 % of GPU memory each. Also solo: one job with and without the hook.

  python3 bench/gpu_bench.py --out DIR [--workloads W1,W2] [--arms ...] [--quick]

Writes DIR/results.json and DIR/*.png; `python3 bench/gpu_bench.py --report DIR` regenerates the GPU
section of docs/benchmarks.md from DIR/results.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "tests" / "gpu" / "train.py"
sys.path.insert(0, str(REPO))

WORKLOADS = {
    # name: (train.py args, description)
    "W1": (["--steps", "300", "--width", "4096", "--depth", "6", "--batch", "4096"],
           "compute-bound MLP training, GPU saturated"),
    "W2": (["--steps", "300", "--width", "4096", "--depth", "6", "--batch", "1024", "--sleep-ms", "40"],
           "bursty: host think time between steps (notebook / slow loader)"),
    "W3": (["--steps", "150", "--width", "4096", "--depth", "6", "--batch", "2048", "--mem-gb", "PLACEHOLDER"],
           "two jobs of about 60 % of GPU memory each"),
}
ARMS = ["serial", "colocate", "mps", "nvshare-auto", "nvshare-concurrent", "nvshare-serial"]


def gpu_info() -> dict:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(h)
    info = {"name": name.decode() if isinstance(name, bytes) else name,
            "memory": pynvml.nvmlDeviceGetMemoryInfo(h).total,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "uuid": pynvml.nvmlDeviceGetUUID(h)}
    info = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in info.items()}
    return info


class UtilSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, int]] = []
        self.stop_flag = threading.Event()

    def run(self):
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self.stop_flag.is_set():
            self.samples.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            time.sleep(0.1)

    def mean(self, t0: float, t1: float) -> float:
        vals = [u for t, u in self.samples if t0 <= t <= t1]
        return sum(vals) / len(vals) if vals else 0.0


def run_jobs(cmds: list[list[str]], envs: list[dict], together: bool, timeout: float = 900) -> list[dict]:
    """Run the jobs together or one after another; returns each job's result (or its error)."""
    results: list[dict] = []

    def launch(cmd, env):
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return p, t0

    def collect(p, t0):
        out, err = p.communicate(timeout=timeout)
        t1 = time.time()
        if p.returncode != 0:
            oom = "out of memory" in err.lower() or "OutOfMemory" in err
            return {"ok": False, "oom": oom, "proc_start": t0, "proc_end": t1, "error": err[-1500:]}
        res = json.loads(out.strip().splitlines()[-1])
        res.update(ok=True, proc_start=t0, proc_end=t1)
        return res

    if together:
        procs = [launch(c, e) for c, e in zip(cmds, envs)]
        results = [collect(p, t0) for p, t0 in procs]
    else:
        for c, e in zip(cmds, envs):
            results.append(collect(*launch(c, e)))
    return results


def summarize(results: list[dict], sampler: UtilSampler) -> dict:
    t0 = min(r["proc_start"] for r in results)
    t1 = max(r["proc_end"] for r in results)
    out = {"makespan": t1 - t0, "ok": all(r["ok"] for r in results),
           "oom": any(r.get("oom") for r in results), "gpu_util": sampler.mean(t0, t1)}
    if out["ok"]:
        first = min(r["times"][0] for r in results)
        last = max(r["times"][-1] for r in results)
        out["train_phase"] = last - first
        out["job_steps_per_s"] = [len(r["times"]) / (r["times"][-1] - r["times"][0]) for r in results]
        out["timeline"] = [{"pid": r["pid"], "times": [t - t0 for t in r["times"]]} for r in results]
        out["losses_last"] = [r["losses"][-1] for r in results]
    else:
        out["errors"] = [r.get("error", "")[-400:] for r in results if not r["ok"]]
    return out


class Nvshare:
    """A real nvshare-scheduler (NVML inventory) in a temp dir."""

    def __init__(self, mode: str, workdir: Path):
        import yaml
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(workdir / "s.sock")
        cfg = {"socket": self.socket, "state_dir": str(workdir / "state"), "scheduling_mode": mode,
               "log_level": "info"}
        (workdir / "nvshare.yaml").write_text(yaml.safe_dump(cfg))
        env = dict(os.environ, NVSHARE_CONFIG=str(workdir / "nvshare.yaml"))
        self.log = open(workdir / "scheduler.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "nvshare_slurm.daemon"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=str(REPO))
        for _ in range(200):
            if os.path.exists(self.socket):
                break
            time.sleep(0.05)
        from nvshare_slurm.client import Client
        self.client = Client(self.socket)
        self.job = 500

    def job_env(self, base: dict) -> dict:
        from nvshare_slurm import libnvshare_path
        self.job += 1
        place = self.client.register_job(self.job, uid=0, gid=0, slots=1, name=f"bench{self.job}")
        env = dict(base)
        env.update(LD_PRELOAD=str(libnvshare_path()), NVSHARE_SOCKET=self.socket,
                   NVSHARE_JOB_ID=str(self.job), NVSHARE_MANAGED_GPUS=",".join(place["gpu_uuid"]),
                   CUDA_VISIBLE_DEVICES=",".join(place["gpu_uuid"]), SLURM_STEP_ID="0")
        return env

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


class Mps:
    def __init__(self, workdir: Path):
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(workdir / "mps-pipe"),
                        CUDA_MPS_LOG_DIRECTORY=str(workdir / "mps-log"))
        for d in ("mps-pipe", "mps-log"):
            (workdir / d).mkdir(exist_ok=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True)
        time.sleep(1)

    def stop(self):
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env)
        time.sleep(2)


def run_arm(arm: str, args: list[str], sampler: UtilSampler, workdir: Path) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "LD_PRELOAD"))}
    cmd = [sys.executable, str(TRAIN), *args]
    if arm == "serial":
        return summarize(run_jobs([cmd, cmd], [base, base], together=False), sampler)
    if arm == "colocate":
        return summarize(run_jobs([cmd, cmd], [base, base], together=True), sampler)
    if arm == "mps":
        mps = Mps(workdir)
        try:
            env = dict(base, **{k: v for k, v in mps.env.items() if k.startswith("CUDA_MPS")})
            return summarize(run_jobs([cmd, cmd], [env, env], together=True), sampler)
        finally:
            mps.stop()
    mode = arm.split("-", 1)[1]
    sched = Nvshare(mode, workdir / arm)
    try:
        res = summarize(run_jobs([cmd, cmd], [sched.job_env(base), sched.job_env(base)], together=True), sampler)
    finally:
        sched.stop()
    res["scheduler_log_tail"] = (workdir / arm / "scheduler.log").read_text(errors="replace")[-3000:]
    return res


def solo(args: list[str], sampler: UtilSampler, workdir: Path) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "LD_PRELOAD"))}
    cmd = [sys.executable, str(TRAIN), *args]
    plain = summarize(run_jobs([cmd], [base], together=False), sampler)
    sched = Nvshare("auto", workdir / "solo")
    try:
        hooked = summarize(run_jobs([cmd], [sched.job_env(base)], together=False), sampler)
    finally:
        sched.stop()
    return {"plain": plain, "hooked": hooked,
            "ratio_train": hooked.get("train_phase", 0) / max(plain.get("train_phase", 1e-9), 1e-9),
            "ratio_makespan": hooked["makespan"] / plain["makespan"],
            "losses_identical": plain.get("losses_last") == hooked.get("losses_last")}


def plots(results: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for wname, arms in results["workloads"].items():
        names = [a for a in arms]
        spans = [arms[a]["makespan"] if arms[a]["ok"] else 0 for a in names]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        bars = ax.bar(names, spans, color=["#888" if not arms[a]["ok"] else "#3a7" for a in names])
        for bar, a in zip(bars, names):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                    "OOM" if arms[a].get("oom") else ("fail" if not arms[a]["ok"] else f"{arms[a]['makespan']:.1f}s"),
                    ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("makespan (s)")
        ax.set_title(f"{wname}: {WORKLOADS[wname][1]}")
        plt.xticks(rotation=20, fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"makespan_{wname}.png", dpi=110)
        plt.close(fig)
        fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 * len(names) + 1), sharex=True)
        for ax, a in zip(axes, names):
            for j, tl in enumerate(arms[a].get("timeline", [])):
                ax.plot(tl["times"], [j] * len(tl["times"]), "|", markersize=8)
            ax.set_yticks([0, 1])
            ax.set_ylabel(a, rotation=0, ha="right", fontsize=8)
        axes[-1].set_xlabel("seconds since the arm started (one tick per training step of job 0 / job 1)")
        fig.suptitle(f"{wname}: which job ran when")
        fig.tight_layout()
        fig.savefig(out / f"timeline_{wname}.png", dpi=110)
        plt.close(fig)


def report(out: Path) -> str:
    res = json.loads((out / "results.json").read_text())
    lines = [f"## GPU ({res['gpu']['name']}, driver {res['gpu']['driver']}, {res['date']})", "",
             "Each arm runs the same two jobs; ratios are makespan over the serial arm measured in the same run.",
             "Training phase = first step to last step; makespan = first process start to last exit.", ""]
    for wname, arms in res["workloads"].items():
        ser = arms.get("serial", {})
        lines += [f"### {wname}: {WORKLOADS[wname][1]}", "",
                  "| arm | makespan s | vs serial | train phase s | vs serial | GPU util % | steps/s per job |",
                  "|---|---|---|---|---|---|---|"]
        for a, r in arms.items():
            if not r["ok"]:
                lines.append(f"| {a} | {'OOM' if r.get('oom') else 'failed'} | | | | | |")
                continue
            rel = r["makespan"] / ser["makespan"] if ser.get("ok") else float("nan")
            relt = r["train_phase"] / ser["train_phase"] if ser.get("ok") else float("nan")
            sps = ", ".join(f"{x:.1f}" for x in r["job_steps_per_s"])
            lines.append(f"| {a} | {r['makespan']:.1f} | {rel:.3f} | {r['train_phase']:.1f} | {relt:.3f} | "
                         f"{r['gpu_util']:.0f} | {sps} |")
        lines += ["", f"![makespan {wname}](bench-results/makespan_{wname}.png)",
                  f"![timeline {wname}](bench-results/timeline_{wname}.png)", ""]
    if "solo" in res:
        for wname, s in res["solo"].items():
            lines.append(f"Solo {wname} under the hook vs no hook: training phase x{s['ratio_train']:.4f}, "
                         f"makespan x{s['ratio_makespan']:.4f}, final loss identical: {s['losses_identical']}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--solo", default="W1")
    ap.add_argument("--report", action="store_true", help="only print the markdown for --out")
    ap.add_argument("--steps-scale", type=float, default=1.0)
    args = ap.parse_args()
    out = Path(args.out)
    if args.report:
        print(report(out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    info = gpu_info()
    sampler = UtilSampler()
    sampler.start()
    work = Path(tempfile.mkdtemp(prefix="nvbench-"))
    results = {"gpu": info, "date": datetime.date.today().isoformat(), "workloads": {}, "solo": {}}

    def wl_args(w):
        a = list(WORKLOADS[w][0])
        if "PLACEHOLDER" in a:
            a[a.index("PLACEHOLDER")] = f"{0.6 * info['memory'] / (1 << 30):.1f}"
        i = a.index("--steps")
        a[i + 1] = str(max(10, int(int(a[i + 1]) * args.steps_scale)))
        return a

    for w in filter(None, args.solo.split(",")):
        results["solo"][w] = solo(wl_args(w), sampler, work)
        print(f"solo {w}: {results['solo'][w]['ratio_train']:.4f}", flush=True)
    for w in args.workloads.split(","):
        results["workloads"][w] = {}
        for arm in args.arms.split(","):
            r = run_arm(arm, wl_args(w), sampler, work)
            results["workloads"][w][arm] = r
            print(f"{w} {arm}: ok={r['ok']} makespan={r['makespan']:.2f} "
                  f"train={r.get('train_phase', 0):.2f} util={r['gpu_util']:.0f}", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    sampler.stop_flag.set()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plots(results, out)
    print(report(out))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
