"""Producer-state snapshots: their CRC-32C (the kernel's) and their round trip."""

from __future__ import annotations

import crc32c

from headrace.protocol.batch import parse_header
from headrace.protocol.records import build_batch
from headrace.storage.fs import RealFileSystem
from headrace.storage.producer_state import ProducerStateManager

CRC_FIELD = slice(6, 10)  # after magic (4 bytes) and version (int16)
BODY_START = 10


def _state(tmp_path) -> ProducerStateManager:
    state = ProducerStateManager(RealFileSystem(), tmp_path)
    for producer_id, sequence in [(7, 0), (7, 3), (9, 0)]:
        batch = build_batch([(b"k", b"v", (), 1_000), (None, b"w", (), 1_001)],
                            base_offset=sequence, producer_id=producer_id, producer_epoch=2,
                            base_sequence=sequence)
        state.update(parse_header(batch), sequence)
    return state


def test_snapshot_crc_is_the_crc32c_earlier_snapshots_carry(tmp_path):
    encoded = _state(tmp_path).encode()
    assert encoded[CRC_FIELD] == crc32c.crc32c(encoded[BODY_START:]).to_bytes(4, "big")


def test_snapshot_round_trips_and_a_damaged_one_is_ignored(tmp_path):
    state = _state(tmp_path)
    encoded = state.encode()
    assert ProducerStateManager.decode(encoded) == state.producers
    damaged = bytearray(encoded)
    damaged[-1] ^= 0x01
    assert ProducerStateManager.decode(bytes(damaged)) is None
