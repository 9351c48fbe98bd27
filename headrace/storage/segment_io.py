"""The storage layer's compiled loops' Python face (``_segment_io.c``): segment files and
the bytes of whole batches in them.

Owns the append path's one-call plain append (``append_plain_batch``: validate a plain
produce batch exactly as ``protocol.kernel.validate_batches`` would and write it to the
segment descriptor with its base offset replaced, never changing the caller's buffer;
``write_batch``), recovery's CRC scan and index rebuild (``index_batches``), the log cleaner's
two passes (``map_batches`` fills the offset map, ``filter_batches`` writes the kept records;
``map_span`` / ``filter_span`` run them over a span of a segment file -- reads and writes
included -- in one call, on a niced helper thread when asked), the offset map's insert and
lookup loops (``offset_map_put`` / ``offset_map_get``) and the page-cache-aware reads the
cleaner, the scrub and cold fetches use (``page_cache_holds``, ``read_chunk``, ``O_DIRECT``
for chunks the page cache lacks). The C reuses the protocol layer's record code
(``protocol/record_batches.h``); decompressing a compressed batch's records stays in Python
(``protocol.kernel.scan_batches``), recompressing them too (``protocol.kernel.seal_compressed``).

The environment variable ``HEADRACE_PAGE_CACHE_PROBE=mincore``, read at import, makes the
spans ask the page cache with mincore(2) as on kernels before 6.5.

Thread-safety: pure functions over the caller's buffers and descriptors; the C releases the
GIL for every loop, read and write. A niced span pauses while the broker serves requests
(``broker.scheduling.note_broker_request`` stores the word it reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headrace.protocol.kernel import (
    BufferLike,
    WritableBuffer,
    byte_view,
    scan_batches,
    seal_compressed,
)
from headrace.storage import _segment_io

# The CRC-32C variant this extension chose at import, as ``protocol.kernel.CRC32C_VARIANT``
# (the same CPU features and HEADRACE_KERNEL_CRC32C cap, read again here).
CRC32C_VARIANT: str = _segment_io.CRC32C_VARIANT

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
append_plain_batch = _segment_io.append_plain_batch

# write_batch(buf, fd, base_offset): write the one batch in ``buf`` (that
# ``append_plain_batch`` validated) to ``fd`` with ``base_offset`` as its base offset, as
# ``append_plain_batch`` writes; ``buf`` is only read.
write_batch = _segment_io.write_batch


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
     (offsets, times, positions)) = _segment_io.index_batches(
        buf, buffer_position, file_size, min_base_offset, next_offset, index_interval_bytes,
        (state.bytes_since_last_entry, state.max_timestamp_ms, state.offset_of_max_timestamp,
         state.last_time_entry_ms, state.has_time_entry))
    return IndexedBatches(
        bytes_valid, next_offset, bool(stopped), first_max_timestamp if has_first else None,
        IndexState(*raw_state[:4], bool(raw_state[4])),
        np.frombuffer(offsets, np.int64).reshape(-1, 2),
        np.frombuffer(times, np.int64).reshape(-1, 2), np.frombuffer(positions, np.int64))


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
    # The aborted transactions whose data batches below ``end_offset`` the passes remove
    # (neither mapped nor numbered): native int64 (producer_id, first_offset, last_offset)
    # triples sorted by producer id, then first offset (``aborted_txn_triples``).
    aborted_txns: bytes = b""


def aborted_txn_triples(aborted: list[tuple[int, int, int]]) -> bytes:
    """``PassScope.aborted_txns`` for (producer_id, first_offset, last_offset) triples."""
    return np.array(sorted(aborted), np.int64).reshape(-1, 3).tobytes()


@dataclass(frozen=True, slots=True)
class TxnMarkerState:
    """What pass 2 carries from call to call of one rewrite to judge transaction markers
    (Kafka's ``CleanedTransactionMetadata``; see ``filter_batches``): ``slots``, an int64
    table of ``(producer id + 1, bits)`` pairs, a power of two of them, zeroed at the start
    of the rewrite and updated in place by each call; ``protected_markers``, sorted
    ``(producer id, epoch)`` pairs of the producers whose last record is a marker at that
    epoch (kept for fencing). Not thread-safe: one rewrite's calls, one after another."""

    slots: np.ndarray
    protected_markers: np.ndarray


MARKERS_COPIED = TxnMarkerState(np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64))
MIN_MARKER_SLOTS = 64


