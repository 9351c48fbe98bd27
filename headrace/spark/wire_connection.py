"""Blocking Kafka connections for the Spark executors' small wire clients (fetch and produce).

Owns: ``BrokerConnection`` -- one blocking PLAINTEXT socket to one broker that sends
ApiVersions v0 when it opens, negotiates each API's version (the highest both sides
support), and sends requests and receives their responses in order (Kafka answers a
connection's requests in the order they were sent, so several may be in flight) -- and the
option helpers both clients share: ``parse_servers`` (``bootstrap.servers``),
``first_option`` (Kafka's option name first, then librdkafka's spelling) and
``connect_any`` (the first reachable bootstrap server).

Requests are encoded with kio through ``headrace.protocol.wire``, or given as ready frame
pieces (``send_pieces``: a hand-encoded prefix and record batches sent with one
``sendmsg`` without joining them). Responses come back as raw frames or kio entities; a
connection given a ``frame_pool`` (``headrace.protocol.buffers.RegionPool``) receives its frames
into the pool's reused regions instead of fresh buffers. ``is_reusable`` tells whether an idle
connection may serve another client (nothing in flight, and the broker has neither closed it
nor sent anything unasked).

Not thread-safe: one connection belongs to one client, which belongs to one Spark task.
"""

from __future__ import annotations

import select
import socket
import struct
from collections import deque
from collections.abc import Sequence

from headrace.errors import KafkaError, UnsupportedVersion, error_for_code
from headrace.protocol import wire
from headrace.protocol.buffers import RegionPool

API_VERSIONS_KEY = 18
NO_ERROR = 0
DEFAULT_KAFKA_PORT = 9092
SENDMSG_MAX_PIECES = 512  # well under the kernel's IOV_MAX (1024)

_INT32 = struct.Struct(">i")


class WireClientError(KafkaError):
    """The cluster cannot be reached or answered something this client cannot use."""


def first_option(options: dict[str, str], names: tuple[str, ...], default: int) -> int:
    """The integer value of the first of ``names`` present in ``options``."""
    for name in names:
        if name in options:
            return int(options[name])
    return default


