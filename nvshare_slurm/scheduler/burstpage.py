"""One burst page per GPU: the shared memory through which co-runners take turns burst by burst.

The daemon only makes the pages and hands them out (BURST_PAGE, the descriptor passed with
SCM_RIGHTS); the jobs' hooks use them (csrc/burst.c). Each page is a memfd sealed against
shrinking and growing, so no job can truncate it under the others (a mapping past the end of a
file raises SIGBUS): the jobs share it, and trust nothing in it.
"""
from __future__ import annotations

import fcntl
import os

PAGE_BYTES = 4096
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def make_page() -> int:
    """A new sealed page: a file descriptor the caller owns."""
    fd = os.memfd_create("nvshare-burst", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, PAGE_BYTES)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except OSError:
        os.close(fd)
        raise
    return fd


class BurstPages:
    """The pages of this node's GPUs, made when first needed, closed with the daemon."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def fd(self, gpu_uuid: str) -> int:
        fd = self._fds.get(gpu_uuid)
        if fd is None:
            fd = self._fds[gpu_uuid] = make_page()
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
