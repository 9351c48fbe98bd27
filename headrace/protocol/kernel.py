"""The compiled record kernel's Python face: whole-buffer record scans into numpy arrays.

Owns the protocol layer's per-record work, no I/O: decoding records into columns (dump-log,
the group coordinator's loading, the Spark data source; ``decode_arrow`` writes the source's
Arrow buffers in place), key hashes (the log cleaner's), the produce-time record walk, and
produce validation (``validate_batches`` and ``check_compressed_records``: Kafka's
LogValidator checks of every record, in the CRC pass; ``check_lz4_records``: an lz4 batch's
section inflated with liblz4 and checked in one pass; ``first_batch_outside_limits``), and
CRC-32C. The loops live in C (``_kernel.c`` over ``record_batches.h``, ``crc32c.h`` and
``kernel_common.h``, built by ``pip install``); this module checks arguments, decompresses
compressed record sections (one ``compression.decompress_section`` call per batch: at most
``MAX_RECORDS_SECTION_BYTES``, a larger one is corrupt) and wraps the C output buffers as
read-only numpy arrays -- no Python object per record. ``byte_view``, ``scan_batches`` and
``seal_compressed`` serve the other layers' compiled faces (``storage.segment_io``: the
append path, recovery, the cleaner's passes; ``spark.encoder``: the sink's batches), which
reuse the same C through these headers.

Input is a buffer of whole Kafka v2 record batches, as a Fetch response or a ``.log``
segment holds them (any contiguous buffer: bytes, bytearray, memoryview, mmap). A trailing
partial batch is ignored, as Kafka clients do; ``bytes_consumed`` says where it starts.
Malformed input raises ``CorruptMessage``; batch CRC-32C is verified unless
``verify_crc=False``. Control batches (transaction markers) are skipped unless asked for.

Column layout follows Arrow: a binary column is ``offsets`` int32[n+1] + ``data`` uint8[]
+ ``valid`` bool[n]; record i's bytes are ``data[offsets[i]:offsets[i+1]]``. Headers are
Arrow ``list<struct<key: string, value: binary>>`` buffers. One call's columns hold at most
2 GiB - 1 bytes each (int32 offsets): larger inputs raise OverflowError; decode in pieces.

Thread-safety: pure functions; the C loops release the GIL, so threads decode in parallel.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from headrace.errors import CorruptMessage
from headrace.protocol import _kernel
from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    CRC_OFFSET,
    LOG_OVERHEAD_BYTES,
)
from headrace.protocol.compression import CODEC_NAMES, compress, decompress_section

NO_OFFSET = -1
LENGTH_OFFSET = 8  # batch_length in the batch header
CREATE_TIME = 0
LOG_APPEND_TIME = 1

BufferLike = bytes | bytearray | memoryview
WritableBuffer = bytearray | memoryview | np.ndarray  # contiguous, writable bytes


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """Records of whole batches as Arrow-layout numpy columns (read-only arrays)."""

    count: int
    offsets: np.ndarray  # int64[n], absolute
    timestamps_ms: np.ndarray  # int64[n]
    timestamp_types: np.ndarray  # int8[n]: 0 CreateTime, 1 LogAppendTime
    key_offsets: np.ndarray  # int32[n+1]
    key_data: np.ndarray  # uint8[]
    key_valid: np.ndarray  # bool[n]; False = null key
    value_offsets: np.ndarray  # int32[n+1]
    value_data: np.ndarray  # uint8[]
    value_valid: np.ndarray  # bool[n]; False = null value (tombstone)
    header_list_offsets: np.ndarray  # int32[n+1]: record i's headers are [o[i], o[i+1])
    header_key_offsets: np.ndarray  # int32[h+1]
    header_key_data: np.ndarray  # uint8[], UTF-8
    header_value_offsets: np.ndarray  # int32[h+1]
    header_value_data: np.ndarray  # uint8[]
    header_value_valid: np.ndarray  # bool[h]
    next_offset: int  # last offset + 1 of the last whole batch; -1 if there was none
    bytes_consumed: int  # bytes of whole batches: where a trailing partial batch starts


@dataclass(frozen=True, slots=True)
class KeyHashes:
    """Per record: offset and MurmurHash3 x64 128 (seed 0) of the key, as the cleaner
    needs them. Null keys hash to (0, 0) with ``has_key`` False."""

    offsets: np.ndarray  # int64[n]
    hash_hi: np.ndarray  # uint64[n]: the first 64-bit word (h1) of the hash
    hash_lo: np.ndarray  # uint64[n]: the second word (h2)
    is_tombstone: np.ndarray  # bool[n]: null value
    has_key: np.ndarray  # bool[n]
    next_offset: int
    bytes_consumed: int

    @property
    def count(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True, slots=True)
class BatchScan:
    """What a header-only pass (``scan_batches``) found in a buffer of whole batches."""

    record_count: int
    next_offset: int
    bytes_consumed: int
    sections: tuple[bytes, ...]  # decompressed records of the compressed batches, in order


_COLUMN_DTYPES = (
    np.int64,  # offsets
    np.int64,  # timestamps_ms
    np.int8,  # timestamp_types
    np.int32,  # key_offsets
    np.uint8,  # key_data
    np.bool_,  # key_valid
    np.int32,  # value_offsets
    np.uint8,  # value_data
    np.bool_,  # value_valid
    np.int32,  # header_list_offsets
    np.int32,  # header_key_offsets
    np.uint8,  # header_key_data
    np.int32,  # header_value_offsets
    np.uint8,  # header_value_data
    np.bool_,  # header_value_valid
)
_KEY_HASH_DTYPES = (np.int64, np.uint64, np.uint64, np.bool_, np.bool_)


def decode_columns(
    buf: BufferLike, *, skip_control: bool = True, verify_crc: bool = True
) -> RecordColumns:
    """Decode every record of the whole batches in ``buf`` into columns.

    Offsets are absolute (base offset + offset delta). Timestamps: a LogAppendTime batch's
    max timestamp for each of its records, else base timestamp + timestamp delta.
    """
    with byte_view(buf) as view:
        scan = scan_batches(view, skip_control, verify_crc, decompress_sections=True)
        raw = _kernel.decode_columns(view, scan.sections, skip_control)
    arrays = [np.frombuffer(data, dtype) for data, dtype in zip(raw, _COLUMN_DTYPES, strict=True)]
    return RecordColumns(
        len(arrays[0]), *arrays, next_offset=scan.next_offset, bytes_consumed=scan.bytes_consumed
    )


ARROW_ALIGNMENT_BYTES = 64  # where each of ArrowBuffers' buffers starts in a region
_ARROW_ROW_BYTES = (8, 8, 4)  # offsets, timestamps_us, timestamp_types: bytes per record
# The smallest v2 record: length, attributes, timestamp delta, offset delta, key length,
# value length and header count, one byte each.
MIN_RECORD_BYTES = 7


@dataclass(frozen=True, slots=True)
class ArrowDecodePlan:
    """What ``decode_arrow`` needs before decoding a buffer, from its batch headers alone:
    at most ``max_records`` records and at most ``max_data_bytes`` bytes of keys (and of
    values) -- its output capacities -- and the decompressed record sections."""

    max_records: int
    max_data_bytes: int
    sections: tuple[bytes, ...]
    skip_control: bool
    next_offset: int
    bytes_consumed: int


@dataclass(frozen=True, slots=True)
class ArrowBuffers:
    """The writable buffers ``decode_arrow`` fills, in Arrow's layout (little-endian)."""

    offsets: memoryview  # int64[rows]
    timestamps_us: memoryview  # int64[rows]: Arrow timestamp[us]
    timestamp_types: memoryview  # int32[rows]: 0 CreateTime, 1 LogAppendTime
    key_offsets: memoryview  # int32[rows + 1]
    key_validity: memoryview  # bitmap[rows]: bit i set = key i is not null
    key_data: memoryview
    value_offsets: memoryview  # int32[rows + 1]
    value_validity: memoryview  # bitmap[rows]
    value_data: memoryview


