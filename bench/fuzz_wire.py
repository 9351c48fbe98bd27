"""A long wire-fuzzing campaign against a real headrace broker process.

Starts ``headrace broker`` (tests/conftest.py ``BrokerProcess``) on a free loopback port with
its data under ``--dir``, then runs cases ``--first-case`` .. ``--first-case + --cases - 1``
of the campaign seeded ``--seed`` (tests/fuzz/wire_cases.py: valid requests of every API key
and version the broker advertises, mutated at their counts, lengths, varints, tagged fields
and header, truncated, extended, bit-flipped) in batches of ``--batch``. A crashed broker is
restarted and the campaign goes on. Prints one JSON line per batch (outcomes, crashes,
broker RSS, whether confluent-kafka still produces and consumes, findings with their frames
as hex) and a summary line; every finding's frame is also saved as hex under ``--dir``.
Exit status 1 when any crash was found (the goal is 0).

Replay one case: ``--first-case 1234 --cases 1``.

``--record-client-requests`` instead rewrites tests/fuzz/client_requests.txt, the seeds
captured from real clients: confluent-kafka, kafka-python and aiokafka produce and consume
in a group through a recording proxy (tests/fuzz/recording_proxy.py) in front of a broker
that advertises the proxy; the frames of advertised keys and versions are kept, at most
``RECORDED_PER_VERSION`` of each.

    .venv/bin/python bench/fuzz_wire.py --cases 20000 --seed 7 [--batch 500] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import BrokerProcess, free_port  # noqa: E402
from tests.fuzz.recording_proxy import (  # noqa: E402
    CLIENT_REQUESTS_PATH,
    RecordingProxy,
    capture_client_requests,
)
from tests.fuzz.wire_campaign import (  # noqa: E402
    DEFAULT_CASE_TIMEOUT_S,
    DEFAULT_RSS_LIMIT_BYTES,
    FUZZ_BROKER_OVERRIDES,
    WireCampaign,
    report_line,
)
from tests.fuzz.wire_cases import advertised_versions  # noqa: E402

RECORDED_PER_VERSION = 3


def record_client_requests(work_dir: Path) -> int:
    proxy_port = free_port()
    data_dir = work_dir / "record-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(data_dir, {**FUZZ_BROKER_OVERRIDES,
                                      "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"})
    broker.start()
    proxy = RecordingProxy(proxy_port, broker.port)
    try:
        capture_client_requests(f"127.0.0.1:{proxy_port}")
    finally:
        proxy.close()
        broker.stop()
    kept: dict[tuple[int, int], list[bytes]] = {}
    for frame in proxy.frames:
        api_key, api_version = struct.unpack_from(">hh", frame, 4)
        if (api_key, api_version) in set(advertised_versions()):
            same = kept.setdefault((api_key, api_version), [])
            if len(same) < RECORDED_PER_VERSION and frame not in same:
                same.append(frame)
    lines = [frame.hex() for _, frames in sorted(kept.items()) for frame in frames]
    CLIENT_REQUESTS_PATH.write_text("\n".join(lines) + "\n")
    print(json.dumps({"recorded": len(proxy.frames), "kept": len(lines),
                      "versions": sorted(kept), "path": str(CLIENT_REQUESTS_PATH)}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record-client-requests", action="store_true")
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first-case", type=int, default=0)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None, help="broker data and findings")
    parser.add_argument("--rss-limit-bytes", type=int, default=DEFAULT_RSS_LIMIT_BYTES)
    parser.add_argument("--case-timeout-s", type=float, default=DEFAULT_CASE_TIMEOUT_S)
    args = parser.parse_args()
    work_dir = args.dir or Path(tempfile.mkdtemp(prefix="fuzz-wire-"))
    if args.record_client_requests:
        return record_client_requests(work_dir)
    data_dir = work_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(data_dir, FUZZ_BROKER_OVERRIDES)
    broker.start()
    started = time.monotonic()
    totals = {"cases": 0, "crashes": 0, "unhealthy_batches": 0, "findings": 0}
    try:
        campaign = WireCampaign(broker, args.seed, work_dir / "findings", args.rss_limit_bytes,
                                args.case_timeout_s)
        end = args.first_case + args.cases
        for first in range(args.first_case, end, args.batch):
            report = campaign.run_batch(first, min(args.batch, end - first))
            print(report_line(report), flush=True)
            totals["cases"] += report.cases
            totals["crashes"] += report.crashes
            totals["findings"] += len(report.findings)
            totals["unhealthy_batches"] += not report.health_ok
    finally:
        broker.stop()
    print(json.dumps({"summary": True, "seed": args.seed, **totals,
                      "seconds": round(time.monotonic() - started, 1),
                      "findings_dir": str(work_dir / "findings")}), flush=True)
    return 1 if totals["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
