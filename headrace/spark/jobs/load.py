"""The load job: a topic into Parquet, incrementally, with its offsets committed alongside.

Owns ``load_topic`` (``headrace spark load``) and the layout of its output directory, on a local
(or locally mounted, shared) file system:

    DIR/.lock                      flock held by the running load; one load per DIR at a time
    DIR/_staging/run-<id>-<hex>/   a run being written; anything here is an unfinished run
    DIR/data/run=<id>/             committed runs, <id> zero-padded to RUN_ID_DIGITS
        part-*.parquet             the records [start, end) of every partition in this run
        _offsets.json              {"format": 1, "topic", "run", "start", "end", "rows",
                                    "partitions": [{"partition", "from_offset",
                                    "until_offset", "rows"}]}; start/end in Spark's JSON form
                                    {"topic": {"0": next_offset}}

Read the table with ``spark.read.parquet("DIR/data")``: Spark skips files starting with ``_``
and adds the ``run`` column from the directory names. Columns are the source's: key, value,
topic, partition, offset, timestamp, timestampType.

Commit protocol (seed 002: the offsets are stored with the output, in one atomic step):
1. Take the lock, delete ``_staging`` (leftovers of a killed run), and find the committed
   offsets: the ``end`` of the highest ``data/run=<id>`` holding ``_offsets.json``. Run dirs
   without it cannot be produced by this protocol and are removed. Partitions not committed yet
   start at ``--starting-offsets`` (first run: earliest, latest or Spark's per-partition JSON)
   or, once a run exists, at their earliest offset (partitions added later).
2. End offsets are the latest offsets now, limited by ``max_offsets`` (Spark's
   maxOffsetsPerTrigger sharing across partitions by backlog).
3. Spark writes the records into a fresh staging dir (a unique name, so a JVM still running
   after its driver was killed cannot mix files into a later run); the job counts the staged
   rows per partition from the Parquet footers (no second Spark job), writes
   ``_offsets.json`` into the same dir, and fsyncs everything.
4. One ``rename`` moves the staging dir to ``data/run=<id>``: that is the commit. Then the
   parent directory is fsynced.
A SIGKILL before step 4 leaves only staging files (discarded by the next run, which re-reads
the same offsets); after it, the run is complete. Either way no record is loaded twice or
skipped. A run with no new offsets commits nothing, except the very first run, which always
records its starting point.

The job runs on the driver's main thread; the lock excludes concurrent loads into one DIR.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from headrace.spark.jobs.faults import CrashHook, crash_hook_from_env, task_fault_from_env
from headrace.spark.jobs.session import JobError
from headrace.spark.offsets import (
    BrokerOffsets,
    OffsetRange,
    PartitionOffsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    rate_limit,
    resolve_offsets,
)
from headrace.spark.options import OptionError, Subscription, parse_source_options

DATA_DIR_NAME = "data"
STAGING_DIR_NAME = "_staging"
LOCK_FILE_NAME = ".lock"
OFFSETS_FILE_NAME = "_offsets.json"
RUN_DIR_PREFIX = "run="
RUN_ID_DIGITS = 8
OFFSETS_FORMAT_VERSION = 1
CRASH_POINTS = ("after-staging-write", "after-offsets-write", "after-rename")


@dataclass(frozen=True, slots=True)
class PartitionLoad:
    """What one run loaded from one partition: offsets [from_offset, until_offset)."""

    partition: int
    from_offset: int
    until_offset: int
    rows: int


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One run of the load job. ``run_id`` is None when there was nothing new to commit."""

    topic: str
    output_dir: str
    run_id: int | None
    rows: int
    partitions: tuple[PartitionLoad, ...]

    def to_json(self) -> dict:
        return {"topic": self.topic, "output_dir": self.output_dir, "run": self.run_id,
                "committed": self.run_id is not None, "rows": self.rows,
                "partitions": [asdict(partition) for partition in self.partitions]}


@dataclass(frozen=True, slots=True)
class CommittedRun:
    run_id: int
    path: Path
    end: PartitionOffsets


def run_dir_name(run_id: int) -> str:
    return f"{RUN_DIR_PREFIX}{run_id:0{RUN_ID_DIGITS}d}"


def _parse_run_id(name: str) -> int | None:
    digits = name.removeprefix(RUN_DIR_PREFIX)
    if name.startswith(RUN_DIR_PREFIX) and digits.isdigit():
        return int(digits)
    return None


