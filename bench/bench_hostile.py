"""Hostile-user benchmark (issue 25): what one user's floods and unresponsive clients cost others.

A real nvshare-scheduler (2 configured GPUs, concurrent mode, switch_time 0.1 s, drop_grace_sec
1 s) serves a good pair: two clients of root's job 1 on GPU 0 that take turns (hold --hold-ms,
release, ask again). Hand-over = one's LOCK_RELEASED sent to the other's LOCK_GRANT received (one
process, one clock). Meanwhile, each scenario's attack runs in helper processes as unprivileged
uids (raw Python clients on the daemon's socket; nobody = 65534 unless said), and every 0.25 s the
bench times a new client's registration (CLIENT_REGISTER into root's job 3, to its reply) and
root's status query (to its reply). Attacks:

- quiet: none;
- report4, report256: 4 or 256 registered connections of nobody's job (GPU 1), one process,
  pipeline MEM_UPDATE reports as fast as the sockets take them;
- heartbeat, query: 64 unregistered connections of nobody (no job) pipeline HEARTBEATs or
  JOB_QUERYs (of a job that does not exist) and read the replies;
- churn: two processes of nobody connect, send a heartbeat, read it and hang up, in a loop;
- slowread: 1,000 connections of 4 uids (250 each) pipeline 200 status queries, never read;
- unresp3, unresp10: 3 or 10 registered clients of nobody's job on GPU 0 (the pair's GPU) that
  ask for the lock every 50 ms and never release it, whatever the daemon says.

Daemon CPU is its CPU time over the measured seconds (100% = one core); RSS its largest seen.
Each --tree NAME=PATH runs its tree's daemon (PYTHONPATH=PATH), alternately, scenario by scenario,
in one run. Needs root (the attackers' uids).

    python bench/bench_hostile.py [--tree before=/tmp/base] [--tree after=.] [--seconds 5]
                                  [--only quiet,report4,...] [--write]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import bench_daemon
from docsection import replace_section
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.client import Client
from nvshare_slurm.wire.proto import C

REPO = Path(__file__).resolve().parent.parent
GPUS = [f"GPU-hostile0-0000-0000-0000-00000000000{i}" for i in range(2)]
NOBODY = 65534
SCENARIOS = ["quiet", "report4", "report256", "heartbeat", "query", "churn", "slowread",
             "unresp3", "unresp10"]

# One attacker process: `kind` over `count` connections as `uid` (the bench runs as root).
ATTACK = r"""
import os, socket, sys, time
sys.path[:0] = {path!r}
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C
kind, count, sock_path, uid, job, gpu = {kind!r}, {count}, {sock!r}, {uid}, {job}, {gpu!r}
if {cpus!r}:
    os.sched_setaffinity(0, {cpus!r})
os.setgroups([]); os.setgid(uid); os.setuid(uid)

def connect(register):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(sock_path)
    if register:
        s.sendall(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER,
                               {{"job_id": job, "step_id": 0, "pid": os.getpid()}}))
        assert proto.recv_frame(s).body().status == C.NVSHARE_OK
    s.setblocking(False)
    return s

if kind == "churn":
    beat = proto.encode(C.NVSHARE_MSG_HEARTBEAT, {{"timestamp_ns": 1}})
    print("ready", flush=True)
    while True:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(sock_path)
            s.sendall(beat)
            proto.recv_frame(s)
            s.close()
        except OSError:
            time.sleep(0.01)
if kind == "slowread":
    query = proto.encode(C.NVSHARE_MSG_STATUS_QUERY, {{"what": C.NVSHARE_STATUS_JOBS}}) * 200
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(sock_path)
            s.send(query)
        except OSError:
            pass
        socks.append(s)
    print("ready", flush=True)
    time.sleep(3600)
if kind == "unresp":
    socks = [connect(True) for _ in range(count)]
    request = proto.encode(C.NVSHARE_MSG_LOCK_REQUEST, {{"gpu_uuid": gpu}})
    print("ready", flush=True)
    while True:
        for s in socks:
            try:
                while s.recv(65536):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                continue
            try:
                s.send(request)
            except OSError:
                pass
        time.sleep(0.05)
frames = {{"report": [proto.encode(C.NVSHARE_MSG_MEM_UPDATE, {{
               "gpu_uuid": gpu, "allocated": (1 + i % 7) << 20, "fixed": 0, "swapped": 0,
               "request": 0}}) for i in range(7)],
          "heartbeat": [proto.encode(C.NVSHARE_MSG_HEARTBEAT, {{"timestamp_ns": 1}})],
          "query": [proto.encode(C.NVSHARE_MSG_JOB_QUERY, {{"job_id": 424242}})]}}[kind]
