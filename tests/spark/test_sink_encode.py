"""The sink's encoder: Arrow columns -> v2 batches (encoder.encode_batches) and partitioning.

Batches are checked with the project's own decoder (``decode_columns``) and validator
(``validate_batches``): every row comes back byte-identical, nulls and headers included.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import InvalidRecord
from headrace.protocol.compression import LZ4, NONE
from headrace.protocol.kernel import decode_columns, validate_batches
from headrace.spark.encoder import (
    ProducerFields,
    StickyPartition,
    encode_batches,
    increment_sequence,
    murmur2,
    partition_rows,
)
from headrace.spark.sink_wire import binary_column, header_column

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
PRODUCER = ProducerFields(producer_id=4321, producer_epoch=3, base_sequence=17)
WRITE_TIME_MS = 1_700_000_000_123
BASE_SEQUENCE_AT = 53  # byte position of base_sequence in a v2 batch header
PRODUCER_ID_AT = 43

# Kafka's UtilsTest.testMurmur2 vectors (clients/src/test/.../utils/UtilsTest.java).
KAFKA_MURMUR2_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}

payloads = st.binary(max_size=40)
header_lists = st.lists(st.tuples(st.text(max_size=8), st.none() | payloads), max_size=3)
table_rows = st.lists(st.tuples(st.none() | payloads, st.none() | payloads,
                                st.none() | header_lists), min_size=1, max_size=30)


def _decoded_rows(buffer) -> list[tuple]:
    columns = decode_columns(buffer)
    rows = []
    for i in range(columns.count):
        def binary(offsets, data, valid, index):
            return bytes(data[offsets[index]:offsets[index + 1]]) if valid[index] else None

        first, end = columns.header_list_offsets[i], columns.header_list_offsets[i + 1]
        headers = [(binary(columns.header_key_offsets, columns.header_key_data,
                           np.ones(end, bool), h).decode(),
                    binary(columns.header_value_offsets, columns.header_value_data,
                           columns.header_value_valid, h)) for h in range(first, end)]
        rows.append((binary(columns.key_offsets, columns.key_data, columns.key_valid, i),
                     binary(columns.value_offsets, columns.value_data, columns.value_valid, i),
                     headers, int(columns.offsets[i]), int(columns.timestamps_ms[i])))
    return rows


def _encode(rows, selection, codec, limit_bytes, extra_header=None):
    keys = binary_column(pa.array([row[0] for row in rows], pa.binary()))
    values = binary_column(pa.array([row[1] for row in rows], pa.binary()))
    headers = header_column(pa.array(
        [None if row[2] is None else [{"key": k, "value": v} for k, v in row[2]]
         for row in rows], HEADER_TYPE))
    return encode_batches(len(rows), keys, values, headers, extra_header,
                          np.array(selection, np.int32), WRITE_TIME_MS, PRODUCER, codec,
                          limit_bytes)


@settings(max_examples=60, deadline=None)
@given(rows=table_rows, codec=st.sampled_from([NONE, LZ4]),
       limit_bytes=st.integers(min_value=61, max_value=2000), data=st.data())
def test_rows_round_trip_through_the_decoder(rows, codec, limit_bytes, data):
    selection = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=40))
    extra = data.draw(st.none() | st.just((b"headrace.batch.id", b"42")))
    encoded = _encode(rows, selection, codec, limit_bytes, extra)
    summaries = validate_batches(encoded.data)  # magic, lengths, CRC-32C
    assert [summary[2] & 0x07 for summary in summaries] == [codec] * len(summaries)
    assert sum(records for _, records in encoded.batches()) == len(selection)
    got = []
    for batch, records in encoded.batches():
        decoded = _decoded_rows(batch)
        assert [offset for *_, offset, _ in decoded] == list(range(records))
        got += decoded
    extra_headers = [(extra[0].decode(), extra[1])] if extra else []
    assert [(key, value, headers) for key, value, headers, _, _ in got] == [
        (rows[i][0], rows[i][1], list(rows[i][2] or []) + extra_headers) for i in selection]
    assert {timestamp for *_, timestamp in got} == {WRITE_TIME_MS}


def test_batches_split_at_the_limit_and_continue_the_sequence():
    rows = [(None, b"v" * 100, None)] * 10
    encoded = _encode(rows, range(10), NONE, 61 + 3 * 110)
    batches = encoded.batches()
    assert [records for _, records in batches] == [3, 3, 3, 1]
    assert all(len(batch) <= 61 + 3 * 110 for batch, _ in batches)
    sequences = [struct.unpack_from(">i", batch, BASE_SEQUENCE_AT)[0] for batch, _ in batches]
    assert sequences == [17, 20, 23, 26]
    assert {struct.unpack_from(">q", batch, PRODUCER_ID_AT)[0] for batch, _ in batches} == {4321}


def test_a_record_larger_than_the_limit_gets_a_batch_of_its_own():
    rows = [(b"k", b"small", None), (b"k", b"x" * 500, None), (b"k", b"small", None)]
    encoded = _encode(rows, [0, 1, 2], LZ4, 200)
    assert [records for _, records in encoded.batches()] == [1, 1, 1]
    assert [row[1] for row in _decoded_rows(encoded.data)] == [b"small", b"x" * 500, b"small"]


def test_sequences_wrap_as_kafkas_do():
    assert increment_sequence(2**31 - 2, 1) == 2**31 - 1
    assert increment_sequence(2**31 - 1, 1) == 0
    assert increment_sequence(2**31 - 3, 5) == 2


def test_sliced_and_string_columns_are_viewed_in_place():
    values = pa.array(["zero", None, "twö", "three"], pa.string()).slice(1, 3)
    column = binary_column(values)
    encoded = encode_batches(3, None, column, None, None, np.arange(3, dtype=np.int32),
                             WRITE_TIME_MS, ProducerFields(), NONE, 1 << 20)
    assert [row[1] for row in _decoded_rows(encoded.data)] == [None, "twö".encode(), b"three"]
    assert [row[0] for row in _decoded_rows(encoded.data)] == [None, None, None]


def test_null_header_keys_are_refused():
    headers = pa.array([[{"key": None, "value": b"v"}]], HEADER_TYPE)
    with pytest.raises(InvalidRecord, match="header key"):
        header_column(headers)


@pytest.mark.parametrize(("text", "expected"), sorted(KAFKA_MURMUR2_VECTORS.items()))
def test_murmur2_matches_kafka(text, expected):
    assert murmur2(text.encode()) == expected


def test_keyed_rows_go_where_the_java_producer_puts_them():
    keys = [b"21", b"foobar", b"abc", b""]
    key_column = binary_column(pa.array(keys, pa.binary()))
    value_column = binary_column(pa.array([b"v"] * 4, pa.binary()))
    partitions, _ = partition_rows(4, key_column, value_column, None, 7, StickyPartition(0), 100)
    assert partitions.tolist() == [(murmur2(key) & 0x7FFFFFFF) % 7 for key in keys]
    assert partitions.tolist()[:3] == [(-973932308 & 0x7FFFFFFF) % 7,
                                       (-790332482 & 0x7FFFFFFF) % 7, 479470107 % 7]


def test_explicit_partitions_win_and_keyless_rows_stick_until_a_batch_is_full():
    keys = binary_column(pa.array([None, None, b"k", None, None, None], pa.binary()))
    values = binary_column(pa.array([b"x" * 9] * 6, pa.binary()))  # 10 bytes each counted
    explicit = np.array([-1, 2, -1, -1, -1, -1], np.int32)
    partitions, sticky = partition_rows(6, keys, values, explicit, 3, StickyPartition(1), 20)
    keyed = (murmur2(b"k") & 0x7FFFFFFF) % 3
    assert partitions.tolist() == [1, 2, keyed, 1, 2, 2]
    assert sticky == StickyPartition(0, 0)
    with pytest.raises(ValueError, match="partition 5"):
        partition_rows(6, keys, values, np.full(6, 5, np.int32), 3, StickyPartition(0), 20)
