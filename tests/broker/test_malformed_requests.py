"""Malformed requests against a real broker process: an impossible array count in any
advertised (api key, version), or a null where the schema has none, closes only that
connection with one WARNING; the broker lives on and real clients keep working."""

from __future__ import annotations

import io
import struct
import time
from dataclasses import fields

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.serial._introspect import EntityField, classify_field, get_field_tag
from kio.serial._serialize import get_field_writer

from headrace.broker.handlers import HANDLERS
from headrace.protocol import wire
from tests.broker.raw_client import RawClient

TOPIC = "survives-malformed"
CLIENT_TIMEOUT_S = 20.0
LOG_WAIT_S = 10.0
HUGE_COMPACT_COUNT = b"\xff\xff\xff\xff\x0f"  # 2^32 - 2 items
HUGE_LEGACY_COUNT = struct.pack(">i", 2**31 - 1)
API_VERSIONS = 18


def _frame_with_huge_first_array(key: int, version: int) -> bytes | None:
    """A request whose fields before its first array are valid (zero values) and whose first
    array announces a huge count followed by three bytes; None if the schema has no array."""
    body_class = wire.request_class(key, version)
    flexible = body_class.__flexible__
    zero = wire.build(body_class, {})
    prefix = io.BytesIO()
    for field in fields(body_class):
        if get_field_tag(field) is not None:
            continue
        if classify_field(field).is_array:
            count = HUGE_COMPACT_COUNT if flexible else HUGE_LEGACY_COUNT
            header = struct.pack(">hhih", key, version, 1, 10) + b"crash-test"
            if flexible:
                header += b"\x00"
            payload = header + prefix.getvalue() + count + b"\x00" * 3
            return struct.pack(">i", len(payload)) + payload
        get_field_writer(field, flexible, False, False)(prefix, getattr(zero, field.name))
    return None


def _hand_coded_frame_with_huge_first_array(key: int, version: int) -> bytes:
    """The same for a version kio has no schema for (``wire.HAND_CODED_VERSIONS``): Produce
    v0-2 (acks, timeout_ms, topics), Fetch v0-3 (replica_id, max_wait_ms, min_bytes,
    max_bytes from v3, topics), ListOffsets v0 (replica_id, topics) and OffsetCommit v0-1
    (group_id, generation_id and member_id from v1, topics); CreateTopics v0 and
    DescribeConfigs v0 start with their array."""
    if key == wire.PRODUCE_KEY:
        fixed = struct.pack(">hi", -1, 0)
    elif key in (wire.CREATE_TOPICS_KEY, wire.DESCRIBE_CONFIGS_KEY):
        fixed = b""
    elif key == wire.OFFSET_COMMIT_KEY:
        fixed = struct.pack(">h", 0) + (struct.pack(">ih", -1, 0) if version >= 1 else b"")
    elif key == wire.LIST_OFFSETS_KEY:
        fixed = struct.pack(">i", -1)
    else:
        fixed = struct.pack(">iii", -1, 0, 0) + (struct.pack(">i", 0) if version >= 3 else b"")
    payload = struct.pack(">hhih", key, version, 1, 10) + b"crash-test" + fixed
    payload += HUGE_LEGACY_COUNT + b"\x00" * 3
    return struct.pack(">i", len(payload)) + payload


def _is_hand_coded(key: int, version: int) -> bool:
    return version in wire.HAND_CODED_VERSIONS.get(key, ())


CRASH_FRAMES = {(key, version): frame for key, handler in HANDLERS.items()
                for version in range(handler.min_version, handler.max_version + 1)
                if (frame := _hand_coded_frame_with_huge_first_array(key, version)
                    if _is_hand_coded(key, version)
                    else _frame_with_huge_first_array(key, version)) is not None}


def _send_and_wait_for_close(bootstrap: str, frame: bytes) -> int:
    """Send ``frame`` on a new connection, return its local port once the broker closed it."""
    with RawClient(bootstrap) as client:
        port = client.sock.getsockname()[1]
        client.send_bytes(frame)
        try:
            assert client.sock.recv(1) == b"", "the broker answered a malformed request"
        except ConnectionResetError:
            pass
    return port


def _warnings_for(broker, port: int, since_byte: int) -> list[str]:
    marker = f"WARNING headrace.broker.connection: closing connection from 127.0.0.1:{port}:"
    return [line for line in broker.log_text(since_byte).splitlines() if marker in line]


def _one_warning_for(broker, port: int, since_byte: int) -> str:
    """The one warning about the connection from ``port`` logged after ``since_byte`` (a port
    an earlier test used may have its own line before)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while not (lines := _warnings_for(broker, port, since_byte)) and \
            time.monotonic() < deadline:
        time.sleep(0.01)  # polling the log file for the line, bounded by LOG_WAIT_S
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def clients(fresh_broker):
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(CLIENT_TIMEOUT_S)
    producer = Producer({"bootstrap.servers": fresh_broker.bootstrap, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": fresh_broker.bootstrap, "group.id": "survivor",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    yield producer, consumer
    consumer.close()


def _round_trip(producer, consumer, value: bytes) -> None:
    producer.produce(TOPIC, value)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None and message.value() == value:
            return
    raise AssertionError(f"{value!r} was not consumed")


def _has_array(entity_class: type) -> bool:
    for field in fields(entity_class):
        kind = classify_field(field)
        if kind.is_array or (isinstance(kind, EntityField) and _has_array(kind.type_)):
            return True
    return False


def test_the_generated_frames_cover_every_advertised_version_with_an_array():
    with_arrays = {(key, version) for key, handler in HANDLERS.items()
                   for version in range(handler.min_version, handler.max_version + 1)
                   if _is_hand_coded(key, version)
                   or _has_array(wire.request_class(key, version))}
    assert set(CRASH_FRAMES) == with_arrays
    assert {(3, 12), (8, 8), (1, 12), (0, 9), (0, 0), (1, 3), (2, 0), (8, 0), (8, 1), (9, 0),
            (19, 0), (19, 1), (20, 0), (32, 0), (35, 0)} <= with_arrays


def test_a_huge_array_count_in_any_request_closes_only_that_connection(fresh_broker, clients):
    producer, consumer = clients
    for (key, version), frame in CRASH_FRAMES.items():
        log_start = fresh_broker.log_bytes()
        port = _send_and_wait_for_close(fresh_broker.bootstrap, frame)
        assert fresh_broker.process.poll() is None, f"broker died on key {key} v{version}"
        assert "overruns" in _one_warning_for(fresh_broker, port, log_start)
        _round_trip(producer, consumer, f"after {key} v{version}".encode())
    log = fresh_broker.log_text()
    assert "internal error" not in log and "Traceback" not in log


@pytest.mark.parametrize(("key", "version", "values"), [
    (8, 2, {"group_id": "g", "topics": None}),  # OffsetCommit
    (8, 8, {"group_id": "g", "topics": None}),
    (2, 1, {"topics": None}),  # ListOffsets
    (2, 7, {"topics": None}),
])
def test_a_null_array_where_the_schema_has_none_closes_with_a_warning(broker, key, version,
                                                                      values):
    log_start = broker.log_bytes()
    body = wire.build(wire.request_class(key, version), values)
    frame = wire.encode_request(key, version, 1, "null-arrays", body)
    port = _send_and_wait_for_close(broker.bootstrap, frame)
    assert "topics: non-nullable field was serialized as null" in \
        _one_warning_for(broker, port, log_start)
    with RawClient(broker.bootstrap) as other:
        assert other.request(API_VERSIONS, 0, {}).error_code == 0
    assert "internal error" not in broker.log_text(since_byte=log_start)

