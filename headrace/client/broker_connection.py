"""headrace's one blocking Kafka wire client: a socket to one broker, used by the command line
and by the Spark executors' fetch and produce clients.

Owns ``BrokerConnection`` -- one blocking PLAINTEXT socket to one broker:

- connect within ``connect_timeout_ms`` (default: the request timeout); every later send and
  receive waits at most ``request_timeout_ms`` (``TimeoutError``, an ``OSError``);
- ApiVersions v0 when it opens (every Kafka broker answers v0, so no fallback is needed), then
  ``version_for`` picks the highest version of an API both sides support, or raises
  ``UnsupportedVersion``;
- requests are kio entities encoded through ``headrace.protocol.wire`` (request header v1, or
  v2 for flexible versions; ``request_values`` builds the entity from plain values), or
  ready frame pieces (``request_header`` + ``send_pieces``: a hand-encoded prefix and record
  batches sent with one ``sendmsg`` without joining them);
- correlation ids count up from 0; several requests may be in flight (Kafka answers a
  connection's requests in the order they were sent) and each response must carry the id of
  the oldest one;
- responses are length-prefixed frames of at most ``max_response_bytes``; received as raw
  frames (``receive_frame``: into a fresh ``bytearray``, or into a region of the
  ``frame_pool`` given, a ``headrace.protocol.buffers.RegionPool``) or decoded by kio
  (``receive``, ``request``).

Errors: the network's are ``OSError`` (``ConnectionError`` when the broker closes the socket,
``TimeoutError``), so callers retry them as Kafka's clients retry a lost connection; a
response this client cannot use -- announced larger than ``max_response_bytes`` or negative,
out of order, undecodable -- is ``WireClientError`` (a ``headrace.errors.KafkaError``) and
closes the connection, whose byte stream can no longer be trusted.

Also the option helpers the clients share: ``parse_servers`` (``bootstrap.servers``),
``first_option`` (Kafka's option name first, then librdkafka's spelling),
``check_plaintext`` and ``connect_any`` (the first reachable bootstrap server); and
``receive_exactly`` / ``receive_frame_bytes`` for callers (tests) holding a bare socket.

Not thread-safe: one connection belongs to one client at a time.
"""

from __future__ import annotations

import select
import socket
import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

from headrace.errors import KafkaError, UnsupportedVersion, error_for_code
from headrace.protocol import wire
from headrace.protocol.buffers import RegionPool

API_VERSIONS_KEY = 18
API_VERSIONS_VERSION = 0  # the version every broker answers
NO_ERROR = 0
DEFAULT_KAFKA_PORT = 9092
DEFAULT_REQUEST_TIMEOUT_MS = 30_000  # the Java client's request.timeout.ms
# The largest response accepted: above the Spark fetch client's fetch.max.bytes (64 MiB) plus
# one record batch as large as a broker with the default socket.request.max.bytes (100 MiB)
# can have stored (KIP-74 returns a first batch whole, whatever fetch.max.bytes says).
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024
SENDMSG_MAX_PIECES = 512  # well under the kernel's IOV_MAX (1024)
FRAME_LENGTH_BYTES = 4

_INT32 = struct.Struct(">i")


class WireClientError(KafkaError):
    """The cluster cannot be reached or answered something this client cannot use."""


class ResponseTooLarge(WireClientError):
    """A response announced more than ``max_response_bytes`` (or a negative size)."""


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
    """Refuse any ``security.protocol`` but PLAINTEXT (the only one this client speaks)."""
    protocol = options.get("security.protocol", "PLAINTEXT").upper()
    if protocol != "PLAINTEXT":
        raise WireClientError(f"security.protocol {protocol} is not supported by the {client}")


def request_header_bytes(api_key: int, version: int, correlation_id: int, client_id: str,
                         flexible: bool) -> bytes:
    """A request header: v1, or v2 (an empty tagged-field section added) when ``flexible``."""
    encoded = client_id.encode()
    header = struct.pack(">hhih", api_key, version, correlation_id, len(encoded)) + encoded
    return header + b"\x00" if flexible else header


