"""The follower's wire connection (``replica_connection.ReplicaConnection``) against a real
single-node broker, and against a peer on a real socket that answers what no Kafka leader
would (a response larger than allowed, another correlation id, bytes that do not decode,
nothing at all): each is an error that closes the connection, never a hang or a huge read."""

from __future__ import annotations

import asyncio
import struct

import pytest

from headrace.broker.replica_connection import ReplicaConnection, ReplicaConnectionError
from headrace.protocol import wire

API_VERSIONS, METADATA = 18, 3
SOCKET_TIMEOUT_MS = 30_000
SHORT_SOCKET_TIMEOUT_MS = 200
MAX_RESPONSE_BYTES = 1 << 20


async def _metadata(connection: ReplicaConnection):
    return await connection.request(METADATA, 12, {
        "topics": [], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False})


def test_requests_round_trip_with_a_broker(broker):
    async def run():
        connection = ReplicaConnection("127.0.0.1", broker.port, "replica-test",
                                       SOCKET_TIMEOUT_MS, MAX_RESPONSE_BYTES)
        await connection.open()
        try:
            first, second = await _metadata(connection), await _metadata(connection)
        finally:
            connection.close()
        return first, second

    first, second = asyncio.run(run())
    assert [b.port for b in first.brokers] == [broker.port]
    assert second.brokers == first.brokers


async def _against_peer(answer: bytes | None, timeout_ms: int = SOCKET_TIMEOUT_MS,
                        hang_up: bool = False):
    """Send one Metadata request to a peer that reads it and writes ``answer`` (None:
    nothing), then hangs up or waits for the follower to; the exception raised and whether
    the connection stayed open."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        await reader.readexactly(size)
        if answer is not None:
            writer.write(answer)
            await writer.drain()
        if not hang_up:
            await reader.read()  # until the follower closes
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = ReplicaConnection("127.0.0.1", port, "replica-test", timeout_ms,
                                   MAX_RESPONSE_BYTES)
    await connection.open()
    try:
        with pytest.raises(Exception) as raised:
            await _metadata(connection)
        return raised.value, connection.is_open
    finally:
        connection.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("answer", [
    struct.pack(">i", MAX_RESPONSE_BYTES + 1),  # announced too large: not read
    struct.pack(">i", -5),
    wire.encode_response(wire.RequestHeader(METADATA, 12, 99, None), wire.build(
        wire.response_class(METADATA, 12), {"brokers": [], "topics": []})),  # another id
    struct.pack(">ii", 7, 1) + b"\xff\xff\xff",  # the right id, a body that does not decode
], ids=["too-large", "negative", "correlation", "undecodable"])
def test_an_unusable_response_closes_the_connection(answer):
    error, still_open = asyncio.run(_against_peer(answer))
    assert isinstance(error, ReplicaConnectionError)
    assert not still_open


def test_a_silent_peer_times_out_and_closes_the_connection():
    error, still_open = asyncio.run(_against_peer(None, SHORT_SOCKET_TIMEOUT_MS))
    assert isinstance(error, TimeoutError)
    assert not still_open


def test_a_peer_hanging_up_mid_response_is_a_connection_error():
    error, still_open = asyncio.run(_against_peer(struct.pack(">ii", 100, 1), hang_up=True))
    assert isinstance(error, EOFError)  # asyncio's IncompleteReadError
    assert not still_open


def test_a_request_cancelled_as_its_response_arrives_ends_cancelled(broker):
    """A fetcher is stopped by cancelling its task (``ReplicaFetcher.stop``, which the
    replica manager's apply loop waits for). The cancellation lands here in the one moment
    that lost it before (Python 3.11's ``asyncio.wait_for``): the response has been read,
    the request has not returned yet. A cancellation the task accepted must end it."""
    async def run():
        connection = ReplicaConnection("127.0.0.1", broker.port, "replica-test",
                                       SOCKET_TIMEOUT_MS, MAX_RESPONSE_BYTES)
        await connection.open()
        loop = asyncio.get_running_loop()
        accepted: list[bool] = []
        protocol = connection._protocol
        received = protocol.buffer_updated

        def cancel_as_the_response_arrives(nbytes: int) -> None:
            received(nbytes)
            if protocol.receiver.partial_frame_bytes == 0:  # the whole response is in
                loop.call_soon(lambda: accepted.append(request.cancel()))

        protocol.buffer_updated = cancel_as_the_response_arrives
        request = asyncio.ensure_future(_metadata(connection))
        try:
            await request
            outcome = "returned"
        except asyncio.CancelledError:
            outcome = "cancelled"
        finally:
            connection.close()
        return accepted, outcome

    accepted, outcome = asyncio.run(run())
    assert accepted, "the response never arrived"
    assert outcome == ("cancelled" if accepted[0] else "returned")
