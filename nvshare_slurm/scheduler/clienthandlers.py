"""The messages of a registered client process (libnvshare.so): CLIENT_REGISTER, then
LOCK_REQUEST, LOCK_RELEASED, MEM_UPDATE, DRAIN_STUCK and DEMAND about one GPU of its job.

Each handler checks the message against the connection's peer credentials and its job's placement
(a client in a container's PID namespace: peerpid.py), hands the event to that GPU's policy
(gpustate.py) and the Actions it returns to the core (after_event). Anything a peer may not send
closes its connection (Violation).
"""
from __future__ import annotations

from typing import Any

from ..base import log
from ..policy.demand import Demand
from ..policy.gpumemory import why_refused
from ..policy.gpustate import GpuState
from ..wire import proto
from ..wire.proto import C
from .connection import Connection, Violation, peer_pidfd
from .daemoncore import Core, Handler, fit, mem_reply, reply, size
from .peerpid import namespaced_peer_problem
from .registry import RegisteredClient

# GPUs not placed for its job that one client may name; past it the rest are neither listed in
# status nor logged (NVSHARE_MAX_GPUS is what one process can see).
MAX_UNGATED = 16
UNGATED_MORE = "..."


class ClientHandlers:
    """The handlers of client messages, by message type (handlers())."""

    def __init__(self, core: Core):
        self.core = core
        self.logger = core.logger
        self.registry = core.registry
        self.gpus = core.gpus
        self.gangs = core.gangs

    def handlers(self) -> dict[int, Handler]:
        return {C.NVSHARE_MSG_CLIENT_REGISTER: self._on_client_register,
                C.NVSHARE_MSG_LOCK_REQUEST: self._on_lock_request,
                C.NVSHARE_MSG_LOCK_RELEASED: self._on_lock_released,
                C.NVSHARE_MSG_MEM_UPDATE: self._on_mem_update,
                C.NVSHARE_MSG_DRAIN_STUCK: self._on_drain_stuck,
                C.NVSHARE_MSG_DEMAND: self._on_demand}

    def _on_client_register(self, conn: Connection, frame: proto.Frame) -> None:
        if conn.client is not None:
            raise Violation("CLIENT_REGISTER on a connection that is already registered")
        body = frame.body()
        job = self.registry.jobs.get(body.job_id)

        def refuse(status: int, message: str) -> None:
            self.logger.warning(f"job {body.job_id} pid {conn.pid} uid {conn.uid}: client "
                                f"refused: {message}")
            self.registry.refused.add(int(body.job_id), conn.pid, conn.uid, message)
            conn.send(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                      {"status": status, "message": fit(message)}, frame.seq)
            conn.close()

        if job is None:
            if self.core.park(conn, frame):
                return None
            return refuse(C.NVSHARE_ERR_NOJOB, f"job {body.job_id} is not registered on this node")
        if conn.uid != 0 and conn.uid != job.uid:
            return refuse(C.NVSHARE_ERR_PERM, f"uid {conn.uid} may not attach to job "
                                              f"{job.job_id} of uid {job.uid}")
        if body.pid != conn.pid:
            # Only a process of a PID namespace (a container) in the job's cgroup; from here on
            # the daemon knows it by SO_PEERCRED's pid alone (status, rogue matching, kills).
            problem = namespaced_peer_problem(conn.pid, int(body.pid), job.job_id)
            if problem is not None:
                return refuse(C.NVSHARE_ERR_PERM, problem)
        if self.core.cfg.unresponsive_holder == "kill":
            conn.pidfd = peer_pidfd(conn)
        client = self.registry.add_client(job.job_id, body.step_id, conn.pid, conn.uid, job.user,
                                          body.mem_limit, conn, job.share_class,
                                          bool(body.flags & C.NVSHARE_CLIENT_PREFETCH))
        conn.client = client
        conn.send(C.NVSHARE_MSG_CLIENT_REGISTER_REPLY,
                  {"status": C.NVSHARE_OK, "client_id": client.client_id,
                   "idle_release_us": int(self.core.cfg.idle_release_ms * 1000),
                   "message": "registered"}, frame.seq)
        where = f" from a PID namespace (pid {body.pid} there)" if body.pid != conn.pid else ""
        self.logger.debug(f"{conn.who()}: client registered{where} (client {client.client_id})")

    def _client_gpu(self, conn: Connection, frame: proto.Frame, body: Any) -> GpuState | None:
        """The GPU a client message names, if it is managed and placed for the client's job."""
        if conn.client is None:
            raise Violation(f"{frame.name} before CLIENT_REGISTER")
        uuid = proto.text(body.gpu_uuid)
        job = self.registry.jobs.get(conn.client.job_id)
        gpu = self.gpus.get(uuid)
        if gpu is not None and job is not None and job.rebuilt and uuid not in job.gpus:
            # Its processes were given GPUs before the state was lost: follow them, gated. A GPU
            # of the fresh placement that none of its clients uses gives way to this one.
            used = {u for c in self.registry.job_clients.get(job.job_id, {}).values()
                    for u in c.gpus}
            unused = [i for i, u in enumerate(job.gpus) if u not in used]
            gpus, index = list(job.gpus), list(job.gpu_index)
            if unused:
                gpus[unused[0]], index[unused[0]] = uuid, gpu.index
            else:
                gpus, index = gpus + [uuid], index + [gpu.index]
            job.gpus, job.gpu_index = gpus, index
            self.registry.job_changed(job)
            self.gangs.remove_job(job.job_id)      # now perhaps a gang over more GPUs
            self.core.add_gang(job)
            self.core.save()
            self.logger.info(f"job {job.job_id}: rebuilt from Slurm, its process uses gpu {uuid}: "
                             f"added to its placement")
        if gpu is None or job is None or uuid not in job.gpus:
            ungated = conn.client.ungated
            if uuid in ungated or len(ungated) > MAX_UNGATED:
                return None
            if len(ungated) == MAX_UNGATED:
                # One peer must not grow the daemon's memory, the log or status without bound.
                ungated.add(UNGATED_MORE)
                self.logger.warning(f"{conn.who()}: names more than {MAX_UNGATED} GPUs not "
                                    f"placed for its job; no more of them are listed or logged")
                return None
            ungated.add(uuid)
            self.logger.warning(f"gpu {log.escape(proto.raw(body.gpu_uuid)) or '?'}: {conn.who()}: "
                                f"not a GPU placed "
                                f"for this job; its work there is not gated")
            return None
        conn.client.gpus.add(uuid)
        return gpu

    def _on_lock_request(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return reply(conn, frame, C.NVSHARE_ERR_NOGPU,
                         f"GPU {log.escape(proto.text(body.gpu_uuid))} is not managed "
                         f"for this job")
        if self.core.suspends.park(_info(conn), gpu.uuid):
            return None                  # its job is suspended: asked again when it resumes
        self.core.after_event(gpu, gpu.request(_info(conn), self.core.now()))

    def _on_lock_released(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return
        where = f"gpu {gpu.uuid}: {conn.who()}"
        if body.flags & C.NVSHARE_RELEASE_NO_ROOM:
            # Granted, but its swapped memory could not come back: it asks again later.
            self.core.warnings.warn((gpu.uuid, _info(conn).client_id, "no room"),
                                    f"{where}: lock given back: no room on the GPU to bring its "
                                    f"swapped memory back")
        elif body.flags & C.NVSHARE_RELEASE_SWAPPED:
            self.logger.info(f"{where}: lock released after moving {size(int(body.bytes))} "
                             f"to host memory")
        else:
            self.logger.debug(f"{where}: lock released"
                              f"{' (idle)' if body.flags & C.NVSHARE_RELEASE_IDLE else ''}")
        self.core.after_event(gpu, gpu.release(_info(conn).client_id, self.core.now(),
                                               idle=bool(body.flags & C.NVSHARE_RELEASE_IDLE)))

    def _on_mem_update(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            if body.request:
                conn.send(C.NVSHARE_MSG_MEM_REPLY, {"gpu_uuid": proto.raw(body.gpu_uuid),
                                                    "status": C.NVSHARE_ERR_NOGPU}, frame.seq)
            return
        request = int(body.request)
        where = f"gpu {gpu.uuid}: {conn.who()}"
        driver_free = int(body.driver_free_mib) << 20
        if request and body.flags & C.NVSHARE_MEM_DRIVER_OOM:
            self.core.warnings.warn(
                (gpu.uuid, _info(conn).client_id, "driver oom"),
                f"{where}: the driver refused an allocation of {size(request)} that nvshare "
                f"admitted: it had {size(driver_free)} free where nvshare counted "
                f"{size(max(0, gpu.memory.room()))} (memory nobody reports: an ended process's "
                f"not yet released, or a process outside nvshare); the hook waits and tries again")
        actions, decision = gpu.mem_update(_info(conn), self.core.now(), int(body.allocated),
                                           int(body.fixed), int(body.swapped), request,
                                           int(body.flags), frame.seq, driver_free)
        if decision is not None:
            if decision.status != C.NVSHARE_OK:
                self.logger.info(f"{where}: allocation of {size(request)} refused: "
                                 f"{why_refused(gpu.memory, _info(conn), request)}")
            elif decision.flags & C.NVSHARE_MEM_DEFERRED:
                self.logger.info(f"{where}: allocation of {size(request)} deferred: no room "
                                 f"now, made in host memory, resident at its next grant")
            mem_reply(conn, gpu.uuid, decision, frame.seq)
        elif request and gpu.memory.yielding(_info(conn).client_id):
            self.logger.info(f"{where}: allocation of {size(request)} waits while this job gives "
                             f"the GPU up: only a running job could make its room")
        elif request:
            self.logger.info(f"{where}: allocation of {size(request)} waits for room")
        self.core.after_event(gpu, actions)

    def _on_drain_stuck(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return
        info = _info(conn)
        resolution = self.gangs.drain_stuck(gpu, info, self.core.now())
        self.core.warnings.warn(
            (gpu.uuid, info.client_id, "drain stuck"),
            f"gpu {gpu.uuid}: {info.label()}: its work there has not finished "
            f"{int(body.bytes)} ms after it was asked to release (DRAIN_STUCK); {resolution}")
        self.core.after_event(gpu, gpu.tick(self.core.now()))

    def _on_demand(self, conn: Connection, frame: proto.Frame) -> None:
        body = frame.body()
        gpu = self._client_gpu(conn, frame, body)
        if gpu is None:
            return
        spread = int(body.gap_spread_ppm)
        demand = Demand(min(int(body.busy_ppm), 1_000_000) / 1e6, int(body.burst_us) / 1e6,
                        int(body.gap_us) / 1e6,
                        None if spread == proto.C.NVSHARE_SPREAD_UNKNOWN else spread / 1e6)
        info = _info(conn)
        before = gpu.takes_turns(info.client_id)
        self.logger.debug(f"gpu {gpu.uuid}: {conn.who()}: demand {demand.describe()}")
        actions = gpu.report_demand(info, demand, self.core.now())
        if gpu.takes_turns(info.client_id) != before:
            self.logger.debug(f"gpu {gpu.uuid}: {conn.who()}: "
                              f"{'takes turns' if not before else 'co-runs'} ({demand.describe()})")
        self.core.after_event(gpu, actions)


def _info(conn: Connection) -> RegisteredClient:
    """The client of a connection that _client_gpu found registered."""
    if conn.client is None:
        raise Violation("a client message before CLIENT_REGISTER")
    return conn.client
