"""Sends ``wire_cases`` frames to a real broker process and watches it survive them.

Each case opens its own connection and sends its frame. A frame whose int32 length matches
its bytes is followed by a sentinel request (ApiVersions v0, correlation id
``SENTINEL_CORRELATION_ID``) and the responses are read until the sentinel's arrives or the
broker closes the connection; a frame whose length lies is followed by a write shutdown and
read until the broker closes. Outcomes: ``answered`` (the sentinel came back: the
connection survived the case), ``closed`` (the broker closed the connection, as Kafka does
for a request it cannot parse) or ``silent`` (nothing within ``case_timeout_s``). After a
``closed`` or ``silent`` case a fresh connection must get an ApiVersions answer, or the case
is a crash: its frame is saved as hex under ``out_dir`` (``crash-<seed>-<case>.hex``) and
the broker is restarted so the campaign goes on.

Anomalies that are not crashes are kept too, one reproducer per class: a handler's
traceback in the broker's log (matched to the case by the client port the log names; cases
run one at a time), an unmutated (valid) request whose connection is closed or never
answered, and a ``silent`` case.

After each batch: the process is alive, its resident memory (``VmRSS`` of
``/proc/<pid>/status``) is under ``rss_limit_bytes``, and a confluent-kafka producer and
consumer still round-trip a record through topic ``fuzz-health``.

Not thread-safe: one campaign drives one broker from one thread.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess
from tests.fuzz.wire_cases import FRAME_LENGTH_BYTES, FuzzCase, case_frame

SENTINEL_CORRELATION_ID = 0x5E471
API_VERSIONS_V0 = struct.pack(">hhihh", 18, 0, SENTINEL_CORRELATION_ID, 4, 0)[:-2] + b"fuzz"
SENTINEL_FRAME = struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0
HEALTH_TOPIC = "fuzz-health"
HEALTH_TIMEOUT_S = 30.0
HEALTH_POLL_S = 0.2
DEFAULT_CASE_TIMEOUT_S = 5.0
DEFAULT_RSS_LIMIT_BYTES = 1024 * 1024 * 1024
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
FUZZ_BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}
UNEXPECTED_ERROR = re.compile(
    r"unexpected error handling a request from 127\.0\.0\.1:(?P<port>\d+)\n"
    r"Traceback \(most recent call last\):\n(?:[ \t].*\n)*(?P<error>\S.*)")
CRASH_LINE = re.compile(r"memory allocation of|panicked at|Fatal Python error|Segmentation|"
                        r"AddressSanitizer|Aborted")


@dataclass
class Finding:
    kind: str  # crash, valid_request_closed, silent
    seed: int
    case: int
    api_key: int
    api_version: int
    mutations: tuple[str, ...]
    frame_hex: str
    detail: str = ""


@dataclass
class BatchReport:
    seed: int
    first_case: int
    cases: int
    outcomes: dict[str, int]
    crashes: int
    rss_bytes: int
    health_ok: bool
    seconds: float
    findings: list[Finding] = field(default_factory=list)
    health_error: str = ""


class BrokerLog:
    """Reads what a broker process appended to its log since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.position = path.stat().st_size if path.exists() else 0

    def new_text(self) -> str:
        with open(self.path, "rb") as log_file:
            log_file.seek(self.position)
            data = log_file.read()
        self.position += len(data)
        return data.decode(errors="replace")


def handler_exceptions(log_text: str) -> dict[int, str]:
    """Client port -> the exception line of each "unexpected error handling a request"
    traceback in ``log_text``."""
    found: dict[int, str] = {}
    for match in UNEXPECTED_ERROR.finditer(log_text):
        found[int(match.group("port"))] = match.group("error").strip()
    return found


def crash_message(log_text: str) -> str:
    """The line of a dying broker's log that says why (an allocation failure, a panic, a
    fatal signal), else its last line."""
    lines = [line for line in log_text.splitlines() if line.strip()]
    for line in lines:
        if CRASH_LINE.search(line):
            return line.strip()
    return lines[-1].strip() if lines else ""


