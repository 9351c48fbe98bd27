"""Connection memory and limits against a real broker process: frames that announce more than
they send, ``queued.max.request.bytes``, the idle timeout against trickled frames,
``max.connections`` and ``max.connections.per.ip``, and accept() out of file descriptors.

What the broker has read from a socket is observed in the kernel (``/proc/net/tcp``: the
receive queue of the broker's end of each connection), its memory in ``/proc/<pid>/status``.
"""

from __future__ import annotations

import re
import resource
import select
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headrace.client.broker_connection import receive_frame_bytes
from headrace.protocol import wire
from tests.broker.raw_client import RawClient
from tests.broker.test_cleaner_live import _wait_until as wait_until
from tests.conftest import BrokerProcess

API_VERSIONS = 18
MAX_FRAME_BYTES = 104857600  # socket.request.max.bytes
WAIT_TIMEOUT_S = 30.0


@pytest.fixture
def start_broker(tmp_path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def start(**overrides: str) -> BrokerProcess:
        data_dir = tmp_path / f"data{len(started)}"
        data_dir.mkdir()
        process = BrokerProcess(data_dir, overrides)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


def resident_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024


def unread_bytes(broker_port: int, client: socket.socket) -> int | None:
    """Bytes the kernel holds for the broker's end of ``client``'s connection that the broker
    has not read yet (None: no such connection, e.g. not accepted yet)."""
    client_port = client.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        remote_port = int(fields[2].split(":")[1], 16)
        if (local_port, remote_port) == (broker_port, client_port):
            return int(fields[4].split(":")[1], 16)
    return None


def wait_all_read(broker: BrokerProcess, client: socket.socket) -> None:
    wait_until(lambda: unread_bytes(broker.port, client) == 0, "the broker read every byte")


def connect(broker: BrokerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", broker.port), timeout=WAIT_TIMEOUT_S)


def api_versions_frame(correlation_id: int, padding_bytes: int = 0) -> bytes:
    """An ApiVersions v0 request, its frame ``padding_bytes`` longer than its body (trailing
    bytes after a body are ignored)."""
    body = wire.build(wire.request_class(API_VERSIONS, 0), {})
    frame = wire.encode_request(API_VERSIONS, 0, correlation_id, "limits", body)
    return struct.pack(">i", len(frame) - 4 + padding_bytes) + frame[4:] + bytes(padding_bytes)


def answered(client: RawClient) -> bool:
    body = client.request(API_VERSIONS, 0, {})
    return body.error_code == 0


def closed_by_broker(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the broker closes ``sock`` within ``timeout_s`` (it sends nothing before)."""
    readable, _, _ = select.select([sock], [], [], timeout_s)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# --- memory grows only with received bytes --------------------------------------------------

def test_frames_announcing_the_maximum_size_hold_only_the_bytes_sent(start_broker):
    broker = start_broker()
    connections, sent_bytes_each = 10, 1000
    idle_rss = resident_bytes(broker.pid)
    clients = [connect(broker) for _ in range(connections)]
    for client in clients:
        client.sendall(struct.pack(">i", MAX_FRAME_BYTES) + b"x" * sent_bytes_each)
    for client in clients:
        wait_all_read(broker, client)
    growth = resident_bytes(broker.pid) - idle_rss
    # received bytes, plus each connection's receive buffer and objects, within 32 MiB
    assert growth < connections * sent_bytes_each + 32 * 1024 * 1024, growth
    for client in clients:
        client.close()


# --- queued.max.request.bytes ---------------------------------------------------------------

def test_reading_pauses_at_queued_max_request_bytes_and_resumes_once_requests_drain(start_broker):
    limit_bytes = 1024 * 1024
    broker = start_broker(**{"queued.max.request.bytes": str(limit_bytes)})
    large = api_versions_frame(1, padding_bytes=4 * limit_bytes)
    half = 4 + 2 * limit_bytes
    with connect(broker) as big, RawClient(broker.bootstrap) as small:
        assert answered(small)
        big.sendall(large[:half])  # over the limit, still partial: the broker holds it
        wait_all_read(broker, big)
        small.send(API_VERSIONS, 0, {})
        for position in (half, half + 1):  # two more loop turns in which ``small`` was readable
            big.sendall(large[position:position + 1])
            wait_all_read(broker, big)
        assert unread_bytes(broker.port, small.sock) > 0  # paused: its request is not read
        big.sendall(large[half + 2:])  # the oldest partial frame may complete
        (correlation_id,) = struct.unpack(">i", _receive_frame(big)[:4])
        assert correlation_id == 1
        _, body = wire.decode_response(API_VERSIONS, 0, small.receive_frame())  # resumed
        assert body.error_code == 0


def _receive_frame(sock: socket.socket) -> bytes:
    return bytes(receive_frame_bytes(sock))


# --- the idle timeout is not defeated by trickling ------------------------------------------

def test_a_frame_trickled_a_byte_at_a_time_is_closed_after_connections_max_idle_ms(start_broker):
    idle_ms = 1000
    broker = start_broker(**{"connections.max.idle.ms": str(idle_ms)})
    trickle_interval_s, max_bytes = 0.1, 300  # 30 s of trickling at most
    with connect(broker) as client:
        client.sendall(struct.pack(">i", MAX_FRAME_BYTES))
        for _ in range(max_bytes):
            client.sendall(b"x")
            if closed_by_broker(client, trickle_interval_s):
                break
        else:
            pytest.fail(f"a frame trickled for {max_bytes * trickle_interval_s:.0f} s is still open")
    assert "idle for more than" in broker.log_text()


# --- max.connections.per.ip and max.connections ---------------------------------------------

@pytest.mark.parametrize("overrides", [
    {"max.connections.per.ip": "2"},
    {"max.connections.per.ip": "100", "max.connections.per.ip.overrides": "127.0.0.1:2"},
], ids=["per-ip", "per-ip-override"])
def test_a_connection_over_max_connections_per_ip_is_closed_at_once(start_broker, overrides):
    broker = start_broker(**overrides)
    first, second = admitted_clients(broker, 2)
    with connect(broker) as third:
        third.sendall(api_versions_frame(1))
        assert closed_by_broker(third, WAIT_TIMEOUT_S)
    assert "closed a new connection from 127.0.0.1" in broker.log_text()
    first.close()
    wait_until(_answers_new_connection(broker), "a connection is admitted again")
    second.close()


def _answered_client(broker: BrokerProcess) -> Callable[[], RawClient | None]:
    """A new connection that the broker admitted and answered, or None."""
    def attempt() -> RawClient | None:
        client = RawClient(broker.bootstrap)
        try:
            if answered(client):
                return client
        except (ConnectionError, OSError):
            pass
        client.close()
        return None
    return attempt


def _answers_new_connection(broker: BrokerProcess) -> Callable[[], bool]:
    def attempt() -> bool:
        client = _answered_client(broker)()
        if client is None:
            return False
        client.close()
        return True
    return attempt


def admitted_clients(broker: BrokerProcess, count: int) -> list[RawClient]:
    """``count`` connections the broker serves (the start-up probe's connection may still
    count against a limit for a moment: its close is seen asynchronously)."""
    return [wait_until(_answered_client(broker), "a connection is admitted")
            for _ in range(count)]


def test_the_broker_stops_accepting_at_max_connections_until_one_closes(start_broker):
    broker = start_broker(**{"max.connections": "2"})
    first, second = admitted_clients(broker, 2)
    with connect(broker) as third:  # completes in the listen backlog
        third.sendall(api_versions_frame(7))
        for _ in range(5):  # loop turns in which an accepting broker would have served it
            assert answered(first)
        assert unread_bytes(broker.port, third) is None or unread_bytes(broker.port, third) > 0
        readable, _, _ = select.select([third], [], [], 0)
        assert not readable  # neither answered nor closed
        second.close()
        (correlation_id,) = struct.unpack(">i", _receive_frame(third)[:4])
        assert correlation_id == 7
    first.close()


# --- accept() out of file descriptors ------------------------------------------------------

def test_accept_out_of_file_descriptors_backs_off_quietly_and_recovers(start_broker):
    broker = start_broker(**{"log.initial.task.delay.ms": "0",
                             "log.flush.offset.checkpoint.interval.ms": "100"})
    checkpoint = broker.data_dir / "recovery-point-offset-checkpoint"
    wait_until(checkpoint.exists, "the broker wrote its first checkpoints")  # needs a descriptor
    with RawClient(broker.bootstrap) as existing:
        assert answered(existing)
        open_fds = len(list(Path(f"/proc/{broker.pid}/fd").iterdir()))
        soft, hard = resource.prlimit(broker.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (open_fds + 2, hard))
        clients = [connect(broker) for _ in range(8)]
        report = re.compile(r"accepting connections failed: .* \((\d+) times since the last")
        reports = wait_until(lambda: len(report.findall(broker.log_text())) >= 2 and
                             report.findall(broker.log_text()), "two reports of failing accepts")
        attempts_between_reports = int(reports[1])
        assert attempts_between_reports <= 10, attempts_between_reports  # 1 s back-off, 5 s apart
        assert answered(existing)  # the loop still serves its connections
        for client in clients:
            client.close()
        wait_until(_answers_new_connection(broker), "a new connection is served")
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert "Traceback" not in broker.log_text()


@pytest.mark.parametrize("overrides, message", [
    ({"max.connections.per.ip": "0"}, "can be set to zero only if"),
    ({"max.connections.per.ip.overrides": "127.0.0.1"}, "expected host:count pairs"),
])
def test_invalid_connection_limits_stop_the_broker_at_start(start_broker, overrides, message):
    with pytest.raises(RuntimeError, match=message):
        start_broker(**overrides)


def test_max_connections_per_ip_set_by_incremental_alter_configs_applies_to_new_connections(
        start_broker):
    broker = start_broker()
    first, second = admitted_clients(broker, 2)
    response = first.request(44, 0, {"resources": [{
        "resource_type": 4, "resource_name": "1", "configs": [
            {"name": "max.connections.per.ip", "config_operation": 0, "value": "2"}]}],
        "validate_only": False})
    assert [r.error_code for r in response.responses] == [0]
    with connect(broker) as third:
        third.sendall(api_versions_frame(1))
        assert closed_by_broker(third, WAIT_TIMEOUT_S)
    first.close()
    second.close()
