"""Recovery after unclean shutdowns: truncated tails, garbage, torn unsynced writes, SIGKILL."""

from __future__ import annotations

import random
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.errors import KafkaStorageError
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log

from .batches import build_batch
from .faulty_fs import CrashingFileSystem
from .helpers import assert_indexes_match_scan, read_all

NOW_MS = 1_700_000_000_000
WRITER = Path(__file__).with_name("crash_writer.py")


def appended(log: Log, batch: bytearray) -> tuple[int, bytes]:
    """Append ``batch`` (left unchanged): its base offset and the bytes stored for it."""
    base_offset = log.append(batch, NOW_MS).base_offset
    return base_offset, struct.pack(">q", base_offset) + bytes(batch[8:])


def build_log(path: Path, batches: int, fs=None, **config) -> tuple[Log, list[tuple[int, bytes]]]:
    log = Log("t", 0, path, LogConfig(**config), fs or RealFileSystem(), NOW_MS,
              clean_shutdown=True)
    sent = []
    for i in range(batches):
        batch = build_batch([b"record-%d" % i] * (1 + i % 3), timestamp_ms=NOW_MS + i)
        sent.append(appended(log, batch))
    return log, sent


def recover(path: Path, recovery_point: int, fs=None, **config) -> Log:
    return Log("t", 0, path, LogConfig(**config), fs or RealFileSystem(), NOW_MS,
               recovery_point=recovery_point, clean_shutdown=False)


def test_truncation_at_every_byte_of_the_last_batches_recovers_the_valid_prefix(scratch):
    source, sent = build_log(scratch / "src", 12, index_interval_bytes=64)
    source.close()
    segment = (scratch / "src" / "00000000000000000000.log").read_bytes()
    tail_start = len(segment) - sum(len(b) for _, b in sent[-3:])
    for cut in range(tail_start, len(segment) + 1):
        target = scratch / f"cut-{cut}"
        target.mkdir()
        (target / "00000000000000000000.log").write_bytes(segment[:cut])
        log = recover(target, recovery_point=sent[4][0], index_interval_bytes=64)
        expected, total = [], 0
        for offset, batch in sent:
            if total + len(batch) > cut:
                break
            expected.append((offset, batch))
            total += len(batch)
        assert read_all(log) == expected
        assert log.segments[-1].size_bytes == total
        assert_indexes_match_scan(log)
        log.close()


def test_garbage_appended_after_the_last_batch_is_truncated(scratch):
    rng = random.Random(7)
    source, sent = build_log(scratch / "src", 20, index_interval_bytes=100)
    source.close()
    segment = (scratch / "src" / "00000000000000000000.log").read_bytes()
    for attempt in range(20):
        target = scratch / f"garbage-{attempt}"
        target.mkdir()
        junk = rng.randbytes(rng.randint(1, 300))
        if attempt % 2:  # zeros: the inode grew but the data never reached the disk
            junk = bytes(len(junk))
        (target / "00000000000000000000.log").write_bytes(segment + junk)
        log = recover(target, recovery_point=0, index_interval_bytes=100)
        assert read_all(log) == sent
        assert log.segments[-1].size_bytes == len(segment)
        log.close()


def test_a_corrupt_middle_segment_drops_it_tail_and_later_segments(scratch):
    source, sent = build_log(scratch / "src", 30, segment_bytes=600)
    source.close()
    segments = sorted((scratch / "src").glob("*.log"))
    assert len(segments) >= 3
    victim = segments[1]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF
    victim.write_bytes(bytes(data))
    log = recover(scratch / "src", recovery_point=0, segment_bytes=600)
    recovered = read_all(log)
    assert recovered == sent[: len(recovered)]
    assert recovered[-1][0] < int(segments[2].stem)
    assert len(log.segments) == 2


