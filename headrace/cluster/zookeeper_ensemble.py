"""A local ZooKeeper ensemble of 1 or 3 (any N) nodes on 127.0.0.1: ``ZooKeeperEnsemble``.

Owns the nodes' generated configs, data directories and JVM processes, for
``headrace cluster up`` and the cluster tests. The JVM is Debian's ``zookeeper`` package run as
a plain process (no system service): ``java -cp <classpath> QuorumPeerMain <node>/zoo.cfg``.

Files under ``base_dir``, per node N (1-based, ZooKeeper's ``myid``)::

    node-N/zoo.cfg        tickTime, initLimit/syncLimit, dataDir, clientPort, server.M lines,
                          4lw.commands.whitelist=srvr,ruok,cons, admin.enableServer=false
    node-N/data/myid      N
    node-N/zookeeper.log  the JVM's stdout and stderr (slf4j-simple logs to stderr)

A node of a single-node ensemble runs standalone (no ``server.M`` lines). Ports are picked free
on ``host`` at construction (client, quorum peer and leader election port per node) and kept
across restarts. Each JVM runs in its own session (process group) with a small heap; the
ensemble kills its nodes by pid only. ``start`` waits, bounded by ``start_timeout_ms``, until every
node serves: each node is asked ``srvr`` (a four-letter word) and answers ``Mode: leader``,
``follower`` or ``standalone`` once it serves. ``node_serving_session`` asks ``cons`` which
node a client session is connected to.

Thread-safety: none; one owner thread drives an ensemble (a test fixture, the ``cluster up``
command). Processes left running at interpreter exit are killed (``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

JAVA = "java"
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# zookeeper.jar's manifest Class-Path names its dependencies (slf4j-api, netty, jetty, ...);
# slf4j-simple is the logging binding, to stderr (without one slf4j drops every log line).
SLF4J_BINDING_JAR = Path("/usr/share/java/slf4j-simple.jar")
ZOOKEEPER_CONF_DIR = Path("/etc/zookeeper/conf")
QUORUM_PEER_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
DEFAULT_TICK_TIME_MS = 500
DEFAULT_HEAP_MB = 64
DEFAULT_START_TIMEOUT_MS = 60_000
STOP_TIMEOUT_MS = 10_000
FOUR_LETTER_WORD_TIMEOUT_MS = 1000
POLL_INTERVAL_MS = 100
SERVING_MODES = ("leader", "follower", "standalone")


class ZooKeeperEnsembleError(RuntimeError):
    """The ensemble could not be started (no Java or jar, a node exited, no quorum in time)."""


@dataclass(frozen=True, slots=True)
class NodePorts:
    client_port: int
    peer_port: int
    election_port: int


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` right now (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def zookeeper_classpath() -> str:
    """The classpath Debian's zkEnv.sh uses, plus the slf4j binding when installed."""
    if not ZOOKEEPER_JAR.exists():
        raise ZooKeeperEnsembleError(
            f"{ZOOKEEPER_JAR} not found: install Debian's zookeeper package "
            "(scripts/install-system-deps.sh)")
    entries = [str(ZOOKEEPER_CONF_DIR), str(ZOOKEEPER_JAR)]
    if SLF4J_BINDING_JAR.exists():
        entries.append(str(SLF4J_BINDING_JAR))
    return ":".join(entries)


