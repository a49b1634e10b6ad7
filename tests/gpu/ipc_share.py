"""Two processes of one job share CUDA memory as torch.multiprocessing and vLLM's custom all-reduce
do (cudaIpcGetMemHandle / cudaIpcOpenMemHandle), under the hook with swap on.

The parent holds --big-mib of other memory and two 64 MiB buffers: a tensor sent to a spawned child
through a torch.multiprocessing queue, and a raw buffer whose handle it takes itself with
cudaIpcGetMemHandle through ctypes on the libcudart that torch loaded. Handshake by files in --dir,
so the test can make another job force swaps in between:
  parent: fills the shared memory, sends it           child: checks it, writes 'opened'
  test: another job makes the parent swap, writes 'go'
  child: writes the second halves, writes 'child-wrote'
  parent: checks both halves and its other memory, writes the first halves, writes 'parent-wrote'
  child: checks them, writes 'child-done'.
Last line of stdout: JSON (parent's and child's findings).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

MiB = 1 << 20
SHARED = 64 * MiB


def wait_file(path: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} never came")
        time.sleep(0.02)


def cudart():
    """The libcudart that torch loaded (dynamically linked wheels), or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libcudart.so" in line:
            return ctypes.CDLL(line.split()[-1])
    return None


class IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]  # cudaIpcMemHandle_t, passed by value


def raw_open(rt, handle: bytes):
    ptr = ctypes.c_void_p()
    rt.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcMemHandle, ctypes.c_uint]
    value = IpcMemHandle()
    ctypes.memmove(ctypes.byref(value), handle, 64)
    rc = rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), value, 1)  # cudaIpcMemLazyEnablePeerAccess
    return rc, ptr.value


def raw_read(rt, ptr: int, n: int) -> bytes:
    buf = ctypes.create_string_buffer(n)
    rc = rt.cudaMemcpy(buf, ctypes.c_void_p(ptr), ctypes.c_size_t(n), 2)  # device to host
    assert rc == 0, f"cudaMemcpy: {rc}"
    return buf.raw


def child(queue, results, folder: str) -> None:
    d = Path(folder)
    found: dict = {}
    shared, raw = queue.get()
    found["opened_value_ok"] = bool((shared == 1.0).all().item())
    rt = cudart()
    raw_ptr = None
    if raw is not None and rt is not None:
        handle, offset = raw
        rc, base = raw_open(rt, handle)
        found["raw_open_rc"] = rc
        if rc == 0:
            raw_ptr = base + offset
            found["raw_opened_value_ok"] = raw_read(rt, raw_ptr, 4096) == b"\x07" * 4096
    (d / "opened").touch()
    wait_file(d / "go")
    half = shared.numel() // 2
    shared[half:] = 2.0
    if raw_ptr is not None:
        assert rt.cudaMemset(ctypes.c_void_p(raw_ptr + SHARED // 2), 0x42, ctypes.c_size_t(SHARED // 2)) == 0
        assert rt.cudaDeviceSynchronize() == 0
    torch.cuda.synchronize()
    (d / "child-wrote").touch()
    wait_file(d / "parent-wrote")
    found["parent_writes_seen"] = bool((shared[:half] == 3.0).all().item())
    if raw_ptr is not None:
        found["raw_parent_writes_seen"] = raw_read(rt, raw_ptr, 4096) == b"\x09" * 4096
        found["raw_close_rc"] = rt.cudaIpcCloseMemHandle(ctypes.c_void_p(raw_ptr - offset))
    results.put(found)
    del shared
    (d / "child-done").touch()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--big-mib", type=int, default=4096)
    args = ap.parse_args()
    d = Path(args.dir)
    torch.cuda.init()
    big = torch.arange(args.big_mib * MiB // 4, device="cuda", dtype=torch.float32)
    # Samples, not a sum: no second copy of `big`, and exact.
    probes = torch.arange(0, big.numel(), 4099, device="cuda")
    big_sample = big[probes].cpu()
    shared = torch.ones(SHARED // 4, device="cuda")
    raw_buf = torch.full((SHARED,), 7, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out: dict = {"parent": {}, "child": {}}
    rt = cudart()
    raw = None
    if rt is not None:
        handle = IpcMemHandle()
        rc = rt.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(raw_buf.data_ptr()))
        out["parent"]["raw_get_rc"] = rc
        libcuda = ctypes.CDLL("libcuda.so.1")
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                        ctypes.c_uint64(raw_buf.data_ptr()))
        if rc == 0:
            raw = (bytes(ctypes.string_at(ctypes.byref(handle), 64)), raw_buf.data_ptr() - base.value)
    else:
        out["parent"]["raw"] = "skipped: torch loaded no libcudart"
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(queue, results, str(d)))
    proc.start()
    queue.put((shared, raw))
    wait_file(d / "child-wrote")
    half = shared.numel() // 2
    out["parent"]["child_writes_seen"] = bool((shared[half:] == 2.0).all().item())
    out["parent"]["own_half_intact"] = bool((shared[:half] == 1.0).all().item())
    out["parent"]["big_intact"] = bool(torch.equal(big[probes].cpu(), big_sample))
    if raw is not None:
        out["parent"]["raw_child_writes_seen"] = bool((raw_buf[SHARED // 2:] == 0x42).all().item())
        raw_buf[:SHARED // 2] = 9
    shared[:half] = 3.0
    torch.cuda.synchronize()
    (d / "parent-wrote").touch()
    out["child"] = results.get(timeout=240)
    proc.join(60)
    out["child_exit"] = proc.exitcode
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