one = b"".join(frames)
batch = one * max(1, 32768 // len(one))
socks = [connect(kind == "report") for _ in range(count)]
print("ready", flush=True)
while True:
    for s in socks:
        try:
            s.send(batch)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            continue
        try:
            while s.recv(262144):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass
"""


def start_daemon(workdir: Path, tree: str, nice: int = 0,
                 cpus: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    proc, sock = bench_daemon.start_daemon(
        workdir, GPUS, tree=tree, preexec_fn=(lambda: os.nice(nice)) if nice else None,
        switch_time_fixed=0.1, drop_grace_sec=1.0)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return proc, sock


class Pair:
    """Two clients of one job on GPU 0 taking turns; hand-over latencies in seconds."""

    def __init__(self, sock: str, hold: float):
        self.sock, self.hold = sock, hold
        self.released_at: float | None = None
        self.latencies: list[float] = []
        self.running = True
        self.holding: set[int] = set()    # which of the two holds the lock, as each has been told
        self.overlaps = 0                 # grants while the other still held it (must stay 0)

    async def client(self, me: int) -> None:
        reader, writer = await asyncio.open_unix_connection(self.sock)
        writer.write(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER,
                                  {"job_id": 1, "step_id": 0, "pid": os.getpid()}))
        frame = await proto.read_frame(reader)
        assert frame is not None and frame.body().status == C.NVSHARE_OK
        request = proto.encode(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": GPUS[0]})
        release = proto.encode(C.NVSHARE_MSG_LOCK_RELEASED,
                               {"gpu_uuid": GPUS[0], "flags": C.NVSHARE_RELEASE_IDLE})
        writer.write(request)
        while self.running:
            frame = await proto.read_frame(reader)
            if frame is None:
                return
            if frame.type == C.NVSHARE_MSG_DROP_LOCK:
                self.holding.discard(me)
                writer.write(release + request)
                continue
            if frame.type != C.NVSHARE_MSG_LOCK_GRANT:
                continue
            if self.holding - {me}:
                self.overlaps += 1
            self.holding.add(me)
            if self.released_at is not None:
                self.latencies.append(time.perf_counter() - self.released_at)
                self.released_at = None
            await asyncio.sleep(self.hold)
            self.released_at = time.perf_counter()
            self.holding.discard(me)
            writer.write(release + request)
        writer.close()


async def timed(sock: str, frame: bytes) -> float:
    start = time.perf_counter()
    reader, writer = await asyncio.open_unix_connection(sock)
    try:
        writer.write(frame)
        await asyncio.wait_for(proto.read_frame(reader), 30)
        return time.perf_counter() - start
    finally:
        writer.close()


async def measure(sock: str, daemon: psutil.Process, seconds: float,
                  hold: float) -> dict[str, float]:
    pair = Pair(sock, hold)
    tasks = [asyncio.ensure_future(pair.client(me)) for me in range(2)]
    await asyncio.sleep(0.5)
    pair.latencies.clear()
    registers, statuses, rss = [], [], []
    cpu0 = sum(daemon.cpu_times()[:2])
    start = time.monotonic()
    register = proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER,
                            {"job_id": 3, "step_id": 0, "pid": os.getpid()})
    status = proto.encode(C.NVSHARE_MSG_STATUS_QUERY, {"what": C.NVSHARE_STATUS_GPUS})
    while time.monotonic() - start < seconds:
        for frame, into in ((register, registers), (status, statuses)):
            try:
                into.append(await timed(sock, frame))
            except (OSError, asyncio.TimeoutError):
                into.append(float("inf"))
        rss.append(daemon.memory_info().rss)
        await asyncio.sleep(0.25)
    elapsed = time.monotonic() - start
    cpu = sum(daemon.cpu_times()[:2]) - cpu0
    pair.running = False
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    lat = sorted(x * 1000 for x in pair.latencies) or [float("inf")]
    return {"n": len(pair.latencies), "overlaps": pair.overlaps, "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))], "max": lat[-1],
            "register": max(registers) * 1000, "status": max(statuses) * 1000,
            "cpu": 100 * cpu / elapsed, "rss": max(rss) / 2**20}


def attackers(name: str, sock: str) -> list[tuple[str, int, int, int, str]]:
    """(kind, connections, uid, job, gpu) of each attacker process."""
    if name == "report4":
        return [("report", 4, NOBODY, 2, GPUS[1])]
    if name == "report256":
        return [("report", 256, NOBODY, 2, GPUS[1])]
    if name in ("heartbeat", "query"):
        return [(name, 64, NOBODY, 0, "")]
    if name == "churn":
        return [("churn", 1, NOBODY, 0, "")] * 2
    if name == "slowread":
        return [("slowread", 250, uid, 0, "") for uid in (65534, 65533, 65532, 65531)]
    if name.startswith("unresp"):
        return [("unresp", int(name[6:]), NOBODY, 2, GPUS[0])]
    return []


def scenario(name: str, tree: str, args: argparse.Namespace) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix=f"nvs-hostile-{name}-", dir="/tmp"))
    proc, sock = start_daemon(workdir, tree, args.daemon_nice, args.serve_cpus)
    helpers: list[subprocess.Popen] = []
    try:
        admin = Client(sock)
        admin.register_job(1, uid=0, gid=0, gpu_index=[0], name="pair")
        admin.register_job(3, uid=0, gid=0, gpu_index=[0], name="probe")
        gpu = 0 if name.startswith("unresp") else 1
        admin.register_job(2, uid=NOBODY, gid=NOBODY, gpu_index=[gpu], name="hostile")
        path = [str(REPO)] + sys.path
        for kind, count, uid, job, uuid in attackers(name, sock):
            helper = subprocess.Popen([sys.executable, "-c", ATTACK.format(
                path=path, kind=kind, count=count, sock=sock, uid=uid, job=job, gpu=uuid,
                cpus=args.attacker_cpus)],
                stdout=subprocess.PIPE, text=True)
            helpers.append(helper)
            if helper.stdout.readline().strip() != "ready":
                raise SystemExit(f"{name}: attacker {kind} did not start")
        time.sleep(0.5)
        result = asyncio.run(measure(sock, psutil.Process(proc.pid), args.seconds,
                                     args.hold_ms / 1000))
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:        # a daemon too busy to stop
            proc.kill()
            proc.wait()
    return result


def _cpus(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus))) or "any"


def fmt(value: float, digits: int = 1) -> str:
    return "timeout" if value == float("inf") else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="NAME=PATH of a checkout whose daemon runs (default: this one)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--hold-ms", type=float, default=2.0)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--daemon-nice", type=int, default=0,
                        help="the daemon's nice value (e.g. -10, as a unit's Nice= would set)")
    parser.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    parser.add_argument("--note", default="", help="a paragraph recorded after the table")
    parser.add_argument("--attacker-cpus", default="last",
                        help="CPUs of the attackers (as Slurm's cpuset confines a job), e.g. 1 "
                             "or 2-3; the daemon and the good pair get the others. 'last': the "
                             "last CPU; 'none': no pinning")
    args = parser.parse_args()
    everything = sorted(os.sched_getaffinity(0))
    if args.attacker_cpus == "none" or len(everything) < 2:
        args.attacker_cpus, args.serve_cpus = set(), set()
    else:
        if args.attacker_cpus == "last":
            args.attacker_cpus = {everything[-1]}
        else:
            low, _, high = args.attacker_cpus.partition("-")
            args.attacker_cpus = set(range(int(low), int(high or low) + 1))
        args.serve_cpus = set(everything) - args.attacker_cpus
        os.sched_setaffinity(0, args.serve_cpus)
    if os.getuid() != 0:
        raise SystemExit("bench_hostile.py runs attackers as other uids: run it as root")
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("this", str(REPO))]
    rows = []
    quiet: dict[str, float] = {}
    for name in args.only.split(","):
        for tree_name, tree in trees:
            r = scenario(name, str(Path(tree).resolve()), args)
            if name == "quiet":
                quiet[tree_name] = r["p99"]
                quiet[tree_name + " n"] = r["n"]
            target = max(10.0, 3 * quiet.get(tree_name, r["p99"]))
            # Starved (under half the quiet hand-overs) misses too, whatever its few p99 say.
            met = r["p99"] <= target and r["register"] <= 1000 and r["status"] <= 1000 \
                and r["rss"] < 200 and r["n"] >= quiet.get(tree_name + " n", 0) / 2 \
                and r["overlaps"] == 0
            row = (f"| {name} | {tree_name} | {r['n']:.0f} | {fmt(r['p50'], 2)} | "
                   f"{fmt(r['p99'], 2)} | {fmt(r['max'])} | {fmt(r['register'])} | "
                   f"{fmt(r['status'])} | {r['cpu']:.0f}% | {r['rss']:.0f} | {r['overlaps']} | "
                   f"{'yes' if met else '**no**'} |")
            print(row, flush=True)
            rows.append(row)
    table = ("| attack | daemon | hand-overs | p50 ms | p99 ms | max ms | register max ms | "
             "status max ms | daemon CPU | RSS MiB | overlapping holds | targets met |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    if args.write:
        date = datetime.date.today().isoformat()
        text = (f"## Hostile users (issue 25)\n\nMeasured {date} with `python "
                f"bench/bench_hostile.py --write` on a {psutil.cpu_count()}-core machine without "
                f"GPUs ({platform.processor() or platform.machine()}, Python "
                f"{platform.python_version()}), shared with other engineers' runs. The attackers "
                f"run on CPU {_cpus(args.attacker_cpus)} (as Slurm's cpuset confines a job), the "
                f"daemon and the good pair on CPU {_cpus(args.serve_cpus)}. Daemons: "
                f"{', '.join(f'{n} = {t}' for n, t in trees)}. {args.seconds:g} s measured per "
                f"row; timeout: no hand-over, or no reply within 30 s. "
                f"Targets: p99 at most max(10 ms, 3 x quiet), registration and status within "
                f"1 s, RSS under 200 MB; a row that misses one says so. The scenarios are in the "
                f"script's docstring.\n\n" + table
                + (f"\n{args.note.strip()}\n" if args.note.strip() else ""))
        replace_section(REPO / "docs" / "benchmarks.md", "Hostile users", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
