"""Build script for the compiled record kernel; everything else is in pyproject.toml.

Owns one setuptools Extension, ``headrace.protocol._kernel``, built from
``headrace/protocol/_kernel.c`` by ``pip install -e '.[spark,test]'``. The C is plain C11
against the Python C API: no numpy headers, no third-party libraries.
"""

from setuptools import Extension, setup

KERNEL = Extension(
    "headrace.protocol._kernel",
    sources=["headrace/protocol/_kernel.c"],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

setup(ext_modules=[KERNEL])
