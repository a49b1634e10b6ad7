"""The site's own TaskProlog (config `site_task_prolog`), run by nvshare-taskprolog.

Slurm runs one TaskProlog per task, a single program with no arguments, on 22.05 and 24.11 alike
(Prolog= and Epilog= take globs; TaskProlog= does not). So nvshare-taskprolog runs the site's
program itself, the way slurmstepd would have: as the job's user, with the task's environment, its
stdin /dev/null, its stdout and stderr one pipe, in a process group of its own. It starts the
program before asking the daemon, so the two overlap, and prints what the program printed, then
its own lines.

Slurm applies a TaskProlog's output line by line (task.c _proc_stdout): `export NAME=value` sets,
`unset NAME` clears, `print ...` writes to the task's stdout, anything else is ignored, a later
line wins, and the output ends at the first NUL. The site's output goes first and unchanged (cut at
a NUL, ended with a newline), so its lines mean what they meant; nvshare's exports come after it,
so for the variables nvshare sets nvshare's value wins, except LD_PRELOAD, which becomes the hook
followed by the entries the site's lines left in it.

The program's exit status is kept: Slurm fails the task when a TaskProlog exits non-zero, and does
not apply the output of one killed by a signal. One that runs past `site_task_prolog_timeout` is
killed with its process group and fails the task (status 1); Slurm itself would wait forever.
It imports only `select` on the way through: it runs before every task.
"""
from __future__ import annotations

import os
import select
import time

EXEC_FAILED = 127          # Slurm's status for a TaskProlog it cannot execute (run_command.c)
NOT_NORMAL = 1             # Slurm's status for one that did not exit normally (task.c)


class SiteResult:
    """What the site's TaskProlog left: the output Slurm would apply (b"" when none), its status
    for the task (0: the task runs), and, when it failed, why in words."""
    __slots__ = ("output", "status", "problem")

    def __init__(self, output: bytes, status: int, problem: str = ""):
        self.output, self.status, self.problem = output, status, problem


class NotStarted:
    """A site TaskProlog that cannot be started: the task fails (status 1), as in Slurm."""

    def __init__(self, problem: str):
        self.result = SiteResult(b"", NOT_NORMAL, problem)

    def finish(self) -> SiteResult:
        return self.result


class SiteTaskProlog:
    """The site's program, started; `finish` collects it."""

    def __init__(self, path: str, timeout: float, environ: dict[str, str]):
        self.path, self.timeout = path, timeout
        self.started = time.monotonic()
        self.pid = 0
        self.failed: SiteResult | None = None
        self.read_end = -1
        try:
            read_end, write_end = os.pipe()     # both close-on-exec; dup2 clears it on 1 and 2
        except OSError as exc:
            self.failed = SiteResult(b"", NOT_NORMAL, f"cannot start {path}: {exc.strerror}")
            return
        try:
            self.pid = os.posix_spawn(
                path, [path], environ, setpgroup=0,
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                              (os.POSIX_SPAWN_DUP2, write_end, 1),
                              (os.POSIX_SPAWN_DUP2, write_end, 2)])
            self.read_end = read_end
        except OSError as exc:
            os.close(read_end)
            self.failed = SiteResult(b"", EXEC_FAILED, f"cannot run {path}: {exc.strerror or exc}")
        finally:
            os.close(write_end)

    def finish(self) -> SiteResult:
        if self.failed is not None:
            return self.failed
        deadline = self.started + self.timeout
        output = self._read_until_eof(deadline)
        status = self._wait(deadline) if output is not None else None
        if output is None or status is None:
            import signal       # here: its import costs ~1 ms of every task
            try:
                os.killpg(self.pid, signal.SIGKILL)     # the group: what it started dies with it
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            return SiteResult(b"", NOT_NORMAL, f"{self.path} still ran after {self.timeout:g} s: "
                                              f"killed with its process group")
        if os.WIFSIGNALED(status):
            return SiteResult(b"", NOT_NORMAL,
                              f"{self.path} was killed by signal {os.WTERMSIG(status)}")
        code = os.waitstatus_to_exitcode(status)
        return SiteResult(slurm_text(output), code,
                          f"{self.path} exited with status {code}" if code else "")

    def _read_until_eof(self, deadline: float) -> bytes | None:
        """Everything the program writes until the pipe closes, or None at the deadline."""
        poller = select.poll()
        poller.register(self.read_end, select.POLLIN)
        chunks: list[bytes] = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if not poller.poll(left * 1000 + 1):
                    continue
                chunk = os.read(self.read_end, 65536)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(self.read_end)

    def _wait(self, deadline: float) -> int | None:
        """The program's wait status, or None at the deadline (it closed its output and goes on)."""
        delay = 0.0005
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return status
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def slurm_text(output: bytes) -> bytes:
    """The output as Slurm reads it: up to the first NUL, ended with a newline so that a line
    printed after it starts a line of its own. Bytes: passed on as the program wrote them."""
    text = output.split(b"\0", 1)[0]
    return text if not text or text.endswith(b"\n") else text + b"\n"


def changes(output: bytes) -> dict[str, str | None]:
    """The variables the output sets (value) or clears (None), last line winning, parsed the way
    slurmstepd parses a TaskProlog's output (text as os.environ decodes it)."""
    result: dict[str, str | None] = {}
    for line in output.decode("utf-8", "surrogateescape").split("\n"):
        if line.startswith("export "):
            name, equal, value = line[7:].lstrip().partition("=")
            if equal:
                result[name.rstrip()] = value
        elif line.startswith("unset "):
            name = line[6:].strip()
            if name:
                result[name] = None
    return result
