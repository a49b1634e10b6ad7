"""libnvshare.so is built as distributions build their libraries (buildtools/hook_build.py).

Its SONAME is the name it is loaded by; the GOT is resolved at load and then read-only (BIND_NOW,
GNU_RELRO); stack canaries and the C library's checked calls (_FORTIFY_SOURCE=2) are compiled in.
The checked calls must not change what the library exports: tests/hook/test_hook.py compares the exports
with the interposed list, and the open family of csrc/devices.c stays under glibc's own versions.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest



@pytest.fixture(autouse=True)
def binutils() -> None:
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.skip("needs readelf and nm (binutils)")


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def test_the_library_names_itself(hook_lib):
    assert re.search(r"\(SONAME\)\s+Library soname: \[libnvshare\.so\]", readelf("-d", str(hook_lib)))


def test_its_relocations_are_resolved_at_load_and_then_read_only(hook_lib):
    dynamic = readelf("-d", str(hook_lib))
    assert re.search(r"\(FLAGS\)\s+.*\bBIND_NOW\b", dynamic) or re.search(r"\(FLAGS_1\)\s+Flags:.*\bNOW\b",
                                                                          dynamic), dynamic
    assert re.search(r"^\s*GNU_RELRO\s", readelf("-l", str(hook_lib)), re.M)


def test_canaries_and_checked_calls_are_compiled_in(hook_lib):
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(hook_lib)], capture_output=True,
                               text=True, check=True).stdout
    names = {line.split()[-1].split("@")[0] for line in undefined.splitlines() if line.strip()}
    assert "__stack_chk_fail" in names
    assert names & {"__snprintf_chk", "__vsnprintf_chk", "__memcpy_chk"}, sorted(names)


def test_the_checked_calls_add_no_export(hook_lib):
    """_FORTIFY_SOURCE turns open() into __open_2: the library defines both under glibc's versions
    (csrc/devices.c), and nothing else of the C library's."""
    defined = subprocess.run(["nm", "-D", "--defined-only", str(hook_lib)], capture_output=True,
                             text=True, check=True).stdout
    names = {line.split()[-1] for line in defined.splitlines() if line.split()[1] in "TtWiV"}
    libc_like = {n for n in names if not n.startswith(("cu", "nvml"))}
    if os.uname().machine == "x86_64":
        assert libc_like == {
            "dlsym@@GLIBC_2.34", "dlsym@GLIBC_2.2.5",
            "open@@GLIBC_2.2.5", "open64@@GLIBC_2.2.5", "openat@@GLIBC_2.4", "openat64@@GLIBC_2.4",
            "__open_2@@GLIBC_2.7", "__open64_2@@GLIBC_2.7", "__openat_2@@GLIBC_2.7",
            "__openat64_2@@GLIBC_2.7", "fopen@@GLIBC_2.2.5", "fopen64@@GLIBC_2.2.5"}, sorted(libc_like)
