"""How libnvshare.so is compiled and linked: the one list of flags.

setup.py builds the library with them (both with setuptools' compiler and with zig), and
tests/hook/test_hook_layers.py compiles each csrc/*.c to an object with the same flags to read the file
graph from the objects' symbols. Pure Python, standard library only: it runs in pip's build
environment.
"""
from __future__ import annotations

VERSION_SCRIPT = "csrc/libnvshare.map"

# -fvisibility=hidden: only what the version script and NVSHARE_EXPORT name leaves the library.
# Hardening, as distributions build their libraries: stack canaries where a function has arrays or
# takes a local's address, and the checked variants of the C library's string, read and poll calls
# (-D_FORTIFY_SOURCE=2 needs optimisation; -U first: some compilers define it already).
# tests/hook/test_hook_hardening.py checks the result; bench/bench_launch.sh measured the launch path
# with and without (docs/design-hook.md "Measured").
HOOK_CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra",
               "-Wno-unused-parameter", "-Werror=implicit-function-declaration",
               "-fstack-protector-strong", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2"]

# -z defs: an undefined symbol is a link error, not a surprise at dlopen in a job. The SONAME is the
# name LD_PRELOAD and the package use. relro + now: the GOT is resolved at load and then read-only,
# so nothing can redirect the hook's calls into the driver or the C library later.
HOOK_LDFLAGS = ["-Wl,-z,defs", "-Wl,--version-script=" + VERSION_SCRIPT, "-pthread",
                "-Wl,-soname,libnvshare.so", "-Wl,-z,relro,-z,now"]
HOOK_LIBRARIES = ["dl", "pthread"]
