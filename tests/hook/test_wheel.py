"""The release wheel, built the way scripts/build-wheel.sh builds it (zig against glibc 2.17).

A site installs it on EL7 (glibc 2.17), EL8 or Ubuntu 20.04 as well as on this Debian 12 machine, and
mounts its hook into containers of any of those: it must be tagged manylinux_2_17 (and manylinux2014,
the same floor's older name), its libnvshare.so must need no newer glibc symbol version, auditwheel must
agree, it must carry what an admin copies (slurm/ snippets, the unit, the docs the unit names), and
its hook must pass the same hook tests as the one built by gcc.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "buildtools"))
from elf_needs import MANYLINUX_BASELINE, glibc_needed, needed_libraries, needed_versions  # noqa: E402

BASELINE = "manylinux_{}_{}".format(*MANYLINUX_BASELINE)
PLATFORM = f"{BASELINE}_x86_64.manylinux2014_x86_64"     # PEP 600's name, then the same floor's old name
DATA = "nvshare_slurm-0.1.0.data/data"
# The source tree pip sees: everything a build reads, nothing built or tested.
NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                    "tests", "bench", ".venv", ".whl", ".slurmdeb")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, Path]:
    """(the .whl, the directory it was unpacked into)."""
    if platform.machine() != "x86_64":
        pytest.skip("the manylinux wheel is built for x86_64 here")
    missing = [m for m in ("ziglang", "wheel", "auditwheel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e '.[test]')")
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, work / "src", ignore=NOT_SOURCE)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(work / "dist"), str(work / "src")],
        env={**os.environ, "NVSHARE_HOOK_CC": "zig"}, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    whl, = (work / "dist").glob("*.whl")
    with zipfile.ZipFile(whl) as archive:
        archive.extractall(work / "unpacked")
    return whl, work / "unpacked"


def test_the_wheel_is_tagged_for_the_manylinux_baseline(wheel):
    whl, unpacked = wheel
    assert MANYLINUX_BASELINE == (2, 17)
    assert whl.name == f"nvshare_slurm-0.1.0-py3-none-{PLATFORM}.whl"
    meta = (unpacked / "nvshare_slurm-0.1.0.dist-info" / "WHEEL").read_text()
    assert re.findall(r"^Tag: (.*)$", meta, re.M) == [
        f"py3-none-{BASELINE}_x86_64", "py3-none-manylinux2014_x86_64"], meta
    assert "Root-Is-Purelib: false" in meta


def test_its_hook_needs_no_glibc_newer_than_the_baseline(wheel):
    hook = wheel[1] / "nvshare_slurm" / "libnvshare.so"
    needs = needed_versions(hook)
    assert glibc_needed(hook) <= MANYLINUX_BASELINE, needs
    # Before glibc 2.34 dlopen and pthread_create lived in libdl and libpthread: the hook names them.
    assert {"libc.so.6", "libdl.so.2", "libpthread.so.0"} <= set(needs)
    assert {"libc.so.6", "libdl.so.2", "libpthread.so.0"} <= set(needed_libraries(hook))


def test_auditwheel_agrees(wheel):
    shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel[0])],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    m = re.search(r'is consistent with the following platform tag: "manylinux_2_(\d+)_x86_64"', text)
    assert m, text
    assert (2, int(m[1])) <= MANYLINUX_BASELINE, text


def test_the_wheel_carries_the_admins_files(wheel):
    data = wheel[1] / DATA
    shipped = {p.name for p in (data / "share" / "nvshare-slurm").iterdir()}
    assert shipped == {p.name for p in (REPO / "slurm").iterdir()}
    docs = data / "share" / "doc" / "nvshare-slurm"
    assert {"admin-guide.md", "user-guide.md", "LICENSE", "README.md"} <= {p.name for p in docs.iterdir()}
    # The unit names files of a pip install into /opt/nvshare: both must be in the wheel.
    unit = (data / "share" / "nvshare-slurm" / "nvshare-scheduler.service").read_text()
    doc_path = re.search(r"^Documentation=file:///opt/nvshare/(\S+)$", unit, re.M)[1]
    assert (data / doc_path).is_file(), doc_path
    command = re.search(r"^ExecStart=/opt/nvshare/bin/(\S+)$", unit, re.M)[1]
    entry_points = (wheel[1] / "nvshare_slurm-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert re.search(rf"^{command} = ", entry_points, re.M)
    assert "Apache License" in (docs / "LICENSE").read_text()



def test_the_wheel_carries_every_module_of_the_package(wheel):
    """The sub-packages too (pyproject's [tool.setuptools] packages names each), their empty
    __init__.py files, and the header wire/wire.py reads beside the package."""
    package = wheel[1] / "nvshare_slurm"
    shipped = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    checkout = REPO / "nvshare_slurm"
    source = {p.relative_to(checkout).as_posix() for p in checkout.rglob("*.py")}
    assert shipped == source, f"not in the wheel: {sorted(source - shipped)}; " \
                              f"not in the checkout: {sorted(shipped - source)}"
    assert {"policy/__init__.py", "scheduler/__init__.py", "wire/wire.py"} <= shipped
    assert (package / "nvshare_proto.h").is_file()

def test_its_hook_loads_in_old_images(wheel):
    """tests/hook/test_glibc_floor.py's checks of the installed hook, on the wheel's: its references
    (elf_needs.py, and objdump where binutils is) and, where the Debian 11 root is cached, programs
    there with it preloaded."""
    hook = wheel[1] / "nvshare_slurm" / "libnvshare.so"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                          "tests/hook/test_glibc_floor.py", "-k", "installed_hook or objdump"], cwd=REPO,
                         env={**os.environ, "NVSHARE_TEST_LIB": str(hook)},
                         capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\b[23] passed", run.stdout), run.stdout[-2000:]


@pytest.mark.timeout(900)
def test_its_hook_passes_the_hook_tests(wheel):
    """tests/hook/test_hook.py again, with NVSHARE_TEST_LIB naming the wheel's zig-built hook."""
    hook = wheel[1] / "nvshare_slurm" / "libnvshare.so"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x",
                          "tests/hook/test_hook.py"], cwd=REPO,
                         env={**os.environ, "NVSHARE_TEST_LIB": str(hook)},
                         capture_output=True, text=True, timeout=880)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-2000:]


def test_the_check_sees_a_library_that_needs_a_newer_glibc(tmp_path):
    """The same reader on a gcc build against this machine's glibc: readelf agrees, and a library
    that calls pthread_create on glibc 2.34+ needs GLIBC_2.34, which the baseline check refuses."""
    if shutil.which("cc") is None or shutil.which("readelf") is None:
        pytest.skip("needs cc and readelf")
    source = tmp_path / "uses_threads.c"
    source.write_text("#include <pthread.h>\nstatic void *run(void *a) { return a; }\n"
                      "int start(pthread_t *t) { return pthread_create(t, 0, run, 0); }\n")
    lib = tmp_path / "libuses_threads.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-pthread", "-o", str(lib), str(source)], check=True)
    readelf = subprocess.run(["readelf", "-V", "--wide", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert {n for names in needed_versions(lib).values() for n in names} \
        == set(re.findall(r"Name: (\S+)\s+Flags", readelf))
    here = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    if here < (2, 34):
        pytest.skip("this machine's glibc is older than 2.34: nothing newer than the baseline to see")
    assert glibc_needed(lib) >= (2, 34) > MANYLINUX_BASELINE
