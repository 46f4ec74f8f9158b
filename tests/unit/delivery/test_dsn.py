"""Delivery status notifications, read back with the stdlib parser as any mail client would."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage, Message

import pytest

from pigeon.delivery.dsn import Failure, build_report, wants_failure_notice
from pigeon.message import Envelope, Recipient
from pigeon.smtp.replies import Reply

HOSTNAME = "mx.pigeon.test"
QUEUE_ID = "00000000000000ab"
ARRIVAL = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
NOW = ARRIVAL + 100.0
ORIGINAL = (
    b"From: Alice <alice@example.org>\r\n"
    b"To: bob@example.net\r\n"
    b"Subject: the quarterly report\r\n"
    b"Message-ID: <m1@example.org>\r\n"
    b"\r\n"
    b"first body line\r\n"
    b"\r\n"
    b"last body line\r\n"
)
USER_UNKNOWN = Reply(550, "5.1.1", ("User unknown",))


def report(
    envelope: Envelope, failures: list[Failure] | None = None, original: bytes = ORIGINAL
) -> tuple[bytes, EmailMessage]:
    if failures is None:
        failures = [Failure(r, USER_UNKNOWN, "failed", "mx.example.net") for r in envelope.recipients]
    data = build_report(
        hostname=HOSTNAME,
        queue_id=QUEUE_ID,
        envelope=envelope,
        failures=failures,
        original=original,
        arrival=ARRIVAL,
        now=NOW,
    )
    parsed = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    assert parsed.defects == []
    return data, parsed


def status_blocks(parsed: EmailMessage) -> list[Message]:
    part = parsed.get_payload()[1]
    assert part.get_content_type() == "message/delivery-status"
    blocks = part.get_payload()
    assert isinstance(blocks, list)
    return blocks


def envelope(*recipients: Recipient, **fields: object) -> Envelope:
    return Envelope("alice@example.org", list(recipients or [Recipient("bob@example.net")]), **fields)  # type: ignore[arg-type]


def test_the_report_is_a_multipart_report_of_three_parts() -> None:
    _, parsed = report(envelope())
    assert parsed.get_content_type() == "multipart/report"
    assert parsed.get_param("report-type") == "delivery-status"
    parts = parsed.get_payload()
    assert [p.get_content_type() for p in parts] == ["text/plain", "message/delivery-status", "text/rfc822-headers"]
    assert all(p.defects == [] for p in parts)


def test_the_report_goes_to_the_envelope_sender_from_the_mailer_daemon() -> None:
    data, parsed = report(envelope())
    assert parsed["To"].addresses[0].addr_spec == "alice@example.org"
    assert b"\r\nTo: <alice@example.org>\r\n" in data
    assert parsed["From"].addresses[0].addr_spec == f"MAILER-DAEMON@{HOSTNAME}"
    assert parsed["Auto-Submitted"] == "auto-replied"
    assert parsed["Subject"] == "Undelivered Mail Returned to Sender"
    assert parsed["MIME-Version"] == "1.0"
    assert parsed["Date"].datetime.timestamp() == NOW
    assert str(parsed["Date"]).endswith(" +0000")  # not "GMT", obsolete syntax (RFC 5322 4.3)
    assert parsed["Message-ID"].endswith(f"@{HOSTNAME}>")


def test_the_delivery_status_has_the_per_message_and_per_recipient_fields() -> None:
    env = envelope(Recipient("bob@example.net", orcpt="rfc822;Bob@Example.NET"), envid="QQ314159")
    _, parsed = report(env)
    per_message, per_recipient = status_blocks(parsed)
    assert per_message["Reporting-MTA"] == f"dns; {HOSTNAME}"
    assert per_message["Original-Envelope-Id"] == "QQ314159"
    assert per_message["Arrival-Date"] == "Tue, 14 Nov 2023 22:13:20 +0000"
    assert per_recipient["Final-Recipient"] == "rfc822; bob@example.net"
    assert per_recipient["Original-Recipient"] == "rfc822; Bob@Example.NET"
    assert per_recipient["Action"] == "failed"
    assert per_recipient["Status"] == "5.1.1"
    assert per_recipient["Remote-MTA"] == "dns; mx.example.net"
    assert per_recipient["Diagnostic-Code"] == "smtp; 550 5.1.1 User unknown"
    assert per_recipient["Last-Attempt-Date"] == "Tue, 14 Nov 2023 22:15:00 +0000"


@pytest.mark.parametrize(
    ("peer", "named"),
    [
        ("mx.example.net", "mx.example.net"),  # the MX host's name, when it was reached by one
        ("[192.0.2.1]:2525", "[192.0.2.1]"),  # an address literal (RFC 5321 4.1.3), no port
        ("[2001:db8::1]:25", "[IPv6:2001:db8::1]"),
    ],
)
def test_the_remote_mta_is_a_host_name_or_an_address_literal_without_a_port(peer: str, named: str) -> None:
    env = envelope()
    _, parsed = report(env, [Failure(env.recipients[0], USER_UNKNOWN, "failed", peer)])
    assert status_blocks(parsed)[1]["Remote-MTA"] == f"dns; {named}"


def test_fields_without_a_value_are_left_out() -> None:
    env = envelope()  # no ENVID, no ORCPT
    _, parsed = report(env, [Failure(env.recipients[0], USER_UNKNOWN, "failed")])  # no remote MTA
    per_message, per_recipient = status_blocks(parsed)
    assert "Original-Envelope-Id" not in per_message
    assert "Original-Recipient" not in per_recipient
    assert "Remote-MTA" not in per_recipient


def test_one_block_per_failed_recipient_in_order() -> None:
    bob, carol = Recipient("bob@example.net"), Recipient("carol@example.net")
    quota = Reply(552, "5.2.2", ("Mailbox full",))
    _, parsed = report(envelope(bob, carol), [Failure(bob, USER_UNKNOWN, "failed"), Failure(carol, quota, "failed")])
    _, first, second = status_blocks(parsed)
    assert (first["Final-Recipient"], first["Status"]) == ("rfc822; bob@example.net", "5.1.1")
    assert (second["Final-Recipient"], second["Status"]) == ("rfc822; carol@example.net", "5.2.2")
    assert second["Diagnostic-Code"] == "smtp; 552 5.2.2 Mailbox full"
    text = parsed.get_payload()[0].get_content()
    assert "<bob@example.net>: User unknown" in text
    assert "<carol@example.net>: Mailbox full" in text


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (Reply(550, None, ("no",)), "5.0.0"),
        (Reply(451, None, ("later",)), "4.0.0"),
        (Reply(451, "4.4.1", ("x",)), "4.4.1"),
    ],
)
def test_status_comes_from_the_enhanced_code_or_the_reply_class(answer: Reply, status: str) -> None:
    env = envelope()
    _, parsed = report(env, [Failure(env.recipients[0], answer, "failed")])
    assert status_blocks(parsed)[1]["Status"] == status


def test_a_multi_line_reply_is_one_diagnostic_line() -> None:
    env = envelope()
    answer = Reply(550, "5.7.1", ("Message rejected.", "See https://example.net/why"))
    _, parsed = report(env, [Failure(env.recipients[0], answer, "failed")])
    assert (
        status_blocks(parsed)[1]["Diagnostic-Code"] == "smtp; 550 5.7.1 Message rejected. See https://example.net/why"
    )


def test_the_diagnostic_code_is_the_servers_reply_with_its_enhanced_code() -> None:
    # RFC 3464 2.3.6: what the server said, "550 5.1.1 ..." as on the wire; a reply without an
    # enhanced code is shown without one, not with one made up.
    env = envelope()
    _, parsed = report(env, [Failure(env.recipients[0], Reply(550, "5.1.1", ("user unknown",)), "failed")])
    assert status_blocks(parsed)[1]["Diagnostic-Code"] == "smtp; 550 5.1.1 user unknown"
    _, parsed = report(env, [Failure(env.recipients[0], Reply(550, None, ("no such user",)), "failed")])
    assert status_blocks(parsed)[1]["Diagnostic-Code"] == "smtp; 550 no such user"


# RFC 5321 4.5.3.1.5 allows 512 octets a reply line (Pigeon's reader takes up to 4096), and
# lines without number; RFC 5322 2.1.1 allows 998 octets a line of a message, and a DSN that a
# next hop refuses for a longer one is lost (its null sender hears of nothing).
THREE_LINES_OF_400 = tuple(" ".join(f"policy{i * 100 + j:03d}" for j in range(40)) for i in range(3))
ONE_LINE_OF_2000 = (" ".join(f"reason{i:04d}" for i in range(182)),)


def lines_of(data: bytes) -> list[bytes]:
    return data.removesuffix(b"\r\n").split(b"\r\n")


@pytest.mark.parametrize("lines", [THREE_LINES_OF_400, ONE_LINE_OF_2000], ids=["3x400", "1x2000"])
@pytest.mark.parametrize("utf8", [False, True], ids=["delivery-status", "global-delivery-status"])
def test_a_long_reply_is_folded_into_lines_a_next_hop_takes_and_unfolds_to_the_reply(
    lines: tuple[str, ...], utf8: bool
) -> None:
    env = envelope(Recipient("renée@example.net" if utf8 else "bob@example.net"), smtputf8=utf8)
    answer = Reply(550, "5.7.1", lines)
    assert max(len(f"550-5.7.1 {line}") for line in lines) >= 400
    data, parsed = report(env, [Failure(env.recipients[0], answer, "failed", "mx.example.net")])
    # Folded at the reply's white space: every line within RFC 5322's 78 octets.
    assert max(len(line) for line in lines_of(data)) <= 78
    # The Diagnostic-Code unfolds (RFC 5322 2.2.3) to the server's reply, whole.
    if utf8:  # (the stdlib reads message/global-delivery-status as one message: its blocks read alike)
        body = data.index(b"\r\n\r\n", data.index(b"Content-Type: message/global-delivery-status")) + 4
        content = data[body:].split(b"\r\n\r\n")[1]
        status = email.message_from_bytes(content + b"\r\n", policy=email.policy.default)
    else:
        status = status_blocks(parsed)[1]
    assert status["Diagnostic-Code"] == f"smtp; 550 5.7.1 {' '.join(lines)}"
    assert status["Status"] == "5.7.1" and status["Action"] == "failed"
    # The text, wrapped, says it all, each word once, in order.
    text = parsed.get_payload()[0].get_content()
    reason = text[text.index("<ren" if utf8 else "<bob") :].split()
    assert reason[1:] == " ".join(lines).split()


def test_a_reply_word_longer_than_a_line_is_cut_into_lines_of_998_octets() -> None:
    env = envelope()
    word = "x" * 2000  # nothing to fold at: cut, a space put in where it is cut
    data, parsed = report(env, [Failure(env.recipients[0], Reply(550, "5.1.1", (word,)), "failed")])
    assert max(len(line) for line in lines_of(data)) <= 998
    diagnostic = status_blocks(parsed)[1]["Diagnostic-Code"]
    assert diagnostic.startswith("smtp; 550 5.1.1 x") and diagnostic.replace(" ", "") == "smtp;5505.1.1" + word
    text = parsed.get_payload()[0].get_content()
    assert "".join(text[text.index("<bob") :].split()) == f"<bob@example.net>:{word}"


def test_a_remote_reply_with_terminal_controls_is_escaped_in_the_human_readable_part() -> None:
    # A remote MX chose the text: an ESC or a C1 CSI must not reach the sender's terminal.
    env = envelope()
    nasty = Reply(550, "5.1.1", ("user unknown \x1b]0;pwned\x07\x1b[2J \u009b31m cleared",))
    data, parsed = report(env, [Failure(env.recipients[0], nasty, "failed")])
    text = parsed.get_payload()[0].get_content()
    assert "<bob@example.net>: user unknown \\x1b]0;pwned\\x07\\x1b[2J \\u009b31m cleared" in text
    assert b"\x1b" not in data and b"\x07" not in data and "\u009b".encode() not in data


def test_by_default_only_the_headers_come_back() -> None:
    _, parsed = report(envelope())
    returned = parsed.get_payload()[2]
    assert returned.get_content_type() == "text/rfc822-headers"
    headers = returned.get_payload(decode=True)
    assert headers == ORIGINAL[: ORIGINAL.index(b"\r\n\r\n") + 2]
    assert b"first body line" not in headers


def test_ret_hdrs_returns_only_the_headers() -> None:
    _, parsed = report(envelope(ret="HDRS"))
    returned = parsed.get_payload()[2]
    assert returned.get_content_type() == "text/rfc822-headers"
    headers = returned.get_payload(decode=True)
    assert headers == ORIGINAL[: ORIGINAL.index(b"\r\n\r\n") + 2]
    assert b"first body line" not in headers


def test_ret_full_returns_the_whole_message() -> None:
    data, parsed = report(envelope(ret="FULL"))
    returned = parsed.get_payload()[2]
    assert returned.get_content_type() == "message/rfc822"
    (inner,) = returned.get_payload()
    assert inner["Subject"] == "the quarterly report"
    assert inner["Message-ID"] == "<m1@example.org>"
    assert inner.get_payload() == "first body line\r\n\r\nlast body line\r\n"
    assert ORIGINAL in data  # byte for byte


@pytest.mark.parametrize(
    ("ret", "said", "description"),
    [
        (None, "Its headers are attached below;", "Undelivered message headers"),
        ("HDRS", "Its headers are attached below;", "Undelivered message headers"),
        ("FULL", "It is attached below;", "Undelivered message"),
    ],
)
def test_the_text_says_whether_the_message_or_only_its_headers_come_back(
    ret: str | None, said: str, description: str
) -> None:
    _, parsed = report(envelope(ret=ret))
    notification, _, returned = parsed.get_payload()
    text = notification.get_content()
    assert said in text
    assert ("It is attached" in text) == (ret == "FULL")
    assert returned["Content-Description"] == description


def test_a_message_without_a_final_crlf_comes_back_whole_ending_in_crlf() -> None:
    original = b"Subject: x\r\n\r\nno newline"
    _, parsed = report(envelope(ret="FULL"), original=original)
    (inner,) = parsed.get_payload()[2].get_payload()
    assert inner.get_payload() == "no newline\r\n"
    assert parsed.get_payload()[2].defects == []


def test_every_line_ends_with_crlf() -> None:
    for ret in (None, "FULL"):
        data, _ = report(envelope(Recipient("bob@example.net", orcpt="rfc822;b@example.net"), ret=ret, envid="e"))
        assert data.endswith(b"--\r\n")
        without_crlf = data.replace(b"\r\n", b"")
        assert b"\n" not in without_crlf
        assert b"\r" not in without_crlf


def test_two_reports_have_different_boundaries_and_message_ids() -> None:
    _, first = report(envelope())
    _, second = report(envelope())
    assert first.get_boundary() != second.get_boundary()
    assert first["Message-ID"] != second["Message-ID"]


def test_a_utf8_recipient_gets_a_global_delivery_status() -> None:
    env = envelope(Recipient("renée@example.net"), smtputf8=True, ret="FULL")
    _, parsed = report(env)
    parts = parsed.get_payload()
    assert [p.get_content_type() for p in parts] == ["text/plain", "message/global-delivery-status", "message/global"]
    assert b"Final-Recipient: utf-8; ren\xc3\xa9e@example.net" in parts[1].as_bytes()


def test_a_utf8_recipient_in_a_plain_delivery_status_is_written_as_utf8_addr_xtext() -> None:
    # Mail that asked for no SMTPUTF8 (an HTTP injection to a U-label domain, say): the report's
    # delivery-status part is ASCII, so the address goes in RFC 6533's escaped form.
    data, parsed = report(envelope(Recipient("ren+é@bücher.example")))
    (block,) = status_blocks(parsed)[1:]
    assert block["Final-Recipient"] == "utf-8; ren\\x{2B}\\x{E9}@b\\x{FC}cher.example"
    assert data.split(b"\r\n\r\n", 1)[0].isascii()


def test_a_global_delivery_status_report_says_so_in_its_report_type() -> None:
    # RFC 6522 3: report-type is the subtype of the second part.
    _, parsed = report(envelope(Recipient("renée@example.net"), smtputf8=True))
    assert parsed.get_param("report-type") == "global-delivery-status"
    assert parsed.get_payload()[1].get_content_type() == "message/global-delivery-status"


def test_utf8_headers_returned_under_ret_hdrs_go_as_message_global_headers() -> None:
    # RFC 6533 6.4: text/rfc822-headers holds ASCII only.
    original = "From: renée@example.org\r\nSubject: café\r\n\r\nbody\r\n".encode()
    env = envelope(Recipient("renée@example.net"), smtputf8=True, ret="HDRS")
    _, parsed = report(env, original=original)
    third = parsed.get_payload()[2]
    assert third.get_content_type() == "message/global-headers"
    assert "Subject: café".encode() in third.as_bytes()
    _, plain = report(envelope(ret="HDRS"))
    assert plain.get_payload()[2].get_content_type() == "text/rfc822-headers"


@pytest.mark.parametrize("smtputf8", [False, True], ids=["delivery-status", "global-delivery-status"])
def test_each_part_holding_8_bit_octets_is_labelled_8bit(smtputf8: bool) -> None:
    # RFC 2045 6.1: a part without Content-Transfer-Encoding is 7bit; a next hop may take it at its word.
    original = "From: alice@example.org\r\nSubject: s\r\n\r\nh\u00e9llo, 8-bit\r\n".encode()
    env = envelope(Recipient("renée@example.net" if smtputf8 else "bob@example.net"), smtputf8=smtputf8, ret="FULL")
    refused = Reply(550, "5.1.1", ("Benutzer unbekannt \u2013 \u00fcberpr\u00fcfen",))
    data, parsed = report(env, [Failure(env.recipients[0], refused, "failed")], original=original)
    text, status, returned = parsed.get_payload()
    assert text["Content-Transfer-Encoding"] == "8bit"
    assert "Benutzer unbekannt \u2013 \u00fcberpr\u00fcfen" in text.get_content()
    # message/delivery-status is ASCII (the reply escaped); message/global-delivery-status is not.
    assert status["Content-Transfer-Encoding"] == ("8bit" if smtputf8 else None)
    assert returned.get_content_type() == ("message/global" if smtputf8 else "message/rfc822")
    assert returned["Content-Transfer-Encoding"] == "8bit"
    assert original in data
    # A report all in ASCII says nothing of it: 7bit, as RFC 2045 6.1 reads a part that does not.
    _, ascii_only = report(envelope(ret="FULL"))
    assert all(part["Content-Transfer-Encoding"] is None for part in ascii_only.walk())


def test_an_envid_or_orcpt_with_a_line_break_cannot_add_fields_to_the_report() -> None:
    # What ServerSession decodes from "ENVID=q+0D+0AX-Injected:+201" and "ORCPT=rfc822;b+0D+0AX-Evil:+20y@example.net".
    env = envelope(Recipient("bob@example.net", orcpt="rfc822;b\r\nX-Evil: y@example.net"), envid="q\r\nX-Injected: 1")
    _, parsed = report(env)
    per_message, per_recipient = status_blocks(parsed)
    assert "X-Injected" not in per_message
    assert "X-Evil" not in per_recipient


@pytest.mark.parametrize(
    ("notify", "wanted"),
    [
        (None, True),
        (["NEVER"], False),
        (["SUCCESS"], False),
        (["DELAY"], False),
        (["FAILURE"], True),
        (["FAILURE", "DELAY"], True),
        (["SUCCESS", "FAILURE"], True),
    ],
)
def test_wants_failure_notice_follows_notify(notify: list[str] | None, wanted: bool) -> None:
    assert wants_failure_notice(Recipient("bob@example.net", notify=notify)) is wanted


GREYLISTED = Reply(451, "4.7.1", ("greylisted, try again later",))
RETRY_UNTIL = ARRIVAL + 5 * 86400


def test_a_delay_report_says_it_is_a_warning_until_when_it_is_retried_and_returns_the_headers() -> None:
    delayed = [Failure(Recipient("bob@example.net"), GREYLISTED, "delayed", "mx.example.net", retry_until=RETRY_UNTIL)]
    data, parsed = report(envelope(ret="FULL"), delayed)  # (RET is for failures: headers all the same)
    assert parsed["Subject"] == "Delayed Mail (still being retried)"
    [_, block] = status_blocks(parsed)
    assert (block["Action"], block["Status"]) == ("delayed", "4.7.1")
    assert block["Diagnostic-Code"] == "smtp; 451 4.7.1 greylisted, try again later"
    assert block["Will-Retry-Until"] == "Sun, 19 Nov 2023 22:13:20 +0000"
    text = parsed.get_payload()[0].get_content()
    assert text.startswith(f"This is the mail system at host {HOSTNAME}.\r\n\r\nTHIS IS A WARNING ONLY.")
    assert "It will be tried again until Sun, 19 Nov 2023 22:13:20 +0000," in text
    assert "Its headers are attached below;" in text
    assert "<bob@example.net>: greylisted, try again later" in text
    assert parsed.get_payload()[2].get_content_type() == "text/rfc822-headers"
    assert b"first body line" not in data


def test_failures_and_delays_of_one_settlement_are_one_report_that_says_both() -> None:
    failures = [
        Failure(Recipient("gone@example.net"), USER_UNKNOWN, "failed", "mx.example.net"),
        Failure(Recipient("late@example.net"), GREYLISTED, "delayed", "mx.example.net", retry_until=RETRY_UNTIL),
    ]
    _, parsed = report(envelope(), failures)
    assert parsed["Subject"] == "Undelivered Mail Returned to Sender"
    assert [(b["Action"], b["Will-Retry-Until"]) for b in status_blocks(parsed)[1:]] == [
        ("failed", None),
        ("delayed", "Sun, 19 Nov 2023 22:13:20 +0000"),
    ]
    text = parsed.get_payload()[0].get_content()
    assert text.count("attached below") == 1 and "The reasons it is still waiting are:" in text
