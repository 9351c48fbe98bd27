"""The Spark pipeline jobs: load (incremental, crash-safe), snapshot, activity; and their CLI.

Job functions run in the session's SparkSession. The SIGKILL case runs the
``headrace spark load`` command once in a subprocess (its own Spark, --master local[2,2], so
spark.task.maxFailures = 2): one injected task failure retried, then SIGKILLed at a crash point.
Result checks read Parquet with pyarrow except where Spark's reading of the table is the
point: no Spark job spent on an oracle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from conftest import append, new_topic

from headrace.spark.jobs.activity import restore_view, run_activity
from headrace.spark.jobs.faults import CRASH_AT_ENV, TASK_FAULT_MARKER_ENV
from headrace.spark.jobs.load import (
    CRASH_POINTS,
    DATA_DIR_NAME,
    STAGING_DIR_NAME,
    committed_runs,
    load_topic,
)
from headrace.spark.jobs.session import JobError
from headrace.spark.jobs.snapshot import CURRENT_LINK_NAME, VERSIONS_DIR_NAME, snapshot_topic

pytestmark = pytest.mark.spark

CLI = [sys.executable, "-m", "headrace.cli.main", "spark"]
SUBPROCESS_TIMEOUT_S = 240
PROCESS_GROUP_EXIT_TIMEOUT_S = 60


class SimulatedCrash(BaseException):
    """Stops a job at a crash point, leaving the files as a SIGKILL there would."""


class Oracle:
    """The records appended so far, as (partition, offset, value)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.records: list[tuple[int, int, bytes]] = []

    def add(self, partition: int, count: int, tag: str) -> None:
        start = sum(1 for record in self.records if record[0] == partition)
        values = [f"{tag}-{partition}-{index}".encode() for index in range(count)]
        append(self.bootstrap, self.topic, partition, values)
        self.records.extend((partition, start + i, value) for i, value in enumerate(values))


def loaded(spark, output_dir) -> list[tuple[int, int, bytes]]:
    """Every loaded record as Spark reads the table (the documented way), duplicates kept."""
    rows = spark.read.parquet(str(output_dir / DATA_DIR_NAME)).collect()
    return sorted((row.partition, row.offset, row.value) for row in rows)


def parquet_records(directory) -> list[tuple[int, int, bytes]]:
    """Every record in the Parquet files under ``directory`` (read with pyarrow, no Spark
    job; files starting with _ or . skipped as Spark does), duplicates kept, sorted."""
    table = pq.read_table(str(directory), columns=["partition", "offset", "value"])
    return sorted(zip(*(table.column(name).to_pylist()
                        for name in ("partition", "offset", "value")), strict=True))


def crash_at(wanted: str):
    def hook(point: str) -> None:
        if point == wanted:
            raise SimulatedCrash(point)
    return hook


def test_load_runs_read_every_offset_exactly_once(spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap, 2)
    oracle = Oracle(bootstrap, topic)
    output_dir = tmp_path / "load"
    oracle.add(0, 5, "a")
    oracle.add(1, 3, "a")
    first = load_topic(spark, bootstrap, topic, output_dir)
    assert (first.run_id, first.rows) == (1, 8)
    assert [(p.partition, p.from_offset, p.until_offset, p.rows) for p in first.partitions] == [
        (0, 0, 5, 5), (1, 0, 3, 3)]

    oracle.add(1, 4, "b")
    second = load_topic(spark, bootstrap, topic, output_dir, max_offsets=3)
    assert (second.run_id, second.rows) == (2, 3)
    third = load_topic(spark, bootstrap, topic, output_dir)
    assert [(p.partition, p.from_offset, p.until_offset) for p in third.partitions] == [
        (0, 5, 5), (1, 6, 7)]
    idle = load_topic(spark, bootstrap, topic, output_dir)
    assert (idle.run_id, idle.rows) == (None, 0)
    assert [run.run_id for run in committed_runs(output_dir)] == [1, 2, 3]
    assert loaded(spark, output_dir) == sorted(oracle.records)