def committed_runs(output_dir: Path) -> list[CommittedRun]:
    """The complete runs in ``output_dir``, oldest first."""
    data_dir = Path(output_dir) / DATA_DIR_NAME
    if not data_dir.is_dir():
        return []
    runs = []
    for child in data_dir.iterdir():
        run_id = _parse_run_id(child.name)
        offsets_path = child / OFFSETS_FILE_NAME
        if run_id is not None and offsets_path.is_file():
            document = json.loads(offsets_path.read_text())
            runs.append(CommittedRun(run_id, child, offsets_from_json(document["end"])))
    return sorted(runs, key=lambda run: run.run_id)


def _remove_incomplete(output_dir: Path) -> None:
    shutil.rmtree(output_dir / STAGING_DIR_NAME, ignore_errors=True)
    data_dir = output_dir / DATA_DIR_NAME
    if not data_dir.is_dir():
        return
    for child in data_dir.iterdir():
        if _parse_run_id(child.name) is not None and not (child / OFFSETS_FILE_NAME).is_file():
            shutil.rmtree(child, ignore_errors=True)


def _check_output_dir(output_dir: Path) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise JobError(f"output directory {output_dir} is not a directory")
    ours = {DATA_DIR_NAME, STAGING_DIR_NAME, LOCK_FILE_NAME}
    if output_dir.is_dir():
        foreign = sorted(child.name for child in output_dir.iterdir() if child.name not in ours)
        if foreign:
            raise JobError(f"output directory {output_dir} holds files of something else "
                           f"({', '.join(foreign[:3])}); use an empty or a load directory")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise JobError(f"cannot create output directory {output_dir}: {error.strerror}") from None


