"""``headrace dump-log FILE...``: inspect segment files on disk, like ``kafka-dump-log.sh``.

Reads Kafka's on-disk formats directly (no broker needed):

- ``<base>.log``: entries of ``int64 base_offset, int32 length, ...``; v2 batches show base and
  last offset, record count, position, size, magic, codec, whether the CRC-32C is valid,
  timestamps, producer id/epoch and base/last sequence; legacy (magic 0/1) entries show
  offset, position, size and magic. ``--deep`` decodes every record (offset, timestamp, key,
  value, headers) with ``headrace.protocol.records``.
- ``<base>.index``: 8-byte entries ``int32 relative_offset, int32 position``.
- ``<base>.timeindex``: 12-byte entries ``int64 timestamp, int32 relative_offset``.
  Index files Kafka preallocated end at the first all-zero entry after the first one.
- ``--verify-index`` checks every index entry against the sibling ``.log``: an offset entry
  must point at the position of a batch whose last offset it names, a time entry must name a
  batch's last offset and the largest timestamp seen up to it; both must increase.

Damage (a CRC mismatch, a truncated entry, an undecodable record, an index mismatch) is
reported in the output, never as a traceback, and makes the exit status 1 once every file has
been dumped. Keys and values print as UTF-8 with undecodable bytes as ``\\xNN`` escapes.
``--output json`` prints one JSON document with the same fields.

Files are read once into memory (mmap for non-empty files). Stateless; single-threaded.
"""

from __future__ import annotations

import json
import mmap
import struct
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from headrace.cli.common import OutputFormat, OutputOption
from headrace.errors import CorruptMessage, KafkaError
from headrace.protocol.batch import (
    BATCH_HEADER_BYTES,
    CURRENT_MAGIC,
    LOG_OVERHEAD_BYTES,
    MAGIC_OFFSET,
    crc_is_valid,
    parse_header,
)
from headrace.protocol.compression import CODEC_NAMES
from headrace.protocol.records import Record, decode_batch, decode_legacy

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
_ENTRY_PREFIX = struct.Struct(">qi")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


@dataclass(slots=True)
class RecordInfo:
    offset: int
    timestamp_ms: int
    key: str | None
    value: str | None
    headers: dict[str, str | None]


@dataclass(slots=True)
class BatchInfo:
    base_offset: int
    position: int
    size_bytes: int
    magic: int
    last_offset: int | None = None
    count: int | None = None
    codec: str | None = None
    crc_valid: bool | None = None
    timestamp_type: str | None = None
    base_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    producer_id: int | None = None
    producer_epoch: int | None = None
    base_sequence: int | None = None
    last_sequence: int | None = None
    partition_leader_epoch: int | None = None
    is_transactional: bool | None = None
    is_control: bool | None = None
    records: list[RecordInfo] | None = None
    error: str | None = None


