"""The leader-epoch cache of one partition's log, as Kafka's ``LeaderEpochFileCache`` (KIP-101,
KIP-279): which leader epoch wrote from which offset on, so that a follower can ask the leader
where its copy of an epoch ends (OffsetForLeaderEpoch) and truncate by epoch rather than by
the high watermark.

Owns ``<partition dir>/leader-epoch-checkpoint``, Kafka's format::

    0              <- version
    2              <- number of entries
    0 0            <- "epoch start_offset", ascending in both
    3 1200

Entries are strictly increasing in epoch and in start offset (``assign`` removes the entries a
new one contradicts, as Kafka's ``maybeTruncateNonMonotonicEntries``). The file is rewritten
atomically (``.tmp`` sibling, fsync, rename, fsync of the directory) on every change: on
``assign`` before the batch of the new epoch is written, so the file never lacks an epoch the
log holds (after a crash it may hold an entry past the recovered log end, which loading
removes with ``truncate_from_end``); truncations are rare (a follower's truncation, retention,
DeleteRecords) and also write at once.

A checkpoint that does not parse: Kafka fails the whole log directory (its
``CheckpointFile.read`` throws a ``KafkaStorageException``). Here the cache is rebuilt from the
log instead (``CheckpointCorrupt`` tells the owning ``Log``, which walks its batch headers: each
batch carries its partitionLeaderEpoch, so the log itself is the cache's ground truth) and the
file is rewritten, with a WARNING. The rebuilt cache is exact for the records the log holds.

Thread-safety: changed only by the owning ``Log`` under its lock; the entries are an immutable
tuple replaced on every change, so ``latest_epoch``, ``end_offset_for``, ``entries`` and
``epoch_for_offset`` may be called from any thread without locking.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from headrace.storage.checkpoint import CHECKPOINT_VERSION, CheckpointCorrupt
from headrace.storage.fs import FileSystem, read_whole_file, write_file_atomically

logger = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def encode_entries(entries: Iterable[EpochEntry]) -> bytes:
    entries = tuple(entries)
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    lines += [f"{entry.epoch} {entry.start_offset}" for entry in entries]
    return ("\n".join(lines) + "\n").encode()


def decode_entries(raw: bytes, name: str) -> tuple[EpochEntry, ...]:
    """The entries of a checkpoint file's bytes; ``CheckpointCorrupt`` if they do not parse,
    the count disagrees, or the entries are not strictly increasing (epoch and offset)."""
    lines = raw.decode("utf-8", "replace").splitlines()
    try:
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise CheckpointCorrupt(f"{name}: unknown version {lines[0]!r}")
        expected = int(lines[1])
        entries = []
        for line in lines[2:]:
            epoch, start_offset = line.split(" ")
            entries.append(EpochEntry(int(epoch), int(start_offset)))
    except (IndexError, ValueError) as error:
        raise CheckpointCorrupt(f"{name}: {error}") from None
    if len(entries) != expected:
        raise CheckpointCorrupt(f"{name}: expected {expected} entries, found {len(entries)}")
    for earlier, later in itertools.pairwise(entries):
        if not (earlier.epoch < later.epoch and earlier.start_offset < later.start_offset):
            raise CheckpointCorrupt(f"{name}: entries {earlier} and {later} out of order")
    if any(entry.epoch < 0 or entry.start_offset < 0 for entry in entries):
        raise CheckpointCorrupt(f"{name}: negative epoch or offset")
    return tuple(entries)


class LeaderEpochCache:
    """The (epoch, start offset) entries of one log, backed by its checkpoint file."""

    def __init__(self, fs: FileSystem, directory: Path, log_end_offset: Callable[[], int],
                 load: bool = True) -> None:
        """Load ``directory``'s checkpoint (empty if there is none, or with ``load`` False);
        raises ``CheckpointCorrupt`` if it does not parse (the caller then uses
        ``rebuilt``). ``log_end_offset`` answers the log's end for ``end_offset_for``."""
        self._fs = fs
        self.path = directory / LEADER_EPOCH_CHECKPOINT
        self._log_end_offset = log_end_offset
        self._entries: tuple[EpochEntry, ...] = ()
        if load and fs.exists(self.path):
            self._publish(decode_entries(read_whole_file(fs, self.path), str(self.path)))

    @classmethod
    def rebuilt(cls, fs: FileSystem, directory: Path, log_end_offset: Callable[[], int],
                batch_epochs: Iterable[tuple[int, int]]) -> LeaderEpochCache:
        """A cache made from the log's (partitionLeaderEpoch, base offset) of every batch in
        log order, ignoring the checkpoint file, which is rewritten."""
        cache = cls(fs, directory, log_end_offset, load=False)
        entries: list[EpochEntry] = []
        for epoch, base_offset in batch_epochs:
            if epoch >= 0 and (not entries or epoch > entries[-1].epoch):
                entries.append(EpochEntry(epoch, base_offset))
        cache._publish(tuple(entries))
        cache._write()
        return cache

    # ---- reading (any thread) ------------------------------------------------------------

    def entries(self) -> tuple[EpochEntry, ...]:
        return self._entries

    def latest_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[-1] if entries else None

    def latest_epoch(self) -> int | None:
        entries = self._entries
        return entries[-1].epoch if entries else None

    def earliest_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[0] if entries else None

    def epoch_entry(self, epoch: int) -> EpochEntry | None:
        entries = self._entries
        index = bisect.bisect_left([entry.epoch for entry in entries], epoch)
        return entries[index] if index < len(entries) and entries[index].epoch == epoch else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote ``offset`` (the latest entry starting at or below it)."""
        entries = self._entries
        starts = [entry.start_offset for entry in entries]
        index = bisect.bisect_right(starts, offset) - 1
        return entries[index].epoch if index >= 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int | None = None
                       ) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's ``endOffsetFor``: for the latest epoch the log end
        offset; for an older one the largest epoch <= it and the start offset of the first
        larger epoch; ``requested_epoch`` older than every entry: itself and the first
        entry's start offset; UNDEFINED (-1, -1) for UNDEFINED_EPOCH, a newer epoch than any
        entry, or an empty cache."""
        entries = self._entries
        if requested_epoch == UNDEFINED_EPOCH or not entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if entries[-1].epoch == requested_epoch:
            end = self._log_end_offset() if log_end_offset is None else log_end_offset
            return requested_epoch, end
        higher = bisect.bisect_right([entry.epoch for entry in entries], requested_epoch)
        if higher == len(entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, entries[0].start_offset
        return entries[higher - 1].epoch, entries[higher].start_offset

    # ---- changing (the owning log, under its lock) ---------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` writes from ``start_offset`` on, removing the entries it
        contradicts (epoch or start offset not below the new one), and write the checkpoint.
        False (nothing changed) when the latest entry already is ``epoch`` at or below
        ``start_offset``. Raises ValueError for a negative epoch or offset."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        latest = self.latest_entry()
        if latest is not None and latest.epoch == epoch and latest.start_offset <= start_offset:
            return False
        kept = [entry for entry in self._entries
                if entry.epoch < epoch and entry.start_offset < start_offset]
        removed = len(self._entries) - len(kept)
        if removed > 1 or (removed == 1 and latest is not None
                           and latest.start_offset != start_offset):
            logger.warning("%s: epoch %d at offset %d removed conflicting entries %s",
                           self.path.parent.name, epoch, start_offset,
                           self._entries[len(kept):])
        self._publish(tuple(kept) + (EpochEntry(epoch, start_offset),))
        self._write()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove every entry starting at or after ``end_offset`` (the log was truncated
        there)."""
        entries = self._entries
        if end_offset < 0 or not entries or entries[-1].start_offset < end_offset:
            return
        self._publish(tuple(entry for entry in entries if entry.start_offset < end_offset))
        self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved to ``start_offset``: drop the entries starting at or below it
        but the latest of those, which now starts at ``start_offset`` (Kafka's
        ``truncateFromStart``; an entry at exactly ``start_offset`` is kept as it is)."""
        entries = self._entries
        below = [entry for entry in entries if entry.start_offset <= start_offset]
        if not below or (len(below) == 1 and below[0].start_offset == start_offset):
            return
        first = EpochEntry(below[-1].epoch, start_offset)
        self._publish((first,) + entries[len(below):])
        self._write()

    def clear(self) -> None:
        """Remove every entry (the log was emptied)."""
        if self._entries:
            self._publish(())
            self._write()

    def _publish(self, entries: tuple[EpochEntry, ...]) -> None:
        self._entries = entries  # one store: readers see the old tuple or the new one

    def _write(self) -> None:
        write_file_atomically(self._fs, self.path, encode_entries(self._entries))
