"""A mailbox against IMAP servers Dovecot does not play (tests/support/imap_server.py), as a node
runs it: a slow link that takes longer than `timeout` to bring a FETCH, a server that stalls
mid-answer, one that spells its answers in lower case, one of IMAP4rev2 alone, one whose FETCH
answers carry no UID, a refused XOAUTH2 token, a server not there or not trusted. What reaches
the webhook, what the server was sent, and what /healthz and the log say."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.apps import WebhookApp, customer_mail, mailbox_failure, mailbox_health, private_ca, webhook_target
from tests.support.imap_server import ImapServer
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import wait_until

_TIMED_OUT = ("no answer", "nothing more")  # what a command timed out says


def _box(port: int, **options: Any) -> dict[str, Any]:
    """A [[mailbox]] table for the test server's user app (no TLS)."""
    box = {"name": "support", "host": "127.0.0.1", "port": port, "tls": "none", "username": "app"}
    return box | {"password": "secret", "target": "hook", "poll_interval": "5s", **options}


def _big_mail(n: int, size: int) -> bytes:
    """A message of about `size` bytes, in lines of 80."""
    return customer_mail(n, tag="big") + (b"y" * 78 + b"\r\n") * (size // 80)


def _node(tmp_path: Path, app: WebhookApp, box: dict[str, Any]) -> PigeonProcess:
    return PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box])


def test_a_fetch_that_takes_longer_than_timeout_is_waited_for_while_its_bytes_come(tmp_path: Path) -> None:
    # Found from outside: a 20 MB message at ~320 KB/s took longer than the default 60 s
    # `timeout`, which bounded the whole FETCH: "fetch: no answer within 60s; reconnecting"
    # every minute, nothing delivered, /healthz "ok". Here 600 KB at 100 KB/s, `timeout` 2 s.
    with ImapServer(rate=100_000) as server, WebhookApp() as app:
        server.append([_big_mail(0, 600_000)] + [customer_mail(i) for i in range(1, 6)])
        with _node(tmp_path, app, _box(server.port, timeout="2s")) as node:
            assert app.wait_distinct(6, 60) == 6, node.stderr()
            wait_until(lambda: not server.unseen(), 10)
            logged = node.stderr()
    assert not any(said in logged for said in _TIMED_OUT), logged


def test_acknowledgements_answered_behind_a_long_fetch_are_not_timed_out(tmp_path: Path) -> None:
    # Batches of 5 messages of 40 KB at 100 KB/s: each FETCH takes 2 s, twice `timeout`, and
    # the STORE \Seen of a batch handed over is answered after the next batch's FETCH.
    with ImapServer(rate=100_000) as server, WebhookApp() as app:
        server.append([_big_mail(i, 40_000) for i in range(20)])
        with _node(tmp_path, app, _box(server.port, timeout="1s", batch=5)) as node:
            assert app.wait_distinct(20, 90) == 20, node.stderr()
            wait_until(lambda: not server.unseen(), 20)
            logged = node.stderr()
    assert not any(said in logged for said in _TIMED_OUT), logged
    assert sum(app.accepted.values()) == 20
    # (each batch's STORE \Seen sent while the next batch's FETCH streamed, and answered after it)
    assert len([line for line in server.received("UID STORE") if line.endswith("(\\Seen)")]) >= 4


def test_a_fetch_that_keeps_failing_keeps_the_mailbox_degraded_and_says_why(tmp_path: Path) -> None:
    # The session's search and claim work between the failures: /healthz said "ok" while
    # nothing could be fetched. Here the server stalls in the middle of each body.
    with ImapServer(stall_after=300) as server, WebhookApp() as app:
        server.append([_big_mail(1, 2000)])
        with _node(tmp_path, app, _box(server.port, timeout="1s")) as node:
            node.wait_stderr("fetch: nothing more from 127.0.0.1", timeout=20)
            seen = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # through reconnects, searches and the fetches after them
                health = mailbox_health(node)
                seen.append((health["status"], health["error"] or ""))
                time.sleep(0.05)
            # Between a failure's reconnect and the next: the last fetch's failure, counted.
            error = wait_until(lambda: "in a row" in (said := mailbox_health(node)["error"] or "") and said, 30)
    assert {status for status, _ in seen} == {"degraded"}, seen
    assert all("fetch" in said for _, said in seen), seen
    said = r"cannot fetch UIDs 1: TimeoutError: fetch: nothing more from 127\.0\.0\.1:\d+ for 1s "
    assert re.fullmatch(said + r"\(\d+ bytes came since it was sent\) \(\d+ fetches failed in a row\)", error), error
    assert not app.accepted and server.unseen() == [1]


@pytest.mark.parametrize("lowercase", ["fetch", True], ids=["fetch-responses", "every-name"])
def test_a_server_that_answers_in_lower_case_has_its_mail_handed_over(tmp_path: Path, lowercase: str | bool) -> None:
    # Found from outside: "* 1 fetch (UID 1 RFC822.SIZE 123 FLAGS ())" was dropped unread; the
    # mailbox searched, asked for sizes, flagged and idled for ever, saying nothing, /healthz "ok".
    # In lower case too, its capabilities ("imap4rev1 idle uidplus move") are still used.
    with ImapServer(lowercase=lowercase) as server, WebhookApp() as app:
        server.append([customer_mail(i) for i in range(5)])
        box = _box(server.port, after_delivery="move", move_to="Done", timeout="5s")
        with _node(tmp_path, app, box) as node:
            assert app.wait_distinct(5, 20) == 5, node.stderr()
            wait_until(lambda: len(server.uids("Done")) == 5, 10)
            wait_until(lambda: server.received("IDLE"), 10)
            assert mailbox_health(node)["status"] == "ok"
            logged = node.stderr()
    assert server.uids() == [] and server.received("UID MOVE") and not server.received("UID COPY")
    assert not server.received("NOOP") and "offers no UIDPLUS" not in logged


