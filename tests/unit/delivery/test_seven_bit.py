"""The 7-bit form of 8-bit mail for a next hop without 8BITMIME (`pigeon.delivery.seven_bit`):
each 8-bit leaf part quoted-printable (a `binary` one base64), decoded to the octets it had,
in ASCII lines a hop takes; and None where no 7-bit form keeps the message as it was."""

from __future__ import annotations

import asyncio
import base64
import binascii
import email
import email.policy
import re
from email.message import EmailMessage

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.delivery.seven_bit import NoSevenBitForm, SevenBitHop, convert, seven_bit
from pigeon.message import Envelope, Message, Recipient

HEAD = b"From: a@example.org\r\nTo: b@example.net\r\nSubject: hi\r\n"
UTF8 = "Grüße, naïve café\r\n".encode()


def _split(entity: bytes) -> tuple[bytes, bytes]:
    head, _, body = entity.partition(b"\r\n\r\n")
    return head + b"\r\n", body


def _field(head: bytes, name: bytes) -> list[bytes]:
    return re.findall(rb"(?im)^" + name + rb":[ \t]*([^\r\n]*)", head)


def _decoded(entity: bytes) -> bytes:
    """An entity's body, decoded by its Content-Transfer-Encoding."""
    head, body = _split(entity)
    (encoding,) = _field(head, b"content-transfer-encoding") or [b"7bit"]
    if encoding.lower() == b"quoted-printable":
        return binascii.a2b_qp(body)
    if encoding.lower() == b"base64":
        return base64.b64decode(body)
    return body


def _parsed(data: bytes) -> EmailMessage:
    parsed = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    assert not parsed.defects and all(not part.defects for part in parsed.walk())
    return parsed


def _text(part: EmailMessage) -> str:
    """A text part's content as a reader shows it: its line ends one."""
    content = part.get_content()
    assert isinstance(content, str)
    return content.replace("\r\n", "\n")


def _lines_fit(data: bytes, limit: int = 998) -> bool:
    return all(len(line) <= limit for line in data.split(b"\r\n"))


def test_mail_without_mime_fields_gets_them_and_its_body_goes_quoted_printable() -> None:
    out = seven_bit(HEAD + b"\r\n" + UTF8)
    assert out is not None and out.isascii()
    head, body = _split(out)
    assert head.startswith(HEAD)
    assert _field(head, b"mime-version") == [b"1.0"]
    assert _field(head, b"content-type") == [b"text/plain; charset=utf-8"]
    assert _field(head, b"content-transfer-encoding") == [b"quoted-printable"]
    assert body == b"Gr=C3=BC=C3=9Fe, na=C3=AFve caf=C3=A9\r\n"
    assert _text(_parsed(out)) == UTF8.decode().replace("\r\n", "\n")


def test_an_8bit_body_that_is_not_utf8_is_said_to_be_of_an_unknown_8bit_charset() -> None:
    out = seven_bit(HEAD + b"\r\nh\xe9llo\r\n")
    assert out is not None
    assert _field(_split(out)[0], b"content-type") == [b"text/plain; charset=unknown-8bit"]
    assert _decoded(out) == b"h\xe9llo\r\n"


def test_a_single_part_8bit_message_says_quoted_printable_in_place_of_8bit() -> None:
    head = HEAD + b"MIME-Version: 1.0\r\nContent-Transfer-Encoding: 8bit\r\nContent-Type: text/plain; charset=utf-8\r\n"
    out = seven_bit(head + b"\r\n" + UTF8)
    assert out is not None
    new_head, _ = _split(out)
    assert new_head == head.replace(b": 8bit", b": quoted-printable")  # (in its place, nothing else touched)
    assert _decoded(out) == UTF8


def test_a_mime_message_without_mime_version_gets_it_when_a_field_of_its_own_changes() -> None:
    out = seven_bit(HEAD + b"Content-Type: text/plain; charset=utf-8\r\n\r\n" + UTF8)
    assert out is not None
    head, _ = _split(out)
    assert _field(head, b"mime-version") == [b"1.0"]
    assert _field(head, b"content-transfer-encoding") == [b"quoted-printable"]


def test_quoted_printable_lines_are_76_at_most_with_equals_and_trailing_white_space_encoded() -> None:
    text = ("é" * 100 + " = x \t\r\nshort line\r\n").encode()
    out = seven_bit(HEAD + b"\r\n" + text)
    assert out is not None
    _, body = _split(out)
    assert all(len(line) <= 76 for line in body.split(b"\r\n"))
    assert b"=3D" in body and body.endswith(b"x =09\r\nshort line\r\n")
    assert b"=\r\n" in body  # (soft line breaks)
    assert _decoded(out) == text


MULTIPART = (
    HEAD + b"MIME-Version: 1.0\r\n"
    b'Content-Type: multipart/mixed; boundary="=_b"\r\n'
    b"\r\n"
    b"This is a multipart message.\r\n"
    b"--=_b\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Transfer-Encoding: 8bit\r\n"
    b"\r\n" + UTF8 + b"--=_b\r\n"
    b"Content-Type: application/octet-stream\r\n"
    b'Content-Disposition: attachment; filename="x.bin"\r\n'
    b"Content-Transfer-Encoding: base64\r\n"
    b"\r\n"
    b"AAECA/8=\r\n"
    b"--=_b--\r\n"
    b"epilogue\r\n"
)


