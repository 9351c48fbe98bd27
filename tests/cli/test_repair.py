"""``headrace repair`` on a stopped broker's real data directory: a dry run changes no file; a
repair truncates before a bad batch (or accepts a gap) and the restarted broker serves the
partition again, with every record before the damage."""

from __future__ import annotations

from pathlib import Path

from tests.broker.test_damaged_logs import (
    _consume_with_confluent,
    _create_topic,
    _fill_partitions,
    _garble_sealed_segment,
    _produce_with_confluent,
    _segment_files,
    _start,
)
from tests.cli.cli_runner import assert_user_error, run, run_json, run_ok

TOPIC = "repairable"


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def _broker_with_damage(tmp_path: Path, damage) -> tuple:
    broker = _start(tmp_path)
    _create_topic(broker.bootstrap, TOPIC, 2)
    written = _fill_partitions(broker, TOPIC, 2)
    assert broker.stop() == 0
    return broker, written, damage(broker)


def _serves_again(broker, expected: list[bytes]) -> None:
    broker.start()
    assert " ERROR " not in broker.log_text().split("started in")[-2]  # this start's lines
    _produce_with_confluent(broker.bootstrap, TOPIC, [b"after-repair"], 1)
    expected = expected + [b"after-repair"]
    assert _consume_with_confluent(broker.bootstrap, TOPIC, len(expected), 1) == expected


def test_dry_run_changes_nothing_and_repair_truncates_before_the_bad_batch(tmp_path):
    broker, written, (segment, position) = _broker_with_damage(
        tmp_path, lambda b: _garble_sealed_segment(b, TOPIC, 1))
    try:
        partition_dir = segment.parent
        before = _files(partition_dir)
        dry = run_ok("repair", "--log-dir", str(broker.data_dir), "--dry-run").stdout.decode()
        assert _files(partition_dir) == before
        assert f"{TOPIC}-1: {segment}: unreadable record batch at byte {position}" in dry
        assert f"would truncate {segment.name} to {position} bytes" in dry, dry
        planned = run_json("repair", "--log-dir", str(broker.data_dir), "--dry-run")
        assert _files(partition_dir) == before
        assert planned["dry_run"] and planned["damaged_partitions"] == 1
        assert [entry["partition"] for entry in planned["repairs"]] == [f"{TOPIC}-1"]
        assert f"would truncate {segment.name}" in planned["repairs"][0]["action"]
        done = run_ok("repair", "--log-dir", str(broker.data_dir)).stdout.decode()
        assert f"did truncate {segment.name} to {position} bytes" in done, done
        assert "1 damaged partition(s) repaired" in done
        first_lost = int(segment.name.split(".")[0]) + 1  # one record per batch
        _serves_again(broker, written[1][:first_lost])
        assert "0 damaged partition(s)" in run_ok(
            "repair", "--log-dir", str(broker.data_dir), "--dry-run").stdout.decode()
    finally:
        broker.stop()


def _delete_middle_segment(broker) -> tuple[int, int]:
    segments = _segment_files(broker, TOPIC, 1)
    for suffix in (".log", ".index", ".timeindex"):
        segments[1].with_suffix(suffix).unlink()
    return int(segments[1].stem), int(segments[2].stem)


def test_accepted_gap_is_served(tmp_path):
    broker, written, (gap_start, gap_end) = _broker_with_damage(tmp_path, _delete_middle_segment)
    try:
        partition_dir = broker.data_dir / f"{TOPIC}-1"
        before = _files(partition_dir)
        dry = run_ok("repair", "--log-dir", str(broker.data_dir), "--dry-run",
                     "--accept-gap").stdout.decode()
        assert _files(partition_dir) == before
        assert f"ends at offset {gap_start} but" in dry and "would accept the gap" in dry, dry
        done = run_ok("repair", "--log-dir", str(broker.data_dir), "--accept-gap").stdout.decode()
        assert "did accept the gap" in done, done
        _serves_again(broker, written[1][:gap_start] + written[1][gap_end:])
    finally:
        broker.stop()


def test_gap_repaired_by_truncation(tmp_path):
    broker, written, (gap_start, _) = _broker_with_damage(tmp_path, _delete_middle_segment)
    try:
        done = run_ok("repair", "--log-dir", str(broker.data_dir)).stdout.decode()
        assert "and delete the" in done, done
        _serves_again(broker, written[1][:gap_start])
    finally:
        broker.stop()


def test_bad_log_dir_is_a_one_line_error(tmp_path):
    assert_user_error(run("repair", "--log-dir", str(tmp_path / "missing")), "not a directory")
