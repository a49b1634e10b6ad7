"""Scheduler benchmark: lock hand-over latency and daemon memory with many clients.

Starts nvshare-scheduler with 8 configured GPUs (concurrent mode), connects N clients (default 500)
from this one asyncio process, 1/8 of them per GPU, and lets them contend: each holder keeps the
lock for --hold-ms then releases and asks again. Hand-over latency = time from a holder's
LOCK_RELEASED (sent) to the next holder's LOCK_GRANT (received) on that GPU; both ends live in this
process, so one clock measures it. Three runs, each with a fresh daemon:

- base: the N clients alone;
- churn: --jobs registered jobs in all (default 2,000), while another process registers and
  unregisters --churn jobs per second (default 50 of each);
- hostile: while --hostile connections (default 1,000) of unprivileged users (250 per uid, run as
  root to use several uids) pipeline status queries and never read a reply.

Prints the tables and, with --write, records them in docs/benchmarks.md ("## Scheduler").

    python bench/bench_scheduler.py [--clients 500] [--seconds 10] [--only base,churn,hostile] [--write]
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
N_GPUS = 8


def start_daemon(workdir: Path) -> tuple[subprocess.Popen, str]:
    uuids = [f"GPU-bench000-0000-0000-0000-00000000000{i}" for i in range(N_GPUS)]
    return bench_daemon.start_daemon(workdir, uuids, switch_time_fixed=10)


class Bench:
    def __init__(self, hold: float):
        self.hold = hold
        self.released_at: dict[str, float] = {}
        self.latencies: list[float] = []
        self.grants = 0
        self.running = True

    async def client(self, sock_path: str, job_id: int, uuid: str) -> None:
        reader, writer = await asyncio.open_unix_connection(sock_path)
        writer.write(proto.encode(C.NVSHARE_MSG_CLIENT_REGISTER,
                                  {"job_id": job_id, "step_id": 0, "pid": os.getpid()}))
        frame = await proto.read_frame(reader)
        assert frame.body().status == C.NVSHARE_OK, proto.text(frame.body().message)
        request = proto.encode(C.NVSHARE_MSG_LOCK_REQUEST, {"gpu_uuid": uuid})
        release = proto.encode(C.NVSHARE_MSG_LOCK_RELEASED,
                               {"gpu_uuid": uuid, "flags": C.NVSHARE_RELEASE_IDLE})
        writer.write(request)
        while self.running:
            frame = await proto.read_frame(reader)
            if frame is None:
                return
            if frame.type != C.NVSHARE_MSG_LOCK_GRANT:
                if frame.type == C.NVSHARE_MSG_DROP_LOCK:
                    writer.write(release)
                continue
            now = time.perf_counter()
            before = self.released_at.pop(uuid, None)
            if before is not None:
                self.latencies.append(now - before)
            self.grants += 1
            await asyncio.sleep(self.hold)
            self.released_at[uuid] = time.perf_counter()
            writer.write(release)
            writer.write(request)
        writer.close()


async def run(sock: str, n_clients: int, seconds: float, hold: float) -> Bench:
    bench = Bench(hold)
    uuids = [f"GPU-bench000-0000-0000-0000-00000000000{i}" for i in range(N_GPUS)]
    tasks = [asyncio.ensure_future(bench.client(sock, 1000 + i, uuids[i % N_GPUS]))
             for i in range(n_clients)]
    await asyncio.sleep(1.0)          # let every client connect and queue
    bench.latencies.clear()
    await asyncio.sleep(seconds)
    bench.running = False
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return bench


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def write_section(text: str) -> None:
    replace_section(REPO / "docs" / "benchmarks.md", "Scheduler", "## Scheduler\n\n" + text.strip() + "\n")


CHURN = """
import os, sys, time
sys.path[:0] = {path!r}
from nvshare_slurm.wire.client import Client
client, rate, job_id = Client({sock!r}), {rate}, 900000
start = time.monotonic()
while True:
    client.register_job(job_id, uid=os.getuid(), gid=os.getgid(), gpu_index=[job_id % {gpus}])
    client.unregister_job(job_id)
    job_id += 1
    time.sleep(max(0.0, start + (job_id - 900000) / rate - time.monotonic()))
"""

HOSTILE = """
import os, socket, sys, time
sys.path[:0] = {path!r}
from nvshare_slurm.wire import proto
from nvshare_slurm.wire.proto import C
uid = {uid}
if uid is not None:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
query = proto.encode(C.NVSHARE_MSG_STATUS_QUERY, {{"what": C.NVSHARE_STATUS_JOBS}}) * 200
socks, opened = [], 0
for _ in range({count}):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect({sock_path!r})
        sock.send(query)
        opened += 1
    except OSError:
        pass
    socks.append(sock)
time.sleep(1.0)
alive = 0
for sock in socks:        # refused ones read as closed
    try:
        alive += sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(alive, flush=True)