def test_a_multipart_has_its_8bit_text_quoted_printable_and_its_base64_attachment_untouched() -> None:
    out = seven_bit(MULTIPART)
    assert out is not None and out.isascii()
    parts = out.split(b"\r\n--=_b")
    assert parts[0] == MULTIPART.split(b"\r\n--=_b")[0]  # the header section and preamble
    text = parts[1].removeprefix(b"\r\n")
    assert _field(_split(text)[0], b"content-transfer-encoding") == [b"quoted-printable"]
    assert _decoded(text) == UTF8.removesuffix(b"\r\n")  # (the CRLF before a delimiter is the delimiter's)
    assert parts[2:] == MULTIPART.split(b"\r\n--=_b")[2:]  # the attachment, the close delimiter, the epilogue
    text_part, attachment = _parsed(out).iter_parts()
    assert _text(text_part) == "Grüße, naïve café"
    assert attachment.get_content() == b"\x00\x01\x02\x03\xff"


def test_a_nested_multipart_and_an_8bit_preamble_are_made_7bit() -> None:
    inner = (
        b'Content-Type: multipart/alternative; boundary="in"\r\n\r\n--in\r\n'
        b"Content-Type: text/plain; charset=utf-8\r\n\r\n" + UTF8 + b"--in\r\n"
        b"Content-Type: text/html; charset=utf-8\r\n\r\n<p>" + UTF8 + b"</p>\r\n--in--\r\n"
    )
    message = (
        HEAD + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="out"\r\n\r\n'
        b"pr\xc3\xa9ambule\r\n--out\r\n" + inner + b"--out--\r\n"
    )
    out = seven_bit(message)
    assert out is not None and out.isascii()
    plain, html = _parsed(out).get_payload()[0].get_payload()
    assert _text(plain) == "Grüße, naïve café"
    assert _text(html) == "<p>Grüße, naïve café\n</p>"


def test_an_8bit_message_rfc822_part_has_its_inner_message_converted_and_says_7bit() -> None:
    inner = b"From: c@example.org\r\nSubject: inner\r\n\r\n" + UTF8
    message = (
        HEAD + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\n'
        b"Content-Type: message/rfc822\r\nContent-Transfer-Encoding: 8bit\r\n\r\n" + inner + b"--b--\r\n"
    )
    out = seven_bit(message)
    assert out is not None and out.isascii()
    (attached,) = _parsed(out).iter_parts()
    assert attached["Content-Transfer-Encoding"] == "7bit"
    (returned,) = attached.iter_parts()
    assert returned["Subject"] == "inner" and returned["Content-Transfer-Encoding"] == "quoted-printable"
    assert _text(returned) == "Grüße, naïve café"  # (its last CRLF is the delimiter's)


def test_a_binary_part_goes_base64() -> None:
    message = HEAD + b"MIME-Version: 1.0\r\nContent-Type: image/png\r\nContent-Transfer-Encoding: binary\r\n\r\n"
    out = seven_bit(message + b"\x89PNG\r\n\x1a\n\x00\xff")
    assert out is not None and out.isascii()
    assert _field(_split(out)[0], b"content-transfer-encoding") == [b"base64"]
    assert _decoded(out) == b"\x89PNG\r\n\x1a\r\n\x00\xff"  # (a bare LF leaves as a CRLF, as ever)


def test_an_ascii_message_is_given_back_as_it_is() -> None:
    message = HEAD + b"\r\nhello\r\n"
    assert seven_bit(message) is message


def test_8bit_header_fields_have_no_7bit_form() -> None:
    assert seven_bit(HEAD + "Subject: café\r\n\r\nplain\r\n".encode()) is None
    # A part's own header section, too (a raw UTF-8 file name).
    part_field = MULTIPART.replace(b'filename="x.bin"', 'filename="é.bin"'.encode())
    assert seven_bit(part_field) is None


def test_convert_says_why_a_message_has_no_7bit_form() -> None:
    with pytest.raises(NoSevenBitForm, match=r"^8-bit data in its header section, which has no 7-bit form$"):
        convert(HEAD + "Subject: café\r\n\r\nplain\r\n".encode())
    part_field = MULTIPART.replace(b'filename="x.bin"', 'filename="é.bin"'.encode())
    with pytest.raises(NoSevenBitForm, match="header section of a MIME part"):
        convert(part_field)
    single = HEAD + b"MIME-Version: 1.0\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    with pytest.raises(NoSevenBitForm, match="a part that says it is 'base64'"):
        convert(single + UTF8)


