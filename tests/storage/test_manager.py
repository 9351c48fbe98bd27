"""LogManager: topics, persistence across restarts, checkpoints, deletion, maintenance."""

from __future__ import annotations

import logging
import os
import random
import shutil
import threading
import uuid
from pathlib import Path

import pytest

from headrace.errors import (
    InconsistentTopicId,
    InvalidConfig,
    InvalidPartitions,
    InvalidTopic,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from headrace.storage.checkpoint import read_checkpoint
from headrace.storage.fs import RealFileSystem
from headrace.storage.manager import CLEAN_SHUTDOWN_MARKER, TOPIC_CONFIGS_DIR, LogManager

from .batches import build_batch
from .faulty_fs import CrashingFileSystem
from .helpers import read_all


def start(dirs, clock, **broker) -> LogManager:
    manager = LogManager(dirs, {k.replace("_", "."): v for k, v in broker.items()}, clock)
    manager.startup()
    return manager


def test_create_validate_and_reject_topics(scratch, clock):
    manager = start([scratch / "a", scratch / "b"], clock)
    info = manager.create_topic("orders", 3, {"retention.ms": "1000"})
    assert info.partitions == 3 and info.config.retention_ms == 1000
    assert {p.name for p in (scratch / "a").iterdir()} | {p.name for p in (scratch / "b").iterdir()} \
        >= {"orders-0", "orders-1", "orders-2"}
    with pytest.raises(TopicAlreadyExists):
        manager.create_topic("orders", 1, {})
    for bad in ["", ".", "..", "a" * 250, "bad name", "ümlaut"]:
        with pytest.raises(InvalidTopic):
            manager.create_topic(bad, 1, {})
    manager.create_topic("x_y", 1, {})
    with pytest.raises(InvalidTopic):
        manager.create_topic("x.y", 1, {})
    with pytest.raises(InvalidPartitions):
        manager.create_topic("zero", 0, {})
    with pytest.raises(InvalidConfig, match="retention.ms"):
        manager.create_topic("cfg", 1, {"retention.ms": "-9"})
    manager.create_topic("dry", 1, {}, validate_only=True)
    with pytest.raises(UnknownTopicOrPartition):
        manager.topic("dry")
    with pytest.raises(UnknownTopicOrPartition):
        manager.get_log("orders", 3)


def test_topics_data_and_configs_survive_a_clean_restart(scratch, clock):
    dirs = [scratch / "a", scratch / "b"]
    manager = start(dirs, clock)
    info = manager.create_topic("events", 2, {"segment.bytes": "500"})
    for partition in range(2):
        for _ in range(10):
            manager.get_log("events", partition).append(build_batch([b"x" * 40]), clock.now_ms())
    before = {p: read_all(manager.get_log("events", p)) for p in range(2)}
    manager.alter_topic_config("events", {"segment.bytes": "700", "retention.bytes": "100000"})
    manager.add_partitions("events", 3)
    with pytest.raises(InvalidPartitions):
        manager.add_partitions("events", 2)
    manager.shutdown()
    assert all((d / CLEAN_SHUTDOWN_MARKER).exists() for d in dirs)
    checkpoints = {}
    for log_dir in dirs:
        checkpoints.update(read_checkpoint(manager.fs, log_dir / "recovery-point-offset-checkpoint"))
    assert checkpoints[("events", 0)] == 10 and checkpoints[("events", 2)] == 0

    manager = start(dirs, clock)
    assert not any((d / CLEAN_SHUTDOWN_MARKER).exists() for d in dirs)
    reloaded = manager.topic("events")
    assert reloaded.topic_id == info.topic_id and reloaded.partitions == 3
    assert reloaded.config.segment_bytes == 700 and reloaded.overrides["retention.bytes"] == "100000"
    assert {p: read_all(manager.get_log("events", p)) for p in range(2)} == before
    manager.shutdown()


def test_unclean_restart_recovers_from_the_checkpointed_recovery_point(scratch, clock):
    manager = start([scratch], clock)
    manager.create_topic("t", 1, {"flush.messages": "1"})
    log = manager.get_log("t", 0)
    for _ in range(5):
        log.append(build_batch([b"v"]), clock.now_ms())
    manager.maintenance(clock.now_ms())
    manager.write_checkpoints()
    expected = read_all(log)
    restarted = start([scratch], clock)  # no shutdown: no marker, checkpoints written
    assert read_all(restarted.get_log("t", 0)) == expected
    restarted.shutdown()


def test_delete_topic_renames_then_removes_after_the_delay(scratch, clock):
    manager = start([scratch], clock, log_segment_delete_delay_ms="1000")
    manager.create_topic("gone", 2, {})
    log = manager.get_log("gone", 0)
    log.append(build_batch([b"v"]), clock.now_ms())
    held = log.read(0, 100)
    manager.delete_topic("gone")
    with pytest.raises(UnknownTopicOrPartition):
        manager.delete_topic("gone")
    pending = [p.name for p in scratch.iterdir() if p.name.endswith("-delete")]
    assert len(pending) == 2 and all(name.startswith("gone-") for name in pending)
    assert held.slices[0].read_bytes()[12:] == bytes(build_batch([b"v"]))[12:]
    manager.remove_expired_files(clock.now_ms() + 999)
    assert len([p for p in scratch.iterdir() if p.name.endswith("-delete")]) == 2
    manager.maintenance(clock.now_ms() + 1000)
    assert len([p for p in scratch.iterdir() if p.name.endswith("-delete")]) == 2
    manager.remove_expired_files(clock.now_ms() + 1000)
    assert not [p for p in scratch.iterdir() if p.name.endswith("-delete")]
    manager.create_topic("gone", 1, {})
    assert manager.get_log("gone", 0).log_end_offset == 0


def test_maintenance_applies_retention_and_broker_defaults_live(scratch, clock):
    manager = start([scratch], clock, log_segment_bytes="300")
    manager.create_topic("r", 1, {})
    log = manager.get_log("r", 0)
    for _ in range(10):
        log.append(build_batch([b"x" * 60]), clock.now_ms())
    segments = len(log.segments)
    assert segments > 3
    manager.maintenance(clock.now_ms(), check_retention=True)
    assert len(log.segments) == segments
    manager.set_broker_defaults({"log.segment.bytes": "300", "log.retention.bytes": "1"})
    manager.maintenance(clock.now_ms())  # retention waits for a retention check
    assert len(log.segments) == segments
    manager.maintenance(clock.now_ms(), check_retention=True)
    assert len(log.segments) == 1 and log.log_start_offset == log.segments[0].base_offset
    manager.write_checkpoints()
    starts = read_checkpoint(manager.fs, scratch / "log-start-offset-checkpoint")
    assert starts[("r", 0)] == log.log_start_offset


class EntryLosingFileSystem(CrashingFileSystem):
    """Also forgets directory entries whose parent directory was not fsynced after they were
    made (mkdir, create, rename target): ``crash()`` tears unsynced file contents, then
    removes those entries, deepest first, as a power loss may."""

    def __init__(self) -> None:
        super().__init__(random.Random(7))
        self.unsynced_entries: set[Path] = set()

    def mkdir(self, path: Path) -> None:
        if not Path(path).exists():
            self.unsynced_entries.add(Path(path))
        super().mkdir(path)

    def open(self, path: Path, flags: int) -> int:
        if flags & os.O_CREAT and not Path(path).exists():
            self.unsynced_entries.add(Path(path))
        return super().open(path, flags)

    def rename(self, source: Path, target: Path) -> None:
        super().rename(source, target)
        self.unsynced_entries.discard(Path(source))
        self.unsynced_entries.add(Path(target))

    def fsync_dir(self, path: Path) -> None:
        super().fsync_dir(path)
        self.unsynced_entries = {p for p in self.unsynced_entries if p.parent != Path(path)}

    def crash(self) -> int:
        torn = super().crash()
        for path in sorted(self.unsynced_entries, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        self.unsynced_entries.clear()
        return torn


def test_a_created_topic_survives_losing_everything_not_fsynced(scratch, clock):
    fs = EntryLosingFileSystem()
    dirs = [scratch / "a", scratch / "b"]
    for log_dir in dirs:
        log_dir.mkdir()
    manager = LogManager(dirs, {}, clock, fs=fs)
    manager.startup()
    info = manager.create_topic("durable", 5, {"cleanup.policy": "compact"})
    fs.crash()
    restarted = start(dirs, clock)
    assert restarted.topic("durable").topic_id == info.topic_id
    assert restarted.topic("durable").partitions == 5
    assert restarted.topic("durable").config.compact_enabled
    assert sorted(p.name for d in dirs for p in d.glob("durable-*/partition.metadata*")) == \
        ["partition.metadata"] * 5
    restarted.shutdown()


def test_checkpoints_are_written_by_write_checkpoints_not_by_maintenance(scratch, clock):
    manager = start([scratch], clock)
    manager.create_topic("t", 1, {"flush.messages": "1"})
    manager.get_log("t", 0).append(build_batch([b"v"]), clock.now_ms())
    manager.maintenance(clock.now_ms())
    assert read_checkpoint(manager.fs, scratch / "recovery-point-offset-checkpoint") == {}
    manager.write_checkpoints()
    assert read_checkpoint(manager.fs, scratch / "recovery-point-offset-checkpoint") == {
        ("t", 0): 1}
    manager.shutdown()


def test_retention_renames_in_maintenance_and_unlinks_in_remove_expired_files(scratch, clock):
    manager = start([scratch], clock, log_segment_bytes="300", log_retention_bytes="1",
                    log_segment_delete_delay_ms="500")
    manager.create_topic("r", 1, {})
    log = manager.get_log("r", 0)
    for _ in range(6):
        log.append(build_batch([b"x" * 60]), clock.now_ms())
    log_dir = scratch / "r-0"
    manager.maintenance(clock.now_ms(), check_retention=True)
    deleted = [p for p in log_dir.iterdir() if p.name.endswith(".deleted")]
    assert deleted and len(log.segments) == 1
    manager.maintenance(clock.now_ms() + 500)
    assert all(p.exists() for p in deleted)
    manager.remove_expired_files(clock.now_ms() + 499)
    assert all(p.exists() for p in deleted)
    manager.remove_expired_files(clock.now_ms() + 500)
    assert not any(p.exists() for p in deleted)
    assert log.read(log.log_start_offset, 1000).slices


def test_a_retention_check_reaches_a_log_skipped_for_its_held_lock_at_the_next_round(
        scratch, clock, caplog):
    """A log whose lock a cleaner's swap holds is skipped by the retention check and checked
    at the next maintenance round; the check logs its completion only then."""
    manager = start([scratch], clock, log_segment_bytes="300", log_retention_bytes="1")
    manager.create_topic("r", 2, {})
    held, free = manager.get_log("r", 0), manager.get_log("r", 1)
    for log in (held, free):
        for _ in range(6):
            log.append(build_batch([b"x" * 60]), clock.now_ms())
    segments = len(held.segments)
    caplog.set_level(logging.INFO, logger="headrace.storage.manager")
    with held._lock:  # what replace_segments holds across its renames and fsyncs
        manager.maintenance(clock.now_ms(), check_retention=True)
    assert len(free.segments) == 1 and len(held.segments) == segments
    assert "log retention check completed" not in caplog.text
    manager.maintenance(clock.now_ms())
    assert len(held.segments) == 1
    assert f"log retention check completed: {2 * (segments - 1)} segments deleted" in caplog.text
    manager.shutdown()


def test_flush_by_time_waits_for_a_flusher_round(scratch, clock):
    """flush.ms is applied by Kafka's log flusher (the broker's
    log.flush.scheduler.interval.ms rounds), not by every maintenance round."""
    manager = start([scratch], clock)
    manager.create_topic("f", 1, {"flush.ms": "100"})
    log = manager.get_log("f", 0)
    log.append(build_batch([b"v"]), clock.now_ms())
    manager.maintenance(clock.now_ms() + 100)
    assert log.recovery_point == 0
    manager.maintenance(clock.now_ms() + 100, flush_by_time=True)
    assert log.recovery_point == 1
    manager.shutdown()


def test_checkpoints_are_written_each_on_its_own_call(scratch, clock):
    manager = start([scratch], clock)
    manager.create_topic("t", 1, {"flush.messages": "1"})
    log = manager.get_log("t", 0)
    log.append(build_batch([b"v"] * 3), clock.now_ms())
    log.delete_records_before(2)
    manager.write_checkpoints(log_start_offsets=False)
    assert read_checkpoint(manager.fs, scratch / "recovery-point-offset-checkpoint") == {
        ("t", 0): 3}
    assert read_checkpoint(manager.fs, scratch / "log-start-offset-checkpoint") == {}
    manager.write_checkpoints(recovery_points=False)
    assert read_checkpoint(manager.fs, scratch / "log-start-offset-checkpoint") == {("t", 0): 2}
    manager.shutdown()


class ConfigSyncHoldingFileSystem(RealFileSystem):
    """Holds the directory fsync of the topic config files, once ``armed``, until ``release``
    is set: a disk so busy with write-back that a config change's fsync takes long."""

    def __init__(self, configs_dir: Path) -> None:
        self.configs_dir = configs_dir
        self.armed = False
        self.holding = threading.Event()
        self.release = threading.Event()

    def fsync_dir(self, path: Path) -> None:
        if self.armed and Path(path) == self.configs_dir:
            self.holding.set()
            self.release.wait()
        super().fsync_dir(path)


def test_a_config_change_being_persisted_holds_neither_appends_nor_maintenance(scratch, clock):
    fs = ConfigSyncHoldingFileSystem(scratch / TOPIC_CONFIGS_DIR)
    manager = LogManager([scratch], {}, clock, fs)
    manager.startup()
    manager.create_topic("t", 1, {})
    log = manager.get_log("t", 0)
    fs.armed = True
    alter = threading.Thread(target=manager.alter_topic_config,
                             args=("t", {"cleanup.policy": "compact"}))
    alter.start()
    try:
        assert fs.holding.wait(60)

        def append_and_maintain() -> None:
            log.append(build_batch([b"v"]), clock.now_ms())
            manager.maintenance(clock.now_ms())

        other = threading.Thread(target=append_and_maintain)
        other.start()
        other.join(60)  # a bound on a deadlock, not a speed: it must not wait for the fsync
        appended_while_held = not other.is_alive()
        applied_before_durable = log.config.compact_enabled
    finally:
        fs.release.set()
        alter.join(60)
    assert appended_while_held and log.log_end_offset == 1
    assert not applied_before_durable
    assert log.config.compact_enabled and manager.topic("t").overrides == {
        "cleanup.policy": "compact"}
    manager.shutdown()
    restarted = start([scratch], clock)
    assert restarted.get_log("t", 0).config.compact_enabled
    restarted.shutdown()


LONGEST_TOPIC = "t" * 249  # Kafka's limit


def test_a_249_character_topic_is_created_configured_restarted_and_deleted(scratch, clock):
    manager = start([scratch], clock, log_segment_delete_delay_ms="0")
    manager.create_topic(LONGEST_TOPIC, 2, {"retention.ms": "60000"})
    manager.get_log(LONGEST_TOPIC, 1).append(build_batch([b"v"]), clock.now_ms())
    manager.alter_topic_config(LONGEST_TOPIC, {"retention.ms": "120000"})
    manager.shutdown()
    manager = start([scratch], clock, log_segment_delete_delay_ms="0")
    assert manager.topic(LONGEST_TOPIC).config.retention_ms == 120000
    assert manager.get_log(LONGEST_TOPIC, 1).log_end_offset == 1
    manager.delete_topic(LONGEST_TOPIC)
    deleted = [p.name for p in scratch.iterdir() if p.name.endswith("-delete")]
    assert len(deleted) == 2 and all(len(name) == 255 for name in deleted)
    assert not (scratch / TOPIC_CONFIGS_DIR / LONGEST_TOPIC).exists()
    manager.remove_expired_files(clock.now_ms())
    assert not [p for p in scratch.iterdir() if p.name.endswith("-delete")]
    with pytest.raises(InvalidTopic):
        manager.create_topic("t" * 250, 1, {})
    manager.shutdown()


def test_topic_configs_of_the_older_properties_form_are_renamed_at_start_up(scratch, clock):
    manager = start([scratch], clock)
    manager.create_topic("orders", 1, {"retention.ms": "60000"})
    manager.create_topic("orders.properties", 1, {"retention.ms": "70000"})
    manager.shutdown()
    configs = scratch / TOPIC_CONFIGS_DIR
    (configs / "orders").rename(configs / "orders.properties.tmp")  # the older layout, by hand
    (configs / "orders.properties").rename(configs / "orders.properties.properties")
    (configs / "orders.properties.tmp").rename(configs / "orders.properties")
    (configs / "orders~").write_bytes(b"retention.ms=1\n")  # a write a crash cut short
    manager = start([scratch], clock)
    assert manager.topic("orders").config.retention_ms == 60000
    assert manager.topic("orders.properties").config.retention_ms == 70000
    assert sorted(p.name for p in configs.iterdir()) == ["orders", "orders.properties"]
    manager.shutdown()


def test_a_cluster_broker_holds_only_its_partitions_under_the_clusters_topic_id(scratch, clock):
    manager = start([scratch], clock)
    topic_id = uuid.uuid4()
    info = manager.create_local_partitions("spread", topic_id, [1, 4], 6, {"retention.ms": "5"})
    assert (info.topic_id, info.partitions, info.config.retention_ms) == (topic_id, 6, 5)
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("spread-")) == [
        "spread-1", "spread-4"]
    with pytest.raises(UnknownTopicOrPartition):
        manager.get_log("spread", 0)
    manager.create_local_partitions("spread", topic_id, [1, 4, 5], 6, {"retention.ms": "5"})
    assert manager.get_log("spread", 5).partition == 5  # idempotent for 1 and 4, adds 5
    with pytest.raises(InconsistentTopicId):
        manager.create_local_partitions("spread", uuid.uuid4(), [2], 6, {})
    manager.shutdown()
    manager = start([scratch], clock)
    assert manager.topic("spread").topic_id == topic_id  # partition.metadata keeps the id
    manager.delete_topic("spread")  # only the partitions held here
    assert sorted(p.name.split(".")[0] for p in scratch.iterdir()
                  if p.name.endswith("-delete")) == ["spread-1", "spread-4", "spread-5"]


def test_managed_high_watermarks_are_checkpointed_and_read_back_at_start_up(scratch, clock):
    cluster = {"zookeeper_connect": "127.0.0.1:1"}  # a cluster's broker (never connected here)
    manager = start([scratch], clock, **cluster)
    manager.create_topic("t", 2, {})
    replicated, single = manager.get_log("t", 0), manager.get_log("t", 1)
    for log in (replicated, single):
        for _ in range(5):
            log.append(build_batch([b"v"]), clock.now_ms())
    manager.write_checkpoints(high_watermarks=True)
    path = scratch / "replication-offset-checkpoint"
    assert not path.exists()  # no replicated high watermark yet: no file
    replicated.manage_high_watermark(manager.initial_high_watermark("t", 0))
    assert replicated.high_watermark == 0  # nothing checkpointed: Kafka's 0
    replicated.update_high_watermark(3)
    manager.write_checkpoints(high_watermarks=True)
    assert read_checkpoint(manager.fs, path) == {("t", 0): 3}
    replicated.update_high_watermark(4)
    manager.shutdown()  # writes the latest on close
    assert read_checkpoint(manager.fs, path) == {("t", 0): 4}
    manager = start([scratch], clock)  # a single node: the checkpoint neither used nor written
    assert not manager.get_log("t", 0).high_watermark_managed
    manager.shutdown()
    assert read_checkpoint(manager.fs, path) == {("t", 0): 4}
    manager = start([scratch], clock, **cluster)
    assert manager.initial_high_watermark("t", 0) == 4
    assert manager.initial_high_watermark("t", 1) == 0
    reloaded = manager.get_log("t", 0)  # loaded managed, from the checkpoint
    assert reloaded.high_watermark_managed and reloaded.high_watermark == 4
    assert not manager.get_log("t", 1).high_watermark_managed
    reloaded.truncate_to(2)
    assert manager.initial_high_watermark("t", 0) == 2  # clamped to the log end
    manager.shutdown()
    path.write_text("0\n5\nt 0 4\n")  # torn
    manager = start([scratch], clock, **cluster)
    assert manager.initial_high_watermark("t", 0) == 0
    assert not manager.get_log("t", 0).high_watermark_managed
    manager.shutdown()
