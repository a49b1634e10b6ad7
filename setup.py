"""Builds csrc/ into nvshare_slurm/libnvshare.so inside a platform-tagged wheel.

libnvshare.so is a plain shared library (LD_PRELOAD), not a Python extension: it is compiled by
setuptools' own compiler step, named without an ABI suffix, and the wheel is tagged py3-none-<platform>
so one wheel serves every Python 3 on that platform. The wire-format header ships beside it, where
nvshare_slurm/wire/proto.py reads it.

The hook is preloaded into every program of a job, containers with old images included: every build
must need no glibc newer than 2.17 (MANYLINUX_BASELINE in buildtools/elf_needs.py; EL7, and the first
glibc of aarch64), or ld.so refuses it and the program does not start. The environment variable
NVSHARE_HOOK_CC picks the compiler:
  cc    (default) setuptools' compiler, gcc: install.sh, `pip install .`, editable installs. Built
        twice when the build machine's glibc is newer: buildtools/glibc_floor.py binds each reference
        above 2.17 to that glibc's older version of it (pthread_create@GLIBC_2.2.5, ...).
  zig   `python -m ziglang cc -target <arch>-linux-gnu.2.17` (pip package ziglang): links against
        glibc 2.17's symbols directly. scripts/build-wheel.sh builds the release wheel so.
Either way the built library is checked: a reference above 2.17, or libdl.so.2 / libpthread.so.0
missing from its DT_NEEDED (glibc < 2.34 keeps dlopen and pthread_create there), fails the build.
The wheel is tagged manylinux_2_17_<arch>.manylinux2014_<arch>.
tests/hook/test_glibc_floor.py preloads the installed library into a Debian 11 root filesystem;
tests/hook/test_wheel.py checks the zig-built wheel.
"""
import glob
import importlib.util
import itertools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

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
from elf_needs import MANYLINUX_BASELINE, glibc_needed, needed_libraries, symbols_above  # noqa: E402
from glibc_floor import GLIBC_LIBRARIES, OLD_HOMES, FloorError, plan  # noqa: E402
from hook_build import HOOK_CFLAGS, HOOK_LDFLAGS, HOOK_LIBRARIES, VERSION_SCRIPT  # noqa: E402

FLOOR = "{}.{}".format(*MANYLINUX_BASELINE)


def hook_compiler() -> list[str] | None:
    """The zig command line when zig builds the hook; None for setuptools' own compiler (cc)."""
    choice = os.environ.get("NVSHARE_HOOK_CC", "cc")
    if choice not in ("zig", "cc"):
        raise SystemExit(f"NVSHARE_HOOK_CC={choice!r}: expected zig or cc")
    if choice == "cc":
        return None
    if importlib.util.find_spec("ziglang") is None:
        raise SystemExit("NVSHARE_HOOK_CC=zig needs the ziglang package (pip install ziglang)")
    target = f"{platform.machine()}-linux-gnu.{FLOOR}"
    # clang ignores gcc's optimize("optimize-sibling-calls") on the dlsym wrappers; at -O2 it makes
    # those tail calls anyway (objdump: both end in `jmp *%rax`), and tests/hook/test_wheel.py runs the
    # hook tests, dlsym routes included, on this build.
    return [sys.executable, "-m", "ziglang", "cc", "-target", target, "-g0", "-Wno-unknown-attributes"]


def check_floor(library: str) -> None:
    """Fails the build, loudly, for a library that ld.so would refuse on glibc 2.17."""
    above = symbols_above(library)
    if above or glibc_needed(library) > MANYLINUX_BASELINE:
        raise SystemExit(f"setup.py: {library} needs a glibc newer than {FLOOR} ({', '.join(above)}); "
                         "preloaded into an older image it would stop every program. Not installed.")
    missing = [name for name in OLD_HOMES if name not in needed_libraries(library)]
    if missing:
        raise SystemExit(f"setup.py: {library} does not name {', '.join(missing)}: on glibc < 2.34 its "
                         "dlopen and pthread_create would be missing. Not installed.")


