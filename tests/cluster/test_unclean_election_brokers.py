"""Unclean leader election on broker processes and a real ZooKeeper, turned on dynamically: a
partition whose only in-sync replica died while its other replica was out of the ISR stays
offline (``unclean.leader.election.enable`` false by default) until the controller's broker is
given ``unclean.leader.election.enable=true`` through IncrementalAlterConfigs; then the live
replica outside the ISR is elected, alone in the ISR, as Kafka's controller does."""

from __future__ import annotations

import os
import signal

from headrace.cluster import zookeeper_paths as paths
from tests.cli.cli_runner import run_ok
from tests.cluster.cluster_helpers import (
    close,
    controller_id,
    partition_state,
    wait_until,
    zookeeper_client,
)
from tests.cluster.test_reassignment_brokers import create_assigned_topic, metadata_brokers


def test_turning_unclean_election_on_elects_the_out_of_sync_replica(cluster_brokers):
    zk = zookeeper_client(cluster_brokers.zookeeper_connect)
    try:
        controller = cluster_brokers.start(3)
        wait_until(lambda: controller_id(zk) == 3, "broker 3 is the controller")
        brokers = {1: cluster_brokers.start(1), 2: cluster_brokers.start(2), 3: controller}
        wait_until(lambda: metadata_brokers(controller) == {1, 2, 3}, "the three brokers")
        assert create_assigned_topic(controller, "lossy", {0: [1, 2]}) == 0
        wait_until(lambda: partition_state(zk, "lossy", 0), "the state")

        os.kill(brokers[2].pid, signal.SIGSTOP)  # its session expires: it leaves the ISR
        try:
            wait_until(lambda: partition_state(zk, "lossy", 0).isr == (1,), "broker 2 out of the ISR")
            brokers[1].kill()
            wait_until(lambda: partition_state(zk, "lossy", 0).leader == -1, "offline")
        finally:
            os.kill(brokers[2].pid, signal.SIGCONT)
        wait_until(lambda: zk.exists(paths.broker_id_path(2)), "broker 2 registered again")
        wait_until(lambda: metadata_brokers(controller) == {2, 3}, "the controller sees broker 2")
        state = partition_state(zk, "lossy", 0)
        assert (state.leader, state.isr) == (-1, (1,))  # clean election only: no candidate

        run_ok("configs", "alter", "broker", "3", "--set", "unclean.leader.election.enable=true",
               "--bootstrap-server", controller.bootstrap)
        elected = wait_until(lambda: (s := partition_state(zk, "lossy", 0)).leader == 2 and s,
                             "the unclean election")
        assert elected.isr == (2,)
    finally:
        close(zk)