def test_load_stopped_at_each_crash_point_then_rerun_has_no_duplicates_or_gaps(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap, 2)
    oracle = Oracle(bootstrap, topic)
    output_dir = tmp_path / "load"
    for round_number, point in enumerate(CRASH_POINTS):
        oracle.add(round_number % 2, 4, f"r{round_number}")
        with pytest.raises(SimulatedCrash):
            load_topic(spark, bootstrap, topic, output_dir, crash_hook=crash_at(point))
        staged = list((output_dir / STAGING_DIR_NAME).glob("run-*"))
        assert len(staged) == (0 if point == "after-rename" else 1)
        load_topic(spark, bootstrap, topic, output_dir)
        assert parquet_records(output_dir / DATA_DIR_NAME) == sorted(oracle.records)
    assert not (output_dir / STAGING_DIR_NAME).exists()


def test_load_refuses_a_directory_of_something_else_and_an_unknown_topic(
        spark, bootstrap, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(JobError, match="something else"):
        load_topic(spark, bootstrap, new_topic(bootstrap, 1), tmp_path)
    with pytest.raises(JobError, match="unknown topic"):
        load_topic(spark, bootstrap, "no-such-topic-jobs", tmp_path / "empty")


def test_load_task_failure_fails_the_job_and_the_rerun_loads_once(
        spark, bootstrap, tmp_path, monkeypatch):
    topic = new_topic(bootstrap, 2)
    oracle = Oracle(bootstrap, topic)
    oracle.add(0, 6, "a")
    oracle.add(1, 2, "a")
    output_dir = tmp_path / "load"
    marker = tmp_path / "task-fault"
    monkeypatch.setenv(TASK_FAULT_MARKER_ENV, str(marker))
    with pytest.raises(Exception, match="injected task failure"):
        load_topic(spark, bootstrap, topic, output_dir)
    assert marker.exists() and committed_runs(output_dir) == []
    report = load_topic(spark, bootstrap, topic, output_dir)
    assert report.rows == 8
    assert parquet_records(output_dir / DATA_DIR_NAME) == sorted(oracle.records)


def _run_cli(arguments: list[str], extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        CLI + arguments, env={**os.environ, **extra_env}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    _wait_process_group_gone(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _wait_process_group_gone(group_id: int) -> None:
    """The killed driver's JVM exits when its stdin closes; wait for the whole group."""
    deadline = time.monotonic() + PROCESS_GROUP_EXIT_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(group_id, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise AssertionError(f"process group {group_id} still running")


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S + PROCESS_GROUP_EXIT_TIMEOUT_S + 120)
def test_load_sigkilled_after_a_retried_task_under_local_2_2_then_rerun_loads_once(
        spark, bootstrap, tmp_path):
    """One ``headrace spark load --master local[2,2]`` process: its first task fails once
    (injected) and is retried, the job stages every record, then the driver SIGKILLs itself
    before committing. The re-run discards the staged run and loads everything exactly once."""
    topic = new_topic(bootstrap, 2)
    oracle = Oracle(bootstrap, topic)
    oracle.add(0, 7, "a")
    oracle.add(1, 3, "a")
    output_dir = tmp_path / "load"
    marker = tmp_path / "task-fault"
    killed = _run_cli(
        ["load", topic, "--output-dir", str(output_dir), "--bootstrap-server", bootstrap,
         "--master", "local[2,2]"],
        {CRASH_AT_ENV: "after-staging-write", TASK_FAULT_MARKER_ENV: str(marker)})
    # Killed at the crash point, not failed: the task failure was retried, which only
    # spark.task.maxFailures = 2 (--master local[2,2]) allows.
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert marker.exists()
    staged = list((output_dir / STAGING_DIR_NAME).iterdir())
    assert len(staged) == 1
    assert parquet_records(staged[0]) == sorted(oracle.records)  # the retry added no duplicate
    assert committed_runs(output_dir) == []

    oracle.add(1, 2, "b")
    report = load_topic(spark, bootstrap, topic, output_dir)
    assert (report.to_json()["run"], report.rows) == (1, 12)
    assert list((output_dir / STAGING_DIR_NAME).iterdir()) == []
    assert loaded(spark, output_dir) == sorted(oracle.records)


def test_cli_reports_an_unknown_topic_in_one_line(bootstrap, tmp_path):
    result = subprocess.run(
        CLI + ["load", "no-such-topic-cli", "--output-dir", str(tmp_path / "out"),
               "--bootstrap-server", bootstrap], capture_output=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.decode().strip().splitlines() == [
        f"headrace: unknown topic 'no-such-topic-cli' at {bootstrap}"]


def test_snapshot_keeps_the_latest_value_per_key_and_drops_tombstones(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap, 2)
    base_ms = int(time.time() * 1000) - 60_000  # old timestamps would fall to retention
    # partition 0: k1 updated twice, k2 deleted, k3 deleted then written again, one keyless.
    append(bootstrap, topic, 0, [b"1a", b"2a", b"1b", None, b"3a", None, b"3b", b"nokey"],
           keys=[b"k1", b"k2", b"k1", b"k2", b"k3", b"k3", b"k3", None],
           # offsets, not timestamps, order a partition: k1's last write has the oldest time
           timestamps_ms=[base_ms + 10, base_ms + 11, base_ms + 1, base_ms + 12,
                          base_ms + 13, base_ms + 14, base_ms + 15, base_ms + 16])
    # partition 1: k4 alone, and k5 also written to partition 0 later in time.
    append(bootstrap, topic, 1, [b"4a", b"5-p1"], keys=[b"k4", b"k5"],
           timestamps_ms=[base_ms + 20, base_ms + 21])
    append(bootstrap, topic, 0, [b"5-p0"], keys=[b"k5"], timestamps_ms=[base_ms + 30])
    output_dir = tmp_path / "snapshot"
    report = snapshot_topic(spark, bootstrap, topic, output_dir, now_ms=1)
    table = spark.read.parquet(os.path.realpath(output_dir / CURRENT_LINK_NAME)).collect()
    assert sorted((row.key, row.value) for row in table) == [
        (b"k1", b"1b"), (b"k3", b"3b"), (b"k4", b"4a"), (b"k5", b"5-p0")]
    assert report.table_path == os.path.realpath(output_dir / CURRENT_LINK_NAME)
    assert (report.keys, report.records_read, report.tombstones_applied,
            report.records_without_key) == (4, 11, 1, 1)

    append(bootstrap, topic, 1, [None], keys=[b"k4"], timestamps_ms=[base_ms + 40])
    for now_ms in (2, 3):
        snapshot_topic(spark, bootstrap, topic, output_dir, now_ms=now_ms)
    table = spark.read.parquet(os.path.realpath(output_dir / CURRENT_LINK_NAME)).collect()
    assert sorted(row.key for row in table) == [b"k1", b"k3", b"k5"]
    assert len(list((output_dir / VERSIONS_DIR_NAME).iterdir())) == 2


def _events(bootstrap: str, topic: str, partition: int, members: list[bytes]) -> None:
    append(bootstrap, topic, partition, [b"page-view"] * len(members), keys=members)


def test_activity_counts_visits_exactly_over_two_available_now_runs(
        spark, bootstrap, tmp_path):
    input_topic = new_topic(bootstrap, 2)
    output_topic = f"{input_topic}-counts"
    checkpoint = str(tmp_path / "checkpoint")
    first = [b"m1", b"m2", b"m1", b"m3", b"m1"]
    _events(bootstrap, input_topic, 0, first[:3])
    _events(bootstrap, input_topic, 1, first[3:])
    report = run_activity(spark, bootstrap, input_topic, output_topic, checkpoint,
                          max_offsets_per_trigger=3)
    assert report.input_rows == 5 and report.micro_batches >= 2
    assert restore_view(bootstrap, output_topic).counts == Counter(first)

    second = [b"m2", b"m4", b"m1"]
    _events(bootstrap, input_topic, 1, second)
    run_activity(spark, bootstrap, input_topic, output_topic, checkpoint)
    assert restore_view(bootstrap, output_topic).counts == Counter(first + second)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, output_topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact"