@dataclass(frozen=True, slots=True)
class ArrowFilled:
    """What ``decode_arrow`` wrote: ``count`` rows, data bytes and null counts."""

    count: int
    key_bytes: int
    value_bytes: int
    key_null_count: int
    value_null_count: int


def plan_arrow_decode(buf: BufferLike, *, skip_control: bool = True) -> ArrowDecodePlan:
    """Capacities for ``decode_arrow(buf, ...)`` (batch headers only; no CRC check here)."""
    with byte_view(buf) as view:
        scan = scan_batches(view, skip_control, False, decompress_sections=True)
        data_bytes = len(view) + sum(len(section) for section in scan.sections)
    # A batch header's record count is not checked here: a corrupt one must not size the
    # output past what the bytes can hold (decoding such a batch raises CorruptMessage).
    max_records = min(scan.record_count, data_bytes // MIN_RECORD_BYTES)
    return ArrowDecodePlan(max_records, data_bytes, scan.sections, skip_control,
                           scan.next_offset, scan.bytes_consumed)


def _arrow_buffer_sizes(max_records: int, max_data_bytes: int) -> tuple[int, ...]:
    bitmap_bytes = (max_records + 7) // 8
    offsets_bytes = 4 * (max_records + 1)
    return (*(width * max_records for width in _ARROW_ROW_BYTES),
            offsets_bytes, bitmap_bytes, max_data_bytes,
            offsets_bytes, bitmap_bytes, max_data_bytes)


def _aligned(size_bytes: int) -> int:
    return -(-size_bytes // ARROW_ALIGNMENT_BYTES) * ARROW_ALIGNMENT_BYTES


def arrow_region_bytes(plan: ArrowDecodePlan) -> int:
    """Bytes of the one region ``arrow_buffers_in`` carves ``plan``'s buffers from."""
    return sum(_aligned(size) for size in
               _arrow_buffer_sizes(plan.max_records, plan.max_data_bytes))


def arrow_buffers_in(region: WritableBuffer, plan: ArrowDecodePlan) -> ArrowBuffers:
    """``plan``'s output buffers as consecutive slices of ``region`` (at least
    ``arrow_region_bytes(plan)`` bytes), each starting ``ARROW_ALIGNMENT_BYTES``-aligned
    relative to the region's start."""
    view = memoryview(region).cast("B")
    slices, start = [], 0
    for size in _arrow_buffer_sizes(plan.max_records, plan.max_data_bytes):
        slices.append(view[start:start + size])
        start += _aligned(size)
    if start > len(view):
        raise ValueError(f"region of {len(view)} bytes, {start} needed")
    return ArrowBuffers(*slices)


def decode_arrow(buf: BufferLike, plan: ArrowDecodePlan, out: ArrowBuffers,
                 from_offset: int, until_offset: int, *, verify_crc: bool = True
                 ) -> ArrowFilled:
    """Decode the records of ``buf`` with offsets in [``from_offset``, ``until_offset``)
    into ``out`` (planned by ``plan_arrow_decode(buf)``) in one pass without the GIL: each
    batch's CRC-32C is checked right before its records are read; control batches are
    skipped as the plan says. Timestamps as ``decode_columns`` gives them, in microseconds.
    More records or bytes than ``out`` holds raise ValueError."""
    with byte_view(buf) as view:
        return ArrowFilled(*_kernel.decode_arrow(
            view, plan.sections, plan.skip_control, verify_crc, from_offset, until_offset,
            (out.offsets, out.timestamps_us, out.timestamp_types, out.key_offsets,
             out.key_validity, out.key_data, out.value_offsets, out.value_validity,
             out.value_data)))


def hash_keys(buf: BufferLike, *, verify_crc: bool = True) -> KeyHashes:
    """Offsets and key hashes of the records of the whole, non-control batches in ``buf``
    (the log cleaner's first pass: the latest offset per key wins)."""
    with byte_view(buf) as view:
        scan = scan_batches(view, True, verify_crc, decompress_sections=True)
        raw = _kernel.hash_keys(view, scan.sections, True)
    arrays = [np.frombuffer(data, dtype) for data, dtype in zip(raw, _KEY_HASH_DTYPES, strict=True)]
    return KeyHashes(*arrays, next_offset=scan.next_offset, bytes_consumed=scan.bytes_consumed)


def murmur3_x64_128(data: BufferLike, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3 x64 128 of ``data``: ``(h1, h2)``, the hash ``hash_keys`` uses."""
    if not 0 <= seed <= 0xFFFFFFFF:
        raise ValueError(f"murmur3 seed must fit in 32 unsigned bits, got {seed}")
    return _kernel.murmur3_x64_128(data, seed)


def whole_batches_bytes(buf: BufferLike) -> int:
    """Bytes of the whole batches at the start of ``buf`` (headers only, no CRC check)."""
    with byte_view(buf) as view:
        return scan_batches(view, False, False, decompress_sections=False).bytes_consumed


def seal_compressed(batch: memoryview, codec: int) -> bytearray:
    """A copy of the uncompressed ``batch`` with the records after its header compressed
    with ``codec``, and its length and CRC-32C fixed."""
    sealed = bytearray(batch[:BATCH_HEADER_BYTES])
    sealed += compress(codec, batch[BATCH_HEADER_BYTES:])
    struct.pack_into(">i", sealed, LENGTH_OFFSET, len(sealed) - LOG_OVERHEAD_BYTES)
    struct.pack_into(">I", sealed, CRC_OFFSET, crc32c(memoryview(sealed)[ATTRIBUTES_OFFSET:]))
    return sealed


def byte_view(buf: BufferLike) -> memoryview:
    """A flat unsigned-byte view of ``buf``; rejects non-contiguous buffers."""
    try:
        view = memoryview(buf)
    except TypeError as exc:
        raise TypeError(f"expected a bytes-like buffer, got {type(buf).__name__}") from exc
    if not view.c_contiguous:
        view.release()
        raise ValueError("record buffer must be contiguous")
    if view.format != "B" or view.ndim != 1:
        flat = view.cast("B")
        view.release()
        return flat
    return view


def scan_batches(
    view: memoryview, skip_control: bool, verify_crc: bool, *, decompress_sections: bool
) -> BatchScan:
    """Record count, next offset and whole-batch bytes of ``view`` (a ``byte_view``) from the
    batch headers (CRC-32C checked if ``verify_crc``), and, if ``decompress_sections``, the
    decompressed records of each compressed batch the walks will meet, in order: the
    ``sections`` every record walk in C takes."""
    record_count, next_offset, bytes_consumed, spans = _kernel.scan(view, skip_control, verify_crc)
    sections: tuple[bytes, ...] = ()
    if decompress_sections and spans:
        triples = np.frombuffer(spans, np.int64).reshape(-1, 3).tolist()
        sections = tuple(_decompress_records(view, *triple) for triple in triples)
    return BatchScan(record_count, next_offset, bytes_consumed, sections)


def _decompress_records(view: memoryview, start: int, end: int, codec: int) -> bytes:
    if codec not in CODEC_NAMES:
        raise CorruptMessage(
            f"record batch at byte {start - BATCH_HEADER_BYTES} uses unknown codec {codec}"
        )
    return decompress_section(codec, view[start:end], start - BATCH_HEADER_BYTES)


# walk_records(chunk, pos, records_left, previous_delta, last_offset_delta) -> (pos,
# records_walked, previous_delta, first_keyless_delta, stop): the produce-time record walk
# (``records.walk_records_section``) over one inflated chunk of a batch's records section: whole
# records from ``pos``, each fully validated as the decoders here validate them, offset deltas
# increasing and at most ``last_offset_delta``, until ``records_left`` are walked (stop
# ``WALK_DONE``), the next record is not wholly in the chunk (``WALK_NEED_MORE``) or one is
# malformed (``WALK_MALFORMED``, ``pos`` at its start). ``first_keyless_delta``: the offset
# delta of the first keyless record walked, or -1. Bound to the C function itself.
walk_records = _kernel.walk_records
WALK_DONE, WALK_NEED_MORE, WALK_MALFORMED = 0, 1, 2


# validate_batches(buf, checks=None) -> tuple of (position, size_bytes, attributes,
# last_offset_delta, base_timestamp, max_timestamp, producer_id, records_count), one per batch:
# checks that ``buf`` is whole v2 batches (magic 2, plausible length, valid CRC-32C); raises
# CorruptMessage naming the byte position of the first bad batch; an empty buffer gives ``()``.
# With ``checks`` -- (compacted, check_timestamps, from_client, now_ms, before_max_ms,
# after_max_ms), see ``storage.validation.record_checks`` -- also Kafka's LogValidator checks:
# a codec id 0-4 (else CorruptMessage); records_count == last_offset_delta + 1 >= 1, from a
# client no control batch and no producer id without base sequence, and for an uncompressed
# batch every record parsed right after the CRC (well formed, offset deltas 0..n-1, nothing
# left over) -- InvalidRecord; per record a key on a compacted topic and a CreateTime timestamp
# within the window -- RecordsRejected(batch_position, ((index, kind, timestamp,
# offset_delta), ...), total) for the first batch with any (its first 1000 listed). An uncompressed batch's max_timestamp is
# then its largest record timestamp (-1 if none), written into the header with a new CRC
# when ``buf`` is writable and its header differs. One C call per request: the storage append
# path's check, bound without a Python wrapper. It releases the GIL only for buffers of 256 KiB
# or more: re-taking it can cost a thread switch interval.
validate_batches = _kernel.validate_batches

# check_compressed_records(buf, position, records, checks) -> max_timestamp: the checks
# ``validate_batches`` makes of an uncompressed batch, for the compressed batch at ``position``
# whose decompressed records section is ``records``; the header's max timestamp is rewritten
# likewise when ``buf`` is writable.
check_compressed_records = _kernel.check_compressed_records

# check_lz4_records(buf, position, out, checks) -> (max_timestamp, section_bytes) or None:
# ``check_compressed_records`` for the lz4 batch at ``position`` in one pass: its section
# inflated by liblz4's frame decoder into the writable buffer ``out``, a block at a time, each
# block's records checked as soon as it is written. None (declined, nothing raised) where the
# section does not inflate -- data liblz4 refuses, a truncated frame, or output that does not
# fit ``out`` with a byte to spare -- so the caller's general path (``compression``'s decoders,
# then ``check_compressed_records``) decides and raises the precise error; where it answers,
# it answers what that path would. Errors as ``check_compressed_records``.
check_lz4_records = _kernel.check_lz4_records

# Raised by the two above with the refused records of one batch (KIP-467 record errors).
RecordsRejected = _kernel.RecordsRejected
RECORD_ERROR_NO_KEY = 1  # a record without a key on a compacted topic
RECORD_ERROR_TIMESTAMP = 2  # a CreateTime timestamp outside message.timestamp.*.max.ms
RECORD_ERROR_TIMESTAMP_TYPE = 3  # LogAppendTime set by a producer where Kafka refuses it


# first_batch_outside_limits(summaries, max_message_bytes, now_ms, before_max_ms, after_max_ms,
# check_timestamps) -> int: index of the first of ``validate_batches``' summaries whose batch
# breaks a produce limit -- larger than ``max_message_bytes``, ``records_count !=
# last_offset_delta + 1`` or < 1, or (if ``check_timestamps``) a base or max timestamp other
# than -1 more than ``before_max_ms`` before or ``after_max_ms`` after ``now_ms`` (saturating
# int64 arithmetic) -- or -1. Bound to the C function itself, without a Python wrapper: it
# runs on every append.
first_batch_outside_limits = _kernel.first_batch_outside_limits


# The CRC-32C variant chosen at import: "folded" (carry-less multiplication, AVX-512
# VPCLMULQDQ), "interleaved" (three SSE 4.2 streams) or "portable" (tables). The environment
# variable HEADRACE_KERNEL_CRC32C=interleaved|portable caps it, e.g. to rule out a CPU-specific
# fault or to test every variant on one machine.
CRC32C_VARIANT_ENV = "HEADRACE_KERNEL_CRC32C"
CRC32C_VARIANT: str = _kernel.CRC32C_VARIANT
# The variants this CPU can run (whatever the environment caps), slowest first.
CRC32C_VARIANTS_SUPPORTED: tuple[str, ...] = tuple(_kernel.CRC32C_VARIANTS_SUPPORTED.split())


def crc32c(buf: BufferLike) -> int:
    """CRC-32C of ``buf`` as ``validate_batches`` computes it, with ``CRC32C_VARIANT``."""
    return _kernel.crc32c(buf)
