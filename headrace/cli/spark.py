"""``headrace spark``: the pipeline jobs on Spark -- load, snapshot, activity, activity-view.

    headrace spark load TOPIC --output-dir DIR [--starting-offsets earliest|latest|JSON]
                                              [--max-offsets N]
    headrace spark snapshot TOPIC --output-dir DIR
    headrace spark activity INPUT_TOPIC OUTPUT_TOPIC --checkpoint DIR [--available-now]
    headrace spark activity-view OUTPUT_TOPIC [--top N]

Every Spark command takes ``--master`` (default ``local[*]``; local masters bind 127.0.0.1 with
the UI off) and ``--bootstrap-server``. The broker and topic are checked before Spark starts,
so an unreachable broker or an unknown topic is one line on stderr and exit status 1, as are a
bad output directory and errors raised by Spark (their first line). The jobs themselves live
in ``headrace.spark.jobs``; this module parses options and prints reports (tables, or one JSON
document with ``--output json``). Stateless; runs on the main thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    connection_options,
    emit,
    fail,
    make_table,
    topic_spark_session,
    user_errors,
)
from headrace.errors import KafkaError
from headrace.spark.jobs.session import DEFAULT_MASTER, JobError, topic_partition_ids

app = typer.Typer(no_args_is_help=True, help="Pipeline jobs on Spark: load, snapshot, activity.")

MasterOption = Annotated[
    str, typer.Option("--master", help="Spark master URL, e.g. local[*] or spark://host:7077")
]
OutputDirOption = Annotated[Path, typer.Option("--output-dir", help="output directory")]


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


@contextmanager
def _job_errors() -> Iterator[None]:
    """User errors of a job, including Spark's, as one line and exit status 1."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with user_errors():
        try:
            yield
        except (JobError, KafkaError) as error:
            raise fail(str(error)) from None
        except (PySparkException, Py4JJavaError) as error:
            raise fail(f"Spark job failed: {_first_line(error)}") from None


@app.command()
@connection_options
def load(
    topic: Annotated[str, typer.Argument(help="topic to load")],
    output_dir: OutputDirOption,
    starting_offsets: Annotated[
        str, typer.Option("--starting-offsets",
                          help="first run only: earliest, latest or {\"topic\":{\"0\":42}}")
    ] = "earliest",
    max_offsets: Annotated[
        int | None, typer.Option("--max-offsets", min=1, help="at most this many per run")
    ] = None,
    master: MasterOption = DEFAULT_MASTER,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Load TOPIC into Parquet under DIR/data, from the offsets the last run committed."""
    from headrace.spark.jobs.load import load_topic

    with _job_errors():
        spark = topic_spark_session(master, f"headrace-load-{topic}", connection, topic)
        report = load_topic(spark, connection.bootstrap_server, topic, output_dir,
                            starting_offsets=starting_offsets, max_offsets=max_offsets)
    title = (f"run {report.run_id}: {report.rows} rows of {topic} committed"
             if report.run_id is not None else f"nothing new in {topic}; no run committed")
    rows = [(p.partition, p.from_offset, p.until_offset, p.rows) for p in report.partitions]
    emit(output, report.to_json(),
         make_table(title, ["partition", "from offset", "until offset", "rows"], rows))


@app.command()
@connection_options
def snapshot(
    topic: Annotated[str, typer.Argument(help="compacted topic")],
    output_dir: OutputDirOption,
    master: MasterOption = DEFAULT_MASTER,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Write TOPIC's latest value per key to DIR/current (Parquet), replacing it atomically."""
    from headrace.spark.jobs.snapshot import snapshot_topic

    with _job_errors():
        spark = topic_spark_session(master, f"headrace-snapshot-{topic}", connection, topic)
        report = snapshot_topic(spark, connection.bootstrap_server, topic, output_dir,
                                now_ms=time.time_ns() // 1_000_000)
    summary = report.to_json()
    emit(output, summary, make_table(f"snapshot of {topic}", ["", ""], list(summary.items())))


@app.command()
@connection_options
def activity(
    input_topic: Annotated[str, typer.Argument(help="page-view events keyed by member id")],
    output_topic: Annotated[str, typer.Argument(help="compacted topic of counts per member")],
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Spark checkpoint dir")],
    available_now: Annotated[
        bool, typer.Option("--available-now", help="count what is there now, then stop")
    ] = False,
    trigger_interval_s: Annotated[
        int, typer.Option("--trigger-interval-s", min=1, help="micro-batch interval")
    ] = 10,
    max_offsets_per_trigger: Annotated[
        int | None, typer.Option("--max-offsets-per-trigger", min=1)
    ] = None,
    master: MasterOption = DEFAULT_MASTER,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Maintain per-member visit counts from INPUT_TOPIC in the compacted OUTPUT_TOPIC."""
    from headrace.spark.jobs.activity import run_activity

    with _job_errors():
        spark = topic_spark_session(master, f"headrace-activity-{input_topic}", connection,
                                    input_topic)
        report = run_activity(spark, connection.bootstrap_server, input_topic, output_topic,
                              str(checkpoint.absolute()), available_now=available_now,
                              trigger_interval_s=trigger_interval_s,
                              max_offsets_per_trigger=max_offsets_per_trigger)
    summary = report.to_json()
    emit(output, summary, make_table("activity", ["", ""], list(summary.items())))


@app.command("activity-view")
@connection_options
def activity_view(
    output_topic: Annotated[str, typer.Argument(help="the activity job's output topic")],
    top: Annotated[int, typer.Option("--top", min=0, help="members shown in the table")] = 20,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Restore every member's visit count by reading the compacted topic once."""
    from headrace.spark.jobs.activity import restore_view

    with _job_errors():
        topic_partition_ids(connection.bootstrap_server, output_topic,
                            connection.request_timeout_ms)
        view = restore_view(connection.bootstrap_server, output_topic)
    ranked = sorted(view.counts.items(), key=lambda item: (-item[1], item[0]))
    document = {"topic": output_topic, "members": len(view.counts),
                "records_read": view.records_read,
                "counts": {key.decode("utf-8", "backslashreplace"): count
                           for key, count in ranked}}
    title = (f"{len(view.counts)} members from {view.records_read} records of "
             f"{output_topic}")
    rows = [(key.decode("utf-8", "backslashreplace"), count) for key, count in ranked[:top]]
    emit(output, document, make_table(title, ["member", "visits"], rows))