def txn_marker_state(producer_count: int, protected_markers: list[tuple[int, int]]
                     ) -> TxnMarkerState:
    """A fresh state with room for ``producer_count`` producer ids at half load (a
    producer beyond the room keeps its markers)."""
    slots = max(MIN_MARKER_SLOTS, 1 << (2 * producer_count).bit_length())
    return TxnMarkerState(np.zeros((slots, 2), np.int64),
                          np.array(sorted(protected_markers), np.int64).reshape(-1, 2))


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
    with byte_view(buf) as view:
        scan = scan_batches(view, True, verify_crc, decompress_sections=True)
        records_read, next_ordinal, new_keys, full = _segment_io.map_batches(
            view, scan.sections, fingerprints, words, room_keys, scope.first_offset,
            scope.end_offset, scope.range_low, scope.range_high, first_ordinal,
            scope.aborted_txns)
    return MapBuild(records_read, next_ordinal, new_keys, bool(full))


def filter_batches(
    buf: BufferLike, fingerprints: np.ndarray, words: np.ndarray, scope: PassScope,
    first_ordinal: int, now_ms: int, new_delete_horizon_ms: int,
    protected_last_offsets: np.ndarray, *, verify_crc: bool = True,
    markers: TxnMarkerState = MARKERS_COPIED
) -> FilteredBatches:
    """The cleaner's pass 2 over the whole batches of ``buf`` (numbering ``scope``'s records
    from ``first_ordinal`` as ``map_batches`` did). A record is kept iff it has a key and is
    outside the hash range, or its key is not in the map, or it is in the dirty section with
    the mapped ordinal -- except a tombstone whose batch's delete horizon is <= ``now_ms``.

    Data of ``scope.aborted_txns`` below ``end_offset`` is removed (Kafka's cleaner drops
    aborted transactions' records). Control batches (transaction markers) are copied, unless
    ``markers`` has slots: then a marker none of whose transaction's data batches the
    rewrite met (since its producer's previous marker, in this call or an earlier one given
    the same ``markers``) is stamped with the delete horizon (``new_delete_horizon_ms``)
    when it has none and removed once its horizon is <= ``now_ms`` -- except a producer's
    last record at its epoch (``markers.protected_markers``) and the last batch below
    ``end_offset``. Per batch: batches keeping every record (and needing no new delete
    horizon) are copied byte for byte; a batch keeping none disappears, unless its last
    offset is in the sorted ``protected_last_offsets`` (a producer's last batch), which stays
    as an empty batch; any other batch is rebuilt with the same base offset, last offset
    delta, producer fields and codec (Kafka's ``buildRetainedRecordsInto``): kept records
    are copied with their timestamp delta rebased on the new base timestamp -- the delete
    horizon (KIP-534, ``new_delete_horizon_ms`` when the batch keeps tombstones and has none
    yet) or else the first kept record's timestamp."""
    protected = np.ascontiguousarray(protected_last_offsets, np.int64)
    with byte_view(buf) as view:
        scan = scan_batches(view, True, verify_crc, decompress_sections=True)
        (out, pending, pending_batches), read, kept, next_ordinal = _segment_io.filter_batches(
            view, scan.sections, fingerprints, words, scope.first_offset, scope.end_offset,
            scope.range_low, scope.range_high, first_ordinal, now_ms, new_delete_horizon_ms,
            protected, scope.aborted_txns, markers.slots, markers.protected_markers)
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
    return _segment_io.page_cache_holds(fd, position, length)


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
    return _segment_io.page_cache_probe()


