"""Kafka 3.9's dynamically updatable broker configs that are not topic-config defaults.

Owns the data of Kafka's ``DynamicBrokerConfig.AllDynamicConfigs`` beyond the ``log.*``
topic defaults and the cleaner settings (``headrace.broker.config`` defines those): each
config's name, ConfigDef type, default as text, inclusive range, and scope. A per-broker config
(Kafka's ``PerBrokerConfigs``: the SSL and SASL listener configs) may only be set with a broker
id as resource name; the others also as the cluster-wide default (empty resource name).
``THREAD_POOL_CONFIGS`` are Kafka's ``DynamicThreadPool.ReconfigurableConfigs``, whose changes
are bounded to half and double the current value.

headrace stores and describes these (persisted like every dynamic broker config) but has no
machinery they would drive: one event loop serves the network, there is no SSL, SASL, metrics
reporter, replication, tiered storage or connection limit. Left out: the SSL keystore and
truststore configs (Kafka takes them only with a ``listener.name.`` prefix), password configs,
and ``listeners``/``advertised.listeners``/``listener.security.protocol.map``, which headrace
cannot change without a restart and so keeps read-only. Pure data; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class DynamicConfigData:
    name: str
    type: str  # Kafka's ConfigDef type, lower case
    default: str | None
    min_value: float | None = None
    max_value: float | None = None
    per_broker: bool = False
    allowed: tuple[str, ...] = ()


def _cluster(name: str, type_: str, default: str | None, lo=None, hi=None) -> DynamicConfigData:
    return DynamicConfigData(name, type_, default, lo, hi)


def _per_broker(name: str, type_: str, default: str | None,
                allowed: tuple[str, ...] = ()) -> DynamicConfigData:
    return DynamicConfigData(name, type_, default, per_broker=True, allowed=allowed)


THREAD_POOL_CONFIGS = ("num.io.threads", "num.replica.fetchers",
                       "num.recovery.threads.per.data.dir", "background.threads")

DYNAMIC_BROKER_CONFIGS = (
    # DynamicThreadPool
    _cluster("num.io.threads", "int", "8", 1),
    _cluster("num.replica.fetchers", "int", "1"),
    _cluster("num.recovery.threads.per.data.dir", "int", "1", 1),
    _cluster("background.threads", "int", "10", 1),
    # SocketServer and the cluster-level listener configs
    _cluster("num.network.threads", "int", "3", 1),
    _cluster("max.connections", "int", str(INT_MAX), 0),
    _cluster("max.connections.per.ip", "int", str(INT_MAX), 0),
    _cluster("max.connections.per.ip.overrides", "string", ""),
    _cluster("max.connection.creation.rate", "int", str(INT_MAX), 0),
    # metrics, producer state, remote log manager
    _cluster("metric.reporters", "list", ""),
    _cluster("producer.id.expiration.ms", "int", "86400000", 1),
    _cluster("transaction.partition.verification.enable", "boolean", "true"),
    _cluster("remote.log.index.file.cache.total.size.bytes", "long", "1073741824", 1),
    _cluster("remote.fetch.max.wait.ms", "int", "500", 1),
    _cluster("remote.log.manager.copy.max.bytes.per.second", "long", str(LONG_MAX), 1),
    _cluster("remote.log.manager.fetch.max.bytes.per.second", "long", str(LONG_MAX), 1),
    # broker quota configs (DynamicConfig.Broker)
    _cluster("leader.replication.throttled.rate", "long", str(LONG_MAX), 0),
    _cluster("follower.replication.throttled.rate", "long", str(LONG_MAX), 0),
    _cluster("replica.alter.log.dirs.io.max.bytes.per.second", "long", str(LONG_MAX), 0),
    # DynamicListenerConfig: per broker
    _per_broker("principal.builder.class", "class", None),
    _per_broker("ssl.protocol", "string", "TLSv1.3"),
    _per_broker("ssl.provider", "string", None),
    _per_broker("ssl.cipher.suites", "list", ""),
    _per_broker("ssl.enabled.protocols", "list", "TLSv1.2,TLSv1.3"),
    _per_broker("ssl.keymanager.algorithm", "string", "SunX509"),
    _per_broker("ssl.trustmanager.algorithm", "string", "PKIX"),
    _per_broker("ssl.endpoint.identification.algorithm", "string", "https"),
    _per_broker("ssl.secure.random.implementation", "string", None),
    _per_broker("ssl.client.auth", "string", "none", ("required", "requested", "none")),
    _per_broker("ssl.engine.factory.class", "class", None),
    _per_broker("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI"),
    _per_broker("sasl.enabled.mechanisms", "list", "GSSAPI"),
    _per_broker("sasl.kerberos.service.name", "string", None),
    _per_broker("sasl.kerberos.kinit.cmd", "string", "/usr/bin/kinit"),
    _per_broker("sasl.kerberos.ticket.renew.window.factor", "double", "0.8"),
    _per_broker("sasl.kerberos.ticket.renew.jitter", "double", "0.05"),
    _per_broker("sasl.kerberos.min.time.before.relogin", "long", "60000"),
    _per_broker("sasl.kerberos.principal.to.local.rules", "list", "DEFAULT"),
    _per_broker("sasl.login.refresh.window.factor", "double", "0.8"),
    _per_broker("sasl.login.refresh.window.jitter", "double", "0.05"),
    _per_broker("sasl.login.refresh.min.period.seconds", "short", "60"),
    _per_broker("sasl.login.refresh.buffer.seconds", "short", "300"),
)
