"""Cluster failover times: a new controller after SIGKILL of the controller, and how long a
leader's partitions stay unavailable after SIGTERM (controlled shutdown) and SIGKILL.

A three-node ZooKeeper ensemble and three brokers (``zookeeper.session.timeout.ms`` =
``--session-timeout-ms``) under /tmp/cluster-failover-bench (or ``--scratch``), all on
127.0.0.1. ``--rounds`` rounds of:

1. ``controller``: SIGKILL the controller; time until ``/controller`` names another broker
   (read every 20 ms), then restart the killed broker and wait until it is
   registered again.
2. ``sigterm`` and ``sigkill``: a topic of ``--partitions`` partitions (RF 1, the limit of this
   release) is spread over the brokers; one broker that leads some of them (not the
   controller) is stopped by the signal. Measured: until the controller marks its partitions
   offline (leader -1 in ZooKeeper), and until a produce to one of them succeeds again after
   the broker is restarted at once (the partition is unavailable for that whole time with one
   replica: its data lives on that broker only).

Prints each round and the medians. Every wait is bounded (``--wait-timeout-s``).

    .venv/bin/python bench/cluster_failover.py --rounds 5 --session-timeout-ms 6000

Timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402
from kazoo.exceptions import NoNodeError  # noqa: E402

from headrace.cluster import zookeeper_paths as paths  # noqa: E402
from headrace.cluster import zookeeper_records as records  # noqa: E402
from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble  # noqa: E402
from tests.broker.raw_client import RawClient  # noqa: E402
from tests.cluster.cluster_helpers import wait_until  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402

BROKER_IDS = (1, 2, 3)
TOPIC = "failover"
CHROOT = "/failover-bench"


class Cluster:
    def __init__(self, scratch: Path, session_timeout_ms: int, wait_timeout_s: float) -> None:
        self.ensemble = ZooKeeperEnsemble(scratch / "zookeeper", size=3).start()
        connect = self.ensemble.connect_string + CHROOT
        self.wait_timeout_s = wait_timeout_s
        self.brokers = {}
        for broker_id in BROKER_IDS:
            data_dir = scratch / f"broker-{broker_id}"
            data_dir.mkdir(parents=True)
            self.brokers[broker_id] = BrokerProcess(data_dir, {
                "broker.id": str(broker_id), "zookeeper.connect": connect,
                "zookeeper.session.timeout.ms": str(session_timeout_ms)})
            self.brokers[broker_id].start()
        self.zk = KazooClient(hosts=connect)
        self.zk.start(timeout=wait_timeout_s)
        self.wait(lambda: len(self.zk.get_children(paths.BROKER_IDS)) == 3, "three brokers")

    def wait(self, observe, what: str):
        """``observe()`` until truthy, read every 20 ms (the figures' resolution); bounded."""
        return wait_until(observe, what, self.wait_timeout_s)

    def controller(self) -> int | None:
        try:
            data, _ = self.zk.get(paths.CONTROLLER)
        except NoNodeError:
            return None
        return records.decode_controller_registration(data).broker_id

    def leader(self, partition: int) -> int:
        path = paths.partition_state_path(TOPIC, partition)
        data, _ = self.zk.get(path)
        return records.decode_partition_state(data).leader

    def registered(self, broker_id: int) -> bool:
        return self.zk.exists(paths.broker_id_path(broker_id)) is not None

    def restart(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        if broker.process.poll() is None:
            broker.stop()
        broker.start()
        self.wait(lambda: self.registered(broker_id), f"broker {broker_id} registered")

    def close(self) -> None:
        for broker in self.brokers.values():
            broker.stop()
        self.zk.stop()
        self.zk.close()
        self.ensemble.stop()


def controller_failover_s(cluster: Cluster) -> float:
    old = cluster.wait(cluster.controller, "a controller")
    started = time.monotonic()
    cluster.brokers[old].kill()
    cluster.wait(lambda: cluster.controller() not in (None, old), "a new controller")
    elapsed = time.monotonic() - started
    cluster.restart(old)
    return elapsed


def create_topic(cluster: Cluster, partitions: int) -> None:
    controller = cluster.brokers[cluster.wait(cluster.controller, "a controller")]
    with RawClient(controller.bootstrap) as client:
        result = client.request(19, 7, {"validate_only": False, "topics": [
            {"name": TOPIC, "num_partitions": partitions, "replication_factor": 1,
             "assignments": [], "configs": []}]}).topics[0]
    if result.error_code not in (0, 36):
        raise SystemExit(f"CreateTopics failed: {result}")


def produce_once(bootstrap: str, partition: int, timeout_s: float) -> bool:
    delivered = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": int(timeout_s * 1000)})
    producer.produce(TOPIC, b"x", partition=partition,
                     on_delivery=lambda error, _message: delivered.append(error is None))
    producer.flush(timeout_s)
    return bool(delivered and delivered[0])


def leader_outage(cluster: Cluster, partitions: int, signal_number: int) -> tuple[float, float]:
    """(s until the controller marks the victim's partitions offline, s until a produce to one
    of them succeeds again with the victim restarted at once)."""
    controller = cluster.wait(cluster.controller, "a controller")
    victim = next(b for b in BROKER_IDS if b != controller)
    [partition] = cluster.wait(
        lambda: [p for p in range(partitions) if cluster.leader(p) == victim][:1],
        "a partition led by the victim")
    started = time.monotonic()
    os.kill(cluster.brokers[victim].pid, signal_number)
    cluster.wait(lambda: cluster.leader(partition) == -1, "leader -1")
    offline_s = time.monotonic() - started
    cluster.brokers[victim].process.wait(cluster.wait_timeout_s)
    cluster.restart(victim)
    others = ",".join(cluster.brokers[b].bootstrap for b in BROKER_IDS)
    cluster.wait(lambda: produce_once(others, partition, 5.0), "a produce to the partition")
    return offline_s, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--wait-timeout-s", type=float, default=120.0)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/cluster-failover-bench"))
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    cluster = Cluster(args.scratch, args.session_timeout_ms, args.wait_timeout_s)
    figures: dict[str, list[float]] = {"controller": [], "sigterm offline": [], "sigterm produce": [],
                                       "sigkill offline": [], "sigkill produce": []}
    try:
        create_topic(cluster, args.partitions)
        for round_number in range(1, args.rounds + 1):
            figures["controller"].append(controller_failover_s(cluster))
            for name, signal_number in (("sigterm", signal.SIGTERM), ("sigkill", signal.SIGKILL)):
                offline_s, produce_s = leader_outage(cluster, args.partitions, signal_number)
                figures[f"{name} offline"].append(offline_s)
                figures[f"{name} produce"].append(produce_s)
            print(f"round {round_number}: " + ", ".join(
                f"{name} {values[-1]:.2f} s" for name, values in figures.items()), flush=True)
    finally:
        cluster.close()
    print(f"session timeout {args.session_timeout_ms} ms, {args.rounds} rounds, medians:")
    for name, values in figures.items():
        print(f"  {name:16s} {statistics.median(values):.2f} s  (min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
