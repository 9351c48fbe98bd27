"""The cluster layer: ZooKeeper-mode membership, the controller and its records.

Sits between coordinator and broker (it may import protocol, storage and coordinator; the broker
imports it). Metadata reaches brokers through ZooKeeper watches, never through controller RPCs.
"""
