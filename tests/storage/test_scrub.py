"""The scrub of sealed segments (``headrace.storage.scrub``) on real files with a manual
clock: every batch's CRC-32C is verified, the first bad byte is reported once, a segment gone
meanwhile is skipped, and a damaged partition goes offline in the log manager."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headrace.errors import KafkaStorageError
from headrace.protocol.batch import BATCH_HEADER_BYTES
from headrace.storage.fs import RealFileSystem
from headrace.storage.manager import LogManager
from headrace.storage.repair import SCRUB_DAMAGE_MARK_FILE, repair_partition
from headrace.storage.scrub import Scrubber
from tests.storage.batches import build_batch
from tests.storage.helpers import NOW_MS, open_log

SEGMENT_BYTES = 16384


def _filled_log(scratch: Path, batches: int = 450):
    log = open_log(scratch, segment_bytes=SEGMENT_BYTES)
    for index in range(batches):
        log.append(build_batch([b"value-%04d" % index * 10]), NOW_MS)
    assert len(log.segments) >= 4
    return log


class _Recorder:
    def __init__(self) -> None:
        self.bytes_read = 0
        self.damages = []

    def on_bytes(self, count: int) -> None:
        self.bytes_read += count

    def on_damage(self, log, damage) -> None:
        self.damages.append((log, damage))


def _scrubber(fs, clock, recorder, **kwargs) -> Scrubber:
    return Scrubber(fs, clock, recorder.on_bytes, recorder.on_damage, **kwargs)


def _damage_file(path: Path, position: int, zero_bytes: int | None = None) -> None:
    """Flip one bit at ``position``, or zero ``zero_bytes`` bytes from it."""
    with open(path, "r+b") as file:
        file.seek(position)
        if zero_bytes is None:
            byte = file.read(1)[0]
            file.seek(position)
            file.write(bytes([byte ^ 0x10]))
        else:
            file.write(bytes(zero_bytes))


def test_a_healthy_log_is_verified_whole_and_its_pass_recorded(scratch, clock):
    log = _filled_log(scratch)
    recorder = _Recorder()
    scrubber = _scrubber(RealFileSystem(), clock, recorder)
    assert scrubber.scrub_pass([log]) == 0
    sealed_bytes = sum(os.path.getsize(s.log_path) for s in log.segments[:-1])
    assert recorder.bytes_read == sealed_bytes and not recorder.damages
    status = scrubber.status[("t", 0)]
    assert (status.last_pass_ms, status.segments, status.bytes_verified) == (
        clock.now_ms(), len(log.segments) - 1, sealed_bytes)
    log.close()


@pytest.mark.parametrize("zero_bytes", [None, 4096])
def test_the_first_bad_byte_of_a_sealed_segment_is_reported_once(scratch, clock, zero_bytes):
    log = _filled_log(scratch)
    damaged = log.segments[1]
    size = os.path.getsize(damaged.log_path)
    batches = list(damaged.iter_batches())
    bad_position, _ = batches[len(batches) // 2]
    # From the batch's first record on (the CRC covers the records; base offset, length and
    # leader epoch it does not).
    _damage_file(damaged.log_path, bad_position + BATCH_HEADER_BYTES, zero_bytes)
    _damage_file(log.segments[2].log_path, 100)  # a later damage: the first one ends the pass
    recorder = _Recorder()
    scrubber = _scrubber(RealFileSystem(), clock, recorder)
    assert scrubber.scrub_pass([log]) == 1
    [(reported_log, damage)] = recorder.damages
    assert reported_log is log and damage.path == damaged.log_path
    assert (damage.position, damage.size_bytes) == (bad_position, size)
    assert ("t", 0) not in scrubber.status  # no complete pass of a damaged log
    log.close()


def test_the_active_segment_is_not_scrubbed(scratch, clock):
    log = _filled_log(scratch)
    _damage_file(log.segments[-1].log_path, 30)
    recorder = _Recorder()
    assert _scrubber(RealFileSystem(), clock, recorder).scrub_pass([log]) == 0
    assert not recorder.damages
    log.close()


class _VanishingSegmentsFs(RealFileSystem):
    """Segments at ``gone`` were deleted (retention, a cleaner swap) after the log listed
    them: opening them fails as it would then."""

    def __init__(self, gone: set[Path]) -> None:
        self.gone = gone

    def open(self, path: Path, flags: int) -> int:
        if Path(path) in self.gone:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return super().open(path, flags)


def test_a_segment_gone_meanwhile_is_skipped_not_reported(scratch, clock):
    log = _filled_log(scratch)
    gone = log.segments[0].log_path
    _damage_file(gone, 40)
    recorder = _Recorder()
    scrubber = _scrubber(_VanishingSegmentsFs({gone}), clock, recorder)
    assert scrubber.scrub_pass([log]) == 0 and not recorder.damages
    assert recorder.bytes_read == sum(os.path.getsize(s.log_path) for s in log.segments[1:-1])
    log.close()


def test_a_damaged_segment_no_longer_in_the_log_is_not_reported(scratch, clock):
    log = _filled_log(scratch)
    first = log.segments[0]
    _damage_file(first.log_path, 40)

    class DeletesOnOpen(RealFileSystem):
        def open(self, path, flags):
            fd = super().open(path, flags)
            if Path(path) == first.log_path and first in log.segments:
                log.delete_records_before(log.segments[1].base_offset)
                log.delete_old_segments(NOW_MS)
            return fd

    recorder = _Recorder()
    assert _scrubber(DeletesOnOpen(), clock, recorder).scrub_pass([log]) == 0
    assert first not in log.segments and not recorder.damages
    log.close()


def test_a_stopped_scrub_records_no_pass(scratch, clock):
    log = _filled_log(scratch)
    recorder = _Recorder()
    scrubber = _scrubber(RealFileSystem(), clock, recorder, stopped=lambda: True)
    assert scrubber.scrub_pass([log]) == 0 and recorder.bytes_read == 0
    assert scrubber.status == {}
    log.close()


def test_take_offline_serves_storage_errors_until_shutdown(scratch, clock):
    manager = LogManager([scratch], {}, clock)
    manager.startup()
    manager.create_topic("orders", 2, {})
    damaged = manager.get_log("orders", 1)
    assert manager.take_offline(damaged, "bad batch in some file at byte 7")
    assert not manager.take_offline(damaged, "again")  # once only
    with pytest.raises(KafkaStorageError, match="byte 7"):
        manager.get_log("orders", 1)
    assert manager.get_log("orders", 0) is not damaged
    assert manager.offline_partitions()[("orders", 1)].reason == "bad batch in some file at byte 7"
    manager.shutdown()
    restarted = LogManager([scratch], {}, clock)
    restarted.startup()  # after a clean shutdown: no CRC scan, the mark keeps it offline
    with pytest.raises(KafkaStorageError, match="byte 7"):
        restarted.get_log("orders", 1)
    restarted.shutdown()
    partition_dir = damaged.dir
    assert repair_partition(RealFileSystem(), partition_dir, False, False, dry_run=True)
    assert (partition_dir / SCRUB_DAMAGE_MARK_FILE).exists()
    repair_partition(RealFileSystem(), partition_dir, False, False, dry_run=False)
    repaired = LogManager([scratch], {}, clock)
    repaired.startup()
    assert repaired.get_log("orders", 1).log_end_offset == 0
    repaired.shutdown()


def test_a_scrub_stopped_inside_a_segment_reads_no_further(scratch, clock):
    log = _filled_log(scratch)
    recorder = _Recorder()
    scrubber = _scrubber(RealFileSystem(), clock, recorder, chunk_bytes=4096,
                         stopped=lambda: recorder.bytes_read > 0)
    assert scrubber.scrub_pass([log]) == 0 and scrubber.status == {}
    assert 0 < recorder.bytes_read <= 4096
    log.close()
