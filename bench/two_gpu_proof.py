"""Issue 15's proof: DDP jobs sharing the same GPUs through a one-node Slurm (run by
scripts/gpu-two-gpu-proof.sh, which finds Slurm and the Python environment first).

  python3 bench/two_gpu_proof.py OUT [--gpus N] [--fake] [--steps S] [--width W] [--batch B]
                                 [--depth D] [--mode concurrent|auto] [--switch-s T]

Brings up munged, an nvshare-scheduler (NVML inventory, debug log), slurmctld and slurmd in
/tmp/nvshare-2gpu, then runs, all through sbatch:
  (a) one N-GPU DDP training alone (`--gres=nvshare:N`, torchrun, NCCL, one process per GPU), and,
      with N >= 2, one single-GPU training alone (the baseline of part c);
  (b) two N-GPU DDP trainings submitted together: both complete, their losses are identical to the
      one alone, the span of their training phases is at most 1.05x two alone back to back, and
      the scheduler's log shows the jobs taking (gang) turns;
  (c) with N >= 2: one N-GPU DDP training beside two single-GPU trainings, one on each of two
      GPUs: all complete, each one's time against alone.
Every job runs with NCCL_NVLS_ENABLE=0 (and NVLink multicast off in PyTorch and NVSHMEM).
--gpus 1 is the reduced mode for a one-GPU machine: world size 1, two jobs share the GPU, part (c)
and the gang checks are skipped. --fake runs the same orchestration on the fake CUDA driver with N
fake GPUs and tests/slurm/fake_ddp.py as the payload (CI: tests/slurm/test_two_gpu_proof.py).

Writes under OUT (at most 8 files, as the device machine returns): result.json (every check, every
job's numbers, date, device), results.md (the same as Markdown tables), timeline.txt (who held
which GPU when, from the scheduler's log) and logs.tar.gz (slurm.conf, nvshare.yaml, the daemons'
logs, each job's output and JSON). Exit status 0 when every check passed.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lock_timeline import gang_together, overlaps, switches, timeline_text, turns_from_log  # noqa: E402
from slurm_node import Checks, OneNodeSlurm, tail, write_logs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASE = Path("/tmp/nvshare-2gpu")    # short: munged's socket path must fit a sockaddr_un
SPAN_LIMIT = 1.05                   # two together vs two alone back to back (the bound)
# NVLink multicast stays off in every job (the machine's rule: it can take shared GPUs down).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
FAKE_UUID = "GPU-fa4e0000-0000-0000-0000-00000000000{}"


def say(text: str) -> None:
    print(f"two-gpu-proof: {text}", flush=True)


# ---- the GPUs ----------------------------------------------------------------------------------

def inventory(args) -> list[dict]:
    """[{index, uuid, name, memory_mib}] of the GPUs the scheduler will manage."""
    if args.fake:
        return [{"index": i, "uuid": FAKE_UUID.format(i), "name": "fake", "memory_mib": 16384}
                for i in range(args.gpus)]
    import pynvml
    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, uuid = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)
            gpus.append({"index": i, "uuid": uuid if isinstance(uuid, str) else uuid.decode(),
                         "name": name if isinstance(name, str) else name.decode(),
                         "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total >> 20})
        return gpus
    finally:
        pynvml.nvmlShutdown()


# ---- the cluster -------------------------------------------------------------------------------

# ---- the jobs ----------------------------------------------------------------------------------

def job_script(args) -> Path:
    """The batch script every job runs: `job.sh NPROC` trains on NPROC GPUs, one process each,
    and writes its JSON to result-<job id>.json in the submit directory."""
    if args.fake:
        payload = (f"export LD_LIBRARY_PATH={REPO}/tests/c/build\n"
                   f"{sys.executable} {REPO}/tests/slurm/fake_ddp.py --nproc $1 "
                   f"--rounds {args.steps} --kernel-us {args.fake_kernel_us} "
                   f"--nvtest {REPO}/tests/c/build/nvtest --out result-$SLURM_JOB_ID.json")
    else:
        payload = (f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node=$1 "
                   f"{REPO}/tests/gpu/ddp_train.py --steps {args.steps} --width {args.width} "
                   f"--depth {args.depth} --batch {args.batch} --out result-$SLURM_JOB_ID.json")
    exports = " ".join(f"{k}={v}" for k, v in NO_MULTICAST.items())
    path = BASE / "jobs" / "job.sh"
    path.write_text(f"""#!/bin/sh
