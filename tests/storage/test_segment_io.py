"""Tests for headrace.storage.segment_io's loops over buffers: the log cleaner's two passes
(``map_batches`` / ``filter_batches``) and segment recovery's scan (``index_batches``),
against pure-Python references written here from Kafka's rules (the cleaner's
``buildRetainedRecordsInto``, KIP-534 delete horizons; the index every
``index.interval.bytes``), over hypothesis-generated logs of every codec; damage must raise
CorruptMessage, never crash. The batches and references of records come from
tests/protocol/test_kernel.py.
"""

from __future__ import annotations

import struct

import crc32c
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import CorruptMessage
from headrace.protocol import compression, kernel
from headrace.protocol.control_records import build_end_txn_marker_batch
from headrace.protocol.records import build_batch
from headrace.storage import segment_io
from tests.protocol.test_kernel import (
    CLEANER_PROPERTY,
    CODECS,
    CONTROL_BIT,
    Batch,
    Rec,
    encode_batch,
    encode_record,
    header_lists,
    logs,
    reference_records,
    simple_batch,
)

# ---------------------------------------------------------------- the cleaner's passes

DELETE_HORIZON_BIT = 0x40
TRANSACTIONAL_BIT = 0x10
PRODUCERS = (7, 8)
FULL_RANGE = (0, 1 << 32)
cleaner_keys = st.sampled_from([None, b"", b"a", b"b", b"c", b"d" * 20])
cleaner_values = st.one_of(st.none(), st.binary(max_size=12))


@st.composite
def cleaner_logs(draw) -> bytes:
    """Batches over a handful of keys (duplicates, tombstones, null keys), some with a
    delete horizon already stamped, some control batches, every codec."""
    out, offset = [], draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 6))):
        count = draw(st.integers(0, 6))
        records = [Rec(i, draw(st.integers(-500, 500)), draw(cleaner_keys), draw(cleaner_values),
                       draw(header_lists)) for i in range(count)]
        horizon = draw(st.booleans()) and draw(st.booleans())
        out.append(Batch(offset, records, codec=draw(st.sampled_from(CODECS)),
                         control=draw(st.integers(0, 9)) == 0,
                         log_append_time=draw(st.booleans()),
                         base_timestamp=draw(st.integers(1000, 3000)),
                         max_timestamp=draw(st.integers(1000, 3000)),
                         attributes_extra=DELETE_HORIZON_BIT if horizon else 0))
        offset += max(count, 1) + draw(st.integers(0, 3))
    return b"".join(map(encode_batch, out))


def raw_batches(buf: bytes):
    """(header fields, raw bytes, [(offset, raw timestamp, key, value, headers)])."""
    pos = 0
    while pos < len(buf):
        base_offset, length = struct.unpack_from(">qi", buf, pos)
        fields = struct.unpack_from(">hiqqqhii", buf, pos + 21)
        attrs, _, base_ts, _, _, _, _, count = fields
        raw, records = buf[pos : pos + 12 + length], buf[pos + 61 : pos + 12 + length]
        pos += 12 + length
        if attrs & CONTROL_BIT:
            yield (base_offset, fields), raw, []
            continue
        if attrs & 7:
            records = compression.decompress(attrs & 7, records)
        parsed = [(d.offset, d.timestamp_ms, d.key, d.value, d.headers)  # stored timestamps
                  for d in reference_records(records, count, base_offset, attrs & ~8, base_ts, 0)]
        yield (base_offset, fields), raw, parsed