def four_letter_word(host: str, port: int, word: str,
                     timeout_ms: int = FOUR_LETTER_WORD_TIMEOUT_MS) -> str:
    """ZooKeeper's answer to a four-letter word (``srvr``, ``ruok``); '' when unreachable."""
    try:
        with socket.create_connection((host, port), timeout=timeout_ms / 1000) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def server_mode(host: str, port: int) -> str | None:
    """``leader``/``follower``/``standalone`` from ``srvr``; None when the node does not serve."""
    for line in four_letter_word(host, port, "srvr").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def wait_while_running(condition: Callable[[], bool],
                       processes: Mapping[int, subprocess.Popen], timeout_ms: int,
                       failure: str, error: type[Exception]) -> None:
    """Poll ``condition`` every ``POLL_INTERVAL_MS`` until it holds; raise ``error`` when one
    of ``processes`` (id -> process) exits first or ``timeout_ms`` passes."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not condition():
        exited = {key: process.returncode for key, process in processes.items()
                  if process.poll() is not None}
        if exited:
            raise error(f"{failure}: exited (id: status) {exited}")
        if time.monotonic() > deadline:
            raise error(f"{failure}: not within {timeout_ms} ms")
        time.sleep(POLL_INTERVAL_MS / 1000)


class ZooKeeperEnsemble:
    """``size`` ZooKeeper nodes on ``host``, ids 1..size. ``start()`` then ``stop()``, or use
    it as a context manager."""

    def __init__(self, base_dir: Path, size: int = 3, host: str = "127.0.0.1",
                 tick_time_ms: int = DEFAULT_TICK_TIME_MS, heap_mb: int = DEFAULT_HEAP_MB,
                 start_timeout_ms: int = DEFAULT_START_TIMEOUT_MS) -> None:
        if size < 1:
            raise ValueError(f"an ensemble needs at least one node, not {size}")
        self.base_dir = Path(base_dir)
        self.size = size
        self.host = host
        self.tick_time_ms = tick_time_ms
        self.heap_mb = heap_mb
        self.start_timeout_ms = start_timeout_ms
        ports = free_ports(host, 3 * size)
        self.ports = {node: NodePorts(*ports[3 * (node - 1): 3 * node])
                      for node in self.node_ids}
        self._processes: dict[int, subprocess.Popen] = {}
        atexit.register(self._kill_all)

    # --- addresses -----------------------------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.size + 1))

    @property
    def connect_string(self) -> str:
        """``host:port,...`` of every node (append a chroot for ``zookeeper.connect``)."""
        return ",".join(f"{self.host}:{self.ports[node].client_port}" for node in self.node_ids)

    @property
    def pids(self) -> dict[int, int]:
        """Node id -> pid of its JVM, for the nodes running (started and not exited)."""
        return {node: process.pid for node, process in self._processes.items()
                if process.poll() is None}

    def node_dir(self, node: int) -> Path:
        return self.base_dir / f"node-{node}"

    def node_serving_session(self, session_id: int) -> int | None:
        """The node a client session is connected to (from ``cons``), None when none is."""
        marker = f"sid=0x{session_id:x},"
        for node in self.pids:
            if marker in four_letter_word(self.host, self.ports[node].client_port, "cons"):
                return node
        return None

    def mode(self, node: int) -> str | None:
        """The node's ``srvr`` mode (leader/follower/standalone), None when not serving."""
        return server_mode(self.host, self.ports[node].client_port)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> ZooKeeperEnsemble:
        """Write the configs, start every node, wait until every node serves."""
        classpath = zookeeper_classpath()
        for node in self.node_ids:
            self._write_config(node)
        for node in self.node_ids:
            self._launch(node, classpath)
        self.wait_until_all_serve(self.start_timeout_ms)
        return self

    def stop(self) -> None:
        """SIGTERM every node, SIGKILL what is left after ``STOP_TIMEOUT_MS``."""
        for process in self._processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)  # a paused node cannot exit
                    process.terminate()
        for process in self._processes.values():
            try:
                process.wait(timeout=STOP_TIMEOUT_MS / 1000)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()

    def kill(self, node: int) -> None:
        """SIGKILL one node (its data directory stays; ``restart`` brings it back)."""
        process = self._processes.pop(node)
        process.kill()
        process.wait()

    def pause(self, node: int) -> None:
        """SIGSTOP one node: it keeps its sockets but answers nothing."""
        os.kill(self._processes[node].pid, signal.SIGSTOP)

    def resume(self, node: int) -> None:
        os.kill(self._processes[node].pid, signal.SIGCONT)

    def restart(self, node: int, timeout_ms: int | None = None) -> None:
        """Start a killed node again (same config and data) and wait until it serves."""
        if node in self._processes:
            self.kill(node)
        self._launch(node, zookeeper_classpath())
        self._wait(lambda: self.mode(node) in SERVING_MODES, timeout_ms,
                   f"ZooKeeper node {node} did not serve again")

    def wait_until_all_serve(self, timeout_ms: int | None = None) -> None:
        """Wait until every running node serves (leader, follower or standalone)."""
        self._wait(lambda: all(self.mode(node) in SERVING_MODES for node in self.pids),
                   timeout_ms, "not every ZooKeeper node serves")

    def wait_for_quorum(self, timeout_ms: int | None = None) -> None:
        """Wait until a majority of nodes serve (a standalone node alone is a quorum)."""
        majority = self.size // 2 + 1
        self._wait(lambda: sum(self.mode(node) in SERVING_MODES for node in self.pids)
                   >= majority, timeout_ms, "no ZooKeeper quorum")

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # --- internals -----------------------------------------------------------------------

    def _write_config(self, node: int) -> None:
        data_dir = self.node_dir(node) / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "myid").write_text(f"{node}\n")
        lines = [
            f"tickTime={self.tick_time_ms}",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={data_dir}",
            f"clientPortAddress={self.host}",
            f"clientPort={self.ports[node].client_port}",
            "maxClientCnxns=0",
            "4lw.commands.whitelist=srvr,ruok,cons",
            "admin.enableServer=false",
            "autopurge.purgeInterval=0",
        ]
        if self.size > 1:
            lines += [f"server.{peer}={self.host}:{ports.peer_port}:{ports.election_port}"
                      for peer, ports in self.ports.items()]
        (self.node_dir(node) / "zoo.cfg").write_text("\n".join(lines) + "\n")

    def _launch(self, node: int, classpath: str) -> None:
        log_file = open(self.node_dir(node) / "zookeeper.log", "ab")  # noqa: SIM115
        try:
            command = [JAVA, f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC",
                       "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath,
                       QUORUM_PEER_MAIN, str(self.node_dir(node) / "zoo.cfg")]
            self._processes[node] = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True)
        except FileNotFoundError as error:
            raise ZooKeeperEnsembleError(f"cannot run {JAVA}: {error}") from None
        finally:
            log_file.close()

    def _wait(self, condition, timeout_ms: int | None, failure: str) -> None:
        wait_while_running(condition, self._processes, timeout_ms or self.start_timeout_ms,
                           f"{failure} (see {self.base_dir}/node-*/zookeeper.log)",
                           ZooKeeperEnsembleError)

    def _kill_all(self) -> None:
        for process in self._processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                    process.wait()
