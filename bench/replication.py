"""Replication figures for BENCHMARKS.md (issue #19), each pair measured in one run on the same
three brokers: RF=3 acks=all produce MB/s against RF=1 acks=all; end-to-end p99 latency at a
fixed rate, RF=3 against RF=1; follower catch-up MB/s against a plain consumer reading the
same bytes; unavailability after a leader SIGKILL and after a controlled shutdown (SIGTERM),
with the acknowledged records lost counted.

A three-node ZooKeeper ensemble and three brokers (the replication tests' harness,
``tests/cluster/replication/replicated_cluster.py``) under ``--scratch`` (default
/tmp/replication-bench), all on 127.0.0.1. Phases:

1. ``produce``: topics of 3 partitions, one led by each broker: RF=3 (min.insync.replicas=2)
   and RF=1; ``--produce-mb`` of ``--record-bytes`` records each, acks=all, idempotent.
2. ``latency``: ``--rate`` records/s for ``--latency-s`` seconds into one partition of each
   topic, a consumer reading it in the same process; latency = consumed - sent (monotonic
   clock), p50/p99/max.
3. ``catch_up``: an RF=3 single-partition topic; one follower is SIGKILLed, ``--catch-up-mb``
   are written (acks=all, the ISR being the two others), the follower is started again;
   timed from its start (it fetches before it registers) until the state znode lists it in
   the ISR. Then
   a plain consumer reads the same bytes from the leader from offset 0.
4. ``unavailability``: an RF=3 topic (min.insync.replicas=2) written continuously
   (``--outage-rate`` records/s, acks=all, idempotent); its leader is SIGKILLed (then
   SIGTERMed in a second round); unavailability = from the signal until the first
   acknowledgement of a record sent after it (``unavailable_s``), and the longest time
   without any acknowledgement from the signal until a second of writes after that
   (``longest_ack_gap_s``). Afterwards every acknowledged record is looked for in the topic:
   ``lost`` counts the missing ones.

Output: one JSON object per phase, then the summary (``--output json``: one line, the summary
with every phase in it). Every loop is bounded in count and time (``--wait-timeout-s``).

    .venv/bin/python bench/replication.py --produce-mb 256 --catch-up-mb 1024 --output json

Timings need a quiet machine; run niced at small sizes to check the script only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble  # noqa: E402
from tests.cluster.replication import replicated_cluster as harness  # noqa: E402
from tests.cluster.replication.replicated_cluster import ReplicatedCluster  # noqa: E402

SPREAD_RF3 = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
SPREAD_RF1 = [[1], [2], [3]]
CHROOT = "/replication-bench"


def create(cluster: ReplicatedCluster, name: str, assignment: list[list[int]],
           min_insync_replicas: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_of(cluster.running())})
    topic = NewTopic(name, len(assignment), -1, replica_assignment=assignment,
                     config={"min.insync.replicas": str(min_insync_replicas)})
    for future in admin.create_topics([topic]).values():
        future.result(timeout=harness.WAIT_TIMEOUT_S)
    for partition, replicas in enumerate(assignment):
        cluster.wait_for_isr(name, replicas, partition)


def producer_of(bootstrap: str, **settings: object) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "batch.size": 1_000_000,
                     "queue.buffering.max.kbytes": 256 * 1024, **settings})


def produce_mb_per_s(bootstrap: str, topic: str, partitions: int, total_bytes: int,
                     record_bytes: int, timeout_s: float) -> float:
    producer = producer_of(bootstrap)
    value = b"x" * record_bytes
    records = total_bytes // record_bytes
    started = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(timeout_s) != 0:
        raise SystemExit(f"{topic}: records unacknowledged after {timeout_s} s")
    return records * record_bytes / (time.perf_counter() - started) / 1e6


def consume_mb_per_s(bootstrap: str, topic: str, records: int, record_bytes: int,
                     timeout_s: float) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                         "enable.auto.commit": False, "fetch.max.bytes": 52_428_800})
    consumer.assign([TopicPartition(topic, 0, 0)])
    started, seen = time.perf_counter(), 0
    deadline = time.monotonic() + timeout_s
    try:
        while seen < records and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    finally:
        consumer.close()
    if seen < records:
        raise SystemExit(f"{topic}: consumed {seen} of {records} records")
    return records * record_bytes / (time.perf_counter() - started) / 1e6


def latency_ms(bootstrap: str, topic: str, rate: int, seconds: float,
               timeout_s: float) -> dict[str, float]:
    """Send ``rate`` records/s to partition 0, each carrying its send time; a consumer in
    this process records the delay at which each arrives."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{topic}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(topic, 0, 0)])
    delays_ms: list[float] = []
    total = int(rate * seconds)
    done = threading.Event()

    def consume() -> None:
        deadline = time.monotonic() + seconds + timeout_s
        while len(delays_ms) < total and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    sent_ns = int(message.value()[:20])
                    delays_ms.append((time.monotonic_ns() - sent_ns) / 1e6)
        done.set()

    reader = threading.Thread(target=consume, name="latency-consumer")
    reader.start()
    producer = producer_of(bootstrap, **{"linger.ms": 0})
    started = time.monotonic()
    for index in range(total):
        due = started + index / rate
        while (wait_s := due - time.monotonic()) > 0:
            producer.poll(min(wait_s, 0.005))
        producer.produce(topic, b"%020d" % time.monotonic_ns() + b"." * 80, partition=0)
        producer.poll(0)
    producer.flush(timeout_s)
    done.wait(seconds + timeout_s)
    reader.join(timeout_s)
    consumer.close()
    if len(delays_ms) < total:
        raise SystemExit(f"{topic}: {len(delays_ms)} of {total} latency records consumed")
    ordered = sorted(delays_ms)
    return {"p50_ms": round(ordered[len(ordered) // 2], 2),
            "p99_ms": round(ordered[int(len(ordered) * 0.99)], 2),
            "max_ms": round(ordered[-1], 2)}


def produce_phase(cluster: ReplicatedCluster, args) -> dict:
    figures = {}
    for name, assignment, min_isr in (("produce-rf3", SPREAD_RF3, 2),
                                      ("produce-rf1", SPREAD_RF1, 1)):
        create(cluster, name, assignment, min_isr)
        figures[name] = produce_mb_per_s(cluster.bootstrap, name, 3, args.produce_mb << 20,
                                         args.record_bytes, args.wait_timeout_s)
    return {"phase": "produce", "rf3_mb_per_s": round(figures["produce-rf3"], 1),
            "rf1_mb_per_s": round(figures["produce-rf1"], 1),
            "rf3_over_rf1": round(figures["produce-rf3"] / figures["produce-rf1"], 2)}


def latency_phase(cluster: ReplicatedCluster, args) -> dict:
    result: dict[str, object] = {"phase": "latency", "rate": args.rate}
    for name, assignment, min_isr in (("latency-rf3", [[1, 2, 3]], 2), ("latency-rf1", [[1]], 1)):
        create(cluster, name, assignment, min_isr)
        result[name[-3:]] = latency_ms(cluster.bootstrap, name, args.rate, args.latency_s,
                                       args.wait_timeout_s)
    result["p99_rf3_over_rf1"] = round(result["rf3"]["p99_ms"] / result["rf1"]["p99_ms"], 2)
    return result


def catch_up_phase(cluster: ReplicatedCluster, args) -> dict:
    topic = "catch-up"
    create(cluster, topic, [[1, 2, 3]], 2)
    follower = 3
    cluster.kill(follower)
    cluster.wait_for_isr(topic, [1, 2])
    total_bytes = args.catch_up_mb << 20
    produce_mb_per_s(cluster.bootstrap, topic, 1, total_bytes, args.record_bytes,
                     args.wait_timeout_s)
    cluster.wait_for_unregistered(follower)
    started = time.perf_counter()  # the follower fetches before it registers: time it all
    cluster.brokers[follower].start()
    cluster.wait_for_isr(topic, [1, 2, 3])
    follower_s = time.perf_counter() - started
    records = total_bytes // args.record_bytes
    consumer_mb_per_s = consume_mb_per_s(cluster.bootstrap, topic, records, args.record_bytes,
                                         args.wait_timeout_s)
    follower_mb_per_s = total_bytes / follower_s / 1e6
    return {"phase": "catch_up", "mb": args.catch_up_mb,
            "follower_mb_per_s": round(follower_mb_per_s, 1),
            "consumer_mb_per_s": round(consumer_mb_per_s, 1),
            "follower_over_consumer": round(follower_mb_per_s / consumer_mb_per_s, 2)}


class ContinuousProducer:
    """Acks=all idempotent writes at ``rate`` records/s on a thread, numbered values, each
    acknowledgement's time kept."""

    def __init__(self, bootstrap: str, topic: str, rate: int, limit_s: float) -> None:
        self.producer = producer_of(bootstrap, **{"linger.ms": 0,
                                                  "topic.metadata.refresh.interval.ms": 500})
        self.topic, self.rate, self.limit_s = topic, rate, limit_s
        self.sent_at: dict[bytes, float] = {}
        self.acked: list[tuple[float, bytes]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="continuous-producer")

    def _delivered(self, error, message) -> None:
        if error is None:
            self.acked.append((time.perf_counter(), message.value()))

    def _run(self) -> None:
        started = time.monotonic()
        index = 0
        while not self.stopping.is_set() and time.monotonic() - started < self.limit_s:
            value = b"u-%010d" % index
            self.sent_at[value] = time.perf_counter()
            self.producer.produce(self.topic, value, partition=0, on_delivery=self._delivered)
            index += 1
            self.producer.poll(1 / self.rate)
        self.producer.flush(self.limit_s)

    def first_ack_of_a_record_sent_after(self, moment: float) -> float | None:
        times = [at for at, value in list(self.acked) if self.sent_at[value] >= moment]
        return min(times) if times else None

    def longest_ack_gap_s(self, since: float) -> float:
        """The longest time without an acknowledgement from ``since`` on."""
        times = [since, *sorted(at for at, _ in list(self.acked) if at >= since)]
        return max(later - earlier for earlier, later in zip(times, times[1:], strict=False))


def outage_round(cluster: ReplicatedCluster, args, topic: str, signal_number: int) -> dict:
    create(cluster, topic, [[1, 2, 3]], 2)
    leader = cluster.state(topic).leader
    writer = ContinuousProducer(cluster.bootstrap, topic, args.outage_rate, args.wait_timeout_s)
    writer.thread.start()
    harness.wait_until(lambda: len(writer.acked) >= args.outage_rate, "a second of writes",
                       args.wait_timeout_s)
    signalled = time.perf_counter()
    if signal_number == signal.SIGKILL:
        cluster.kill(leader)
    else:
        cluster.brokers[leader].stop()
    recovered = harness.wait_until(lambda: writer.first_ack_of_a_record_sent_after(signalled),
                                   "an acknowledgement after the signal", args.wait_timeout_s)
    acked_at_recovery = len(writer.acked)
    harness.wait_until(lambda: len(writer.acked) >= acked_at_recovery + args.outage_rate,
                       "a second of writes after recovering", args.wait_timeout_s)
    writer.stopping.set()
    writer.thread.join(args.wait_timeout_s)
    acked = {value for _, value in writer.acked}
    consumed = set(harness.read_all(cluster.bootstrap_of(cluster.running()), topic, len(acked)))
    cluster.restore()
    return {"unavailable_s": round(recovered - signalled, 3),
            "longest_ack_gap_s": round(writer.longest_ack_gap_s(signalled), 3),
            "acked": len(acked), "lost": len(acked - consumed)}


def unavailability_phase(cluster: ReplicatedCluster, args) -> dict:
    return {"phase": "unavailability", "session_timeout_ms": args.session_timeout_ms,
            "leader_kill": outage_round(cluster, args, "outage-kill", signal.SIGKILL),
            "controlled_shutdown": outage_round(cluster, args, "outage-term", signal.SIGTERM)}


def run(args) -> dict:
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    with ZooKeeperEnsemble(args.scratch / "zookeeper", size=3) as zookeeper:
        cluster = ReplicatedCluster(
            args.scratch, zookeeper.connect_string + CHROOT,
            {"zookeeper.session.timeout.ms": str(args.session_timeout_ms)})
        try:
            cluster.start()
            phases = [phase(cluster, args) for phase in (
                produce_phase, latency_phase, catch_up_phase, unavailability_phase)]
        finally:
            cluster.stop()
    for phase in phases:
        if args.output == "text":
            print(json.dumps(phase), flush=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    by_name = {phase["phase"]: phase for phase in phases}
    return {
        "produce_mb": args.produce_mb, "record_bytes": args.record_bytes,
        "rf3_over_rf1_produce": by_name["produce"]["rf3_over_rf1"],
        "p99_rf3_over_rf1_latency": by_name["latency"]["p99_rf3_over_rf1"],
        "catch_up_mb": args.catch_up_mb,
        "follower_over_consumer_catch_up": by_name["catch_up"]["follower_over_consumer"],
        "leader_kill_unavailable_s": by_name["unavailability"]["leader_kill"]["unavailable_s"],
        "controlled_shutdown_unavailable_s":
            by_name["unavailability"]["controlled_shutdown"]["unavailable_s"],
        "lost": sum(by_name["unavailability"][kind]["lost"]
                    for kind in ("leader_kill", "controlled_shutdown")),
        "phases": by_name,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--produce-mb", type=int, default=256)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--latency-s", type=float, default=10.0)
    parser.add_argument("--catch-up-mb", type=int, default=1024)
    parser.add_argument("--outage-rate", type=int, default=200)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--wait-timeout-s", type=float, default=600.0)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/replication-bench"))
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args()
    summary = run(args)
    if args.output == "text":
        summary.pop("phases")  # printed one by one already
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
