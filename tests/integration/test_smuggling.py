"""SMTP smuggling over a real socket: only <CRLF>.<CRLF> ends DATA, and nothing gets through."""

from __future__ import annotations

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

SMUGGLED = b"MAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@example.net>\r\nDATA\r\nSubject: smuggled\r\n\r\nx\r\n"


def _open_transaction(client: RawSmtp) -> None:
    client.expect(220)
    client.expect(250, "EHLO client.test")
    client.expect(250, "MAIL FROM:<a@example.org>")
    client.expect(250, "RCPT TO:<b@example.net>")
    client.expect(354, "DATA")


@pytest.mark.parametrize(
    "fake_end",
    [b"\n.\n", b"\r.\r", b"\n.\r\n", b"\r\n.\n", b"\r.\r\n", b"\r\n.\r", b"\n.\r"],
    ids=["LF.LF", "CR.CR", "LF.CRLF", "CRLF.LF", "CR.CRLF", "CRLF.CR", "LF.CR"],
)
def test_fake_end_of_data_neither_ends_the_message_nor_smuggles_one(pigeon: PigeonProcess, fake_end: bytes) -> None:
    with RawSmtp(pigeon.smtp_port) as client:
        _open_transaction(client)
        client.send(b"Subject: hello\r\n\r\nbody" + fake_end + SMUGGLED + b".\r\n")
        code, text = client.reply()
        assert code == 554
        assert text[0].startswith("5.6.0 Message contains a bare")
        client.expect(250, "NOOP")  # nothing of the smuggled transaction was executed
        client.expect(221, "QUIT")
    assert pigeon.spool_messages() == []
    pigeon.stop()  # the log is complete: no Rejection of a smuggled command can still be on its way
    assert [r["response"]["code"] for r in pigeon.records("Rejection")] == [554]


def test_normalise_mode_stores_one_message_with_the_fake_end_as_content(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with PigeonProcess(tmp_path / "node", smtp={"bare_linefeeds": "normalise"}) as pigeon:
        with RawSmtp(pigeon.smtp_port) as client:
            _open_transaction(client)
            client.send(b"Subject: hello\r\n\r\nbody\n.\n" + SMUGGLED + b".\r\n")
            client.expect(250)
            client.expect(221, "QUIT")
        (stored,) = pigeon.spool_messages()
        assert stored["sender"] == "a@example.org"
        assert stored["data"].endswith(b"body\r\n.\r\n" + SMUGGLED)


def test_bdat_chunk_containing_a_terminator_is_content(pigeon: PigeonProcess) -> None:
    body = b"Subject: chunked\r\n\r\nline one\r\n.\r\nline after a dot\r\n"
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        assert "CHUNKING" in client.expect(250, "EHLO client.test")
        client.send(b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n")
        client.expect(250)
        client.expect(250)
        client.send(b"BDAT 20\r\n" + body[:20])
        assert client.expect(250) == ["2.0.0 20 octets received"]
        client.send(b"BDAT %d LAST\r\n" % (len(body) - 20) + body[20:])
        assert client.expect(250)[0].startswith("2.0.0 Ok: queued as ")
        client.expect(221, "QUIT")
    (stored,) = pigeon.spool_messages()
    assert stored["data"].endswith(body)


def test_a_bare_lf_in_a_command_line_gets_one_421_and_nothing_after_it_runs(pigeon: PigeonProcess) -> None:
    # A proxy that frames commands by CRLF would see `RCPT TO:<a@r.test>\nRCPT TO:<b@r.test>` as one
    # line: the second recipient must not be taken here either.
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.send(b"MAIL FROM:<s@example.org>\r\nRCPT TO:<a@example.net>\nRCPT TO:<b@example.net>\r\nNOOP\r\n")
        client.expect(250)
        code, text = client.reply()
        assert code == 421 and text == [
            "4.5.2 mx.pigeon.test Error: bare <LF> received; command lines must end with <CR><LF> (RFC 5321 "
            "2.3.8), closing connection"
        ]
        assert client.closed_by_peer()  # no reply to the NOOP: closed
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.send(b"NOOP\nNOOP\r\n")
        assert client.reply()[0] == 421
        assert client.closed_by_peer()
    pigeon.stop()
    # Each names the command whose line the bare LF ended, as other Rejection records name theirs.
    assert [(r["command"], r["response"]["code"]) for r in pigeon.records("Rejection")] == [
        ("RCPT", 421),
        ("NOOP", 421),
    ]