@contextmanager
def _exclusive_lock(output_dir: Path) -> Iterator[None]:
    descriptor = os.open(output_dir / LOCK_FILE_NAME, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobError(f"another load is running in {output_dir}") from None
        yield
    finally:
        os.close(descriptor)


def _fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync_path(Path(directory) / name)
        _fsync_path(Path(directory))


def _first_run_start(starting_offsets: str, topic: str, keys: list[tuple[str, int]],
                     broker: BrokerOffsets, client_config: dict[str, str]) -> PartitionOffsets:
    options = {f"kafka.{key}": value for key, value in client_config.items()}
    options.update({"subscribe": topic, "startingOffsets": starting_offsets})
    try:
        spec = parse_source_options(options, streaming=True).starting
    except OptionError as error:
        raise JobError(f"--starting-offsets: {error}") from None
    if spec.kind not in ("earliest", "latest", "offsets"):
        raise JobError("--starting-offsets must be earliest, latest or per-partition JSON")
    try:
        return resolve_offsets(spec, keys, broker, is_starting=True)
    except OptionError as error:
        raise JobError(f"--starting-offsets: {error}") from None


def _plan(topic: str, committed: CommittedRun | None, starting_offsets: str,
          max_offsets: int | None, fail_on_data_loss: bool,
          client_config: dict[str, str]) -> tuple[PartitionOffsets, PartitionOffsets,
                                                   list[OffsetRange]]:
    broker = BrokerOffsets(client_config)
    keys = broker.topic_partitions(Subscription("subscribe", topics=(topic,)))
    if not keys:
        raise JobError(f"unknown topic {topic!r}")
    if committed is None:
        start = _first_run_start(starting_offsets, topic, keys, broker, client_config)
    else:
        start = {key: offset for key, offset in committed.end.items() if key[0] == topic}
    added = [key for key in keys if key not in start]
    earliest_of_added = broker.earliest(added)
    latest = broker.latest(keys)
    end = latest
    if max_offsets is not None:
        end = rate_limit(max_offsets, start, latest, earliest_of_added.__getitem__)
    ranges = plan_ranges(start, end, fail_on_data_loss, earliest_of_added.__getitem__)
    full_start = {**earliest_of_added, **start}
    return full_start, end, ranges


def _read_ranges(spark, ranges: list[OffsetRange], fail_on_data_loss: bool,
                 client_config: dict[str, str]):
    topic = ranges[0].topic
    assign = {topic: [offset_range.partition for offset_range in ranges]}
    starting = {topic: {str(r.partition): r.from_offset for r in ranges}}
    ending = {topic: {str(r.partition): r.until_offset for r in ranges}}
    reader = spark.read.format("headrace")
    for key, value in client_config.items():
        reader = reader.option(f"kafka.{key}", value)
    return (reader.option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("failOnDataLoss", str(fail_on_data_loss).lower())
            .load())


def _file_rows_by_partition(path: Path) -> Counter[int]:
    """Rows per Kafka partition in one Parquet file, from its footer when the row groups'
    statistics pin each group to one partition (one task reads one partition, so they do),
    else from the partition column itself."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parquet_file = pq.ParquetFile(path)
    metadata = parquet_file.metadata
    column_index = metadata.schema.to_arrow_schema().get_field_index("partition")
    rows: Counter[int] = Counter()
    for group_index in range(metadata.num_row_groups):
        group = metadata.row_group(group_index)
        statistics = group.column(column_index).statistics
        if (statistics is None or not statistics.has_min_max or statistics.null_count
                or statistics.min != statistics.max):
            counts = pc.value_counts(parquet_file.read_row_group(
                group_index, columns=["partition"]).column("partition"))
            rows.update({item["values"].as_py(): item["counts"].as_py() for item in counts})
        elif group.num_rows:
            rows[statistics.min] += group.num_rows
    return rows


def _staged_rows_by_partition(staging_dir: Path) -> dict[int, int]:
    """Rows per Kafka partition of a staged run, read from the Parquet footers on the driver
    (no Spark job: O(files), not O(rows))."""
    rows: Counter[int] = Counter()
    for path in sorted(staging_dir.glob("part-*.parquet")):
        rows.update(_file_rows_by_partition(path))
    return dict(rows)


def _partition_loads(start: PartitionOffsets, end: PartitionOffsets,
                     rows_by_partition: dict[int, int]) -> tuple[PartitionLoad, ...]:
    return tuple(
        PartitionLoad(partition, start.get((topic, partition), until_offset), until_offset,
                      rows_by_partition.get(partition, 0))
        for (topic, partition), until_offset in sorted(end.items())
    )


def _write_offsets_file(run_dir: Path, topic: str, run_id: int, start: PartitionOffsets,
                        end: PartitionOffsets, loads: tuple[PartitionLoad, ...]) -> None:
    document = {
        "format": OFFSETS_FORMAT_VERSION, "topic": topic, "run": run_id,
        "start": offsets_to_json(start), "end": offsets_to_json(end),
        "rows": sum(load.rows for load in loads),
        "partitions": [asdict(load) for load in loads],
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / OFFSETS_FILE_NAME).write_text(json.dumps(document, indent=1) + "\n")


def _stage(spark, staging_dir: Path, ranges: list[OffsetRange], fail_on_data_loss: bool,
           client_config: dict[str, str]) -> dict[int, int]:
    """Write the ranges' records as Parquet into ``staging_dir``; rows per partition."""
    if not ranges:
        return {}
    frame = task_fault_from_env(_read_ranges(spark, ranges, fail_on_data_loss, client_config))
    frame.write.mode("errorifexists").parquet(str(staging_dir))
    return _staged_rows_by_partition(staging_dir)


def load_topic(spark, bootstrap: str, topic: str, output_dir: str | Path, *,
               starting_offsets: str = "earliest", max_offsets: int | None = None,
               fail_on_data_loss: bool = True, client_config: dict[str, str] | None = None,
               crash_hook: CrashHook | None = None) -> LoadReport:
    """Load ``topic`` from the committed offsets to the latest ones; see the module docstring.

    ``crash_hook(point)`` is called at each of CRASH_POINTS (default: $HEADRACE_JOB_CRASH_AT).
    """
    output_dir = Path(output_dir).absolute()
    crash_hook = crash_hook or crash_hook_from_env(CRASH_POINTS)
    config = {"bootstrap.servers": bootstrap, **(client_config or {})}
    _check_output_dir(output_dir)
    with _exclusive_lock(output_dir):
        _remove_incomplete(output_dir)
        runs = committed_runs(output_dir)
        committed = runs[-1] if runs else None
        start, end, ranges = _plan(topic, committed, starting_offsets, max_offsets,
                                   fail_on_data_loss, config)
        if committed is not None and not ranges and end == committed.end:
            return LoadReport(topic, str(output_dir), None, 0,
                              _partition_loads(start, end, {}))
        run_id = committed.run_id + 1 if committed else 1
        staging_dir = output_dir / STAGING_DIR_NAME / f"run-{run_id}-{uuid.uuid4().hex}"
        rows_by_partition = _stage(spark, staging_dir, ranges, fail_on_data_loss, config)
        crash_hook("after-staging-write")
        loads = _partition_loads(start, end, rows_by_partition)
        _write_offsets_file(staging_dir, topic, run_id, start, end, loads)
        _fsync_tree(staging_dir)
        crash_hook("after-offsets-write")
        data_dir = output_dir / DATA_DIR_NAME
        data_dir.mkdir(exist_ok=True)
        os.rename(staging_dir, data_dir / run_dir_name(run_id))
        _fsync_path(data_dir)
        crash_hook("after-rename")
        return LoadReport(topic, str(output_dir), run_id, sum(rows_by_partition.values()),
                          loads)
