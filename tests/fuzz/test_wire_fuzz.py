"""The broker survives a few thousand seeded malformed requests (tests/fuzz/wire_cases.py):
it never dies, no handler raises (a traceback in its log fails the test), its memory stays
bounded, and a real client still produces and consumes. A crash or a handler fault is
reported with its seed, case index and frame as hex (also saved under the test's tmp dir);
``bench/fuzz_wire.py --seed S --first-case N --cases 1`` replays it."""

from __future__ import annotations

import random

import pytest

from tests.conftest import _start
from tests.fuzz.recording_proxy import load_client_requests
from tests.fuzz.wire_campaign import FUZZ_BROKER_OVERRIDES, WireCampaign
from tests.fuzz.wire_cases import (
    advertised_versions,
    case_frame,
    kio_encoding,
    mutate,
    recorded_request,
    valid_request,
)

FUZZ_SEED = 1
FUZZ_CASES = 3000
BATCH_CASES = 1000
RSS_LIMIT_BYTES = 512 * 1024 * 1024
MUTATION_SAMPLES = 400
RECORDED_FRAMES_AT_LEAST = 30
RECORDED_EMPTY_BODIES = 2  # ApiVersions v0 (librdkafka's first request)


@pytest.fixture
def fuzz_broker(tmp_path):
    process = _start(tmp_path, FUZZ_BROKER_OVERRIDES)
    yield process
    process.stop()


@pytest.mark.parametrize(("api_key", "api_version"), advertised_versions())
def test_generated_requests_encode_as_kio_does(api_key, api_version):
    for sample in range(3):
        request = valid_request(random.Random(sample), api_key, api_version)
        assert kio_encoding(api_key, api_version, request.frame) == request.frame
        assert all(span.end <= len(request.frame) for span in request.spans)


def test_recorded_client_requests_are_seeds_with_field_spans():
    frames = load_client_requests()
    assert len(frames) >= RECORDED_FRAMES_AT_LEAST  # three clients' produce/consume/commit
    with_body_spans = 0
    for frame in frames:
        request = recorded_request(frame)
        assert request is not None and request.frame == frame
        with_body_spans += any(span.kind in ("count", "length") for span in request.spans)
    assert with_body_spans >= len(frames) - RECORDED_EMPTY_BODIES


def test_cases_replay_from_seed_and_index():
    assert case_frame(FUZZ_SEED, 17) == case_frame(FUZZ_SEED, 17)
    assert case_frame(FUZZ_SEED, 17) != case_frame(FUZZ_SEED + 1, 17)


def test_every_mutation_kind_is_drawn():
    request = valid_request(random.Random(0), 1, 16)  # Fetch v16: flexible, nested arrays
    kinds, unchanged = set(), 0
    for sample in range(MUTATION_SAMPLES):
        names, frame, _ = mutate(random.Random(sample), request)
        unchanged += frame == request.frame  # a byte or int set to the value it had
        kinds.update(names)
    assert unchanged < MUTATION_SAMPLES // 20
    assert kinds >= {"count", "length", "tagged", "int", "truncate", "append", "bitflip",
                     "byte", "api_key", "api_version", "client_id_length", "frame_length"}


def test_broker_survives_seeded_malformed_requests(fuzz_broker, tmp_path):
    campaign = WireCampaign(fuzz_broker, FUZZ_SEED, tmp_path / "findings", RSS_LIMIT_BYTES)
    reports = [campaign.run_batch(first, BATCH_CASES)
               for first in range(0, FUZZ_CASES, BATCH_CASES)]
    crashes = [finding for report in reports for finding in report.findings
               if finding.kind == "crash"]
    assert not crashes, "\n".join(
        f"seed {c.seed} case {c.case} api {c.api_key} v{c.api_version} {c.mutations}: "
        f"{c.detail}\n  frame {c.frame_hex}" for c in crashes)
    handler_faults = [finding for report in reports for finding in report.findings
                      if finding.kind == "handler_exception"]
    assert not handler_faults, "\n".join(
        f"seed {f.seed} case {f.case} api {f.api_key} v{f.api_version} {f.mutations}: "
        f"{f.detail}\n  frame {f.frame_hex}" for f in handler_faults)
    assert all(report.health_ok for report in reports), reports
    answered = sum(report.outcomes.get("answered", 0) for report in reports)
    assert answered > FUZZ_CASES // 10  # most cases are refused, but many reach handlers
