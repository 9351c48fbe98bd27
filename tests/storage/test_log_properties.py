"""Property test: any interleaving of appends, rolls, reads, retention, DeleteRecords and clean
or unclean (torn) restarts returns exactly what was appended at the offsets assigned, and the
indexes agree with a linear scan."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from headrace.errors import RecordListTooLarge
from headrace.storage.config import LogConfig
from headrace.storage.log import MAX_TIMESTAMP, Log
from tests.record_reading import iter_headers

from .batches import build_batch
from .conftest import SCRATCH_ROOT
from .faulty_fs import CrashingFileSystem
from .helpers import assert_indexes_match_scan, read_all

NOW_MS = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=90, retention_bytes=-1,
                   retention_ms=-1, file_delete_delay_ms=0)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        SCRATCH_ROOT.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(dir=SCRATCH_ROOT))
        self.fs = CrashingFileSystem(random.Random(0))
        self.log = Log("p", 0, self.root / "p-0", CONFIG, self.fs, NOW_MS, clean_shutdown=True)
        self.model: dict[int, bytes] = {}
        self.durable_end = 0

    def teardown(self) -> None:
        self.log.close_without_flush()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
          value_bytes=st.integers(0, 150), skew_ms=st.integers(-500, 500))
    def append(self, sizes, value_bytes, skew_ms):
        batches = [build_batch([b"v" * value_bytes] * n, timestamp_ms=NOW_MS + skew_ms)
                   for n in sizes]
        records = bytearray(b"".join(batches))
        if len(records) > CONFIG.segment_bytes:
            with pytest.raises(RecordListTooLarge):
                self.log.append(records, NOW_MS)
            return
        result = self.log.append(records, NOW_MS)
        offset = result.base_offset
        for batch, n in zip(batches, sizes, strict=True):
            self.model[offset] = (bytes(batch)[8:], offset + n - 1)
            offset += n
        assert offset - 1 == result.last_offset

    @rule()
    def roll(self):
        self.log.roll(NOW_MS)

    @rule()
    def flush(self):
        self.log.flush()
        self.durable_end = self.log.log_end_offset

    @rule(fraction=st.floats(0, 1), max_bytes=st.integers(1, 2000))
    def read(self, fraction, max_bytes):
        start, end = self.log.log_start_offset, self.log.log_end_offset
        offset = start + int((end - start) * fraction)
        result = self.log.read(offset, max_bytes)
        data = b"".join(piece.read_bytes() for piece in result.slices)
        headers = list(iter_headers(data, verify_crc=True))
        if offset < end:
            assert headers and headers[0][1].base_offset <= offset <= headers[0][1].last_offset
            assert len(data) <= max_bytes or len(headers) == 1
        for position, header in headers:
            assert self.model[header.base_offset][0] == data[position + 8 : position + header.size_bytes]

    @rule(fraction=st.floats(0, 1))
    def delete_records(self, fraction):
        start, end = self.log.log_start_offset, self.log.log_end_offset
        self.log.delete_records_before(start + int((end - start) * fraction))
        self.log.delete_old_segments(NOW_MS)
        self.log.remove_deleted_files(NOW_MS)

    @rule(clean=st.booleans())
    def restart(self, clean):
        recovery_point = self.log.recovery_point
        log_start = self.log.log_start_offset
        if clean:
            self.log.close()
            self.durable_end = self.log.log_end_offset
        else:
            self.log.close_without_flush()
            self.fs.crash()
        self.log = Log("p", 0, self.root / "p-0", CONFIG, self.fs, NOW_MS,
                       recovery_point=recovery_point, log_start_offset=log_start,
                       clean_shutdown=clean)
        end = self.log.log_end_offset
        assert end >= self.durable_end
        self.model = {o: b for o, b in self.model.items() if o < end}
        self.durable_end = min(self.durable_end, end)

    @invariant()
    def log_holds_exactly_the_model(self):
        stored = read_all(self.log)
        log_start = self.log.log_start_offset
        expected = [(o, b) for o, (b, last) in sorted(self.model.items()) if last >= log_start]
        assert [(o, b[8:]) for o, b in stored] == expected
        if self.model:
            assert self.log.log_end_offset > max(self.model)
        assert_indexes_match_scan(self.log)
        found = self.log.offset_for_timestamp(MAX_TIMESTAMP)
        assert (found is None) == (self.log.size_bytes == 0)


TestLogProperties = LogMachine.TestCase
TestLogProperties.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
