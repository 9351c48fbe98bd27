"""``headrace produce`` and ``headrace consume`` against a live headrace broker."""

from __future__ import annotations

import base64
import json

import pytest

from headrace.broker.handlers import HANDLERS
from tests.cli.cli_runner import assert_user_error, run, run_json, run_ok, unique_topic

JOIN_GROUP_API_KEY = 11


def _topic(broker, prefix: str, partitions: int = 1) -> str:
    topic = unique_topic(prefix)
    run_ok("topics", "create", topic, "--partitions", str(partitions), "-b", broker.bootstrap)
    return topic


def _consume(broker, topic: str, *args: str) -> bytes:
    return run_ok("consume", topic, "-b", broker.bootstrap, *args).stdout


def test_lines_in_values_out(broker):
    topic = _topic(broker, "everyday")
    run_ok("produce", topic, "-b", broker.bootstrap, stdin=b"a\nb\n\nlast-without-newline")
    output = _consume(broker, topic, "--from-beginning", "--max-messages", "4")
    assert output == b"a\nb\n\nlast-without-newline\n"


def test_consume_reports_count_and_stops_at_end_or_when_idle(broker):
    topic = _topic(broker, "stops", partitions=2)
    run_ok("produce", topic, "-b", broker.bootstrap, stdin=b"1\n2\n3\n")
    at_end = run_ok("consume", topic, "-b", broker.bootstrap, "--from-beginning",
                    "--exit-at-end")
    assert sorted(at_end.stdout.split()) == [b"1", b"2", b"3"]
    assert b"Processed a total of 3 messages" in at_end.stderr
    idle = run_ok("consume", topic, "-b", broker.bootstrap, "--timeout-ms", "300")
    assert idle.stdout == b""  # the default start is the end of the log


def test_keys_headers_and_format_fields(broker):
    topic = _topic(broker, "format", partitions=2)
    run_ok("produce", topic, "-b", broker.bootstrap, "--key-separator", ":", "--partition",
           "1", "--header", "source=cli", "--header", "n=1", stdin=b"k1:v:1\nk2:\n")
    output = _consume(broker, topic, "--from-beginning", "--partition", "1", "-e", "--format",
                      "%t|%p|%o|%k|%K|%s|%S|%h|%%\\n")
    lines = output.decode().splitlines()
    assert lines == [
        f"{topic}|1|0|k1|2|v:1|3|source=cli,n=1|%",
        f"{topic}|1|1|k2|2||0|source=cli,n=1|%",
    ]
    timestamps = _consume(broker, topic, "--from-beginning", "-p", "1", "-e", "-f", "%T\\t")
    assert all(int(field) > 0 for field in timestamps.split(b"\t")[:-1])


def test_consume_output_json_is_one_object_per_record(broker):
    topic = _topic(broker, "json-lines")
    run_ok("produce", topic, "-b", broker.bootstrap, "-K", "=", "-H", "source=cli",
           stdin=b"k=text\nbinary=\xff\xfe\n")
    output = _consume(broker, topic, "--from-beginning", "-e", "--output", "json")
    records = [json.loads(line) for line in output.splitlines()]
    assert [{key: record[key] for key in record if key != "timestamp"} for record in records] == [
        {"topic": topic, "partition": 0, "offset": 0, "key": "k", "value": "text",
         "headers": [["source", "cli"]]},
        {"topic": topic, "partition": 0, "offset": 1, "key": "binary",
         "value_base64": base64.b64encode(b"\xff\xfe").decode(), "headers": [["source", "cli"]]},
    ]
    assert all(record["timestamp"] > 0 for record in records)
    assert_user_error(run("consume", topic, "-b", broker.bootstrap, "--output", "json",
                          "--print-key"), "--output json cannot be combined")


def test_print_shortcuts(broker):
    topic = _topic(broker, "shortcuts")
    run_ok("produce", topic, "-b", broker.bootstrap, "-K", "=", stdin=b"a=1\nb=2\n")
    output = _consume(broker, topic, "--from-beginning", "-e", "--print-key", "--print-offset",
                      "--print-partition")
    assert output == b"Partition:0\tOffset:0\ta\t1\nPartition:0\tOffset:1\tb\t2\n"
    keyed = _consume(broker, topic, "--from-beginning", "-e", "--print-key",
                     "--key-separator", " -> ")
    assert keyed == b"a -> 1\nb -> 2\n"


