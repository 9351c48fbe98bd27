"""__consumer_offsets record formats against golden bytes hand-built from Kafka's schemas."""

from __future__ import annotations

import pytest

from headrace.coordinator.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataRecord,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hashcode,
    partition_for_group,
)
from headrace.errors import CorruptMessage

OFFSET = "000000000000002a"  # 42
TIMESTAMP = "00000000000003e8"  # 1000
EXPIRE = "00000000000007d0"  # 2000
METADATA = "00016d"  # "m"


def test_offset_commit_key_v1_golden():
    golden = bytes.fromhex("000100016700017400000003")
    assert encode_offset_commit_key(OffsetCommitKey("g", "t", 3)) == golden
    assert decode_key(golden) == OffsetCommitKey("g", "t", 3)
    assert decode_key(bytes.fromhex("000000016700017400000003")) == OffsetCommitKey("g", "t", 3)


def test_group_metadata_key_v2_golden():
    golden = bytes.fromhex("0002000167")
    assert encode_group_metadata_key(GroupMetadataKey("g")) == golden
    assert decode_key(golden) == GroupMetadataKey("g")


def test_unknown_key_version_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_key(bytes.fromhex("0003000167"))


def test_offset_commit_value_v3_golden():
    golden = bytes.fromhex("0003" + OFFSET + "00000005" + METADATA + TIMESTAMP)
    value = OffsetCommitValue(42, 5, "m", 1000)
    assert encode_offset_commit_value(value) == golden
    assert decode_offset_commit_value(golden) == value


@pytest.mark.parametrize(
    "hex_bytes,expected",
    [
        ("0000" + OFFSET + METADATA + TIMESTAMP, OffsetCommitValue(42, -1, "m", 1000)),
        (
            "0001" + OFFSET + METADATA + TIMESTAMP + EXPIRE,
            OffsetCommitValue(42, -1, "m", 1000, 2000),
        ),
        ("0002" + OFFSET + METADATA + TIMESTAMP, OffsetCommitValue(42, -1, "m", 1000)),
    ],
    ids=["v0", "v1", "v2"],
)
def test_offset_commit_value_old_versions(hex_bytes, expected):
    assert decode_offset_commit_value(bytes.fromhex(hex_bytes)) == expected


def test_truncated_value_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_offset_commit_value(bytes.fromhex("0003" + OFFSET))


def _group_hex(version: int) -> str:
    header = (
        "0008" + b"consumer".hex() + "00000007" + "0005" + b"range".hex() + "0002" + b"m1".hex()
    )
    if version >= 2:
        header += TIMESTAMP
    member = "0002" + b"m1".hex()
    if version >= 3:
        member += "0002" + b"i1".hex()
    member += "0001" + b"c".hex() + "0002" + b"/h".hex()
    if version >= 1:
        member += "00007530"  # rebalance timeout 30000
    member += "00002710" + "0000000101" + "0000000102"  # session 10000, subscription, assignment
    return f"{version:04x}" + header + "00000001" + member


def _group_value(version: int) -> GroupMetadataValue:
    member = MemberMetadataRecord(
        "m1",
        "i1" if version >= 3 else None,
        "c",
        "/h",
        30000 if version >= 1 else 10000,
        10000,
        b"\x01",
        b"\x02",
    )
    timestamp = 1000 if version >= 2 else -1
    return GroupMetadataValue("consumer", 7, "range", "m1", timestamp, (member,))


def test_group_metadata_value_v3_golden():
    golden = bytes.fromhex(_group_hex(3))
    assert encode_group_metadata_value(_group_value(3)) == golden
    assert decode_group_metadata_value(golden) == _group_value(3)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_group_metadata_value_old_versions(version):
    assert decode_group_metadata_value(bytes.fromhex(_group_hex(version))) == _group_value(version)


def test_group_metadata_value_with_null_protocol_and_leader():
    golden = bytes.fromhex("0003000000000003ffffffff" + TIMESTAMP + "00000000")
    value = GroupMetadataValue("", 3, None, None, 1000, ())
    assert encode_group_metadata_value(value) == golden
    assert decode_group_metadata_value(golden) == value


@pytest.mark.parametrize(
    "text,expected",
    [("", 0), ("hello", 99162322), ("Aa", 2112), ("BB", 2112), ("polygenelubricants", -(2**31))],
)
def test_java_string_hashcode(text, expected):
    assert java_string_hashcode(text) == expected


def test_java_string_hashcode_counts_utf16_code_units():
    # U+1F600 is the surrogate pair D83D DE00 in Java: (31 * 0xD83D + 0xDE00)
    assert java_string_hashcode("\U0001f600") == 31 * 0xD83D + 0xDE00
    assert java_string_hashcode("é") == 0xE9


def test_partition_for_group():
    assert partition_for_group("hello") == 99162322 % 50
    assert partition_for_group("polygenelubricants") == 0  # Utils.abs(MIN_VALUE) == 0
    assert java_string_hashcode("my-group") == -1906497762  # negative: abs before modulo
    assert partition_for_group("my-group") == 1906497762 % 50 == 12
    assert partition_for_group("hello", num_partitions=7) == 99162322 % 7
