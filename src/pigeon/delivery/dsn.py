"""Delivery status notifications (RFC 3464, inside an RFC 6522 multipart/report).

Written as bytes from a template rather than through the email package: the structure is
fixed and small, and the result must be exact. The stdlib parser reads it back (the
tests do), and so does any mail client.

Who gets one (RFC 3461): the envelope sender, never the null sender, for each recipient
that failed (bounced or expired) unless its NOTIFY excludes FAILURE (NOTIFY absent means
"failures only"). `RET=FULL` returns the whole message, anything else only its headers.
A recipient whose NOTIFY has SUCCESS gets a report of it when nobody further on will send
one (RFC 3461 5.2.2): "delivered" to an application's target, "relayed" to a server that did
not take the DSN parameters (one that did reports on its own). A success returns only the
headers. A recipient still being retried past `[delivery] delay_warning` is reported once as
"delayed" (unless its NOTIFY leaves out DELAY), with the deferral's 4.x.y status and until when
it will be tried (`Will-Retry-Until`); only the headers come back (RET is for failures).

Every line keeps to RFC 5322's 998 octets (2.1.1), and to 78 where the words allow: a next
hop may refuse a longer line (Pigeon does, 554 5.6.0), and a report is refused unheard. A
server's reply has no such limit once its lines are joined (RFC 5321 allows 512 octets a line,
Pigeon's reader 4096, lines without number): the Diagnostic-Code is folded at its white space
(unfolded, it is the reply again), the text wrapped, and a word longer than a line cut.

A report is 8-bit when it reports on internationalised mail (RFC 6533: UTF-8 in the
message/global-delivery-status part, message/global or message/global-headers returned) or
returns an 8-bit message; each part holding 8-bit octets says so, `Content-Transfer-Encoding:
8bit` (a part that does not is 7bit, RFC 2045 6.1). The hop it goes back through may lack
8BITMIME, and a report refused there is lost (no one hears of a null sender's failure), so
there it goes in a 7-bit form (`seven_bit`): the text quoted-printable; message/delivery-status,
with the addresses in RFC 6533's utf-8-addr-xtext form (any other character that is not ASCII
escaped alike); the message returned whole (message/rfc822, or message/global) in its own 7-bit
form, as message/rfc822, where it has one (its header section ASCII: the converter the caller
gives, `seven_bit.seven_bit`); else, and of headers returned, only its header fields that are
ASCII, as text/rfc822-headers (and the text says so, not that the message came back). A DKIM
signature made over the 8-bit form is taken off: it would fail (the delivery signs the 7-bit
form again, `seven_bit.SevenBitHop`).
"""

from __future__ import annotations

import asyncio
import binascii
import datetime
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import format_datetime
from typing import Final, Protocol

from pigeon.logs.peer_text import shown
from pigeon.message import Envelope, Message, Recipient, format_id
from pigeon.mime import address_header, message_id_field
from pigeon.smtp.client import rcpt_reply_as_sent
from pigeon.smtp.extensions import encode_utf8_addr_xtext
from pigeon.smtp.replies import Reply
from pigeon.spool.shards import Spools
from pigeon.spool.spool import Settling, Spool

# What the text says comes back of the message (the 7-bit form's `seven_bit` says the third).
_SAYS_WHOLE: Final = "It is attached below"
_SAYS_HEADERS: Final = "Its headers are attached below"
_SAYS_ASCII_HEADERS: Final = "Its headers (those in ASCII) are attached below"
_OWN: Final = "LOCAL"  # the protocol of a report's envelope: written here, stored by `Intake.local`

