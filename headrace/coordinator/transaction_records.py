"""The ``__transaction_state`` record formats, byte-compatible with Kafka's.

Owns the key and value the transaction coordinator writes to and reads from the transaction
log (Kafka's ``TransactionLogKey.json`` / ``TransactionLogValue.json``), the numeric ids of
the transaction states as stored, and which partition of the log a transactional id lives
in. Every key and value starts with an int16 version; classic (non-flexible) fields::

    TransactionLogKey   v0: transactional_id STRING
    TransactionLogValue v0: producer_id INT64, producer_epoch INT16,
        transaction_timeout_ms INT32, transaction_status INT8,
        transaction_partitions NULLABLE [topic STRING, partition_ids [INT32]],
        transaction_last_update_timestamp_ms INT64, transaction_start_timestamp_ms INT64

Value v1 is the flexible form Kafka writes only for clients of transaction version 2
(KIP-890 part 2), which headrace does not offer; reading it raises CorruptMessage. A record
with a null value (tombstone) removes an expired transactional id. The partition of a
transactional id is ``Utils.abs(transactionalId.hashCode()) %
transaction.state.log.num.partitions``, as for groups.

Pure functions and frozen dataclasses; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.coordinator.records import java_string_hashcode, kafka_utils_abs
from headrace.errors import CorruptMessage
from headrace.protocol.consumer_protocol import FieldReader, FieldWriter

TRANSACTION_STATE_TOPIC_NAME = "__transaction_state"
TRANSACTION_STATE_NUM_PARTITIONS_DEFAULT = 50

TRANSACTION_LOG_KEY_VERSION = 0
TRANSACTION_LOG_VALUE_VERSION = 0

# TransactionState ids as stored in transaction_status (Kafka's TransactionMetadata.scala)
EMPTY_STATUS = 0
ONGOING_STATUS = 1
PREPARE_COMMIT_STATUS = 2
PREPARE_ABORT_STATUS = 3
COMPLETE_COMMIT_STATUS = 4
COMPLETE_ABORT_STATUS = 5
DEAD_STATUS = 6
PREPARE_EPOCH_FENCE_STATUS = 7


def partition_for_transactional_id(
    transactional_id: str, num_partitions: int = TRANSACTION_STATE_NUM_PARTITIONS_DEFAULT
) -> int:
    return kafka_utils_abs(java_string_hashcode(transactional_id)) % num_partitions


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: int
    transaction_partitions: tuple[tuple[str, tuple[int, ...]], ...]  # (topic, partition ids)
    transaction_last_update_timestamp_ms: int
    transaction_start_timestamp_ms: int


def encode_transaction_log_key(transactional_id: str) -> bytes:
    return FieldWriter().int16(TRANSACTION_LOG_KEY_VERSION).string(transactional_id).to_bytes()


def decode_transaction_log_key(data: bytes) -> str:
    """The transactional id of a key; CorruptMessage for an unknown version."""
    reader = FieldReader(data)
    version = reader.int16()
    if version != TRANSACTION_LOG_KEY_VERSION:
        raise CorruptMessage(f"unknown TransactionLogKey version {version}")
    return reader.string()


def encode_transaction_log_value(value: TransactionLogValue) -> bytes:
    writer = FieldWriter().int16(TRANSACTION_LOG_VALUE_VERSION)
    writer.int64(value.producer_id).int16(value.producer_epoch)
    writer.int32(value.transaction_timeout_ms).int8(value.transaction_status)
    writer.int32(len(value.transaction_partitions))
    for topic, partition_ids in value.transaction_partitions:
        writer.string(topic).int32_array(partition_ids)
    writer.int64(value.transaction_last_update_timestamp_ms)
    return writer.int64(value.transaction_start_timestamp_ms).to_bytes()


def decode_transaction_log_value(data: bytes) -> TransactionLogValue:
    reader = FieldReader(data)
    version = reader.int16()
    if version != TRANSACTION_LOG_VALUE_VERSION:
        raise CorruptMessage(f"unsupported TransactionLogValue version {version}")
    producer_id = reader.int64()
    producer_epoch = reader.int16()
    timeout_ms = reader.int32()
    status = reader.int8()
    if not EMPTY_STATUS <= status <= PREPARE_EPOCH_FENCE_STATUS:
        raise CorruptMessage(f"unknown transaction status {status}")
    partitions = tuple(
        (reader.string(), reader.int32_array()) for _ in range(reader.array_length())
    )
    value = TransactionLogValue(
        producer_id, producer_epoch, timeout_ms, status, partitions, reader.int64(),
        reader.int64(),
    )
    if reader.remaining_bytes:
        raise CorruptMessage(f"{reader.remaining_bytes} bytes after a TransactionLogValue")
    return value
