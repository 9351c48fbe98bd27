"""A whole cluster on 127.0.0.1 for ``headrace cluster up``: ``LocalCluster``.

Owns a ZooKeeper ensemble (``headrace.cluster.zookeeper_ensemble``) and N broker processes
(``headrace broker`` with ``broker.id``, ``zookeeper.connect`` under the chroot ``/headrace``,
``listeners`` and ``log.dirs`` overridden). Files under ``base_dir``::

    zookeeper/node-N/...   the ensemble (see ZooKeeperEnsemble)
    broker-I/              broker I's data directory (log.dirs)
    broker-I.log           broker I's stdout and stderr

``start`` returns once every broker is registered in ``/brokers/ids`` (bounded by
``start_timeout_ms``); ``stop`` sends SIGTERM to the brokers (SIGKILL after
``BROKER_STOP_TIMEOUT_MS``), then stops the ensemble. Every process runs in its own session,
so a Ctrl-C at the terminal reaches only ``headrace cluster up``, which stops them in order.
Broker ids are 1..N; broker I listens on ``first_port + I - 1`` (free ports when
``first_port`` is 0).

Thread-safety: none; driven by the command's main thread.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster.zookeeper_ensemble import (
    ZooKeeperEnsemble,
    free_ports,
    wait_while_running,
)

CHROOT = "/headrace"
HOST = "127.0.0.1"
DEFAULT_START_TIMEOUT_MS = 120_000
BROKER_STOP_TIMEOUT_MS = 30_000


class LocalClusterError(RuntimeError):
    """A broker exited at start-up, or the cluster did not come up in time."""


class LocalCluster:
    def __init__(self, base_dir: Path, broker_count: int, zookeeper_nodes: int = 3,
                 first_port: int = 0, start_timeout_ms: int = DEFAULT_START_TIMEOUT_MS) -> None:
        if broker_count < 1:
            raise ValueError(f"a cluster needs at least one broker, not {broker_count}")
        self.base_dir = Path(base_dir).resolve()
        self.broker_ids = list(range(1, broker_count + 1))
        self.start_timeout_ms = start_timeout_ms
        self.ensemble = ZooKeeperEnsemble(self.base_dir / "zookeeper", size=zookeeper_nodes,
                                          host=HOST)
        ports = (free_ports(HOST, broker_count) if first_port == 0
                 else [first_port + index for index in range(broker_count)])
        self.ports = dict(zip(self.broker_ids, ports, strict=True))
        self.brokers: dict[int, subprocess.Popen] = {}

    @property
    def zookeeper_connect(self) -> str:
        return self.ensemble.connect_string + CHROOT

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{self.ports[broker_id]}" for broker_id in self.broker_ids)

    def broker_log(self, broker_id: int) -> Path:
        return self.base_dir / f"broker-{broker_id}.log"

    def start(self) -> None:
        """The ensemble, then every broker; returns once all are registered."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.ensemble.start()
        try:
            for broker_id in self.broker_ids:
                self.brokers[broker_id] = self._launch(broker_id)
            self._wait_until_registered()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the brokers (SIGKILL when they outlast the timeout), then the ensemble."""
        for process in self.brokers.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + BROKER_STOP_TIMEOUT_MS / 1000
        for process in self.brokers.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.ensemble.stop()

    def exited_brokers(self) -> dict[int, int]:
        """Broker id -> exit status of the brokers that are no longer running."""
        return {broker_id: process.returncode for broker_id, process in self.brokers.items()
                if process.poll() is not None}

    @property
    def pids(self) -> list[int]:
        """Every process started: the brokers', then the ZooKeeper nodes'."""
        return ([process.pid for process in self.brokers.values()]
                + list(self.ensemble.pids.values()))

    def _launch(self, broker_id: int) -> subprocess.Popen:
        overrides = {
            "broker.id": str(broker_id),
            "zookeeper.connect": self.zookeeper_connect,
            "listeners": f"PLAINTEXT://{HOST}:{self.ports[broker_id]}",
            "log.dirs": str(self.base_dir / f"broker-{broker_id}"),
        }
        command = [sys.executable, "-m", "headrace.cli.main", "broker"]
        for key, value in overrides.items():
            command += ["--override", f"{key}={value}"]
        with open(self.broker_log(broker_id), "ab") as log_file:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_until_registered(self) -> None:
        client = KazooClient(hosts=self.ensemble.connect_string)  # the chroot may not exist yet
        client.start(timeout=self.start_timeout_ms / 1000)
        try:
            expected = {str(broker_id) for broker_id in self.broker_ids}
            wait_while_running(
                lambda: expected <= _children(client, CHROOT + paths.BROKER_IDS), self.brokers,
                self.start_timeout_ms,
                f"brokers not all registered (see {self.base_dir}/broker-*.log)",
                LocalClusterError)
        finally:
            client.stop()
            client.close()


def _children(client: KazooClient, path: str) -> set[str]:
    try:
        return set(client.get_children(path))
    except NoNodeError:
        return set()
