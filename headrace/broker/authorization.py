"""Authorized operations: the bit set of ACL operations a caller may perform on a resource.

Owns Kafka's ``AclOperation`` codes, the operations each resource type supports (Kafka's
``AclEntry.supportedOperations``) and ``authorized_operations``, the one place that answers
the ``*_authorized_operations`` fields of Metadata (v8+), DescribeCluster and DescribeGroups
(v3+). The bit set is Kafka's ``Utils.to32BitField``: bit ``code`` is set for each allowed
operation. headrace has no authorizer, and Kafka without one allows every supported
operation, so that is the answer; an ACL authorizer would filter the supported operations
here, per principal. Pure data; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from types import MappingProxyType

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)  # the schemas' default: not requested
CLUSTER_NAME = "kafka-cluster"  # the name of the one CLUSTER resource, as Kafka's


class AclOperation(IntEnum):
    """Kafka's ``org.apache.kafka.common.acl.AclOperation`` codes."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class ResourceType(IntEnum):
    """Kafka's ``org.apache.kafka.common.resource.ResourceType`` codes."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


_OP = AclOperation
SUPPORTED_OPERATIONS = MappingProxyType({
    ResourceType.TOPIC: frozenset({_OP.READ, _OP.WRITE, _OP.CREATE, _OP.DESCRIBE, _OP.DELETE,
                                   _OP.ALTER, _OP.DESCRIBE_CONFIGS, _OP.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_OP.READ, _OP.DESCRIBE, _OP.DELETE}),
    ResourceType.CLUSTER: frozenset({_OP.CREATE, _OP.CLUSTER_ACTION, _OP.DESCRIBE_CONFIGS,
                                     _OP.ALTER_CONFIGS, _OP.IDEMPOTENT_WRITE, _OP.ALTER,
                                     _OP.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_OP.DESCRIBE, _OP.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_OP.DESCRIBE}),
    ResourceType.USER: frozenset({_OP.CREATE_TOKENS, _OP.DESCRIBE_TOKENS}),
})


def operations_bit_set(operations: Iterable[AclOperation]) -> int:
    """Kafka's ``Utils.to32BitField``: bit ``code`` set for each operation."""
    bits = 0
    for operation in operations:
        bits |= 1 << operation
    return bits


def authorized_operations(resource_type: ResourceType, resource_name: str) -> int:
    """The operations the caller may perform on the named resource, as a bit set. Without an
    authorizer that is every operation the resource type supports, whatever the name."""
    del resource_name  # an authorizer would match it against ACL patterns
    return operations_bit_set(SUPPORTED_OPERATIONS[resource_type])
