"""Builds csrc/ into nvshare_slurm/libnvshare.so inside a platform-tagged wheel.

libnvshare.so is a plain shared library (LD_PRELOAD), not a Python extension: it is compiled by
setuptools' own compiler step, named without an ABI suffix, and the wheel is tagged py3-none-<platform>
so one wheel serves every Python 3 on that platform. The wire-format header ships beside it, where
nvshare_slurm/proto.py reads it.

Which glibc the hook needs decides where the wheel loads. The environment variable NVSHARE_HOOK_CC
picks the compiler:
  cc    (default) setuptools' compiler, gcc: editable, development and on-node installs; the .so
        needs the glibc of the build machine (2.34 or newer on Debian 12, EL9 and Ubuntu 22.04).
  zig   `python -m ziglang cc -target <arch>-linux-gnu.2.28` (pip package ziglang): links against
        glibc 2.28's symbols, so the .so loads on EL8, Ubuntu 20.04 and everything newer.
The wheel is tagged manylinux_2_28_<arch> only when the built .so needs nothing newer than glibc 2.28
(buildtools/elf_needs.py reads that from the file), else with the plain platform tag.
scripts/build-wheel.sh builds the release wheel with zig and checks it with auditwheel.
"""
import glob
import importlib.util
import os
import platform
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - wheel is a build requirement
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK_SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.c")))
# A header change rebuilds the library (every part includes the headers of the parts below it).
HOOK_HEADERS = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.h")))

sys.path.insert(0, os.path.join(HERE, "buildtools"))
from elf_needs import MANYLINUX_BASELINE, glibc_needed  # noqa: E402
from hook_build import HOOK_CFLAGS, HOOK_LDFLAGS, HOOK_LIBRARIES, VERSION_SCRIPT  # noqa: E402


def hook_compiler() -> list[str] | None:
    """The zig command line when zig builds the hook; None for setuptools' own compiler (cc)."""
    choice = os.environ.get("NVSHARE_HOOK_CC", "cc")
    if choice not in ("zig", "cc"):
        raise SystemExit(f"NVSHARE_HOOK_CC={choice!r}: expected zig or cc")
    if choice == "cc":
        return None
    if importlib.util.find_spec("ziglang") is None:
        raise SystemExit("NVSHARE_HOOK_CC=zig needs the ziglang package (pip install ziglang)")
    target = "{}-linux-gnu.{}.{}".format(platform.machine(), *MANYLINUX_BASELINE)
    # clang ignores gcc's optimize("optimize-sibling-calls") on the dlsym wrappers; at -O2 it makes
    # those tail calls anyway (objdump: both end in `jmp *%rax`), and tests/hook/test_wheel.py runs the
    # hook tests, dlsym routes included, on this build.
    return [sys.executable, "-m", "ziglang", "cc", "-target", target, "-g0", "-Wno-unknown-attributes"]


class BuildLibnvshare(build_ext):
    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext):
        zig = hook_compiler()
        if zig:
            self.compiler.set_executables(compiler_so=zig, linker_so=zig + ["-shared"])
        else:
            self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a not in ("-g",)]
        objects = self.compiler.compile(
            ext.sources, output_dir=self.build_temp, include_dirs=["csrc"], extra_postargs=HOOK_CFLAGS)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        self.compiler.link_shared_object(
            objects, target, libraries=HOOK_LIBRARIES, extra_postargs=HOOK_LDFLAGS)


class BuildPyWithHeader(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "nvshare_slurm")
        os.makedirs(dest, exist_ok=True)
        shutil.copy(os.path.join(HERE, "csrc", "nvshare_proto.h"), dest)


cmdclass = {"build_ext": BuildLibnvshare, "build_py": BuildPyWithHeader}

if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            if plat.startswith("linux_"):
                built = os.path.join(self.bdist_dir, "nvshare_slurm", "libnvshare.so")
                if os.path.exists(built) and glibc_needed(built) <= MANYLINUX_BASELINE:
                    plat = "manylinux_{}_{}_".format(*MANYLINUX_BASELINE) + plat[len("linux_"):]
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

# What an admin copies from (slurm.conf and gres.conf snippets, the systemd unit, the example config)
# and the docs the unit's Documentation= names: <prefix>/share/nvshare-slurm,
# <prefix>/share/doc/nvshare-slurm.
def repo_files(*patterns: str) -> list[str]:
    return sorted(os.path.relpath(p, HERE) for pattern in patterns
                  for p in glob.glob(os.path.join(HERE, pattern)))


DATA_FILES = [
    ("share/nvshare-slurm", repo_files("slurm/*")),
    ("share/doc/nvshare-slurm", repo_files("README.md", "LICENSE", "docs/*.md")),
]

setup(
    data_files=DATA_FILES,
    ext_modules=[Extension("nvshare_slurm.libnvshare", sources=HOOK_SOURCES,
                           depends=HOOK_HEADERS + [VERSION_SCRIPT])],
    cmdclass=cmdclass,
)
