"""The pipeline jobs on a Spark standalone cluster: a master and two workers on 127.0.0.1.

One cluster per module (tests/spark/standalone.py: ``spark-class`` of the installed pyspark,
``--cores 1 --memory 1g`` per worker). The workers' Python is a virtual environment into which
headrace is installed as a wheel built from this checkout; the drivers are ``headrace spark``,
an example and ``spark-submit``, each a subprocess with a shell's environment (no checkout on
PYTHONPATH), PYSPARK_PYTHON naming the executors' interpreter and SPARK_CONF_DIR holding the
cluster's ``spark-defaults.conf``. Output is checked row by row against the topic itself, read
with confluent-kafka. The jobs read the session's broker, and the load also a topic spread over
three brokers in cluster mode (a three-node ZooKeeper ensemble and tests/cluster's ``Cluster``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tarfile
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from conftest import append, new_topic
from environments import (
    REPOSITORY_ROOT,
    build_wheel,
    copy_checkout,
    new_environment,
    pip_install,
    user_environment,
    without_java_frames,
)
from standalone import EXECUTOR_MEMORY, SPARK_HOME, StandaloneCluster

from headrace.spark.jobs.activity import restore_view
from headrace.spark.jobs.faults import (
    PAUSED_FILE_PREFIX,
    RESUME_FILE_NAME,
    TASK_PAUSE_DIR_ENV,
    TASK_PAUSE_OFFSET_ENV,
)
from headrace.spark.jobs.load import DATA_DIR_NAME, STAGING_DIR_NAME, committed_runs
from headrace.spark.jobs.snapshot import CURRENT_LINK_NAME

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB_TIMEOUT_S = 300
PAUSE_WAIT_TIMEOUT_S = 180
POLL_INTERVAL_S = 0.2
READ_TIMEOUT_S = 60
ENVIRONMENT_ARCHIVE_ALIAS = "environment"
RECORD_BYTES = 1024
ATTEMPT_PARTITION = re.compile(r"attempt_\d+_\d+_m_(\d+)_\d+")
EXAMPLES_DIR = REPOSITORY_ROOT / "examples" / "spark"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cluster-wheel")
    return build_wheel(copy_checkout(directory / "checkout"), directory / "wheels")


@pytest.fixture(scope="module")
def headrace_python(wheel, tmp_path_factory) -> Path:
    """The workers' Python: headrace installed from the wheel."""
    python = new_environment(tmp_path_factory.mktemp("cluster-venv") / "headrace-venv")
    pip_install(python, str(wheel))
    return python


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    standalone = StandaloneCluster(tmp_path_factory.mktemp("standalone"), user_environment())
    try:
        standalone.start()
        yield standalone
    finally:
        standalone.stop()


@pytest.fixture(scope="module")
def conf_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("spark-conf")
    (directory / "spark-defaults.conf").write_text(
        f"spark.executor.memory {EXECUTOR_MEMORY}\n"
        "spark.ui.enabled false\n"
        "spark.sql.shuffle.partitions 2\n")
    return directory


def driver_environment(conf_dir: Path, executor_python: str, **extra: str) -> dict[str, str]:
    return {**user_environment(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf_dir),
            "PYSPARK_PYTHON": executor_python, **extra}


def run_driver(command: list[str], environment: dict[str, str], cwd: Path) -> str:
    result = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True,
                            timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + without_java_frames(result.stderr)
    return result.stdout


def headrace_spark(python: Path, *arguments: str) -> list[str]:
    return [str(python), "-m", "headrace.cli.main", "spark", *arguments]


