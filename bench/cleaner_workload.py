"""Fast keyed-log generator for the cleaner benchmarks: v2 batches of fixed-shape records
built with numpy (no Python loop per record), appended through the storage ``Log`` API.

Record i of a batch: attributes 0, timestamp delta 0, offset delta i, a key of ``key_bytes``
ASCII digits (the key id, zero-padded), a value of ``value_bytes`` bytes naming the version,
no headers. Batches are uncompressed CreateTime batches with no producer id. Each record
shape (offset delta 0..63 takes one varint byte, 64.. two) is a template; keys are written
into the template with one fancy-indexing store per batch.

Not thread-safe: one generator per thread.
"""

from __future__ import annotations

import struct

import numpy as np

from headrace.protocol.batch import ATTRIBUTES_OFFSET, BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES
from headrace.protocol.kernel import crc32c
from headrace.protocol.varint import encode_signed

NOW_MS = 1_700_000_000_000
_HEADER = struct.Struct(">qiibIhiqqqhii")
_POWERS_OF_TEN = 10 ** np.arange(18, -1, -1, dtype=np.int64)





class BatchBuilder:
    """Builds batches of ``records_per_batch`` records with given key ids and version."""

    def __init__(self, records_per_batch: int, key_bytes: int, value_bytes: int) -> None:
        if key_bytes < len(_POWERS_OF_TEN):
            raise ValueError(f"keys need at least {len(_POWERS_OF_TEN)} bytes for the id digits")
        self.records_per_batch = records_per_batch
        self.key_bytes = key_bytes
        self.value_bytes = value_bytes
        template, key_starts, self._record_starts = bytearray(), [], []
        for delta in range(records_per_batch):
            self._record_starts.append(len(template))
            head = b"\x00" + encode_signed(0) + encode_signed(delta) + encode_signed(key_bytes)
            tail = encode_signed(value_bytes) + b"\x00" * value_bytes + encode_signed(0)
            body_bytes = len(head) + key_bytes + len(tail)
            template += encode_signed(body_bytes) + head
            key_starts.append(len(template))
            template += b"0" * key_bytes + tail
        self._template = np.frombuffer(bytes(template), np.uint8)
        digits_at = np.arange(key_bytes - len(_POWERS_OF_TEN), key_bytes)
        self._digit_positions = np.asarray(key_starts)[:, None] + digits_at[None, :]
        value_at = np.arange(value_bytes) + len(encode_signed(value_bytes)) + key_bytes
        self._value_positions = np.asarray(key_starts)[:, None] + value_at[None, :]

    def build(self, key_ids: np.ndarray, version: int) -> bytearray:
        """One batch (base offset 0: the log assigns offsets) of the given keys."""
        records = self._template.copy()
        digits = (key_ids[:, None] // _POWERS_OF_TEN[None, :]) % 10 + ord("0")
        records[self._digit_positions[: len(key_ids)]] = digits.astype(np.uint8)
        records[self._value_positions[: len(key_ids)]] = ord("a") + version % 26
        if len(key_ids) < self.records_per_batch:
            records = records[: self._record_starts[len(key_ids)]]
        batch = bytearray(_HEADER.pack(0, BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + len(records),
                                       -1, 2, 0, 0, len(key_ids) - 1, NOW_MS, NOW_MS, -1, -1,
                                       -1, len(key_ids)))
        batch += records.tobytes()
        struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
        return batch


def permuted_ids(start: int, count: int, keys: int, multiplier: int) -> np.ndarray:
    """``count`` key ids from position ``start`` of a fixed permutation of 0..keys-1
    (``i * multiplier mod keys``; the multiplier must be coprime to ``keys``, and
    ``keys * multiplier`` must fit in int64)."""
    positions = np.arange(start, start + count, dtype=np.int64)
    return (positions * multiplier) % keys