def test_unflushed_sealed_segment_without_its_index_is_recovered_not_failed(scratch):
    """After a crash, a rolled segment past the recovery point may have lost its index file
    and its tail: recovery truncates it (Kafka's recovery), it is not damage."""
    source, sent = build_log(scratch / "src", 30, segment_bytes=600)
    source.close()
    segments = sorted((scratch / "src").glob("*.log"))
    victim = segments[1]
    victim.with_suffix(".index").unlink()
    victim.write_bytes(victim.read_bytes()[:-9])
    log = recover(scratch / "src", recovery_point=0, segment_bytes=600)
    recovered = read_all(log)
    assert recovered == sent[: len(recovered)] and recovered[-1][0] < int(segments[2].stem)
    assert len(log.segments) == 2


def test_flushed_sealed_segment_without_its_index_and_a_bad_byte_is_damage(scratch):
    """Below the recovery point (or after a clean shutdown) a bad byte met while rebuilding
    a missing index is damage: KafkaStorageError naming the file and byte, file untouched."""
    source, sent = build_log(scratch / "src", 30, segment_bytes=600)
    source.close()
    victim = sorted((scratch / "src").glob("*.log"))[1]
    victim.with_suffix(".index").unlink()
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF
    victim.write_bytes(bytes(data))
    last_batch = _last_batch_position(bytes(data))
    for clean in (True, False):
        with pytest.raises(KafkaStorageError, match=f"{victim}.*at byte {last_batch} "):
            Log("t", 0, scratch / "src", LogConfig(segment_bytes=600), RealFileSystem(),
                NOW_MS, recovery_point=sent[-1][0] + 1, clean_shutdown=clean)
        assert victim.read_bytes() == data


def _last_batch_position(data: bytes) -> int:
    position = last = 0
    while position < len(data):
        last = position
        position += struct.unpack_from(">i", data, position + 8)[0] + 12
    return last


def test_unsynced_writes_torn_by_a_crash_lose_only_the_unflushed_tail(scratch):
    rng = random.Random(1234)
    for round_number in range(15):
        fs = CrashingFileSystem(rng)
        path = scratch / f"round-{round_number}"
        log = Log("t", 0, path, LogConfig(segment_bytes=800, index_interval_bytes=50), fs, NOW_MS,
                  clean_shutdown=True)
        sent, flushed = [], 0
        for i in range(rng.randint(5, 40)):
            batch = build_batch([b"v%d" % i] * (1 + i % 2))
            sent.append(appended(log, batch))
            if rng.random() < 0.2:
                log.flush()
                flushed = len(sent)
            if rng.random() < 0.1:
                log.flush_if_due(NOW_MS)  # flushes rolled segments
        recovery_point = log.recovery_point
        log.close_without_flush()
        fs.crash()
        log = recover(path, recovery_point, segment_bytes=800, index_interval_bytes=50)
        recovered = read_all(log)
        assert recovered == sent[: len(recovered)]
        assert len(recovered) >= flushed
        assert log.log_end_offset >= recovery_point
        assert_indexes_match_scan(log)
        log.close()


def _run_writer_and_kill(path: Path, rng: random.Random) -> list[int]:
    process = subprocess.Popen([sys.executable, str(WRITER), str(path)], stdout=subprocess.PIPE,
                               text=True, cwd=Path(__file__).parents[2])
    acknowledged = []
    kill_after = rng.randint(1, 150)
    for line in process.stdout:
        acknowledged.append(int(line))
        if len(acknowledged) >= kill_after:
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    return acknowledged


@pytest.mark.slow
def test_sigkilled_writer_loses_no_acknowledged_batch(scratch):
    rng = random.Random(99)
    path = scratch / "t-0"
    for _ in range(4):
        acknowledged = _run_writer_and_kill(path, rng)
        log = Log("t", 0, path, LogConfig(flush_messages=1), RealFileSystem(), NOW_MS,
                  recovery_point=0)
        stored = dict(read_all(log))
        for offset in acknowledged:
            assert offset in stored, f"acknowledged offset {offset} lost"
            assert stored[offset][8:] == bytes(build_batch([b"%d" % offset] * 3))[8:]
        assert_indexes_match_scan(log)
        log.close()
