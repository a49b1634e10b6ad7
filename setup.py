"""Builds csrc/ into nvshare_slurm/libnvshare.so inside a platform-tagged wheel.

libnvshare.so is a plain shared library (LD_PRELOAD), not a Python extension: it is compiled by
setuptools' own compiler step, named without an ABI suffix, and the wheel is tagged py3-none-<platform>
so one wheel serves every Python 3 on that platform. The wire-format header ships beside it, where
nvshare_slurm/proto.py reads it.
"""
import glob
import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - wheel is a build requirement
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK_SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.c")))
VERSION_SCRIPT = os.path.join("csrc", "libnvshare.map")


class BuildLibnvshare(build_ext):
    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext):
        self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a not in ("-g",)]
        objects = self.compiler.compile(
            ext.sources, output_dir=self.build_temp, include_dirs=["csrc"],
            extra_postargs=["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", "-pthread",
                            "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror=implicit-function-declaration"])
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        self.compiler.link_shared_object(
            objects, target, libraries=["dl", "pthread"],
            extra_postargs=["-Wl,-z,defs", "-Wl,--version-script=" + VERSION_SCRIPT, "-pthread"])


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
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

setup(
    ext_modules=[Extension("nvshare_slurm.libnvshare", sources=HOOK_SOURCES,
                           depends=["csrc/nvshare_proto.h", VERSION_SCRIPT])],
    cmdclass=cmdclass,
)
