"""The cluster layer: ZooKeeper-mode membership, the controller and its records (issue #18).

Sits between coordinator and broker (it may import protocol, storage and coordinator; the broker
imports it). Metadata reaches brokers through ZooKeeper watches, never through controller RPCs.
Modules: the local ensemble (``zookeeper_ensemble``), Kafka's znode paths (``zookeeper_paths``),
the records' JSON codecs (``zookeeper_records``), ``zookeeper.connect`` parsing
(``zookeeper_connect``), the broker's one ZooKeeper session and its registration
(``zookeeper_session``). The broker composes them in ``headrace.broker.cluster_membership``.
No state at package level.
"""
