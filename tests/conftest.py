"""Fixtures every test directory may use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import Dovecot, Postgres, RedisServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In a parallel run (pytest-xdist, as ./scripts/test runs the suite), the tests that declare
    a longer timeout than the default start first, the longest first: the minutes they take
    then overlap the many short tests instead of running alone at the end. Each worker
    collects and sorts alike; with --maxschedchunk=1 (pyproject.toml) they are handed out
    one by one in this order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: -_declared_timeout(item))


def _declared_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker is not None and marker.args else 0.0


# --- Real peer servers (tests/support/services.py) ---------------------------------------------
# Each fixture's server is private to the test and stopped when it ends, even if it failed.


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server on a free loopback port, no persistence (restart loses the data)."""
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def dovecot(tmp_path: Path) -> Iterator[Dovecot]:
    """A private Dovecot IMAP server with one user, app/secret (IMAP + STARTTLS, and IMAPS)."""
    with Dovecot(tmp_path / "dovecot") as server:
        yield server


@pytest.fixture(scope="session")
def postgres_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One initdb per session (~0.5 s) that each test's cluster copies (~0.05 s)."""
    return Postgres.initdb(tmp_path_factory.mktemp("postgres-template") / "data")


@pytest.fixture
def postgres(tmp_path: Path, postgres_template: Path) -> Iterator[Postgres]:
    """A private PostgreSQL cluster per test (function scope: a test may kill or fill it without
    touching the next one); copying a session-wide initdb makes that cost ~0.2 s a test."""
    with Postgres(tmp_path / "postgres", template=postgres_template) as server:
        yield server
