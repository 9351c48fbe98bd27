"""Single-offset forms of the parallel consumer's done-range metadata codec, for tests:
``encode_done_offsets``/``decode_done_offsets`` over ``offset_tracker``'s range codec.
Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace.client.offset_tracker import decode_done_ranges, encode_done_ranges


def encode_done_offsets(committed_offset: int, done_offsets: Iterable[int]) -> str:
    """``encode_done_ranges`` for single offsets."""
    return encode_done_ranges(committed_offset, ((offset, offset + 1) for offset in done_offsets))


def decode_done_offsets(committed_offset: int, metadata: str | None) -> set[int]:
    """``decode_done_ranges`` as a set of offsets (for small ranges: tests, tools)."""
    return {offset for start, end in decode_done_ranges(committed_offset, metadata)
            for offset in range(start, end)}
