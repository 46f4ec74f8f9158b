"""The MIME writer: what the email package (as a mail client would) reads back from it."""

from __future__ import annotations

import email.utils
import re
from email import message_from_bytes, message_from_string
from email.header import decode_header, make_header
from email.message import EmailMessage
from email.policy import default, strict
from typing import Final

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon import mime
from pigeon.smtp import address


def _parse(head: str, part: mime.Part) -> EmailMessage:
    message = message_from_bytes(head.encode() + b"MIME-Version: 1.0\r\n" + part.to_bytes(), policy=default)
    assert isinstance(message, EmailMessage)
    return message


@given(st.text(min_size=0, max_size=300))
# Found by the atheris fuzzer: a word too long for the first line was folded onto the next,
# which readers took as a leading space; control characters went out as they were.
@example("x" * 200)
@example("\x7f" * 69 + "*\n\x1a")
def test_any_subject_reads_back_as_written_on_one_logical_line(subject: str) -> None:
    head = mime.header("Subject", subject)
    assert all(len(line) <= 78 for line in head.split("\r\n"))
    assert head.isascii()
    message = _parse(head, mime.text_part("x", "plain"))
    assert message["Subject"] == mime.one_line(subject)


@pytest.mark.parametrize(
    "subject", ["件名\u3000テスト\u202fok", "  two  spaces   inside   ", "a\u00a0b\tc", "word " * 30 + " two  spaces"]
)
def test_a_subject_keeps_its_own_white_space_unicode_tabs_and_runs(subject: str) -> None:
    head = mime.header("Subject", subject)
    assert all(len(line) <= 76 for line in head.split("\r\n"))
    message = message_from_bytes(head.encode() + b"\r\nx\r\n", policy=strict)
    assert message["Subject"] == subject


def test_a_header_value_cannot_smuggle_another_header() -> None:
    head = mime.header("Subject", "hello\r\nBcc: victim@example.net")
    message = _parse(head, mime.text_part("x", "plain"))
    assert message["Bcc"] is None
    assert message["Subject"] == "hello Bcc: victim@example.net"


@given(st.text(min_size=0, max_size=2000))
def test_any_text_reads_back_as_written(text: str) -> None:
    message = _parse("", mime.text_part(text, "plain"))
    expected = text.replace("\r\n", "\n").replace("\r", "\n")
    got = message.get_content().replace("\r\n", "\n")
    assert got.rstrip("\n") == expected.rstrip("\n")


def test_names_with_specials_and_non_ascii_are_quoted_or_encoded() -> None:
    head = mime.address_header("From", 'Smith, "J" Müller', "j@example.org")
    head += mime.address_header("To", "A. Person", "a@example.net")
    message = _parse(head, mime.text_part("x", "plain"))
    assert message["From"].addresses[0].display_name == 'Smith, "J" Müller'
    assert message["To"].addresses[0].display_name == "A. Person"


def _mailbox(field: str) -> tuple[str, str]:
    """The display name and address of a one-mailbox field, read as RFC 2047 6.2 says: the
    white space between two encoded words dropped (which `email.headerregistry` keeps)."""
    value = field.partition(":")[2].replace("\r\n", "")
    name, addr = email.utils.parseaddr(value)
    return str(make_header(decode_header(name))), addr


_ENCODED_WORD: Final = re.compile(r"=\?[^?\s]*\?[qb]\?[^?\s]*\?=")


@pytest.mark.parametrize(
    ("name", "addr", "field"),
    [
        # Only where the local part is not ASCII is the address written in UTF-8 (RFC 6532).
        ("Jörg", "jörg@bücher.example", "From: =?utf-8?q?J=C3=B6rg?= <jörg@bücher.example>"),
        ("Jörg", "joerg@Bücher.example", "From: =?utf-8?q?J=C3=B6rg?= <joerg@xn--bcher-kva.example>"),
        ("", "bob@bücher.example", "From: bob@xn--bcher-kva.example"),
        ("", "jörg@bücher.example", "From: <jörg@bücher.example>"),
        ("Ann", "ann@example.com", "From: Ann <ann@example.com>"),
        ("x" * 70, "a@example.org", "From: " + "x" * 70 + "\r\n <a@example.org>"),
    ],
)
def test_an_address_field_encodes_the_name_alone_and_writes_the_domain_as_its_a_label(
    name: str, addr: str, field: str
) -> None:
    assert mime.address_header("From", name, addr) == field + "\r\n"


