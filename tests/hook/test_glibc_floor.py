"""Every build of libnvshare.so loads with glibc 2.17 and newer (setup.py, buildtools/glibc_floor.py).

The hook is preloaded into every program of a job, and a container job's image may carry an older
glibc than the node that built the hook (CentOS 7: 2.17, UBI 8: 2.28, Ubuntu 20.04 and Debian 11: 2.31).
A library that needs a newer symbol version stops every program there, /bin/true included, which is
worse than no hook. So: the installed library (tests run against it) references nothing above
GLIBC_2.17 and names libdl and libpthread; preloaded into a Debian 11 root filesystem
(scripts/bullseye-root.sh) with the job's variables set, programs there run; a library built the old
way, for this machine's glibc, fails the same run; and a build whose code needs a function glibc 2.17
lacks fails, loudly, without leaving a library behind.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "buildtools"))
from elf_needs import (MANYLINUX_BASELINE, dynamic_symbols, glibc_needed, glibc_version,  # noqa: E402
                       needed_libraries, symbols_above)
from glibc_floor import OLD_HOMES, plan  # noqa: E402

CACHE = Path(os.environ.get("NVSHARE_BULLSEYE_CACHE", "/var/cache/nvshare-bullseye"))
HERE_GLIBC = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
# The source tree a build sees: everything it reads, nothing built or tested.
NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                    "tests", "bench", ".venv", ".whl", ".slurmdeb")
# A program in the old root: the hook's dlsym answers Python's extension-module lookups, threads
# start, a child forks and exits, and a subprocess inherits the preload.
PYTHON_PROGRAM = """
import _hashlib, os, subprocess, threading
t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print("true", subprocess.run(["/bin/true"]).returncode, _hashlib.new("sha256", b"x").hexdigest()[:8])
"""
LD_SO_ERRORS = re.compile(r"ERROR: ld\.so|cannot be preloaded|version `GLIBC_[^']*' not found|"
                          r"undefined symbol|error while loading shared libraries")


@pytest.fixture(scope="module")
def bullseye() -> Path:
    """The cached Debian 11 root filesystem (glibc 2.31)."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    root = CACHE / "root"
    if not (CACHE / "ready").is_file() or not (root / "bin" / "true").exists():
        log = CACHE / "debootstrap.log"
        last = f"; its last attempt logged to {log}" if log.exists() else ""
        pytest.skip(f"no Debian 11 root filesystem in {root}: scripts/bullseye-root.sh makes it "
                    f"(scripts/test.sh runs it){last}")
    return root