def reference_clean(buf, scope, now_ms, horizon_ms, protected=()):
    """The cleaner's two passes, the slow obvious way: (latest ordinal per key, batches out
    as (header fields, records section uncompressed))."""
    def in_scope(offset, key):
        value = kernel.murmur3_x64_128(key)[1] >> 32
        return scope.range_low <= value < scope.range_high, \
            scope.first_offset <= offset < scope.end_offset

    aborted = np.frombuffer(scope.aborted_txns, np.int64).reshape(-1, 3).tolist()

    def is_aborted(base_offset, fields):
        attrs, pid = fields[0], fields[4]
        return bool(attrs & TRANSACTIONAL_BIT) and not attrs & CONTROL_BIT and any(
            p == pid and first <= base_offset <= last for p, first, last in aborted)

    latest, ordinal = {}, 0
    for (base_offset, fields), _, records in raw_batches(buf):
        if fields[0] & CONTROL_BIT or is_aborted(base_offset, fields):
            continue
        for offset, _, key, _, _ in records:
            if key is not None and all(in_scope(offset, key)):
                latest[key], ordinal = ordinal, ordinal + 1
    out, ordinal = [], 0
    for (base_offset, fields), raw, records in raw_batches(buf):
        attrs, last_delta, base_ts, max_ts, pid, epoch, seq, _ = fields
        if attrs & CONTROL_BIT:
            out.append(((base_offset, fields), raw[61:]))
            continue
        kept = []
        for offset, ts, key, value, headers in records:
            if key is None or (offset < scope.end_offset and is_aborted(base_offset, fields)):
                continue
            in_range, dirty = in_scope(offset, key)
            mine = ordinal if dirty and in_range else None
            ordinal += mine is not None
            expired = value is None and attrs & DELETE_HORIZON_BIT and base_ts <= now_ms
            if not in_range or offset >= scope.end_offset or (
                    not expired and (key not in latest or latest[key] == mine)):
                kept.append((offset, ts, key, value, headers))
        tombstones = any(value is None for _, _, _, value, _ in kept)
        if records and len(kept) == len(records) and (
                not tombstones or attrs & DELETE_HORIZON_BIT):
            out.append(((base_offset, fields), None))
        elif kept:
            new_attrs, new_base = attrs, kept[0][1]
            if attrs & DELETE_HORIZON_BIT:
                new_base = base_ts
            elif tombstones:
                new_attrs, new_base = attrs | DELETE_HORIZON_BIT, horizon_ms
            new_max = max_ts if attrs & 8 else max(ts for _, ts, _, _, _ in kept)
            section = b"".join(encode_record(Rec(o - base_offset, ts - new_base, k, v, h))
                               for o, ts, k, v, h in kept)
            out.append(((base_offset, (new_attrs, last_delta, new_base, new_max, pid, epoch, seq,
                                       len(kept))), section))
        elif base_offset + last_delta in protected:
            out.append(((base_offset, (attrs & ~7, last_delta, base_ts, max_ts, pid, epoch, seq,
                                       0)), b""))
    return latest, out


def kernel_clean(buf, scope, now_ms, horizon_ms, slots=64,
                 markers=segment_io.MARKERS_COPIED):
    fingerprints, words = np.zeros(slots, np.uint64), np.zeros(slots, np.uint32)
    build = segment_io.map_batches(buf, fingerprints, words, scope, 0, slots)
    filtered = segment_io.filter_batches(buf, fingerprints, words, scope, 0, now_ms, horizon_ms,
                                     np.empty(0, np.int64), markers=markers)
    return build, filtered


def sections_of(buf: bytes):
    """(header fields, uncompressed records section) per batch of a kernel output."""
    out = []
    for (base_offset, fields), raw, _ in raw_batches(buf):
        section = raw[61:]
        if fields[0] & 7 and not fields[0] & CONTROL_BIT:
            section = compression.decompress(fields[0] & 7, section)
        out.append(((base_offset, fields), section))
    return out


@CLEANER_PROPERTY
@given(cleaner_logs(), st.sampled_from([FULL_RANGE, (0, 1 << 31), (1 << 31, 1 << 32)]),
       st.integers(0, 4000), st.data())
def test_cleaner_passes_match_the_reference(buf, hash_range, now_ms, data):
    offsets = [o for _, _, records in raw_batches(buf) for o, *_ in records] or [0]
    first = data.draw(st.integers(min(offsets), max(offsets) + 1))
    end = data.draw(st.integers(first, max(offsets) + 2))
    _assert_kernel_matches_reference(buf, segment_io.PassScope(first, end, *hash_range), now_ms)


@st.composite
def transactional_cleaner_logs(draw) -> bytes:
    """``cleaner_logs`` whose data batches are, some of them, transactional batches of one
    of ``PRODUCERS``."""
    out = bytearray()
    for (_, fields), raw, _ in raw_batches(draw(cleaner_logs())):
        if not fields[0] & CONTROL_BIT and draw(st.booleans()):
            raw = bytearray(raw)
            struct.pack_into(">h", raw, 21, fields[0] | TRANSACTIONAL_BIT)
            raw = with_producer_id(bytes(raw), draw(st.sampled_from(PRODUCERS)))
        out += raw
    return bytes(out)


