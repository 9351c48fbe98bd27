"""The consumer protocol's byte formats the group coordinator reads.

Owns:

* ``FieldReader`` / ``FieldWriter``: the primitives of Kafka's non-flexible (classic) schemas,
  big-endian: int16/int32/int64, STRING (int16 length), NULLABLE_STRING (length -1 = null),
  BYTES / NULLABLE_BYTES (int32 length), ARRAY (int32 count). The coordinator's
  ``__consumer_offsets`` record codecs use them too.
* ConsumerProtocolSubscription v0-v3, each prefixed by an int16 version::

      v0: topics [STRING], user_data NULLABLE_BYTES
      v1: + owned_partitions [topic STRING, partitions [INT32]]
      v2: + generation_id INT32 (default -1)
      v3: + rack_id NULLABLE_STRING

  As Kafka does, a newer version than we know is read with the newest layout we know and
  trailing bytes are ignored (``decode_subscription``).

The other half of the consumer protocol -- encoding subscriptions, computing and encoding
assignments (Kafka's range and roundrobin assignors) -- runs in the group's leader client, as
in Kafka; headrace's clients are librdkafka's, so that half lives with the tests that act as
a group leader (``tests/coordinator/group_leader.py``).

Pure functions over bytes; thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from headrace.errors import CorruptMessage

CONSUMER_PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION_LATEST = 3

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT8 = struct.Struct(">b")


class FieldReader:
    """Reads classic Kafka schema fields from a buffer; raises CorruptMessage on truncation."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._position = 0

    @property
    def remaining_bytes(self) -> int:
        return len(self._data) - self._position

    def _take(self, size_bytes: int) -> memoryview:
        if size_bytes < 0 or self._position + size_bytes > len(self._data):
            raise CorruptMessage(
                f"truncated field: need {size_bytes} bytes at {self._position} of {len(self._data)}"
            )
        chunk = self._data[self._position : self._position + size_bytes]
        self._position += size_bytes
        return chunk

    def int8(self) -> int:
        return _INT8.unpack(self._take(1))[0]

    def int16(self) -> int:
        return _INT16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _INT32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _INT64.unpack(self._take(8))[0]

    def nullable_string(self) -> str | None:
        length = self.int16()
        if length == -1:
            return None
        return bytes(self._take(length)).decode("utf-8")

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise CorruptMessage("null in a non-nullable string field")
        return value

    def nullable_bytes(self) -> bytes | None:
        length = self.int32()
        if length == -1:
            return None
        return bytes(self._take(length))

    def bytes_(self) -> bytes:
        value = self.nullable_bytes()
        if value is None:
            raise CorruptMessage("null in a non-nullable bytes field")
        return value

    def array_length(self) -> int:
        count = self.int32()
        if count < -1:
            raise CorruptMessage(f"negative array length {count}")
        return max(count, 0)

    def int32_array(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(self.array_length()))


class FieldWriter:
    """Appends classic Kafka schema fields to a growing buffer."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def to_bytes(self) -> bytes:
        return b"".join(self._parts)

    def int8(self, value: int) -> FieldWriter:
        self._parts.append(_INT8.pack(value))
        return self

    def int16(self, value: int) -> FieldWriter:
        self._parts.append(_INT16.pack(value))
        return self

    def int32(self, value: int) -> FieldWriter:
        self._parts.append(_INT32.pack(value))
        return self

    def int64(self, value: int) -> FieldWriter:
        self._parts.append(_INT64.pack(value))
        return self

    def nullable_string(self, value: str | None) -> FieldWriter:
        if value is None:
            return self.int16(-1)
        encoded = value.encode("utf-8")
        self.int16(len(encoded))
        self._parts.append(encoded)
        return self

    def string(self, value: str) -> FieldWriter:
        return self.nullable_string(value)

    def nullable_bytes(self, value: bytes | None) -> FieldWriter:
        if value is None:
            return self.int32(-1)
        self.int32(len(value))
        self._parts.append(bytes(value))
        return self

    def bytes_(self, value: bytes) -> FieldWriter:
        return self.nullable_bytes(value)

    def int32_array(self, values: Sequence[int]) -> FieldWriter:
        self.int32(len(values))
        for value in values:
            self.int32(value)
        return self


TopicPartitions = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class Subscription:
    """A consumer's JoinGroup metadata for the "consumer" protocol type."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: TopicPartitions = ()
    generation_id: int = -1
    rack_id: str | None = None


def read_topic_partitions(reader: FieldReader) -> TopicPartitions:
    return tuple((reader.string(), reader.int32_array()) for _ in range(reader.array_length()))


def decode_subscription(data: bytes) -> Subscription:
    """Decode ConsumerProtocolSubscription; raises CorruptMessage on malformed bytes."""
    reader = FieldReader(data)
    version = reader.int16()
    if version < 0:
        raise CorruptMessage(f"negative ConsumerProtocolSubscription version {version}")
    topics = tuple(reader.string() for _ in range(reader.array_length()))
    user_data = reader.nullable_bytes()
    owned = read_topic_partitions(reader) if version >= 1 else ()
    generation_id = reader.int32() if version >= 2 else -1
    rack_id = reader.nullable_string() if version >= 3 else None
    return Subscription(topics, user_data, owned, generation_id, rack_id)
