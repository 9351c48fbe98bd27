"""Accepting connections: the listening socket, Kafka's connection limits, and back-off when the
process is out of file descriptors.

Owns ``Acceptor``, which accepts on a non-blocking listening socket watched with
``loop.add_reader`` and hands each accepted socket to ``loop.connect_accepted_socket`` (the same
on the default loop and on uvloop, whose servers accept internally and cannot be paused).

Limits, with Kafka's names, defaults and behaviour (``ConnectionQuotas``), read at every accept
so that a dynamic change applies to the next connection:

* ``max.connections.per.ip`` (default 2147483647) and ``max.connections.per.ip.overrides``
  (``host:count,...``; hosts as IP addresses or names, resolved when the value is read): a
  connection over its address's limit is accepted and closed at once.
* ``max.connections`` (default 2147483647): while that many connections are open the broker
  stops accepting -- new connections wait in the listen backlog -- until one closes.

``accept()`` failing for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) stops accepting for
``ACCEPT_BACKOFF_MS`` and then tries again; the failure is logged as one line without a traceback,
at most once per ``ACCEPT_FAILURE_LOG_INTERVAL_MS`` with the number of failed attempts since the
last line. Rejections for the per-address limit are logged the same way. (asyncio's own server
logs a traceback per failure; uvloop's logs one per attempt without pausing.)

Runs on the event loop thread only; not thread-safe.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Mapping

from headrace.broker.rate_limited_log import RateLimitedLog
from headrace.errors import InvalidConfig

log = logging.getLogger(__name__)

ACCEPT_BACKOFF_MS = 1000  # as asyncio's ACCEPT_RETRY_DELAY
ACCEPT_FAILURE_LOG_INTERVAL_MS = 5000
MAX_ACCEPTS_PER_WAKEUP = 128  # then the loop serves other sockets before accepting more
OUT_OF_RESOURCES_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def parse_per_ip_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``host:count,host:count`` -> {address: count}
    (InvalidConfig for an entry that is not ``host:count``; names resolve to their address)."""
    overrides: dict[str, int] = {}
    for entry in (item.strip() for item in text.split(",")):
        if not entry:
            continue
        host, separator, count = entry.rpartition(":")
        if not separator or not host or not count.strip().lstrip("-").isdigit():
            raise InvalidConfig(f"Invalid value {text} for configuration "
                                "max.connections.per.ip.overrides: expected host:count pairs")
        overrides[_address_of(host.strip().strip("[]"))] = int(count)
    return overrides


def _address_of(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return host  # unresolvable now: matched as written


class Acceptor:
    """Accepts on ``listener`` and starts ``make_protocol(on_closed)`` for each admitted socket;
    the protocol calls ``on_closed()`` once from ``connection_lost``."""

    def __init__(self, listener: socket.socket, config, make_protocol: Callable[
            [Callable[[], None]], asyncio.BaseProtocol]) -> None:
        self.listener = listener
        self.config = config
        self.make_protocol = make_protocol
        self.open_connections = 0
        self.connections_by_address: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self._backoff: asyncio.TimerHandle | None = None
        self._closed = False
        self._failures = RateLimitedLog(log, ACCEPT_FAILURE_LOG_INTERVAL_MS)
        self._rejections = RateLimitedLog(log, ACCEPT_FAILURE_LOG_INTERVAL_MS)
        self._pending: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.listener.setblocking(False)
        self._resume()

    def close(self) -> None:
        self._closed = True
        self._pause()
        if self._backoff is not None:
            self._backoff.cancel()
        self.listener.close()

    def config_changed(self) -> None:
        """A limit may have been raised: accept again if the broker-wide one allows it."""
        if not self._accepting and self._backoff is None:
            self._resume()

    # --- accepting -----------------------------------------------------------------------

    def _resume(self) -> None:
        if self._closed or self._accepting or self._at_max_connections():
            return
        self._accepting = True
        self._loop.add_reader(self.listener.fileno(), self._accept_ready)

    def _pause(self) -> None:
        if self._accepting:
            self._accepting = False
            self._loop.remove_reader(self.listener.fileno())

    def _accept_ready(self) -> None:
        for _ in range(MAX_ACCEPTS_PER_WAKEUP):
            if not self._accepting:
                return
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in OUT_OF_RESOURCES_ERRNOS:
                    self._back_off(error)
                    return
                log.debug("accepting a connection failed: %s", error)  # the peer gave up
                continue
            self._admit(sock, address[0])

    def _back_off(self, error: OSError) -> None:
        self._failures.event(logging.WARNING, "accepting connections failed: %s; trying again "
                             "in %d ms", error.strerror, ACCEPT_BACKOFF_MS)
        self._pause()
        self._backoff = self._loop.call_later(ACCEPT_BACKOFF_MS / 1000, self._end_backoff)

    def _end_backoff(self) -> None:
        self._backoff = None
        self._resume()

    def _admit(self, sock: socket.socket, address: str) -> None:
        count = self.connections_by_address.get(address, 0)
        limit = self._per_ip_limit(address)
        if count >= limit:
            self._rejections.event(logging.INFO, "closed a new connection from %s: %d open "
                                   "already, its max.connections.per.ip", address, limit)
            sock.close()
            return
        self.connections_by_address[address] = count + 1
        self.open_connections += 1
        if self._at_max_connections():
            self._pause()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        slot = _Slot(self, address)
        task = self._loop.create_task(
            self._loop.connect_accepted_socket(lambda: self.make_protocol(slot.release), sock))
        self._pending.add(task)
        task.add_done_callback(lambda done: self._connected(done, sock, slot))

    def _connected(self, task: asyncio.Task, sock: socket.socket, slot: _Slot) -> None:
        self._pending.discard(task)
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.warning("setting up a connection failed: %s", task.exception())
            sock.close()
            slot.release()

    def _released(self, address: str) -> None:
        self.open_connections -= 1
        count = self.connections_by_address.get(address, 0) - 1
        if count > 0:
            self.connections_by_address[address] = count
        else:
            self.connections_by_address.pop(address, None)
        if self._backoff is None:
            self._resume()

    # --- limits --------------------------------------------------------------------------

    def _at_max_connections(self) -> bool:
        return self.open_connections >= self.config.get_int("max.connections")

    def _per_ip_limit(self, address: str) -> int:
        overrides = _overrides(self.config.get("max.connections.per.ip.overrides") or "")
        return overrides.get(address, self.config.get_int("max.connections.per.ip"))


_parsed_overrides: dict[str, Mapping[str, int]] = {}


def _overrides(text: str) -> Mapping[str, int]:
    """Parsed once per distinct value (names are resolved then)."""
    parsed = _parsed_overrides.get(text)
    if parsed is None:
        _parsed_overrides.clear()
        parsed = _parsed_overrides[text] = parse_per_ip_overrides(text)
    return parsed


class _Slot:
    """One admitted connection's place in the counts, given back exactly once."""

    __slots__ = ("_acceptor", "_address")

    def __init__(self, acceptor: Acceptor, address: str) -> None:
        self._acceptor: Acceptor | None = acceptor
        self._address = address

    def release(self) -> None:
        if self._acceptor is not None:
            acceptor, self._acceptor = self._acceptor, None
            acceptor._released(self._address)


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket (SO_REUSEADDR, as asyncio's servers)."""
    family, kind, protocol, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
