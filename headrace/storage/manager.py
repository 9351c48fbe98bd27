"""The log manager: every partition log in the broker's data directories.

Owns topic creation/deletion, partition placement across ``log.dirs``, start-up loading and
recovery, per-topic configuration, checkpoints and the periodic ``maintenance`` work.

On-disk layout of each data directory (Kafka's, plus one headrace file)::

    <log.dir>/<topic>-<partition>/              one Log (see ``log``)
    <log.dir>/<topic>-<partition>/partition.metadata
                                                "version: 0\\ntopic_id: <base64url uuid>\\n"
    <log.dir>/<topic>-<partition>.<uuid hex>-delete/
                                                a deleted partition, removed after
                                                log.segment.delete.delay.ms; the topic
                                                is cut short so the name fits in
                                                255 bytes (Kafka's LocalLog does the same)
    <log.dir>/recovery-point-offset-checkpoint  see ``checkpoint``
    <log.dir>/log-start-offset-checkpoint
    <log.dir>/replication-offset-checkpoint     the high watermarks of the logs whose high
                                                watermark replication manages (a cluster's
                                                broker only, once there is one)
    <log.dir>/.headrace_cleanshutdown            written last by ``shutdown``; present at
                                                start-up means no recovery scan is needed
    <first log.dir>/__topic_configs/<topic>     the topic's config overrides, key=value
                                                lines, written through ``<topic>~``; a
                                                249-character name (Kafka's limit) leaves
                                                no room for an extension in 255 bytes, and
                                                "~" is in no topic name. Files of the
                                                older ``<topic>.properties`` form are
                                                renamed at start-up.

Every partition holds descriptors open (``DESCRIPTORS_PER_NEW_PARTITION`` for its active
segment; sealed segments open theirs only when read, within a budget: see
``segment_files``), so creating partitions is refused up front with POLICY_VIOLATION when the new ones
would leave less than ``DESCRIPTOR_RESERVE_FRACTION`` of the process's descriptor limit
(RLIMIT_NOFILE) free: a creation that ran out of descriptors half-way would leave partial
partitions behind and starve every connection.

A partition whose log cannot be loaded at start-up (a bad sealed segment, a gap between
segments, an unreadable file: any exception from ``Log``) goes offline, as Kafka's failed log:
one ERROR naming the file and byte, ``get_log`` raises KAFKA_STORAGE_ERROR for it, and every
other partition is served. It stays offline until the broker restarts (after ``headrace
repair``); deleting its topic removes its directory. The same happens at run time when the
background scrub finds a bad batch in a sealed segment (``take_offline``): the log leaves the
served logs (retention, flushes and the cleaner no longer see it) but stays open until the
broker shuts down or its topic is deleted, so reads already holding its file slices finish;
a ``scrub-damage`` file in its directory keeps it offline at later starts until ``headrace
repair`` removes it.

A broker in a cluster holds only the partitions it leads (``create_local_partitions``, under
the cluster's topic id): such a topic counts all its partitions but has logs for some; the
others are neither served nor deleted here.

Creating a topic makes its partitions durable in one batch (concurrent fsyncs of the new
``partition.metadata`` files, then of the new directories and once of each log directory)
before the topic is published, so a topic a client has seen survives a crash.

Thread-safety: mutating calls (create/delete/alter/maintenance/shutdown) are serialized by one
lock (deleting a topic first waits for a cleaning of its partitions to stop, see
``Log.stop_cleaning``); ``get_log``/``topic``/``topics`` read dictionaries that are replaced, not mutated, so they
are safe from any thread. Topic config changes (``alter_topic_config``) may run on any thread:
a config lock, always taken before the manager's lock, orders them with each other and with
topic creation and deletion, and their file writes (fsyncs) happen under the config lock
alone, so the append thread and maintenance never wait for them; the new config is then
applied under the manager's lock and each log's (``Log.update_config``), which every append
holds. ``write_checkpoints`` may run on its own thread (the broker's
background thread): it takes a checkpoint lock, then the manager's lock only to read offsets,
and writes the files outside it.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
import re
import resource
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from headrace.errors import (
    InconsistentTopicId,
    InvalidPartitions,
    InvalidTopic,
    KafkaStorageError,
    PolicyViolation,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from headrace.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointCorrupt,
    read_checkpoint,
    write_checkpoint,
)
from headrace.storage.clock import Clock
from headrace.storage.config import (
    LogConfig,
    format_properties_text,
    parse_properties_text,
    validate_topic_overrides,
)
from headrace.storage.fs import (
    FileSystem,
    RealFileSystem,
    read_whole_file,
    remove_tree,
    write_file_atomically,
)
from headrace.storage.log import Log
from headrace.storage.repair import SCRUB_DAMAGE_MARK_FILE

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_MARKER = ".headrace_cleanshutdown"
TOPIC_CONFIGS_DIR = "__topic_configs"
PARTITION_METADATA = "partition.metadata"
DELETE_DIR_SUFFIX = "-delete"
MAX_TOPIC_NAME_LENGTH = 249
MAX_FILE_NAME_BYTES = 255  # NAME_MAX of Linux file systems, and Kafka's assumption
TOPIC_CONFIG_TMP_SUFFIX = "~"
LEGACY_TOPIC_CONFIG_SUFFIX = ".properties"
_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
CREATION_FSYNC_THREADS = 8
DESCRIPTORS_PER_NEW_PARTITION = 3  # its first segment: .log, .index and .timeindex files
DESCRIPTOR_RESERVE_FRACTION = 0.25  # of RLIMIT_NOFILE, kept for sockets, reads and rolls
_OPEN_DESCRIPTORS_DIR = Path("/proc/self/fd")
_CREATE_TRUNCATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    config: LogConfig
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OfflinePartition:
    """A partition whose log could not be loaded at start-up (Kafka's failed log): its
    directory and why (the file and byte position). Served as KAFKA_STORAGE_ERROR until an
    operator repairs it (``headrace repair``) and restarts the broker."""

    directory: Path
    reason: str
    log: Log | None = None  # the log taken offline at run time, still open until shutdown


def validate_topic_name(name: str) -> None:
    """Kafka's rules: [a-zA-Z0-9._-], 1..249 characters, not "." or ".."."""
    if not name or name in (".", ".."):
        raise InvalidTopic(f"Topic name '{name}' is illegal")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopic(f"Topic name '{name}' is longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_TOPIC_NAME.match(name):
        raise InvalidTopic(f"Topic name '{name}' is illegal, it contains a character other than "
                           "ASCII alphanumerics, '.', '_' and '-'")


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a ``<topic>-<partition>`` directory name, else None (a deleted
    partition's ``-delete`` directory or another file)."""
    if name.endswith(DELETE_DIR_SUFFIX) or name == TOPIC_CONFIGS_DIR:
        return None
    match = _PARTITION_DIR.match(name)
    return None if match is None else (match.group(1), int(match.group(2)))


def topic_overrides(log_dir: Path, topic: str) -> dict[str, str]:
    """A topic's config overrides as stored under ``log_dir`` (the first data directory),
    for tools reading a stopped broker's data; {} when it has none."""
    path = log_dir / TOPIC_CONFIGS_DIR / topic
    return parse_properties_text(path.read_text()) if path.exists() else {}


def deleted_dir_name(topic: str, partition: int) -> str:
    """``<topic>-<partition>.<uuid hex>-delete``, the topic cut short to fit the name in
    MAX_FILE_NAME_BYTES (as Kafka names a deleted log's directory)."""
    suffix = f"-{partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return topic[: MAX_FILE_NAME_BYTES - len(suffix)] + suffix


def encode_topic_id(topic_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def decode_topic_id(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def open_descriptor_count() -> int:
    """Descriptors this process has open (Linux's /proc/self/fd; 0 where it is absent)."""
    try:
        return len(os.listdir(_OPEN_DESCRIPTORS_DIR))
    except FileNotFoundError:
        return 0


def check_descriptor_budget(new_partitions: int) -> None:
    """PolicyViolation unless ``new_partitions`` more partitions leave the descriptor
    reserve free (see the module docstring)."""
    limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limit == resource.RLIM_INFINITY:
        return
    open_now = open_descriptor_count()
    needed = new_partitions * DESCRIPTORS_PER_NEW_PARTITION
    usable = limit - int(limit * DESCRIPTOR_RESERVE_FRACTION) - open_now
    if needed > usable:
        raise PolicyViolation(
            f"Creating {new_partitions} partition(s) needs {needed} file descriptors, but only "
            f"{max(usable, 0)} of the limit of {limit} are free beyond the "
            f"{DESCRIPTOR_RESERVE_FRACTION:.0%} kept for connections ({open_now} open).")


class LogManager:
    """Owns every partition log in the data directories."""

    def __init__(self, log_dirs: list[Path], broker_properties: dict[str, str], clock: Clock,
                 fs: FileSystem | None = None) -> None:
        if not log_dirs:
            raise ValueError("at least one log directory is needed")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.broker_properties = dict(broker_properties)
        self.clock = clock
        self.fs = fs or RealFileSystem()
        self._lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()  # taken before ``_lock``, never after
        self._config_lock = threading.Lock()  # topic config files; taken before ``_lock``
        self._topics: dict[str, TopicInfo] = {}
        self._logs: dict[tuple[str, int], Log] = {}
        self._log_dir_of: dict[tuple[str, int], Path] = {}
        self._offline: dict[tuple[str, int], OfflinePartition] = {}
        self._pending_dir_deletions: list[tuple[int, Path, list[Log]]] = []
        self._last_checkpoints: dict[Path, dict] = {}  # checkpoint file -> offsets written
        self._flush_due: set[tuple[str, int]] = set()  # logs a flusher round has not reached
        self._retention_due: set[tuple[str, int]] = set()  # same, for a retention check
        self._retention_check_running = False
        self._retention_deleted_segments = 0
        self._startup_state: dict[tuple[str, int], tuple[bool, int, int]] = {}
        # the replication-offset-checkpoint values read at start-up (initial_high_watermark)
        self._checkpointed_high_watermarks: dict[tuple[str, int], int] = {}

    @property
    def _configs_dir(self) -> Path:
        return self.log_dirs[0] / TOPIC_CONFIGS_DIR

    @property
    def _in_cluster(self) -> bool:
        """A broker of a cluster (``zookeeper.connect`` set) replicates; a single node's
        high watermarks always follow the log end: it neither applies nor writes
        ``replication-offset-checkpoint`` (a file a cluster broker left stays as it is)."""
        return bool(self.broker_properties.get("zookeeper.connect"))

    @property
    def _delete_delay_ms(self) -> int:
        return LogConfig.from_properties({}, self.broker_properties).file_delete_delay_ms

    # ---- start-up ------------------------------------------------------------------------

    def startup(self) -> None:
        """Load every log, recovering those of data directories without a clean-shutdown
        marker; then remove the markers (the logs are live again)."""
        with self._lock:
            LogConfig.from_properties({}, self.broker_properties)  # fail fast on bad defaults
            if not self.fs.exists(self._configs_dir):
                self.fs.mkdir(self._configs_dir)
                self.fs.fsync_dir(self.log_dirs[0])
            found: dict[str, dict[int, tuple[Path, uuid.UUID | None]]] = {}
            for log_dir in self.log_dirs:
                self.fs.mkdir(log_dir)
                self._scan_log_dir(log_dir, found)
            overrides_by_topic = self._overrides_by_topic(list(found))
            for topic, partitions in found.items():
                self._load_topic(topic, partitions, overrides_by_topic.get(topic, {}))
            for log_dir in self.log_dirs:
                marker = log_dir / CLEAN_SHUTDOWN_MARKER
                if self.fs.exists(marker):
                    self.fs.remove(marker)
                    self.fs.fsync_dir(log_dir)

    def _load_topic_configs(self) -> dict[str, dict[str, str]]:
        """Every topic's overrides by file name; a write a crash interrupted is removed."""
        configs = {}
        for name in self.fs.listdir(self._configs_dir):
            path = self._configs_dir / name
            if name.endswith(TOPIC_CONFIG_TMP_SUFFIX):
                self.fs.remove(path)
            elif _LEGAL_TOPIC_NAME.match(name):
                configs[name] = parse_properties_text(read_whole_file(self.fs, path).decode())
        return configs

    def _overrides_by_topic(self, topics: list[str]) -> dict[str, dict[str, str]]:
        """Each topic's overrides. A topic without a file ``<topic>`` has its file in the
        older ``<topic>.properties`` form, renamed to ``<topic>`` here; shorter names go
        first, so file ``a.properties`` is topic ``a``'s older file when ``a`` has no
        other, whether or not a topic ``a.properties`` exists."""
        configs = self._load_topic_configs()
        overrides: dict[str, dict[str, str]] = {}
        older_files: set[str] = set()
        for topic in sorted(topics, key=len):
            older_file = topic + LEGACY_TOPIC_CONFIG_SUFFIX
            if topic in configs and topic not in older_files:
                overrides[topic] = configs[topic]
            elif older_file in configs:
                overrides[topic] = configs[older_file]
                older_files.add(older_file)
                self.fs.rename(self._configs_dir / older_file, self._configs_dir / topic)
        if older_files:
            self.fs.fsync_dir(self._configs_dir)
        return overrides

    def _scan_log_dir(self, log_dir: Path, found: dict) -> None:
        clean = self.fs.exists(log_dir / CLEAN_SHUTDOWN_MARKER)
        try:
            recovery_points = read_checkpoint(self.fs, log_dir / RECOVERY_POINT_CHECKPOINT)
            log_starts = read_checkpoint(self.fs, log_dir / LOG_START_OFFSET_CHECKPOINT)
        except CheckpointCorrupt as error:
            logger.warning("%s; recovering every log in %s", error, log_dir)
            recovery_points, log_starts, clean = {}, {}, False
        try:
            self._checkpointed_high_watermarks.update(
                read_checkpoint(self.fs, log_dir / REPLICATION_OFFSET_CHECKPOINT))
        except CheckpointCorrupt as error:  # the high watermarks restart from 0, as absent
            logger.warning("%s; high watermarks of %s start from 0", error, log_dir)
        for name in sorted(self.fs.listdir(log_dir)):
            path = log_dir / name
            if not self.fs.is_dir(path) or name == TOPIC_CONFIGS_DIR:
                continue
            if name.endswith(DELETE_DIR_SUFFIX):
                remove_tree(self.fs, path)
                continue
            key = parse_partition_dir_name(name)
            if key is None:
                continue
            topic, partition = key
            self._startup_state[key] = (clean, recovery_points.get(key, 0),
                                        log_starts.get(key, 0))
            found.setdefault(topic, {})[partition] = (path, self._read_topic_id(path))

    def _read_topic_id(self, partition_dir: Path) -> uuid.UUID | None:
        path = partition_dir / PARTITION_METADATA
        if not self.fs.exists(path):
            return None
        fields = parse_properties_text(read_whole_file(self.fs, path).decode().replace(": ", "="))
        return decode_topic_id(fields["topic_id"]) if "topic_id" in fields else None

    def _load_topic(self, topic: str, partitions: dict, overrides: dict[str, str]) -> None:
        config = LogConfig.from_properties(overrides, self.broker_properties)
        topic_id = next((tid for _, tid in partitions.values() if tid is not None), None)
        topic_id = topic_id or uuid.uuid4()
        logs = dict(self._logs)
        for partition, (path, _) in sorted(partitions.items()):
            clean, recovery_point, log_start = self._startup_state[(topic, partition)]
            mark = path / SCRUB_DAMAGE_MARK_FILE
            if self.fs.exists(mark):  # found by a scrub before; not yet repaired
                reason = read_whole_file(self.fs, mark).decode(errors="replace")
                self._take_offline(topic, partition, path, KafkaStorageError(reason))
                continue
            try:
                logs[(topic, partition)] = Log(
                    topic, partition, path, config, self.fs, self.clock.now_ms(),
                    recovery_point=recovery_point, log_start_offset=log_start,
                    clean_shutdown=clean)
            except Exception as error:  # any damage takes this partition offline, not the broker
                self._take_offline(topic, partition, path, error)
                continue
            checkpointed = self._checkpointed_high_watermarks.get((topic, partition))
            if checkpointed is not None and self._in_cluster:  # replicated before: still is
                logs[(topic, partition)].manage_high_watermark(checkpointed)
            self._log_dir_of[(topic, partition)] = path.parent
        self._logs = logs
        count = max(partitions) + 1
        self._set_topic(TopicInfo(topic, topic_id, count, config, dict(overrides)))

    def _take_offline(self, topic: str, partition: int, path: Path, error: Exception) -> None:
        reason = f"{type(error).__name__}: {error}"
        out_of_files = isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE)
        remedy = "raise the open-file limit and restart the broker" if out_of_files else \
            "stop the broker and run headrace repair"
        logger.error("%s-%d is offline: its log in %s cannot be loaded: %s (the other "
                     "partitions are served; %s)", topic, partition, path, reason, remedy)
        self._offline[(topic, partition)] = OfflinePartition(path, reason)

    def take_offline(self, log: Log, reason: str) -> bool:
        """Take ``log``'s partition offline at run time (a scrub found damage): one ERROR,
        then KAFKA_STORAGE_ERROR for it until ``headrace repair`` and a restart. False when
        ``log`` is no longer the partition's served log (deleted or already offline)."""
        key = (log.topic, log.partition)
        with self._lock:
            if self._logs.get(key) is not log:
                return False
            logs = dict(self._logs)
            del logs[key]
            self._logs = logs
            self._log_dir_of.pop(key, None)
            self._offline[key] = OfflinePartition(log.dir, reason, log)
            write_file_atomically(self.fs, log.dir / SCRUB_DAMAGE_MARK_FILE, reason.encode())
        log.stop_cleaning()
        logger.error("%s-%d is offline: %s (the other partitions are served; stop the broker "
                     "and run headrace repair)", log.topic, log.partition, reason)
        return True

    def offline_partitions(self) -> dict[tuple[str, int], OfflinePartition]:
        """Partitions whose logs could not be loaded at start-up."""
        return dict(self._offline)

    def _set_topic(self, info: TopicInfo) -> None:
        topics = dict(self._topics)
        topics[info.name] = info
        self._topics = topics

    # ---- topics --------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, overrides: dict[str, str],
                     validate_only: bool = False) -> TopicInfo:
        with self._config_lock, self._lock:
            validate_topic_name(name)
            if name in self._topics:
                raise TopicAlreadyExists(f"Topic '{name}' already exists.")
            self._check_collision(name)
            if partitions < 1:
                raise InvalidPartitions(f"Number of partitions must be at least 1, got {partitions}")
            normalised = validate_topic_overrides(dict(overrides))
            config = LogConfig.from_properties(normalised, self.broker_properties)
            info = TopicInfo(name, uuid.uuid4(), partitions, config, normalised)
            check_descriptor_budget(partitions)
            if validate_only:
                return info
            self._write_topic_config(name, normalised)
            self._create_partitions(info, range(partitions))
            self._set_topic(info)
            logger.info("created topic %s with %d partitions", name, partitions)
            return info

    def _check_collision(self, name: str) -> None:
        folded = name.replace(".", "_")
        for existing in self._topics:
            if existing.replace(".", "_") == folded:
                raise InvalidTopic(f"Topic '{name}' collides with existing topic: {existing}")

    def _write_topic_config(self, name: str, overrides: dict[str, str]) -> None:
        write_file_atomically(self.fs, self._configs_dir / name,
                              format_properties_text(overrides).encode(),
                              tmp_suffix=TOPIC_CONFIG_TMP_SUFFIX)

    def _create_partitions(self, info: TopicInfo, partitions: range) -> None:
        """Create the partitions' directories, ``partition.metadata`` files and first segments,
        then make them durable in one batch: the metadata files' fsyncs run concurrently, then
        the renames, then the fsyncs of every new partition directory (its metadata and
        segment entries) and, once each, of the log directories holding them. The caller
        publishes the topic only after this returns."""
        created: list[tuple[Path, Path, int]] = []  # (partition dir, log dir, metadata fd)
        metadata = f"version: 0\ntopic_id: {encode_topic_id(info.topic_id)}\n".encode()
        try:
            for partition in partitions:
                log_dir = self._least_loaded_log_dir([d for _, d, _ in created])
                path = log_dir / f"{info.name}-{partition}"
                self.fs.mkdir(path)
                fd = self.fs.open(path / (PARTITION_METADATA + ".tmp"), _CREATE_TRUNCATE_FLAGS)
                created.append((path, log_dir, fd))
                self.fs.write(fd, metadata)
            self._fsync_concurrently(self.fs.fsync, [fd for _, _, fd in created])
        finally:
            for _, _, fd in created:
                self.fs.close(fd)
        logs = dict(self._logs)
        for partition, (path, _, _) in zip(partitions, created, strict=True):
            self.fs.rename(path / (PARTITION_METADATA + ".tmp"), path / PARTITION_METADATA)
            logs[(info.name, partition)] = Log(info.name, partition, path, info.config, self.fs,
                                               self.clock.now_ms(), clean_shutdown=True)
        directories = [path for path, _, _ in created]
        directories += sorted({log_dir for _, log_dir, _ in created})
        self._fsync_concurrently(self.fs.fsync_dir, directories)
        for partition, (_, log_dir, _) in zip(partitions, created, strict=True):
            self._log_dir_of[(info.name, partition)] = log_dir
        self._logs = logs

    @staticmethod
    def _fsync_concurrently(fsync, targets: list) -> None:
        """``fsync(target)`` for every target, up to ``CREATION_FSYNC_THREADS`` at a time: the
        file system commits concurrent fsyncs together, so N of them cost a few fsyncs'
        time rather than N."""
        if len(targets) <= 1:
            for target in targets:
                fsync(target)
            return
        threads = min(CREATION_FSYNC_THREADS, len(targets))
        with ThreadPoolExecutor(threads, thread_name_prefix="headrace-create-fsync") as pool:
            for _ in pool.map(fsync, targets):
                pass

    def _least_loaded_log_dir(self, being_created: list[Path]) -> Path:
        """The log directory holding the fewest partitions, counting ``being_created`` (the
        directories of partitions placed but not yet published)."""
        counts = {d: 0 for d in self.log_dirs}
        for log_dir in [*self._log_dir_of.values(), *being_created]:
            counts[log_dir] += 1
        return min(self.log_dirs, key=lambda d: counts[d])

    def delete_topic(self, name: str) -> None:
        """Rename the partition directories to ``<dir>.<uuid>-delete``; their files are
        removed after log.segment.delete.delay.ms (readers holding slices still finish)."""
        with self._config_lock, self._lock:
            info = self.topic(name)
            due_ms = self.clock.now_ms() + self._delete_delay_ms
            logs = dict(self._logs)
            for partition in range(info.partitions):
                offline = self._offline.pop((name, partition), None)
                if offline is not None:
                    directory = offline.directory
                    doomed = [offline.log] if offline.log is not None else []
                elif (name, partition) not in logs:  # cluster mode: led by another broker
                    continue
                else:
                    log = logs.pop((name, partition))
                    log.stop_cleaning()  # before the rename: no cleaner may write there
                    self._log_dir_of.pop((name, partition))
                    directory, doomed = log.dir, [log]
                target = directory.parent / deleted_dir_name(name, partition)
                self.fs.rename(directory, target)
                self.fs.fsync_dir(directory.parent)
                self._pending_dir_deletions.append((due_ms, target, doomed))
            self._logs = logs
            config_path = self._configs_dir / name
            if self.fs.exists(config_path):
                self.fs.remove(config_path)
            topics = dict(self._topics)
            del topics[name]
            self._topics = topics
            logger.info("deleted topic %s", name)

    def create_local_partitions(self, name: str, topic_id: uuid.UUID, partitions: list[int],
                                total_partitions: int, overrides: dict[str, str]) -> TopicInfo:
        """Cluster mode: make sure this broker holds the logs of ``partitions`` of ``name`` (the
        ones it leads), under the cluster's ``topic_id``; the topic's other partitions live on
        other brokers and have no log here. Creates the topic's local entry and config file
        first if missing. Idempotent; returns the local topic."""
        with self._config_lock, self._lock:
            info = self._topics.get(name)
            if info is None:
                validate_topic_name(name)
                normalised = validate_topic_overrides(dict(overrides))
                config = LogConfig.from_properties(normalised, self.broker_properties)
                info = TopicInfo(name, topic_id, total_partitions, config, normalised)
                self._write_topic_config(name, normalised)
            elif info.topic_id != topic_id:
                raise InconsistentTopicId(
                    f"local topic {name} has id {info.topic_id}, the cluster's is {topic_id}")
            missing = [p for p in partitions
                       if (name, p) not in self._logs and (name, p) not in self._offline]
            check_descriptor_budget(len(missing))
            self._create_partitions(info, missing)
            info = TopicInfo(name, topic_id, max(info.partitions, total_partitions), info.config,
                             info.overrides)
            self._set_topic(info)
            if missing:
                logger.info("created %s partitions %s", name, missing)
            return info

    def add_partitions(self, name: str, total_partitions: int) -> None:
        with self._lock:
            info = self.topic(name)
            if total_partitions <= info.partitions:
                raise InvalidPartitions(
                    f"Topic currently has {info.partitions} partitions, which is higher than or "
                    f"equal to the requested {total_partitions}.")
            check_descriptor_budget(total_partitions - info.partitions)
            self._create_partitions(info, range(info.partitions, total_partitions))
            self._set_topic(TopicInfo(name, info.topic_id, total_partitions, info.config,
                                      info.overrides))

    def topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicOrPartition(f"Unknown topic {name}")
        return info

    def topics(self) -> dict[str, TopicInfo]:
        return dict(self._topics)

    def get_log(self, topic: str, partition: int) -> Log:
        log = self._logs.get((topic, partition))
        if log is None:
            offline = self._offline.get((topic, partition))
            if offline is not None:
                raise KafkaStorageError(f"{topic}-{partition} is offline: {offline.reason}")
            raise UnknownTopicOrPartition(f"Unknown topic-partition {topic}-{partition}")
        return log

    def alter_topic_config(self, name: str, overrides: dict[str, str]) -> None:
        """Make ``overrides`` the topic's whole override set: persist it (temp file, fsync,
        rename, directory fsync) without the manager's lock, then apply it to every partition
        under it. Any thread; never holds a lock the append path takes while it fsyncs."""
        with self._config_lock:
            self.topic(name)
            normalised = validate_topic_overrides(dict(overrides))
            LogConfig.from_properties(normalised, self.broker_properties)
            self._write_topic_config(name, normalised)
            with self._lock:
                info = self.topic(name)
                config = LogConfig.from_properties(normalised, self.broker_properties)
                self._apply_config(TopicInfo(name, info.topic_id, info.partitions, config,
                                             normalised))

    def _apply_config(self, info: TopicInfo) -> None:
        self._set_topic(info)
        for partition in range(info.partitions):
            log = self._logs.get((info.name, partition))
            if log is not None:  # an offline partition gets the config at its next load
                log.update_config(info.config)

    def set_broker_defaults(self, broker_properties: dict[str, str]) -> None:
        with self._lock:
            LogConfig.from_properties({}, broker_properties)
            self.broker_properties = dict(broker_properties)
            for info in list(self._topics.values()):
                config = LogConfig.from_properties(info.overrides, self.broker_properties)
                self._apply_config(TopicInfo(info.name, info.topic_id, info.partitions, config,
                                             info.overrides))

    # ---- periodic work and shutdown ------------------------------------------------------

    def maintenance(self, now_ms: int, flush_by_time: bool = False,
                    check_retention: bool = False) -> None:
        """Roll by segment.ms and flush rolled segments (every round); with ``flush_by_time``
        start a round of Kafka's log flusher (flush.ms; the broker runs it each
        log.flush.scheduler.interval.ms), with ``check_retention`` a retention check (each
        log.retention.check.interval.ms), which renames segments to ``.deleted``. A log whose
        lock another thread holds (a cleaner swapping segments in) is skipped and its part of
        a flusher round or retention check done at the next call (``Log.maintain``), so the
        append thread never waits for a swap's fsyncs; a retention check logs its completion
        once every log had its turn. Neither checkpoints nor file removal happen here:
        ``write_checkpoints`` and ``remove_expired_files`` run on another thread so appends
        never wait for their fsyncs and unlinks."""
        with self._lock:
            keys = set(self._logs)
            if flush_by_time:
                self._flush_due = set(keys)
            if check_retention:
                self._retention_due = set(keys)
                self._retention_check_running = True
            for key, log in list(self._logs.items()):
                deleted = log.maintain(now_ms, flush_by_time=key in self._flush_due,
                                       check_retention=key in self._retention_due)
                if deleted is not None:
                    self._flush_due.discard(key)
                    self._retention_due.discard(key)
                    self._retention_deleted_segments += deleted
            self._retention_due &= keys  # a deleted topic's logs are not waited for
            self._flush_due &= keys
            if self._retention_check_running and not self._retention_due:
                self._retention_check_running = False
                logger.info("log retention check completed: %d segments deleted",
                            self._retention_deleted_segments)
                self._retention_deleted_segments = 0

    def remove_expired_files(self, now_ms: int) -> None:
        """Remove the ``.deleted`` segments and deleted partition directories whose
        file.delete.delay.ms has passed. Safe from any thread, concurrently with appends and
        maintenance: the unlinks run outside the manager's lock (and each log's)."""
        with self._lock:
            logs = list(self._logs.values())
            due_dirs = self._take_due_dir_deletions(now_ms, force=False)
        for log in logs:
            log.remove_deleted_files(now_ms)
        self._remove_dirs(due_dirs)

    def _take_due_dir_deletions(self, now_ms: int, force: bool) -> list:
        """Callers hold ``_lock``."""
        due, kept = [], []
        for deletion in self._pending_dir_deletions:
            due_ms = deletion[0]
            (due if force or due_ms <= now_ms else kept).append(deletion)
        self._pending_dir_deletions = kept
        return due

    def _remove_dirs(self, due_dirs: list) -> None:
        for _due_ms, path, logs in due_dirs:
            for log in logs:
                log.close_without_flush()
            remove_tree(self.fs, path)

    def initial_high_watermark(self, topic: str, partition: int) -> int:
        """Where a log's managed high watermark starts (``Log.manage_high_watermark``): the
        value in ``replication-offset-checkpoint`` at start-up, 0 when absent (Kafka's
        default), clamped to the log's [log start, log end]. In a cluster, a log with a
        checkpointed value is loaded with its high watermark managed from it already."""
        log = self.get_log(topic, partition)
        checkpointed = self._checkpointed_high_watermarks.get((topic, partition), 0)
        return min(max(checkpointed, log.log_start_offset), log.log_end_offset)

    def write_checkpoints(self, recovery_points: bool = True,
                          log_start_offsets: bool = True, high_watermarks: bool = False
                          ) -> None:
        """Write the recovery-point, log-start-offset and/or replication-offset (high
        watermark) checkpoints of every data directory whose offsets changed since the last
        write (the broker writes each on its own Kafka interval:
        log.flush.offset.checkpoint.interval.ms, log.flush.start.offset.checkpoint.interval.ms,
        replica.high.watermark.checkpoint.interval.ms). Safe from any thread, concurrently
        with appends and maintenance: the offsets are read under the manager's lock, the
        files are written (and fsynced) outside it. Checkpoints only shorten recovery; data
        is durable by the flush policy (flush.messages, flush.ms) alone."""
        names = [name for name, wanted in ((RECOVERY_POINT_CHECKPOINT, recovery_points),
                                           (LOG_START_OFFSET_CHECKPOINT, log_start_offsets),
                                           (REPLICATION_OFFSET_CHECKPOINT, high_watermarks))
                 if wanted]
        with self._checkpoint_lock:
            self._write_checkpoints(names, only_if_changed=True)

    def _write_checkpoints(self, names: list[str], only_if_changed: bool) -> None:
        """Callers hold ``_checkpoint_lock``, so snapshots reach the files in the order they
        were taken."""
        with self._lock:
            snapshots = [(log_dir / name, self._checkpoint_snapshot(log_dir, name))
                         for log_dir in self.log_dirs for name in names]
        for path, offsets in snapshots:
            if only_if_changed and self._last_checkpoints.get(path) == offsets:
                continue
            if path.name == REPLICATION_OFFSET_CHECKPOINT and (
                    not self._in_cluster or (not offsets and not self.fs.exists(path))):
                continue  # a single node, or no replicated log yet: no file
            write_checkpoint(self.fs, path, offsets)
            self._last_checkpoints[path] = offsets

    def _checkpoint_snapshot(self, log_dir: Path, name: str) -> dict:
        keys = [k for k, d in self._log_dir_of.items() if d == log_dir]
        if name == RECOVERY_POINT_CHECKPOINT:
            return {k: self._logs[k].recovery_point for k in keys}
        if name == REPLICATION_OFFSET_CHECKPOINT:
            return {k: self._logs[k].high_watermark for k in keys
                    if self._logs[k].high_watermark_managed}
        return {k: self._logs[k].log_start_offset for k in keys}

    def shutdown(self) -> None:
        """Flush and close every log, write the checkpoints, then the clean-shutdown
        markers."""
        with self._checkpoint_lock, self._lock:
            for log in self._logs.values():
                log.close()
            for offline in self._offline.values():
                if offline.log is not None:
                    offline.log.close()
            self._remove_dirs(self._take_due_dir_deletions(0, force=True))
            self._write_checkpoints([RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT,
                                     REPLICATION_OFFSET_CHECKPOINT], only_if_changed=False)
            for log_dir in self.log_dirs:
                write_file_atomically(self.fs, log_dir / CLEAN_SHUTDOWN_MARKER, b"")
