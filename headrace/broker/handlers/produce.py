"""Produce (key 0), versions 0-12: append record batches to partition logs.

acks 0 (no response at all), 1 and -1 (all: on one node the local write; a partition whose
min.insync.replicas exceeds 1 answers NOT_ENOUGH_REPLICAS, as Kafka does with too few
in-sync replicas); any other acks value gets INVALID_REQUIRED_ACKS for every partition. In a
cluster, a partition led here (``cluster.partition_leader``) gets its leader epoch stamped
into the batches; acks=-1 answers NOT_ENOUGH_REPLICAS before the append when its ISR is
below min.insync.replicas, then waits (Kafka's DelayedProduce: a future completed when the
high watermark passes the records, no polling) up to the request's ``timeout``:
REQUEST_TIMED_OUT past it, NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR fell below
min.insync.replicas meanwhile, NOT_LEADER_OR_FOLLOWER when leadership moved (also while the
records were being appended: no longer led here when the wait would begin); the base offset
is answered with those errors, as Kafka's. A partition whose ISR is its leader alone is
flushed after the append (the last replica standing: see ``cluster.partition_leader``).
Versions 0-2 (clients that skip ApiVersions) carry magic 0/1 message sets: each is
up-converted to one v2 batch (``message_format.upconvert``, Kafka's LogValidator: a bad
CRC-32 is CORRUPT_MESSAGE) -- a v2 batch is accepted there too, as Kafka accepts it. From v3
on, Kafka allows only magic 2: a legacy set is INVALID_RECORD. Records reach the log as
read-only views of the request frame (``wire.decode_request``), never copied on the way.
Validation -- sizes, CRCs, Kafka's record checks (``storage.validation``: a record without a
key on a compacted topic, timestamps, structure), producer sequences -- is the log's
(``Log.append`` with ``from_client``); its errors become per-partition error codes, with
KIP-467 ``record_errors`` (index in the batch, message) and ``error_message`` in v8+, and an
I/O error from the log (``OSError``: disk full, EIO...) or an offline partition (its log failed
to load) answers KAFKA_STORAGE_ERROR for that partition only -- NOT_LEADER_OR_FOLLOWER to v3
requests, as Kafka down-converts it for producers that may not know the code. A request carrying
a transactional batch but no transactional id is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED
for every partition, as Kafka's. With one, KIP-890 part 1 (while
``transaction.partition.verification.enable``): each partition with a transactional batch is
appended only if the transaction coordinator's ``verify`` finds it in the producer's ongoing
transaction; the others answer the coordinator's error as Kafka translates it
(``produce_verification_error_code``: INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH...).
Unknown topics are not created here (Kafka creates them on Metadata): UNKNOWN_TOPIC_OR_PARTITION.

Every partition of a request is appended in one job on the broker's single append thread, so
fsync (flush.messages, rolls) never blocks the event loop -- except a request that certainly
fsyncs nothing (``_appends_cannot_sync``: at most ``INLINE_APPEND_MAX_BYTES``, no
flush.messages or segment roll reachable, no compacted partition) arriving while the append
thread is idle: it is appended inline on the event loop, which saves the two thread wake-ups
of a hand-off (bench/broker_request_cost.py: about a third of the broker CPU of a small
produce; a quarter of that of a 400 KB lz4 request, whose write into the page cache holds the
loop for some 100-200 us). Serialization is unchanged: the loop thread is the only one that
hands jobs to the append thread, so an inline append never overlaps one. Event loop thread
otherwise.

The response body is encoded by hand (``encode_produce_body``, versions 0-12; a test checks
v3-12 byte for byte against kio's encoder, which lacks v0-2: the old-protocol broker tests
check those), which costs a fraction of building kio entities::

    responses [ name string
                partition_responses [ index int32, error_code int16, base_offset int64,
                                      log_append_time_ms int64 (v2+),
                                      log_start_offset int64 (v5+),
                                      record_errors [ batch_index int32,
                                                      batch_index_error_message nullable string
                                                    ] (v8+),
                                      error_message nullable string (v8+)
                                    ] ]
    throttle_time_ms int32 (v1+)

v9+ are flexible: compact arrays and strings (unsigned varint length + 1) and an empty
tagged-field section after every struct (``current_leader`` is left at its default, so omitted).
"""

from __future__ import annotations

import asyncio
import logging
import struct