@dataclass(slots=True)
class FileReport:
    """What one file holds, and the problems found in it."""

    file: str
    kind: str
    base_offset: int | None
    batches: list[BatchInfo] = field(default_factory=list)
    entries: list[dict[str, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading files


def _read_file(path: Path) -> bytes | mmap.mmap:
    with open(path, "rb") as stream:
        size_bytes = stream.seek(0, 2)
        if size_bytes == 0:
            return b""
        return mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)


def base_offset_of(path: Path) -> int | None:
    """The segment base offset in the file name (``00000000000000000042.log`` -> 42)."""
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else None


def _display(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


# ---------------------------------------------------------------- .log segments


def iter_batches(data: bytes | mmap.mmap, problems: list[str]) -> Iterator[BatchInfo]:
    """Every entry of a segment, shallowly; a truncated tail ends the walk with a problem."""
    position, end = 0, len(data)
    while position < end:
        if end - position <= MAGIC_OFFSET:  # not even the magic byte is there
            problems.append(f"truncated entry at position {position}: {end - position} bytes")
            return
        base_offset, length = _ENTRY_PREFIX.unpack_from(data, position)
        size_bytes = LOG_OVERHEAD_BYTES + length
        if length < 0 or position + size_bytes > end:
            problems.append(f"entry at position {position} claims {size_bytes} bytes but "
                            f"only {end - position} remain")
            return
        batch = BatchInfo(base_offset, position, size_bytes, data[position + MAGIC_OFFSET])
        if batch.magic == CURRENT_MAGIC:
            _fill_v2_header(batch, data)
        yield batch
        position += size_bytes


def _fill_v2_header(batch: BatchInfo, data: bytes | mmap.mmap) -> None:
    if batch.size_bytes < BATCH_HEADER_BYTES:
        batch.error = f"v2 batch of {batch.size_bytes} bytes is shorter than its header"
        return
    header = parse_header(data, batch.position)
    batch.last_offset = header.last_offset
    batch.count = header.records_count
    batch.codec = CODEC_NAMES.get(header.compression, f"unknown({header.compression})")
    batch.crc_valid = crc_is_valid(data, batch.position, header)
    batch.timestamp_type = "LogAppendTime" if header.is_log_append_time else "CreateTime"
    batch.base_timestamp_ms = header.base_timestamp
    batch.max_timestamp_ms = header.max_timestamp
    batch.producer_id = header.producer_id
    batch.producer_epoch = header.producer_epoch
    batch.base_sequence = header.base_sequence
    batch.last_sequence = header.last_sequence
    batch.partition_leader_epoch = header.partition_leader_epoch
    batch.is_transactional = header.is_transactional
    batch.is_control = header.is_control
    if not batch.crc_valid:
        batch.error = (f"CRC-32C mismatch: stored {header.crc:#010x}, "
                       f"computed over the batch differs")


def _decode_records(batch: BatchInfo, data: bytes | mmap.mmap) -> None:
    entry = data[batch.position : batch.position + batch.size_bytes]
    try:
        if batch.magic == CURRENT_MAGIC:
            records: tuple[Record, ...] | list[Record] = decode_batch(entry).records
        else:
            records = decode_legacy(entry)
    except (CorruptMessage, KafkaError) as error:
        batch.error = batch.error or f"records not decodable: {error}"
        return
    batch.records = [
        RecordInfo(record.offset, record.timestamp_ms, _display(record.key),
                   _display(record.value),
                   {header.key: _display(header.value) for header in record.headers})
        for record in records
    ]


def dump_segment(path: Path, deep: bool) -> FileReport:
    report = FileReport(str(path), "log", base_offset_of(path))
    data = _read_file(path)
    for batch in iter_batches(data, report.problems):
        if deep and batch.error is None:
            _decode_records(batch, data)
        if batch.error is not None:
            report.problems.append(f"batch at position {batch.position}: {batch.error}")
        report.batches.append(batch)
    return report


# ---------------------------------------------------------------- index files


def _index_entries(path: Path, entry_struct: struct.Struct, problems: list[str]
                   ) -> Iterator[tuple[int, int]]:
    data = _read_file(path)
    whole_bytes = len(data) - len(data) % entry_struct.size
    if whole_bytes != len(data):
        problems.append(f"{len(data) - whole_bytes} trailing bytes after the last whole entry")
    for slot, position in enumerate(range(0, whole_bytes, entry_struct.size)):
        first, second = entry_struct.unpack_from(data, position)
        if slot > 0 and first == 0 and second == 0:  # Kafka's preallocated, unused tail
            return
        yield first, second


def dump_offset_index(path: Path) -> FileReport:
    base_offset = base_offset_of(path) or 0
    report = FileReport(str(path), "offset index", base_offset)
    for relative_offset, position in _index_entries(path, _OFFSET_ENTRY, report.problems):
        report.entries.append({"offset": base_offset + relative_offset, "position": position})
    return report


def dump_time_index(path: Path) -> FileReport:
    base_offset = base_offset_of(path) or 0
    report = FileReport(str(path), "time index", base_offset)
    for timestamp_ms, relative_offset in _index_entries(path, _TIME_ENTRY, report.problems):
        report.entries.append({"timestamp_ms": timestamp_ms,
                               "offset": base_offset + relative_offset})
    return report


def _segment_batches(index_path: Path, report: FileReport) -> list[BatchInfo] | None:
    log_path = index_path.with_suffix(LOG_SUFFIX)
    if not log_path.exists():
        report.problems.append(f"cannot verify: {log_path} does not exist")
        return None
    return list(iter_batches(_read_file(log_path), []))


def verify_offset_index(report: FileReport, path: Path) -> None:
    batches = _segment_batches(path, report)
    if batches is None:
        return
    by_position = {batch.position: batch for batch in batches}
    previous_offset = previous_position = -1
    for entry in report.entries:
        offset, position = entry["offset"], entry["position"]
        batch = by_position.get(position)
        if batch is None:
            report.problems.append(f"index offset {offset}: no batch starts at position "
                                   f"{position}")
        elif batch.last_offset != offset:
            report.problems.append(f"index offset {offset} at position {position}: the batch "
                                   f"there ends at offset {batch.last_offset}")
        if offset <= previous_offset or position <= previous_position:
            report.problems.append(f"index entry offset {offset} position {position} does not "
                                   f"follow offset {previous_offset} position "
                                   f"{previous_position}")
        previous_offset, previous_position = offset, position


def verify_time_index(report: FileReport, path: Path) -> None:
    batches = _segment_batches(path, report)
    if batches is None:
        return
    running_max_by_last_offset: dict[int, int] = {}
    running_max = -1
    for batch in batches:
        if batch.last_offset is not None:
            running_max = max(running_max, batch.max_timestamp_ms)
            running_max_by_last_offset[batch.last_offset] = running_max
    previous_timestamp = -1
    for entry in report.entries:
        timestamp_ms, offset = entry["timestamp_ms"], entry["offset"]
        expected = running_max_by_last_offset.get(offset)
        if expected is None:
            report.problems.append(f"time index offset {offset}: no batch ends at that offset")
        elif expected != timestamp_ms:
            report.problems.append(f"time index offset {offset}: timestamp {timestamp_ms}, but "
                                   f"the largest timestamp up to it is {expected}")
        if timestamp_ms <= previous_timestamp:
            report.problems.append(f"time index timestamp {timestamp_ms} at offset {offset} "
                                   f"does not grow (previous {previous_timestamp})")
        previous_timestamp = timestamp_ms


def dump_file(path: Path, deep: bool, verify_index: bool) -> FileReport:
    if path.suffix == LOG_SUFFIX:
        return dump_segment(path, deep)
    if path.suffix == INDEX_SUFFIX:
        report = dump_offset_index(path)
        if verify_index:
            verify_offset_index(report, path)
        return report
    if path.suffix == TIME_INDEX_SUFFIX:
        report = dump_time_index(path)
        if verify_index:
            verify_time_index(report, path)
        return report
    raise ValueError(f"{path}: not a .log, .index or .timeindex file")


# ---------------------------------------------------------------- text output


def _flag(value: bool | None) -> str:
    return str(value).lower()


def _batch_line(batch: BatchInfo) -> str:
    if batch.magic != CURRENT_MAGIC or batch.last_offset is None:
        return (f"offset: {batch.base_offset} position: {batch.position} "
                f"size: {batch.size_bytes} magic: {batch.magic}")
    return (
        f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
        f"count: {batch.count} baseSequence: {batch.base_sequence} "
        f"lastSequence: {batch.last_sequence} producerId: {batch.producer_id} "
        f"producerEpoch: {batch.producer_epoch} "
        f"partitionLeaderEpoch: {batch.partition_leader_epoch} "
        f"isTransactional: {_flag(batch.is_transactional)} "
        f"isControl: {_flag(batch.is_control)} position: {batch.position} "
        f"{batch.timestamp_type}: {batch.max_timestamp_ms} "
        f"baseTimestamp: {batch.base_timestamp_ms} size: {batch.size_bytes} "
        f"magic: {batch.magic} compresscodec: {batch.codec} crcValid: {_flag(batch.crc_valid)}"
    )


def _record_line(record: RecordInfo) -> str:
    headers = ",".join(f"{key}={'' if value is None else value}"
                       for key, value in record.headers.items())
    return (f"| offset: {record.offset} timestamp: {record.timestamp_ms} "
            f"headers: [{headers}] key: {record.key} payload: {record.value}")


def render_text(report: FileReport) -> Iterator[str]:
    yield f"Dumping {report.file}"
    if report.kind == "log":
        yield f"Log starting offset: {report.base_offset}"
        for batch in report.batches:
            yield _batch_line(batch)
            for record in batch.records or ():
                yield _record_line(record)
    for entry in report.entries:
        yield " ".join(f"{name}: {value}" for name, value in entry.items())
    for problem in report.problems:
        yield f"PROBLEM: {problem}"


# ---------------------------------------------------------------- the command


def dump_log(
    files: Annotated[list[Path], typer.Argument(help=".log, .index or .timeindex files")],
    deep: Annotated[bool, typer.Option("--deep", help="decode every record")] = False,
    verify_index: Annotated[
        bool, typer.Option("--verify-index", help="check index entries against the .log")
    ] = False,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Print the batches, records or index entries of segment files (no broker needed)."""
    reports, unreadable = [], 0
    for path in files:
        try:
            report = dump_file(path, deep, verify_index)
        except OSError as error:
            typer.echo(f"headrace: {error.strerror or error}: {path}", err=True)
            unreadable += 1
            continue
        except ValueError as error:
            typer.echo(f"headrace: {error}", err=True)
            unreadable += 1
            continue
        reports.append(report)
        if output is OutputFormat.table:
            sys.stdout.write("".join(line + "\n" for line in render_text(report)))
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps([asdict(report) for report in reports], indent=2) + "\n")
    if unreadable or any(report.problems for report in reports):
        raise typer.Exit(1)
