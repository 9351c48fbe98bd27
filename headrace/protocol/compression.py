"""Kafka's record compression codecs: none, gzip, snappy, lz4, zstd -- compressed whole with
cramjam, inflated by streaming decoders with an output limit (zlib, lz4.frame, zstandard).

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

Bounded decompression -- the one way every reader inflates a records section:

- ``iter_decompressed(codec, data, max_output_bytes)`` yields the output in chunks of at most
  ``DECOMPRESS_CHUNK_BYTES`` (1 MiB) and raises ``MessageTooLarge`` as soon as it passes
  ``max_output_bytes``; ``decompress_bounded`` joins them for callers that need one buffer
  (the compiled kernel's sections); ``decompress`` is ``decompress_bounded`` with
  ``MAX_RECORDS_SECTION_BYTES``; ``decompress_into`` writes a section into the caller's
  reusable buffer (produce validation), ``MessageTooLarge`` past its size, or declines.
  Streaming decoders with an output cap per call: zlib (``max_length``) for gzip,
  ``lz4.frame`` (``max_length``) for lz4, ``zstandard`` (``read_to_iter`` with a 1 MiB
  ``write_size``, window at most ``ZSTD_MAX_WINDOW_BYTES``;
  the frame's declared content size is never used to allocate, and the frame layout is
  walked first, as the streaming decoder stops quietly at truncated input); snappy has no
  streaming form, so each block's declared length (the raw block's preamble, every xerial
  block's) is checked against the limit before its output is allocated -- a block cannot
  inflate more than ~21x its compressed size.
- ``StreamCompressor(codec)`` writes a payload from chunks (broker-side recompression).

Which limit, and why. Kafka (read in apache/kafka: ``LogValidator.
validateMessagesAndAssignOffsetsCompressed``, ``DefaultRecordBatch.compressedIterator`` /
``StreamRecordIterator``, ``DefaultRecord.readFrom`` / ``readPartiallyFrom`` over the
codec's ``wrapForInput`` stream) has no limit on a batch's inflated size: it streams record
by record, reading only what the declared records span -- ``records_count`` records, each
as long as its length varint says -- and then one more byte, which must be the end of the
stream ("Incorrect declared batch size, records still remaining", INVALID_RECORD); a stream
that ends early is INVALID_RECORD too. When it recompresses it keeps every record in memory
and only afterwards refuses a rebuilt batch above ``max.message.bytes`` (MESSAGE_TOO_LARGE,
``UnifiedLog.append``). KAFKA-20723 (the share-group DLQ fetcher) later capped a
decompression by the topic's max.message.bytes for the same reason. headrace follows the
streaming walk (``records.walk_records_section``: the bytes pulled from the decoder are the
declared records plus one chunk), holds one chunk at a time instead of whole records,
refuses a recompressed batch as soon as its output passes ``max.message.bytes``, and bounds
the total by ``MAX_RECORDS_SECTION_BYTES`` = 100 MiB, ``socket.request.max.bytes``' default:
a batch whose records could not be sent uncompressed in one request is refused with
MESSAGE_TOO_LARGE. That bound is what lets the readers that need a whole section (the
cleaner, the Spark source, dump-log, through the kernel) hold it. An undecodable stream is
CORRUPT_MESSAGE ("the message ... is otherwise corrupt"): Kafka itself turns the codec's
IOException into KafkaException("Failed to decompress record stream"), which answers
UNKNOWN_SERVER_ERROR -- headrace never answers -1 for bad input.

Pure functions; thread-safe. A ``StreamCompressor`` and an ``iter_decompressed`` iterator
belong to one thread.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import cramjam
import lz4.frame
import zstandard

from headrace.errors import CorruptMessage, MessageTooLarge, UnsupportedCompressionType

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

DECOMPRESS_CHUNK_BYTES = 1024 * 1024  # what a streaming reader holds of the output at once
# The most a batch's records section may inflate to, for every reader (see the docstring):
# socket.request.max.bytes' default, the largest request the broker reads at all.
MAX_RECORDS_SECTION_BYTES = 100 * 1024 * 1024
# zstd frames declaring a larger window are refused (the decoder allocates the window):
# 16 MiB = windowLog 24, above what levels 1-19 choose (at most 23).
ZSTD_MAX_WINDOW_BYTES = 16 * 1024 * 1024
GZIP_WBITS = 31  # zlib: a gzip wrapper with a 32 KiB window
GZIP_LEVEL = 6  # java.util.zip.Deflater's default, as Kafka's GzipCompression
ZSTD_LEVEL = 3  # zstd's and Kafka's default level

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


def compress(
    codec: int,
    data: bytes | bytearray | memoryview,
    *,
    legacy_lz4_header_checksum: bool = False,
) -> bytes:
    """Compress ``data`` with ``codec`` in the format Kafka's own broker writes.

    ``legacy_lz4_header_checksum``: the output goes into a magic-0 message, whose LZ4 frame
    header checksum Kafka computes wrongly (over the frame magic too); it is written so.
    """
    _check_codec(codec)
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return _xerial_snappy_compress(data)
    if codec == LZ4:
        frame = bytes(cramjam.lz4.compress(data))
        return _legacy_lz4_header_checksum(frame) if legacy_lz4_header_checksum else frame
    return bytes(cramjam.zstd.compress(data))


class StreamCompressor:
    """One codec payload written from a stream of chunks, in the formats ``compress``
    writes (xerial snappy in 32 KiB blocks, LZ4 frames of independent 64 KiB blocks, gzip,
    zstd), holding only the codec's working state and less than one snappy block: each
    ``compress`` returns the output ready so far, ``finish`` the rest. Not thread-safe."""

    def __init__(self, codec: int) -> None:
        _check_codec(codec)
        self.codec = codec
        self._snappy_pending = bytearray()
        self._started = False
        if codec == GZIP:
            self._deflater = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, GZIP_WBITS)
        elif codec == LZ4:
            self._lz4 = lz4.frame.LZ4FrameCompressor(
                block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                content_checksum=True)
        elif codec == ZSTD:
            self._zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj()

    def compress(self, chunk: bytes | bytearray | memoryview) -> bytes:
        start = b"" if self._started else self._begin()
        self._started = True
        if self.codec == NONE:
            return start + bytes(chunk)
        if self.codec == GZIP:
            return start + self._deflater.compress(chunk)
        if self.codec == LZ4:
            return start + self._lz4.compress(chunk)
        if self.codec == ZSTD:
            return start + self._zstd.compress(chunk)
        self._snappy_pending += chunk
        return start + self._snappy_blocks(XERIAL_BLOCK_INPUT_BYTES)

    def finish(self) -> bytes:
        start = b"" if self._started else self._begin()
        self._started = True
        if self.codec == GZIP:
            return start + self._deflater.flush()
        if self.codec == LZ4:
            return start + self._lz4.flush()
        if self.codec == ZSTD:
            return start + self._zstd.flush()
        if self.codec == SNAPPY:
            return start + self._snappy_blocks(1)
        return start

    def _begin(self) -> bytes:
        if self.codec == LZ4:
            return self._lz4.begin()
        if self.codec == SNAPPY:
            return _XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_COMPATIBLE_VERSION)
        return b""

    def _snappy_blocks(self, min_block_bytes: int) -> bytes:
        """Xerial blocks of the pending input while at least ``min_block_bytes`` wait."""
        parts, pending = [], self._snappy_pending
        while len(pending) >= min_block_bytes:
            block = bytes(cramjam.snappy.compress_raw(
                memoryview(pending)[:XERIAL_BLOCK_INPUT_BYTES]))
            parts += (_INT32.pack(len(block)), block)
            del pending[:XERIAL_BLOCK_INPUT_BYTES]
        return b"".join(parts)


def decompress(
    codec: int,
    data: bytes | bytearray | memoryview,
    *,
    legacy_lz4_header_checksum: bool = False,
) -> bytes:
    """``decompress_bounded`` with the broker-wide limit ``MAX_RECORDS_SECTION_BYTES``."""
    return decompress_bounded(codec, data, MAX_RECORDS_SECTION_BYTES,
                              legacy_lz4_header_checksum=legacy_lz4_header_checksum)


def decompress_section(
    codec: int,
    data: bytes | bytearray | memoryview,
    position: int,
    *,
    legacy_lz4_header_checksum: bool = False,
) -> bytes:
    """A stored batch's records section (the batch at byte ``position``) for a reader that
    needs it whole -- the kernel's cleaner, Spark and dump-log paths, ``decode_batch``:
    ``decompress``, except that a section inflating past ``MAX_RECORDS_SECTION_BYTES`` (which
    produce never accepts) is ``CorruptMessage``, as any other malformation there."""
    try:
        return decompress(codec, data, legacy_lz4_header_checksum=legacy_lz4_header_checksum)
    except MessageTooLarge as exc:
        raise CorruptMessage(f"record batch at byte {position}: {exc.message}") from exc


def decompress_bounded(
    codec: int,
    data: bytes | bytearray | memoryview,
    max_output_bytes: int,
    *,
    legacy_lz4_header_checksum: bool = False,
) -> bytes:
    """The whole of ``data`` decompressed, for callers that need it in one piece (the compiled
    kernel's record sections): ``iter_decompressed`` joined, so it never inflates more than
    ``max_output_bytes`` (+ one chunk) before raising ``MessageTooLarge``; undecodable input
    raises ``CorruptMessage``. Holds at most the output and one chunk."""
    if codec == NONE:
        if len(data) > max_output_bytes:
            raise MessageTooLarge(f"records of {len(data)} bytes exceed {max_output_bytes}")
        return bytes(data)
    return b"".join(iter_decompressed(codec, data, max_output_bytes,
                                      legacy_lz4_header_checksum=legacy_lz4_header_checksum))


def decompress_into(codec: int, data: bytes | bytearray | memoryview,
                    out: bytearray | memoryview) -> int | None:
    """``data`` decompressed into the writable buffer ``out``, for a caller that reuses one
    buffer for every section (produce validation: a fresh buffer per batch costs a page fault
    per 4 KiB of output): the bytes written; ``MessageTooLarge`` when the output passes
    ``len(out) - 1`` bytes, as ``decompress_bounded(codec, data, len(out) - 1)`` raises it
    for data that decodes; None when the decoders here refuse the data. The caller then
    takes ``decompress_bounded``, which raises the precise error. So this writes what
    ``decompress_bounded`` with that limit returns, raises what it raises, or answers None
    for data it refuses; data both too large and undecodable may get either error, as the
    two decoders notice them at different points (``decompress_bounded`` a chunk at a
    time).

    No output beyond ``len(out)`` is ever produced: lz4 (``cramjam.lz4.decompress_into``,
    liblz4's frame decoder: linked or independent blocks, every checksum verified,
    concatenated and skippable frames) and gzip (``cramjam.gzip.decompress_into``,
    concatenated members, CRC-32 and size verified) write into ``out`` only, and a full
    ``out`` is their one ``WriteZero`` error; zstd reads from ``zstandard``'s stream reader
    into it, the window capped at ``ZSTD_MAX_WINDOW_BYTES`` and the frame layout walked
    first, as ``iter_decompressed`` does; snappy decodes each block into ``out`` after
    checking its declared length fits."""
    _check_codec(codec)
    with memoryview(out) as view:
        try:
            if codec == LZ4:
                written = cramjam.lz4.decompress_into(data, view)
            elif codec == GZIP:
                written = cramjam.gzip.decompress_into(data, view)
            elif codec == ZSTD:
                written = _zstd_into(data, view)
            elif codec == SNAPPY:
                written = _snappy_into(data, view)
            else:
                written = _copy_into(data, view)
        except cramjam.DecompressionError as exc:
            if str(exc) == _CRAMJAM_OUTPUT_FULL:
                raise _output_too_large(codec, len(view)) from None
            return None
        except (zstandard.ZstdError, CorruptMessage):
            return None
        if written is not None and written >= len(view):
            raise _output_too_large(codec, len(view))
        return written


_CRAMJAM_OUTPUT_FULL = "failed to write whole buffer"  # std::io::ErrorKind::WriteZero


def _output_too_large(codec: int, out_bytes: int) -> MessageTooLarge:
    return MessageTooLarge(f"{CODEC_NAMES[codec]} records inflate past {out_bytes - 1} bytes")


def _copy_into(data: bytes | bytearray | memoryview, out: memoryview) -> int:
    size_bytes = len(data)
    if size_bytes >= len(out):
        return size_bytes  # too large: raised by the caller
    out[:size_bytes] = data
    return size_bytes


def _zstd_into(data: bytes | bytearray | memoryview, out: memoryview) -> int:
    """Every frame of ``data`` read into ``out``: the bytes written (``len(out)`` when it
    was filled: too large)."""
    _zstd_frames(data)
    reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW_BYTES).stream_reader(
        data, read_across_frames=True)
    written = 0
    while written < len(out):
        size_bytes = reader.readinto(out[written:])
        if not size_bytes:
            return written
        written += size_bytes
    return written


def _snappy_into(data: bytes | bytearray | memoryview, out: memoryview) -> int | None:
    """One raw snappy block, or xerial-framed blocks, decoded into ``out`` one after
    another; None if a block is malformed; ``len(out)`` (too large) as soon as a block's
    declared length does not fit, before it is decoded."""
    view = memoryview(data)
    if len(view) < XERIAL_HEADER_BYTES or bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _raw_snappy_into(view, out, 0)
    pos, written = XERIAL_HEADER_BYTES, 0
    while pos < len(view):
        if len(view) - pos < _INT32.size:
            return None
        (block_bytes,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if block_bytes < 0 or pos + block_bytes > len(view):
            return None
        block_written = _raw_snappy_into(view[pos : pos + block_bytes], out, written)
        if block_written is None:
            return None
        written += block_written
        if written >= len(out):
            return written  # too large: raised by the caller
        pos += block_bytes
    return written


def _raw_snappy_into(block: memoryview, out: memoryview, start: int) -> int | None:
    """The block's output bytes, written at ``start``; too many to fit: returned unwritten."""
    declared_bytes = cramjam.snappy.decompress_raw_len(block)
    if start + declared_bytes >= len(out):
        return declared_bytes
    written = cramjam.snappy.decompress_raw_into(block, out[start : start + declared_bytes])
    return written if written == declared_bytes else None


def iter_decompressed(
    codec: int,
    data: bytes | bytearray | memoryview,
    max_output_bytes: int,
    *,
    chunk_bytes: int = DECOMPRESS_CHUNK_BYTES,
    legacy_lz4_header_checksum: bool = False,
) -> Iterator[bytes | bytearray]:
    """``data`` decompressed with ``codec``, as a stream of bytes-like chunks: each at most
    ``chunk_bytes``, except a snappy block, which comes whole (at most its declared length,
    checked against the limit before it is allocated). ``MessageTooLarge`` as soon as the
    output passes ``max_output_bytes``; ``CorruptMessage`` for input that does not decode
    (also truncated input and bytes after the last frame). The consumer holds one chunk at
    a time; the decompressor holds its window (zstd: at most ``ZSTD_MAX_WINDOW_BYTES``)."""
    _check_codec(codec)
    budget = _OutputBudget(codec, max_output_bytes, chunk_bytes)
    if codec == NONE:
        view = memoryview(data)
        for start in range(0, len(view), chunk_bytes):
            piece = bytes(view[start : start + chunk_bytes])
            budget.take(len(piece))
            yield piece
        return
    if codec == GZIP:
        yield from _gzip_chunks(data, budget)
    elif codec == SNAPPY:
        yield from _snappy_chunks(data, budget)
    elif codec == LZ4:
        if legacy_lz4_header_checksum:
            data = _repair_lz4_header_checksum(data)
        yield from _lz4_chunks(data, budget)
    else:
        yield from _zstd_chunks(data, budget)


class _OutputBudget:
    """How much more a decompression may produce: ``want`` is the next request size (never
    more than one byte past the limit), ``take`` counts output and raises past the limit."""

    __slots__ = ("codec", "max_output_bytes", "chunk_bytes", "produced_bytes")

    def __init__(self, codec: int, max_output_bytes: int, chunk_bytes: int) -> None:
        if max_output_bytes < 0 or chunk_bytes <= 0:
            raise ValueError("max_output_bytes must be >= 0 and chunk_bytes > 0")
        self.codec = codec
        self.max_output_bytes = max_output_bytes
        self.chunk_bytes = chunk_bytes
        self.produced_bytes = 0

    def want(self) -> int:
        return min(self.chunk_bytes, self.max_output_bytes - self.produced_bytes + 1)

    def check_room(self, size_bytes: int) -> None:
        if self.produced_bytes + size_bytes > self.max_output_bytes:
            raise MessageTooLarge(
                f"{CODEC_NAMES[self.codec]} records inflate past {self.max_output_bytes} bytes")

    def take(self, size_bytes: int) -> None:
        self.check_room(size_bytes)
        self.produced_bytes += size_bytes


def _corrupt(codec: int, reason: object) -> CorruptMessage:
    return CorruptMessage(f"{CODEC_NAMES[codec]} data does not decode: {reason}")


def _gzip_chunks(data: bytes | bytearray | memoryview, budget: _OutputBudget) -> Iterator[bytes]:
    """RFC 1952 members one after another (as java.util.zip.GZIPInputStream reads them)."""
    pending = bytes(data)
    while True:
        inflater = zlib.decompressobj(wbits=GZIP_WBITS)
        while not inflater.eof:
            try:
                out = inflater.decompress(pending, budget.want())
            except zlib.error as exc:
                raise _corrupt(GZIP, exc) from exc
            pending = inflater.unconsumed_tail
            if out:
                budget.take(len(out))
                yield out
            elif not pending and not inflater.eof:
                raise _corrupt(GZIP, "truncated member")
        pending = inflater.unused_data
        if not pending:
            return


def _lz4_chunks(data: bytes | bytearray | memoryview, budget: _OutputBudget) -> Iterator[bytes]:
    """LZ4 frames one after another; blocks linked or independent, checksums verified."""
    pending = bytes(data)
    while True:
        frame = lz4.frame.LZ4FrameDecompressor()
        idle_calls = 0
        while not frame.eof:
            try:
                out = frame.decompress(pending, max_length=budget.want())
            except RuntimeError as exc:
                raise _corrupt(LZ4, exc) from exc
            pending = b""
            if out:
                idle_calls = 0
                budget.take(len(out))
                yield out
            elif frame.eof:
                break
            elif frame.needs_input or idle_calls:
                raise _corrupt(LZ4, "truncated frame")
            else:
                idle_calls += 1
        pending = frame.unused_data
        if not pending:
            return


def _zstd_chunks(data: bytes | bytearray | memoryview, budget: _OutputBudget) -> Iterator[bytes]:
    """zstd frames one after another. The frame layout is walked first (``_zstd_frames``):
    the streaming decoder stops quietly at truncated input, the walk does not. A frame's
    declared content size is never used to allocate; its window is capped."""
    payload = bytes(data)
    decompressor = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW_BYTES)
    for start, end in _zstd_frames(payload):
        try:
            for out in decompressor.read_to_iter(payload[start:end],
                                                 write_size=budget.chunk_bytes):
                budget.take(len(out))
                yield out
        except zstandard.ZstdError as exc:
            raise _corrupt(ZSTD, exc) from exc


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50  # low four bits free
_ZSTD_DICT_ID_BYTES = (0, 1, 2, 4)
_ZSTD_CONTENT_SIZE_BYTES = (0, 2, 4, 8)  # flag 0 in a single-segment frame: 1 byte
_ZSTD_RESERVED_BLOCK_TYPE = 3
_ZSTD_RLE_BLOCK_TYPE = 1


