"""``headrace cluster info``, ``headrace cluster describe`` and ``headrace cluster up``.

``info``: cluster id, controller, brokers and topic count, by DescribeCluster through
confluent-kafka's AdminClient plus one Metadata request for the topic count.

``describe``: the brokers, the controller, and per broker how many partitions it holds
(replicas) and leads, from DescribeCluster and Metadata; and the partition health counts
Kafka's brokers report as metrics: under-replicated (ISR smaller than the replicas), offline
(no leader) and under-min-ISR (ISR smaller than the topic's ``min.insync.replicas``, read with
DescribeConfigs) partitions.

``elect-leaders (--topic T [--partition P] | --all-topic-partitions) [--election-type
preferred|unclean]``: ElectLeaders through the controller (confluent-kafka's AdminClient), one
row per partition: ``elected`` or Kafka's error name (ELECTION_NOT_NEEDED, ...).

``reassign (--execute|--cancel|--verify) (--reassignment-json-file F | --topic T --partition P
--replicas 3,1)`` and ``reassign --list [--topic T]``: kafka-reassign-partitions' modes through
AlterPartitionReassignments / ListPartitionReassignments on the controller (``reassignments``):
execute starts (or replaces) the reassignments (``--throttle B``: Kafka's replication throttles,
``leader/follower.replication.throttled.rate`` B bytes/s on the brokers involved and the
moving partitions' replicas in the topics' ``*.replication.throttled.replicas``), cancel reverts
them to their original replicas, verify reports each one completed, in progress, or neither
(and removes the throttles once none is in progress); one row per partition.

``reassign --generate --topics-to-move-json-file F --broker-list 1,2``: Kafka's proposal of the
topics' partitions placed again over the listed brokers (current and proposed reassignment
JSON with ``--output json``; the proposed one is a valid ``--reassignment-json-file``).

``decommission --broker-id B [--dry-run]``: every replica on broker B reassigned to the other
brokers (``reassignments.plan_decommission``); the plan is printed (as Kafka's reassignment JSON
with ``--output json``) and executed unless ``--dry-run``; the broker may be stopped once
``reassign --list`` no longer shows its partitions.

``up --brokers N [--base-dir D] [--zookeeper-nodes 3] [--first-port 9092] [--output json]``:
a local ZooKeeper ensemble and N brokers on 127.0.0.1 (``local_cluster.LocalCluster``); prints
the bootstrap list once every broker is registered, runs until SIGINT (Ctrl-C) or SIGTERM, then
stops the brokers and the ensemble. A cluster that does not come up is one line on stderr and
exit status 1.

Stateless; runs on the main thread (``up``'s signal handlers only set an event).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    emit,
    fail,
    make_table,
    report,
    user_errors,
)

app = typer.Typer(no_args_is_help=True, help="Inspect the cluster.")


def describe_cluster(connection: Connection, admin=None, metadata=None):
    """(DescribeCluster's answer, the Metadata of every topic) through one AdminClient."""
    if admin is None:
        admin, metadata = connection.admin()
    description = admin.describe_cluster(
        request_timeout=connection.request_timeout_s
    ).result(timeout=connection.request_timeout_s)
    return description, metadata


@app.command()
@connection_options
def info(
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Cluster id, controller, brokers and how many topics there are."""
    with user_errors():
        description, metadata = describe_cluster(connection)
        brokers = [
            {"id": node.id, "host": node.host, "port": node.port, "rack": node.rack}
            for node in sorted(description.nodes, key=lambda node: node.id)
        ]
        controller = description.controller.id if description.controller else None
        topics_count = sum(1 for name in metadata.topics if not name.startswith("__"))
        data = {
            "cluster_id": description.cluster_id, "controller_id": controller,
            "brokers": brokers, "topics_count": topics_count,
        }
        summary = make_table(None, ["cluster id", "controller", "brokers", "topics"], [
            (description.cluster_id, controller, len(brokers), topics_count)
        ])
        broker_table = make_table("brokers", ["id", "host", "port", "rack"], [
            (broker["id"], broker["host"], broker["port"], broker["rack"]) for broker in brokers
        ])
        emit(output, data, summary, broker_table)


@app.command()
@connection_options
def describe(
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Brokers, the controller, per broker how many partitions it holds and leads, and how many
    partitions are offline, under-replicated and under their min.insync.replicas."""
    with user_errors():
        admin, metadata = connection.admin()
        description, metadata = describe_cluster(connection, admin, metadata)
        controller = description.controller.id if description.controller else None
        replicas, leaders = partition_counts_by_broker(metadata)
        brokers = [
            {"id": node.id, "host": node.host, "port": node.port, "rack": node.rack,
             "controller": node.id == controller, "partitions": replicas.get(node.id, 0),
             "leaders": leaders.get(node.id, 0)}
            for node in sorted(description.nodes, key=lambda node: node.id)
        ]
        health = partition_health_counts(
            metadata, topic_min_insync_replicas(connection, admin, metadata))
        data = {"cluster_id": description.cluster_id, "controller_id": controller,
                "brokers": brokers, **health}
        summary = make_table(None, ["cluster id", "controller", "brokers", "offline partitions",
                                    "under-replicated", "under min ISR"],
                             [(description.cluster_id, controller, len(brokers),
                               health["offline_partitions"], health["under_replicated_partitions"],
                               health["under_min_isr_partitions"])])
        columns = ["id", "host", "port", "rack", "controller", "partitions", "leaders"]
        broker_table = make_table("brokers", columns, [
            tuple("*" if column == "controller" and broker[column] else
                  "" if column == "controller" else broker[column] for column in columns)
            for broker in brokers])
        emit(output, data, summary, broker_table)


def topic_min_insync_replicas(connection: Connection, admin, metadata) -> dict[str, int]:
    """topic -> its effective ``min.insync.replicas`` (one DescribeConfigs for every topic)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    from headrace.cli.common import wait_all

    names = sorted(metadata.topics)
    if not names:
        return {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name) for name in names],
                                     request_timeout=connection.request_timeout_s)
    described = wait_all(futures, connection.request_timeout_ms)
    return {resource.name: int(entries["min.insync.replicas"].value)
            for resource, entries in described.items() if "min.insync.replicas" in entries}


def partition_health_counts(metadata, min_insync_replicas: dict[str, int]) -> dict[str, int]:
    """Kafka's UnderReplicatedPartitions, OfflinePartitionsCount and UnderMinIsrPartitionCount
    over every partition of confluent-kafka's ClusterMetadata."""
    counts = {"offline_partitions": 0, "under_replicated_partitions": 0, "under_min_isr_partitions": 0}
    for name, topic in metadata.topics.items():
        for partition in topic.partitions.values():
            counts["offline_partitions"] += partition.leader < 0
            counts["under_replicated_partitions"] += len(partition.isrs) < len(partition.replicas)
            counts["under_min_isr_partitions"] += len(partition.isrs) < min_insync_replicas.get(name, 1)
    return counts


def partition_counts_by_broker(metadata) -> tuple[dict[int, int], dict[int, int]]:
    """(broker id -> replicas it holds, broker id -> partitions it leads; -1 counts the
    partitions without a leader) over every topic of confluent-kafka's ClusterMetadata."""
    replicas: dict[int, int] = {}
    leaders: dict[int, int] = {}
    for topic in metadata.topics.values():
        for partition in topic.partitions.values():
            for replica in partition.replicas:
                replicas[replica] = replicas.get(replica, 0) + 1
            leaders[partition.leader] = leaders.get(partition.leader, 0) + 1
    return replicas, leaders


@app.command()
def up(
    brokers: Annotated[int, typer.Option("--brokers", min=1, help="how many brokers")] = 3,
    base_dir: Annotated[Path, typer.Option(
        "--base-dir", help="ZooKeeper's and the brokers' data and logs")] = Path("./cluster"),
    zookeeper_nodes: Annotated[int, typer.Option(
        "--zookeeper-nodes", min=1, help="ZooKeeper ensemble size")] = 3,
    first_port: Annotated[int, typer.Option(
        "--first-port", min=0, max=65535,
        help="broker I listens on first-port + I - 1 (0: free ports)")] = 9092,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Start a ZooKeeper ensemble and N brokers on 127.0.0.1; Ctrl-C stops them all."""
    from headrace.cli.local_cluster import LocalCluster, LocalClusterError
    from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsembleError

    stop_requested = threading.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, lambda _signal, _frame: stop_requested.set())
    cluster = LocalCluster(base_dir, brokers, zookeeper_nodes, first_port)
    try:
        cluster.start()
    except (LocalClusterError, ZooKeeperEnsembleError, OSError) as error:
        raise fail(str(error)) from None
    try:
        report(output, f"zookeeper.connect: {cluster.zookeeper_connect}\n"
                       f"bootstrap servers: {cluster.bootstrap_servers}",
               {"zookeeper_connect": cluster.zookeeper_connect,
                "bootstrap_servers": cluster.bootstrap_servers})
        sys.stdout.flush()  # a pipe reads the addresses now, not at exit
        typer.echo("Ctrl-C stops the cluster", err=True)
        reported: set[int] = set()
        while not stop_requested.wait(1.0):
            for broker_id, status in cluster.exited_brokers().items():
                if broker_id not in reported:
                    reported.add(broker_id)
                    typer.echo(f"broker {broker_id} exited with status {status}; see "
                               f"{cluster.broker_log(broker_id)}", err=True)
    finally:
        typer.echo("stopping the cluster", err=True)
        cluster.stop()


ELECTION_TYPES = ("preferred", "unclean")


@app.command("elect-leaders")
@connection_options
def elect_leaders(
    topic: Annotated[str | None, typer.Option("--topic", help="the topic's partitions")] = None,
    partition: Annotated[int | None, typer.Option(
        "--partition", min=0, help="only this partition of --topic")] = None,
    all_topic_partitions: Annotated[bool, typer.Option(
        "--all-topic-partitions", help="every partition of every topic")] = False,
    election_type: Annotated[str, typer.Option(
        "--election-type", help="preferred (the first replica leads again) or unclean "
        "(a live replica outside the ISR may lead an offline partition)")] = "preferred",
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Leader election through the controller (ElectLeaders), as kafka-leader-election."""
    from confluent_kafka import ElectionType, TopicPartition

    with user_errors():
        if election_type not in ELECTION_TYPES:
            raise UserError(f"--election-type must be one of {', '.join(ELECTION_TYPES)}")
        if all_topic_partitions == (topic is not None) or (partition is not None and topic is None):
            raise UserError("give either --topic (and optionally --partition) or "
                            "--all-topic-partitions")
        admin, metadata = connection.admin()
        partitions = None
        if topic is not None:
            if topic not in metadata.topics:
                raise UserError(f"topic {topic!r} does not exist")
            indexes = [partition] if partition is not None else sorted(metadata.topics[topic].partitions)
            partitions = [TopicPartition(topic, index) for index in indexes]
        kind = ElectionType.PREFERRED if election_type == "preferred" else ElectionType.UNCLEAN
        # confluent-kafka 2.16's elect_leaders fails on any keyword option (a SystemError in
        # its argument parsing): the client's default request timeout applies
        results = admin.elect_leaders(kind, partitions).result(
            timeout=connection.request_timeout_s)
        rows = sorted(((tp.topic, tp.partition, "elected" if error is None else error.name())
                       for tp, error in results.items()))
        data = [{"topic": t, "partition": p, "result": r} for t, p, r in rows]
        emit(output, data, make_table(None, ["topic", "partition", "result"], rows))


@app.command()
@connection_options
def reassign(
    execute: Annotated[bool, typer.Option("--execute", help="start the reassignments")] = False,
    cancel: Annotated[bool, typer.Option("--cancel", help="revert them to the original replicas")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="report whether they completed")] = False,
    list_: Annotated[bool, typer.Option("--list", help="the ongoing reassignments")] = False,
    generate: Annotated[bool, typer.Option(
        "--generate", help="propose a plan moving --topics-to-move-json-file's topics onto "
        "--broker-list (nothing is executed)")] = False,
    topics_to_move_json_file: Annotated[Path | None, typer.Option("--topics-to-move-json-file")] = None,
    broker_list: Annotated[str | None, typer.Option("--broker-list", help="e.g. 1,2,3")] = None,
    reassignment_json_file: Annotated[Path | None, typer.Option(
        "--reassignment-json-file", help="Kafka's reassignment JSON")] = None,
    topic: Annotated[str | None, typer.Option("--topic", help="one partition's topic (or --list's)")] = None,
    partition: Annotated[int | None, typer.Option("--partition", min=0)] = None,
    replicas: Annotated[str | None, typer.Option("--replicas", help="target broker ids, e.g. 3,1")] = None,
    throttle: Annotated[int | None, typer.Option(
        "--throttle", min=1, help="with --execute: replication bytes/s for the moving replicas "
        "(removed by --verify once every listed reassignment completed)")] = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Reassign partitions to other brokers, as kafka-reassign-partitions."""
    from headrace.cli import reassignments

    with user_errors():
        if sum((execute, cancel, verify, list_, generate)) != 1:
            raise UserError("give exactly one of --execute, --cancel, --verify, --list, --generate")
        admin, metadata = connection.admin()
        if generate:
            _emit_generated(output, metadata, topics_to_move_json_file, broker_list)
            return
        if list_:
            ongoing = reassignments.list_ongoing(metadata, connection.request_timeout_ms,
                                                 None if topic is None else [topic])
            _emit_ongoing(output, ongoing)
            return
        targets = _requested_reassignments(reassignment_json_file, topic, partition, replicas)
        current = reassignments.current_replicas(metadata)
        if verify:
            ongoing = reassignments.list_ongoing(metadata, connection.request_timeout_ms)
            _emit_verification(output, targets, current, ongoing)
            if not any(key in ongoing for key in targets):  # as Kafka's --verify: throttles off
                reassignments.clear_throttles(
                    admin, {t for t, _ in targets},
                    {b for key, r in targets.items() for b in (*r, *current.get(key, ()))
                     if b in metadata.brokers},
                    connection.request_timeout_ms)
            return
        if throttle is not None and execute:
            topic_configs, brokers = reassignments.throttle_plan(current, targets)
            reassignments.set_throttles(admin, topic_configs, brokers, throttle,
                                        connection.request_timeout_ms)
        results = reassignments.alter(
            metadata, dict.fromkeys(targets) if cancel else targets, connection.request_timeout_ms)
        rows = sorted((t, p, result) for (t, p), result in results.items())
        emit(output, [{"topic": t, "partition": p, "result": r} for t, p, r in rows],
             make_table(None, ["topic", "partition", "result"], rows))


def _emit_generated(output: OutputFormat, metadata, topics_file: Path | None,
                    broker_list: str | None) -> None:
    """kafka-reassign-partitions --generate: the current assignment and a proposed one."""
    from headrace.cli import reassignments

    if topics_file is None or not broker_list:
        raise UserError("--generate needs --topics-to-move-json-file and --broker-list")
    try:
        brokers = [int(b) for b in broker_list.split(",")]
    except ValueError:
        raise UserError(f"--broker-list {broker_list!r} is not a comma-separated list of broker ids") from None
    current, proposed = reassignments.plan_generate(
        metadata, reassignments.read_topics_to_move_file(topics_file), brokers)
    rows = [(t, p, list(current[(t, p)]), list(r)) for (t, p), r in sorted(proposed.items())]
    emit(output, {"current": reassignments.reassignment_document(current),
                  "proposed": reassignments.reassignment_document(proposed)},
         make_table(None, ["topic", "partition", "current replicas", "proposed replicas"], rows))


def _requested_reassignments(path: Path | None, topic: str | None, partition: int | None,
                             replicas: str | None) -> dict[tuple[str, int], tuple[int, ...]]:
    from headrace.cli import reassignments

    if (path is None) == (topic is None):
        raise UserError("give either --reassignment-json-file or --topic, --partition and --replicas")
    if path is not None:
        return reassignments.read_reassignment_file(path)
    if partition is None or not replicas:
        raise UserError("--topic needs --partition and --replicas")
    try:
        return {(topic, partition): tuple(int(r) for r in replicas.split(","))}
    except ValueError:
        raise UserError(f"--replicas {replicas!r} is not a comma-separated list of broker ids") from None


def _emit_ongoing(output: OutputFormat, ongoing: dict) -> None:
    rows = sorted((t, p, a["replicas"], a["adding_replicas"], a["removing_replicas"])
                  for (t, p), a in ongoing.items())
    emit(output, [{"topic": t, "partition": p, "replicas": r, "adding_replicas": a,
                   "removing_replicas": d} for t, p, r, a, d in rows],
         make_table(None, ["topic", "partition", "replicas", "adding", "removing"], rows))


def _emit_verification(output: OutputFormat, targets: dict, current: dict, ongoing: dict) -> None:
    """Kafka's --verify: completed (the replicas are the target), in progress, or neither."""
    rows = []
    for (t, p), target in sorted(targets.items()):
        if (t, p) in ongoing:
            status = "in progress"
        elif current.get((t, p)) == tuple(target):
            status = "completed"
        else:
            status = f"not reassigning; replicas are {list(current.get((t, p), ()))}"
        rows.append((t, p, list(target), status))
    emit(output, [{"topic": t, "partition": p, "target": r, "status": s} for t, p, r, s in rows],
         make_table(None, ["topic", "partition", "target", "status"], rows))


@app.command()
@connection_options
def decommission(
    broker_id: Annotated[int, typer.Option("--broker-id", help="the broker to empty")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan only")] = False,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Reassign every replica off a broker (before stopping it for good)."""
    from headrace.cli import reassignments

    with user_errors():
        _admin, metadata = connection.admin()
        if broker_id not in metadata.brokers and not any(
                broker_id in r for r in reassignments.current_replicas(metadata).values()):
            raise UserError(f"broker {broker_id} holds no replica and is not in the cluster")
        plan = reassignments.plan_decommission(metadata, broker_id)
        results = {} if dry_run or not plan else reassignments.alter(
            metadata, plan, connection.request_timeout_ms)
        rows = [(t, p, list(r), results.get((t, p), "planned"))
                for (t, p), r in sorted(plan.items())]
        data = {**reassignments.reassignment_document(plan),
                "results": [{"topic": t, "partition": p, "result": res} for t, p, _r, res in rows]}
        emit(output, data, make_table(None, ["topic", "partition", "replicas", "result"], rows))