def use_cachestat(flag: bool) -> bool:
    """Whether the spans ask which chunks are in the page cache with cachestat(2) (Linux
    6.5+) rather than mincore(2) over a mapping of the chunk (what kernels without
    cachestat get); returns the previous setting. For tests of the mincore path."""
    return _segment_io.use_cachestat(flag)


def read_chunk(fd: int, direct_fd: int, buffer: WritableBuffer, position: int,
               want: int) -> memoryview:
    """Up to ``want`` bytes of the file ``fd`` at ``position`` (fewer only at its end), read
    into ``buffer`` as ``map_span`` reads a chunk: from ``direct_fd`` (``O_DIRECT``; -1 for
    none) unless they are all in the page cache. With a ``direct_fd``, ``buffer`` is aligned
    and ``want`` at most ``len(buffer) - DIRECT_READ_SLACK_BYTES``. Without the GIL."""
    start, got = _segment_io.read_chunk(fd, direct_fd, buffer, position, want)
    return memoryview(buffer)[start:start + got]


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
    pauses briefly while the broker serves requests (its ``note_broker_request``).

    ``direct_fd`` (the same file opened ``O_DIRECT``, or -1) is read instead of ``fd`` for a
    chunk not wholly in the page cache (``cachestat``), so reading cold segments neither
    fills the page cache nor runs readahead. ``buffer`` must then start on a multiple of
    ``DIRECT_READ_ALIGN_BYTES`` and holds chunks of ``len(buffer) -
    DIRECT_READ_SLACK_BYTES``; ``stop_bytes`` of a ``SPAN_GROW`` is the buffer size the batch
    needs, slack included."""
    return MapSpan(*_segment_io.map_span(
        fd, buffer, position, end_position, span_bytes, fingerprints, words, room_keys,
        scope.first_offset, scope.end_offset, scope.range_low, scope.range_high,
        first_ordinal, niceness, direct_fd, scope.aborted_txns))


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
    direct_fd: int = -1, markers: TxnMarkerState = MARKERS_COPIED
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
    or write raises ``OSError``. ``niceness`` and ``direct_fd`` as for ``map_span``;
    ``markers`` as for ``filter_batches``."""
    protected = np.ascontiguousarray(protected_last_offsets, np.int64)
    state = output.state
    *counts, (next_offset, has_first, first_max_timestamp, raw_state,
              (offsets, times)) = _segment_io.filter_span(
        fd, out_fd, buffer, position, end_position, span_bytes, fingerprints, words,
        scope.first_offset, scope.end_offset, scope.range_low, scope.range_high,
        first_ordinal, now_ms, new_delete_horizon_ms, protected, output.out_position,
        output.next_offset, output.index_interval_bytes,
        (state.bytes_since_last_entry, state.max_timestamp_ms, state.offset_of_max_timestamp,
         state.last_time_entry_ms, state.has_time_entry), stage, stage_fill, niceness,
        direct_fd, scope.aborted_txns, markers.slots, markers.protected_markers)
    indexed = IndexedBatches(
        counts[-2], next_offset, False, first_max_timestamp if has_first else None,
        IndexState(*raw_state[:4], bool(raw_state[4])),
        np.frombuffer(offsets, np.int64).reshape(-1, 2),
        np.frombuffer(times, np.int64).reshape(-1, 2), np.empty(0, np.int64))
    return FilterSpan(*counts, indexed)


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
        pieces += (view[previous:position], seal_compressed(batches[start:end], codec))
        previous = position
    pieces.append(view[previous:])
    return b"".join(pieces)


# offset_map_put(fingerprints, words, h1, h2, offsets, base_offset, room) -> (inserted, new_keys,
# full) and offset_map_get(fingerprints, words, h1, h2, offsets, base_offset, 0) -> int64 bytes:
# the offset map's Robin Hood insert and lookup loops over its two tables
# (``storage.offset_map`` owns the tables and the sums). Bound to the C functions themselves.
offset_map_put = _segment_io.offset_map_put
offset_map_get = _segment_io.offset_map_get
