"""DSN parameters are xtext: decoded exactly, and never a way to inject header fields."""

from __future__ import annotations

import pytest

from pigeon.smtp.events import MailFrom, RcptTo

from .harness import Peer


@pytest.mark.parametrize(
    "command",
    [
        "MAIL FROM:<a@example.org> ENVID=q+0D+0AX-Injected:+201",
        "MAIL FROM:<a@example.org> ENVID=caf+E9",  # +E9 alone is not UTF-8
    ],
)
def test_envid_with_control_characters_or_bad_octets_is_refused(command: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send(command + "\r\n").startswith("501 5.5.4 ENVID ")


def test_orcpt_with_an_encoded_line_break_is_refused() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    reply = peer.send("RCPT TO:<b@example.net> ORCPT=rfc822;b+0D+0AX-Evil:+20y@example.net\r\n")
    assert reply.startswith("501 5.5.4 ORCPT ")


@pytest.mark.parametrize(
    ("orcpt", "reply"),
    [
        ("utf-8;\\x{ZZZ}@y.test", "501 5.5.4 ORCPT utf-8 address is malformed: \\ must start \\x{HEX}"),
        ("utf-8;a\\b@y.test", "501 5.5.4 ORCPT utf-8 address is malformed: \\ must start \\x{HEX}"),
        ("utf-8;\\x{D800}@y.test", "501 5.5.4 ORCPT \\x{D800} is no Unicode character (RFC 6533)"),
        ("utf-8;\\x{110000}@y.test", "501 5.5.4 ORCPT \\x{110000} is no Unicode character (RFC 6533)"),
        ("utf-8;\\x{0}\\x{1B}[31m@y.test", "501 5.5.4 ORCPT must not contain control characters"),
    ],
)
def test_a_utf8_orcpt_with_a_bad_escape_is_refused_naming_it(orcpt: str, reply: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send(f"RCPT TO:<b@example.net> ORCPT={orcpt}\r\n") == reply + "\r\n"


def test_a_utf8_orcpt_with_escapes_of_characters_is_taken() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send("RCPT TO:<b@example.net> ORCPT=utf-8;ren\\x{E9}\\x{1F600}\\x{2B}@y.test\r\n").startswith("250 ")


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        # U+202E then é, as xtext: what the DSN's Original-Envelope-Id could not give back as sent.
        ("ENVID=a+E2+80+AEb+C3+A9", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("ENVID=caf+C3+A9", "U+00E9 LATIN SMALL LETTER E WITH ACUTE"),
        # SMTPUTF8 extends addresses (RFC 6531), not ENVID: still printable ASCII.
        ("SMTPUTF8 ENVID=caf+C3+A9", "U+00E9 LATIN SMALL LETTER E WITH ACUTE"),
    ],
)
def test_an_envid_that_is_not_printable_ascii_once_decoded_is_refused_at_mail(parameters: str, named: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    reply = peer.send(f"MAIL FROM:<a@example.org> {parameters}\r\n")
    assert reply == f"501 5.5.4 ENVID must be printable ASCII once decoded (RFC 3461 4.4): it holds {named}\r\n"


def test_an_envid_of_printable_ascii_with_spaces_is_taken() -> None:
    # RFC 3461 4.4: graphic characters and white space; "+", "=" and space go as +HH.
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send("MAIL FROM:<a@example.org> ENVID=batch+207+2Bx+3Dy~\r\n").startswith("250 ")
    (mail,) = peer.of_type(MailFrom)
    assert mail.envid == "batch 7+x=y~"


@pytest.mark.parametrize("smtputf8", ["", " SMTPUTF8"])
def test_an_rfc822_orcpt_with_letters_outside_ascii_is_taken_as_relays_before_rfc_6533_send_it(smtputf8: str) -> None:
    # RFC 3461 4.2 wants ASCII there, but refusing it would refuse the recipient.
    peer = Peer.start()
    peer.send(f"EHLO client.test\r\nMAIL FROM:<a@example.org>{smtputf8}\r\n")
    assert peer.send("RCPT TO:<b@example.net> ORCPT=rfc822;ren+C3+A9@y.test\r\n").startswith("250 ")
    (rcpt,) = peer.of_type(RcptTo)
    assert rcpt.orcpt == "rfc822;ren\u00e9@y.test"


_HIDDEN = [
    ("\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("\u200b", "U+200B ZERO WIDTH SPACE"),
    ("\u0085", "U+0085"),  # NEL: a C1 control, which has no name
    ("\u2028", "U+2028 LINE SEPARATOR"),
    ("\u00a0", "U+00A0 NO-BREAK SPACE"),
    ("\ue000", "U+E000"),  # private use
]
_FORMS = {
    "rfc822 xtext": lambda c: "rfc822;a" + "".join(f"+{b:02X}" for b in c.encode()) + "b@y.test",
    "utf-8 escape": lambda c: f"utf-8;a\\x{{{ord(c):X}}}b@y.test",
    "utf-8 as it is": lambda c: f"utf-8;a{c}b@y.test",
}


@pytest.mark.parametrize("form", list(_FORMS))
@pytest.mark.parametrize(("hidden", "named"), _HIDDEN)
def test_an_orcpt_with_an_invisible_or_format_character_is_refused_naming_it_in_every_form(
    form: str, hidden: str, named: str
) -> None:
    # One rule for RFC 3461's rfc822 and RFC 6533's utf-8 form: a DSN could show neither as sent.
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org> SMTPUTF8\r\n")
    orcpt = _FORMS[form](hidden)
    addr_type = orcpt.partition(";")[0]
    assert peer.send(f"RCPT TO:<b@example.net> ORCPT={orcpt}\r\n") == (
        f"501 5.5.4 ORCPT {addr_type} address must hold no invisible or format characters once decoded:"
        f" it holds {named}\r\n"
    )
    assert not peer.of_type(RcptTo)


@pytest.mark.parametrize("orcpt", ["rfc822;a+1Bb@y.test", "utf-8;a\\x{1B}b@y.test", "utf-8;a\tb@y.test"])
def test_an_orcpt_with_an_ascii_control_is_refused_in_every_form(orcpt: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org> SMTPUTF8\r\n")
    reply = peer.send(f"RCPT TO:<b@example.net> ORCPT={orcpt}\r\n")
    assert reply == "501 5.5.4 ORCPT must not contain control characters\r\n"


def test_a_utf8_orcpt_as_utf8_under_smtputf8_is_taken_as_sent() -> None:
    # RFC 6533 3: utf-8-addr-unitext in an SMTPUTF8 transaction, utf-8-addr-xtext in any.
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org> SMTPUTF8\r\n")
    assert peer.send("RCPT TO:<b@example.net> ORCPT=utf-8;ren\u00e9\\x{1F600}@y.test\r\n").startswith("250 ")
    (rcpt,) = peer.of_type(RcptTo)
    assert rcpt.orcpt == "utf-8;ren\u00e9\\x{1F600}@y.test"
