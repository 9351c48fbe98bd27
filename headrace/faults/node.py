"""Nodes under test: processes the harness starts, kills, pauses, resumes and restarts by pid.

``Node`` is the process mechanics (a command, an environment, a log file, a listening address
it is ready at); ``BrokerNode`` is a headrace broker on its own address and data directory.
``ZooKeeperNode`` is one JVM of a ZooKeeper ensemble on its own address (ports the same on
every address: ``ZOOKEEPER_CLIENT_PORT``, ``ZOOKEEPER_PEER_PORT``, ``ZOOKEEPER_ELECTION_PORT``).
With ``source_address_shim`` (``source_address_shim.c``) a node's outgoing connections leave
from its own address, so an iptables rule can cut chosen node pairs.

A node may run inside a ``Namespace`` (``ip netns exec``, which keeps the pid), under the
power-cut shim (``power_cut.py``: ``power_cut`` then leaves only what was fsynced), and with a
skewable clock: libfaketime preloaded, re-reading its offset from a control file every
second (``FAKETIME_TIMESTAMP_FILE`` with ``FAKETIME_CACHE_DURATION=1``: re-reading it on every
call, ``FAKETIME_NO_CACHE``, made each wall-clock read cost ~22 us and the broker's start-up
several seconds); monotonic clocks stay true (``FAKETIME_DONT_FAKE_MONOTONIC=1``), so
``set_clock_offset_s`` takes effect within a second, also across restarts. In that mode
libfaketime 0.9.10 fails Python's ``time.sleep`` (clock_nanosleep) with EINVAL; the broker
never sleeps that way. Control file format: one line, ``+N`` or ``-N`` seconds, libfaketime's
relative form.

Readiness: a TCP connection to the node's address succeeds (from inside its namespace), within
``start_timeout_s``. The log file collects the process's stdout and stderr across restarts.

Thread-safety: one thread drives a node (the runner's nemesis thread, or its main thread
while no nemesis runs).
"""

from __future__ import annotations

import glob
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from headrace.cluster.zookeeper_ensemble import QUORUM_PEER_MAIN, zookeeper_classpath
from headrace.faults.namespace import Namespace
from headrace.faults.power_cut import (
    CutOutcome,
    rebuild_after_power_cut,
    record_baseline,
    shadow_dir_of,
    shim_environment,
)

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
READY_PROBE_TIMEOUT_S = 1.0
READY_PROBE_INTERVAL_S = 0.05
SOURCE_ADDRESS_VARIABLE = "HEADRACE_SOURCE_ADDRESS"  # read by source_address_shim.c
LIBFAKETIME_GLOB = "/usr/lib/*/faketime/libfaketimeMT.so.1"


def libfaketime_path() -> Path | None:
    """Debian's faketime package's multi-threaded library, if installed."""
    found = sorted(glob.glob(LIBFAKETIME_GLOB))
    return Path(found[0]) if found else None


