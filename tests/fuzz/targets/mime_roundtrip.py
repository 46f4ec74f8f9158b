"""The MIME writer, through the injection composer: whatever subject, names, headers, text,
HTML and attachments a request carries, the message is CRLF throughout with no bare CR or
LF, and a mail reader (the stdlib parser) reads back the same subject, text and bytes.

Attachment `file_name` and `content_id` are drawn without control characters: header values
with those are refused at the API (a 400 naming the field), not written."""

from __future__ import annotations

import base64
import email
import email.policy
import re
from typing import Final

import atheris

from pigeon.compose import Address, Attachment, Composer, InjectRecipient, InjectRequest, Parts
from pigeon.mime import one_line

_BARE: Final = re.compile(rb"\r(?!\n)|(?<!\r)\n")
_HEADER_NAMES: Final = ("X-Custom", "Keywords", "X-Campaign-Note")


def _text(fdp: atheris.FuzzedDataProvider, size: int) -> str:
    # No template syntax: this is about MIME, not Jinja2. No surrogates: JSON cannot carry them.
    text = fdp.ConsumeUnicodeNoSurrogates(size).replace("{", "(")
    return text


def _value(fdp: atheris.FuzzedDataProvider, size: int) -> str:
    # Without control characters (C0, DEL, C1): a file name with one is refused at the API.
    return "".join(c for c in _text(fdp, size) if not (c < " " or "\x7f" <= c <= "\x9f"))


def check(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    subject = _text(fdp, 80)
    from_name = _text(fdp, 30)
    headers = {name: _text(fdp, 60) for name in _HEADER_NAMES[: fdp.ConsumeIntInRange(0, 3)]}
    text = _text(fdp, 400) if fdp.ConsumeBool() else None
    html = _text(fdp, 200) if fdp.ConsumeBool() else None
    attachments = []
    for index in range(fdp.ConsumeIntInRange(0, 3)):
        content = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
        attachments.append(
            Attachment(
                data=base64.b64encode(content).decode(),
                base64=True,
                file_name=_value(fdp, 20) or None,
                content_id=(_value(fdp, 20) or f"cid{index}") if fdp.ConsumeBool() else None,
            )
        )
    parts = Parts(
        from_=Address("news@example.org", from_name),
        subject=subject,
        headers=headers,
        text=text,
        html=html,
        attachments=attachments,
    )
    request = InjectRequest("news@example.org", [InjectRecipient("ann@example.net")], parts)
    composed = Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0])
    raw = composed.data
    assert not _BARE.search(raw), "a bare CR or LF in a composed message"
    assert all(len(line) <= 998 for line in raw.split(b"\r\n")), "a line longer than 998 octets"

    message = email.message_from_bytes(raw, policy=email.policy.default)
    # The text as given, its own white space too (U+3000, tabs, runs of spaces), but for line breaks.
    assert str(message["Subject"] or "") == one_line(subject), (message["Subject"], subject)
    for name, value in headers.items():
        assert str(message[name] or "") == one_line(value), (name, message[name], value)
    # A lone text part's 7bit body comes back with its CRLFs (a multipart's parts with LFs).
    bodies = {
        part.get_content_type(): _lines(part.get_content())
        for part in message.walk()
        if part.get_content_maintype() == "text"
    }
    if text is not None:
        assert bodies["text/plain"].rstrip("\n") == _lines(text).rstrip("\n"), (bodies["text/plain"], text)
    if html is not None:
        assert bodies["text/html"].rstrip("\n") == _lines(html).rstrip("\n")
    found = [part.get_content() for part in message.walk() if part.get_content_maintype() == "application"]
    assert found == [base64.b64decode(a.data) for a in _in_order(attachments, html is not None)]


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _in_order(attachments: list[Attachment], has_html: bool) -> list[Attachment]:
    """Inline parts come first (in multipart/related, or first among the attachments)."""
    inline = [a for a in attachments if a.content_id]
    return inline + [a for a in attachments if not a.content_id]
