"""Subprocess for the SIGKILL crash test: appends with flush.messages=1 to the log directory
given as argv[1] and prints each acknowledged base offset on stdout."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402
from tests.storage.batches import build_batch  # noqa: E402

NOW_MS = 1_700_000_000_000


def main() -> None:
    path = Path(sys.argv[1])
    log = Log("t", 0, path, LogConfig(flush_messages=1, segment_bytes=4096), RealFileSystem(),
              NOW_MS, recovery_point=0)
    while True:
        offset = log.log_end_offset
        result = log.append(build_batch([b"%d" % offset] * 3), NOW_MS)
        print(result.base_offset, flush=True)


if __name__ == "__main__":
    main()
