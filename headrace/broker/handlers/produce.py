"""Produce (key 0), versions 3-12: append record batches to partition logs.

acks 0 (no response at all), 1 and -1 (all: on one node the local write; a partition whose
min.insync.replicas exceeds 1 answers NOT_ENOUGH_REPLICAS, as Kafka does with too few
in-sync replicas); any other acks value gets INVALID_REQUIRED_ACKS for every partition.
Legacy magic 0/1 message sets are up-converted to one v2 batch. On a compacted topic a
record without a key is INVALID_RECORD. Validation of sizes, CRCs, timestamps and producer
sequences is the log's (``Log.append``); its errors become per-partition error codes.
Unknown topics are not created here (Kafka creates them on Metadata): UNKNOWN_TOPIC_OR_PARTITION.

Every partition of a request is appended in one job on the broker's single append thread, so
fsync (flush.messages) never blocks the event loop. Event loop thread otherwise.
"""

from __future__ import annotations

import logging

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    InvalidRequiredAcks,
    KafkaError,
    NotEnoughReplicas,
    UnknownServerError,
)
from headrace.protocol import records as record_codec

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 12

VALID_ACKS = (0, 1, -1)
log = logging.getLogger(__name__)


def _partition_error(index: int, error: KafkaError) -> dict:
    return {"index": index, "error_code": error.code, "base_offset": -1,
            "log_append_time": -1, "log_start_offset": -1, "error_message": error.message}


def _prepare(records: bytes | None) -> bytearray:
    if not records:
        raise CorruptMessage("empty record set")
    if record_codec.is_legacy(records):
        converted = record_codec.upconvert_legacy(records)
        if not converted:
            raise CorruptMessage("empty legacy message set")
        return bytearray(converted)
    return bytearray(records)


def _append_one(manager, topic: str, index: int, records, acks: int, now_ms: int) -> dict:
    try:
        log_ = manager.get_log(topic, index)
        if acks == -1 and log_.config.min_insync_replicas > 1:
            raise NotEnoughReplicas(
                f"min.insync.replicas={log_.config.min_insync_replicas} but 1 replica"
            )
        data = _prepare(records)
        if log_.config.compact_enabled:
            keyless = record_codec.first_keyless_record(data)
            if keyless is not None:
                raise InvalidRecord("compacted topic records must have keys")
        result = log_.append(data, now_ms)
    except KafkaError as error:
        return _partition_error(index, error)
    except Exception:
        log.exception("append to %s-%d failed", topic, index)
        return _partition_error(index, UnknownServerError("append failed"))
    return {"index": index, "error_code": 0, "base_offset": result.base_offset,
            "log_append_time": result.log_append_time_ms,
            "log_start_offset": result.log_start_offset}


def _append_all(manager, topic_data, acks: int, now_ms: int) -> list[dict]:
    return [
        {"name": topic.name,
         "partition_responses": [
             _append_one(manager, topic.name, partition.index, partition.records, acks, now_ms)
             for partition in topic.partition_data]}
        for topic in topic_data
    ]


def _reject_all(topic_data, error: KafkaError) -> list[dict]:
    return [{"name": topic.name,
             "partition_responses": [_partition_error(p.index, error)
                                     for p in topic.partition_data]}
            for topic in topic_data]


async def handle(ctx, request):
    acks = request.acks
    if acks not in VALID_ACKS:
        responses = _reject_all(request.topic_data, InvalidRequiredAcks(f"acks={acks}"))
    else:
        broker = ctx.broker
        responses = await broker.run_append(
            _append_all, broker.log_manager, request.topic_data, acks, ctx.now_ms
        )
    if acks == 0:
        return None
    return ctx.respond({"responses": responses, "throttle_time": 0})
