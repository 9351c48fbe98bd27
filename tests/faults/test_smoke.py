"""One short seeded fault run of each nemesis against a real broker, checked by the workload's
checker (``headrace/faults/runner.py``): nothing acknowledged is lost, duplicated by an
idempotent producer, or seen at two offsets, and no consumer goes back or skips.

Flush per record (log.flush.interval.messages=1) throughout, so power cuts too must keep every
acknowledged record; ``bench/faults.py`` runs the long campaigns. A failing run's history and
broker log are kept under ``$HEADRACE_FAULTS_FAILURES`` (default /tmp/headrace-faults-failures/,
outside pytest's tmp dirs, which later sessions rotate away) and the failure message holds the
path and the replay command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from headrace.faults.namespace import missing_tools
from headrace.faults.node import libfaketime_path
from headrace.faults.runner import RunConfig, run

SMOKE_DURATION_S = 4.0
FAILURES_DIR = Path(os.environ.get("HEADRACE_FAULTS_FAILURES", "/tmp/headrace-faults-failures"))


def run_and_check(tmp_path, config: RunConfig) -> dict:
    result = run(config, tmp_path / "run", failures_dir=FAILURES_DIR / tmp_path.name)
    summary = result.summary()
    assert result.valid, json.dumps(summary)
    assert summary["acked"] > 0, json.dumps(summary)
    assert sum(summary["faults"].values()) >= 1, summary
    assert set(summary["faults"]) <= set(config.nemeses), summary
    return summary


@pytest.mark.parametrize("kind", ["kill", "pause", "power"])
def test_a_seeded_run_of_each_process_and_power_fault_finds_no_anomaly(tmp_path, kind):
    run_and_check(tmp_path, RunConfig(seed=11, nemeses=(kind,), duration_s=SMOKE_DURATION_S))


@pytest.mark.required_where("faketime")
def test_a_seeded_run_with_clock_skew_finds_no_anomaly(tmp_path):
    if libfaketime_path() is None:
        pytest.skip("libfaketime not installed (Debian package faketime)")
    run_and_check(tmp_path, RunConfig(seed=12, nemeses=("clock",), duration_s=SMOKE_DURATION_S))


@pytest.mark.required_where("netns")
def test_a_seeded_run_with_network_partitions_finds_no_anomaly(tmp_path):
    if missing_tools():
        pytest.skip(f"network namespaces need {', '.join(missing_tools())}")
    run_and_check(tmp_path, RunConfig(seed=13, nemeses=("partition",),
                                      duration_s=SMOKE_DURATION_S))


def test_a_seeded_list_append_run_with_kills_and_power_cuts_finds_no_anomaly(tmp_path):
    run_and_check(tmp_path, RunConfig(seed=14, nemeses=("kill", "power"), workload="list-append",
                                      duration_s=SMOKE_DURATION_S))


def test_power_cuts_find_lost_writes_when_segment_fsyncs_are_dropped(tmp_path):
    """The harness has teeth: with the broker's .log fsyncs turned into no-ops, flush per
    record no longer makes acknowledged records durable, and a power cut loses some."""
    result = run(RunConfig(seed=15, nemeses=("power",), duration_s=SMOKE_DURATION_S,
                           drop_segment_fsyncs=True), tmp_path / "run")
    assert result.counts["lost"] > 0, json.dumps(result.summary())
    assert (tmp_path / "run" / "failed" / "seed-15" / "history.jsonl").exists()


def test_a_seeded_transactional_run_with_kills_finds_no_aborted_read_or_cycle(tmp_path):
    """One node (the transaction coordinator is single-node): transactions committed and
    aborted around kills; read_committed consumers never see an aborted value (G1a), the
    transactions' reads and writes form no cycle (G1c), the drain holds every commit."""
    summary = run_and_check(tmp_path, RunConfig(seed=16, nemeses=("kill",),
                                                workload="transactional",
                                                duration_s=SMOKE_DURATION_S * 2))
    assert (summary["g1a"], summary["g1c"]) == (0, 0), summary
