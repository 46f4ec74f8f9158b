"""Python's smtplib, as a plain client would use it: mail is stored, logged and answered 250."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from email.policy import SMTP

import pytest

from tests.support.process import PigeonProcess


def _message(to: list[str], subject: str = "hello") -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "sender@example.org"
    msg["To"] = ", ".join(to)
    msg["Subject"] = subject
    msg["X-Tenant"] = "acme"
    msg["X-Campaign"] = "spring"
    msg.set_content("Hello there.\n.leading dot line\n")
    return msg


def test_message_is_stored_once_per_domain_with_received_header(pigeon: PigeonProcess) -> None:
    recipients = ["a@example.net", "b@example.net", "c@other.test"]
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        code, _text = client.noop()
        assert code == 250
        refused = client.send_message(_message(recipients), "sender@example.org", recipients)
        assert refused == {}

    stored = pigeon.spool_messages()
    assert sorted(m["queue"] for m in stored) == ["spring:acme@example.net", "spring:acme@other.test"]
    by_queue = {m["queue"]: m for m in stored}
    assert by_queue["spring:acme@example.net"]["recipients"] == ["a@example.net", "b@example.net"]
    assert by_queue["spring:acme@other.test"]["recipients"] == ["c@other.test"]
    data = stored[0]["data"]
    assert data.startswith(b"Received: from client.test ([127.0.0.1])\r\n\tby mx.pigeon.test (Pigeon) with ESMTP id ")
    assert b"\r\n.leading dot line\r\n" in data  # unstuffed exactly once
    assert data.endswith(b"Hello there.\r\n.leading dot line\r\n")
    assert stored[0]["body_id"] == stored[1]["body_id"]  # one body row, shared
    assert stored[0]["data"] == stored[1]["data"]


def test_a_mailbox_named_twice_in_one_envelope_is_stored_once(pigeon: PigeonProcess) -> None:
    recipients = ["a@example.net", "a@EXAMPLE.NET", "A@example.net", "c@other.test", "a@example.net"]
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.send_message(_message(recipients), "sender@example.org", recipients) == {}

    by_queue = {m["queue"]: m["recipients"] for m in pigeon.spool_messages()}
    # Domains compare without case, local parts with it (RFC 5321 2.4): A@ is another mailbox.
    assert by_queue == {
        "spring:acme@example.net": ["a@example.net", "A@example.net"],
        "spring:acme@other.test": ["c@other.test"],
    }
    # The log file is written after the 250 (the records were committed with the messages).
    logged = {r["queue"]: r["recipients"] for r in pigeon.wait_records("Reception", 2)}
    assert logged == by_queue


def test_reply_names_the_spool_ids_and_reception_records_match(pigeon: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("sender@example.org")
        client.rcpt("a@example.net")
        client.rcpt("c@other.test")
        code, text = client.data(_message(["a@example.net"]).as_bytes(policy=SMTP))
    assert code == 250
    ids = text.decode().split("queued as ")[1].split()
    records = pigeon.wait_records("Reception", len(ids))
    assert sorted(r["id"] for r in records) == sorted(ids)
    for record in records:
        assert record["sender"] == "sender@example.org"
        assert record["peer"].startswith("127.0.0.1:")
        assert record["helo"] == "client.test"
        assert record["protocol"] == "ESMTP"
        assert record["response"]["code"] == 250
        assert record["node"] == "test-node"
        assert record["size"] > 0
    assert {tuple(r["recipients"]) for r in records} == {("a@example.net",), ("c@other.test",)}
    # One body, whose Received: field names the first id: the other message's record says so.
    assert [(r["id"], r.get("trace_id")) for r in sorted(records, key=lambda r: ids.index(r["id"]))] == [
        (ids[0], None),
        (ids[1], ids[0]),
    ]
    stored = {m["id"]: m["data"] for m in pigeon.spool_messages()}
    assert f"with ESMTP id {ids[0]}".encode() in stored[ids[1]].split(b"\r\n\r\n")[0].replace(b"\r\n\t", b" ")


def test_dsn_parameters_are_stored_with_the_envelope(pigeon: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.has_extn("dsn")
        client.mail("sender@example.org", ["RET=HDRS", "ENVID=QQ314159"])
        client.rcpt("a@example.net", ["NOTIFY=SUCCESS,FAILURE", "ORCPT=rfc822;orig+2Bx@example.net"])
        code, _ = client.data(b"Subject: dsn\r\n\r\nbody\r\n")
    assert code == 250
    (stored,) = pigeon.spool_messages()
    envelope = stored["envelope"]
    assert envelope.ret == "HDRS"
    assert envelope.envid == "QQ314159"
    (recipient,) = envelope.recipients
    assert recipient.notify == ["FAILURE", "SUCCESS"]
    assert recipient.orcpt == "rfc822;orig+x@example.net"


def test_an_envid_or_orcpt_that_would_come_back_altered_is_refused_and_nothing_stored(pigeon: PigeonProcess) -> None:
    # RFC 3461 4.4 and 4.2: once decoded, printable ASCII. Taken, U+202E and é came back in
    # a DSN's Original-Envelope-Id as "a b\x{E9}", not what the client gave.
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        code, text = client.mail("x10@snd.test", ["ENVID=a+E2+80+AEb+C3+A9"])
        assert (code, text.decode()) == (
            501,
            "5.5.4 ENVID must be printable ASCII once decoded (RFC 3461 4.4): it holds U+202E RIGHT-TO-LEFT OVERRIDE",
        )
        assert client.mail("x10@snd.test", ["ENVID=a+20b"])[0] == 250
        code, text = client.rcpt("a@example.net", ["ORCPT=rfc822;a+E2+80+AEb@example.net"])
        assert code == 501
        assert "U+202E RIGHT-TO-LEFT OVERRIDE" in text.decode()
    assert pigeon.spool_messages() == []


def test_an_orcpt_with_a_format_or_space_character_is_refused_naming_it_in_either_form(pigeon: PigeonProcess) -> None:
    # The utf-8 form (escaped or as it is) follows the rfc822 form's rule: no way round it.
    refused = "5.5.4 ORCPT {} address must hold no invisible or format characters once decoded: it holds {}"
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.mail("x11@snd.test", ["SMTPUTF8"])[0] == 250
        for orcpt, addr_type, named in [
            ("utf-8;x\\x{202E}@example.net", "utf-8", "U+202E RIGHT-TO-LEFT OVERRIDE"),
            ("utf-8;x\u202e@example.net", "utf-8", "U+202E RIGHT-TO-LEFT OVERRIDE"),
            ("utf-8;x\\x{A0}@example.net", "utf-8", "U+00A0 NO-BREAK SPACE"),
            ("rfc822;x+C2+A0@example.net", "rfc822", "U+00A0 NO-BREAK SPACE"),
        ]:
            code, text = client.rcpt("a@example.net", [f"ORCPT={orcpt}"])
            assert (code, text.decode()) == (501, refused.format(addr_type, named))
    assert pigeon.spool_messages() == []


def test_a_utf8_orcpt_is_stored_as_sent_under_smtputf8(pigeon: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.mail("sender@example.org", ["SMTPUTF8", "ENVID=batch+207"])[0] == 250
        assert client.rcpt("a@example.net", ["ORCPT=utf-8;ren\u00e9\\x{1F600}@example.net"])[0] == 250
        code, _ = client.data(b"Subject: dsn\r\n\r\nbody\r\n")
    assert code == 250
    (stored,) = pigeon.spool_messages()
    assert stored["envelope"].envid == "batch 7"
    assert stored["envelope"].recipients[0].orcpt == "utf-8;ren\u00e9\\x{1F600}@example.net"


def test_smtputf8_address_is_accepted_with_the_parameter(pigeon: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.has_extn("smtputf8")
        code, _ = client.mail("jöran@example.org", ["SMTPUTF8", "BODY=8BITMIME"])
        assert code == 250
        code, _ = client.rcpt("用户@例子.测试")
        assert code == 250
        code, _ = client.data("Subject: ünïcode\r\n\r\nbody\r\n".encode())
        assert code == 250
    (stored,) = pigeon.spool_messages()
    assert stored["sender"] == "jöran@example.org"
    assert stored["recipients"] == ["用户@例子.测试"]
    assert stored["envelope"].smtputf8
    assert b" with UTF8SMTP id " in stored["data"]


def test_esmtp_parameters_after_helo_are_refused_and_logged(pigeon: PigeonProcess) -> None:
    """RFC 5321 4.1.1.1, RFC 6531 3.4: after HELO no extension applies. Found from outside:
    `MAIL FROM:<a@b.c> SMTPUTF8` after HELO got 250. (smtplib leaves parameters out after
    HELO, so they are sent with docmd.)"""
    helo = b"the session began with HELO, which offers no extensions"
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.helo("client.test")[0] == 250
        assert client.docmd("MAIL", "FROM:<ann@example.org> SMTPUTF8") == (
            555,
            b"5.5.4 SMTPUTF8 is not recognised: " + helo,
        )
        assert client.docmd("MAIL", "FROM:<a@example.org>") == (250, b"2.1.0 Sender ok")
        assert client.docmd("RCPT", "TO:<b@example.net> NOTIFY=NEVER") == (
            555,
            b"5.5.4 NOTIFY is not recognised: " + helo,
        )
        assert client.docmd("RCPT", "TO:<b@example.net>")[0] == 250
        client.send(b"BDAT 5 LAST\r\nhello")  # (the chunk is read and dropped)
        code, text = client.getreply()
        assert (code, text[:5]) == (502, b"5.5.1")
        assert client.data(b"Subject: plain\r\n\r\nhi\r\n")[0] == 250
        assert client.ehlo("client.test")[0] == 250  # after EHLO, as ever
        assert client.docmd("MAIL", "FROM:<a@example.org> SIZE=100 BODY=8BITMIME")[0] == 250
    rejections = pigeon.wait_records("Rejection", 3)
    assert [(r["command"], r["response"]["code"]) for r in rejections] == [("MAIL", 555), ("RCPT", 555), ("BDAT", 502)]
    assert (rejections[0]["sender"], rejections[1]["recipients"]) == ("ann@example.org", ["b@example.net"])
    (stored,) = pigeon.spool_messages()
    assert b" with SMTP id " in stored["data"]


def test_oversized_message_is_refused_before_and_after_data(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with PigeonProcess(tmp_path / "node", smtp={"max_message_size": 2000}) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            assert client.esmtp_features["size"] == "2000"
            code, text = client.mail("sender@example.org", ["SIZE=5000"])
            assert (code, text[:5]) == (552, b"5.3.4")
            client.rset()
            client.mail("sender@example.org")
            client.rcpt("a@example.net")
            code, text = client.data(b"Subject: big\r\n\r\n" + (b"x" * 70 + b"\r\n") * 40)
            assert (code, text[:5]) == (552, b"5.3.4")
            code, _ = client.noop()  # the session goes on
            assert code == 250
        assert pigeon.spool_messages() == []
        rejections = pigeon.wait_records("Rejection", 2)
        assert [(r["command"], r["response"]["code"]) for r in rejections] == [("MAIL", 552), ("DATA", 552)]


def test_too_many_recipients_get_452_and_the_rest_is_kept(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with PigeonProcess(tmp_path / "node", smtp={"max_recipients": 2}) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            client.mail("sender@example.org")
            assert client.rcpt("a@example.net")[0] == 250
            assert client.rcpt("b@example.net")[0] == 250
            code, text = client.rcpt("c@example.net")
            assert (code, text[:5]) == (452, b"4.5.3")
            assert client.data(b"Subject: x\r\n\r\nbody\r\n")[0] == 250
        (stored,) = pigeon.spool_messages()
        assert stored["recipients"] == ["a@example.net", "b@example.net"]


def test_a_tenant_or_campaign_header_with_a_control_character_is_refused_naming_the_header(
    pigeon: PigeonProcess,
) -> None:
    # ESC, DEL, a C1 control and a bidi override would each be kept in the queue name, and so
    # in every log line and admin listing of it. VT and FF too, wherever they are: only SP and
    # HTAB, the header's own white space, are folded (they became "_", or went at an end).
    cases = [
        ("X-Tenant", "ac\x1bme"),
        ("X-Campaign", "c\x7fd"),
        ("X-Tenant", "ac\x9bme"),
        ("X-Campaign", "spring\u202e"),
        ("X-Tenant", "ac\x0bme"),
        ("X-Tenant", "acme\x0b"),
        ("X-Campaign", "\x0cspring"),
        ("X-Campaign", "spr\x0cing"),
    ]
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        for header, value in cases:
            message = (
                f"From: sender@example.org\r\nTo: a@example.net\r\n{header}: {value}\r\nSubject: hi\r\n\r\nHello.\r\n"
            )
            with pytest.raises(smtplib.SMTPDataError) as refused:
                client.sendmail("sender@example.org", ["a@example.net"], message.encode())
            assert refused.value.smtp_code == 554
            text = refused.value.smtp_error.decode()
            assert text.startswith("5.6.0 ") and header in text and "control or format" in text, text
            client.rset()
    assert pigeon.spool_messages() == []
