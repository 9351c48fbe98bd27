"""Kafka's record compression codecs: none, gzip, snappy, lz4, zstd -- all through cramjam.

Owns the codec ids (the low three bits of a batch's or legacy message's ``attributes``)
and the byte formats each codec uses on the wire:

- gzip (1): RFC 1952 gzip members; several concatenated members decode as one stream.
- snappy (2): written in the xerial block framing Kafka's Java client and broker use::

      header  b"\\x82SNAPPY\\x00"  int32 version (1)  int32 compatible version (1)
      blocks  [int32 compressed length][raw snappy block of <= 32 KiB input]*

  Read in that framing or as one raw snappy block (librdkafka writes raw blocks).
- lz4 (3): the LZ4 *frame* format. Magic-0 messages carry Kafka's historic wrong header
  checksum (KAFKA-3160: hashed over the frame magic too); ``decompress`` repairs it when
  asked with ``legacy_lz4_header_checksum=True``.
- zstd (4): zstd frames; allowed only in v2 record batches (checked by callers).

Errors: undecodable input raises ``CorruptMessage``; an unknown codec id or name raises
``UnsupportedCompressionType``.

Pure functions; thread-safe.
"""

from __future__ import annotations

import struct

import cramjam

from headrace.errors import CorruptMessage, UnsupportedCompressionType

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES: dict[int, str] = {
    NONE: "none",
    GZIP: "gzip",
    SNAPPY: "snappy",
    LZ4: "lz4",
    ZSTD: "zstd",
}
_CODECS_BY_NAME = {name: codec for codec, name in CODEC_NAMES.items()}
# compression.type values that are not codecs: keep whatever the producer sent.
PRODUCER_COMPRESSION_NAME = "producer"
UNCOMPRESSED_NAME = "uncompressed"  # Kafka's alias of "none" in compression.type

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_VERSION = 1
XERIAL_COMPATIBLE_VERSION = 1
XERIAL_HEADER_BYTES = 16
XERIAL_BLOCK_INPUT_BYTES = 32 * 1024  # snappy-java's default block size
_XERIAL_HEADER = struct.Struct(">8sii")
_INT32 = struct.Struct(">i")

LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_DICT_ID = 0x01


def codec_by_name(name: str) -> int | None:
    """Codec id for a Kafka ``compression.type`` value; None for ``producer`` (keep the
    producer's codec). ``uncompressed`` is Kafka's alias of ``none``."""
    lowered = name.strip().lower()
    if lowered == PRODUCER_COMPRESSION_NAME:
        return None
    if lowered == UNCOMPRESSED_NAME:
        return NONE
    if lowered not in _CODECS_BY_NAME:
        raise UnsupportedCompressionType(f"unknown compression type {name!r}")
    return _CODECS_BY_NAME[lowered]


def codec_name(codec: int) -> str:
    _check_codec(codec)
    return CODEC_NAMES[codec]


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress ``data`` with ``codec`` in the format Kafka's own broker writes."""
    _check_codec(codec)
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return _xerial_snappy_compress(data)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    return bytes(cramjam.zstd.compress(data))


def decompress(
    codec: int,
    data: bytes | bytearray | memoryview,
    *,
    legacy_lz4_header_checksum: bool = False,
) -> bytes:
    """Decompress ``data``; raises CorruptMessage if it does not decode with ``codec``.

    ``legacy_lz4_header_checksum``: the input is from a magic-0 message, whose LZ4 frame
    header checksum Kafka computed wrongly; it is recomputed before decoding.
    """
    _check_codec(codec)
    if codec == NONE:
        return bytes(data)
    try:
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == LZ4:
            if legacy_lz4_header_checksum:
                data = _repair_lz4_header_checksum(data)
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CorruptMessage(f"{CODEC_NAMES[codec]} data does not decode: {exc}") from exc


def _check_codec(codec: int) -> None:
    if codec not in CODEC_NAMES:
        raise UnsupportedCompressionType(f"unknown compression codec id {codec}")


def _xerial_snappy_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_COMPATIBLE_VERSION)]
    for start in range(0, len(view), XERIAL_BLOCK_INPUT_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_INPUT_BYTES]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    if len(view) < XERIAL_HEADER_BYTES or bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    # version and compatible version are ignored as Kafka does: some writers get them wrong.
    pos, out = XERIAL_HEADER_BYTES, []
    while pos < len(view):
        if len(view) - pos < _INT32.size:
            raise CorruptMessage(f"xerial snappy block length truncated at byte {pos}")
        (block_bytes,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if block_bytes < 0 or pos + block_bytes > len(view):
            raise CorruptMessage(f"xerial snappy block at byte {pos} overruns the data")
        out.append(bytes(cramjam.snappy.decompress_raw(view[pos : pos + block_bytes])))
        pos += block_bytes
    return b"".join(out)


def _repair_lz4_header_checksum(data: bytes | bytearray | memoryview) -> bytes:
    """Rewrite the frame descriptor's checksum byte: ``(xxh32(descriptor) >> 8) & 0xFF``."""
    frame = bytearray(data)
    if len(frame) < 7 or bytes(frame[:4]) != LZ4_FRAME_MAGIC:
        raise CorruptMessage("lz4 frame magic missing")
    flags = frame[4]
    descriptor_bytes = 2
    descriptor_bytes += 8 if flags & _LZ4_FLG_CONTENT_SIZE else 0
    descriptor_bytes += 4 if flags & _LZ4_FLG_DICT_ID else 0
    checksum_pos = 4 + descriptor_bytes
    if len(frame) <= checksum_pos:
        raise CorruptMessage("lz4 frame descriptor truncated")
    frame[checksum_pos] = (xxh32(bytes(frame[4:checksum_pos])) >> 8) & 0xFF
    return bytes(frame)


_PRIME32_1 = 0x9E3779B1
_PRIME32_2 = 0x85EBCA77
_PRIME32_3 = 0xC2B2AE3D
_PRIME32_4 = 0x27D4EB2F
_PRIME32_5 = 0x165667B1
_MASK32 = 0xFFFFFFFF
XXH32_SHORT_INPUT_MAX_BYTES = 15


def _rotl32(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK32


def xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of a short input (at most 15 bytes: an LZ4 frame descriptor)."""
    if len(data) > XXH32_SHORT_INPUT_MAX_BYTES:
        raise ValueError(f"xxh32 here handles inputs up to {XXH32_SHORT_INPUT_MAX_BYTES} bytes")
    acc = (seed + _PRIME32_5 + len(data)) & _MASK32
    pos = 0
    while pos + 4 <= len(data):
        word = int.from_bytes(data[pos : pos + 4], "little")
        acc = (acc + word * _PRIME32_3) & _MASK32
        acc = (_rotl32(acc, 17) * _PRIME32_4) & _MASK32
        pos += 4
    for byte in data[pos:]:
        acc = (acc + byte * _PRIME32_5) & _MASK32
        acc = (_rotl32(acc, 11) * _PRIME32_1) & _MASK32
    acc ^= acc >> 15
    acc = (acc * _PRIME32_2) & _MASK32
    acc ^= acc >> 13
    acc = (acc * _PRIME32_3) & _MASK32
    acc ^= acc >> 16
    return acc
