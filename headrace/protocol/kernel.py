"""The compiled record kernel's Python face: whole-buffer record scans into numpy arrays.

Owns the per-record work shared by the log cleaner (key hashes, both passes: ``map_batches``
fills the offset map, ``filter_batches`` writes the kept records, and ``map_span`` /
``filter_span`` run them over a span of a segment file -- reads and writes included -- in
one call), produce validation (``validate_batches`` and ``check_compressed_records``: Kafka's
LogValidator checks of every record, in the CRC pass; ``append_plain_batch`` /
``write_batch`` check a plain produce batch and write it to the segment descriptor with its
base offset replaced, in one call, never changing the caller's buffer), dump-log and the Spark
data source (columns; ``decode_arrow`` writes the source's Arrow buffers in place). The loops
live in C (``_kernel.c``, built by ``pip install``); this module checks arguments, decompresses compressed record sections (one
``compression.decompress_section`` call per batch: at most ``MAX_RECORDS_SECTION_BYTES``, a
larger one is corrupt) and wraps the C output buffers as read-only numpy
arrays -- no Python object per record.

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
from headrace.protocol.compression import CODEC_NAMES, NONE, compress, decompress_section

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
class _Scan:
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
    with _byte_view(buf) as view:
        scan = _scan(view, skip_control, verify_crc, decompress_sections=True)
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
    with _byte_view(buf) as view:
        scan = _scan(view, skip_control, False, decompress_sections=True)
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
    with _byte_view(buf) as view:
        return ArrowFilled(*_kernel.decode_arrow(
            view, plan.sections, plan.skip_control, verify_crc, from_offset, until_offset,
            (out.offsets, out.timestamps_us, out.timestamp_types, out.key_offsets,
             out.key_validity, out.key_data, out.value_offsets, out.value_validity,
             out.value_data)))


def hash_keys(buf: BufferLike, *, verify_crc: bool = True) -> KeyHashes:
    """Offsets and key hashes of the records of the whole, non-control batches in ``buf``
    (the log cleaner's first pass: the latest offset per key wins)."""
    with _byte_view(buf) as view:
        scan = _scan(view, True, verify_crc, decompress_sections=True)
        raw = _kernel.hash_keys(view, scan.sections, True)
    arrays = [np.frombuffer(data, dtype) for data, dtype in zip(raw, _KEY_HASH_DTYPES, strict=True)]
    return KeyHashes(*arrays, next_offset=scan.next_offset, bytes_consumed=scan.bytes_consumed)


def murmur3_x64_128(data: BufferLike, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3 x64 128 of ``data``: ``(h1, h2)``, the hash ``hash_keys`` uses."""
    if not 0 <= seed <= 0xFFFFFFFF:
        raise ValueError(f"murmur3 seed must fit in 32 unsigned bits, got {seed}")
    return _kernel.murmur3_x64_128(data, seed)


@dataclass(frozen=True, slots=True)
class PassScope:
    """The records one log-cleaner pass owns: keyed records of non-control batches with an
    offset in the dirty section ``[first_offset, end_offset)`` and ``h2 >> 32`` (the second
    word of the key's MurmurHash3) in ``[range_low, range_high)``. The pass numbers them
    0, 1, 2, ... in log order: their ordinals, which the offset map stores (so one pass
    addresses 2**26 of its own records whatever the offset span)."""

    first_offset: int
    end_offset: int
    range_low: int
    range_high: int


@dataclass(frozen=True, slots=True)
class MapBuild:
    """What ``map_batches`` did: records walked, the ordinal after the last one numbered,
    keys new to the map, and whether it stopped because the map is full (room, slot reach
    or the 2**26 ordinal field)."""

    records_read: int
    next_ordinal: int
    new_keys: int
    full: bool


@dataclass(frozen=True, slots=True)
class FilteredBatches:
    """The cleaned bytes of one buffer of whole batches (``filter_batches``)."""

    data: BufferLike  # has len()
    records_read: int  # records of non-control batches
    records_kept: int
    next_ordinal: int


def map_batches(
    buf: BufferLike, fingerprints: np.ndarray, words: np.ndarray, scope: PassScope,
    first_ordinal: int, room_keys: int, *, verify_crc: bool = True
) -> MapBuild:
    """The cleaner's pass 1 over the whole batches of ``buf``: put each record of ``scope``
    into the offset-map tables (``headrace.storage.offset_map``) as key hash -> its ordinal,
    the latest winning, numbering from ``first_ordinal``; stops when ``room_keys`` new keys
    were added or the map cannot take the next one (``full``)."""
    with _byte_view(buf) as view:
        scan = _scan(view, True, verify_crc, decompress_sections=True)
        records_read, next_ordinal, new_keys, full = _kernel.map_batches(
            view, scan.sections, fingerprints, words, room_keys, scope.first_offset,
            scope.end_offset, scope.range_low, scope.range_high, first_ordinal)
    return MapBuild(records_read, next_ordinal, new_keys, bool(full))


def filter_batches(
    buf: BufferLike, fingerprints: np.ndarray, words: np.ndarray, scope: PassScope,
    first_ordinal: int, now_ms: int, new_delete_horizon_ms: int,
    protected_last_offsets: np.ndarray, *, verify_crc: bool = True
) -> FilteredBatches:
    """The cleaner's pass 2 over the whole batches of ``buf`` (numbering ``scope``'s records
    from ``first_ordinal`` as ``map_batches`` did). A record is kept iff it has a key and is
    outside the hash range, or its key is not in the map, or it is in the dirty section with
    the mapped ordinal -- except a tombstone whose batch's delete horizon is <= ``now_ms``.

    Per batch: control batches and batches keeping every record (and needing no new delete
    horizon) are copied byte for byte; a batch keeping none disappears, unless its last
    offset is in the sorted ``protected_last_offsets`` (a producer's last batch), which stays
    as an empty batch; any other batch is rebuilt with the same base offset, last offset
    delta, producer fields and codec (Kafka's ``buildRetainedRecordsInto``): kept records
    are copied with their timestamp delta rebased on the new base timestamp -- the delete
    horizon (KIP-534, ``new_delete_horizon_ms`` when the batch keeps tombstones and has none
    yet) or else the first kept record's timestamp."""
    protected = np.ascontiguousarray(protected_last_offsets, np.int64)
    with _byte_view(buf) as view:
        scan = _scan(view, True, verify_crc, decompress_sections=True)
        (out, pending, pending_batches), read, kept, next_ordinal = _kernel.filter_batches(
            view, scan.sections, fingerprints, words, scope.first_offset, scope.end_offset,
            scope.range_low, scope.range_high, first_ordinal, now_ms, new_delete_horizon_ms,
            protected)
    return FilteredBatches(_insert_compressed(out, pending, pending_batches), read, kept,
                           next_ordinal)


SPAN_DONE = 0  # the span ended: at end_position, or at the first chunk past span_bytes
SPAN_COMPRESSED = 1  # a compressed batch starts at the position reached
SPAN_GROW = 2  # the batch at the position reached (stop_bytes long) is larger than the buffer
SPAN_FULL = 3  # pass 1: the map cannot take the next key


@dataclass(frozen=True, slots=True)
class MapSpan:
    """What ``map_span`` did: the file position reached, why it stopped there (``SPAN_*``;
    ``stop_bytes`` is the batch size for ``SPAN_GROW``), and the pass's figures as
    ``MapBuild`` gives them for a buffer."""

    position: int
    stop: int
    stop_bytes: int
    records_read: int
    next_ordinal: int
    new_keys: int


@dataclass(frozen=True, slots=True)
class FilterSpan:
    """What ``filter_span`` did: the file position reached, why it stopped there, records
    read and kept, the next ordinal, the bytes of output (written, or staged: the last
    ``stage_fill`` bytes of the output are still in the stage) and the index of those bytes
    (``indexed``: what ``index_batches`` computes over them)."""

    position: int
    stop: int
    stop_bytes: int
    records_read: int
    records_kept: int
    next_ordinal: int
    bytes_written: int
    stage_fill: int
    indexed: IndexedBatches


# A span with a direct_fd reads its uncached chunks with O_DIRECT: its buffer starts on a
# multiple of this and holds a chunk plus this slack (see map_span).
DIRECT_READ_ALIGN_BYTES = 4096
DIRECT_READ_SLACK_BYTES = 2 * DIRECT_READ_ALIGN_BYTES


def page_cache_holds(fd: int, position: int, length: int) -> bool:
    """Whether every page of bytes ``[position, position + length)`` of the file ``fd`` is in
    the page cache (cachestat, or mincore before Linux 6.5; True where the kernel cannot
    tell). One system call; the GIL is held."""
    return _kernel.page_cache_holds(fd, position, length)


def aligned_buffer(size_bytes: int, alignment_bytes: int = DIRECT_READ_ALIGN_BYTES
                   ) -> np.ndarray:
    """``size_bytes`` of uninitialised memory starting at a multiple of ``alignment_bytes``
    (``O_DIRECT`` I/O needs block-aligned memory)."""
    raw = np.empty(size_bytes + alignment_bytes, np.uint8)
    start = -raw.ctypes.data % alignment_bytes
    return raw[start:start + size_bytes]


# The environment variable HEADRACE_PAGE_CACHE_PROBE=mincore, read at import, makes the spans
# ask the page cache with mincore(2) as on kernels before 6.5 (unset or "cachestat": cachestat
# while the kernel has it).
PAGE_CACHE_PROBE_ENV = "HEADRACE_PAGE_CACHE_PROBE"


def page_cache_probe() -> str:
    """"cachestat" or "mincore": the probe the spans use now (cachestat turns into mincore on
    its first ENOSYS, on kernels before 6.5)."""
    return _kernel.page_cache_probe()


def use_cachestat(flag: bool) -> bool:
    """Whether the spans ask which chunks are in the page cache with cachestat(2) (Linux
    6.5+) rather than mincore(2) over a mapping of the chunk (what kernels without
    cachestat get); returns the previous setting. For tests of the mincore path."""
    return _kernel.use_cachestat(flag)


def read_chunk(fd: int, direct_fd: int, buffer: WritableBuffer, position: int,
               want: int) -> memoryview:
    """Up to ``want`` bytes of the file ``fd`` at ``position`` (fewer only at its end), read
    into ``buffer`` as ``map_span`` reads a chunk: from ``direct_fd`` (``O_DIRECT``; -1 for
    none) unless they are all in the page cache. With a ``direct_fd``, ``buffer`` is aligned
    and ``want`` at most ``len(buffer) - DIRECT_READ_SLACK_BYTES``. Without the GIL."""
    start, got = _kernel.read_chunk(fd, direct_fd, buffer, position, want)
    return memoryview(buffer)[start:start + got]


note_broker_request = _kernel.note_broker_request
"""``note_broker_request()``: the broker's event loop received a request now. While requests
keep coming (one within the last 50 ms), a niced span (``niceness`` > 0 in ``map_span`` /
``filter_span``) pauses 50 us after every 250 us of CPU, between chunks, so a thread woken
on its CPU -- the event loop, the append thread, a client -- runs at once instead of waiting
for the scheduler to preempt the span; an idle broker's spans never pause. One atomic store."""


def map_span(
    fd: int, buffer: WritableBuffer, position: int, end_position: int, span_bytes: int,
    fingerprints: np.ndarray, words: np.ndarray, scope: PassScope, first_ordinal: int,
    room_keys: int, niceness: int = 0, direct_fd: int = -1
) -> MapSpan:
    """``map_batches`` over the file ``fd`` from ``position``, for about ``span_bytes`` (up
    to ``end_position``), in one call without the GIL: chunks of ``len(buffer)`` bytes are
    read into ``buffer`` and their whole batches mapped (a batch straddling a chunk's end is
    read again at the next chunk's start), CRC-32C checked. Stops early before a compressed
    batch (``SPAN_COMPRESSED``: map it with ``map_batches``), before a batch larger than
    ``buffer`` (``SPAN_GROW``) and when the map is full (``SPAN_FULL``). A batch running past
    ``end_position`` or the end of the file raises ``CorruptMessage``. With ``niceness``
    > 0 the span runs on a helper thread that much nicer than the caller (Linux nice values
    are per thread), while the caller waits without the GIL: the span's CPU work yields to
    other threads, yet the caller takes the GIL back at its own priority; such a span also
    pauses briefly while the broker serves requests (``note_broker_request``).

    ``direct_fd`` (the same file opened ``O_DIRECT``, or -1) is read instead of ``fd`` for a
    chunk not wholly in the page cache (``cachestat``), so reading cold segments neither
    fills the page cache nor runs readahead. ``buffer`` must then start on a multiple of
    ``DIRECT_READ_ALIGN_BYTES`` and holds chunks of ``len(buffer) -
    DIRECT_READ_SLACK_BYTES``; ``stop_bytes`` of a ``SPAN_GROW`` is the buffer size the batch
    needs, slack included."""
    return MapSpan(*_kernel.map_span(
        fd, buffer, position, end_position, span_bytes, fingerprints, words, room_keys,
        scope.first_offset, scope.end_offset, scope.range_low, scope.range_high,
        first_ordinal, niceness, direct_fd))


@dataclass(frozen=True, slots=True)
class OutputIndex:
    """Where ``filter_span``'s output goes in its file and the index state there: the file
    position it starts at, the offset after the last batch written before it (-1 if none),
    ``index.interval.bytes`` and the running ``IndexState``."""

    out_position: int
    next_offset: int
    index_interval_bytes: int
    state: IndexState


def filter_span(
    fd: int, out_fd: int, buffer: WritableBuffer, position: int, end_position: int,
    span_bytes: int, fingerprints: np.ndarray, words: np.ndarray, scope: PassScope,
    first_ordinal: int, now_ms: int, new_delete_horizon_ms: int,
    protected_last_offsets: np.ndarray, output: OutputIndex,
    stage: WritableBuffer | None = None, stage_fill: int = 0, niceness: int = 0,
    direct_fd: int = -1
) -> FilterSpan:
    """``filter_batches`` over the file ``fd`` as ``map_span`` walks it, writing each chunk's
    cleaned bytes to ``out_fd`` at its current offset (so the output needs one chunk of
    memory) and indexing them as ``index_batches`` would index the written file from
    ``output`` on (each output batch CRC-checked; one that fails raises ``CorruptMessage``).
    With a ``stage`` (for an ``O_DIRECT`` output: an aligned buffer whose size is a
    multiple of the block size, holding ``stage_fill`` bytes of earlier output), the output
    is appended to the stage and only whole stages are written. Stops early before a
    compressed batch (``SPAN_COMPRESSED``: filter it with ``filter_batches``, which
    recompresses) and before a batch larger than ``buffer`` (``SPAN_GROW``). A failed read
    or write raises ``OSError``. ``niceness`` and ``direct_fd`` as for ``map_span``."""
    protected = np.ascontiguousarray(protected_last_offsets, np.int64)
    state = output.state
    *counts, (next_offset, has_first, first_max_timestamp, raw_state,
              (offsets, times)) = _kernel.filter_span(
        fd, out_fd, buffer, position, end_position, span_bytes, fingerprints, words,
        scope.first_offset, scope.end_offset, scope.range_low, scope.range_high,
        first_ordinal, now_ms, new_delete_horizon_ms, protected, output.out_position,
        output.next_offset, output.index_interval_bytes,
        (state.bytes_since_last_entry, state.max_timestamp_ms, state.offset_of_max_timestamp,
         state.last_time_entry_ms, state.has_time_entry), stage, stage_fill, niceness,
        direct_fd)
    indexed = IndexedBatches(
        counts[-2], next_offset, False, first_max_timestamp if has_first else None,
        IndexState(*raw_state[:4], bool(raw_state[4])),
        np.frombuffer(offsets, np.int64).reshape(-1, 2),
        np.frombuffer(times, np.int64).reshape(-1, 2), np.empty(0, np.int64))
    return FilterSpan(*counts, indexed)


def whole_batches_bytes(buf: BufferLike) -> int:
    """Bytes of the whole batches at the start of ``buf`` (headers only, no CRC check)."""
    with _byte_view(buf) as view:
        return _scan(view, False, False, decompress_sections=False).bytes_consumed


def _insert_compressed(out: BufferLike, pending: BufferLike, pending_batches: BufferLike
                       ) -> BufferLike:
    """``out`` with each pending batch compressed, sealed and inserted at its position."""
    entries = np.frombuffer(pending, np.int64).reshape(-1, 4).tolist()
    view = memoryview(out)
    if not entries:
        return view
    batches = memoryview(pending_batches)
    pieces: list[BufferLike] = []
    previous = 0
    for position, start, end, codec in entries:
        pieces += (view[previous:position], _seal_compressed(batches[start:end], codec))
        previous = position
    pieces.append(view[previous:])
    return b"".join(pieces)


def _seal_compressed(batch: memoryview, codec: int) -> bytearray:
    """Compress the records after the batch header and fix its length and CRC-32C."""
    sealed = bytearray(batch[:BATCH_HEADER_BYTES])
    sealed += compress(codec, batch[BATCH_HEADER_BYTES:])
    struct.pack_into(">i", sealed, LENGTH_OFFSET, len(sealed) - LOG_OVERHEAD_BYTES)
    struct.pack_into(">I", sealed, CRC_OFFSET, crc32c(memoryview(sealed)[ATTRIBUTES_OFFSET:]))
    return sealed


def _byte_view(buf: BufferLike) -> memoryview:
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


def _scan(
    view: memoryview, skip_control: bool, verify_crc: bool, *, decompress_sections: bool
) -> _Scan:
    record_count, next_offset, bytes_consumed, spans = _kernel.scan(view, skip_control, verify_crc)
    sections: tuple[bytes, ...] = ()
    if decompress_sections and spans:
        triples = np.frombuffer(spans, np.int64).reshape(-1, 3).tolist()
        sections = tuple(_decompress_records(view, *triple) for triple in triples)
    return _Scan(record_count, next_offset, bytes_consumed, sections)


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


# append_plain_batch(buf, fd, base_offset, max_size_bytes, max_last_offset, now_ms,
# (max_message_bytes, before_max_ms, after_max_ms, required_codec, compacted, from_client)) ->
# (last_offset, max_timestamp, written) | None: the append path's common case in one call, GIL
# released throughout. ``buf`` is only read (bytes, bytearray, or a read-only memoryview of a
# request frame). When it holds exactly one v2 batch that passes ``validate_batches`` with its
# checks and ``first_batch_outside_limits`` (timestamps always checked: CreateTime topics
# only), is at
# most ``max_size_bytes``, ends at or below ``max_last_offset`` once based at ``base_offset``
# and is in ``required_codec`` (-1: any; control batches excepted): writes it to ``fd`` with
# ``base_offset`` in place of its first 8 bytes -- one writev of the new base offset and the
# rest, as the CRC does not cover the base offset (``written`` True; continuing short writes,
# retrying EINTR after running signal handlers; a failed write truncates the file back to
# where the batch began and raises OSError) -- unless the batch carries a producer id (and is
# no control batch), is compressed, or its header's max timestamp is not its records' largest:
# then nothing is written (``written`` False; ``max_timestamp`` is the records' for an
# uncompressed batch) and the caller checks the sequence, the compressed records, rewrites
# the max timestamp in a copy, before ``write_batch``. A batch with a bad CRC raises
# CorruptMessage exactly as ``validate_batches`` would; one its checks refuse is declined. Anything else (also an object that is no contiguous buffer)
# returns None with nothing written (decided from the header, before any CRC work): the
# caller's general path validates again and raises the precise error. Bound to the C function
# itself: it runs on every append.
append_plain_batch = _kernel.append_plain_batch

# write_batch(buf, fd, base_offset): write the one batch in ``buf`` (that
# ``append_plain_batch`` validated) to ``fd`` with ``base_offset`` as its base offset, as
# ``append_plain_batch`` writes; ``buf`` is only read.
write_batch = _kernel.write_batch


@dataclass(frozen=True, slots=True)
class IndexState:
    """A segment's running index state between chunks of ``index_batches``: log bytes since
    the last offset index entry, the largest timestamp so far and its offset, and the time
    index's last timestamp (``has_time_entry`` False while the time index is empty)."""

    bytes_since_last_entry: int
    max_timestamp_ms: int
    offset_of_max_timestamp: int
    last_time_entry_ms: int
    has_time_entry: bool


@dataclass(frozen=True, slots=True)
class IndexedBatches:
    """What ``index_batches`` found in one chunk of a segment's log file."""

    bytes_valid: int  # whole valid batches from the start of the chunk
    next_offset: int  # after the last valid batch; the given next_offset if none
    stopped: bool  # an invalid batch ends the log at bytes_valid (else the chunk ran out)
    first_max_timestamp_ms: int | None  # the first valid batch's max timestamp
    state: IndexState
    offset_entries: np.ndarray  # int64[n, 2]: last offset of the batch, file position
    time_entries: np.ndarray  # int64[m, 2]: largest timestamp so far, its offset
    batch_positions: np.ndarray  # int64[k]: position of each valid batch in the chunk


def index_batches(buf: BufferLike, buffer_position: int, file_size: int, min_base_offset: int,
                  next_offset: int, index_interval_bytes: int, state: IndexState
                  ) -> IndexedBatches:
    """Segment recovery over one chunk read at ``buffer_position`` of a ``file_size``-byte
    log: validate the batches from the chunk's start (magic 2, plausible length, base offset
    >= max(``min_base_offset``, ``next_offset``), inside the file, CRC-32C) up to the first
    invalid one, and compute the index entries the append path writes for them: an offset
    index entry (batch last offset, position) when more than ``index_interval_bytes`` were
    written since the last one, each with a time index entry (largest timestamp so far, its
    offset) when that timestamp grew past the time index's last. One C call, no Python per
    batch; the returned state carries over to the next chunk."""
    (bytes_valid, next_offset, stopped, has_first, first_max_timestamp, raw_state,
     (offsets, times, positions)) = _kernel.index_batches(
        buf, buffer_position, file_size, min_base_offset, next_offset, index_interval_bytes,
        (state.bytes_since_last_entry, state.max_timestamp_ms, state.offset_of_max_timestamp,
         state.last_time_entry_ms, state.has_time_entry))
    return IndexedBatches(
        bytes_valid, next_offset, bool(stopped), first_max_timestamp if has_first else None,
        IndexState(*raw_state[:4], bool(raw_state[4])),
        np.frombuffer(offsets, np.int64).reshape(-1, 2),
        np.frombuffer(times, np.int64).reshape(-1, 2), np.frombuffer(positions, np.int64))


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


# --- producing: record batches from columns (the Spark sink) -----------------------------

NO_PRODUCER_ID = -1
SEQUENCE_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BinaryColumn:
    """An Arrow-layout binary column: row i is ``data[offsets[i]:offsets[i+1]]``, null where
    ``valid`` (if given) is False."""

    offsets: np.ndarray  # int32[n+1]
    data: BufferLike
    valid: np.ndarray | None = None  # bool[n]; None: no nulls

    def _spec(self) -> tuple:
        valid = None if self.valid is None else np.ascontiguousarray(self.valid, np.bool_)
        return (np.ascontiguousarray(self.offsets, np.int32), self.data, valid)


@dataclass(frozen=True, slots=True)
class HeaderColumn:
    """Arrow ``list<struct<key: string, value: binary>>`` buffers: row i's headers are the
    entries ``[list_offsets[i], list_offsets[i+1])`` of ``keys`` (no nulls) and ``values``;
    a null list (``list_valid`` False) has no headers."""

    list_offsets: np.ndarray  # int32[n+1]
    list_valid: np.ndarray | None
    keys: BinaryColumn
    values: BinaryColumn

    def _spec(self) -> tuple:
        valid = (None if self.list_valid is None
                 else np.ascontiguousarray(self.list_valid, np.bool_))
        return (np.ascontiguousarray(self.list_offsets, np.int32), valid, self.keys._spec(),
                self.values._spec(), len(self.keys.offsets) - 1)


@dataclass(frozen=True, slots=True)
class ProducerFields:
    """The idempotent producer's batch fields; ``producer_id`` -1: a plain producer (base
    sequence -1 is written)."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = 0


@dataclass(frozen=True, slots=True)
class StickyPartition:
    """Where the partitioner puts keyless rows: ``partition`` until ``bytes_in_batch`` reach
    the batch size, then the next partition in turn."""

    partition: int
    bytes_in_batch: int = 0


@dataclass(frozen=True, slots=True)
class EncodedBatches:
    """Whole v2 record batches, back to back; ``bounds[i]`` is batch i's (start, end,
    record count) in ``data``."""

    data: BufferLike
    bounds: np.ndarray  # int64[k, 3]

    def batches(self) -> list[tuple[memoryview, int]]:
        """(bytes, record count) of each batch."""
        view = memoryview(self.data)
        return [(view[start:end], records) for start, end, records in self.bounds.tolist()]


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: producer sequences wrap to 0 after
    2**31 - 1."""
    if sequence > SEQUENCE_MAX - increment:
        return increment - (SEQUENCE_MAX - sequence) - 1
    return sequence + increment


def murmur2(data: BufferLike) -> int:
    """Kafka's ``Utils.murmur2`` of ``data`` as a signed 32-bit int."""
    return _kernel.murmur2(data)


def partition_rows(rows: int, keys: BinaryColumn | None, values: BinaryColumn,
                   explicit_partitions: np.ndarray | None, partition_count: int,
                   sticky: StickyPartition, batch_bytes: int
                   ) -> tuple[np.ndarray, StickyPartition]:
    """The Java producer's default partition of each row (``BuiltInPartitioner`` without
    adaptive statistics): an explicit partition (>= 0 in ``explicit_partitions``) as given;
    a keyed row ``(murmur2(key) & 0x7fffffff) % partition_count``; a keyless row the
    sticky partition, which moves to the next partition once its rows' value bytes reach
    ``batch_bytes``. Returns the partitions (int32[rows]) and the sticky state to carry on
    with. An explicit partition >= ``partition_count`` raises ValueError."""
    explicit = (None if explicit_partitions is None
                else np.ascontiguousarray(explicit_partitions, np.int32))
    raw, partition, bytes_in_batch = _kernel.partition_rows(
        rows, None if keys is None else keys._spec(), values._spec(), explicit,
        partition_count, sticky.partition, sticky.bytes_in_batch, batch_bytes)
    return np.frombuffer(raw, np.int32), StickyPartition(partition, bytes_in_batch)


def encode_batches(rows: int, keys: BinaryColumn | None, values: BinaryColumn | None,
                   headers: HeaderColumn | None, extra_header: tuple[bytes, bytes] | None,
                   selection: np.ndarray, timestamp_ms: int, producer: ProducerFields,
                   codec: int, max_batch_bytes: int) -> EncodedBatches:
    """Kafka v2 record batches (magic 2, CreateTime ``timestamp_ms`` for every record, base
    offset 0, partition leader epoch -1) of the rows ``selection`` (int32 row indices, in
    order) of a ``rows``-row table: key, value (None: a null column), the row's headers
    followed by ``extra_header`` if given. A new batch starts when the next record would
    take the batch past ``max_batch_bytes`` (a batch holds at least one record);
    successive batches continue the producer's sequence. With a codec other than NONE the
    records section of each batch is compressed here (the limit applies before
    compression) and the batch's length and CRC-32C sealed."""
    selected = np.ascontiguousarray(selection, np.int32)
    data, bounds = _kernel.encode_batches(
        rows, None if keys is None else keys._spec(),
        None if values is None else values._spec(),
        None if headers is None else headers._spec(), extra_header, selected, timestamp_ms,
        (producer.producer_id, producer.producer_epoch, producer.base_sequence), codec,
        max_batch_bytes)
    encoded = EncodedBatches(data, np.frombuffer(bounds, np.int64).reshape(-1, 3))
    if codec == NONE:
        return encoded
    return _compress_batches(encoded, codec)


def _compress_batches(encoded: EncodedBatches, codec: int) -> EncodedBatches:
    sealed = [_seal_compressed(batch, codec) for batch, _ in encoded.batches()]
    ends = np.cumsum([len(batch) for batch in sealed], dtype=np.int64)
    bounds = np.stack([ends - [len(batch) for batch in sealed], ends,
                       encoded.bounds[:, 2]], axis=1) if sealed else encoded.bounds
    return EncodedBatches(b"".join(sealed), np.ascontiguousarray(bounds, np.int64))
