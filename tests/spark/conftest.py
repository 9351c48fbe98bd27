"""Fixtures of the Spark data source tests: one broker and one SparkSession per test session.

``bootstrap`` is the only place that chooses the broker: by default headrace's own broker
process (the session ``broker`` fixture of tests/conftest.py); HEADRACE_TEST_PEER=tansu runs
the Tansu peer instead (../shared/bench/run-peer.sh fetches it on first use; TANSU_BIN
overrides the binary), a broker we did not write; HEADRACE_TEST_BOOTSTRAP=host:port uses a
cluster that is already running.
Tansu reports a high watermark of (last batch's first offset + 1), so ``append`` sends the last
record of every call in a batch of its own: "latest" is then the true log end on any broker.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import tansu_peer

SPARK_SCRATCH_DIR = Path("/tmp/spark-h6")
# Tansu 0.6.0 stores its own timestamps and answers every ListOffsets-by-timestamp with the
# first offset, so timestamp lookups can only be tested against another broker.
USE_TANSU = os.environ.get("HEADRACE_TEST_PEER") == "tansu"
PEER_IGNORES_TIMESTAMPS = USE_TANSU


@pytest.fixture(scope="session")
def bootstrap(request):
    existing = os.environ.get("HEADRACE_TEST_BOOTSTRAP")
    if existing:
        yield existing
        return
    if not USE_TANSU:
        yield request.getfixturevalue("broker").bootstrap
        return
    with tansu_peer(SPARK_SCRATCH_DIR) as peer_bootstrap:
        yield peer_bootstrap


@pytest.fixture(scope="session")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("headrace-spark-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(SPARK_SCRATCH_DIR / "spark-local"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def unique_name(prefix: str = "spark") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def new_topic(bootstrap: str, partitions: int, name: str | None = None) -> str:
    name = name or unique_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)
    return name


def append(bootstrap: str, topic: str, partition: int, values: list[bytes], *,
           keys: list[bytes] | None = None, timestamps_ms: list[int] | None = None,
           headers: list | None = None, batch_per_record: bool = False) -> None:
    """Produce ``values`` to one partition in order; the last one in a batch of its own.

    batch_per_record puts every record in its own batch (Tansu answers timestamp lookups per
    batch).
    """
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    for index, value in enumerate(values):
        if batch_per_record or index == len(values) - 1:
            producer.flush(30)
        arguments = {"value": value, "partition": partition}
        if keys is not None:
            arguments["key"] = keys[index]
        if timestamps_ms is not None:
            arguments["timestamp"] = timestamps_ms[index]
        if headers is not None:
            arguments["headers"] = headers[index]
        producer.produce(topic, **arguments)
    assert producer.flush(30) == 0
