"""``headrace bench produce|consume`` against a live headrace broker (counts, not speed)."""

from __future__ import annotations

from tests.cli.cli_runner import assert_user_error, run, run_json, unique_topic

RECORDS = 3000
RECORD_SIZE_BYTES = 64


def test_bench_produce_then_consume_counts_every_record(broker):
    topic = unique_topic("bench")
    produced = run_json("bench", "produce", topic, "--records", str(RECORDS),
                        "--record-size-bytes", str(RECORD_SIZE_BYTES), "--partitions", "2",
                        "-b", broker.bootstrap)
    assert (produced["records"], produced["bytes"]) == (RECORDS, RECORDS * RECORD_SIZE_BYTES)
    assert produced["records_per_s"] > 0 and produced["mb_per_s"] >= 0
    described = run_json("topics", "describe", topic, "-b", broker.bootstrap)
    assert sum(row["high_offset"] for row in described["partitions"]) == RECORDS

    consumed = run_json("bench", "consume", topic, "-b", broker.bootstrap)
    assert (consumed["records"], consumed["bytes"]) == (RECORDS, RECORDS * RECORD_SIZE_BYTES)


def test_bench_consume_of_missing_topic_is_a_user_error(broker):
    assert_user_error(run("bench", "consume", unique_topic("absent"), "-b", broker.bootstrap),
                      "unknown topic")
