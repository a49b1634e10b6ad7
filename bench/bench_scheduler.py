"""Scheduler benchmark: lock hand-over latency and daemon memory with many clients.

Starts nvshare-scheduler with 8 configured GPUs (concurrent mode), connects N clients (default 500)
from this one asyncio process, 1/8 of them per GPU, and lets them contend: each holder keeps the
lock for --hold-ms then releases and asks again. Hand-over latency = time from a holder's
LOCK_RELEASED (sent) to the next holder's LOCK_GRANT (received) on that GPU; both ends live in this
process, so one clock measures it. Prints a table and, with --write, records it in
docs/benchmarks.md ("## Scheduler").

    python bench/bench_scheduler.py [--clients 500] [--seconds 10] [--write]
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
import yaml

from docsection import replace_section
from nvshare_slurm import proto
from nvshare_slurm.client import Client
from nvshare_slurm.proto import C

REPO = Path(__file__).resolve().parent.parent
N_GPUS = 8


def start_daemon(workdir: Path) -> tuple[subprocess.Popen, str]:
    sock = str(workdir / "s.sock")
    cfg = {"socket": sock, "state_dir": str(workdir / "state"), "log_level": "warning",
           "scheduling_mode": "concurrent", "switch_time_mode": "fixed", "switch_time_fixed": 10,
           "gpus": [{"uuid": f"GPU-bench000-0000-0000-0000-00000000000{i}", "memory": "80G"}
                    for i in range(N_GPUS)]}
    (workdir / "nvshare.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
    env["NVSHARE_CONFIG"] = str(workdir / "nvshare.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "nvshare_slurm.daemon"], env=env,
                            stderr=open(workdir / "daemon.log", "wb"))
    deadline = time.monotonic() + 15
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"daemon did not start:\n{(workdir / 'daemon.log').read_text()}")
        time.sleep(0.05)
    return proc, sock


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hold-ms", type=float, default=2.0)
    parser.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="nvs-bench-", dir="/tmp"))
    proc, sock = start_daemon(workdir)
    try:
        admin = Client(sock)
        for i in range(args.clients):
            admin.register_job(1000 + i, uid=os.getuid(), gid=os.getgid(),
                               gpu_index=[i % N_GPUS], name="bench")
        bench = asyncio.run(run(sock, args.clients, args.seconds, args.hold_ms / 1000))
        daemon = psutil.Process(proc.pid)
        rss = daemon.memory_info().rss
        cpu = daemon.cpu_times()
    finally:
        proc.terminate()
        proc.wait(10)
    lat = [x * 1000 for x in bench.latencies]
    if not lat:
        print("no hand-overs measured", file=sys.stderr)
        return 1
    rows = [("clients", f"{args.clients} over {N_GPUS} GPUs (concurrent mode)"),
            ("hold per turn", f"{args.hold_ms:g} ms, then release and ask again"),
            ("hand-overs measured", f"{len(lat)} in {args.seconds:g} s"),
            ("hand-over latency p50", f"{statistics.median(lat):.3f} ms"),
            ("hand-over latency p99", f"{percentile(lat, 0.99):.3f} ms"),
            ("hand-over latency max", f"{max(lat):.3f} ms"),
            ("daemon RSS", f"{rss / 2**20:.1f} MiB"),
            ("daemon CPU", f"{cpu.user + cpu.system:.1f} s")]
    table = "| metric | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    print(table)
    if args.write:
        date = datetime.date.today().isoformat()
        write_section(
            f"Measured {date} with `python bench/bench_scheduler.py --write` on a "
            f"{psutil.cpu_count()}-core machine without GPUs ({platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}), shared with other work; the daemon and all "
            f"clients (one asyncio process) share those cores. GPUs are configured (`gpus:`), so "
            f"this measures the daemon alone: no CUDA. Latency = a holder's LOCK_RELEASED sent to "
            f"the next holder's LOCK_GRANT received, on the same GPU. Targets: p99 < 5 ms, "
            f"RSS < 100 MB.\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
