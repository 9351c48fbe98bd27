"""Codecs: round trips, Kafka's wire framings, cross-checks against independent libraries."""

import gzip
import struct

import cramjam
import lz4.frame
import pytest
import snappy
import xxhash
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from headrace.errors import CorruptMessage, UnsupportedCompressionType
from headrace.protocol import compression
from headrace.protocol.compression import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    codec_by_name,
    compress,
    decompress,
    xxh32,
)
from headrace.protocol.varint import encode_unsigned

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
COMPRESSED_CODECS = [GZIP, SNAPPY, LZ4, ZSTD]
SAMPLE = b"".join(b"record %d with some repeated text; " % i for i in range(5000))


def test_codec_ids_are_kafkas_attribute_values():
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)


@pytest.mark.parametrize(
    ("name", "codec"),
    [("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4), ("uncompressed", 0), ("LZ4", 3)],
)
def test_codec_by_name(name, codec):
    assert codec_by_name(name) == codec


def test_codec_by_name_producer_means_keep_the_producers_codec():
    assert codec_by_name("producer") is None


def test_codec_by_name_rejects_unknown_names():
    with pytest.raises(UnsupportedCompressionType):
        codec_by_name("brotli")


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_unknown_codec_ids_are_unsupported(codec):
    with pytest.raises(UnsupportedCompressionType):
        compress(codec, b"x")
    with pytest.raises(UnsupportedCompressionType):
        decompress(codec, b"x")


@pytest.mark.parametrize("codec", ALL_CODECS)
@pytest.mark.parametrize("data", [b"", b"a", SAMPLE], ids=["empty", "one-byte", "large"])
def test_every_codec_round_trips(codec, data):
    assert decompress(codec, compress(codec, data)) == data


@given(codec=st.sampled_from(ALL_CODECS), data=st.binary(max_size=3000))
def test_round_trip_property(codec, data):
    assert decompress(codec, compress(codec, memoryview(data))) == data


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_compression_shrinks_repetitive_data(codec):
    assert len(compress(codec, SAMPLE)) < len(SAMPLE) // 4


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_undecodable_input_raises_corrupt_message(codec, damage):
    encoded = compress(codec, SAMPLE)
    bad = b"\x00\x01garbage that is no codec's stream" if damage == "garbage" else encoded[: len(encoded) // 2]
    with pytest.raises(CorruptMessage):
        decompress(codec, bad)


def _xerial_frame(blocks, version=1, compatible=1):
    """The xerial snappy framing, written out from its layout."""
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", version, compatible)
    for block in blocks:
        raw = bytes(cramjam.snappy.compress_raw(block))
        out += struct.pack(">i", len(raw)) + raw
    return out


def test_xerial_framed_snappy_decodes():
    blocks = [b"first block " * 100, b"second " * 50, b"x"]
    assert decompress(SNAPPY, _xerial_frame(blocks)) == b"".join(blocks)


def test_xerial_version_fields_are_not_trusted():
    # Some writers put little-endian version fields; Kafka and kafka-python ignore them.
    framed = _xerial_frame([b"payload " * 10], version=0x01000000, compatible=0x01000000)
    assert decompress(SNAPPY, framed) == b"payload " * 10


def test_xerial_block_overrunning_the_data_is_corrupt():
    framed = _xerial_frame([b"payload " * 100])
    with pytest.raises(CorruptMessage):
        decompress(SNAPPY, framed[:-3])
    with pytest.raises(CorruptMessage):
        decompress(SNAPPY, framed + b"\x00\x00")


def test_raw_snappy_decodes():
    assert decompress(SNAPPY, snappy.compress(SAMPLE)) == SAMPLE


def test_snappy_is_written_in_xerial_framing_in_32_kib_blocks():
    encoded = compress(SNAPPY, SAMPLE)
    assert encoded.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    first_block_bytes = struct.unpack_from(">i", encoded, 16)[0]
    first_block = snappy.decompress(encoded[20 : 20 + first_block_bytes])
    assert first_block == SAMPLE[: 32 * 1024]


def test_other_libraries_decode_what_we_write():
    assert gzip.decompress(compress(GZIP, SAMPLE)) == SAMPLE
    assert kafka_codec.snappy_decode(compress(SNAPPY, SAMPLE)) == SAMPLE
    assert lz4.frame.decompress(compress(LZ4, SAMPLE)) == SAMPLE
    assert zstandard.ZstdDecompressor().decompress(compress(ZSTD, SAMPLE)) == SAMPLE


def test_we_decode_what_other_libraries_write():
    assert decompress(GZIP, gzip.compress(SAMPLE)) == SAMPLE
    assert decompress(SNAPPY, kafka_codec.snappy_encode(SAMPLE)) == SAMPLE
    assert decompress(LZ4, lz4.frame.compress(SAMPLE, block_linked=False)) == SAMPLE
    assert decompress(LZ4, lz4.frame.compress(SAMPLE, store_size=True)) == SAMPLE
    assert decompress(ZSTD, zstandard.ZstdCompressor().compress(SAMPLE)) == SAMPLE


def test_zstd_frame_without_content_size_decodes():
    streaming = zstandard.ZstdCompressor(write_content_size=False).compress(SAMPLE)
    assert decompress(ZSTD, streaming) == SAMPLE


def test_legacy_lz4_with_kafkas_wrong_header_checksum():
    old_kafka = kafka_codec.lz4_encode_old_kafka(SAMPLE)
    with pytest.raises(CorruptMessage):
        decompress(LZ4, old_kafka)
    assert decompress(LZ4, old_kafka, legacy_lz4_header_checksum=True) == SAMPLE


def test_legacy_lz4_repair_rejects_a_non_frame():
    with pytest.raises(CorruptMessage):
        decompress(LZ4, b"not an lz4 frame", legacy_lz4_header_checksum=True)


@given(st.binary(max_size=compression.XXH32_SHORT_INPUT_MAX_BYTES), st.integers(0, 2**32 - 1))
def test_xxh32_matches_the_reference_library(data, seed):
    assert xxh32(data, seed) == xxhash.xxh32_intdigest(data, seed)


# ---------------------------------------------------------------- bounded decompression

BOMB_BYTES = 64 << 20
BOMB_LIMIT_BYTES = 8 << 20
CHUNK_BYTES = 1 << 20


def _streamed(codec, chunk, count):
    """``chunk`` repeated ``count`` times, compressed without holding the whole input."""
    compressor = compression.StreamCompressor(codec)
    return b"".join([*(compressor.compress(chunk) for _ in range(count)), compressor.finish()])


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_stream_compressor_writes_what_decompress_reads(codec):
    assert decompress(codec, _streamed(codec, SAMPLE[:70_000], 5)) == SAMPLE[:70_000] * 5


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD])
def test_a_bomb_is_inflated_a_chunk_at_a_time_and_refused_past_the_limit(codec):
    bomb = _streamed(codec, bytes(CHUNK_BYTES), BOMB_BYTES // CHUNK_BYTES)
    seen_bytes, largest_chunk_bytes = 0, 0
    with pytest.raises(compression.MessageTooLarge):
        for chunk in compression.iter_decompressed(codec, bomb, BOMB_LIMIT_BYTES,
                                                   chunk_bytes=CHUNK_BYTES):
            seen_bytes += len(chunk)
            largest_chunk_bytes = max(largest_chunk_bytes, len(chunk))
    assert largest_chunk_bytes <= CHUNK_BYTES
    assert seen_bytes <= BOMB_LIMIT_BYTES


def _snappy_with_declared_length(data, declared_bytes):
    block = bytes(cramjam.snappy.compress_raw(data))
    true_preamble_bytes = len(encode_unsigned(cramjam.snappy.decompress_raw_len(block)))
    return encode_unsigned(declared_bytes) + block[true_preamble_bytes:]


@pytest.mark.parametrize("framing", ["raw", "xerial"])
def test_a_snappy_block_declaring_more_than_the_limit_is_refused_before_decoding(framing):
    block = _snappy_with_declared_length(bytes(CHUNK_BYTES), 1 << 31)
    payload = block if framing == "raw" else _xerial_frame([]) + struct.pack(">i", len(block)) + block
    with pytest.raises(compression.MessageTooLarge):
        compression.decompress_bounded(SNAPPY, payload, BOMB_LIMIT_BYTES)


def test_a_zstd_frame_asking_for_a_window_above_the_cap_is_corrupt():
    params = zstandard.ZstdCompressionParameters.from_level(  # a 32 MiB window
        3, window_log=25, write_content_size=False)
    streaming = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = streaming.compress(b"window " * 1000) + streaming.flush()  # size unknown: no shrink
    assert zstandard.get_frame_parameters(frame).window_size > compression.ZSTD_MAX_WINDOW_BYTES
    with pytest.raises(CorruptMessage):
        decompress(ZSTD, frame)


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_bytes_after_the_last_frame_are_corrupt(codec):
    with pytest.raises(CorruptMessage):
        decompress(codec, compress(codec, SAMPLE) + b"\x01\x02\x03\x04\x05")


# ---------------------------------------------------------------- decompression into a buffer

SKIPPABLE_LZ4_FRAME = b"\x50\x2a\x4d\x18" + struct.pack("<i", 4) + b"skip"
INTO_PAYLOADS = {
    "none": (NONE, SAMPLE),
    "gzip": (GZIP, compress(GZIP, SAMPLE)),
    "gzip, two members": (GZIP, gzip.compress(SAMPLE[:1000]) + gzip.compress(SAMPLE[1000:])),
    "snappy, xerial blocks": (SNAPPY, compress(SNAPPY, SAMPLE)),
    "snappy, one raw block": (SNAPPY, snappy.compress(SAMPLE)),
    "lz4": (LZ4, compress(LZ4, SAMPLE)),
    "lz4, linked blocks and every checksum": (LZ4, lz4.frame.compress(
        SAMPLE, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=True,
        block_checksum=True, content_checksum=True, store_size=True)),
    "lz4, librdkafka's: independent 64 KiB blocks, no checksum": (LZ4, lz4.frame.compress(
        SAMPLE, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
        content_checksum=False, store_size=False)),
    "lz4, two frames and a skippable one": (
        LZ4, compress(LZ4, SAMPLE[:999]) + SKIPPABLE_LZ4_FRAME + compress(LZ4, SAMPLE[999:])),
    "zstd": (ZSTD, compress(ZSTD, SAMPLE)),
    "zstd, two frames without content size": (ZSTD, b"".join(
        zstandard.ZstdCompressor(write_content_size=False, write_checksum=True).compress(part)
        for part in (SAMPLE[:5000], SAMPLE[5000:]))),
}


@pytest.mark.parametrize("name", sorted(INTO_PAYLOADS))
def test_decompress_into_writes_what_decompress_returns(name):
    codec, payload = INTO_PAYLOADS[name]
    out = bytearray(len(SAMPLE) + 1)
    assert compression.decompress_into(codec, memoryview(payload), out) == len(SAMPLE)
    assert out[: len(SAMPLE)] == decompress(codec, payload) == SAMPLE


@pytest.mark.parametrize("name", sorted(INTO_PAYLOADS))
def test_decompress_into_refuses_output_past_the_buffer_less_a_byte_as_decompress_bounded(name):
    codec, payload = INTO_PAYLOADS[name]
    for out_bytes in (len(SAMPLE), len(SAMPLE) // 3):
        with pytest.raises(compression.MessageTooLarge):
            compression.decompress_bounded(codec, payload, out_bytes - 1)
        with pytest.raises(compression.MessageTooLarge):
            compression.decompress_into(codec, payload, bytearray(out_bytes))


def _damaged(codec: int, damage: str) -> bytes:
    encoded = compress(codec, SAMPLE)
    if damage == "truncated":
        return encoded[: len(encoded) // 2]
    if damage == "last byte missing":
        return encoded[:-1]
    if damage == "trailing bytes":
        return encoded + b"\x01\x02\x03\x04\x05"
    if damage == "checksum flipped":  # gzip's CRC-32, lz4's and zstd's content checksums
        return encoded[:-5] + bytes([encoded[-5] ^ 1]) + encoded[-4:] if codec == GZIP else \
            encoded[:-2] + bytes([encoded[-2] ^ 1]) + encoded[-1:]
    return b"\x00\x01garbage that is no codec's stream"


DAMAGES = [(codec, damage) for codec in COMPRESSED_CODECS
           for damage in ("garbage", "truncated", "last byte missing", "trailing bytes",
                          "checksum flipped")
           if (codec, damage) != (SNAPPY, "checksum flipped")]  # snappy carries no checksum


@pytest.mark.parametrize(("codec", "damage"), DAMAGES)
def test_decompress_into_declines_whatever_decompress_refuses(codec, damage):
    payload = _damaged(codec, damage)
    with pytest.raises(CorruptMessage):
        decompress(codec, payload)
    assert compression.decompress_into(codec, payload, bytearray(4 * len(SAMPLE))) is None


def test_decompress_into_declines_a_zstd_window_above_the_cap():
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=25,
                                                            write_content_size=False)
    streaming = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = streaming.compress(b"window " * 1000) + streaming.flush()
    assert compression.decompress_into(ZSTD, frame, bytearray(1 << 20)) is None


@pytest.mark.parametrize("framing", ["raw", "xerial"])
def test_decompress_into_refuses_a_snappy_block_declaring_more_than_the_buffer(framing):
    block = _snappy_with_declared_length(bytes(CHUNK_BYTES), 1 << 31)
    payload = block if framing == "raw" else _xerial_frame([]) + struct.pack(">i", len(block)) + block
    with pytest.raises(compression.MessageTooLarge):
        compression.decompress_into(SNAPPY, payload, bytearray(BOMB_LIMIT_BYTES))


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD])
def test_decompress_into_refuses_a_bomb_having_written_only_the_buffer(codec):
    bomb = _streamed(codec, bytes(CHUNK_BYTES), BOMB_BYTES // CHUNK_BYTES)
    out = bytearray(BOMB_LIMIT_BYTES + 1)
    with pytest.raises(compression.MessageTooLarge):
        compression.decompress_into(codec, bomb, out)


@given(name=st.sampled_from(sorted(INTO_PAYLOADS)), position=st.integers(0, 10**6),
       flip=st.integers(0, 255), cut=st.integers(0, 3), out_bytes=st.integers(1, 2 * len(SAMPLE)))
def test_decompress_into_answers_as_decompress_bounded_or_declines(name, position, flip, cut,
                                                                   out_bytes):
    """Damage anywhere (or none), any buffer size: the bytes decompress_bounded returns, or
    an error where it raises one -- MessageTooLarge exactly where it does for data that
    decodes; data both too large and undecodable may get either, as the decoders notice
    the two at different points -- or a decline where it refuses the data."""
    codec, payload = INTO_PAYLOADS[name]
    damaged = bytearray(payload[: len(payload) - cut])
    damaged[position % len(damaged)] ^= flip
    out = bytearray(out_bytes)
    try:
        expected = compression.decompress_bounded(codec, bytes(damaged), out_bytes - 1)
    except (CorruptMessage, compression.MessageTooLarge) as exc:
        expected = type(exc)
    decodes = expected is not CorruptMessage and (
        expected is not compression.MessageTooLarge or _decodes(codec, bytes(damaged)))
    try:
        written = compression.decompress_into(codec, bytes(damaged), out)
    except compression.MessageTooLarge:
        assert expected is compression.MessageTooLarge or not decodes
        return
    if written is None:
        assert expected in (CorruptMessage, compression.MessageTooLarge)
        assert not decodes
    else:
        assert out[:written] == expected


def _decodes(codec: int, data: bytes) -> bool:
    try:
        decompress(codec, data)
    except CorruptMessage:
        return False
    return True
