"""8-bit mail made 7-bit for a next hop without 8BITMIME (RFC 6152), as Postfix does by default
(`disable_mime_output_conversion = no`), rather than refused there.

`seven_bit(message)` is pure: the message's bytes (CRLF lines, as they leave) in, its 7-bit
form out, or None when it has none. It walks the MIME structure (RFC 2045, 2046):

* a leaf part (a single-part message too) whose body holds 8-bit octets and whose
  Content-Transfer-Encoding is absent, `7bit` or `8bit` is re-encoded quoted-printable (RFC
  2045 6.7: lines of at most 76 characters, soft line breaks, "=" and white space at a line's
  end encoded, each CRLF of the body a hard line break), its field saying so; one that says
  `binary` goes base64 (its octets, CRLFs included, are its content);
* a multipart is read by its boundary, each part in turn (its preamble and epilogue, which
  no reader shows, quoted-printable too where they are 8-bit); a `message/rfc822` part is a
  message, made 7-bit the same way (RFC 2046 5.2.1 allows it no other encoding than 7bit,
  8bit or binary, so it cannot be quoted-printable whole); a container that said `8bit` or
  `binary` says `7bit` once what it holds is;
* a message without MIME fields gets them: `MIME-Version: 1.0`, `Content-Type: text/plain;
  charset=utf-8` (`charset=unknown-8bit` when its body is not UTF-8, RFC 1428) and the
  encoding; a MIME message without MIME-Version gets that field when a field of its own changes.

None (`convert`: NoSevenBitForm, saying why; the message is refused there as before, `554 5.6.3`,
the reply ending with that reason): 8-bit octets in a header section
(a raw UTF-8 Subject, a part's file name: no 7-bit form keeps them as the reader saw them, RFC
2047 words would be a guess at where the words are), 8-bit octets in a body that says it is
quoted-printable or base64 already (broken, and read differently by each reader), in a part of
an unknown encoding, in a `message/partial` or `message/external-body` (7bit only, RFC 2046
5.2), or in a multipart without a boundary; and a structure nested deeper than `_DEEPEST`.

What is not 8-bit is left byte for byte as it was: only the fields and bodies of the parts that
change are written again.
"""

from __future__ import annotations

import base64
import binascii
import email.message
import re
from collections.abc import Awaitable, Callable
from typing import Final

from pigeon.delivery.dsn import for_seven_bit_hop
from pigeon.dkim.canonical import header_fields, split_message
from pigeon.message import Message
from pigeon.mime import is_utf8
from pigeon.smtp.framing import crlf_lines
from pigeon.smtp.replies import Reply

_DEEPEST: Final = 32  # MIME levels followed; a message nested deeper (a bomb, or a test) has no 7-bit form here
_PASSED_ON: Final = frozenset({b"", b"7bit", b"8bit"})  # encodings whose 8-bit body may be re-encoded
_ENCODING: Final = re.compile(rb"[ \t\r\n]*([!-~]*)")
_MIME_FIELDS: Final = frozenset({b"mime-version", b"content-type", b"content-transfer-encoding"})


class NoSevenBitForm(ValueError):
    """The message has no 7-bit form; the text says why, as a refusal's reply ends with it
    ("8-bit data in its header section, which has no 7-bit form")."""


_IN_HEADER: Final = "8-bit data in its header section, which has no 7-bit form"


def seven_bit(message: bytes) -> bytes | None:
    """`message` (CRLF lines) in 7-bit form, as the module docstring says; `message` itself when
    it is ASCII already; None when it has no 7-bit form (`convert` says why)."""
    try:
        return convert(message)
    except NoSevenBitForm:
        return None


def convert(message: bytes) -> bytes:
    """As `seven_bit`, raising NoSevenBitForm rather than giving None. A bare CR or LF is made
    a CRLF first, as the SMTP client makes every one that leaves (`smtp.framing.crlf_lines`)."""
    if message.isascii():
        return message
    return _message(crlf_lines(message), 0)


def _message(message: bytes, depth: int) -> bytes:
    """A message (the top one, or one inside a message/rfc822 part) made 7-bit."""
    head, body = split_message(message)
    if not head.isascii():
        raise NoSevenBitForm(_IN_HEADER if depth == 0 else "8-bit data in the header section of a message it holds")
    names = {field.name for field in header_fields(head)}
    if not names & _MIME_FIELDS:
        # No MIME at all (RFC 2045 4: without MIME-Version it is plain US-ASCII text, which
        # 8-bit octets make it not): say what it is, in the encoding it goes in.
        charset = b"utf-8" if is_utf8(body) else b"unknown-8bit"
        fields = (
            b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=" + charset + b"\r\n"
            b"Content-Transfer-Encoding: quoted-printable\r\n"
        )
        return _with_blank(head) + fields + b"\r\n" + _quoted_printable(body)
    new_head, new_body = _entity(head, body, "text/plain", depth)
    if new_head != head and b"mime-version" not in names:
        new_head += b"MIME-Version: 1.0\r\n"
    return _joined(new_head, new_body, message)