def _zstd_frames(payload: bytes) -> list[tuple[int, int]]:
    """(start, end) of each zstd frame in ``payload`` (RFC 8878 section 3.1), skippable
    frames left out; CorruptMessage for anything else, a truncation or trailing bytes."""
    frames, pos, size = [], 0, len(payload)
    if not payload:
        raise _corrupt(ZSTD, "empty input")
    while pos < size:
        if size - pos < 4:
            raise _corrupt(ZSTD, f"truncated frame magic at byte {pos}")
        magic = int.from_bytes(payload[pos : pos + 4], "little")
        if magic & ~0xF == _ZSTD_SKIPPABLE_MAGIC:
            pos += 8 + int.from_bytes(payload[pos + 4 : pos + 8], "little")
            if pos > size:
                raise _corrupt(ZSTD, "truncated skippable frame")
            continue
        if magic != _ZSTD_MAGIC:
            raise _corrupt(ZSTD, f"no zstd frame at byte {pos}")
        end = _zstd_frame_end(payload, pos)
        frames.append((pos, end))
        pos = end
    return frames


def _zstd_frame_end(payload: bytes, start: int) -> int:
    size = len(payload)
    if size - start < 5:
        raise _corrupt(ZSTD, "truncated frame header")
    descriptor = payload[start + 4]
    single_segment = descriptor >> 5 & 1
    content_size_flag = descriptor >> 6
    content_size_bytes = _ZSTD_CONTENT_SIZE_BYTES[content_size_flag] or single_segment
    pos = start + 5 + (1 - single_segment) + _ZSTD_DICT_ID_BYTES[descriptor & 3]
    pos += content_size_bytes
    last_block = 0
    while not last_block:
        if size - pos < 3:
            raise _corrupt(ZSTD, "truncated frame: a block header is missing")
        block_header = int.from_bytes(payload[pos : pos + 3], "little")
        last_block, block_type = block_header & 1, block_header >> 1 & 3
        if block_type == _ZSTD_RESERVED_BLOCK_TYPE:
            raise _corrupt(ZSTD, "reserved block type")
        pos += 3 + (1 if block_type == _ZSTD_RLE_BLOCK_TYPE else block_header >> 3)
    pos += 4 if descriptor >> 2 & 1 else 0  # content checksum
    if pos > size:
        raise _corrupt(ZSTD, "truncated frame")
    return pos

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


