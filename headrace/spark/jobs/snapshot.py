"""The snapshot job: a compacted topic as a Parquet table of each key's latest value.

Owns ``snapshot_topic`` (``headrace spark snapshot``), the choice of a key's latest record, and
the layout of its output directory on a local (or locally mounted, shared) file system:

    DIR/current -> versions/<id>   symlink to the latest table, replaced atomically
    DIR/versions/<id>/             one complete table: part-*.parquet, _snapshot.json
                                   ({"format": 1, "topic", "end": {"topic": {"0": offset}},
                                   "keys", "records_read", "tombstones_applied"})
    DIR/_staging/<id>/             a table being written (removed by the next run)

Columns: key binary, value binary, partition int, offset long, timestamp timestamp.

Which record is a key's latest -- Kafka's compaction semantics, made exact across partitions:
1. Within one partition the record with the highest offset wins (the log cleaner keeps exactly
   that one; timestamps do not order a partition, offsets do).
2. Should one key appear in several partitions (partitions added to the topic, a custom
   partitioner), the per-partition winners are ordered by (timestamp, partition) and the
   highest wins: the most recent write, ties broken deterministically.
3. A winner whose value is null is a tombstone: the key is left out. Records without a key
   cannot be compacted by Kafka either and are skipped (counted in the report).
Both steps are ``groupBy`` aggregations with ``max_by`` over a struct, so Spark shuffles by
key and spills to disk as needed: exact at any number of keys, never collected on the driver.

Replacing the table: the new version is written to ``_staging``, fsynced, renamed into
``versions/``, then a new symlink is renamed over ``DIR/current`` (rename is atomic), so a
reader of ``DIR/current`` sees the old table or the new one, never a mixture. Spark (Hadoop's
local file system) does not list a directory through a symlink: Spark readers read the
resolved path, ``os.path.realpath("DIR/current")``, or the ``table`` path of the report. Versions older
than the previous one are deleted. Runs on the driver's main thread; one run per DIR at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from headrace.spark.jobs.session import JobError
from headrace.spark.offsets import BrokerOffsets, offsets_to_json
from headrace.spark.options import Subscription

CURRENT_LINK_NAME = "current"
VERSIONS_DIR_NAME = "versions"
STAGING_DIR_NAME = "_staging"
SUMMARY_FILE_NAME = "_snapshot.json"
SUMMARY_FORMAT_VERSION = 1
VERSIONS_KEPT = 2


@dataclass(frozen=True, slots=True)
class SnapshotReport:
    topic: str
    table_path: str
    keys: int
    records_read: int
    tombstones_applied: int
    records_without_key: int

    def to_json(self) -> dict:
        return {"topic": self.topic, "table": self.table_path, "keys": self.keys,
                "records_read": self.records_read,
                "tombstones_applied": self.tombstones_applied,
                "records_without_key": self.records_without_key}


def latest_per_key(records):
    """Each key's latest record (see the module docstring), tombstones included.

    Also one row for key null (records that cannot be compacted); every row carries
    ``records``, the number of records read for its key.
    """
    from pyspark.sql import functions as F

    record = F.struct("key", "value", "partition", "offset", "timestamp")
    per_partition = (records.groupBy("key", "partition")
                     .agg(F.max_by(record, F.col("offset")).alias("record"),
                          F.count(F.lit(1)).alias("records")))
    across = (per_partition
              .groupBy("key")
              .agg(F.max_by(F.col("record"),
                            F.struct(F.col("record.timestamp"), F.col("record.partition")))
                   .alias("record"),
                   F.sum("records").alias("records")))
    return across.select("record.*", "records")


def _read_topic(spark, bootstrap: str, topic: str, end: dict, client_config: dict[str, str]):
    reader = spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
    for key, value in client_config.items():
        reader = reader.option(f"kafka.{key}", value)
    return (reader.option("subscribe", topic).option("startingOffsets", "earliest")
            .option("endingOffsets", json.dumps(end)).load())


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in [*files, "."]:
            descriptor = os.open(Path(directory) / name, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def _prepare_output_dir(output_dir: Path) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise JobError(f"output directory {output_dir} is not a directory")
    ours = {CURRENT_LINK_NAME, VERSIONS_DIR_NAME, STAGING_DIR_NAME}
    if output_dir.is_dir():
        foreign = sorted(child.name for child in output_dir.iterdir()
                         if child.name not in ours and not _is_link_in_progress(child))
        if foreign:
            raise JobError(f"output directory {output_dir} holds files of something else "
                           f"({', '.join(foreign[:3])}); use an empty or a snapshot directory")
    try:
        (output_dir / VERSIONS_DIR_NAME).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise JobError(f"cannot create output directory {output_dir}: {error.strerror}") from None
    shutil.rmtree(output_dir / STAGING_DIR_NAME, ignore_errors=True)
    for child in output_dir.iterdir():
        if _is_link_in_progress(child):
            child.unlink()


def _is_link_in_progress(path: Path) -> bool:
    """A new ``current`` symlink not yet renamed into place (its run was killed)."""
    return path.name.startswith(f".{CURRENT_LINK_NAME}-") and path.is_symlink()


def _publish(output_dir: Path, staging_dir: Path, version_name: str) -> None:
    versions_dir = output_dir / VERSIONS_DIR_NAME
    os.rename(staging_dir, versions_dir / version_name)
    new_link = output_dir / f".{CURRENT_LINK_NAME}-{version_name}"
    os.symlink(Path(VERSIONS_DIR_NAME) / version_name, new_link)
    os.replace(new_link, output_dir / CURRENT_LINK_NAME)
    descriptor = os.open(output_dir, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    kept = sorted(versions_dir.iterdir(), key=lambda path: path.name)[-VERSIONS_KEPT:]
    for old in sorted(versions_dir.iterdir()):
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)


def _version_name(clock_ms: int) -> str:
    return f"{clock_ms:016d}-{uuid.uuid4().hex[:8]}"


def snapshot_topic(spark, bootstrap: str, topic: str, output_dir: str | Path, *,
                   now_ms: int, client_config: dict[str, str] | None = None) -> SnapshotReport:
    """Write ``topic``'s latest value per key (up to the latest offsets now) to ``output_dir``.

    ``now_ms`` names the new version (versions sort by it).
    """
    from pyspark.sql import functions as F

    output_dir = Path(output_dir).absolute()
    config = {"bootstrap.servers": bootstrap, **(client_config or {})}
    broker = BrokerOffsets(config)
    keys = broker.topic_partitions(Subscription("subscribe", topics=(topic,)))
    if not keys:
        raise JobError(f"unknown topic {topic!r}")
    _prepare_output_dir(output_dir)
    end = offsets_to_json(broker.latest(keys))
    records = _read_topic(spark, bootstrap, topic, end, client_config or {})
    latest = latest_per_key(records).persist()
    try:
        version_name = _version_name(now_ms)
        staging_dir = output_dir / STAGING_DIR_NAME / version_name
        live = F.col("key").isNotNull() & F.col("value").isNotNull()
        latest.where(live).drop("records").write.parquet(str(staging_dir))
        totals = latest.agg(
            F.count_if(live).alias("keys"),
            F.coalesce(F.sum("records"), F.lit(0)).alias("records"),
            F.count_if(F.col("key").isNotNull() & F.col("value").isNull()).alias("tombstones"),
            F.coalesce(F.sum(F.when(F.col("key").isNull(), F.col("records"))), F.lit(0))
            .alias("keyless"),
        ).collect()[0]
    finally:
        latest.unpersist()
    report = SnapshotReport(topic, str(output_dir / VERSIONS_DIR_NAME / version_name),
                            totals["keys"],
                            totals["records"], totals["tombstones"], totals["keyless"])
    summary = {"format": SUMMARY_FORMAT_VERSION, "end": end, **report.to_json()}
    (staging_dir / SUMMARY_FILE_NAME).write_text(json.dumps(summary, indent=1) + "\n")
    _fsync_tree(staging_dir)
    _publish(output_dir, staging_dir, version_name)
    return report