@given(
    st.text(max_size=400),
    st.sampled_from(
        ["a@example.org", "jörg@bücher.example", "joerg@bücher.example", "x" * 64 + "@" + "d" * 60 + ".example"]
    ),
    st.sampled_from(["From", "To", "Reply-To"]),
)
# What the outside tester found: an all-ASCII word of 75 characters, or a Unicode address,
# made the whole field one encoded word, the address inside it.
@example("x" * 75, "a@example.org", "From")
@example("x" * 2000, "a@example.org", "Reply-To")
@example("Jörg", "jörg@bücher.example", "From")
@example("Jörg Müller " * 20, "a@example.org", "From")
@example("=?utf-8?q?x?=", "a@example.org", "From")
@example('"\\ "\\" x', "a@example.org", "From")
def test_any_name_reads_back_as_written_and_the_address_stays_an_address(name: str, addr: str, field: str) -> None:
    head = mime.address_header(field, name, addr)
    expected_addr = address.with_a_label(addr)
    lines = head.removesuffix("\r\n").split("\r\n")
    for line in lines:
        assert len(line.encode()) <= 998
        # Over 76 columns only the address or an ASCII word too long for any shorter line.
        assert len(line) <= 76 or f"<{expected_addr}>" in line or len(line.split()) <= 2, line
    assert all(len(word) <= 75 for word in _ENCODED_WORD.findall(head))
    assert head.isascii() == addr.partition("@")[0].isascii()
    read_name, read_addr = _mailbox(head)
    # (parseaddr trims the name: its own white space inside is what is compared)
    assert (read_name.strip(), read_addr) == (mime.one_line(name).strip(), expected_addr)
    message = message_from_string(head + "\r\nx\r\n", policy=default)  # a reader finds the address (UTF-8 too)
    assert message[field].addresses[0].addr_spec == expected_addr


def test_attachments_and_inline_parts_keep_their_bytes_names_and_ids() -> None:
    data = bytes(range(256)) * 10
    attachment = mime.binary_part(data, "application/octet-stream", file_name="Grüße.bin", content_id=None)
    logo = mime.binary_part(b"\x89PNG", "image/png", file_name=None, content_id="logo")
    related = mime.multipart("related", [mime.text_part('<img src="cid:logo">', "html"), logo])
    message = _parse("", mime.multipart("mixed", [related, attachment]))
    (attached,) = list(message.iter_attachments())
    assert attached.get_filename() == "Grüße.bin" and attached.get_content() == data
    image = next(p for p in message.walk() if p.get_content_type() == "image/png")
    assert image["Content-ID"] == "<logo>" and image.get_content() == b"\x89PNG"


def test_a_long_non_ascii_file_name_is_folded_with_crlf_and_reads_back() -> None:
    """RFC 2231 sections fold past 76 characters: the fold must be CRLF, as everywhere in a
    message (a bare LF there had the content check refuse every long non-ASCII attachment name)."""
    name = "Rechnung_für_Übersetzungsdienstleistungen_2026_März.pdf"
    part = mime.binary_part(b"%PDF", "application/pdf", file_name=name, content_id=None)
    raw = part.to_bytes()
    assert b"\n" not in raw.replace(b"\r\n", b"")
    message = _parse("", mime.multipart("mixed", [mime.text_part("x", "plain"), part]))
    (attached,) = list(message.iter_attachments())
    assert attached.get_filename() == name
    assert b"=?" not in raw and max(map(len, raw.split(b"\r\n"))) <= 76


@pytest.mark.parametrize("subject", ["=??Q??=", "=?utf-8?q?not_mine?=", "price =?", "a =?x?b?AAAA?= b"])
def test_a_subject_that_looks_like_an_encoded_word_reads_back_as_written(subject: str) -> None:
    message = _parse(mime.header("Subject", subject), mime.text_part("x", "plain"))
    assert message["Subject"] == subject