def _entity(head: bytes, body: bytes, default_type: str, depth: int) -> tuple[bytes, bytes]:
    """An entity's header section (ASCII, the CRLF of its last field included) and body, made
    7-bit; NoSevenBitForm when it has none. `default_type`: its type when it names none
    (RFC 2046 5.1.5: message/rfc822 in a multipart/digest)."""
    if body.isascii():
        return head, body
    if depth >= _DEEPEST:
        raise NoSevenBitForm(f"8-bit data in a MIME structure nested over {_DEEPEST} levels deep")
    content_type, boundary, encoding = _read(head, default_type)
    kind = content_type.partition("/")[0]
    if kind == "multipart" or content_type == "message/rfc822":
        if encoding not in _PASSED_ON and encoding != b"binary":
            # (RFC 2045 6.4: a composite is never encoded; this one says it is)
            raise NoSevenBitForm(f"8-bit data in a {content_type} part that says it is {_said(encoding)}")
        if kind == "multipart":
            if not boundary:
                raise NoSevenBitForm(f"8-bit data in a {content_type} part without a boundary")
            inner = "message/rfc822" if content_type == "multipart/digest" else "text/plain"
            converted = _multipart(body, boundary, inner, depth + 1)
        else:
            converted = _message(body, depth + 1)
        return (_encoded_as(head, b"7bit") if encoding in (b"8bit", b"binary") else head), converted
    if content_type in ("message/partial", "message/external-body"):
        raise NoSevenBitForm(f"8-bit data in a {content_type} part, which is 7bit only")  # RFC 2046 5.2.2, 5.2.3
    if encoding == b"binary":
        return _encoded_as(head, b"base64"), base64.encodebytes(body).replace(b"\n", b"\r\n")
    if encoding not in _PASSED_ON:
        # quoted-printable or base64 with 8-bit octets in it, or an encoding unknown
        raise NoSevenBitForm(f"8-bit data in a part that says it is {_said(encoding)}")
    return _encoded_as(head, b"quoted-printable"), _quoted_printable(body)


def _said(encoding: bytes) -> str:
    """A Content-Transfer-Encoding, as a reason names it (printable, short)."""
    return repr(encoding[:40].decode("ascii", "replace"))


def _read(head: bytes, default_type: str) -> tuple[str, str | None, bytes]:
    """An ASCII header section's media type (lower-case, `default_type` when it has none or
    one that is no media type, RFC 2045 5.2), its boundary parameter, and its
    Content-Transfer-Encoding (lower-case, b"" when absent)."""
    parsed = email.message.Message()
    parsed.set_default_type(default_type)
    encoding = b""
    for field in header_fields(head):
        value = field.raw.partition(b":")[2]
        if field.name == b"content-type" and "content-type" not in parsed:
            parsed["Content-Type"] = value.decode("ascii").replace("\r\n", "").strip()
        elif field.name == b"content-transfer-encoding" and not encoding:
            found = _ENCODING.match(value)
            encoding = found.group(1).lower() if found is not None else b""
            encoding = encoding or b"7bit"  # (a field there, but empty: 7bit, the default)
    return parsed.get_content_type(), parsed.get_boundary(), encoding


def _multipart(body: bytes, boundary: str, default_type: str, depth: int) -> bytes:
    """A multipart's body with each of its parts made 7-bit. A delimiter is a line of "--",
    the boundary, and maybe white space (RFC 2046 5.1.1: the CRLF before it is the
    delimiter's); the close delimiter has "--" after the boundary. The preamble and the
    epilogue are no part: quoted-printable where they are 8-bit, though nobody decodes them."""
    marker = re.escape(boundary.encode("ascii", "replace"))
    found = list(re.finditer(rb"(?m)^--" + marker + rb"(--)?[ \t]*(?:\r\n|\Z)", body))
    if not found:
        raise NoSevenBitForm("8-bit data in a multipart with no line of its boundary")
    cut = max(found[0].start() - 2, 0)
    out = [_ascii(body[:cut]), body[cut : found[0].end()]]
    for at, line in enumerate(found):
        if line.group(1) is not None:  # the close delimiter: the epilogue follows
            out.append(_ascii(body[line.end() :]))
            return b"".join(out)
        following = found[at + 1] if at + 1 < len(found) else None
        start = line.end()
        end = max(following.start() - 2, start) if following is not None else len(body)
        part = body[start:end]
        head, part_body = split_message(part)
        if not head.isascii():
            raise NoSevenBitForm("8-bit data in the header section of a MIME part, which has no 7-bit form")
        out.append(_joined(*_entity(head, part_body, default_type, depth), part))
        if following is not None:
            out.append(body[end : following.end()])
    return b"".join(out)  # (no close delimiter: the last part ran to the end, as readers take it)


