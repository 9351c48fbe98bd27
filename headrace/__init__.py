"""headrace: a Kafka-compatible streaming log.

Layers, lowest first (a layer never imports one above it):
``errors`` (shared error codes) -> ``protocol`` (sans-I/O wire codec and record batches)
-> ``storage`` (the partition log) -> ``coordinator`` (group state machines)
-> ``broker`` (the asyncio server) -> ``client``, ``spark``, ``cli``.
"""

__version__ = "0.1.0"
