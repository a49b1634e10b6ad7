"""How libnvshare.so is compiled and linked: the one list of flags.

setup.py builds the library with them (both with setuptools' compiler and with zig), and
tests/test_hook_layers.py compiles each csrc/*.c to an object with the same flags to read the file
graph from the objects' symbols. Pure Python, standard library only: it runs in pip's build
environment.
"""
from __future__ import annotations

VERSION_SCRIPT = "csrc/libnvshare.map"

# -fvisibility=hidden: only what the version script and NVSHARE_EXPORT name leaves the library.
HOOK_CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra",
               "-Wno-unused-parameter", "-Werror=implicit-function-declaration"]

# -z defs: an undefined symbol is a link error, not a surprise at dlopen in a job.
HOOK_LDFLAGS = ["-Wl,-z,defs", "-Wl,--version-script=" + VERSION_SCRIPT, "-pthread"]
HOOK_LIBRARIES = ["dl", "pthread"]
