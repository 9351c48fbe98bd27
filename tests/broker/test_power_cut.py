"""Power cuts on a real broker, its production append path intact (``tests/power_cut.py``): a
confluent-kafka producer (acks=all) records what was acknowledged, the power is cut at a
seeded moment (SIGKILL, then only what was fsynced is kept, with a seeded torn tail of the
rest), the broker restarts on what is left and the partition is read back.

With flush.messages=1 every acknowledged record survives at its offset; with the default
flush policy the log is a prefix of what was produced (never a hole), and records produced
after recovery follow it at the next offsets (a torn tail was cut off, not appended after). A run whose shim turns
the segment files' fsyncs into no-ops must lose acknowledged records: the simulation has teeth.
"""

from __future__ import annotations

import pytest

from tests.power_cut import build_shim, cut_and_recover, log_anomalies, lost_acknowledged

RECORDS_AFTER_RECOVERY = 20
FLUSH_EVERY_RECORD = {"log.flush.interval.messages": "1"}


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return build_shim(tmp_path_factory.mktemp("power-cut-shim"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_acknowledged_record_survives_a_power_cut_with_flush_per_record(
        tmp_path, shim, seed):
    run = cut_and_recover(tmp_path, shim, seed, FLUSH_EVERY_RECORD,
                          records_after_recovery=RECORDS_AFTER_RECOVERY)
    assert run.acknowledged, "the cut came before any acknowledgement"
    assert lost_acknowledged(run.acknowledged, run.stored) == []
    assert log_anomalies(run.stored, run.appended) == []


@pytest.mark.parametrize("seed", [11, 12])
def test_default_flush_policy_loses_only_an_unsynced_suffix(tmp_path, shim, seed):
    run = cut_and_recover(tmp_path, shim, seed, {},
                          records_after_recovery=RECORDS_AFTER_RECOVERY)
    assert run.outcome.dropped_bytes > 0, "the cut dropped nothing: nothing was tested"
    assert run.outcome.torn_tail_bytes > 0, "no torn tail: recovery's truncation untested"
    assert log_anomalies(run.stored, run.appended) == []


def test_power_cut_loses_acknowledged_records_when_segment_fsyncs_are_dropped(tmp_path, shim):
    run = cut_and_recover(tmp_path, shim, 5, FLUSH_EVERY_RECORD, drop_fsync_suffix=".log",
                          torn_tails=False)
    assert run.acknowledged
    assert lost_acknowledged(run.acknowledged, run.stored) != []
