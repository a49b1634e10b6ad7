"""Asks the driver, through cuGetProcAddress_v2 as the CUDA runtime does, for every name given on
stdin (one a line), at cudaVersion 12000 and 13000 with both stream flags, and prints one JSON
object: {name: {"VERSION/FLAGS": "library symbol" | null}}. Run it under LD_PRELOAD=libnvshare.so:
the library named is where the caller's calls would go."""
from __future__ import annotations

import ctypes
import json
import sys


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def main() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    assert cuda.cuInit(0) == 0
    getproc = cuda.cuGetProcAddress_v2
    getproc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                        ctypes.POINTER(ctypes.c_int)]
    found: dict[str, dict[str, str | None]] = {}
    for name in (line.strip() for line in sys.stdin):
        if not name:
            continue
        answers = found.setdefault(name, {})
        for version in (12000, 13000):
            for flags in (0, 2):  # CU_GET_PROC_ADDRESS_DEFAULT, _PER_THREAD_DEFAULT_STREAM
                fn = ctypes.c_void_p()
                status = ctypes.c_int()
                rc = getproc(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(status))
                where = None
                info = DlInfo()
                if rc == 0 and fn.value and libc.dladdr(fn, ctypes.byref(info)):
                    lib = (info.dli_fname or b"?").decode().rsplit("/", 1)[-1]
                    where = f"{lib} {(info.dli_sname or b'?').decode()}"
                answers[f"{version}/{flags}"] = where
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
