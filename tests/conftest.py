"""Fixtures every test directory may use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import Dovecot, Postgres, RedisServer

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