@CLEANER_PROPERTY
@given(transactional_cleaner_logs(), st.integers(0, 4000), st.data())
def test_cleaner_passes_remove_aborted_data_as_the_reference(buf, now_ms, data):
    """Kafka's cleaner: data of aborted transactions below the cleanable end is neither
    mapped nor numbered, and removed (a producer's last batch would stay, empty)."""
    offsets = [o for _, _, records in raw_batches(buf) for o, *_ in records] or [0]
    first = data.draw(st.integers(min(offsets), max(offsets) + 1))
    end = data.draw(st.integers(first, max(offsets) + 2))
    around = st.integers(min(offsets) - 1, max(offsets) + 1)
    aborted = data.draw(st.lists(st.tuples(st.sampled_from(PRODUCERS), around, around),
                                 max_size=3))
    scope = segment_io.PassScope(first, end, *FULL_RANGE, segment_io.aborted_txn_triples(aborted))
    _assert_kernel_matches_reference(buf, scope, now_ms)


def _assert_kernel_matches_reference(buf, scope, now_ms):
    latest, expected = reference_clean(buf, scope, now_ms, now_ms + 777)
    build, filtered = kernel_clean(buf, scope, now_ms, now_ms + 777)
    assert not build.full and build.new_keys == len(latest)
    assert build.next_ordinal == filtered.next_ordinal
    got = sections_of(bytes(filtered.data))
    original = {h[0]: section for h, section in sections_of(buf)}
    assert len(got) == len(expected)
    for (header, section), (want_header, want_section) in zip(got, expected, strict=True):
        assert header == want_header
        assert section == (original[header[0]] if want_section is None else want_section)
    kernel.decode_columns(bytes(filtered.data))  # every CRC-32C holds


def with_producer_id(batch: bytes, producer_id: int) -> bytes:
    patched = bytearray(batch)
    struct.pack_into(">q", patched, 43, producer_id)
    struct.pack_into(">I", patched, 17, crc32c.crc32c(bytes(patched[21:])))
    return bytes(patched)


def test_emptied_producer_batch_stays_only_if_it_is_the_producers_last():
    older = with_producer_id(encode_batch(Batch(10, [Rec(0, 0, b"k", b"1")])), 7)
    newer = encode_batch(Batch(11, [Rec(0, 0, b"k", b"2")]))
    buf = older + newer
    scope = segment_io.PassScope(0, 100, *FULL_RANGE)
    fingerprints, words = np.zeros(16, np.uint64), np.zeros(16, np.uint32)
    segment_io.map_batches(buf, fingerprints, words, scope, 0, 16)
    for protected, batches_out in (([], [11]), ([10], [10, 11])):
        filtered = segment_io.filter_batches(buf, fingerprints, words, scope, 0, 0, 0,
                                         np.asarray(protected, np.int64))
        headers = [h for h, _, _ in raw_batches(bytes(filtered.data))]
        assert [base for base, _ in headers] == batches_out
        assert [fields[-1] for _, fields in headers] == [0, 1][-len(batches_out):]
    # once no longer the producer's last, the emptied batch goes (Kafka's DELETE_EMPTY)
    emptied = bytes(segment_io.filter_batches(buf, fingerprints, words, scope, 0, 0, 0,
                                              np.asarray([10], np.int64)).data)
    fingerprints, words = np.zeros(16, np.uint64), np.zeros(16, np.uint32)
    segment_io.map_batches(emptied, fingerprints, words, scope, 0, 16)
    for protected, batches_out in (([], [11]), ([10], [10, 11])):
        again = segment_io.filter_batches(emptied, fingerprints, words, scope, 0, 0, 0,
                                          np.asarray(protected, np.int64))
        assert [base for (base, _), _, _ in raw_batches(bytes(again.data))] == batches_out


MARKER_EPOCH = 3


def _txn_log() -> list[bytes]:
    """Producer 7's transactional batch (0) and commit marker (1), producer 8's commit marker
    with no data (2), a plain batch (3)."""
    data = build_batch([(b"k", b"v", (), 5)], base_offset=0, producer_id=7,
                       producer_epoch=MARKER_EPOCH, base_sequence=0, transactional=True)
    return [data, build_end_txn_marker_batch(7, MARKER_EPOCH, True, 0, 5, base_offset=1),
            build_end_txn_marker_batch(8, MARKER_EPOCH, True, 0, 5, base_offset=2),
            build_batch([(b"other", b"v", (), 5)], base_offset=3)]


