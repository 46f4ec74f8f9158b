"""`pigeon inject`'s exit status tells a script whether trying again can help."""

from __future__ import annotations

from pigeon.cli.inject import NOPERM, TEMPFAIL, USAGE, exit_status, failure_status


def _answer(*errors: str | None) -> dict[str, object]:
    recipients = [{"email": f"r{n}@example.net", **({"error": e} if e else {"id": "0123456789abcdef"})}
                  for n, e in enumerate(errors)]  # fmt: skip
    return {"accepted": errors.count(None), "failed": len(errors) - errors.count(None), "recipients": recipients}


def test_every_recipient_accepted_exits_0() -> None:
    assert exit_status(200, _answer(None, None)) == 0


def test_refused_only_for_now_exits_75_so_a_script_tries_again() -> None:
    assert exit_status(503, _answer("451 4.3.0 spool busy", "451 4.3.0 spool busy")) == TEMPFAIL == 75


def test_some_accepted_and_the_rest_refused_for_now_exits_1_as_running_it_again_would_send_twice() -> None:
    assert exit_status(200, _answer(None, "451 4.7.1 policy: later")) == 1


def test_any_recipient_refused_for_good_exits_1() -> None:
    assert exit_status(422, _answer("554 5.6.0 template: 'code' is undefined")) == 1
    assert exit_status(200, _answer(None, "451 4.3.0 later", "550 5.7.1 no")) == 1


def test_a_refused_token_exits_77_ex_noperm() -> None:
    assert failure_status(401) == failure_status(403) == NOPERM == 77


def test_a_busy_or_failing_node_exits_75_so_a_script_tries_again() -> None:
    assert {failure_status(status) for status in (429, 500, 502, 503, 504)} == {TEMPFAIL}


def test_a_malformed_request_exits_2() -> None:
    assert {failure_status(status) for status in (400, 404, 413)} == {USAGE} == {2}
