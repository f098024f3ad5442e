"""Builds the kvcr Python package: libkvcr (static, with CMake, in a
temporary build directory) linked into the CPython extension kvcr._native.

    pip install --no-build-isolation .        # or scripts/install-python.sh

Needs a C compiler, cmake, ninja (or make), pkg-config, the libraries
libkvcr links (libxxhash, UCX, ZeroMQ, msgpack-c, liburing) and the Python
headers; not the benchmark-only ones (hiredis). Nothing is downloaded.
Environment:
  KVCR_CMAKE_BUILD_DIR  reuse this CMake build directory instead of a
                        temporary one (faster rebuilds)
  KVCR_BUILD_JOBS       parallel compile jobs (default 1)
  KVCR_UCX_ROOT         build against the UCX at this prefix (scripts/ucx-modern.sh
                        makes one) and find it at run time through RUNPATH
"""
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# A UCX at this prefix instead of the system's (scripts/ucx-modern.sh; the
# CMake option of the same name, docs/ARCHITECTURE.md "Peer failures over TCP").
UCX_ROOT = os.environ.get("KVCR_UCX_ROOT", "")


def _pkg_config(*args):
    env = dict(os.environ)
    if UCX_ROOT:
        env["PKG_CONFIG_PATH"] = os.pathsep.join(
            p for p in (os.path.join(UCX_ROOT, "lib", "pkgconfig"), env.get("PKG_CONFIG_PATH"))
            if p)
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True,
                             env=env)
        return out.stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return []


class BuildWithLibkvcr(build_ext):
    """Builds libkvcr.a with CMake first, then links it into the extension."""

    def run(self):
        if shutil.which("cmake") is None:
            sys.exit("kvcr: cmake is required to build libkvcr (apt-get install cmake)")
        keep = os.environ.get("KVCR_CMAKE_BUILD_DIR")
        tmp = None if keep else tempfile.mkdtemp(prefix="kvcr-cmake-")
        build_dir = keep or tmp
        try:
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            # Every time: a kept build directory follows KVCR_UCX_ROOT too.
            configure = ["cmake", "-S", ROOT, "-B", build_dir, f"-DKVCR_UCX_ROOT={UCX_ROOT}"]
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                configure += [*gen, "-DCMAKE_BUILD_TYPE=Release", "-DKVCR_BUILD_TESTS=OFF"]
            subprocess.run(configure, check=True)
            jobs = os.environ.get("KVCR_BUILD_JOBS", "1")
            subprocess.run(["cmake", "--build", build_dir, "--target", "kvcr_static",
                            "-j", jobs], check=True)
            lib = os.path.join(build_dir, "libkvcr.a")
            if not os.path.exists(lib):
                sys.exit(f"kvcr: the CMake build did not produce {lib}")
            for ext in self.extensions:
                ext.extra_objects = [lib]
                deps = ["libxxhash", "ucx", "libzmq", "msgpack", "liburing"]
                ext.libraries = [l[2:] for l in _pkg_config("--libs-only-l", *deps)] \
                    or ["xxhash", "ucp", "uct", "ucs", "zmq", "msgpackc", "uring"]
                ext.libraries += ["pthread", "m"]
                ext.library_dirs = [l[2:] for l in _pkg_config("--libs-only-L", *deps)]
                # That UCX is found at run time by the extension's RUNPATH.
                ext.runtime_library_dirs = [os.path.join(UCX_ROOT, "lib")] if UCX_ROOT else []
                # libkvcr's symbols stay inside the extension.
                ext.extra_link_args = ["-Wl,--exclude-libs,ALL"]
            self.force = True  # relink: libkvcr.a is not among the tracked sources
            super().run()
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)


setup(
    name="kvcr",
    version="0.1.0",
    description="KV Cache Runner: the KV-cache tier beside an LLM inference engine",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"kvcr": ["py.typed"]},  # typed: its annotations are the API's
    ext_modules=[
        Extension(
            "kvcr._native",
            sources=["python/kvcr/_native.c", "python/kvcr/_native_config.c",
                     "python/kvcr/_native_policy.c", "python/kvcr/_native_callbacks.c",
                     "python/kvcr/_native_values.c", "python/kvcr/_native_instance.c"],
            # The public headers and the test interface (kvcr/testing.h: the
            # hint introspection hook), nothing of src/.
            include_dirs=["include"],
            depends=["python/kvcr/_native.h", "include/kvcr/kvcr.h", "include/kvcr/types.h",
                     "include/kvcr/policy.h", "include/kvcr/stats.h", "include/kvcr/error.h",
                     "include/kvcr/testing.h"],
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        )
    ],
    cmdclass={"build_ext": BuildWithLibkvcr},
    # Keep setuptools out of build/, the C tree's CMake directory.
    options={"build": {"build_base": "build-python"}},
    python_requires=">=3.10",
)
