"""How a process's open files limit is shared out between its listeners (`pigeon.node.descriptors`)."""

from __future__ import annotations

from pigeon.node.descriptors import RESERVED, share


def test_caps_that_fit_under_the_limit_are_kept_as_configured_without_a_word() -> None:
    shares = share(65536, 2000, 1000)
    assert (shares.smtp, shares.http, shares.warning) == (2000, 1000, None)
    assert share(2000 + 1000 + RESERVED, 2000, 1000).warning is None


def test_below_the_limit_http_gets_an_eighth_of_the_room_and_smtp_the_rest_leaving_the_reserve() -> None:
    shares = share(1024, 2000, 1000)
    assert (shares.smtp, shares.http) == (672, 96)
    assert shares.smtp + shares.http + RESERVED <= 1024
    assert shares.warning is not None
    assert "the limit (RLIMIT_NOFILE) is 1024, below [smtp] max_connections (2000) + [http] max_connections (1000)" in (
        shares.warning
    )
    assert "keeps to 672 SMTP and 96 HTTP connections" in shares.warning
    assert "LimitNOFILE=" in shares.warning


def test_a_small_http_cap_leaves_smtp_all_the_rest() -> None:
    shares = share(1024, 2000, 50)
    assert (shares.smtp, shares.http) == (1024 - RESERVED - 50, 50)


def test_a_process_with_one_listener_gives_it_all_the_room() -> None:
    supervisor = share(1024, 0, 1000)
    assert (supervisor.smtp, supervisor.http) == (0, 1024 - RESERVED)
    assert supervisor.warning is not None and "[smtp]" not in supervisor.warning and "SMTP" not in supervisor.warning
    worker = share(1024, 2000, 0)
    assert (worker.smtp, worker.http) == (1024 - RESERVED, 0)


def test_however_low_the_limit_each_listener_keeps_a_few_connections() -> None:
    shares = share(100, 2000, 1000)
    assert (shares.smtp, shares.http) == (16, 16)
