"""The ``driver`` fixture: a fresh GroupCoordinator behind a Driver (see coordinator_driver)."""

import pytest
from coordinator_driver import Driver


@pytest.fixture
def driver() -> Driver:
    return Driver()