# What the delivery session says after a 421 of which command it answered, "(answer of
# [192.0.2.1]:25 to RCPT TO)", or that it was the greeting ("(greeting of ...)"): Pigeon's
# words for the log, not the server's, so not in a Diagnostic-Code (RFC 3464 2.3.6).
_STAGE_NOTE: Final = re.compile(r" \((?:answer of [^()]+ to [A-Za-z ,]+|greeting of [^()]+)\)$")


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed recipient, as the report shows it."""

    recipient: Recipient
    reply: Reply
    action: str  # "failed" (bounced or expired); "relayed" or "delivered" for NOTIFY=SUCCESS
    remote_mta: str | None = None  # the host that answered, if any
    # RFC 3464 diagnostic type: "smtp" for a reply a server gave; "X-Pigeon" for one Pigeon wrote
    # (an expiry, a DNS failure, a refusal before sending such as no 8BITMIME at the server), so
    # the report does not claim a server said it.
    diagnostic_type: str = "smtp"
    attempted: float | None = None  # when the last attempt was, if not the report's own time
    # The Diagnostic-Code's reply when it is not `reply`: an expiry whose last failure was a
    # server's reply reports that reply (`smtp;`, with its `remote_mta`), `reply` (5.4.7) giving
    # the Status and the text, which say the message expired.
    diagnostic: str | None = None
    # Of a "delayed" report: until when the message will be tried (RFC 3464 2.3.9 Will-Retry-Until).
    retry_until: float | None = None


def wants_delay_notice(recipient: Recipient) -> bool:
    """RFC 3461 4.1: NOTIFY=DELAY asks for a delay notice, NOTIFY without it (NEVER, FAILURE
    alone) refuses one, and no NOTIFY leaves it to the MTA (`[delivery] delay_warning`, which
    the caller checks for either)."""
    return recipient.notify is None or "DELAY" in recipient.notify


def wants_success_notice(recipient: Recipient) -> bool:
    """RFC 3461 4.1: a success is reported only when NOTIFY asks for it."""
    return recipient.notify is not None and "SUCCESS" in recipient.notify


def wants_failure_notice(recipient: Recipient) -> bool:
    """RFC 3461 4.1: no NOTIFY means failures are reported; NOTIFY=NEVER means nothing is."""
    return recipient.notify is None or "FAILURE" in recipient.notify


_FOLD_AT: Final = 78  # RFC 5322 2.1.1: a line SHOULD be at most 78 octets...
_LINE_LIMIT: Final = 998  # ...and MUST be at most 998, without its CRLF (a next hop may refuse it)


def build_report(
    *,
    hostname: str,
    queue_id: str,
    envelope: Envelope,
    failures: Sequence[Failure],
    original: bytes,
    arrival: float,
    now: float | None = None,
    max_line: int = _LINE_LIMIT,
    from_address: str | None = None,
) -> bytes:
    """The complete DSN message, CRLF line endings, ready to store and send to the sender.
    No line Pigeon writes in it is longer than `max_line` (`[smtp] max_line_length`: a next hop
    with the same setting refuses a longer one), whatever `[smtp] hostname` is.

    `from_address`: its From (`[delivery] dsn_from`; None: MAILER-DAEMON@`hostname`). Only the
    From: the Message-ID's domain and the Reporting-MTA stay `hostname`, the host that wrote the
    report (RFC 5322 3.6.4 makes an id unique by its host; RFC 3464 2.2.2 names the MTA)."""
    now = time.time() if now is None else now
    # No host name in it: with a long one the boundary passed RFC 2046's 70 characters and
    # its line `max_line`. The queue id and 64 random bits are unique enough.
    boundary = f"{queue_id}.{secrets.token_hex(8)}"
    date = _date(now)
    utf8 = envelope.smtputf8 or not envelope.sender.isascii()
    failed = [f for f in failures if f.action == "failed"]
    delayed = [f for f in failures if f.action == "delayed"]
    succeeded = [f for f in failures if f.action in ("relayed", "delivered")]
    full = envelope.ret == "FULL" and bool(failed)  # a success returns the headers only (RFC 3461 4.3)
    human = _wrapped(f"This is the mail system at host {hostname}.", max_line) + "\r\n\r\n"
    if failed:
        # A remote server's words, escaped as everywhere they are shown: an ESC in them must
        # not reach the sender's terminal (the Diagnostic-Code below is a header field's value).
        # Wrapped: a next hop's reply may be 4096 octets a line, and lines, joined.
        reasons = "\r\n".join(
            _wrapped(f"<{f.recipient.address}>: {shown(f.reply.text, limit=None)}", max_line) for f in failed
        )
        # Say what comes back: without RET=FULL, only the header section does.
        attached = _SAYS_WHOLE if full else _SAYS_HEADERS
        human += (
            "Your message could not be delivered to one or more recipients.\r\n"
            f"{attached}; the reasons are:\r\n\r\n{reasons}\r\n"
        )
    if delayed:
        # Postfix's words, near enough: a sender who reads no further must not send it again.
        until = max(f.retry_until or now for f in delayed)
        waiting = "\r\n".join(
            _wrapped(f"<{f.recipient.address}>: {shown(f.reply.text, limit=None)}", max_line) for f in delayed
        )
        # What came back is said once (a failure's text said it), as the 7-bit form looks for it.
        heading = "The reasons it is still waiting are" if failed else f"{_SAYS_HEADERS}; the reasons are"
        human += ("\r\n" if failed else "") + (
            "THIS IS A WARNING ONLY. YOU DO NOT NEED TO SEND YOUR MESSAGE AGAIN.\r\n\r\n"
            "Your message has not yet been delivered to one or more recipients.\r\n"
            f"It will be tried again until {_date(until)},\r\n"
            "and you will be told if it cannot be delivered by then.\r\n"
            f"{heading}:\r\n\r\n{waiting}\r\n"
        )
    if succeeded:
        # RFC 3461 5.2.2: "relayed" to a server that does not report on; "delivered" here.
        said = {"delivered": "delivered", "relayed": "relayed to a server that sends no further reports"}
        done = "\r\n".join(_wrapped(f"<{f.recipient.address}>: {said[f.action]}", max_line) for f in succeeded)
        human += ("\r\n" if failed or delayed else "") + f"As you asked, a report of its delivery:\r\n\r\n{done}\r\n"
    per_message = [f"Reporting-MTA: dns; {hostname}", f"X-Pigeon-Queue-ID: {queue_id}"]
    if envelope.envid:
        per_message.append(f"Original-Envelope-Id: {_field(envelope.envid)}")
    per_message.append(f"Arrival-Date: {_date(arrival)}")
    blocks = ["\r\n".join(_folded(field, max_line) for field in per_message)]
    for failure in failures:
        address = failure.recipient.address
        if address.isascii():
            fields = [f"Final-Recipient: rfc822; {_field(address)}"]
        else:
            # RFC 6533 3: UTF-8 as it is only in a message/global-delivery-status part.
            fields = [f"Final-Recipient: utf-8; {_field(address) if utf8 else encode_utf8_addr_xtext(address)}"]
        if failure.recipient.orcpt:
            fields.append(f"Original-Recipient: {_original_recipient(failure.recipient.orcpt, utf8)}")
        fields.append(f"Action: {failure.action}")
        fields.append(f"Status: {_status(failure.reply)}")
        if failure.remote_mta:
            fields.append(f"Remote-MTA: dns; {_mta_name(failure.remote_mta)}")
        # RFC 3464 2.3.6: the server's reply as it gave it, its enhanced code too ("550 5.1.1 ...");
        # a 552 to RCPT that Pigeon read as 452 is quoted as the 552 (the text says what was read).
        diagnostic = str(failure.reply) if failure.diagnostic is None else failure.diagnostic
        if failure.diagnostic_type == "smtp":
            diagnostic = rcpt_reply_as_sent(diagnostic)
            if diagnostic.startswith("421 "):
                diagnostic = _STAGE_NOTE.sub("", diagnostic)
        fields.append(f"Diagnostic-Code: {failure.diagnostic_type}; {_field(diagnostic)}")
        if failure.attempted is not None:
            fields.append(f"Last-Attempt-Date: {_date(failure.attempted)}")
        elif failure.diagnostic_type == "smtp":
            fields.append(f"Last-Attempt-Date: {date}")
        if failure.retry_until is not None:
            fields.append(f"Will-Retry-Until: {_date(failure.retry_until)}")
        blocks.append("\r\n".join(_folded(field, max_line) for field in fields))
    # RFC 6522 3: the multipart/report's report-type is this part's subtype.
    status_type = "message/global-delivery-status" if utf8 else "message/delivery-status"
    status = "\r\n\r\n".join(blocks)
    if not utf8:
        # message/delivery-status is ASCII (RFC 3464 2.1.1): a server's UTF-8 reply, or an
        # ENVID decoded to UTF-8, escaped as RFC 6533 escapes UTF-8 addresses.
        status = _escaped(status)
    returned = original if full else _headers(original)
    if full:
        returned_type = "message/global" if utf8 else "message/rfc822"
    else:
        # RFC 6533 6.4: headers that may hold UTF-8 go as message/global-headers.
        returned_type = "message/global-headers" if utf8 or not returned.isascii() else "text/rfc822-headers"
    head = (
        address_header("From", "Mail Delivery System", from_address or f"MAILER-DAEMON@{hostname}", max_line)
        + f"To: <{envelope.sender}>\r\n"
        f"Subject: {_subject(bool(failed), bool(delayed))}\r\n"
        f"Date: {date}\r\n" + message_id_field(hostname, max_line) + "Auto-Submitted: auto-replied\r\n"
        "MIME-Version: 1.0\r\n"
        f'Content-Type: multipart/report; report-type={status_type.partition("/")[2]};\r\n\tboundary="{boundary}"\r\n'
        "\r\n"
        "This is a MIME-encapsulated message.\r\n\r\n"
    )
    parts = [
        f"--{boundary}\r\nContent-Description: Notification\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n{_encoding(human)}\r\n{human}\r\n",
        f"--{boundary}\r\nContent-Description: Delivery report\r\nContent-Type: {status_type}\r\n"
        f"{_encoding(status)}\r\n{status}\r\n\r\n",
        f"--{boundary}\r\nContent-Description: {_description(bool(failed), full, bool(delayed))}\r\n"
        f"Content-Type: {returned_type}\r\n{_encoding(returned)}\r\n",
    ]
    text = (head + "".join(parts)).encode("utf-8")
    if not returned.endswith(b"\r\n"):
        returned += b"\r\n"
    return text + returned + f"\r\n--{boundary}--\r\n".encode()


def _encoding(content: str | bytes) -> str:
    """A part's Content-Transfer-Encoding field, for one whose `content` holds 8-bit octets:
    a part without one is 7bit (RFC 2045 6.1), which a next hop may take at its word."""
    return "" if content.isascii() else "Content-Transfer-Encoding: 8bit\r\n"


def _subject(failed: bool, delayed: bool) -> str:
    """The report's Subject, as Postfix words it: a failure's first, then a delay's."""
    if failed:
        return "Undelivered Mail Returned to Sender"
    return "Delayed Mail (still being retried)" if delayed else "Successful Mail Delivery Report"