@pytest.fixture
def inside(bullseye) -> Iterator[Path]:
    """A fresh directory in the root's /tmp, removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="nvshare-floor-", dir=bullseye / "tmp"))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_preloaded(root: Path, library: Path, *argv: str, debug: bool = False) -> subprocess.CompletedProcess:
    """argv inside root with library preloaded and the job's variables set, so the hook is active.
    debug: LD_DEBUG=libs,bindings, ld.so says which libraries it initialised and where each symbol
    bound (and reports lookups that fail and are answered, such as the hook's dlvsym of dlsym@GLIBC_2.34)."""
    env = ["PATH=/usr/bin:/bin", f"LD_PRELOAD=/{library.relative_to(root)}",
           "NVSHARE_JOB_ID=4242", f"NVSHARE_SOCKET=/{library.parent.relative_to(root)}/scheduler.sock"]
    env += ["LD_DEBUG=libs,bindings"] if debug else []
    return subprocess.run(["chroot", str(root), "/usr/bin/env", "-i", *env, *argv],
                          capture_output=True, text=True, timeout=120)


def build(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["cc", "-shared", "-fPIC", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def test_the_installed_hook_needs_no_glibc_newer_than_2_17(hook_lib):
    assert MANYLINUX_BASELINE == (2, 17)
    assert symbols_above(hook_lib) == []
    assert glibc_needed(hook_lib) <= (2, 17)
    # glibc < 2.34 defines dlopen, dlvsym and pthread_create in these, not in libc.so.6
    assert set(OLD_HOMES) <= set(needed_libraries(hook_lib)), needed_libraries(hook_lib)


def test_objdump_sees_the_same_references(hook_lib):
    """binutils' reading of the library's undefined symbols and versions, against elf_needs.py's."""
    if shutil.which("objdump") is None:
        pytest.skip("needs objdump (binutils)")
    table = subprocess.run(["objdump", "-T", str(hook_lib)], capture_output=True, text=True,
                           check=True).stdout
    undefined = re.finditer(r"\*UND\*\s+\S+\s+\(?(GLIBC_[\d.]+)\)?\s+(\S+)$", table, re.M)
    theirs = {(m[2], m[1]) for m in undefined}
    ours = {(s.name, s.version) for s in dynamic_symbols(hook_lib)
            if not s.defined and glibc_version(s.version)}
    assert theirs == ours and ours
    assert max(glibc_version(v) for _, v in theirs)[:2] <= (2, 17), sorted(theirs)


def test_the_installed_hook_runs_programs_in_a_debian_11_root(hook_lib, bullseye, inside):
    library = inside / "libnvshare.so"
    shutil.copy(hook_lib, library)
    ran = run_preloaded(bullseye, library, "/bin/true")
    assert ran.returncode == 0 and not LD_SO_ERRORS.search(ran.stderr), ran.stderr[-3000:]
    ran = run_preloaded(bullseye, library, "python3", "-c", PYTHON_PROGRAM)
    assert ran.returncode == 0 and not LD_SO_ERRORS.search(ran.stderr), ran.stderr[-3000:]
    assert ran.stdout.split("\n") == ["thread", "child 7", "true 0 2d711642", ""], ran.stdout

    # ld.so loaded and initialised the hook (it was not skipped), and Python found PyInit__hashlib
    # through the hook's dlsym (dlsym@GLIBC_2.2.5 on x86-64, 2.17 on aarch64).
    ran = run_preloaded(bullseye, library, "python3", "-c", PYTHON_PROGRAM, debug=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"calling init: /{library.relative_to(bullseye)}" in ran.stderr, ran.stderr[-3000:]
    binding = re.search(r"binding file python3 \[0\] to (\S+) \[0\]: normal symbol `dlsym' \[GLIBC_2\.",
                        ran.stderr)
    assert binding and binding[1] == f"/{library.relative_to(bullseye)}", ran.stderr[-3000:]


def test_a_library_built_for_this_glibc_does_not_load_there(bullseye, inside):
    """The run above can fail: a plain cc build of pthread_create on glibc 2.34+ needs GLIBC_2.34,
    and Debian 11's ld.so refuses /bin/true with it preloaded."""
    if HERE_GLIBC < (2, 34):
        pytest.skip("this machine's glibc is older than 2.34: a plain build already loads on 2.31")
    (inside / "t.c").write_text("#include <pthread.h>\nstatic void *run(void *a) { return a; }\n"
                                "int start(pthread_t *t) { return pthread_create(t, 0, run, 0); }\n")
    build("-pthread", "-o", "libplain.so", "t.c", cwd=inside)
    assert symbols_above(inside / "libplain.so") == ["pthread_create@GLIBC_2.34"]
    ran = run_preloaded(bullseye, inside / "libplain.so", "/bin/true")
    assert ran.returncode != 0 and "version `GLIBC_2.34' not found" in ran.stderr, ran.stderr[-3000:]


def test_the_floor_binds_old_versions_and_stat_wrappers_that_load_there(bullseye, inside):
    """glibc_floor.py on a small library of its own: dlopen, pthread_create and fstat (glibc 2.33's
    function, __fxstat64 before) rebound by setup.py's two builds, then called from its constructor
    in the old root."""
    if HERE_GLIBC < (2, 34):
        pytest.skip("this machine's glibc is older than 2.34: nothing to rebind")
    (inside / "t.c").write_text(r"""#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
static void *run(void *a) { return a; }
__attribute__((constructor)) static void check(void)
{
    struct stat st, at;
    pthread_t t;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    int ok = libc && fstat(1, &st) == 0 && fstatat(AT_FDCWD, "/bin/true", &at, 0) == 0 &&
             S_ISREG(at.st_mode) && pthread_create(&t, 0, run, 0) == 0 && pthread_join(t, 0) == 0;
    fprintf(stderr, "floor: %s\n", ok ? "ok" : "FAILED");
}
""")
    build("-pthread", "-o", "libfirst.so", "t.c", "-ldl", cwd=inside)
    glibc = [Path(subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True, text=True,
                                 check=True).stdout.strip()) for name in ("libc.so.6", "libdl.so.2",
                                                                          "libpthread.so.0")]
    floor = plan(inside / "libfirst.so", glibc, os.uname().machine)
    assert {"dlopen", "pthread_create"} <= set(floor.symvers) and {"fstat", "fstatat"} <= set(floor.wrappers)
    (inside / "floor.h").write_text(floor.header)
    (inside / "compat.c").write_text(floor.compat_source)
    build("-pthread", "-include", "floor.h", "-o", "libfloor.so", "t.c", "compat.c",
          "-Wl,--no-as-needed", *[f"-l:{name}" for name in OLD_HOMES], cwd=inside)
    assert symbols_above(inside / "libfloor.so") == []
    assert not {"fstat", "fstatat"} & {s.name for s in dynamic_symbols(inside / "libfloor.so")}

    here = subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(inside / "libfloor.so")},
                          capture_output=True, text=True)
    assert here.returncode == 0 and "floor: ok" in here.stderr, here.stderr
    ran = run_preloaded(bullseye, inside / "libfloor.so", "/bin/true")
    assert ran.returncode == 0 and not LD_SO_ERRORS.search(ran.stderr), ran.stderr[-3000:]
    assert "floor: ok" in ran.stderr, ran.stderr[-3000:]


@pytest.mark.timeout(600)
def test_a_build_that_needs_a_newer_glibc_fails_and_installs_nothing(tmp_path):
    """A change to csrc/ that calls memfd_create (glibc 2.27): setup.py stops, names the function,
    and the package gets no library."""
    if HERE_GLIBC < (2, 27) or shutil.which("cc") is None:
        pytest.skip("needs cc and a glibc with memfd_create (2.27+)")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE)
    (src / "csrc" / "zz_newer.c").write_text(
        "#define _GNU_SOURCE\n#include <sys/mman.h>\n"
        "__attribute__((visibility(\"hidden\"))) int nvshare_zz_newer(void)"
        " { return memfd_create(\"x\", 0); }\n")
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src,
                           env={**os.environ, "NVSHARE_HOOK_CC": "cc"}, capture_output=True, text=True,
                           timeout=580)
    out = built.stdout + built.stderr
    assert built.returncode != 0, out[-3000:]
    assert "memfd_create@GLIBC_2.27" in out and "Not installed" in out, out[-3000:]
    assert not (src / "nvshare_slurm" / "libnvshare.so").exists()
