"""Produce and consume throughput of a three-broker cluster against a one-broker cluster, and
how long metadata takes to reach every broker after CreateTopics.

One ZooKeeper node; two clusters side by side under chroots of their own: one broker, and
three brokers (RF=1). Each of ``--rounds`` rounds, for each cluster in turn: a new topic of
``--partitions`` partitions; one confluent-kafka producer (acks=1, linger.ms=5) writes
``--records`` records of ``--record-bytes`` round-robin over the partitions (MB/s until its
flush returns), then one consumer assigned every partition reads them all back (MB/s). Prints
each round, then the medians and the ratios three / one (goal: at least 0.9 for both).

Metadata propagation, on the three-broker cluster: ``--propagation-topics`` topics created one
after another; for each, the time from the CreateTopics response until every broker's Metadata
(a raw request per broker, repeated) shows a live leader for every partition. Prints p50, p99
and max in ms.

    nice -n 5 .venv/bin/python bench/cluster_throughput.py --records 200000 --rounds 3

Scratch data under /tmp/cluster-throughput (or ``--scratch``); everything binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble  # noqa: E402
from tests.broker.raw_client import RawClient  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402

METADATA_KEY, METADATA_VERSION = 3, 12
TIMEOUT_S = 120.0


class Cluster:
    def __init__(self, scratch: Path, name: str, connect: str, broker_count: int) -> None:
        self.brokers = []
        for broker_id in range(1, broker_count + 1):
            data_dir = scratch / name / f"broker-{broker_id}"
            data_dir.mkdir(parents=True)
            self.brokers.append(BrokerProcess(data_dir, {
                "broker.id": str(broker_id), "zookeeper.connect": connect,
                "offsets.topic.num.partitions": "1"}))

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers)

    def start(self) -> None:
        for broker in self.brokers:
            broker.start()
        wait_for(lambda: all(len(metadata(b, []).brokers) == len(self.brokers)
                             for b in self.brokers), "every broker registered")

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()

    def create_topic(self, partitions: int) -> str:
        """A new topic; returns once CreateTopics answered (leaders may not be known yet)."""
        name = f"bench-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(TIMEOUT_S)
        return name

    def leaders_everywhere(self, topic: str) -> bool:
        return all(_has_leaders(metadata(broker, [topic])) for broker in self.brokers)


def metadata(broker: BrokerProcess, topics: list[str]):
    with RawClient(broker.bootstrap) as client:
        return client.request(METADATA_KEY, METADATA_VERSION, {
            "topics": [{"name": t} for t in topics] if topics else None,
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})


def _has_leaders(answer) -> bool:
    live = {broker.node_id for broker in answer.brokers}
    return all(topic.error_code == 0 and topic.partitions and all(
        p.error_code == 0 and p.leader_id in live for p in topic.partitions)
        for topic in answer.topics)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.001)


def produce(bootstrap: str, topic: str, partitions: int, records: int, record_bytes: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
                         "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512 * 1024})
    value = b"x" * record_bytes
    started = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(TIMEOUT_S) == 0
    return records * record_bytes / (time.perf_counter() - started) / 1e6


def consume(bootstrap: str, topic: str, partitions: int, records: int, record_bytes: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    started, seen = time.perf_counter(), 0
    deadline = time.monotonic() + TIMEOUT_S
    while seen < records and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    if seen < records:
        raise SystemExit(f"consumed {seen} of {records} records")
    return records * record_bytes / elapsed / 1e6


def throughput_round(cluster: Cluster, args) -> dict:
    topic = cluster.create_topic(args.partitions)
    wait_for(lambda: cluster.leaders_everywhere(topic), f"leaders of {topic}")
    produced = produce(cluster.bootstrap, topic, args.partitions, args.records, args.record_bytes)
    consumed = consume(cluster.bootstrap, topic, args.partitions, args.records, args.record_bytes)
    return {"produce_mb_per_s": round(produced, 1), "consume_mb_per_s": round(consumed, 1)}


def propagation_ms(cluster: Cluster, topics: int, partitions: int) -> list[float]:
    times = []
    for _ in range(topics):
        topic = cluster.create_topic(partitions)
        answered = time.perf_counter()
        wait_for(lambda t=topic: cluster.leaders_everywhere(t), "leaders everywhere")
        times.append((time.perf_counter() - answered) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--propagation-topics", type=int, default=50)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/cluster-throughput"))
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    with ZooKeeperEnsemble(args.scratch / "zookeeper", size=1) as zookeeper:
        clusters = {size: Cluster(args.scratch, f"cluster-{size}",
                                  f"{zookeeper.connect_string}/cluster-{size}", size)
                    for size in (1, 3)}
        try:
            for cluster in clusters.values():
                cluster.start()
            rounds = {1: [], 3: []}
            for round_number in range(args.rounds):
                for size, cluster in clusters.items():
                    result = {"round": round_number, "brokers": size,
                              **throughput_round(cluster, args)}
                    rounds[size].append(result)
                    print(json.dumps(result), flush=True)
            times = propagation_ms(clusters[3], args.propagation_topics, args.partitions)
        finally:
            for cluster in clusters.values():
                cluster.stop()
    summary = {"records": args.records, "record_bytes": args.record_bytes,
               "partitions": args.partitions, "rounds": args.rounds}
    for name in ("produce_mb_per_s", "consume_mb_per_s"):
        one = statistics.median(r[name] for r in rounds[1])
        three = statistics.median(r[name] for r in rounds[3])
        summary[f"{name}_one_broker"], summary[f"{name}_three_brokers"] = one, three
        summary[f"{name}_ratio"] = round(three / one, 2)
    ordered = sorted(times)
    summary["metadata_propagation_ms"] = {
        "topics": len(ordered), "p50": round(ordered[len(ordered) // 2], 1),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "max": round(ordered[-1], 1)}
    print(json.dumps(summary))
    shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
