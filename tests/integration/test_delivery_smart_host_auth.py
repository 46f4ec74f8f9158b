"""Relaying through a smart host that requires SMTP AUTH: a `[[route]]` with `next_hop` and
`auth_username`, on port 587 (STARTTLS, then AUTH) or 465 (implicit TLS), against a real server
(aiosmtpd with AUTH, or a scripted one) on loopback.

What a user sees is asserted: what the smart host received and who it authenticated, the
records (`auth_user`, a `TransientFailure` that says why, never a `Bounce`), the WARNING, and
that the password is nowhere in the node's output, its log records or `pigeon serve --check`.
"""

from __future__ import annotations

import smtplib
import ssl
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.integration.test_cli import pigeon_cli
from tests.integration.test_reload import _hangup
from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, ScriptedSink, delivery_config

PASSWORD = "c0rrect-h0rse-Battery"
WRONG = "wr0ng-Passw0rd-Staple"
MESSAGE = b"From: <sender@example.org>\r\nSubject: via the smart host\r\n\r\nHello.\r\n"


def _context(directory: Path) -> ssl.SSLContext:
    certificate, key = ensure_self_signed(directory, "relay.test")
    return server_context(certificate, key)


def _node(tmp_path: Path, sink: Any, **route: Any) -> PigeonProcess:
    (tmp_path / "relay-password").write_text(route.pop("password", PASSWORD) + "\n")
    config = delivery_config(sink.endpoint)
    config["route"] = [
        {
            "domain": "*",
            "next_hop": sink.endpoint,
            "tls": "required",
            "auth_username": "alice",
            "auth_password_file": str(tmp_path / "relay-password"),
        }
        | route
    ]
    return PigeonProcess(tmp_path / "node", **config)


def _peer(sink: Any) -> str:
    return f"[{sink.host}]:{sink.port}"  # as records name a next hop given as an address


