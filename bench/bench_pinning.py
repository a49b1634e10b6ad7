"""How fast can a first swap-out leave the GPU? (issue 28: Slurm 22.05 freezes a suspended job 2 s
after SIGTSTP, and on the H100 the hook moved only 3.0-3.8 GiB of 63 GiB in that time.)

The hook's swap-out (csrc/swap.c) copies 256 MiB chunks to pinned host memory it allocates with
cuMemHostAlloc as it goes, and keeps that copy for later swaps, which then run at bus speed. This
measures, for the same total, one after the other on one GPU (driver API through ctypes, the device
memory from PyTorch):
  hook       per chunk: cuMemHostAlloc, then cuMemcpyDtoH (what the hook does on a first swap)
  warm       cuMemcpyDtoH into host memory pinned before (a later swap)
  pageable   cuMemcpyDtoH into malloc'd memory never touched before (the driver stages it)
  pinners-N  N threads allocate pinned chunks ahead while the main thread copies each one as soon
             as it is pinned
  register-4k / register-thp
             per chunk: mmap anonymous memory (register-thp: madvise(MADV_HUGEPAGE), so the kernel
             backs it with 2 MiB pages), cuMemHostRegister it, then copy: the other way to pin
  populate-thp-N
             N threads mmap + MADV_HUGEPAGE + MADV_POPULATE_WRITE (the pages made and zeroed in
             parallel) and cuMemHostRegister ahead, the main thread copies
Each line: seconds and GB/s for the total. GPU machine only.

  python3 bench/bench_pinning.py [--gib 8] [--threads 4]
"""
from __future__ import annotations

import argparse
import ctypes
import queue
import threading
import time

CHUNK = 256 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    import torch
    total = int(args.gib * (1 << 30)) // CHUNK * CHUNK
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    dev.fill_(7)
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert cu.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value
    base = dev.data_ptr()
    n = total // CHUNK

    def pin() -> ctypes.c_void_p:
        p = ctypes.c_void_p()
        rc = cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(CHUNK), 0)
        assert rc == 0, rc
        return p

    def copy(host: int, i: int) -> None:
        rc = cu.cuMemcpyDtoH_v2(ctypes.c_void_p(host), ctypes.c_uint64(base + i * CHUNK),
                                ctypes.c_size_t(CHUNK))
        assert rc == 0, rc

    def report(name: str, seconds: float) -> None:
        rate = total / seconds / 1e9
        print(f"{name:12s} {total / (1 << 30):6.1f} GiB in {seconds:6.3f} s: {rate:6.1f} GB/s", flush=True)

    t = time.perf_counter()
    hooked = []
    for i in range(n):
        hooked.append(pin())
        copy(hooked[-1].value, i)
    report("hook", time.perf_counter() - t)

    t = time.perf_counter()
    for i, p in enumerate(hooked):
        copy(p.value, i)
    report("warm", time.perf_counter() - t)
    for p in hooked:
        cu.cuMemFreeHost(p)

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    buf = libc.malloc(ctypes.c_size_t(total))
    t = time.perf_counter()
    for i in range(n):
        copy(buf + i * CHUNK, i)
    report("pageable", time.perf_counter() - t)
    libc.free(ctypes.c_void_p(buf))

    pinners(cu, ctx, n, args.threads, pin, copy, report, lambda p: cu.cuMemFreeHost(p))
    thp = "?"
    try:
        thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    except OSError:
        pass
    print(f"transparent_hugepage: {thp}", flush=True)
    mapper = Mapper(libc, cu)
    for name, huge, populate in (("register-4k", False, False), ("register-thp", True, False)):
        t = time.perf_counter()
        done = []
        for i in range(n):
            done.append(mapper.pinned(huge, populate))
            copy(done[-1], i)
        report(name, time.perf_counter() - t)
        for p in done:
            mapper.release(p)
    for threads in sorted({1, 2, args.threads}):
        pinners(cu, ctx, n, threads, lambda: mapper.pinned(True, True), copy, report, mapper.release,
                name=f"populate-thp-{threads}")


class Mapper:
    """Anonymous host memory made by mmap, pinned by cuMemHostRegister."""
    MADV_HUGEPAGE, MADV_POPULATE_WRITE = 14, 23

    def __init__(self, libc, cu) -> None:
        self.libc, self.cu = libc, cu
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.maps: dict[int, tuple[int, int]] = {}

    def pinned(self, huge: bool, populate: bool) -> int:
        span = CHUNK + (2 << 20)
        raw = self.libc.mmap(None, span, 3, 0x22, -1, 0)   # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
        assert raw not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        p = (raw + (2 << 20) - 1) & ~((2 << 20) - 1)
        if huge:
            self.libc.madvise(p, CHUNK, self.MADV_HUGEPAGE)
        if populate:
            self.libc.madvise(p, CHUNK, self.MADV_POPULATE_WRITE)   # EINVAL before Linux 5.14: no harm
        rc = self.cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(CHUNK), 0)
        assert rc == 0, rc
        self.maps[p] = (raw, span)
        return p

    def release(self, p) -> None:
        p = p.value if isinstance(p, ctypes.c_void_p) else p
        self.cu.cuMemHostUnregister(ctypes.c_void_p(p))
        raw, span = self.maps.pop(p)
        self.libc.munmap(raw, span)


def pinners(cu, ctx, n, threads, pin, copy, report, free, name=None) -> None:
    if name is None:
        for t in sorted({1, 2, threads}):
            pinners(cu, ctx, n, t, pin, copy, report, free, name=f"pinners-{t}")
        return
    ready: queue.Queue = queue.Queue()
    todo = iter(range(n))
    lock = threading.Lock()

    def pinner(todo=todo, lock=lock, ready=ready) -> None:
        cu.cuCtxSetCurrent(ctx)
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            ready.put((i, pin()))

    t = time.perf_counter()
    workers = [threading.Thread(target=pinner) for _ in range(threads)]
    for w in workers:
        w.start()
    done = []
    for _ in range(n):
        i, p = ready.get()
        copy(p.value if isinstance(p, ctypes.c_void_p) else p, i)
        done.append(p)
    report(name, time.perf_counter() - t)
    for w in workers:
        w.join()
    for p in done:
        free(p)


if __name__ == "__main__":
    main()
