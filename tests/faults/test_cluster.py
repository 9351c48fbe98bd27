"""The cluster target of the fault harness (``headrace/faults/cluster.py``): node cuts that cut
exactly the chosen node pairs, and one seeded run with every cluster nemesis overlapping.

Needs root, ``ip``, ``iptables`` (a network namespace) and ZooKeeper's jar with Java; the
cluster is three ZooKeeper JVMs and three brokers, so the module keeps to two cluster starts.
A failing run's history and node logs are kept under ``$HEADRACE_FAULTS_FAILURES`` (see
test_smoke.py) and the failure message holds the replay command.
"""

from __future__ import annotations

import json

import pytest

from headrace.cluster.zookeeper_ensemble import ZOOKEEPER_JAR
from headrace.faults.cluster import BROKER_HOSTS, ZOOKEEPER_HOSTS, FaultCluster, wait_until
from headrace.faults.namespace import Namespace, missing_tools
from headrace.faults.nemesis.cluster import CLUSTER_NEMESIS_KINDS
from headrace.faults.runner import CLIENT_HOST, RunConfig, run
from tests.faults.test_smoke import FAILURES_DIR

CLUSTER_SMOKE_DURATION_S = 30.0
CUT_BROKER = 2

pytestmark = [
    pytest.mark.required_where("netns"),
    pytest.mark.skipif(bool(missing_tools()),
                       reason=f"network namespaces need {', '.join(missing_tools())}"),
    pytest.mark.skipif(not ZOOKEEPER_JAR.exists(), reason=f"{ZOOKEEPER_JAR} not installed"),
]


def test_a_broker_cut_from_every_zookeeper_node_loses_its_registration_until_healed(tmp_path):
    """The cut is the broker's alone: its own ZooKeeper session expires (its packets leave
    from its own address), while the other brokers, and the harness's client on 127.0.0.1,
    keep theirs."""
    namespace = Namespace()
    cluster = None
    try:
        namespace.create([CLIENT_HOST, *BROKER_HOSTS.values(), *ZOOKEEPER_HOSTS.values()])
        cluster = FaultCluster(tmp_path, namespace)
        cluster.start()
        for zookeeper_host in ZOOKEEPER_HOSTS.values():
            namespace.cut_both_ways(BROKER_HOSTS[CUT_BROKER], zookeeper_host)
        wait_until(lambda: cluster.registered() == set(BROKER_HOSTS) - {CUT_BROKER},
                   f"broker {CUT_BROKER}'s registration to expire, and only its")
        namespace.heal_all()
        wait_until(lambda: cluster.registered() == set(BROKER_HOSTS),
                   f"broker {CUT_BROKER} to register again")
    finally:
        if cluster is not None:
            cluster.close()
        namespace.remove()


def test_a_seeded_cluster_run_with_every_nemesis_overlapping_finds_no_anomaly(tmp_path):
    config = RunConfig(seed=21, nemeses=CLUSTER_NEMESIS_KINDS, target="cluster",
                       duration_s=CLUSTER_SMOKE_DURATION_S)
    result = run(config, tmp_path / "run", failures_dir=FAILURES_DIR / tmp_path.name)
    summary = result.summary()
    assert result.valid, json.dumps(summary)
    assert summary["acked"] > 0, json.dumps(summary)
    assert set(summary["faults"]) == set(CLUSTER_NEMESIS_KINDS), summary
    assert summary["recovery_s"] is not None, summary