from headrace.broker.context import RawResponse
from headrace.broker.rate_limited_log import RateLimitedLog
from headrace.coordinator.transaction import produce_verification_error_code
from headrace.errors import (
    CorruptMessage,
    FencedLeaderEpoch,
    InvalidRecord,
    InvalidRequiredAcks,
    KafkaError,
    KafkaStorageError,
    NotEnoughReplicas,
    NotLeaderOrFollower,
    RequestTimedOut,
    TransactionalIdAuthorizationFailed,
    UnknownServerError,
    error_for_code,
)
from headrace.protocol import message_format
from headrace.protocol import records as record_codec
from headrace.protocol.batch import BATCH_HEADER_BYTES, TRANSACTIONAL_BIT, parse_header
from headrace.protocol.varint import encode_unsigned

API_KEY = 0
MIN_VERSION = 0
MAX_VERSION = 12
FIRST_STORAGE_ERROR_VERSION = 4  # v3 gets NOT_LEADER_OR_FOLLOWER instead, as Kafka answers

FIRST_MAGIC_V2_ONLY_VERSION = 3  # Kafka's ProduceRequest.validateRecords

VALID_ACKS = (0, 1, -1)
INLINE_APPEND_MAX_BYTES = 1024 * 1024  # librdkafka's default message.max.bytes
FIRST_FLEXIBLE_VERSION = 9
_PARTITION_HEAD = struct.Struct(">ihq")  # index, error, base offset
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
log = logging.getLogger(__name__)
STORAGE_ERROR_LOG_INTERVAL_MS = 5000
# A failed disk fails every append: one line per interval, counting the rest (append thread).
_storage_errors = RateLimitedLog(log, STORAGE_ERROR_LOG_INTERVAL_MS)


def _partition_error(index: int, error: KafkaError) -> dict:
    return {"index": index, "error_code": error.code, "base_offset": -1,
            "log_append_time": -1, "log_start_offset": -1, "error_message": error.message,
            "record_errors": error.record_errors}


def _transactional_batch_position(records: memoryview | bytes | None) -> int | None:
    """Where the first v2 batch of ``records`` with the transactional bit starts (Kafka's
    ``RequestUtils.hasTransactionalRecords``), or None; headers only, stops at anything not
    whole."""
    if not records:
        return None
    position, end = 0, len(records)
    while end - position >= BATCH_HEADER_BYTES and records[position + 16] == 2:
        if records[position + 22] & TRANSACTIONAL_BIT:
            return position
        position += int.from_bytes(records[position + 8 : position + 12], "big") + 12
    return None


def _has_transactional_batch(records: memoryview | bytes | None) -> bool:
    return _transactional_batch_position(records) is not None


def _unverified_partitions(ctx, request) -> dict[tuple[str, int], KafkaError]:
    """KIP-890 part 1: the partitions whose transactional batch is not in its producer's
    ongoing transaction, with the error each answers."""
    if not ctx.broker.config.get_bool("transaction.partition.verification.enable"):
        return {}
    refused = {}
    for topic in request.topic_data:
        for partition in topic.partition_data:
            position = _transactional_batch_position(partition.records)
            if position is None:
                continue
            header = parse_header(partition.records, position)
            tp = (topic.name, partition.index)
            code = ctx.broker.transactions.coordinator.verify(
                request.transactional_id, header.producer_id, header.producer_epoch, [tp])[tp]
            if code:
                refused[tp] = error_for_code(
                    produce_verification_error_code(code, ctx.api_version),
                    f"partition {topic.name}-{partition.index} is not in an ongoing "
                    f"transaction of producer {header.producer_id}")
    return refused


def _prepare(records: memoryview | bytes | None, version: int) -> memoryview | bytes:
    """The v2 batches to append: ``records`` itself (a view of the request frame: the log
    only reads it), or, for versions 0-2, the up-converted batch of a legacy message set."""
    if not records:
        raise CorruptMessage("empty record set")
    if record_codec.is_legacy(records):
        if version >= FIRST_MAGIC_V2_ONLY_VERSION:
            raise InvalidRecord(f"Produce requests with version {version} are only allowed "
                                "to contain record batches with magic version 2")
        converted = message_format.upconvert(records)
        if not converted:
            raise CorruptMessage("empty legacy message set")
        return converted
    return records