export {exports} PYTHONUNBUFFERED=1
echo "proof-env SLURM_JOB_ID=$SLURM_JOB_ID NPROC=$1"
echo "proof-env CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES:-}}"
echo "proof-env LD_PRELOAD=${{LD_PRELOAD:-}}"
echo "proof-env NCCL_NVLS_ENABLE=${{NCCL_NVLS_ENABLE:-}}"
{payload}
rc=$?
echo "proof-exit $rc"
exit $rc
""")
    path.chmod(0o755)
    return path


class Jobs:
    def __init__(self, cluster: OneNodeSlurm, script: Path, timeout: float):
        self.c, self.script, self.timeout = cluster, script, timeout
        self.records: dict[str, dict] = {}

    def submit(self, part: str, name: str, nproc: int) -> str:
        res = self.c.run("sbatch", "--parsable", f"--gres=nvshare:{nproc}", "-J", name,
                         "-o", "slurm-%j.out", str(self.script), str(nproc))
        if res.returncode != 0:
            raise RuntimeError(f"sbatch {name} failed: {res.stderr.strip()}")
        job = res.stdout.strip().split(";")[0]
        self.records[job] = {"job": job, "part": part, "name": name, "nproc": nproc,
                             "submitted": time.time()}
        say(f"submitted {name}: job {job} (--gres=nvshare:{nproc})")
        return job

    def wait(self, *jobs: str) -> None:
        deadline = time.monotonic() + self.timeout
        pending = set(jobs)
        while pending and time.monotonic() < deadline:
            for job in list(pending):
                if self.c.job_state(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                 "COMPLETING", None):
                    pending.discard(job)
            time.sleep(0.5)
        for job in pending:
            say(f"job {job} still running after {self.timeout:.0f} s: cancelled")
            self.c.run("scancel", job)
        for job in jobs:
            self.collect(job)

    def wait_registered(self, job: str, timeout: float = 60) -> None:
        """Until the job's prolog registered it with the scheduler (it is placed), so that the next
        job's placement counts it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if f"job {job}: registered" in tail(self.c.sched_log, 10**9):
                return
            if self.c.job_state(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
                return
            time.sleep(0.2)
        say(f"job {job} was not registered within {timeout:.0f} s; going on")

    def collect(self, job: str) -> dict:
        rec, st = self.records[job], self.c.job_state(job)
        rec.update(state=st.get("JobState", "?"), exit=st.get("ExitCode", "?"))
        text = tail(self.c.jobs / f"slurm-{job}.out", 10**7)
        env = dict(re.findall(r"\b(\w+)=(\S*)", "\n".join(
            line for line in text.splitlines() if line.startswith("proof-env "))))
        rec["env"] = {k: env.get(k, "") for k in ("CUDA_VISIBLE_DEVICES", "LD_PRELOAD",
                                                  "NCCL_NVLS_ENABLE")}
        rec["output_tail"] = text[-1500:]
        result = self.c.jobs / f"result-{job}.json"
        rec["result"] = json.loads(result.read_text()) if result.exists() else None
        return rec


# ---- the proof ---------------------------------------------------------------------------------

def seconds(rec: dict) -> float | None:
    res = rec.get("result")
    return res["train_seconds"] if res else None


def check_job(check: Checks, part: str, rec: dict, uuids: list[str], digest: str | None = None,
              fake: bool = False) -> None:
    """What every job must show: completed, under the hook, on distinct managed GPUs, multicast
    off, all ranks in step, and (given one) the losses of its run alone."""
    what = f"{rec['name']} (job {rec['job']})"
    check(part, f"{what} completed with exit 0", rec["state"] == "COMPLETED" and rec["exit"] == "0:0",
          f"{rec['state']} {rec['exit']}" + ("" if rec["state"] == "COMPLETED" else
                                            "\n" + rec["output_tail"][-600:]))
    visible = [u for u in rec["env"]["CUDA_VISIBLE_DEVICES"].split(",") if u]
    check(part, f"{what} was given {rec['nproc']} distinct managed GPU(s)",
          len(set(visible)) == len(visible) == rec["nproc"] and set(visible) <= set(uuids),
          ",".join(visible) or "CUDA_VISIBLE_DEVICES unset")
    check(part, f"{what} ran under the hook", "libnvshare.so" in rec["env"]["LD_PRELOAD"],
          rec["env"]["LD_PRELOAD"] or "LD_PRELOAD unset")
    res = rec.get("result") or {}
    check(part, f"{what} had NCCL_NVLS_ENABLE=0", rec["env"]["NCCL_NVLS_ENABLE"] == "0"
          and res.get("nccl_nvls_enable") == "0",
          f"job {rec['env']['NCCL_NVLS_ENABLE'] or 'unset'}, training {res.get('nccl_nvls_enable')}")
    ok = res.get("world") == rec["nproc"] and len(set(res.get("checksums", [None, 1]))) == 1
    check(part, f"{what} trained with world size {rec['nproc']}, ranks in step", ok,
          f"world {res.get('world')}, {len(res.get('losses', []))} steps in "
          f"{res.get('train_seconds', 0):.2f} s, loss digest {res.get('loss_digest')}"
          + ("" if fake else f", on {', '.join(res.get('gpus', []))}"))
    if digest is not None:
        check(part, f"{what}: losses identical to alone", res.get("loss_digest") == digest,
              f"{res.get('loss_digest')} vs {digest}")


def prove(args, cluster: OneNodeSlurm, gpus: list[dict]) -> dict:
    n = args.gpus
    uuids = [g["uuid"] for g in gpus]
    uuid_index = {g["uuid"]: g["index"] for g in gpus}
    jobs = Jobs(cluster, job_script(args), args.job_timeout)
    check = Checks()
    parts: dict[str, dict] = {}

    say(f"(a) one {n}-GPU DDP training alone")
    ddp_alone = jobs.submit("a", "ddp-alone", n)
    jobs.wait(ddp_alone)
    a = jobs.records[ddp_alone]
    check_job(check, "a", a, uuids, fake=args.fake)
    alone_s, digest = seconds(a), (a.get("result") or {}).get("loss_digest")
    parts["a"] = {"job": ddp_alone, "train_seconds": alone_s, "loss_digest": digest}
    single_s = single_digest = None
    if n >= 2:
        single_alone = jobs.submit("a", "single-alone", 1)
        jobs.wait(single_alone)
        s = jobs.records[single_alone]
        check_job(check, "a", s, uuids, fake=args.fake)
        single_s, single_digest = seconds(s), (s.get("result") or {}).get("loss_digest")
        parts["a"]["single"] = {"job": single_alone, "train_seconds": single_s,
                                "loss_digest": single_digest}

    say(f"(b) two {n}-GPU DDP trainings submitted together")
    pair = [jobs.submit("b", "ddp-1", n), jobs.submit("b", "ddp-2", n)]
    jobs.wait(*pair)
    for job in pair:
        check_job(check, "b", jobs.records[job], uuids, digest, fake=args.fake)
    results = [jobs.records[j].get("result") for j in pair]
    part_b = {"jobs": pair, "train_seconds": [seconds(jobs.records[j]) for j in pair]}
    if all(results) and alone_s:
        t0 = min(r["start"] for r in results)
        span = max(r["end"] for r in results) - t0
        limit = SPAN_LIMIT * 2 * alone_s
        part_b.update(span_seconds=span, alone_back_to_back_seconds=2 * alone_s,
                      span_ratio=span / (2 * alone_s))
        check("b", f"training-phase span <= {SPAN_LIMIT}x two alone back to back", span <= limit,
              f"{span:.2f} s vs 2 x {alone_s:.2f} s = {2 * alone_s:.2f} s "
              f"({span / (2 * alone_s):.3f}x)")
        check("b", "the two trainings overlapped in time (they shared, not queued in Slurm)",
              min(r["end"] for r in results) > max(r["start"] for r in results),
              "training phases " + ", ".join(f"{r['start'] - t0:.1f}..{r['end'] - t0:.1f} s"
                                             for r in results))
    else:
        check("b", f"training-phase span <= {SPAN_LIMIT}x two alone back to back", False,
              "a training wrote no result")
    log = tail(cluster.sched_log, 10**9)
    turns = turns_from_log(log, uuid_index)
    pair_turns = [t for t in turns if t["job"] in pair]
    gpus_b = sorted({t["gpu"] for t in pair_turns})
    crossed = overlaps(turns, set(pair))
    check("b", "the jobs' turns never overlapped on a GPU", pair_turns and crossed == 0,
          f"{crossed} overlaps in {len(pair_turns)} turns")
    hand = {g: switches(turns, set(pair), g) for g in gpus_b}
    check("b", "the jobs took turns", hand and min(hand.values()) >= 2,
          ", ".join(f"GPU {g}: {k} hand-overs" for g, k in hand.items()) or "no turns")
    # A gang's holder that did not drain within about a turn of DROP_LOCK (its collective waited
    # for a peer the turn's end shut out): each costs that long. Counted to explain a slow span.
    stuck = {j: len(re.findall(rf"job {j} step \S+ pid \d+: not released .* taken as a stuck drain",
                               log)) for j in pair}
    part_b.update(turns=len(pair_turns), hand_overs=hand, stuck_drains=stuck)
    print(f"  (b) {len(pair_turns)} turns; stuck drains: "
          + ", ".join(f"job {j} {k}" for j, k in stuck.items()), flush=True)
    if n >= 2:
        for job in pair:
            check("b", f"job {job}: the scheduler made it a gang",
                  re.search(rf"job {job}: a gang on GPUs \d+(,\d+)+", log), "")
            together = gang_together(turns, job, gpus_b)
            check("b", f"job {job}: gang turns, holding all its GPUs together", together >= 0.9,
                  f"it held GPUs {','.join(map(str, gpus_b))} all at once for "
                  f"{together * 100:.0f} % of its time on any one of them (at least 90 %)")
            part_b[f"gang_share_{job}"] = together
    else:
        check.skip("b", "gang turns", "one GPU: single-GPU jobs take plain turns")
    parts["b"] = part_b

    if n >= 2:
        say(f"(c) one {n}-GPU DDP training beside two single-GPU trainings")
        # The singles first: on idle GPUs the second is placed beside the first (least loaded
        # first counts jobs once memory is equal), the DDP job then spans both. Beside a DDP job
        # whose ranks hold unequal memory both singles could land on the emptier GPU.
        one = jobs.submit("c", "single-1", 1)
        jobs.wait_registered(one)
        two = jobs.submit("c", "single-2", 1)
        jobs.wait_registered(two)
        ddp = jobs.submit("c", "ddp-mixed", n)
        jobs.wait(ddp, one, two)
        check_job(check, "c", jobs.records[ddp], uuids, digest, fake=args.fake)
        for job in (one, two):
            check_job(check, "c", jobs.records[job], uuids, single_digest, fake=args.fake)
        trio = [r for r in (jobs.records[j].get("result") for j in (ddp, one, two)) if r]
        t0 = min((r["start"] for r in trio), default=0.0)
        check("c", "the three trainings ran at the same time", len(trio) == 3
              and max(r["start"] for r in trio) < min(r["end"] for r in trio),
              "training phases " + ", ".join(f"{r['start'] - t0:.1f}..{r['end'] - t0:.1f} s"
                                             for r in trio))
        where = [jobs.records[j]["env"]["CUDA_VISIBLE_DEVICES"] for j in (one, two)]
        check("c", "the single-GPU trainings ran one on each GPU", where[0] and where[1]
              and where[0] != where[1],
              " and ".join(f"GPU {uuid_index.get(u, '?')}" for u in where))
        rows = []
        for job, base in ((ddp, alone_s), (one, single_s), (two, single_s)):
            t = seconds(jobs.records[job])
            rows.append({"job": job, "name": jobs.records[job]["name"], "train_seconds": t,
                         "alone_seconds": base, "ratio": t / base if t and base else None})
        parts["c"] = {"jobs": rows}
        print("  (c) each job against alone: " + "; ".join(
            f"{r['name']} {r['train_seconds'] or 0:.2f} s vs {r['alone_seconds'] or 0:.2f} s"
            + (f" ({r['ratio']:.2f}x)" if r["ratio"] else "") for r in rows), flush=True)
    else:
        check.skip("c", "a DDP job beside two single-GPU jobs", "needs two GPUs")

    names = {j: r["name"] for j, r in jobs.records.items()}
    turns = turns_from_log(tail(cluster.sched_log, 10**9), uuid_index)   # every part's
    for job, rec in jobs.records.items():
        # The hook gated every GPU the job was given: it asked for each one's lock and got it.
        given = {uuid_index.get(u) for u in rec["env"]["CUDA_VISIBLE_DEVICES"].split(",") if u}
        held = {t["gpu"] for t in turns if t["job"] == job}
        check(rec["part"], f"{rec['name']} (job {job}) held the lock of each GPU it was given",
              given and held == given, f"given GPUs {sorted(given, key=str)}, held {sorted(held)}")
    (args.out / "timeline.txt").write_text(timeline_text(turns, names))
    return {"checks": check.rows, "parts": parts,
            "jobs": {j: {k: v for k, v in r.items() if k != "output_tail"}
                     | {"result": summary_of(r.get("result"))} for j, r in jobs.records.items()}}


def summary_of(result: dict | None) -> dict | None:
    if not result:
        return None
    return {k: result.get(k) for k in ("world", "loss_digest", "train_seconds", "start", "end",
                                       "checksums", "gpus", "nccl_nvls_enable")} | {
        "steps": len(result.get("losses", [])), "first_losses": result.get("losses", [])[:3]}


def markdown(report: dict) -> str:
    def ok(v):
        return "skip" if v is None else ("pass" if v else "FAIL")
    lines = [f"# Two GPUs (issue 15): {report['date']}, {report['device']}", "",
             f"Mode `{report['settings']['mode']}`, {report['settings']['gpus']} GPU(s), "
             f"{report['settings']['steps']} steps; {'PASSED' if report['passed'] else 'FAILED'}.", "",
             "| job | name | GPUs | train s | loss digest | state |", "|---|---|---|---|---|---|"]
    for j, r in report["jobs"].items():
        res = r.get("result") or {}
        lines.append(f"| {j} | {r['name']} | {r['nproc']} | {res.get('train_seconds') or 0:.2f} | "
                     f"{res.get('loss_digest')} | {r.get('state')} {r.get('exit')} |")
    b = report["parts"].get("b", {})
    if "span_seconds" in b:
        lines += ["", f"(b) span {b['span_seconds']:.2f} s vs two alone back to back "
                      f"{b['alone_back_to_back_seconds']:.2f} s: {b['span_ratio']:.3f}x "
                      f"(limit {SPAN_LIMIT}x); {b['turns']} turns; stuck drains "
                      + ", ".join(f"job {j}: {k}" for j, k in b.get("stuck_drains", {}).items())]
    for r in report["parts"].get("c", {}).get("jobs", []):
        if r["ratio"]:
            lines.append(f"(c) {r['name']}: {r['train_seconds']:.2f} s vs alone "
                         f"{r['alone_seconds']:.2f} s ({r['ratio']:.2f}x)")
    lines += ["", "| part | check | result | detail |", "|---|---|---|---|"]
    for c in report["checks"]:
        detail = c["detail"].replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {c['part']} | {c['check']} | {ok(c['ok'])} | {detail} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs per DDP job (default: every GPU, at most 2)")
    ap.add_argument("--fake", action="store_true", help="the fake CUDA driver and a stand-in payload")
    ap.add_argument("--steps", type=int, default=0,
                    help="training steps (fake: collective rounds); default 600, 150 with --fake")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--fake-kernel-us", type=int, default=20000)
    ap.add_argument("--mode", choices=("concurrent", "auto"), default="concurrent")
    ap.add_argument("--switch-s", type=float, default=0.0,
                    help="fixed turn length in concurrent mode (default 2 s, 0.3 s with --fake)")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--slurm-root", default=os.environ.get("NVSHARE_SLURM_ROOT", "/"))
    args = ap.parse_args()
    if args.gpus is not None and args.gpus < 1:
        ap.error("--gpus must be at least 1")
    # One proof at a time: a second would empty the first one's cluster directory under it.
    lock = open(f"{BASE}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        ap.error(f"another proof is running (it holds {BASE}.lock)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.out = args.out.resolve()
    args.steps = args.steps or (150 if args.fake else 600)
    args.switch_s = args.switch_s or (0.3 if args.fake else 2.0)
    if args.fake:
        args.gpus = args.gpus or 2
    try:
        gpus = inventory(args)
    except Exception as exc:   # noqa: BLE001  (pynvml's errors have no common base worth naming)
        ap.error(f"NVML found no GPU ({exc}); on a machine without one, --fake")
    if not gpus:
        ap.error("NVML lists no GPU")
    args.gpus = args.gpus or min(2, len(gpus))
    if args.gpus > len(gpus):
        ap.error(f"--gpus {args.gpus}: this machine has {len(gpus)} GPU(s)")
    if args.fake:
        os.environ["FAKE_CUDA_DEVICES"] = ",".join(f"{g['uuid']}:16G" for g in gpus)
    device = ", ".join(f"GPU {g['index']} {g['name']} {g['uuid']} {g['memory_mib']} MiB" for g in gpus)
    say(f"inventory ({'fake driver' if args.fake else 'NVML'}): {device}")
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "device": f"{len(gpus)} x {gpus[0]['name']}" + (" (fake driver)" if args.fake else ""),
              "inventory": gpus, "settings": {k: (str(v) if isinstance(v, Path) else v)
                                              for k, v in vars(args).items()}}
    scheduler = ["log_level: debug",   # debug: every grant and release, for the timeline
                 f"scheduling_mode: {args.mode}"]
    if args.mode != "auto":
        scheduler += ["switch_time_mode: fixed", f"switch_time_fixed: {args.switch_s}"]
    if args.fake:
        scheduler.append("gpus: [" + ", ".join(f"{{uuid: {g['uuid']}, memory: 16G}}"
                                               for g in gpus) + "]")
    cluster = OneNodeSlurm(BASE, args.slurm_root, 8 * len(gpus), scheduler, NO_MULTICAST)
    try:
        cluster.start()
        say(f"one-node Slurm up ({cluster.host}, Gres=nvshare:{8 * len(gpus)}), scheduler in "
            f"{args.mode} mode")
        report.update(prove(args, cluster, gpus))
    except Exception as exc:   # noqa: BLE001  (the report says what broke; the logs are kept)
        say(f"stopped: {exc}")
        report.setdefault("checks", []).append({"part": "-", "check": "the proof ran to the end",
                                                "ok": False, "detail": str(exc)[:2000]})
        report.setdefault("parts", {})
        report.setdefault("jobs", {})
    finally:
        cluster.stop()
        write_logs(BASE, args.out / "logs.tar.gz")
    report["passed"] = bool(report["checks"]) and all(c["ok"] is not False for c in report["checks"])
    (args.out / "result.json").write_text(json.dumps(report, indent=1))
    (args.out / "results.md").write_text(markdown(report))
    failed = [c for c in report["checks"] if c["ok"] is False]
    say(f"{'PASSED' if report['passed'] else 'FAILED'}: "
        f"{sum(1 for c in report['checks'] if c['ok'])} passed, {len(failed)} failed, "
        f"{sum(1 for c in report['checks'] if c['ok'] is None)} skipped; results in {args.out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
