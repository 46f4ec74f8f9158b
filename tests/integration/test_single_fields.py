"""A header section with two of a field RFC 5322 3.6 allows once (two From: one signed, the
other shown; RFC 6376 8.15) is refused at every door: SMTP DATA and BDAT 554 5.6.0 naming
the field, with a Rejection record; POST /api/v1/inject and `pigeon inject` 400 naming it
(554 5.6.0 for a later recipient whose substitutions add one). A policy that would add a
second one fails (451 4.3.0). An EHLO name over 255 octets is refused (501 5.5.2)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

TOKEN = "single-fields-token-0123456789"
TWO_FROM = b"From: a@example.org\r\nFrom: b@evil.test\r\nSubject: x\r\n\r\nb\r\n"
REFUSED = "554 5.6.0 Message has more than one From header field (RFC 5322 3.6 allows one)"
LONG_EHLO = "EHLO name is longer than 255 octets; no domain or address literal is that long"
# Over 64 KiB of fields before the second one: past what the signer and the policy read.
FILLER = b"".join(b"X-Filler-%03d: " % n + b"a" * 900 + b"\r\n" for n in range(80))


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path_factory.mktemp("single") / "node", http={"token": tokens}) as node:
        yield node


def _data(pigeon: PigeonProcess, message: bytes) -> str:
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<data@example.net>")
        smtp.expect(354, "DATA")
        smtp.send(message + b".\r\n")
        code, text = smtp.reply()
        return f"{code} {text[-1]}"


def _bdat(pigeon: PigeonProcess, message: bytes) -> str:
    """In chunks of 20 octets: the second field comes in a later chunk than the first."""
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<bdat@example.net>")
        chunks = [message[at : at + 20] for at in range(0, len(message), 20)]
        for chunk in chunks[:-1]:
            smtp.send(b"BDAT %d\r\n" % len(chunk) + chunk)
            smtp.expect(250)
        smtp.send(b"BDAT %d LAST\r\n" % len(chunks[-1]) + chunks[-1])
        code, text = smtp.reply()
        return f"{code} {text[-1]}"


@pytest.mark.parametrize("door", ["DATA", "BDAT"])
@pytest.mark.parametrize("far", [False, True], ids=["near", "past-64-KiB"])
def test_smtp_refuses_a_second_from_naming_it_and_logs_the_rejection(
    pigeon: PigeonProcess, door: str, far: bool
) -> None:
    send = _data if door == "DATA" else _bdat
    message = TWO_FROM if not far else b"From: a@example.org\r\n" + FILLER + b"FROM :b@evil.test\r\n\r\nb\r\n"
    before = len(pigeon.spool_messages())
    rejections = len(pigeon.records("Rejection"))
    assert send(pigeon, message) == REFUSED
    assert len(pigeon.spool_messages()) == before
    rejection = pigeon.wait_records("Rejection", rejections + 1)[-1]
    assert rejection["command"] == door
    assert rejection["response"]["code"] == 554 and rejection["response"]["enhanced"] == "5.6.0"
    assert "From" in rejection["response"]["text"]
    # One From (and "Resent-From", which may repeat) is taken.
    assert send(pigeon, b"From: a@example.org\r\nResent-From: c@example.org\r\nResent-From: d@example.org\r\n"
                b"Subject: x\r\n\r\nb\r\n").startswith("250 ")  # fmt: skip


def test_two_cc_or_references_fields_still_pass(pigeon: PigeonProcess) -> None:
    message = b"From: a@example.org\r\nCc: b@example.org\r\nCc: c@example.org\r\nReferences: <1@x>\r\n"
    assert _data(pigeon, message + b"references: <2@x>\r\nSubject: old mail\r\n\r\nb\r\n").startswith("250 ")


@pytest.mark.parametrize("name", ["Subject", "Message-ID", "Reply-To", "Date", "To"])
def test_any_field_allowed_once_is_refused_twice_in_any_case(pigeon: PigeonProcess, name: str) -> None:
    value = b"<x@example.org>"
    field = name.encode() + b": " + value + b"\r\n"
    message = b"From: a@example.org\r\n" + field + name.upper().encode() + b":" + value + b"\r\n\r\nb\r\n"
    assert _data(pigeon, message) == REFUSED.replace("From", name)


@pytest.mark.parametrize("template", [False, True])
def test_http_injection_of_raw_content_with_two_from_is_a_bad_request_naming_it(
    pigeon: PigeonProcess, template: bool
) -> None:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "http@example.net"}],
        "content": TWO_FROM.decode(),
        "template": template,
    }
    before = len(pigeon.spool_messages())
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 400, answer
    assert answer == {"error": REFUSED, "field": "$.content"}  # SMTP's reply, word for word
    assert len(pigeon.spool_messages()) == before


def test_a_recipient_whose_substitutions_add_a_second_from_is_refused_alone(pigeon: PigeonProcess) -> None:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [
            {"email": "fine@example.net", "substitutions": {"extra": "X-Fine: yes"}},
            {"email": "evil@example.net", "substitutions": {"extra": "From: b@evil.test"}},
        ],
        "content": "From: a@example.org\n{{ extra }}\nSubject: x\n\nb\n",
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    fine, evil = answer["recipients"]
    assert "id" in fine
    assert evil["error"] == REFUSED
    # Found by what it names: the module's other tests share this node, and a Rejection of
    # theirs may reach the log after this test began (records are written a moment late).
    (rejection,) = wait_until(
        lambda: [r for r in pigeon.records("Rejection") if r.get("recipients") == ["evil@example.net"]]
    )
    assert rejection["command"] == "inject"


def test_pigeon_inject_of_a_file_with_two_from_fails_naming_it(pigeon: PigeonProcess, tmp_path: Path) -> None:
    path = tmp_path / "message.eml"
    path.write_bytes(TWO_FROM)
    command = ["inject", "-c", str(pigeon.config_path), "--token", TOKEN]
    command += ["--from", "app@example.org", "--to", "cli@example.net", str(path)]
    done = zygote.run(command, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert "more than one From header field" in done.stderr


def test_an_ehlo_name_over_255_octets_gets_the_same_501_5_5_2_before_and_after_a_greeting_and_255_is_taken(
    pigeon: PigeonProcess,
) -> None:
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        # The first command, as README promises: the enhanced code did not wait for an EHLO taken.
        assert smtp.command("EHLO " + "a" * 252 + ".tld") == (501, ["5.5.2 " + LONG_EHLO])
        assert smtp.command("HELO " + "a" * 252 + ".tld") == (501, ["5.5.2 " + LONG_EHLO.replace("EHLO", "HELO")])
        assert smtp.command("EHLO " + "a" * 251 + ".tld")[0] == 250
        assert smtp.command("EHLO " + "a" * 252 + ".tld") == (501, ["5.5.2 " + LONG_EHLO])
        assert smtp.command("HELO " + "a" * 252 + ".tld") == (501, ["5.5.2 " + LONG_EHLO.replace("EHLO", "HELO")])
        smtp.expect(250, "MAIL FROM:<app@example.org>")


def test_a_policy_that_would_add_a_second_from_fails_and_one_that_replaces_it_is_obeyed(tmp_path: Path) -> None:
    module = tmp_path / "policy.py"
    module.write_text(
        textwrap.dedent("""
        from pigeon.policy import Changes
        def on_message(message):
            if message.headers["Subject"] == "add":
                return Changes(add_headers=[("from", "c@example.org")])
            return Changes(add_headers=[("From", "c@example.org")], remove_headers=["FROM"])
        """)
    )
    with PigeonProcess(tmp_path / "node", policy={"module": str(module)}) as pigeon:
        assert _data(pigeon, b"From: a@example.org\r\nSubject: add\r\n\r\nb\r\n") == (
            "451 4.3.0 policy error; try again later"
        )
        (failure,) = pigeon.wait_records("PolicyFailure")
        assert "added a from header field the message would then have twice" in failure["error"], failure
        assert _data(pigeon, b"From: a@example.org\r\nSubject: replace\r\n\r\nb\r\n").startswith("250 ")


def test_a_message_from_a_client_that_greets_with_an_idn_is_taken(pigeon: PigeonProcess) -> None:
    # The Received field wrote such a name with encode("idna", "replace"), an error handler
    # the idna codec does not take: every message from such a client failed.
    for name in ("b\u00fccher.example", "\u00e9" * 70 + ".example"):  # (a label IDNA cannot encode)
        with RawSmtp(pigeon.smtp_port) as smtp:
            smtp.expect(220)
            smtp.send(f"EHLO {name}\r\n".encode())
            smtp.expect(250)
            smtp.expect(250, "MAIL FROM:<app@example.org>")
            smtp.expect(250, "RCPT TO:<idn@example.net>")
            smtp.expect(354, "DATA")
            smtp.send(b"From: a@example.org\r\nSubject: x\r\n\r\nb\r\n.\r\n")
            assert smtp.reply()[0] == 250, name
