"""The harness of the replication tests: three real brokers sharing a ZooKeeper chroot, each
run as a ``headrace.faults.node.BrokerNode`` (killed with SIGKILL, paused with SIGSTOP,
power-cut through the shim, restarted on its own port and data directory), and the readers a
scenario needs: a partition's state znode (woken by watches), its leader and ISR, each
replica's log as batch headers read from its segment files, producing with real clients
(confluent-kafka, idempotent, acks=all) and consuming what the leader serves.

``ReplicatedCluster(base_dir, zookeeper_connect, overrides, power_shim, namespace,
zookeeper_connect_of)``: ``zookeeper_connect_of(broker_id)`` may give each broker its own
connect string (the isolated-leader test reaches ZooKeeper through one address per broker, so
one broker's ZooKeeper traffic can be dropped alone). Topics are created with an explicit
replica assignment (the first replica is the preferred leader) through CreateTopics.

Replica logs are compared by their batch headers (base offset, last offset, leader epoch,
CRC): a follower copies the leader's batches unchanged, so converged replicas hold equal
lists. A segment read while its broker appends may end in a partial batch; reading stops
there (``replica_batches`` reports whole batches only).

Waits are bounded and on observed states: ZooKeeper watches for znodes, otherwise repeated
observation (``wait_until``) of client answers or files.

Thread-safety: one test thread drives a cluster; producers' callbacks run inside ``poll`` and
``flush`` on that thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.errors import CorruptMessage
from headrace.faults.namespace import Namespace
from headrace.faults.node import BrokerNode, free_port
from headrace.protocol.batch import BATCH_HEADER_BYTES, BatchHeader, parse_header
from tests.broker.raw_client import RawClient
from tests.cluster import cluster_helpers

BROKER_IDS = (1, 2, 3)
# Three brokers, ZooKeeper, clients and other engineers' suites share two cores: waits are
# generous (still bounded; nothing here is timed).
WAIT_TIMEOUT_S = 90.0
SESSION_TIMEOUT_MS = 6000  # a SIGKILLed broker leaves ZooKeeper (and the ISR) this long after
METADATA_KEY = 3
DELIVERY_TIMEOUT_MS = 120_000
FLUSH_TIMEOUT_S = 150.0
BROKER_OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "controlled.shutdown.retry.backoff.ms": "100",
}


def wait_until(observe: Callable[[], object], what: str, timeout_s: float = WAIT_TIMEOUT_S):
    return cluster_helpers.wait_until(observe, what, timeout_s)


@dataclass(frozen=True)
class BatchSummary:
    """What identifies a stored batch across replicas."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int

    @classmethod
    def of(cls, header: BatchHeader) -> BatchSummary:
        return cls(header.base_offset, header.last_offset, header.partition_leader_epoch,
                   header.crc)


def whole_batches(segment: bytes) -> Iterator[BatchHeader]:
    """The whole batches at the start of ``segment`` (a partial or torn tail ends it)."""
    position = 0
    while position + BATCH_HEADER_BYTES <= len(segment):
        try:
            header = parse_header(segment, position)
        except CorruptMessage:
            return
        if header.batch_length <= 0 or position + header.size_bytes > len(segment):
            return
        yield header
        position += header.size_bytes


