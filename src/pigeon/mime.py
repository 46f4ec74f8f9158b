"""A lean MIME writer for the messages Pigeon builds (injection from parts, per recipient).

Python's `email` package builds a tree of objects and re-parses every header it is given;
for one message that is fine, for a 100-recipient request it was most of the cost (about
1.5 ms per recipient). The structures needed here are few and fixed, so this writes them
directly: 7bit where the text allows it, quoted-printable otherwise, base64 for attachments,
RFC 2047 encoded words for non-ASCII header text, CRLF throughout.

    multipart/mixed                  (only with attachments)
      multipart/related              (only with inline parts and HTML)
        multipart/alternative        (only with both text and HTML)
          text/plain
          text/html
        inline parts
      attachments
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import re
import secrets
from dataclasses import dataclass
from email.header import Header
from typing import Final

_MAX_LINE: Final = 998
_FOLD_AT: Final = 76
# What RFC 5322 allows in an unstructured header as it is: printable ASCII and spaces.
_PLAIN: Final = re.compile(r"[\x20-\x7e]*")
_PLAIN_TEXT: Final = re.compile(r"[\x20-\x7e\t\n]*")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Part:
    """A finished MIME part: its header lines and encoded body, CRLF-terminated."""

    headers: bytes
    body: bytes

    def to_bytes(self) -> bytes:
        return self.headers + b"\r\n" + self.body


def text_part(text: str, subtype: str) -> Part:
    """text/<subtype> in UTF-8: 7bit when it is short-lined printable ASCII, else quoted-printable
    (control characters as they are are read back differently by mail readers)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if _PLAIN_TEXT.fullmatch(text) and all(len(line) <= _MAX_LINE for line in text.split("\n")):
        body, encoding = text.encode("ascii"), "7bit"
    else:
        # Quoted-printable of the UTF-8 bytes; soft line breaks keep lines within 76 columns.
        body, encoding = binascii.b2a_qp(text.encode("utf-8", "surrogatepass"), istext=True), "quoted-printable"
    body = body.replace(b"\n", b"\r\n")
    if not body.endswith(b"\r\n"):
        body += b"\r\n"
    headers = f'Content-Type: text/{subtype}; charset="utf-8"\r\nContent-Transfer-Encoding: {encoding}\r\n'
    return Part(headers.encode(), body)


def binary_part(data: bytes, content_type: str, *, file_name: str | None, content_id: str | None) -> Part:
    """An attachment (or, with a content id, an inline part), base64 in 76-column lines."""
    lines = [f"Content-Type: {content_type}"]
    if file_name:
        lines[0] += f"; name={_parameter(file_name)}"
    disposition = "inline" if content_id else "attachment"
    lines.append(f"Content-Disposition: {disposition}" + (f"; filename={_parameter(file_name)}" if file_name else ""))
    if content_id:
        lines.append(f"Content-ID: <{content_id}>")
    lines.append("Content-Transfer-Encoding: base64")
    body = base64.encodebytes(data).replace(b"\n", b"\r\n")
    return Part(("\r\n".join(lines) + "\r\n").encode("utf-8"), body)


def multipart(subtype: str, parts: list[Part]) -> Part:
    boundary = f"=_pigeon_{secrets.token_hex(12)}"
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + part.to_bytes() for part in parts)
    body += b"--" + boundary.encode() + b"--\r\n"
    return Part(f'Content-Type: multipart/{subtype}; boundary="{boundary}"\r\n'.encode(), body)


def header(name: str, value: str) -> str:
    """`Name: value` with CRLF, as encoded words when the value is not plain short ASCII."""
    value = " ".join(value.split())  # no line breaks can be smuggled into a header
    if _PLAIN.fullmatch(value) is None:
        encoded = Header(value, "utf-8", header_name=name).encode(linesep="\r\n", maxlinelen=_FOLD_AT)
        return f"{name}: {encoded}\r\n"
    if len(name) + 2 + len(value) <= _FOLD_AT:
        return f"{name}: {value}\r\n"
    words = value.split(" ")
    # Folding only happens between words: one that cannot fit on a line of its own (or the
    # first, beside the name) would start the value with a fold, which readers take as a space.
    if len(name) + 2 + len(words[0]) > _FOLD_AT or max(map(len, words)) >= _FOLD_AT:
        encoded = Header(value, "utf-8", header_name=name).encode(linesep="\r\n", maxlinelen=_FOLD_AT)
        return f"{name}: {encoded}\r\n"
    encoded = Header(value, "us-ascii", header_name=name).encode(linesep="\r\n", maxlinelen=_FOLD_AT)
    return f"{name}: {encoded}\r\n"


def address(name: str, addr: str) -> str:
    """A mailbox for From/To/Reply-To: the display name quoted or encoded as needed."""
    if not name:
        return addr if addr.isascii() else f"<{addr}>"
    name = " ".join(name.split())
    if _CONTROL.search(name):
        # Control characters as they are confuse readers (some take \x1c-\x1e for line ends).
        return f"{Header(name, 'utf-8').encode()} <{addr}>"
    if not addr.isascii():  # SMTPUTF8: UTF-8 is allowed as it is, in a quoted name too
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{quoted}" <{addr}>'
    return email.utils.formataddr((name, addr), charset="utf-8")


def _parameter(value: str) -> str:
    """A quoted MIME parameter value; non-ASCII as an RFC 2047 word (what mail clients read)."""
    if value.isascii():
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    # Folded past 76 characters, like every header line: with CRLF, never a bare LF.
    return '"' + Header(value, "utf-8").encode(linesep="\r\n") + '"'