def topic_records(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` up to its high watermarks now, as (partition, offset, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        ends = {partition: consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                          timeout=READ_TIMEOUT_S)[1]
                for partition in range(partitions)}
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)
                         for partition in range(partitions) if ends[partition]])
        records: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(records) < sum(ends.values()) and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1.0):
                if message.error() is None and message.offset() < ends[message.partition()]:
                    records.append((message.partition(), message.offset(), message.value()))
        assert len(records) == sum(ends.values()), "topic not read to its end in time"
        return sorted(records)
    finally:
        consumer.close()


def loaded_records(output_dir: Path) -> list[tuple[int, int, bytes]]:
    """Every row of the committed runs (pyarrow, skipping _ and . files as Spark does),
    duplicates kept, sorted."""
    table = pq.read_table(str(output_dir / DATA_DIR_NAME), columns=["partition", "offset",
                                                                    "value"])
    return sorted(zip(*(table.column(name).to_pylist()
                        for name in ("partition", "offset", "value")), strict=True))


def completed_app_names(cluster: StandaloneCluster) -> list[str]:
    return [app["name"] for app in cluster.master_state()["completedapps"]]


def test_load_snapshot_and_the_activity_example_run_on_the_cluster(
        cluster, headrace_python, conf_dir, bootstrap, tmp_path):
    environment = driver_environment(conf_dir, str(headrace_python))
    topic = new_topic(bootstrap, 2)
    for partition in range(2):
        append(bootstrap, topic, partition,
               [f"v-{partition}-{index}".encode() for index in range(50)],
               keys=[f"p{partition}-k{index % 7}".encode() for index in range(50)])
    output_dir = tmp_path / "load"
    run_driver(headrace_spark(headrace_python, "load", topic, "--output-dir", str(output_dir),
                              "--bootstrap-server", bootstrap, "--master", cluster.master_url),
               environment, tmp_path)
    assert loaded_records(output_dir) == topic_records(bootstrap, topic, 2)

    snapshot_dir = tmp_path / "snapshot"
    run_driver(headrace_spark(headrace_python, "snapshot", topic, "--output-dir",
                              str(snapshot_dir), "--bootstrap-server", bootstrap,
                              "--master", cluster.master_url), environment, tmp_path)
    table = pq.read_table(os.path.realpath(snapshot_dir / CURRENT_LINK_NAME))
    latest = {f"p{partition}-k{index % 7}".encode(): f"v-{partition}-{index}".encode()
              for partition in range(2) for index in range(50)}  # the last write wins
    assert dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                    strict=True)) == latest

    events = new_topic(bootstrap, 2)
    members = [b"m1", b"m2", b"m1", b"m3", b"m1", b"m2"]
    append(bootstrap, events, 0, [b"page-view"] * 3, keys=members[:3])
    append(bootstrap, events, 1, [b"page-view"] * 3, keys=members[3:])
    counts = f"{events}-counts"
    output = run_driver([str(headrace_python), str(EXAMPLES_DIR / "activity_stream.py"),
                         "--bootstrap", bootstrap, "--events", events, "--counts", counts,
                         "--checkpoint", str(tmp_path / "checkpoint"),
                         "--master", cluster.master_url], environment, tmp_path)
    assert "counted 6 events" in output
    assert restore_view(bootstrap, counts).counts == Counter(members)
    assert {f"headrace-load-{topic}", f"headrace-snapshot-{topic}",
            "headrace-activity-example"} <= set(completed_app_names(cluster))


def environment_archive(python: Path, archive: Path) -> Path:
    """A tar.gz of the virtual environment of ``python``, its symlinks kept (venv-pack's
    output for an environment whose base interpreter is where the workers have it)."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(python.parents[1], arcname=".")
    return archive


def test_workers_without_headrace_run_the_load_example_from_an_environment_archive(
        cluster, headrace_python, conf_dir, bootstrap, tmp_path):
    """spark-submit --archives env.tar.gz#environment with PYSPARK_PYTHON=./environment/bin/python
    and PYSPARK_DRIVER_PYTHON unset, as README documents. The driver runs in a directory holding
    the same environment unpacked (client mode); Spark runs the data source's reads with the
    interpreter its driver-side lookup used, that same relative path, so the executors run the
    archive's Python: the only place on the workers where headrace is installed."""
    archive = environment_archive(headrace_python, tmp_path / "headrace-env.tar.gz")
    driver_dir = tmp_path / "driver"
    with tarfile.open(archive) as tar:
        tar.extractall(driver_dir / ENVIRONMENT_ARCHIVE_ALIAS, filter="tar")
    environment = driver_environment(conf_dir, f"./{ENVIRONMENT_ARCHIVE_ALIAS}/bin/python")
    topic = new_topic(bootstrap, 2)
    for partition in range(2):
        append(bootstrap, topic, partition,
               [f"archived-{partition}-{index}".encode() for index in range(20)])
    output_dir = tmp_path / "load"

    run_driver([str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master_url,
                "--archives", f"{archive}#{ENVIRONMENT_ARCHIVE_ALIAS}",
                str(EXAMPLES_DIR / "load_topic.py"), "--bootstrap", bootstrap,
                "--topic", topic, "--output-dir", str(output_dir),
                "--master", cluster.master_url], environment, driver_dir)

    assert loaded_records(output_dir) == topic_records(bootstrap, topic, 2)
    (app,) = [app["id"] for app in cluster.master_state()["completedapps"]
              if app["name"] == "headrace-load-example"]
    unpacked = list(cluster.directory.glob(f"worker-*/{app}/*/{ENVIRONMENT_ARCHIVE_ALIAS}"))
    assert len(unpacked) == cluster.worker_count  # each executor ran the archive's Python


def _wait_paused_tasks(pause_dir: Path, count: int,
                       driver: subprocess.Popen) -> list[tuple[int, int]]:
    """(partition, Python worker pid) of the first ``count`` task attempts seen paused."""
    deadline = time.monotonic() + PAUSE_WAIT_TIMEOUT_S
    while time.monotonic() < deadline:
        paused = sorted(pause_dir.glob(f"{PAUSED_FILE_PREFIX}*"))
        if len(paused) >= count:
            return [tuple(int(part) for part in path.name.removeprefix(
                PAUSED_FILE_PREFIX).split("-")) for path in paused]
        assert driver.poll() is None, "the load ended before its tasks paused"
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"{count} paused tasks not seen within {PAUSE_WAIT_TIMEOUT_S} s")


def _wait_writing_tasks(staged_run: Path, driver: subprocess.Popen) -> set[int]:
    """Spark partition ids of the task attempts that have opened an output file in the staged
    run (Spark's task attempt files: .../attempt_<job>_m_<partition>_<attempt>/part-*)."""
    deadline = time.monotonic() + PAUSE_WAIT_TIMEOUT_S
    while True:
        writing = {int(match.group(1)) for path in staged_run.rglob("part-*")
                   if (match := ATTEMPT_PARTITION.search(str(path)))}
        if writing:
            return writing
        assert time.monotonic() < deadline, f"no task attempt file under {staged_run}"
        assert driver.poll() is None, "the load ended while its tasks were paused"
        time.sleep(POLL_INTERVAL_S)


@pytest.mark.timeout(3 * JOB_TIMEOUT_S)
def test_load_sigkilled_worker_mid_job_then_rerun_matches_the_topic_row_by_row(
        cluster, headrace_python, conf_dir, bootstrap, tmp_path):
    """Both partitions' tasks pause half-way (their first attempts only); the worker JVM
    running one whose attempt has opened its output file is SIGKILLed, then the other
    resumes. Spark re-runs the lost task on
    the surviving worker and the load commits; a second load after more records arrive adds
    exactly those. The output then equals the topic, row by row: no duplicate, no gap."""
    records_per_partition = 4000
    topic = new_topic(bootstrap, 2)
    for partition in range(2):
        append(bootstrap, topic, partition,
               [f"a-{partition}-{index}-".ljust(RECORD_BYTES, "x").encode()
                for index in range(records_per_partition)])
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    output_dir = tmp_path / "load"
    load_command = headrace_spark(headrace_python, "load", topic, "--output-dir",
                                  str(output_dir), "--bootstrap-server", bootstrap,
                                  "--master", cluster.master_url)
    driver = subprocess.Popen(
        load_command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
        env=driver_environment(conf_dir, str(headrace_python), **{
            TASK_PAUSE_DIR_ENV: str(pause_dir),
            TASK_PAUSE_OFFSET_ENV: str(records_per_partition // 2)}))
    try:
        paused = _wait_paused_tasks(pause_dir, 2, driver)
        assert sorted(partition for partition, _ in paused) == [0, 1]
        assert len({cluster.worker_holding(pid).pid for _, pid in paused}) == 2
        (staged_run,) = (output_dir / STAGING_DIR_NAME).glob("run-*")
        writing = _wait_writing_tasks(staged_run, driver)
        # The victim's attempt has an output file open: it dies in the middle of its write.
        victim_pid = next(pid for partition, pid in paused if partition in writing)
        killed = cluster.kill_worker_of(victim_pid)
        (pause_dir / RESUME_FILE_NAME).touch()
        stdout, stderr = driver.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0, stdout + without_java_frames(stderr)
    cluster.wait_worker_gone(killed)
    cluster.replace_worker()

    for partition in range(2):
        append(bootstrap, topic, partition, [f"b-{partition}-{index}".encode()
                                             for index in range(10)])
    run_driver(load_command, driver_environment(conf_dir, str(headrace_python)), tmp_path)

    assert [run.run_id for run in committed_runs(output_dir)] == [1, 2]
    assert loaded_records(output_dir) == topic_records(bootstrap, topic, 2)


@pytest.fixture(scope="module")
def three_brokers(tmp_path_factory):
    """Three headrace brokers in cluster mode over a three-node ZooKeeper ensemble (the
    cluster tests' ``Cluster``)."""
    from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble
    from tests.cluster.test_cluster_clients import Cluster as BrokerCluster

    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zookeeper"), size=3)
    ensemble.start()
    try:
        brokers = BrokerCluster(tmp_path_factory.mktemp("brokers"),
                                f"{ensemble.connect_string}/spark-cluster")
        try:
            brokers.start()
            yield brokers
        finally:
            brokers.stop()
    finally:
        ensemble.stop()


def test_load_reads_a_topic_spread_over_three_brokers_on_the_cluster(
        cluster, headrace_python, conf_dir, three_brokers, tmp_path):
    from tests.cluster.test_cluster_clients import create_topic

    topic, leaders = create_topic(three_brokers, 3)
    assert sorted(set(leaders.values())) == [1, 2, 3]
    bootstrap = three_brokers.bootstrap
    for partition in range(3):
        append(bootstrap, topic, partition,
               [f"spread-{partition}-{index}".encode() for index in range(30)])
    output_dir = tmp_path / "load"

    run_driver(headrace_spark(headrace_python, "load", topic, "--output-dir", str(output_dir),
                              "--bootstrap-server", bootstrap, "--master", cluster.master_url),
               driver_environment(conf_dir, str(headrace_python)), tmp_path)

    assert loaded_records(output_dir) == topic_records(bootstrap, topic, 3)