def _description(failed: bool, full: bool, delayed: bool = False) -> str:
    """The returned part's Content-Description: what it is, of which message."""
    if full:
        return "Undelivered message"
    if failed:
        return "Undelivered message headers"
    return "Delayed message headers" if delayed else "Message headers"


def _original_recipient(orcpt: str, utf8: bool) -> str:
    """An ORCPT ("type;address", as `RcptTo.orcpt` keeps it) as the Original-Recipient field's
    value. UTF-8 goes as it is only in message/global-delivery-status (RFC 6533 3): in
    message/delivery-status an address that is not ASCII is of type utf-8, in xtext form."""
    addr_type, _, address = orcpt.partition(";")
    if utf8 or address.isascii():
        return f"{_field(addr_type)}; {_field(address)}"
    if addr_type.lower() == "utf-8":
        # As the client sent it (utf-8-addr-unitext): its escapes stand, its UTF-8 is escaped.
        xtext = _escaped(address)
    else:
        xtext = encode_utf8_addr_xtext(address)
    return f"utf-8; {_field(xtext)}"


def _escaped(text: str) -> str:
    """Each character of `text` that is not ASCII as RFC 6533's `\\x{HEX}`."""
    return text if text.isascii() else "".join(c if c.isascii() else f"\\x{{{ord(c):X}}}" for c in text)


