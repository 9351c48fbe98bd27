"""Fetch responses larger than the socket buffers, to readers that are slow or leave: a real
broker process, raw sockets with a small receive buffer, so the broker's sendfile has to wait
for the socket to drain several times within one response."""

from __future__ import annotations

import socket
import struct
import time

from headrace.protocol import records as record_codec
from headrace.protocol import wire
from tests.broker.raw_client import SOCKET_TIMEOUT_S, RawClient
from tests.record_reading import iter_records

PRODUCE, FETCH, METADATA = 0, 1, 3
SMALL_RECEIVE_BUFFER_BYTES = 8192
READ_CHUNK_BYTES = 4096
VALUE_BYTES = 100_000
VALUES_PER_BATCH = 10


def _values(count: int) -> list[bytes]:
    return [bytes([65 + n % 26]) * VALUE_BYTES for n in range(count)]


def _create_and_fill(bootstrap: str, topic: str, values: list[bytes]):
    now = int(time.time() * 1000)
    with RawClient(bootstrap) as client:
        created = client.request(METADATA, 12, {"topics": [{"name": topic}],
                                                "allow_auto_topic_creation": True})
        assert created.topics[0].error_code == 0
        for start in range(0, len(values), VALUES_PER_BATCH):
            batch = record_codec.build_batch(
                [(b"k", value, [], now) for value in values[start:start + VALUES_PER_BATCH]])
            produced = client.request(PRODUCE, 9, {"acks": -1, "timeout": 30000, "topic_data": [
                {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
            assert produced.responses[0].partition_responses[0].error_code == 0
    return created.topics[0].topic_id


def _fetch_frame(version: int, correlation_id: int, topic: str, topic_id) -> bytes:
    body = wire.build(wire.request_class(FETCH, version), {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 50_000_000,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
        "forgotten_topics_data": [],
        "topics": [{"topic": topic, "topic_id": topic_id, "partitions": [{
            "partition": 0, "fetch_offset": 0, "partition_max_bytes": 20_000_000,
            "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}]}],
    })
    return wire.encode_request(FETCH, version, correlation_id, "slow-reader", body)


def _slow_reader(bootstrap: str) -> socket.socket:
    """A connection whose receive window stays small: the broker's sends fill it often."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RECEIVE_BUFFER_BYTES)
    sock.settimeout(SOCKET_TIMEOUT_S)
    sock.connect((host, int(port)))
    return sock


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    received = bytearray()
    while len(received) < count:
        chunk = sock.recv(min(READ_CHUNK_BYTES, count - len(received)))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        received += chunk
    return bytes(received)


def _receive_fetch(sock: socket.socket, version: int) -> tuple[int, list[bytes]]:
    (size,) = struct.unpack(">i", _receive_exactly(sock, 4))
    correlation_id, body = wire.decode_response(FETCH, version, _receive_exactly(sock, size))
    partition = body.responses[0].partitions[0]
    assert partition.error_code == 0
    return correlation_id, [r.value for r in iter_records(partition.records)]


def test_pipelined_fetches_larger_than_the_socket_buffers_arrive_whole_and_in_order(broker):
    values = _values(60)  # 6 MB: more than the broker's send buffer can ever hold at once
    topic_id = _create_and_fill(broker.bootstrap, "slow-reader", values)
    with _slow_reader(broker.bootstrap) as sock:
        sock.sendall(_fetch_frame(12, 1, "slow-reader", None)
                     + _fetch_frame(16, 2, "", topic_id)
                     + _fetch_frame(11, 3, "slow-reader", None))
        assert _receive_fetch(sock, 12) == (1, values)
        assert _receive_fetch(sock, 16) == (2, values)
        assert _receive_fetch(sock, 11) == (3, values)


def test_a_reader_leaving_mid_response_does_not_disturb_other_connections(broker):
    log_start = broker.log_bytes()
    values = _values(60)
    _create_and_fill(broker.bootstrap, "leaving-reader", values)
    with _slow_reader(broker.bootstrap) as leaving:
        leaving.sendall(_fetch_frame(12, 1, "leaving-reader", None))
        _receive_exactly(leaving, READ_CHUNK_BYTES)  # the response has started
    with _slow_reader(broker.bootstrap) as staying:
        staying.sendall(_fetch_frame(12, 7, "leaving-reader", None))
        assert _receive_fetch(staying, 12) == (7, values)
    assert broker.process.poll() is None
    assert "unexpected error" not in broker.log_text(since_byte=log_start)