def test_start_positions(broker):
    topic = _topic(broker, "positions")
    run_ok("produce", topic, "-b", broker.bootstrap, stdin=b"r0\nr1\nr2\nr3\n")
    assert _consume(broker, topic, "--offset", "2", "-e") == b"r2\nr3\n"
    assert _consume(broker, topic, "--timestamp", "2001-09-09T01:46:40Z", "-e") == \
        b"r0\nr1\nr2\nr3\n"
    far_future_ms = str(32503680000000)  # year 3000: no record that late
    assert _consume(broker, topic, "--timestamp", far_future_ms, "--timeout-ms", "300") == b""
    assert _consume(broker, topic, "--from-beginning", "-n", "1") == b"r0\n"


def test_compressed_produce_round_trips(broker):
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    topic = _topic(broker, "codecs", partitions=len(codecs))
    expected = {}
    for partition, codec in enumerate(codecs):
        lines = [f"{codec} {number} {'x' * 50}".encode() for number in range(200)]
        run_ok("produce", topic, "-b", broker.bootstrap, "--compression", codec, "--acks", "1",
               "--partition", str(partition), stdin=b"\n".join(lines) + b"\n")
        expected[partition] = lines
    output = _consume(broker, topic, "--from-beginning", "-e", "-f", "%p %s\n")
    consumed: dict[int, list[bytes]] = {partition: [] for partition in expected}
    for line in output.splitlines():
        partition, value = line.split(b" ", 1)
        consumed[int(partition)].append(value)
    assert consumed == expected
    for partition, codec in enumerate(codecs):  # the batches on disk really are compressed
        segment = broker.data_dir / f"{topic}-{partition}" / "00000000000000000000.log"
        (report,) = run_json("dump-log", str(segment))
        assert {batch["codec"] for batch in report["batches"]} == {codec}


def test_produce_from_file(broker, tmp_path):
    topic = _topic(broker, "file")
    source = tmp_path / "records.txt"
    source.write_bytes(b"one\r\ntwo\n")
    run_ok("produce", topic, "-b", broker.bootstrap, "--file", str(source))
    described = run_json("topics", "describe", topic, "-b", broker.bootstrap)
    assert described["partitions"][0]["high_offset"] == 2
    assert _consume(broker, topic, "--from-beginning", "-e") == b"one\ntwo\n"


def test_produce_and_consume_user_errors(broker, tmp_path):
    topic = _topic(broker, "perrors")
    bootstrap = ("-b", broker.bootstrap)
    assert_user_error(run("produce", topic, *bootstrap, "--partition", "3", stdin=b"x\n"),
                      "has no partition 3")
    assert_user_error(run("produce", topic, *bootstrap, "--file", str(tmp_path / "absent")),
                      "No such file or directory")
    assert_user_error(run("produce", topic, *bootstrap, "-K", ":", stdin=b"ok:1\nnokey\n"),
                      "line 2 has no key separator")
    assert_user_error(run("produce", topic, *bootstrap, "--header", "novalue", stdin=b"x\n"),
                      "expected key=value")
    assert_user_error(run("consume", unique_topic("absent"), *bootstrap), "unknown topic")
    assert_user_error(run("consume", topic, *bootstrap, "--format", "%z"), "unknown format")
    assert_user_error(run("consume", topic, *bootstrap, "--partition", "5"), "no partition 5")
    assert_user_error(run("consume", topic, *bootstrap, "--offset", "1", "--from-beginning"),
                      "choose one start position")
    assert_user_error(run("consume", topic, *bootstrap, "--timestamp", "yesterday"),
                      "bad --timestamp")
    assert_user_error(run("consume", topic, *bootstrap, "--group", "g", "--offset", "0"),
                      "cannot be used with --group")
    bad_argument = run("consume", topic, *bootstrap, "--max-messages", "many")
    assert bad_argument.returncode != 0 and b"Traceback" not in bad_argument.stderr


@pytest.mark.skipif(JOIN_GROUP_API_KEY not in HANDLERS,
                    reason="the broker has no group coordinator yet (JoinGroup)")
def test_group_consumer_commits_and_resumes(broker):
    topic = _topic(broker, "group")
    group = unique_topic("console-group")
    run_ok("produce", topic, "-b", broker.bootstrap, stdin=b"g0\ng1\ng2\n")
    first = _consume(broker, topic, "--group", group, "--from-beginning", "-n", "2")
    assert first == b"g0\ng1\n"
    rest = _consume(broker, topic, "--group", group, "--from-beginning", "--timeout-ms", "8000")
    assert rest == b"g2\n"
