"""The SparkSession the pipeline jobs run in, and the broker checks they make before starting.

Owns: ``build_session`` (``--master``, default ``local[*]``; local masters bind the driver to
127.0.0.1 through SPARK_LOCAL_IP, ``spark.driver.host`` and ``spark.driver.bindAddress``; the
web UI and console progress bars are off and Spark logs only errors) and ``JobError``, the
error a job raises for a condition its user can fix (bad directory, unknown topic), which the
command line prints as one line. ``topic_partition_ids`` asks the cluster for a topic's
partitions within a bounded time, so an unreachable broker or a missing topic is reported
before any Spark work starts.

For local masters, Python workers run on this interpreter (PYSPARK_PYTHON, unless already
set): Spark otherwise starts ``python3`` from PATH, which outside an activated virtual
environment has neither pyspark nor pyarrow. That includes the worker that looks up
``pyspark_*`` data sources, which reads PYSPARK_DRIVER_PYTHON, then PYSPARK_PYTHON, never
``spark.pyspark.python``; without it ``format("headrace")`` is not found. The interpreter
found by that lookup also runs the data source's reads and writes on the executors, so for
other masters nothing is set: the cluster's own PYSPARK_PYTHON applies.

Stateless apart from those process-wide environment variables (set before the JVM starts; a
value already set is kept); call from the driver's main thread.
"""

from __future__ import annotations

import logging
import os
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

DEFAULT_MASTER = "local[*]"
LOOPBACK_ADDRESS = "127.0.0.1"
DEFAULT_METADATA_TIMEOUT_MS = 10_000
SPARK_LOG_LEVEL = "ERROR"

_SILENT_LOGGER = logging.getLogger("headrace.spark.jobs.librdkafka")
_SILENT_LOGGER.addHandler(logging.NullHandler())
_SILENT_LOGGER.propagate = False


class JobError(Exception):
    """A condition the user can fix; the message is one line."""


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def build_session(master: str = DEFAULT_MASTER, app_name: str = "headrace",
                  extra_config: dict[str, str] | None = None):
    """A SparkSession for ``master``; local masters stay on the loopback interface."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK_ADDRESS)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (builder.config("spark.driver.host", LOOPBACK_ADDRESS)
                   .config("spark.driver.bindAddress", LOOPBACK_ADDRESS))
    builder = (builder.config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (extra_config or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(SPARK_LOG_LEVEL)
    return session


def topic_partition_ids(bootstrap: str, topic: str,
                        timeout_ms: int = DEFAULT_METADATA_TIMEOUT_MS) -> list[int]:
    """The partition ids of ``topic``; JobError when the broker or the topic is not there."""
    admin = AdminClient({
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": max(1000, timeout_ms),
        "logger": _SILENT_LOGGER,
        "error_cb": lambda error: None,
    })
    try:
        # All topics: a metadata request naming the topic could auto-create it.
        metadata = admin.list_topics(timeout=timeout_ms / 1000)
    except KafkaException:
        raise JobError(f"cannot reach a broker at {bootstrap} within {timeout_ms} ms") from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise JobError(f"unknown topic {topic!r} at {bootstrap}")
    return sorted(found.partitions)