def parse_servers(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port`` pairs of a ``bootstrap.servers`` list (``PLAINTEXT://`` prefixes and
    missing ports, 9092, allowed)."""
    servers = []
    for entry in text.split(","):
        entry = entry.strip().removeprefix("PLAINTEXT://").removeprefix("plaintext://")
        if not entry:
            continue
        host, _, port = entry.rpartition(":")
        if not host:
            host, port = port, str(DEFAULT_KAFKA_PORT)
        servers.append((host.strip("[]"), int(port)))
    if not servers:
        raise WireClientError(f"bootstrap.servers {text!r} names no server")
    return tuple(servers)


def check_plaintext(options: dict[str, str], client: str) -> None:
    """Refuse any ``security.protocol`` but PLAINTEXT (the only one these clients speak)."""
    protocol = options.get("security.protocol", "PLAINTEXT").upper()
    if protocol != "PLAINTEXT":
        raise WireClientError(f"security.protocol {protocol} is not supported by the {client}")


def request_header_bytes(api_key: int, version: int, correlation_id: int, client_id: str,
                         flexible: bool) -> bytes:
    """A request header: v1, or v2 (an empty tagged-field section added) when ``flexible``."""
    encoded = client_id.encode()
    header = struct.pack(">hhih", api_key, version, correlation_id, len(encoded)) + encoded
    return header + b"\x00" if flexible else header


class BrokerConnection:
    """One blocking socket to one broker, with the API versions it supports."""

    def __init__(self, address: tuple[str, int], client_id: str, timeout_s: float, *,
                 receive_buffer_bytes: int | None = None,
                 send_buffer_bytes: int | None = None,
                 frame_pool: RegionPool | None = None) -> None:
        self.address = address
        self._frame_pool = frame_pool
        self._size_view = memoryview(bytearray(_INT32.size))
        self._client_id = client_id
        self._socket = socket.create_connection(address, timeout=timeout_s)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if receive_buffer_bytes:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        if send_buffer_bytes:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        self._next_correlation_id = 0
        self._in_flight: deque[tuple[int, int, int]] = deque()  # correlation id, key, version
        self.api_versions: dict[int, tuple[int, int]] = {}
        try:
            response = self.request(API_VERSIONS_KEY, 0,
                                    wire.build(wire.request_class(API_VERSIONS_KEY, 0), {}))
        except BaseException:
            self._socket.close()
            raise
        if int(response.error_code) != NO_ERROR:
            self._socket.close()
            raise error_for_code(int(response.error_code), f"ApiVersions failed on {address}")
        self.api_versions = {item.api_key: (item.min_version, item.max_version)
                             for item in response.api_keys}

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def client_id(self) -> str:
        return self._client_id

    def is_reusable(self) -> bool:
        """True when no request is in flight and the socket has nothing to read: a broker that
        closed the connection (e.g. after ``connections.max.idle.ms``) makes it readable."""
        if self._in_flight or self._socket.fileno() < 0:
            return False
        poller = select.poll()
        poller.register(self._socket, select.POLLIN)
        return not poller.poll(0)

    def version_for(self, api_key: int, client_range: tuple[int, int]) -> int:
        broker_min, broker_max = self.api_versions.get(api_key, (0, -1))
        version = min(broker_max, client_range[1])
        if version < max(broker_min, client_range[0]):
            raise UnsupportedVersion(
                f"broker {self.address} supports api {api_key} v{broker_min}-v{broker_max}, "
                f"this client v{client_range[0]}-v{client_range[1]}")
        return version

    def _take_correlation_id(self, api_key: int, version: int) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id += 1
        self._in_flight.append((correlation_id, api_key, version))
        return correlation_id

    def send(self, api_key: int, version: int, body) -> None:
        correlation_id = self._next_correlation_id
        frame = wire.encode_request(api_key, version, correlation_id, self._client_id, body)
        self._socket.sendall(frame)
        self._take_correlation_id(api_key, version)

    def request_header(self, api_key: int, version: int, flexible: bool) -> bytes:
        """The request header the next ``send_pieces`` call must start with (it carries
        the next correlation id)."""
        return request_header_bytes(api_key, version, self._next_correlation_id,
                                    self._client_id, flexible)

    def send_pieces(self, api_key: int, version: int, pieces: Sequence) -> None:
        """Send one request frame made of ``pieces`` (header from ``request_header`` first,
        then the body), its length prefixed, without joining the pieces."""
        size = sum(len(piece) for piece in pieces)
        pending = [memoryview(_INT32.pack(size))] + [memoryview(piece).cast("B")
                                                     for piece in pieces]
        while pending:
            sent = self._socket.sendmsg(pending[:SENDMSG_MAX_PIECES])
            while pending and sent >= len(pending[0]):
                sent -= len(pending[0])
                pending.pop(0)
            if sent:
                pending[0] = pending[0][sent:]
        self._take_correlation_id(api_key, version)

    def receive_frame(self) -> tuple[int, int, bytearray | memoryview]:
        """(api key, version, frame without its length) of the oldest request in flight.

        With a ``frame_pool`` the frame is received into one of its regions, reused for a
        later frame only once every view of this one has been released; else into a fresh
        ``bytearray``."""
        correlation_id, api_key, version = self._in_flight.popleft()
        self._receive_into(self._size_view)
        (size,) = _INT32.unpack(self._size_view)
        if self._frame_pool is None:
            frame = bytearray(size)
        else:
            frame = memoryview(self._frame_pool.take(size))[:size]
        self._receive_into(memoryview(frame))
        (received_id,) = _INT32.unpack_from(frame)
        if received_id != correlation_id:
            raise WireClientError(
                f"response correlation id {received_id} from {self.address}, "
                f"expected {correlation_id}")
        return api_key, version, frame

    def receive(self):
        """The kio entity of the oldest request's response."""
        api_key, version, frame = self.receive_frame()
        return wire.decode_response(api_key, version, bytes(frame))[1]

    def request(self, api_key: int, version: int, body):
        """Send one request and decode its response with kio (not for Fetch: its records
        should stay a view of the frame)."""
        self.send(api_key, version, body)
        return self.receive()

    def _receive_into(self, view: memoryview) -> None:
        size = len(view)
        received = 0
        while received < size:
            count = self._socket.recv_into(view[received:], size - received)
            if count == 0:
                raise ConnectionError(f"broker {self.address} closed the connection")
            received += count

    def close(self) -> None:
        self._socket.close()


def connect_any(servers: tuple[tuple[str, int], ...], client_id: str, timeout_s: float,
                **socket_options) -> BrokerConnection:
    """A connection to the first reachable server; ConnectionError naming every failure."""
    failures = []
    for address in servers:
        try:
            return BrokerConnection(address, client_id, timeout_s, **socket_options)
        except OSError as error:
            failures.append(f"{address[0]}:{address[1]}: {error}")
    raise ConnectionError("no bootstrap server reachable: " + "; ".join(failures))