def _filter_markers(pieces: list[bytes], now_ms: int, markers) -> dict[int, tuple]:
    """base offset -> (header fields, bytes) of the batches ``filter_batches`` keeps of
    ``pieces``, one call per piece with the same ``markers``; every output CRC-32C checked."""
    scope = segment_io.PassScope(0, 4, *FULL_RANGE)
    fingerprints, words = np.zeros(16, np.uint64), np.zeros(16, np.uint32)
    kept = {}
    for piece in pieces:
        segment_io.map_batches(piece, fingerprints, words, scope, 0, 16)
        out = bytes(segment_io.filter_batches(piece, fingerprints, words, scope, 0, now_ms,
                                              now_ms + 1000, np.empty(0, np.int64),
                                              markers=markers).data)
        for (base, fields), raw, _ in raw_batches(out):
            assert struct.unpack_from(">I", raw, 17)[0] == crc32c.crc32c(raw[21:])
            kept[base] = fields, raw
    return kept


def test_markers_without_data_get_a_horizon_and_go_once_it_passes():
    pieces = _txn_log()
    original = {base: fields for (base, fields), _, _ in raw_batches(b"".join(pieces))}
    first = _filter_markers(pieces, 100, segment_io.txn_marker_state(2, []))
    assert first[1][0] == original[1]  # its data is there: copied
    attributes, _, base_timestamp, max_timestamp, *_ = first[2][0]
    assert (attributes & DELETE_HORIZON_BIT, base_timestamp, max_timestamp) == (
        DELETE_HORIZON_BIT, 1100, 5)
    records = reference_records(first[2][1][61:], 1, 2, attributes & ~8, base_timestamp, 0)
    assert [record.timestamp_ms for record in records] == [5]  # the record's time is kept
    stamped_log = [pieces[0], pieces[1], first[2][1], pieces[3]]
    assert first[2] == _filter_markers(stamped_log, 1099, segment_io.txn_marker_state(2, []))[2]
    later = _filter_markers(stamped_log, 1100, segment_io.txn_marker_state(2, []))
    assert sorted(later) == [0, 1, 3]
    protected = segment_io.txn_marker_state(2, [(8, MARKER_EPOCH)])
    assert _filter_markers(pieces, 100, protected)[2][0] == original[2]
    copied = _filter_markers(pieces, 100, segment_io.MARKERS_COPIED)
    assert {base: fields for base, (fields, _) in copied.items()} == original


def test_the_marker_state_carries_from_call_to_call():
    pieces = _txn_log()
    shared = segment_io.txn_marker_state(2, [])
    assert not _filter_markers(pieces, 100, shared)[1][0][0] & DELETE_HORIZON_BIT
    fresh = segment_io.txn_marker_state(2, [])
    assert _filter_markers(pieces[1:2], 100, fresh)[1][0][0] & DELETE_HORIZON_BIT


def test_map_batches_reports_full_when_the_room_runs_out():
    buf = encode_batch(Batch(0, [Rec(i, 0, b"key-%d" % i, b"v") for i in range(8)]))
    fingerprints, words = np.zeros(64, np.uint64), np.zeros(64, np.uint32)
    build = segment_io.map_batches(buf, fingerprints, words, segment_io.PassScope(0, 8, *FULL_RANGE),
                               0, 5)
    assert build.full and build.new_keys == 5 and build.records_read == 6


def _field_at(buf: bytes, position: int) -> str:
    """Which part of its batch byte ``position`` of ``buf`` is: the leader epoch (not covered
    by the CRC), "offset-or-length" (framing: a flip may move batch bounds or offsets), or
    "checked" (magic, CRC, and everything the CRC covers)."""
    pos = 0
    while True:
        (length,) = struct.unpack_from(">i", buf, pos + 8)
        if position < pos + 12 + length:
            inside = position - pos
            return ("offset-or-length" if inside < 12 else "epoch" if inside < 16 else "checked")
        pos += 12 + length


