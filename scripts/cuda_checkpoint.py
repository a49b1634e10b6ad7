"""NVIDIA's checkpoint driver API (r570+: cuCheckpointProcessLock, ...Checkpoint, ...Restore,
...Unlock, ...GetState), called from outside the target process as the cuda-checkpoint utility
does: issue 28's comparison arm in scripts/gpu_suspend_bench.py. Not used by nvshare itself
(docs/design-scheduler.md "Suspend" says why).

  python3 scripts/cuda_checkpoint.py state PID
  python3 scripts/cuda_checkpoint.py suspend PID [--timeout-ms 10000]    # lock, then checkpoint
  python3 scripts/cuda_checkpoint.py resume PID                          # restore, then unlock

Each action prints one JSON line: the seconds each call took and the driver's result; exit 1 when a
call failed, 2 when the driver has no such API.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
ARGS_BYTES = 128   # every args struct is at most 64 bytes today; zeroed means "no options"


class CheckpointError(Exception):
    pass


class Driver:
    def __init__(self, path: str = "libcuda.so.1"):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise CheckpointError(f"cannot load {path}: {exc}") from exc
        missing = [n for n in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                               "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
                               "cuCheckpointProcessGetState") if not hasattr(self.lib, n)]
        if missing:
            raise CheckpointError(f"{path} has no checkpoint API ({', '.join(missing)}): driver r570 or "
                                  "later needed")
        rc = self.lib.cuInit(0)
        if rc != 0:
            raise CheckpointError(f"cuInit: CUDA error {rc}")

    def _call(self, name: str, pid: int, timeout_ms: int = 0) -> dict:
        args = (ctypes.c_ubyte * ARGS_BYTES)()
        ctypes.c_uint.from_buffer(args).value = timeout_ms   # CUcheckpointLockArgs.timeoutMs
        t0 = time.monotonic()
        rc = getattr(self.lib, name)(ctypes.c_int(pid), ctypes.byref(args))
        return {"call": name, "rc": rc, "seconds": round(time.monotonic() - t0, 4)}

    def state(self, pid: int) -> str:
        st = ctypes.c_int(-1)
        rc = self.lib.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(st))
        return STATES.get(st.value, f"unknown {st.value}") if rc == 0 else f"error {rc}"

    def suspend(self, pid: int, timeout_ms: int) -> list[dict]:
        """Lock (the process's CUDA calls block), then checkpoint (its GPU memory to host memory,
        its context released). Stops at the first call that fails."""
        done = [self._call("cuCheckpointProcessLock", pid, timeout_ms)]
        if done[-1]["rc"] == 0:
            done.append(self._call("cuCheckpointProcessCheckpoint", pid))
        return done

    def resume(self, pid: int) -> list[dict]:
        done = [self._call("cuCheckpointProcessRestore", pid)]
        if done[-1]["rc"] == 0:
            done.append(self._call("cuCheckpointProcessUnlock", pid))
        return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("state", "suspend", "resume"))
    ap.add_argument("pid", type=int)
    ap.add_argument("--timeout-ms", type=int, default=10000, help="the lock's timeout (0: none)")
    ap.add_argument("--library", default="libcuda.so.1")
    a = ap.parse_args(argv)
    if a.pid <= 0 or a.timeout_ms < 0:
        ap.error("the pid must be above 0 and the timeout at least 0")
    try:
        drv = Driver(a.library)
    except CheckpointError as exc:
        print(json.dumps({"action": a.action, "pid": a.pid, "error": str(exc)}), flush=True)
        return 2
    t0 = time.monotonic()
    calls = [] if a.action == "state" else (drv.suspend(a.pid, a.timeout_ms) if a.action == "suspend"
                                            else drv.resume(a.pid))
    out = {"action": a.action, "pid": a.pid, "calls": calls, "seconds": round(time.monotonic() - t0, 4),
           "state": drv.state(a.pid), "ok": all(c["rc"] == 0 for c in calls)}
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
