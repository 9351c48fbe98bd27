"""``headrace cleaner status``: the log cleaner's state per compacted partition.

Reads the ``cleaner-status.json`` file the broker keeps in each data directory (format in
``headrace.broker.cleaner_service``; written at start, after every cleaning and when a
partition's cleaning state changes), so it works on a running or a stopped broker's data and
needs no connection. ``--log-dir PATH`` (repeatable, default ``./data``) names the
directories. The title gives the cleaner's settings (threads configured and alive, offset map
and read size per thread). For each partition: dirty ratio, first dirty offset, log end
offset, size, the last cleaning (when, seconds, MB processed, messages read -> written, size
reduction) and whether the partition is uncleanable, with the reason; then the cleaner
metrics under Kafka's names (DeadThreadCount, cleaner-recopy-percent,
max-compaction-delay-secs, uncleanable-bytes of that log dir...). ``--output json`` prints ``{"log_dirs": [<status file>, ...]}``.

A missing directory, a directory without a status file, or an unreadable file is one line on
stderr and exit status 1. Stateless; runs on the main thread.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from headrace.broker.cleaner_service import STATUS_FILE, STATUS_VERSION
from headrace.broker.config import BROKER_CONFIGS
from headrace.cli.common import OutputFormat, OutputOption, UserError, emit, make_table, user_errors

DEFAULT_LOG_DIR = Path(BROKER_CONFIGS["log.dir"].default)  # the broker's default data dir
MEGABYTE = 1024 * 1024
PARTITION_COLUMNS = ["partition", "dirty ratio", "first dirty", "log end", "size MB",
                     "last cleaned (UTC)", "secs", "MB processed", "messages read -> written",
                     "reduction", "uncleanable"]

app = typer.Typer(no_args_is_help=True, help="Inspect the log cleaner (log compaction).")

LogDirOption = Annotated[
    list[Path] | None,
    typer.Option("--log-dir", help="broker data directory (repeatable); default ./data"),
]


def read_status(log_dir: Path) -> dict[str, Any]:
    """The parsed status file of ``log_dir``; UserError naming the problem otherwise."""
    if not log_dir.exists():
        raise UserError(f"log dir {log_dir} does not exist")
    if not log_dir.is_dir():
        raise UserError(f"log dir {log_dir} is not a directory")
    path = log_dir / STATUS_FILE
    if not path.exists():
        raise UserError(f"{log_dir} has no {STATUS_FILE}: not a headrace broker data directory, "
                        "or the broker has not started there yet")
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"cannot read {path}: {error}") from None
    if not isinstance(document, dict) or document.get("version") != STATUS_VERSION or \
            not isinstance(document.get("partitions"), list):
        raise UserError(f"{path} is not a version {STATUS_VERSION} cleaner status file")
    return document


def _time_text(time_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(time_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _partition_row(entry: dict[str, Any]) -> list[object]:
    last = entry.get("last_cleaning") or {}
    uncleanable = (entry.get("uncleanable_reason") or "yes") if entry.get("uncleanable") else ""
    row: list[object] = [
        f"{entry['topic']}-{entry['partition']}" + (" (cleaning)" if entry.get("in_progress")
                                                    else ""),
        f"{entry['dirty_ratio']:.3f}", entry["first_dirty_offset"], entry["log_end_offset"],
        f"{entry['size_bytes'] / MEGABYTE:.2f}",
    ]
    if last:
        bytes_read = last["bytes_read"]
        reduction = 100.0 * (1 - last["bytes_written"] / bytes_read) if bytes_read else 0.0
        row += [_time_text(last["time_ms"]), f"{last['elapsed_secs']:.2f}",
                f"{bytes_read / MEGABYTE:.2f}",
                f"{last['messages_read']} -> {last['messages_written']}", f"{reduction:.1f}%"]
    else:
        row += ["never", "", "", "", ""]
    return [*row, uncleanable]


def _tables(document: dict[str, Any]):
    enabled = "enabled" if document.get("cleaner_enabled") else "disabled"
    title = (f"{document.get('log_dir')}: cleaner {enabled}, {document.get('threads')} "
             f"thread(s) ({document.get('threads_alive', 0)} alive), "
             f"{document.get('offset_map_bytes', 0) / MEGABYTE:.1f} MB offset map and "
             f"{document.get('io_chunk_bytes', 0) // 1024} KiB reads per thread, "
             f"status of {_time_text(document['written_ms'])} UTC")
    rows = [_partition_row(entry) for entry in document["partitions"]]
    yield make_table(title, PARTITION_COLUMNS, rows)
    metrics = document.get("metrics") or {}
    yield make_table(None, ["metric", "value"],
                     [[name, round(value, 3)] for name, value in sorted(metrics.items())])


@app.command("status")
def status(log_dir: LogDirOption = None, output: OutputOption = OutputFormat.table) -> None:
    """Dirty ratio, first dirty offset, last cleaning and uncleanable state per partition."""
    with user_errors():
        documents = [read_status(path) for path in (log_dir or [DEFAULT_LOG_DIR])]
        tables = [table for document in documents for table in _tables(document)]
        emit(output, {"log_dirs": documents}, *tables)
