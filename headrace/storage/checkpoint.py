"""Offset checkpoint files of a data directory, in Kafka's text format.

Owns ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and
``replication-offset-checkpoint`` (the high watermarks replication manages). Format::

    0                      <- version
    2                      <- number of entries
    orders 0 1234          <- "topic partition offset", one line per partition
    orders 1 88

Written atomically (``.tmp`` sibling, fsync, rename, fsync of the directory) so a crash leaves
the old or the new file, never a torn one. A file that does not parse is reported with
``CheckpointCorrupt``; the caller falls back to full recovery. Stateless; thread-safe.
"""

from __future__ import annotations

from pathlib import Path

from headrace.storage.fs import FileSystem, read_whole_file, write_file_atomically

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CHECKPOINT_VERSION = 0


class CheckpointCorrupt(Exception):
    pass


def write_checkpoint(fs: FileSystem, path: Path, offsets: dict[tuple[str, int], int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    write_file_atomically(fs, path, ("\n".join(lines) + "\n").encode())


def read_checkpoint(fs: FileSystem, path: Path) -> dict[tuple[str, int], int]:
    """The offsets in ``path`` ({} if it does not exist)."""
    if not fs.exists(path):
        return {}
    lines = read_whole_file(fs, path).decode("utf-8", "replace").splitlines()
    try:
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise CheckpointCorrupt(f"{path}: unknown version {lines[0]}")
        expected = int(lines[1])
        offsets = {}
        for line in lines[2:]:
            topic, partition, offset = line.split(" ")
            offsets[(topic, int(partition))] = int(offset)
    except (IndexError, ValueError) as error:
        raise CheckpointCorrupt(f"{path}: {error}") from None
    if len(offsets) != expected:
        raise CheckpointCorrupt(f"{path}: expected {expected} entries, found {len(offsets)}")
    return offsets