def _snappy_chunks(data: bytes | bytearray | memoryview,
                   budget: _OutputBudget) -> Iterator[bytearray]:
    """Xerial-framed blocks one by one, or one raw snappy block (librdkafka's form)."""
    view = memoryview(data)
    if len(view) < XERIAL_HEADER_BYTES or bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        yield _raw_snappy_block(view, budget)
        return
    # version and compatible version are ignored as Kafka does: some writers get them wrong.
    pos = XERIAL_HEADER_BYTES
    while pos < len(view):
        if len(view) - pos < _INT32.size:
            raise CorruptMessage(f"xerial snappy block length truncated at byte {pos}")
        (block_bytes,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if block_bytes < 0 or pos + block_bytes > len(view):
            raise CorruptMessage(f"xerial snappy block at byte {pos} overruns the data")
        yield _raw_snappy_block(view[pos : pos + block_bytes], budget)
        pos += block_bytes


def _raw_snappy_block(block: memoryview, budget: _OutputBudget) -> bytearray:
    """One raw snappy block, its declared length checked against the limit before the
    output is allocated (and the decoder held to it)."""
    try:
        declared_bytes = cramjam.snappy.decompress_raw_len(block)
        budget.check_room(declared_bytes)
        out = bytearray(declared_bytes)
        written = cramjam.snappy.decompress_raw_into(block, out)
    except cramjam.DecompressionError as exc:
        raise _corrupt(SNAPPY, exc) from exc
    if written != declared_bytes:
        raise _corrupt(SNAPPY, f"block of {written} bytes declared {declared_bytes}")
    budget.take(written)
    return out

def _repair_lz4_header_checksum(data: bytes | bytearray | memoryview) -> bytes:
    """Rewrite the frame descriptor's checksum byte: ``(xxh32(descriptor) >> 8) & 0xFF``."""
    frame = bytearray(data)
    checksum_pos = _lz4_header_checksum_position(frame)
    frame[checksum_pos] = (xxh32(bytes(frame[4:checksum_pos])) >> 8) & 0xFF
    return bytes(frame)


def _legacy_lz4_header_checksum(data: bytes) -> bytes:
    """The frame with Kafka's magic-0 checksum byte: xxh32 of magic and descriptor."""
    frame = bytearray(data)
    checksum_pos = _lz4_header_checksum_position(frame)
    frame[checksum_pos] = (xxh32(bytes(frame[:checksum_pos])) >> 8) & 0xFF
    return bytes(frame)


def _lz4_header_checksum_position(frame: bytearray) -> int:
    if len(frame) < 7 or bytes(frame[:4]) != LZ4_FRAME_MAGIC:
        raise CorruptMessage("lz4 frame magic missing")
    flags = frame[4]
    descriptor_bytes = 2
    descriptor_bytes += 8 if flags & _LZ4_FLG_CONTENT_SIZE else 0
    descriptor_bytes += 4 if flags & _LZ4_FLG_DICT_ID else 0
    checksum_pos = 4 + descriptor_bytes
    if len(frame) <= checksum_pos:
        raise CorruptMessage("lz4 frame descriptor truncated")
    return checksum_pos


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
