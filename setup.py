"""Build script for the compiled extensions; everything else is in pyproject.toml.

Owns three setuptools Extensions, built by ``pip install -e '.[spark,test]'``:
``headrace.protocol._kernel`` (the record kernel, ``headrace/protocol/_kernel.c``),
``headrace.protocol._prepass`` (the request pre-pass's walker,
``headrace/protocol/_prepass.c``) and ``headrace.protocol._message_format`` (magic 0/1
message-format conversion, ``headrace/protocol/_message_format.c``). The C is plain C11
against the Python C API: no numpy headers, no third-party libraries.
"""

from setuptools import Extension, setup

KERNEL = Extension(
    "headrace.protocol._kernel",
    sources=["headrace/protocol/_kernel.c"],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

PREPASS = Extension(
    "headrace.protocol._prepass",
    sources=["headrace/protocol/_prepass.c"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

MESSAGE_FORMAT = Extension(
    "headrace.protocol._message_format",
    sources=["headrace/protocol/_message_format.c"],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

setup(ext_modules=[KERNEL, PREPASS, MESSAGE_FORMAT])