@CLEANER_PROPERTY
@given(transactional_cleaner_logs(), st.booleans(), st.data())
def test_cleaner_passes_reject_damage_without_crashing(buf, judge_markers, data):
    """A flip the CRC or the magic byte covers is CorruptMessage; one in the leader epoch
    (outside the CRC) cleans and writes whole batches; one in the framing either. Control
    batches (random records, as damaged markers would have) are judged as markers or not."""
    position = data.draw(st.integers(0, len(buf) - 1))
    damaged = bytearray(buf)
    damaged[position] ^= 1 << data.draw(st.integers(0, 7))
    scope = segment_io.PassScope(0, 2**41, *FULL_RANGE)
    markers = segment_io.txn_marker_state(len(PRODUCERS), []) if judge_markers \
        else segment_io.MARKERS_COPIED
    field = _field_at(buf, position)
    if field == "checked":
        with pytest.raises(CorruptMessage):
            kernel_clean(bytes(damaged), scope, 2000, 2500, markers=markers)
        return
    try:
        _, filtered = kernel_clean(bytes(damaged), scope, 2000, 2500, markers=markers)
    except CorruptMessage:
        assert field == "offset-or-length", f"a leader-epoch flip at {position} was rejected"
        return
    kernel.decode_columns(bytes(filtered.data))  # what it writes is whole and CRC-valid


# ---------------------------------------------------------------- segment recovery scan


def reference_index_batches(buf: bytes, file_size: int, min_base_offset: int, interval: int,
                            state: segment_io.IndexState):
    """Segment recovery's rules batch by batch in Python (what LogSegment did before)."""
    since, max_ts, offset_of_max = (state.bytes_since_last_entry, state.max_timestamp_ms,
                                    state.offset_of_max_timestamp)
    last_time, has_time = state.last_time_entry_ms, state.has_time_entry
    pos, next_offset, stopped, first = 0, -1, False, None
    entries, times, positions = [], [], []
    while len(buf) - pos >= 61:
        base, length, _, magic, crc = struct.unpack_from(">qiibI", buf, pos)
        size = length + 12
        if magic != 2 or length < 49 or base < max(min_base_offset, next_offset) \
                or pos + size > file_size:
            stopped = True
            break
        if pos + size > len(buf):
            break
        if crc32c.crc32c(buf[pos + 21 : pos + size]) != crc:
            stopped = True
            break
        last = base + struct.unpack_from(">i", buf, pos + 23)[0]
        batch_max_ts = struct.unpack_from(">q", buf, pos + 35)[0]
        first = batch_max_ts if first is None else first
        if batch_max_ts > max_ts:
            max_ts, offset_of_max = batch_max_ts, last
        if since > interval:
            entries.append((last, pos))
            if not has_time or max_ts > last_time:
                times.append((max_ts, offset_of_max))
                last_time, has_time = max_ts, True
            since = 0
        since += size
        positions.append(pos)
        next_offset = last + 1
        pos += size
    return (pos, next_offset, stopped, first, (since, max_ts, offset_of_max, last_time, has_time),
            entries, times, positions)


@CLEANER_PROPERTY
@given(logs(), st.integers(0, 300), st.integers(-1, 2**41), st.booleans(), st.data())
def test_index_batches_matches_reference(log, interval, max_ts, has_time, data):
    buf, _ = log
    if buf and data.draw(st.booleans()):  # damage one byte
        at = data.draw(st.integers(0, len(buf) - 1))
        buf = buf[:at] + bytes([buf[at] ^ data.draw(st.integers(1, 255))]) + buf[at + 1:]
    cut = data.draw(st.integers(0, len(buf)))  # the chunk may end before the file does
    file_size = data.draw(st.sampled_from([len(buf), cut]))
    state = segment_io.IndexState(data.draw(st.integers(0, 400)), max_ts, 7, max_ts - 1, has_time)
    min_base = data.draw(st.integers(0, 2**40))
    got = segment_io.index_batches(buf[:cut], 0, file_size, min_base, -1, interval, state)
    want = reference_index_batches(buf[:cut], file_size, min_base, interval, state)
    assert (got.bytes_valid, got.next_offset, got.stopped, got.first_max_timestamp_ms) == \
        want[:4]
    assert (got.state.bytes_since_last_entry, got.state.max_timestamp_ms,
            got.state.offset_of_max_timestamp, got.state.last_time_entry_ms,
            got.state.has_time_entry) == want[4]
    assert got.offset_entries.tolist() == [list(e) for e in want[5]]
    assert got.time_entries.tolist() == [list(e) for e in want[6]]
    assert got.batch_positions.tolist() == want[7]


def test_index_batches_positions_are_file_positions():
    one = simple_batch()
    buf = one + one  # the second batch repeats the first one's offsets
    scan = segment_io.index_batches(buf, 1000, 1000 + len(buf), 0, -1, 0,
                                segment_io.IndexState(1, -1, 0, 0, False))
    assert scan.bytes_valid == len(one) and scan.stopped  # offsets went backwards
    assert scan.offset_entries.tolist() == [[scan.next_offset - 1, 1000]]
