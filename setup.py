"""Builds the kvcr Python package with libkvcr compiled into its extension.

`pip install .` at the repository root needs only a C compiler and the
Debian packages the README's set-up installs (libxxhash-dev, python3-dev).
"""
import glob

from setuptools import Extension, find_packages, setup

LIB_SOURCES = sorted(glob.glob("src/**/*.c", recursive=True))

setup(
    name="kvcr",
    version="0.1.0",
    description="KV Cache Runner: the KV-cache tier beside an LLM inference engine",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[
        Extension(
            "kvcr._native",
            sources=["python/kvcr/_native.c"] + LIB_SOURCES,
            include_dirs=["include", "src"],
            libraries=["xxhash", "pthread", "m"],
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        )
    ],
    python_requires=">=3.9",
)
