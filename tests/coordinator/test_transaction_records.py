"""``__transaction_state`` keys and values: Kafka's bytes, round trips, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.coordinator.transaction_records import (
    TransactionLogValue,
    decode_transaction_log_key,
    decode_transaction_log_value,
    encode_transaction_log_key,
    encode_transaction_log_value,
    partition_for_transactional_id,
)
from headrace.errors import CorruptMessage

# TransactionLogValue v0 laid out field by field from Kafka's TransactionLogValue.json: producer 1000,
# epoch 3, timeout 60000, status Ongoing (1), partitions [("t", [0, 2])], timestamps 5 and 4.
KAFKA_VALUE_BYTES = bytes.fromhex(
    "0000" "00000000000003e8" "0003" "0000ea60" "01"
    "00000001" "000174" "00000002" "00000000" "00000002"
    "0000000000000005" "0000000000000004")


def test_value_bytes_are_kafkas():
    value = TransactionLogValue(1000, 3, 60_000, 1, (("t", (0, 2)),), 5, 4)
    assert encode_transaction_log_value(value) == KAFKA_VALUE_BYTES
    assert decode_transaction_log_value(KAFKA_VALUE_BYTES) == value


def test_key_bytes_are_kafkas():
    assert encode_transaction_log_key("tx") == bytes.fromhex("0000" "0002") + b"tx"
    assert decode_transaction_log_key(bytes.fromhex("00000002") + b"tx") == "tx"


def test_partition_is_kafkas_hash():
    # Utils.abs("my-txn".hashCode()) % 50, hashCode() printed by Java 17: -1061187895
    assert partition_for_transactional_id("my-txn") == 1061187895 % 50 == 45


@pytest.mark.parametrize("data", [
    KAFKA_VALUE_BYTES[:-1],                      # truncated
    b"\x00\x01" + KAFKA_VALUE_BYTES[2:],         # v1 (flexible), not offered
    KAFKA_VALUE_BYTES[:16] + b"\x09" + KAFKA_VALUE_BYTES[17:],  # status 9 does not exist
    KAFKA_VALUE_BYTES + b"\x00",                 # trailing bytes
])
def test_bad_values_are_corrupt(data):
    with pytest.raises(CorruptMessage):
        decode_transaction_log_value(data)


def test_unknown_key_version_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_transaction_log_key(b"\x00\x01\x00\x01x")


_partitions = st.dictionaries(
    st.text(min_size=1, max_size=5),
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4).map(tuple), max_size=3,
).map(lambda topics: tuple(topics.items()))


@given(st.integers(-1, 2**63 - 1), st.integers(-1, 2**15 - 1), st.integers(1, 2**31 - 1),
       st.integers(0, 7), _partitions, st.integers(-1, 2**62), st.integers(-1, 2**62))
def test_value_round_trip(producer_id, epoch, timeout_ms, status, partitions, updated, started):
    value = TransactionLogValue(producer_id, epoch, timeout_ms, status, partitions, updated,
                                started)
    assert decode_transaction_log_value(encode_transaction_log_value(value)) == value
