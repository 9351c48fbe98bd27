"""``headrace dump-log`` on real segment files written by ``headrace.storage.Log``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from headrace.protocol.batch import CRC_OFFSET
from headrace.protocol.compression import GZIP
from headrace.protocol.records import Header, build_batch
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log
from tests.cli.cli_runner import assert_user_error, run, run_json, run_ok

NOW_MS = 1_700_000_000_000
SEGMENT = "00000000000000000000"


def _write_log(directory: Path) -> Path:
    """Three batches (one gzip, one with headers and a null value) with an index entry each."""
    config = LogConfig.from_properties({"index.interval.bytes": "1"}, {})
    log = Log("dump", 0, directory, config, RealFileSystem(), NOW_MS)
    batches = [
        build_batch([(b"k0", b"v0", (), NOW_MS), (b"k1", b"v1", (), NOW_MS + 1)]),
        build_batch([(b"k2", b"v2", (), NOW_MS + 5)], compression=GZIP),
        build_batch([(b"k3", None, [Header("h", b"x")], NOW_MS + 9)], producer_id=7,
                    producer_epoch=2, base_sequence=0),
    ]
    for batch in batches:
        log.append(bytearray(batch), NOW_MS + 10)
    log.close()
    return directory


def _segment_file(directory: Path, suffix: str) -> str:
    return str(directory / f"{SEGMENT}{suffix}")


def test_batches_and_records(tmp_path):
    directory = _write_log(tmp_path / "dump-0")
    (report,) = run_json("dump-log", _segment_file(directory, ".log"), "--deep")
    batches = report["batches"]
    assert [(b["base_offset"], b["last_offset"], b["count"]) for b in batches] == \
        [(0, 1, 2), (2, 2, 1), (3, 3, 1)]
    assert [b["codec"] for b in batches] == ["none", "gzip", "none"]
    assert all(b["crc_valid"] for b in batches) and report["problems"] == []
    assert batches[0]["position"] == 0
    assert batches[1]["position"] == batches[0]["size_bytes"]
    assert (batches[2]["producer_id"], batches[2]["producer_epoch"],
            batches[2]["base_sequence"], batches[2]["last_sequence"]) == (7, 2, 0, 0)
    assert batches[0]["max_timestamp_ms"] == NOW_MS + 1
    records = [record for batch in batches for record in batch["records"]]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == \
        [(0, "k0", "v0"), (1, "k1", "v1"), (2, "k2", "v2"), (3, "k3", None)]
    assert records[3]["headers"] == {"h": "x"}

    text = run_ok("dump-log", _segment_file(directory, ".log"), "--deep").stdout.decode()
    assert "baseOffset: 2 lastOffset: 2 count: 1" in text
    assert "compresscodec: gzip crcValid: true" in text
    assert "| offset: 3 timestamp: 1700000000009 headers: [h=x] key: k3 payload: None" in text


def test_crc_damage_is_reported_not_raised(tmp_path):
    directory = _write_log(tmp_path / "dump-0")
    segment = Path(_segment_file(directory, ".log"))
    data = bytearray(segment.read_bytes())
    second_batch = int.from_bytes(data[8:12], "big") + 12
    data[second_batch + CRC_OFFSET] ^= 0xFF
    segment.write_bytes(bytes(data))

    result = run("dump-log", str(segment), "--deep")
    text = result.stdout.decode()
    assert result.returncode == 1 and b"Traceback" not in result.stderr
    assert text.count("crcValid: false") == 1
    assert "PROBLEM: batch at position" in text and "CRC-32C mismatch" in text
    assert "| offset: 3" in text  # the walk continues past the damaged batch


def test_truncated_tail_is_reported(tmp_path):
    directory = _write_log(tmp_path / "dump-0")
    segment = Path(_segment_file(directory, ".log"))
    segment.write_bytes(segment.read_bytes()[:-10])
    result = run("dump-log", str(segment), "-o", "json")
    assert result.returncode == 1
    (report,) = json.loads(result.stdout)
    assert len(report["batches"]) == 2
    assert "claims" in report["problems"][0]


def test_indexes_dump_and_verify(tmp_path):
    directory = _write_log(tmp_path / "dump-0")
    offsets, times = run_json("dump-log", _segment_file(directory, ".index"),
                              _segment_file(directory, ".timeindex"), "--verify-index")
    # as in Kafka, the first batch of a segment gets no entry (its position is 0 anyway)
    assert [entry["offset"] for entry in offsets["entries"]] == [2, 3]
    assert offsets["entries"][0]["position"] > 0 and offsets["problems"] == []
    assert times["entries"][-1] == {"timestamp_ms": NOW_MS + 9, "offset": 3}
    assert times["problems"] == []


def test_verify_index_finds_a_wrong_entry(tmp_path):
    directory = _write_log(tmp_path / "dump-0")
    index = Path(_segment_file(directory, ".index"))
    data = bytearray(index.read_bytes())
    struct.pack_into(">ii", data, 0, 2, 5)  # entry 2 now points into the middle of a batch
    index.write_bytes(bytes(data))
    result = run("dump-log", str(index), "--verify-index")
    assert result.returncode == 1
    assert "index offset 2: no batch starts at position 5" in result.stdout.decode()
    unverified = run("dump-log", str(index))
    assert unverified.returncode == 0 and b"offset: 2 position: 5" in unverified.stdout


def test_bad_files_are_user_errors(tmp_path):
    assert_user_error(run("dump-log", str(tmp_path / "absent.log")), "No such file")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert_user_error(run("dump-log", str(other)), "not a .log, .index or .timeindex file")
