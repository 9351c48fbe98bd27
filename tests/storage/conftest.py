"""Fixtures for storage tests: scratch directories under /tmp/storage, a manual clock."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from headrace.storage.clock import ManualClock

SCRATCH_ROOT = Path("/tmp/storage")


@pytest.fixture
def scratch() -> Path:
    SCRATCH_ROOT.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=SCRATCH_ROOT))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
