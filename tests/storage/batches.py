"""Test helper: build v2 record batches (uncompressed) without the protocol's record codec
(only its varint codec)."""

from __future__ import annotations

import struct

import crc32c

from headrace.protocol.varint import encode_signed


def _record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes) -> bytes:
    body = b"\x00" + encode_signed(timestamp_delta) + encode_signed(offset_delta)
    body += encode_signed(-1) if key is None else encode_signed(len(key)) + key
    body += encode_signed(len(value)) + value + encode_signed(0)
    return encode_signed(len(body)) + body


def build_batch(values: list[bytes], timestamp_ms: int = 1_700_000_000_000, producer_id: int = -1,
                producer_epoch: int = -1, base_sequence: int = -1, timestamps: list[int] | None = None,
                header_max_timestamp_ms: int | None = None) -> bytearray:
    """One v2 batch holding ``values`` as records (base offset 0, valid CRC). The header's max
    timestamp is the records' unless ``header_max_timestamp_ms`` says otherwise (librdkafka
    writes 0 there for records without a timestamp)."""
    stamps = timestamps or [timestamp_ms] * len(values)
    header_max_ms = max(stamps) if header_max_timestamp_ms is None else header_max_timestamp_ms
    records = b"".join(_record(i, stamps[i] - stamps[0], None, v) for i, v in enumerate(values))
    after_crc = struct.pack(">hiqqqhii", 0, len(values) - 1, stamps[0], header_max_ms, producer_id,
                            producer_epoch, base_sequence, len(values)) + records
    crc = crc32c.crc32c(after_crc)
    body = struct.pack(">ibI", 0, 2, crc) + after_crc
    return bytearray(struct.pack(">qi", 0, len(body)) + body)
