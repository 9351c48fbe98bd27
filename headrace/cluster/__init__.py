"""Cluster mode: brokers coordinated through ZooKeeper (issue #18).

A layer between coordinator and broker: it may import protocol, storage and coordinator; the
broker (the composition root) imports it. Owns the local ZooKeeper ensemble
(``zookeeper_ensemble``), Kafka's znode paths (``zookeeper_paths``) and the broker's one
ZooKeeper session with its registration (``zookeeper_session``). No state at package level.
"""
