"""The log cleaner's offset map: key hash -> latest offset, in a fixed budget of memory.

Owns one buffer of ``log.cleaner.dedupe.buffer.size`` bytes (Kafka's default 128 MiB), used
as an open-addressing (Robin Hood, linear probing) table of 12-byte slots stored as two numpy
columns in that one buffer:

    fingerprints uint64[capacity]   h1, the first word of the key's MurmurHash3 x64 128
                                    (0 = empty slot; an h1 of 0 is stored as 1)
    words        uint32[capacity]   displacement (6 bits, 0..63) << 26 | offset - base_offset
                                    (26 bits: one pass addresses at most 2**26 values)

The cleaner stores ordinals rather than offsets (``put_batches``, base 0): the n-th record of
its pass (keyed, in the dirty section and the pass's hash range) is ordinal n, so a pass
covers 2**26 of its own records whatever the offset span; more make the map count as full
and the cleaner splits the hash range, as it does for too many keys.

``capacity = buffer_bytes // 12`` slots, filled to at most ``log.cleaner.io.buffer.load.factor``
(0.9). A pass that knows an upper bound on its keys (the cleaner: the dirty section's offset
span) uses -- and clears -- only the first ``ceil(bound / load factor)`` slots of each column
(``clear(base, expected_values)``): a small dirty section then costs a small table that stays
in cache instead of 128 MiB of memory traffic. The collision bound below holds for any such
table: with n keys in c >= n / 0.9 slots, n(n-1)/2 * 2**-64 / c <= 0.45 n * 2**-64, largest
for the whole buffer. Home slot = ``((h2 & 0xffffffff) * capacity) >> 32`` (h2 = the hash's second word). An
insert that would need a displacement above 63 makes the map count as full, like reaching the
load factor. The insert and lookup loops are in C (``_segment_io.c``: ``segment_io.offset_map_put/get``).

Capacity: 128 MiB / 12 B = 11,184,810 slots; x 0.9 = 10,066,329 distinct keys per pass
(Kafka: SHA-256 at 40 B a slot, ~3.0 M; WarpStream's MD5 at 24 B, ~5 M).

Collision bound (a live record is dropped only if a *different* key is taken for its key, i.e.
both its identity bits collide): a lookup matches a slot only if the stored fingerprint equals
h1 (64 bits) AND the slot's home (position - displacement) equals the key's home -- so the
position contributes log2(capacity) = 23.4 bits. Two distinct keys are confused with
probability 2**-64 / 11,184,810 = 2**-87.4 = 4.85e-27 (the fastrange home is uniform to within
1 part in 384; the 0 -> 1 fingerprint remap only doubles the odds of one value in 2**64).
Keys of other hash ranges are filtered out before the map is touched, so only keys of the
same pass can collide: with n = 10,066,329 keys in a pass, n(n-1)/2 = 5.07e13 pairs, expected
confusions <= 5.07e13 * 4.85e-27 = 2.5e-13 per full pass -- below 1e-12. (With a 64-bit
fingerprint alone it would be 2.7e-6; the displacement field is what buys the position bits.)
A cleaning that needs R passes of full maps stays below R * 2.5e-13.

Thread-safety: none; one cleaner thread owns a map (the C loops release the GIL).
"""

from __future__ import annotations

import math

import numpy as np

from headrace.protocol.kernel import BufferLike, WritableBuffer
from headrace.storage import segment_io
from headrace.storage.segment_io import MapBuild, MapSpan, PassScope, map_batches, map_span

SLOT_BYTES = 12
DEFAULT_DEDUPE_BUFFER_SIZE_BYTES = 128 * 1024 * 1024
DEFAULT_LOAD_FACTOR = 0.9
MAX_OFFSET_SPAN = 1 << 26  # values (offsets or ordinals) a pass can address: the 26-bit delta
HASH_RANGE_VALUES = 1 << 32  # hash ranges partition h2 >> 32
NOT_FOUND = -1
MIN_EXPECTED_VALUES = 4096  # a sized map holds at least this many keys (a few pages)


