"""Fixtures every test directory may use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from hypothesis import settings

from tests.support import zygote
from tests.support.services import Dovecot, Postgres, RedisServer, reachable

# No per-example deadline: on a machine whose cores are all busy (the suite's 4 workers on 2
# cores, CI), an example that takes 2 ms alone takes 200 some day, and that says nothing of the
# code. Tests that bound time measure CPU time themselves (test_text_from_others_in_linear_time).
settings.register_profile("pigeon", deadline=None)
settings.load_profile("pigeon")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test a stale build: a module that mypyc compiled (setup.py) is imported from
    its build, not its source, so an edit made since the build would go untested."""
    import pigeon

    package = Path(pigeon.__file__).parent
    stale = [
        str(source.relative_to(package.parent))
        for built in package.rglob("*.so")
        if (source := built.with_name(built.name.split(".", 1)[0] + ".py")).exists()
        and source.stat().st_mtime > built.stat().st_mtime
    ]
    if stale:
        pytest.exit(f"built before their last edit: {', '.join(stale)}; run ./scripts/test (it rebuilds them)", 4)


@pytest.hookimpl(tryfirst=True)  # (before xdist's own, which reads the groups)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In a parallel run (pytest-xdist, as ./scripts/test runs the suite), the long tests start
    first, the longest first: the minutes they take then overlap the many short tests instead
    of running alone at the end. Long are those that declare a longer timeout than the default,
    then those `_LONG` names. Each worker collects and sorts alike; they are handed out one by
    one in this order (--dist loadgroup), but for the tests of a module that share a fixture
    of module (or class) scope, such as one node they all ask things of: those go to one worker
    together, or each worker would start that node for its share of them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: (-_declared_timeout(item), -_LONG.get(item.nodeid.partition("[")[0], 0)))
        for item in items:
            if _shares_a_fixture(item):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.partition("::")[0]))


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in ("module", "class", "package") for definitions in info.name2fixturedefs.values()
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With PIGEON_TEST_CPU=DIR, each test's CPU seconds (the test process's own, and its
    children's: the Pigeon nodes, sinks and servers it started and reaped) and wall seconds,
    a line per test in DIR/<worker>.tsv: the suite is bound by two cores' CPU, not by its
    waits, so this, not --durations, says which tests make it long."""
    into = os.environ.get("PIGEON_TEST_CPU")
    if not into:
        yield
        return
    import resource
    import time

    def cpu(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    def reaped() -> float:  # the zygote's forks are its children, not this process's
        return cpu(resource.RUSAGE_CHILDREN) + zygote.reaped_cpu()

    own, children, started = cpu(resource.RUSAGE_SELF), reaped(), time.monotonic()
    yield
    own, children = cpu(resource.RUSAGE_SELF) - own, reaped() - children
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(into) / f"{worker}.tsv", "a", encoding="utf-8") as out:
        out.write(f"{item.nodeid}\t{own:.2f}\t{children:.2f}\t{time.monotonic() - started:.2f}\n")


def _declared_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker is not None and marker.args else 0.0


# Tests (each case of them) that took 10 s or more in a default run but declare no longer
# timeout, with the seconds one took there (2 cores, 4 workers). Started late, one of them
# alone made the run's last half minute. A renamed test only loses its place in the order.
_LONG: Final[dict[str, float]] = {
    "tests/unit/queue/test_interleavings.py::test_every_order_of_two_messages_bounce_and_suspend": 33,
    "tests/integration/test_worker_timeout.py::"
    "test_a_bulk_bounce_that_takes_longer_than_worker_timeout_answers_200_when_done": 26,
    "tests/integration/test_worker_timeout.py::"
    "test_a_worker_stopped_during_a_bulk_bounce_is_reported_missing_and_the_cli_exits_75": 19,
    "tests/integration/test_inbound.py::test_a_redis_outage_mid_batch_is_logged_once_and_its_end_too": 18,
    "tests/integration/test_inbound_imap_return.py::"
    "test_health_recovers_within_5s_of_dovecot_coming_back_and_mail_is_drained_once": 11,
    "tests/unit/queue/test_interleavings_sites.py::"
    "test_every_order_of_one_message_to_a_site_that_goes_down_and_comes_back": 14,
    "tests/integration/test_cli.py::test_admin_commands_bounce_suspend_resume_retry_and_inspect": 12,
    "tests/integration/test_cli.py::test_queue_summary_names_who_suspended_a_queue_and_a_bad_duration_exits_2": 12,
}


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
    """One initdb per session (~0.5 s) that each test's cluster copies (~0.05 s). Made outside
    pytest's tree (`reachable`), as the servers' own files are: a pytest session starting
    meanwhile takes back the search permission the postgres user needs there."""
    return Postgres.initdb(
        reachable(tmp_path_factory.mktemp("postgres-template") / "cluster", "postgres-template") / "data"
    )


@pytest.fixture
def postgres(tmp_path: Path, postgres_template: Path) -> Iterator[Postgres]:
    """A private PostgreSQL cluster per test (function scope: a test may kill or fill it without
    touching the next one); copying a session-wide initdb makes that cost ~0.2 s a test."""
    with Postgres(tmp_path / "postgres", template=postgres_template) as server:
        yield server
