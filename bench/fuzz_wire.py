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

    .venv/bin/python bench/fuzz_wire.py --cases 20000 --seed 7 [--batch 500] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import BrokerProcess  # noqa: E402
from tests.fuzz.wire_campaign import (  # noqa: E402
    DEFAULT_CASE_TIMEOUT_S,
    DEFAULT_RSS_LIMIT_BYTES,
    FUZZ_BROKER_OVERRIDES,
    WireCampaign,
    report_line,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first-case", type=int, default=0)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None, help="broker data and findings")
    parser.add_argument("--rss-limit-bytes", type=int, default=DEFAULT_RSS_LIMIT_BYTES)
    parser.add_argument("--case-timeout-s", type=float, default=DEFAULT_CASE_TIMEOUT_S)
    args = parser.parse_args()
    work_dir = args.dir or Path(tempfile.mkdtemp(prefix="fuzz-wire-"))
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