def _field(value: str) -> str:
    """A value safe inside a header field: no CR, LF or other controls (no injected fields),
    nor a C1 control (U+009B is a terminal's CSI) or a bidirectional override."""
    return value if value.isprintable() else "".join(c if c.isprintable() else " " for c in value)


_PIECE: Final = re.compile(r"[ \t]*[^ \t]+|[ \t]+")  # a word with the white space before it
_INDENT: Final = "    "  # a wrapped reason's continuation lines, in the human-readable text


def _folded(field: str, limit: int = _LINE_LIMIT) -> str:
    """One field of the delivery-status part (`Name: value`) folded as RFC 5322 2.2.3 folds:
    a CRLF put before white space the value has, so that unfolded it is the value again. Its
    lines keep to 78 octets where its words allow, and to `limit` (`[smtp] max_line_length`)
    always: a word longer than that (a server's reply has no limit on its words) is cut, a
    space put in where it is cut.

    Counted as the field's widest form, each character that is not ASCII as `\\x{HEX}`
    (message/delivery-status, and the 7-bit form of message/global-delivery-status): never
    shorter than its UTF-8, so no form has a longer line."""
    return "\r\n".join(_lines(field, _escaped_width, limit, fold=True))


def _wrapped(line: str, limit: int = _LINE_LIMIT) -> str:
    """One line of the human-readable text, wrapped at its white space to 78 octets where its
    words allow (the continuation lines indented), and cut where a word passes `limit` octets."""
    return "\r\n".join(_lines(line, _utf8_width, limit, fold=False))


