"""Policy Actions onto connections: each GPU's grants, contention notices, drops, swap asks and
held memory replies as frames to their clients, with the burst page and the hand-over eventfd
they need, and the log line of each. An unresponsive holder is cut off or released here.

A send never sends what it brings about: the Actions of an unresponsive holder's release go back
to the core's work list (daemon.py, after_event), which sends them after the rest.
"""
from __future__ import annotations

import os
import signal

from ..base import log
from ..policy.gpustate import GpuState
from ..policy.policytypes import (CONTENDED, DROP, ENDED_MEMORY, GRANT, HANDOFF, MEM_REPLY, PREFETCH,
                                  SWAP_OUT, SWAP_UNANSWERED, UNRESPONSIVE, Action, ClientInfo, move_grace)
from ..wire.proto import C
from .burstpage import BurstPages
from .connection import Connection
from .daemoncore import Core, mem_reply, size
from .procinfo import ANY_START, ProcIdentity, signal_checked

_DROP_NAMES = {C.NVSHARE_DROP_TIMESLICE: "time slice over", C.NVSHARE_DROP_MAX_RUNTIME:
               "max runtime reached", C.NVSHARE_DROP_ADMIN: "admin update",
               C.NVSHARE_DROP_MEMORY: "memory no longer fits",
               C.NVSHARE_DROP_SUSPEND: "its job is suspended"}