class ReplicatedCluster:
    """Three broker nodes under one chroot; a kazoo client of the test inside it."""

    def __init__(self, base_dir: Path, zookeeper_connect: str,
                 overrides: dict[str, str] | None = None, power_shim: Path | None = None,
                 namespace: Namespace | None = None, host: str = "127.0.0.1",
                 zookeeper_connect_of: Callable[[int], str] | None = None) -> None:
        self.zookeeper_connect = zookeeper_connect
        self.namespace = namespace
        self.brokers: dict[int, BrokerNode] = {}
        for broker_id in BROKER_IDS:
            connect = zookeeper_connect_of(broker_id) if zookeeper_connect_of else zookeeper_connect
            self.brokers[broker_id] = BrokerNode(
                f"broker-{broker_id}", host, free_port(host, namespace),
                base_dir / f"broker-{broker_id}",
                {"broker.id": str(broker_id), "zookeeper.connect": connect,
                 **BROKER_OVERRIDES, **(overrides or {})},
                namespace=namespace, power_shim=power_shim)
        self.zk: KazooClient | None = None

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers.values())

    def bootstrap_of(self, broker_ids: Iterable[int]) -> str:
        return ",".join(self.brokers[b].bootstrap for b in broker_ids)

    def start(self) -> None:
        for broker in self.brokers.values():
            broker.start()
        self.zk = KazooClient(hosts=self.zookeeper_connect, timeout=10.0)
        self.zk.start(timeout=WAIT_TIMEOUT_S)
        self.wait_for_registered(BROKER_IDS)

    def stop(self) -> None:
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        for broker in self.brokers.values():
            broker.stop()

    def running(self) -> list[int]:
        return [b for b, broker in self.brokers.items() if broker.running]

    def kill(self, broker_id: int) -> None:
        """SIGKILL (the page cache survives: only power cuts lose unflushed writes)."""
        self.brokers[broker_id].kill()

    def pause(self, broker_ids: Iterable[int]) -> None:
        for broker_id in broker_ids:
            self.brokers[broker_id].pause()

    def resume(self, broker_ids: Iterable[int]) -> None:
        for broker_id in broker_ids:
            self.brokers[broker_id].resume()

    def power_cut(self, broker_id: int) -> int:
        """SIGKILL, then only what the broker fsynced stays; the bytes dropped."""
        return self.brokers[broker_id].power_cut().dropped_bytes

    def restart_after_expiry(self, broker_id: int) -> None:
        """Start a stopped or killed broker once ZooKeeper dropped its old registration (a
        broker refuses to register over a live one)."""
        self.wait_for_unregistered(broker_id)
        self.brokers[broker_id].start()
        self.wait_for_registered([broker_id])

    def restore(self) -> None:
        """Every broker running again (for the next test of a module-scoped cluster)."""
        self.resume(self.running())
        for broker_id, broker in self.brokers.items():
            if not broker.running:
                self.restart_after_expiry(broker_id)

    def registered(self) -> set[int]:
        self.zk.sync(paths.BROKER_IDS)
        return {int(child) for child in self.zk.get_children(paths.BROKER_IDS)}

    def wait_for_registered(self, broker_ids: Iterable[int]) -> None:
        wanted = set(broker_ids)
        wait_until(lambda: wanted <= self.registered(), f"brokers {sorted(wanted)} to register")

    def wait_for_unregistered(self, broker_id: int) -> None:
        wait_until(lambda: broker_id not in self.registered(),
                   f"broker {broker_id}'s registration to expire")

    # --- topics and partition states ------------------------------------------------------

    def create_topic(self, name: str, replicas: Sequence[int], configs: dict[str, str]) -> None:
        """One partition on ``replicas`` (the first is the preferred leader)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap_of(self.running())})
        topic = NewTopic(name, 1, -1, replica_assignment=[list(replicas)], config=configs)
        for future in admin.create_topics([topic]).values():
            future.result(timeout=WAIT_TIMEOUT_S)

    def state(self, topic: str, partition: int = 0) -> records.PartitionState | None:
        return cluster_helpers.partition_state(self.zk, topic, partition)

    def wait_for_state(self, topic: str, predicate: Callable[[records.PartitionState], bool],
                       what: str, partition: int = 0,
                       timeout_s: float = WAIT_TIMEOUT_S) -> records.PartitionState:
        """Until the state znode satisfies ``predicate``, woken by watches on it."""
        path = paths.partition_state_path(topic, partition)
        deadline = time.monotonic() + timeout_s
        changed = threading.Event()
        while True:
            changed.clear()
            self.zk.sync(path)
            if self.zk.exists(path, watch=lambda _event: changed.set()) is not None:
                data, _ = self.zk.get(path, watch=lambda _event: changed.set())
                state = records.decode_partition_state(data)
                if predicate(state):
                    return state
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not changed.wait(remaining_s):
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what} "
                                     f"(state: {self.state(topic, partition)})")

    def wait_for_isr(self, topic: str, isr: Iterable[int], partition: int = 0
                     ) -> records.PartitionState:
        wanted = set(isr)
        return self.wait_for_state(topic, lambda s: set(s.isr) == wanted and s.has_leader,
                                   f"{topic}-{partition}'s ISR to be {sorted(wanted)}",
                                   partition)

    def wait_for_leader(self, topic: str, candidates: Iterable[int], partition: int = 0,
                        newer_than_epoch: int = -1) -> records.PartitionState:
        allowed = set(candidates)
        return self.wait_for_state(
            topic, lambda s: s.leader in allowed and s.leader_epoch > newer_than_epoch,
            f"{topic}-{partition} to be led by one of {sorted(allowed)} in an epoch after "
            f"{newer_than_epoch}", partition)

    def metadata_leader(self, broker_id: int, topic: str, partition: int = 0
                        ) -> tuple[int, int] | None:
        """(leader, leader epoch) as ``broker_id`` answers Metadata; None without a leader."""
        values = {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                  "include_topic_authorized_operations": False}
        with RawClient(self.brokers[broker_id].bootstrap) as client:
            answer = client.request(METADATA_KEY, 12, values)
        for found in answer.topics[0].partitions:
            if found.partition_index == partition and not found.error_code:
                return found.leader_id, found.leader_epoch
        return None

    def wait_for_metadata_leader(self, topic: str, leader: int, epoch: int,
                                 broker_ids: Iterable[int], partition: int = 0) -> None:
        """Every broker of ``broker_ids`` answers Metadata with ``leader`` in ``epoch``."""
        asked = list(broker_ids)
        wait_until(lambda: all(self.metadata_leader(b, topic, partition) == (leader, epoch)
                               for b in asked),
                   f"brokers {asked} to name {leader} leader of {topic}-{partition} in "
                   f"epoch {epoch}")

    # --- replica logs -------------------------------------------------------------------

    def partition_dir(self, broker_id: int, topic: str, partition: int = 0) -> Path:
        return self.brokers[broker_id].data_dir / f"{topic}-{partition}"

    def replica_batches(self, broker_id: int, topic: str, partition: int = 0
                        ) -> list[BatchSummary]:
        """The whole batches of the replica's segment files, in offset order."""
        directory = self.partition_dir(broker_id, topic, partition)
        if not directory.is_dir():
            return []
        batches: list[BatchSummary] = []
        for segment in sorted(directory.glob("*.log")):
            try:
                content = segment.read_bytes()
            except FileNotFoundError:  # deleted by truncation or retention meanwhile
                continue
            batches.extend(BatchSummary.of(h) for h in whole_batches(content))
        return batches

    def log_end_offset(self, broker_id: int, topic: str, partition: int = 0) -> int:
        batches = self.replica_batches(broker_id, topic, partition)
        return batches[-1].last_offset + 1 if batches else 0

    def wait_for_identical_replicas(self, topic: str, broker_ids: Sequence[int],
                                    partition: int = 0) -> list[BatchSummary]:
        """Until every replica's batches equal the first's (which is non-empty); those."""
        def identical():
            logs = [self.replica_batches(b, topic, partition) for b in broker_ids]
            return logs[0] if logs[0] and all(log == logs[0] for log in logs) else None

        try:
            return wait_until(identical, f"replicas {list(broker_ids)} of {topic}-{partition} "
                                         f"to hold identical batches")
        except AssertionError as failure:
            described = {b: _describe(self.replica_batches(b, topic, partition))
                         for b in broker_ids}
            raise AssertionError(f"{failure}; replicas: {described}") from None