time.sleep(3600)
"""


def register_many(sock: str, first: int, count: int) -> None:
    admin = Client(sock)
    for i in range(count):
        admin.register_job(first + i, uid=os.getuid(), gid=os.getgid(),
                           gpu_index=[i % N_GPUS], name="bench")


def scenario(name: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    workdir = Path(tempfile.mkdtemp(prefix=f"nvs-bench-{name}-", dir="/tmp"))
    proc, sock = start_daemon(workdir)
    helpers: list[subprocess.Popen] = []
    rows: list[tuple[str, str]] = []
    path = [str(REPO)] + sys.path
    try:
        register_many(sock, 1000, args.clients)
        if name == "churn":
            extra = max(0, args.jobs - args.clients)
            register_many(sock, 100000, extra)
            helpers.append(subprocess.Popen([sys.executable, "-c", CHURN.format(
                path=path, sock=sock, rate=args.churn, gpus=N_GPUS)]))
            rows += [("registered jobs", f"{args.clients + extra}, {args.clients} of them with "
                                         f"a client"),
                     ("churn", f"{args.churn:g} registrations and {args.churn:g} "
                               f"unregistrations per second (another process)")]
        if name == "hostile":
            uids: list[int | None] = [65534, 65533, 65532, 65531] if os.getuid() == 0 else [None]
            per_uid = -(-args.hostile // len(uids))
            alive = 0
            for uid in uids:
                helper = subprocess.Popen([sys.executable, "-c", HOSTILE.format(
                    path=path, uid=uid, count=per_uid, sock_path=sock)], stdout=subprocess.PIPE,
                    text=True)
                helpers.append(helper)
                alive += int(helper.stdout.readline() or 0)
            who = f"{len(uids)} uids" if uids != [None] else "this uid"
            rows += [("hostile connections", f"{args.hostile} asked, {alive} open ({who}), each "
                                             f"with 200 status queries it never reads")]
        bench = asyncio.run(run(sock, args.clients, args.seconds, args.hold_ms / 1000))
        daemon = psutil.Process(proc.pid)
        rss = daemon.memory_info().rss
        cpu = daemon.cpu_times()
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait()
        proc.terminate()
        proc.wait(10)
    lat = [x * 1000 for x in bench.latencies]
    if not lat:
        raise SystemExit(f"{name}: no hand-overs measured")
    return [("clients", f"{args.clients} over {N_GPUS} GPUs (concurrent mode)"),
            ("hold per turn", f"{args.hold_ms:g} ms, then release and ask again")] + rows + [
            ("hand-overs measured", f"{len(lat)} in {args.seconds:g} s"),
            ("hand-over latency p50", f"{statistics.median(lat):.3f} ms"),
            ("hand-over latency p99", f"{percentile(lat, 0.99):.3f} ms"),
            ("hand-over latency max", f"{max(lat):.3f} ms"),
            ("daemon RSS", f"{rss / 2**20:.1f} MiB"),
            ("daemon CPU", f"{cpu.user + cpu.system:.1f} s")]


TITLES = {"base": "Clients alone. Targets: p99 < 5 ms, RSS < 100 MB.",
          "churn": "Registrations under way: 50 jobs registered and 50 unregistered per second "
                   "beside 2,000 registered jobs. Target: p99 < 5 ms.",
          "hostile": "Under attack: 1,000 connections of unprivileged users pipeline status "
                     "queries and never read. Targets: p99 < 10 ms, RSS < 200 MB."}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hold-ms", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=2000, help="churn: registered jobs in all")
    parser.add_argument("--churn", type=float, default=50.0, help="churn: per second, each way")
    parser.add_argument("--hostile", type=int, default=1000, help="hostile: connections")
    parser.add_argument("--only", default="base,churn,hostile")
    parser.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    parser.add_argument("--note", default="", help="a paragraph recorded after the tables")
    args = parser.parse_args()
    tables = []
    for name in args.only.split(","):
        rows = scenario(name, args)
        table = "| metric | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
        print(f"{name}:\n{table}")
        tables.append(f"### {name}\n\n{TITLES[name]}\n\n{table}")
    if args.write:
        date = datetime.date.today().isoformat()
        write_section(
            f"Measured {date} with `python bench/bench_scheduler.py --write` on a "
            f"{psutil.cpu_count()}-core machine without GPUs ({platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}), shared with other engineers' test runs; the "
            f"daemon, the clients (one asyncio process) and the helper processes share those "
            f"cores. GPUs are configured (`gpus:`), so this measures the daemon alone: no CUDA. "
            f"Latency = a holder's LOCK_RELEASED sent to the next holder's LOCK_GRANT received, "
            f"on the same GPU. A run that misses its target is recorded as measured.\n\n"
            + "\n".join(tables) + (f"\n{args.note.strip()}\n" if args.note.strip() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
