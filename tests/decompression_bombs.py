"""Decompression bombs and a broker's memory, shared by tests/broker/test_decompression_bombs.py
and bench/decompression_bombs.py.

Owns: building bomb batches -- one v2 batch of one declared record whose records section
inflates to ``inflated_bytes``, compressed a 1 MiB chunk at a time (``StreamCompressor``)
so the builder never holds the inflated bytes -- in two shapes:

* ``record``: one well-formed record (key b"k") whose value is all zeros;
* ``zeros``: nothing but zeros (no valid record; the reported 181 KB zstd batch).

Snappy's format cannot inflate more than ~21x, so a snappy bomb is one raw snappy block of
1 MiB of the section whose preamble declares the whole ``inflated_bytes``. ``legacy_bomb``:
a magic-1 compressed wrapper holding one inner message and then zeros.

Also: a process's VmRSS from /proc and a thread sampling its peak, and a process's CPU time.
Not thread-safe beyond what ``RssSampler`` says.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from functools import cache
from pathlib import Path

import cramjam
import crc32c

from headrace.protocol import compression, wire
from headrace.protocol.compression import SNAPPY
from headrace.protocol.varint import encode_unsigned, write_signed

PRODUCE = 0
PRODUCE_VERSION = 9
LEGACY_PRODUCE_VERSION = 2  # the last that carries magic 0/1 message sets (up-converted)
ZERO_CHUNK = bytes(1 << 20)
RSS_SAMPLE_INTERVAL_S = 0.002
SHAPES = ("record", "zeros")


def record_prefix(value_bytes: int) -> bytes:
    """Length and fields of a record with key b"k" up to its value's first byte; the one
    header-count byte (0) follows the value."""
    body = bytearray(b"\x00")  # attributes
    write_signed(body, 0)  # timestamp delta
    write_signed(body, 0)  # offset delta
    write_signed(body, 1)
    body += b"k"
    write_signed(body, value_bytes)
    prefix = bytearray()
    write_signed(prefix, len(body) + value_bytes + 1)
    return bytes(prefix + body)


def section_chunks(shape: str, inflated_bytes: int):
    """The inflated records section of a bomb, a chunk at a time."""
    if shape == "record":
        yield record_prefix(inflated_bytes)
    yield from (ZERO_CHUNK for _ in range(inflated_bytes // len(ZERO_CHUNK)))
    if shape == "record":
        yield b"\x00"  # header count


def lying_snappy_block(shape: str, inflated_bytes: int) -> bytes:
    """One raw snappy block of 1 MiB of the section whose preamble declares all of it."""
    head = record_prefix(inflated_bytes) if shape == "record" else b""
    block = bytes(cramjam.snappy.compress_raw(head + ZERO_CHUNK))
    true_preamble_bytes = len(encode_unsigned(cramjam.snappy.decompress_raw_len(block)))
    return encode_unsigned(len(head) + inflated_bytes + 1) + block[true_preamble_bytes:]


@cache
def bomb_batch(codec: int, shape: str, inflated_bytes: int, timestamp_ms: int) -> bytes:
    if codec == SNAPPY:
        payload = lying_snappy_block(shape, inflated_bytes)
    else:
        compressor = compression.StreamCompressor(codec)
        payload = b"".join([*map(compressor.compress, section_chunks(shape, inflated_bytes)),
                            compressor.finish()])
    covered = struct.pack(">hiqqqhii", codec, 0, timestamp_ms, timestamp_ms, -1, -1, -1, 1)
    covered += payload
    return struct.pack(">qiibI", 0, 9 + len(covered), -1, 2, crc32c.crc32c(covered)) + covered


def produce_frame(topic: str, batch: bytes, correlation_id: int = 1,
                  version: int = PRODUCE_VERSION) -> bytes:
    """A Produce request of ``batch`` to partition 0; ``LEGACY_PRODUCE_VERSION`` (magic 0/1
    message sets, which kio has no schema for) is written by hand."""
    if version == LEGACY_PRODUCE_VERSION:
        name = topic.encode()
        body = struct.pack(">hiih", -1, 30000, 1, len(name)) + name
        body += struct.pack(">iii", 1, 0, len(batch)) + batch
        header = struct.pack(">hhih", PRODUCE, version, correlation_id, 4) + b"bomb"
        return struct.pack(">i", len(header) + len(body)) + header + body
    body = wire.build(wire.request_class(PRODUCE, version), {
        "acks": -1, "timeout": 30000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    return wire.encode_request(PRODUCE, version, correlation_id, "bomb", body)


def produce_error_code(response_frame: bytes, version: int = PRODUCE_VERSION) -> int:
    if version == LEGACY_PRODUCE_VERSION:  # correlation id, 1 topic, name, 1 partition, index
        (name_bytes,) = struct.unpack_from(">h", response_frame, 8)
        return struct.unpack_from(">h", response_frame, 18 + name_bytes)[0]
    _, body = wire.decode_response(PRODUCE, version, response_frame)
    return body.responses[0].partition_responses[0].error_code


def vm_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every ``RSS_SAMPLE_INTERVAL_S`` until ``stopped`` is set;
    ``peak_bytes`` is the largest seen (starting with the RSS at construction). Written by
    its own thread only; read it after ``join``."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.start_bytes = vm_rss_bytes(pid)
        self.peak_bytes = self.start_bytes
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak_bytes = max(self.peak_bytes, vm_rss_bytes(self.pid))
            self.stopped.wait(RSS_SAMPLE_INTERVAL_S)


def legacy_message(offset: int, attributes: int, value: bytes, timestamp_ms: int) -> bytes:
    """One magic-1 message set entry with a null key."""
    body = struct.pack(">bbqii", 1, attributes, timestamp_ms, -1, len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(message)) + message


@cache
def legacy_bomb(codec: int, inflated_bytes: int, timestamp_ms: int) -> bytes:
    """A magic-1 wrapper whose compressed value is one valid inner message followed by
    ``inflated_bytes`` of zeros."""
    compressor = compression.StreamCompressor(codec)
    inner = legacy_message(0, 0, b"inner", timestamp_ms)
    payload = b"".join([compressor.compress(inner),
                        *map(compressor.compress, section_chunks("zeros", inflated_bytes)),
                        compressor.finish()])
    return legacy_message(0, codec, payload, timestamp_ms)
