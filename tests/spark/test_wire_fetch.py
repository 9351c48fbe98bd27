"""The executor's raw Fetch client: response parsing for every version, options, a real broker."""

from __future__ import annotations

import pytest
from conftest import append, new_topic

from headrace.protocol import wire
from headrace.spark.fetch import next_fetch_offset
from headrace.spark.wire_fetch import (
    EARLIEST_TIMESTAMP,
    FETCH_KEY,
    LATEST_TIMESTAMP,
    FetchClientConfig,
    FetchClientError,
    PartitionFetchClient,
    parse_fetch_response,
)

RECORDS = b"\x00" * 7 + b"record batch bytes"


def _response_frame(version: int, partitions: list[dict], correlation_id: int = 9) -> bytearray:
    body = wire.build(wire.response_class(FETCH_KEY, version), {
        "throttle_time": 0, "error_code": 0, "session_id": 0,
        "responses": [{"topic": "other", "partitions": [{"partition_index": 0}]},
                      {"topic": "t", "partitions": partitions}]})
    header = wire.response_header_bytes(wire.RequestHeader(FETCH_KEY, version, correlation_id,
                                                           None), version >= 12)
    return bytearray(header + wire.encode_body(body))


@pytest.mark.parametrize("version", range(4, 13))
def test_every_version_yields_the_named_partition(version):
    frame = _response_frame(version, [
        {"partition_index": 0, "high_watermark": 5, "records": b"other"},
        {"partition_index": 3, "high_watermark": 42, "log_start_offset": 7,
         "aborted_transactions": [{"producer_id": 1, "first_offset": 2}], "records": RECORDS},
    ])
    fetched = parse_fetch_response(frame, version, "t", 3)
    assert fetched.error_code == 0
    assert fetched.high_watermark == 42
    assert fetched.log_start_offset == (7 if version >= 5 else -1)
    assert bytes(fetched.records) == RECORDS


def test_tagged_fields_are_skipped():
    frame = _response_frame(12, [{
        "partition_index": 1, "high_watermark": 3, "records": RECORDS,
        "diverging_epoch": {"epoch": 4, "end_offset": 99},
        "current_leader": {"leader_id": 2, "leader_epoch": 8},
    }])
    plain = _response_frame(12, [{"partition_index": 1, "high_watermark": 3,
                                  "records": RECORDS}])
    assert len(frame) > len(plain)  # the tagged fields really are on the wire
    fetched = parse_fetch_response(frame, 12, "t", 1)
    assert (fetched.high_watermark, bytes(fetched.records)) == (3, RECORDS)


@pytest.mark.parametrize("varint", [b"\x80", b"\xff" * 6], ids=["truncated", "overlong"])
def test_a_bad_varint_in_the_response_is_a_client_error(varint):
    frame = _response_frame(12, [{"partition_index": 1, "records": RECORDS}])
    damaged = frame[:4] + varint  # the response header's tagged-field count, then nothing
    with pytest.raises(FetchClientError, match="varint"):
        parse_fetch_response(damaged, 12, "t", 1)


def test_null_records_and_partition_errors():
    frame = _response_frame(11, [{"partition_index": 0, "error_code": 1,
                                  "high_watermark": -1, "records": None}])
    fetched = parse_fetch_response(frame, 11, "t", 0)
    assert fetched.error_code == 1 and bytes(fetched.records) == b""


def test_a_missing_partition_is_an_error():
    frame = _response_frame(12, [{"partition_index": 0, "records": RECORDS}])
    with pytest.raises(FetchClientError, match="lacks t-5"):
        parse_fetch_response(frame, 12, "t", 5)


def test_options_take_kafka_and_librdkafka_names():
    config = FetchClientConfig.from_client_options({
        "bootstrap.servers": "PLAINTEXT://a:1, b:2,c", "fetch.max.bytes": "1000",
        "max.partition.fetch.bytes": "500", "fetch.wait.max.ms": "7",
        "socket.timeout.ms": "900", "client.id": "me"})
    assert config.bootstrap_servers == (("a", 1), ("b", 2), ("c", 9092))
    assert (config.fetch_max_bytes, config.max_partition_fetch_bytes) == (1000, 500)
    assert (config.fetch_max_wait_ms, config.request_timeout_ms) == (7, 900)
    assert config.client_id == "me"
    with pytest.raises(FetchClientError, match="SASL_SSL"):
        FetchClientConfig.from_client_options({"bootstrap.servers": "a:1",
                                               "security.protocol": "sasl_ssl"})


def test_fetches_raw_batches_and_offsets_from_a_real_broker(bootstrap):
    topic = new_topic(bootstrap, 2)
    append(bootstrap, topic, 1, [b"v%d" % i for i in range(5)])
    client = PartitionFetchClient(
        FetchClientConfig.from_client_options({"bootstrap.servers": bootstrap}), topic, 1)
    try:
        assert client.list_offset(EARLIEST_TIMESTAMP) == 0
        assert client.list_offset(LATEST_TIMESTAMP) == 5
        client.send_fetch(0)
        client.send_fetch(4)  # pipelined: answers arrive in order
        first, second = client.receive_fetch(), client.receive_fetch()
        assert first.error_code == 0 and first.high_watermark == 5
        assert next_fetch_offset(first.records, 0) == (5, len(first.records))
        assert next_fetch_offset(second.records, 4)[0] == 5
        client.send_fetch(5)
        assert bytes(client.receive_fetch().records) == b""  # at the log end
    finally:
        client.close()


def test_batches_past_the_range_end_are_left_out(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v%d" % i for i in range(4)], batch_per_record=True)
    client = PartitionFetchClient(
        FetchClientConfig.from_client_options({"bootstrap.servers": bootstrap}), topic, 0)
    try:
        client.send_fetch(0)
        records = client.receive_fetch().records
    finally:
        client.close()
    whole = next_fetch_offset(records, 0)
    two, two_bytes = next_fetch_offset(records, 0, until_offset=2)
    assert whole == (4, len(records))
    assert two == 2 and 0 < two_bytes < len(records)
    assert next_fetch_offset(records, 0, until_offset=0)[0] == 1  # the first batch always
