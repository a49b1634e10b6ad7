"""Prometheus metrics of one node's nvshare-scheduler (config `metrics_port`, off by default).

Served over plain HTTP by the daemon's own event loop, so a scrape reads the scheduler's state
between two events, never while one is half applied, and needs no lock. The endpoint answers
`GET /metrics` only; a slow or oversized request is cut off, and only a few scrapes run at once.

Every sample carries `node`; GPU samples carry `gpu` (UUID) and `index`; job samples `job`,
`class` (the job's share class: high, normal, low), `gpu` and `index`, and `user` only where the
site turns it on (`metrics_user_labels`). Names follow Prometheus conventions: `_bytes`,
`_seconds`, `_total`. It listens on `metrics_bind` (127.0.0.1 by default) and a port it cannot
bind stops the daemon at start: a site that asked for metrics finds out at once.
"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..base import log
from ..policy.gpustate import GpuState, sharing_now
from .accounting import UsageLedger

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST = 8192
REQUEST_TIMEOUT_SEC = 5.0
MAX_SCRAPES = 8


class Source(Protocol):
    """What the metrics read: the daemon, seen through this narrow window."""
    gpus: dict[str, GpuState]
    ledger: UsageLedger
    registry: Any

    def now(self) -> float: ...


def sharing(gpu: GpuState) -> str:
    """How the GPU is shared right now, in one word for a label (the policy's own choice)."""
    return sharing_now(gpu)[0]


class SchedulerCollector:
    def __init__(self, source: Source, node: str | None = None, user_labels: bool = False):
        self.source = source
        self.node = node or socket.gethostname().split(".")[0]
        self.user_labels = user_labels

    def collect(self) -> Iterator[Metric]:
        src, node = self.source, self.node
        now = src.now()
        g_labels = ["node", "gpu", "index"]
        info = GaugeMetricFamily("nvshare_gpu_info", "A managed GPU: its mode and current sharing",
                                 labels=g_labels + ["name", "mode", "sharing"])
        holders = GaugeMetricFamily("nvshare_gpu_holders", "Processes holding the GPU's lock",
                                    labels=g_labels)
        waiters = GaugeMetricFamily("nvshare_gpu_waiters", "Processes waiting for the GPU's lock",
                                    labels=g_labels)
        memory = GaugeMetricFamily("nvshare_gpu_memory_bytes",
                                   "GPU memory: total, usable (after the reserve), used by jobs "
                                   "(resident), fixed (never swappable), swapped (in host memory)",
                                   labels=g_labels + ["kind"])
        handovers = CounterMetricFamily("nvshare_gpu_handovers", "Lock grants", labels=g_labels)
        drains = CounterMetricFamily("nvshare_gpu_drains", "DROP_LOCKs answered by a release",
                                     labels=g_labels)
        drain_sec = CounterMetricFamily("nvshare_gpu_drain_seconds",
                                        "Time from DROP_LOCK to release, summed", labels=g_labels)
        swap_bytes = CounterMetricFamily("nvshare_gpu_swap_bytes",
                                         "Bytes moved between GPU and host memory",
                                         labels=g_labels + ["direction"])
        swap_sec = CounterMetricFamily("nvshare_gpu_swap_seconds",
                                       "Time of drains that moved memory to host memory",
                                       labels=g_labels)
        for gpu in src.gpus.values():
            labels = [node, gpu.uuid, str(gpu.index)]
            info.add_metric(labels + [gpu.name, gpu.settings.mode, sharing(gpu)], 1)
            holders.add_metric(labels, len(gpu.holders))
            waiters.add_metric(labels, len(gpu.queue))
            mem = gpu.memory
            for kind, value in (("total", gpu.memory_total), ("usable", mem.usable),
                                ("used", mem.sum_allocated), ("fixed", mem.sum_fixed),
                                ("swapped", mem.sum_swapped)):
                memory.add_metric(labels + [kind], value)
            counters = src.ledger.gpus.get(gpu.uuid)
            if counters is None:
                continue
            handovers.add_metric(labels, counters.handovers)
            drains.add_metric(labels, counters.drains)
            drain_sec.add_metric(labels, counters.drain_sec)
            swap_bytes.add_metric(labels + ["out"], counters.swap_out_bytes)
            swap_bytes.add_metric(labels + ["in"], counters.swap_in_bytes)
            swap_sec.add_metric(labels, counters.swap_sec)
        yield from (info, holders, waiters, memory, handovers, drains, drain_sec, swap_bytes,
                    swap_sec)
        yield from self._jobs(now)

    def _jobs(self, now: float) -> Iterator[Metric]:
        src, node = self.source, self.node
        j_labels = ["node", "job"] + (["user"] if self.user_labels else []) + \
            ["class", "gpu", "index"]
        registered = GaugeMetricFamily("nvshare_jobs_registered", "Jobs registered on this node",
                                       labels=["node"])
        registered.add_metric([node], len(src.registry.jobs))
        held = CounterMetricFamily("nvshare_job_gpu_held_seconds",
                                   "Seconds the job held the GPU's lock", labels=j_labels)
        wait = CounterMetricFamily("nvshare_job_gpu_wait_seconds",
                                   "Seconds the job waited for the GPU's lock", labels=j_labels)
        peak = GaugeMetricFamily("nvshare_job_gpu_memory_peak_bytes",
                                 "The job's peak GPU memory there (resident + swapped)",
                                 labels=j_labels)
        swapped = CounterMetricFamily("nvshare_job_gpu_swapped_bytes",
                                      "Bytes of the job moved to host memory", labels=j_labels)
        for job in src.registry.jobs.values():
            usage = src.ledger.job_usage(job.job_id, now)
            for uuid, index in zip(job.gpus, job.gpu_index, strict=True):
                u = usage.get(uuid)
                if u is None:
                    continue
                labels = [node, str(job.job_id)] + ([job.user] if self.user_labels else []) + \
                    [job.share_class, uuid, str(index)]
                held.add_metric(labels, u["held_sec"])
                wait.add_metric(labels, u["wait_sec"])
                peak.add_metric(labels, u["peak_memory"])
                swapped.add_metric(labels, u["swapped_out"])
        yield from (registered, held, wait, peak, swapped)


class MetricsServer:
    """GET /metrics on `port`, answered on the daemon's event loop."""

    def __init__(self, source: Source, port: int, host: str = "127.0.0.1",
                 user_labels: bool = False):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SchedulerCollector(source, user_labels=user_labels))
        self.port = port
        self.host = host
        self._server: asyncio.AbstractServer | None = None
        self._slots = asyncio.Semaphore(MAX_SCRAPES)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host or None, self.port,
                                                  limit=MAX_REQUEST)
        where = f"[{self.host}]" if ":" in self.host else (self.host or "*")
        log.get().info(f"metrics: serving http://{where}:{self.port}/metrics")

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._slots.locked():
            writer.transport.abort()
            return
        async with self._slots:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_SEC)
                request = head.split(b"\r\n", 1)[0].split()
                if len(request) >= 2 and request[0] == b"GET" and \
                        request[1].split(b"?", 1)[0] == b"/metrics":
                    self._respond(writer, b"200 OK", generate_latest(self.registry), CONTENT_TYPE)
                else:
                    self._respond(writer, b"404 Not Found", b"GET /metrics\n", "text/plain")
                await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_SEC)
                writer.close()
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ConnectionError, OSError):
                pass
            finally:
                if not writer.transport.is_closing():
                    writer.transport.abort()   # a peer that never reads costs nothing more

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, status: bytes, body: bytes, ctype: str) -> None:
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype.encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\nConnection: close\r\n\r\n" + body)
