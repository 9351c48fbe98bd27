"""The controller's automatic preferred-leader rebalance (``auto.leader.rebalance.enable``)
against a real ZooKeeper: after a preferred leader's broker returns and its leader puts it back
in the ISR, the next imbalance check elects it again when more than
``leader.imbalance.per.broker.percentage`` of its partitions are led elsewhere, and not at or
below that share. Brokers are kazoo sessions; the test writes the leaders' ISR expansion."""

from __future__ import annotations

from headrace.cluster.controller import LeaderRebalance
from tests.cluster import test_controller as harness
from tests.cluster.cluster_helpers import WAIT_TIMEOUT_S, partition_state, topic_states, wait_until
from tests.cluster.test_controller import active_seeing, write_rf2_topic
from tests.cluster.test_controller_isr_writes import write_isr_as_leader

# the controller tests' fixtures: brokers as kazoo sessions, each with its controller candidate
connect, admin, cluster = harness.connect, harness.admin, harness.cluster
CHECK_INTERVAL_S = 0.2


def fail_over_and_return(cluster, admin, topic: str, partitions: int, rebalance: LeaderRebalance):
    """Broker 1, the preferred leader of ``topic``'s partitions, dies (broker 2 takes over) and
    comes back into every ISR. The controller (broker 3's)."""
    cluster.add_broker(1, controller=False)
    cluster.add_broker(2, controller=False)
    cluster.add_broker(3, leader_rebalance=rebalance)
    controller = active_seeing(cluster)
    write_rf2_topic(admin, topic, {p: (1, 2) for p in range(partitions)})
    wait_until(lambda: topic_states(admin, topic, partitions), "the states")
    cluster.kill_broker(1)
    wait_until(lambda: all(partition_state(admin, topic, p).leader == 2 for p in range(partitions)),
               "broker 2 leads")
    cluster.add_broker(1, controller=False)
    wait_until(lambda: 1 in controller.submit(controller.live_broker_ids).result(WAIT_TIMEOUT_S),
               "broker 1 back")
    return controller


def test_the_preferred_leader_leads_again_after_it_returned(cluster, admin):
    rebalance = LeaderRebalance(enable=True, check_interval_s=CHECK_INTERVAL_S)
    fail_over_and_return(cluster, admin, "home", 2, rebalance)
    assert partition_state(admin, "home", 0).leader == 2  # not in the ISR yet: no election
    for p in (0, 1):
        write_isr_as_leader(admin, "home", p, (2, 1))
    for p in (0, 1):
        wait_until(lambda p=p: partition_state(admin, "home", p).leader == 1, "broker 1 leads again")


def test_no_rebalance_at_or_below_the_imbalance_share(cluster, admin):
    tolerant = LeaderRebalance(enable=True, check_interval_s=CHECK_INTERVAL_S,
                               imbalance_per_broker_percentage=100)
    controller = fail_over_and_return(cluster, admin, "away", 1, tolerant)
    write_isr_as_leader(admin, "away", 0, (2, 1))
    for _check in range(3):  # each submit waits behind whatever checks ran meanwhile
        controller.submit(controller._check_leader_imbalance).result(WAIT_TIMEOUT_S)
    assert partition_state(admin, "away", 0).leader == 2


def test_disabled_rebalance_leaves_leaders_where_they_are(cluster, admin):
    controller = fail_over_and_return(cluster, admin, "stay", 1, LeaderRebalance(enable=False))
    write_isr_as_leader(admin, "stay", 0, (2, 1))
    assert controller._seconds_to_rebalance_check() is None  # no check is ever due
    assert partition_state(admin, "stay", 0).leader == 2