class OffsetMap:
    """Key hash -> latest offset for one pass of the cleaner, within a fixed buffer."""

    def __init__(self, buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
                 load_factor: float = DEFAULT_LOAD_FACTOR) -> None:
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor must lie in (0, 1], got {load_factor}")
        self.capacity_slots = buffer_size_bytes // SLOT_BYTES
        if self.capacity_slots < 2:
            raise ValueError(f"dedupe buffer of {buffer_size_bytes} bytes holds no slots")
        self.load_factor = load_factor
        self.max_entries = max(1, int(self.capacity_slots * load_factor))
        self._buffer = np.zeros(self.capacity_slots * SLOT_BYTES, np.uint8)
        fingerprint_bytes = self.capacity_slots * 8
        self._all_fingerprints = self._buffer[:fingerprint_bytes].view(np.uint64)
        self._all_words = self._buffer[fingerprint_bytes:].view(np.uint32)
        self._use_slots(self.capacity_slots)
        self.base_offset = 0
        self.size = 0
        self.latest_offset = -1

    def clear(self, base_offset: int, expected_values: int | None = None) -> None:
        """Empty the map for a pass whose offsets start at ``base_offset``; given an upper
        bound on the keys the pass puts (``expected_values``), use only the slots that hold
        that many at the load factor (at most the whole buffer)."""
        slots = self.capacity_slots
        if expected_values is not None:
            needed = math.ceil(max(expected_values, MIN_EXPECTED_VALUES) / self.load_factor)
            slots = min(slots, needed)
        self._use_slots(slots)
        self._fingerprints.fill(0)
        self.base_offset = base_offset
        self.size = 0
        self.latest_offset = -1

    def _use_slots(self, slots: int) -> None:
        self.active_slots = slots
        self.active_max_entries = max(1, min(self.max_entries, int(slots * self.load_factor)))
        self._fingerprints = self._all_fingerprints[:slots]
        self._words = self._all_words[:slots]

    @property
    def utilization(self) -> float:
        """Filled slots / slots (Kafka's buffer utilisation)."""
        return self.size / self.capacity_slots

    def put(self, hash_hi: np.ndarray, hash_lo: np.ndarray, offsets: np.ndarray) -> int:
        """Insert keys in offset order; returns how many were taken before the map filled
        (``len(offsets)`` when all fit). Offsets must lie in
        ``[base_offset, base_offset + MAX_OFFSET_SPAN)``."""
        if len(offsets) == 0:
            return 0
        taken, new_keys, _full = segment_io.offset_map_put(
            self._fingerprints, self._words, _u64(hash_hi), _u64(hash_lo),
            np.ascontiguousarray(offsets, np.int64), self.base_offset,
            self.active_max_entries - self.size)
        self.size += new_keys
        if taken:
            self.latest_offset = max(self.latest_offset, int(offsets[taken - 1]))
        return taken

    def put_batches(self, buf: BufferLike, scope: PassScope, first_ordinal: int) -> MapBuild:
        """Map each record of ``scope`` in the whole batches of ``buf`` to its ordinal
        (numbered from ``first_ordinal``; the map must have been cleared with base 0)."""
        build = map_batches(buf, self._fingerprints, self._words, scope, first_ordinal,
                            self.active_max_entries - self.size)
        self.size += build.new_keys
        return build

    def put_span(self, fd: int, buffer: WritableBuffer, position: int, end_position: int,
                 span_bytes: int, scope: PassScope, first_ordinal: int,
                 niceness: int = 0, direct_fd: int = -1) -> MapSpan:
        """``put_batches`` over about ``span_bytes`` of the file ``fd`` from ``position``, read
        into ``buffer`` chunk by chunk in one kernel call (``segment_io.map_span``, run
        ``niceness`` nicer than the caller, uncached chunks read from ``direct_fd``)."""
        span = map_span(fd, buffer, position, end_position, span_bytes, self._fingerprints,
                        self._words, scope, first_ordinal, self.active_max_entries - self.size,
                        niceness, direct_fd)
        self.size += span.new_keys
        return span

    @property
    def fingerprints(self) -> np.ndarray:
        """The slot fingerprints of the slots in use (for the kernel's lookups)."""
        return self._fingerprints

    @property
    def words(self) -> np.ndarray:
        """The slot words of the slots in use: displacement << 26 | value - base_offset."""
        return self._words

    def get(self, hash_hi: np.ndarray, hash_lo: np.ndarray) -> np.ndarray:
        """The mapped offset of each key, ``NOT_FOUND`` (-1) where absent."""
        if len(hash_hi) == 0:
            return np.empty(0, np.int64)
        dummy = np.empty(len(hash_hi), np.int64)
        raw = segment_io.offset_map_get(self._fingerprints, self._words, _u64(hash_hi),
                                     _u64(hash_lo), dummy, self.base_offset, 0)
        return np.frombuffer(raw, np.int64)


def _u64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, np.uint64)
