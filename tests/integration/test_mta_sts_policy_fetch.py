"""Fetching MTA-STS policies (`PolicyStore`) against a DNS server and an HTTPS server on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pigeon.delivery.mta_sts import Mode
from pigeon.delivery.mta_sts_store import PolicyStore
from pigeon.delivery.mx import Resolver
from tests.support.dns import DnsServer, Zone
from tests.support.mta_sts import PolicyServer, TestCa

_ENFORCE = "version: STSv1\nmode: enforce\nmx: mx1.example.net\nmax_age: 86400\n"


def _zone() -> Zone:
    return Zone({"_mta-sts.example.net": [("TXT", "v=STSv1; id=1;")], "mta-sts.example.net": [("A", "127.0.0.1")]})


async def test_many_messages_for_one_domain_cause_one_fetch_and_the_policy_is_kept_on_disk(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    with (
        DnsServer(_zone()) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as server,
    ):
        resolver = Resolver([(dns.address, dns.port)], timeout=1.0)
        store = PolicyStore(resolver, ca_file=ca.path, https_port=server.port, directory=tmp_path / "spool")
        applied = await asyncio.gather(*(store.policy("example.net") for _ in range(50)))
        assert {a.policy.mode if a else None for a in applied} == {Mode.ENFORCE}
        assert server.requests == ["mta-sts.example.net"]
    kept = json.loads((tmp_path / "spool" / "mta-sts-0.json").read_text())
    assert kept["policies"]["example.net"]["id"] == "1"
    assert kept["policies"]["example.net"]["policy"] == _ENFORCE


@pytest.mark.parametrize(
    ("served", "why"),
    [
        ("version: STSv1\nmode: enforce\nmax_age: 86400\n", "mode enforce and no mx"),
        (None, "answered HTTP 404"),
    ],
)
async def test_a_bad_policy_is_no_policy_and_a_warning_names_the_domain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, served: str | None, why: str
) -> None:
    ca = TestCa(tmp_path / "ca")
    policies = {"mta-sts.example.net": served} if served is not None else {}
    with (
        DnsServer(_zone()) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), policies) as server,
        caplog.at_level(logging.WARNING),
    ):
        resolver = Resolver([(dns.address, dns.port)], timeout=1.0)
        store = PolicyStore(resolver, ca_file=ca.path, https_port=server.port)
        assert await store.policy("example.net") is None
        assert await store.policy("example.net") is None  # (not fetched again at once)
        assert len(server.requests) == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("example.net: no MTA-STS policy applied: ") and why in warning


async def test_a_new_id_that_cannot_be_fetched_warns_that_the_cached_policy_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Found from outside: the WARNING said "no MTA-STS policy applied" while the policy kept
    # (id 1) was, rightly, still enforced.
    ca = TestCa(tmp_path / "ca")
    served = {"mta-sts.example.net": _ENFORCE}
    with DnsServer(_zone()) as dns, PolicyServer(ca.server_context("mta-sts.example.net"), served) as server:
        first = PolicyStore(Resolver([(dns.address, dns.port)], timeout=1.0), ca_file=ca.path,
                            https_port=server.port, directory=tmp_path / "spool")  # fmt: skip
        assert (await first.policy("example.net")) is not None
        dns.zone.records["_mta-sts.example.net"] = [("TXT", "v=STSv1; id=2;")]
        served.clear()  # id 2 is answered 404
        again = PolicyStore(Resolver([(dns.address, dns.port)], timeout=1.0), ca_file=ca.path,
                            https_port=server.port, directory=tmp_path / "spool")  # fmt: skip
        with caplog.at_level(logging.WARNING):
            applied = await again.policy("example.net")
    assert applied is not None and applied.policy_id == "1"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("example.net: its MTA-STS policy (id 2) could not be had: ")
    assert "answered HTTP 404" in warning
    assert "; keeping its cached policy (id 1, mode enforce, until 20" in warning
    assert "no MTA-STS policy applied" not in warning


async def test_a_policy_host_whose_certificate_does_not_verify_gives_no_policy(tmp_path: Path) -> None:
    ca, stranger = TestCa(tmp_path / "ca"), TestCa(tmp_path / "other", "Another CA")
    with (
        DnsServer(_zone()) as dns,
        PolicyServer(stranger.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as server,
    ):
        resolver = Resolver([(dns.address, dns.port)], timeout=1.0)
        store = PolicyStore(resolver, ca_file=ca.path, https_port=server.port)
        assert await store.policy("example.net") is None


async def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {within}s")


async def test_a_policy_in_use_is_refreshed_in_the_background_and_outlives_its_server_going_down(
    tmp_path: Path,
) -> None:
    # RFC 8461 10.2: a policy fetched only once it had expired left a domain without one when its
    # policy server was down just then (a downgrade window), and a policy that a message used
    # the day before its expiry was not renewed.
    ca = TestCa(tmp_path / "ca")
    now = [1_000_000.0]
    served = {"mta-sts.example.net": _ENFORCE}  # max_age 86400: refreshed once 12 hours old
    with DnsServer(_zone()) as dns, PolicyServer(ca.server_context("mta-sts.example.net"), served) as server:
        store = PolicyStore(Resolver([(dns.address, dns.port)], timeout=1.0), ca_file=ca.path,
                            https_port=server.port, directory=tmp_path / "spool", clock=lambda: now[0])  # fmt: skip
        assert (await store.policy("example.net")) is not None
        now[0] += 11 * 3600
        assert (await store.policy("example.net")) is not None
        assert server.requests == ["mta-sts.example.net"]  # (not yet due)
        now[0] += 2 * 3600
        server.delay = 2.0
        started = time.monotonic()
        applied = await asyncio.gather(*(store.policy("example.net") for _ in range(20)))
        assert time.monotonic() - started < 1.0  # the cached policy, at once: the refresh is not waited for
        assert {a.policy_id if a else None for a in applied} == {"1"}
        await _until(lambda: len(server.requests) == 2)  # one refresh, however many messages
        kept = tmp_path / "spool" / "mta-sts-0.json"
        await _until(lambda: json.loads(kept.read_text())["policies"]["example.net"]["fetched"] == now[0])  # on disk
        # The policy server goes down; the policy as fetched first would have expired by now.
        served.clear()
        now[0] += 12 * 3600
        applied_late = await store.policy("example.net")
        assert applied_late is not None and applied_late.enforced and applied_late.policy_id == "1"


async def test_a_refresh_that_fails_keeps_the_cached_policy_until_it_expires(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = TestCa(tmp_path / "ca")
    now = [1_000_000.0]
    served = {"mta-sts.example.net": _ENFORCE}
    with DnsServer(_zone()) as dns, PolicyServer(ca.server_context("mta-sts.example.net"), served) as server:
        store = PolicyStore(Resolver([(dns.address, dns.port)], timeout=1.0), ca_file=ca.path,
                            https_port=server.port, clock=lambda: now[0])  # fmt: skip
        assert (await store.policy("example.net")) is not None
        served.clear()  # answered 404 from now on
        now[0] += 20 * 3600
        with caplog.at_level(logging.WARNING):
            assert (await store.policy("example.net")) is not None
            await _until(lambda: any(r.levelno == logging.WARNING for r in caplog.records))
            assert (await store.policy("example.net")) is not None
        assert len(server.requests) == 2  # (a failed refresh is not tried again at once)
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.startswith("example.net: its MTA-STS policy (id 1) could not be had: ")
        assert "; keeping its cached policy (id 1, mode enforce, until " in warning
        now[0] += 4 * 3600 + 1  # past its max_age: fetched while waiting, which fails: no policy
        assert (await store.policy("example.net")) is None


async def test_a_worker_takes_in_what_its_sibling_fetched_at_its_next_look_once_a_second(tmp_path: Path) -> None:
    # Two workers' stores on one spool: the policy one fetched is the other's once it looks at
    # its sibling's file again (SIBLINGS_EVERY), not at every message, and the record stripped
    # for the other (which never asked) does not leave it without the policy.
    ca = TestCa(tmp_path / "ca")
    monotonic = [100.0]
    with (
        DnsServer(_zone()) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as server,
    ):

        def store(worker: int) -> PolicyStore:
            return PolicyStore(Resolver([(dns.address, dns.port)], timeout=1.0), ca_file=ca.path,
                               https_port=server.port, directory=tmp_path / "spool", worker=worker, workers=2,
                               monotonic=lambda: monotonic[0])  # fmt: skip

        first, second = store(0), store(1)
        assert await second.policy("example.org") is None  # (a look: no sibling has a file yet)
        fetched = await first.policy("example.net")
        assert fetched is not None and fetched.policy_id == "1"
        del dns.zone.records["_mta-sts.example.net"]  # stripped, as `second` asks for it
        assert await second.policy("example.net") is None  # within a second of its last look
        monotonic[0] += 1.0
        applied = await second.policy("example.net")
        assert applied is not None and applied.enforced and applied.policy_id == "1"
        assert server.requests == ["mta-sts.example.net"]
