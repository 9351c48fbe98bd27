"""Subprocess for the cleaner SIGKILL test: opens the log in argv[1] and cleans it over and
over (multi-range, tiny map), printing "cleaning" before the first clean."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headrace.storage.cleaner import Cleaner  # noqa: E402
from headrace.storage.offset_map import OffsetMap  # noqa: E402
from tests.storage.cleaner_workload import NOW_MS, compact_config, open_log  # noqa: E402


def main() -> None:
    log = open_log(Path(sys.argv[1]), compact_config())
    cleaner = Cleaner(OffsetMap(4096), io_chunk_bytes=2048)
    print("cleaning", flush=True)
    while True:
        cleaner.clean(log, 0, NOW_MS)


if __name__ == "__main__":
    main()