class Node:
    """A process on ``host:port`` that the harness controls by its pid."""

    def __init__(self, name: str, host: str, port: int, log_path: Path,
                 namespace: Namespace | None = None, start_timeout_s: float = START_TIMEOUT_S,
                 preload: list[Path] | None = None, clock_control_file: Path | None = None,
                 source_address_shim: Path | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.log_path = log_path
        self.namespace = namespace
        self.start_timeout_s = start_timeout_s
        self.preload = list(preload or [])
        self.clock_control_file = clock_control_file
        self.binds_source_address = source_address_shim is not None
        if source_address_shim is not None:
            self.preload.append(source_address_shim)
        self.process: subprocess.Popen | None = None
        if clock_control_file is not None:
            self.preload.append(_required_libfaketime())
            self.set_clock_offset_s(0)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.preload:
            env["LD_PRELOAD"] = ":".join(str(library) for library in self.preload)
        if self.clock_control_file is not None:
            env.update(FAKETIME_TIMESTAMP_FILE=str(self.clock_control_file),
                       FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
        if self.binds_source_address:
            env[SOURCE_ADDRESS_VARIABLE] = self.host
        return env

    def start(self) -> None:
        prefix = self.namespace.command_prefix() if self.namespace else []
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen([*prefix, *self.command()], stdout=log_file,
                                            stderr=subprocess.STDOUT, env=self.environment())
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start-up with "
                                   f"{self.process.returncode}; log: {self.log_path}")
            if self._accepts_connections():
                return
            time.sleep(READY_PROBE_INTERVAL_S)
        raise TimeoutError(f"{self.name} not ready on {self.address} in "
                           f"{self.start_timeout_s} s")

    def _accepts_connections(self) -> bool:
        def probe() -> bool:
            try:
                socket.create_connection((self.host, self.port), READY_PROBE_TIMEOUT_S).close()
                return True
            except OSError:
                return False

        if self.namespace is None:
            return probe()
        return self.namespace.run_inside(probe, READY_PROBE_TIMEOUT_S * 5)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown; the page cache survives."""
        if self.running:
            os.kill(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(STOP_TIMEOUT_S)

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is paused); SIGKILL if it outlives the wait."""
        if not self.running:
            return
        self.resume()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def set_clock_offset_s(self, offset_s: int) -> None:
        """Skew the node's wall clock by ``offset_s`` seconds from now on."""
        if self.clock_control_file is None:
            raise RuntimeError(f"{self.name} was started without a skewable clock")
        staging = self.clock_control_file.with_suffix(".tmp")
        staging.write_text(f"{offset_s:+d}\n")
        staging.rename(self.clock_control_file)


class BrokerNode(Node):
    """A headrace broker with its data directory; ``power_shim`` enables ``power_cut``."""

    def __init__(self, name: str, host: str, port: int, data_dir: Path,
                 overrides: dict[str, str] | None = None, namespace: Namespace | None = None,
                 power_shim: Path | None = None, clock_control_file: Path | None = None,
                 drop_fsync_suffix: str = "", source_address_shim: Path | None = None) -> None:
        self.data_dir = data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.overrides = dict(overrides or {})
        self.power_shim = power_shim
        self.drop_fsync_suffix = drop_fsync_suffix  # a mutation: fsyncs of these files do nothing
        self.shadow_dir = shadow_dir_of(self.data_dir)
        super().__init__(name, host, port, self.data_dir.with_name(f"{name}.log"), namespace,
                         preload=[power_shim] if power_shim else [],
                         clock_control_file=clock_control_file,
                         source_address_shim=source_address_shim)

    @property
    def bootstrap(self) -> str:
        return self.address

    def command(self) -> list[str]:
        settings = {"listeners": f"PLAINTEXT://{self.address}", "log.dirs": str(self.data_dir),
                    **self.overrides}
        command = [sys.executable, "-m", "headrace.cli.main", "broker"]
        for key, value in settings.items():
            command += ["--override", f"{key}={value}"]
        return command

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.power_shim is not None:
            env.update(shim_environment(self.data_dir, self.shadow_dir,
                                        self.drop_fsync_suffix))
        return env

    def start(self) -> None:
        if self.power_shim is not None:
            record_baseline(self.data_dir, self.shadow_dir)
        super().start()

    def power_cut(self, rng: random.Random | None = None) -> CutOutcome:
        """SIGKILL, then leave in the data directory only what the broker had fsynced (with
        seeded torn tails of the rest when ``rng`` is given)."""
        if self.power_shim is None:
            raise RuntimeError(f"{self.name} was started without the power-cut shim")
        self.kill()
        return rebuild_after_power_cut(self.data_dir, self.shadow_dir, rng)


def free_port(host: str = "127.0.0.1", namespace: Namespace | None = None) -> int:
    """A TCP port free on ``host`` now (inside ``namespace`` when given)."""
    def bind() -> int:
        with socket.socket() as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]

    return namespace.run_inside(bind, READY_PROBE_TIMEOUT_S * 5) if namespace else bind()


def _required_libfaketime() -> Path:
    library = libfaketime_path()
    if library is None:
        raise RuntimeError(f"libfaketime not found ({LIBFAKETIME_GLOB}): install faketime")
    return library


ZOOKEEPER_CLIENT_PORT = 2181
ZOOKEEPER_PEER_PORT = 2888
ZOOKEEPER_ELECTION_PORT = 3888
ZOOKEEPER_TICK_TIME_MS = 500
ZOOKEEPER_HEAP_MB = 64


class ZooKeeperNode(Node):
    """ZooKeeper server ``node_id`` of the ensemble ``peers`` (id -> host), on its host."""

    def __init__(self, node_id: int, peers: dict[int, str], base_dir: Path,
                 namespace: Namespace | None = None,
                 source_address_shim: Path | None = None) -> None:
        self.node_id = node_id
        self.node_dir = (base_dir / f"zookeeper-{node_id}").resolve()
        (self.node_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.node_dir / "data" / "myid").write_text(f"{node_id}\n")
        lines = [f"tickTime={ZOOKEEPER_TICK_TIME_MS}", "initLimit=10", "syncLimit=5",
                 f"dataDir={self.node_dir / 'data'}", f"clientPortAddress={peers[node_id]}",
                 f"clientPort={ZOOKEEPER_CLIENT_PORT}", "maxClientCnxns=0",
                 "4lw.commands.whitelist=srvr,ruok", "admin.enableServer=false",
                 *(f"server.{peer}={host}:{ZOOKEEPER_PEER_PORT}:{ZOOKEEPER_ELECTION_PORT}"
                   for peer, host in sorted(peers.items()))]
        (self.node_dir / "zoo.cfg").write_text("\n".join(lines) + "\n")
        super().__init__(f"zookeeper-{node_id}", peers[node_id], ZOOKEEPER_CLIENT_PORT,
                         self.node_dir / "zookeeper.log", namespace,
                         source_address_shim=source_address_shim)

    def command(self) -> list[str]:
        # IPv4 sockets only: the source-address shim binds IPv4 sockets.
        return ["java", f"-Xmx{ZOOKEEPER_HEAP_MB}m", "-XX:+UseSerialGC",
                "-Djava.net.preferIPv4Stack=true", "-Dzookeeper.jmx.log4j.disable=true",
                "-cp", zookeeper_classpath(), QUORUM_PEER_MAIN, str(self.node_dir / "zoo.cfg")]
