"""Seeded keyed workloads for the cleaner tests (and the SIGKILL subprocess): an oracle of the
latest value per key, like Kafka's LogCompactionTester."""

from __future__ import annotations

import random
from pathlib import Path

from headrace.protocol.compression import GZIP, NONE
from headrace.protocol.kernel import decode_columns
from headrace.protocol.records import build_batch
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log

NOW_MS = 1_700_000_000_000


def compact_config(**overrides) -> LogConfig:
    settings = dict(cleanup_policy=("compact",), segment_bytes=16 * 1024,
                    index_interval_bytes=512, min_cleanable_dirty_ratio=0.0,
                    delete_retention_ms=1000)
    settings.update(overrides)
    return LogConfig(**settings)


def open_log(path: Path, config: LogConfig, now_ms: int = NOW_MS) -> Log:
    return Log("t", 0, path, config, RealFileSystem(), now_ms, recovery_point=0)


def append_workload(log: Log, seed: int, keys: int, batches: int, delete_fraction: float,
                    now_ms: int = NOW_MS) -> dict[bytes, bytes | None]:
    """Append random batches of updates and deletes; returns key -> latest value (None for
    a deleted key). Half the batches are gzip-compressed."""
    rng = random.Random(seed)
    oracle: dict[bytes, bytes | None] = {}
    for batch_number in range(batches):
        records = []
        for _ in range(rng.randint(1, 8)):
            key = b"k%d" % rng.randrange(keys)
            value = None if rng.random() < delete_fraction else b"v%d-%d" % (batch_number, rng.random() * 1e9)
            records.append((key, value, [], now_ms))
            oracle[key] = value
        codec = GZIP if batch_number % 2 else NONE
        log.append(bytearray(build_batch(records, compression=codec)), now_ms)
    return oracle


def read_records(log: Log, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from ``start`` (default: log start)."""
    offset = log.log_start_offset if start is None else start
    records = []
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        data = b"".join(piece.read_bytes() for piece in result.slices)
        columns = decode_columns(data)
        for i in range(columns.count):
            key = bytes(columns.key_data[columns.key_offsets[i]:columns.key_offsets[i + 1]]) \
                if columns.key_valid[i] else None
            value = bytes(columns.value_data[columns.value_offsets[i]:columns.value_offsets[i + 1]]) \
                if columns.value_valid[i] else None
            records.append((int(columns.offsets[i]), key, value))
        if columns.next_offset <= offset:
            break
        offset = columns.next_offset
    return records


def latest_values(records: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, bytes | None]:
    latest: dict[bytes, bytes | None] = {}
    for _, key, value in records:
        latest[key] = value
    return latest
