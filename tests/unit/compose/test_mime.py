"""The MIME writer: what the email package (as a mail client would) reads back from it."""

from __future__ import annotations

from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default

from hypothesis import example, given
from hypothesis import strategies as st

from pigeon import mime


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
    assert message["Subject"] == " ".join(subject.split())


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
    head = mime.header("From", mime.address('Smith, "J" Müller', "j@example.org")) + mime.header(
        "To", mime.address("A. Person", "a@example.net")
    )
    message = _parse(head, mime.text_part("x", "plain"))
    assert message["From"].addresses[0].display_name == 'Smith, "J" Müller'
    assert message["To"].addresses[0].display_name == "A. Person"


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
    """Encoded words fold past 76 characters: the fold must be CRLF, as everywhere in a message
    (a bare LF there had the content check refuse every long non-ASCII attachment name)."""
    name = "Rechnung_für_Übersetzungsdienstleistungen_2026_März.pdf"
    part = mime.binary_part(b"%PDF", "application/pdf", file_name=name, content_id=None)
    raw = part.to_bytes()
    assert b"\n" not in raw.replace(b"\r\n", b"")
    message = _parse("", mime.multipart("mixed", [mime.text_part("x", "plain"), part]))
    (attached,) = list(message.iter_attachments())
    assert attached.get_filename() == name
