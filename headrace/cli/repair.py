"""``headrace repair``: repair the damaged partition logs of a stopped broker's data.

``headrace repair --log-dir PATH [--log-dir PATH ...] [--dry-run] [--accept-gap]
[--topic NAME]`` checks every partition directory (a CRC scan of every segment, see
``headrace.storage.repair``) and, per damaged partition, truncates the log before the first bad
batch, gap or overlap (deleting the segments after it), or with ``--accept-gap`` records a gap
as accepted so the broker serves the partition with it. ``--dry-run`` prints what it would do
and changes nothing. One line per damage on stdout ("<topic>-<partition>: <what was found>;
<what was done>"), then a summary line; or, with ``--output json``, one document
``{"dry_run", "damaged_partitions", "repairs": [{"partition", "action"}]}``. A missing or unreadable directory is one line on
stderr and exit status 1. Compacted topics (``cleanup.policy`` override containing
``compact``) may have gaps. Run it only while the broker is stopped. Stateless; main thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from headrace.cli.common import OutputFormat, OutputOption, UserError, report, user_errors
from headrace.errors import KafkaError
from headrace.storage.fs import RealFileSystem
from headrace.storage.manager import parse_partition_dir_name, topic_overrides
from headrace.storage.repair import repair_partition


def repair(
    log_dir: Annotated[list[Path], typer.Option("--log-dir", help="broker data directory "
                                                "(repeatable; the first holds topic configs)")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would be done, "
                                          "change nothing")] = False,
    accept_gap: Annotated[bool, typer.Option("--accept-gap", help="keep the segments after a "
                                             "gap and record the gap as accepted")] = False,
    topic: Annotated[str | None, typer.Option("--topic", help="only this topic")] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Repair damaged partition logs of a stopped broker (truncate before the damage)."""
    with user_errors():
        for directory in log_dir:
            if not directory.is_dir():
                raise UserError(f"log dir {directory} is not a directory")
        repairs: list[dict[str, str]] = []

        def record(partition: str, action: str) -> None:  # people see each one at once
            if output is OutputFormat.json:
                repairs.append({"partition": partition, "action": action})
            else:
                typer.echo(f"{partition}: {action}")

        damaged = 0
        for directory in log_dir:
            damaged += _repair_log_dir(directory, log_dir[0], dry_run, accept_gap, topic,
                                       record)
        verb = "would be repaired" if dry_run else "repaired"
        report(output, f"{damaged} damaged partition(s) {verb}",
               {"dry_run": dry_run, "damaged_partitions": damaged, "repairs": repairs})


def _repair_log_dir(directory: Path, configs_dir: Path, dry_run: bool, accept_gap: bool,
                    only_topic: str | None, record: Callable[[str, str], None]) -> int:
    """Repair (or with ``dry_run`` plan) each partition of ``directory``, ``record``-ing
    (partition, action) per damage; returns the number of damaged partitions."""
    fs = RealFileSystem()
    damaged = 0
    for name in sorted(fs.listdir(directory)):
        key = parse_partition_dir_name(name)
        if key is None or not (directory / name).is_dir() or \
                only_topic not in (None, key[0]):
            continue
        policy = topic_overrides(configs_dir, key[0]).get("cleanup.policy", "delete")
        try:
            lines = repair_partition(fs, directory / name, "compact" in policy, accept_gap,
                                     dry_run)
        except (KafkaError, OSError) as error:
            raise UserError(f"{directory / name}: {error}") from None
        for line in lines:
            record(f"{key[0]}-{key[1]}", line)
        damaged += bool(lines)
    return damaged
