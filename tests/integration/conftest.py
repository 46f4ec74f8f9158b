from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess


@pytest.fixture
def pigeon(tmp_path: Path) -> Iterator[PigeonProcess]:
    """A Pigeon node with the test defaults: one worker, loopback may relay."""
    with PigeonProcess(tmp_path / "node") as node:
        yield node
