"""The shared blocking wire client against a real broker: version negotiation, correlation,
bounded responses, timeouts, and the errors each failure becomes."""

from __future__ import annotations

import socket
import threading

import pytest

from headrace.client.broker_connection import (
    BrokerConnection,
    ResponseTooLarge,
    WireClientError,
    connect_any,
    parse_servers,
    receive_frame_bytes,
)
from headrace.errors import UnsupportedVersion
from headrace.protocol import wire
from tests.client.conftest import create_topic

API_VERSIONS = 18
METADATA = 3
FETCH = 1
CLIENT_ID = "broker-connection-test"
LONG_FETCH_WAIT_MS = 60_000
SHORT_REQUEST_TIMEOUT_MS = 300


def _connect(bootstrap: str, **options) -> BrokerConnection:
    return BrokerConnection(parse_servers(bootstrap)[0], CLIENT_ID, **options)


def test_versions_are_negotiated_when_the_connection_opens(bootstrap):
    with _connect(bootstrap) as connection:
        broker_min, broker_max = connection.api_versions[METADATA]
        assert connection.version_for(METADATA, (0, 99)) == broker_max
        assert connection.version_for(METADATA, (broker_min, broker_min)) == broker_min
        with pytest.raises(UnsupportedVersion, match="api 3"):
            connection.version_for(METADATA, (broker_max + 1, broker_max + 5))
        response = connection.request_values(METADATA, connection.version_for(METADATA, (1, 12)),
                                              {"topics": []})
        assert response.brokers[0].port == parse_servers(bootstrap)[0][1]


def test_pipelined_requests_are_answered_in_order_with_their_correlation_ids(bootstrap):
    with _connect(bootstrap) as connection:
        sent = [connection.send_values(API_VERSIONS, version, {}) for version in (0, 1, 2)]
        frames = [connection.receive_frame() for _ in sent]
        assert [(key, version) for key, version, _ in frames] == [(18, 0), (18, 1), (18, 2)]
        assert [wire.decode_response(18, version, bytes(frame))[0]
                for _, version, frame in frames] == sent


def test_a_response_for_another_request_is_refused_and_closes_the_connection(bootstrap):
    with _connect(bootstrap) as connection:
        stray = wire.build(wire.request_class(API_VERSIONS, 0), {})
        connection.socket.sendall(wire.encode_request(API_VERSIONS, 0, 999, CLIENT_ID, stray))
        connection.send_values(API_VERSIONS, 0, {})
        with pytest.raises(WireClientError, match="correlation id 999"):
            connection.receive()
        assert connection.socket.fileno() < 0


def test_a_response_larger_than_the_limit_is_refused_before_it_is_read(bootstrap):
    with pytest.raises(ResponseTooLarge, match="at most 16 accepted"):
        _connect(bootstrap, max_response_bytes=16)  # ApiVersions' answer is larger
    with _connect(bootstrap, negotiate_api_versions=False) as connection:
        connection.send_values(API_VERSIONS, 0, {})
        connection.max_response_bytes = 16
        with pytest.raises(ResponseTooLarge):
            connection.receive_frame()
        assert connection.socket.fileno() < 0


def test_the_bare_socket_frame_reader_has_the_same_bound(bootstrap):
    with _connect(bootstrap, negotiate_api_versions=False) as connection:
        connection.socket.sendall(wire.encode_request(
            API_VERSIONS, 0, 1, CLIENT_ID, wire.build(wire.request_class(API_VERSIONS, 0), {})))
        with pytest.raises(ResponseTooLarge):
            receive_frame_bytes(connection.socket, max_frame_bytes=16)


def test_an_undecodable_response_is_a_wire_client_error(bootstrap):
    with _connect(bootstrap) as connection:
        header = connection.request_header(API_VERSIONS, 0, flexible=False)
        connection.send_pieces(METADATA, 12, [header])  # booked as Metadata v12
        with pytest.raises(WireClientError, match="undecodable api 3 v12"):
            connection.receive()
        assert connection.socket.fileno() < 0


def test_an_unanswered_request_times_out_after_request_timeout_ms(bootstrap):
    topic = create_topic(bootstrap, partitions=1, prefix="wire-timeout")
    with _connect(bootstrap, request_timeout_ms=SHORT_REQUEST_TIMEOUT_MS) as connection:
        version = connection.version_for(FETCH, (4, 12))
        connection.send_values(FETCH, version, {
            "replica_id": -1, "max_wait": LONG_FETCH_WAIT_MS, "min_bytes": 1,
            "max_bytes": 1024, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}]})
        with pytest.raises(TimeoutError):
            connection.receive_frame()


def test_a_connection_the_broker_closes_is_a_connection_error(bootstrap):
    with _connect(bootstrap) as connection:
        connection.socket.sendall(b"\x00\x00\x00\x02\xff\xff")  # a frame too short for a header
        with pytest.raises(ConnectionError):  # while sending or receiving
            connection.send_values(API_VERSIONS, 0, {})
            connection.receive_frame()


def test_connect_any_names_every_unreachable_server(bootstrap):
    unused_port = _closed_port()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{unused_port}"):
        connect_any((("127.0.0.1", unused_port),), CLIENT_ID)
    with connect_any((("127.0.0.1", unused_port), parse_servers(bootstrap)[0]),
                     CLIENT_ID) as connection:
        assert connection.address == parse_servers(bootstrap)[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_frame_shorter_than_a_response_header_is_refused():
    """A fault-injecting peer (no broker sends this): an empty frame for every request."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        answered = threading.Thread(target=_answer_with_an_empty_frame, args=(server,))
        answered.start()
        try:
            with BrokerConnection(server.getsockname(), CLIENT_ID,
                                  negotiate_api_versions=False) as connection:
                connection.send_values(API_VERSIONS, 0, {})
                with pytest.raises(WireClientError, match="shorter than its header"):
                    connection.receive_frame()
                assert connection.socket.fileno() < 0
        finally:
            answered.join(timeout=30)


def _answer_with_an_empty_frame(server: socket.socket) -> None:
    server.settimeout(30)
    peer, _ = server.accept()
    with peer:
        peer.recv(4096)
        peer.sendall(b"\x00\x00\x00\x00")
        peer.recv(1)  # until the client closes