class BuildLibnvshare(build_ext):
    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext):
        zig = hook_compiler()
        link_args = list(HOOK_LDFLAGS)
        if zig:
            self.compiler.set_executables(compiler_so=zig, linker_so=zig + ["-shared"])
        else:
            self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a not in ("-g",)]
            # DT_NEEDED even where glibc >= 2.34 defines everything in libc.so.6 (and under --as-needed)
            link_args += ["-Wl,--push-state,--no-as-needed"] + [f"-l:{name}" for name in OLD_HOMES] \
                + ["-Wl,--pop-state"]
        # Built and checked in build_temp; only a library that passes reaches the package (an
        # editable install's checkout included), so a failed build leaves no library that breaks programs.
        built = os.path.join(self.build_temp, "libnvshare.so")
        objects = self.compiler.compile(
            ext.sources, output_dir=self.build_temp, include_dirs=["csrc"], extra_postargs=HOOK_CFLAGS)
        self.compiler.link_shared_object(
            objects, built, libraries=HOOK_LIBRARIES, extra_postargs=link_args)
        if not zig:
            self.bind_to_the_floor(ext, built, link_args)
        check_floor(built)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target + ".new")
        os.chmod(target + ".new", 0o755)
        os.replace(target + ".new", target)   # a running job's mapping of the old file stays intact

    def glibc_files(self) -> list[Path]:
        """The build machine's glibc libraries, where the compiler finds them."""
        # the command without its options: "gcc", or "ccache gcc"
        cc = list(itertools.takewhile(lambda a: not a.startswith("-"), self.compiler.compiler_so))
        found = []
        for name in GLIBC_LIBRARIES:
            out = subprocess.run(cc + [f"-print-file-name={name}"], capture_output=True,
                                 text=True).stdout.strip()
            if os.path.isabs(out) and os.path.exists(out):
                found.append(Path(out))
        if not any(p.name == "libc.so.6" for p in found):
            raise SystemExit(f"setup.py: {' '.join(cc)} -print-file-name=libc.so.6 finds no libc.so.6: "
                             f"cannot bind the hook to glibc {FLOOR}'s versions (NVSHARE_HOOK_CC=zig?). "
                             "Not installed.")
        return found

    def bind_to_the_floor(self, ext, target: str, link_args: list[str]) -> None:
        """The second build of glibc_floor.py, when the first one needs a glibc above the floor."""
        try:
            floor = plan(Path(target), self.glibc_files(), platform.machine())
            compat = floor.compat_source
        except FloorError as e:
            raise SystemExit(f"setup.py: {target}: {e}. Build with NVSHARE_HOOK_CC=zig "
                             "(pip install ziglang), or build on an older glibc. Not installed.") from e
        if not floor:
            return
        work = os.path.join(os.path.abspath(self.build_temp), "glibc-floor")
        os.makedirs(work, exist_ok=True)
        header = os.path.join(work, "glibc_floor.h")
        Path(header).write_text(floor.header)
        sources = list(ext.sources)
        if compat:
            sources.append(os.path.join(work, "glibc_compat.c"))
            Path(sources[-1]).write_text(compat)
        objects = self.compiler.compile(sources, output_dir=work, include_dirs=["csrc"],
                                        extra_postargs=HOOK_CFLAGS + ["-include", header])
        self.compiler.link_shared_object(
            objects, target, libraries=HOOK_LIBRARIES, extra_postargs=link_args)


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
            built = os.path.join(self.bdist_dir, "nvshare_slurm", "libnvshare.so")
            if plat.startswith("linux_") and os.path.exists(built):
                check_floor(built)
                # PEP 600's name and manylinux2014, its older name (pip before 20.3 reads only that)
                arch = plat[len("linux_"):]
                plat = "manylinux_{}_{}_{}".format(*MANYLINUX_BASELINE, arch)
                if MANYLINUX_BASELINE == (2, 17):
                    plat += f".manylinux2014_{arch}"
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