def receive_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ConnectionError if the peer closes first."""
    size = len(view)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:], size - received)
        if count == 0:
            raise ConnectionError("the broker closed the connection")
        received += count


def receive_frame_bytes(sock: socket.socket,
                        max_frame_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> bytearray:
    """One length-prefixed frame from ``sock``, without its length; ResponseTooLarge when it
    announces more than ``max_frame_bytes`` or a negative size."""
    size_view = memoryview(bytearray(FRAME_LENGTH_BYTES))
    receive_exactly(sock, size_view)
    frame = bytearray(checked_frame_size(size_view, max_frame_bytes))
    receive_exactly(sock, memoryview(frame))
    return frame


def checked_frame_size(size_bytes: memoryview | bytes, max_frame_bytes: int) -> int:
    (size,) = _INT32.unpack(size_bytes)
    if not 0 <= size <= max_frame_bytes:
        raise ResponseTooLarge(f"response of {size} bytes announced; at most "
                               f"{max_frame_bytes} accepted")
    return size


class BrokerConnection:
    """One blocking socket to one broker, with the API versions it supports."""

    def __init__(self, address: tuple[str, int], client_id: str, *,
                 request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 connect_timeout_ms: int | None = None,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 negotiate_api_versions: bool = True,
                 receive_buffer_bytes: int | None = None,
                 send_buffer_bytes: int | None = None,
                 frame_pool: RegionPool | None = None) -> None:
        self.address = address
        self.max_response_bytes = max_response_bytes
        self._frame_pool = frame_pool
        self._size_view = memoryview(bytearray(FRAME_LENGTH_BYTES))
        self._client_id = client_id
        self._socket = socket.create_connection(
            address, timeout=(connect_timeout_ms or request_timeout_ms) / 1000)
        self._socket.settimeout(request_timeout_ms / 1000)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if receive_buffer_bytes:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        if send_buffer_bytes:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        self._next_correlation_id = 0
        self._in_flight: deque[tuple[int, int, int]] = deque()  # correlation id, key, version
        self.api_versions: dict[int, tuple[int, int]] = {}
        if negotiate_api_versions:
            self._negotiate_api_versions()

    def _negotiate_api_versions(self) -> None:
        try:
            response = self.request_values(API_VERSIONS_KEY, API_VERSIONS_VERSION, {})
            if int(response.error_code) != NO_ERROR:
                raise error_for_code(int(response.error_code),
                                     f"ApiVersions failed on {self.address_text}")
        except BaseException:
            self.close()
            raise
        self.api_versions = {item.api_key: (item.min_version, item.max_version)
                             for item in response.api_keys}

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def address_text(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def socket(self) -> socket.socket:
        """The socket itself, for callers that write raw bytes (tests of malformed frames)."""
        return self._socket

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
        """The highest version of ``api_key`` in ``client_range`` the broker supports."""
        broker_min, broker_max = self.api_versions.get(api_key, (0, -1))
        version = min(broker_max, client_range[1])
        if version < max(broker_min, client_range[0]):
            raise UnsupportedVersion(
                f"broker {self.address_text} supports api {api_key} v{broker_min}-v{broker_max}, "
                f"this client v{client_range[0]}-v{client_range[1]}")
        return version

    def _take_correlation_id(self, api_key: int, version: int) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id += 1
        self._in_flight.append((correlation_id, api_key, version))
        return correlation_id

    def send(self, api_key: int, version: int, body: Any) -> int:
        """Send the kio entity ``body``; returns the request's correlation id."""
        correlation_id = self._next_correlation_id
        frame = wire.encode_request(api_key, version, correlation_id, self._client_id, body)
        self._socket.sendall(frame)
        return self._take_correlation_id(api_key, version)

    def send_values(self, api_key: int, version: int, values: dict[str, Any]) -> int:
        """Send a request built from plain values (``wire.build``)."""
        return self.send(api_key, version,
                         wire.build(wire.request_class(api_key, version), values))

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
        receive_exactly(self._socket, self._size_view)
        size = self._checked_size()
        if self._frame_pool is None:
            frame = bytearray(size)
        else:
            frame = memoryview(self._frame_pool.take(size))[:size]
        receive_exactly(self._socket, memoryview(frame))
        if size < _INT32.size:
            self.close()
            raise WireClientError(f"response of {size} bytes from {self.address_text} is "
                                  "shorter than its header")
        (received_id,) = _INT32.unpack_from(frame)
        if received_id != correlation_id:
            self.close()
            raise WireClientError(
                f"response correlation id {received_id} from {self.address_text}, "
                f"expected {correlation_id}")
        return api_key, version, frame

    def _checked_size(self) -> int:
        try:
            return checked_frame_size(self._size_view, self.max_response_bytes)
        except ResponseTooLarge as error:
            self.close()
            raise ResponseTooLarge(f"broker {self.address_text}: {error}") from None

    def receive(self) -> Any:
        """The kio entity of the oldest request's response."""
        api_key, version, frame = self.receive_frame()
        try:
            return wire.decode_response(api_key, version, bytes(frame))[1]
        except (KafkaError, ValueError, IndexError, struct.error) as error:
            self.close()
            raise WireClientError(f"undecodable api {api_key} v{version} response from "
                                  f"{self.address_text}: {error}") from None

    def request(self, api_key: int, version: int, body: Any) -> Any:
        """Send one request and decode its response with kio (not for Fetch: its records
        should stay a view of the frame)."""
        self.send(api_key, version, body)
        return self.receive()

    def request_values(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        """``request`` with the body built from plain values (``wire.build``)."""
        self.send_values(api_key, version, values)
        return self.receive()

    def close(self) -> None:
        self._socket.close()


def connect_any(servers: tuple[tuple[str, int], ...], client_id: str,
                **connection_options: Any) -> BrokerConnection:
    """A connection to the first reachable server; ConnectionError naming every failure."""
    failures = []
    for address in servers:
        try:
            return BrokerConnection(address, client_id, **connection_options)
        except OSError as error:
            failures.append(f"{address[0]}:{address[1]}: {error}")
    raise ConnectionError("no bootstrap server reachable: " + "; ".join(failures))