def _lines(line: str, width: Callable[[str], int], limit: int, *, fold: bool) -> list[str]:
    """`line` as lines of at most `_FOLD_AT` octets (counted by `width`) where its white space
    allows, and of at most `limit` always. `fold`: a header field's fold, the white space
    kept at the start of the next line; else text's wrap, the white space replaced by `_INDENT`."""
    if width(line) <= _FOLD_AT:
        return [line]  # the usual case
    lead = " " if fold else _INDENT  # (what starts a line a word was cut to make)
    lines: list[str] = []
    current = ""
    for piece in _PIECE.findall(line):
        word = piece if fold else piece.lstrip()
        if not word:
            continue  # white space at the end of a line of text: nothing to show
        if current.strip() and word.strip() and width(current + piece) > _FOLD_AT:
            lines.append(current)  # a line is never only white space (RFC 5322 3.2.2)
            current = word if fold else _INDENT + word
        else:
            current += piece
        while width(current) > limit:
            cut = _cut(current, width, limit)
            lines.append(current[:cut])
            current = lead + current[cut:]
    lines.append(current)
    return lines


def _cut(text: str, width: Callable[[str], int], limit: int) -> int:
    """Where to cut `text` so that its first part is as long as a line may be."""
    size = 0
    for index, char in enumerate(text):
        size += width(char)
        if size > limit:
            return index
    return len(text)


