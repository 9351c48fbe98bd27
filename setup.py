"""Build script for the compiled extensions; everything else is in pyproject.toml.

Owns the setuptools Extensions built by ``pip install -e '.[spark,test]'``, one or more per
package, each imported only by its package's Python face:

* ``headrace.protocol._kernel`` (``headrace/protocol/_kernel.c``, face ``protocol/kernel.py``):
  record batches decoded, validated and CRC-checked, no I/O;
* ``headrace.protocol._prepass`` (``_prepass.c``): the request pre-pass's walker;
* ``headrace.protocol._message_format`` (``_message_format.c``): magic 0/1 conversion;
* ``headrace.storage._segment_io`` (``headrace/storage/_segment_io.c``, face
  ``storage/segment_io.py``): the plain append, index rebuild, the cleaner's passes and spans,
  page-cache probes and O_DIRECT reads;
* ``headrace.spark._encoder`` (``headrace/spark/_encoder.c``, face ``spark/encoder.py``): the
  sink's batch encoder and partitioner;
* ``headrace.broker._scheduling`` (``headrace/broker/_scheduling.c``, face
  ``broker/scheduling.py``): the broker's request hint to the cleaner's spans.

Shared C lives in headers, static, compiled into each extension that includes them:
``headrace/protocol/{kernel_common,crc32c,record_batches}.h`` and
``headrace/storage/cooperative_spans.h`` (C includes follow the layer rule). The C is plain
C11 against the Python C API: no numpy headers. One system library: the record kernel links
liblz4 (Debian's ``liblz4-dev``, installed by ``scripts/install-system-deps.sh``) for its
frame decoder, so that an lz4 batch is inflated and its records checked in one pass.
"""

from setuptools import Extension, setup

WARNINGS = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
PROTOCOL_HEADERS = ["headrace/protocol/kernel_common.h", "headrace/protocol/crc32c.h",
                    "headrace/protocol/record_batches.h"]
COOPERATIVE_SPANS_HEADER = "headrace/storage/cooperative_spans.h"

KERNEL = Extension(
    "headrace.protocol._kernel",
    sources=["headrace/protocol/_kernel.c"],
    depends=PROTOCOL_HEADERS,
    extra_compile_args=["-O3", *WARNINGS],
    libraries=["lz4"],  # liblz4's frame decoder: lz4 sections inflated and checked in one pass
)

PREPASS = Extension(
    "headrace.protocol._prepass",
    sources=["headrace/protocol/_prepass.c"],
    depends=["headrace/protocol/kernel_common.h"],
    extra_compile_args=["-O2", *WARNINGS],
)

MESSAGE_FORMAT = Extension(
    "headrace.protocol._message_format",
    sources=["headrace/protocol/_message_format.c"],
    depends=["headrace/protocol/kernel_common.h"],
    extra_compile_args=["-O3", *WARNINGS],
)

SEGMENT_IO = Extension(
    "headrace.storage._segment_io",
    sources=["headrace/storage/_segment_io.c"],
    depends=[*PROTOCOL_HEADERS, COOPERATIVE_SPANS_HEADER],
    extra_compile_args=["-O3", *WARNINGS],
)

ENCODER = Extension(
    "headrace.spark._encoder",
    sources=["headrace/spark/_encoder.c"],
    depends=PROTOCOL_HEADERS,
    extra_compile_args=["-O3", *WARNINGS],
)

SCHEDULING = Extension(
    "headrace.broker._scheduling",
    sources=["headrace/broker/_scheduling.c"],
    depends=[COOPERATIVE_SPANS_HEADER],
    extra_compile_args=["-O3", *WARNINGS],
)

setup(ext_modules=[KERNEL, PREPASS, MESSAGE_FORMAT, SEGMENT_IO, ENCODER, SCHEDULING])