def _joined(head: bytes, body: bytes, original: bytes) -> bytes:
    """An entity's header section and body as one, written as `original` was: without the empty
    line when it had neither it nor a body (all header), and from the empty line when it had
    no header section."""
    if head and not body and b"\r\n\r\n" not in original and not original.startswith(b"\r\n"):
        return head
    return head + b"\r\n" + body


def _with_blank(head: bytes) -> bytes:
    """A header section that ends with a CRLF, for fields to be added after it."""
    return head if not head or head.endswith(b"\r\n") else head + b"\r\n"


def _encoded_as(head: bytes, encoding: bytes) -> bytes:
    """`head` with its Content-Transfer-Encoding field(s) saying `encoding`: the first made so
    where it is, any other taken off, or one added at the end."""
    written = b"Content-Transfer-Encoding: " + encoding + b"\r\n"
    kept: list[bytes] = []
    for field in header_fields(head):
        if field.name == b"content-transfer-encoding":
            if written:
                kept.append(written)
                written = b""
        else:
            kept.append(field.raw)
    return b"".join(kept) + written


def _quoted_printable(data: bytes) -> bytes:
    """`data` (CRLF lines) quoted-printable (RFC 2045 6.7): each CRLF a hard line break, lines
    of at most 76 characters with soft breaks, "=", a control character, an octet beyond
    ASCII, and white space at a line's end encoded."""
    lines = data.split(b"\r\n")
    # (binascii reads "\n" as a line break and encodes a lone "\r": given the lines one by one
    # with LF between them, it writes exactly the hard breaks there are.)
    encoded = binascii.b2a_qp(b"\n".join(lines), quotetabs=False, istext=True, header=False)
    return encoded.replace(b"\n", b"\r\n")


def _ascii(text: bytes) -> bytes:
    """A preamble or epilogue: as it is when ASCII, else quoted-printable."""
    return text if text.isascii() else _quoted_printable(text)


Sign = Callable[[Message, bytes], Awaitable[bytes | None]]
"""Signs a message's 7-bit form (its bytes) again with the DKIM signers that signed it at
reception: its DKIM-Signature fields, or None when no signer applies to it any more (a reload
took it away). Raises what the signing raised."""

NOT_CONVERTED: Final = "Message has 8-bit data and the receiving server does not offer 8BITMIME; not made 7-bit"
CANNOT_SIGN: Final = "the 7-bit form of the message for this server could not be signed (DKIM)"


class SevenBitHop:
    """What a message goes as to a hop without 8BITMIME, when it is 8-bit (the SMTP agent asks
    only then): a report of Pigeon's own in its 7-bit form (`dsn.for_seven_bit_hop`), any other
    message `seven_bit`'s, when `convert` (`[delivery] eight_bit_conversion`) allows it.

    The DKIM signatures Pigeon made at reception (`Envelope.dkim_signatures`, on top of the
    bytes that leave) signed the 8-bit form, and would fail: they come off, and the 7-bit form
    is signed again by the same signers (`sign`, in the node's signing process), so that it
    leaves as well signed as the 8-bit form would have. A signature that came with the message
    (an upstream one, below Pigeon's Received field) cannot be made again here: it stays, and
    fails, as it does after any hop's conversion."""

    def __init__(self, *, convert: bool, sign: Sign | None = None) -> None:
        self._convert = convert
        self._sign = sign

    async def __call__(self, message: Message, body: bytes) -> tuple[bytes | None, Reply | None]:
        """(the bytes to send, None); (None, None) when the message is not to be converted
        (it is refused, 554 5.6.3, as ever); (None, a 554 5.6.3 saying why) when it has no 7-bit
        form; or (None, a 451) when its signatures could not be made again (the attempt is
        deferred: better later than unsigned, as at reception)."""
        signatures = message.envelope.dkim_signatures
        ours = bool(signatures) and body.startswith(signatures or b"")  # Pigeon's, on top of what leaves
        converted = for_seven_bit_hop(message, body, seven_bit)  # (without them)
        if converted is None and self._convert:
            try:
                converted = convert(body[len(signatures or b"") :] if ours else body)
            except NoSevenBitForm as why:
                return None, Reply(554, "5.6.3", (f"{NOT_CONVERTED}: {why}",))
        if converted is None or not ours or self._sign is None:
            return converted, None
        try:
            signed = await self._sign(message, converted)
        except Exception as error:  # (the signing process died, or a reload changed the signers)
            return None, Reply(451, "4.3.0", (f"{CANNOT_SIGN}: {error}",))
        return (converted if signed is None else signed + converted), None