def _utf8_width(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _escaped_width(text: str) -> int:
    return len(text) if text.isascii() else len(_escaped(text))


def _mta_name(peer: str) -> str:
    """The Remote-MTA's name (RFC 3464 2.3.5: a host name for type "dns"): the MX host's name
    when the peer was reached by one, else its address literal (RFC 5321 4.1.3), without the
    port a peer is shown with ("[192.0.2.1]:2525" gives "[192.0.2.1]")."""
    if not peer.startswith("["):
        return _field(peer)
    address = peer[1:].partition("]")[0]
    return _field(f"[IPv6:{address}]" if ":" in address else f"[{address}]")


def _status(reply: Reply) -> str:
    if reply.enhanced:
        return reply.enhanced
    return "5.0.0" if reply.code >= 500 else "4.0.0" if reply.code >= 400 else "2.0.0"


def _headers(message: bytes) -> bytes:
    end = message.find(b"\r\n\r\n")
    return message if end < 0 else message[: end + 2]


_BOUNDARY: Final = re.compile(rb'boundary="([^"\r\n]+)"')
_CONTENT_TYPE: Final = re.compile(rb"(?im)^content-type:[ \t]*([^;\s]+)")
_CONTENT_TYPE_FIELD: Final = re.compile(rb"(?im)^content-type:[^\r\n]*")
_ENCODING_FIELD: Final = re.compile(rb"(?im)^content-transfer-encoding:[^\r\n]*\r\n")
_DESCRIPTION_FIELD: Final = re.compile(rb"(?im)^content-description:[^\r\n]*")
_FIELD_BREAK: Final = re.compile(rb"\r\n(?![ \t])")  # a line end not followed by a continuation line
_RETURNED: Final = frozenset({b"message/rfc822", b"message/global", b"message/global-headers"})
_WHOLE: Final = frozenset({b"message/rfc822", b"message/global"})

Convert = Callable[[bytes], bytes | None]
"""A message (CRLF lines) in its 7-bit form, or None when it has none (`seven_bit.seven_bit`)."""


def seven_bit(report: bytes, convert: Convert | None = None) -> bytes | None:
    """`report` (a report `build_report` made, as stored: Pigeon's Received field on top) in
    the 7-bit form the module docstring describes, for a hop without 8BITMIME; None when it is
    no such report, or has 8-bit content where none is expected. A message returned whole goes
    as `convert` makes it, when it does (None: always its ASCII header fields only)."""
    head_end = report.find(b"\r\n\r\n")
    boundary = _BOUNDARY.search(report, 0, head_end)
    if head_end < 0 or boundary is None or not report[:head_end].isascii():
        return None
    head = report[: head_end + 2].replace(b"report-type=global-delivery-status", b"report-type=delivery-status")
    delimiter = b"\r\n--" + boundary.group(1)
    preamble, *parts = report[head_end + 2 :].split(delimiter)
    if not parts or not parts[-1].startswith(b"--"):
        return None
    read: list[tuple[bytes, bytes, bytes]] = []  # each part's type, fields and content
    for part in parts[:-1]:
        fields_end = part.find(b"\r\n\r\n")
        found = _CONTENT_TYPE.search(part, 0, fields_end) if fields_end >= 0 else None
        if found is None:
            return None
        read.append((found.group(1).lower(), part[: fields_end + 2], part[fields_end + 4 :]))
    # The message returned whole, in its 7-bit form where it has one (message/rfc822: a
    # message/global whose header section is ASCII is one).
    whole: dict[int, bytes] = {}
    for index, (kind, _, content) in enumerate(read):
        if kind in _WHOLE and not content.isascii() and convert is not None:
            converted = convert(content)
            if converted is not None and converted.isascii():
                whole[index] = converted
    # Else the message, or its headers, cannot come back as they are: only its ASCII header fields do.
    cut = any(
        kind in _RETURNED and not content.isascii() and i not in whole for i, (kind, _, content) in enumerate(read)
    )
    written = [preamble]
    for index, (kind, fields, content) in enumerate(read):
        if kind == b"text/plain" and cut:
            content = _says_ascii_headers(content)  # (the text was written before it was cut)
        if index in whole:
            fields = _CONTENT_TYPE_FIELD.sub(b"Content-Type: message/rfc822", _ENCODING_FIELD.sub(b"", fields))
            content = whole[index]
        elif not content.isascii():
            fields, content = _seven_bit_part(kind, fields, content)
        elif kind == b"message/global-delivery-status":  # (all ASCII already)
            fields = fields.replace(b"message/global-delivery-status", b"message/delivery-status")
        if not (fields + content).isascii():
            return None
        written.append(fields + b"\r\n" + content)
    written.append(parts[-1])
    return head + delimiter.join(written)


def _seven_bit_part(kind: bytes, fields: bytes, content: bytes) -> tuple[bytes, bytes]:
    """One part of a report, its 8-bit `content` made 7-bit (see `seven_bit`)."""
    fields = _ENCODING_FIELD.sub(b"", fields)  # ("8bit" no longer: 7bit, or said again below)
    if kind == b"text/plain":
        return fields + b"Content-Transfer-Encoding: quoted-printable\r\n", binascii.b2a_qp(content, istext=True)
    if kind == b"message/global-delivery-status":
        fields = fields.replace(b"message/global-delivery-status", b"message/delivery-status")
        return fields, _escaped(content.decode("utf-8", "replace")).encode("ascii")
    if kind in _RETURNED:
        fields = _CONTENT_TYPE_FIELD.sub(b"Content-Type: text/rfc822-headers", fields)
        fields = _DESCRIPTION_FIELD.sub(b"Content-Description: Message headers (those in ASCII)", fields)
        return fields, _ascii_fields(_headers(content))
    return fields, content  # (none other is written: refused by the caller)


def _says_ascii_headers(text: bytes) -> bytes:
    """The human-readable `text` of a report, saying that of the message only its header fields
    in ASCII come back, where it said the message or its headers did (the README promises the
    text says which came back). Our sentence comes before the reasons: a server's words, after
    it, that happen to say the same are left as they are."""
    for said in (_SAYS_WHOLE, _SAYS_HEADERS):
        written = f"\r\n{said}; ".encode()
        if written in text:
            return text.replace(written, f"\r\n{_SAYS_ASCII_HEADERS}; ".encode(), 1)
    return text


def _ascii_fields(header_section: bytes) -> bytes:
    """The fields of `header_section` that are ASCII (each with its continuation lines)."""
    kept: list[bytes] = []
    for field in _FIELD_BREAK.split(header_section.removesuffix(b"\r\n")):
        if field and field.isascii():
            kept.append(field + b"\r\n")
    return b"".join(kept)


def for_seven_bit_hop(message: Message, body: bytes, convert: Convert | None = None) -> bytes | None:
    """The bytes to send for `message` (`body`: as it would leave) to a hop without
    8BITMIME, when it is a report of Pigeon's own (null sender, written here): `seven_bit`
    (the message it returns made 7-bit by `convert`), without the DKIM signatures made over
    the 8-bit form. None for any other message (the delivery makes it 7-bit otherwise,
    `seven_bit.seven_bit`), or a report that cannot be made 7-bit."""
    envelope = message.envelope
    if envelope.sender or envelope.protocol != _OWN:
        return None
    signatures = envelope.dkim_signatures
    if signatures and body.startswith(signatures):
        body = body[len(signatures) :]
    return seven_bit(body, convert)


class Submit(Protocol):
    """The intake's local submission (`Intake.local`): durable when it returns."""

    def __call__(
        self, envelope: Envelope, data: bytes, *, spool: Spool, settles: Settling, reports_on: str | None = None
    ) -> Awaitable[object]: ...


class Notifier:
    """Stores the report for a message's failures as a new message to its sender (null
    sender, so it can never bounce back), in the same transaction as the outcome it reports
    (`settles`), in the failed message's shard: after a crash the sender has its one DSN
    and the failures are settled, or neither happened and the attempt is made again.

    `outgoing` gives a message's bytes as they leave Pigeon (the delivery's own
    `OutgoingBody`): what the report returns of it (headers or all) is that, never the
    spooled original, which still has the routing headers (`X-Tenant`, `X-Campaign`: for
    Pigeon only) and lacks the policy's edits and a submission's Date and Message-ID."""

    def __init__(
        self,
        *,
        hostname: str,
        spools: Spools,
        outgoing: Callable[[Message], bytes],
        submit: Submit,
        max_line: int = _LINE_LIMIT,
        from_address: str | None = None,
    ) -> None:
        self._hostname = hostname
        self._from_address = from_address
        self._max_line = max_line
        self._spools = spools
        self._outgoing = outgoing
        self._submit = submit

    def __call__(self, message: Message, failures: list[Failure], settles: Settling) -> asyncio.Future[object]:
        return asyncio.ensure_future(self._store(message, failures, settles))

    async def _store(self, message: Message, failures: list[Failure], settles: Settling) -> object:
        report = build_report(
            hostname=self._hostname,
            queue_id=format_id(message.id),
            envelope=message.envelope,
            failures=failures,
            original=self._outgoing(message),
            arrival=message.created,
            max_line=self._max_line,
            from_address=self._from_address,
        )
        envelope = Envelope(sender="", recipients=[Recipient(message.envelope.sender)], protocol=_OWN)
        spool = self._spools.of(message.id)
        return await self._submit(envelope, report, spool=spool, settles=settles, reports_on=format_id(message.id))


def _date(when: float) -> str:
    """An RFC 5322 date-time in UTC, written "+0000" (its "GMT" is obsolete syntax, 4.3)."""
    return format_datetime(datetime.datetime.fromtimestamp(when, datetime.UTC))
