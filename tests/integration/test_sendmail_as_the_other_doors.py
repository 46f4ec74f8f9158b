"""`pigeon sendmail` holds a message to what the other submission doors hold it to, though it
submits as a relay client (which the node leaves as it came): a Date or Message-ID that is not
of its RFC 5322 syntax, or a From that names no one, is refused (65, with SMTP-after-AUTH's
`554 5.6.0` text) and nothing is sent, and the message asks for SMTPUTF8 by Pigeon's one rule
(an address that needs it, or UTF-8 in the header section), not for any 8-bit octet or for a
domain that has an A-label."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator

import pytest

from pigeon.listener.passwords import set_password
from tests.integration.test_sendmail import arrived, sendmail
from tests.support.process import PigeonProcess
from tests.support.sinks import Received, ScriptedSink, delivery_config


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=True) as sink:  # (offered: the node passes on a wish for SMTPUTF8)
        yield sink


@pytest.fixture(scope="module")
def node(sink: ScriptedSink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("node")
    users = root / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    with PigeonProcess(root / "node", smtp=smtp, **delivery_config(sink.endpoint)) as pigeon:
        yield pigeon


def submitted(node: PigeonProcess, sender: str, recipient: str, message: bytes) -> smtplib.SMTPResponseException | None:
    """`message` submitted over SMTP after AUTH (the door sendmail is compared with): None when
    taken, else the node's refusal."""
    with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
        client.login("app", "secret-password")
        options = ["SMTPUTF8"] if not (sender + recipient).isascii() else []
        if not message.isascii():
            options.append("BODY=8BITMIME")
        try:
            client.sendmail(sender, [recipient], message, mail_options=options)
        except smtplib.SMTPDataError as error:
            return error
    return None


@pytest.mark.parametrize(
    ("field", "said"),
    [
        (b"Date: yesterday", b"Message has a Date header field that is not"),
        (b"Message-ID: <a..b@c>", b"Message has a Message-ID header field that is not"),
        (b"From:  ", b"Message has no From header field"),  # (sendmail adds one only where none is)
    ],
    ids=["date", "message-id", "empty-from"],
)
def test_a_malformed_date_or_message_id_or_an_empty_from_is_refused_with_65_as_smtp_after_auth_refuses_it(
    node: PigeonProcess, sink: ScriptedSink, field: bytes, said: bytes
) -> None:
    marker = b"marker-malformed-" + field[:4]
    author = b"" if field.startswith(b"From") else b"From: a@example.org\r\n"
    message = author + field + b"\r\nSubject: x\r\n\r\n" + marker + b"\r\n"
    refusal = submitted(node, "a@example.org", "to@example.net", message)
    assert refusal is not None and refusal.smtp_code == 554, refusal
    result = sendmail(node.config_path, "-i", "-f", "a@example.org", "to@example.net", message=message)
    assert result.returncode == 65, result.stderr
    # The same words as the other door's, naming the field and what is wrong with it.
    reply = b"554 " + refusal.smtp_error.replace(b"\n", b" ")
    assert result.stderr == b"sendmail: the message refused: " + reply + b"\n"
    assert reply.startswith(b"554 5.6.0 " + said)
    # Nothing went: a message sent after it arrives, it never does.
    after = marker + b"-after"
    assert sendmail(node.config_path, "-i", "to@example.net", message=b"Subject: x\n\n" + after + b"\n").returncode == 0
    arrived(sink, after)
    assert not any(marker + b"\r\n" in m.data for m in sink.received)


def through_both_doors(
    node: PigeonProcess, sink: ScriptedSink, sender: str, recipient: str, head: bytes
) -> list[Received]:
    """The message with header section `head` as it arrived through SMTP after AUTH and then
    through sendmail."""
    got = []
    for door in ("smtp", "sendmail"):
        marker = f"marker-{door}-{sender}-{recipient}".encode()
        message = head + b"\r\n" + marker + b"\r\n"
        if door == "smtp":
            assert submitted(node, sender, recipient, message) is None
        else:
            result = sendmail(node.config_path, "-i", "-f", sender, recipient, message=message)
            assert result.returncode == 0, result.stderr
        got.append(arrived(sink, marker))
    return got


def parameters(received: Received) -> list[str]:
    return sorted(option for option in received.mail_options if not option.upper().startswith("SIZE="))


def test_a_latin_1_header_asks_for_no_smtputf8_as_at_the_other_doors(node: PigeonProcess, sink: ScriptedSink) -> None:
    head = b"From: a@example.org\r\nSubject: caf\xe9\r\n"
    by_smtp, by_sendmail = through_both_doors(node, sink, "a@example.org", "latin@example.net", head)
    assert parameters(by_smtp) == ["BODY=8BITMIME"]
    assert parameters(by_sendmail) == ["BODY=8BITMIME"]
    assert b"Subject: caf\xe9\r\n" in by_sendmail.data


def test_a_utf_8_header_still_asks_for_smtputf8(node: PigeonProcess, sink: ScriptedSink) -> None:
    head = "From: a@example.org\r\nSubject: café\r\n".encode()
    by_smtp, by_sendmail = through_both_doors(node, sink, "a@example.org", "utf8@example.net", head)
    assert parameters(by_smtp) == parameters(by_sendmail) == ["BODY=8BITMIME", "SMTPUTF8"]


def test_an_address_whose_domain_has_an_a_label_asks_for_no_smtputf8(node: PigeonProcess, sink: ScriptedSink) -> None:
    # As an HTTP injection's (or an SMTP client's that writes the A-label) goes: the address
    # has an ASCII form, so nothing needs SMTPUTF8 (RFC 5890).
    message = b"From: a@example.org\r\nSubject: idn\r\n\r\nmarker-idn\r\n"
    result = sendmail(node.config_path, "-i", "-f", "u@bücher.test", "r@bücher.test", message=message)
    assert result.returncode == 0, result.stderr
    got = arrived(sink, b"marker-idn")
    assert (got.sender, got.recipients) == ("u@xn--bcher-kva.test", ["r@xn--bcher-kva.test"])
    assert parameters(got) == []


def test_a_non_ascii_local_part_still_goes_with_smtputf8(node: PigeonProcess, sink: ScriptedSink) -> None:
    head = b"From: a@example.org\r\nSubject: eai\r\n"
    by_smtp, by_sendmail = through_both_doors(node, sink, "jörg@bücher.test", "ann@example.net", head)
    assert by_smtp.sender == by_sendmail.sender == "jörg@bücher.test"  # (no ASCII form)
    assert parameters(by_smtp) == parameters(by_sendmail)
    assert "SMTPUTF8" in parameters(by_sendmail)