def _describe(batches: list[BatchSummary]) -> str:
    return " ".join(f"[{b.base_offset}-{b.last_offset} e{b.leader_epoch} {b.crc:08x}]"
                    for b in batches[-12:])


# --- clients ------------------------------------------------------------------------------


class AckedProducer:
    """An idempotent acks=all confluent-kafka producer remembering what was acknowledged (in
    acknowledgement order) and what failed."""

    def __init__(self, bootstrap: str, topic: str, **settings: object) -> None:
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[tuple[bytes, KafkaError]] = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_MS,
            "topic.metadata.refresh.interval.ms": 1000, **settings})

    def _delivered(self, error, message) -> None:
        if error is None:
            self.acked.append(message.value())
        else:
            self.failed.append((message.value(), error))

    def send(self, values: Iterable[bytes], partition: int = 0) -> None:
        for value in values:
            while True:
                try:
                    self.producer.produce(self.topic, value, partition=partition,
                                          on_delivery=self._delivered)
                    break
                except BufferError:  # queue full: serve callbacks, then again
                    self.producer.poll(0.1)
            self.producer.poll(0)

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        remaining = self.producer.flush(timeout_s)
        assert remaining == 0, f"{remaining} records still unacknowledged after {timeout_s} s"
        assert not self.failed, f"{len(self.failed)} records failed, first: {self.failed[0]}"

    def wait_for_acked(self, count: int, what: str) -> None:
        wait_until(lambda: self.producer.poll(0.05) is not None and len(self.acked) >= count,
                   what)