class ActionSender:
    """Sends one GPU's Actions at a time for the daemon core."""

    def __init__(self, core: Core, burst_pages: BurstPages):
        self.core = core
        self.logger = core.logger
        self.registry = core.registry
        self.ledger = core.ledger
        self.burst_pages = burst_pages
        self._sharing: dict[str, tuple[str, str]] = {}   # GPU -> (sharing, reason) last logged

    def send(self, gpu: GpuState, actions: list[Action]) -> list[tuple[GpuState, list[Action]]]:
        """Send one GPU's Actions to their clients and log them; the Actions this brings about
        are returned, not sent."""
        follow_ups: list[tuple[GpuState, list[Action]]] = []
        for action in actions:
            client = self.registry.clients.get(action.client.client_id)
            conn = client.connection if client is not None else None
            where = f"gpu {gpu.uuid}: {action.client.label()}"
            if action.kind == GRANT:
                flags = action.flags
                if conn is not None and (action.bursts or action.yields) \
                        and self._give_burst_page(conn, gpu.uuid):
                    flags |= (C.NVSHARE_GRANT_BURSTS if action.bursts else 0) \
                        | (C.NVSHARE_GRANT_YIELD if action.yields else 0)
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_LOCK_GRANT, {"gpu_uuid": gpu.uuid,
                                                         "flags": flags,
                                                         "switch_ms": action.value,
                                                         "bytes": action.ahead})
                kind = ("exclusive" if not action.flags & C.NVSHARE_GRANT_SHARED else
                        "shared, bursts take turns" if flags & C.NVSHARE_GRANT_BURSTS else "shared") \
                    + (", waits out prompt bursts" if flags & C.NVSHARE_GRANT_YIELD else "") \
                    + (", unasked: a prompt client that gave it back idle" if action.unasked else "")
                self.logger.debug(f"{where}: lock granted ({kind})")
                if action.bytes:
                    self.core.warnings.warn(
                        (gpu.uuid, action.client.client_id, "granted without room"),
                        f"{where}: lock granted although {size(action.bytes)} of its swapped "
                        f"memory does not fit: nothing more can move to host memory")
            elif action.kind == CONTENDED:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_LOCK_CONTENDED, {"gpu_uuid": gpu.uuid})
                self.logger.debug(f"{where}: others wait, asked to release when idle")
            elif action.kind == DROP:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_DROP_LOCK, {"gpu_uuid": gpu.uuid,
                                                        "switch_ms": action.value,
                                                        "bytes": action.bytes})
                move = f"; asked to move {size(action.bytes)} to host memory" \
                    if action.bytes else ""
                self.logger.info(f"{where}: lock dropped "
                                 f"({_DROP_NAMES.get(action.value, '?')}){move}")
            elif action.kind == SWAP_OUT:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_PREPARE_SWAP_OUT, {"gpu_uuid": gpu.uuid,
                                                               "bytes": action.bytes})
                self.logger.info(f"{where}: asked to move {size(action.bytes)} to host memory")
            elif action.kind == PREFETCH:
                if conn is not None:
                    conn.send(C.NVSHARE_MSG_PREFETCH, {"gpu_uuid": gpu.uuid, "bytes": action.bytes})
                self.logger.debug(f"{where}: may bring {size(action.bytes)} back before its turn")
            elif action.kind == SWAP_UNANSWERED:
                self.logger.warning(f"{where}: did not answer PREPARE_SWAP_OUT "
                                    f"({size(action.bytes)}) within "
                                    f"{self.core.cfg.drop_grace_sec + move_grace(action.bytes):.1f}s")
            elif action.kind == MEM_REPLY and action.reply is not None:
                if conn is not None:
                    mem_reply(conn, gpu.uuid, action.reply, action.token)
                if action.reply.no_room:
                    self.logger.warning(f"{where}: allocation answered without the room it "
                                        f"waited for: nothing more moved to host memory (within "
                                        f"{self.core.cfg.drop_grace_sec:g}s); the driver decides")
                else:
                    self.logger.debug(f"{where}: allocation answered after waiting for room")
            elif action.kind == ENDED_MEMORY:
                after = f"{action.flags / 1000:.1f}s after its process ended"
                if action.value == 0:
                    self.logger.info(f"{where}: the driver released its {size(action.bytes)} "
                                     f"{after}; counted free now")
                else:
                    self.logger.warning(f"{where}: the driver still shows {size(action.bytes)} "
                                        f"of it {after}; counted free now, although the driver "
                                        f"may not have it (a hung teardown or a zombie process?)")
            elif action.kind == HANDOFF and action.source is not None:
                self._hand_over(gpu, action.source, action.client, conn)
            elif action.kind == UNRESPONSIVE:
                released = self._unresponsive(gpu, action.client)
                if released:
                    follow_ups.append((gpu, released))
        self.ledger.observe(gpu, self.core.now())
        self._log_sharing(gpu)
        # A stopped client whose memory a waiter needs runs for its move-out (moveout.py); what
        # that brings about joins the core's work list (after_event), like a dropped client's.
        self.core.suspends.after_send(gpu)
        return follow_ups

    def _hand_over(self, gpu: GpuState, holder: ClientInfo, successor: ClientInfo,
                   successor_conn: Connection | None) -> None:
        """HANDOFF: one new eventfd to the holder (before its DROP_LOCK) and to its successor, and
        to nobody else. The holder's hook writes it once its work is drained; the successor's
        hook, waiting for the lock, starts on it. Both messages are advice: where one cannot go
        (a peer's output is queued, it has gone), the successor waits for its grant as before."""
        entry = self.registry.clients.get(holder.client_id)
        holder_conn = entry.connection if entry is not None else None
        if holder_conn is None or successor_conn is None:
            return
        try:
            fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except OSError as exc:
            self.core.warnings.warn((gpu.uuid, 0, "eventfd"), f"gpu {gpu.uuid}: cannot make an "
                                    f"eventfd ({log.escape(exc)}): turns pass through grants")
            return
        try:
            sent = holder_conn.send_with_fd(C.NVSHARE_MSG_HANDOFF, {
                "gpu_uuid": gpu.uuid, "flags": C.NVSHARE_HANDOFF_FROM}, fd) and \
                successor_conn.send_with_fd(C.NVSHARE_MSG_HANDOFF, {
                    "gpu_uuid": gpu.uuid, "flags": C.NVSHARE_HANDOFF_TO}, fd)
        finally:
            os.close(fd)
        self.logger.debug(f"gpu {gpu.uuid}: {holder.label()}: its turn passes to "
                          f"{successor.label()} {'by hand-over' if sent else 'by grant'}")

    def _give_burst_page(self, conn: Connection, uuid: str) -> bool:
        """Has this connection the GPU's burst page, or can it have it now? Without it the client
        co-runs as before, and the next such grant tries again."""
        if uuid in conn.burst_pages:
            return True
        try:
            fd = self.burst_pages.fd(uuid)
        except OSError as exc:
            self.core.warnings.warn((uuid, 0, "burst page"), f"gpu {uuid}: cannot make its burst "
                                    f"page ({log.escape(exc)}): co-runners' bursts overlap")
            return False
        if not conn.send_with_fd(C.NVSHARE_MSG_BURST_PAGE, {"gpu_uuid": uuid}, fd):
            return False
        conn.burst_pages.add(uuid)
        return True

    def _log_sharing(self, gpu: GpuState) -> None:
        now = (gpu.sharing, gpu.sharing_reason)
        if gpu.sharing and self._sharing.get(gpu.uuid, ("", ""))[0] != now[0]:
            self.logger.info(f"gpu {gpu.uuid}: sharing: {now[0]} ({now[1]})")
        self._sharing[gpu.uuid] = now

    def _unresponsive(self, gpu: GpuState, info: ClientInfo) -> list[Action]:
        """A holder that ignored DROP_LOCK for drop_grace_sec loses the lock here, whatever the
        policy, so one client can never keep a GPU from the others; kill also signals it (and
        cutting its connection off drops it). The Actions of a release for it come back."""
        holder = gpu.holders.get(info.client_id)
        since = holder.grace_from() if holder is not None else None
        grace = self.core.now() - since if since is not None else self.core.cfg.drop_grace_sec
        where = f"gpu {gpu.uuid}: {info.label()}"
        client = self.registry.clients.get(info.client_id)
        conn = client.connection if client is not None else None
        uid = getattr(info, "uid", None)
        self.logger.warning(f"gpu {gpu.uuid}: uid {uid if uid is not None else '?'} loses its place "
                            f"there for {gpu.lock.penalty_left(info, self.core.now()):g}s: "
                            f"a holder of it did not release in time after DROP_LOCK")
        if self.core.cfg.unresponsive_holder == "kill":
            self.logger.warning(f"{where}: has not released the lock {grace:.1f}s after DROP_LOCK; "
                                f"killing it (unresponsive_holder=kill)")
            pidfd = conn.pidfd if conn is not None else None
            if pidfd is None or conn is None:
                self.logger.error(f"{where}: its process cannot be told apart from a reused pid; "
                                  f"not signalled")
            else:
                # The pidfd taken at registration pins the process; uid, job and run state are
                # checked again now (procinfo.signal_checked, the one checked kill).
                why_not = signal_checked(ProcIdentity(conn.pid, conn.uid, -1, ANY_START,
                                                      info.job_id), signal.SIGKILL, pidfd)
                if why_not:
                    self.logger.warning(f"{where}: not signalled: {why_not}")
            if conn is not None:
                self.logger.warning(f"{where}: lock revoked, connection closed")
                conn.abort()          # drops its lock and queue place: the next waiter runs
            return []
        # Revoked even when nobody waits now (its owner's own clients may wait benched): a holder
        # that keeps an unanswered DROP_LOCK would keep the GPU from whoever comes next.
        self.logger.warning(f"{where}: has not released the lock {grace:.1f}s after DROP_LOCK "
                            f"(unresponsive; policy warn): lock revoked and handed on; what it "
                            f"still runs there is not gated")
        return gpu.release(info.client_id, self.core.now())