def _receive_exactly(sock: socket.socket, count: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(count - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _read_until_sentinel(sock: socket.socket) -> str:
    """``answered`` once the sentinel's response is read, ``closed`` at end of stream."""
    while True:
        prefix = _receive_exactly(sock, FRAME_LENGTH_BYTES)
        if prefix is None:
            return "closed"
        (size,) = struct.unpack(">i", prefix)
        if size < 4 or size > MAX_RESPONSE_BYTES:
            raise AssertionError(f"broker sent a response frame of {size} bytes")
        body = _receive_exactly(sock, size)
        if body is None:
            return "closed"
        if struct.unpack_from(">i", body)[0] == SENTINEL_CORRELATION_ID:
            return "answered"


def send_case(port: int, case: FuzzCase, timeout_s: float) -> tuple[str, int]:
    """Send one case on a new connection: its outcome (answered, closed or silent) and the
    connection's local port (which the broker's log names)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        return _exchange(sock, case), sock.getsockname()[1]


def _exchange(sock: socket.socket, case: FuzzCase) -> str:
    try:
        if case.length_matches:
            sock.sendall(case.frame + SENTINEL_FRAME)
        else:
            sock.sendall(case.frame)
            sock.shutdown(socket.SHUT_WR)
        return _read_until_sentinel(sock)
    except TimeoutError:
        return "silent"
    except (ConnectionResetError, BrokenPipeError):
        return "closed"


def broker_answers(port: int, timeout_s: float) -> bool:
    """Whether a fresh connection gets an ApiVersions response."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(SENTINEL_FRAME)
            return _read_until_sentinel(sock) == "answered"
    except OSError:
        return False


def resident_bytes(pid: int) -> int:
    """VmRSS of a live process, in bytes (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def client_round_trip(bootstrap: str) -> None:
    """confluent-kafka produces one record to HEALTH_TOPIC and consumes it back."""
    value = uuid.uuid4().bytes
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "message.timeout.ms": int(HEALTH_TIMEOUT_S * 1000)})
    delivered = []
    producer.produce(HEALTH_TOPIC, value, partition=0,
                     on_delivery=lambda error, message: delivered.append((error, message)))
    producer.flush(HEALTH_TIMEOUT_S)
    if len(delivered) != 1 or delivered[0][0] is not None:
        raise AssertionError(f"health produce failed: {delivered}")
    offset = delivered[0][1].offset()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-health",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(HEALTH_TOPIC, 0, offset)])
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            message = consumer.poll(HEALTH_POLL_S)
            if message is None or message.error():
                continue
            if message.value() == value:
                return
        raise AssertionError(f"health record at offset {offset} was not consumed back")
    finally:
        consumer.close()


def create_health_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(HEALTH_TOPIC, 1, 1)])
    for future in futures.values():
        try:
            future.result(HEALTH_TIMEOUT_S)
        except Exception as error:  # already there after a restart: fine
            if "TOPIC_ALREADY_EXISTS" not in str(error):
                raise


class WireCampaign:
    """Runs seeded cases against ``broker`` in batches; see the module docstring."""

    def __init__(self, broker: BrokerProcess, seed: int, out_dir: Path,
                 rss_limit_bytes: int = DEFAULT_RSS_LIMIT_BYTES,
                 case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S,
                 restart_after_crash: bool = True) -> None:
        self.broker = broker
        self.seed = seed
        self.out_dir = out_dir
        self.rss_limit_bytes = rss_limit_bytes
        self.case_timeout_s = case_timeout_s
        self.restart_after_crash = restart_after_crash
        self.anomaly_classes_seen: set[str] = set()
        out_dir.mkdir(parents=True, exist_ok=True)
        self.log = BrokerLog(broker.log_path)
        create_health_topic(broker.bootstrap)

    def run_batch(self, first_case: int, cases: int) -> BatchReport:
        started = time.monotonic()
        outcomes: Counter[str] = Counter()
        findings: list[Finding] = []
        for index in range(first_case, first_case + cases):
            case = case_frame(self.seed, index)
            outcome, port = send_case(self.broker.port, case, self.case_timeout_s)
            outcomes[outcome] += 1
            findings += self._judge(case, outcome, port)
        for finding in findings:
            self._save(finding)
        rss = resident_bytes(self.broker.pid)
        health_error = self._health_error(rss)
        return BatchReport(self.seed, first_case, cases, dict(outcomes),
                           sum(f.kind == "crash" for f in findings), rss, not health_error,
                           round(time.monotonic() - started, 3), findings, health_error)

    def _judge(self, case: FuzzCase, outcome: str, port: int) -> list[Finding]:
        """Findings of a case just sent from ``port``: cases run one at a time, and the
        broker logs a handler's traceback before it closes the connection, so what the log
        says about ``port`` by now is about this case."""
        if outcome == "answered":
            return []
        if not broker_answers(self.broker.port, self.case_timeout_s):
            exit_status = self._exit_status()
            log_text = self.log.new_text()  # the restarted broker appends to the same log
            if self.restart_after_crash:
                self.broker.restart()
            return [*self._handler_exception(case, port, log_text),
                    self._finding("crash", case, f"{exit_status}: {crash_message(log_text)}")]
        findings = self._handler_exception(case, port, self.log.new_text())
        if not case.mutations and case.length_matches:
            findings += self._new_class(f"valid_request_{outcome}:{case.api_key}", case, "")
        if outcome == "silent":
            findings += self._new_class(f"silent:{case.api_key}:{','.join(case.mutations)}",
                                        case, "")
        return findings

    def _handler_exception(self, case: FuzzCase, port: int, log_text: str) -> list[Finding]:
        error = handler_exceptions(log_text).get(port)
        if error is None:
            return []
        return self._new_class(f"handler_exception:{case.api_key}:{error}", case, error)

    def _new_class(self, anomaly_class: str, case: FuzzCase, detail: str) -> list[Finding]:
        if anomaly_class in self.anomaly_classes_seen:
            return []
        self.anomaly_classes_seen.add(anomaly_class)
        return [self._finding(anomaly_class.split(":")[0], case, detail or anomaly_class)]

    def _finding(self, kind: str, case: FuzzCase, detail: str) -> Finding:
        return Finding(kind, case.seed, case.index, case.api_key, case.api_version,
                       case.mutations, case.frame.hex(), detail)

    def _exit_status(self) -> str:
        try:
            return f"exit status {self.broker.process.wait(self.case_timeout_s)}"
        except subprocess.TimeoutExpired:
            return "alive, not answering"

    def _save(self, finding: Finding) -> None:
        path = self.out_dir / f"{finding.kind}-{finding.seed}-{finding.case}.hex"
        path.write_text(finding.frame_hex + "\n")

    def _health_error(self, rss: int) -> str:
        """Why the broker is unhealthy after a batch, or "" if it is not."""
        if self.broker.process.poll() is not None or rss == 0:
            return f"broker exited with {self.broker.process.poll()}"
        if rss > self.rss_limit_bytes:
            return f"RSS {rss} bytes over the limit of {self.rss_limit_bytes}"
        try:
            client_round_trip(self.broker.bootstrap)
        except Exception as error:  # any client failure is an unhealthy broker
            return f"confluent-kafka round trip failed: {error!r}"
        return ""


def report_line(report: BatchReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)