def test_a_server_of_imap4rev2_alone_has_its_mail_handed_over(tmp_path: Path) -> None:
    # Found from outside: "ImapError: the server's greeting: server not IMAP4 compliant", for
    # ever. Its searches come back as ESEARCH; UIDPLUS (UID EXPUNGE) and IDLE are part of it.
    with ImapServer(rev2=True) as server, WebhookApp() as app:
        server.append([customer_mail(i) for i in range(5)])
        with _node(tmp_path, app, _box(server.port, after_delivery="delete")) as node:
            assert app.wait_distinct(5, 20) == 5, node.stderr()
            wait_until(lambda: not server.uids(), 10)
            server.append([customer_mail(i, tag="later") for i in range(2)])  # told by IDLE
            assert app.wait_distinct(7, 10) == 7, node.stderr()
            logged = node.stderr()
    assert server.received("UID EXPUNGE") and not server.received("EXPUNGE") and server.received("IDLE")
    assert "offers no UIDPLUS" not in logged


def test_fetch_answers_without_uids_are_said_and_the_mailbox_degraded(tmp_path: Path) -> None:
    # Such an answer yields nothing to hand over: before, nothing said so, and the mailbox
    # claimed and fetched the same messages at every round, /healthz "ok".
    with ImapServer(fetch_without_uid=True) as server, WebhookApp() as app:
        server.append([customer_mail(i) for i in range(2)])
        with _node(tmp_path, app, _box(server.port)) as node:
            line = node.wait_stderr("carried BODY[] but no UID", timeout=20)
            health = mailbox_health(node)
    assert "WARNING" in line and "mailbox support" in line, line
    assert health["status"] == "degraded", health
    assert health["error"].endswith(
        "fetch: the server answered, but with nothing of use for UIDs 1:2, which are in INBOX: 2 of its FETCH "
        "responses carried BODY[] but no UID, which a UID FETCH must; this server's answers cannot be read"
    ), health
    assert not app.accepted and server.unseen() == [1, 2]


def test_a_server_not_there_is_named_as_the_webhook_target_names_one(tmp_path: Path) -> None:
    # Found from outside: "ConnectionRefusedError: [Errno 111] Connection refused".
    dead = free_port()
    with WebhookApp() as app, _node(tmp_path, app, _box(dead)) as node:
        error = wait_until(lambda: mailbox_failure(node), 15)
    assert error == f"cannot connect to 127.0.0.1:{dead}: Connection refused"


def test_a_certificate_not_trusted_names_the_server_and_ca_file(tmp_path: Path) -> None:
    # Found from outside: "SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate
    # verify failed: unable to get local issuer certificate (_ssl.c:1006)".
    ca_pem, context = private_ca(tmp_path / "ca")
    with ImapServer(tls=context) as server, WebhookApp() as app:
        server.append([customer_mail(1)])
        with _node(tmp_path, app, _box(server.port, tls="implicit")) as node:
            error = wait_until(lambda: mailbox_failure(node), 15)
        assert error == (
            f"TLS to 127.0.0.1:{server.port} (implicit): certificate not trusted: unable to get local issuer "
            "certificate; set ca_file to the PEM file of the CA that issued it (or tls_verify = false)"
        )
        box = _box(server.port, tls="implicit", ca_file=str(ca_pem))
        with PigeonProcess(tmp_path / "q", target=[webhook_target(app)], mailbox=[box]) as node:
            assert app.wait_distinct(1, 20) == 1, node.stderr()


@pytest.mark.timeout(150)
def test_a_refused_xoauth2_token_is_said_to_be_the_token(tmp_path: Path) -> None:
    # Found from outside: "ImapError: login as app: NO [AUTHENTICATIONFAILED] Authentication
    # failed.", as for a wrong password, while the server's challenge said the token was refused.
    token_file = tmp_path / "token"
    token_file.write_text("expired-token\n")
    with ImapServer() as server, WebhookApp() as app:
        server.append([customer_mail(1)])
        box = _box(server.port, auth="xoauth2", password_file=str(token_file))
        del box["password"]
        with _node(tmp_path, app, box) as node:
            error = wait_until(lambda: mailbox_failure(node), 15)
            assert error == (
                'ImapError: login as app: auth = "xoauth2": the server refused the token (status 401, scope mail); '
                "refresh the token in password_file (the server said: NO [AUTHENTICATIONFAILED] Authentication "
                "failed.)"
            )
            token_file.write_text("")  # whatever keeps it current emptied it
            wait_until(lambda: "the token is empty" in (mailbox_failure(node) or ""), 20)
            assert mailbox_failure(node) == (
                f'ImapError: auth = "xoauth2": the token is empty (password_file {token_file}): nothing sent to '
                "the server"
            )
            token_file.write_text("good-token\n")
            assert app.wait_distinct(1, 70) == 1, node.stderr()
    assert server.tokens[0] == "expired-token" and server.tokens[-1] == "good-token" and "" not in server.tokens