def test_bodies_that_cannot_be_reencoded_have_no_7bit_form() -> None:
    single = HEAD + b"MIME-Version: 1.0\r\nContent-Type: text/plain\r\n"
    for encoding in (b"quoted-printable", b"base64", b"x-uuencode"):
        assert seven_bit(single + b"Content-Transfer-Encoding: " + encoding + b"\r\n\r\n" + UTF8) is None
    for kind in (b"message/partial; id=x", b"message/external-body; access-type=x"):
        assert seven_bit(HEAD + b"MIME-Version: 1.0\r\nContent-Type: " + kind + b"\r\n\r\n" + UTF8) is None
    assert seven_bit(HEAD + b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n\r\n" + UTF8) is None
    nested = UTF8
    for _ in range(40):
        nested = b"Content-Type: message/rfc822\r\n\r\n" + nested
    assert seven_bit(HEAD + b"MIME-Version: 1.0\r\n" + nested) is None


# --- properties ------------------------------------------------------------------------------
_LINE = st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_TEXT = st.lists(_LINE, max_size=8).map(lambda lines: b"".join(line + b"\r\n" for line in lines))


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_any_single_part_body_decodes_to_its_octets_from_ascii_lines(body: bytes) -> None:
    out = seven_bit(HEAD + b"\r\n" + body)
    assert out is not None and out.isascii() and _lines_fit(out)
    assert _decoded(out) == body


_ENCODINGS = st.sampled_from([None, b"7bit", b"8bit", b"binary"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TEXT, _ENCODINGS), min_size=1, max_size=4))
def test_each_part_of_any_multipart_decodes_to_its_octets(parts: list[tuple[bytes, bytes | None]]) -> None:
    boundary = b"=_pigeon_boundary"  # ("=_" cannot begin a line of quoted-printable, nor "-" be a part's)
    body = b""
    for content, encoding in parts:
        body += b"--" + boundary + b"\r\nContent-Type: text/plain\r\n"
        if encoding is not None:
            body += b"Content-Transfer-Encoding: " + encoding + b"\r\n"
        body += b"\r\n" + content.replace(b"-", b"") + b"\r\n"
    message = HEAD + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="' + boundary + b'"\r\n\r\n'
    message += body + b"--" + boundary + b"--\r\n"
    out = seven_bit(message)
    assert out is not None and out.isascii() and _lines_fit(out)
    written = out.split(b"\r\n--" + boundary)
    assert len(written) == len(parts) + 2 and written[-1] == b"--\r\n"  # (the close delimiter's end)
    for (content, _), entity in zip(parts, written[1:-1], strict=True):
        assert _decoded(entity.removeprefix(b"\r\n")) == content.replace(b"-", b"")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_octets_give_ascii_or_none_and_never_raise(tail: bytes) -> None:
    out = seven_bit(HEAD + b"MIME-Version: 1.0\r\n" + tail)
    assert out is None or out.isascii()


# --- the delivery's side: signatures ---------------------------------------------------------
SIGNATURE = b"DKIM-Signature: v=1; a=ed25519-sha256; d=example.org; s=s; b=old\r\n"


def _message(envelope: Envelope) -> Message:
    return Message(id=1, queue="q", envelope=envelope, created=0.0, size=0, body_id=1)


def test_pigeons_own_signature_comes_off_and_the_7bit_form_is_signed_again() -> None:
    upstream = b"DKIM-Signature: v=1; d=sender.example; b=theirs\r\n"
    stored = upstream + HEAD + b"\r\n" + UTF8
    envelope = Envelope("a@example.org", [Recipient("b@example.net")], dkim_signatures=SIGNATURE, tenant="acme")
    signed: list[tuple[str | None, bytes]] = []

    async def sign(message: Message, data: bytes) -> bytes:
        signed.append((message.envelope.tenant, data))
        return b"DKIM-Signature: new\r\n"

    out, failed = asyncio.run(SevenBitHop(convert=True, sign=sign)(_message(envelope), SIGNATURE + stored))
    converted = seven_bit(stored)
    assert failed is None and converted is not None
    assert out == b"DKIM-Signature: new\r\n" + converted  # (the upstream one stays: not Pigeon's to make)
    assert signed == [("acme", converted)]


def test_without_a_signer_now_the_7bit_form_leaves_without_pigeons_signature() -> None:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")], dkim_signatures=SIGNATURE)

    async def none(message: Message, data: bytes) -> None:
        return None

    out, failed = asyncio.run(
        SevenBitHop(convert=True, sign=none)(_message(envelope), SIGNATURE + HEAD + b"\r\n" + UTF8)
    )
    assert failed is None and out == seven_bit(HEAD + b"\r\n" + UTF8)


def test_a_signing_that_fails_defers_the_message_rather_than_send_it_unsigned() -> None:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")], dkim_signatures=SIGNATURE)

    async def broken(message: Message, data: bytes) -> bytes:
        raise RuntimeError("the signing process died")

    out, failed = asyncio.run(
        SevenBitHop(convert=True, sign=broken)(_message(envelope), SIGNATURE + HEAD + b"\r\n" + UTF8)
    )
    assert out is None and failed is not None
    assert (failed.code, failed.enhanced) == (451, "4.3.0") and "the signing process died" in failed.text


def test_with_conversion_off_only_a_report_of_pigeons_own_goes_7bit() -> None:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")])
    out, failed = asyncio.run(SevenBitHop(convert=False)(_message(envelope), HEAD + b"\r\n" + UTF8))
    assert (out, failed) == (None, None)