def consumer_of(bootstrap: str, topic: str, partition: int = 0,
                offset: int = OFFSET_BEGINNING, **settings: object) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{os.getpid()}",
                         "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 1000,
                         **settings})
    consumer.assign([TopicPartition(topic, partition, offset)])
    return consumer


def consume_at_least(consumer: Consumer, count: int, what: str,
                     timeout_s: float = WAIT_TIMEOUT_S,
                     error_codes: list[int] | None = None) -> list[bytes]:
    """Values consumed until ``count`` were (bounded). The codes of the errors the client
    reports go to ``error_codes`` (and the failure message); a fatal one fails the test."""
    values: list[bytes] = []
    errors: list[str] = []
    codes = error_codes if error_codes is not None else []

    def enough() -> bool:
        for message in consumer.consume(500, timeout=0.2):
            error = message.error()
            if error is None:
                values.append(message.value())
            elif error.code() != KafkaError._PARTITION_EOF:
                assert not error.fatal(), f"consumer error: {error}"
                errors.append(str(error))
                codes.append(error.code())
        return len(values) >= count

    try:
        wait_until(enough, f"{count} records of {what} to be consumed", timeout_s)
    except AssertionError as failure:
        raise AssertionError(f"{failure}: got {len(values)}, errors {errors[-3:]}") from None
    return values


def read_all(bootstrap: str, topic: str, expected_count: int, partition: int = 0) -> list[bytes]:
    """Every record of the partition from its start, read by a new consumer until
    ``expected_count`` were read, then until an end-of-partition is seen."""
    consumer = consumer_of(bootstrap, topic, partition, **{"enable.partition.eof": True})
    try:
        values = consume_at_least(consumer, expected_count, topic)
        at_end = []

        def drained() -> bool:
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is None:
                    values.append(message.value())
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.append(True)
            return bool(at_end)

        wait_until(drained, f"the end of {topic}-{partition}")
        return values
    finally:
        consumer.close()


def assert_acked_consumed_once_in_order(acked: Sequence[bytes], consumed: Sequence[bytes]) -> None:
    """Every acknowledged record was consumed exactly once, in the order it was sent (records
    are named by an increasing sequence number, so order is their sort order)."""
    duplicates = len(consumed) - len(set(consumed))
    assert duplicates == 0, f"{duplicates} records consumed twice"
    missing = sorted(set(acked) - set(consumed))
    assert not missing, f"{len(missing)} acknowledged records lost, first {missing[:5]}"
    assert list(consumed) == sorted(consumed), "records consumed out of order"


def numbered(prefix: bytes, start: int, stop: int, padding_bytes: int = 0) -> list[bytes]:
    """Values ``<prefix>-<000000n>`` (sortable), each padded to ``padding_bytes`` if given."""
    return [(b"%s-%08d" % (prefix, n)).ljust(padding_bytes, b".") for n in range(start, stop)]


def checkpointed_high_watermark(data_dir: Path, topic: str, partition: int = 0) -> int | None:
    """The partition's HW in the log dir's ``replication-offset-checkpoint`` (Kafka's format:
    version, count, then ``topic partition offset`` lines); None when absent."""
    try:
        lines = (data_dir / "replication-offset-checkpoint").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        fields = line.split(" ")
        if len(fields) == 3 and fields[0] == topic and fields[1] == str(partition):
            return int(fields[2])
    return None
