"""A scripted stand-in for nvshare-scheduler on a Unix socket, shared by the hook tests that need a
daemon behaving in a way the real one never does (tests/hook/test_hook_refused.py,
tests/hook/test_hook_stall.py). A subclass says how a connection is served."""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path


class ScriptedDaemon:
    """Listens on path (any uid may connect) and serves each accepted connection on its own thread
    with serve(conn, number), number counting connections from 0. stop() closes the listening socket
    and every connection: the socket file stays, a connect is refused, as when the daemon's process
    is gone."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.cond = threading.Condition()
        self.conns: list[socket.socket] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        os.chmod(self.path, 0o777)
        self.server.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def serve(self, conn: socket.socket, number: int) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.cond:
                number = len(self.conns)
                self.conns.append(conn)
            threading.Thread(target=self.serve, args=(conn, number), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # close() alone leaves it listening under accept()
        self.server.close()
        with self.cond:
            conns = list(self.conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