def _send(pigeon: PigeonProcess, *recipients: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("sender@example.org", list(recipients or ["bob@example.net"]), MESSAGE)


def _everything_written(pigeon: PigeonProcess) -> str:
    """The node's output and every log file it wrote (records, as they are on disk)."""
    files = [p for p in (pigeon.root / "log").rglob("*") if p.is_file() and not p.name.endswith(".gz")]
    return pigeon.stderr() + "".join(p.read_text(errors="replace") for p in files)


def test_starttls_then_auth_plain_delivers_and_the_records_name_the_user(tmp_path: Path) -> None:
    with (
        ScriptedSink(tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink,
        _node(tmp_path, sink) as pigeon,
    ):
        # Each message once the one before is delivered: it goes on the connection left idle
        # (one sent meanwhile may open a second, whose AUTH could still be on its way).
        for n in range(3):
            _send(pigeon, f"bob{n}@example.net")
            deliveries = pigeon.wait_records("Delivery", n + 1)
        written = _everything_written(pigeon)
    assert [(r.auth_user, r.tls) for r in sink.received] == [("alice", True)] * 3
    carried_mail = [c for c in sink.connections if c.helo]  # (not the sink's own readiness probe)
    assert len(carried_mail) == 1
    assert sink.auth_attempts == [("PLAIN", "alice", True)]  # AUTH once a connection, not once a message
    assert all(record["auth_user"] == "alice" and record["tls"] for record in deliveries)
    assert PASSWORD not in written


def test_auth_login_is_used_when_the_route_asks_for_it(tmp_path: Path) -> None:
    with (
        ScriptedSink(tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink,
        _node(tmp_path, sink, auth_mechanisms=["LOGIN"]) as pigeon,
    ):
        _send(pigeon)
        (delivery,) = pigeon.wait_records("Delivery")
    assert sink.auth_attempts == [("LOGIN", "alice", True)]
    assert delivery["auth_user"] == "alice" and sink.received[0].auth_user == "alice"


def test_implicit_tls_on_465_then_auth_delivers(tmp_path: Path) -> None:
    with (
        ScriptedSink(implicit_tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink,
        _node(tmp_path, sink, tls="implicit") as pigeon,
    ):
        _send(pigeon)
        (delivery,) = pigeon.wait_records("Delivery")
    assert sink.auth_attempts == [("PLAIN", "alice", True)]
    assert delivery["auth_user"] == "alice"
    assert "TLSv1" in delivery["tls"] and delivery["tls"].endswith("certificate not verified")


def test_a_wrong_password_defers_never_bounces_and_a_fixed_file_and_sighup_deliver(tmp_path: Path) -> None:
    with (
        ScriptedSink(tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink,
        _node(tmp_path, sink, password=WRONG) as pigeon,
    ):
        _send(pigeon)
        failure, *_ = pigeon.wait_records("TransientFailure")
        response = failure["response"]
        assert (response["code"], response["enhanced"]) == (451, "4.7.8")
        assert response["text"].startswith(f"authentication as alice failed: {_peer(sink)} answered")
        assert response["text"].endswith("answered AUTH PLAIN with: 535 5.7.8 Authentication credentials invalid")
        assert "auth_user" not in failure  # the connection did not authenticate
        assert not pigeon.records("Bounce") and not sink.received
        warning = pigeon.wait_stderr("authentication as alice failed")
        assert "WARNING" in warning and "[[route]] '*'" in warning and _peer(sink) in warning

        (tmp_path / "relay-password").write_text(PASSWORD + "\n")
        _hangup(pigeon, "reloaded:")
        (delivery,) = pigeon.wait_records("Delivery", timeout=20)
        written = _everything_written(pigeon)
    assert delivery["auth_user"] == "alice" and [r.auth_user for r in sink.received] == ["alice"]
    assert WRONG not in written and PASSWORD not in written
    assert (False in [taken for *_, taken in sink.auth_attempts]) and sink.auth_attempts[-1][2]


def test_a_server_that_does_not_offer_auth_defers_saying_so(tmp_path: Path) -> None:
    with (
        AnswerSink(extensions=("PIPELINING",)) as sink,
        _node(tmp_path, sink, tls="disabled", allow_plaintext_auth=True) as pigeon,
    ):
        _send(pigeon)
        failure, *_ = pigeon.wait_records("TransientFailure")
        assert not pigeon.records("Bounce")
    assert failure["response"]["text"] == f"authentication as alice failed: {_peer(sink)} does not offer AUTH"
    assert not any(command.startswith(("AUTH", "MAIL")) for command in sink.commands)


def test_an_opportunistic_route_whose_starttls_fails_sends_no_auth_in_the_clear(tmp_path: Path) -> None:
    with (
        AnswerSink(extensions=("PIPELINING", "STARTTLS", "AUTH PLAIN LOGIN")) as sink,
        _node(tmp_path, sink, tls="opportunistic") as pigeon,
    ):
        _send(pigeon)
        failure, *_ = pigeon.wait_records("TransientFailure")
        assert not pigeon.records("Bounce")
        written = _everything_written(pigeon)
    assert failure["response"]["text"].startswith(f"TLS handshake with {_peer(sink)} failed")
    assert not any(command.startswith(("AUTH", "MAIL")) for command in sink.commands), sink.commands
    assert PASSWORD not in written


def test_an_opportunistic_route_to_a_server_without_starttls_says_so_and_not_to_change_the_password(
    tmp_path: Path,
) -> None:
    with (
        AnswerSink(extensions=("PIPELINING", "AUTH PLAIN LOGIN")) as sink,
        _node(tmp_path, sink, tls="opportunistic") as pigeon,
    ):
        _send(pigeon)
        failure, *_ = pigeon.wait_records("TransientFailure")
        warning = pigeon.wait_stderr("held, no attempt counted")
    text = failure["response"]["text"]
    assert text.startswith(f"authentication as alice not attempted: {_peer(sink)} does not offer STARTTLS")
    assert "allow_plaintext_auth" not in text and 'tls = "implicit"' in text
    assert "WARNING" in warning and "password" not in warning.partition("held, no attempt counted")[2]
    assert not any(command.startswith(("AUTH", "MAIL")) for command in sink.commands)


def test_serve_check_names_a_route_auth_mistake_without_the_password(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[spool]\npath = "spool"\n[[route]]\ndomain = "*"\nnext_hop = "relay.test:587"\ntls = "disabled"\n'
        f'auth_username = "alice"\nauth_password = "{PASSWORD}"\n'
    )
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"pigeon: configuration error: {config}, line 7: [[route]] #1 auth_username: route '*': auth_username with "
        'tls = "disabled": the password would cross the network in clear'
    )
    assert PASSWORD not in result.stderr + result.stdout


def test_a_route_that_authenticates_without_tls_verify_is_warned_about_at_check_and_start(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    route = (
        '[spool]\npath = "spool"\n[[route]]\ndomain = "*"\nnext_hop = "relay.test:587"\ntls = "required"\n'
        f'auth_username = "alice"\nauth_password = "{PASSWORD}"\n'
    )
    config.write_text(route)
    result = pigeon_cli("serve", "--check", "-c", str(config))
    said = (
        "[[route]] #1 (domain '*') authenticates to relay.test:587 as 'alice' without tls_verify = true: its "
        "password goes to whoever presents any certificate there"
    )
    assert result.returncode == 0 and f"pigeon: warning: {said}" in result.stderr
    config.write_text(route + "tls_verify = true\n")
    assert "tls_verify" not in pigeon_cli("serve", "--check", "-c", str(config)).stderr
    with (
        ScriptedSink(tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink,
        _node(tmp_path, sink) as pigeon,
    ):
        warning = pigeon.wait_stderr("without tls_verify = true")
    assert "WARNING" in warning and PASSWORD not in pigeon.stderr() + result.stderr


def test_a_certificate_that_does_not_verify_gets_no_auth_on_the_unverified_fallback(tmp_path: Path) -> None:
    # Opportunistic TLS would try again without verifying (mail without AUTH still does): not
    # with the password, which goes only to the certificate the route asked to verify.
    with (
        ScriptedSink(tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink,
        _node(tmp_path, sink, tls="opportunistic", tls_verify=True) as pigeon,
    ):
        _send(pigeon)
        failure, *_ = pigeon.wait_records("TransientFailure")
        assert sink.after(1.0) == [] and not pigeon.records("Delivery")
        written = _everything_written(pigeon)
    assert sink.auth_attempts == []
    response = failure["response"]
    assert (response["code"], response["enhanced"]) == (451, "4.7.5")
    assert "certificate verify failed" in response["text"]
    assert "without verifying" not in written and PASSWORD not in written


def test_a_wrong_password_is_tried_once_a_wave_not_once_a_message_and_a_reload_that_fixes_it_delivers_what_was_held(
    tmp_path: Path,
) -> None:
    # A provider counts each failed AUTH (and locks the account after some): a backlog of 30
    # must not open 30 connections that each send the wrong password again.
    (tmp_path / "relay-password").write_text(WRONG + "\n")
    with ScriptedSink(tls=_context(tmp_path / "tls"), users={"alice": PASSWORD}) as sink:
        config = delivery_config(sink.endpoint, site_retry_interval="60s", max_site_retry_interval="60s")
        config["route"] = [
            {
                "domain": "*",
                "next_hop": sink.endpoint,
                "tls": "required",
                "auth_username": "alice",
                "auth_password_file": str(tmp_path / "relay-password"),
            }
        ]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                for n in range(30):
                    client.sendmail("sender@example.org", [f"bob{n}@example.net"], MESSAGE)
            pigeon.wait_records("TransientFailure", 30)
            sink.after(3.0)
            assert 1 <= len(sink.auth_attempts) <= 2, sink.auth_attempts
            assert not pigeon.records("Bounce")
            warnings = [line for line in pigeon.stderr().splitlines() if "authentication as alice failed" in line]
            assert len([line for line in warnings if "WARNING" in line]) == 1, warnings
            assert "held, no attempt counted: AUTH to" in warnings[0] and "[[route]] '*'" in warnings[0]

            (tmp_path / "relay-password").write_text(PASSWORD + "\n")
            _hangup(pigeon, "reloaded:")
            _send(pigeon, "carol@example.net")  # new mail goes at once: the hold is lifted
            # And the held mail too, without `pigeon retry`, long before its probe (60s on).
            deliveries = pigeon.wait_records("Delivery", 31, timeout=20)
            assert "carol@example.net" in {delivery["recipient"] for delivery in deliveries}
            assert "held for a refused AUTH made due now" in pigeon.stderr()
            # By that walk alone: the reload's rerouting walk leaves the probe of a lifted hold
            # to it (both chose the same rows, and the log credited whichever wrote first).
            assert "waited for the probe of a site down" not in pigeon.stderr()
            written = _everything_written(pigeon)
    refused = [attempt for attempt in sink.auth_attempts if not attempt[2]]
    assert 1 <= len(refused) <= 2
    assert WRONG not in written and PASSWORD not in written


@pytest.mark.parametrize(
    ("route", "said"),
    [
        ({"password": WRONG}, "authentication as alice failed: localhost [127.0.0.1]:{port} answered AUTH PLAIN"),
        (
            {"tls": "implicit", "tls_verify": True},
            "TLS handshake with localhost [127.0.0.1]:{port} failed: [SSL: CERTIFICATE_VERIFY_FAILED]",
        ),
    ],
    ids=["wrong-password", "implicit-tls-unverified"],
)
def test_the_routes_failure_at_the_first_address_ends_the_attempt_and_is_what_it_records(
    tmp_path: Path, route: dict[str, Any], said: str
) -> None:
    # localhost is 127.0.0.1 then ::1: the second refuses the connection, which said nothing
    # of why the first would not do, and was the only reply recorded; each attempt also sent
    # the password again at the next address.
    implicit = route.get("tls") == "implicit"
    context = _context(tmp_path / "tls")
    sink_tls = {"implicit_tls": context} if implicit else {"tls": context}
    with ScriptedSink(users={"alice": PASSWORD}, **sink_tls) as sink:  # type: ignore[arg-type]
        (tmp_path / "relay-password").write_text(route.pop("password", PASSWORD) + "\n")
        config = delivery_config(sink.endpoint)
        config["route"] = [
            {
                "domain": "*",
                "next_hop": f"localhost:{sink.port}",
                "tls": "required",
                "auth_username": "alice",
                "auth_password_file": str(tmp_path / "relay-password"),
            }
            | route
        ]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon)
            failure, *_ = pigeon.wait_records("TransientFailure")
    assert failure["response"]["text"].startswith(said.format(port=sink.port)), failure["response"]
    assert "Connection refused" not in failure["response"]["text"]