def _append_one(manager, topic: str, index: int, records, acks: int, now_ms: int,
                version: int, replication, appended_by: dict) -> dict:
    """One partition's append; in a cluster by the partition's leader as it is when the
    append runs (``replication.leaders``: replaced, never mutated, so read from any thread),
    recorded in ``appended_by``. A leader epoch the log has moved past meanwhile (a newer
    state applied since) is NOT_LEADER_OR_FOLLOWER, as a partition not led here: nothing is
    written and the client retries after refreshing its metadata, where Kafka's brokers
    never answer FENCED_LEADER_EPOCH to a producer."""
    try:
        log_ = manager.get_log(topic, index)
        leaders = replication.leaders if replication is not None else None
        leader = leaders.get((topic, index)) if leaders is not None else None
        if leader is not None:
            result = _append_as_leader(leader, log_, _prepare(records, version), acks, now_ms)
            appended_by[(topic, index)] = leader
        elif leaders is not None:  # a cluster's partition served here but not led (yet)
            raise NotLeaderOrFollower(f"broker does not lead {topic}-{index}")
        else:
            if acks == -1 and log_.config.min_insync_replicas > 1:
                raise NotEnoughReplicas(
                    f"min.insync.replicas={log_.config.min_insync_replicas} but 1 replica"
                )
            result = log_.append(_prepare(records, version), now_ms, True)
    except FencedLeaderEpoch as error:
        return _partition_error(index, NotLeaderOrFollower(str(error)))
    except KafkaError as error:
        return _partition_error(index, error)
    except OSError as error:
        _storage_errors.event(logging.ERROR, "storage error appending to %s-%d: %s", topic,
                              index, error)
        return _partition_error(index, KafkaStorageError(f"storage error: {error}"))
    except Exception:
        log.exception("append to %s-%d failed", topic, index)
        return _partition_error(index, UnknownServerError("append failed"))
    return {"index": index, "error_code": 0, "base_offset": result.base_offset,
            "log_append_time": result.log_append_time_ms,
            "log_start_offset": result.log_start_offset,
            "required_offset": result.last_offset + 1}


def _append_as_leader(leader, log_, records, acks: int, now_ms: int):
    """Kafka's ``appendRecordsToLeader``: NOT_ENOUGH_REPLICAS for acks=all below
    min.insync.replicas, the leader epoch stamped; a partition whose ISR is its leader alone
    is flushed (``partition_leader``: the last replica standing)."""
    if acks == -1:
        leader.check_enough_replicas()
    result = log_.append(records, now_ms, True, leader.leader_epoch)
    if leader.flush_after_append:
        log_.flush()
    return result


def _append_all(manager, topic_data, acks: int, now_ms: int, version: int,
                refused: dict[tuple[str, int], KafkaError] | None = None,
                replication=None, appended_by: dict | None = None) -> list[dict]:
    """Append every partition but those ``refused`` (answered with their error)."""
    refused = refused or {}
    return [
        {"name": topic.name,
         "partition_responses": [
             _partition_error(partition.index, refused[(topic.name, partition.index)])
             if (topic.name, partition.index) in refused else
             _append_one(manager, topic.name, partition.index, partition.records, acks, now_ms,
                         version, replication, {} if appended_by is None else appended_by)
             for partition in topic.partition_data]}
        for topic in topic_data
    ]


def _appends_cannot_sync(manager, topic_data, now_ms: int, leaders=None) -> bool:
    """Whether appending ``topic_data`` is small (at most ``INLINE_APPEND_MAX_BYTES`` of
    records) and, for every partition, certainly does no fsync and waits for no other thread
    (``Log.append_needs_no_io_wait``: an existing, not compacted log whose flush.messages and
    segment roll cannot be reached), so it may run inline on the event loop."""
    total_bytes = 0
    for topic in topic_data:
        for partition in topic.partition_data:
            size_bytes = len(partition.records or b"")
            total_bytes += size_bytes
            if total_bytes > INLINE_APPEND_MAX_BYTES:
                return False
            if record_codec.is_legacy(partition.records or b""):
                return False  # its v2 size and timestamps are known only once up-converted
            try:
                log_ = manager.get_log(topic.name, partition.index)
            except KafkaError:
                return False
            leader = leaders.get((topic.name, partition.index)) if leaders is not None else None
            if leader is not None and leader.flush_after_append:
                return False
            if not log_.append_needs_no_io_wait(size_bytes, now_ms, partition.records or b""):
                return False
    return True


def _storage_errors_as_not_leader(responses: list[dict]) -> None:
    """Produce v3 clients may not know KAFKA_STORAGE_ERROR (a fatal unknown error to them):
    Kafka answers NOT_LEADER_OR_FOLLOWER, so they refresh metadata and retry."""
    for topic in responses:
        for partition in topic["partition_responses"]:
            if partition["error_code"] == KafkaStorageError.code:
                partition["error_code"] = NotLeaderOrFollower.code


def _reject_all(topic_data, error: KafkaError) -> list[dict]:
    return [{"name": topic.name,
             "partition_responses": [_partition_error(p.index, error)
                                     for p in topic.partition_data]}
            for topic in topic_data]


async def handle(ctx, request):
    acks = request.acks
    if acks not in VALID_ACKS:
        responses = _reject_all(request.topic_data, InvalidRequiredAcks(f"acks={acks}"))
    elif getattr(request, "transactional_id", None) is None and any(
            _has_transactional_batch(partition.records) for topic in request.topic_data
            for partition in topic.partition_data):
        responses = _reject_all(request.topic_data, TransactionalIdAuthorizationFailed(
            "transactional records need a transactional id"))
    else:
        broker = ctx.broker
        manager = broker.log_manager
        refused = {} if getattr(request, "transactional_id", None) is None else (
            _unverified_partitions(ctx, request))
        replication = broker.cluster.leader_replicas if broker.cluster is not None else None
        leaders = replication.leaders if replication is not None else None
        appended_by: dict = {}
        if broker.append_thread_idle and _appends_cannot_sync(manager, request.topic_data,
                                                              ctx.now_ms, leaders):
            responses = _append_all(manager, request.topic_data, acks, ctx.now_ms,
                                    ctx.api_version, refused, replication, appended_by)
        else:
            responses = await broker.run_append(
                _append_all, manager, request.topic_data, acks, ctx.now_ms, ctx.api_version,
                refused, replication, appended_by)
        if replication is not None:
            await _replicated(replication, appended_by, responses, acks, request.timeout_ms)
    if acks == 0:
        return None
    if ctx.api_version < FIRST_STORAGE_ERROR_VERSION:
        _storage_errors_as_not_leader(responses)
    body = encode_produce_body(ctx.api_version, responses)
    return RawResponse((body,), len(body))


async def _replicated(replication, appended_by, responses: list[dict], acks: int,
                      timeout_ms: int) -> None:
    """After the local appends (made by the partition leaders of ``appended_by``): the
    high watermark may move (a leader alone in its ISR); acks=all waits, for at most the
    request's ``timeout_ms``, until each appended partition's high watermark passes its
    records (``PartitionLeader.wait_for``), whose answer replaces the partition's error code;
    REQUEST_TIMED_OUT for those still waiting, as Kafka's ``DelayedProduce`` expires. A
    partition this broker stopped leading while its records were being appended (on the
    append thread, while the replica manager applied a newer state) answers
    NOT_LEADER_OR_FOLLOWER, as ``DelayedProduce`` does for a partition no longer led here:
    its records are not replicated, and the new leader's followers will truncate them."""
    waits: list[tuple[dict, asyncio.Future]] = []
    for topic in responses:
        for partition in topic["partition_responses"]:
            if partition["error_code"] != 0:
                continue
            key = (topic["name"], partition["index"])
            replication.appended(*key)
            if acks != -1:
                continue
            leader = replication.leaders.get(key)
            appender = appended_by.get(key)
            if leader is None or appender is None or leader.log is not appender.log:
                partition["error_code"] = NotLeaderOrFollower.code
                continue
            waits.append((partition, leader.wait_for(partition["required_offset"])))
    pending = [future for _, future in waits if not future.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(timeout_ms, 0) / 1000)
    for partition, future in waits:
        if future.done():
            partition["error_code"] = future.result()
        else:
            future.cancel()
            partition["error_code"] = RequestTimedOut.code


def _array_length(count: int, flexible: bool) -> bytes:
    return encode_unsigned(count + 1) if flexible else _INT32.pack(count)


def _nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else _INT16.pack(-1)
    encoded = text.encode()
    return (encode_unsigned(len(encoded) + 1) if flexible else _INT16.pack(len(encoded))) + encoded


def _record_errors(record_errors: tuple[tuple[int, str], ...], flexible: bool) -> bytes:
    out = bytearray(_array_length(len(record_errors), flexible))
    for batch_index, message in record_errors:
        out += _INT32.pack(batch_index)
        out += _nullable_string(message, flexible)
        if flexible:
            out += b"\x00"
    return bytes(out)


def encode_produce_body(version: int, responses: list[dict]) -> bytes:
    """The Produce response body of ``version`` (0-12) for ``_append_all``'s answers."""
    flexible = version >= FIRST_FLEXIBLE_VERSION
    out = bytearray(_array_length(len(responses), flexible))
    for topic in responses:
        out += _nullable_string(topic["name"], flexible)
        partitions = topic["partition_responses"]
        out += _array_length(len(partitions), flexible)
        for partition in partitions:
            out += _PARTITION_HEAD.pack(partition["index"], partition["error_code"],
                                        partition["base_offset"])
            if version >= 2:
                out += _INT64.pack(partition["log_append_time"])
            if version >= 5:
                out += _INT64.pack(partition["log_start_offset"])
            if version >= 8:
                out += _record_errors(partition.get("record_errors", ()), flexible)
                out += _nullable_string(partition.get("error_message"), flexible)
            if flexible:
                out += b"\x00"
        if flexible:
            out += b"\x00"
    if version >= 1:
        out += _INT32.pack(0)  # throttle_time_ms
    if flexible:
        out += b"\x00"
    return bytes(out)
